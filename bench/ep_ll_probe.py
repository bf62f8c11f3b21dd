"""Where the time of low-latency EP dispatch + combine goes, and which tile configuration is fastest (GPU only).

    torchrun --standalone --nproc-per-node 1 bench/ep_ll_probe.py [--tokens 128] [--configs "rc=1024,cw=16;..."]
        [--out probe.md]

One LL context; for each configuration (overrides of the context's tuning attributes, see ``KEYS``) dispatch +
combine (identity experts) is checked against torch, then timed as CUDA-graph replays (median of CUDA events,
ranks barriered before each replay), the dispatch alone and the combine alone too, and 20 replays are profiled
for each kernel's device time.  A device copy of the dispatch + combine payload (the bench's ``device_copy``) is
timed in the same run.  A diagnosis tool: the benchmark of record is ``ditron bench ep``.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist

import ditron
from ditron.kernels import ep

#: configuration keys -> EpContext attributes
KEYS = {"rc": "reduce_cols", "rr": "reduce_rows", "cw": "combine_warps", "br": "ll_rows", "cc": "ll_copy_cols",
        "dw": "dispatch_warps", "st": "ll_strided"}
DEFAULT = ";".join(["default", "rr=8,cw=16", "rc=512,rr=8,cw=8", "rc=512,rr=4,cw=4", "rc=256,rr=8,cw=8",
                    "rc=2048,rr=2,cw=8", "cc=1024,dw=4", "cc=1024,dw=8", "cc=512,dw=4", "br=4", "st=1",
                    "st=1,cc=1024,dw=4", "st=1,br=4"])


def _graph(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return gr


def _time(gr, n=50):
    ts = []
    for _ in range(n):
        dist.barrier()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        gr.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(ts)


def _kernel_us(gr, n=20):
    """Mean device time per replay of each kernel (name -> us)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            gr.replay()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t:
            out[ev.key] = t / n
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts-per-rank", type=int, default=8)
    p.add_argument("--configs", default=DEFAULT, help="';'-separated configurations: 'default' or key=value,... "
                   f"(keys: {', '.join(f'{k}={v}' for k, v in KEYS.items())})")
    p.add_argument("--out", default=None, help="also write the table (Markdown) here")
    a = p.parse_args()
    world = ditron.init()
    W, me, dev = world.world_size, world.rank, world.device
    E = a.experts_per_rank * W
    g = torch.Generator(device=dev).manual_seed(1 + me)
    x = torch.randn((a.tokens, a.hidden), generator=g, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=g, device=dev)[:a.topk] for _ in range(a.tokens)])
    w = torch.rand((a.tokens, a.topk), generator=g, device=dev)
    ref = (x.float() * w.sum(1, keepdim=True)).to(torch.bfloat16)
    ctx = ep.create_ep_context(a.tokens, a.hidden, E, a.topk, torch.bfloat16, mode="low_latency",
                               capacity=a.tokens)
    base = {v: getattr(ctx, v) for v in KEYS.values()}
    n = 2 * a.tokens * a.topk * a.hidden
    csrc = torch.empty(n, dtype=torch.bfloat16, device=dev)
    cdst = torch.empty(n, dtype=torch.bfloat16, device=dev)
    cgr = _graph(lambda: cdst.copy_(csrc))
    copy_us = _time(cgr)
    copy_kernel_us = sum(_kernel_us(cgr).values())
    # the dispatch's copy pattern done by torch (graph replay): x[token of pair] into recv_x's rows, in natural pair
    # order (the LL dispatch's order: a token's k rows land in k experts' blocks) and grouped by expert (contiguous
    # destination rows, as the normal mode's receive)
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    cnt = torch.bincount(flat, minlength=E)
    slot = torch.empty_like(flat)
    slot[order] = torch.arange(flat.numel(), device=dev) - torch.repeat_interleave(torch.cumsum(cnt, 0) - cnt, cnt)
    drow = flat * a.tokens + slot                          # recv_x[e, slot] (capacity = tokens, one rank)
    tok = torch.arange(flat.numel(), device=dev) // a.topk
    rx = torch.empty((E * a.tokens, a.hidden), dtype=torch.bfloat16, device=dev)
    scatter_us = _time(_graph(lambda: rx.index_copy_(0, drow, x[tok])))
    tok_sorted, drow_sorted = tok[order], drow[order]
    grouped_us = _time(_graph(lambda: rx.index_copy_(0, drow_sorted, x[tok_sorted])))
    rows = []
    for cfg in [c.strip() for c in a.configs.split(";") if c.strip()]:
        for k, v in base.items():
            setattr(ctx, k, v)
        if cfg != "default":
            for kv in cfg.split(","):
                k, v = kv.split("=")
                setattr(ctx, KEYS[k.strip()], int(v))
        state = {}

        def step():
            recv_x, _, h = ep.ep_dispatch(x, idx, w, ctx, validate=False)
            state["recv_x"], state["h"] = recv_x, h
            return ep.ep_combine(recv_x, h, ctx)
        try:
            out = step()
            torch.cuda.synchronize()
            err = (out.float() - ref.float()).abs().max().item()
            gr = _graph(step)
            both = _time(gr)
            ks = _kernel_us(gr)
            disp = _time(_graph(lambda: ep.ep_dispatch(x, idx, w, ctx, validate=False)))
            comb = _time(_graph(lambda: ep.ep_combine(state["recv_x"], state["h"], ctx)))
            kd = sum(t for kname, t in ks.items() if "ll_dispatch" in kname)
            kc = sum(t for kname, t in ks.items() if "ll_combine" in kname)
            rows.append(f"| {cfg} | {both:.1f} | {disp:.1f} | {comb:.1f} | {kd:.1f} | {kc:.1f} | {err:.3g} |")
        except Exception as e:  # noqa: BLE001 -- a configuration that does not compile or run: say so, go on
            rows.append(f"| {cfg} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} | | | | | |")
        if me == 0:
            print(rows[-1], flush=True)
    if me == 0:
        text = "\n".join([
            f"### LL EP probe: {a.tokens} tokens, hidden {a.hidden}, top-{a.topk}, {a.experts_per_rank} experts/rank, "
            f"bf16, W={W} ({torch.cuda.get_device_name()})", "",
            f"Defaults: {', '.join(f'{k}={base[v]}' for k, v in KEYS.items())}; device copy of the dispatch + "
            f"combine payload ({n * 2 / 1e6:.1f} MB): {copy_us:.1f} us (graph replay, same run; its kernel "
            f"{copy_kernel_us:.1f} us by the profiler).  The dispatch's copy by torch (gather x, index_copy_ into "
            f"recv_x, graph replay): pairs in natural order {scatter_us:.1f} us, grouped by expert "
            f"{grouped_us:.1f} us.",
            "",
            "| config | dispatch + combine, graph (us) | dispatch alone (us) | combine alone (us) | "
            "dispatch kernel (profiler, us) | combine kernel (profiler, us) | max err |",
            "| --- | --- | --- | --- | --- | --- | --- |", *rows, ""])
        print(text, flush=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text + "\n")
    dist.barrier()
    ditron.finalize()


if __name__ == "__main__":
    main()
