"""The flash-attention core of the attention zoo (``@triton.jit`` helpers
shared by ring attention, :mod:`kernels.attention`, and its tests).

One program owns a ``[BLOCK_M, HEAD_D]`` tile of queries and keeps the
online-softmax state in registers: the fp32 accumulator, the running row sum
``l`` and the running row maximum ``m`` (in log2 units: scores are scaled by
``sm_scale * log2(e)`` so that ``exp2`` replaces ``exp``).  Keys arrive in
``BLOCK_N`` tiles from any number of sources (this rank's K/V, then peers'
copies through ``dl.symm_at``); each source is a list of *chunks* (1, or 2
with zig-zag sharding) with a global chunk index, which is all the causal
mask needs:

* key chunk before the query chunk: every key is visible -- unmasked tiles
  (a masked tail tile where the chunk length is not a multiple of ``BLOCK_N``);
* the query chunk itself: the tiles left of the query tile unmasked, the
  diagonal tiles with the causal mask;
* a later chunk: skipped.

Only builtins and @triton.jit functions of this module are used (Triton's
library functions such as ``tl.max`` or ``tl.zeros`` are not interpretable in
the simulator's workers).
"""
from __future__ import annotations

import triton
import triton.language as tl

#: the running maximum starts finite, so that a tile whose keys are all
#: masked (-inf) gives exp2(-inf - m) = 0 and no NaN
M_INIT = tl.constexpr(-1.0e30)


@triton.jit
def _fmax(a, b):
    return tl.maximum(a, b)


@triton.jit
def _fadd(a, b):
    return a + b


@triton.jit
def chunk_id(r, h, WORLD: tl.constexpr, NCH: tl.constexpr):
    """Global index of chunk ``h`` of rank ``r``: contiguous sharding (one
    chunk per rank) or zig-zag (rank ``r`` holds chunks ``r`` and ``2W-1-r``)."""
    if NCH == 1:
        g = r
    else:
        g = tl.where(h == 0, r, 2 * WORLD - 1 - r)
    return g


@triton.jit
def attend_tiles(acc, l_i, m_i, q, kb, vb, kdesc, vdesc, drow, dcol, qidx, lo, hi, C, qk_scale, allvis,
                 MODE: tl.constexpr, TMA: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr):
    """Keys ``[lo, hi)`` of one chunk (indices within the chunk).  ``kb`` /
    ``vb``: the chunk's first row (pointer loads), or ``kdesc`` / ``vdesc``
    with the chunk at row ``dcol`` of descriptor row ``drow`` (TMA; out-of-range
    rows read zeros or the next chunk's rows, masked like the tail).
    ``MODE`` 0: no mask (every key < C visible), 1: keys >= C masked (tail),
    2: keys >= C masked and, unless ``allvis``, the causal mask (key index <=
    query index, within the same chunk)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    for n0 in range(lo, hi, BLOCK_N):
        kidx = n0 + offs_n
        if TMA:
            k = tl.reshape(kdesc.load([drow, dcol + n0, 0]), [BLOCK_N, HEAD_D])
        else:
            kp = kb + kidx[:, None] * HEAD_D + offs_d[None, :]
            if MODE == 0:
                k = tl.load(kp)
            else:
                k = tl.load(kp, mask=(kidx < C)[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        if MODE == 1:
            qk = tl.where((kidx < C)[None, :], qk, float("-inf"))
        if MODE == 2:
            qk = tl.where(((kidx[None, :] <= qidx[:, None]) | allvis) & (kidx < C)[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(qk, 1, _fmax) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.reduce(p, 1, _fadd)
        acc = acc * alpha[:, None]
        if TMA:
            v = tl.reshape(vdesc.load([drow, dcol + n0, 0]), [BLOCK_N, HEAD_D])
        else:
            vp = vb + kidx[:, None] * HEAD_D + offs_d[None, :]
            if MODE == 0:
                v = tl.load(vp)
            else:
                v = tl.load(vp, mask=(kidx < C)[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attend_chunk(acc, l_i, m_i, q, kb, vb, kdesc, vdesc, drow, dcol, qidx, m0, qg, kg, C, qk_scale,
                 CAUSAL: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_D: tl.constexpr, SAME: tl.constexpr):
    """One key chunk (global index ``kg``, ``C`` keys) against the query tile
    at row ``m0`` of query chunk ``qg``: all of it, its diagonal part, or
    nothing (see the module docstring) -- always as one unmasked and one
    masked loop with bounds computed here (no branch around the loops:
    loops in the branches of a runtime ``if`` would each get their own
    shared-memory pipeline buffers).  ``SAME``: ``kg == qg`` is known at
    compile time (one rank, one chunk)."""
    n_full = C // BLOCK_N * BLOCK_N
    if CAUSAL:
        lo_d = m0 // BLOCK_N * BLOCK_N
        hi_d = tl.minimum(m0 + BLOCK_M, C)
        if SAME:
            hi0 = lo_d
            lo1 = lo_d
            hi1 = hi_d
            allvis = False
        else:
            allvis = kg < qg
            same = kg == qg
            hi0 = tl.where(allvis, n_full, tl.where(same, lo_d, 0))
            lo1 = tl.where(allvis, n_full, lo_d)
            hi1 = tl.where(allvis, C, tl.where(same, hi_d, lo1))
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, kb, vb, kdesc, vdesc, drow, dcol, qidx, 0, hi0, C,
                                     qk_scale, allvis, 0, TMA, BLOCK_N, HEAD_D)
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, kb, vb, kdesc, vdesc, drow, dcol, qidx, lo1, hi1, C,
                                     qk_scale, allvis, 2, TMA, BLOCK_N, HEAD_D)
    else:
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, kb, vb, kdesc, vdesc, drow, dcol, qidx, 0, n_full, C,
                                     qk_scale, True, 0, TMA, BLOCK_N, HEAD_D)
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, kb, vb, kdesc, vdesc, drow, dcol, qidx, n_full, C, C,
                                     qk_scale, True, 1, TMA, BLOCK_N, HEAD_D)
    return acc, l_i, m_i


@triton.jit
def attend_source(acc, l_i, m_i, q, kb, vb, kdesc, vdesc, drow, qidx, m0, qg, src, C, qk_scale,
                  WORLD: tl.constexpr, NCH: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr):
    """Every chunk of rank ``src``'s K/V of one head (``kb`` / ``vb``: its
    first row; chunk ``h`` starts ``h * C`` rows later)."""
    for h in tl.static_range(NCH):
        acc, l_i, m_i = attend_chunk(acc, l_i, m_i, q, kb + h * C * HEAD_D, vb + h * C * HEAD_D, kdesc, vdesc,
                                     drow, h * C, qidx, m0, qg, chunk_id(src, h, WORLD, NCH), C, qk_scale,
                                     CAUSAL, TMA, BLOCK_M, BLOCK_N, HEAD_D, WORLD == 1 and NCH == 1)
    return acc, l_i, m_i


@triton.jit
def store_rows(o_ptr, lse_ptr, acc, l_i, m_i, rows, row_ok, HEAD_D: tl.constexpr):
    """``acc / l`` into the output rows (``o_ptr``: the head's first row) and
    the natural-log LSE into ``lse_ptr`` (the head's first entry)."""
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    offs_d = tl.arange(0, HEAD_D)
    tl.store(o_ptr + rows[:, None] * HEAD_D + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse_ptr + rows, (m_i + tl.log2(l_safe)) * 0.6931471805599453, mask=row_ok)
