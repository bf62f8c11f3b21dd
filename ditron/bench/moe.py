"""MoE benchmarks (``ditron bench grouped_gemm|ag_moe|moe_rs|moe_ar|ep``).

    torchrun --standalone --nproc-per-node 2 -m ditron.bench ag_moe --shapes paper --graph
    torchrun --standalone --nproc-per-node 2 -m ditron.bench moe_rs --shapes paper --graph
    torchrun --standalone --nproc-per-node 2 -m ditron.bench moe_ar --shapes paper --graph
    torchrun --standalone --nproc-per-node 1 -m ditron.bench grouped_gemm --shapes paper --tp 2
    torchrun --standalone --nproc-per-node 2 -m ditron.bench ep --tokens 128,4096 --mode normal,low_latency --graph
    ditron sim -n 2 -m ditron.bench ag_moe --shapes 16,32,32,4,2 --iters 5 --warmup 1   # CPU smoke run

Shapes (``--shapes paper``: ``moe_h800`` of shared/bench/paper-shapes.json;
or ``"T,H,I,E,k;..."``): ``T`` tokens in all, hidden ``H``, intermediate
``I``, ``E`` experts, top-``k``.  Tensor parallelism over the ``W`` ranks:
rank ``r`` holds ``T / W`` tokens (ag_moe, moe_rs) and the experts'
``I / W`` slice.  Routing: seeded random top-k (no expert repeated in a
token), the same on every run.

* ``ag_moe``: ditron ``ag_moe`` (``[W * m * k, I / W]``) vs ``nccl_grouped``:
  NCCL ``all_gather_into_tensor`` of the tokens, then the permutation by
  (segment, expert) and ``torch._grouped_mm`` (where this torch has it; else
  ``nccl_loop``: a per-expert loop of ``torch.matmul``, whose counts are
  read back each call);
* ``moe_rs``: ditron ``moe_rs`` vs grouped GEMM + top-k weighted combine
  (``index_add``) + NCCL ``reduce_scatter_tensor``;
* ``moe_ar``: ditron ``moe_ar`` vs the same with NCCL ``all_reduce``;
* ``grouped_gemm``: the grouped GEMM core alone at the per-rank shape of
  ag_moe (``--tp``) vs ``torch._grouped_mm`` and the loop;
* ``ep``: dispatch + identity experts + combine, per token count (``--tokens``
  per rank; hidden 7168, top-8, 8 experts per rank by default, from
  ``ep_dispatch_combine``), ditron normal and low-latency vs ``a2a_single``:
  the path inference engines use without DeepEP (sort by destination, count
  exchange and ``all_to_all_single`` with host splits, regroup by local
  expert; back the same way, weighted sum); ``copy_engine``: ``rank_copy``
  of the same bytes to one peer (the NVLink copy-engine ceiling).  Bus
  bandwidth: ``2 * (W-1)/W * T * k * H * bytes / time`` (dispatch and combine
  payloads).  Low-latency mode runs up to 1024 tokens per rank (its buffers
  hold ``E * capacity`` rows).  ``DITRON_HEAP_SIZE`` must hold the contexts
  (e.g. ``8G`` for 4096 tokens of 7168 at top-8).

Each implementation is checked first (against a float32 torch reference that
every rank computes from every rank's regenerated inputs; baselines too),
then timed like the other benchmarks (ditron/bench.py's ``measure``).
Reported: time per implementation and shape, the speedup over the baseline,
and the geomean over shapes.  Results: ``--out`` (Markdown + JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .harness import Impl, _release, agree_fn, geomean, measure, result_meta

OPS = ("grouped_gemm", "ag_moe", "moe_rs", "moe_ar", "ep")


def paper_shapes():
    """``moe_h800`` of shared/bench/paper-shapes.json (kept here: the file is outside the package)."""
    return [("Qwen1.5-MoE-A2.7B", 8192, 2048, 1408, 60, 4), ("Mixtral-8x7B", 8192, 14336, 4096, 8, 2),
            ("Mixtral-8x22B", 8192, 16384, 6144, 8, 2), ("DeepSeek-MoE", 8192, 1408, 2048, 64, 6)]


def parse_shapes(spec):
    if spec == "paper":
        return paper_shapes()
    out = []
    for item in spec.split(";"):
        if item.strip():
            T, H, I, E, k = (int(v) for v in item.split(","))
            out.append((f"T{T}_H{H}_I{I}_E{E}_k{k}", T, H, I, E, k))
    return out


def _rand(shape, seed, dtype, device, scale=1.0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


def _routing(T, E, k, seed, device):
    import torch
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(T, E, generator=g).topk(k, dim=1).indices
    w = torch.rand(T, k, generator=g) + 0.1
    return idx.to(device), w.to(device)


def grouped_mm_fn(device, dtype):
    """``fn(a, w, counts) -> a_grouped @ w[e]``: torch._grouped_mm where it
    works on this device (probed once), else None."""
    import torch
    if not hasattr(torch, "_grouped_mm") or not str(device).startswith("cuda"):
        return None
    try:
        a = torch.randn(32, 64, device=device, dtype=dtype)
        w = torch.randn(2, 64, 32, device=device, dtype=dtype)
        torch._grouped_mm(a, w, offs=torch.tensor([16, 32], dtype=torch.int32, device=device))
    except Exception:  # noqa: BLE001 -- not supported on this GPU / torch
        return None

    def fn(a, w, counts):
        return torch._grouped_mm(a, w, offs=torch.cumsum(counts, 0).to(torch.int32))
    return fn


def loop_mm(a, w, counts_host):
    """The per-expert loop of ``torch.matmul`` (counts known on the host)."""
    import torch
    out = torch.empty((a.shape[0], w.shape[2]), dtype=a.dtype, device=a.device)
    off = 0
    for e, c in enumerate(counts_host):
        if c:
            torch.matmul(a[off:off + c], w[e], out=out[off:off + c])
        off += c
    return out


def _check(ref, rel=2e-2):
    def check(out):
        err = (out.float() - ref).abs().max().item()
        scale = ref.abs().max().item() + 1e-6
        if not err <= rel * scale + 1e-2:
            raise AssertionError(f"max abs error {err:.3g} (scale {scale:.3g})")
    return check


def _seg_gemm(a, wr, plan, gmm, gather=True):
    """The plan's rows times their experts, in torch: ``gmm`` (grouped_mm) or
    the loop; ``wr``: the experts' weights repeated per segment (``[W * E, K,
    N]``); ``gather``: ``a`` holds the tokens (ag_moe), else the rows (moe_rs)."""
    rows = a[plan.perm // plan.k] if gather else a
    counts = plan.counts[:, :plan.num_experts].reshape(-1)
    if gmm is not None:
        return gmm(rows, wr, counts)
    return loop_mm(rows, wr, counts.tolist())


def _gluon_ok(world, dtype, hidden=8):
    """Whether the Gluon Hopper MoE GEMMs (``core="gluon"``) run here: fp16 / bf16 on a Hopper GPU, one node, at
    most 8 ranks, ``hidden`` a multiple of 8."""
    import torch

    from ..kernels import gemm_hopper
    return (world.backend != "sim" and dtype in (torch.float16, torch.bfloat16) and world.nnodes == 1
            and world.world_size <= 8 and hidden % 8 == 0 and gemm_hopper.supported(world.device))


def tp_impls(op, shape, world, dtype, gmm, seed=0):
    """Impls of ag_moe / moe_rs / moe_ar / grouped_gemm at ``shape`` on this rank."""
    import torch
    import torch.distributed as dist

    from ..kernels import moe_tp
    from ..kernels.moe import grouped_gemm
    _, T, H, I, E, k = shape
    W, me, dev = world.world_size, world.rank, world.device
    m, il = T // W, I // W
    xs = [_rand((m, H), seed + 11 * s, dtype, dev) for s in range(W)]
    routes = [_routing(m, E, k, seed + 13 * s, dev) for s in range(W)]
    x_all = torch.cat(xs)
    idx_all = torch.cat([r[0] for r in routes])
    w_all = torch.cat([r[1] for r in routes])
    plan = moe_tp.moe_plan(idx_all, W, me, E)
    nccl = dist.is_available() and dist.is_initialized()
    base_name = "nccl_grouped" if gmm is not None else "nccl_loop"
    impls = []
    if op in ("ag_moe", "grouped_gemm"):
        w1 = _rand((E, H, il), seed + 1 + me, dtype, dev, H ** -0.5)
        w1r = w1.repeat(W, 1, 1)
        ref = _seg_gemm(x_all.float(), w1r.float(), plan, None)
        if op == "grouped_gemm":
            tok = plan.perm // k
            rows = x_all[tok]
            counts = plan.counts[:, :E].reshape(-1)
            wr = w1r
            impls.append(Impl("ditron", lambda: grouped_gemm(rows, wr, counts), _check(ref)))
            if _gluon_ok(world, dtype):        # the warp-specialised Gluon Hopper core (kernels/moe_hopper.py)
                impls.append(Impl("ditron_gluon", lambda: grouped_gemm(rows, wr, counts, core="gluon"), _check(ref)))
            # the same kernel with pointer tiles (the config's TMA off), and with the permutation fused into the
            # A loads (gather_idx; pointer A tiles), as AG-MoE runs it
            import dataclasses

            from ..kernels.moe import moe_config
            ptr_cfg = dataclasses.replace(moe_config(rows.shape[0], wr.shape[2], H, dtype, dev), tma=False)
            impls.append(Impl("ditron_pointer", lambda: grouped_gemm(rows, wr, counts, config=ptr_cfg), _check(ref)))
            impls.append(Impl("ditron_gather", lambda: grouped_gemm(x_all, wr, counts, gather_idx=tok), _check(ref)))
            # gathered A rows go through pointer loads (cp.async; Hopper has no TMA gather): tiles with fewer
            # live registers per thread than the default 128 x 256 x 64 (accumulator + A row pointers)
            base_cfg = moe_config(tok.numel(), wr.shape[2], H, dtype, dev)
            # (sm_90a, ptxas: default 236 registers; n128 146; n128k128 154; k32 242; no spills; A by cp.async)
            variants = (("n128", dict(block_n=128, num_stages=4)), ("n128k128", dict(block_n=128, block_k=128,
                                                                                     num_stages=3)),
                        ("k32", dict(block_k=32, num_stages=5)))
            for tag, kw in variants if world.backend != "sim" else ():
                gcfg = dataclasses.replace(base_cfg, **kw)
                impls.append(Impl(f"ditron_gather_{tag}", lambda gcfg=gcfg: grouped_gemm(
                    x_all, wr, counts, gather_idx=tok, config=gcfg), _check(ref)))
            if gmm is not None:
                impls.append(Impl("torch_grouped_mm", lambda: gmm(rows, wr, counts), _check(ref)))
            ch = counts.tolist()
            impls.append(Impl("torch_loop", lambda: loop_mm(rows, wr, ch), _check(ref)))
            return impls, "torch_loop"
        ctx = moe_tp.create_ag_moe_context(m, H, E, k, dtype)
        x, idx = xs[me], routes[me][0]
        impls.append(Impl("ditron", lambda: moe_tp.ag_moe(x, idx, w1, ctx, validate=False)[0], _check(ref)))
        if nccl:
            buf = torch.empty_like(x_all)

            def base():
                dist.all_gather_into_tensor(buf, x)
                ids = torch.empty_like(idx_all)
                dist.all_gather_into_tensor(ids, idx)
                p = moe_tp.moe_plan(ids, W, me, E, validate=False)
                return _seg_gemm(buf, w1r, p, gmm)
            impls.append(Impl(base_name, base, _check(ref)))
        return impls, base_name
    # moe_rs / moe_ar: h of every rank regenerated for the reference
    hs = [_rand((plan.rows, il), seed + 17 * s, dtype, dev) for s in range(W)]
    w2s = [_rand((E, il, H), seed + 19 * s, dtype, dev, il ** -0.5) for s in range(W)]
    wpos = torch.where(plan.perm >= 0, w_all.reshape(-1)[plan.perm], 0.0)
    tok = plan.perm // k

    def combine(y):
        out = torch.zeros((W * m, H), dtype=torch.float32, device=dev)
        out.index_add_(0, tok, y.float() * wpos[:, None])
        return out
    full = sum(combine(_seg_gemm(h.float(), w2.repeat(W, 1, 1).float(), plan, None, False))
               for h, w2 in zip(hs, w2s))
    h, w2 = hs[me], w2s[me]
    w2r = w2.repeat(W, 1, 1)
    if op == "moe_rs":
        ctx = moe_tp.create_moe_rs_context(m, H, E, k, dtype)
        ref = full[me * m:(me + 1) * m]
        wme = w_all[me * m:(me + 1) * m]
        impls.append(Impl("ditron", lambda: moe_tp.moe_rs(h, plan, w2, wme, ctx), _check(ref)))
        if _gluon_ok(world, dtype, H):
            gctx = moe_tp.create_moe_rs_context(m, H, E, k, dtype, core="gluon")
            impls.append(Impl("ditron_gluon", lambda: moe_tp.moe_rs(h, plan, w2, wme, gctx), _check(ref)))
        if nccl:
            out = torch.empty((m, H), dtype=dtype, device=dev)

            def base():
                dist.reduce_scatter_tensor(out, combine(_seg_gemm(h, w2r, plan, gmm, False)).to(dtype))
                return out
            impls.append(Impl(base_name, base, _check(ref)))
    else:
        ctx = moe_tp.create_moe_ar_context(T, H, E, k, dtype)
        impls.append(Impl("ditron", lambda: moe_tp.moe_ar(h, plan, w2, w_all, ctx), _check(full)))
        if _gluon_ok(world, dtype, H):
            gctx = moe_tp.create_moe_ar_context(T, H, E, k, dtype, core="gluon")
            impls.append(Impl("ditron_gluon", lambda: moe_tp.moe_ar(h, plan, w2, w_all, gctx), _check(full)))
        if nccl:
            def base():
                y = combine(_seg_gemm(h, w2r, plan, gmm, False)).to(dtype)
                dist.all_reduce(y)
                return y
            impls.append(Impl(base_name, base, _check(full)))
    return impls, base_name


def ep_impls(tokens, world, dtype, H, k, experts_per_rank, modes, seed=0, traced=None, fp8=False):
    if fp8:
        from .ep_fp8 import ep_fp8_impls
        x = _rand((tokens, H), seed + 7 * world.rank, dtype, world.device)
        idx, w = _routing(tokens, experts_per_rank * world.world_size, k, seed + 5 * world.rank, world.device)
        return ep_fp8_impls(x, idx, w, world, experts_per_rank * world.world_size, traced=traced)
    import torch
    import torch.distributed as dist

    import ditron
    from ..kernels import ep
    W, me, dev = world.world_size, world.rank, world.device
    E = experts_per_rank * W
    x = _rand((tokens, H), seed + 7 * me, dtype, dev)
    idx, w = _routing(tokens, E, k, seed + 5 * me, dev)
    # identity experts: out[t] = sum_j w[t, j] * x[t]
    ref = x.float() * w.sum(1, keepdim=True)
    impls = []
    for mode in modes:
        if mode == "low_latency" and tokens > 1024:
            continue          # LL buffers hold E * capacity rows: decode sizes only
        ctx = ep.create_ep_context(tokens, H, E, k, dtype, mode=mode, capacity=tokens)

        def run(ctx=ctx):
            recv_x, _, handle = ep.ep_dispatch(x, idx, w, ctx, validate=False)
            return ep.ep_combine(recv_x, handle, ctx)
        impls.append(Impl(f"ditron {mode}", run, _check(ref)))
        if traced is not None:
            traced.append((mode, ctx, run))
    if dist.is_available() and dist.is_initialized():
        El = experts_per_rank

        def a2a():
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)
            send = torch.bincount(flat, minlength=E).view(W, El)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send)
            s_split, r_split = send.sum(1).tolist(), recv.sum(1).tolist()          # host sync, as engines do
            rx = torch.empty((sum(r_split), H), dtype=dtype, device=dev)
            dist.all_to_all_single(rx, x[order // k], r_split, s_split)
            # regroup by local expert (rows arrive by source, then expert), identity experts, back
            le = torch.repeat_interleave(torch.arange(El, device=dev).repeat(W), recv.reshape(-1))
            g = torch.argsort(le, stable=True)
            grouped = rx[g]                                   # the experts' input, grouped by local expert
            y = torch.empty_like(rx)
            y[g] = grouped                                    # identity experts; back to arrival order
            back = torch.empty((order.numel(), H), dtype=dtype, device=dev)
            dist.all_to_all_single(back, y, s_split, r_split)
            out = torch.zeros((tokens, H), dtype=torch.float32, device=dev)
            out.index_add_(0, order // k, back.float() * w.reshape(-1)[order][:, None])
            return out.to(dtype)
        impls.append(Impl("a2a_single", a2a, _check(ref)))
    if world.backend != "sim":
        # the memory floor at one GPU: a device copy of the dispatch + combine payload (2 * T * k rows)
        n = 2 * tokens * k * H
        csrc = torch.empty(n, dtype=dtype, device=dev)
        cdst = torch.empty(n, dtype=dtype, device=dev)
        impls.append(Impl("device_copy", lambda: cdst.copy_(csrc), None, "copy of the dispatch + combine payload"))
    if world.backend != "sim" and W > 1:
        # the NVLink copy-engine ceiling: the same payload (dispatch + combine) to the next rank, no SM
        n = 2 * tokens * k * H * (W - 1) // W
        box = ditron.symm_empty((n,), dtype, name="bench.ce")
        src = torch.empty(n, dtype=dtype, device=dev)
        nxt = (me + 1) % W
        impls.append(Impl("copy_engine", lambda: ditron.rank_copy(box, src, dst_rank=nxt), None,
                          "rank_copy of the same bytes to one peer"))
    return impls


def _write(op, rows, summary, args, world, command):
    os.makedirs(args.out, exist_ok=True)
    tag = args.tag or args.machine.replace(" ", "-")
    stem = os.path.join(args.out, f"{tag}-{op}-{args.dtype}")
    meta = result_meta(op, args.dtype, world.world_size, world.device, args.machine, command)
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows, "summary": summary}, f, indent=1, default=str)
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    by = {(r["shape"], r["impl"]): r for r in rows}
    extra = " bus GB/s (ditron) |" if op == "ep" else ""
    md = [f"### {op}, {args.dtype}, {world.world_size} ranks ({args.machine}, {meta['date']})", "",
          f"Command: `{command}`", "", "Time in us (speedup over the baseline):", "",
          "| shape | " + " | ".join(impls) + " |" + extra, "| --- |" + " --- |" * (len(impls) + bool(extra))]
    for s in shapes:
        cells = []
        for name in impls:
            r = by.get((s, name))
            if r is None or r["status"] != "ok":
                cells.append("n/a" if r is None else r["status"].upper())
            else:
                sp = f" ({r['speedup']:.2f}x)" if r.get("speedup") else ""
                cells.append(f"{r['us']:.1f}{sp}")
        bus = ""
        if extra:
            bw = [by[(s, n)].get("busbw_GBs") for n in impls if (s, n) in by and n.startswith("ditron")]
            bus = " " + (", ".join(f"{b:.1f}" for b in bw if b) or "-") + " |"
        md.append(f"| {s} | " + " | ".join(cells) + " |" + bus)
    geo = ", ".join(f"{n} {v:.2f}x" for n, v in summary["geomean_speedup"].items() if v)
    md += ["", "Geomean speedup over the baseline: " + (geo or "n/a"), ""]
    vs = summary.get("vs_torch_grouped_mm")
    if vs:
        md += ["Geomean vs torch_grouped_mm (its time / the impl's): " +
               ", ".join(f"{n} {v:.2f}x" for n, v in vs.items() if v), ""]
    if summary.get("notes"):
        md += ["Goals (issue 55):", ""] + [f"- {n}" for n in summary["notes"]] + [""]
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        md += ["Failures:", ""] + [f"- {r['shape']} {r['impl']}: {r['error']}" for r in failed] + [""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md))
    return stem + ".md", stem + ".json"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="ditron bench", description=__doc__.split("\n\n")[0])
    p.add_argument("op", choices=OPS)
    p.add_argument("--shapes", default="paper", help="'paper' (moe_h800) or 'T,H,I,E,k;...'")
    p.add_argument("--tp", type=int, default=None, help="grouped_gemm: the TP degree of the per-rank shape")
    p.add_argument("--tokens", default="128,4096", help="ep: tokens per rank, comma-separated")
    p.add_argument("--hidden", type=int, default=7168, help="ep: hidden size")
    p.add_argument("--topk", type=int, default=8, help="ep: k")
    p.add_argument("--experts-per-rank", type=int, default=8, help="ep: experts per rank")
    p.add_argument("--mode", default="normal,low_latency", help="ep: ditron modes")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"],
                   help="fp8 (ep): the low-latency fp8 payload (e4m3 + per-128 scales) vs bf16 vs a device copy")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=25)
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    p.add_argument("--trace", action="store_true", help="ep: the per-phase account (host work, kernel phases; "
                   "ditron/bench/ep_trace.py), written to <out>/<tag>-ep-trace-<dtype>.md")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--tag", default=None)
    p.add_argument("--machine", default=os.environ.get("DITRON_MACHINE", "unknown machine"))
    args = p.parse_args(argv)

    import torch

    import ditron
    if args.dtype == "fp8" and args.op != "ep":
        p.error("--dtype fp8 is for ep here (fp8 GEMMs: ditron bench gemm --dtype fp8)")
    world = ditron.init()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}[args.dtype]
    gmm = grouped_mm_fn(world.device, dtype)
    agree = agree_fn(world)
    rows = []
    trace_md = []
    fp8_notes = []
    if args.op == "ep":
        cases = [(f"{t} tok/rank", int(t)) for t in args.tokens.split(",") if t]
    else:
        cases = [(s[0], s) for s in parse_shapes(args.shapes)]
    for label, case in cases:
        with ditron.heap_scope():
            traced = [] if args.trace else None
            if args.op == "ep":
                impls, base = ep_impls(case, world, dtype, args.hidden, args.topk, args.experts_per_rank,
                                       [m for m in args.mode.split(",") if m], traced=traced,
                                       fp8=args.dtype == "fp8"), "a2a_single"
                if args.dtype == "fp8":
                    base = "ditron low_latency bf16"
            else:
                shape = case
                if args.op == "grouped_gemm" and args.tp:       # one GPU, ag_moe's per-rank GEMM at TP = --tp
                    shape = (case[0], case[1], case[2], case[3] // args.tp, case[4], case[5])
                impls, base = tp_impls(args.op, shape, world, dtype, gmm)
            res = measure(impls, world.device, warmup=args.warmup, iters=args.iters, graph=args.graph,
                          barrier=ditron.barrier_all, repeat=args.repeat, agree=agree)
            for impl in impls:
                r = res[impl.name]
                row = {"shape": label, "impl": impl.name, "us": r["us"], "status": "ok" if r["ok"] else "failed",
                       "error": r["error"], "note": r["note"]}
                if args.op == "ep" and r["ok"]:
                    nbytes = 2 * case * args.topk * args.hidden * torch.empty((), dtype=dtype).element_size()
                    if "fp8" in impl.name:
                        from .ep_fp8 import fp8_payload_bytes
                        nbytes = fp8_payload_bytes(case, args.hidden, args.topk)
                    row["busbw_GBs"] = nbytes * (world.world_size - 1) / max(world.world_size, 1) / (r["us"] * 1e3)
                rows.append(row)
            for mode, ctx, run in traced or ():
                from . import ep_trace
                host = ep_trace.host_account(run, world.device)
                phases = ep_trace.kernel_phases(ctx, run, world.device)
                trace_md += ep_trace.report(label, mode, host, phases)
                r, c = res.get(f"ditron {mode}"), res.get("device_copy")
                if r and c and r["ok"] and c["ok"]:
                    trace_md += [f"Graph-replay time {r['us']:.1f} us = {r['us'] / c['us']:.2f}x the device copy of "
                                 f"the same bytes ({c['us']:.1f} us).", ""]
            if args.op == "ep" and args.dtype == "fp8":
                from .ep_fp8 import goal_notes
                fp8_notes += goal_notes(res, label)
            base_us = res[base]["us"] if base in res and res[base]["ok"] else None
            for row in rows:
                if row["shape"] == label and row["status"] == "ok" and row["impl"] != base and base_us:
                    row["speedup"] = base_us / row["us"]
        _release(world.device)
    summary = {"geomean_speedup": {}, "notes": fp8_notes}
    for name in dict.fromkeys(r["impl"] for r in rows):
        summary["geomean_speedup"][name] = geomean([r.get("speedup") for r in rows if r["impl"] == name])
    gref = {r["shape"]: r["us"] for r in rows if r["impl"] == "torch_grouped_mm" and r["status"] == "ok"}
    if gref:
        summary["vs_torch_grouped_mm"] = {
            name: geomean([gref[r["shape"]] / r["us"] for r in rows
                           if r["impl"] == name and r["status"] == "ok" and r["shape"] in gref])
            for name in dict.fromkeys(r["impl"] for r in rows) if name != "torch_grouped_mm"}
    if world.rank == 0:
        command = "ditron bench " + " ".join(argv)
        paths = _write(args.op, rows, summary, args, world, command)
        print(open(paths[0]).read())
        if trace_md:
            tpath = os.path.join(args.out, f"{args.tag or args.machine.replace(' ', '-')}-ep-trace-{args.dtype}.md")
            text = "\n".join([f"### ep per-phase account, {args.dtype}, {world.world_size} ranks ({args.machine})", "",
                              f"Command: `{command}`", ""] + trace_md)
            with open(tpath, "w") as f:
                f.write(text)
            print(text)
            paths = paths + (tpath,)
        print("wrote " + ", ".join(paths))
    bad = [r for r in rows if r["status"] != "ok"]
    ditron.finalize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
