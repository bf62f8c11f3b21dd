"""GEMM + communication benchmarks (``ditron bench ag_gemm|gemm_rs|gemm_ar|gemm``).

    torchrun --standalone --nproc-per-node 4 -m ditron.bench ag_gemm --shapes paper --dtype bf16 --graph
    torchrun --standalone --nproc-per-node 4 -m ditron.bench gemm_rs --shapes "8192,4096,11008;8192,8192,28672"
    torchrun --standalone --nproc-per-node 1 -m ditron.bench gemm --shapes paper --tp 4 --configs sweep
    ditron sim -n 2 -m ditron.bench ag_gemm --shapes 64,32,32      # smoke run of the harness on CPU

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
``--configs sweep`` times a list of ``GemmConfig`` and reports the best per
shape (configs that do not compile, e.g. out of shared memory, are skipped).

Memory: inputs, outputs and ditron's contexts are allocated per shape and freed
after it (``ditron.heap_scope``, ``torch.cuda.empty_cache``); the symmetric
heap (``DITRON_HEAP_SIZE``) must hold the largest shape's context.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass

from .harness import Impl, Progress, measure, result_meta

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
KERNEL_MODULES = {"ag_gemm": ("ditron.kernels.ag_gemm", "create_ag_gemm_context", "ag_gemm"),
                  "gemm_rs": ("ditron.kernels.gemm_rs", "create_gemm_rs_context", "gemm_rs"),
                  "gemm_ar": ("ditron.kernels.gemm_ar", "create_gemm_ar_context", "gemm_ar")}
#: GemmConfig fields of the sweep (``--configs sweep``); the simulator uses SIM_SWEEP
SWEEP_TILES = ((128, 128, 64), (128, 256, 64), (256, 128, 64), (128, 128, 128))
SWEEP = [dict(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=w, num_stages=s, tma=t)
         for bm, bn, bk in SWEEP_TILES for s in (3, 4) for w in (4, 8) for t in (False, True)]
SIM_SWEEP = [dict(block_m=16, block_n=16, block_k=32, group_m=4, num_warps=1, num_stages=1),
             dict(block_m=32, block_n=16, block_k=16, group_m=4, num_warps=1, num_stages=1)]


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


# ---------------------------------------------------------------------------
# inputs, references, checks
# ---------------------------------------------------------------------------

def eps_of(dtype):
    import torch
    return {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -20}[dtype]


def tolerance(dtype, K, reduce_ranks=0):
    """Absolute tolerance of an output whose entries are sums of ``K``
    products of unit-variance inputs (standard deviation ``sqrt(K)``): the
    output's rounding (12 units of the dtype's epsilon times ``sqrt(K)``,
    beyond the largest of many millions of normal samples), plus 6 more per
    rank whose partial sums are rounded to the dtype and reduced in it."""
    return eps_of(dtype) * math.sqrt(K) * (12 + 6 * reduce_ranks)


def make_check(ref_fn, atol, what=""):
    """``check(out)``: finite, the right shape, and within ``atol`` of
    ``ref_fn()`` (float32) everywhere."""
    def check(out):
        import torch
        ref = ref_fn()
        if out is None or not isinstance(out, torch.Tensor):
            raise AssertionError(f"returned {type(out).__name__}, not a tensor")
        if tuple(out.shape) != tuple(ref.shape):
            raise AssertionError(f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
        got = out.float()
        if not bool(torch.isfinite(got).all()):
            raise AssertionError("output has inf or nan")
        err = (got - ref).abs().max().item()
        if err > atol:
            raise AssertionError(f"max abs error {err:.4g} > tolerance {atol:.4g}{what}")
    return check


class Inputs:
    """Seeded inputs of every rank (each rank regenerates its peers' on its own
    device: references need no communication) and lazily computed float32
    references, dropped after the checks."""

    def __init__(self, device, dtype, seed):
        self.device, self.dtype, self.seed = device, dtype, seed
        self.cache = {}

    def rand(self, shape, rank, salt):
        import torch
        g = torch.Generator(device=self.device).manual_seed(
            (self.seed * 1_000_003 + rank * 7919 + salt * 104_729 + shape[0] * 31 + shape[1]) % (1 << 62))
        return torch.randn(tuple(shape), generator=g, device=self.device, dtype=torch.float32).to(self.dtype)

    def ref(self, key, fn):
        def get():
            if key not in self.cache:
                self.cache[key] = fn()
            return self.cache[key]
        return get

    def clear(self):
        self.cache.clear()


# ---------------------------------------------------------------------------
# implementations of one shape
# ---------------------------------------------------------------------------

def _kernel_module(op):
    """(module, create_context, run) of ditron's kernel for ``op``, or the reason it is missing."""
    mod_name, create, run = KERNEL_MODULES[op]
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        return None, f"{mod_name} cannot be imported ({type(e).__name__}: {e})"
    missing = [n for n in (create, run) if not hasattr(mod, n)]
    if missing:
        return None, f"{mod_name} has no {', '.join(missing)}"
    return (mod, create, run), ""


