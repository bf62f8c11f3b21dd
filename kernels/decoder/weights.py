"""Random weights and KV cache of the Qwen3-like decoder, per rank.

Every tensor is generated in its *global* (unsharded) shape from a seed that
depends only on (seed, layer, kind), then this rank's shard is sliced out, so
TP=1 and TP=W compute the same model (on the same device type: CPU and CUDA
generators differ).  Layouts (per rank, bf16, layers stacked first):

* ``norm [2L + 1, H]``: input_layernorm of layer l at ``2l``, post_attention_layernorm at ``2l + 1``, the
  final norm at ``2L`` (one stacked tensor: every RMSNorm task shares one branch of the megakernel);
* ``qkv [L, (QH + 2 KH) * D, H]``: this rank's q heads, then its k heads, then its v heads;
* ``q_norm, k_norm [L, D]``; ``o [L, H, QH * D]`` (row-parallel: this rank's columns);
* ``gate_up [L, 2 I_r, H]``: this rank's gate rows, then its up rows; ``down [L, H, I_r]`` (row-parallel);
* KV cache ``[L, B, KH, max_ctx, D]``: random up to ``ctx``, :data:`PAST_END` beyond (never read when the
  masks are right; a masking bug shows up as a large error).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ditron.errors import DitronError

from .config import DecoderConfig, Shard

PAST_END = 1000.0
_KINDS = {"norm": 1, "qkv": 2, "qk_norm": 3, "o": 4, "gate_up": 5, "down": 6, "k": 7, "v": 8, "x": 9}


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

    def nbytes(self) -> int:
        return sum(getattr(self, f.name).numel() * getattr(self, f.name).element_size() for f in fields(self))


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
                   torch.stack(dn))


def make_cache(cfg: DecoderConfig, rank: int, world_size: int, batch: int, max_ctx: int, ctx: int, device="cpu",
               seed: int = 0, dtype=torch.bfloat16):
    """This rank's ``(k_cache, v_cache)``, ``[L, B, KH, max_ctx, D]``, random at positions ``< ctx``."""
    sh = cfg.shard(world_size)
    if not 0 <= ctx < max_ctx:
        raise DitronError(f"make_cache: ctx={ctx} must be in 0..max_ctx-1={max_ctx - 1} (room for the new tokens)")
    L, D, KH = cfg.n_layers, cfg.head_dim, sh.kv_heads
    out = []
    for kind in ("k", "v"):
        c = torch.full((L, batch, KH, max_ctx, D), PAST_END, dtype=dtype, device=device)
        for l in range(L):
            full = _randn((batch, cfg.n_kv_heads, ctx, D), seed, l, kind, device)
            c[l, :, :, :ctx] = full[:, rank * KH:(rank + 1) * KH].to(dtype)
        out.append(c)
    return out[0], out[1]


def make_input(cfg: DecoderConfig, batch: int, step: int, device="cpu", seed: int = 0, dtype=torch.bfloat16):
    """The step's input hidden states ``[B, H]`` (the same on every rank)."""
    return _randn((batch, cfg.hidden), seed + 7919 * (step + 1), 0, "x", device).to(dtype)
