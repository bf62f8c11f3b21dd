"""Random weights and KV cache of the Qwen3-like decoder, per rank.

Every tensor is generated in its *global* (unsharded) shape from a seed that
depends only on (seed, layer, kind), then this rank's shard is sliced out, so
TP=1 and TP=W compute the same model (on the same device type: CPU and CUDA
generators differ).  Layouts (per rank, bf16, layers stacked first):

* ``norm [2L + 1, H]``: input_layernorm of layer l at ``2l``, post_attention_layernorm at ``2l + 1``, the
  final norm at ``2L`` (one stacked tensor: every RMSNorm task shares one branch of the megakernel);
* ``qkv [L, (QH + 2 KH) * D, H]``: this rank's q heads, then its k heads, then its v heads;
* ``q_norm, k_norm [L, D]`` (ones where the model has none: ``DecoderConfig.qk_norm=False``); ``inv_freq [D / 2]``
  float32, the RoPE table; ``o [L, H, QH * D]`` (row-parallel: this rank's columns);
* ``gate_up [L, 2 I_r, H]``: this rank's gate rows, then its up rows; ``down [L, H, I_r]`` (row-parallel);
* KV cache: :class:`PagedKV` (pages ``[L, num_pages, page_size, KH, D]`` and a block table ``[B, max_pages]``),
  random up to each sequence's context, :data:`PAST_END` beyond and in unowned pages (never read when the masks
  and the page lookups are right; a bug shows up as a large error).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

from ditron.errors import DitronError

from .config import DecoderConfig, Shard

PAST_END = 1000.0
_KINDS = {"norm": 1, "qkv": 2, "qk_norm": 3, "o": 4, "gate_up": 5, "down": 6, "k": 7, "v": 8, "x": 9, "embed": 10,
          "lm_head": 11}


def _randn(shape, seed, layer, kind, device, scale=1.0, offset=0.0):
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed * 100003 + layer * 101 + _KINDS[kind])
    return torch.randn(shape, generator=g, device=dev, dtype=torch.float32) * scale + offset


@dataclass
class Weights:
    norm: torch.Tensor
    qkv: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    inv_freq: torch.Tensor = None    # [D / 2] float32: RoPE inverse frequencies (DecoderConfig.inv_freq)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (getattr(self, f.name) for f in fields(self))
                   if t is not None)


def make_weights(cfg: DecoderConfig, rank: int, world_size: int, device="cpu", seed: int = 0,
                 dtype=torch.bfloat16) -> Weights:
    """This rank's shard of the seeded global weights."""
    sh = cfg.shard(world_size)
    if not 0 <= rank < world_size:
        raise DitronError(f"make_weights: rank {rank} is not in 0..{world_size - 1}")
    H, D, L = cfg.hidden, cfg.head_dim, cfg.n_layers
    qs = slice(rank * sh.q_heads * D, (rank + 1) * sh.q_heads * D)
    ks = slice(rank * sh.kv_heads * D, (rank + 1) * sh.kv_heads * D)
    iss = slice(rank * sh.inter, (rank + 1) * sh.inter)
    nq, nkv, inter = cfg.n_q_heads * D, cfg.n_kv_heads * D, cfg.intermediate
    norm = _randn((2 * L + 1, H), seed, 0, "norm", device, 0.1, 1.0).to(dtype)
    qkv, qn, kn, o, gu, dn = [], [], [], [], [], []
    for l in range(L):
        w = _randn((nq + 2 * nkv, H), seed, l, "qkv", device, H ** -0.5)
        qkv.append(torch.cat([w[:nq][qs], w[nq:nq + nkv][ks], w[nq + nkv:][ks]]).to(dtype))
        n = _randn((2, D), seed, l, "qk_norm", device, 0.1, 1.0)
        qn.append(n[0].to(dtype))
        kn.append(n[1].to(dtype))
        o.append(_randn((H, nq), seed, l, "o", device, nq ** -0.5)[:, qs].to(dtype).contiguous())
        w = _randn((2 * inter, H), seed, l, "gate_up", device, H ** -0.5)
        gu.append(torch.cat([w[:inter][iss], w[inter:][iss]]).to(dtype))
        dn.append(_randn((H, inter), seed, l, "down", device, inter ** -0.5)[:, iss].to(dtype).contiguous())
        del w
    return Weights(norm, torch.stack(qkv), torch.stack(qn), torch.stack(kn), torch.stack(o), torch.stack(gu),
                   torch.stack(dn), cfg.inv_freq().to(device))