_TORCH_FUSED = {}


def torch_fused_op(op, device):
    """(callable, '') for torch's fused symmetric-memory op of ``op``, or
    (None, why not)."""
    import torch
    import torch.distributed as dist
    if op == "gemm_ar":
        return None, "torch has no fused GEMM + all-reduce op"
    if not str(device).startswith("cuda"):
        return None, "needs CUDA (not on the simulator)"
    if not (dist.is_available() and dist.is_initialized()):
        return None, "needs torch.distributed"
    if op in _TORCH_FUSED:
        return _TORCH_FUSED[op]
    name = {"ag_gemm": "fused_all_gather_matmul", "gemm_rs": "fused_matmul_reduce_scatter"}[op]
    try:
        import torch.distributed._symmetric_memory as symm_mem
        fn = getattr(torch.ops.symm_mem, name)
        group_name = dist.group.WORLD.group_name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # deprecated (and unneeded) in newer torch
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(group_name)
    except Exception as e:  # noqa: BLE001 -- reported as n/a
        _TORCH_FUSED[op] = (None, f"torch.ops.symm_mem.{name} unavailable ({type(e).__name__}: {e})")
        return _TORCH_FUSED[op]
    if op == "ag_gemm":
        def run(a, b):
            return fn(a, [b], 0, group_name)[1][0]
    else:
        def run(a, b):
            return fn(a, b, "sum", 0, group_name)
    _TORCH_FUSED[op] = (run, "")
    return _TORCH_FUSED[op]


def _heap_hint(e):
    size = os.environ.get("DITRON_HEAP_SIZE")
    return (f"the ditron context does not fit in the symmetric heap (DITRON_HEAP_SIZE="
            f"{size or 'unset: the default'}); set a larger DITRON_HEAP_SIZE before the run: {e}")


def _takes_out(fn):
    import inspect
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _failing(name, err):
    def run():
        raise err
    return Impl(name, run)


