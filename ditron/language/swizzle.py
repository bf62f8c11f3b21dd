"""Tile order (threadblock swizzle) for GEMMs that overlap communication.

A GEMM kernel launched over ``num_pid_m * num_pid_n`` programs (or a
persistent kernel looping over tile ids) asks one of these functions which
output tile ``(pid_m, pid_n)`` its linear id ``pid`` should compute:

* :func:`swizzle_2d` -- the grouped order of Triton's matmul tutorial (L2 reuse).
* :func:`swizzle_gather` -- AllGather-GEMM (the paper's *gather mode*): tiles
  whose A rows are already local first, then the other ranks' segments in the
  order they arrive; a tile needing several segments waits for the last one.
* :func:`swizzle_scatter` -- GEMM-ReduceScatter (*scatter mode*): tiles that
  other ranks wait for first, in the order those ranks consume them; the
  rank's own segment last.
* :func:`tile_segments` -- which rank segments the rows of an M tile touch
  (the signals a gather-mode consumer must wait for / the ranks a
  scatter-mode producer feeds).

One source, two uses
--------------------
Every function here is a ``@triton.jit`` function on integer scalars
(program ids, sizes, rank, world): it inlines into ``@ditron.jit`` /
``@triton.jit`` kernels and runs in Triton's interpreter and in the ditron
simulator.  The same Python source also runs on host integers: the ``*_py``
twins (:func:`swizzle_2d_py`, :func:`swizzle_gather_py`, ...) are the jit
functions' own code objects re-bound to globals in which ``tl.minimum``,
``tl.maximum``, ``tl.where`` and ``tl.cdiv`` are plain-integer functions and
the jit helpers are their twins.  There is no second implementation to keep in
step; tests sweep the twins exhaustively and compare the jit versions with
them through the interpreter and the compiler.  (For that reason the code uses
only ``+ - * // %``, comparisons, ``&``, ``tl.minimum/maximum/where/cdiv``,
``while`` loops and a single ``return``, and keeps every operand of
``//`` and ``%`` non-negative, where Triton's truncating and Python's flooring
division agree.)

Rank segments
-------------
Rows of A (gather) or of C (scatter) are split into ``world`` segments, one per
rank: ``M_per_rank = M // world``; segment ``s`` is rows
``[s * M_per_rank, (s + 1) * M_per_rank)``, and the last segment also takes the
``M % world`` remainder rows (so it ends at ``M``).  If ``M < world`` every
segment but the last is empty.  M tile ``t`` is rows
``[t * BLOCK_M, min((t + 1) * BLOCK_M, M))``; it *touches* the segments
``tile_segments(t) = [lo, hi]`` of those rows.  When ``M_per_rank`` is not a
multiple of ``BLOCK_M`` a tile can straddle two segments (several when
``M_per_rank < BLOCK_M``).

``nnodes`` must divide ``world``; ranks ``[n * L, (n + 1) * L)``
(``L = world // nnodes``) are node ``n``.

Segment order (a position 0 .. world-1 per segment, seen from ``rank``
with node ``nr = rank // L`` and local rank ``lr = rank % L``; ``ns``/``ls``
the node and local index of segment ``s``):

* gather (arrival order): ``pos(s) = ((ns - nr) % nnodes) * L + (ls - lr) % L``
  -- the own segment (0), then the node's ring ``rank+1, rank+2, ...``
  (wrapping within the node), then the next node's segments starting with the
  peer of the same local rank, then the node after, ...  Intra-node segments
  always come before inter-node ones (NVLink data lands before network data).
* scatter (consumption order): ``pos(s) = ((ns - nr - 1) % nnodes) * L +
  (ls - lr - 1) % L`` -- other nodes first (starting with node ``nr + 1``, and
  in each node with local rank ``lr + 1``), then the own node's ring
  ``rank+1, rank+2, ...``, the own segment last.  Inter-node destinations come
  first because their transfers are the longest and overlap best when started
  early (the paper's section 3.2; its appendix B code uses the same rotation).

Tile order
----------
Each M tile gets a key: gather mode ``max(pos(s) for s in tile_segments)`` --
a tile is scheduled with the *last* segment it needs, never before all its
rows are present; scatter mode ``min(pos(...))`` -- a tile is produced with
its *earliest* consumer (cross-rank tiles are therefore pulled forward, to the
left, as in the paper's figures 13-15).  Tiles are ordered by key; the tiles of
one key are a contiguous run of M tiles (only the two end tiles of a segment can
straddle), scheduled over all N tiles in :func:`swizzle_2d`'s grouped order.
So in gather mode the tiles entirely inside the own segment come first and in
scatter mode they come last, and a straddling tile is in gather mode placed
with the later, in scatter mode with the earlier of its segments.

Cost: ``O(world)`` scalar integer operations per call (plus the segments a
boundary tile touches); no memory access.  ``pid`` must be in
``[0, cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N))``; a larger one gives
``pid_m >= cdiv(M, BLOCK_M)`` (out of range, so masked loads/stores do
nothing).
"""
from __future__ import annotations

