"""``ditron demo megakernel``: a Qwen3-like tensor-parallel decoder step
(RMSNorm, QKV, q/k norm + RoPE + KV append, flash-decoding attention, o_proj
+ all-reduce, gate/up + SiLU-mul, down + all-reduce, N layers, final norm) as
one persistent megakernel built from registered tasks (``ditron.task``),
checked against the same model in plain torch.

Without a GPU job it starts 2 simulated ranks (``ditron sim``) with the tiny
config (2 layers, hidden 64); under ``torchrun --nproc-per-node N -m
ditron.demo_megakernel`` it runs on the GPUs with Qwen3-8B's shapes (36
layers, random weights) and a torch reference over NCCL.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def run_on_this_rank(config, layers, batch, ctx, steps, scheduler, programs, show_source):
    import ditron
    from ditron.kernels.decoder import qwen3_8b, tiny
    from ditron.kernels.decoder import run as R

    world = ditron.init()
    cfg = {"tiny": tiny, "8b": qwen3_8b}[config]()
    if layers:
        cfg = cfg.with_(n_layers=layers)
    s = R.setup(cfg, world, batch, ctx, max_ctx=ctx + max(steps, 1) + 7)
    t = time.monotonic()
    dm = R.megakernel(s, scheduler=scheduler, num_programs=programs)
    if show_source and world.rank == 0:
        print(dm.source, flush=True)
    ref = R.reference(s)
    g, mk = dm.graph, dm.mk
    ok_all = True
    for step in range(steps):
        ok, err, scale = R.check_step(dm, ref, cfg, batch, step, world.device)
        ok_all &= ok
        print(f"[rank {world.rank}/{world.world_size} on {world.backend}] step {step + 1} (seq {ctx + step} -> "
              f"{ctx + step + 1}): {'matches torch' if ok else 'MISMATCH'} (max abs error {err:.3g}, scale "
              f"{scale:.3g}, tolerance {R.REL:g} * scale + {R.ABS:g})", flush=True)
    if world.rank == 0:
        print(f"megakernel '{g.name}': {len(g.tasks)} tasks, {g.num_slots} tiles, {len(mk.code.branches)} branches, "
              f"{mk.num_programs} programs, scheduler {scheduler}; {cfg.n_layers} layers, hidden {cfg.hidden}, "
              f"TP={world.world_size}, batch {batch}, context {ctx} ({time.monotonic() - t:.1f} s)", flush=True)
    ditron.finalize()
    if not ok_all:
        raise SystemExit(1)


def main(argv=None):
    p = argparse.ArgumentParser(prog="ditron demo megakernel", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--ranks", type=int, default=2, help="simulated ranks (default 2)")
    p.add_argument("--config", choices=["tiny", "8b"], default=None,
                   help="model shapes (default: tiny on the simulator, 8b on GPUs)")
    p.add_argument("--layers", type=int, default=0, help="override the number of layers")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", type=int, default=None, help="KV positions before the first step (default 33 / 512)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--scheduler", default="round_robin", choices=["round_robin", "zigzag", "dynamic"])
    p.add_argument("--programs", type=int, default=None,
                   help="persistent programs (default: 4 on the simulator, the SM count on GPUs)")
    p.add_argument("--source", action="store_true", help="print the generated kernel")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    on_gpus = bool(os.environ.get("WORLD_SIZE")) and not args.inside
    config = args.config or ("8b" if on_gpus else "tiny")
    ctx = args.ctx or (512 if config == "8b" else 33)
    if args.inside or os.environ.get("WORLD_SIZE"):
        run_on_this_rank(config, args.layers, args.batch, ctx, args.steps, args.scheduler, args.programs,
                         args.source)
        return 0
    from .sim.launcher import run_job
    print(f"ditron demo megakernel: a Qwen3-like TP decoder step ({config} config) as one persistent kernel on "
          f"{args.ranks} simulated ranks (CPU, Triton interpreter); batch {args.batch}, context {ctx}, "
          f"{args.steps} steps", flush=True)
    t = time.monotonic()
    cmd = ["-m", "ditron.demo_megakernel", "--inside", "--config", config, "--layers", str(args.layers), "--batch",
           str(args.batch), "--ctx", str(ctx), "--steps", str(args.steps), "--scheduler", args.scheduler]
    if args.programs:
        cmd += ["--programs", str(args.programs)]
    if args.source:
        cmd.append("--source")
    code = run_job(args.ranks, cmd)
    if code == 0:
        print(f"ditron demo megakernel: verified on all {args.ranks} ranks against torch in "
              f"{time.monotonic() - t:.1f} s")
    else:
        print(f"ditron demo megakernel: FAILED (exit code {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