def overlap_impls(op, shape: Shape, world, dtype, methods, peers, seed=0, log=None):
    """(impls, n/a {name: reason}, inputs) for one shape of an overlap op."""
    import torch
    import torch.distributed as dist

    import ditron
    W, R, dev = world.world_size, world.rank, world.device
    a_shape, b_shape, out_shape = local_dims(op, shape, W)
    on_gpu = str(dev).startswith("cuda")
    have_dist = on_gpu and dist.is_available() and dist.is_initialized()
    inp = Inputs(dev, dtype, seed)
    impls, na = [], {}

    a = inp.rand(a_shape, R, 0)
    b = inp.rand(b_shape, R, 1)

    def nan_empty(shape_):
        # outputs start as NaN: an implementation that writes nothing cannot pass with a stale result
        return torch.full(tuple(shape_), float("nan"), dtype=dtype, device=dev)

    def others_a(r):
        return a if r == R else inp.rand(a_shape, r, 0)

    def others_b(r):
        return b if r == R else inp.rand(b_shape, r, 1)

    K = shape.K
    if op == "ag_gemm":
        a_full = inp.ref("a_full", lambda: torch.cat([others_a(r) for r in range(W)]))
        ref = inp.ref("out", lambda: a_full().float() @ b.float())
        check_op = make_check(ref, tolerance(dtype, K))
        check_gemm = check_op
        check_comm = make_check(lambda: a_full().float(), 0.0)
        gemm_a = None                       # the gathered A, made when needed
    else:
        rows = slice(R * (shape.M // W), (R + 1) * (shape.M // W)) if op == "gemm_rs" else slice(None)

        def reduced():
            acc = None
            for r in range(W):
                part = others_a(r)[rows].float() @ others_b(r).float()
                acc = part if acc is None else acc.add_(part)
            return acc
        ref = inp.ref("out", reduced)
        check_op = make_check(ref, tolerance(dtype, K, W))
        check_comm = check_op
        check_gemm = make_check(inp.ref("partial", lambda: a.float() @ b.float()), tolerance(dtype, K))

    # -- ditron ------------------------------------------------------------------
    kern, why = _kernel_module(op)
    if kern is None:
        for label, _, _ in methods:
            na[f"ditron {label}"] = why
    else:
        mod, create_name, run_name = kern
        contexts = {}
        for label, ctx_opts, call_opts in methods:
            name = f"ditron {label}"
            key = json.dumps(ctx_opts, sort_keys=True, default=str)
            try:
                if key not in contexts:
                    if op == "ag_gemm":
                        contexts[key] = getattr(mod, create_name)(a_shape[0], K, dtype, **ctx_opts)
                    else:
                        contexts[key] = getattr(mod, create_name)(shape.M, shape.N, dtype, **ctx_opts)
                ctx = contexts[key]
            except Exception as e:  # noqa: BLE001 -- the same on every rank: reported as a failure
                if isinstance(e, ditron.DitronError) and "symmetric heap" in str(e):
                    e = ditron.DitronError(_heap_hint(e))
                    if log:
                        log(f"{op} {shape.label}: {e}")
                contexts[key] = e
                impls.append(_failing(name, e))
                continue
            if isinstance(ctx, Exception):
                impls.append(_failing(name, ctx))
                continue
            fn = getattr(mod, run_name)
            kw = dict(call_opts)
            if _takes_out(fn):
                kw["out"] = nan_empty(out_shape)
            impls.append(Impl(name, lambda fn=fn, ctx=ctx, kw=kw: fn(a, b, ctx, **kw), check_op,
                              ", ".join(f"{k}={v}" for k, v in {**ctx_opts, **call_opts}.items())))

    # -- peers -------------------------------------------------------------------
    nccl_why = "needs CUDA and NCCL (not on the simulator)"
    if "torch_fused" in peers:
        fused, why = torch_fused_op(op, dev)
        if fused is None:
            na["torch_fused"] = why
        else:
            impls.append(Impl("torch_fused", lambda: fused(a, b), check_op,
                              "torch.ops.symm_mem." + ("fused_all_gather_matmul" if op == "ag_gemm"
                                                       else "fused_matmul_reduce_scatter")))
    if "cublas_nccl" in peers:
        if not have_dist:
            na["cublas_nccl"] = nccl_why
        elif op == "ag_gemm":
            gathered = nan_empty((shape.M, K))
            out = nan_empty(out_shape)

            def seq():
                dist.all_gather_into_tensor(gathered, a)
                return torch.matmul(gathered, b, out=out)
            impls.append(Impl("cublas_nccl", seq, check_op, "all_gather_into_tensor, then torch.matmul"))
        elif op == "gemm_rs":
            c = nan_empty((shape.M, shape.N))
            out = nan_empty(out_shape)

            def seq():
                torch.matmul(a, b, out=c)
                dist.reduce_scatter_tensor(out, c)
                return out
            impls.append(Impl("cublas_nccl", seq, check_op, "torch.matmul, then reduce_scatter_tensor"))
        else:
            c = nan_empty((shape.M, shape.N))

            def seq():
                torch.matmul(a, b, out=c)
                dist.all_reduce(c)
                return c
            impls.append(Impl("cublas_nccl", seq, check_op, "torch.matmul, then all_reduce (in place)"))
    if "gemm_only" in peers or "ditron_gemm_only" in peers:
        if op == "ag_gemm":
            gemm_a = a_full()               # [M, K]: the gathered A, made locally
        else:
            gemm_a = a
        g_out = nan_empty((gemm_a.shape[0], b.shape[1]))
    if "gemm_only" in peers:
        impls.append(Impl("gemm_only", lambda: torch.matmul(gemm_a, b, out=g_out), check_gemm,
                          "torch.matmul at the local shape" + (" (the gathered A)" if op == "ag_gemm" else "")))
    if "comm_only" in peers:
        if not have_dist:
            na["comm_only"] = nccl_why
        elif op == "ag_gemm":
            gathered2 = nan_empty((shape.M, K))
            impls.append(Impl("comm_only", lambda: (dist.all_gather_into_tensor(gathered2, a), gathered2)[1],
                              check_comm, "all_gather_into_tensor of the A shards"))
        else:
            partial = torch.matmul(a, b)      # this rank's partial C, the collective's input
            if op == "gemm_rs":
                rs_out = nan_empty(out_shape)
                impls.append(Impl("comm_only", lambda: (dist.reduce_scatter_tensor(rs_out, partial), rs_out)[1],
                                  check_comm, "reduce_scatter_tensor of the partial C"))
            else:
                impls.append(Impl("comm_only", lambda: (dist.all_reduce(partial), partial)[1], check_comm,
                                  "all_reduce of the partial C in place (checked on the first call; later calls "
                                  "reduce the previous result: the same traffic)"))
    if "ditron_gemm_only" in peers:
        try:
            gemm_mod = importlib.import_module("ditron.kernels.gemm")
            d_out = nan_empty(g_out.shape)
            impls.append(Impl("ditron_gemm_only", lambda: gemm_mod.matmul(gemm_a, b, out=d_out), check_gemm,
                              "ditron.kernels.gemm.matmul, default config"))
        except ImportError as e:
            na["ditron_gemm_only"] = f"ditron.kernels.gemm cannot be imported ({e})"
    return impls, na, inp


def agree_fn(world):
    """``agree(flags) -> flags``: an implementation counts as passed only if it
    passed on every rank (so that every rank times the same ones)."""
    import torch
    import torch.distributed as dist

    import ditron

    def agree(flags):
        if dist.is_available() and dist.is_initialized():
            dev = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
            t = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            return [bool(v) for v in t.tolist()]
        if world.world_size == 1 or world.nnodes > 1:
            return list(flags)
        with ditron.heap_scope():                 # the simulator: through symmetric memory
            buf = ditron.symm_zeros((len(flags),), torch.int32, name="bench.agree")
            buf.copy_(torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32))
            ditron.barrier_all()
            res = torch.ones(len(flags), dtype=torch.int32)
            for r in range(world.world_size):
                res = torch.minimum(res, ditron.peer_tensor(buf, r).cpu())
            ditron.barrier_all()
        return [bool(v) for v in res.tolist()]
    return agree


def _release(device):
    gc.collect()
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _log_local_failures(world, shape, res):
    """Rank 0 writes the results; the other ranks print their own failures (rank 0's table only says
    'failed on another rank')."""
    if world.rank == 0:
        return
    for name, r in res.items():
        if not r["ok"] and r["error"] != "failed on another rank":
            print(f"ditron bench: rank {world.rank}: {shape.label} {name}: {r['error']}", file=sys.stderr,
                  flush=True)


def _column_order(name):
    return PEERS.index(name) + 1 if name in PEERS else 0


def _row_status(res, na, name):
    if name in na:
        return "n/a"
    return "ok" if res[name]["ok"] else "FAILED"


def run_overlap(op, shapes, world, dtype, methods, peers, *, warmup, iters, graph, repeat, seed=0,
                progress=True, log=None):
    """Check and time every implementation at every shape; returns the rows."""
    import ditron
    W = world.world_size
    rows = []
    bar = Progress(len(shapes), op, progress and world.rank == 0)
    agree = agree_fn(world)
    for shape in shapes:
        a_shape, b_shape, out_shape = local_dims(op, shape, W)
        with ditron.heap_scope():               # contexts per shape, freed after it
            try:
                impls, na, inp = overlap_impls(op, shape, world, dtype, methods, peers, seed, log)
            except Exception as e:  # noqa: BLE001 -- e.g. out of GPU memory: the shape is reported, the run goes on
                impls, na, inp = [], {}, None
                err = f"{type(e).__name__}: {e}"
                if log:
                    log(f"{op} {shape.label}: cannot set up the shape: {err}")
                for label, _, _ in methods:
                    impls.append(_failing(f"ditron {label}", e))
            res = measure(impls, world.device, warmup=warmup, iters=iters, graph=graph,
                          barrier=ditron.barrier_all, repeat=repeat, agree=agree,
                          after_checks=inp.clear if inp is not None else None)
            ditron.barrier_all()
            _release(world.device)
        _log_local_failures(world, shape, res)
        names = [i.name for i in impls] + [n for n in na if n not in {i.name for i in impls}]
        names.sort(key=_column_order)          # ditron's methods, then the peers in PEERS order (stable)
        notes = {i.name: i.note for i in impls}
        for name in names:
            r = res.get(name, {"ok": None, "error": "", "us": None, "rounds_us": [], "note": ""})
            status = _row_status(res, na, name)
            us = r["us"] if status == "ok" else None
            rows.append({"model": shape.label, "M": shape.M, "N": shape.N, "K": shape.K, "tp": W,
                         "a_shape": list(a_shape), "b_shape": list(b_shape), "out_shape": list(out_shape),
                         "impl": name, "status": status, "ok": status == "ok" if status != "n/a" else None,
                         "us": us, "rounds_us": r["rounds_us"],
                         "tflops": (gemm_flops(op, shape, W) / (us * 1e-6) / 1e12
                                    if us and name != "comm_only" else None),
                         "error": na.get(name) or r["error"],
                         "note": "; ".join(n for n in (notes.get(name, ""), r.get("note", "")) if n)})
        del impls
        _release(world.device)
        bar.step(shape.label)
    bar.close()
    return rows


# ---------------------------------------------------------------------------
# derived figures (pure functions of the rows: tested without GPUs)
# ---------------------------------------------------------------------------

def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def derive(rows):
    """Adds ``speedup`` (cublas_nccl's time / this time), ``hidden_raw`` /
    ``hidden`` ((gemm_only + comm_only - t) / comm_only, clamped to [0, 1]),
    ``hidden_own_raw`` (the same with ditron_gemm_only for ditron's methods)
    and per shape ``ideal`` ((gemm_only + comm_only) / max of them) to the
    rows; returns the summary: geomeans over shapes per implementation."""
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["impl"]): r for r in rows}

    def t(model, impl):
        r = by.get((model, impl))
        return r["us"] if r and r["status"] == "ok" and r["us"] else None

    ideal = {}
    for s in shapes:
        base, tg, tc, tdg = t(s, "cublas_nccl"), t(s, "gemm_only"), t(s, "comm_only"), t(s, "ditron_gemm_only")
        ideal[s] = (tg + tc) / max(tg, tc) if tg and tc else None
        for r in rows:
            if r["model"] != s:
                continue
            us = t(s, r["impl"])
            part = r["impl"] in PARTS
            r["speedup"] = base / us if base and us and not part else None
            r["hidden_raw"] = (tg + tc - us) / tc if tg and tc and us and not part else None
            r["hidden"] = min(1.0, max(0.0, r["hidden_raw"])) if r["hidden_raw"] is not None else None
            own = tdg if r["impl"].startswith("ditron ") else None
            r["hidden_own_raw"] = (own + tc - us) / tc if own and tc and us else None
            r["ideal"] = ideal[s]
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["impl"] not in PARTS))
    summary = {"geomean_speedup": {}, "geomean_shapes": {}, "mean_hidden": {}, "shapes": len(shapes)}
    for name in impls:
        sp = [by[(s, name)].get("speedup") for s in shapes if (s, name) in by]
        sp = [x for x in sp if x]
        summary["geomean_speedup"][name] = geomean(sp)
        summary["geomean_shapes"][name] = len(sp)
        hid = [by[(s, name)].get("hidden") for s in shapes if (s, name) in by]
        hid = [x for x in hid if x is not None]
        summary["mean_hidden"][name] = sum(hid) / len(hid) if hid else None
    summary["ideal_geomean"] = geomean([v for v in ideal.values() if v])
    return summary


