"""``ditron demo attention``: one ring-attention step (causal, zig-zag
sharded sequence, GQA) checked on every rank against torch's
``scaled_dot_product_attention`` on the whole sequence.

Without a GPU job it starts 4 simulated ranks (``ditron sim``); under
``torchrun --nproc-per-node N -m ditron.demo_attention`` it runs on the GPUs.
Every rank holds two chunks of ``--chunk`` rows of Q, K and V (chunks ``r``
and ``2W-1-r`` of the sequence); the K/V of the other ranks reach it through
``dl.symm_at`` loads after waits on their signals.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def run_on_this_rank(chunk, heads, kv_heads, head_dim, dtype_name):
    import torch

    import ditron
    from ditron.kernels.attention import create_ring_attention_context, ring_attention, shard

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    world = ditron.init()
    W, r, dev = world.world_size, world.rank, world.device
    n = 2 * chunk * W
    g = torch.Generator().manual_seed(2024)
    q = torch.randn(1, heads, n, head_dim, generator=g).to(dtype)
    k = torch.randn(1, kv_heads, n, head_dim, generator=g).to(dtype)
    v = torch.randn(1, kv_heads, n, head_dim, generator=g).to(dtype)
    ctx = create_ring_attention_context(1, 2 * chunk, kv_heads, head_dim, dtype)
    out = ring_attention(*(shard(t, r, W, "zigzag").to(dev) for t in (q, k, v)), ctx, causal=True)
    ditron.barrier_all()
    G = heads // kv_heads
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(G, 1),
                                                           v.float().repeat_interleave(G, 1), is_causal=True)
    err = (out.float().cpu() - shard(ref, r, W, "zigzag")).abs().max().item()
    ok = err <= (2.5e-2 if dtype == torch.bfloat16 else 5e-3)
    print(f"[rank {r}/{W} on {world.backend}] causal ring attention over {n} positions (chunks {r} and "
          f"{2 * W - 1 - r} of {chunk} rows, {heads}/{kv_heads} heads): {'matches torch' if ok else 'MISMATCH'} "
          f"(max abs error {err:.3g})", flush=True)
    ditron.finalize()
    if not ok:
        raise SystemExit(1)


def main(argv=None):
    p = argparse.ArgumentParser(prog="ditron demo attention", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--ranks", type=int, default=4, help="simulated ranks (default 4)")
    p.add_argument("--chunk", type=int, default=11, help="rows per chunk (each rank holds 2; not a tile multiple)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    conf = ["--chunk", str(args.chunk), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
            "--head-dim", str(args.head_dim), "--dtype", args.dtype]
    if args.inside or os.environ.get("WORLD_SIZE"):
        run_on_this_rank(args.chunk, args.heads, args.kv_heads, args.head_dim, args.dtype)
        return 0
    from .sim.launcher import run_job
    print(f"ditron demo attention: causal ring attention (zig-zag sharding, GQA {args.heads}/{args.kv_heads} heads) "
          f"on {args.ranks} simulated ranks (CPU, Triton interpreter); {2 * args.chunk} rows per rank", flush=True)
    t = time.monotonic()
    code = run_job(args.ranks, ["-m", "ditron.demo_attention", "--inside"] + conf)
    if code == 0:
        print(f"ditron demo attention: verified on all {args.ranks} ranks against torch in "
              f"{time.monotonic() - t:.1f} s")
    else:
        print(f"ditron demo attention: FAILED (exit code {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
