"""``ditron demo moe``: one expert-parallel MoE layer round -- EP dispatch,
each rank's expert MLP on the grouped GEMM, EP combine -- checked on every
rank against a plain torch MoE layer.

Without a GPU job it starts 4 simulated ranks (``ditron sim``); under
``torchrun --nproc-per-node N -m ditron.demo_moe`` it runs on the GPUs.
Every rank has ``--tokens`` tokens routed to ``--topk`` of ``--experts``
experts (uneven: some experts get no token); each expert is
``silu(x @ w1[e]) @ w2[e]``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _inputs(rank, T, H, I, E, k, dtype):
    import torch
    g = torch.Generator().manual_seed(4242 + rank)
    x = (torch.randn(T, H, generator=g) * 0.5).to(dtype)
    logits = torch.randn(T, E, generator=g)
    logits[:, E // 2:] -= 2.0                                   # uneven routing: the last experts are rarely chosen
    w, idx = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    return x, idx, w


def _weights(H, I, E, dtype):
    import torch
    g = torch.Generator().manual_seed(77)
    return ((torch.randn(E, H, I, generator=g) / H ** 0.5).to(dtype),
            (torch.randn(E, I, H, generator=g) / I ** 0.5).to(dtype))


def run_on_this_rank(T, H, I, E, k, dtype_name, mode):
    import torch

    import ditron
    from ditron.kernels.ep import create_ep_context, ep_combine, ep_dispatch
    from ditron.kernels.moe import grouped_gemm

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    world = ditron.init()
    W, dev = world.world_size, world.device
    El = E // W
    w1, w2 = _weights(H, I, E, dtype)
    w1_local = w1[world.rank * El:(world.rank + 1) * El].to(dev)
    w2_local = w2[world.rank * El:(world.rank + 1) * El].to(dev)
    x, idx, w = _inputs(world.rank, T, H, I, E, k, dtype)
    ctx = create_ep_context(T, H, E, k, dtype, mode=mode)
    recv_x, recv_counts, handle = ep_dispatch(x.to(dev), idx.to(dev), w.to(dev), ctx)
    if mode == "normal":
        h = torch.nn.functional.silu(grouped_gemm(recv_x, w1_local, recv_counts).float()).to(dtype)
        y = grouped_gemm(h, w2_local, recv_counts)
    else:   # [E_local, W * capacity, H]: each expert's rows are a plain GEMM
        y = torch.empty_like(recv_x)
        for l in range(El):
            y[l] = (torch.nn.functional.silu((recv_x[l].float() @ w1_local[l].float()).to(dtype).float())
                    .to(dtype).float() @ w2_local[l].float()).to(dtype)
    out = ep_combine(y, handle, ctx)
    ditron.barrier_all()
    ref = torch.zeros(T, H)
    for j in range(k):
        for e in range(E):
            m = idx[:, j] == e
            if m.any():
                hh = torch.nn.functional.silu((x[m].float() @ w1[e].float()).to(dtype).float()).to(dtype)
                ref[m] += w[m, j][:, None] * (hh.float() @ w2[e].float()).to(dtype).float()
    err = (out.float().cpu() - ref).abs().max().item()
    scale = ref.abs().max().item()
    ok = err <= 2e-2 * scale + 1e-2
    got = recv_counts.cpu().tolist()
    print(f"[rank {world.rank}/{W} on {world.backend}] {mode} EP: experts {world.rank * El}..{(world.rank + 1) * El - 1}"
          f" received {got} rows; combined {T} tokens: {'matches torch' if ok else 'MISMATCH'} "
          f"(max abs error {err:.3g}, scale {scale:.3g})", flush=True)
    ditron.finalize()
    if not ok:
        raise SystemExit(1)


def main(argv=None):
    p = argparse.ArgumentParser(prog="ditron demo moe", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--ranks", type=int, default=4, help="simulated ranks (default 4)")
    p.add_argument("--tokens", type=int, default=6, help="tokens per rank (default 6)")
    p.add_argument("--hidden", type=int, default=40)
    p.add_argument("--intermediate", type=int, default=24)
    p.add_argument("--experts", type=int, default=8, help="experts in all (a multiple of the ranks)")
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--mode", default="normal", choices=["normal", "low_latency"])
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    conf = [str(v) for v in (args.tokens, args.hidden, args.intermediate, args.experts, args.topk)]
    if args.inside or os.environ.get("WORLD_SIZE"):
        run_on_this_rank(args.tokens, args.hidden, args.intermediate, args.experts, args.topk, args.dtype, args.mode)
        return 0
    from .sim.launcher import run_job
    print(f"ditron demo moe: EP dispatch -> expert MLP (grouped GEMM) -> combine on {args.ranks} simulated ranks "
          f"(CPU, Triton interpreter); {args.tokens} tokens per rank, hidden {args.hidden}, {args.experts} experts, "
          f"top-{args.topk}, {args.mode} mode", flush=True)
    t = time.monotonic()
    code = run_job(args.ranks, ["-m", "ditron.demo_moe", "--inside", "--tokens", conf[0], "--hidden", conf[1],
                                "--intermediate", conf[2], "--experts", conf[3], "--topk", conf[4], "--dtype",
                                args.dtype, "--mode", args.mode])
    if code == 0:
        print(f"ditron demo moe: verified on all {args.ranks} ranks against torch in {time.monotonic() - t:.1f} s")
    else:
        print(f"ditron demo moe: FAILED (exit code {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