def _cell(r, key, fmt):
    if r is None:
        return "-"
    if r["status"] != "ok":
        return r["status"]
    v = r.get(key)
    return "-" if v is None else fmt(v)


def overlap_tables(rows, summary):
    """Markdown tables: latency, speedup (with geomean and ideal), hidden."""
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    main = [i for i in impls if i not in PARTS]
    by = {(r["model"], r["impl"]): r for r in rows}
    dims = {r["model"]: f"{r['M']}, {r['N']}, {r['K']}" for r in rows}

    def table(cols, key, fmt, extra=None, foot=None):
        head = "| shape | M, N, K | " + " | ".join(cols) + (" | " + extra[0] if extra else "") + " |"
        lines = [head, "| --- | --- |" + " --- |" * (len(cols) + (1 if extra else 0))]
        for s in shapes:
            cells = [_cell(by.get((s, c)), key, fmt) for c in cols]
            if extra:
                cells.append(extra[1](s))
            lines.append(f"| {s} | {dims[s]} | " + " | ".join(cells) + " |")
        if foot:
            lines.append(foot)
        return "\n".join(lines)

    def ideal_of(s):
        r = next((r for r in rows if r["model"] == s), None)
        return f"{r['ideal']:.2f}x" if r and r.get("ideal") else "-"

    gm = summary["geomean_speedup"]
    foot = ("| **geomean** | | " + " | ".join(
        (f"**{gm[c]:.2f}x**" if gm.get(c) else "-") for c in main)
        + f" | {summary['ideal_geomean']:.2f}x |" if summary.get("ideal_geomean") else
        "| **geomean** | | " + " | ".join((f"**{gm[c]:.2f}x**" if gm.get(c) else "-") for c in main) + " | - |")
    lat = table(impls, "us", lambda v: f"{v:.1f}")
    spd = table(main, "speedup", lambda v: f"{v:.2f}x", ("ideal", ideal_of), foot)
    hid = table(main, "hidden", lambda v: f"{100 * v:.0f}%")
    return lat, spd, hid


