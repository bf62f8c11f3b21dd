"""Test bodies (run on every rank; see conftest.py) for the zoo's gemm_rs:
seeded random operands, different on every rank (never zeros), checked
against torch's ``(sum over ranks of a_s @ b_s)[rank's rows]`` in float32.
They run on simulated ranks in CI and on GPUs under torchrun."""
import contextlib
import importlib
import time

import torch

import ditron
from bodies_ag_gemm import DTYPES, _check, _rand_of, error_messages
from ditron.kernels.gemm import SIM_CONFIG, GemmConfig
from ditron.kernels.gemm_rs import create_gemm_rs_context, gemm_rs


def _operands(rank, M, K, N, dtype, seed):
    return _rand_of(rank, (M, K), dtype, seed), _rand_of(rank, (K, N), dtype, seed, salt=1)


def _reference(world, M, K, N, dtype, seed):
    """This rank's rows of ``sum_s a_s @ b_s`` (fp32, from the unrounded products)."""
    total = torch.zeros(M, N)
    for s in range(world.world_size):
        a, b = _operands(s, M, K, N, dtype, seed)
        total += a.float() @ b.float()
    m = M // world.world_size
    return total[world.rank * m:(world.rank + 1) * m]


def _sim_options(world, options):
    """Small tiles on the simulator unless the test chose a config."""
    if world.backend == "sim":
        options.setdefault("config", SIM_CONFIG)
    return options


@contextlib.contextmanager
def _held_after_copies(hold):
    """``"ce"``: this rank sleeps ``hold`` seconds between its copy-engine
    sequence and its reduction (the simulator's streams are synchronous), so
    its peers' next copies into its slots must wait for its ``free`` flags."""
    G = importlib.import_module("ditron.kernels.gemm_rs")
    copy = G._copy_ce

    def held(*args):
        copy(*args)
        time.sleep(hold)
    G._copy_ce = held
    try:
        yield
    finally:
        G._copy_ce = copy


def gemm_rs_calls(world, dtype, method, shapes, N=40, seed=0, delay=0.0, hold=0.0, **options):
    """One context (the largest M, ``N`` columns), one call per ``(m, K)`` of
    ``shapes`` (``M = world * m``), in order: every call reuses the context.
    All calls are queued first, then checked.  ``delay``: before call ``i``,
    rank ``i % world`` sleeps that long (its peers' reductions must wait for
    its partial products, not read stale or zero rows).  ``hold`` (``"ce"``):
    in call ``i`` the same rank also sleeps between its copies and its
    reduction (its peers' copies of call ``i + 1`` must wait until it has
    read their copies of call ``i``).  Returns the calls counted by the
    reduction and by the GEMM."""
    dtype = DTYPES[dtype]
    W = world.world_size
    ctx = create_gemm_rs_context(W * max(m for m, _ in shapes), N, dtype, method=method,
                                 **_sim_options(world, options))
    results = []
    for i, (m, K) in enumerate(shapes):
        late = W > 1 and world.rank == i % W
        if delay and late:
            time.sleep(delay)
        a, b = _operands(world.rank, W * m, K, N, dtype, seed + i)
        with _held_after_copies(hold) if hold and late else contextlib.nullcontext():
            results.append(gemm_rs(a.to(world.device), b.to(world.device), ctx))
    for i, ((m, K), out) in enumerate(zip(shapes, results)):
        assert out.shape == (m, N) and out.dtype == dtype, (out.shape, out.dtype)
        _check(out, _reference(world, W * m, K, N, dtype, seed + i), f"{method} call {i} m={m} K={K} rank={world.rank}")
    return int(ctx.calls[0]), int(ctx.gcalls[0])


def gemm_rs_out_and_strides(world, method):
    """A given ``out`` that is a column slice of a wider tensor (row stride !=
    N), a transposed ``a`` and a transposed ``b`` (no unit last stride)."""
    W, m, K, N = world.world_size, 5, 48, 24
    dtype = torch.float16
    ctx = create_gemm_rs_context(W * m, N, dtype, method=method, **_sim_options(world, {}))
    a, b = _operands(world.rank, W * m, K, N, dtype, 5)
    at = a.t().contiguous().to(world.device)
    bt = b.t().contiguous().to(world.device)
    wide = torch.full((m, N + 8), -1.0, dtype=dtype, device=world.device)
    out = wide[:, 4:4 + N]
    res = gemm_rs(at.t(), bt.t(), ctx, out=out)
    assert res is out
    _check(out, _reference(world, W * m, K, N, dtype, 5), f"{method} out/strides")
    assert bool((wide[:, :4] == -1).all()) and bool((wide[:, 4 + N:] == -1).all()), "wrote outside 'out'"
    return int(ctx.calls[0])


def method_choice(world):
    """The method ``"auto"`` picks, and the error of ``"ce"`` (one node only)."""
    ctx = create_gemm_rs_context(4 * world.world_size, 16, torch.float16, **_sim_options(world, {}))
    try:
        create_gemm_rs_context(4 * world.world_size, 16, torch.float16, method="ce", **_sim_options(world, {}))
    except ditron.DitronError as e:
        return ctx.method, str(e)
    return ctx.method, None


