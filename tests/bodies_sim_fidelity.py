"""Bodies of tests/test_sim_fidelity.py: the simulator agrees with a GPU on per-thread code, bf16 / fp8 / libdevice
numerics and tensor descriptors (values computed by torch)."""
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

import ditron
import ditron.language as dl
from ditron.language import shmem


# ---------------------------------------------------------------------------
# per-thread semantics: thread i signals and waits for peer i
# ---------------------------------------------------------------------------

@ditron.jit
def thread_barrier_kernel(flag_ptr, out_ptr, sig_ptr, round_):
    rank = dl.rank()
    n = dl.num_ranks()
    thread_idx = dl.tid(axis=0)
    if thread_idx < n:
        peer = thread_idx
        dl.st(dl.symm_at(flag_ptr + rank, peer), round_, scope="sys", semantic="release")
    if thread_idx < n:
        while dl.ld(flag_ptr + thread_idx, scope="sys", semantic="acquire") != round_:
            pass
    dl.syncthreads()
    if thread_idx < n:
        dl.atomic_add(out_ptr + 1, 1)                 # per thread: n additions
    dl.atomic_add(out_ptr + 2, 1)                     # a scalar outside the branch: every thread adds
    shmem.signal_op(sig_ptr, 1, shmem.NVSHMEM_SIGNAL_ADD, rank)        # thread-level: every thread adds
    if thread_idx == 0:
        shmem.signal_op(sig_ptr, 100, shmem.NVSHMEM_SIGNAL_ADD, rank)  # thread 0 only
    if thread_idx == 0:
        tl.store(out_ptr, dl.num_threads())        # scalar store: thread 0 performs it (last: it publishes nothing)


def thread_barrier(world, rounds=1):
    n = world.world_size
    flag = ditron.symm_zeros((n,), torch.int32, name="flags")
    sig = ditron.symm_zeros((1,), torch.int64, name="sig")
    out = torch.zeros(3, dtype=torch.int32, device=world.device)
    ditron.barrier_all()
    for r in range(1, rounds + 1):
        thread_barrier_kernel[(1,)](flag, out, sig, r, num_warps=2)
    ditron.barrier_all()
    return flag.tolist(), out.tolist(), sig.item()


@ditron.jit
def refused_kernel(flag_ptr, WHICH: tl.constexpr):
    t = dl.tid(0)
    if WHICH == "wait":
        if t < 2:
            dl.wait(flag_ptr, 1, "sys", "acquire", waitValue=0)
    elif WHICH == "ballot":
        if t < 16:                         # lanes 16-31 of warp 0 never vote, though the mask names them
            dl.ballot_sync(-1, t > 3)
    elif WHICH == "tl_atomic":
        if t < 2:
            tl.atomic_add(flag_ptr, 1)
    elif WHICH == "putmem_block":
        if t < 2:
            shmem.putmem_block(flag_ptr, flag_ptr + 8, 4, 0)
    elif WHICH == "tile_store":
        if t < 2:
            tl.store(flag_ptr + tl.arange(0, 2), tl.zeros((2,), tl.int32))


@ditron.jit
def per_thread_load_kernel(flag_ptr):
    t = dl.tid(0)
    v = tl.load(flag_ptr + t)              # each GPU thread has its own v: not modelled outside a branch
    tl.store(flag_ptr, v)


def refused(world, which):
    flag = ditron.symm_zeros((256,), torch.int32)
    if which == "per_thread_load":
        per_thread_load_kernel[(1,)](flag)
    else:
        refused_kernel[(1,)](flag, WHICH=which)


# ---------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------