# ---------------------------------------------------------------------------
# the GEMM core against cuBLAS
# ---------------------------------------------------------------------------

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
        default = config_label(dataclasses.asdict(gemm_mod.default_config(shape.M, shape.N, shape.K, dtype, device)))
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


def gemm_tables(rows, summary):
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["impl"]): r for r in rows}
    dims = {r["model"]: f"{r['M']} x {r['N']} x {r['K']}" for r in rows}
    lines = ["| shape | M x N x K | cuBLAS | ditron default | best ditron config | best |",
             "| --- | --- | --- | --- | --- | --- |"]

    def tf(r):
        if r is None:
            return "-"
        if r["status"] != "ok":
            return r["status"]
        return f"{r['us']:.1f} us, {r['tflops']:.0f} TFLOP/s" + (f", {r['vs_cublas']:.2f}x" if r["vs_cublas"] and
                                                                  r["impl"] != "cublas" else "")
    for s in shapes:
        b = summary["best_per_shape"].get(s)
        lines.append(f"| {s} | {dims[s]} | {tf(by.get((s, 'cublas')))} | {tf(by.get((s, 'ditron default')))} | "
                     f"{b['impl'][7:] if b else '-'} | {tf(by.get((s, b['impl']))) if b else '-'} |")
    main = "\n".join(lines)
    sweep = ""
    cfgs = [n for n in dict.fromkeys(r["impl"] for r in rows) if n.startswith("ditron ") and n != "ditron default"]
    if cfgs:
        head = "| config | " + " | ".join(shapes) + " | geomean vs cuBLAS |"
        sl = [head, "| --- |" + " --- |" * (len(shapes) + 1)]
        for n in ["ditron default"] + cfgs:
            cells = []
            for s in shapes:
                r = by.get((s, n))
                cells.append("-" if r is None else (f"{r['tflops']:.0f}" if r["status"] == "ok" else r["status"]))
            g = summary["configs"].get(n, {}).get("geomean_vs_cublas")
            sl.append(f"| {n[7:]} | " + " | ".join(cells) + f" | {f'{g:.3f}x' if g else '-'} |")
        sweep = "\n".join(sl)
    return main, sweep


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------

