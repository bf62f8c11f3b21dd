"""Collective benchmarks (``ditron bench all_reduce|all_gather|reduce_scatter``).

    torchrun --nproc-per-node 4 -m ditron.bench all_reduce --sizes 8K..256M --dtype bf16
    ditron sim -n 4 -m ditron.bench all_reduce --sizes 1K..8K     # smoke run of the harness on CPU

For each size of the sweep, every implementation (ditron's methods, NCCL
through ``torch.distributed``, torch's symmetric-memory ops) is checked and
timed by the harness (:mod:`ditron.bench.harness`).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from .harness import Impl, parse_sizes, run_sweep, table, write_results


def _bus(op):
    return {"all_reduce": lambda n: 2 * (n - 1) / n if n > 1 else 1.0,
            "all_gather": lambda n: (n - 1) / n if n > 1 else 1.0,
            "reduce_scatter": lambda n: (n - 1) / n if n > 1 else 1.0,
            "all_to_all": lambda n: (n - 1) / n if n > 1 else 1.0}[op]


def _tol(dtype, world):
    import torch
    return {torch.float32: 1e-5, torch.float16: 2e-3 * world, torch.bfloat16: 2e-2 * world}[dtype]


def collective_impls(op, dtype, world, methods, peers, rng_seed=0):
    """``make_impls`` for one collective: ditron's ``methods`` plus ``peers``
    (``nccl``, ``torch_one_shot``, ``torch_two_shot``)."""
    import torch
    import torch.distributed as dist

    from ditron import kernels as zoo

    elem = torch.empty((), dtype=dtype).element_size()
    dev = world.device
    W, R = world.world_size, world.rank
    contexts = {}

    def ctx_for(numel):
        key = numel
        if key not in contexts:
            contexts.clear()
            if op == "all_reduce":
                contexts[key] = zoo.create_all_reduce_context(numel, dtype)
            elif op == "all_gather":
                contexts[key] = zoo.create_all_gather_context(numel, dtype)
            elif op == "reduce_scatter":
                contexts[key] = zoo.create_reduce_scatter_context(numel, dtype)
        return contexts[key]

    def make(nbytes):
        numel = max(1, nbytes // elem)
        if op == "reduce_scatter":
            numel = max(W, numel // W * W)
        def gen(r):
            # every rank can regenerate every rank's input on its own device: references need no communication
            g = torch.Generator(device=dev).manual_seed(rng_seed + 7919 * r + nbytes)
            return torch.randn(numel, generator=g, device=dev).to(dtype)

        x = gen(R)

        class _Inputs:
            def __iter__(self):
                return (gen(r) for r in range(W))

        xs = _Inputs()
        impls = []
        tol = _tol(dtype, W)

        def check_close(ref_fn):
            def check(out):
                ref = ref_fn()
                got = out.float().reshape(ref.shape)
                if not torch.allclose(got, ref, rtol=tol, atol=tol):
                    raise AssertionError(f"max error {(got - ref).abs().max().item():.3g}")
            return check

        if op == "all_reduce":
            ref = check_close(lambda: sum(t.float() for t in xs))
            ar_mod = importlib.import_module("ditron.kernels.all_reduce")
            for m in methods:
                if m == "ll" and numel * elem > ar_mod.LL_MAX_BYTES:
                    continue            # the LL protocol's size limit: "-" in the table, not a failure
                ctx = ctx_for(numel)
                out = torch.empty_like(x)
                impls.append(Impl(f"ditron {m}", lambda m=m, ctx=ctx, out=out: zoo.all_reduce(x, ctx, out=out, method=m),
                                  ref))
            if "nccl" in peers and dist.is_initialized():
                y = torch.empty_like(x)

                def nccl():
                    y.copy_(x)
                    dist.all_reduce(y)
                    return y
                impls.append(Impl("NCCL", nccl, ref, "includes a copy of the input"))
            if str(dev).startswith("cuda") and {"torch_one_shot", "torch_two_shot"} & set(peers):
                import torch.distributed._symmetric_memory as symm_mem
                buf = symm_mem.empty(numel, dtype=dtype, device=dev)
                symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
                if "torch_one_shot" in peers:
                    def one():
                        buf.copy_(x)
                        return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", dist.group.WORLD.group_name)
                    impls.append(Impl("torch one_shot", one, ref, "includes a copy into symmetric memory"))
                if "torch_two_shot" in peers:
                    def two():
                        buf.copy_(x)
                        torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", dist.group.WORLD.group_name)
                        return buf
                    impls.append(Impl("torch two_shot", two, ref, "in place, includes a copy"))
        elif op == "all_gather":
            ref = check_close(lambda: torch.cat([t.float() for t in xs]))
            for m in methods:
                ctx = ctx_for(numel)
                impls.append(Impl(f"ditron {m}", lambda m=m, ctx=ctx: zoo.all_gather(x, ctx, method=m), ref))
            if "nccl" in peers and dist.is_initialized():
                y = torch.empty(W * numel, dtype=dtype, device=dev)
                impls.append(Impl("NCCL", lambda: (dist.all_gather_into_tensor(y, x), y)[1], ref))
        elif op == "reduce_scatter":
            m_ = numel // W
            ref = check_close(lambda: sum(t.float() for t in xs)[R * m_:(R + 1) * m_])
            for m in methods:
                ctx = ctx_for(numel)
                impls.append(Impl(f"ditron {m}", lambda m=m, ctx=ctx: zoo.reduce_scatter(x, ctx, method=m), ref))
            if "nccl" in peers and dist.is_initialized():
                y = torch.empty(m_, dtype=dtype, device=dev)
                impls.append(Impl("NCCL", lambda: (dist.reduce_scatter_tensor(y, x), y)[1], ref))
        return impls

    return make


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="ditron bench", description=__doc__.split("\n\n")[0])
    from .registry import COLLECTIVE_OPS
    p.add_argument("op", choices=list(COLLECTIVE_OPS))
    p.add_argument("--sizes", default="8K..256M", help="bytes per rank: 'LO..HI' (powers of --step) or a list")
    p.add_argument("--step", type=int, default=2)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--methods", default="auto", help="ditron methods, comma-separated")
    p.add_argument("--peers", default="nccl,torch_one_shot,torch_two_shot",
                   help="baselines: nccl, torch_one_shot, torch_two_shot (comma-separated; '' for none)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=25)
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    p.add_argument("--repeat", type=int, default=2,
                   help="timing rounds in alternating order; the best round's median is reported (default 2)")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--tag", default=None, help="file-name prefix (default: machine kind or 'local')")
    p.add_argument("--machine", default=os.environ.get("DITRON_MACHINE", "unknown machine"))
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    import ditron
    world = ditron.init()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    peers = [s for s in args.peers.split(",") if s] if world.backend != "sim" else []
    methods = [m for m in args.methods.split(",") if m]
    sizes = parse_sizes(args.sizes, args.step)
    make = collective_impls(args.op, dtype, world, methods, peers)
    sweep = run_sweep(args.op, args.dtype, sizes, make, _bus(args.op), device=world.device,
                      world_size=world.world_size, rank=world.rank, warmup=args.warmup, iters=args.iters,
                      graph=args.graph, barrier=ditron.barrier_all, repeat=args.repeat)
    if world.rank == 0:
        command = "ditron bench " + " ".join(argv)
        paths = write_results(sweep, args.out, args.tag or args.machine.replace(" ", "-"), command, args.machine)
        print(table(sweep, "us"))
        print("wrote " + ", ".join(p for p in paths if p))
    bad = [r for r in sweep.rows if not r["ok"]]
    ditron.finalize()
    return 1 if bad else 0
