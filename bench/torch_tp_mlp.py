"""The tensor-parallel MLP of ``ditron.nn`` through torch.compile and CUDA graphs, against calling the zoo
kernels directly (issue 16, GPU acceptance).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --standalone --nproc-per-node 2 bench/torch_tp_mlp.py --machine nvidia-h200-x2
    ditron sim -n 2 bench/torch_tp_mlp.py --tokens 64 --d 32 --ffn 48 --iters 2     # smoke run on the CPU

``mlp = ditron.nn.TensorParallelMLP.from_linears(fc1, fc2)`` (AllGather-GEMM, GELU, GEMM-ReduceScatter, with
biases; input and output sharded on the sequence) is

1. checked: eager against the unsharded torch MLP, ``torch.compile(mlp, fullgraph=True)`` against eager, the
   direct kernel calls against eager, and (GPUs) a manual CUDA-graph capture of the compiled step, replayed
   on a new input, against eager;
2. timed (the harness of ``ditron bench``: CUDA-graph replays, rounds in alternating order, the best round's
   median of the slowest rank): ``compiled`` (the compiled module captured in a CUDA graph), ``direct``
   (``kernels.ag_gemm`` + bias + GELU + ``kernels.gemm_rs`` + bias, the same contexts, captured in a CUDA
   graph) and ``eager module`` (the uncompiled module, for reference).

Rank 0 prints a Markdown table; the exit status is 1 when a check fails, when the compiled step could not be
captured, or (GPUs) when compiled / direct exceeds 1 + ``--tolerance`` (default 3%).
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import ditron
import ditron.nn as dnn
from ditron import torch_ops
from ditron.bench.harness import Impl, measure
from ditron.kernels.ag_gemm import ag_gemm
from ditron.kernels.gemm_rs import gemm_rs

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def close(got, ref, what, rel):
    err = (got.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    if not err <= rel * scale + 1e-2:
        raise AssertionError(f"{what}: max abs error {err:.4g} (scale {scale:.4g})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8192, help="sequence length (all ranks together)")
    p.add_argument("--d", type=int, default=4096, help="model dimension")
    p.add_argument("--ffn", type=int, default=14336, help="MLP hidden dimension (split over the ranks)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeat", type=int, default=4, help="timing rounds in alternating order")
    p.add_argument("--tolerance", type=float, default=0.03, help="allowed compiled / direct - 1 (GPUs)")
    p.add_argument("--machine", default="unknown machine")
    args = p.parse_args(argv)

    world = ditron.init()
    W, R, dev = world.world_size, world.rank, torch.device(world.device)
    gpu = dev.type == "cuda"
    dtype = DTYPES[args.dtype]
    if args.tokens % W:
        raise SystemExit(f"--tokens {args.tokens} is not a multiple of the world size {W}")
    m = args.tokens // W

    torch.manual_seed(0)                          # the same full layers and input on every rank
    fc1 = nn.Linear(args.d, args.ffn, device=dev, dtype=dtype)
    fc2 = nn.Linear(args.ffn, args.d, device=dev, dtype=dtype)
    gen = torch.Generator(device=dev).manual_seed(1)
    x_full = torch.randn(args.tokens, args.d, generator=gen, device=dev, dtype=dtype)
    x = x_full[R * m:(R + 1) * m].contiguous()
    x_other = torch.randn(m, args.d, generator=gen, device=dev, dtype=dtype)
    mlp = dnn.TensorParallelMLP.from_linears(fc1, fc2)
    rel = 2e-2
    failures = []

    with torch.no_grad():
        ref = fc2(nn.functional.gelu(fc1(x_full)))[R * m:(R + 1) * m]
        del x_full
        eager = mlp(x)
        close(eager, ref, f"rank {R}: eager TP MLP vs the unsharded MLP", rel)
        compiled = torch.compile(mlp, fullgraph=True)
        close(compiled(x), eager, f"rank {R}: compiled vs eager", rel)

        w1t, b1 = mlp.fc1.weight.t(), mlp.fc1.bias
        w2t, b2 = mlp.fc2.weight.t(), mlp.fc2.bias
        ctx1 = torch_ops.context_for("ag_gemm", x, w1t)          # the contexts the registered ops use
        h = mlp.act(mlp.fc1(x))
        ctx2 = torch_ops.context_for("gemm_rs", h, w2t)
        del h

        def direct():
            hid = nn.functional.gelu(ag_gemm(x, w1t, ctx1) + b1)
            return gemm_rs(hid, w2t, ctx2) + b2

        close(direct(), eager, f"rank {R}: direct kernel calls vs eager", rel)

        if gpu:                                  # the compiled step in a CUDA graph, replayed on another input
            static_x = x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                compiled(static_x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = compiled(static_x)
            static_x.copy_(x_other)
            graph.replay()
            close(static_y, mlp(x_other), f"rank {R}: CUDA-graph replay of the compiled step", rel)
            static_x.copy_(x)
            graph.replay()
            close(static_y, eager, f"rank {R}: CUDA-graph replay of the compiled step (2)", rel)
            del graph, static_y, static_x

        def check(out):
            close(out, eager, f"rank {R}", rel)

        impls = [Impl("direct", direct, check), Impl("compiled", lambda: compiled(x), check),
                 Impl("eager module", lambda: mlp(x), check)]
        res = measure(impls, dev, warmup=args.warmup, iters=args.iters, graph=gpu, barrier=ditron.barrier_all,
                      repeat=args.repeat)

    for name, r in res.items():
        if not r["ok"]:
            failures.append(f"{name}: {r['error']}")
        elif gpu and r["note"]:
            failures.append(f"{name}: {r['note']}")       # e.g. CUDA-graph capture failed, timed eagerly
    t_direct, t_compiled = res["direct"]["us"], res["compiled"]["us"]
    ratio = t_compiled / t_direct
    within = ratio <= 1 + args.tolerance
    if gpu and not within:
        failures.append(f"compiled / direct = {ratio:.3f} > {1 + args.tolerance:.3f}")
    if R == 0:
        print(f"\nTP MLP, {args.machine}, {W} ranks, {args.dtype}, tokens {args.tokens}, d {args.d}, ffn {args.ffn} "
              f"({'CUDA-graph replays' if gpu else 'simulator: times are meaningless'})")
        print("| tokens, d, ffn | ranks | dtype | direct (us) | compiled + CUDA graph (us) | eager module (us) | "
              "compiled / direct | within {:.0%} |".format(args.tolerance))
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        print(f"| {args.tokens}, {args.d}, {args.ffn} | {W} | {args.dtype} | {t_direct:.1f} | {t_compiled:.1f} | "
              f"{res['eager module']['us']:.1f} | {ratio:.3f} | {'yes' if within else 'NO'} |")
        print("command: " + " ".join(["torchrun --standalone --nproc-per-node", str(W)] if gpu else
                                     ["ditron sim -n", str(W)]) + " bench/torch_tp_mlp.py " + " ".join(
            sys.argv[1:] if argv is None else argv))
    for f in failures:
        print(f"rank {R}: FAILED: {f}", file=sys.stderr)
    ditron.finalize()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
