"""Attention benchmarks: ``ditron bench ring_attn`` (ring attention forward,
kernels/attention.py) against torch SDPA in the same run.

    torchrun --standalone --nproc-per-node 1 -m ditron.bench ring_attn --seq 8192,16384,32768 --machine nvidia-h100-x1
    torchrun --standalone --nproc-per-node 4 -m ditron.bench ring_attn --seq 32768      # sequence = all ranks
    ditron sim -n 2 -m ditron.bench ring_attn --seq 64 --heads 2/1 --head-dim 16 --iters 1 --warmup 1   # CPU smoke

First a correctness pass on fresh random inputs at odd shapes (every
config, causal and not, bf16 and fp16, against fp32 math SDPA); then per
(sequence, causal) the implementations are checked on the benchmark's
inputs and timed side by side (the harness's ``measure``: warm-up, median,
slowest rank, rounds in alternating order):

* ``ditron``: what ``ring_attention`` runs without a ``core`` / ``config``
  (``kernels.attention.resolve_core``: on a Hopper GPU at world size 1 the Gluon
  core with its per-GPU table's config, kernels/attention_tables/; else the tl
  core with ``default_config`` for the length) -- its ``config`` column names the
  core, the config and the table entry; then the tl core's GPU configs
  (``ditron[<AttnConfig>]``, skipped where one is the default) and with
  ``--configs all``, ``ditron[<config>]`` for each of ``TUNE_CONFIGS``;
* ``sdpa_cudnn`` and ``sdpa_flash``: ``scaled_dot_product_attention`` with
  that backend (GQA through ``enable_gqa``) on the whole sequence at world
  size 1; at world size > 1, NCCL ``all_gather`` of K and V then SDPA of the
  local queries (contiguous sharding, the causal mask as
  ``causal_lower_right`` on the visible keys), and ``nccl_all_gather_kv``
  alone.

``--seq`` is the whole sequence (every rank holds ``seq / W`` rows).
TFLOP/s count ``4 * B * Hq * seq^2 * D`` (half with ``causal``) over all
ranks.  After the table: every implementation's ratio to SDPA cuDNN per
(seq, causal), its geomean and its worst shape (issue 52's goal: the
``ditron`` row >= 0.95x at every shape).  Results: ``--out`` (Markdown + JSON).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

from .harness import Impl, add_run_args, gather_ranks, measure, result_meta


def _sdpa(q, k, v, causal, backend=None, lower_right=False):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    mask = None
    if causal and lower_right:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(q.shape[2], k.shape[2])
    kw = dict(attn_mask=mask, is_causal=causal and mask is None, enable_gqa=q.shape[1] != k.shape[1])
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _math_reference(q, k, v, causal):
    """fp32 SDPA (math) with the KV heads repeated: the small checks' reference."""
    import torch.nn.functional as F
    G = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(G, 1),
                                          v.float().repeat_interleave(G, 1), is_causal=causal)


_gather = gather_ranks          # the name the attention benches use


def _config_label(A, q, k, causal, W, cfg):
    """What a row runs: ``cfg`` (an explicit tl config), or for None the default core and config of the shape
    (kernels.attention.resolve_core: the Gluon core on Hopper at world size 1, else the tl core by length)."""
    if cfg is not None:
        return "tl " + cfg.short()
    choice = A.resolve_core(q, k, causal, W)
    if choice.core == "gluon":
        return f"default: {choice.label()} [{choice.why}]"
    return f"default: tl {A.default_config(q.device, q.shape[2] * W, causal, W).short()} [{choice.why}]"


def geomean(xs):
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary(rows):
    """Per implementation: its ratio to SDPA cuDNN at every (seq, causal), the geomean and the worst."""
    shapes = list(dict.fromkeys((r["seq"], r["causal"]) for r in rows))
    lines = ["x cuDNN (cuDNN time / implementation time) per shape: "
             + " ".join(f"{s}{'c' if c else ''}" for s, c in shapes)]
    for impl in dict.fromkeys(r["impl"] for r in rows):
        if impl.endswith("sdpa_cudnn") or impl == "nccl_all_gather_kv":
            continue
        by = {(r["seq"], r["causal"]): r for r in rows if r["impl"] == impl}
        ratios = [by[sh]["vs_cudnn"] if sh in by else float("nan") for sh in shapes]
        ok = [x for x in ratios if x == x]
        worst = min(ok) if ok else float("nan")
        note = next((r["note"] for r in rows if r["impl"] == impl and r["note"]), "")
        lines.append(f"{impl:<24} geomean {geomean(ratios):.3f} worst {worst:.3f} | "
                     + " ".join(f"{x:.3f}" for x in ratios) + (f" | {note}" if note else ""))
    return lines


