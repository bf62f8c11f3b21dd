"""Test bodies (run on every rank; see conftest.py) for the zoo's all_gather,
reduce_scatter and all_to_all: random inputs seeded per rank (never zeros),
checked against torch.  They run on simulated ranks in CI and on GPUs under
torchrun; the reuse bodies take an iteration count (100 in the simulator,
1000 on GPUs) and queue every call before checking any result, so on GPUs
ranks really run ahead of each other."""
import torch

import ditron
from ditron.kernels.all_gather import all_gather, create_all_gather_context
from ditron.kernels.all_to_all import all_to_all, all_to_all_v, create_all_to_all_context
from ditron.kernels.reduce_scatter import create_reduce_scatter_context, reduce_scatter

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
AG_METHODS = ("push", "pull", "ring", "ce")
RS_METHODS = ("mesh", "ring")


def _rand_of(rank, shape, dtype, seed):
    g = torch.Generator().manual_seed(1_000_003 * seed + 7919 * rank + 17)
    return (torch.randn(shape, generator=g, dtype=torch.float32) + 0.5).to(dtype)


def _dev(world, t):
    return t.to(world.device)


def _tol(dtype):
    return {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
            torch.bfloat16: dict(rtol=1.6e-2, atol=2e-2)}[dtype]


# ---------------------------------------------------------------------------
# all_gather
# ---------------------------------------------------------------------------

def _ag_ref(world, shape, dtype, seed):
    parts = [_rand_of(r, shape, dtype, seed) for r in range(world.world_size)]
    return torch.stack(parts) if len(shape) == 0 else torch.cat(parts)


def all_gather_sizes(world, dtype, method, sizes, seed=0):
    """One context (the largest size), one call per size: exact copies."""
    dtype = DTYPES[dtype]
    ctx = create_all_gather_context(max(sizes), dtype)
    for i, n in enumerate(sizes):
        x = _dev(world, _rand_of(world.rank, (n,), dtype, seed + i))
        out = all_gather(x, ctx, method=method)
        assert out.shape == (world.world_size * n,), out.shape
        ref = _ag_ref(world, (n,), dtype, seed + i)
        assert torch.equal(out.cpu(), ref), f"{method} n={n}: {(out.cpu() != ref).nonzero()[:4].tolist()}"
    return int(ctx.calls[0])


def all_gather_shapes(world, method):
    """2-D and 0-d inputs, a given ``out``, a symmetric input."""
    ctx = create_all_gather_context(5 * 7, torch.float16)
    W = world.world_size
    x = _dev(world, _rand_of(world.rank, (5, 7), torch.float16, 11))
    out = all_gather(x, ctx, method=method)
    assert out.shape == (W * 5, 7)
    assert torch.equal(out.cpu(), _ag_ref(world, (5, 7), torch.float16, 11))
    s = _dev(world, _rand_of(world.rank, (), torch.float16, 12))
    out0 = all_gather(s, ctx, method=method)
    assert out0.shape == (W,) and torch.equal(out0.cpu(), _ag_ref(world, (), torch.float16, 12))
    sym = ditron.symm_empty((33,), torch.float16)
    sym.copy_(_rand_of(world.rank, (33,), torch.float16, 13))
    given = torch.full((W, 33), -1.0, dtype=torch.float16, device=world.device)
    res = all_gather(sym, ctx, out=given, method=method)
    assert res is given and torch.equal(given.cpu().reshape(-1), _ag_ref(world, (33,), torch.float16, 13))
    return int(ctx.calls[0])


