"""What sweeps configs: the GEMM core (``ditron.kernels.gemm``) against cuBLAS at local GEMM shapes
(``ditron bench gemm``), with ``--configs default|sweep|BMxBNxBK...``, and the best config per shape.
"""
from __future__ import annotations

import dataclasses
import importlib

from .gemm_run import Inputs, _failing, _log_local_failures, make_check, tolerance
from .gemm_shapes import Shape
from .harness import Impl, Progress, _release, agree_fn, geomean, measure

#: GemmConfig fields of the sweep (``--configs sweep``); the simulator uses SIM_SWEEP
SWEEP_TILES = ((128, 128, 64), (128, 256, 64), (256, 128, 64), (128, 128, 128))


SWEEP = [dict(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=w, num_stages=s, tma=t)
         for bm, bn, bk in SWEEP_TILES for s in (3, 4) for w in (4, 8) for t in (False, True)]


SIM_SWEEP = [dict(block_m=16, block_n=16, block_k=32, group_m=4, num_warps=1, num_stages=1),
             dict(block_m=32, block_n=16, block_k=16, group_m=4, num_warps=1, num_stages=1)]


def parse_configs(spec, sim):
    """``default`` | ``sweep`` | ``BMxBNxBK[:sS][:wW][:gG][:tma]`` list -> [GemmConfig fields]."""
    if spec == "default":
        return []
    if spec == "sweep":
        return [dict(c) for c in (SIM_SWEEP if sim else SWEEP)]
    out = []
    for item in [s for s in spec.split(",") if s]:
        head, *opts = item.split(":")
        try:
            bm, bn, bk = (int(v) for v in head.lower().split("x"))
        except ValueError:
            raise SystemExit(f"ditron bench gemm: cannot read the config {item!r} (e.g. 128x256x64:s3:w8:tma)")
        c = dict(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=8, num_stages=3, tma=False)
        for o in opts:
            if o == "tma":
                c["tma"] = True
            elif o[:1] in "swg" and o[1:].isdigit():
                c[{"s": "num_stages", "w": "num_warps", "g": "group_m"}[o[0]]] = int(o[1:])
            else:
                raise SystemExit(f"ditron bench gemm: unknown config option {o!r} in {item!r}")
        out.append(c)
    return out


def config_label(c: dict) -> str:
    return (f"{c['block_m']}x{c['block_n']}x{c['block_k']} s{c['num_stages']} w{c['num_warps']}"
            + (" tma" if c.get("tma") else ""))


def gemm_impls(shape: Shape, device, dtype, configs, seed=0):
    import torch
    gemm_mod = importlib.import_module("ditron.kernels.gemm")
    inp = Inputs(device, dtype, seed)
    a = inp.rand((shape.M, shape.K), 0, 0)
    b = inp.rand((shape.K, shape.N), 0, 1)
    check_close = make_check(inp.ref("out", lambda: a.float() @ b.float()), tolerance(dtype, shape.K))
    # one output for all: NaN before each implementation's check (one that writes nothing cannot pass)
    out = torch.full((shape.M, shape.N), float("nan"), dtype=dtype, device=device)

    def check(res):
        try:
            check_close(res)
        finally:
            out.fill_(float("nan"))
    try:
        # what matmul runs without a config: the GPU kind's measured table, else the default rule
        core, cfg, why = gemm_mod.resolve_config(shape.M, shape.N, shape.K, dtype, device)
        default = (cfg.label() if core == "gluon" else config_label(dataclasses.asdict(cfg))) + f" ({why})"
    except Exception:  # noqa: BLE001 -- only a label
        default = ""
    impls = [Impl("cublas", lambda: torch.matmul(a, b, out=out), check, "torch.matmul"),
             Impl("ditron default", lambda: gemm_mod.matmul(a, b, out=out), check, default)]
    cfgs = {}
    for c in configs:
        label = "ditron " + config_label(c)
        try:
            known = {f.name for f in dataclasses.fields(gemm_mod.GemmConfig)}
            cfg = gemm_mod.GemmConfig(**{k: v for k, v in c.items() if k in known})
        except Exception as e:  # noqa: BLE001
            impls.append(_failing(label, e))
            continue
        cfgs[label] = c
        impls.append(Impl(label, lambda cfg=cfg: gemm_mod.matmul(a, b, out=out, config=cfg), check))
    return impls, cfgs, inp


def _compile_skip(r):
    """A config that does not fit the GPU (shared memory, registers): skipped, not a failure."""
    text = (r.get("exc", "") + " " + r.get("error", "")).lower()
    return "outofresources" in text.replace(" ", "") or "out of resource" in text or "shared memory" in text


def run_gemm(shapes, world, dtype, configs, *, warmup, iters, graph, repeat, seed=0, progress=True):
    rows = []
    bar = Progress(len(shapes), "gemm", progress and world.rank == 0)
    agree = agree_fn(world)
    for shape in shapes:
        impls, cfgs, inp = gemm_impls(shape, world.device, dtype, configs, seed)
        res = measure(impls, world.device, warmup=warmup, iters=iters, graph=graph, barrier=None,
                      repeat=repeat, agree=agree, after_checks=inp.clear)
        _log_local_failures(world, shape, res)
        flops = 2.0 * shape.M * shape.N * shape.K
        base = res["cublas"]["us"] if res["cublas"]["ok"] else None
        for impl in impls:
            r = res[impl.name]
            status = "ok" if r["ok"] else ("skipped" if _compile_skip(r) else "FAILED")
            us = r["us"] if r["ok"] else None
            rows.append({"model": shape.label, "M": shape.M, "N": shape.N, "K": shape.K, "impl": impl.name,
                         "config": cfgs.get(impl.name), "status": status, "ok": r["ok"], "us": us,
                         "rounds_us": r["rounds_us"], "tflops": flops / (us * 1e-6) / 1e12 if us else None,
                         "vs_cublas": base / us if base and us else None, "error": r["error"],
                         "note": "; ".join(n for n in (impl.note, r["note"]) if n)})
        del impls
        _release(world.device)
        bar.step(shape.label)
    bar.close()
    return rows


def gemm_summary(rows):
    """Best ditron config per shape, and each config's geomean ratio to cuBLAS."""
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    best = {}
    for s in shapes:
        cand = [r for r in rows if r["model"] == s and r["impl"].startswith("ditron") and r["status"] == "ok"]
        if cand:
            b = min(cand, key=lambda r: r["us"])
            best[s] = {"impl": b["impl"], "config": b["config"], "us": b["us"], "tflops": b["tflops"],
                       "vs_cublas": b["vs_cublas"]}
    per_cfg = {}
    for name in dict.fromkeys(r["impl"] for r in rows if r["impl"].startswith("ditron")):
        xs = [r["vs_cublas"] for r in rows if r["impl"] == name and r["vs_cublas"]]
        per_cfg[name] = {"geomean_vs_cublas": geomean(xs), "shapes": len(xs)}
    full = [n for n, v in per_cfg.items() if v["shapes"] == len(shapes) and v["geomean_vs_cublas"]]
    overall = max(full, key=lambda n: per_cfg[n]["geomean_vs_cublas"]) if full else None
    return {"best_per_shape": best, "configs": per_cfg, "best_overall": overall}