def small_checks(world, configs, args):
    """Every config at odd shapes, causal and not, bf16 and fp16, against
    fp32 math SDPA on the gathered tensors.  Returns a list of failures."""
    import torch

    from ..kernels import attention as A
    W, r, dev = world.world_size, world.rank, world.device
    sim = world.backend == "sim"
    # (B, Hq, Hkv, rows per rank, D, dtypes, configs): the default config (None: by length) and GPU_CONFIG
    # at odd shapes in both dtypes; the others at a shape that shares their compiled variant with the timed
    # runs (rows a multiple of 16, not of the tile: the tail tiles run)
    if sim:
        shapes = [(1, 4, 2, 10, 16, (torch.bfloat16, torch.float16), configs)]
    else:
        shapes = [(1, 8, 2, 1000, 128, (torch.bfloat16, torch.float16), configs[:1] + [A.GPU_CONFIG]),
                  (2, 4, 4, 333, 64, (torch.bfloat16,), configs[:1]),
                  (1, 8, 2, 1008, 128, (torch.bfloat16,), configs[1:])]
    fails = []
    for B, HQ, HKV, S, D, dtypes, cfgs in shapes:
        if not cfgs:
            continue
        for dtype in dtypes:
            ctx = A.create_ring_attention_context(B, S, HKV, D, dtype)
            for causal in (False, True):
                layout = "zigzag" if causal else "contiguous"
                g = torch.Generator().manual_seed(11 + S + int(causal))
                q, k, v = (torch.randn(B, h, S * W, D, generator=g).to(dtype) for h in (HQ, HKV, HKV))
                ref = A.shard(_math_reference(q.to(dev), k.to(dev), v.to(dev), causal).cpu(), r, W, layout)
                sh = [A.shard(t, r, W, layout).to(dev) for t in (q, k, v)]
                for cfg in cfgs:
                    # None: the default core and config for this shape (kernels.attention.resolve_core)
                    label = _config_label(A, sh[0], sh[1], causal, W, cfg)
                    try:
                        out = A.ring_attention(*sh, ctx, causal=causal, layout=layout, config=cfg)
                        err = (out.float().cpu() - ref).abs().max().item()
                        tol = 2.5e-2 if dtype == torch.bfloat16 else 5e-3
                        if not err <= tol:
                            fails.append(f"{label} {dtype} causal={causal} {(B, HQ, HKV, S, D)}: max abs "
                                         f"error {err:.3g} > {tol}")
                    except Exception as e:  # noqa: BLE001 -- reported
                        fails.append(f"{label} {dtype} causal={causal} {(B, HQ, HKV, S, D)}: "
                                     f"{type(e).__name__}: {str(e)[:300]}")
            del ctx
    return fails


