"""Bodies of tests/test_reliability_api.py: misuse of the zoo's collectives
that must fail loudly on every rank (cross-rank argument checks, context
type, aliasing, heap_scope lifetime, failed creations).  Each body runs on
every rank and returns what it saw; the test asserts on it."""
import torch

import ditron
from ditron import kernels as K


def _error(fn):
    try:
        fn()
    except ditron.DitronError as e:
        return str(e)
    return None


def _ctx_and_call(world, op, method, n):
    """A context of ``op`` and a function that calls ``op`` once on ``n`` elements per rank."""
    W, dt = world.world_size, torch.float16
    x = torch.ones(n, dtype=dt)
    if op == "all_reduce":
        ctx = K.create_all_reduce_context(256, dt)
        return ctx, lambda m: K.all_reduce(x[:m], ctx, method=method)
    if op == "all_gather":
        ctx = K.create_all_gather_context(256, dt)
        return ctx, lambda m: K.all_gather(x[:m], ctx, method=method)
    if op == "reduce_scatter":
        ctx = K.create_reduce_scatter_context(256 * W, dt)
        xs = torch.ones(W * n, dtype=dt)
        return ctx, lambda m: K.reduce_scatter(xs[:W * m], ctx, method=method)
    if op == "all_to_all":
        ctx = K.create_all_to_all_context(8 * W, 4, dt)
        xs = torch.ones(8 * W, 4, dtype=dt)
        return ctx, lambda m: K.all_to_all(xs[:W * (m % 8 + 1)], ctx)
    if op == "ag_gemm":
        ctx = K.create_ag_gemm_context(16, 16, dt)
        b = torch.ones(16, 16, dtype=dt)
        return ctx, lambda m: K.ag_gemm(torch.ones(m % 16 + 1, 16, dtype=dt), b, ctx)
    if op == "gemm_rs":
        ctx = K.create_gemm_rs_context(16 * W, 16, dt)
        b = torch.ones(16, 16, dtype=dt)
        return ctx, lambda m: K.gemm_rs(torch.ones(W * (m % 16 + 1), 16, dtype=dt), b, ctx)
    if op == "gemm_ar":
        ctx = K.create_gemm_ar_context(16, 16, dt)
        b = torch.ones(16, 16, dtype=dt)
        return ctx, lambda m: K.gemm_ar(torch.ones(m % 16 + 1, 16, dtype=dt), b, ctx, method=method)
    raise AssertionError(op)


def divergent(world, op, method, good=120, bad=100):
    """Two agreeing calls, then rank 0 passes ``bad`` elements and the others
    ``good``: every rank must raise, nothing may be launched."""
    _, call = _ctx_and_call(world, op, method, max(good, bad))
    call(good)
    call(good)
    return _error(lambda: call(bad if world.rank == 0 else good))


def divergent_method(world, methods):
    """Rank 0 uses another method than the others."""
    ctx = K.create_all_reduce_context(256, torch.float32)
    x = torch.ones(64)
    K.all_reduce(x, ctx, method=methods[1])
    return _error(lambda: K.all_reduce(x, ctx, method=methods[0] if world.rank == 0 else methods[1]))


def skip_call(world, op, method, stamp_dir=None):
    """Rank 0 makes one call fewer than the others and returns: the others
    must not hang silently (the test expects a hang report).  With
    ``stamp_dir``, each rank writes the wall time at which the good first call
    finished there (the hang starts after it)."""
    import os
    import time
    _, call = _ctx_and_call(world, op, method, 40)
    call(40)
    if stamp_dir is not None:
        with open(os.path.join(stamp_dir, f"rank{world.rank}"), "w") as f:
            f.write(repr(time.time()))
    if world.rank != 0:
        call(40)
    return "done"


def wrong_context(world):
    """Every pairing of a context with another op's function."""
    W = world.world_size
    rs = K.create_reduce_scatter_context(64 * W, torch.float32)
    ag = K.create_all_gather_context(64, torch.float32)
    x = torch.ones(64)
    return [_error(lambda: K.all_gather(x, rs)), _error(lambda: K.reduce_scatter(torch.ones(64 * W), ag)),
            _error(lambda: K.all_reduce(x, ag)), _error(lambda: K.all_to_all(torch.ones(W, 4), rs)),
            _error(lambda: K.all_gather(x, "not a context"))]


def aliasing(world):
    """Inputs and outputs that overlap the context's own buffers."""
    ctx = K.create_all_reduce_context(64, torch.float32)
    ag = K.create_all_gather_context(64, torch.float32)
    return [_error(lambda: K.all_reduce(ctx.buf[:64], ctx)),
            _error(lambda: K.all_reduce(torch.ones(64), ctx, out=ctx.buf[64:128])),
            _error(lambda: K.all_gather(ag.buf[0, 0, :8], ag))]


def scope_lifetime(world):
    """A context and a tensor made inside a heap_scope, used after it ended
    (after a newer allocation took their memory)."""
    with ditron.heap_scope():
        ctx = K.create_all_reduce_context(64, torch.float32)
        t = ditron.symm_zeros((64,), torch.float32, name="scoped")
    newer = ditron.symm_zeros((1 << 12,), torch.float32, name="newer")
    newer.fill_(7)
    errs = [_error(lambda: K.all_reduce(torch.ones(64), ctx)),
            _error(lambda: K.all_reduce(t, K.create_all_reduce_context(64, torch.float32))),
            _error(lambda: ditron.peer_tensor(t, (world.rank + 1) % world.world_size))]
    return errs, bool((newer == 7).all())


def failed_creation(world):
    """A context creation that fails after allocating gives its memory back."""
    heap = world.heap
    before = heap.mark()
    # all_gather's context allocates 2 * W slots, then its signals, then one more slot: size the slot so
    # that the first allocations fit and the last one does not (heap full half-way through the creation)
    W = world.world_size
    slot = (heap.size - heap.top) * 2 // (4 * W + 1) // 4        # 2W slots use 4W/(4W+1) of the free heap
    errs = [_error(lambda: K.create_gemm_rs_context(max(1, W - 1), 16, torch.float16)),
            _error(lambda: K.create_all_gather_context(slot, torch.float32))]
    return errs, heap.mark() == before


def dtype_strings(world):
    out = []
    for name in ("float16", "bf16", "fp32", "torch.int64", "i32"):
        out.append(str(ditron.symm_empty((4,), name).dtype))
    out.append(str(ditron.symm_zeros((4,), "half").dtype))
    return out, _error(lambda: ditron.symm_empty((4,), "float17")), _error(lambda: ditron.symm_empty((4,), 3))


def reinit_settings(world):
    """A second init asking for other settings is an error; the same settings return the world."""
    same = ditron.init() is world and ditron.init(heap_size=world.heap_size) is world
    return same, _error(lambda: ditron.init(heap_size=world.heap_size // 2))
