"""GEMV tiles of the decoder step's batch path (the ``tl.dot`` path; issue 26: batch 8 within 1.3x batch 1).

With the batch rows as the MMA's M operand (``x @ w^T``, :func:`~.tiles_gemv._gemv_acc`) Triton lays the warps over
those few rows, so every warp multiplies, and reads from shared memory, the whole weight chunk.  Here the warps
split the weights instead: gate/up with its gate and up rows stacked as M (``w @ x^T``; ``TileConfig.gu_wdot``),
qkv / o / down with each K chunk split over the warps by a batched ``tl.dot`` (``TileConfig.dot_ksplit``); the
tiles are ``[columns, batch rows]``.  Also the prenorm tiles that load their epilogue's inputs before the weight
stream (``TileConfig.pn_early``).  Conventions: :mod:`.tiles`; the shared GEMV helpers: :mod:`.tiles_gemv`."""
from __future__ import annotations

import triton
import triton.language as tl

from .tiles_gemv import (_cols_mask, _cols_n0, _gemv_acc, _resnorm_commit, _resnorm_index, _resnorm_operands,
                         _rstd_rows, _store_rows, _store_silu_mul)


@triton.jit
def _wdot_gu_acc(x_ptr, w_ptr, n0, B, N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STREAM: tl.constexpr, COLS: tl.constexpr = 0):
    """``(g, u)``, each ``[BLOCK_N, BLOCK_B]`` float32: ``g[n, b] = sum_k w[n0 + n, k] * x[b, k]`` (gate rows of
    ``w[2N, K]``) and ``u`` the same over the up rows ``N + n0 + n`` (``TileConfig.gu_wdot``, the batch path).
    The weights are the MMA's M operand: gate and up rows stacked into one ``[2 * BLOCK_N, BLOCK_K]`` chunk, the
    batch rows its N operand (``x^T``: ``BLOCK_B >= 8`` columns, no padding to 16).  With ``2 * BLOCK_N`` a multiple
    of 16 per warp every warp reads its own weight rows from shared memory once; the ``tl.dot`` of
    :func:`_gemv_acc` puts the few batch rows on M, where every warp computed (and read) the whole chunk.
    ``STREAM``: the software pipeline depth (``cp.async`` of the weight and activation chunks).  ``COLS > 0``
    (``TileConfig.gu_wdot_cols``): only the first ``COLS`` gate and up rows are read (the others are zero)."""
    r = tl.arange(0, 2 * BLOCK_N)
    up = r >= BLOCK_N
    j = r - tl.where(up, BLOCK_N, 0)
    n = n0 + j
    rows = n + tl.where(up, N, 0)
    mn = n < N
    if COLS > 0:
        mn = mn & (j < COLS)
    offs_b = tl.arange(0, BLOCK_B)
    mb = offs_b < B
    acc = tl.zeros([2 * BLOCK_N, BLOCK_B], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STREAM):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mk = offs_k < K
        w = tl.load(w_ptr + rows[:, None] * K + offs_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0,
                    eviction_policy="evict_first")
        x = tl.load(x_ptr + offs_b[:, None] * K + offs_k[None, :], mask=mb[:, None] & mk[None, :], other=0.0)
        acc = tl.dot(w, tl.trans(x.to(w.dtype)), acc)
    g, u = tl.split(tl.permute(tl.reshape(acc, (2, BLOCK_N, BLOCK_B)), (1, 2, 0)))
    return g, u


@triton.jit
def _store_cols(out_ptr, val, n0, B, N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                COLS: tl.constexpr = 0):
    """``out[b, n0 + n] = val[n, b]`` (``val``: ``[BLOCK_N, BLOCK_B]``, the transposed tiles of
    :func:`_wdot_gu_acc`); ``COLS > 0``: only ``n < COLS`` (:func:`~.tiles_gemv._cols_mask`)."""
    offs_b = tl.arange(0, BLOCK_B)
    offs_n, mn = _cols_mask(n0, N, BLOCK_N, COLS)
    tl.store(out_ptr + offs_b[None, :] * N + offs_n[:, None], val.to(out_ptr.dtype.element_ty),
             mask=(offs_b < B)[None, :] & mn[:, None])


@triton.jit
def _store_silu_mul_cols(out_ptr, g, u, rstd, n0, B, N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                         COLS: tl.constexpr):
    """The prenorm ``gu_wdot`` tiles' epilogue: ``out = bf16(silu(g * rstd) * (u * rstd))`` on the transposed
    tiles (``rstd``: ``[BLOCK_B]``; :func:`_store_cols`, ``COLS``)."""
    g = g * rstd[None, :]
    u = u * rstd[None, :]
    _store_cols(out_ptr, g / (1.0 + tl.exp(-g)) * u, n0, B, N, BLOCK_B, BLOCK_N, COLS)


