"""Test bodies (run on every rank; see conftest.py) for the zoo's ag_gemm:
seeded random shards (never zeros) checked against torch's
``all_gather(a) @ b`` in float32.  They run on simulated ranks in CI and on
GPUs under torchrun."""
import time

import torch

import ditron
from ditron.kernels.ag_gemm import ag_gemm, create_ag_gemm_context

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _rand_of(rank, shape, dtype, seed, salt=0):
    g = torch.Generator().manual_seed(1_000_003 * seed + 7919 * rank + 104_729 * salt + 17)
    return (torch.randn(shape, generator=g, dtype=torch.float32) + 0.25).to(dtype)


def _check(got, ref, what):
    got = got.float().cpu()
    err = (got - ref).abs().max().item()
    scale = ref.abs().max().item() + 1e-6
    assert err <= 2e-2 * scale + 1e-2, f"{what}: max abs error {err} (scale {scale})"


def error_messages(cases):
    """``{name: message of the DitronError that cases[name]() raised, or None}``."""
    msgs = {}
    for name, fn in cases.items():
        try:
            fn()
        except ditron.DitronError as e:
            msgs[name] = str(e)
        else:
            msgs[name] = None
    return msgs


def ag_gemm_calls(world, dtype, shapes, per_rank_b=False, seed=0, delay=0.0, **options):
    """One context (the largest m), one call per ``(m, N)`` of ``shapes``, in
    order (every call reuses the context).  All calls are queued first, then
    checked.  ``delay``: before call ``i``, rank ``i % world`` sleeps that long
    (its peers must wait for its segment, not read stale or zero rows).
    Returns the number of calls the context counted."""
    dtype = DTYPES[dtype]
    W, K = world.world_size, shapes[0][2] if len(shapes[0]) > 2 else 32
    ctx = create_ag_gemm_context(max(s[0] for s in shapes), K, dtype, **options)
    results = []
    for i, (m, N, *_rest) in enumerate(shapes):
        if delay and W > 1 and world.rank == i % W:
            time.sleep(delay)
        a = _rand_of(world.rank, (m, K), dtype, seed + i).to(world.device)
        b = _rand_of(world.rank if per_rank_b else 0, (K, N), dtype, seed + i, salt=1).to(world.device)
        results.append((m, N, ag_gemm(a, b, ctx), b.float().cpu()))
    for i, (m, N, c, b) in enumerate(results):
        assert c.shape == (W * m, N) and c.dtype == dtype, (c.shape, c.dtype)
        full = torch.cat([_rand_of(r, (m, K), dtype, seed + i) for r in range(W)]).float()
        _check(c, full @ b, f"call {i} m={m} N={N} rank={world.rank}")
    return int(ctx.calls[0])


def ag_gemm_out_and_strided_b(world):
    """A given ``out`` and a transposed (non-contiguous) ``b``."""
    W, m, K, N = world.world_size, 5, 32, 24
    ctx = create_ag_gemm_context(m, K, torch.float16)
    a = _rand_of(world.rank, (m, K), torch.float16, 3).to(world.device)
    bt = _rand_of(0, (N, K), torch.float16, 3, salt=1).to(world.device)
    out = torch.full((W * m, N), -1.0, dtype=torch.float16, device=world.device)
    res = ag_gemm(a, bt.t(), ctx, out=out)
    assert res is out
    full = torch.cat([_rand_of(r, (m, K), torch.float16, 3) for r in range(W)]).float()
    _check(out, full @ bt.float().cpu().t(), "out/strided b")
    return int(ctx.calls[0])


def errors(world):
    """Messages of the errors raised before launch (nothing is launched)."""
    ctx = create_ag_gemm_context(8, 32, torch.float16)
    a = torch.ones(5, 32, dtype=torch.float16, device=world.device)
    b = torch.ones(32, 16, dtype=torch.float16, device=world.device)
    cases = {
        "too_many_rows": lambda: ag_gemm(torch.ones(9, 32, dtype=torch.float16, device=world.device), b, ctx),
        "no_rows": lambda: ag_gemm(torch.ones(0, 32, dtype=torch.float16, device=world.device), b, ctx),
        "wrong_k": lambda: ag_gemm(torch.ones(5, 16, dtype=torch.float16, device=world.device),
                                   b[:16].contiguous(), ctx),
        "a_dtype": lambda: ag_gemm(a.to(torch.bfloat16), b, ctx),
        "b_dtype": lambda: ag_gemm(a, b.float(), ctx),
        "b_rows": lambda: ag_gemm(a, b[:16], ctx),
        "a_1d": lambda: ag_gemm(a.reshape(-1), b, ctx),
        "out_shape": lambda: ag_gemm(a, b, ctx, out=torch.empty(5 * world.world_size + 1, 16, dtype=torch.float16,
                                                                 device=world.device)),
        "ctx_dtype": lambda: create_ag_gemm_context(8, 32, torch.float32),
        "producer": lambda: create_ag_gemm_context(8, 32, torch.float16, producer="nccl"),
        "option": lambda: create_ag_gemm_context(8, 32, torch.float16, block_q=16),
        "core": lambda: create_ag_gemm_context(8, 32, torch.float16, core="cublas"),
        "gluon_sm": lambda: create_ag_gemm_context(8, 32, torch.float16, core="gluon", producer="sm"),
        "gluon_fp8": lambda: create_ag_gemm_context(8, 32, torch.float8_e4m3fn, core="gluon"),
        "gluon_config_tl": lambda: create_ag_gemm_context(8, 32, torch.float16, gluon_config=object()),
        "gluon_config_type": lambda: create_ag_gemm_context(8, 32, torch.float16, core="gluon", gluon_config=3),
    }
    msgs = error_messages(cases)
    assert int(ctx.calls[0]) == 0       # nothing was launched
    return msgs


def tutorial(world, m=5, N=24, K=48):
    """docs/zoo.md's walk-through: step 0 (plain Triton GEMM) on this rank and
    step 3 (AllGather-GEMM) across ranks, against torch."""
    from ditron.kernels.ag_gemm_tutorial import matmul_kernel, tutorial_ag_gemm
    W = world.world_size
    a = _rand_of(world.rank, (m, K), torch.float16, 11).to(world.device)
    b = _rand_of(0, (K, N), torch.float16, 11, salt=1).to(world.device)
    c0 = torch.empty((m, N), dtype=torch.float16, device=world.device)
    # the walk-through's first step: the same function under @ditron.jit (the simulator runs ditron kernels;
    # Triton 3.6's own interpreter fails on range(K) with NumPy >= 2.4, which ditron's executor fixes)
    ditron.jit(matmul_kernel.fn)[(1 * 2,)](a, b, c0, m, N, K, BLOCK_M=16, BLOCK_N=16, BLOCK_K=32)
    _check(c0, a.float().cpu() @ b.float().cpu(), "step 0")
    with ditron.heap_scope():
        c = tutorial_ag_gemm(a, b)
    full = torch.cat([_rand_of(r, (m, K), torch.float16, 11) for r in range(W)]).float()
    _check(c, full @ b.float().cpu(), "step 3")
    return c.shape[0]
