"""What the demo, the benchmark and the tests share: set up this rank's
decoder (weights, KV cache, megakernel), a torch reference for the same
rank, and the check of one step against it.

The reference is :class:`~.reference.TorchDecoder` over ``torch.distributed``
where a process group exists (GPUs under torchrun; world size 1 needs none);
on simulated ranks (no process group) it is :class:`Lockstep`: this process
regenerates every rank's shard and runs the TP step of all ranks itself
(cheap for the small configs the simulator runs).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DecoderConfig
from .model import build_megakernel
from .reference import TorchDecoder, lockstep_step
from .weights import PAGE_SIZE, PagedKV, contexts, make_cache, make_input, make_weights

#: the check of one step (see tests/bodies_decoder.py for the justification): max abs error <= REL * max|ref| + ABS
REL, ABS = 3e-2, 2e-2


class Lockstep:
    """Every rank's torch step in this process; ``step(x)`` returns rank ``rank``'s output."""

    def __init__(self, cfg, world_size, rank, batch, max_ctx, ctx, seed=0, page_size=PAGE_SIZE):
        self.rank = rank
        self.states = []
        for r in range(world_size):
            cache = make_cache(cfg, r, world_size, batch, max_ctx, ctx, seed=seed, page_size=page_size)
            self.states.append((cfg, cfg.shard(world_size), make_weights(cfg, r, world_size, seed=seed), cache,
                                torch.tensor(contexts(ctx, batch), dtype=torch.int32)))

    @property
    def seq(self):
        return self.states[self.rank][4]

    @property
    def cache(self):
        return self.states[self.rank][3]

    @property
    def k_cache(self):
        return self.cache.k

    @property
    def v_cache(self):
        return self.cache.v

    def step(self, x):
        return lockstep_step(self.states, x.cpu())[self.rank]


@dataclass
class RankSetup:
    cfg: DecoderConfig
    world: object
    batch: int
    max_ctx: int
    ctx: list               # per-sequence context lengths
    page_size: int
    weights: object
    cache: PagedKV

    @property
    def k_cache(self):
        return self.cache.k

    @property
    def v_cache(self):
        return self.cache.v


def ragged(ctx: int, batch: int) -> list:
    """Per-sequence contexts around ``ctx`` for a ragged batch: sequence ``b`` has ``ctx - (b * 37) % (ctx // 2 + 1)``
    positions (the first has ``ctx``, the others shorter, neither aligned to pages nor to splits)."""
    return [max(1, ctx - (b * 37) % (ctx // 2 + 1)) for b in range(batch)]


def setup(cfg, world, batch, ctx, max_ctx=None, seed=0, page_size=PAGE_SIZE, weights=None) -> RankSetup:
    """``ctx``: an int (every sequence) or one context length per sequence; ``weights``: this rank's
    :func:`make_weights` (``seed``) if already built."""
    ctxs = contexts(ctx, batch)
    max_ctx = max_ctx or max(ctxs) + 128
    w = weights if weights is not None else make_weights(cfg, world.rank, world.world_size, device=world.device,
                                                        seed=seed)
    cache = make_cache(cfg, world.rank, world.world_size, batch, max_ctx, ctxs, device=world.device, seed=seed,
                       page_size=page_size)
    return RankSetup(cfg, world, batch, max_ctx, ctxs, page_size, w, cache)


def megakernel(s: RankSetup, **kw):
    return build_megakernel(s.cfg, s.weights, s.cache, world_size=s.world.world_size, batch=s.batch, ctx=s.ctx, **kw)


def reference(s: RankSetup, seed=0):
    import torch.distributed as dist
    W = s.world.world_size
    if W == 1 or (dist.is_available() and dist.is_initialized()):
        seq = torch.tensor(s.ctx, dtype=torch.int32, device=s.world.device)
        return TorchDecoder(s.cfg, s.cfg.shard(W), s.weights, s.cache, seq)
    return Lockstep(s.cfg, W, s.world.rank, s.batch, s.max_ctx, s.ctx, seed=seed, page_size=s.page_size)


def check_step(dm, ref, cfg, batch, step, device):
    """One step of both on the same fresh input; ``(ok, max abs error, max |ref|)``."""
    x = make_input(cfg, batch, step).to(device)
    y = dm.step(x).float().cpu()
    r = ref.step(x).float().cpu()
    err = (y - r).abs().max().item()
    scale = r.abs().max().item()
    ok = bool(err <= REL * scale + ABS) and dm.seq.cpu().tolist() == ref.seq.cpu().tolist()
    return ok, err, scale