def ring_case(world, seq, causal, configs, args, agree):
    """Check and time one (sequence, causal); returns the table rows."""
    import torch

    import ditron
    from ..kernels import attention as A
    W, r, dev = world.world_size, world.rank, world.device
    HQ, HKV = (int(h) for h in args.heads.split("/"))
    D, B = args.head_dim, args.batch
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if seq % (2 * W):
        raise SystemExit(f"--seq {seq} must be a multiple of 2 x world size")
    S = seq // W
    layout = "zigzag" if causal else "contiguous"
    g = torch.Generator(device=dev).manual_seed(seq + 7 * int(causal) + 1000 * r)
    # this rank's rows in ditron's layout (fresh random inputs, drawn on the device)
    q = torch.randn(B, HQ, S, D, generator=g, device=dev).to(dtype)
    k = torch.randn(B, HKV, S, D, generator=g, device=dev).to(dtype)
    v = torch.randn(B, HKV, S, D, generator=g, device=dev).to(dtype)
    ctx = A.create_ring_attention_context(B, S, HKV, D, dtype)
    cuda = str(dev).startswith("cuda")
    # reference: SDPA (flash backend on GPUs: a known-good kernel; math on the simulator) on the gathered tensors
    kf, vf, qf = _gather(k, world), _gather(v, world), _gather(q, world)
    whole = [A.unshard(list(x.split(S, 2)), layout) for x in (qf, kf, vf)]
    from torch.nn.attention import SDPBackend
    ref_full = _sdpa(*whole, causal, SDPBackend.FLASH_ATTENTION if cuda else SDPBackend.MATH)
    ref = A.shard(ref_full, r, W, layout)
    del qf, kf, vf, whole, ref_full
    tol = 3e-2 if dtype == torch.bfloat16 else 6e-3

    def check(out):
        err = (out.float() - ref.float()).abs().max().item()
        if not err <= tol:
            raise AssertionError(f"max abs error {err:.3g} > {tol} against SDPA")

    impls = []
    choice = A.resolve_core(q, k, causal, W)
    default = A.default_config(dev, seq, causal, W) if choice.core == "tl" else None
    for cfg in configs:
        if cfg is not None and cfg == default:
            continue            # the "ditron" row (config None) is this config at this length
        name = "ditron" if cfg is None else f"ditron[{cfg.short()}]"
        impls.append(Impl(name, lambda cfg=cfg: A.ring_attention(q, k, v, ctx, causal=causal, layout=layout,
                                                                 config=cfg), check,
                          note=_config_label(A, q, k, causal, W, cfg)))
    backends = [("sdpa_cudnn", "CUDNN_ATTENTION"), ("sdpa_flash", "FLASH_ATTENTION")] if cuda else \
        [("sdpa_math", "MATH")]
    if W == 1:
        for name, be in backends:
            impls.append(Impl(name, lambda be=be: _sdpa(q, k, v, causal, getattr(SDPBackend, be)), check))
    else:
        # torch baseline: contiguous shards (rank r's rows r*S..), NCCL all_gather of K / V, SDPA of the local rows
        qc, kc, vc = (A.shard(A.unshard(list(_gather(x, world).split(S, 2)), layout), r, W, "contiguous")
                      for x in (q, k, v))
        ref_c = A.shard(_sdpa(*(A.unshard(list(_gather(x, world).split(S, 2)), "contiguous")
                                for x in (qc, kc, vc)), causal), r, W, "contiguous")

        def check_c(out):
            err = (out.float() - ref_c.float()).abs().max().item()
            if not err <= tol:
                raise AssertionError(f"max abs error {err:.3g} > {tol}")

        def ag_sdpa(be):
            kk, vv = _gather(kc, world), _gather(vc, world)
            if causal:
                kk, vv = kk[:, :, :(r + 1) * S], vv[:, :, :(r + 1) * S]
            return _sdpa(qc, kk, vv, causal, getattr(SDPBackend, be), lower_right=True)

        for name, be in backends:
            impls.append(Impl(f"nccl_ag+{name}", lambda be=be: ag_sdpa(be), check_c))
        impls.append(Impl("nccl_all_gather_kv", lambda: (_gather(kc, world), _gather(vc, world))[0]))
    graph = cuda and W == 1 and args.graph != "off" or args.graph == "on"
    res = measure(impls, dev, warmup=args.warmup, iters=args.iters, graph=graph, barrier=ditron.barrier_all,
                  repeat=args.repeat, agree=agree)
    flops = 4.0 * B * HQ * seq * seq * D * (0.5 if causal else 1.0)
    rows = []
    for impl in impls:
        rr = res[impl.name]
        us = rr["us"] if rr["ok"] else float("nan")
        rows.append({"seq": seq, "causal": causal, "impl": impl.name, "note": impl.note, "ok": rr["ok"],
                     "error": rr["error"], "us": us, "tflops": flops / us / 1e6 if rr["ok"] else float("nan")})
    for row in rows:
        base = next((x for x in rows if x["impl"].endswith("sdpa_cudnn") and x["ok"]), None)
        row["vs_cudnn"] = base["us"] / row["us"] if base and row["ok"] else float("nan")
    ctx = None             # the buffers go before the next case (the lambdas above hold the name)
    return rows


