"""``ditron demo``: run a zoo kernel on several ranks and check it against torch.

Without a GPU job it starts 4 simulated ranks (``ditron sim``); under
``torchrun --nproc-per-node N -m ditron.demo`` (or ``ditron demo`` inside a
torchrun job) it runs on the GPUs.  The kernel is the ring exchange of
``ditron.kernels.porting_example``: every rank signals its left neighbour
that its block is ready, then pulls its right neighbour's block through
``dl.symm_at`` after ``dl.wait`` -- at a size that is not a multiple of the
tile.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def run_on_this_rank(n: int, block: int) -> float:
    import torch
    import triton

    import ditron
    from ditron.kernels.porting_example import ready_kernel, ring_pull_kernel

    world = ditron.init()
    dev = world.device
    g = torch.Generator().manual_seed(1234 + world.rank)
    x = ditron.symm_empty((n,), torch.float16, name="x")
    x.copy_(torch.randn(n, generator=g).half().to(dev))
    sig = ditron.symm_zeros((world.world_size,), torch.int32, name="ready")
    out = torch.empty(n, dtype=torch.float16, device=dev)
    ditron.barrier_all()
    ready_kernel[(1,)](sig)
    ring_pull_kernel[(triton.cdiv(n, block),)](x, out, sig, n, BLOCK=block)
    ditron.barrier_all()
    right = (world.rank + 1) % world.world_size
    ref = torch.randn(n, generator=torch.Generator().manual_seed(1234 + right)).half()
    err = (out.float().cpu() - ref.float()).abs().max().item()
    ok = torch.equal(out.cpu(), ref)
    print(f"[rank {world.rank}/{world.world_size} on {world.backend}] pulled {n} fp16 values from rank {right}: "
          f"{'matches torch' if ok else 'MISMATCH'} (max abs error {err:g})", flush=True)
    ditron.finalize()
    if not ok:
        raise SystemExit(1)
    return err


#: the other demos: name -> (module, one line); the help text is derived from this
DEMOS = {
    "megakernel": ("ditron.demo_megakernel", "a tensor-parallel decoder step as one persistent kernel"),
    "moe": ("ditron.demo_moe", "expert parallelism: EP dispatch -> expert MLP -> combine"),
    "attention": ("ditron.demo_attention", "a causal ring-attention step on 4 simulated ranks"),
    "generate": ("ditron.demo_generate", "a Hugging Face Qwen3 / Llama model through the decode megakernel"),
}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DEMOS:
        import importlib
        return importlib.import_module(DEMOS[argv[0]][0]).main(argv[1:])
    epilog = "other demos (ditron demo NAME --help for their options):\n" + \
        "\n".join(f"  {name:<12} {text}" for name, (_, text) in DEMOS.items())
    p = argparse.ArgumentParser(prog="ditron demo", description=__doc__.split("\n\n")[0], epilog=epilog,
                                usage=f"ditron demo [{'|'.join(DEMOS)}] [options]",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--ranks", type=int, default=4, help="simulated ranks (default 4)")
    p.add_argument("--size", type=int, default=3000, help="elements per rank (default 3000, not a tile multiple)")
    p.add_argument("--block", type=int, default=1024)
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inside or os.environ.get("WORLD_SIZE"):
        run_on_this_rank(args.size, args.block)
        return 0
    from .sim.launcher import run_job
    print(f"ditron demo: ring exchange on {args.ranks} simulated ranks (CPU, Triton interpreter); "
          f"{args.size} elements per rank, tile {args.block}", flush=True)
    t = time.monotonic()
    code = run_job(args.ranks, ["-m", "ditron.demo", "--inside", "--size", str(args.size), "--block",
                                str(args.block)])
    if code == 0:
        print(f"ditron demo: verified on all {args.ranks} ranks against torch in {time.monotonic() - t:.1f} s")
    else:
        print(f"ditron demo: FAILED (exit code {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
