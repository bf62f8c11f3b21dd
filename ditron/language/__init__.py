"""``ditron.language`` -- import as ``dl``.

Tile level: :func:`rank`, :func:`num_ranks`, :func:`symm_at`, :func:`wait`,
:func:`consume_token`, :func:`notify`, :func:`multimem_ld_reduce`,
:func:`multimem_st`.  Task level (megakernel scoreboard): :func:`wait_deps`,
:func:`release_tile`, :func:`fetch_task`.  Thread level: :func:`tid`, :func:`laneid`,
:func:`num_threads`, :func:`num_warps`, :func:`simt_exec_region`, :func:`ld`, :func:`st`,
:func:`atomic_add`, :func:`atomic_cas`, :func:`syncthreads`, :func:`fence`,
:func:`ballot_sync`, :func:`shfl_sync` (+ ``_up``/``_down``/``_xor``),
:func:`ffs`.  Bounding polling loops: :func:`clock_ns`, :func:`poll_timeout`.  Memory hints:
:func:`prefetch_l2`.  Chunk level: :mod:`ditron.language.shmem`.  Tile order:
:func:`swizzle_2d`, :func:`swizzle_gather`, :func:`swizzle_scatter`,
:func:`tile_segments` (:mod:`ditron.language.swizzle`, with host twins
``*_py``).
"""
import sys as _sys

from . import shmem
from . import shmem as libshmem_device

# ``import ditron.language.libshmem_device`` (Triton-distributed's name) is the same module
_sys.modules[__name__ + ".libshmem_device"] = shmem
from .core import (atomic_add, atomic_cas, ballot_sync, clock_ns, consume_token, fence, ffs, laneid, ld, multimem_ld_reduce,
                   multimem_st, notify, num_ranks, num_threads, num_warps, rank, shfl_down_sync, shfl_sync,
                   shfl_up_sync, shfl_xor_sync, poll_timeout, simt_exec_region, st, symm_at, syncthreads,
                   tid, wait)
from .core import fetch_task, prefetch_l2, release_tile, wait_deps
from . import swizzle
from .swizzle import (segment_position, segment_position_py, swizzle_2d, swizzle_2d_py, swizzle_gather,
                      swizzle_gather_py, swizzle_scatter, swizzle_scatter_py, tile_order_py, tile_segments,
                      tile_segments_py)

__all__ = ["rank", "num_ranks", "symm_at", "wait", "consume_token", "notify", "multimem_ld_reduce", "multimem_st",
           "tid", "laneid", "num_threads", "simt_exec_region", "num_warps", "ld", "st", "atomic_add", "atomic_cas", "syncthreads",
           "fence", "ballot_sync", "shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "ffs",
           "clock_ns", "poll_timeout", "prefetch_l2",
           "wait_deps", "release_tile", "fetch_task",
           "shmem", "libshmem_device",
           "swizzle", "swizzle_2d", "swizzle_gather", "swizzle_scatter", "tile_segments", "segment_position",
           "swizzle_2d_py", "swizzle_gather_py", "swizzle_scatter_py", "tile_segments_py", "segment_position_py",
           "tile_order_py"]
