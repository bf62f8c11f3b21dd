"""Conformance kernels written the way Triton-distributed's tutorials and
intra-node collectives are written -- its import paths (``triton_dist...``),
its names and idioms (thread-indexed polling, ``putmem_signal``, team
queries, ``language_extra`` loads / stores / atomics with its defaults, its
host helpers from ``triton_dist.utils``) -- and test bodies that run them on
every rank (see conftest.py) against torch references.

These are ditron's own kernels (no Triton-distributed code is copied); they
exist to prove that every name a port needs resolves and behaves as in
Triton-distributed.  Thread-indexed loops are written ``for i in range(tid,
n, ntid)``, which is correct for any thread count, so they pass on the
simulator (one thread per program) as on GPUs; the ``if tid < n:`` form needs
per-thread simulation (docs/porting.md).
"""
import torch
import triton
import triton.language as tl

import ditron
import triton_dist
import triton_dist.language as dl
from triton_dist.language.extra import libshmem_device
from triton_dist.language.extra.cuda.language_extra import (__syncthreads, atomic_add, atomic_cas, fence, ld,
                                                            ld_acquire, load_v2_b64, load_v4_u32, multimem_ld_reduce_v4, ntid,
                                                            pack_b32_v2, st,
                                                            st_v2_u32, st_v4_b32, tid)
from triton_dist.utils import (NVSHMEM_SIGNAL_DTYPE, get_triton_dist_world, initialize_distributed,
                               nvshmem_barrier_all_on_stream, nvshmem_create_tensor, nvshmem_create_tensors,
                               nvshmem_free_tensor_sync)


# ---------------------------------------------------------------------------
# 1. producer / consumer through a queue on the next rank (tutorial-01 style)
# ---------------------------------------------------------------------------

@triton_dist.jit
def ring_queue_kernel(rank: tl.constexpr, num_ranks: tl.constexpr, input_ptr, output_ptr, num_inputs: int,
                      queue_ptr, signal_ptr, queue_size: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                      NUM_PRODUCERS: tl.constexpr, NUM_CONSUMERS: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_SIZE)
    if pid < NUM_PRODUCERS:
        peer = (rank + 1) % num_ranks
        for i in range(pid, num_inputs, NUM_PRODUCERS):
            slot = i % queue_size
            lap = i // queue_size
            token = dl.wait(dl.symm_at(signal_ptr, peer) + slot, 1, "sys", "acquire", waitValue=lap * 2)
            src = dl.consume_token(input_ptr, token)
            data = tl.load(src + i * BLOCK_SIZE + offs)
            tl.store(dl.symm_at(queue_ptr, peer) + slot * BLOCK_SIZE + offs, data)
            __syncthreads()
            libshmem_device.fence()
            dl.notify(signal_ptr + slot, peer, signal=lap * 2 + 1, sig_op="set", comm_scope="intra_node")
    elif pid < NUM_PRODUCERS + NUM_CONSUMERS:
        pid = pid - NUM_PRODUCERS
        for i in range(pid, num_inputs, NUM_CONSUMERS):
            slot = i % queue_size
            lap = i // queue_size
            token = dl.wait(signal_ptr + slot, 1, "sys", "acquire", waitValue=lap * 2 + 1)
            q = dl.consume_token(queue_ptr, token)
            data = tl.load(q + slot * BLOCK_SIZE + offs)
            tl.store(output_ptr + i * BLOCK_SIZE + offs, data)
            __syncthreads()
            dl.notify(signal_ptr + slot, rank, signal=lap * 2 + 2, sig_op="set", comm_scope="intra_node")


def _assert_close(got, ref, rtol=1.3e-6, atol=1e-5):
    # (torch.testing.assert_close imports torch.distributed.tensor, ~10 s per simulated rank process)
    got, ref = got.cpu().float(), ref.cpu().float()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if not torch.allclose(got, ref, rtol=rtol, atol=atol):
        bad = (got - ref).abs() > atol + rtol * ref.abs()
        i = int(bad.reshape(-1).nonzero()[0])
        raise AssertionError(f"{int(bad.sum())} of {got.numel()} elements differ; first at {i}: "
                             f"{got.reshape(-1)[i].item()} != {ref.reshape(-1)[i].item()}")