def reuse_sizes(iters, largest, seed):
    """The sizes of the reuse bodies' calls: seeded draws from 0..largest (a longer run's first ``iters`` draws
    are these)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, largest + 1, (iters,), generator=g).tolist()


AG_REUSE = dict(max_n=160, seed=5)      # all_gather_reuse: sizes 0..max_n from this seed
RS_REUSE = dict(max_m=40, seed=6)       # reduce_scatter_reuse: shards 0..max_m from this seed


def all_gather_reuse(world, iters, max_n=AG_REUSE["max_n"], dtype="bf16"):
    """``iters`` calls of one context: methods cycle, sizes vary, fresh data;
    every call is queued before any result is checked."""
    dtype = DTYPES[dtype]
    ctx = create_all_gather_context(max_n, dtype)
    sizes = reuse_sizes(iters, max_n, AG_REUSE["seed"])
    xs = [_dev(world, _rand_of(world.rank, (n,), dtype, 100 + i)) for i, n in enumerate(sizes)]
    outs = [all_gather(x, ctx, method=AG_METHODS[i % 4]) for i, x in enumerate(xs)]
    for i, (n, out) in enumerate(zip(sizes, outs)):
        assert torch.equal(out.cpu(), _ag_ref(world, (n,), dtype, 100 + i)), f"iteration {i} ({AG_METHODS[i % 4]})"
    return int(ctx.calls[0])


# ---------------------------------------------------------------------------
# reduce_scatter
# ---------------------------------------------------------------------------

def _rs_ref(world, numel, dtype, seed):
    W = world.world_size
    m = numel // W
    total = sum(_rand_of(r, (numel,), dtype, seed).float() for r in range(W))
    return total[world.rank * m:(world.rank + 1) * m].to(dtype)


def reduce_scatter_sizes(world, dtype, method, shard_sizes, seed=0):
    dtype = DTYPES[dtype]
    W = world.world_size
    ctx = create_reduce_scatter_context(W * max(shard_sizes), dtype)
    for i, m in enumerate(shard_sizes):
        x = _dev(world, _rand_of(world.rank, (W * m,), dtype, seed + i))
        out = reduce_scatter(x, ctx, method=method)
        assert out.shape == (m,), out.shape
        torch.testing.assert_close(out.cpu(), _rs_ref(world, W * m, dtype, seed + i), **_tol(dtype))
    return int(ctx.calls[0])


def reduce_scatter_shapes(world, method):
    """[W * 3, 5] -> [3, 5]; a flat odd size -> [m]; a given out; symmetric x."""
    W = world.world_size
    ctx = create_reduce_scatter_context(W * 15, torch.float32)
    x = _dev(world, _rand_of(world.rank, (W * 3, 5), torch.float32, 21))
    out = reduce_scatter(x, ctx, method=method)
    assert out.shape == (3, 5)
    torch.testing.assert_close(out.cpu().reshape(-1), _rs_ref(world, W * 15, torch.float32, 21), **_tol(torch.float32))
    sym = ditron.symm_empty((W * 7,), torch.float32)
    sym.copy_(_rand_of(world.rank, (W * 7,), torch.float32, 22))
    given = torch.zeros(7, dtype=torch.float32, device=world.device)
    assert reduce_scatter(sym, ctx, out=given, method=method) is given
    torch.testing.assert_close(given.cpu(), _rs_ref(world, W * 7, torch.float32, 22), **_tol(torch.float32))
    return int(ctx.calls[0])


def reduce_scatter_reuse(world, iters, max_m=RS_REUSE["max_m"], dtype="fp16"):
    dtype = DTYPES[dtype]
    W = world.world_size
    ctx = create_reduce_scatter_context(W * max_m, dtype)
    sizes = reuse_sizes(iters, max_m, RS_REUSE["seed"])
    xs = [_dev(world, _rand_of(world.rank, (W * m,), dtype, 200 + i)) for i, m in enumerate(sizes)]
    outs = [reduce_scatter(x, ctx, method=RS_METHODS[i % 2]) for i, x in enumerate(xs)]
    for i, (m, out) in enumerate(zip(sizes, outs)):
        torch.testing.assert_close(out.cpu(), _rs_ref(world, W * m, dtype, 200 + i), **_tol(dtype),
                                   msg=lambda s, i=i: f"iteration {i} ({RS_METHODS[i % 2]}): {s}")
    return int(ctx.calls[0])


# ---------------------------------------------------------------------------
# all_to_all
# ---------------------------------------------------------------------------

def _a2a_ref(world, t, hidden, dtype, seed):
    W, me = world.world_size, world.rank
    return torch.cat([_rand_of(s, (W * t, hidden), dtype, seed)[me * t:(me + 1) * t] for s in range(W)])


def _splits_of(rank, W, max_tokens, seed):
    """Random counts per destination (some zero), summing to at most max_tokens."""
    g = torch.Generator().manual_seed(31 * seed + rank)
    total = int(torch.randint(0, max_tokens + 1, (1,), generator=g))
    cuts = torch.sort(torch.randint(0, total + 1, (W - 1,), generator=g)).values
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([total])])
    return bounds[1:] - bounds[:-1]


def _a2av_ref(world, max_tokens, hidden, dtype, seed):
    W, me = world.world_size, world.rank
    parts = []
    for s in range(W):
        sp = _splits_of(s, W, max_tokens, seed)
        xs = _rand_of(s, (int(sp.sum()), hidden), dtype, seed)
        start = int(sp[:me].sum())
        parts.append(xs[start:start + int(sp[me])])
    return torch.cat(parts), [p.shape[0] for p in parts]


def _a2av_inputs(world, max_tokens, hidden, dtype, seed, splits_dtype=torch.int32):
    sp = _splits_of(world.rank, world.world_size, max_tokens, seed)
    x = _rand_of(world.rank, (int(sp.sum()), hidden), dtype, seed)
    return _dev(world, x), _dev(world, sp.to(splits_dtype))


def all_to_all_sizes(world, dtype, tokens_per_rank, hidden, seed=0):
    dtype = DTYPES[dtype]
    W = world.world_size
    ctx = create_all_to_all_context(W * max(tokens_per_rank), hidden, dtype)
    for i, t in enumerate(tokens_per_rank):
        x = _dev(world, _rand_of(world.rank, (W * t, hidden), dtype, seed + i))
        out = all_to_all(x, ctx)
        assert out.shape == (W * t, hidden)
        assert torch.equal(out.cpu(), _a2a_ref(world, t, hidden, dtype, seed + i)), f"t={t}"
    return int(ctx.calls[0])


def all_to_all_v_calls(world, dtype, max_tokens, hidden, calls, seed=0):
    dtype = DTYPES[dtype]
    W = world.world_size
    ctx = create_all_to_all_context(max_tokens, hidden, dtype)
    for i in range(calls):
        x, splits = _a2av_inputs(world, max_tokens, hidden, dtype, seed + i,
                                 torch.int32 if i % 2 == 0 else torch.int64)
        out, counts = all_to_all_v(x, splits, ctx)
        assert out.shape == (W * max_tokens, hidden) and counts.dtype == torch.int64
        ref, ref_counts = _a2av_ref(world, max_tokens, hidden, dtype, seed + i)
        assert counts.cpu().tolist() == ref_counts, (counts.cpu().tolist(), ref_counts)
        got = out.cpu()[:int(counts.sum())]
        assert torch.equal(got, ref), f"call {i}"
    return int(ctx.calls[0])


def all_to_all_reuse(world, iters, max_tokens=8, hidden=16, dtype="bf16"):
    """Equal and variable splits alternate on one context; all calls queued
    before the checks."""
    dtype = DTYPES[dtype]
    W = world.world_size
    ctx = create_all_to_all_context(max_tokens, hidden, dtype)
    t_max = max_tokens // W
    results = []
    for i in range(iters):
        if i % 2 == 0:
            t = (i // 2) % (t_max + 1)
            x = _dev(world, _rand_of(world.rank, (W * t, hidden), dtype, 300 + i))
            results.append(("eq", t, all_to_all(x, ctx)))
        else:
            x, splits = _a2av_inputs(world, max_tokens, hidden, dtype, 300 + i)
            results.append(("v", None, all_to_all_v(x, splits, ctx)))
    for i, (kind, t, res) in enumerate(results):
        if kind == "eq":
            assert torch.equal(res.cpu(), _a2a_ref(world, t, hidden, dtype, 300 + i)), f"iteration {i} (equal)"
        else:
            out, counts = res
            ref, ref_counts = _a2av_ref(world, max_tokens, hidden, dtype, 300 + i)
            assert counts.cpu().tolist() == ref_counts, f"iteration {i}: counts {counts.tolist()} != {ref_counts}"
            assert torch.equal(out.cpu()[:len(ref)], ref), f"iteration {i} (variable)"
    return int(ctx.calls[0])


# ---------------------------------------------------------------------------
# every op, every method, on one world (the 3-, 8-rank and 2-node subsets)
# ---------------------------------------------------------------------------

def every_op(world, dtype="fp16", ag_sizes=(37, 300), rs_shards=(37, 1), a2a_v_calls=2):
    calls = []
    # the copy engine reaches this node's ranks only
    for method in AG_METHODS if world.nnodes == 1 else [m for m in AG_METHODS if m != "ce"]:
        calls.append(all_gather_sizes(world, dtype, method, ag_sizes, seed=41))
    for method in RS_METHODS:
        calls.append(reduce_scatter_sizes(world, dtype, method, rs_shards, seed=42))
    calls.append(all_to_all_sizes(world, dtype, (3,), 5, seed=43))
    calls.append(all_to_all_v_calls(world, dtype, 9, 7, a2a_v_calls, seed=44))
    return calls


# ---------------------------------------------------------------------------
# errors before launch
# ---------------------------------------------------------------------------

def _error(fn):
    try:
        fn()
    except ditron.DitronError as e:
        return str(e)
    return None


def errors(world):
    W = world.world_size
    dev = world.device
    ag = create_all_gather_context(10, torch.float16)
    rs = create_reduce_scatter_context(4 * W, torch.float32)
    a2a = create_all_to_all_context(2 * W, 8, torch.bfloat16)
    h16 = torch.ones(10, dtype=torch.float16, device=dev)
    msgs = {
        "ag_too_big": _error(lambda: all_gather(torch.ones(11, dtype=torch.float16, device=dev), ag)),
        "ag_dtype": _error(lambda: all_gather(torch.ones(10, dtype=torch.float32, device=dev), ag)),
        "ag_device": _error(lambda: all_gather(torch.ones(10, dtype=torch.float16, device="meta"), ag)),
        "ag_method": _error(lambda: all_gather(h16, ag, method="tree")),
        "ag_out": _error(lambda: all_gather(h16, ag, out=torch.empty(10 * W + 1, dtype=torch.float16, device=dev))),
        "ag_strided": _error(lambda: all_gather(torch.ones(20, dtype=torch.float16, device=dev)[::2], ag)),
        "ag_dtype_ctx": _error(lambda: create_all_gather_context(4, torch.int32)),
        # one rank: every count is a multiple of the world size (no error to provoke: None, nothing launched)
        "rs_not_multiple": _error(lambda: reduce_scatter(torch.ones(W + 1, device=dev), rs)) if W > 1 else None,
        "rs_too_big": _error(lambda: reduce_scatter(torch.ones(8 * W, device=dev), rs)),
        "rs_method": _error(lambda: reduce_scatter(torch.ones(W, device=dev), rs, method="tree")),
        "a2a_hidden": _error(lambda: all_to_all(torch.ones(W, 9, dtype=torch.bfloat16, device=dev), a2a)),
        "a2a_tokens": _error(lambda: all_to_all(torch.ones(3 * W, 8, dtype=torch.bfloat16, device=dev), a2a)),
        "a2a_not_multiple": _error(lambda: all_to_all(torch.ones(W + 1, 8, dtype=torch.bfloat16, device=dev), a2a)
                                   if W > 1 else None),
        "a2a_splits": _error(lambda: all_to_all_v(torch.ones(2, 8, dtype=torch.bfloat16, device=dev),
                                                  torch.ones(W, dtype=torch.float32, device=dev), a2a)),
        "a2a_splits_len": _error(lambda: all_to_all_v(torch.ones(2, 8, dtype=torch.bfloat16, device=dev),
                                                      torch.ones(W + 1, dtype=torch.int32, device=dev), a2a)),
    }
    # nothing was launched: the call counters are untouched
    assert int(ag.calls[0]) == int(rs.calls[0]) == int(a2a.calls[0]) == 0
    return msgs


# ---------------------------------------------------------------------------
# GPUs only: CUDA-graph capture and replay
# ---------------------------------------------------------------------------

def graph_replay(world, replays=20, n=4099):
    """Capture one all_gather, one reduce_scatter and one all_to_all in a
    CUDA graph and replay it with fresh inputs copied into the static ones."""
    if world.backend == "sim":
        return None
    W = world.world_size
    dtype = torch.bfloat16
    ag = create_all_gather_context(n, dtype)
    rs = create_reduce_scatter_context(W * n, dtype)
    a2a = create_all_to_all_context(W * 16, 64, dtype)
    x_ag = torch.empty(n, dtype=dtype, device=world.device)
    x_rs = torch.empty(W * n, dtype=dtype, device=world.device)
    x_a2a = torch.empty(W * 16, 64, dtype=dtype, device=world.device)
    x_ag.copy_(_rand_of(world.rank, (n,), dtype, 0))
    x_rs.copy_(_rand_of(world.rank, (W * n,), dtype, 0))
    x_a2a.copy_(_rand_of(world.rank, (W * 16, 64), dtype, 0))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                      # warm-up (compiles) outside the capture
        all_gather(x_ag, ag)
        reduce_scatter(x_rs, rs)
        all_to_all(x_a2a, a2a)
    torch.cuda.current_stream().wait_stream(s)
    ditron.barrier_all()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_ag = all_gather(x_ag, ag)
        o_rs = reduce_scatter(x_rs, rs)
        o_a2a = all_to_all(x_a2a, a2a)
    for i in range(replays):
        x_ag.copy_(_rand_of(world.rank, (n,), dtype, 500 + i))
        x_rs.copy_(_rand_of(world.rank, (W * n,), dtype, 500 + i))
        x_a2a.copy_(_rand_of(world.rank, (W * 16, 64), dtype, 500 + i))
        graph.replay()
        assert torch.equal(o_ag.cpu(), _ag_ref(world, (n,), dtype, 500 + i)), f"replay {i}: all_gather"
        torch.testing.assert_close(o_rs.cpu(), _rs_ref(world, W * n, dtype, 500 + i), **_tol(dtype))
        assert torch.equal(o_a2a.cpu(), _a2a_ref(world, 16, 64, dtype, 500 + i)), f"replay {i}: all_to_all"
    return int(ag.calls[0]), int(rs.calls[0]), int(a2a.calls[0])