@triton.jit
def gate_up_wdot_tile(tile, x_ptr, w_ptr, out_ptr, layer, B, N: tl.constexpr, K: tl.constexpr,
                      BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STREAM: tl.constexpr):
    """:func:`gate_up_tile` of the batch path with the weight rows on the MMA's M side (:func:`_wdot_gu_acc`;
    ``TileConfig.gu_wdot``): ``out[B, N] = bf16(silu(x @ gate^T) * (x @ up^T))``, columns
    ``[tile * BLOCK_N, +BLOCK_N)``."""
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    n0 = tile * BLOCK_N
    g, u = _wdot_gu_acc(x_ptr, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, STREAM)
    _store_cols(out_ptr, g / (1.0 + tl.exp(-g)) * u, n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def gate_up_rstd_wdot_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, N: tl.constexpr, K: tl.constexpr,
                           NT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, STREAM: tl.constexpr, COLS: tl.constexpr = 0):
    """:func:`gate_up_rstd_tile` (``TileConfig.prenorm``) on the layout of :func:`gate_up_wdot_tile`; ``COLS > 0``
    (``TileConfig.gu_wdot_cols``): columns ``[tile * COLS, +COLS)``, the other rows masked (as ``gate_up_cols``)."""
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    n0 = _cols_n0(tile, BLOCK_N, COLS)
    g, u = _wdot_gu_acc(x_ptr, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, STREAM, COLS)
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    _store_silu_mul_cols(out_ptr, g, u, rstd, n0, B, N, BLOCK_B, BLOCK_N, COLS)


@triton.jit
def linear_rstd_early_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, N: tl.constexpr, K: tl.constexpr,
                           NT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr):
    """:func:`linear_rstd_tile` that loads its rows' partial sums of squares before the weight stream
    (``TileConfig.pn_early``): they are ready when the tile starts (its producers are its dependencies), so the
    load's latency overlaps the stream instead of following it at the end of every tile."""
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * BLOCK_N
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr, x_ptr, x_ptr,
                       0, 0.0, STREAM, K)
    _store_rows(out_ptr, acc * rstd[:, None], n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def gate_up_rstd_early_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, N: tl.constexpr, K: tl.constexpr,
                            NT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr, COLS: tl.constexpr = 0):
    """:func:`gate_up_rstd_tile` (``COLS`` as there: ``TileConfig.gate_up_cols``) with ``rstd`` loaded first
    (:func:`linear_rstd_early_tile`)."""
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    n0 = _cols_n0(tile, BLOCK_N, COLS)
    g, u = _gemv_acc(x_ptr, wl, wl + N * K, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, True, x_ptr, x_ptr,
                     x_ptr, 0, 0.0, STREAM, K, COLS)
    _store_silu_mul(out_ptr, g, u, rstd, n0, B, N, BLOCK_B, BLOCK_N, COLS)


@triton.jit
def gate_up_rstd_wdot_early_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, N: tl.constexpr,
                                 K: tl.constexpr, NT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr,
                                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STREAM: tl.constexpr,
                                 COLS: tl.constexpr = 0):
    """:func:`gate_up_rstd_wdot_tile` (``COLS`` as there) with ``rstd`` loaded first
    (:func:`linear_rstd_early_tile`)."""
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    n0 = _cols_n0(tile, BLOCK_N, COLS)
    g, u = _wdot_gu_acc(x_ptr, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, STREAM, COLS)
    _store_silu_mul_cols(out_ptr, g, u, rstd, n0, B, N, BLOCK_B, BLOCK_N, COLS)


@triton.jit
def linear_resnorm_early_tile(tile, x_ptr, w_ptr, x0_ptr, resid_ptr, nw_ptr, hn_ptr, ss_ptr, layer, norm, first, B,
                              N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr, COLS: tl.constexpr):
    """:func:`linear_resnorm_tile` that loads its columns of the residual stream and the norm weights before the
    weight stream (``TileConfig.pn_early``; see :func:`linear_rstd_early_tile`)."""
    n0 = tile * COLS
    offs_b, offs_n, mb, mn, off, m = _resnorm_index(n0, B, N, BLOCK_B, BLOCK_N, COLS)
    r0, nw = _resnorm_operands(x0_ptr, resid_ptr, nw_ptr, norm, first, off, m, offs_n, mn, N)
    wl = w_ptr + layer.to(tl.int64) * N * K
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr, x_ptr, x_ptr,
                       0, 0.0, STREAM, K, COLS % BLOCK_N)     # (0: all BLOCK_N rows)
    _resnorm_commit(r0, acc, nw[None, :], m, mb, off, offs_b, tile, resid_ptr, hn_ptr, ss_ptr, N, COLS, 1)


