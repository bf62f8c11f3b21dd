"""Importing this module runs :func:`ditron.sim.prewarm.warm`: the last entry of the preload list of
:class:`ditron.sim.pool.SimCluster`'s fork server (multiprocessing's preload takes module names), so that the
ranks it forks inherit the kernels' first-launch work instead of each doing it again.

``DITRON_SIM_POOL_PRELOAD=mod1,mod2`` (opt-in) has that server import these modules too (after the warm-up; a
module that fails to import is left to the rank that imports it): e.g. ``torch._dynamo`` and
``torch._inductor.compile_fx``, about 2 CPU-seconds in every rank that runs ``torch.compile``.  Only for modules
whose import-time settings are the same in the server and in the ranks: they see the server's environment (the
process's when its first cluster started; the ranks' own is set after the fork), so a cluster started after a
change to a variable they read at import (``TORCHINDUCTOR_CACHE_DIR``, ``TMPDIR`` for torch's) would not see it.
tests/conftest.py sets it for the suite, whose clusters all start with one environment.  ``tempfile``'s cached
temporary directory, which those imports fill in, is reset after them, so that a rank computes it from its own
environment.
"""
import os

from .prewarm import warm, preload_more

ENV = "DITRON_SIM_POOL_PRELOAD"

WARMED = warm()
PRELOADED = preload_more(os.environ.get(ENV, ""))
