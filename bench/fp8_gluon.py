"""Issue 55: the fp8 Gluon core (kernels/gemm_hopper.py ``scaled_matmul_hopper``) on ONE H100, checked and
timed side by side with torch._scaled_mm in the same process (bench/fp8_gluon.sh runs it; < 5 minutes).

1. Correctness, per recipe (``--recipes``, default all three: rowwise ``scale_a [M, 1]`` / ``scale_b [1, N]``,
   per-tensor scalars, DeepSeek-V3 blockwise ``scale_a [M, K/128]`` (1 x 128 groups) / ``scale_b [K/128,
   N/128]`` (128 x 128 blocks)) and per-rank paper shape (TP=8, ``ditron.bench.gemm_shapes``): fresh random
   e4m3 operands (randn quantised per row / per tensor / per group to the whole e4m3 range: never zeros),
   ``b = w.t()`` column-major, bf16 output poisoned with NaN first.  Every Gluon config and the tl fp8 core
   are compared on 512 sampled rows (the whole output checked finite) with the float32 reference
   ``(a.float() @ b.float()) * sa * sb`` (blockwise: ``sum_g (a_g @ b_g) * sa[:, g] * sb[g, n // 128]``) and
   with torch._scaled_mm (blockwise: where the installed torch runs it -- torch 2.11 refused every layout;
   the layouts tried are printed): max abs error and max error relative to the largest |reference| (pass:
   <= 1e-2 relative, finite).  A failing candidate is not timed and fails the run (exit 1) -- except
   torch._scaled_mm itself: where the vendor baseline is wrong (torch 2.11's blockwise _scaled_mm at K not a
   multiple of 128, bench/results/h100-2026-12-07d-fp8-block) the line says "vendor baseline wrong at this shape
   (excluded from the geomean)", it is not timed there and the exit status is ditron's alone.  Blockwise also
   reports, for every Gluon config, how many output elements differ from its tl twin's (``twin_config``: same
   tiles and K order; the design says 0 -- for the overlapped consumer as for the serial one -- and a difference
   fails the run).
2. Timing (rowwise: every candidate; per-tensor: the default Gluon config, the tl core and _scaled_mm): CUDA-graph
   replays of 5 calls, median of up to 10 replays (``bench/gemm_core_levers.py``'s timer and convention: same
   buffers every call, no L2 flush), ``--rounds`` rounds in alternating order, best kept.  Candidates:
   torch._scaled_mm (cuBLASLt per-tensor; CUTLASS rowwise in torch), the Gluon fp8 core (configs below), the tl
   fp8 core (``ditron.kernels.gemm.matmul``, its default ``fp8_config``) and ditron's bf16 core on the same
   shape (``ditron.kernels.gemm.matmul`` on bf16 operands: the H100 table's choice, the Gluon bf16 core).
   Table: us per call and ratio _scaled_mm time / candidate time (goal for the Gluon fp8 core >= 0.95x) and
   bf16 time / best Gluon fp8 time (goal >= 1.6x); geomeans last.  Blockwise (``--block-configs``: the
   default -- the overlapped consumer --, coop s4, pingpong s6 / s4 and the serial consumer "coop 128x128x128 s6
   serial") has its own table beside the tl fp8 core's blockwise, torch._scaled_mm (where it ran and was right)
   and the bf16 core: best Gluon vs tl fp8, vs _scaled_mm (goal >= 0.95x) and bf16 / best Gluon (goal >= 1.6x).

    python bench/fp8_gluon.py [--tp 8] [--rounds 2] [--configs "coop 128x128x128 s6,pingpong 64x128x128 s4"]
                              [--recipes row,tensor,block] [--block-configs "coop 128x128x128 s6"]
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

#: the Gluon fp8 configs timed (128 x 256 tiles do not fit: the fp32 promotion keeps a second accumulator -- a
#: third with the overlapped blockwise consumer --, so each consumer warpgroup holds at most 64 x 128 --
#: HopperGemmConfig.validate says so).  Blockwise, ``block_overlap`` (the default) is the overlapped consumer (step
#: k + 1's wgmma in flight while step k is promoted); "serial" is the first one (each step's wgmma waited for,
#: then promoted) -- the same bits, by design and by the twin check below.
CONFIGS = {
    "coop 128x128x128 s6": HC(128, 128, 128, stages=6, mode="coop"),          # the default (fp8_default_config)
    "coop 128x128x128 s4": HC(128, 128, 128, stages=4, mode="coop"),
    "coop 128x128x128 s6 g16": HC(128, 128, 128, stages=6, mode="coop", group_m=16),
    "pingpong 64x128x128 s6": HC(64, 128, 128, stages=6, mode="pingpong"),
    "pingpong 64x128x128 s4": HC(64, 128, 128, stages=4, mode="pingpong"),
    "coop 128x128x128 s6 serial": HC(128, 128, 128, stages=6, mode="coop", block_overlap=False),
    "pingpong 64x128x128 s4 serial": HC(64, 128, 128, stages=4, mode="pingpong", block_overlap=False),
    # per-tensor / rowwise with the serial promotion (``promote_overlap=False``; the overlapped one is the default):
    # the default is checked bit for bit against it (the same fp32 adds in the same K order)
    "coop 128x128x128 s6 pserial": HC(128, 128, 128, stages=6, mode="coop", promote_overlap=False),
    "coop 128x128x128 s4 pserial": HC(128, 128, 128, stages=4, mode="coop", promote_overlap=False),
}
DEFAULT = "coop 128x128x128 s6"
BLOCK_CONFIGS = ("coop 128x128x128 s6,coop 128x128x128 s4,pingpong 64x128x128 s6,pingpong 64x128x128 s4,"
                 "coop 128x128x128 s6 serial")
ROW_CONFIGS = ",".join(n for n in CONFIGS if not n.endswith(" serial"))    # block_overlap is blockwise only


def tensor_configs(configs):
    """Per-tensor scales time the default and its ``pserial`` variant where ``--configs`` names them."""
    return [c for c in configs if c in (DEFAULT, DEFAULT + " pserial")] or [DEFAULT]
RECIPES = ("row", "tensor", "block")
GROUP = 128                     # DeepSeek-V3: 1 x 128 groups of a, 128 x 128 blocks of b


def operands(M, N, K, recipe, seed, dev):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn((M, K), generator=g, device=dev)
    w = torch.randn((N, K), generator=g, device=dev)
    top = torch.finfo(E4).max
    if recipe == "block":
        nk, nn = -(-K // GROUP), -(-N // GROUP)
        xp = torch.nn.functional.pad(x, (0, nk * GROUP - K)).reshape(M, nk, GROUP)
        sa = (xp.abs().amax(2) / top).clamp(min=1e-12)                                  # [M, K/128]
        a = (xp / sa[:, :, None]).reshape(M, nk * GROUP)[:, :K].to(E4)
        wp = torch.nn.functional.pad(w, (0, nk * GROUP - K, 0, nn * GROUP - N)).reshape(nn, GROUP, nk, GROUP)
        sw = (wp.abs().amax((1, 3)) / top).clamp(min=1e-12)                             # [N/128, K/128]
        wq = (wp / sw[:, None, :, None]).reshape(nn * GROUP, nk * GROUP)[:N, :K].to(E4)
        return a, wq.t(), sa.float(), sw.t().float()                                    # sb [K/128, N/128]
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


def block_reference(a, b, sa, sb, rows):
    """float32 reference of the blockwise recipe on ``rows`` of the output: ``sum_g (a[rows, g] @ b[g]) *
    sa[rows, g] * sb[g, n // 128]``."""
    K, N = b.shape
    ref = torch.zeros((rows.numel(), N), dtype=torch.float32, device=a.device)
    ar = a[rows].float()
    for g in range(sa.shape[1]):
        k0, k1 = g * GROUP, min(K, (g + 1) * GROUP)
        part = ar[:, k0:k1] @ b[k0:k1].float()
        ref += part * sa[rows, g][:, None] * sb[g].repeat_interleave(GROUP)[:N][None, :]
    return ref


#: torch._scaled_mm's blockwise call, where the installed torch runs it: (layout name, fn) or the refusals
BLOCK_VENDOR = {}


def block_vendor(a, b, sa, sb, ref, rows):
    """torch._scaled_mm on blockwise scales: the scale layouts tried (DeepSeek's as given, and the
    outer-dim-major ones cuBLASLt's 1x128 / 128x128 modes document), the first that runs and matches ``ref``."""
    if "fn" in BLOCK_VENDOR or "refused" in BLOCK_VENDOR:
        return BLOCK_VENDOR.get("fn")
    layouts = {
        "as given": lambda sa, sb: (sa, sb),
        "scale_a col-major": lambda sa, sb: (sa.t().contiguous().t(), sb),
        "both col-major": lambda sa, sb: (sa.t().contiguous().t(), sb.t().contiguous().t()),
        "scale_b col-major": lambda sa, sb: (sa, sb.t().contiguous().t()),
    }
    refused = []
    for name, lay in layouts.items():
        try:
            xa, xb = lay(sa, sb)
            got = torch._scaled_mm(a, b, scale_a=xa, scale_b=xb, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
            if got is None:
                raise RuntimeError("returned None")
            rel = (got[rows].float() - ref).abs().max().item() / ref.abs().max().item()
            if not rel <= 1e-2:
                raise RuntimeError(f"wrong result (rel error {rel:.3g})")
        except Exception as e:  # noqa: BLE001 -- reported
            refused.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            continue
        memo = {}

        def vendor(a, b, sa, sb, out, lay=lay, memo=memo):
            # the scales in the layout torch takes, converted once per scale pair (outside the timed graph:
            # graph_timer's warm-up calls come first)
            src = memo.get("src")
            if src is None or src[0] is not sa or src[1] is not sb:
                memo.clear()
                memo["src"], memo["scales"] = (sa, sb), lay(sa, sb)
            xa, xb = memo["scales"]
            return torch._scaled_mm(a, b, scale_a=xa, scale_b=xb, out_dtype=torch.bfloat16)
        BLOCK_VENDOR["fn"] = vendor
        print(f"  torch._scaled_mm blockwise runs with scales {name}")
        return BLOCK_VENDOR["fn"]
    BLOCK_VENDOR["refused"] = refused
    print("  torch._scaled_mm blockwise did not run (not a baseline here):\n    " + "\n    ".join(refused))
    return None


def candidates(recipe, configs):
    if recipe == "block":
        c = {"torch._scaled_mm": BLOCK_VENDOR["fn"]} if "fn" in BLOCK_VENDOR else {}
    else:
        c = {"torch._scaled_mm": lambda a, b, sa, sb, out: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                                                              out_dtype=torch.bfloat16)}
    for name in configs:
        cfg = CONFIGS[name]
        c[f"gluon {name}"] = (lambda cfg: lambda a, b, sa, sb, out: H.scaled_matmul_hopper(
            a, b, sa, sb, torch.bfloat16, out=out, config=cfg))(cfg)
    c["tl fp8 core"] = lambda a, b, sa, sb, out: G.matmul(a, b, out=out, scale_a=sa, scale_b=sb,
                                                          out_dtype=torch.bfloat16)
    return c


def check(name, fn, a, b, sa, sb, ref, vendor, rows):
    """``rows``: the output rows ``ref`` (and ``vendor``) hold; returns (ok, err, rel, rel vs vendor, output)."""
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.bfloat16, device=ref.device)
    got = fn(a, b, sa, sb, out)
    torch.cuda.synchronize()
    finite = bool(torch.isfinite(got.float()).all().item())
    part = got[rows]
    top = ref.abs().max().item()
    err = (part.float() - ref).abs().max().item()
    err_v = (part.float() - vendor.float()).abs().max().item() if vendor is not None else float("nan")
    ok = finite and err <= 1e-2 * top
    return ok, err, err / top, err_v / top, got


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--configs", default=ROW_CONFIGS)
    p.add_argument("--recipes", default=",".join(RECIPES), help="row, tensor, block")
    p.add_argument("--block-configs", default=BLOCK_CONFIGS, help="the Gluon configs checked and timed blockwise")
    p.add_argument("--budget", type=float, default=240.0, help="seconds: later rounds are skipped past it")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    block_configs = [c.strip() for c in args.block_configs.split(",") if c.strip()]
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    for name in configs + block_configs:
        if name not in CONFIGS:
            p.error(f"config {name!r}: use one of {', '.join(CONFIGS)}")
    for r in recipes:
        if r not in RECIPES:
            p.error(f"recipe {r!r}: use one of {', '.join(RECIPES)}")
    dev = torch.device("cuda")
    t_start = time.time()
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton "
          f"{__import__('triton').__version__}, TP={args.tp}")
    dog = Watchdog(120, lambda what: print(f"hung in {what}", flush=True))
    shapes = gemm_core_shapes("paper", args.tp)
    results = {"correctness": [], "timing": []}
    failed = set()          # ditron's failures: the exit status
    vendor_wrong = set()    # (shape, recipe) where torch._scaled_mm itself is wrong: not a baseline there

    # 1. correctness
    print("\n## correctness (bf16 out; rel = max abs error / max |reference|)")
    print(f"{'shape':34s} {'recipe':6s} {'candidate':30s} {'max abs err':>11s} {'rel':>9s} {'rel vs _scaled_mm':>17s}")
    for si, s in enumerate(shapes):
        for recipe in recipes:
            a, b, sa, sb = operands(s.M, s.N, s.K, recipe, 1 + si, dev)
            # the float32 reference on 512 sampled rows (a full float32 GEMM per shape and recipe would take
            # minutes); every candidate's whole output is checked finite (it starts as NaN)
            gen = torch.Generator(device=dev).manual_seed(7 + si)
            rows = torch.cat([torch.randperm(s.M, generator=gen, device=dev)[:510],
                              torch.tensor([0, s.M - 1], device=dev)])
            if recipe == "block":
                ref = block_reference(a, b, sa, sb, rows)
                vfn = block_vendor(a, b, sa, sb, ref, rows)
                vendor = vfn(a, b, sa, sb, None)[rows] if vfn else None
            else:
                ref = (a[rows].float() @ b.float()) * (sa[rows] if sa.dim() == 2 else sa) * sb
                vendor = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)[rows]
            twins = {}              # the tl twins' outputs of this shape, per twin config
            outs = {}               # per-tensor / rowwise Gluon outputs: the ``pserial`` configs' bitwise check
            recipe_configs = {"row": configs, "tensor": tensor_configs(configs), "block": block_configs}[recipe]
            for name, fn in candidates(recipe, recipe_configs).items():
                dog.beat(f"check {s.label} {recipe} {name}")
                got = None
                try:
                    ok, err, rel, rel_v, got = check(name, fn, a, b, sa, sb, ref, vendor, rows)
                except Exception as e:  # noqa: BLE001 -- reported, the candidate is not timed
                    ok, err, rel, rel_v = False, float("nan"), float("nan"), float("nan")
                    print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                note = ""
                if not ok and name == "torch._scaled_mm":
                    # the vendor baseline is wrong here (torch._scaled_mm blockwise with K not a multiple of 128,
                    # seen with torch 2.11 / cuBLASLt): not ditron's failure, and no baseline at this shape
                    vendor_wrong.add((s.label, recipe))
                    vendor = None
                    note = "  vendor baseline wrong at this shape (excluded from the geomean)"
                elif not ok:
                    failed.add((s.label, recipe, name))
                    note = "  FAIL"
                results["correctness"].append(dict(shape=s.label, recipe=recipe, candidate=name, ok=ok, err=err,
                                                   rel=rel, rel_vendor=rel_v, vendor_wrong=bool(
                                                       name == "torch._scaled_mm" and not ok)))
                print(f"{s.label[:34]:34s} {recipe:6s} {name[:30]:30s} {err:11.4g} {rel:9.2e} {rel_v:17.2e}{note}",
                      flush=True)
                if recipe != "block" and name.startswith("gluon ") and got is not None:
                    outs[name] = got
                    base = name[:-len(" pserial")] if name.endswith(" pserial") else None
                    if base in outs:
                        differ = int((outs[base].view(torch.int16) != got.view(torch.int16)).sum().item())
                        if differ:
                            failed.add((s.label, recipe, f"{name} vs {base}"))
                        results["correctness"].append(dict(shape=s.label, recipe=recipe,
                                                           candidate=f"{base} vs pserial bits", differ=differ))
                        print(f"{s.label[:34]:34s} {recipe:6s} {'overlapped vs serial':30s} {differ} of {got.numel()} "
                              f"elements differ (bitwise){'  FAIL' if differ else ''}", flush=True)
                    got = None
                if recipe == "block" and name.startswith("gluon ") and got is not None:
                    # the tl twin of the config (twin_config: the same tiles and K order): bit for bit by design,
                    # the overlapped blockwise consumer as the serial one (the same fp32 operations, same order)
                    cfg = CONFIGS[name[len("gluon "):]]
                    tcfg = H.twin_config(cfg)
                    dog.beat(f"twin {s.label} {name}")
                    if tcfg not in twins:
                        twins[tcfg] = G.matmul(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, core="tl",
                                               config=tcfg)
                        torch.cuda.synchronize()
                    differ = int((twins[tcfg].view(torch.int16) != got.view(torch.int16)).sum().item())
                    if differ:
                        failed.add((s.label, recipe, f"{name} vs tl twin"))
                    results["correctness"].append(dict(shape=s.label, recipe=recipe, candidate=f"{name} tl twin bits",
                                                       differ=differ))
                    label = f"{name[len('gluon '):]} vs tl twin"
                    print(f"{s.label[:34]:34s} {recipe:6s} {label[:30]:30s} {differ} of {got.numel()} elements "
                          f"differ (bitwise){'  FAIL' if differ else ''}", flush=True)
                del got
            del twins, outs
            del a, b, ref, vendor
    print(f"correctness: {'all passed' if not failed else f'{len(failed)} FAILED'}"
          + (f"; torch._scaled_mm wrong at {len(vendor_wrong)} shape(s), not timed there" if vendor_wrong else "")
          + f" ({time.time() - t_start:.0f} s)")

    # 2. timing
    rows = []
    for si, s in enumerate(shapes):
        a16 = torch.randn((s.M, s.K), device=dev, dtype=torch.bfloat16)
        b16 = torch.randn((s.K, s.N), device=dev, dtype=torch.bfloat16)
        out16 = torch.empty((s.M, s.N), device=dev, dtype=torch.bfloat16)
        for ri, recipe in enumerate(recipes):
            a, b, sa, sb = operands(s.M, s.N, s.K, recipe, 100 + si, dev)
            out = torch.empty((s.M, s.N), device=dev, dtype=torch.bfloat16)
            cands = candidates(recipe, {"row": configs, "tensor": tensor_configs(configs),
                                        "block": block_configs}[recipe])
            timers = {}
            for name, fn in cands.items():
                if (s.label, recipe, name) in failed or (name == "torch._scaled_mm" and (s.label, recipe)
                                                                         in vendor_wrong):
                    continue
                dog.beat(f"capture {s.label} {recipe} {name}")
                timers[name] = graph_timer(lambda fn=fn: fn(a, b, sa, sb, out))
            if ri == 0:                     # the bf16 core once per shape, with the first recipe
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

    # 3. compact tables: per-tensor / rowwise against torch._scaled_mm, blockwise against the tl fp8 core
    bf16 = {s.label: best["bf16 core (matmul)"] for s, _, best in rows if "bf16 core (matmul)" in best}
    for s, _, best in rows:
        if s.label in bf16:
            best["bf16 core (matmul)"] = bf16[s.label]
    names = ["torch._scaled_mm"] + [f"gluon {c}" for c in configs] + ["tl fp8 core", "bf16 core (matmul)"]
    short = {"torch._scaled_mm": "_scaled_mm", "tl fp8 core": "tl fp8", "bf16 core (matmul)": "bf16"}
    geo = {}
    if any(r != "block" for r in recipes):
        print("\n## us per call; (x) = _scaled_mm time / this time (fp8 goal >= 0.95x); bf16/best = bf16 time / "
              "best Gluon fp8 time (goal >= 1.6x)")
        print("| shape | M x N x K | recipe | " + " | ".join(short.get(n, n.replace("gluon ", "G ")) for n in names)
              + " | best gluon vs _scaled_mm | bf16 / best gluon |")
        print("|" + " --- |" * (len(names) + 5))
    for s, recipe, best in rows:
        if recipe == "block":
            continue
        base = best.get("torch._scaled_mm")
        cells = []
        for n in names:
            t = best.get(n)
            if t is None:
                cells.append("wrong" if n == "torch._scaled_mm" and (s.label, recipe) in vendor_wrong else "-")
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
    if "block" in recipes:
        bnames = [f"gluon {c}" for c in block_configs] + ["tl fp8 core", "torch._scaled_mm", "bf16 core (matmul)"]
        print("\n## blockwise (1 x 128 / 128 x 128 scales): us per call; (x) = tl fp8 core time / this time; "
              "vs _scaled_mm = _scaled_mm time / best Gluon fp8 time (goal >= 0.95x; '-' where it did not run or was "
              "wrong); bf16/best = bf16 time / best Gluon fp8 time (goal >= 1.6x)"
              + ("" if "fn" in BLOCK_VENDOR else "; torch._scaled_mm blockwise did not run here"))
        print("| shape | M x N x K | " + " | ".join(short.get(n, n.replace("gluon ", "G ")) for n in bnames)
              + " | best gluon vs tl fp8 | best gluon vs _scaled_mm | bf16 / best gluon |")
        print("|" + " --- |" * (len(bnames) + 5))
        for s, recipe, best in rows:
            if recipe != "block":
                continue
            base = best.get("tl fp8 core")
            vend = best.get("torch._scaled_mm")
            cells = []
            for n in bnames:
                t = best.get(n)
                if t is None:
                    cells.append("wrong" if n == "torch._scaled_mm" and (s.label, recipe) in vendor_wrong else "-")
                    continue
                ratio = base / t if base else float("nan")
                cells.append(f"{t:.1f}" + (f" ({ratio:.2f}x)" if n.startswith("gluon ") or n == "torch._scaled_mm"
                                          else ""))
                if n.startswith("gluon ") or n == "torch._scaled_mm":
                    geo.setdefault(("block", f"{n} vs tl fp8"), []).append(ratio)
                if n.startswith("gluon ") and vend:
                    geo.setdefault(("block", f"{n} vs _scaled_mm"), []).append(vend / t)
            g_best = min((best[n] for n in best if n.startswith("gluon ")), default=None)
            vs = f"{base / g_best:.2f}x" if (g_best and base) else "-"
            vsv = f"{vend / g_best:.2f}x" if (g_best and vend) else "-"
            b16 = best.get("bf16 core (matmul)")
            vs16 = f"{b16 / g_best:.2f}x" if (g_best and b16) else "-"
            if g_best and base:
                geo.setdefault(("block", "best gluon vs tl fp8"), []).append(base / g_best)
            if g_best and vend:
                geo.setdefault(("block", "best gluon vs _scaled_mm"), []).append(vend / g_best)
            if g_best and b16:
                geo.setdefault(("block", "bf16/best"), []).append(b16 / g_best)
            print(f"| {s.label} | {s.M}x{s.N}x{s.K} | " + " | ".join(cells) + f" | {vs} | {vsv} | {vs16} |")
    print("\n## geomeans (ratio _scaled_mm time / candidate time -- blockwise: tl fp8 core time / candidate time; "
          "bf16/best: bf16 time / best Gluon fp8)")
    for (recipe, n), v in sorted(geo.items()):
        v = [x for x in v if x == x]
        if v:
            print(f"{recipe:6s} {n:44s} {math.exp(sum(map(math.log, v)) / len(v)):.3f}x  (worst {min(v):.2f}x, "
                  f"{len(v)} shapes)")
    if vendor_wrong:
        print(f"\nvendor baseline wrong (torch._scaled_mm against the float32 reference; not ditron's failure, "
              f"excluded from the geomeans): {sorted(vendor_wrong)}")
        results["scaled_mm_wrong"] = sorted(vendor_wrong)
    print(f"\ncorrectness (ditron): {'all passed' if not failed else 'FAILED: ' + str(sorted(failed))}; "
          f"total {time.time() - t_start:.0f} s")
    if "refused" in BLOCK_VENDOR:
        results["scaled_mm_blockwise_refused"] = BLOCK_VENDOR["refused"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
