"""GEMM + communication benchmarks (``ditron bench ag_gemm|gemm_rs|gemm_ar|gemm``).

    torchrun --standalone --nproc-per-node 4 -m ditron.bench ag_gemm --shapes paper --dtype bf16 --graph
    torchrun --standalone --nproc-per-node 4 -m ditron.bench gemm_rs --shapes "8192,4096,11008;8192,8192,28672"
    torchrun --standalone --nproc-per-node 1 -m ditron.bench gemm --shapes paper --tp 4 --configs sweep
    torchrun --standalone --nproc-per-node 1 -m ditron.bench gemm --dtype fp8 --recipe row,block --shapes paper --tp 8
    torchrun --standalone --nproc-per-node 2 -m ditron.bench gemm_rs --dtype fp8 --recipe tensor,row,block \
        --shapes paper --methods ce,ce:core=gluon
    ditron sim -n 2 -m ditron.bench ag_gemm --shapes 64,32,32      # smoke run of the harness on CPU
    ditron sim -n 2 -m ditron.bench gemm_ar --dtype fp8 --recipe row --shapes 32,32,64 --methods one_shot

Shapes are the paper's GLOBAL ``(M, N, K)`` (``--shapes paper``: appendix C.2,
tables 1 and 2, as in shared/bench/paper-shapes.json; ``strong``: the
strong-scaling tables), split for tensor parallelism over ``W = --tp`` ranks
(the world size):

* ``ag_gemm``: A ``[M, K]`` sharded ``[M/W, K]`` per rank, B ``[K, N/W]`` per
  rank; out ``[M, N/W]`` = all_gather(A) @ B.
* ``gemm_rs``: A ``[M, K/W]``, B ``[K/W, N]`` per rank; out ``[M/W, N]`` = this
  rank's rows of the sum over ranks of A @ B.
* ``gemm_ar``: the GEMM-RS shapes; out ``[M, N]`` = the sum over ranks.

Per shape, side by side in one process: ditron (each ``--methods``), and the
``--peers``: ``cublas_nccl`` (torch.matmul and the NCCL collective, one after
the other), ``torch_fused`` (torch.ops.symm_mem.fused_all_gather_matmul /
fused_matmul_reduce_scatter; none exists for GEMM-AR), ``gemm_only``
(torch.matmul at the local shape), ``comm_only`` (the NCCL collective alone)
and ``ditron_gemm_only`` (ditron.kernels.gemm.matmul at the local shape).
Every implementation is first checked against a float32 torch reference on
fresh random inputs (every rank regenerates every rank's inputs), then timed
like the collectives (ditron/bench/harness.py: rounds in alternating order, the best
round's median of the slowest rank, ``--graph`` for CUDA-graph replays).
Reported: the time of each, the speedup over ``cublas_nccl``, the fraction of
the communication hidden, ``(t_gemm_only + t_comm_only - t) / t_comm_only``
(clamped to [0, 1] in the table, raw in the JSON), and the geomean over the
shapes of each speedup.

``ditron bench gemm``: the GEMM core (kernels/gemm.py) against cuBLAS at the
per-rank GEMM shapes of the three workloads (``--shapes paper`` with ``--tp``;
explicit ``M,N,K`` are local GEMM shapes ``[M, K] @ [K, N]``), in TFLOP/s;
``ditron default`` is what ``matmul`` runs without a config: the measured
per-GPU table's entry for the shape (kernels/gemm_tables/, the nearest rule of
kernels/gemm_table.py; ``--table PATH|off``), else the default rule;
``--configs sweep`` times a list of ``GemmConfig`` and reports the best per
shape (configs that do not compile, e.g. out of shared memory, are skipped).
``--dtype fp8`` for the overlap ops (ditron/bench/gemm_fp8.py): per shape and ``--recipe`` (``tensor``,
``row``, ``block``; several comma-separated; the recipe is part of the row's shape label), every rank's
operands are e4m3, quantised from fresh random float32 ones (per-tensor: one scale per tensor and rank;
rowwise: per row of A and column of B; blockwise: 1x128 for A, 128x128 for B, DeepSeek-V3's), and every
implementation is checked against the float32 product of the dequantised operands with the op's
collective semantics (AG-GEMM: every rank's rows, each with its own scales; GEMM-RS / GEMM-AR: the sum
over ranks), then timed: ditron's fp8 op (each ``--methods``, e.g. ``ce,ce:core=gluon`` or
``rs_ag:core=gluon``), ditron's bf16 op of the same method on the dequantised operands (``bf16 ditron X``),
and the vendor baseline ``cublas_nccl``: AG-GEMM ``all_gather_into_tensor`` of the fp8 A rows and of their
scales, then ``torch._scaled_mm``; GEMM-RS / GEMM-AR ``torch._scaled_mm`` to bf16, then
``reduce_scatter_tensor`` / ``all_reduce``.  ``gemm_only`` is ``torch._scaled_mm`` alone, ``ditron_gemm_only``
ditron's fp8 ``matmul`` alone.  Where ``torch._scaled_mm`` refuses a recipe or gives a wrong result (it is
held to the reference before it is timed: blockwise without cuBLASLt's kernel, or at a local K not a
multiple of 128), its cells are n/a with the reason and the shape leaves the geomean (not a ditron
failure).  An extra table gives per method the speedup over the vendor and over ditron's bf16 op.  Two
ranks on one GPU (``DITRON_RANKS_PER_GPU=2``) are for correctness only: the harness refuses to time ranks
that share a GPU (their rows then say "timing failed"), so run them with ``--check-only`` (every
implementation checked, none timed); timings need one GPU per rank.

``--dtype fp8`` for ``gemm``: e4m3 operands quantised with ``--recipe``
(``tensor``, ``row``, ``block``; several comma-separated) -- the fp8 core
against ``torch._scaled_mm`` (cuBLASLt; blockwise: ``F.scaled_mm`` where
this torch has it) in the column ``cuBLAS``, and against ditron's bf16 core
and cuBLAS bf16 on the same (dequantised) operands, in the same run; a
second table gives the two goal ratios.

Memory: inputs, outputs and ditron's contexts are allocated per shape and freed
after it (``ditron.heap_scope``, ``torch.cuda.empty_cache``); the symmetric
heap (``DITRON_HEAP_SIZE``) must hold the largest shape's context.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys

# the command line runs what the modules below provide (docs: ditron/bench/gemm_shapes.py); their names stay
# importable from here
from .gemm_fp8 import overlap_fp8_impls, vendor_mm  # noqa: F401
from .gemm_report import (_method_text, _plot, derive, fp8_overlap_table, fp8_vs_bf16, gemm_tables,  # noqa: F401
                          overlap_tables, write_gemm, write_overlap)
from .gemm_run import (KERNEL_MODULES, Inputs, _kernel_module, eps_of, make_check, overlap_impls,  # noqa: F401
                       run_overlap, tolerance, torch_fused_op)
from .gemm_shapes import (DEFAULT_METHODS, METHOD_PRESETS, OPS, PAPER_SHAPES, PARTS, PEERS,  # noqa: F401
                          SHAPE_SETS, STRONG_SHAPES, Shape, gemm_core_shapes, gemm_flops, local_dims,
                          method_spec, parse_shapes)
from .gemm_sweep import (FP8_RECIPES, SIM_SWEEP, SWEEP, _compile_skip, config_label, fp8_impls,  # noqa: F401
                         gemm_impls, gemm_summary, parse_configs, quantise_fp8, quantise_rows, run_gemm)
from .harness import _release, agree_fn, geomean, result_meta  # noqa: F401


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(prog="ditron bench", description="GEMM + communication benchmarks "
                                "(run under torchrun, or ditron sim for a smoke run)")
    p.add_argument("op", choices=OPS)
    p.add_argument("--shapes", default="paper",
                   help="'paper' or 'strong' (optionally ':MODEL,MODEL'), or global 'M,N,K;M,N,K' "
                        "(for 'gemm': local GEMM shapes)")
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel degree (default and, for the overlap ops, required: the world size)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"],
                   help="fp8: e4m3 operands (--recipe), timed against torch._scaled_mm (overlap ops: + the "
                        "torch.distributed collective) and ditron's bf16 GEMM / op on the same shapes")
    p.add_argument("--recipe", default="row",
                   help="fp8 scaling recipes, comma-separated: tensor, row (per-row / per-column), block "
                        "(1x128 / 128x128)")
    p.add_argument("--methods", default=None,
                   help="ditron methods, comma-separated, each NAME[:key=value...] (ag_gemm: default, ce, sm, "
                        "sm_overlap; gemm_rs: ce, scatter, pull; gemm_ar: auto, one_shot, two_shot, rs_ag); "
                        "the Gluon Hopper core: ag_gemm / gemm_rs ce:core=gluon, gemm_ar rs_ag:core=gluon")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"baselines, comma-separated ('' for none): {', '.join(PEERS)}")
    p.add_argument("--configs", default="default",
                   help="gemm only: 'default', 'sweep', or configs 'BMxBNxBK[:sS][:wW][:gG][:tma],...'")
    p.add_argument("--table", default=None,
                   help="gemm only: the per-GPU config table 'ditron default' reads (a JSON path, or 'off' for the "
                        "default rule alone); default: kernels/gemm_tables/ by GPU kind (DITRON_GEMM_TABLE)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=25)
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    p.add_argument("--check-only", action="store_true",
                   help="overlap ops: check every implementation, time none (e.g. ranks sharing a GPU, "
                        "DITRON_RANKS_PER_GPU, which the harness refuses to time)")
    p.add_argument("--repeat", type=int, default=2,
                   help="timing rounds in alternating order; the best round's median is reported (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto", help="ditron.init backend (auto, p2p, nvshmem, sim)")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--tag", default=None, help="file-name prefix (default: the machine, or 'local')")
    p.add_argument("--machine", default=os.environ.get("DITRON_MACHINE", "unknown machine"))
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    op = args.op
    peers = [s for s in args.peers.split(",") if s]
    bad = [s for s in peers if s not in PEERS]
    if bad:
        raise SystemExit(f"ditron bench {op}: unknown peer(s) {', '.join(bad)}; use {', '.join(PEERS)}")
    methods = []
    if op != "gemm":
        methods = [method_spec(op, s) for s in (args.methods or DEFAULT_METHODS[op]).split(",") if s]

    if args.table is not None:
        os.environ["DITRON_GEMM_TABLE"] = args.table     # read by kernels/gemm_table.py at the first lookup
    import torch

    import ditron
    world = ditron.init(args.backend)
    rank0 = world.rank == 0

    def log(msg):
        if rank0:
            print(f"ditron bench: {msg}", file=sys.stderr, flush=True)

    if args.check_only and op == "gemm":
        raise SystemExit("ditron bench gemm: --check-only is for the overlap ops (ag_gemm, gemm_rs, gemm_ar)")
    recipes = [r for r in args.recipe.split(",") if r]
    bad = [r for r in recipes if r not in FP8_RECIPES]
    if bad or not recipes:
        raise SystemExit(f"ditron bench: unknown --recipe {', '.join(bad)}; use {', '.join(FP8_RECIPES)}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": "fp8"}[args.dtype]
    W = world.world_size
    tp = args.tp or W
    sim = world.backend == "sim"
    command = "ditron bench " + " ".join(argv)
    if op == "gemm":
        shapes = gemm_core_shapes(args.shapes, tp)
        configs = parse_configs(args.configs, sim)
        if dtype == "fp8":
            rows = []
            for recipe in recipes:
                rows += run_gemm(shapes, world, dtype, configs, warmup=args.warmup, iters=args.iters,
                                 graph=args.graph, repeat=args.repeat, seed=args.seed, recipe=recipe)
        else:
            rows = run_gemm(shapes, world, dtype, configs, warmup=args.warmup, iters=args.iters, graph=args.graph,
                            repeat=args.repeat, seed=args.seed)
        summary = gemm_summary(rows)
        name = "gemm" + ("-sweep" if args.configs != "default" else "")
        bad_rows = [r for r in rows if r["status"] == "FAILED"]
    else:
        if tp != W:
            raise SystemExit(f"ditron bench {op}: --tp {tp} but the world has {W} ranks; launch "
                             f"{tp} ranks (torchrun --nproc-per-node {tp})")
        shapes = parse_shapes(args.shapes, "ag_gemm" if op == "ag_gemm" else "gemm_rs")
        for s in shapes:
            local_dims(op, s, W)                      # every shape splits, before any work
        kern, why = _kernel_module(op)
        if kern is None:
            log(f"ditron's {op} is not available: {why}; only the peers are measured")
        if dtype == "fp8":
            rows = []
            for recipe in recipes:          # one row per (shape, recipe): the model label names the recipe
                rows += run_overlap(op, [dataclasses.replace(s, label=f"{s.label} {recipe}") for s in shapes],
                                    world, dtype, methods, peers, warmup=args.warmup, iters=args.iters,
                                    graph=args.graph, repeat=args.repeat, seed=args.seed, log=log,
                                    impls_fn=functools.partial(overlap_fp8_impls, recipe=recipe),
                                    check_only=args.check_only)
        else:
            rows = run_overlap(op, shapes, world, dtype, methods, peers, warmup=args.warmup, iters=args.iters,
                               graph=args.graph, repeat=args.repeat, seed=args.seed, log=log,
                               check_only=args.check_only)
        summary = derive(rows)
        if dtype == "fp8":
            summary["fp8_vs_bf16"] = fp8_vs_bf16(rows)
        name = op
        bad_rows = [r for r in rows if r["status"] == "FAILED"]
    if rank0:
        meta = result_meta(name, args.dtype, W, world.device, args.machine, command)
        meta.update(tp=tp, backend=world.backend, shapes=args.shapes,
                    heap_size=os.environ.get("DITRON_HEAP_SIZE"),
                    method=_method_text(op, peers, args.graph, args.warmup, args.iters, args.repeat, sim,
                                        fp8=dtype == "fp8"))
        if dtype == "fp8":
            meta["recipes"] = recipes
        if args.check_only:
            meta["check_only"] = True
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{args.tag or args.machine.replace(' ', '-')}-{name}-{args.dtype}")
        if op == "gemm":
            paths = write_gemm(rows, summary, meta, stem)
            main_t, sweep_t = gemm_tables(rows, summary)
            print(main_t)
        else:
            paths = write_overlap(rows, summary, meta, stem)
            lat, spd, hid = overlap_tables(rows, summary)
            print(lat + "\n\n" + spd + "\n\n" + hid)
            if "fp8_vs_bf16" in summary:
                print("\n" + fp8_overlap_table(rows, summary))
        print("wrote " + ", ".join(p for p in paths if p))
        if bad_rows:
            print(f"ditron bench {op}: {len(bad_rows)} implementation(s) FAILED:", file=sys.stderr)
            for r in bad_rows:
                print(f"  {r['model']} {r['impl']}: {r['error']}", file=sys.stderr)
    ditron.barrier_all()
    ditron.finalize()
    return 1 if bad_rows else 0


if __name__ == "__main__":
    sys.exit(main())
