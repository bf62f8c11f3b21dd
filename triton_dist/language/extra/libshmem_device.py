"""``triton_dist.language.extra.libshmem_device``: :mod:`ditron.language.shmem`
(NVSHMEM on NVIDIA, rocSHMEM on AMD, the simulator's model on the CPU) plus
Triton-distributed's rocSHMEM spellings.

``ROCSHMEM_*`` constants are the operation names (``"set"``, ``"eq"``, ...)
that ditron's calls accept on every target; ``putmem_signal_wg`` /
``putmem_signal_nbi_wg`` (AMD work-group) are the ``_block`` variants;
``set_rocshmem_ctx`` is accepted and does nothing (ditron's rocSHMEM calls use
the default context).  Other missing names raise an ``AttributeError`` naming
what to use instead.
"""
from ditron import _compat
from ditron.language.extra import missing as _missing
from ditron.language.shmem import *  # noqa: F401,F403
from ditron.language.shmem import (NVSHMEM_CMP_EQ, NVSHMEM_CMP_GE, NVSHMEM_CMP_GT, NVSHMEM_CMP_LE,  # noqa: F401
                                   NVSHMEM_CMP_LT, NVSHMEM_CMP_NE, NVSHMEM_SIGNAL_ADD, NVSHMEM_SIGNAL_SET,
                                   NVSHMEM_TEAM_INVALID, NVSHMEM_TEAM_SHARED, NVSHMEM_TEAM_WORLD,
                                   NVSHMEMI_TEAM_GPU_LEADERS, NVSHMEMI_TEAM_SAME_GPU, NVSHMEMX_TEAM_NODE,
                                   NVSHMEMX_TEAM_SAME_MYPE_NODE, barrier_all, barrier_all_block, barrier_all_warp,
                                   fence, getmem, getmem_block, getmem_nbi, getmem_nbi_block, getmem_nbi_warp,
                                   getmem_warp, my_pe, n_pes, putmem, putmem_block, putmem_nbi, putmem_nbi_block,
                                   putmem_nbi_warp, putmem_signal, putmem_signal_block, putmem_signal_nbi,
                                   putmem_signal_nbi_block, putmem_signal_nbi_warp, putmem_signal_warp, quiet,
                                   remote_mc_ptr, remote_ptr, signal_op, signal_wait_until, sync_all, sync_all_block,
                                   sync_all_warp)

ROCSHMEM_SIGNAL_SET = "set"
ROCSHMEM_SIGNAL_ADD = "add"
ROCSHMEM_CMP_EQ = "eq"
ROCSHMEM_CMP_NE = "ne"
ROCSHMEM_CMP_GT = "gt"
ROCSHMEM_CMP_GE = "ge"
ROCSHMEM_CMP_LT = "lt"
ROCSHMEM_CMP_LE = "le"

putmem_wg = putmem_block
putmem_nbi_wg = putmem_nbi_block
getmem_wg = getmem_block
getmem_nbi_wg = getmem_nbi_block
putmem_signal_wg = putmem_signal_block
putmem_signal_nbi_wg = putmem_signal_nbi_block
barrier_all_wg = barrier_all_block
sync_all_wg = sync_all_block


@_compat.builtin
def set_rocshmem_ctx(ctx, _semantic=None):
    """Accepted and ignored: ditron's rocSHMEM calls use the default context."""
    return None


def __getattr__(name):
    raise _missing(__name__, name)
