"""Registers, spills and shared memory of the decoder megakernel without a GPU (issue 26).

The megakernel is one kernel with one branch per kind of task: its register budget is set by its heaviest
branch, for every branch, and its shared memory by the largest.  :func:`compile_step` compiles the step exactly as
:func:`~.model.decoder_tasks` configures it (Qwen3-8B's ``N`` and ``K`` are compile-time constants, so the real
shapes matter; one layer: the branches are the same for 36) ahead of time for ``sm_90a``, the whole step or a
subset of its task kinds (each alone: what that branch costs); :func:`usage` adds ``ptxas -v``'s registers and
spills and how many programs fit per SM.  Weights and cache are 1-element / tiny placeholders (compiled, never
run).  ``python bench/megakernel_regs.py`` prints the table per lever.
"""
from __future__ import annotations

import torch

from .config import DecoderConfig
from .model import check_target, decoder_tasks, make_buffers, register
from .weights import Head, PagedKV, Weights

#: what ``torch.cuda.get_device_properties`` reports for one H100 SXM / H200 (the same per-SM limits)
H100_SM = {"regs_per_multiprocessor": 65536, "shared_memory_per_multiprocessor": 233472,
           "max_threads_per_multi_processor": 2048, "warp_size": 32}


def kinds_of(specs) -> list:
    """Task kinds in order (``qkv.3`` -> ``qkv``)."""
    return list(dict.fromkeys(s.name.rsplit(".", 1)[0] if s.name.rsplit(".", 1)[-1].isdigit() else s.name
                              for s in specs))


def step_specs(cfg: DecoderConfig, batch: int, max_ctx: int = 4272, page_size: int = 16, max_top_k: int = 64) -> list:
    """The step's task specs at TP=1 (:func:`~.model.decoder_tasks`) on placeholder weights and cache; with
    ``cfg.vocab`` the model's ends too (embedding gather, LM head, sampler: :class:`~.weights.Head` of placeholder
    tables with the real shapes, one element of storage)."""
    sh = cfg.shard(1)
    w = Weights(*[torch.empty(1, dtype=torch.bfloat16) for _ in range(7)], torch.empty(1, dtype=torch.float32))
    pages = -(-max_ctx // page_size)
    # K and V are distinct tensors, as in a real cache: one tensor passed as both is one kernel argument, and the
    # compiler then folds V's loads into K's (the attention branch compiled without its V stream)
    k, v = (torch.empty((1, 1, page_size, sh.kv_heads, cfg.head_dim), dtype=torch.bfloat16) for _ in range(2))
    cache = PagedKV(k, v, torch.zeros((batch, pages), dtype=torch.int32))
    head = None
    if cfg.vocab:
        one = torch.empty(1, dtype=torch.bfloat16)
        head = Head(one.expand(cfg.vocab, cfg.hidden), one.expand(1, cfg.vocab, cfg.hidden), cfg.vocab, 0, cfg.vocab,
                    max_top_k)
    buf = make_buffers(cfg, 1, batch, cache.max_ctx, 1, "cpu", head=head)
    return decoder_tasks(cfg, 1, w, cache, buf, head)


def compile_step(cfg: DecoderConfig, batch: int, kinds=None, target: str = "sm_90a", max_ctx: int = 4272,
                 page_size: int = 16, max_top_k: int = 64):
    """Compile the decoder step of one rank at TP=1 (``cfg`` with one layer is enough) for ``batch`` sequences and
    a block table of ``max_ctx`` positions; ``kinds``: only these task kinds (e.g. ``("attn",)``; their
    kept task then depends on the one before it).  Needs a ditron world (``ditron.init("sim")``: the all-reduce tasks
    allocate symmetric staging).  Returns the :class:`ditron.compiler.CompiledKernel`."""
    import ditron
    import ditron.task as dtask
    cfg = check_target(cfg, target)
    specs = step_specs(cfg, batch, max_ctx, page_size, max_top_k)
    if kinds is not None:
        keep = set(kinds)
        specs = [s for s in specs if (s.name.rsplit(".", 1)[0] if s.name.rsplit(".", 1)[-1].isdigit() else s.name)
                 in keep]
        for prev, s in zip([None] + specs, specs):     # a chain: every hazard between the kept tasks ordered
            s.deps = [(prev.name, None)] if prev is not None else []
    with ditron.heap_scope():           # the all-reduce staging: freed once compiled (never run)
        g = dtask.TaskGraph(f"decoder_b{batch}")
        register(g, specs)
        mk = g.compile(num_programs=8, num_warps=cfg.tiles.num_warps, wait_acquire=cfg.tiles.wait_acquire,
                       noinline_branches=cfg.tiles.noinline_branches)
        opts = {"maxnreg": cfg.tiles.max_regs} if cfg.tiles.max_regs else {}
        return ditron.compile(mk.kernel, target=target, signature=mk.signature(), num_warps=cfg.tiles.num_warps,
                              **opts)


def resident_per_sm(use: dict, num_warps: int) -> int:
    """Programs of a kernel with ``use`` (:meth:`CompiledKernel.usage`) that fit on one H100 / H200 SM."""
    from types import SimpleNamespace

    from ditron.task.runtime import resident_per_sm as fit
    return fit(SimpleNamespace(**H100_SM), use["registers"], use["shared"], num_warps)


def usage(cfg: DecoderConfig, batch: int, kinds=None, **kw) -> dict:
    """:meth:`CompiledKernel.usage` of :func:`compile_step` plus ``resident_per_sm`` (H100 / H200) and
    ``cp_async`` / ``tma`` (whether the PTX streams through shared memory)."""
    ck = compile_step(cfg, batch, kinds, **kw)
    use = ck.usage()
    use["resident_per_sm"] = resident_per_sm(use, cfg.tiles.num_warps)
    ptx = ck.asm["ptx"]
    use["cp_async"] = "cp.async.cg" in ptx or "cp.async.ca" in ptx
    use["tma"] = "cp.async.bulk.tensor" in ptx
    return use
