"""Test bodies (run on every rank; see conftest.py) for the all_reduce zoo
kernel.  The same bodies run on simulated ranks in CI and on GPUs under
torchrun: inputs are seeded per (rank, seed) so every rank can build the
reference (the fp32 sum over ranks) without communicating."""
import hashlib

import torch

import ditron
import importlib

AR = importlib.import_module("ditron.kernels.all_reduce")   # the module (ditron.kernels.all_reduce is the function)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: (rtol, atol) against the fp32 reference: the result is the fp32 sum rounded
#: once to the dtype (rounded to nearest on GPUs and on the simulator).
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _dtype(d):
    return DTYPES[d] if isinstance(d, str) else d


def _x_of(rank, shape, dtype, seed):
    g = torch.Generator().manual_seed(100003 * seed + rank)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)


def _ref(world_size, shape, dtype, seed):
    return sum(_x_of(q, shape, dtype, seed).float() for q in range(world_size))


def _digest(t):
    return hashlib.sha1(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _check(out, world_size, shape, dtype, seed, what):
    ref = _ref(world_size, shape, dtype, seed)
    rtol, atol = TOL[dtype]
    assert out.dtype == dtype and tuple(out.shape) == tuple(shape), (what, out.dtype, out.shape)
    torch.testing.assert_close(out.float().cpu(), ref, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def check_methods(world, methods, sizes, dtype, max_numel=None, inplace=False, multicast=None, **tuning):
    """Every method x size against torch; returns the digests of the results
    (the caller checks that every rank got bitwise the same)."""
    dtype = _dtype(dtype)
    ctx = AR.create_all_reduce_context(max_numel or max(sizes), dtype, multicast=multicast)
    digests = {}
    for method in methods:
        for i, n in enumerate(sizes):
            seed = 7 * i + len(method)
            x = _x_of(world.rank, n, dtype, seed).to(world.device)
            if inplace:
                out = AR.all_reduce(x, ctx, out=x, method=method, **tuning)
                assert out is x
            else:
                out = AR.all_reduce(x, ctx, method=method, **tuning)
                torch.testing.assert_close(x.cpu(), _x_of(world.rank, n, dtype, seed))    # input untouched
            _check(out, world.world_size, (n,), dtype, seed, f"{method} n={n} {dtype}")
            digests[f"{method}/{n}"] = _digest(out)
    return digests


def shapes_and_auto(world, dtype):
    """method='auto' on 2-D inputs, out given, sizes around the thresholds."""
    dtype = _dtype(dtype)
    ctx = AR.create_all_reduce_context(3000, dtype)
    chosen = []
    for seed, shape in enumerate([(3, 5), (40, 25), (1,), (2, 3, 7)]):
        x = _x_of(world.rank, shape, dtype, seed).to(world.device)
        out = torch.empty_like(x)
        assert AR.all_reduce(x, ctx, out=out) is out
        _check(out, world.world_size, shape, dtype, seed, f"auto {shape}")
        chosen.append(AR.choose_method(ctx, x.numel()))
    return chosen


def reuse(world, iters, methods, n, dtype):
    """``iters`` calls on one context, cycling through ``methods`` and three
    sizes, with fresh inputs each call and no barrier in between (a rank may
    run a call ahead of its peers); results are checked after the loop so that
    nothing synchronises the ranks on GPUs either."""
    dtype = _dtype(dtype)
    ctx = AR.create_all_reduce_context(n, dtype)
    outs = []
    for i in range(iters):
        size = n - 7 * (i % 3)
        x = _x_of(world.rank, size, dtype, 1000 + i).to(world.device)
        outs.append(AR.all_reduce(x, ctx, method=methods[i % len(methods)]))
    for i, out in enumerate(outs):
        _check(out, world.world_size, (n - 7 * (i % 3),), dtype, 1000 + i, f"call {i} ({methods[i % len(methods)]})")
    return int(ctx.calls[0].item()), int(ctx.calls[1].item())


def cuda_graph(world, n, dtype, method, replays):
    """Capture one all_reduce in a CUDA graph and replay it on new inputs."""
    dtype = _dtype(dtype)
    ctx = AR.create_all_reduce_context(n, dtype)
    x = torch.empty(n, dtype=dtype, device=world.device)
    out = torch.empty_like(x)
    x.copy_(_x_of(world.rank, n, dtype, 0))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                       # compile and warm up outside the capture
        AR.all_reduce(x, ctx, out=out, method=method)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    _check(out, world.world_size, (n,), dtype, 0, f"{method} eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        AR.all_reduce(x, ctx, out=out, method=method)
    for i in range(1, replays + 1):
        x.copy_(_x_of(world.rank, n, dtype, i))
        graph.replay()
        _check(out, world.world_size, (n,), dtype, i, f"{method} replay {i}")
    return replays


def errors(world):
    """Wrong calls fail on every rank before any launch (so nothing hangs)."""
    ctx = AR.create_all_reduce_context(100, torch.float32)
    dev = world.device
    msgs = []

    def expect(fn, *needles):
        try:
            fn()
        except ditron.DitronError as e:
            msg = str(e)
            assert all(s in msg for s in needles), (msg, needles)
            msgs.append(msg)
        else:
            raise AssertionError(f"no error for {needles}")

    x = torch.ones(100, device=dev)
    expect(lambda: AR.all_reduce(torch.ones(101, device=dev), ctx), "101 elements", "max_numel=100")
    expect(lambda: AR.all_reduce(x.half(), ctx), "torch.float16", "torch.float32")
    expect(lambda: AR.all_reduce(x, ctx, out=torch.empty(99, device=dev)), "'out'", "99 elements")
    expect(lambda: AR.all_reduce(x, ctx, out=x.half()), "'out'", "torch.float16")
    expect(lambda: AR.all_reduce(x, ctx, method="three_shot"), "unknown method 'three_shot'")
    expect(lambda: AR.all_reduce(torch.ones(10, 10, device=dev).t(), ctx), "contiguous")
    expect(lambda: AR.all_reduce(x, ctx, method="one_shot", block=24), "block=24")
    expect(lambda: AR.all_reduce(x, ctx, method="two_shot", block=16, chunk=40), "chunk=40")
    expect(lambda: AR.all_reduce(x, object()), "create_all_reduce_context")
    if torch.device(dev).type == "cuda":
        expect(lambda: AR.all_reduce(x.cpu(), ctx), "is on cpu")
    expect(lambda: AR.create_all_reduce_context(10, torch.int32), "int32", "not supported")
    big = AR.create_all_reduce_context(AR.LL_MAX_BYTES // 2 + 10, torch.float16)
    expect(lambda: AR.all_reduce(torch.ones(big.max_numel, dtype=torch.float16, device=dev), big, method="ll"),
           "method='ll'", f"at most {AR.LL_MAX_BYTES // 2}")
    if world.backend != "sim":
        expect(lambda: AR.all_reduce(x, ctx, method="multimem_one_shot"), "multicast")
        expect(lambda: AR.create_all_reduce_context(10, torch.float32, multicast=True), "multicast")
    # nothing was launched: the call counter is untouched, and the context still works
    assert int(ctx.calls[0].item()) == 0
    _check(AR.all_reduce(_x_of(world.rank, 100, torch.float32, 5).to(dev), ctx), world.world_size, (100,),
           torch.float32, 5, "after errors")
    return len(msgs)


def auto_choices(world, multicast):
    """What method='auto' picks by size (host logic; no launch)."""
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        esize = torch.empty((), dtype=dtype).element_size()
        one_shot_max = AR.AUTO_ONE_SHOT_MAX_BYTES * 4 // max(4, world.world_size) // esize
        ctx = AR.create_all_reduce_context(one_shot_max + 1, dtype, multicast=multicast)
        ll_max = AR.AUTO_LL_MAX_BYTES // esize
        out[str(dtype)] = [AR.choose_method(ctx, n) for n in (1, ll_max, ll_max + 1, one_shot_max, one_shot_max + 1)]
    return out