def _data_of(rank, n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(7919 * seed + rank)
    return torch.randn(n, generator=g).to(dtype)


def ring_queue(world, num_blocks=3, queue_size=2, block=32):
    rank, n = world.rank, world.world_size
    queue = nvshmem_create_tensor((queue_size * block,), torch.float32)
    signal = nvshmem_create_tensor((queue_size,), NVSHMEM_SIGNAL_DTYPE)
    signal.zero_()
    x = _data_of(rank, num_blocks * block, seed=1).to(world.device)
    out = torch.empty_like(x)
    nvshmem_barrier_all_on_stream()
    ring_queue_kernel[(2,)](rank, n, x, out, num_blocks, queue, signal, queue_size, BLOCK_SIZE=block,
                            NUM_PRODUCERS=1, NUM_CONSUMERS=1)
    nvshmem_barrier_all_on_stream()
    _assert_close(out, _data_of((rank - 1) % n, num_blocks * block, seed=1))
    nvshmem_free_tensor_sync(signal)
    nvshmem_free_tensor_sync(queue)
    return "ring_queue"


# ---------------------------------------------------------------------------
# 2. all-gather by putmem_signal, thread-indexed signal waits (tutorial-02 style)
# ---------------------------------------------------------------------------

@triton_dist.jit
def allgather_putmem_signal_kernel(symm_buf, symm_signal, elems_per_rank, signal_target):
    pid = tl.program_id(0)
    rank = libshmem_device.my_pe()
    world_size = libshmem_device.n_pes()
    nbytes = elems_per_rank * symm_buf.dtype.element_ty.primitive_bitwidth // 8
    if pid == 0:
        for peer in range(0, world_size):
            if peer != rank:
                libshmem_device.putmem_signal_nbi_block(symm_buf + rank * elems_per_rank,
                                                        symm_buf + rank * elems_per_rank, nbytes,
                                                        symm_signal + rank, signal_target,
                                                        libshmem_device.NVSHMEM_SIGNAL_SET, peer)
        thread_idx = tid(0)
        for src in range(thread_idx, world_size, ntid(0)):
            if src != rank:
                libshmem_device.signal_wait_until(symm_signal + src, libshmem_device.NVSHMEM_CMP_EQ,
                                                  signal_target)
        __syncthreads()


@triton_dist.jit
def allgather_rocshmem_style_kernel(symm_buf, symm_signal, elems_per_rank, signal_target, ctx):
    # the AMD spellings: set_rocshmem_ctx, putmem_signal_wg, ROCSHMEM_* constants
    libshmem_device.set_rocshmem_ctx(ctx)
    rank = libshmem_device.my_pe()
    world_size = libshmem_device.n_pes()
    peer = tl.program_id(0)
    if peer != rank:
        libshmem_device.putmem_signal_wg(symm_buf + rank * elems_per_rank, symm_buf + rank * elems_per_rank,
                                         elems_per_rank * 2, symm_signal + rank, signal_target,
                                         libshmem_device.ROCSHMEM_SIGNAL_SET, peer)
    if peer == rank:
        for src in range(tid(0), world_size, ntid(0)):
            if src != rank:
                libshmem_device.signal_wait_until(symm_signal + src, libshmem_device.ROCSHMEM_CMP_EQ,
                                                  signal_target)
        __syncthreads()


def allgather_putmem_signal(world, elems=37, rounds=2):
    rank, n = world.rank, world.world_size
    buf = nvshmem_create_tensor((n * elems,), torch.float16)
    signal = nvshmem_create_tensor((n,), NVSHMEM_SIGNAL_DTYPE)
    signal.zero_()
    for r in range(1, rounds + 1):
        buf.zero_()
        buf[rank * elems:(rank + 1) * elems].copy_(_data_of(rank, elems, torch.float16, seed=r).to(world.device))
        nvshmem_barrier_all_on_stream()
        if r % 2:
            allgather_putmem_signal_kernel[(2,)](buf, signal, elems, r)
        else:
            allgather_rocshmem_style_kernel[(n,)](buf, signal, elems, r, signal)
        nvshmem_barrier_all_on_stream()
        ref = torch.cat([_data_of(q, elems, torch.float16, seed=r) for q in range(n)])
        _assert_close(buf, ref)
    nvshmem_free_tensor_sync(signal)
    nvshmem_free_tensor_sync(buf)
    return "allgather_putmem_signal"


# ---------------------------------------------------------------------------
# 3. barrier with atomic_cas / ld_acquire / st, thread per peer (common_ops style)
# ---------------------------------------------------------------------------

@triton_dist.jit
def flag_barrier_exchange_kernel(rank, num_ranks, symm_flags, symm_data, out_ptr, N: tl.constexpr):
    # publish this rank's data into every peer's slot for it, then barrier through per-peer flags
    offs = tl.arange(0, N)
    mine = tl.load(symm_data + rank * N + offs)
    thread_idx = tid(0)
    block_size = ntid(0)
    for peer in range(0, num_ranks):
        tl.store(dl.symm_at(symm_data + rank * N + offs, peer), mine)
    __syncthreads()
    for peer in range(thread_idx, num_ranks, block_size):
        remote = dl.symm_at(symm_flags + rank, peer)
        while atomic_cas(remote, 0, 1, "sys", "release") != 0:
            pass
    for peer in range(thread_idx, num_ranks, block_size):
        while ld_acquire(symm_flags + peer, "sys") != 1:
            pass
        st(symm_flags + peer, 0)
    __syncthreads()
    total = tl.zeros((N,), tl.float32)
    for peer in range(0, num_ranks):
        total += tl.load(symm_data + peer * N + offs)
    tl.store(out_ptr + offs, total)


@triton_dist.jit
def counter_kernel(symm_counter, num_ranks):
    # every rank adds 1 to word `rank` of every peer's counter: relaxed GPU-scope default, system scope here
    rank = dl.rank()
    for peer in range(tid(0), num_ranks, ntid(0)):
        atomic_add(dl.symm_at(symm_counter + rank, peer), 1, "sys", "release")


def flag_barrier(world, N=16, rounds=2):
    rank, n = world.rank, world.world_size
    group = initialize_distributed()          # joins the running world
    assert (group.rank(), group.size()) == (rank, n) and get_triton_dist_world() is group
    flags = nvshmem_create_tensor((n,), torch.int32)
    flags.zero_()
    data = nvshmem_create_tensor((n * N,), torch.float32)
    counter = nvshmem_create_tensor((n,), torch.int32)
    counter.zero_()
    out = torch.empty(N, device=world.device)
    for r in range(rounds):
        data.zero_()
        data[rank * N:(rank + 1) * N].copy_(_data_of(rank, N, seed=10 + r).to(world.device))
        nvshmem_barrier_all_on_stream()
        flag_barrier_exchange_kernel[(1,)](rank, n, flags, data, out, N=N)
        _assert_close(out, sum(_data_of(q, N, seed=10 + r) for q in range(n)))
        counter_kernel[(1,)](counter, n)
    nvshmem_barrier_all_on_stream()
    assert counter.cpu().tolist() == [rounds] * n, counter
    assert flags.cpu().tolist() == [0] * n
    for t in (counter, data, flags):
        nvshmem_free_tensor_sync(t)
    return "flag_barrier"


# ---------------------------------------------------------------------------
# 4. vector loads / stores from a peer (low-latency all-gather style)
# ---------------------------------------------------------------------------

@triton_dist.jit
def vector_pull_kernel(symm_src, dst, n_vec4, rank, num_ranks):
    # pull the next rank's words four at a time (load_v4_u32 -> st_v4_b32), and
    # the 64-bit words two at a time (load_v2_b64 -> two halves -> pack_b32_v2)
    peer = (rank + 1) % num_ranks
    src = dl.symm_at(symm_src, peer)
    for i in range(tid(0), n_vec4, ntid(0)):
        a, b, c, d = load_v4_u32(src + i * 4)
        st_v4_b32(dst + i * 4, a, b, c, d)
    src64 = src.to(tl.pointer_type(tl.int64), bitcast=True)
    dst32 = (dst + n_vec4 * 4).to(tl.pointer_type(tl.uint32), bitcast=True)
    for i in range(tid(0), n_vec4, ntid(0)):
        lo, hi = load_v2_b64(src64 + i * 2)
        st_v2_u32(dst32 + i * 4, (lo & 0xFFFFFFFF).to(tl.uint32), (lo >> 32).to(tl.uint32))
        packed = pack_b32_v2((hi & 0xFFFFFFFF).to(tl.uint32), (hi >> 32).to(tl.uint32))
        st(dst32.to(tl.pointer_type(tl.uint64), bitcast=True) + i * 2 + 1, packed, "gpu", "relaxed")


def vector_pull(world, n_vec4=5):
    rank, n = world.rank, world.world_size
    words = n_vec4 * 4
    src = nvshmem_create_tensor((words,), torch.int32)
    g = torch.Generator().manual_seed(rank)
    src.copy_(torch.randint(-2**31, 2**31 - 1, (words,), generator=g, dtype=torch.int64).to(torch.int32))
    dst = torch.zeros(2 * words, dtype=torch.int32, device=world.device)
    nvshmem_barrier_all_on_stream()
    vector_pull_kernel[(1,)](src, dst, n_vec4, rank, n)
    nvshmem_barrier_all_on_stream()
    g = torch.Generator().manual_seed((rank + 1) % n)
    ref = torch.randint(-2**31, 2**31 - 1, (words,), generator=g, dtype=torch.int64).to(torch.int32)
    assert torch.equal(dst.cpu(), torch.cat([ref, ref])), (dst, ref)
    nvshmem_free_tensor_sync(src)
    return "vector_pull"


# ---------------------------------------------------------------------------
# 5. team queries and multicast (all-reduce multimem style)
# ---------------------------------------------------------------------------

@triton_dist.jit
def node_team_allreduce_kernel(symm_in, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mc = libshmem_device.remote_mc_ptr(libshmem_device.NVSHMEMX_TEAM_NODE, symm_in)
    total = dl.multimem_ld_reduce(mc + offs, acc_dtype=tl.float32)
    tl.store(out + offs, total, mask=offs < n)


def node_team_allreduce(world, n=100, block=64):
    rank = world.rank
    x = nvshmem_create_tensor((triton.cdiv(n, block) * block,), torch.float16)
    x.zero_()
    x[:n].copy_(_data_of(rank, n, torch.float16, seed=3).to(world.device))
    out = torch.empty(n, dtype=torch.float16, device=world.device)
    nvshmem_barrier_all_on_stream()
    node_team_allreduce_kernel[(triton.cdiv(n, block),)](x, out, n, BLOCK=block)
    first = rank - world.local_rank                          # NVSHMEMX_TEAM_NODE: the ranks of this node
    ref = sum(_data_of(q, n, torch.float16, seed=3).float()
              for q in range(first, first + world.local_world_size)).to(torch.float16)
    _assert_close(out, ref, rtol=2e-3, atol=2e-3)
    nvshmem_barrier_all_on_stream()
    nvshmem_free_tensor_sync(x)
    return "node_team_allreduce"


# ---------------------------------------------------------------------------
# host helpers: peer views, free, the heap returning memory
# ---------------------------------------------------------------------------

def host_helpers(world):
    rank, n = world.rank, world.world_size
    views = nvshmem_create_tensors((4,), torch.int32, rank, world.local_world_size)
    assert len(views) == world.local_world_size and views[world.local_rank] is not None
    views[world.local_rank].fill_(-1)
    nvshmem_barrier_all_on_stream()
    nxt = (world.local_rank + 1) % world.local_world_size
    views[nxt][1] = rank                       # write into the next rank's copy through its view
    nvshmem_barrier_all_on_stream()
    prev_rank = rank - world.local_rank + (world.local_rank - 1) % world.local_world_size
    assert views[world.local_rank].cpu().tolist() == [-1, prev_rank, -1, -1]
    a = nvshmem_create_tensor((100,), torch.float32)
    a_ptr = a.data_ptr()
    b = nvshmem_create_tensor((7,), torch.int64)
    nvshmem_free_tensor_sync(a)                # older than b: its memory stays taken until b goes
    c = nvshmem_create_tensor((100,), torch.float32)
    assert c.data_ptr() > b.data_ptr()
    nvshmem_free_tensor_sync(c)
    nvshmem_free_tensor_sync(b)                # now a's memory returns too
    assert nvshmem_create_tensor((100,), torch.float32).data_ptr() == a_ptr
    try:
        a.zero_() if False else ditron.peer_tensor(a, rank)
        raise AssertionError("a freed tensor was accepted")
    except ditron.DitronError as e:
        assert "freed" in str(e) or "symmetric" in str(e), e
    nvshmem_barrier_all_on_stream()
    nvshmem_free_tensor_sync(views[world.local_rank])
    # dl.notify with Triton-distributed's default comm_scope ("inter_node": an OpenSHMEM signal)
    sig = nvshmem_create_tensor((1,), NVSHMEM_SIGNAL_DTYPE)
    sig.zero_()
    nvshmem_barrier_all_on_stream()
    td_notify_kernel[(1,)](sig, (rank + 1) % n)
    nvshmem_barrier_all_on_stream()
    assert sig.item() == 1
    nvshmem_free_tensor_sync(sig)
    return "host_helpers"


# ---------------------------------------------------------------------------
# kernels for the compile tests and refusals
# ---------------------------------------------------------------------------

@triton_dist.jit
def simt_barrier_kernel(flags, rank, n):
    # the ``if thread_idx < n`` form: one thread per peer (needs per-thread execution)
    with dl.simt_exec_region() as (thread_idx, block_size):
        if thread_idx < n:
            remote = dl.symm_at(flags + rank, thread_idx)
            while atomic_cas(remote, 0, 1, "sys", "release") != 0:
                pass
        if thread_idx < n:
            while ld_acquire(flags + thread_idx, "sys") != 1:
                pass
            st(flags + thread_idx, 0)
        __syncthreads()


def simt_region_on_sim(world):
    flags = nvshmem_create_tensor((world.world_size,), torch.int32)
    flags.zero_()
    nvshmem_barrier_all_on_stream()
    simt_barrier_kernel[(1,)](flags, world.rank, world.world_size)
    return flags.cpu().tolist()


@triton_dist.jit
def extra_names_kernel(src, dst, flag):
    v = ld(src)                                     # relaxed, gpu
    st(dst, v + 1)                                  # relaxed, gpu
    old = atomic_add(dst + 1, 1)                    # relaxed, gpu
    fence()                                         # sc, gpu
    a, b, c, d = load_v4_u32(src + 4)
    st_v4_b32(dst + 4, a, b, c, d, scope="sys", semantic="release")
    x, y = load_v2_b64(src + 8)
    st_v2_u32(dst + 8, x.to(tl.uint32), y.to(tl.uint32))
    w = pack_b32_v2(old, v)
    tl.store(dst + 12, (w >> 32).to(tl.int32))
    while ld_acquire(flag, "sys") != 1:
        pass


@triton_dist.jit
def td_notify_kernel(sig, peer):
    dl.notify(sig, peer, signal=1)                  # Triton-distributed's default comm_scope: inter_node


@triton_dist.jit
def packed_multimem_kernel(p, out):
    a, b, c, d = multimem_ld_reduce_v4(p)
    tl.store(out, a)


ALL = (ring_queue, allgather_putmem_signal, flag_barrier, vector_pull, node_team_allreduce, host_helpers)


def run_inter_node(world):
    """The bodies whose kernels reach other nodes only through SHMEM calls (or the node team)."""
    return [allgather_putmem_signal(world), node_team_allreduce(world), host_helpers(world)]


def run_all(world):
    from triton_dist.utils import is_nvshmem_multimem_supported
    return [body(world) if body is not node_team_allreduce or is_nvshmem_multimem_supported() else body.__name__
            for body in ALL]


# ---------------------------------------------------------------------------
# stock Triton's triton.language.extra.cuda.utils, imported by name (Triton-distributed's all-reduces)
# ---------------------------------------------------------------------------

from triton.language.extra.cuda.utils import globaltimer as _cu_globaltimer  # noqa: E402
from triton.language.extra.cuda.utils import num_threads as _cu_num_threads  # noqa: E402
from triton.language.extra.cuda.utils import num_warps as _cu_num_warps  # noqa: E402
from triton.language.extra.cuda.utils import smid as _cu_smid  # noqa: E402
from triton_dist.language.extra.language_extra import num_threads as _le_num_threads  # noqa: E402
from triton_dist.language.extra.language_extra import num_warps as _le_num_warps  # noqa: E402
from triton_dist.language.extra.language_extra import threads_per_warp as _le_threads_per_warp  # noqa: E402


@triton_dist.jit
def cuda_utils_kernel(out):
    block_dim = _cu_num_warps() * 32
    tl.store(out, block_dim)
    tl.store(out + 1, _cu_num_threads())
    t0 = _cu_globaltimer()
    tl.store(out + 2, (_cu_globaltimer() >= t0).to(tl.int32))
    lanes: tl.constexpr = _le_num_warps() * _le_threads_per_warp()     # language_extra's constexprs
    tl.store(out + 3 + tl.arange(0, 1), tl.full((1,), lanes, tl.int32) + _le_num_threads() * 0)


@triton_dist.jit
def cuda_smid_kernel(out):
    tl.store(out, _cu_smid())


def cuda_utils(world):
    out = torch.zeros(4, dtype=torch.int32, device=world.device)
    cuda_utils_kernel[(1,)](out, num_warps=2)
    try:
        cuda_smid_kernel[(1,)](out)
        smid = "no error"
    except Exception as e:                    # noqa: BLE001 (the message is the result)
        smid = str(e)
    return out.tolist(), "no SM id" in smid
