"""Test bodies (run on every rank; see conftest.py) for the tile- and
chunk-level primitives.  They run on simulated ranks in CI and on GPUs under
torchrun: kernels here are written once, like user code."""
import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem


def _dev(world):
    return world.device


def _rand(world, shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + world.rank)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).to(_dev(world))


def _rand_of(rank, shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)


# ---------------------------------------------------------------------------
# all-gather by pushing tiles with symm_at stores, then notify / wait
# ---------------------------------------------------------------------------

@ditron.jit
def push_allgather_kernel(x_ptr, out_ptr, sig_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    me = dl.rank()
    world = dl.num_ranks()
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    for peer in range(0, world):
        tl.store(dl.symm_at(out_ptr + me * n + offs, peer), v, mask=mask)
        # one signal word per (source rank, tile); released after the stores
        dl.notify(sig_ptr + me * tl.num_programs(0) + pid, peer, signal=1, sig_op="set", comm_scope="intra_node")
    # wait for every rank's tile pid, then read it back through the token
    for src in range(0, world):
        tok = dl.wait(sig_ptr + src * tl.num_programs(0) + pid, 1, "sys", "acquire", waitValue=1)
        got = tl.load(dl.consume_token(out_ptr + src * n + offs, tok), mask=mask)
        tl.store(out_ptr + src * n + offs, got, mask=mask)


def allgather_push(world, n, block):
    x = ditron.symm_empty((n,), torch.float32)
    x.copy_(_rand(world, n, seed=1))
    out = ditron.symm_zeros((world.world_size, n), torch.float32)
    grid = triton.cdiv(n, block)
    sig = ditron.symm_zeros((world.world_size * grid,), torch.int32)
    ditron.barrier_all()
    push_allgather_kernel[(grid,)](x, out, sig, n, BLOCK=block)
    ditron.barrier_all()
    ref = torch.stack([_rand_of(r, n, seed=1) for r in range(world.world_size)])
    torch.testing.assert_close(out.cpu(), ref)
    return int(sig.sum())


# ---------------------------------------------------------------------------
# putmem_signal_nbi + signal_wait_until: ring shift of a chunk
# ---------------------------------------------------------------------------

@ditron.jit
def ring_put_signal_kernel(src_ptr, dst_ptr, sig_ptr, nbytes, out_ptr, n, BLOCK: tl.constexpr):
    me = dl.rank()
    nxt = (me + 1) % dl.num_ranks()
    if tl.program_id(0) == 0:
        shmem.putmem_signal_nbi_block(dst_ptr, src_ptr, nbytes, sig_ptr, 7, shmem.NVSHMEM_SIGNAL_SET, nxt)
        shmem.quiet()
    v = shmem.signal_wait_until(sig_ptr, shmem.NVSHMEM_CMP_EQ, 7)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    data = tl.load(dst_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, data + (v - 7).to(tl.float32), mask=mask)


def ring_put_signal(world, n, block):
    src = ditron.symm_empty((n,), torch.float32)
    src.copy_(_rand(world, n, seed=2))
    dst = ditron.symm_zeros((n,), torch.float32)
    sig = ditron.symm_zeros((1,), torch.int64)
    out = torch.zeros(n, device=_dev(world))
    ditron.barrier_all()
    ring_put_signal_kernel[(triton.cdiv(n, block),)](src, dst, sig, n * 4, out, n, BLOCK=block)
    ditron.barrier_all()
    prev = (world.rank - 1) % world.world_size
    torch.testing.assert_close(out.cpu(), _rand_of(prev, n, seed=2))
    return int(sig.item())


# ---------------------------------------------------------------------------
# getmem: pull a chunk from every peer
# ---------------------------------------------------------------------------

@ditron.jit
def pull_all_kernel(src_ptr, out_ptr, n):
    pe = tl.program_id(0)
    shmem.getmem_block(out_ptr + pe * n, src_ptr, n * 2, pe)


def pull_all(world, n):
    src = ditron.symm_empty((n,), torch.float16)
    src.copy_(_rand(world, n, torch.float16, seed=3))
    out = torch.zeros((world.world_size, n), dtype=torch.float16, device=_dev(world))
    ditron.barrier_all()
    pull_all_kernel[(world.world_size,)](src, out, n)
    ref = torch.stack([_rand_of(r, n, torch.float16, seed=3) for r in range(world.world_size)])
    torch.testing.assert_close(out.cpu(), ref)
    ditron.barrier_all()


# ---------------------------------------------------------------------------
# persistent producer/consumer between the programs of one launch
# ---------------------------------------------------------------------------

@ditron.jit
def persistent_chain_kernel(x_ptr, out_ptr, flags_ptr, n, BLOCK: tl.constexpr):
    """Program p adds its tile to what program p+1 produced: program 0 waits
    for the last program, which starts the chain."""
    pid = tl.program_id(0)
    last = tl.num_programs(0) - 1
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x_ptr + pid * n + offs, mask=mask)
    if pid != last:
        tok = dl.wait(flags_ptr + pid + 1, 1, "gpu", "acquire", waitValue=1)
        prev = tl.load(dl.consume_token(out_ptr + (pid + 1) * n + offs, tok), mask=mask)
        acc += prev
    tl.store(out_ptr + pid * n + offs, acc, mask=mask)
    dl.notify(flags_ptr + pid, dl.rank(), signal=1, comm_scope="gpu")


