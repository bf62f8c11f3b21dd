"""Issue 55: the fp8 Gluon core (kernels/gemm_hopper.py ``scaled_matmul_hopper``) on ONE H100, checked and
timed side by side with torch._scaled_mm in the same process (bench/fp8_gluon.sh runs it; < 5 minutes).

1. Correctness, per recipe (rowwise ``scale_a [M, 1]`` / ``scale_b [1, N]``, per-tensor scalars) and per-rank
   paper shape (TP=8, ``ditron.bench.gemm_shapes``): fresh random e4m3 operands (randn quantised per row / per
   tensor to the whole e4m3 range: never zeros), ``b = w.t()`` column-major, bf16 output poisoned with NaN
   first.  Every Gluon config and the tl fp8 core are compared with the float32 reference
   ``(a.float() @ b.float()) * sa * sb`` and with torch._scaled_mm: max abs error and max error relative to the
   largest |reference| (pass: <= 1e-2 relative, finite).  A failing candidate is not timed.
2. Timing (rowwise: every candidate; per-tensor: the default Gluon config, the tl core and _scaled_mm): CUDA-graph
   replays of 5 calls, median of up to 10 replays (``bench/gemm_core_levers.py``'s timer and convention: same
   buffers every call, no L2 flush), ``--rounds`` rounds in alternating order, best kept.  Candidates:
   torch._scaled_mm (cuBLASLt per-tensor; CUTLASS rowwise in torch), the Gluon fp8 core (configs below), the tl
   fp8 core (``ditron.kernels.gemm.matmul``, its default ``fp8_config``) and ditron's bf16 core on the same
   shape (``ditron.kernels.gemm.matmul`` on bf16 operands: the H100 table's choice, the Gluon bf16 core).
   Table: us per call and ratio _scaled_mm time / candidate time (goal for the Gluon fp8 core >= 0.95x) and
   bf16 time / best Gluon fp8 time (goal >= 1.6x); geomeans last.

    python bench/fp8_gluon.py [--tp 8] [--rounds 2] [--configs "coop 128x128x128 s6,pingpong 64x128x128 s4"]
"""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ditron.bench.gemm_shapes import gemm_core_shapes  # noqa: E402
import ditron.kernels.gemm as G  # noqa: E402
import ditron.kernels.gemm_hopper as H  # noqa: E402
from gemm_core_levers import graph_timer, Watchdog  # noqa: E402

HC = H.HopperGemmConfig
E4 = torch.float8_e4m3fn

#: the Gluon fp8 configs timed (128 x 256 tiles do not fit: the fp32 promotion keeps a second accumulator, so
#: each consumer warpgroup holds at most 64 x 128 -- HopperGemmConfig.validate says so)
CONFIGS = {
    "coop 128x128x128 s6": HC(128, 128, 128, stages=6, mode="coop"),          # the default (fp8_default_config)
    "coop 128x128x128 s4": HC(128, 128, 128, stages=4, mode="coop"),
    "coop 128x128x128 s6 g16": HC(128, 128, 128, stages=6, mode="coop", group_m=16),
    "pingpong 64x128x128 s6": HC(64, 128, 128, stages=6, mode="pingpong"),
    "pingpong 64x128x128 s4": HC(64, 128, 128, stages=4, mode="pingpong"),
}
DEFAULT = "coop 128x128x128 s6"


def operands(M, N, K, recipe, seed, dev):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn((M, K), generator=g, device=dev)
    w = torch.randn((N, K), generator=g, device=dev)
    top = torch.finfo(E4).max
    if recipe == "row":
        sa = (x.abs().amax(1, keepdim=True) / top).clamp(min=1e-12)
        sw = (w.abs().amax(1, keepdim=True) / top).clamp(min=1e-12)
        sb = sw.t().contiguous()                              # [1, N]
    else:
        sa = (x.abs().max() / top).clamp(min=1e-12).reshape(())
        sw = sb = (w.abs().max() / top).clamp(min=1e-12).reshape(())
    a = (x / sa).to(E4)
    b = (w / sw).to(E4).t()                                   # [K, N] column-major: w.t()
    return a, b, sa.float(), sb.float()


def candidates(recipe, configs):
    c = {"torch._scaled_mm": lambda a, b, sa, sb, out: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                                                          out_dtype=torch.bfloat16)}
    for name in configs:
        cfg = CONFIGS[name]
        c[f"gluon {name}"] = (lambda cfg: lambda a, b, sa, sb, out: H.scaled_matmul_hopper(
            a, b, sa, sb, torch.bfloat16, out=out, config=cfg))(cfg)
    c["tl fp8 core"] = lambda a, b, sa, sb, out: G.matmul(a, b, out=out, scale_a=sa, scale_b=sb,
                                                          out_dtype=torch.bfloat16)
    return c


