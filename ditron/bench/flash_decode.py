"""``ditron bench flash_decode``: distributed flash-decoding
(kernels/flash_decode.py) against torch SDPA and the copy bandwidth, in the same run.

    torchrun --standalone --nproc-per-node 1 -m ditron.bench flash_decode --ctx 32768,65536 --batch 1,16,64
    ditron sim -n 2 -m ditron.bench flash_decode --ctx 64 --batch 2 --heads 4/2 --head-dim 16 --iters 1 --warmup 1

Per (context, batch): every sequence has ``ctx`` keys in all (``ctx / W`` on
each rank), ``--heads`` query / KV heads of ``--head-dim``.  Checked first on
the benchmark's inputs against SDPA on the gathered cache, then timed side by
side with the harness (CUDA-graph replays on GPUs):

* ``ditron``: :func:`flash_decode` (split kernel + combine; with W > 1 the
  partials travel by the LL protocol);
* ``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient``: SDPA of the single
  query against this rank's cache (W = 1), or at W > 1 NCCL ``all_gather`` of
  K and V then SDPA (``nccl_ag+sdpa_*``);
* ``KV GB/s``: K and V bytes read per rank / time, and the fraction of the
  device's copy bandwidth (a 1 GiB ``copy_``: read + write bytes / time,
  measured in the same run).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from .harness import Impl, add_run_args, measure, queued_us, result_meta


def case(world, ctx_len, batch, args, agree, bw):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import ditron
    import importlib
    FD = importlib.import_module("ditron.kernels.flash_decode")   # the module (ditron.kernels.flash_decode is the function)
    from .harness import gather_ranks as _gather
    W, r, dev = world.world_size, world.rank, world.device
    HQ, HKV = (int(h) for h in args.heads.split("/"))
    D = args.head_dim
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if ctx_len % W:
        raise SystemExit(f"--ctx {ctx_len} must be a multiple of the world size {W}")
    L = ctx_len // W
    gen = torch.Generator(device=dev).manual_seed(ctx_len + batch + 1000 * r)
    q = torch.randn(batch, HQ, D, generator=torch.Generator(device=dev).manual_seed(batch), device=dev).to(dtype)
    k = torch.randn(batch, HKV, L, D, generator=gen, device=dev).to(dtype)
    v = torch.randn(batch, HKV, L, D, generator=gen, device=dev).to(dtype)
    lens = torch.full((batch,), L, dtype=torch.int32, device=dev)
    ctx = FD.create_flash_decode_context(batch, HQ, HKV, D, dtype)
    cuda = str(dev).startswith("cuda")

    def sdpa(be, kk, vv):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q[:, :, None], kk, vv, enable_gqa=HQ != HKV)[:, :, 0]

    kg, vg = _gather(k, world), _gather(v, world)
    ref = sdpa(SDPBackend.FLASH_ATTENTION if cuda else SDPBackend.MATH, kg, vg)
    del kg, vg
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3

    def check(out):
        err = (out.float() - ref.float()).abs().max().item()
        if not err <= tol:
            raise AssertionError(f"max abs error {err:.3g} > {tol} against SDPA")

    impls = []
    variants = [(bn, ns) for bn in (int(b) for b in (args.block_n or "0").split(","))
                for ns in (int(x) for x in str(args.splits or "0").split(","))]
    for i, (bn, ns) in enumerate(variants):
        tag = ",".join(x for x in (f"block_n={bn}" if bn else "", f"splits={ns}" if ns else "") if x)
        impls.append(Impl("ditron" if i == 0 else f"ditron[{tag or 'default'}]",
                          lambda bn=bn, ns=ns: FD.flash_decode(q, k, v, lens, ctx, splits=ns or None,
                                                               block_n=bn or None), check))
    backends = [("sdpa_flash", "FLASH_ATTENTION"), ("sdpa_cudnn", "CUDNN_ATTENTION"),
                ("sdpa_efficient", "EFFICIENT_ATTENTION")] if cuda else [("sdpa_math", "MATH")]
    for name, be in backends:
        if W == 1:
            impls.append(Impl(name, lambda be=be: sdpa(getattr(SDPBackend, be), k, v), check))
        else:
            impls.append(Impl(f"nccl_ag+{name}", lambda be=be: sdpa(getattr(SDPBackend, be), _gather(k, world),
                                                                     _gather(v, world)), check))
    res = measure(impls, dev, warmup=args.warmup, iters=args.iters, graph=cuda and W == 1,
                  barrier=ditron.barrier_all, repeat=args.repeat, agree=agree)
    kv_bytes = 2 * batch * HKV * L * D * torch.empty((), dtype=dtype).element_size()
    rows = []
    for impl in impls:
        rr = res[impl.name]
        us = rr["us"] if rr["ok"] else float("nan")
        gbs = kv_bytes / (us * 1e-6) / 1e9 if rr["ok"] else float("nan")
        q_us = float("nan")
        if rr["ok"] and cuda and W == 1:
            try:
                q_us = queued_us(impl.run)
            except Exception:  # noqa: BLE001 -- the column stays empty (the per-call timing stands)
                q_us = float("nan")
        rows.append({"ctx": ctx_len, "batch": batch, "impl": impl.name, "ok": rr["ok"], "error": rr["error"],
                     "us": us, "kv_GBs": gbs, "of_copy_bw": gbs * 1e9 / bw, "note": rr.get("note", ""),
                     "queued_us": q_us, "of_copy_bw_queued": kv_bytes / (q_us * 1e-6) / bw})
    del ctx
    return rows


def main(argv):
    p = argparse.ArgumentParser(prog="ditron bench flash_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="32768,65536", help="keys per sequence over all ranks (comma list)")
    p.add_argument("--batch", default="1,16,64")
    p.add_argument("--heads", default="32/8", help="query / KV heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--splits", default="0", help="splits per (sequence, KV head) (comma list: each is timed, "
                                                "with each --block-n; 0: by size)")
    p.add_argument("--block-n", default="0", help="keys per tile of the split kernel (comma list: each is timed; "
                                                 "0: the default)")
    add_run_args(p, warmup=5, iters=20)
    args = p.parse_args(argv)

    import ditron
    from .harness import _release, agree_fn
    from .megakernel import copy_bandwidth
    world = ditron.init()
    bw = copy_bandwidth(world.device)
    agree = agree_fn(world)
    rows = []
    for c in (int(x) for x in args.ctx.split(",") if x):
        for b in (int(x) for x in args.batch.split(",") if x):
            with ditron.heap_scope():
                rows += case(world, c, b, args, agree, bw)
            _release(world.device)
    if world.rank == 0:
        command = "ditron bench flash_decode " + " ".join(argv)
        meta = result_meta("flash_decode", args.dtype, world.world_size, world.device, args.machine, command)
        meta["copy_bandwidth_GBs"] = bw / 1e9
        lines = ["| ctx | batch | impl | us | KV GB/s | of copy bw | us queued | of copy bw queued | check |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            ok = "ok" if r["ok"] else f"FAILED: {r['error'][:120]}"
            lines.append(f"| {r['ctx']} | {r['batch']} | {r['impl']} | {r['us']:.1f} | {r['kv_GBs']:.0f} | "
                         f"{r['of_copy_bw']:.2f} | {r['queued_us']:.1f} | {r['of_copy_bw_queued']:.2f} | {ok} |")
        md = [f"### Distributed flash-decoding, {args.heads} heads, head dim {args.head_dim}, {args.dtype}, "
              f"{world.world_size} rank(s) ({args.machine}, {meta['date']})", "", f"Command: `{command}`", "",
              f"Copy bandwidth (1 GiB copy_, read + write) {bw / 1e9:.0f} GB/s. KV GB/s: K and V bytes read per "
              "rank / time. Every row checked against SDPA on the gathered cache before timing. us: one CUDA-graph replay "
              "between events, synchronised after each (the host's graph-launch latency included); us queued: "
              "50 replays back to back between two events, per call (world size 1).", "",
              "\n".join(lines), ""]
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{args.tag or args.machine.replace(' ', '_')}-flash_decode-w{world.world_size}")
        with open(stem + ".md", "w") as f:
            f.write("\n".join(md))
        with open(stem + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
        print("\n".join(md))
        print(f"wrote {stem}.md, {stem}.json")
    bad = [r for r in rows if not r["ok"] and r["impl"].startswith("ditron")]
    ditron.finalize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
