"""The model's ends inside the megakernel (issue 53): the token-embedding gather before the first layer, and after
the LM head (a plain GEMV task, :func:`~.tiles_gemv.linear_tile`) the on-device sampler.  Conventions:
:mod:`.tiles`.

The sampler works in two stages so that the LM head can be vocab-parallel (rank ``r`` holds rows
``[r * V_r, r * V_r + n_valid)`` of the LM head and so columns of the logits):

1. the ``kpass`` largest of this rank's logits, in order, ties to the smaller token id (``kpass = 1`` for a greedy
   row, ``K`` -- the compiled ``max_top_k`` -- for a sampled one; unused slots hold ``-inf``), as ``cand[b] = [K
   values, K token ids]`` (float32; ids < 2**24 are exact), in two tasks so that no single program walks a whole
   vocabulary row: :func:`topk_part_tile` (``B * NSPLIT`` tiles, :func:`topk_splits`) takes the ``kpass`` best of
   one contiguous chunk of the row, each as soon as the LM-head tiles of its chunk are done, and
   :func:`topk_merge_tile` (one tile per row) the ``kpass`` best of the ``NSPLIT * kpass`` candidates (the union of
   the chunks' bests holds the row's best; the order is the same, so the result is the one a single pass over the
   row gives).  One program per row over 151936 logits was ~150 dependent 1024-wide steps for greedy and ~9,500 for
   ``K = 64`` at the very end of the step, with the rest of the GPU idle;
2. (at TP > 1 an all-gather of ``cand`` to ``[W, B, 2K]`` on every rank, ``ditron.task.comm.all_gather``), then
   :func:`sample_tile` (one tile per batch row, on every rank, identical inputs: identical tokens): the ``W * K``
   candidates contain the global top ``K`` tokens; greedy (``temperature[b] <= 0``) takes the largest (the smallest id
   among equal logits, as ``torch.argmax``); otherwise the candidates are cut to the ``top_k[b]`` largest (0: all
   ``K``), scaled by ``1 / temperature[b]``, cut to the smallest prefix whose probability reaches ``top_p[b]`` (the
   first always kept), and one is drawn with the Gumbel-max trick from Triton's Philox generator (``tl.rand(seed[b],
   position * NC + candidate)``: the draw depends on the sequence's seed and position only, not on the batch's other
   rows or the number of ranks).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def embed_tile(tile, tok_ptr, emb_ptr, x_ptr, H: tl.constexpr, BLOCK: tl.constexpr):
    """Batch row ``tile``: ``x[tile] = emb[tok[tile]]`` (the token-embedding gather; ``emb``: ``[V, H]`` bf16, the
    whole table on every rank: a step reads ``B`` rows of it)."""
    t = tl.load(tok_ptr + tile).to(tl.int64)
    for h0 in range(0, H, BLOCK):
        offs = h0 + tl.arange(0, BLOCK)
        m = offs < H
        tl.store(x_ptr + tile * H + offs, tl.load(emb_ptr + t * H + offs, mask=m, other=0.0), mask=m)


def topk_splits(n_cols: int) -> tuple:
    """``(NSPLIT, CHUNK)``: the chunks stage 1 splits a row of ``n_cols`` logits into (at most 64, each at least
    2048 columns but the last)."""
    nsplit = max(1, min(64, -(-n_cols // 2048)))
    chunk = -(-n_cols // nsplit)
    return nsplit, chunk


@triton.jit
def _best_after(vals, ids, m, prev_v, prev_i, best_v, best_i):
    """Fold one block of candidates (``vals``, int32 ``ids``, valid where ``m``) into ``(best_v, best_i)``: the
    largest in the order (value descending, id ascending) among those after ``(prev_v, prev_i)``."""
    ok = m & ((vals < prev_v) | ((vals == prev_v) & (ids > prev_i)))
    v = tl.where(ok, vals, float("-inf"))
    cm = tl.max(v, axis=0)
    ci = tl.min(tl.where(ok & (v == cm), ids, 2147483647), axis=0)
    better = (cm > best_v) | ((cm == best_v) & (ci < best_i))
    return tl.where(better, cm, best_v), tl.where(better, ci, best_i)


@triton.jit
def _fill_unused(out, kpass, K: tl.constexpr):
    """Candidate slots ``[kpass, K)`` of ``out = [K values, K ids]``: value ``-inf``, id ``-1`` (no candidate)."""
    for k in range(kpass, K):
        tl.store(out + k, float("-inf"))
        tl.store(out + K + k, -1.0)


@triton.jit
def topk_part_tile(tile, logits_ptr, part_ptr, temp_ptr, n_valid, N: tl.constexpr, K: tl.constexpr,
                   NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Stage 1a for row ``tile // NSPLIT``, chunk ``tile % NSPLIT`` (columns ``[s * CHUNK, +CHUNK)`` of the first
    ``n_valid``): its ``kpass`` best as ``part[b, s] = [K values, K column ids]`` (ids local to this rank)."""
    b = tile // NSPLIT
    s = tile % NSPLIT
    lo = s * CHUNK
    hi = tl.minimum(lo + CHUNK, n_valid)
    temp = tl.load(temp_ptr + b)
    kpass = tl.where(temp > 0.0, K, 1)
    row = logits_ptr + b.to(tl.int64) * N
    out = part_ptr + tile * (2 * K)
    zf = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)        # scalar tensors: loop-carried values keep a type
    zi = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
    prev_v = zf + float("inf")
    prev_i = zi - 1
    for k in range(0, kpass):
        best_v = zf - float("inf")
        best_i = zi + 2147483647
        for j0 in range(lo, hi, BLOCK):
            offs = j0 + tl.arange(0, BLOCK)
            m = offs < hi
            v = tl.load(row + offs, mask=m, other=float("-inf")).to(tl.float32)
            best_v, best_i = _best_after(v, offs, m, prev_v, prev_i, best_v, best_i)
        tl.store(out + k, best_v)
        tl.store(out + K + k, tl.where(best_v > float("-inf"), best_i, -1).to(tl.float32))
        prev_v = best_v
        prev_i = best_i
    _fill_unused(out, kpass, K)


