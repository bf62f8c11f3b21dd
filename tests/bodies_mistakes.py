"""Test bodies (run on every simulated rank) for user mistakes that must be
errors naming the mistake, not silent wrong results (issue 25)."""
import torch
import triton
import triton.language as tl

import ditron
import ditron.task as dtask


@triton.jit
def square_tile(tile, x, out, n, BLOCK: tl.constexpr):
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    tl.store(out + offs, v * v, mask=m)


@triton.jit
def square_tile_and_spill(tile, x, out, spill, n, BLOCK: tl.constexpr):
    """Also writes ``spill`` (which the task may forget to declare)."""
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    tl.store(out + offs, v * v, mask=m)
    tl.store(spill + offs, v, mask=m)


def megakernel_mistake(world, mistake, scheduler="round_robin"):
    """Ordinary (non-symmetric) tensors; ``mistake``: None (correct graph), "narrow" (b's tiles read two of
    a's tiles, the Dep covers one), "undeclared_write" (a also writes ``spill`` without writes=),
    "undeclared_read" (b reads t without reads=), "war" (c overwrites what b reads without a Dep on b)."""
    n = 30                                          # not a multiple of the tiles
    g = torch.Generator().manual_seed(7 + world.rank)
    x = torch.randn(n, generator=g)
    t, u, spill = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    gr = dtask.TaskGraph("mistake")
    a_fn = square_tile_and_spill if mistake == "undeclared_write" else square_tile
    a_args = {"x": x, "out": t, "n": n, "BLOCK": 8}
    if mistake == "undeclared_write":
        a_args["spill"] = spill
    a = gr.register_task(a_fn, name="a", num_tiles=4, args=a_args, reads=("x",), writes=("out",))
    hi = 1 if mistake == "narrow" else 2
    b = gr.register_task(square_tile, name="b", num_tiles=2, args={"x": t, "out": u, "n": n, "BLOCK": 16},
                         reads=() if mistake == "undeclared_read" else ("x",), writes=("out",),
                         deps=[dtask.Dep(a, lambda i: (2 * i, min(4, 2 * i + hi)))])
    if mistake == "war":
        # c overwrites t, which b reads; its Dep on b is an empty range: the graph's (per-task) hazard check
        # passes, but no tile of b is ordered before the tile of c that overwrites its input
        gr.register_task(square_tile, name="c", num_tiles=4, args={"x": x, "out": t, "n": n, "BLOCK": 8},
                         reads=("x",), writes=("out",), deps=[dtask.Dep(a, "same"), dtask.Dep(b, lambda i: (0, 0))])
    mk = gr.compile(scheduler=scheduler, num_programs=3)
    mk.step()
    torch.testing.assert_close(u, x ** 4)
    return True


def without_taskcheck(world, body, *args, **kwargs):
    """Run ``body`` with the megakernel access check off (to see what the race finder alone reports)."""
    import os
    old = os.environ.get("DITRON_SIM_TASKCHECK")
    os.environ["DITRON_SIM_TASKCHECK"] = "0"
    try:
        return body(world, *args, **kwargs)
    finally:
        if old is None:
            del os.environ["DITRON_SIM_TASKCHECK"]
        else:
            os.environ["DITRON_SIM_TASKCHECK"] = old


# ---------------------------------------------------------------------------
# tensor bounds, not heap bounds (symm_at stores, gets, signals)
# ---------------------------------------------------------------------------

import ditron.language as dl  # noqa: E402
from ditron.language import shmem  # noqa: E402


@ditron.jit
def push_kernel(x_ptr, dst_ptr, n, LIMIT, BLOCK: tl.constexpr):
    """Push x (n elements) into the next rank's dst; lanes >= LIMIT are masked (LIMIT = n is right; a larger
    LIMIT is the mistake: it stores past the end of dst)."""
    offs = tl.arange(0, BLOCK)
    peer = (dl.rank() + 1) % dl.num_ranks()
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(dl.symm_at(dst_ptr + offs, peer), v, mask=offs < LIMIT)


def symm_store_past_end(world, limit_extra):
    """dst (128 elements) is followed by another symmetric tensor: a store past dst's end must not land in it."""
    n = 128
    x = torch.arange(n, dtype=torch.float32)
    dst = ditron.symm_zeros((n,), torch.float32, name="dst")
    after = ditron.symm_zeros((64,), torch.float32, name="after")
    ditron.barrier_all()
    push_kernel[(1,)](x, dst, n, n + limit_extra, BLOCK=256)
    ditron.barrier_all()
    assert float(after.abs().sum()) == 0.0
    torch.testing.assert_close(dst, x)
    return True


@ditron.jit
def get_kernel(src_ptr, out_ptr, nbytes):
    shmem.getmem_block(out_ptr, src_ptr, nbytes, (dl.rank() + 1) % dl.num_ranks())


def get_too_much(world, extra_bytes):
    n = 64
    src = ditron.symm_zeros((n,), torch.float32, name="src")
    out = torch.zeros(n + 64, dtype=torch.float32)
    ditron.barrier_all()
    get_kernel[(1,)](src, out, n * 4 + extra_bytes)
    ditron.barrier_all()
    return True


@ditron.jit
def signal_kernel(sig_ptr, index):
    dl.notify(sig_ptr + index, (dl.rank() + 1) % dl.num_ranks(), signal=1, sig_op="set", comm_scope="intra_node")