def check(name, fn, a, b, sa, sb, ref, vendor):
    out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device=ref.device)
    got = fn(a, b, sa, sb, out)
    torch.cuda.synchronize()
    top = ref.abs().max().item()
    err = (got.float() - ref).abs().max().item()
    err_v = (got.float() - vendor.float()).abs().max().item()
    ok = bool(torch.isfinite(got.float()).all().item()) and err <= 1e-2 * top
    return ok, err, err / top, err_v / top


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--budget", type=float, default=240.0, help="seconds: later rounds are skipped past it")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    dev = torch.device("cuda")
    t_start = time.time()
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton "
          f"{__import__('triton').__version__}, TP={args.tp}")
    dog = Watchdog(120, lambda what: print(f"hung in {what}", flush=True))
    shapes = gemm_core_shapes("paper", args.tp)
    results = {"correctness": [], "timing": []}
    failed = set()

    # 1. correctness
    print("\n## correctness (bf16 out; rel = max abs error / max |reference|)")
    print(f"{'shape':34s} {'recipe':6s} {'candidate':30s} {'max abs err':>11s} {'rel':>9s} {'rel vs _scaled_mm':>17s}")
    for si, s in enumerate(shapes):
        for recipe in ("row", "tensor"):
            a, b, sa, sb = operands(s.M, s.N, s.K, recipe, 1 + si, dev)
            ref = (a.float() @ b.float()) * sa * sb
            vendor = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
            for name, fn in candidates(recipe, configs).items():
                dog.beat(f"check {s.label} {recipe} {name}")
                try:
                    ok, err, rel, rel_v = check(name, fn, a, b, sa, sb, ref, vendor)
                except Exception as e:  # noqa: BLE001 -- reported, the candidate is not timed
                    ok, err, rel, rel_v = False, float("nan"), float("nan"), float("nan")
                    print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                if not ok:
                    failed.add((s.label, recipe, name))
                results["correctness"].append(dict(shape=s.label, recipe=recipe, candidate=name, ok=ok, err=err,
                                                   rel=rel, rel_vendor=rel_v))
                print(f"{s.label[:34]:34s} {recipe:6s} {name[:30]:30s} {err:11.4g} {rel:9.2e} {rel_v:17.2e}"
                      f"{'' if ok else '  FAIL'}", flush=True)
            del a, b, ref, vendor
    print(f"correctness: {'all passed' if not failed else f'{len(failed)} FAILED'} ({time.time() - t_start:.0f} s)")

    # 2. timing
    rows = []
    for si, s in enumerate(shapes):
        a16 = torch.randn((s.M, s.K), device=dev, dtype=torch.bfloat16)
        b16 = torch.randn((s.K, s.N), device=dev, dtype=torch.bfloat16)
        out16 = torch.empty((s.M, s.N), device=dev, dtype=torch.bfloat16)
        for recipe in ("row", "tensor"):
            a, b, sa, sb = operands(s.M, s.N, s.K, recipe, 100 + si, dev)
            out = torch.empty((s.M, s.N), device=dev, dtype=torch.bfloat16)
            cands = candidates(recipe, configs if recipe == "row" else [DEFAULT])
            timers = {}
            for name, fn in cands.items():
                if (s.label, recipe, name) in failed:
                    continue
                dog.beat(f"capture {s.label} {recipe} {name}")
                timers[name] = graph_timer(lambda fn=fn: fn(a, b, sa, sb, out))
            if recipe == "row":
                timers["bf16 core (matmul)"] = graph_timer(lambda: G.matmul(a16, b16, out=out16))
            best = {}
            for r in range(args.rounds):
                if r and time.time() - t_start > args.budget:
                    break
                order = list(timers) if r % 2 == 0 else list(reversed(timers))
                for name in order:
                    dog.beat(f"time {s.label} {recipe} {name}")
                    t = timers[name]()
                    best[name] = min(best.get(name, float("inf")), t)
            rows.append((s, recipe, best))
            results["timing"].append(dict(shape=s.label, M=s.M, N=s.N, K=s.K, recipe=recipe, us=best))
            del timers
            torch.cuda.empty_cache()
        print(f"timed {s.label} ({time.time() - t_start:.0f} s)", flush=True)

    # 3. one compact table
    names = ["torch._scaled_mm"] + [f"gluon {c}" for c in configs] + ["tl fp8 core", "bf16 core (matmul)"]
    short = {"torch._scaled_mm": "_scaled_mm", "tl fp8 core": "tl fp8", "bf16 core (matmul)": "bf16"}
    print("\n## us per call; (x) = _scaled_mm time / this time (fp8 goal >= 0.95x); bf16/best = bf16 time / best "
          "Gluon fp8 time (goal >= 1.6x)")
    print("| shape | M x N x K | recipe | " + " | ".join(short.get(n, n.replace("gluon ", "G ")) for n in names)
          + " | best gluon vs _scaled_mm | bf16 / best gluon |")
    print("|" + " --- |" * (len(names) + 5))
    geo = {}
    for s, recipe, best in rows:
        base = best.get("torch._scaled_mm")
        cells = []
        for n in names:
            t = best.get(n)
            if t is None:
                cells.append("-")
                continue
            ratio = base / t if base else float("nan")
            cells.append(f"{t:.1f}" + (f" ({ratio:.2f}x)" if n != "torch._scaled_mm" and n != "bf16 core (matmul)"
                                      else ""))
            if n != "bf16 core (matmul)":
                geo.setdefault((recipe, n), []).append(ratio)
        g_best = min((best[n] for n in best if n.startswith("gluon ")), default=None)
        vs = f"{base / g_best:.2f}x" if (g_best and base) else "-"
        b16 = best.get("bf16 core (matmul)")
        vs16 = f"{b16 / g_best:.2f}x" if (g_best and b16) else "-"
        if g_best and base:
            geo.setdefault((recipe, "best gluon"), []).append(base / g_best)
        if g_best and b16:
            geo.setdefault((recipe, "bf16/best"), []).append(b16 / g_best)
        print(f"| {s.label} | {s.M}x{s.N}x{s.K} | {recipe} | " + " | ".join(cells) + f" | {vs} | {vs16} |")
    print("\n## geomeans (ratio _scaled_mm time / candidate time; bf16/best: bf16 time / best Gluon fp8)")
    for (recipe, n), v in sorted(geo.items()):
        v = [x for x in v if x == x]
        if v:
            print(f"{recipe:6s} {n:32s} {math.exp(sum(map(math.log, v)) / len(v)):.3f}x  (worst {min(v):.2f}x, "
                  f"{len(v)} shapes)")
    print(f"\ncorrectness: {'all passed' if not failed else 'FAILED: ' + str(sorted(failed))}; "
          f"total {time.time() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