@ditron.jit
def bf16_kernel(x_ptr, y_ptr, z_ptr, f_ptr, o_ptr, r_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    z = tl.load(z_ptr + offs, mask=m)
    f = tl.load(f_ptr + offs, mask=m)                 # fp32
    outs = (x + y, x - y, x * y, x / y, tl.fma(x, y, z), tl.where(x < y, x, y), tl.maximum(x, y),
            tl.minimum(x, y), -x, x + f, (x * 2.5).to(tl.bfloat16))
    for i in tl.static_range(len(outs)):
        tl.store(o_ptr + i * n + offs, outs[i], mask=m)
    small = tl.where(m, x, 0.0)
    tl.store(r_ptr, tl.sum(small, axis=0))
    tl.store(r_ptr + 1, tl.max(tl.where(m, x, float("-inf")), axis=0))
    tl.store(r_ptr + 2, tl.min(tl.where(m, x, float("inf")), axis=0))


def bf16_arith(world):
    g = torch.Generator().manual_seed(3)
    n = 1000
    x, y, z = [(torch.randn(n, generator=g) * 8).bfloat16() for _ in range(3)]
    y[y == 0] = 1
    f = torch.randn(n, generator=g) * 3
    dev = world.device
    o = torch.empty(11 * n, dtype=torch.bfloat16, device=dev)
    r = torch.empty(3, dtype=torch.bfloat16, device=dev)
    bf16_kernel[(1,)](x.to(dev), y.to(dev), z.to(dev), f.to(dev), o, r, n, BLOCK=1024)
    o, r = o.cpu(), r.cpu()
    X, Y, Z = x.float(), y.float(), z.float()
    want = [x + y, x - y, x * y, x / y, (X.double() * Y.double() + Z.double()).float().bfloat16(),
            torch.where(x < y, x, y), torch.maximum(x, y), torch.minimum(x, y), -x, (X + f).bfloat16(),
            (X * 2.5).bfloat16()]
    names = ["add", "sub", "mul", "div", "fma", "where", "max", "min", "neg", "bf16+fp32", "mul const"]
    bad = []
    for i, (w, name) in enumerate(zip(want, names)):
        got = o[i * n:(i + 1) * n]
        # NVIDIA's `/` is div.full.f32 (within 2 ulp of fp32 division) before cvt.rn.bf16: the GPU's bf16 quotient
        # may be one bf16 ulp off; the simulator divides exactly, so it is checked bitwise
        ulps = 1 if (name == "div" and world.backend != "sim") else 0
        diff = ((got.view(torch.int16).int() - w.view(torch.int16).int()).abs() > ulps).nonzero().flatten()
        if diff.numel():
            j = diff[0].item()
            bad.append(f"{name}: {diff.numel()} differ, first at {j}: x={x[j].item()} y={y[j].item()} "
                       f"got {got[j].item()} torch {w[j].item()}")
    assert not bad, "; ".join(bad)
    # reductions: max/min exact; the sum of small integers is exact in any order
    assert r[1].item() == x.max().item() and r[2].item() == x.min().item(), (r.tolist(), x.max(), x.min())
    ints = torch.arange(-20, 20, dtype=torch.bfloat16)
    r2 = torch.empty(3, dtype=torch.bfloat16, device=dev)
    ints = ints.to(dev)
    bf16_kernel[(1,)](ints, ints + 1, ints, ints.float(), torch.empty(11 * 40, dtype=torch.bfloat16, device=dev), r2,
                      40, BLOCK=64)
    ints, r2 = ints.cpu(), r2.cpu()
    assert r2[0].item() == ints.float().sum().item(), (r2.tolist(), ints.float().sum())
    return n


@ditron.jit
def fp8_kernel(x_ptr, e4_ptr, e5_ptr, back_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    a = x.to(tl.float8e4nv)
    tl.store(e4_ptr + offs, a, mask=m)
    tl.store(e5_ptr + offs, x.to(tl.float8e5), mask=m)
    tl.store(back_ptr + offs, a.to(tl.float32), mask=m)


@ditron.jit
def fp8_dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr):
    r = tl.arange(0, M)
    a = tl.load(a_ptr + r[:, None] * M + r[None, :])
    b = tl.load(b_ptr + r[:, None] * M + r[None, :])
    tl.store(c_ptr + r[:, None] * M + r[None, :], tl.dot(a, b))


def fp8_values():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2000, generator=g) * torch.logspace(-9, 4, 2000)
    # the examples, ties between fp8 neighbours, subnormals, signed zero
    extra = torch.tensor([7.845, 500.0, 0.3, 1.0625, 1.1875, 3.25, 2 ** -9, 3 * 2 ** -10, -0.0, 448.0, 464.0,
                          57344.0, 1e-12])
    return torch.cat([x, extra]).float()


def fp8_convert(world):
    x = fp8_values()
    n = x.numel()
    dev = world.device
    e4 = torch.empty(n, dtype=torch.float8_e4m3fn, device=dev)
    e5 = torch.empty(n, dtype=torch.float8_e5m2, device=dev)
    back = torch.empty(n, device=dev)
    fp8_kernel[(triton.cdiv(n, 1024),)](x.to(dev), e4, e5, back, n, BLOCK=1024)
    e4, e5, back = e4.cpu(), e5.cpu(), back.cpu()
    # torch rounds to nearest even like cvt.rn; sm_90's .satfinite clamps beyond the largest finite value
    for got, tdt, top in ((e4, torch.float8_e4m3fn, 448.0), (e5, torch.float8_e5m2, 57344.0)):
        want = x.clamp(-top, top).to(tdt)
        diff = (got.view(torch.uint8) != want.view(torch.uint8)).nonzero().flatten()
        assert diff.numel() == 0, f"{tdt}: {diff.numel()} differ, e.g. {x[diff[:3]].tolist()} -> " \
                                  f"{got[diff[:3]].float().tolist()}, torch {want[diff[:3]].float().tolist()}"
    assert torch.equal(back, e4.float())
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e6])
    e4s, e5s = torch.empty(4, dtype=torch.float8_e4m3fn, device=dev), torch.empty(4, dtype=torch.float8_e5m2, device=dev)
    fp8_kernel[(1,)](special.to(dev), e4s, e5s, torch.empty(4, device=dev), 4, BLOCK=4)
    f4, f5 = e4s.float().cpu(), e5s.float().cpu()
    assert f4[:2].tolist() == [448.0, -448.0] and f4[2].isnan() and f4[3] == 448.0, f4
    assert f5[:2].tolist() == [57344.0, -57344.0] and f5[2].isnan() and f5[3] == 57344.0, f5
    g = torch.Generator().manual_seed(11)
    a, b = (torch.randn(16, 16, generator=g) * 4).to(torch.float8_e4m3fn), torch.randn(16, 16, generator=g).to(
        torch.float8_e5m2)
    c = torch.empty(16, 16, device=dev)
    fp8_dot_kernel[(1,)](a.to(dev), b.to(dev), c, M=16)   # fp8 operands of tl.dot: exact products, fp32 sums
    torch.testing.assert_close(c.cpu(), a.float() @ b.float(), rtol=1e-6, atol=1e-5)
    return n


