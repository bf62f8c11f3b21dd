"""Test bodies (run on every rank; see conftest.py) for the zoo's gemm_ar:
seeded random per-rank operands (never zeros; every rank can rebuild every
other rank's) checked against torch's ``sum_s a_s @ b_s`` in float32.  They
run on simulated ranks in CI and on GPUs under torchrun."""
import hashlib
import importlib
import time

import torch

import ditron
from bodies_ag_gemm import DTYPES, _check, _rand_of, error_messages

GA = importlib.import_module("ditron.kernels.gemm_ar")


def _operands(rank, M, N, K, dtype, seed):
    """Rank ``rank``'s ``a`` [M, K] and ``b`` [K, N] (CPU)."""
    return _rand_of(rank, (M, K), dtype, seed), _rand_of(rank, (K, N), dtype, seed, salt=1)


def _reference(W, M, N, ks, dtype, seed):
    return sum(a.float() @ b.float() for a, b in (_operands(r, M, N, ks[r], dtype, seed) for r in range(W)))


def _digest(t):
    return hashlib.sha1(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def gemm_ar_calls(world, dtype, calls, per_rank_k=False, seed=0, delay=0.0, **options):
    """One context (the largest M, the calls' N), one ``gemm_ar`` per
    ``(method, M, N, K)`` of ``calls``, in order (every call reuses the
    context).  ``per_rank_k``: rank ``r`` uses ``K + 8 * r`` columns of ``a``.
    ``delay``: before call ``i``, rank ``i % world`` sleeps that long (its peers
    must wait for its tiles, not read stale ones).  All calls are queued first,
    then checked.  Returns (calls the context counted, digest of every result):
    the caller checks that every rank got the same bits."""
    dtype = DTYPES[dtype]
    W = world.world_size
    ctx = GA.create_gemm_ar_context(max(c[1] for c in calls), calls[0][2], dtype, **options)
    results = []
    for i, (method, M, N, K) in enumerate(calls):
        ks = [K + 8 * r if per_rank_k else K for r in range(W)]
        if delay and W > 1 and world.rank == i % W:
            time.sleep(delay)
        a, b = _operands(world.rank, M, N, ks[world.rank], dtype, seed + i)
        results.append((ks, GA.gemm_ar(a.to(world.device), b.to(world.device), ctx, method=method)))
    digests = []
    for i, ((method, M, N, K), (ks, out)) in enumerate(zip(calls, results)):
        assert out.shape == (M, N) and out.dtype == dtype, (out.shape, out.dtype)
        _check(out, _reference(W, M, N, ks, dtype, seed + i), f"call {i} {method} M={M} N={N} rank={world.rank}")
        digests.append(_digest(out))
    return int(ctx.calls[0]), digests


def gemm_ar_out_and_strides(world, method):
    """A given, strided ``out`` (a column slice), a transposed ``a`` and ``b``."""
    W, M, N, K = world.world_size, 21, 24, 40
    ctx = GA.create_gemm_ar_context(M, N, torch.float16)
    a, b = _operands(world.rank, M, N, K, torch.float16, 5)
    at = a.t().contiguous().to(world.device).t()
    bt = b.t().contiguous().to(world.device).t()
    big = torch.full((M, N + 8), -1.0, dtype=torch.float16, device=world.device)
    out = big[:, 4:4 + N]
    assert GA.gemm_ar(at, bt, ctx, out=out, method=method) is out
    _check(out, _reference(W, M, N, [K] * W, torch.float16, 5), f"{method} out/strides")
    assert bool((big[:, :4] == -1).all()) and bool((big[:, 4 + N:] == -1).all()), "wrote outside out"
    return int(ctx.calls[0])


def auto_choices(world, multicast):
    """``choose_method`` for outputs around the one-shot threshold, and one
    ``auto`` call checked against torch."""
    n = 256
    ctx = GA.create_gemm_ar_context(4096, n, torch.bfloat16, multicast=multicast)
    limit = GA.AUTO_ONE_SHOT_MAX_BYTES * 4 // max(4, world.world_size) // (2 * n)     # rows at the threshold
    chosen = [GA.choose_method(ctx, m) for m in (1, limit, limit + 1, 4096)]
    a, b = _operands(world.rank, 3, n, 16, torch.bfloat16, 9)
    out = GA.gemm_ar(a.to(world.device), b.to(world.device), ctx)
    _check(out, _reference(world.world_size, 3, n, [16] * world.world_size, torch.bfloat16, 9), "auto")
    return chosen


def errors(world):
    """Messages of the errors raised before launch (nothing is launched)."""
    dev = world.device
    ctx = GA.create_gemm_ar_context(8, 16, torch.float16)
    a = torch.ones(5, 32, dtype=torch.float16, device=dev)
    b = torch.ones(32, 16, dtype=torch.float16, device=dev)
    cases = {
        "too_many_rows": lambda: GA.gemm_ar(torch.ones(9, 32, dtype=torch.float16, device=dev), b, ctx),
        "no_rows": lambda: GA.gemm_ar(torch.ones(0, 32, dtype=torch.float16, device=dev), b, ctx),
        "wrong_n": lambda: GA.gemm_ar(a, torch.ones(32, 24, dtype=torch.float16, device=dev), ctx),
        "a_dtype": lambda: GA.gemm_ar(a.to(torch.bfloat16), b.to(torch.bfloat16), ctx),
        "a_fp32": lambda: GA.gemm_ar(a.float(), b.float(), ctx),
        "b_dtype": lambda: GA.gemm_ar(a, b.float(), ctx),
        "b_rows": lambda: GA.gemm_ar(a, b[:16], ctx),
        "a_1d": lambda: GA.gemm_ar(a.reshape(-1), b, ctx),
        "out_shape": lambda: GA.gemm_ar(a, b, ctx, out=torch.empty(4, 16, dtype=torch.float16, device=dev)),
        "out_dtype": lambda: GA.gemm_ar(a, b, ctx, out=torch.empty(5, 16, dtype=torch.bfloat16, device=dev)),
        "method": lambda: GA.gemm_ar(a, b, ctx, method="three_shot"),
        "ctx": lambda: GA.gemm_ar(a, b, object()),
        "ctx_dtype": lambda: GA.create_gemm_ar_context(8, 16, torch.float64),     # float32: for fp8 operands
        "ctx_size": lambda: GA.create_gemm_ar_context(0, 16, torch.float16),
        "ctx_programs": lambda: GA.create_gemm_ar_context(8, 16, torch.float16, reduce_programs=-1),
    }
    msgs = error_messages(cases)
    assert int(ctx.calls[0]) == 0       # nothing was launched
    return msgs


def multimem_multi_node_error(world):
    """The multimem methods refuse a world of several nodes before launch."""
    ctx = GA.create_gemm_ar_context(8, 16, torch.bfloat16)
    a = torch.ones(5, 32, dtype=torch.bfloat16, device=world.device)
    b = torch.ones(32, 16, dtype=torch.bfloat16, device=world.device)
    msgs = []
    for method in GA.MULTIMEM_METHODS:
        try:
            GA.gemm_ar(a, b, ctx, method=method)
        except ditron.DitronError as e:
            msgs.append(str(e))
    assert int(ctx.calls[0]) == 0
    return msgs, GA.choose_method(ctx, 5), ctx.multicast


def rs_ag_calls(world, calls=3, m=6, N=40, K=48, seed=5, delay=0.3, method="rs_ag", **options):
    """Method "rs_ag" (gemm_rs "ce" + all_gather "ce"): reused context, a
    delayed rank per call, against torch; then its errors.  ``options``: the
    context's (``core="gluon"``: "auto" is "rs_ag")."""
    W = world.world_size
    dtype = torch.bfloat16
    ctx = GA.create_gemm_ar_context(W * m, N, dtype, **options)
    for i in range(calls):
        if delay and W > 1 and world.rank == i % W:
            time.sleep(delay)
        a = _rand_of(world.rank, (W * m, K), dtype, seed + i).to(world.device)
        b = _rand_of(world.rank, (K, N), dtype, seed + i, salt=1).to(world.device)
        out = GA.gemm_ar(a, b, ctx, method=method)
        ref = sum(_rand_of(r, (W * m, K), dtype, seed + i).float() @ _rand_of(r, (K, N), dtype, seed + i, salt=1).float()
                  for r in range(W))
        _check(out, ref, f"rs_ag call {i}")
    msgs = []
    for fn in (lambda: GA.gemm_ar(torch.ones(W * m - 1 if W > 1 else 0, K, dtype=dtype, device=world.device),
                                  torch.ones(K, N, dtype=dtype, device=world.device), ctx, method=method),):
        try:
            fn()
        except ditron.DitronError as e:
            msgs.append(str(e))
    return calls, msgs


def gluon_errors(world):
    """core="gluon": what the context and a call refuse before launch (several nodes: the context)."""
    dev = world.device
    W = world.world_size
    if world.nnodes > 1:
        return error_messages({"gluon_nodes": lambda: GA.create_gemm_ar_context(8, 16, torch.bfloat16, core="gluon")})
    ctx = GA.create_gemm_ar_context(4 * W, 16, torch.bfloat16, core="gluon")
    a = torch.ones(4 * W, 32, dtype=torch.bfloat16, device=dev)
    b = torch.ones(32, 16, dtype=torch.bfloat16, device=dev)
    f8 = torch.float8_e4m3fn
    cases = {
        "core": lambda: GA.create_gemm_ar_context(8, 16, torch.float16, core="cublas"),
        "gluon_fp32": lambda: GA.create_gemm_ar_context(8, 16, torch.float32, core="gluon"),
        "gluon_config_tl": lambda: GA.create_gemm_ar_context(8, 16, torch.float16, gluon_config=object()),
        "gluon_config_type": lambda: GA.create_gemm_ar_context(8, 16, torch.float16, core="gluon", gluon_config=3),
        "gluon_method": lambda: GA.gemm_ar(a, b, ctx, method="one_shot"),
        "gluon_fp8": lambda: GA.gemm_ar(a.to(f8), b.to(f8), ctx, scale_a=torch.ones(4 * W, 1, device=dev),
                                        scale_b=torch.ones(1, 16, device=dev)),
    }
    if W > 1:
        cases["gluon_m"] = lambda: GA.gemm_ar(a[:4 * W - 1], b, ctx)
    msgs = error_messages(cases)
    assert GA.choose_method(ctx, 4 * W) == "rs_ag" and ctx._rs_ag is None     # nothing was launched
    return msgs
