"""``triton_dist.language`` (import as ``dl``): Triton-distributed's tile-level
names on ditron (:mod:`ditron.language`).

``wait``, ``consume_token``, ``rank``, ``num_ranks``, ``symm_at`` and
``simt_exec_region`` are ditron's; ``notify`` is ``dl.notify`` with
Triton-distributed's default ``comm_scope="inter_node"``.  Every other
``ditron.language`` name is available too.  Triton-distributed names without a
ditron equivalent (shared-memory and TMA helpers, SIMT vectors, ``extern_call``)
raise an ``AttributeError`` naming what to use instead.
"""
from ditron.language import *  # noqa: F401,F403
from ditron.language import (consume_token, num_ranks, rank, shmem, simt_exec_region, symm_at,  # noqa: F401
                             wait)
from ditron.language.extra import missing as _missing
from ditron.language.extra import notify  # noqa: F401  (Triton-distributed's default comm_scope)

from . import extra  # noqa: F401,E402


def __getattr__(name):
    raise _missing(__name__, name)