_DESCRIBE = {
    "ag_gemm": "A [M, K] sharded [M/W, K] per rank, B [K, N/W] per rank; out [M, N/W] = all_gather(A) @ B",
    "gemm_rs": "A [M, K/W], B [K/W, N] per rank; out [M/W, N] = this rank's rows of the sum over ranks of A @ B",
    "gemm_ar": "A [M, K/W], B [K/W, N] per rank; out [M, N] = the sum over ranks of A @ B",
}


def _method_text(op, peers, graph, warmup, iters, repeat, sim=False):
    how = ("a host timer around each call (the simulator: meaningless numbers)" if sim else
           f"{'CUDA-graph replays' if graph else 'eager calls'} between CUDA events")
    timing = (f"{how}, {warmup} warm-ups, median of {iters}, slowest rank, best of {repeat} round(s) in "
              "alternating order")
    if op == "gemm":
        return ("Each GEMM is checked against torch in float32 on fresh random inputs, then timed: " + timing + ".")
    return (f"Global shapes split for TP=W: {_DESCRIBE[op]}. Every implementation is checked against a float32 "
            "torch reference on fresh random inputs (tolerance scaled by sqrt(K)), then timed: " + timing + ". "
            "`cublas_nccl`: torch.matmul and the NCCL collective one after the other; `torch_fused`: torch's "
            "symmetric-memory fused op; `gemm_only` / `comm_only`: the cuBLAS GEMM / the NCCL collective alone "
            "at the local shape; `ditron_gemm_only`: ditron.kernels.gemm.matmul alone. Communication hidden = "
            "(gemm_only + comm_only - t) / comm_only; ideal = (gemm_only + comm_only) / max(gemm_only, comm_only).")


