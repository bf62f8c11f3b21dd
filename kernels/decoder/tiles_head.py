"""The model's ends inside the megakernel (issue 53): the token-embedding gather before the first layer, and after
the LM head (a plain GEMV task, :func:`~.tiles_gemv.linear_tile`) the on-device sampler.  Conventions:
:mod:`.tiles`.

The sampler works in two stages so that the LM head can be vocab-parallel (rank ``r`` holds rows
``[r * V_r, r * V_r + n_valid)`` of the LM head and so columns of the logits):

1. :func:`topk_tile` (one tile per batch row, on every rank): the ``kpass`` largest of this rank's logits, in order,
   ties to the smaller token id (``kpass = 1`` for a greedy row, ``K`` -- the compiled ``max_top_k`` -- for a sampled
   one; unused slots hold ``-inf``), as ``cand[b] = [K values, K token ids]`` (float32; ids < 2**24 are exact);
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


@triton.jit
def topk_tile(tile, logits_ptr, cand_ptr, temp_ptr, n_valid, v_off, N: tl.constexpr, K: tl.constexpr,
              BLOCK: tl.constexpr):
    """Stage 1 of the sampler for batch row ``tile`` over this rank's logits ``[B, N]`` (the first ``n_valid``
    columns are tokens ``v_off + j``): ``kpass`` passes, each the largest logit after the previous pass's in the order
    (value descending, id ascending)."""
    b = tile
    temp = tl.load(temp_ptr + b)
    kpass = tl.where(temp > 0.0, K, 1)
    row = logits_ptr + b.to(tl.int64) * N
    out = cand_ptr + b * (2 * K)
    zf = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)        # scalar tensors: loop-carried values keep a type
    zi = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
    prev_v = zf + float("inf")
    prev_i = zi - 1
    for k in range(0, kpass):
        best_v = zf - float("inf")
        best_i = zi + 2147483647
        for j0 in range(0, n_valid, BLOCK):
            offs = j0 + tl.arange(0, BLOCK)
            m = offs < n_valid
            v = tl.load(row + offs, mask=m, other=float("-inf")).to(tl.float32)
            ok = m & ((v < prev_v) | ((v == prev_v) & (offs > prev_i)))
            v = tl.where(ok, v, float("-inf"))
            cm = tl.max(v, axis=0)
            ci = tl.min(tl.where(ok & (v == cm), offs, 2147483647), axis=0)
            better = (cm > best_v) | ((cm == best_v) & (ci < best_i))
            best_v = tl.where(better, cm, best_v)
            best_i = tl.where(better, ci, best_i)
        tl.store(out + k, best_v)
        tl.store(out + K + k, (best_i + v_off).to(tl.float32))
        prev_v = best_v
        prev_i = best_i
    for k in range(kpass, K):
        tl.store(out + k, float("-inf"))
        tl.store(out + K + k, -1.0)


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
