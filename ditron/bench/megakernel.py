"""Decoder-step benchmark (``ditron bench megakernel``): the Qwen3-like TP
decoder of ``kernels/decoder`` as one persistent megakernel against the same
model in torch, eager and CUDA-graph captured, and against the HBM limit.

    torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel --ctx 512,4096 --machine nvidia-h200
    torchrun --standalone --nproc-per-node 2 -m ditron.bench megakernel --ctx 512,4096 --machine nvidia-h200-x2
    ditron sim -n 2 -m ditron.bench megakernel --config tiny --ctx 33 --warmup 1 --iters 2   # CPU smoke run

Per context (``--ctx``, default 512 and 4096) and batch (``--batch``, default
1, 2, 4, 8, 16): this rank's shard of the seeded random model (built once), a
paged KV cache (``--page-size``, default 16; ``--ragged``: per-sequence
contexts below ``ctx``, see ``run.ragged``) and the megakernel are built; it is
checked against the torch reference on a fresh input (one step of each; the
ranks agree on the outcome), then timed side by side (the harness's
``measure``: warm-up, median over iterations, the slowest rank, rounds in
alternating order):

* ``torch_eager``: :class:`TorchDecoder.step` (bf16 ``F.linear``, SDPA over the
  pages gathered through the block table, NCCL all-reduce);
* ``torch_graph``: the same step captured in a CUDA graph and replayed;
* ``megakernel``: a CUDA graph of ``mk.step()`` (epoch bump + one launch);
* ``hbm_limit``: (weight bytes + KV bytes read per step on a rank) / the
  device's copy bandwidth, measured in the same run (a 1 GiB ``copy_``:
  read + write bytes / time).

Rank 0 writes a Markdown table, the JSON rows and (matplotlib installed) a plot
of mk / HBM limit and mk / torch + CUDA graph per batch, one line per context;
``--out`` defaults to ``$OUT`` when that is set, else ``bench/results``.
``--dry-run`` checks the arguments and the configuration (tiles, kinds of
tasks, bytes per step and cache sizes per case) without building anything.

Every step appends one position, so the context grows by up to
``2 * repeat * (warmup + iters)`` positions during the timing (the KV bytes
of those positions are a fraction of a percent of the weight bytes at 8B).
Tuning: ``--gemv-block-n/-k``, ``--block-n qkv=..,o=..,gate_up=..,down=..``, ``--block-k`` (the same for K),
``--cols o=..,down=..,gate_up=..`` (the masked prenorm tiles' columns),
``--gemv-dot``, ``--dot-block-n/-k``, ``--dot-stream`` (the tl.dot GEMV path of batches above 2), ``--gemv-stream``
(the FMA path of batches 1-2), ``--stream-stages``, ``--max-regs`` (ptxas register cap), ``--down-split-k``,
``--attn-split``,
``--attn-block``, ``--comm-block``, ``--num-warps``, ``--no-fuse-norm``,
``--attn-stages``, ``--attn-tiles``, ``--attn-prefetch-v``, ``--attn-prefetch-o``, ``--attn-fuse-rope``,
``--rope-group``, ``--comb-group`` (the attention levers),
``--prefetch-k`` / ``--prefetch-projs`` (weight prefetch before each GEMV tile's wait), ``--scheduler``,
``--programs``.  ``--trace`` adds a traced build's time per kind of task (``mk.profile()``).  Results: ``--out``
(Markdown + JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .harness import Impl, _release, agree_fn, measure, result_meta, traced_fields


def copy_bandwidth(device, nbytes=1 << 30, iters=10):
    """Bytes per second a device-to-device ``copy_`` moves (read + write)."""
    import time

    import torch
    if not str(device).startswith("cuda"):
        nbytes = min(nbytes, 64 << 20)
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if str(device).startswith("cuda"):
        from ..runtime import sharing
        sharing.refuse_timing("ditron bench megakernel")
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            dst.copy_(src)
        b.record()
        b.synchronize()
        secs = a.elapsed_time(b) * 1e-3 / iters
    else:
        t = time.perf_counter()
        dst.copy_(src)
        secs = time.perf_counter() - t
    return 2 * nbytes / secs


def _config(args):
    from ..kernels.decoder import qwen3_8b, tiny
    if getattr(args, "model", None):
        from .megakernel_model import model_config
        cfg = model_config(args.model)
    else:
        cfg = {"8b": qwen3_8b, "tiny": tiny}[args.config]()
    if args.layers:
        cfg = cfg.with_(n_layers=args.layers)
    over = {k: v for k, v in (("gemv_block_n", args.gemv_block_n), ("gemv_block_k", args.gemv_block_k),
                              ("attn_split", args.attn_split), ("attn_block", args.attn_block),
                              ("comm_block", args.comm_block), ("num_warps", args.num_warps),
                              ("prefetch_k", args.prefetch_k), ("dot_block_n", args.dot_block_n),
                              ("dot_block_k", args.dot_block_k), ("stream_stages", args.stream_stages),
                              ("max_regs", args.max_regs), ("down_split_k", args.down_split_k),
                              ("programs_per_sm", args.programs_per_sm), ("dot_from", args.dot_from),
                              ("dot_pad", args.dot_pad), ("dot_ring", args.dot_ring),
                              ("dot_ring_small", args.dot_ring_small)) if v}
    if args.fuse_upto >= 0:
        over["fuse_upto"] = args.fuse_upto
    for flag, what in ((args.block_n, "block_n"), (args.block_k, "block_k"), (args.cols, "cols")):
        known = ("o", "down", "gate_up") if what == "cols" else ("qkv", "o", "gate_up", "down")
        for item in (flag or "").split(","):
            if item:
                proj, _, v = item.partition("=")
                if proj.strip() not in known or not v.strip().isdigit():
                    raise SystemExit(f"--{what.replace('_', '-')} {flag!r}: expected proj=N items with proj one of "
                                     f"{', '.join(known)}")
                over[f"{proj.strip()}_{what}"] = int(v)
    if args.no_fuse_norm:
        over["fuse_norm"] = False
    if args.fuse_norm:
        over["fuse_norm"] = True
    if args.no_gemv_stream:
        over["gemv_stream"] = False
    if args.dot_stream:
        over["dot_stream"] = True
    if args.no_dot_stream:
        over["dot_stream"] = False
    if args.tp1_all_reduce:
        over["direct_tp1"] = False
    if args.fold_resid:
        over["fold_resid"] = True
    if args.prenorm:
        over["prenorm"] = True
    if args.no_prenorm:
        over["prenorm"] = False
    if args.gemv_stream:
        over["gemv_stream"] = True
    if args.gemv_dot != "auto":
        over["gemv_dot"] = args.gemv_dot == "on"
    # the attention levers (issue 26 at context 4096: TileConfig.attn_stages / attn_tiles / rope_group / comb_group)
    over.update({k: v for k, v in (("attn_stages", args.attn_stages), ("attn_tiles", args.attn_tiles))
                 if v is not None})
    over.update({k: True for k, v in (("rope_group", args.rope_group), ("comb_group", args.comb_group),
                                      ("attn_prefetch_v", args.attn_prefetch_v),
                                      ("attn_prefetch_o", args.attn_prefetch_o),
                                      ("attn_fuse_rope", args.attn_fuse_rope)) if v})
    # the batch path's gate/up tiles with the weight rows on the MMA's M side (issue 26: TileConfig.gu_wdot)
    # (and its other batch-path levers; 0 turns gu_wdot / dot_ksplit off)
    over.update({k: v for k, v in (("gu_wdot", args.gu_wdot), ("gu_wdot_k", args.gu_wdot_k),
                                   ("gu_wdot_cols", args.gu_wdot_cols), ("dot_ksplit", args.dot_ksplit))
                 if v is not None})
    if args.pn_early:
        over["pn_early"] = True
    if args.no_prenorm_dot:
        over["prenorm_dot"] = False
    # the streamed prenorm GEMV tiles wait on their producers per segment of K chunks (TileConfig.stream_wait)
    if args.stream_wait is not None:
        over["stream_wait"] = args.stream_wait
    if args.stream_wait_projs:
        over["stream_wait_projs"] = args.stream_wait_projs
    if args.prefetch_projs:
        over["prefetch_projs"] = args.prefetch_projs
    if args.stream_wait_exact:
        over["stream_wait_exact"] = True
    if args.stream_wait_load or args.stream_wait_fence:
        over["stream_wait_load"] = not args.stream_wait_fence
    if args.wait_acquire:
        over["wait_acquire"] = args.wait_acquire
    if args.noinline_branches or args.inline_branches:
        over["noinline_branches"] = bool(args.noinline_branches)
    return cfg.with_tiles(**over) if over else cfg


def case_contexts(ctx, batch, ragged):
    from ..kernels.decoder import run as R
    return R.ragged(ctx, batch) if ragged else [ctx] * batch


def bench_case(world, cfg, ctx, batch, args, bw, weights=None):
    """Check then time one (context, batch); returns the table row."""
    import torch

    import ditron
    from ..kernels.decoder import run as R
    from ..kernels.decoder.reference import graph_replay
    margin = 2 * args.repeat * (args.warmup + args.iters) + 16
    ctxs = case_contexts(ctx, batch, args.ragged)
    s = R.setup(cfg, world, batch, ctxs, max_ctx=ctx + margin, page_size=args.page_size, weights=weights)
    dm = R.megakernel(s, scheduler=args.scheduler, num_programs=args.programs)
    ref = R.reference(s)
    ok, err, scale = R.check_step(dm, ref, cfg, batch, 0, world.device)
    ok = agree_fn(world)([ok])[0]
    sh = cfg.shard(world.world_size)
    nbytes = sh.weight_bytes() + sum(sh.kv_bytes(c, 1) for c in ctxs)
    row = {"ctx": ctx, "batch": batch, "check": "ok" if ok else "FAILED", "max_abs_err": err, "scale": scale,
           "bytes_per_rank": nbytes, "hbm_limit_us": nbytes / bw * 1e6, "tasks": len(dm.graph.tasks),
           "tiles": dm.graph.num_slots, "branches": len(dm.mk.code.branches), "programs": dm.mk.num_programs}
    x = torch.randn(batch, cfg.hidden, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(world.device)
    dm.buf.x.copy_(x)
    cuda = str(world.device).startswith("cuda")
    impls = [] if args.skip_eager else [Impl("torch_eager", lambda: ref.step(x))]
    if cuda:
        impls.append(Impl("torch_graph", ref.graphed(x)))
    if ok:
        impls.append(Impl("megakernel", graph_replay(dm.step) if cuda else dm.step))
    res = measure(impls, world.device, warmup=args.warmup, iters=args.iters, graph=False,
                  barrier=ditron.barrier_all, repeat=args.repeat, agree=agree_fn(world))
    for name, r in res.items():
        row[f"{name}_us"] = r["us"] if r["ok"] else None
        if not r["ok"]:
            row.setdefault("errors", {})[name] = r["error"]
    mk = row.get("megakernel_us")
    if mk:
        for base in ("torch_eager", "torch_graph"):
            if row.get(f"{base}_us"):
                row[f"mk_over_{base}"] = mk / row[f"{base}_us"]
        row["mk_over_hbm_limit"] = mk / row["hbm_limit_us"]
    if dm.mk.resources:
        row["resources"] = dm.mk.resources
    if args.trace and ok:
        # a second build of the same step with per-item timestamps (the timed kernel has none)
        tm = R.megakernel(s, scheduler=args.scheduler, num_programs=dm.mk.num_programs, trace=True)
        row.update(traced_fields(tm.mk, tm.step))
    return row


def table(rows) -> str:
    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)
    lines = ["| context | batch | check (max abs err) | torch eager (us) | torch + CUDA graph (us) | megakernel (us) "
             "| HBM limit (us) | mk / graph | mk / limit |", "| --- |" + " --- |" * 8]
    for r in rows:
        lines.append(f"| {r['ctx']} | {r['batch']} | {r['check']} ({r['max_abs_err']:.3g}) | "
                     f"{f(r.get('torch_eager_us'))} | {f(r.get('torch_graph_us'))} | {f(r.get('megakernel_us'))} | "
                     f"{f(r['hbm_limit_us'])} | {f(r.get('mk_over_torch_graph'), '{:.2f}x')} | "
                     f"{f(r.get('mk_over_hbm_limit'), '{:.2f}x')} |")
    return "\n".join(lines)


def plot(rows, path, title):
    """mk / HBM limit and mk / torch + CUDA graph per batch, one line per context; ``None`` without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for ctx in dict.fromkeys(r["ctx"] for r in rows):
        rs = [r for r in rows if r["ctx"] == ctx]
        for a, key in zip(ax, ("mk_over_hbm_limit", "mk_over_torch_graph")):
            pts = [(r["batch"], r[key]) for r in rs if r.get(key)]
            if pts:
                a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"context {ctx}")
    for a, what, goal in zip(ax, ("megakernel / HBM limit", "megakernel / torch + CUDA graph"), (1.3, 0.55)):
        a.axhline(goal, color="gray", ls="--", lw=1, label=f"goal {goal}x")
        a.axhline(1.0, color="black", lw=0.5)
        a.set_xscale("log", base=2)
        batches = sorted({r["batch"] for r in rows})
        a.set_xticks(batches)
        a.set_xticklabels([str(b) for b in batches])
        a.set_xlabel("batch")
        a.set_title(f"{title}: {what}", fontsize=9)
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def dry_run(cfg, ctxs, batches, args) -> int:
    """The cases without building anything (no GPU, no weights): tiles, GEMV path, bytes per step, cache sizes."""
    from ..kernels.decoder.config import cdiv
    sh = cfg.shard(1)
    wb = sh.weight_bytes()
    print(f"ditron bench megakernel --dry-run: config {args.config} ({cfg.n_layers} layers), tiles {vars(cfg.tiles)}, "
          f"weights {wb / 2**30:.2f} GiB per rank at TP=1")
    margin = 2 * args.repeat * (args.warmup + args.iters) + 16
    for ctx in ctxs:
        for b in batches:
            cs = case_contexts(ctx, b, args.ragged)
            kv = sum(sh.kv_bytes(c, 1) for c in cs)
            pages = b * cdiv(ctx + margin, args.page_size) + 1
            cache = 2 * cfg.n_layers * pages * args.page_size * sh.kv_heads * cfg.head_dim * 2
            dot = cfg.tiles.dot_for(b)
            stream = cfg.tiles.stream_for(b)
            pre = cfg.tiles.direct_tp1 and cfg.tiles.prenorm_for(b)
            norm = ("prenorm (o / down write its input)" if pre
                    else "fused into the GEMV tiles" if cfg.tiles.fuse_for(b) else "separate tasks")
            # act columns per gate/up tile (TileConfig.gate_up_cols / gu_wdot_cols under prenorm)
            gbn = cfg.tiles.gu_wdot if dot and cfg.tiles.gu_wdot else cfg.tiles.block_n("gate_up", dot)
            gu = cfg.tiles.cols("gate_up", dot) if pre else gbn
            print(f"  context {ctx} batch {b}: contexts {cs if len(cs) <= 4 else cs[:4] + ['...']}, GEMV "
                  f"{'tl.dot (rows padded to 16), K chunk ' + str(cfg.tiles.block_k('down', True)) if dot else 'FMA'}"
                  f"{f' streamed by cp.async ({stream} stages)' if stream else ''}"
                  f"{f', gate/up weight rows on M ({cfg.tiles.gu_wdot} x 2)' if dot and cfg.tiles.gu_wdot else ''}"
                  f"{f', K over {cfg.tiles.dot_ksplit} warps' if dot and cfg.tiles.dot_ksplit > 1 else ''}"
                  f", RMSNorm {norm}, gate/up {cdiv(sh.inter, gu)} tiles of {gu}"
                  f"{f' of {gbn} columns' if gu != gbn else ' columns'}"
                  f", bytes per step {(wb + kv) / 2**30:.2f} GiB, paged cache {pages} pages = {cache / 2**30:.2f} GiB "
                  f"(x2 with the reference's copy)")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "megakernel":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="ditron bench megakernel", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=["8b", "tiny"], default="8b")
    p.add_argument("--model", choices=["qwen3-8b", "llama3-8b", "tiny-qwen3"], default=None,
                   help="the whole step of this model (embedding to sampled token; random weights at its shapes) "
                        "against the full step's HBM limit, torch + CUDA graph and transformers under torch.compile "
                        "(ditron/bench/megakernel_model.py); default batches 1,8,16")
    p.add_argument("--check-rel", type=float, default=None,
                   help="--model: the step's check holds the logits to REL * max|logit| + 0.02 of torch's "
                        "(default 0.06 with --model: 36 random bfloat16 layers put any two bfloat16 "
                        "implementations ~4%% apart; tests/gpu/hf_8b_equality.py holds the same step to "
                        "transformers in float32)")
    p.add_argument("--hf-batch", default="1,16",
                   help="with --model: batches at which transformers (static cache, torch.compile reduce-overhead) is "
                        "timed, one rank only (each case compiles once, in a child process of its own: "
                        "ditron/bench/megakernel_hf.py; '' : none)")
    p.add_argument("--hf-timeout", type=float, default=900,
                   help="seconds a transformers case's child process may take (model build, compile, timing)")
    p.add_argument("--layers", type=int, default=0, help="override the number of layers")
    p.add_argument("--ctx", default="512,4096", help="KV positions before the step (comma list)")
    p.add_argument("--batch", default=None, help="batch sizes (comma list; default 1,2,4,8,16, with --model 1,8,16)")
    p.add_argument("--ragged", action="store_true", help="per-sequence contexts below --ctx (run.ragged)")
    p.add_argument("--page-size", type=int, default=16, help="positions per page of the paged KV cache")
    p.add_argument("--skip-eager", action="store_true", help="time torch + CUDA graph only (not eager torch)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the arguments and print the cases (bytes per step, cache sizes); build nothing")
    p.add_argument("--scheduler", default="round_robin", help="round_robin, zigzag or dynamic")
    p.add_argument("--programs", type=int, default=None,
                   help="persistent programs (default: 2 per SM, fewer if the compiled kernel's registers or shared "
                        "memory do not let that many be resident)")
    p.add_argument("--gemv-block-n", type=int, default=0)
    p.add_argument("--gemv-block-k", type=int, default=0)
    p.add_argument("--block-n", default="", help="per-projection columns per tile, e.g. 'qkv=32,gate_up=16'")
    p.add_argument("--block-k", default="", help="per-projection K chunk, e.g. 'gate_up=512,down=2048'")
    p.add_argument("--cols", default="",
                   help="with prenorm: output columns per o_proj / down_proj / gate/up tile (masked tiles; "
                        "TileConfig.o_cols / down_cols / gate_up_cols), e.g. 'o=11,down=11,gate_up=37'")
    p.add_argument("--gemv-dot", choices=["auto", "on", "off"], default="auto",
                   help="GEMV tiles accumulate with tl.dot (auto: from batch --dot-from on)")
    p.add_argument("--dot-block-n", type=int, default=0,
                   help="columns per GEMV tile on the tl.dot path (0: the projection's width)")
    p.add_argument("--dot-block-k", type=int, default=0, help="K chunk of the tl.dot GEMV path (8b default 512)")
    p.add_argument("--dot-stream", action="store_true",
                   help="the tl.dot GEMV path streams weights by cp.async into shared memory (Triton's pipeliner)")
    p.add_argument("--no-dot-stream", action="store_true",
                   help="the tl.dot GEMV path double-buffers the weights in registers (8b default: streamed)")
    p.add_argument("--tp1-all-reduce", action="store_true",
                   help="keep the all-reduce tasks on one rank (8b default: o / down write the delta directly)")
    p.add_argument("--fold-resid", action="store_true",
                   help="one rank, fused norms (batch 1): o_proj / down_proj commit the residual add of their columns "
                        "(no res_a / res_m tasks)")
    p.add_argument("--prenorm", action="store_true",
                   help="at every batch (8b default: batch 1): o_proj / down_proj add their output to the residual "
                        "and write the next norm's bf16 input and sums of squares; qkv / gate-up tiles are plain GEMVs "
                        "scaled by rstd (no fused-norm re-reads, no norm tasks)")
    p.add_argument("--no-prenorm", action="store_true", help="off at every batch (the fused / separate norms)")
    p.add_argument("--dot-pad", type=int, default=0,
                   help="the tl.dot path pads the batch rows to at least this many (8b default 8; TileConfig default 16)")
    p.add_argument("--dot-ring", type=int, default=0,
                   help="shared-memory bytes per program for the streamed tl.dot path's ring: its depth per projection "
                        "(8b default 73728, above batch 8: see --dot-ring-small; 0: --stream-stages)")
    p.add_argument("--dot-ring-small", type=int, default=0,
                   help="the ring's bytes at batches of at most 8 instead of --dot-ring (8b default 49152)")
    p.add_argument("--dot-from", type=int, default=0,
                   help="smallest batch on the tl.dot path when --gemv-dot is auto (8b default: 2)")
    p.add_argument("--fuse-upto", type=int, default=-1,
                   help="largest batch whose GEMV tiles fuse the RMSNorm (8b default: 1; 0: none)")
    p.add_argument("--gemv-stream", action="store_true",
                   help="the FMA GEMV path of small batches streams weights by cp.async into shared memory")
    p.add_argument("--stream-stages", type=int, default=0,
                   help="software-pipeline depth of --gemv-stream / --dot-stream (default 3)")
    p.add_argument("--max-regs", type=int, default=0,
                   help="registers per thread the megakernel may use (ptxas maxnreg; 0: ptxas chooses)")
    p.add_argument("--down-split-k", type=int, default=0,
                   help="K slices of the down projection (split-K tiles + a sum per all-reduce chunk; 0/1: no split)")
    p.add_argument("--no-fuse-norm", action="store_true", help="separate RMSNorm tasks (TileConfig.fuse_norm=False)")
    p.add_argument("--fuse-norm", action="store_true",
                   help="RMSNorm fused into the GEMV tiles at every batch (default: up to --fuse-upto)")
    p.add_argument("--no-gemv-stream", action="store_true",
                   help="batches 1-2: weights double-buffered in registers (8b default: streamed, --gemv-stream)")
    p.add_argument("--programs-per-sm", type=int, default=0,
                   help="default grid per SM, shrunk to what fits (8b: 3; --programs sets the grid exactly)")
    p.add_argument("--attn-split", type=int, default=0)
    p.add_argument("--attn-block", type=int, default=0)
    p.add_argument("--attn-stages", type=int, default=None,
                   help="software pipeline depth of each attention tile's loop over K/V blocks (0: a plain loop)")
    p.add_argument("--attn-tiles", type=int, default=None,
                   help="attention tiles per layer to aim for (the split length follows batch and context; 0: "
                        "--attn-split positions per tile; 8b default 396: one wave on 3 programs x 132 SMs)")
    p.add_argument("--attn-prefetch-v", action="store_true",
                   help="attention tiles load the next block's V rows into registers while reducing the current one")
    p.add_argument("--attn-prefetch-o", action="store_true",
                   help="attention tiles prefetch their share of the layer's o_proj weights into L2 before their wait")
    p.add_argument("--attn-fuse-rope", action="store_true",
                   help="no rope stage: attention tiles norm / rotate q themselves, the split of the new position "
                        "appends k and v")
    p.add_argument("--rope-group", action="store_true",
                   help="one q/k-norm + RoPE tile per (sequence, kv head) instead of one per head")
    p.add_argument("--comb-group", action="store_true",
                   help="one flash-decoding combine tile per (sequence, kv head) instead of one per q head")
    p.add_argument("--gu-wdot", type=int, default=None,
                   help="gate/up tile width of the tl.dot batch path with the weight rows (gate and up stacked) as "
                        "the MMA's M operand (0: off, the plain tl.dot tiles; 8b default 32: 384 tiles)")
    p.add_argument("--gu-wdot-k", type=int, default=None,
                   help="K chunk of --gu-wdot's tiles (0, the 8b default: from the ring, 256 up to batch 8)")
    p.add_argument("--gu-wdot-cols", type=int, default=None,
                   help="columns per --gu-wdot tile under prenorm, the other rows masked (TileConfig.gu_wdot_cols; "
                        "0: all), e.g. 19 for Llama-3.1-8B's 14336 in 755 tiles of 32 rows")
    p.add_argument("--no-prenorm-dot", action="store_true",
                   help="the tl.dot batch path with separate norm tasks (8b default: prenorm there too). The batch "
                        "path before issue 26's b8 levers: --no-prenorm-dot --gu-wdot 0 --dot-ksplit 0")
    p.add_argument("--pn-early", action="store_true",
                   help="prenorm on the tl.dot batch path: its tiles load the epilogue's inputs (rstd's sums, "
                        "the residual columns) before the weight stream")
    p.add_argument("--dot-ksplit", type=int, default=None,
                   help="tl.dot batch path: each K chunk of the qkv / o / down tiles split over this many warps "
                        "(a batched dot; 0: off; 8b default 4)")
    p.add_argument("--stream-wait", type=int, default=None,
                   help="batch 1 (prenorm, streamed FMA GEMVs): K chunks per in-tile wait segment -- the qkv / o / "
                        "gate-up / down tiles wait on their producers per segment inside their K loop, so their "
                        "weights stream while the last producers finish (0: off; default: 1 on NVIDIA, 0 on AMD)")
    p.add_argument("--stream-wait-projs", default="",
                   help="the projections the in-tile waits apply to (comma list of qkv, o, gate_up, down; "
                        "default gate_up)")
    p.add_argument("--stream-wait-exact", action="store_true",
                   help="with --stream-wait: each segment waits at its own first chunk and the activations are "
                        "loaded outside the software pipeline (the first weight chunks are requested before any "
                        "wait) instead of pipelined activations and waits stream-stages chunks ahead")
    sw_acq = p.add_mutually_exclusive_group()
    sw_acq.add_argument("--stream-wait-load", action="store_true",
                        help="the in-loop waits poll with ld.acquire and no fence (the default; the fence, "
                             "MEMBAR.ALL.GPU, may wait for the weight copies in flight)")
    sw_acq.add_argument("--stream-wait-fence", action="store_true",
                        help="the in-loop waits poll relaxed and end with fence.acq_rel.gpu (the flag's default until 2026-11-27)")
    p.add_argument("--wait-acquire", choices=["fence", "load"], default=None,
                   help="how the megakernel's scoreboard waits before each tile acquire: relaxed polls + one "
                        "fence.acq_rel.gpu (default) or ld.acquire polls and no fence")
    inl = p.add_mutually_exclusive_group()
    inl.add_argument("--noinline-branches", action="store_true",
                     help="each task kind's tile a called (noinline) function in the megakernel, not inlined into "
                          "the item loop (TileConfig.noinline_branches: fewer registers held across kinds; the "
                          "default on NVIDIA)")
    inl.add_argument("--inline-branches", action="store_true",
                     help="every task kind's tile inlined into the megakernel's item loop (noinline_branches=False; "
                          "the default on AMD)")
    p.add_argument("--comm-block", type=int, default=0)
    p.add_argument("--num-warps", type=int, default=0)
    p.add_argument("--prefetch-k", type=int, default=0,
                   help="GEMV weight columns per row prefetched into L2 before each tile's dependency wait (0: off)")
    p.add_argument("--prefetch-projs", default="",
                   help="the projections that --prefetch-k applies to (comma list of qkv, o, gate_up, down; "
                        "default all)")
    p.add_argument("--trace", action="store_true",
                   help="also run a traced build of the step and print where its time goes (per kind of task)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=25)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    p.add_argument("--tag", default=None)
    p.add_argument("--machine", default=os.environ.get("DITRON_MACHINE", "unknown machine"))
    args = p.parse_args(argv)

    cfg = _config(args)
    if args.batch is None:
        args.batch = "1,8,16" if args.model else "1,2,4,8,16"
    args.hf_batches = [int(b) for b in args.hf_batch.split(",") if b]
    ctxs = [int(c) for c in args.ctx.split(",") if c]
    batches = [int(b) for b in args.batch.split(",") if b]
    if not ctxs or not batches or min(ctxs) < 1 or min(batches) < 1 or args.page_size < 1:
        p.error(f"--ctx {args.ctx!r}, --batch {args.batch!r}, --page-size {args.page_size}: positive values needed")
    if args.dry_run:
        return dry_run(cfg, ctxs, batches, args)
    if args.model:
        from .megakernel_model import main_model
        args.contexts = lambda ctx, batch: case_contexts(ctx, batch, args.ragged)
        return main_model(args, argv, cfg, ctxs, batches, copy_bandwidth)
    import ditron
    world = ditron.init()
    bw = copy_bandwidth(world.device)
    from ..kernels.decoder.weights import make_weights
    weights = make_weights(cfg, world.rank, world.world_size, device=world.device)
    def report(final):
        if world.rank != 0:
            return
        command = "ditron bench megakernel " + " ".join(argv)
        meta = result_meta("megakernel", "bf16", world.world_size, world.device, args.machine, command)
        meta.update(config=args.config, layers=cfg.n_layers, tiles=vars(cfg.tiles), copy_bandwidth_GBs=bw / 1e9,
                    scheduler=args.scheduler)
        md = [f"### Decoder step megakernel ({args.config}, {cfg.n_layers} layers), TP={world.world_size} "
              f"({args.machine}, {meta['date']})", "", f"Command: `{command}`", "",
              f"Copy bandwidth {bw / 1e9:.0f} GB/s; HBM limit = (weight + KV bytes per rank) / copy bandwidth. "
              f"Tiles: {vars(cfg.tiles)}; scheduler {args.scheduler}; programs "
              f"{', '.join(str(r['programs']) for r in rows)}; page size {args.page_size}"
              + ("; ragged contexts (run.ragged: sequence b has ctx - 37 b mod (ctx / 2 + 1))" if args.ragged else "")
              + "; registers (spilled bytes) per case: "
              + ", ".join(f"{r['resources']['n_regs']} ({r['resources']['n_spills']})" if r.get("resources") else "-"
                          for r in rows) + ".", "", table(rows), ""]
        for r in rows:
            if r.get("profile_table"):
                md += [f"Traced step, context {r['ctx']}, batch {r['batch']} (a separate build with timestamps):",
                       "", r["profile_table"], ""]
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{args.tag or args.machine.replace(' ', '_')}-megakernel")
        with open(stem + ".md", "w") as f:
            f.write("\n".join(md))
        with open(stem + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
        if not final:                  # the results so far (a run cut short keeps them)
            return
        png = plot(rows, stem + ".png", f"decoder step ({args.config}, TP={world.world_size}, {args.machine})")
        print("\n".join(md))
        print(f"wrote {stem}.md, {stem}.json" + (f", {png}" if png else
                                                  " (no plot: matplotlib is not installed)"))

    rows = []
    for ctx in ctxs:
        for batch in batches:
            with ditron.heap_scope():
                rows.append(bench_case(world, cfg, ctx, batch, args, bw, weights))
            _release(world.device)
            if world.rank == 0:
                r = rows[-1]
                print(f"context {ctx} batch {batch}: {r['check']}, megakernel {r.get('megakernel_us')} us, "
                      f"torch + graph {r.get('torch_graph_us')} us, HBM limit {r['hbm_limit_us']:.1f} us"
                      + (f", {r['resources']['n_regs']} registers ({r['resources']['n_spills']} spilled)"
                         if r.get("resources") else ""), flush=True)
            report(final=False)
    report(final=True)
    bad = [r for r in rows if r["check"] != "ok" or r.get("errors")]
    ditron.finalize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
