"""Where the decoder megakernel's GEMV time goes, outside the megakernel: the decoder's own GEMV tile function
(``kernels/decoder/tiles_gemv.py: linear_tile``) launched (a) one program per tile and (b) as a persistent loop over
the tiles with P programs (what the megakernel does, without the scoreboard), against ``torch.nn.functional.linear``
(cuBLAS) and a device copy, at Qwen3-8B's projection shapes, batch 1, weights of 8 stacked layers (more than L2).

    python bench/gemv_probe.py [--configs 16x1024x4,8x1024x4,...] [--programs 264,528] [--stream 0,3]

Prints achieved bandwidth (weight bytes / time) per implementation and shape.  ``--stream``: the tiles' ``STREAM``
values to compare (0: weights double-buffered in registers; S > 0: streamed by ``cp.async`` into shared memory
with a pipeline of S stages, ``TileConfig.gemv_stream``; issue 26).
"""
import argparse

import torch
import triton
import triton.language as tl

from ditron.kernels.decoder import tiles as T

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
L = 8


@triton.jit(do_not_specialize=["layer"])
def one_tile_per_program(x_ptr, w_ptr, out_ptr, layer, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, STREAM: tl.constexpr):
    T.linear_tile(tl.program_id(0), x_ptr, w_ptr, out_ptr, layer, 1, N, K, 1, BN, BK, False, STREAM)


@triton.jit(do_not_specialize=["layers"])
def persistent(x_ptr, w_ptr, out_ptr, layers, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, STREAM: tl.constexpr):
    ntiles = tl.cdiv(N, BN)
    for j in range(tl.program_id(0), layers * ntiles, tl.num_programs(0)):
        T.linear_tile(j % ntiles, x_ptr, w_ptr, out_ptr, j // ntiles, 1, N, K, 1, BN, BK, False, STREAM)


@triton.jit(do_not_specialize=["layers", "first"])
def persistent_rms(x_ptr, resid_ptr, delta_ptr, nw_ptr, w_ptr, out_ptr, layers, first, N: tl.constexpr,
                   K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GATE_UP: tl.constexpr, STREAM: tl.constexpr):
    """The fused-norm GEMV tiles (rms_linear_tile / rms_gate_up_tile: N = output columns; gate/up reads 2N rows)."""
    ntiles = tl.cdiv(N, BN)
    for j in range(tl.program_id(0), layers * ntiles, tl.num_programs(0)):
        if GATE_UP:
            T.rms_gate_up_tile(j % ntiles, x_ptr, resid_ptr, delta_ptr, nw_ptr, w_ptr, out_ptr, j // ntiles, 0,
                               first, 1, 1e-6, N, K, 1, BN, BK, False, STREAM)
        else:
            T.rms_linear_tile(j % ntiles, x_ptr, resid_ptr, delta_ptr, nw_ptr, w_ptr, out_ptr, j // ntiles, 0,
                              first, 1, 1e-6, N, K, 1, BN, BK, False, STREAM)


@triton.jit(do_not_specialize=["layers"])
def persistent_gate_up(x_ptr, w_ptr, out_ptr, layers, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, STREAM: tl.constexpr):
    ntiles = tl.cdiv(N, BN)
    for j in range(tl.program_id(0), layers * ntiles, tl.num_programs(0)):
        T.gate_up_tile(j % ntiles, x_ptr, w_ptr, out_ptr, j // ntiles, 1, N, K, 1, BN, BK, False, STREAM)


def fused_norm_probe(dev, configs, P, streams=(0,)):
    """rms_linear_tile (qkv), gate_up_tile and rms_gate_up_tile (gate/up) vs linear_tile, persistent, P programs."""
    for name, (N, K), gu in (("qkv", SHAPES["qkv"], False), ("gate_up", (SHAPES["gate_up"][0] // 2, 4096), True)):
        rows = 2 * N if gu else N
        w = torch.randn(L, rows, K, device=dev).to(torch.bfloat16)
        x = torch.randn(1, K, device=dev).to(torch.bfloat16)
        resid, delta = torch.randn(1, K, device=dev), torch.randn(1, K, device=dev)
        nw = torch.randn(1, K, device=dev).to(torch.bfloat16)
        out = torch.empty(1, N, device=dev, dtype=torch.bfloat16)
        nbytes = w.numel() * 2
        for c in configs:
            bn, bk, nw_ = (int(v) for v in c.split("x"))
            for st in streams:
                line = f"  {name} {bn}x{bk} w{nw_} stream={st} P={P}:"
                for first in (1, 0):
                    t = timeit(lambda: persistent_rms[(P,)](x, resid, delta, nw, w, out, L, first, N, K, bn, bk, gu,
                                                            st, num_warps=nw_))
                    line += f" fused-norm first={first} {nbytes / t / 1e9:.0f} GB/s;"
                if gu:
                    t = timeit(lambda: persistent_gate_up[(P,)](x, w, out, L, N, K, bn, bk, st, num_warps=nw_))
                    line += f" gate_up_tile {nbytes / t / 1e9:.0f} GB/s"
                print(line, flush=True)
        del w


def timeit(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e-3 / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="16x1024x4,8x1024x4,8x2048x4,16x512x4,32x512x8,64x256x8,4x2048x4")
    p.add_argument("--programs", default="264,528,1056")
    p.add_argument("--fused-norm", default="", help="configs for the fused-norm probe only (e.g. 16x1024x4,16x512x4)")
    p.add_argument("--stream", default="0", help="STREAM values (0: register double-buffering; S: cp.async, S stages)")
    p.add_argument("--shapes", default=",".join(SHAPES), help="projections of the plain probe")
    args = p.parse_args()
    streams = [int(v) for v in args.stream.split(",")]
    if args.fused_norm:
        fused_norm_probe(torch.device("cuda"), args.fused_norm.split(","), int(args.programs.split(",")[0]), streams)
        return
    dev = torch.device("cuda")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    bw = 2 * src.numel() / timeit(lambda: dst.copy_(src))
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    del src, dst
    for name in args.shapes.split(","):
        N, K = SHAPES[name]
        w = torch.randn(L, N, K, device=dev).to(torch.bfloat16)
        x = torch.randn(1, K, device=dev).to(torch.bfloat16)
        out = torch.empty(1, N, device=dev)
        ref = torch.nn.functional.linear(x.float(), w[L - 1].float())
        nbytes = w.numel() * 2

        def torch_all():
            for l in range(L):
                torch.nn.functional.linear(x, w[l])
        t = timeit(torch_all)
        print(f"{name} N={N} K={K}: torch F.linear {nbytes / t / 1e9:.0f} GB/s")
        for c in args.configs.split(","):
            bn, bk, nw = (int(v) for v in c.split("x"))
            grid = triton.cdiv(N, bn)
            for st in streams:
                def tiles():
                    for l in range(L):
                        one_tile_per_program[(grid,)](x, w, out, l, N, K, bn, bk, st, num_warps=nw)
                t = timeit(tiles)
                err = (out - ref).abs().max().item()
                line = (f"  tile {bn}x{bk} w{nw} stream={st}: one program per tile ({grid}) {nbytes / t / 1e9:.0f} "
                        f"GB/s (err {err:.2g})")
                for P in (int(v) for v in args.programs.split(",")):
                    t = timeit(lambda: persistent[(P,)](x, w, out, L, N, K, bn, bk, st, num_warps=nw))
                    line += f"; persistent P={P} {nbytes / t / 1e9:.0f}"
                print(line, flush=True)
        del w


if __name__ == "__main__":
    main()