def write_overlap(rows, summary, meta, stem):
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1, default=str)
    lat, spd, hid = overlap_tables(rows, summary)
    op = meta["op"]
    md = [f"### {op}, {meta['dtype']}, TP={meta['world_size']} ({meta['machine']}, {meta['date']})", "",
          f"Command: `{meta['command']}`", "", meta["method"], "",
          "Latency (us):", "", lat, "",
          "Speedup over cublas_nccl (its time / the implementation's; geomean over the shapes):", "", spd, "",
          "Communication hidden ((gemm_only + comm_only - t) / comm_only, clamped to [0, 1]; raw in the JSON):",
          "", hid, ""]
    na = {}
    for r in rows:
        if r["status"] == "n/a":
            na.setdefault(r["impl"], r["error"])
    if na:
        md += ["Not available:", ""] + [f"- {k}: {v}" for k, v in na.items()] + [""]
    failed = [r for r in rows if r["status"] == "FAILED"]
    if failed:
        md += ["Failures:", ""] + [f"- {r['model']} {r['impl']}: {r['error']}" for r in failed] + [""]
    notes = {(r["impl"], r["note"]) for r in rows if r["note"] and r["status"] == "ok"}
    if notes:
        md += ["Notes:", ""] + [f"- {i}: {n}" for i, n in sorted(notes)] + [""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md))
    png = _plot(rows, stem, op, "speedup", "speedup over cublas_nccl", exclude=PARTS)
    return stem + ".md", stem + ".json", png