@triton.jit
def topk_merge_tile(tile, part_ptr, cand_ptr, temp_ptr, v_off, K: tl.constexpr, NSPLIT: tl.constexpr,
                    BLOCK: tl.constexpr):
    """Stage 1b for row ``tile``: the ``kpass`` best of its chunks' candidates ``part[b, :, :]`` as ``cand[b] = [K
    values, K token ids]`` (ids ``v_off + column``)."""
    b = tile
    temp = tl.load(temp_ptr + b)
    kpass = tl.where(temp > 0.0, K, 1)
    n = NSPLIT * kpass
    base = part_ptr + b * (NSPLIT * 2 * K)
    out = cand_ptr + b * (2 * K)
    zf = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    zi = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
    prev_v = zf + float("inf")
    prev_i = zi - 1
    for k in range(0, kpass):
        best_v = zf - float("inf")
        best_i = zi + 2147483647
        for j0 in range(0, n, BLOCK):
            j = j0 + tl.arange(0, BLOCK)
            m = j < n
            addr = base + (j // kpass) * (2 * K) + j % kpass
            v = tl.load(addr, mask=m, other=float("-inf"))
            ids = tl.load(addr + K, mask=m, other=-1.0).to(tl.int32)
            best_v, best_i = _best_after(v, ids, m & (ids >= 0), prev_v, prev_i, best_v, best_i)
        tl.store(out + k, best_v)
        tl.store(out + K + k, tl.where(best_v > float("-inf"), best_i + v_off, -1).to(tl.float32))
        prev_v = best_v
        prev_i = best_i
    _fill_unused(out, kpass, K)


@triton.jit
def sample_tile(tile, cand_ptr, tok_ptr, seq_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, B, W, K: tl.constexpr,
                NC: tl.constexpr):
    """Stage 2 of the sampler for batch row ``tile``: ``cand`` is ``[W, B, 2K]`` (every rank's candidates); writes
    the next token to ``tok[tile]`` (int32)."""
    b = tile
    j = tl.arange(0, NC)
    mj = j < W * K
    r = j // K
    k = j % K
    base = (r * B + b) * (2 * K)
    v = tl.load(cand_ptr + base + k, mask=mj, other=float("-inf"))
    ids = tl.load(cand_ptr + base + K + k, mask=mj, other=-1.0)
    valid = mj & (ids >= 0.0) & (v > float("-inf"))
    v = tl.where(valid, v, float("-inf"))
    ids = tl.where(valid, ids, 3.0e38)
    # rank of each candidate in (value descending, id ascending): the number of candidates before it
    vi = v[:, None]
    ii = ids[:, None]
    before = (vi > v[None, :]) | ((vi == v[None, :]) & (ii < ids[None, :]))
    before = before & valid[:, None]
    rank = tl.sum(before.to(tl.int32), axis=0)
    temp = tl.load(temp_ptr + b)
    if temp > 0.0:
        kk = tl.load(topk_ptr + b)
        kk = tl.where((kk <= 0) | (kk > K), K, kk)
        keep = valid & (rank < kk)
        vmax = tl.max(v, axis=0)
        z = tl.where(keep, (v - vmax) / temp, float("-inf"))
        p = tl.exp(z)
        p = p / tl.sum(p, axis=0)
        # the probability of the candidates ranked before each one (nucleus: keep while it is below top_p)
        cum = tl.sum(tl.where(rank[:, None] < rank[None, :], p[:, None], 0.0), axis=0)
        keep = keep & (cum < tl.load(topp_ptr + b))
        pos = tl.load(seq_ptr + b) - 1
        u = tl.rand(tl.load(seed_ptr + b), pos * NC + j)
        u = tl.minimum(tl.maximum(u, 1.0e-20), 1.0 - 1.0e-7)
        score = tl.where(keep, z - tl.log(-tl.log(u)), float("-inf"))
        smax = tl.max(score, axis=0)
        pick = tl.min(tl.where(keep & (score == smax), ids, 3.0e38), axis=0)
    else:
        pick = tl.min(tl.where(valid & (rank == 0), ids, 3.0e38), axis=0)
    tl.store(tok_ptr + b, pick.to(tl.int32))
