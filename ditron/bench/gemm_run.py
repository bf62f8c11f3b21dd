"""What runs one shape of an overlap op (``ditron bench ag_gemm|gemm_rs|gemm_ar``): seeded inputs, float32
references and checks, ditron's methods and the peers (cuBLAS + NCCL, torch's fused ops, the parts alone), then
the harness's checks and timing (:func:`ditron.bench.harness.measure`) and one row per implementation.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import sys
import warnings

from .gemm_shapes import PEERS, Shape, gemm_flops, local_dims
from .harness import Impl, Progress, _release, agree_fn, measure

KERNEL_MODULES = {"ag_gemm": ("ditron.kernels.ag_gemm", "create_ag_gemm_context", "ag_gemm"),
                  "gemm_rs": ("ditron.kernels.gemm_rs", "create_gemm_rs_context", "gemm_rs"),
                  "gemm_ar": ("ditron.kernels.gemm_ar", "create_gemm_ar_context", "gemm_ar")}


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


def partial_comm_impl(op, partial, make_out, check, what):
    """The ``comm_only`` peer of GEMM-RS / GEMM-AR: torch.distributed's collective on this rank's partial C
    (``reduce_scatter_tensor`` into ``make_out()`` for gemm_rs, else ``all_reduce`` in place)."""
    import torch.distributed as dist
    if op == "gemm_rs":
        rs_out = make_out()
        return Impl("comm_only", lambda: (dist.reduce_scatter_tensor(rs_out, partial), rs_out)[1], check,
                    f"reduce_scatter_tensor of {what}")
    return Impl("comm_only", lambda: (dist.all_reduce(partial), partial)[1], check,
                f"all_reduce of {what} in place (checked on the first call; later calls reduce the previous "
                "result: the same traffic)")


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
    nccl_why = "needs CUDA and NCCL (not on the simulator)"
    if have_dist and dist.get_backend() != "nccl":      # ranks sharing a GPU run torch.distributed on gloo
        have_dist = False
        nccl_why = f"needs NCCL (torch.distributed runs on {dist.get_backend()}: ranks share a GPU)"
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
            impls.append(partial_comm_impl(op, partial, lambda: nan_empty(out_shape), check_comm, "the partial C"))
    if "ditron_gemm_only" in peers:
        try:
            gemm_mod = importlib.import_module("ditron.kernels.gemm")
            d_out = nan_empty(g_out.shape)
            impls.append(Impl("ditron_gemm_only", lambda: gemm_mod.matmul(gemm_a, b, out=d_out), check_gemm,
                              "ditron.kernels.gemm.matmul, default config"))
        except ImportError as e:
            na["ditron_gemm_only"] = f"ditron.kernels.gemm cannot be imported ({e})"
    return impls, na, inp


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
                progress=True, log=None, impls_fn=None, check_only=False):
    """Check and time every implementation at every shape; returns the rows.  ``impls_fn``: what makes one
    shape's implementations (default :func:`overlap_impls`; fp8: ``ditron.bench.gemm_fp8.overlap_fp8_impls``)."""
    impls_fn = impls_fn or overlap_impls
    import ditron
    W = world.world_size
    rows = []
    bar = Progress(len(shapes), op, progress and world.rank == 0)
    agree = agree_fn(world)
    for shape in shapes:
        a_shape, b_shape, out_shape = local_dims(op, shape, W)
        with ditron.heap_scope():               # contexts per shape, freed after it
            try:
                impls, na, inp = impls_fn(op, shape, world, dtype, methods, peers, seed, log)
            except Exception as e:  # noqa: BLE001 -- e.g. out of GPU memory: the shape is reported, the run goes on
                impls, na, inp = [], {}, None
                err = f"{type(e).__name__}: {e}"
                if log:
                    log(f"{op} {shape.label}: cannot set up the shape: {err}")
                for label, _, _ in methods:
                    impls.append(_failing(f"ditron {label}", e))
            res = measure(impls, world.device, warmup=warmup, iters=iters, graph=graph,
                          barrier=ditron.barrier_all, repeat=repeat, agree=agree, check_only=check_only,
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
            us = r["us"] if status == "ok" and not check_only else None
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
