"""Where the time of low-latency EP dispatch + combine goes (GPU only).

    torchrun --standalone --nproc-per-node 2 bench/ep_ll_probe.py [--tokens 128] [--programs 64,132]

Captures dispatch + combine (identity experts) in a CUDA graph, checks the result against torch, times graph
replays (median of CUDA events, ranks barriered before each replay), then profiles 20 replays and prints the
device time of every kernel in the graph (rank 0).  A diagnosis tool: the benchmark of record is
``ditron bench ep``.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist

import ditron
from ditron.kernels import ep


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts-per-rank", type=int, default=8)
    p.add_argument("--programs", default="64", help="max_programs values to try, comma-separated")
    a = p.parse_args()
    world = ditron.init()
    W, me, dev = world.world_size, world.rank, world.device
    E = a.experts_per_rank * W
    g = torch.Generator(device=dev).manual_seed(1 + me)
    x = torch.randn((a.tokens, a.hidden), generator=g, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=g, device=dev)[:a.topk] for _ in range(a.tokens)])
    w = torch.rand((a.tokens, a.topk), generator=g, device=dev)
    ref = (x.float() * w.sum(1, keepdim=True)).to(torch.bfloat16)
    for P in [int(v) for v in a.programs.split(",")]:
        ctx = ep.create_ep_context(a.tokens, a.hidden, E, a.topk, torch.bfloat16, mode="low_latency",
                                   capacity=a.tokens, max_programs=P)

        def step():
            recv_x, _, h = ep.ep_dispatch(x, idx, w, ctx, validate=False)
            return ep.ep_combine(recv_x, h, ctx)
        out = step()
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
            torch.cuda.synchronize()
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                out = step()
        torch.cuda.current_stream().wait_stream(s)
        ts = []
        for _ in range(50):
            dist.barrier()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            gr.replay()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3)
        err2 = (out.float() - ref.float()).abs().max().item()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                dist.barrier()
                gr.replay()
            torch.cuda.synchronize()
        if me == 0:
            print(f"\n== tokens {a.tokens} hidden {a.hidden} top-{a.topk} W={W} max_programs={P}: "
                  f"max err {err:.3g} / after replays {err2:.3g}; graph replay median {statistics.median(ts):.1f} us "
                  f"(min {min(ts):.1f})", flush=True)
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
    dist.barrier()
    ditron.finalize()


if __name__ == "__main__":
    main()
