"""Bodies for test_zoo_skew.py: every overlap kernel and reduction of the zoo
in each producer / method configuration, with the last rank delayed *inside*
the call (ditron.sim.skew: after each of its signals, or its programs
starting staggered), on inputs whose exact result needs fp32 accumulation.

Inputs are fp16 / bf16 values of magnitude in [0.5, 1) (random signs): the
sum of up to 8 of them is exact in fp32, so a correct reduction (fp32
accumulation, one rounding) equals ``sum(float64).to(dtype)`` bit for bit,
while accumulating in the data type rounds after every addition and differs
in many elements.  The GEMMs multiply one-hot ``a`` rows, so each partial
product is exactly a row of ``b`` (exact in any precision): the same holds
for GEMM-RS and GEMM-AR.  On GPUs the skew hooks do nothing (the protocol and
precision checks still run)."""
import contextlib
import importlib

import torch

import ditron
from ditron.sim import skew

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _halves(rank, shape, dtype, salt):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    mag = 0.5 + 0.5 * torch.rand(shape, generator=g)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    return (mag * sign).to(dtype)


def _one_hot(rows, k, dtype):
    a = torch.zeros(rows, k)
    a[torch.arange(rows), torch.arange(rows) % k] = 1.0
    return a.to(dtype)


def _plans(world, kernel, dtype="fp16", program=None):
    """(name, context) pairs, fp16 on the simulator (otherwise no skew): the last rank stops after its first
    signal until every other rank is idle (blocked waiting for it, or done: ``until_idle``, so the result
    does not depend on the machine's speed), and, for a ``kernel`` whose skew the signals do not create
    (a producer program whose data a consumer reads, LL packets), the same at the start of program
    ``program`` (None: the first to start) of that kernel."""
    W, late = world.world_size, world.world_size - 1
    if W == 1 or world.backend != "sim" or dtype != "fp16":
        return [("none", contextlib.nullcontext)]
    out = [("signals", lambda: skew.delay(late, at="signal", nth=1, seconds=10, until_idle=True))]
    if kernel:
        out.append(("programs", lambda: skew.delay(late, at="program", nth=1, seconds=10, kernel=kernel,
                                                   program=program, until_idle=True)))
    return out


def _mismatch(got, want):
    bad = (got.float() != want.float())
    return int(bad.sum())


def ag_gemm_skew(world, producer, dtype="fp16", m=5, K=32, N=24):
    """all_gather(one-hot a) @ b == b's rows, exactly, with the last rank late."""
    G = importlib.import_module("ditron.kernels.ag_gemm")
    dt = DTYPES[dtype]
    W = world.world_size
    ctx = G.create_ag_gemm_context(m, K, dt, producer=producer)
    a = _one_hot(m, K, dt).to(world.device)
    b = _halves(0, (K, N), dt, 1).to(world.device)
    want = (_one_hot(m, K, torch.float32).double() @ b.double().cpu()).repeat(W, 1).to(dt)
    out = []
    for name, plan in _plans(world, "ag_gemm_producer" if producer == "sm" else None,
                              program=ctx.producer_programs - 1):
        with plan() as st:
            c = G.ag_gemm(a, b, ctx)
            hits = st["hits"] if st else 0
        out.append((name, _mismatch(c.cpu(), want), hits))
    return out


def gemm_rs_skew(world, method, dtype, m=4, K=8, N=24):
    G = importlib.import_module("ditron.kernels.gemm_rs")
    from ditron.kernels.gemm import SIM_CONFIG
    dt = DTYPES[dtype]
    W = world.world_size
    M = W * m
    opts = {"config": SIM_CONFIG} if world.backend == "sim" else {}
    ctx = G.create_gemm_rs_context(M, N, dt, method=method, **opts)
    a = _one_hot(M, K, dt).to(world.device)
    b = _halves(world.rank, (K, N), dt, 2).to(world.device)
    total = sum(_one_hot(M, K, torch.float64) @ _halves(r, (K, N), dt, 2).double() for r in range(W))
    want = total[world.rank * m:(world.rank + 1) * m].to(dt)
    out = []
    for name, plan in _plans(world, None, dtype):
        with plan() as st:
            c = G.gemm_rs(a, b, ctx)
            hits = st["hits"] if st else 0
        out.append((name, _mismatch(c.cpu(), want), hits))
    return out


def gemm_ar_skew(world, method, dtype, M=6, K=8, N=24):
    G = importlib.import_module("ditron.kernels.gemm_ar")
    dt = DTYPES[dtype]
    W = world.world_size
    ctx = G.create_gemm_ar_context(M, N, dt)
    a = _one_hot(M, K, dt).to(world.device)
    b = _halves(world.rank, (K, N), dt, 3).to(world.device)
    want = sum(_one_hot(M, K, torch.float64) @ _halves(r, (K, N), dt, 3).double() for r in range(W)).to(dt)
    out = []
    for name, plan in _plans(world, None, dtype):
        with plan() as st:
            c = G.gemm_ar(a, b, ctx, method=method)
            hits = st["hits"] if st else 0
        out.append((name, _mismatch(c.cpu(), want), hits))
    return out


def all_reduce_skew(world, method, dtype, n=300):
    AR = importlib.import_module("ditron.kernels.all_reduce")
    dt = DTYPES[dtype]
    W = world.world_size
    ctx = AR.create_all_reduce_context(n, dt)
    x = _halves(world.rank, (n,), dt, 4).to(world.device)
    want = sum(_halves(r, (n,), dt, 4).double() for r in range(W)).to(dt)
    out = []
    for name, plan in _plans(world, "all_reduce" if method == "ll" else None, dtype):
        with plan() as st:
            y = AR.all_reduce(x, ctx, method=method)
            hits = st["hits"] if st else 0
        out.append((name, _mismatch(y.cpu(), want), hits))
    return out


def reduce_scatter_skew(world, method, dtype, m=100):
    RS = importlib.import_module("ditron.kernels.reduce_scatter")
    dt = DTYPES[dtype]
    W = world.world_size
    ctx = RS.create_reduce_scatter_context(W * m, dt)
    x = _halves(world.rank, (W * m,), dt, 5).to(world.device)
    total = sum(_halves(r, (W * m,), dt, 5).double() for r in range(W))
    want = total[world.rank * m:(world.rank + 1) * m].to(dt)
    out = []
    for name, plan in _plans(world, None, dtype):
        with plan() as st:
            y = RS.reduce_scatter(x, ctx, method=method)
            hits = st["hits"] if st else 0
        out.append((name, _mismatch(y.cpu(), want), hits))
    return out