def signal_past_end(world, index):
    sig = ditron.symm_zeros((4,), torch.int32, name="flags")
    ditron.symm_zeros((4,), torch.int32, name="next_flags")
    ditron.barrier_all()
    signal_kernel[(1,)](sig, index)
    ditron.barrier_all()
    return True


# ---------------------------------------------------------------------------
# ranks allocate alike
# ---------------------------------------------------------------------------

def extra_allocation(world, odd_rank):
    """Rank ``odd_rank`` allocates one extra symmetric tensor (-1: none does); then every rank allocates 'b'."""
    import time
    a = ditron.symm_zeros((64,), torch.float32, name="a")
    if world.rank == odd_rank:
        ditron.symm_zeros((16,), torch.float32, name="extra")
    else:
        time.sleep(0.3)                            # the odd rank allocates first: the others find the mismatch
    b = ditron.symm_zeros((32,), torch.bfloat16, name="b")
    ditron.barrier_all()
    return a.numel() + b.numel()


def graphs_of_different_sizes(world, differ):
    """A graph with an all-reduce; with ``differ`` rank 0 adds one more all-reduce (a compute task that only
    one rank has is allowed: compute may be split unevenly)."""
    from ditron.task import comm
    n = 64
    x, y, out = torch.ones(n), torch.zeros(n), torch.zeros(n)
    g = dtask.TaskGraph("sizes")
    a = g.register_task(square_tile, name="a", num_tiles=2, args={"x": x, "out": y, "n": n, "BLOCK": 32},
                        reads=("x",), writes=("out",))
    if world.rank == 0:
        g.register_task(square_tile, name="extra", num_tiles=2, args={"x": x, "out": x, "n": n, "BLOCK": 32},
                        reads=("x",), writes=("out",), deps=[dtask.Dep(a)])
    if differ and world.rank == 0:
        comm.all_reduce(g, "ar0", torch.ones(n), torch.zeros(n), block=32)
    comm.all_reduce(g, "ar", y, out, deps=[dtask.Dep(a)], block=32)
    mk = g.compile()
    mk.step()
    torch.testing.assert_close(out, torch.full((n,), float(world.world_size)))
    return True


# ---------------------------------------------------------------------------
# reports that point at the user
# ---------------------------------------------------------------------------

def torch_op_mismatch(world, odd_rank):
    """torch.ops.ditron.all_reduce with another method on ``odd_rank`` (a mismatch report, no hang)."""
    import ditron.torch_ops  # noqa: F401 -- registers torch.ops.ditron.*
    x = torch.ones(64)
    torch.ops.ditron.all_reduce(x)
    method = "two_shot" if world.rank == odd_rank else "one_shot"
    return float(torch.ops.ditron.all_reduce(x, method).sum())


def ep_call_mismatch(world, odd_rank):
    """Every rank dispatches, then combines -- except ``odd_rank``, which dispatches again (a skipped
    ep_combine)."""
    from ditron.kernels.ep import create_ep_context, ep_combine, ep_dispatch
    H, E, k = 16, 2 * world.world_size, 2
    ctx = create_ep_context(4, H, E, k, torch.float32)
    x = torch.ones(4, H)
    idx = torch.stack([torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int64)], 1)
    w = torch.full((4, k), 0.5)
    recv_x, recv_counts, handle = ep_dispatch(x, idx, w, ctx)
    if world.rank == odd_rank:
        ep_dispatch(x, idx, w, ctx)
    else:
        ep_combine(recv_x, handle, ctx)
    return int(recv_counts.sum())


@triton.jit
def _wait_in_helper(sig_ptr):
    dl.wait(sig_ptr + 1, 1, "sys", "acquire", waitValue=1)


@ditron.jit
def helper_wait_kernel(sig_ptr):
    _wait_in_helper(sig_ptr)


def hang_in_helper(world):
    sig = ditron.symm_zeros((4,), torch.int32, name="ready_flags")
    helper_wait_kernel[(1,)](sig)


# ---------------------------------------------------------------------------
# the simulator rejects what GPUs reject
# ---------------------------------------------------------------------------

@triton.jit
def plain_rank_kernel(out_ptr):
    tl.store(out_ptr, dl.rank())


@ditron.jit
def ditron_rank_kernel(out_ptr):
    tl.store(out_ptr, dl.rank())


def rank_in_kernel(world, plain):
    out = torch.full((1,), -1, dtype=torch.int32)
    (plain_rank_kernel if plain else ditron_rank_kernel)[(1,)](out)
    return int(out[0])


# ---------------------------------------------------------------------------
# gpu-scope-wait across kernels
# ---------------------------------------------------------------------------

@ditron.jit
def produce_kernel(flag_ptr):
    dl.notify(flag_ptr, (dl.rank() + 1) % dl.num_ranks(), signal=1, sig_op="set", comm_scope="intra_node")


@ditron.jit
def consume_kernel(flag_ptr, SCOPE: tl.constexpr):
    dl.wait(flag_ptr, 1, SCOPE, "acquire", waitValue=1)       # LINT_LINE


def flag_from_another_kernel(world, scope):
    """One kernel signals the next rank's flag, another waits on it (scope ``scope``); returns the lint
    warnings of this rank."""
    import os
    import warnings
    from ditron.errors import DitronLintWarning
    flag = ditron.symm_zeros((1,), torch.int32, name="flag")
    ditron.barrier_all()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        produce_kernel[(1,)](flag)
        consume_kernel[(1,)](flag, SCOPE=scope)
    return [(str(w.message), os.path.basename(w.filename), w.lineno) for w in got
            if issubclass(w.category, DitronLintWarning)]
