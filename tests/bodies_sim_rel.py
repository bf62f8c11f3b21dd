"""Test bodies for the simulator's reliability features: rounding, polling
loops, the race finder (see tests/test_sim_*.py)."""
import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl


# ---------------------------------------------------------------------------
# fp32 -> bf16 / fp16 conversions round to nearest even, as on GPUs
# ---------------------------------------------------------------------------

@ditron.jit
def convert_kernel(x_ptr, bf_ptr, h_ptr, back_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    b = x.to(tl.bfloat16)
    tl.store(bf_ptr + offs, b, mask=mask)
    tl.store(h_ptr + offs, x.to(tl.float16), mask=mask)
    tl.store(back_ptr + offs, b.to(tl.float16), mask=mask)     # bf16 -> fp16 through fp32


def rounding_values():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3000, generator=g) * torch.logspace(-30, 30, 3000)
    # ties and near-ties of bf16 (8 significant bits) and fp16 (11), overflow, subnormals, signed zero
    ties = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -(1 + 2 ** -8), 1 + 2 ** -11,
                         1 + 3 * 2 ** -11, 65519.0, 65520.0, 3.4e38, 1e-40, -1e-45, -0.0, float("inf")])
    return torch.cat([x, ties]).to(torch.float32)


def rounding(world):
    x = rounding_values()
    n = x.numel()
    bf = torch.empty(n, dtype=torch.bfloat16)
    h = torch.empty(n, dtype=torch.float16)
    back = torch.empty(n, dtype=torch.float16)
    convert_kernel[(triton.cdiv(n, 1024),)](x, bf, h, back, n, BLOCK=1024)
    want_bf = x.to(torch.bfloat16)
    bad = (bf.view(torch.int16) != want_bf.view(torch.int16)).nonzero().flatten()
    assert bad.numel() == 0, f"fp32->bf16 differs from torch at {bad[:5].tolist()}: {x[bad[:5]].tolist()} -> " \
                             f"{bf[bad[:5]].tolist()}, torch {want_bf[bad[:5]].tolist()}"
    assert torch.equal(h.view(torch.int16), x.to(torch.float16).view(torch.int16)), "fp32->fp16 differs from torch"
    assert torch.equal(back.view(torch.int16), want_bf.to(torch.float16).view(torch.int16)), \
        "bf16->fp16 differs from torch"
    return n


# ---------------------------------------------------------------------------
# polling loops: program-to-program spins complete, hangs are reported
# ---------------------------------------------------------------------------

@ditron.jit
def program_spin_kernel(flag_ptr, out_ptr, USE_LD: tl.constexpr):
    pid = tl.program_id(0)
    last = tl.num_programs(0) - 1
    if pid == 0:
        # program 0 runs first on the simulator and waits for the last program of the same launch
        if USE_LD:
            while dl.ld(flag_ptr, scope="gpu", semantic="acquire") == 0:
                pass
        else:
            while tl.load(flag_ptr, volatile=True) == 0:
                pass
        tl.store(out_ptr, tl.load(flag_ptr, volatile=True))
    if pid == last:
        dl.st(flag_ptr, 7, scope="gpu", semantic="release")


def program_spin(world, use_ld):
    flag = torch.zeros(1, dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    program_spin_kernel[(4,)](flag, out, USE_LD=use_ld)
    return int(out.item())


@ditron.jit
def poll_hang_kernel(flag_ptr, USE_LD: tl.constexpr):
    if USE_LD:
        while dl.ld(flag_ptr + 1, scope="sys", semantic="acquire") < 1:     # POLL_LD: nobody writes it
            pass
    else:
        while tl.load(flag_ptr + 1, volatile=True) < 1:                     # POLL_VOLATILE
            pass


def poll_hang(world, use_ld, rank):
    flag = ditron.symm_zeros((2,), torch.int32, name="never_set")
    ditron.barrier_all()
    if world.rank == rank:
        poll_hang_kernel[(1,)](flag, USE_LD=use_ld)
    ditron.barrier_all()


def ll_skipped_call(world, skipper, stamp_dir):
    """A rank that skips an ``ll`` all_reduce: the others poll for its packets forever.  Each rank writes the
    wall time at which the good first call finished to ``stamp_dir`` (the hang starts after it)."""
    import importlib
    import os
    import time
    AR = importlib.import_module("ditron.kernels.all_reduce")
    ctx = AR.create_all_reduce_context(120, torch.float32)
    x = torch.ones(120)
    AR.all_reduce(x, ctx, method="ll")
    with open(os.path.join(stamp_dir, f"rank{world.rank}"), "w") as f:
        f.write(repr(time.time()))
    if world.rank != skipper:
        AR.all_reduce(x, ctx, method="ll")
    ditron.barrier_all()


# ---------------------------------------------------------------------------
# the race finder: a producer pushes a tile into the next rank's buffer and
# signals it; the next rank waits and reads.  MODE picks a correct or a racy
# version of each side.
# ---------------------------------------------------------------------------

MODES = ("ok", "fences_ok", "relaxed_flag", "signal_first", "no_wait", "gpu_wait", "relaxed_wait")


@ditron.jit
def push_kernel(x_ptr, rx_ptr, flag_ptr, out_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    me = dl.rank()
    nxt = (me + 1) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    if MODE == "signal_first":
        dl.notify(flag_ptr, nxt, signal=1, sig_op="set", comm_scope="intra_node")
    tl.store(dl.symm_at(rx_ptr + offs, nxt), v, mask=mask)                  # RACE_STORE
    if MODE == "relaxed_flag":
        dl.st(dl.symm_at(flag_ptr, nxt), 1, scope="sys", semantic="relaxed")
    elif MODE == "fences_ok":
        dl.fence("release", "sys")
        dl.st(dl.symm_at(flag_ptr, nxt), 1, scope="sys", semantic="relaxed")
    elif MODE != "signal_first":
        dl.notify(flag_ptr, nxt, signal=1, sig_op="set", comm_scope="intra_node")
    if MODE == "gpu_wait":
        tok = dl.wait(flag_ptr, 1, "gpu", "acquire", waitValue=1)
    elif MODE == "relaxed_wait" or MODE == "fences_ok":
        tok = dl.wait(flag_ptr, 1, "sys", "relaxed", waitValue=1)
        if MODE == "fences_ok":
            dl.fence("acquire", "sys")
    elif MODE != "no_wait":
        tok = dl.wait(flag_ptr, 1, "sys", "acquire", waitValue=1)
    else:
        tok = 0
    got = tl.load(dl.consume_token(rx_ptr + offs, tok), mask=mask)           # RACE_LOAD
    tl.store(out_ptr + offs, got, mask=mask)


def push(world, mode, n=40):
    x = ditron.symm_empty((n,), torch.float32)
    x.copy_(torch.arange(n, dtype=torch.float32) + 1000 * world.rank)
    rx = ditron.symm_zeros((64,), torch.float32, name="rx")
    flag = ditron.symm_zeros((1,), torch.int32, name="flag")
    out = torch.zeros(n)
    ditron.barrier_all()
    push_kernel[(1,)](x, rx, flag, out, n, MODE=mode, BLOCK=64)
    ditron.barrier_all()
    prev = (world.rank - 1) % world.world_size
    return bool(torch.equal(out, torch.arange(n, dtype=torch.float32) + 1000 * prev))