@triton.jit
def linear_kdot_tile(tile, x_ptr, w_ptr, out_ptr, layer, B, N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, S: tl.constexpr, STREAM: tl.constexpr):
    """:func:`~.tiles_gemv.linear_tile` of the batch path with each K chunk split over ``S`` warps
    (``TileConfig.dot_ksplit``): the chunk is loaded as ``[S, BLOCK_N, BLOCK_K / S]`` weights and
    ``[S, BLOCK_B, BLOCK_K / S]`` activations and multiplied by one batched ``tl.dot`` (``w @ x^T`` per slice: the
    weight rows on M, the batch rows the N operand), so Triton lays the warps over the slices
    (``warpsPerCTA = [S, 1, 1]``): each warp reads and multiplies its own quarter of the chunk once, where the plain
    path's 4 warps each multiply the whole ``[8, BLOCK_K] x [BLOCK_K, BLOCK_N]`` product.  The slices' partial sums
    are added once, after the stream."""
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * BLOCK_N
    acc = _kdot_acc(x_ptr, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, S, STREAM, BLOCK_N)
    _store_cols(out_ptr, acc, n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def _kdot_acc(x_ptr, wl, n0, B, N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, S: tl.constexpr, STREAM: tl.constexpr, COLS: tl.constexpr):
    """``acc[n, b] = sum_k wl[n0 + n, k] * x[b, k]`` (``[BLOCK_N, BLOCK_B]`` float32; rows ``n >= COLS`` zero) with
    each K chunk multiplied as a batched ``tl.dot`` over ``S`` slices (see :func:`linear_kdot_tile`)."""
    KS: tl.constexpr = BLOCK_K // S
    s3 = tl.arange(0, S)[:, None, None]
    r3 = tl.arange(0, BLOCK_N)[None, :, None]
    n3 = n0 + r3
    b3 = tl.arange(0, BLOCK_B)[None, :, None]
    k3 = tl.arange(0, KS)[None, None, :]
    mn3 = (n3 < N) & (r3 < COLS)
    acc = tl.zeros([S, BLOCK_N, BLOCK_B], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STREAM):
        kk = k0 + s3 * KS + k3
        w = tl.load(wl + n3 * K + kk, mask=mn3 & (kk < K), other=0.0, eviction_policy="evict_first")
        x = tl.load(x_ptr + b3 * K + kk, mask=(b3 < B) & (kk < K), other=0.0)
        acc = tl.dot(w, tl.permute(x.to(w.dtype), (0, 2, 1)), acc)
    return tl.sum(acc, axis=0)


@triton.jit
def linear_rstd_kdot_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, N: tl.constexpr, K: tl.constexpr,
                          NT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, S: tl.constexpr, STREAM: tl.constexpr):
    """:func:`~.tiles_gemv.linear_rstd_tile` (``prenorm``) on :func:`_kdot_acc` (``TileConfig.dot_ksplit``), its
    rows' ``rstd`` loaded before the weight stream."""
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * BLOCK_N
    acc = _kdot_acc(x_ptr, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, S, STREAM, BLOCK_N)
    _store_cols(out_ptr, acc * rstd[None, :], n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def linear_resnorm_kdot_tile(tile, x_ptr, w_ptr, x0_ptr, resid_ptr, nw_ptr, hn_ptr, ss_ptr, layer, norm, first, B,
                             N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, S: tl.constexpr, STREAM: tl.constexpr, COLS: tl.constexpr):
    """:func:`~.tiles_gemv.linear_resnorm_tile` (``prenorm``: o_proj / down_proj) on :func:`_kdot_acc`
    (``TileConfig.dot_ksplit``), its residual columns and norm weights loaded before the weight stream; the
    tile is ``[columns, batch rows]``."""
    offs_b = tl.arange(0, BLOCK_B)
    n0 = tile * COLS
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mb = offs_b < B
    mn = (offs_n < N) & (tl.arange(0, BLOCK_N) < COLS)
    off = offs_b[None, :] * N + offs_n[:, None]
    m = mn[:, None] & mb[None, :]
    r0, nw = _resnorm_operands(x0_ptr, resid_ptr, nw_ptr, norm, first, off, m, offs_n, mn, N)
    wl = w_ptr + layer.to(tl.int64) * N * K
    acc = _kdot_acc(x_ptr, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, S, STREAM, COLS)
    _resnorm_commit(r0, acc, nw[:, None], m, mb, off, offs_b, tile, resid_ptr, hn_ptr, ss_ptr, N, COLS, 0)