@ditron.jit
def libdevice_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(o_ptr + offs, libdevice.exp(x), mask=m)
    tl.store(o_ptr + n + offs, libdevice.log1p(tl.abs(x)), mask=m)
    tl.store(o_ptr + 2 * n + offs, libdevice.tanh(x), mask=m)
    tl.store(o_ptr + 3 * n + offs, libdevice.pow(tl.abs(x), 1.5), mask=m)
    tl.store(o_ptr + 4 * n + offs, libdevice.erf(x), mask=m)
    tl.store(o_ptr + 5 * n + offs, libdevice.rsqrt(tl.abs(x) + 1.0), mask=m)


def libdevice_math(world):
    x = torch.linspace(-3, 3, 100)
    n = x.numel()
    o = torch.empty(6 * n, device=world.device)
    libdevice_kernel[(1,)](x.to(world.device), o, n, BLOCK=128)
    o = o.cpu()
    want = torch.cat([x.exp(), x.abs().log1p(), x.tanh(), x.abs() ** 1.5, torch.erf(x), (x.abs() + 1).rsqrt()])
    torch.testing.assert_close(o, want, rtol=2e-6, atol=1e-6)
    return n


# ---------------------------------------------------------------------------
# tensor descriptors (TMA)
# ---------------------------------------------------------------------------

@ditron.jit
def desc_kernel(x_ptr, o_ptr, sig_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    tok = dl.wait(sig_ptr, 1, "gpu", "acquire", waitValue=0)
    xd = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    xd = dl.consume_token(xd, tok)
    od = tl.make_tensor_descriptor(o_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    t = xd.load([pm * BM, pn * BN])                   # out-of-bounds elements read as 0
    od.store([pm * BM, pn * BN], t * 2 + 1)           # out-of-bounds elements are not written


def descriptors(world, M=37, N=52):
    dev = world.device
    if world.backend != "sim":          # in-kernel descriptors need Triton's global scratch allocator on GPUs
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    x = torch.randn(M, N)
    sig = torch.zeros(1, dtype=torch.int32, device=dev)
    flat = torch.full((M * N + 64,), -5.0, device=dev)        # 64 elements past the tensor: clipped stores skip them
    desc_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 32))](x.to(dev), flat, sig, M, N, BM=16, BN=32)
    flat = flat.cpu()
    assert torch.equal(flat[:M * N].view(M, N), x * 2 + 1)
    assert torch.all(flat[M * N:] == -5.0), "a clipped descriptor store wrote past the tensor"
    return M * N


@ditron.jit
def desc_peer_kernel(buf_ptr, out_ptr, N, RACY: tl.constexpr, BN: tl.constexpr):
    rank = dl.rank()
    peer = (rank + 1) % dl.num_ranks()
    dst = dl.symm_at(buf_ptr, peer) if RACY else buf_ptr
    d = tl.make_tensor_descriptor(dst, shape=[1, N], strides=[N, 1], block_shape=[1, BN])
    d.store([0, 0], tl.full((1, BN), 1.0, tl.float32) + rank)        # TMA store into the peer's copy
    mine = tl.make_tensor_descriptor(buf_ptr, shape=[1, N], strides=[N, 1], block_shape=[1, BN])
    v = mine.load([0, 0])                                            # no signal orders this after the peer's store
    o = tl.make_tensor_descriptor(out_ptr, shape=[1, N], strides=[N, 1], block_shape=[1, BN])
    o.store([0, 0], v)


def desc_peer(world, racy):
    N = 32
    buf = ditron.symm_zeros((N,), torch.float32, name="tma_buf")
    out = torch.zeros(N)
    ditron.barrier_all()
    desc_peer_kernel[(1,)](buf, out, N, RACY=racy, BN=32)
    ditron.barrier_all()
    return out[0].item()