def _table(rows):
    lines = ["| seq | causal | impl | config | us | TFLOP/s | x cuDNN | check |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ok = "ok" if r["ok"] else f"FAILED: {r['error'][:120]}"
        lines.append(f"| {r['seq']} | {r['causal']} | {r['impl']} | {r['note']} | {r['us']:.0f} | {r['tflops']:.0f} | "
                     f"{r['vs_cudnn']:.2f} | {ok} |")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    op = argv[0] if argv and argv[0] in ("ring_attn", "flash_decode", "ulysses") else "ring_attn"
    if argv and argv[0] == op:
        argv = argv[1:]
    if op != "ring_attn":
        raise SystemExit(f"ditron bench {op} is run by its own module (ditron bench dispatches it)")
    p = argparse.ArgumentParser(prog="ditron bench ring_attn", description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", default="8192,16384,32768", help="whole sequence lengths (comma list)")
    p.add_argument("--causal", choices=["both", "on", "off"], default="both")
    p.add_argument("--heads", default="32/8", help="query / KV heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--configs", choices=["default", "all", "levers"], default="default",
                   help="all: time every config of kernels.attention.TUNE_CONFIGS; levers: the default and "
                        "LEVER_CONFIGS (persistent grid, two programs per SM)")
    p.add_argument("--no-small-checks", action="store_true", help="skip the correctness pass at odd shapes")
    p.add_argument("--graph", choices=["auto", "on", "off"], default="auto",
                   help="time CUDA-graph replays (auto: at world size 1 on GPUs, as `ditron bench flash_decode`; "
                        "off: eager calls, the host's launch time included)")
    add_run_args(p)
    args = p.parse_args(argv)

    import ditron
    from ..kernels import attention as A
    from .harness import _release, agree_fn
    world = ditron.init()
    sim = world.backend == "sim"
    more = {"all": A.TUNE_CONFIGS, "levers": A.LEVER_CONFIGS, "default": ()}[args.configs]
    # None first: the default config for each length (kernels.attention.default_config); then both GPU
    # defaults explicitly (each row skipped where it is the default) and the swept configs
    configs = [None] if sim else [None] + list(dict.fromkeys((A.GPU_CONFIG, A.GPU_SHORT_CONFIG, A.HOPPER_CONFIG)
                                                                + tuple(more)))
    if sim and args.configs == "levers":
        configs.append(dataclasses.replace(A.SIM_CONFIG, persistent=True))
    agree = agree_fn(world)
    fails = [] if args.no_small_checks else small_checks(world, configs, args)
    if fails:
        print(f"[rank {world.rank}] correctness FAILED at small shapes:\n  " + "\n  ".join(fails), flush=True)
    elif world.rank == 0 and not args.no_small_checks:
        print(f"correctness: {len(configs)} config(s), causal and not, at shapes that are not tile multiples "
              f"(bf16 and fp16 for the default) match fp32 SDPA on {world.world_size} rank(s)", flush=True)
    rows = []
    causals = {"both": (False, True), "on": (True,), "off": (False,)}[args.causal]
    for seq in (int(s) for s in args.seq.split(",") if s):
        for causal in causals:
            with ditron.heap_scope():
                rows += ring_case(world, seq, causal, configs, args, agree)
            _release(world.device)
    if world.rank == 0:
        command = "ditron bench ring_attn " + " ".join(argv)
        meta = result_meta("ring_attn", args.dtype, world.world_size, world.device, args.machine, command)
        md = [f"### Ring attention forward, {args.heads} heads, head dim {args.head_dim}, batch {args.batch}, "
              f"{args.dtype}, {world.world_size} rank(s) ({args.machine}, {meta['date']})", "",
              f"Command: `{command}`", "",
              "Checked first: " + ("skipped" if args.no_small_checks else
                                   ("FAILED: " + "; ".join(fails)) if fails else "every config matches fp32 SDPA "
                                   "at shapes that are not tile multiples (causal and not; bf16 and fp16 for the "
                                   "default)") + ". "
              "Each row checked against SDPA (flash backend) on fresh random inputs before timing. Timed as "
              + ("CUDA-graph replays (every row alike; host launch time excluded)."
                 if (args.graph == "on" or args.graph == "auto" and world.world_size == 1 and not sim)
                 else "eager calls (host launch time included)."), "",
              _table(rows), "", "```", *summary(rows), "```", ""]
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{args.tag or args.machine.replace(' ', '_')}-ring_attn-w{world.world_size}")
        with open(stem + ".md", "w") as f:
            f.write("\n".join(md))
        with open(stem + ".json", "w") as f:
            json.dump({"meta": meta, "small_check_failures": fails, "rows": rows}, f, indent=1, default=str)
        print("\n".join(md))
        print(f"wrote {stem}.md, {stem}.json")
    bad = fails or [r for r in rows if not r["ok"] and r["impl"] == "ditron"]
    ditron.finalize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