import types as _types

import triton
import triton.language as tl

__all__ = ["swizzle_2d", "swizzle_gather", "swizzle_scatter", "tile_segments", "segment_position",
           "swizzle_2d_py", "swizzle_gather_py", "swizzle_scatter_py", "tile_segments_py",
           "segment_position_py", "tile_order_py"]


# ---------------------------------------------------------------------------
# single-device grouped order
# ---------------------------------------------------------------------------

@triton.jit
def swizzle_2d(pid, num_pid_m, num_pid_n, GROUP_M):
    """Grouped tile order of Triton's matmul tutorial: ``pid -> (pid_m, pid_n)``.

    Tiles are taken in groups of ``GROUP_M`` tile rows; inside a group
    ``pid_m`` varies fastest, then ``pid_n``, so consecutive programs share
    columns of B (and the group's rows of A) in L2.  The last group is
    ``num_pid_m % GROUP_M`` rows tall when ``num_pid_m`` is not a multiple of
    ``GROUP_M`` (still a permutation of the grid).  ``GROUP_M = 1`` is plain
    row-major order.
    """
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    in_group = pid % num_pid_in_group
    pid_m = first_pid_m + in_group % group_size_m
    pid_n = in_group // group_size_m
    return pid_m, pid_n


# ---------------------------------------------------------------------------
# rank segments
# ---------------------------------------------------------------------------