@dataclass
class Head:
    """The model's ends on this rank (issue 53): ``embed [V, H]`` bf16 (the whole token-embedding table: a step
    gathers ``B`` rows), ``lm [1, V_r, H]`` bf16 (this rank's rows of the vocab-parallel LM head, ``V_r = cdiv(V,
    W)``, zero rows past the vocabulary), ``v_off = rank * V_r`` its first token id and ``n_valid`` its real rows;
    ``max_top_k``: the sampler's candidates per rank (the compiled top-k cap, a power of two)."""
    embed: torch.Tensor
    lm: torch.Tensor
    vocab: int
    v_off: int
    n_valid: int
    max_top_k: int = 64

    def __post_init__(self):
        K = self.max_top_k
        if K < 1 or K & (K - 1):
            raise DitronError(f"Head.max_top_k={K}: must be a power of two >= 1 (1: greedy only)")
        if self.n_valid < 1:
            raise DitronError(f"Head: this rank holds no LM-head rows (vocab {self.vocab}, offset {self.v_off}); "
                              "use fewer ranks")

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.embed, self.lm))


def make_head(cfg: DecoderConfig, rank: int, world_size: int, device="cpu", seed: int = 0, max_top_k: int = 64,
              dtype=torch.bfloat16) -> "Head":
    """This rank's :class:`Head` of seeded global random embedding and LM-head tables (``cfg.vocab`` rows; the
    benchmark's model ends; a checkpoint's come from :mod:`.hf`): the whole embedding, this rank's LM-head rows."""
    V, H = cfg.vocab, cfg.hidden
    if V < 1:
        raise DitronError("make_head: DecoderConfig.vocab is 0 (no vocabulary)")
    VR = -(-V // world_size)
    v_off = rank * VR
    n = max(0, min(VR, V - v_off))
    emb = _randn((V, H), seed, 0, "embed", device, 0.02).to(dtype)
    lm = torch.zeros(1, VR, H, dtype=dtype, device=device)
    lm[0, :n] = _randn((V, H), seed, 0, "lm_head", device, H ** -0.5)[v_off:v_off + n].to(dtype)
    return Head(emb, lm, V, v_off, n, max_top_k)


#: positions per page of the paged KV cache unless told otherwise (vLLM's default block size)
PAGE_SIZE = 16


class PagedKV(NamedTuple):
    """This rank's paged KV cache, laid out as serving engines keep it (vLLM's flash-attention layout
    ``[num_blocks, block_size, num_kv_heads, head_size]`` per layer, the layers stacked first):

    * ``k``, ``v``: ``[L, num_pages, page_size, KH, D]``: position ``p`` of sequence ``b`` is row
      ``p % page_size`` of page ``block_table[b, p // page_size]`` (one page holds every kv head of
      ``page_size`` consecutive positions: an append writes one contiguous ``KH * D`` row);
    * ``block_table``: ``[B, max_pages]`` int32, sequence ``b``'s pages in order (entries past its context are
      never read; the step appends at ``seq[b] - 1`` after ``seq[b] += 1``, so that page must be in the table).
    """
    k: torch.Tensor
    v: torch.Tensor
    block_table: torch.Tensor

    @property
    def page_size(self) -> int:
        return int(self.k.shape[2])

    @property
    def num_pages(self) -> int:
        return int(self.k.shape[1])

    @property
    def max_pages(self) -> int:
        return int(self.block_table.shape[1])

    @property
    def max_ctx(self) -> int:
        """Positions one sequence can hold (its block table's width times the page size)."""
        return self.max_pages * self.page_size

    def positions(self, which: str, layer: int, b: int, start: int, stop: int) -> torch.Tensor:
        """``[KH, stop - start, D]``: positions ``[start, stop)`` of sequence ``b`` (``which``: ``"k"`` / ``"v"``)."""
        pos = torch.arange(start, stop, device=self.block_table.device)
        pages = self.block_table[b].long()[pos // self.page_size]
        return getattr(self, which)[layer][pages.to(self.k.device), (pos % self.page_size).to(self.k.device)] \
            .transpose(0, 1)

    def clone(self) -> "PagedKV":
        return PagedKV(self.k.clone(), self.v.clone(), self.block_table.clone())

    def to(self, device) -> "PagedKV":
        return PagedKV(self.k.to(device), self.v.to(device), self.block_table.to(device))


def contexts(ctx, batch: int) -> list:
    """Per-sequence context lengths: ``ctx`` (an int: the same for every sequence, or one per sequence)."""
    if isinstance(ctx, int):
        return [ctx] * batch
    out = [int(c) for c in ctx]
    if len(out) != batch:
        raise DitronError(f"{len(out)} context lengths {out} for a batch of {batch} sequences")
    return out


def make_cache(cfg: DecoderConfig, rank: int, world_size: int, batch: int, max_ctx: int, ctx, device="cpu",
               seed: int = 0, dtype=torch.bfloat16, page_size: int = PAGE_SIZE, spare_pages: int = 1) -> PagedKV:
    """This rank's :class:`PagedKV` for ``batch`` sequences of up to ``max_ctx`` positions each, random at
    positions ``< ctx[b]`` (``ctx``: an int or one per sequence), :data:`PAST_END` elsewhere.  The pages are
    handed out in a seeded random order (the same on every rank: the block table is replicated), plus
    ``spare_pages`` that no sequence owns."""
    sh = cfg.shard(world_size)
    ctxs = contexts(ctx, batch)
    bad = [c for c in ctxs if not 0 <= c < max_ctx]
    if bad:
        raise DitronError(f"make_cache: contexts {ctxs} must be in 0..max_ctx-1={max_ctx - 1} (room for the new "
                          f"tokens)")
    if page_size < 1:
        raise DitronError(f"make_cache: page_size={page_size} must be positive")
    L, D, KH, P = cfg.n_layers, cfg.head_dim, sh.kv_heads, page_size
    per_seq = -(-max_ctx // P)
    num_pages = batch * per_seq + spare_pages
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed * 7 + 12345))
    block_table = order[:batch * per_seq].view(batch, per_seq).to(torch.int32)
    top = max(ctxs)
    out = []
    for kind in ("k", "v"):
        c = torch.full((L, num_pages, P, KH, D), PAST_END, dtype=dtype, device=device)
        for l in range(L):
            full = _randn((batch, cfg.n_kv_heads, top, D), seed, l, kind, device)
            for b, n in enumerate(ctxs):
                pos = torch.arange(n)
                pages = block_table[b].long()[pos // P]
                c[l, pages.to(device), (pos % P).to(device)] = \
                    full[b, rank * KH:(rank + 1) * KH, :n].transpose(0, 1).to(dtype)
        out.append(c)
    return PagedKV(out[0], out[1], block_table.to(device))


def make_input(cfg: DecoderConfig, batch: int, step: int, device="cpu", seed: int = 0, dtype=torch.bfloat16):
    """The step's input hidden states ``[B, H]`` (the same on every rank)."""
    return _randn((batch, cfg.hidden), seed + 7919 * (step + 1), 0, "x", device).to(dtype)
