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


#: fp8 recipes of ``ditron bench gemm --dtype fp8`` (``--recipe``)
FP8_RECIPES = ("tensor", "row", "block")


def _fp8_operands(inp, shape, recipe):
    """Seeded fp8 operands of one shape: ``a [M, K]`` e4m3, ``b [K, N]`` e4m3 column-major (``w.t()``, as
    torch._scaled_mm takes it), their scales for ``recipe`` and the dequantised bf16 operands (the bf16
    GEMMs of the same run multiply those)."""
    return quantise_fp8(inp.rand((shape.M, shape.K), 0, 0), inp.rand((shape.N, shape.K), 0, 1), recipe)


def quantise_fp8(x, w, recipe):
    """e4m3 operands of ``x [M, K] @ w[N, K].t()`` (float32) for ``recipe`` (``tensor``, ``row``, ``block``):
    ``(a [M, K], b [K, N] column-major (w.t()), scale_a, scale_b, a_deq, b_deq)`` -- the decode scales in
    kernels/scaling.py's shapes and the dequantised operands (float32)."""
    a, sa, a_deq = quantise_rows(x, recipe, 1)
    wq, sw, w_deq = quantise_rows(w, recipe, 128)
    return a, wq.t(), sa, sw.t(), a_deq, w_deq.t()


def quantise_rows(t, recipe, gm=1):
    """e4m3 quantisation of a float32 ``t [R, C]`` whose rows are the GEMM's rows (an activation, ``gm=1``) or
    its columns (a weight ``w [N, K]``, ``gm=128``): ``(q, decode scales, q * scales in float32)``; the scales are
    one element (``tensor``), ``[R, 1]`` (``row``) or one per ``gm x 128`` block, ``[cdiv(R, gm), cdiv(C, 128)]``
    (``block``)."""
    import torch
    E4 = torch.float8_e4m3fn
    top = torch.finfo(E4).max
    if recipe == "block":       # t [R, C] -> scales [cdiv(R, gm), cdiv(C, 128)] over gm x 128 blocks
        R, C = t.shape
        tp = torch.nn.functional.pad(t, (0, -C % 128, 0, -R % gm))
        s = tp.reshape(tp.shape[0] // gm, gm, -1, 128).abs().amax(dim=(1, 3)) / top
        s = s.clamp(min=1e-12)
        full = s.repeat_interleave(gm, 0).repeat_interleave(128, 1)[:R, :C]
        q = (t / full).to(E4)
        return q, s.float(), q.float() * full
    if recipe == "tensor":
        s = (t.abs().max() / top).float().reshape(())
    else:
        s = (t.abs().amax(dim=1, keepdim=True) / top).float()
    q = (t / s).to(E4)
    return q, s, q.float() * s


def _vendor_fp8(a, b, sa, sb, recipe, out, ref=None):
    """The vendor's fp8 GEMM: torch._scaled_mm (cuBLASLt; per-tensor and rowwise scales), or for blockwise
    scales :func:`vendor_blockwise`."""
    import torch
    if recipe != "block":
        return lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out.dtype, out=out)
    return vendor_blockwise(a, b, sa, sb, out, ref)