def persistent_chain(world, programs, n):
    x = _rand(world, (programs, n), seed=4)
    out = ditron.symm_zeros((programs, n), torch.float32)
    flags = ditron.symm_zeros((programs,), torch.int32)
    persistent_chain_kernel[(programs,)](x, out, flags, n, BLOCK=triton.next_power_of_2(n))
    ref = torch.flip(torch.cumsum(torch.flip(x, [0]), 0), [0])
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
    return flags.tolist()


# ---------------------------------------------------------------------------
# topology
# ---------------------------------------------------------------------------

@ditron.jit
def topology_kernel(out_ptr):
    tl.store(out_ptr + 0, dl.rank())
    tl.store(out_ptr + 1, dl.num_ranks())
    tl.store(out_ptr + 2, dl.rank(0))
    tl.store(out_ptr + 3, dl.num_ranks(0))
    tl.store(out_ptr + 4, dl.rank(1))
    tl.store(out_ptr + 5, dl.num_ranks(1))
    tl.store(out_ptr + 6, shmem.my_pe())
    tl.store(out_ptr + 7, shmem.n_pes())


def topology(world):
    out = torch.zeros(8, dtype=torch.int32, device=_dev(world))
    topology_kernel[(1,)](out)
    host = (world.rank, world.world_size, world.local_rank, world.local_world_size, world.node, world.nnodes)
    return out.tolist(), host


@ditron.jit
def inter_node_signal_kernel(sig_ptr, data_ptr, n, BLOCK: tl.constexpr):
    """Each rank sends to the rank with the same local rank on the next node:
    shmem put (works across nodes) + inter_node notify; then waits for its own."""
    me = dl.rank()
    per_node = dl.num_ranks(0)
    peer = (me + per_node) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    shmem.putmem_block(data_ptr + n, data_ptr, n * 4, peer)
    dl.notify(sig_ptr, peer, signal=1, sig_op="add", comm_scope="inter_node")
    tok = dl.wait(sig_ptr, 1, "sys", "acquire", waitValue=1)
    v = tl.load(dl.consume_token(data_ptr + n + offs, tok), mask=offs < n)
    tl.store(data_ptr + 2 * n + offs, v * 2, mask=offs < n)


def inter_node_exchange(world, n):
    data = ditron.symm_zeros((3, n), torch.float32)
    data[0].copy_(_rand(world, n, seed=5))
    sig = ditron.symm_zeros((1,), torch.int64)
    ditron.barrier_all()
    inter_node_signal_kernel[(1,)](sig, data, n, BLOCK=triton.next_power_of_2(n))
    ditron.barrier_all()
    src = (world.rank - world.local_world_size) % world.world_size
    torch.testing.assert_close(data[2].cpu(), 2 * _rand_of(src, n, seed=5))


@ditron.jit
def symm_at_off_node_kernel(x_ptr):
    peer = (dl.rank() + dl.num_ranks(0)) % dl.num_ranks()
    tl.store(dl.symm_at(x_ptr, peer), 1.0)


def symm_at_off_node(world):
    x = ditron.symm_zeros((4,), torch.float32)
    symm_at_off_node_kernel[(1,)](x)


# ---------------------------------------------------------------------------
# errors and hangs
# ---------------------------------------------------------------------------

@ditron.jit
def remote_store_kernel(x_ptr, peer):
    tl.store(dl.symm_at(x_ptr, peer), 1.0)


def non_symmetric_arg(world):
    x = torch.zeros(4, device=_dev(world))           # not symmetric
    remote_store_kernel[(1,)](x, (world.rank + 1) % world.world_size)