def errors(world):
    """Messages of the errors raised before launch (nothing is launched)."""
    W = world.world_size
    dev = world.device
    msgs = {}
    ctx = create_gemm_rs_context(8 * W, 16, torch.float16, **_sim_options(world, {}))

    def t(*shape, dtype=torch.float16):
        return torch.ones(*shape, dtype=dtype, device=dev)

    a, b = t(4 * W, 32), t(32, 16)
    cases = {
        "too_many_rows": lambda: gemm_rs(t(9 * W, 32), b, ctx),
        "wrong_n": lambda: gemm_rs(a, t(32, 24), ctx),
        "a_dtype": lambda: gemm_rs(a.to(torch.bfloat16), b.to(torch.bfloat16), ctx),
        "a_fp32": lambda: gemm_rs(a.float(), b.float(), ctx),
        "b_dtype": lambda: gemm_rs(a, b.float(), ctx),
        "b_rows": lambda: gemm_rs(a, t(16, 16), ctx),
        "a_1d": lambda: gemm_rs(a.reshape(-1), b, ctx),
        "out_shape": lambda: gemm_rs(a, b, ctx, out=t(4 * W + 1, 16)),     # never (M / W, N) = (4, 16), W = 1 too
        "out_dtype": lambda: gemm_rs(a, b, ctx, out=t(4, 16, dtype=torch.bfloat16)),
        "ctx_dtype": lambda: create_gemm_rs_context(8 * W, 16, torch.float64),     # float32: for fp8 operands
        "ctx_method": lambda: create_gemm_rs_context(8 * W, 16, torch.float16, method="ring"),
        "ctx_max_m": lambda: create_gemm_rs_context(W - 1, 16, torch.float16),
        "ctx_config": lambda: create_gemm_rs_context(8 * W, 16, torch.float16,
                                                     config=GemmConfig(block_m=24)),
    }
    if W > 1:                       # at W = 1 every M is a multiple of the world size: that call would launch
        cases["m_not_multiple"] = lambda: gemm_rs(t(4 * W + 1, 32), b, ctx)
    msgs.update(error_messages(cases))
    assert int(ctx.calls[0]) == 0 and int(ctx.gcalls[0]) == 0       # nothing was launched
    return msgs


def gluon_errors(world):
    """core="gluon" (kernels/gemm_rs_hopper.py): what the context and a call refuse before launch."""
    W = world.world_size
    opts = _sim_options(world, {})
    gctx = create_gemm_rs_context(8 * W, 16, torch.bfloat16, method="ce", core="gluon", **opts)
    a = torch.ones(4 * W, 32, device=world.device).to(torch.float8_e4m3fn)
    b = torch.ones(32, 16, device=world.device).to(torch.float8_e4m3fn)
    sa = torch.ones(4 * W, 1, device=world.device)
    sb = torch.ones(1, 16, device=world.device)
    cases = {
        "core": lambda: create_gemm_rs_context(8 * W, 16, torch.float16, core="cublas"),
        "gluon_scatter": lambda: create_gemm_rs_context(8 * W, 16, torch.float16, method="scatter", core="gluon"),
        "gluon_fp32": lambda: create_gemm_rs_context(8 * W, 16, torch.float32, method="ce", core="gluon"),
        "gluon_config_tl": lambda: create_gemm_rs_context(8 * W, 16, torch.float16, gluon_config=object()),
        "gluon_config_type": lambda: create_gemm_rs_context(8 * W, 16, torch.float16, method="ce", core="gluon",
                                                            gluon_config=3),
        "gluon_fp8_call": lambda: gemm_rs(a, b, gctx, scale_a=sa, scale_b=sb),
    }
    msgs = error_messages(cases)
    assert gctx.core == "gluon" and gctx.gluon_config is not None
    assert int(gctx.calls[0]) == 0 and int(gctx.gcalls[0]) == 0     # nothing was launched
    return msgs


def gluon_matches_twin(world, shapes, N):
    """GPUs (issue 52 item 4): on the same operands, a ``core="gluon"`` context and a ``core="tl"`` one whose
    config is the Gluon config's twin (``gemm_hopper.twin_config``: same tiles, same BLOCK_K) give bit-identical
    results (the partials are then the same bits, and so are the copies and the reduction), and both are right."""
    from ditron.kernels import gemm_hopper as H
    W = world.world_size
    max_m = W * max(m for m, _ in shapes)
    gctx = create_gemm_rs_context(max_m, N, torch.bfloat16, method="ce", core="gluon")
    tctx = create_gemm_rs_context(max_m, N, torch.bfloat16, method="ce", config=H.twin_config(gctx.gluon_config))
    for i, (m, K) in enumerate(shapes):
        a, b = (x.to(world.device) for x in _operands(world.rank, W * m, K, N, torch.bfloat16, 21 + i))
        fast = gemm_rs(a, b, gctx)
        slow = gemm_rs(a, b, tctx)
        _check(fast, _reference(world, W * m, K, N, torch.bfloat16, 21 + i), f"gluon m={m} K={K} rank={world.rank}")
        assert torch.equal(fast, slow), (f"gluon vs tl twin m={m} K={K} rank={world.rank}: "
                                         f"{int((fast != slow).sum())} of {fast.numel()} entries differ")
    return len(shapes)