def write_gemm(rows, summary, meta, stem):
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1, default=str)
    main, sweep = gemm_tables(rows, summary)
    md = [f"### GEMM core vs cuBLAS, {meta['dtype']} ({meta['machine']}, {meta['date']})", "",
          f"Command: `{meta['command']}`", "", meta["method"], "", main, ""]
    if sweep:
        md += ["Sweep (TFLOP/s per shape; the last column: geomean over the shapes of cuBLAS's time / the "
               "config's):", "", sweep, ""]
        if summary.get("best_overall"):
            md += [f"Best config over all shapes: `{summary['best_overall'][7:]}`", ""]
    skipped = sorted({(r["impl"], r["error"].splitlines()[0][:160]) for r in rows if r["status"] == "skipped"})
    if skipped:
        md += ["Skipped (do not compile for this GPU):", ""] + [f"- {i[7:]}: {e}" for i, e in skipped] + [""]
    failed = [r for r in rows if r["status"] == "FAILED"]
    if failed:
        md += ["Failures:", ""] + [f"- {r['model']} {r['impl']}: {r['error']}" for r in failed] + [""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md))
    best = {b["impl"] for b in summary["best_per_shape"].values()}
    png = _plot([r for r in rows if r["impl"] in {"cublas", "ditron default"} | best], stem, "gemm", "tflops",
                "TFLOP/s")
    return stem + ".md", stem + ".json", png


def _plot(rows, stem, op, key, ylabel, exclude=()):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    impls = [i for i in dict.fromkeys(r["impl"] for r in rows) if i not in exclude]
    by = {(r["model"], r["impl"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(shapes) + 2), 4))
    w = 0.8 / max(1, len(impls))
    for j, name in enumerate(impls):
        ys = [(by.get((s, name)) or {}).get(key) or 0 for s in shapes]
        ax.bar([i + j * w for i in range(len(shapes))], ys, w, label=name)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(shapes))])
    ax.set_xticklabels(shapes, rotation=20, fontsize=7, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{op}: {ylabel}")
    if key == "speedup":
        ax.axhline(1.0, color="gray", lw=0.8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))     # beside the bars, not over them
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return stem + ".png"


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
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--methods", default=None,
                   help="ditron methods, comma-separated, each NAME[:key=value...] (ag_gemm: default, ce, sm, "
                        "sm_overlap; gemm_rs: scatter, pull; gemm_ar: auto, one_shot, two_shot)")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"baselines, comma-separated ('' for none): {', '.join(PEERS)}")
    p.add_argument("--configs", default="default",
                   help="gemm only: 'default', 'sweep', or configs 'BMxBNxBK[:sS][:wW][:gG][:tma],...'")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=25)
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
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

    import torch

    import ditron
    world = ditron.init(args.backend)
    rank0 = world.rank == 0

    def log(msg):
        if rank0:
            print(f"ditron bench: {msg}", file=sys.stderr, flush=True)

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    W = world.world_size
    tp = args.tp or W
    sim = world.backend == "sim"
    command = "ditron bench " + " ".join(argv)
    if op == "gemm":
        shapes = gemm_core_shapes(args.shapes, tp)
        configs = parse_configs(args.configs, sim)
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
        rows = run_overlap(op, shapes, world, dtype, methods, peers, warmup=args.warmup, iters=args.iters,
                           graph=args.graph, repeat=args.repeat, seed=args.seed, log=log)
        summary = derive(rows)
        name = op
        bad_rows = [r for r in rows if r["status"] == "FAILED"]
    if rank0:
        meta = result_meta(name, args.dtype, W, world.device, args.machine, command)
        meta.update(tp=tp, backend=world.backend, shapes=args.shapes,
                    heap_size=os.environ.get("DITRON_HEAP_SIZE"),
                    method=_method_text(op, peers, args.graph, args.warmup, args.iters, args.repeat, sim))
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