def fail_on_rank(world, bad_rank):
    sig = ditron.symm_zeros((1,), torch.int32)
    if world.rank == bad_rank:
        raise ValueError(f"planted failure on rank {bad_rank}")
    # the others wait for a signal that the failing rank never sends
    wait_kernel[(1,)](sig, 1)


@ditron.jit
def wait_kernel(sig_ptr, value):
    dl.wait(sig_ptr, 1, "sys", "acquire", waitValue=value)


def missing_notify(world, silent_rank):
    """Every rank notifies its right neighbour and waits for its left one,
    except ``silent_rank``, which forgets to notify: its right neighbour hangs."""
    sig = ditron.symm_zeros((2,), torch.int32, name="ring_flags")
    ditron.barrier_all()
    ring_notify_kernel[(1,)](sig, world.rank != silent_rank)


@ditron.jit
def ring_notify_kernel(sig_ptr, do_notify):
    me = dl.rank()
    nxt = (me + 1) % dl.num_ranks()
    if do_notify:
        dl.notify(sig_ptr + 1, nxt, signal=1, comm_scope="intra_node")
    dl.wait(sig_ptr + 1, 1, "sys", "acquire", waitValue=1)


def barrier_loop(world, iters):
    x = ditron.symm_zeros((1,), torch.int64)
    for i in range(iters):
        x.fill_(i)
        ditron.barrier_all()
        peer = ditron.peer_tensor(x, (world.rank + 1) % world.world_size)
        assert int(peer.item()) == i, (i, int(peer.item()))
        ditron.barrier_all()
    return iters


def rank_copy_roundtrip(world, n):
    x = ditron.symm_empty((n,), torch.bfloat16)
    x.copy_(_rand(world, n, torch.bfloat16, seed=6))
    got = torch.empty(n, dtype=torch.bfloat16, device=_dev(world))
    ditron.barrier_all()
    peer = (world.rank + 1) % world.world_size
    ditron.rank_copy(got, x, src_rank=peer)
    torch.testing.assert_close(got.cpu(), _rand_of(peer, n, torch.bfloat16, seed=6))
    # push mine into the next rank's slot
    slot = ditron.symm_zeros((n,), torch.bfloat16)
    ditron.barrier_all()
    ditron.rank_copy(slot, x, dst_rank=peer)
    ditron.barrier_all()
    prev = (world.rank - 1) % world.world_size
    torch.testing.assert_close(slot.cpu(), _rand_of(prev, n, torch.bfloat16, seed=6))


# ---------------------------------------------------------------------------
# multicast (simulator / compile-verified on GPUs)
# ---------------------------------------------------------------------------

@ditron.jit
def multimem_kernel(x_ptr, out_ptr, bcast_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    mc = shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, x_ptr + offs)
    s = dl.multimem_ld_reduce(mc, op="sum")
    tl.store(out_ptr + offs, s, mask=mask)
    if dl.rank() == 0:
        dl.multimem_st(shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, bcast_ptr + offs), s.to(tl.float32) * 0 + 3.0)


def multimem_sum(world, n):
    x = ditron.symm_empty((triton.next_power_of_2(n),), torch.bfloat16)
    x.copy_(_rand(world, x.numel(), torch.bfloat16, seed=7))
    b = ditron.symm_zeros((triton.next_power_of_2(n),), torch.bfloat16)
    out = torch.zeros(n, dtype=torch.bfloat16)
    ditron.barrier_all()
    multimem_kernel[(1,)](x, out, b, n, BLOCK=triton.next_power_of_2(n))
    ditron.barrier_all()
    ref = sum(_rand_of(r, x.numel(), torch.bfloat16, seed=7).float() for r in range(world.world_size))
    torch.testing.assert_close(out.float(), ref[:n].bfloat16().float(), rtol=1e-2, atol=1e-2)
    assert torch.all(b == 3.0)


# ---------------------------------------------------------------------------
# thread-level helpers (tile-at-a-time on the simulator)
# ---------------------------------------------------------------------------

@ditron.jit
def thread_helpers_kernel(cnt_ptr, out_ptr):
    offs = tl.arange(0, 32)
    old = dl.atomic_add(cnt_ptr + offs * 0, 1)             # every lane adds 1: one counter
    tl.store(out_ptr + offs, old)
    ball = dl.ballot_sync(0xFFFFFFFF, (offs % 2) == 1)
    tl.store(out_ptr + 32, ball)
    sh = dl.shfl_xor_sync(0xFFFFFFFF, offs, 1)
    tl.store(out_ptr + 33 + offs, sh)
    tl.store(out_ptr + 65, dl.ffs(tl.full((), 40, tl.int32)))
    tl.store(out_ptr + 66, dl.tid(0) + dl.laneid() + dl.num_threads() * 100 + dl.num_warps() * 1000)
    prev = dl.atomic_cas(cnt_ptr + 1, 0, 5)
    tl.store(out_ptr + 67, prev)
    dl.st(cnt_ptr + 2, 9, "sys", "release")
    tl.store(out_ptr + 68, dl.ld(cnt_ptr + 2, "sys", "acquire"))