@triton.jit
def _owner(row, M_per_rank, world):
    """Segment (rank) that row ``row`` belongs to (the last takes the remainder)."""
    s = tl.minimum(row // tl.maximum(M_per_rank, 1), world - 1)
    return tl.where(M_per_rank > 0, s, world - 1)


@triton.jit
def tile_segments(pid_m, M, BLOCK_M, world):
    """``(lo, hi)``: the rank segments that M tile ``pid_m`` touches (rows
    ``[pid_m * BLOCK_M, min((pid_m + 1) * BLOCK_M, M))``), inclusive.
    ``lo == hi`` unless the tile straddles segments.  In AG-GEMM the tile needs
    segments ``lo .. hi``; in GEMM-RS its rows go to ranks ``lo .. hi``."""
    M_per_rank = M // world
    first_row = pid_m * BLOCK_M
    last_row = tl.minimum(first_row + BLOCK_M, M) - 1
    lo = _owner(first_row, M_per_rank, world)
    hi = _owner(last_row, M_per_rank, world)
    return lo, hi


@triton.jit
def segment_position(seg, rank, world, nnodes, SCATTER):
    """Position (0 .. world-1) of rank segment ``seg`` in ``rank``'s order:
    arrival order (gather, ``SCATTER=0``) or consumption order (scatter,
    ``SCATTER=1``); see the module docstring."""
    L = world // nnodes
    nr = rank // L
    lr = rank % L
    ns = seg // L
    ls = seg % L
    return ((ns - nr - SCATTER + nnodes) % nnodes) * L + (ls - lr - SCATTER + L) % L


@triton.jit
def _segment_at(k, rank, world, nnodes, SCATTER):
    """Inverse of :func:`segment_position`: the segment at position ``k``."""
    L = world // nnodes
    nr = rank // L
    lr = rank % L
    ns = (nr + k // L + SCATTER) % nnodes
    ls = (lr + k % L + SCATTER) % L
    return ns * L + ls


@triton.jit
def _tile_key(pid_m, M, BLOCK_M, rank, world, nnodes, SCATTER):
    """Gather: the latest arrival position among the segments the tile needs;
    scatter: the earliest consumption position among them."""
    lo, hi = tile_segments(pid_m, M, BLOCK_M, world)
    key = segment_position(lo, rank, world, nnodes, SCATTER)
    s = lo + 1
    while s <= hi:
        p = segment_position(s, rank, world, nnodes, SCATTER)
        key = tl.where(SCATTER > 0, tl.minimum(key, p), tl.maximum(key, p))
        s += 1
    return key


@triton.jit
def _swizzle_dist(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M, SCATTER):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    M_per_rank = M // world
    # defaults for pid past the grid: pid_m = num_pid_m (out of range)
    sel_first = num_pid_m + pid * 0
    sel_rows = 1 + pid * 0
    sel_local = pid * 0
    before = pid * 0     # tiles of the keys already walked
    k = pid * 0
    while k < world:     # (not range(world): Triton 3.6's plain interpreter fails on a runtime range bound)
        seg = _segment_at(k, rank, world, nnodes, SCATTER)
        start = seg * M_per_rank
        end = tl.where(seg == world - 1, M, start + M_per_rank)
        # M tiles touching the segment: [a, b]; only a and b can straddle, and
        # they belong to this key only if no other segment they touch outranks it
        a = start // BLOCK_M
        b = (tl.maximum(end, 1) - 1) // BLOCK_M
        a2 = a + tl.where(_tile_key(a, M, BLOCK_M, rank, world, nnodes, SCATTER) == k, 0, 1)
        b2 = b - tl.where(_tile_key(b, M, BLOCK_M, rank, world, nnodes, SCATTER) == k, 0, 1)
        rows = tl.where(end > start, tl.maximum(b2 - a2 + 1, 0), 0)
        ntiles = rows * num_pid_n
        hit = (pid >= before) & (pid < before + ntiles)
        sel_first = tl.where(hit, a2, sel_first)
        sel_rows = tl.where(hit, rows, sel_rows)
        sel_local = tl.where(hit, pid - before, sel_local)
        before = before + ntiles
        k += 1
    dm, pid_n = swizzle_2d(sel_local, sel_rows, num_pid_n, GROUP_M)
    return sel_first + dm, pid_n


@triton.jit
def swizzle_gather(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes=1, GROUP_M=8):
    """Gather-mode tile order (AllGather-GEMM): ``pid -> (pid_m, pid_n)``.

    A (``M`` rows) is all-gathered along M: ``rank``'s own segment is local,
    the others arrive over time in the order own, ``rank+1``, ``rank+2``, ...
    on the node, then the other nodes (intra-node before inter-node).  The
    order computes first the tiles whose rows are all local, then, segment by
    segment in arrival order, the tiles that become computable when that
    segment arrives, so no program waits for data while computable tiles
    remain, and a program waiting on segment ``s`` overlaps with ``s``'s
    transfer.  Within one segment the tiles are in :func:`swizzle_2d` order
    (``GROUP_M``) for L2 reuse.

    Non-perfect shapes: a tile straddling segments (``M // world`` not a
    multiple of ``BLOCK_M``) needs all of them and is scheduled with the
    segment that arrives *last* (the paper postpones cross-rank tiles in
    gather mode); the consumer waits for every segment in
    :func:`tile_segments`.  ``N`` need not be a multiple of ``BLOCK_N``.
    ``nnodes`` must divide ``world``.  ``world`` may be a runtime value
    (``dl.num_ranks()``); the loop runs ``world`` times.
    """
    return _swizzle_dist(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M, 0)


@triton.jit
def swizzle_scatter(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes=1, GROUP_M=8):
    """Scatter-mode tile order (GEMM-ReduceScatter): ``pid -> (pid_m, pid_n)``.

    Output rows of segment ``s`` go to rank ``s``.  Tiles are produced in the
    order their destinations consume them: first the other nodes' segments
    (node ``+1`` first, in each starting at local rank ``+1``; their
    transfers are the longest), then the node's ring ``rank+1, rank+2, ...``,
    and the rank's own segment, which no transfer waits for, last.  So every
    rank has data for its first consumer early instead of all ranks starting
    on segment 0.  Within one segment the tiles are in :func:`swizzle_2d`
    order (``GROUP_M``).

    Non-perfect shapes: a tile straddling segments is needed by all of their
    ranks and is produced with the *earliest* of them (the paper moves
    cross-rank tiles to the left in scatter mode), so a tile touching the own
    segment and a remote one is not in the final, local-only part.
    ``nnodes`` must divide ``world``.
    """
    return _swizzle_dist(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M, 1)


# ---------------------------------------------------------------------------
# host twins: the same code objects on Python integers
# ---------------------------------------------------------------------------

def _cdiv(a, b):
    return (a + b - 1) // b


_tl_host = _types.SimpleNamespace(
    minimum=min,
    maximum=max,
    where=lambda cond, a, b: a if cond else b,
    cdiv=_cdiv,
    constexpr=tl.constexpr,
)
_HOST_GLOBALS = {"tl": _tl_host, "__builtins__": __builtins__}


def _twin_of(jit_fn, g, name):
    """``jit_fn``'s code as a Python function whose globals are ``g`` (its helpers' twins and a ``tl``)."""
    fn = jit_fn.fn
    return _types.FunctionType(fn.__code__, g, name, fn.__defaults__, fn.__closure__)


def _host_twin(jit_fn):
    fn = jit_fn.fn
    twin = _twin_of(jit_fn, _HOST_GLOBALS, fn.__name__ + "_py")
    twin.__doc__ = (f"Host twin of :func:`{fn.__name__}` (same code, Python integers).\n\n" + (fn.__doc__ or ""))
    twin.__qualname__ = twin.__name__
    twin.__module__ = __name__
    _HOST_GLOBALS[fn.__name__] = twin
    return twin


swizzle_2d_py = _host_twin(swizzle_2d)
_owner_py = _host_twin(_owner)
tile_segments_py = _host_twin(tile_segments)
segment_position_py = _host_twin(segment_position)
_segment_at_py = _host_twin(_segment_at)
_tile_key_py = _host_twin(_tile_key)
_swizzle_dist_py = _host_twin(_swizzle_dist)
swizzle_gather_py = _host_twin(swizzle_gather)
swizzle_scatter_py = _host_twin(swizzle_scatter)


def host_twins(tl_ns) -> dict:
    """The twins over another ``tl`` namespace (its ``minimum`` / ``maximum`` / ``where`` / ``cdiv`` /
    ``constexpr``): jit function name -> Python function, each calling the others' twins.  The simulator's
    int32 twins (``ditron.sim.scalar_twins``) are these."""
    g = {"tl": tl_ns, "__builtins__": __builtins__}
    for jf in (swizzle_2d, _owner, tile_segments, segment_position, _segment_at, _tile_key, _swizzle_dist,
               swizzle_gather, swizzle_scatter):
        g[jf.fn.__name__] = _twin_of(jf, g, jf.fn.__name__)
    return g


def tile_order_py(mode, M, N, BLOCK_M, BLOCK_N, rank=0, world=1, nnodes=1, GROUP_M=8):
    """The whole schedule as a list of ``(pid_m, pid_n)``, index = ``pid``.
    ``mode``: ``"2d"``, ``"gather"`` or ``"scatter"``.  For tests, plots and
    host-side planning."""
    num_pid_m, num_pid_n = _cdiv(M, BLOCK_M), _cdiv(N, BLOCK_N)
    total = num_pid_m * num_pid_n
    if mode == "2d":
        return [swizzle_2d_py(p, num_pid_m, num_pid_n, GROUP_M) for p in range(total)]
    fn = {"gather": swizzle_gather_py, "scatter": swizzle_scatter_py}[mode]
    return [fn(p, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M) for p in range(total)]
