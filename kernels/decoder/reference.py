"""The Qwen3-like decoder step in plain torch, tensor-parallel: the reference
the megakernel is checked against and the baseline it is timed against.

One rank's step is a generator (:func:`step_gen`): it yields each
row-parallel partial sum (o_proj, down_proj; bf16 ``[B, H]``) and expects it
all-reduced in place before it is resumed.  :class:`TorchDecoder` drives it
with ``torch.distributed.all_reduce`` (NCCL on GPUs, gloo on CPU, nothing at
world size 1), eagerly or replaying a captured CUDA graph;
:func:`lockstep_step` drives the generators of all ranks in one process
(summing the partials), which the CPU tests use.

Numerics (what the kernel does too): bf16 tensors between ops, float32 inside
every op and for the residual stream; RMSNorm ``bf16(r * rstd * w)``; q/k
norm rounded to bf16 before RoPE (rotate-half, float32 angles), KV appended
at ``seq[b] - 1`` after ``seq[b] += 1`` into sequence ``b``'s page of the paged
cache (:class:`~.weights.PagedKV`; contexts may differ per sequence).  The
baseline uses torch's fast paths (bf16 ``F.linear``; SDPA over each sequence's
pages gathered through the block table, with a per-sequence mask -- the gather
copies the KV bytes once more per layer, which a paged-attention kernel would
not; bf16 all-reduce); the kernel accumulates partial sums in float32 and all-reduces
them in float32, so the two differ by bf16 rounding only.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import DecoderConfig, Shard
from .weights import PagedKV, Weights


def _rms(x, w, eps):
    x = x.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(torch.bfloat16)


def _rope(x, pos, theta):
    """``x [B, ..., D]`` float32 at positions ``pos`` (one per row ``b``, or a single one for all); ``theta``: the
    RoPE base, or the ``[D / 2]`` inverse-frequency table (``DecoderConfig.inv_freq``)."""
    D = x.shape[-1]
    if torch.is_tensor(theta):
        inv = theta.to(device=x.device, dtype=torch.float32)
    else:
        inv = 1.0 / (theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
    ang = pos.float().reshape(-1, *([1] * (x.dim() - 1))) * inv
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def step_gen(cfg: DecoderConfig, sh: Shard, w: Weights, cache: PagedKV, seq, x):
    """One decode step of one rank (a generator; see the module doc).  ``seq`` ``[B]`` int32 holds each
    sequence's context length; the step advances it and appends every sequence's k / v in place at position
    ``seq[b] - 1`` of its pages (``cache``: :class:`PagedKV`, shared block table).  Returns the final hidden
    states ``[B, H]`` bf16."""
    B, D, L = x.shape[0], cfg.head_dim, cfg.n_layers
    QH, KH, P = sh.q_heads, sh.kv_heads, cache.page_size
    seq.add_(1)
    pos = (seq - 1).long()                                                   # [B]
    bt = cache.block_table.long()
    page, row = bt[torch.arange(B, device=bt.device), pos // P], pos % P     # where each sequence appends
    T = cache.max_ctx
    valid = (torch.arange(T, device=x.device)[None, :] < seq[:, None])[:, None, None, :]   # [B, 1, 1, T]
    resid = x.float()
    for l in range(L):
        h = _rms(resid, w.norm[2 * l], cfg.rms_eps)
        qkv = F.linear(h, w.qkv[l]).view(B, QH + 2 * KH, D)
        if cfg.qk_norm:
            q = _rms(qkv[:, :QH], w.q_norm[l], cfg.rms_eps).float()
            k = _rms(qkv[:, QH:QH + KH], w.k_norm[l], cfg.rms_eps).float()
        else:
            q, k = qkv[:, :QH].float(), qkv[:, QH:QH + KH].float()
        theta = w.inv_freq if w.inv_freq is not None else cfg.rope_theta
        q = _rope(q, pos, theta).to(torch.bfloat16)
        k = _rope(k, pos, theta).to(torch.bfloat16)
        cache.k[l][page, row] = k
        cache.v[l][page, row] = qkv[:, QH + KH:]
        # every sequence's pages gathered in order ([B, max_pages * P, KH, D] -> [B, KH, T, D]); GQA without
        # expanding the cache: the G q heads of a kv head are G queries of one head (decode has one position per
        # head and no causal mask among them): [B, KH, G, D] x [B, KH, T, D]
        kk = cache.k[l][bt].reshape(B, T, KH, D).transpose(1, 2)
        vv = cache.v[l][bt].reshape(B, T, KH, D).transpose(1, 2)
        a = F.scaled_dot_product_attention(q.view(B, KH, QH // KH, D), kk, vv, attn_mask=valid,
                                           scale=1.0 / math.sqrt(D))
        part = F.linear(a.reshape(B, QH * D), w.o[l])
        yield part
        resid = resid + part.float()
        h = _rms(resid, w.norm[2 * l + 1], cfg.rms_eps)
        gu = F.linear(h, w.gate_up[l]).float()
        act = (F.silu(gu[:, :sh.inter]) * gu[:, sh.inter:]).to(torch.bfloat16)
        part = F.linear(act, w.down[l])
        yield part
        resid = resid + part.float()
    return _rms(resid, w.norm[2 * L], cfg.rms_eps)


def _drive(gen, all_reduce):
    try:
        part = next(gen)
        while True:
            all_reduce(part)
            part = gen.send(None)
    except StopIteration as stop:
        return stop.value


def lockstep_step(states, x):
    """All ranks of a TP group in one process: ``states`` is a list of ``(cfg, shard, weights, cache, seq)`` per
    rank (``cache``: :class:`PagedKV`); the partial sums are added across ranks.  Returns every rank's output."""
    gens = [step_gen(*s, x) for s in states]
    outs = [None] * len(gens)
    parts = []
    for i, g in enumerate(gens):
        parts.append(next(g))
    while True:
        total = torch.stack([p.float() for p in parts]).sum(0).to(parts[0].dtype)
        for p in parts:
            p.copy_(total)
        nxt = []
        for i, g in enumerate(gens):
            try:
                nxt.append(g.send(None))
            except StopIteration as stop:
                outs[i] = stop.value
        if not nxt:
            return outs
        parts = nxt