def thread_helpers(world):
    cnt = ditron.symm_zeros((4,), torch.int32)
    out = torch.zeros(80, dtype=torch.int32)
    thread_helpers_kernel[(1,)](cnt, out)
    return out.tolist(), cnt.tolist()


@ditron.jit
def runtime_range_kernel(out_ptr, n):
    # range() over a runtime value: Triton 3.6's interpreter converts it with
    # int(<1-element array>), which NumPy >= 2.4 rejects; ditron patches it
    acc = 0
    for i in range(n):
        acc += i
    for j in tl.range(0, n, 2):
        acc += 1
    tl.store(out_ptr, acc + dl.rank() * 0)


def runtime_range(world, n):
    out = torch.zeros(1, dtype=torch.int32, device=_dev(world))
    runtime_range_kernel[(1,)](out, n)
    return int(out.item())


@ditron.jit
def out_of_heap_kernel(x_ptr, far):
    tl.store(dl.symm_at(x_ptr + far, 0), 1.0)


def out_of_heap(world):
    x = ditron.symm_zeros((4,), torch.float32)
    out_of_heap_kernel[(1,)](x, world.heap_size // 4)     # one heap past x: outside the symmetric heap


@ditron.jit
def triton_helpers_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # Triton's own @jit library functions (tl.sum, tl.max, tl.cdiv) inside a simulated kernel
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + 0, tl.sum(v, axis=0))
    tl.store(out_ptr + 1, tl.max(v, axis=0))
    tl.store(out_ptr + 2, tl.cdiv(n, 4).to(tl.float32))


def triton_helpers(world, n):
    x = torch.rand(n, device=_dev(world)) + 1
    out = torch.zeros(3, device=_dev(world))
    triton_helpers_kernel[(1,)](x, out, n, BLOCK=triton.next_power_of_2(n))
    torch.testing.assert_close(out[0], x.sum())
    assert out[1].item() == x.max().item() and out[2].item() == -(-n // 4)


@ditron.jit
def plain_poll_kernel(flag_ptr):
    # a polling loop nobody satisfies: the watchdog reports it after the hang timeout (30 s by default);
    # the run's time limit in the test (3 s) comes first
    while tl.load(flag_ptr, volatile=True) == 0:
        pass


def plain_poll_forever(world):
    flag = ditron.symm_zeros((1,), torch.int32)
    plain_poll_kernel[(1,)](flag)


@ditron.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


def bf16_dot(world):
    a = torch.randn(16, 32).bfloat16()
    b = torch.randn(32, 16).bfloat16()
    c = torch.empty(16, 16, dtype=torch.float32)
    dot_kernel[(1,)](a, b, c, 16, 16, 32)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-4, atol=1e-4)


@ditron.jit
def prefetch_kernel(w, out, n, limit, stride, LINES: tl.constexpr):
    """Prefetch LINES addresses `stride` elements apart (masked from `limit` on), then sum the first n of them."""
    offs = tl.arange(0, LINES) * stride
    dl.prefetch_l2(w + offs, mask=offs < limit)
    tl.store(out, tl.sum(tl.load(w + offs, mask=offs < n, other=0.0), 0))


def prefetch_bounds(world, limit):
    """dl.prefetch_l2 is a hint: the result is the same with it; past the tensor only if the mask allows it."""
    n = 1000
    w, out = _rand(world, (n,), seed=5), torch.zeros(1, device=_dev(world))
    prefetch_kernel[(1,)](w, out, n, limit, 300, LINES=8)
    ref = w[torch.arange(0, n, 300, device=w.device)].sum()
    assert torch.allclose(out[0], ref), (out, ref)


def torch_threads(world):
    """This rank's torch intra-op threads and its OMP_NUM_THREADS (ditron.sim.threads)."""
    import os
    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


def inductor_threads(world):
    """This rank's inductor compile threads and its TORCHINDUCTOR_COMPILE_THREADS (ditron.sim.threads)."""
    import os

    import torch._inductor.config as config
    return config.compile_threads, os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
