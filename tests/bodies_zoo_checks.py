"""Bodies for test_zoo_checks.py: every fingerprint field of every zoo op,
differing on the last rank only, and mixed symmetric / plain kernel operands
through the runtime's launch check."""
import torch
import triton.language as tl

import ditron
import ditron.language as dl
from ditron import kernels as K

DT, OTHER = torch.float16, torch.float32


def _error(fn):
    try:
        fn()
    except ditron.DitronError as e:
        return str(e)
    return None


def _case(world, op, field, odd):
    """A call of ``op`` whose fingerprint field ``field`` differs when ``odd`` (the last rank)."""
    W = world.world_size
    if op == "all_reduce":
        ctx = K.create_all_reduce_context(256, DT)
        kw = {"method": "one_shot", "block": None, "chunk": None, "programs": None}
        n, dt = 64, DT
        if odd:
            if field in ("block", "chunk", "programs"):
                kw[field] = {"block": 128, "chunk": 32, "programs": 2}[field]
            elif field == "method":
                kw["method"] = "two_shot"
        n = 60 if odd and field == "x.shape" else n
        dt = OTHER if odd and field == "x.dtype" else dt
        return lambda: K.all_reduce(torch.ones(n, dtype=dt), ctx, **kw)
    if op in ("all_gather", "reduce_scatter"):
        create = K.create_all_gather_context if op == "all_gather" else K.create_reduce_scatter_context
        fn = K.all_gather if op == "all_gather" else K.reduce_scatter
        ctx = create(64 * W, DT)
        n = W * (16 if odd and field == "x.shape" else 32)
        dt = OTHER if odd and field == "x.dtype" else DT
        m = {"all_gather": ("push", "pull"), "reduce_scatter": ("mesh", "ring")}[op]
        method = m[1] if odd and field == "method" else m[0]
        return lambda: fn(torch.ones(n, dtype=dt), ctx, method=method)
    if op in ("all_to_all", "all_to_all_v"):
        ctx = K.create_all_to_all_context(8 * W, 8, DT)
        rows = W * (2 if odd and field == "x.shape" else 4)
        hidden = 4 if odd and field == "x.shape[1:]" else 8
        dt = OTHER if odd and field == "x.dtype" else DT
        x = torch.ones(rows, hidden, dtype=dt)
        if op == "all_to_all":
            return lambda: K.all_to_all(x, ctx)
        return lambda: K.all_to_all_v(x, torch.full((W,), rows // W, dtype=torch.int32), ctx)
    if op == "ag_gemm":
        ctx = K.create_ag_gemm_context(16, 16, DT)
        m = 3 if odd and field == "a.shape" else 4
        dt = OTHER if odd and field == "a.dtype" else DT
        return lambda: K.ag_gemm(torch.ones(m, 16, dtype=dt), torch.ones(16, 16, dtype=dt), ctx)
    if op == "gemm_rs":
        ctx = K.create_gemm_rs_context(16 * W, 16, DT)
        m = 2 if odd and field == "a.shape" else 4
        k = 8 if odd and field == "b.shape" else 16
        dt = OTHER if odd and field == "a.dtype" else DT
        return lambda: K.gemm_rs(torch.ones(W * m, 16, dtype=dt), torch.ones(k, 16, dtype=dt), ctx)
    if op == "gemm_ar":
        ctx = K.create_gemm_ar_context(16, 16, DT)
        m = 3 if odd and field == "M" else 4
        dt = OTHER if odd and field == "a.dtype" else DT
        method = "two_shot" if odd and field == "method" else "one_shot"
        return lambda: K.gemm_ar(torch.ones(m, 16, dtype=dt), torch.ones(16, 16, dtype=dt), ctx, method=method)
    raise AssertionError(op)


def divergent_fields(world, cases):
    """For each (op, field): the error this rank got when the last rank's ``field`` differed."""
    out = []
    for op, field in cases:
        call = _case(world, op, field, odd=world.rank == world.world_size - 1)
        out.append(_error(call))
        ditron.barrier_all()
    return out


@ditron.jit
def two_peer_kernel(x_ptr, y_ptr, peer):
    v = tl.load(dl.symm_at(x_ptr, peer))
    tl.store(dl.symm_at(y_ptr, peer), v)


def mixed_operands(world):
    """x symmetric and y plain (positional and keyword), then the reverse: the launch check names the plain
    one; both symmetric: the launch runs."""
    sx = ditron.symm_zeros((4,), torch.float32, name="sx")
    sy = ditron.symm_zeros((4,), torch.float32, name="sy")
    px, py = torch.zeros(4), torch.zeros(4)
    peer = (world.rank + 1) % world.world_size
    msgs = [_error(lambda: two_peer_kernel[(1,)](sx, py, peer)),
            _error(lambda: two_peer_kernel[(1,)](sx, y_ptr=py, peer=peer)),
            _error(lambda: two_peer_kernel[(1,)](px, sy, peer)),
            _error(lambda: two_peer_kernel[(1,)](x_ptr=px, y_ptr=sy, peer=peer))]
    ditron.barrier_all()
    msgs.append(_error(lambda: two_peer_kernel[(1,)](sx, sy, peer)))
    ditron.barrier_all()
    return msgs
