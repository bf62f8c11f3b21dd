"""GEMV, RMSNorm and residual tiles of the decoder step (the weight-streaming phases), plus the step's first
task (``advance_tile``).  Conventions: :mod:`.tiles`."""
from __future__ import annotations

import triton
import triton.language as tl

import ditron.language as dl

#: K elements per partial sum of the FMA GEMV (:func:`_mac`): one thread's 16-byte vector of bf16 weights
_LANE_K = tl.constexpr(8)


@triton.jit
def advance_tile(tile, seq_ptr, B, BLOCK_B: tl.constexpr):
    """The step's first task: one more position in every sequence's KV cache (``seq[b] += 1``, ``b < B``)."""
    offs = tl.arange(0, BLOCK_B)
    m = offs < B
    tl.store(seq_ptr + offs, tl.load(seq_ptr + offs, mask=m, other=0) + 1, mask=m)


@triton.jit
def add_rmsnorm_tile(tile, x_ptr, delta_ptr, resid_ptr, w_ptr, out_ptr, layer, first, eps, N: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Batch row ``tile``: ``r = x`` (``first != 0``) or ``r = resid + delta``;
    ``resid = r`` (float32); ``out = bf16(r * rsqrt(mean(r^2) + eps) * w[layer])``.
    ``w`` is ``[num_norms, N]`` (``layer`` picks the norm)."""
    row = tile.to(tl.int64) * N
    offs0 = tl.arange(0, BLOCK)
    ss = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, N, BLOCK):
        offs = k0 + offs0
        m = offs < N
        if first != 0:
            r = tl.load(x_ptr + row + offs, mask=m, other=0.0).to(tl.float32)
        else:
            r = (tl.load(resid_ptr + row + offs, mask=m, other=0.0).to(tl.float32)
                 + tl.load(delta_ptr + row + offs, mask=m, other=0.0).to(tl.float32))
        tl.store(resid_ptr + row + offs, r, mask=m)
        ss += r * r
    rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / N + eps)
    wl = w_ptr + layer.to(tl.int64) * N
    for k0 in range(0, N, BLOCK):
        offs = k0 + offs0
        m = offs < N
        # the same offsets and layout as the store above: each element is re-read by the thread that wrote it
        r = tl.load(resid_ptr + row + offs, mask=m, other=0.0)
        w = tl.load(wl + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row + offs, (r * rstd * w).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def add_resid_tile(tile, x_ptr, resid_ptr, delta_ptr, first, N: tl.constexpr, BLOCK: tl.constexpr):
    """Elements ``[tile * BLOCK, +BLOCK)`` of the flattened ``[B, H]`` residual stream (``N = B * H``):
    ``resid = x`` (``first != 0``) or ``resid + delta`` -- the residual add that the fused-norm GEMV tiles
    (:func:`rms_linear_tile`, :func:`rms_gate_up_tile`) apply on the fly, committed once."""
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    if first != 0:
        r = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    else:
        r = tl.load(resid_ptr + offs, mask=m, other=0.0) + tl.load(delta_ptr + offs, mask=m, other=0.0)
    tl.store(resid_ptr + offs, r, mask=m)


@triton.jit
def _resid_chunk(x_ptr, resid_ptr, delta_ptr, first, offs_b, mb, offs_k, mk, K: tl.constexpr):
    """float32 ``[BLOCK_B, BLOCK_K]`` chunk of the residual stream with the pending add applied."""
    off = offs_b[:, None] * K + offs_k[None, :]
    m = mb[:, None] & mk[None, :]
    if first != 0:
        r = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    else:
        r = (tl.load(resid_ptr + off, mask=m, other=0.0).to(tl.float32)
             + tl.load(delta_ptr + off, mask=m, other=0.0).to(tl.float32))
    return r


@triton.jit
def _act_chunk(x_ptr, resid_ptr, delta_ptr, nw_ptr, first, offs_b, mb, offs_k, mk, K: tl.constexpr,
               NORM: tl.constexpr):
    """The GEMV's activation chunk ``[BLOCK_B, BLOCK_K]`` and the norm weights ``[BLOCK_K]``: ``NORM``: the
    residual stream ``r`` (float32, :func:`_resid_chunk`) and ``nw``; else ``x`` (its dtype) and zeros (unused)."""
    if NORM:
        a = _resid_chunk(x_ptr, resid_ptr, delta_ptr, first, offs_b, mb, offs_k, mk, K)
        nw = tl.load(nw_ptr + offs_k, mask=mk, other=0.0).to(tl.float32)
    else:
        a = tl.load(x_ptr + offs_b[:, None] * K + offs_k[None, :], mask=mb[:, None] & mk[None, :], other=0.0)
        nw = offs_k.to(tl.float32) * 0.0
    return a, nw


@triton.jit
def _cols_n0(tile, BLOCK_N: tl.constexpr, COLS: tl.constexpr):
    """The first column of tile ``tile`` of a GEMV whose tiles hold ``COLS`` columns each, 0: ``BLOCK_N`` (the
    gate/up tiles of ``TileConfig.gate_up_cols``, whose default 0 keeps the plain tiles' constants)."""
    return tile * (BLOCK_N if COLS == 0 else COLS)


@triton.jit
def _cols_mask(n0, N: tl.constexpr, BLOCK_N: tl.constexpr, COLS: tl.constexpr):
    """``(offs_n, mn)``: the columns ``n0 + [0, BLOCK_N)`` of a tile and their mask, ``< N`` and, with ``COLS > 0``,
    only the first ``COLS`` of them (a masked tile: the other rows are never read nor written)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mn = offs_n < N
    if COLS > 0:
        mn = mn & (tl.arange(0, BLOCK_N) < COLS)
    return offs_n, mn


@triton.jit
def _w_chunk(w_ptr, offs_n, mn, offs_k, mk, K: tl.constexpr):
    # weights are read once per step: stream them past L2
    return tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _mac(acc, x, w, DOT: tl.constexpr, BLOCK_B: tl.constexpr):
    """``DOT``: ``acc[b, n] += sum_k x[b, k] * w[n, k]`` with ``tl.dot``.  Otherwise (a few batch rows) ``acc``
    holds partial sums, ``[BLOCK_N, BLOCK_K // J, BLOCK_B]``: per row ``b`` the 2-D product ``w * x[b]`` is
    viewed as ``[BLOCK_N, BLOCK_K // J, J]`` and only its last axis is summed, i.e. each thread adds up the ``J``
    (8) neighbouring K elements it loaded itself (one 16-byte vector of bf16 weights); the ``BLOCK_K // J`` partial
    sums per output are added once, after the K loop (:func:`_gemv_acc`).  Reducing every chunk along all of K, as
    before, cost each chunk a shuffle tree across the lanes and, for chunks wider than one warp, a round trip
    through shared memory with barriers (sm_90a, Triton 3.6, batch 1: o_proj's K loop 668 instructions per chunk
    with 82 shuffles, 17 shared stores and 3 barriers; now 455, no shuffles, the pipeliner's 2 barriers).  The
    product is formed in the weight chunk's own layout: a 3-D broadcast ``x[:, None, :] * w[None, :, :]`` would make
    Triton move every weight chunk through shared memory to change its layout."""
    if DOT:
        acc = tl.dot(x.to(w.dtype), tl.trans(w), acc)
    else:
        BN: tl.constexpr = w.shape[0]
        PARTS: tl.constexpr = acc.shape[1]             # BLOCK_K // J (_gemv_acc)
        J: tl.constexpr = w.shape[1] // PARTS
        wf = w.to(tl.float32)
        xf = x.to(tl.float32)
        rows = tl.arange(0, BLOCK_B)
        for b in tl.static_range(BLOCK_B):
            xb = tl.sum(tl.where(rows[:, None] == b, xf, 0.0), axis=0)          # row b of x: [BLOCK_K]
            part = tl.sum(tl.reshape(wf * xb[None, :], [BN, PARTS, J]), axis=2)     # [BLOCK_N, BLOCK_K / J]
            if BLOCK_B == 1:
                acc += part[:, :, None]
            else:
                acc += tl.where(rows[None, None, :] == b, part[:, :, None], 0.0)
    return acc


@triton.jit
def _gemv_acc(x_ptr, w_ptr, w2_ptr, n0, B, N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, NORM: tl.constexpr, TWO: tl.constexpr,
              resid_ptr, delta_ptr, nw_ptr, first, eps, STREAM: tl.constexpr, LD: tl.constexpr,
              COLS: tl.constexpr = 0, wait_ptr=0, epoch=0, WAIT_PN: tl.constexpr = 0, WAIT_SEG: tl.constexpr = 1,
              WAIT_EXACT: tl.constexpr = False, WAIT_LOAD: tl.constexpr = False):
    """``(acc, acc2)``: ``acc[b, n] = sum_k x[b, k] * w[n0 + n, k]`` in float32 (``x``: ``[B, K]``, ``w``:
    ``[N, K]``; rows of both ``LD`` elements apart: ``K`` but for a split-K slice) and the same with ``w2`` when
    ``TWO`` (gate and up share ``x``; else ``acc2`` is ``acc``).
    ``COLS > 0``: only the first ``COLS`` of the ``BLOCK_N`` rows (the others are zero).
    ``DOT``: ``tl.dot`` (``BLOCK_B >= 16``; rows past ``B`` are zero).  ``NORM``: ``x`` is the RMSNorm of the
    residual stream ``r`` with weights ``nw``, computed as ``rsqrt(mean(r^2) + eps) * ((r * nw) @ w^T)``: the
    sum of squares is accumulated in the same pass over ``K`` (no separate norm pass before the weights stream).

    One pass over ``K`` in ``[BLOCK_N, BLOCK_K]`` chunks, double-buffered in registers: the loads of chunk
    ``k + 1`` (weights and activations) are issued before chunk ``k`` is reduced, so a program always has a
    chunk of weights in flight.  ``STREAM > 0`` (``TileConfig.dot_stream`` on the ``tl.dot`` path,
    ``TileConfig.gemv_stream`` on the FMA path of small batches): a plain loop ``tl.range(...,
    num_stages=STREAM)`` that Triton's software pipeliner turns into ``cp.async`` copies into shared memory,
    ``STREAM - 1`` chunks ahead (the weight stream held in shared memory instead of registers; the loop's
    explicit ``num_stages`` makes Triton pipeline loads that do not feed a ``tl.dot``).

    ``WAIT_PN > 0`` (``TileConfig.stream_wait``, ``STREAM > 0`` only): the producers of ``x`` are waited on here,
    not before the tile (``Dep(..., inner=True)``): producer tile ``p`` (scoreboard slot ``wait_ptr + p``) wrote
    columns ``[p * WAIT_PN, +WAIT_PN)`` of ``x``; per ``WAIT_SEG`` K chunks (a segment) one ``dl.wait_deps`` on
    the producers of the segment's columns, ``STREAM`` iterations before the segment is reduced (before the
    pipeline requests its activations), those of the first ``STREAM`` chunks before the loop.  The segments cover
    all of ``K``: when the loop ends every producer tile was waited on (their other outputs, e.g. the sums of
    squares of ``hn``, may be read after)."""
    offs_b = tl.arange(0, BLOCK_B)
    mb = offs_b < B
    offs_n, mn = _cols_mask(n0, N, BLOCK_N, COLS)   # COLS < BLOCK_N columns: the other rows masked (never read)
    if DOT:
        acc = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
        acc2 = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    else:                                     # transposed partial sums, J = _LANE_K K elements each: see _mac
        PARTS: tl.constexpr = BLOCK_K // min(_LANE_K, BLOCK_K)
        acc = tl.zeros([BLOCK_N, PARTS, BLOCK_B], tl.float32)
        acc2 = tl.zeros([BLOCK_N, PARTS, BLOCK_B], tl.float32)
    if DOT:     # the rows' sums of squares, reduced per chunk: a [16, BLOCK_K] float32 sum would hold registers
        ss = tl.zeros([BLOCK_B], tl.float32)
    else:
        ss = tl.zeros([BLOCK_B, BLOCK_K], tl.float32)
    if STREAM > 0 and WAIT_PN > 0 and WAIT_EXACT:
        # each segment's wait at its first chunk; the activations are loaded by dl.ld (inline asm, which Triton's
        # pipeliner neither pipelines nor moves: the wait and the load stay in the loop's last stage, with the
        # reduction), so the pipeline's prologue and its lookahead requests carry only weights: the first
        # STREAM - 1 weight chunks are requested before any wait (the activations' latency is exposed per chunk,
        # overlapping the wait for that chunk's weights)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STREAM):
            c = k0 // BLOCK_K
            lo = c * BLOCK_K // WAIT_PN
            hi = (tl.minimum((c + WAIT_SEG) * BLOCK_K, K) + WAIT_PN - 1) // WAIT_PN
            if WAIT_LOAD:
                # after the first chunk acquire loads, no fence (MEMBAR.ALL.GPU may wait for the weight copies in
                # flight); the first wait -- long for a program idle in the producer phase -- polls relaxed with a
                # fence at the end (an acquire load invalidates the SM's L1 at every poll)
                n = tl.where(c % WAIT_SEG == 0, hi - lo, 0)
                tok = dl.wait_deps(wait_ptr + lo, tl.where(c == 0, n, 0), epoch)
                tok += dl.wait_deps(wait_ptr + lo, tl.where(c == 0, 0, n), epoch, acquire="load")
            else:
                tok = dl.wait_deps(wait_ptr + lo, tl.where(c % WAIT_SEG == 0, hi - lo, 0), epoch)
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mk = offs_k < K
            # in-bounds addresses for every element (dl.ld has no mask), zeros where masked
            xa = dl.ld(dl.consume_token(x_ptr, tok) + tl.minimum(offs_b, B - 1)[:, None] * LD
                       + tl.minimum(offs_k, K - 1)[None, :], semantic="relaxed")
            x = tl.where(mb[:, None] & mk[None, :], xa, 0.0)
            acc = _mac(acc, x, _w_chunk(w_ptr, offs_n, mn, offs_k, mk, LD), DOT, BLOCK_B)
            if TWO:
                acc2 = _mac(acc2, x, _w_chunk(w2_ptr, offs_n, mn, offs_k, mk, LD), DOT, BLOCK_B)
    elif STREAM > 0 and WAIT_PN > 0:
        # the waits run STREAM chunks ahead of the chunk they cover: Triton's pipeliner issues chunk k's loads
        # (cp.async) STREAM - 1 iterations before chunk k is reduced, so a wait at iteration k - STREAM comes
        # before them in program order (a wait that a pipelined load depended on would be moved into the load's
        # stage, which the pipeliner cannot predicate); the first segments' producers are waited before the loop
        # (the pipeline's prologue follows it; its activation loads also take the token)
        NCH: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
        PRE: tl.constexpr = min(NCH, (STREAM + WAIT_SEG - 1) // WAIT_SEG * WAIT_SEG)
        tok = dl.wait_deps(wait_ptr, (min(PRE * BLOCK_K, K) + WAIT_PN - 1) // WAIT_PN, epoch)
        xw = dl.consume_token(x_ptr, tok)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STREAM):
            c = k0 // BLOCK_K + STREAM              # the chunk whose segment's producers this iteration waits for
            lo = c * BLOCK_K // WAIT_PN
            hi = (tl.minimum((c + WAIT_SEG) * BLOCK_K, K) + WAIT_PN - 1) // WAIT_PN
            if WAIT_LOAD:
                dl.wait_deps(wait_ptr + lo, tl.where((c % WAIT_SEG == 0) & (c >= PRE) & (c < NCH), hi - lo, 0), epoch,
                             acquire="load")
            else:
                dl.wait_deps(wait_ptr + lo, tl.where((c % WAIT_SEG == 0) & (c >= PRE) & (c < NCH), hi - lo, 0), epoch)
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mk = offs_k < K
            a, nw = _act_chunk(xw, resid_ptr, delta_ptr, nw_ptr, first, offs_b, mb, offs_k, mk, LD, NORM)
            x, ss = _norm_chunk(a, nw, ss, DOT, NORM)
            acc = _mac(acc, x, _w_chunk(w_ptr, offs_n, mn, offs_k, mk, LD), DOT, BLOCK_B)
            if TWO:
                acc2 = _mac(acc2, x, _w_chunk(w2_ptr, offs_n, mn, offs_k, mk, LD), DOT, BLOCK_B)
    elif STREAM > 0:
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STREAM):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mk = offs_k < K
            a, nw = _act_chunk(x_ptr, resid_ptr, delta_ptr, nw_ptr, first, offs_b, mb, offs_k, mk, LD, NORM)
            x, ss = _norm_chunk(a, nw, ss, DOT, NORM)
            acc = _mac(acc, x, _w_chunk(w_ptr, offs_n, mn, offs_k, mk, LD), DOT, BLOCK_B)
            if TWO:
                acc2 = _mac(acc2, x, _w_chunk(w2_ptr, offs_n, mn, offs_k, mk, LD), DOT, BLOCK_B)
    else:
        acc, acc2, ss = _gemv_loop(x_ptr, w_ptr, w2_ptr, offs_b, mb, offs_n, mn, acc, acc2, ss, K, BLOCK_B, BLOCK_K,
                                   DOT, NORM, TWO, resid_ptr, delta_ptr, nw_ptr, first, LD)
    if not DOT:
        acc = tl.trans(tl.sum(acc, axis=1))
        acc2 = tl.trans(tl.sum(acc2, axis=1))
    if NORM:
        if DOT:
            rstd = 1.0 / tl.sqrt(ss / K + eps)
        else:
            rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=1) / K + eps)
        acc = acc * rstd[:, None]
        acc2 = acc2 * rstd[:, None]
    if not TWO:
        acc2 = acc
    return acc, acc2


@triton.jit
def _norm_chunk(a, nw, ss, DOT: tl.constexpr, NORM: tl.constexpr):
    """One K chunk's GEMV operand of :func:`_gemv_acc` from its activations ``a`` (``[BLOCK_B, BLOCK_K]`` float32):
    ``NORM``: ``a * nw`` with the rows' sums of squares added to ``ss`` (``DOT``: reduced per chunk), else ``a``;
    returns ``(x, ss)``."""
    if NORM:
        if DOT:
            ss += tl.sum(a * a, axis=1)
        else:
            ss += a * a
        x = a * nw[None, :]
    else:
        x = a
    return x, ss


@triton.jit
def _gemv_loop(x_ptr, w_ptr, w2_ptr, offs_b, mb, offs_n, mn, acc, acc2, ss, K: tl.constexpr, BLOCK_B: tl.constexpr,
               BLOCK_K: tl.constexpr, DOT: tl.constexpr, NORM: tl.constexpr, TWO: tl.constexpr, resid_ptr, delta_ptr,
               nw_ptr, first, LD: tl.constexpr):
    """The register double-buffered pass over ``K`` of :func:`_gemv_acc`; returns ``(acc, acc2, ss)``."""
    offs_k = tl.arange(0, BLOCK_K)
    mk = offs_k < K
    w_nx = _w_chunk(w_ptr, offs_n, mn, offs_k, mk, LD)
    w2_nx = w_nx
    if TWO:
        w2_nx = _w_chunk(w2_ptr, offs_n, mn, offs_k, mk, LD)
    a_nx, nw_nx = _act_chunk(x_ptr, resid_ptr, delta_ptr, nw_ptr, first, offs_b, mb, offs_k, mk, LD, NORM)
    for k0 in range(0, K, BLOCK_K):
        w = w_nx
        w2 = w2_nx
        a = a_nx
        nw = nw_nx
        offs_k = k0 + BLOCK_K + tl.arange(0, BLOCK_K)         # the next chunk (all masked after the last)
        mk = offs_k < K
        w_nx = _w_chunk(w_ptr, offs_n, mn, offs_k, mk, LD)
        if TWO:
            w2_nx = _w_chunk(w2_ptr, offs_n, mn, offs_k, mk, LD)
        else:
            w2_nx = w_nx
        a_nx, nw_nx = _act_chunk(x_ptr, resid_ptr, delta_ptr, nw_ptr, first, offs_b, mb, offs_k, mk, LD, NORM)
        x, ss = _norm_chunk(a, nw, ss, DOT, NORM)
        acc = _mac(acc, x, w, DOT, BLOCK_B)
        if TWO:
            acc2 = _mac(acc2, x, w2, DOT, BLOCK_B)
    return acc, acc2, ss


@triton.jit
def _store_rows(out_ptr, val, n0, B, N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                COLS: tl.constexpr = 0):
    """``out[b, n0 + n] = val[b, n]`` for the rows ``b < B`` and columns ``< N``; ``COLS > 0``: only ``n < COLS``
    (a masked tile: the columns past them belong to the next tile, :func:`_cols_mask`)."""
    offs_b = tl.arange(0, BLOCK_B)
    offs_n, mn = _cols_mask(n0, N, BLOCK_N, COLS)
    tl.store(out_ptr + offs_b[:, None] * N + offs_n[None, :], val.to(out_ptr.dtype.element_ty),
             mask=(offs_b < B)[:, None] & mn[None, :])


@triton.jit
def linear_tile(tile, x_ptr, w_ptr, out_ptr, layer, B, N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr):
    """Columns ``[tile * BLOCK_N, +BLOCK_N)`` of ``out[B, N] = x[B, K] @ w[layer]^T`` (``w``: ``[L, N, K]``);
    ``out`` is bf16 or float32 (partial sums of a row-parallel projection)."""
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * BLOCK_N
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr, x_ptr, x_ptr,
                       0, 0.0, STREAM, K)
    _store_rows(out_ptr, acc, n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def linear_resid_tile(tile, x_ptr, w_ptr, x0_ptr, resid_ptr, delta_ptr, layer, first, B, N: tl.constexpr,
                      K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      DOT: tl.constexpr, STREAM: tl.constexpr):
    """:func:`linear_tile` whose output is the residual stream's next delta, with the pending residual add folded
    in (one rank, ``TileConfig.fold_resid``): for columns ``[tile * BLOCK_N, +BLOCK_N)`` of the ``[B, N]`` float32
    streams, ``resid = x0`` (``first != 0``) or ``resid + delta`` -- the add an :func:`add_resid_tile` task would
    commit -- then ``delta = x @ w[layer]^T``.  Every reader of the old ``resid`` / ``delta`` (the fused-norm GEMV
    tiles before this projection) is ordered before the tile by its dependencies, and each tile touches only its
    own columns, so the commit needs no task of its own."""
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * BLOCK_N
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr, x_ptr, x_ptr,
                       0, 0.0, STREAM, K)
    # after the weight stream (values held across it cost the 168-register budget spills)
    offs_b = tl.arange(0, BLOCK_B)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    off = offs_b[:, None] * N + offs_n[None, :]
    m = (offs_b < B)[:, None] & (offs_n < N)[None, :]
    if first != 0:
        r = tl.load(x0_ptr + off, mask=m, other=0.0).to(tl.float32)
    else:
        r = tl.load(resid_ptr + off, mask=m, other=0.0) + tl.load(delta_ptr + off, mask=m, other=0.0)
    tl.store(resid_ptr + off, r, mask=m)
    tl.debug_barrier()              # every thread's read of the old delta before any thread overwrites it
    tl.store(delta_ptr + off, acc.to(delta_ptr.dtype.element_ty), mask=m)


@triton.jit
def _resnorm_operands(x0_ptr, resid_ptr, nw_ptr, norm, first, off, m, offs_n, mn, N: tl.constexpr):
    """The prenorm epilogue's operands at ``off`` / columns ``offs_n``: the old residual (float32; the embeddings
    ``x0`` at the first layer) and the next norm's weights (float32)."""
    if first != 0:
        r0 = tl.load(x0_ptr + off, mask=m, other=0.0).to(tl.float32)
    else:
        r0 = tl.load(resid_ptr + off, mask=m, other=0.0)
    nw = tl.load(nw_ptr + norm * N + offs_n, mask=mn, other=0.0).to(tl.float32)
    return r0, nw


@triton.jit
def _resnorm_index(n0, B, N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, COLS: tl.constexpr):
    """The ``[rows, columns]`` indices of a prenorm tile of ``COLS`` columns from ``n0``: ``(offs_b, offs_n, mb,
    mn, off, m)`` (row and column offsets and masks, element offsets into ``[B, N]``, their mask)."""
    offs_b = tl.arange(0, BLOCK_B)
    offs_n, mn = _cols_mask(n0, N, BLOCK_N, COLS)
    mb = offs_b < B
    off = offs_b[:, None] * N + offs_n[None, :]
    m = mb[:, None] & mn[None, :]
    return offs_b, offs_n, mb, mn, off, m


@triton.jit
def _resnorm_epilogue(acc, tile, n0, B, x0_ptr, resid_ptr, nw_ptr, hn_ptr, ss_ptr, norm, first, N: tl.constexpr,
                      BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, COLS: tl.constexpr):
    """The prenorm epilogue of a ``[rows, columns]`` tile after its GEMV ``acc``: its operands
    (:func:`_resnorm_operands`) loaded, then :func:`_resnorm_commit`."""
    offs_b, offs_n, mb, mn, off, m = _resnorm_index(n0, B, N, BLOCK_B, BLOCK_N, COLS)
    r0, nw = _resnorm_operands(x0_ptr, resid_ptr, nw_ptr, norm, first, off, m, offs_n, mn, N)
    _resnorm_commit(r0, acc, nw[None, :], m, mb, off, offs_b, tile, resid_ptr, hn_ptr, ss_ptr, N, COLS, 1)


@triton.jit
def _resnorm_commit(r0, acc, nw2, m, mb, off, offs_b, tile, resid_ptr, hn_ptr, ss_ptr, N: tl.constexpr,
                    COLS: tl.constexpr, AXIS: tl.constexpr):
    """The prenorm epilogue of :func:`linear_resnorm_tile` and its batch-path forms: ``r = r0 + acc`` (masked),
    ``resid = r``, ``hn = bf16(r * nw)``, and the tile's sum of squares per batch row into ``ss[b, tile]``.
    ``nw2``: the norm weights broadcast to the tile's layout; ``AXIS``: the tile's column axis (1: ``[rows,
    columns]``, 0: ``[columns, rows]``)."""
    r = tl.where(m, r0 + acc, 0.0)
    tl.debug_barrier()              # every thread's read of the old resid before any thread overwrites it
    tl.store(resid_ptr + off, r, mask=m)
    tl.store(hn_ptr + off, (r * nw2).to(hn_ptr.dtype.element_ty), mask=m)
    NTILES: tl.constexpr = (N + COLS - 1) // COLS
    tl.store(ss_ptr + offs_b * NTILES + tile, tl.sum(r * r, axis=AXIS), mask=mb)


@triton.jit
def linear_resnorm_tile(tile, x_ptr, w_ptr, x0_ptr, resid_ptr, nw_ptr, hn_ptr, ss_ptr, layer, norm, first, B,
                        N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr, COLS: tl.constexpr):
    """o_proj / down_proj tile of ``TileConfig.prenorm`` (one rank, batch 1): for columns ``cols = [tile * COLS,
    +COLS)`` (``COLS <= BLOCK_N``: any count, e.g. so that the tiles match the programs), ``r = (x0 if first else
    resid) + x @ w[layer]^T`` (the residual add done at once: no delta),
    ``resid = r``, the next RMSNorm's input without its ``rstd``: ``hn = bf16(r * nw[norm])``, and the tile's share
    of the rows' sum of squares: ``ss[b, tile] = sum over cols of r^2`` (float32 ``[B, tiles]``).  The consumer
    (:func:`linear_rstd_tile`, :func:`gate_up_rstd_tile`) adds the ``tiles`` partial sums of its row: a plain GEMV
    over ``hn`` scaled by ``rstd`` at the end, instead of re-reading the float32 residual and delta per chunk."""
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * COLS
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr, x_ptr, x_ptr,
                       0, 0.0, STREAM, K, COLS % BLOCK_N)     # (0: all BLOCK_N rows)
    _resnorm_epilogue(acc, tile, n0, B, x0_ptr, resid_ptr, nw_ptr, hn_ptr, ss_ptr, norm, first, N, BLOCK_B, BLOCK_N,
                      COLS)


@triton.jit
def linear_resnorm_sw_tile(tile, x_ptr, w_ptr, x0_ptr, resid_ptr, nw_ptr, hn_ptr, ss_ptr, layer, norm, first, B,
                           task_slots, epoch, N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr,
                           COLS: tl.constexpr, WAIT_OFF: tl.constexpr, WAIT_PN: tl.constexpr,
                           WAIT_SEG: tl.constexpr, WAIT_EXACT: tl.constexpr, WAIT_LOAD: tl.constexpr):
    """:func:`linear_resnorm_tile` that waits on the producers of ``x`` itself, per segment of K chunks, while its
    weights stream (``TileConfig.stream_wait``; :func:`_gemv_acc`'s ``WAIT_PN``): the producer task's tile ``p``
    is scoreboard slot ``task_slots + WAIT_OFF + p`` (``task_slots``: this task's tile 0, ``dtask.TASK_SLOTS``;
    ``WAIT_OFF``: the producer's first slot minus this task's).  Its epilogue (the residual, ``hn``, ``ss``) runs after the
    loop, when every producer was waited on (the readers of the ``hn`` it overwrites among them)."""
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * COLS
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr, x_ptr, x_ptr,
                       0, 0.0, STREAM, K, COLS % BLOCK_N, task_slots + WAIT_OFF, epoch, WAIT_PN, WAIT_SEG,
                       WAIT_EXACT, WAIT_LOAD)
    _resnorm_epilogue(acc, tile, n0, B, x0_ptr, resid_ptr, nw_ptr, hn_ptr, ss_ptr, norm, first, N, BLOCK_B, BLOCK_N,
                      COLS)


@triton.jit
def _rstd_rows(ss_ptr, B, eps, K: tl.constexpr, NT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr):
    """``rsqrt(mean(r^2) + eps)`` per batch row from the ``NT`` partial sums of squares ``ss[B, NT]`` of
    :func:`linear_resnorm_tile` (``K``: the row length), as ``[BLOCK_B]`` float32."""
    offs_t = tl.arange(0, BLOCK_T)
    offs_b = tl.arange(0, BLOCK_B)
    s = tl.load(ss_ptr + offs_b[:, None] * NT + offs_t[None, :], mask=(offs_b < B)[:, None] & (offs_t < NT)[None, :],
                other=0.0)
    return 1.0 / tl.sqrt(tl.sum(s, axis=1) / K + eps)


@triton.jit
def linear_rstd_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, N: tl.constexpr, K: tl.constexpr,
                     NT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr):
    """:func:`rms_linear_tile` over the producers' ``hn = bf16(r * nw)`` (``TileConfig.prenorm``): columns
    ``[tile * BLOCK_N, +BLOCK_N)`` of ``out = rstd * (hn @ w[layer]^T)``, ``rstd`` from the ``NT`` partial sums of
    squares ``ss`` (:func:`_rstd_rows`)."""
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * BLOCK_N
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr, x_ptr, x_ptr,
                       0, 0.0, STREAM, K)
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    _store_rows(out_ptr, acc * rstd[:, None], n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def _store_silu_mul(out_ptr, g, u, rstd, n0, B, N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                    COLS: tl.constexpr):
    """The prenorm gate/up tiles' epilogue: ``out = bf16(silu(g * rstd) * (u * rstd))`` (``rstd``: ``[BLOCK_B]``)
    for the tile's columns (:func:`_store_rows`, ``COLS``)."""
    g = g * rstd[:, None]
    u = u * rstd[:, None]
    _store_rows(out_ptr, g / (1.0 + tl.exp(-g)) * u, n0, B, N, BLOCK_B, BLOCK_N, COLS)


@triton.jit
def gate_up_rstd_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, N: tl.constexpr, K: tl.constexpr,
                      NT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr, COLS: tl.constexpr = 0):
    """:func:`rms_gate_up_tile` over ``hn`` (``TileConfig.prenorm``; see :func:`linear_rstd_tile`).  ``COLS > 0``
    (``TileConfig.gate_up_cols``): the tile's columns are ``[tile * COLS, +COLS)``, ``COLS < BLOCK_N``: its other
    gate and up rows masked (never read) and its output stored for those columns only, so that the tiles of any
    count of columns can match the programs (0: ``BLOCK_N`` columns)."""
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    n0 = _cols_n0(tile, BLOCK_N, COLS)
    g, u = _gemv_acc(x_ptr, wl, wl + N * K, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, True, x_ptr, x_ptr,
                     x_ptr, 0, 0.0, STREAM, K, COLS)
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    _store_silu_mul(out_ptr, g, u, rstd, n0, B, N, BLOCK_B, BLOCK_N, COLS)