class TorchDecoder:
    """This rank's torch decoder step, TP over ``group`` (``torch.distributed``; none at world size 1).
    Owns its own copy of the KV cache and ``seq`` so that it advances independently of the megakernel."""

    def __init__(self, cfg, shard, weights, cache, seq, group=None):
        self.cfg, self.shard, self.w = cfg, shard, weights
        self.cache = cache.clone()
        self.seq = seq.clone()
        self.group = group

    @property
    def k_cache(self):
        return self.cache.k

    @property
    def v_cache(self):
        return self.cache.v

    def _all_reduce(self, t):
        import torch.distributed as dist
        if self.shard.world_size > 1:
            dist.all_reduce(t, group=self.group)

    def step(self, x):
        return _drive(step_gen(self.cfg, self.shard, self.w, self.cache, self.seq, x),
                      self._all_reduce)

    def graphed(self, x_static):
        """A CUDA-graph replay of :meth:`step` on ``x_static`` (GPU only): returns ``replay() -> out``.
        The warm-up step's effect on the cache and ``seq`` is undone before the capture."""
        k, v, seq = self.k_cache.clone(), self.v_cache.clone(), self.seq.clone()

        def restore():
            self.k_cache.copy_(k), self.v_cache.copy_(v), self.seq.copy_(seq)
        return graph_replay(lambda: self.step(x_static), after_warmup=restore)


def graph_replay(fn, after_warmup=None):
    """Capture ``fn()`` in a CUDA graph after one warm-up call on a side stream (workspace allocation, NCCL
    communicators); returns ``replay() -> out`` (``out``: the captured call's result, refreshed by each replay).
    ``after_warmup`` runs between the warm-up and the capture."""
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        fn()
    torch.cuda.current_stream().wait_stream(st)
    torch.cuda.synchronize()
    if after_warmup is not None:
        after_warmup()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()

    def replay():
        g.replay()
        return out
    return replay