def blockwise_scale_layouts(sa, sb):
    """torch's blockwise scale layouts for ``a [M, K]`` with 1 x 128 scales and ``b [K, N]`` with 128 x 128
    ones, from ``sa [M, K/128]`` and ``sb [K/128, N/128]`` (kernels/scaling.py's layouts).  As torch's CUDA
    checks name them (aten/src/ATen/native/cuda/ScaledBlas.cpp, ``_scaled_block1x128_block128x128`` and
    ``is_blockwise_1x128_scaling`` / ``is_blockwise_128x128_scaling``): ``scale_a [M, K/128]`` with strides
    ``(1, M)`` (outer-dim-major); ``scale_b [round_up(K/128, 4), N/128]`` with strides ``(1, round_up(K/128,
    4))`` (torch >= 2.10: the K groups padded to a multiple of 4), or unpadded ``[K/128, N/128]`` with strides
    ``(1, K/128)`` (earlier versions).  Returns ``[(name, scale_a, scale_b)]``."""
    import torch
    kg, ng = sb.shape
    sa_t = sa.t().contiguous().t()
    kp = -(-kg // 4) * 4
    pad = torch.ones((ng, kp), dtype=sb.dtype, device=sb.device)
    pad[:, :kg] = sb.t()
    out = [("scale_b [round_up(K/128, 4), N/128] K-major", sa_t, pad.t())]
    if kp != kg:
        out.append(("scale_b [K/128, N/128] K-major (unpadded)", sa_t, sb.t().contiguous().t()))
    else:
        out.append(("scale_b [K/128, N/128] N-major", sa_t, sb.contiguous()))
    return out


def vendor_blockwise(a, b, sa, sb, out, ref=None):
    """torch's blockwise fp8 GEMM (DeepSeek's 1 x 128 / 128 x 128 scales, cuBLASLt >= 12.9 on sm_90) as a
    ``run()`` writing ``out``: ``torch._scaled_mm`` (it picks the blockwise kernel from the scales' shapes and
    strides) or ``torch.nn.functional.scaled_mm`` with ``ScalingType.BlockWise1x128`` / ``BlockWise128x128``,
    with the scale layouts of :func:`blockwise_scale_layouts`; the first that runs and matches ``ref()``
    (within 5% of its largest element; an fp32 product of the dequantised operands) is it.  None: a
    ``RuntimeError`` that starts ``baseline unavailable: not available in this torch`` and gives each try's
    reason (a refusal, a wrong result, or a call that returned None -- torch 2.11's ``F.scaled_mm``)."""
    import torch
    F = torch.nn.functional
    T = getattr(F, "ScalingType", None)
    tries = []
    for lname, sa_t, sb_t in blockwise_scale_layouts(sa, sb):
        def v1(sa_t=sa_t, sb_t=sb_t):
            return torch._scaled_mm(a, b, scale_a=sa_t, scale_b=sb_t, out_dtype=out.dtype, out=out)
        tries.append((f"torch._scaled_mm, {lname}", v1))
        if hasattr(F, "scaled_mm") and hasattr(T, "BlockWise1x128"):
            def v2(sa_t=sa_t, sb_t=sb_t):
                r = F.scaled_mm(a, b, sa_t, T.BlockWise1x128, sb_t, T.BlockWise128x128, output_dtype=out.dtype)
                if r is None:
                    raise RuntimeError("torch.nn.functional.scaled_mm returned None")
                return out.copy_(r)
            tries.append((f"F.scaled_mm, {lname}", v2))
    errors = []
    for name, run in tries:
        try:
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize(out.device) if out.is_cuda else None
            if ref is not None:
                want = ref()
                err = (out.float() - want).abs().max().item()
                if not err <= 0.05 * want.abs().max().item():
                    errors.append(f"{name}: off by {err:.3g}")
                    continue
            return run
        except Exception as e:  # noqa: BLE001 -- try the next form
            errors.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    raise RuntimeError(f"baseline unavailable: not available in this torch ({torch.__version__}): "
                       + "; ".join(errors))


def fp8_impls(shape: Shape, device, configs, recipe, seed=0):
    """``ditron bench gemm --dtype fp8``: the fp8 core against the vendor's fp8 GEMM (``cublas``:
    torch._scaled_mm) and ditron's and cuBLAS's bf16 GEMMs of the same (dequantised) operands, all checked
    against the float32 product of the dequantised operands."""
    import torch
    gemm_mod = importlib.import_module("ditron.kernels.gemm")
    inp = Inputs(device, torch.float32, seed)
    a, b, sa, sb, a_deq, b_deq = _fp8_operands(inp, shape, recipe)
    a16, b16 = a_deq.to(torch.bfloat16), b_deq.to(torch.bfloat16)
    b16_rm = b16.contiguous()                # the bf16 core's fast layout (row-major [K, N])
    check_close = make_check(inp.ref("out", lambda: a_deq @ b_deq), tolerance(torch.bfloat16, shape.K))
    out = torch.full((shape.M, shape.N), float("nan"), dtype=torch.bfloat16, device=device)

    def check(res):
        try:
            check_close(res)
        finally:
            out.fill_(float("nan"))
    try:
        default = config_label(dataclasses.asdict(gemm_mod.default_config(shape.M, shape.N, shape.K, a.dtype, device)))
    except Exception:  # noqa: BLE001 -- only a label
        default = ""
    try:
        vendor = Impl("cublas", _vendor_fp8(a, b, sa, sb, recipe, out, inp.ref("out", lambda: a_deq @ b_deq)),
                      check, f"torch._scaled_mm ({recipe})" if recipe != "block" else "F.scaled_mm (blockwise)")
    except Exception as e:  # noqa: BLE001
        vendor = _failing("cublas", e)
    impls = [vendor,
             Impl("ditron default", lambda: gemm_mod.matmul(a, b, out=out, scale_a=sa, scale_b=sb), check,
                  f"fp8 {recipe}; " + ("the Gluon core's default on Hopper (matmul's choice), else "
                                       if recipe != "block" else "") + f"tl {default}"),
             Impl("bf16 ditron", lambda: gemm_mod.matmul(a16, b16_rm, out=out), check,
                  "ditron's bf16 core, same shape"),
             Impl("bf16 cublas", lambda: torch.matmul(a16, b16_rm, out=out), check, "torch.matmul bf16")]
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
        impls.append(Impl(label, lambda cfg=cfg: gemm_mod.matmul(a, b, out=out, config=cfg, scale_a=sa, scale_b=sb),
                          check))
    return impls, cfgs, inp


def _compile_skip(r):
    """A config that does not fit the GPU (shared memory, registers): skipped, not a failure."""
    text = (r.get("exc", "") + " " + r.get("error", "")).lower()
    if "baseline unavailable" in text:
        return True
    return "outofresources" in text.replace(" ", "") or "out of resource" in text or "shared memory" in text


def run_gemm(shapes, world, dtype, configs, *, warmup, iters, graph, repeat, seed=0, progress=True, recipe=None):
    """``recipe`` (fp8: ``dtype`` is then ``"fp8"``): the scaling recipe of the fp8 operands."""
    rows = []
    bar = Progress(len(shapes), "gemm", progress and world.rank == 0)
    agree = agree_fn(world)
    for shape in shapes:
        if dtype == "fp8":
            impls, cfgs, inp = fp8_impls(shape, world.device, configs, recipe, seed)
        else:
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
            rows.append({"model": shape.label + (f" {recipe}" if recipe else ""), "M": shape.M, "N": shape.N, "K": shape.K, "impl": impl.name,
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
    """Best ditron config per shape, and each config's geomean ratio to cuBLAS (fp8: to torch._scaled_mm,
    and the fp8 core's ratio to ditron's bf16 core: ``fp8``)."""
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
    out = {"best_per_shape": best, "configs": per_cfg, "best_overall": overall}
    by = {(r["model"], r["impl"]): r for r in rows}
    if any(k[1] == "bf16 ditron" for k in by):
        fp8 = {}
        for s in shapes:
            f, v, d = by.get((s, "ditron default")), by.get((s, "cublas")), by.get((s, "bf16 ditron"))
            fp8[s] = {"vs_scaled_mm": v["us"] / f["us"] if f and v and f["us"] and v["us"] else None,
                      "vs_ditron_bf16": d["us"] / f["us"] if f and d and f["us"] and d["us"] else None}
        out["fp8"] = fp8
        out["fp8_geomean"] = {k: geomean([x[k] for x in fp8.values() if x[k]]) for k in ("vs_scaled_mm",
                                                                                          "vs_ditron_bf16")}
    return out
