"""CPU threads of a simulated rank's libraries.

A rank of a ``ditron sim`` job (or of a :class:`~ditron.sim.pool.SimCluster`) runs on the machine's cores beside
the job's other ranks, and it runs its kernel's programs as threads of its own, so intra-op thread pools in
every rank only oversubscribe the cores. As torchrun does for its ranks, a rank whose job does not set
``OMP_NUM_THREADS`` gets ``OMP_NUM_THREADS=1`` (:func:`default_env`). On 2 cores the OpenMP workers spinning
between a rank's small torch operations cost 11% of the CPU of ``tests/test_decoder_attention.py``.

A rank started as a new process reads the variable when it imports torch; a rank forked from a server that
imported torch already takes it from :func:`apply` (torch reads ``OMP_NUM_THREADS`` once, at import)."""
from __future__ import annotations

import os
import sys

VAR = "OMP_NUM_THREADS"
#: the value a rank gets when neither the job's environment nor the launcher's sets :data:`VAR`
RANK_DEFAULT = "1"


def default_env(base, launcher=None) -> dict:
    """``{VAR: RANK_DEFAULT}`` for a rank whose environment ``base`` (and the launcher's, ``launcher``: default
    this process's) does not set :data:`VAR`, else ``{}``."""
    if VAR in base or VAR in (os.environ if launcher is None else launcher):
        return {}
    return {VAR: RANK_DEFAULT}


def apply(env) -> None:
    """In a forked rank, after it took its environment ``env``: torch's intra-op threads as ``env`` says (a
    positive integer in :data:`VAR`), when torch is already imported; nothing otherwise."""
    torch = sys.modules.get("torch")
    value = env.get(VAR)
    if torch is None or value is None:
        return
    try:
        n = int(value)
    except ValueError:
        return                          # what torch itself does with a value it cannot read: keep its default
    if n > 0 and torch.get_num_threads() != n:
        torch.set_num_threads(n)