@triton.jit
def linear_rstd_sw_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, task_slots, epoch,
                        N: tl.constexpr, K: tl.constexpr, NT: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
                        STREAM: tl.constexpr, WAIT_OFF: tl.constexpr, WAIT_PN: tl.constexpr,
                        WAIT_SEG: tl.constexpr, WAIT_EXACT: tl.constexpr, WAIT_LOAD: tl.constexpr):
    """:func:`linear_rstd_tile` that waits on the producers of ``hn`` and ``ss`` itself (as
    :func:`linear_resnorm_sw_tile`): ``ss`` is read after the loop, when every producer was waited on."""
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * BLOCK_N
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr, x_ptr, x_ptr,
                       0, 0.0, STREAM, K, 0, task_slots + WAIT_OFF, epoch, WAIT_PN, WAIT_SEG,
                       WAIT_EXACT, WAIT_LOAD)
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    _store_rows(out_ptr, acc * rstd[:, None], n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def gate_up_rstd_sw_tile(tile, x_ptr, ss_ptr, w_ptr, out_ptr, layer, B, eps, task_slots, epoch,
                         N: tl.constexpr, K: tl.constexpr, NT: tl.constexpr, BLOCK_T: tl.constexpr,
                         BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
                         STREAM: tl.constexpr, WAIT_OFF: tl.constexpr, WAIT_PN: tl.constexpr,
                         WAIT_SEG: tl.constexpr, WAIT_EXACT: tl.constexpr, WAIT_LOAD: tl.constexpr,
                         COLS: tl.constexpr = 0):
    """:func:`gate_up_rstd_tile` (``COLS`` as there) that waits on the producers of ``hn`` and ``ss`` itself (as
    :func:`linear_rstd_sw_tile`)."""
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    n0 = _cols_n0(tile, BLOCK_N, COLS)
    g, u = _gemv_acc(x_ptr, wl, wl + N * K, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, True, x_ptr, x_ptr,
                     x_ptr, 0, 0.0, STREAM, K, COLS, task_slots + WAIT_OFF, epoch, WAIT_PN, WAIT_SEG,
                     WAIT_EXACT, WAIT_LOAD)
    rstd = _rstd_rows(ss_ptr, B, eps, K, NT, BLOCK_B, BLOCK_T)
    _store_silu_mul(out_ptr, g, u, rstd, n0, B, N, BLOCK_B, BLOCK_N, COLS)


@triton.jit
def linear_split_tile(tile, x_ptr, w_ptr, out_ptr, layer, B, N: tl.constexpr, K: tl.constexpr,
                      SPLIT_K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      DOT: tl.constexpr, STREAM: tl.constexpr):
    """Split-K :func:`linear_tile` (``TileConfig.down_split_k``): tile ``t`` is K slice ``s = t % SPLIT_K`` of
    columns ``[(t // SPLIT_K) * BLOCK_N, +BLOCK_N)``: ``out[s, B, N] = x[:, slice] @ w[layer][:, slice]^T``
    (float32 partial sums over ``K / SPLIT_K`` columns; :func:`sum_splits_tile` adds the slices).  A slice needs
    only the producer tiles of its columns of ``x``, so it starts before the whole of ``x`` is written."""
    KS: tl.constexpr = K // SPLIT_K
    s = tile % SPLIT_K
    wl = w_ptr + layer.to(tl.int64) * N * K + s * KS
    n0 = (tile // SPLIT_K) * BLOCK_N
    acc, _ = _gemv_acc(x_ptr + s * KS, wl, wl, n0, B, N, KS, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, False, x_ptr,
                       x_ptr, x_ptr, 0, 0.0, STREAM, K)
    _store_rows(out_ptr + s * B * N, acc, n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def sum_splits_tile(tile, x_ptr, out_ptr, N: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """Elements ``[tile * BLOCK, +BLOCK)`` of ``out[N] = sum_s x[s, N]`` (float32; the split-K slices of
    :func:`linear_split_tile`, added in slice order)."""
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    acc = tl.load(x_ptr + offs, mask=m, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(x_ptr + s * N + offs, mask=m, other=0.0)
    tl.store(out_ptr + offs, acc, mask=m)


@triton.jit
def rms_linear_tile(tile, x_ptr, resid_ptr, delta_ptr, nw_ptr, w_ptr, out_ptr, layer, norm, first, B, eps,
                    N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr):
    """:func:`linear_tile` of the RMSNorm'd residual stream, the norm fused in: every tile computes
    ``rstd * ((r * nw[norm]) @ w^T)`` with ``r = x`` (``first``) or ``resid + delta`` and the rows' ``rstd`` from
    the same pass (:func:`_gemv_acc`; :func:`add_resid_tile` commits the add).  No norm stage between the
    all-reduce and the projection; the normalised activations are not rounded to bf16 (float32 products)."""
    wl = w_ptr + layer.to(tl.int64) * N * K
    n0 = tile * BLOCK_N
    acc, _ = _gemv_acc(x_ptr, wl, wl, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, True, False, resid_ptr, delta_ptr,
                       nw_ptr + norm * K, first, eps, STREAM, K)
    _store_rows(out_ptr, acc, n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def gate_up_tile(tile, x_ptr, w_ptr, out_ptr, layer, B, N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr):
    """Fused gate/up projection and SiLU-mul: ``w[layer]`` is ``[2N, K]`` (gate rows, then up rows);
    ``out[B, N] = bf16(silu(x @ gate^T) * (x @ up^T))``, columns ``[tile * BLOCK_N, +BLOCK_N)``."""
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    n0 = tile * BLOCK_N
    g, u = _gemv_acc(x_ptr, wl, wl + N * K, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, False, True, x_ptr, x_ptr,
                     x_ptr, 0, 0.0, STREAM, K)
    _store_rows(out_ptr, g / (1.0 + tl.exp(-g)) * u, n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def rms_gate_up_tile(tile, x_ptr, resid_ptr, delta_ptr, nw_ptr, w_ptr, out_ptr, layer, norm, first, B, eps,
                     N: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, DOT: tl.constexpr, STREAM: tl.constexpr):
    """:func:`gate_up_tile` of the RMSNorm'd residual stream (the norm fused in, as in :func:`rms_linear_tile`)."""
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    n0 = tile * BLOCK_N
    g, u = _gemv_acc(x_ptr, wl, wl + N * K, n0, B, N, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT, True, True, resid_ptr,
                     delta_ptr, nw_ptr + norm * K, first, eps, STREAM, K)
    _store_rows(out_ptr, g / (1.0 + tl.exp(-g)) * u, n0, B, N, BLOCK_B, BLOCK_N)


@triton.jit
def _prefetch_rows(w, n0, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH_K: tl.constexpr,
                   ROWS: tl.constexpr = 0):
    """L2 prefetch of columns ``[0, PREFETCH_K)`` of rows ``[n0, n0 + BLOCK_N)`` of ``w[N, K]`` (bf16: one address
    per 128-byte line); ``ROWS > 0``: only the first ``ROWS`` of them."""
    rows, m = _cols_mask(n0, N, BLOCK_N, ROWS)
    cols = tl.arange(0, PREFETCH_K // 64) * 64
    dl.prefetch_l2(w + rows[:, None].to(tl.int64) * K + cols[None, :], mask=m[:, None] & (cols < K)[None, :])


@triton.jit
def o_weight_prefetch(tile, wo_ptr, layer, O_N: tl.constexpr, O_K: tl.constexpr, O_ROWS: tl.constexpr,
                      O_LINES: tl.constexpr):
    """Prefetch hook of the attention tiles (``TileConfig.attn_prefetch_o``): rows ``[tile * O_ROWS, (tile + 1) *
    O_ROWS)`` of the layer's o_proj weight ``[O_N, O_K]`` into L2, one row per step (a line per 64 columns:
    ``O_LINES``, the power of two at least ``cdiv(O_K, 64)``)."""
    w = wo_ptr + layer.to(tl.int64) * O_N * O_K
    cols = tl.arange(0, O_LINES) * 64
    for i in tl.range(0, O_ROWS):
        r = tile * O_ROWS + i
        dl.prefetch_l2(w + r.to(tl.int64) * O_K + cols, mask=(cols < O_K) & (r < O_N))


@triton.jit
def linear_prefetch(tile, w_ptr, layer, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                    PREFETCH_K: tl.constexpr):
    """Prefetch hook of :func:`linear_tile` / :func:`rms_linear_tile` (runs before the tile's dependency wait):
    the first ``PREFETCH_K`` columns of the tile's weight rows into L2."""
    _prefetch_rows(w_ptr + layer.to(tl.int64) * N * K, tile * BLOCK_N, N, K, BLOCK_N, PREFETCH_K)


@triton.jit
def linear_cols_prefetch(tile, w_ptr, layer, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                         COLS: tl.constexpr, PREFETCH_K: tl.constexpr):
    """:func:`linear_prefetch` of the tiles of ``COLS`` columns (``TileConfig.o_cols`` / ``down_cols``: tile ``t``
    holds rows ``[t * COLS, +COLS)``, ``COLS <= BLOCK_N``)."""
    _prefetch_rows(w_ptr + layer.to(tl.int64) * N * K, tile * COLS, N, K, BLOCK_N, PREFETCH_K, COLS)


@triton.jit
def _gate_up_prefetch_rows(w_ptr, layer, n0, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                           PREFETCH_K: tl.constexpr, ROWS: tl.constexpr):
    """:func:`_prefetch_rows` of the gate rows and the up rows of a gate/up tile (``w[layer]``: ``[2N, K]``)."""
    wl = w_ptr + layer.to(tl.int64) * 2 * N * K
    _prefetch_rows(wl, n0, N, K, BLOCK_N, PREFETCH_K, ROWS)
    _prefetch_rows(wl + N * K, n0, N, K, BLOCK_N, PREFETCH_K, ROWS)


@triton.jit
def gate_up_prefetch(tile, w_ptr, layer, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                     PREFETCH_K: tl.constexpr):
    """Prefetch hook of :func:`gate_up_tile` / :func:`rms_gate_up_tile`: gate and up rows of the tile."""
    _gate_up_prefetch_rows(w_ptr, layer, tile * BLOCK_N, N, K, BLOCK_N, PREFETCH_K, 0)


@triton.jit
def gate_up_cols_prefetch(tile, w_ptr, layer, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                          COLS: tl.constexpr, PREFETCH_K: tl.constexpr):
    """:func:`gate_up_prefetch` of the tiles of ``COLS`` columns (``TileConfig.gate_up_cols``: tile ``t`` reads gate
    and up rows ``[t * COLS, +COLS)``; 0: ``BLOCK_N``), as :func:`linear_cols_prefetch`: the rows past ``COLS``
    belong to the next tile, which asks for them itself."""
    _gate_up_prefetch_rows(w_ptr, layer, _cols_n0(tile, BLOCK_N, COLS), N, K, BLOCK_N, PREFETCH_K, COLS)
