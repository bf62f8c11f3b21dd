"""The fp8 LL dispatch's tiles at world size 1 (issue 55 item 2), side by side with the bf16 round trip, in one
process: each variant of ``(ll_rows, ll_fp8_groups, dispatch_warps)`` (context attributes, kernels/ep.py
``ep_tiles``) is checked first -- every e4m3 code and scale the first dispatch delivers against torch's quantiser
(ditron/bench/ep_fp8.py ``dispatch_check``) and the round trip through identity experts within its bound
(``combine_check``) -- then timed as a CUDA-graph replay of dispatch + combine beside the bf16 one.
H100, 2026-12-07 (bench/results/h100-2026-12-07f-fp8/): the default (8, 4, 4) sends its rows in 14 us against
bf16's 8 us.

    DITRON_HEAP_SIZE=12G torchrun --standalone --nproc-per-node 1 bench/diag/ep_fp8_sweep.py [--tokens 128] [--hidden 7168]
    ditron sim -n 1 bench/diag/ep_fp8_sweep.py --tokens 4 --hidden 512 --topk 2 --experts 4 \\
        --variants 4,1,1:4,4,1:4,1,1,p:4,1,1,o2 --iters 2                 # the CPU smoke run
"""
import argparse

import torch

import ditron
from ditron.bench.ep_fp8 import combine_check, dispatch_check
from ditron.bench.harness import Impl, measure
from ditron.bench.moe import _rand, _routing
from ditron.kernels import ep

# powers of two (Triton tiles); a 4th field "p": ll_fp8_prequant (each token quantised once, then its words moved),
# or "o<N>": ll_fp8_once with ll_fp8_once_groups N (each token of a dispatch block quantised once, N groups a step;
# "o<N>n": without ll_fp8_once_prefetch, one step's loads at a time -- sm_90a as the benchmark's launch compiles
# each (world size 1, H specialised) on Triton 3.6, registers / spilled bytes per thread: rows 8, 4 warps: o4 128 / 0,
# o8 128 / 8 (ptxas's choice), o8n 142 / 0, o16 216 / 0, o16n 215 / 0; 8 warps: o8 121 / 0, o16 166 / 0, o16n 128 /
# 48 (ptxas's choice), o32 217 / 0, o64n 236 / 0; rows 16, 8 warps, o16 166 / 0; the per-pair path 208 / 0)
DEFAULT_VARIANTS = ("8,4,4:8,4,4,o8:8,4,4,o8n:8,4,4,o16:8,4,4,o16n:8,4,4,o4:8,4,8,o16:8,4,8,o16n:8,4,8,o8:"
                    "8,4,8,o32:8,4,8,o64n:16,4,8,o16:4,4,4,o8:8,4,4,p")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help="ll_rows,ll_fp8_groups,dispatch_warps per variant, ':'-separated")
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    world = ditron.init()
    if world.world_size != 1:
        raise SystemExit("ep_fp8_sweep: world size 1 only (the own-row path)")
    dev = world.device
    T, H, k, E = args.tokens, args.hidden, args.topk, args.experts
    x = _rand((T, H), 0, torch.bfloat16, dev)
    idx, w = _routing(T, E, k, 0, dev)
    impls, notes = [], {}
    ctx16 = ep.create_ep_context(T, H, E, k, torch.bfloat16, mode="low_latency", capacity=T)

    def run16():
        recv_x, _, handle = ep.ep_dispatch(x, idx, w, ctx16, validate=False)
        return ep.ep_combine(recv_x, handle, ctx16)
    impls.append(Impl("bf16 (default tiles)", run16, combine_check(x, w, False, "bf16 round trip")))
    for v in args.variants.split(":"):
        f = v.split(",")
        rows, groups, warps = (int(s) for s in f[:3])
        pre = f[3:] == ["p"]
        o = f[3] if f[3:] and f[3].startswith("o") else ""
        once, pf = int(o[1:].rstrip("n") or 0), not o.endswith("n")
        ctx = ep.create_ep_context(T, H, E, k, torch.bfloat16, mode="low_latency", capacity=T)
        ctx.ll_rows, ctx.ll_fp8_groups, ctx.dispatch_warps, ctx.ll_fp8_prequant = rows, groups, warps, pre
        ctx.ll_fp8_once = bool(once)
        if once:
            ctx.ll_fp8_once_groups, ctx.ll_fp8_once_prefetch = once, pf
        name = f"fp8 rows {rows} groups {groups} warps {warps}" + (" prequant" if pre else "") + \
            (f" once {once}" + ("" if pf else " no prefetch") if once else "")
        try:
            (c8, s8), _, handle = ep.ep_dispatch(x, idx, w, ctx, use_fp8=True)
            y8 = ep.fp8_dequantize(c8, s8).to(torch.bfloat16)
            ep.ep_combine(y8, handle, ctx)
            bad = dispatch_check(x, idx, E, c8, s8)
        except Exception as e:  # noqa: BLE001 -- the variant is reported, not timed
            notes[name] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        if bad:
            notes[name] = bad
            continue

        def run8(ctx=ctx, y8=y8):
            _, _, handle = ep.ep_dispatch(x, idx, w, ctx, validate=False, use_fp8=True)
            return ep.ep_combine(y8, handle, ctx)
        impls.append(Impl(name, run8, combine_check(x, w, True, name)))
    cuda = str(dev).startswith("cuda")
    res = measure(impls, dev, warmup=5, iters=args.iters, graph=cuda, repeat=2)
    base = res[impls[0].name]["us"]
    print(f"# {torch.cuda.get_device_name(dev) if cuda else 'simulator'}: {T} tokens, hidden {H}, top-{k}, {E} experts,"
          " world size 1; dispatch + combine, CUDA-graph replays (us); ratio = bf16 time / this time")
    print("| variant | us | vs bf16 | status |\n| --- | --- | --- | --- |")
    for impl in impls:
        r = res[impl.name]
        print(f"| {impl.name} | {r['us']:.1f} | {base / r['us']:.2f}x | {'ok' if r['ok'] else r['error'][:120]} |")
    for name, why in notes.items():
        print(f"| {name} | - | - | {why[:160]} |")


if __name__ == "__main__":
    main()
