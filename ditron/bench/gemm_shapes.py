"""What ``ditron bench ag_gemm|gemm_rs|gemm_ar|gemm`` runs: the workloads, their shapes (the paper's, or
given) and how they split over TP ranks, and ditron's methods per op.  Pure functions (tested without GPUs).

The GEMM benchmarks, by idea (each imports only those above it in this list):

* :mod:`ditron.bench.gemm_shapes` -- what to run (this module);
* :mod:`ditron.bench.gemm_run` -- what runs one shape of an overlap op (inputs, checks, ditron and its peers);
* :mod:`ditron.bench.gemm_sweep` -- what sweeps ``GemmConfig`` for the GEMM core against cuBLAS (and the fp8
  operands, ``--dtype fp8``);
* :mod:`ditron.bench.gemm_fp8` -- what runs one shape of an overlap op on fp8 operands (``--dtype fp8``);
* :mod:`ditron.bench.gemm_report` -- what derives figures and writes tables, JSON and plots;
* :mod:`ditron.bench.gemm` -- the command line (and the names above, re-exported).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

OPS = ("ag_gemm", "gemm_rs", "gemm_ar", "gemm")


# The paper's shapes (appendix C.2, tables 1-2, and the strong-scaling tables; a copy of
# shared/bench/paper-shapes.json, which tests/test_bench_gemm.py compares against): (model, M, N, K), global.
PAPER_SHAPES = {
    "ag_gemm": [("LLaMA3-7B", 8192, 11008, 4096), ("LLaMA3.1-8B", 8192, 14336, 4096),
                ("LLaMA3.1-70B", 8192, 28672, 8192), ("LLaMA3.1-405B", 8192, 53248, 16384),
                ("Mistral-7B", 8192, 14336, 4096), ("Qwen2-72B", 8192, 29568, 8192)],
    "gemm_rs": [("LLaMA3-7B", 8192, 4096, 11008), ("LLaMA3.1-8B", 8192, 4096, 14336),
                ("LLaMA3.1-70B", 8192, 8192, 28672), ("LLaMA3.1-405B", 8192, 16384, 53248),
                ("Mistral-7B", 8192, 4096, 14336), ("Qwen2-72B", 8192, 8192, 29568)],
}


STRONG_SHAPES = {
    "ag_gemm": [("LLaMA3-7B", 32768, 11008, 4096), ("LLaMA3.1-8B", 32768, 14336, 4096),
                ("Qwen3-32B", 32768, 25600, 5120), ("Seed-OSS-36B", 32768, 27648, 5120),
                ("LLaMA3.1-70B", 32768, 28672, 8192), ("Qwen2-72B", 32768, 29568, 8192),
                ("GPT-3-175B", 32768, 49152, 12288), ("LLaMA3.1-405B", 32768, 53248, 16384)],
    "gemm_rs": [("LLaMA3-7B", 32768, 4096, 11008), ("LLaMA3.1-8B", 32768, 4096, 14336),
                ("Qwen3-32B", 32768, 5120, 25600), ("Seed-OSS-36B", 32768, 5120, 27648),
                ("LLaMA3.1-70B", 32768, 8192, 28672), ("Qwen2-72B", 32768, 8192, 29568),
                ("GPT-3-175B", 32768, 12288, 49152), ("LLaMA3.1-405B", 32768, 16384, 53248)],
}


SHAPE_SETS = {"paper": PAPER_SHAPES, "strong": STRONG_SHAPES}


#: ditron's methods per op: name -> (context options, call options); other names: see method_spec
METHOD_PRESETS = {
    "ag_gemm": {"default": ({}, {}), "ce": ({"producer": "ce"}, {}), "sm": ({"producer": "sm"}, {}),
                "sm_overlap": ({"producer": "sm", "overlap": True}, {})},
    "gemm_rs": {"default": ({}, {}), "ce": ({"method": "ce"}, {}), "scatter": ({"method": "scatter"}, {}),
                "pull": ({"method": "pull"}, {})},
    "gemm_ar": {"default": ({}, {}), "auto": ({}, {"method": "auto"}), "one_shot": ({}, {"method": "one_shot"}),
                "two_shot": ({}, {"method": "two_shot"}), "rs_ag": ({}, {"method": "rs_ag"})},
}


DEFAULT_METHODS = {"ag_gemm": "default", "gemm_rs": "ce,scatter,pull", "gemm_ar": "auto,one_shot,two_shot,rs_ag"}


PEERS = ("cublas_nccl", "torch_fused", "gemm_only", "comm_only", "ditron_gemm_only")


#: implementations that are parts of the op, not the op (no speedup / hidden fraction)
PARTS = ("gemm_only", "comm_only", "ditron_gemm_only")


@dataclass(frozen=True)
class Shape:
    label: str
    M: int
    N: int
    K: int


# ---------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------

def _shape_list(text):
    """``"M,N,K;M,N,K"`` or ``"MxNxK,MxNxK"`` -> [(M, N, K)]."""
    out = []
    if "x" in text.lower():
        items = [s for s in re.split(r"[;,\s]+", text) if s]
        dims = [s.lower().split("x") for s in items]
    else:
        items = [s for s in re.split(r"[;\s]+", text) if s]
        dims = [s.split(",") for s in items]
    for item, d in zip(items, dims):
        try:
            m, n, k = (int(v) for v in d)
        except ValueError:
            raise SystemExit(f"ditron bench: cannot read the shape {item!r} (use M,N,K; shapes separated by ';')")
        if min(m, n, k) < 1:
            raise SystemExit(f"ditron bench: shape {item!r} has a dimension < 1")
        out.append((m, n, k))
    return out


def parse_shapes(spec: str, workload: str):
    """``paper`` / ``strong`` (optionally ``paper:MODEL,MODEL``) or explicit
    shapes -> [Shape] for ``workload`` ('ag_gemm' or 'gemm_rs')."""
    name, _, models = spec.partition(":")
    if name in SHAPE_SETS:
        rows = SHAPE_SETS[name][workload]
        if models:
            want = [m.strip() for m in models.split(",") if m.strip()]
            unknown = [m for m in want if m not in {r[0] for r in rows}]
            if unknown:
                raise SystemExit(f"ditron bench: no model {', '.join(unknown)} in the {name} shapes "
                                 f"({', '.join(r[0] for r in rows)})")
            rows = [r for r in rows if r[0] in want]
        return [Shape(*r) for r in rows]
    return [Shape(f"{m},{n},{k}", m, n, k) for m, n, k in _shape_list(spec)]


def local_dims(op, shape: Shape, W: int):
    """(a shape, b shape, out shape) on one rank for TP over ``W`` ranks; a
    shape that does not split evenly raises SystemExit."""
    M, N, K = shape.M, shape.N, shape.K
    need = {"ag_gemm": (("M", M), ("N", N)), "gemm_rs": (("M", M), ("K", K)), "gemm_ar": (("K", K),)}[op]
    for what, v in need:
        if v % W:
            raise SystemExit(f"ditron bench {op}: {shape.label}: {what}={v} is not a multiple of --tp {W}")
    if op == "ag_gemm":
        return (M // W, K), (K, N // W), (M, N // W)
    if op == "gemm_rs":
        return (M, K // W), (K // W, N), (M // W, N)
    return (M, K // W), (K // W, N), (M, N)


def gemm_flops(op, shape: Shape, W: int) -> float:
    """Floating-point operations of one rank's GEMM."""
    if op == "ag_gemm":
        return 2.0 * shape.M * (shape.N // W) * shape.K
    return 2.0 * shape.M * shape.N * (shape.K // W)


def gemm_core_shapes(spec: str, W: int):
    """Local GEMM shapes for ``ditron bench gemm``: with a named set, the
    per-rank GEMMs of AG-GEMM (``M x N/W x K``) and of GEMM-RS / GEMM-AR
    (``M x N x K/W``), duplicates merged; explicit shapes are local already."""
    name = spec.partition(":")[0]
    if name not in SHAPE_SETS:
        return [Shape(f"{m},{n},{k}", m, n, k) for m, n, k in _shape_list(spec)]
    out = {}
    for op, tag in (("ag_gemm", "AG"), ("gemm_rs", "RS/AR")):
        for s in parse_shapes(spec, op):
            a, b, _ = local_dims(op, s, W)
            key = (s.M, b[1], a[1])           # AG-GEMM multiplies the gathered [M, K] A
            if key in out:
                out[key] = dataclasses.replace(out[key], label=out[key].label + " / " + s.label)
            else:
                out[key] = Shape(f"{tag} {s.label}", *key)
    return list(out.values())


def _value(text):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    return None if text == "None" else text


def method_spec(op, item):
    """``NAME[:key=value[:key=value...]]`` -> (label, context options, call
    options).  NAME is a preset of METHOD_PRESETS[op]; for gemm_rs / gemm_ar
    another NAME is passed on as ``method=NAME``.  ``key=value`` pairs go to
    the context (``call.key=value``: to the call)."""
    name, *opts = item.split(":")
    presets = METHOD_PRESETS[op]
    if name in presets:
        ctx_opts, call_opts = (dict(d) for d in presets[name])
    elif op == "gemm_rs":
        ctx_opts, call_opts = {"method": name}, {}
    elif op == "gemm_ar":
        ctx_opts, call_opts = {}, {"method": name}
    else:
        raise SystemExit(f"ditron bench {op}: unknown method {name!r}; use one of {', '.join(presets)} "
                         "(optionally with :key=value context options)")
    for o in opts:
        if "=" not in o:
            raise SystemExit(f"ditron bench {op}: method option {o!r} is not key=value")
        k, v = o.split("=", 1)
        if k.startswith("call."):
            call_opts[k[5:]] = _value(v)
        else:
            ctx_opts[k] = _value(v)
    return item, ctx_opts, call_opts
