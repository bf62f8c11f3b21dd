"""Bodies of tests/test_sim_simt_region.py: Triton-distributed's SIMT regions (``dl.simt_exec_region``) on the
simulator, per thread as on a GPU: per-thread CAS loops and ld/st across ranks, per-thread atomics, and a
``syncthreads`` inside the region that every thread reaches."""
import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language.extra import atomic_add, atomic_cas, ld, st, __syncthreads


@ditron.jit
def simt_barrier_kernel(flag_ptr, out_ptr, rank, world_size):
    with dl.simt_exec_region() as (thread_idx, block_size):
        if thread_idx < world_size:          # thread i signals peer i, then waits for peer i's signal
            while atomic_cas(dl.symm_at(flag_ptr + rank, thread_idx), 0, 1, "sys", "release") != 0:
                pass
        if thread_idx < world_size:
            while atomic_cas(flag_ptr + thread_idx, 1, 0, "sys", "acquire") != 1:
                pass
        atomic_add(out_ptr + 1, 1, "gpu", "relaxed")              # every thread of the region adds once
        if thread_idx % 2 == 1:
            atomic_add(out_ptr + 2, thread_idx, "gpu", "relaxed")  # the odd threads add their index
        __syncthreads()                                           # all threads' adds before any read below
        if thread_idx == 0:
            st(out_ptr + 3, ld(out_ptr + 1, "gpu", "acquire"), "gpu", "release")
        if thread_idx == block_size - 1:
            st(out_ptr + 4, block_size, "gpu", "release")


def simt_barrier(world, rounds=2):
    n = world.world_size
    flag = ditron.symm_zeros((n,), torch.int32, name="simt_flags")
    outs = []
    for _ in range(rounds):
        out = ditron.symm_zeros((5,), torch.int32, name="simt_out")
        ditron.barrier_all()
        simt_barrier_kernel[(1,)](flag, out, world.rank, n, num_warps=2)
        outs.append(out.cpu().tolist())
    assert flag.cpu().tolist() == [0] * n          # every peer's signal consumed: the barrier completed
    return outs


# ---------------------------------------------------------------------------
# issue 56, item 2: a condition on a helper's per-thread result, and a thread's values kept between its regions
# (the shape of Triton-distributed's grid barrier; ditron's own code)
# ---------------------------------------------------------------------------

from ditron.language.extra import ld_acquire, tid  # noqa: E402


@ditron.jit
def _leader():
    return (tid(0) + tid(1) + tid(2)) == 0                 # per thread: only thread 0 leads


@ditron.jit
def _grid_sync(count_ptr):
    __syncthreads()
    n = tl.num_programs(0)
    if _leader():                                          # thread 0 of each program arrives once
        add = tl.where(tl.program_id(0) == 0, tl.cast(0x80000000, tl.uint32, bitcast=True) - (n - 1), 1)
        ticket = atomic_add(count_ptr.to(tl.pointer_type(tl.uint32)), add, scope="gpu", semantic="release")
    else:
        ticket = tl.cast(0, tl.uint32)
    if _leader():                                          # the same thread, with its own ticket
        now = ld_acquire(count_ptr)
        while ((ticket ^ now) & 0x80000000) == 0:
            now = ld_acquire(count_ptr)
    __syncthreads()


@ditron.jit
def grid_sync_kernel(count_ptr, out_ptr):
    pid = tl.program_id(0)
    for step in range(3):                                  # three grid barriers: the top bit flips each time
        _grid_sync(count_ptr)
        tl.store(out_ptr + pid, step + 1)
        _grid_sync(count_ptr)
        total = tl.sum(tl.load(out_ptr + tl.arange(0, 4)))  # every program's store of this step is visible
        tl.store(out_ptr + 4 + pid * 3 + step, total)


@ditron.jit
def kept_values_kernel(out_ptr):
    t = tid(0)
    if t < 4:
        mine = t * 10                                       # each thread's own value ...
    else:
        mine = -1
    v = 0
    if t < 4:
        st(out_ptr + t, mine + v, "gpu", "relaxed")        # ... still its own in the next region
    mine = 7                                               # rebound outside any region: every thread's is 7
    if t < 4:
        st(out_ptr + 4 + t, mine, "gpu", "relaxed")


def grid_sync(world):
    count = torch.zeros(1, dtype=torch.int32, device=world.device)
    out = torch.zeros(16, dtype=torch.int32, device=world.device)
    grid_sync_kernel[(4,)](count, out)
    kept = torch.zeros(8, dtype=torch.int32, device=world.device)
    kept_values_kernel[(1,)](kept)
    return count.item() & 0xFFFFFFFF, out[4:].tolist(), kept.tolist()


# ---------------------------------------------------------------------------
# warp-collective SHMEM calls in a branch every lane of a warp takes (Triton-distributed's
# _forward_push_2d_ll_kernel: `wid = thread_idx // 32; if wid < nnodes and wid != nid: putmem_nbi_warp(...)`)
# ---------------------------------------------------------------------------

from ditron.language import shmem  # noqa: E402


@ditron.jit
def warp_put_kernel(src_ptr, dst_ptr, sig_ptr, MODE: tl.constexpr):
    """num_warps=4: warps 1 and 2 each put their 16-int segment of ``src`` into the next rank's ``dst`` and add 1
    to its signal word (once per warp, as on a GPU); the other modes are what a GPU cannot do."""
    thread_idx = dl.tid(0)
    wid = thread_idx // 32
    peer = (dl.rank() + 1) % dl.num_ranks()
    if MODE == "uniform":
        if wid == 1 or wid == 2:
            shmem.putmem_signal_nbi_warp(dst_ptr + wid * 16, src_ptr + wid * 16, 64, sig_ptr, 1, "add", peer)
    elif MODE == "divergent":
        if thread_idx < 40:                  # warp 1: lanes 0-7 only
            shmem.putmem_nbi_warp(dst_ptr, src_ptr, 64, peer)
    else:                                    # "args"
        if wid == 1:
            shmem.putmem_warp(dst_ptr + dl.laneid(), src_ptr, 4, peer)


@ditron.jit
def warp_put_after_kernel(src_ptr, dst_ptr, sig_ptr, MODE: tl.constexpr):
    """Warp 1 puts its 32 ints into the next rank's ``dst``, then each of its lanes reads its element back there
    and counts it in ``sig`` when it arrived: the put is complete in every lane when it returns."""
    wid = dl.tid(0) // 32
    peer = (dl.rank() + 1) % dl.num_ranks()
    if wid == 1:
        shmem.putmem_warp(dst_ptr + 16, src_ptr + 16, 128, peer)
        i = 16 + dl.laneid()
        if ld(dl.symm_at(dst_ptr + i, peer), "gpu", "relaxed") == ld(src_ptr + i, "gpu", "relaxed"):
            atomic_add(sig_ptr, 1, "gpu", "relaxed")


def warp_put(world, mode):
    n = world.world_size
    src = ditron.symm_empty((64,), torch.int32, name="warp_src")
    src.copy_(torch.arange(64, dtype=torch.int32) + 100 * world.rank)
    dst = ditron.symm_zeros((64,), torch.int32, name="warp_dst")
    sig = ditron.symm_zeros((1,), torch.int64, name="warp_sig")
    ditron.barrier_all()
    kernel = warp_put_after_kernel if mode == "after" else warp_put_kernel
    kernel[(1,)](src, dst, sig, MODE=mode, num_warps=4)
    ditron.barrier_all()
    prev = (world.rank - 1) % n
    want = torch.zeros(64, dtype=torch.int32)
    want[16:48] = torch.arange(16, 48, dtype=torch.int32) + 100 * prev
    return bool(torch.equal(dst.cpu(), want)), int(sig.cpu()[0])


# ---------------------------------------------------------------------------
# issue 56 item 1 (Triton-distributed's all_to_all_vdev_2d_offset.py): a warp shuffle on per-lane values inside a
# branch on the thread id (the warp prefix sum of its single-block scan), and a per-thread value passed to a helper
# that builds an aggregate outside any branch (its `Profiler.create(..., is_leader=(tid(0) == 0))`)
# ---------------------------------------------------------------------------

from ditron.language.extra import __ballot_sync, __shfl_up_sync_i32, __shfl_sync_i32, __shfl_down_sync_i32, laneid  # noqa: E402,E501


@ditron.jit
def _warp_scan(x, lane, n):
    """Inclusive prefix sum of the first ``n`` lanes' ``x`` (Hillis-Steele over shfl.up)."""
    step = 1
    while step < n:
        got = __shfl_up_sync_i32(0xFFFFFFFF, x, step)
        if lane >= step:
            x += got
        step = step * 2
    return x


@ditron.jit
def warp_scan_kernel(src_ptr, out_ptr, n, MODE: tl.constexpr):
    """num_warps=2, 64 threads: each warp scans its 32 inputs (lanes past ``n`` add 0); the last lane of each warp
    stores its warp's total, and every lane of warp 1 gets lane 0's value through a broadcast."""
    lane = laneid()
    warp = tid(0) // 32
    if warp < 2:                                           # a branch on the thread id, as in the scan kernel
        v = ld(src_ptr + warp * 32 + lane, "gpu", "relaxed") if lane < n else 0
        inc = _warp_scan(v, lane, n)
        if lane < n:
            st(out_ptr + warp * 32 + lane, inc - v, "gpu", "relaxed")     # exclusive
        if lane == 31:
            st(out_ptr + 64 + warp, inc, "gpu", "relaxed")
    if warp == 1:
        first = __shfl_sync_i32(0xFFFFFFFF, lane * 7 + 3, 0)
        st(out_ptr + 66 + lane, first, "gpu", "relaxed")
    if MODE == "down":                                     # a higher lane's value (lockstep lanes)
        if warp == 0:
            st(out_ptr + lane, __shfl_down_sync_i32(0xFFFFFFFF, lane * 5, 1), "gpu", "relaxed")
    if MODE == "mismatched":                               # the two halves of warp 0 at different collectives
        if warp == 0:
            if lane < 16:
                st(out_ptr + lane, __shfl_up_sync_i32(0xFFFFFFFF, lane, 1), "gpu", "relaxed")
            else:
                st(out_ptr + lane, __ballot_sync(0xFFFFFFFF, lane > 20), "gpu", "relaxed")
    if MODE == "outside_mask":                             # lane 15 reads lane 16, which the mask leaves out
        if lane < 16:
            st(out_ptr + lane, __shfl_down_sync_i32(0x0000FFFF, lane, 1), "gpu", "relaxed")
    if MODE == "divergent":                                # lanes 16-31 skip the shuffle: undefined on a GPU
        if lane < 16:
            st(out_ptr + lane, __shfl_up_sync_i32(0xFFFFFFFF, lane, 1), "gpu", "relaxed")


def warp_scan(world, mode="ok", n=32):
    src = torch.arange(1, 65, dtype=torch.int32, device=world.device) * (world.rank + 1)
    out = torch.full((98,), -1, dtype=torch.int32, device=world.device)
    warp_scan_kernel[(1,)](src, out, n, MODE=mode, num_warps=2)
    return src.cpu(), out.cpu()


@tl.core._aggregate
class Tracer:
    """A Profiler-like aggregate: a buffer cursor and a per-thread ``is_leader``."""
    buf: tl.tensor
    is_leader: tl.tensor
    ENABLED: tl.constexpr

    def __init__(self, buf, is_leader, ENABLED):
        self.buf = buf
        self.is_leader = is_leader
        self.ENABLED = ENABLED

    @triton.jit
    def create(buf, is_leader=True, ENABLED: tl.constexpr = True):
        if ENABLED:
            tl.store(buf, tl.program_id(0) + 100)          # a scalar store: thread 0 of the program makes it
        return Tracer(buf + 1, is_leader, ENABLED)

    @triton.jit
    def record(self, event):
        nxt = self.buf
        if self.ENABLED:
            if self.is_leader:
                atomic_add(self.buf, event, "gpu", "relaxed")   # per thread: the leader alone
            nxt = self.buf + 1
        return Tracer(nxt, self.is_leader, self.ENABLED)


@ditron.jit
def tracer_kernel(buf_ptr, out_ptr, ENABLED: tl.constexpr):
    tracer = Tracer.create(buf_ptr, is_leader=(tid(0) == 33), ENABLED=ENABLED)
    if tl.program_id(0) == 0:
        tracer = tracer.record(5)
    tracer = tracer.record(7)
    atomic_add(out_ptr, 1, "gpu", "relaxed")               # outside any branch: every thread adds once


def tracer(world, enabled=True):
    buf = torch.zeros(4, dtype=torch.int32, device=world.device)
    out = torch.zeros(1, dtype=torch.int32, device=world.device)
    tracer_kernel[(1,)](buf, out, ENABLED=enabled, num_warps=2)
    return buf.cpu().tolist(), out.item()


# ---------------------------------------------------------------------------
# issue 56 item 1, lockstep lanes: the lanes of a warp meet at every warp collective in a branch on the thread id,
# so a lane reads a higher lane's value (shfl_down / shfl_xor reductions, a broadcast from lane 31 after a warp
# prefix sum: Triton-distributed's single_block_prefix_sum_kernel_scan_scan) and votes see every lane
# ---------------------------------------------------------------------------

from ditron.language.extra import __shfl_xor_sync_i32  # noqa: E402


@ditron.jit
def _butterfly_sum(x):
    """Every lane gets the warp's sum (shfl.bfly: each lane reads a higher and a lower lane)."""
    for i in tl.static_range(5):
        x += __shfl_xor_sync_i32(0xFFFFFFFF, x, 16 >> i)
    return x


@ditron.jit
def lockstep_kernel(src_ptr, out_ptr, n, MODE: tl.constexpr):
    """num_warps=2 (64 threads); ``out`` has 6 rows of 64 (one value per thread each)."""
    t = tid(0)
    lane = laneid()
    warp = t // 32
    v = ld(src_ptr + t, "gpu", "relaxed")
    if warp < 2:                                             # every lane of both warps, in a per-thread branch
        if MODE == "scan_bcast":
            inc = _warp_scan(v, lane, n)                     # inclusive prefix sum of the first n lanes
            total = __shfl_sync_i32(0xFFFFFFFF, inc, n - 1)  # the last lane's sum, to every lane
            st(out_ptr + t, inc, "gpu", "relaxed")
            st(out_ptr + 64 + t, total, "gpu", "relaxed")
            st(out_ptr + 128 + t, __shfl_sync_i32(0xFFFFFFFF, v, 31 - lane), "gpu", "relaxed")    # reversed
        if MODE == "reduce":
            x = v
            off = 16
            while off > 0:                                   # tree reduction: lane 0 ends with the sum
                x += __shfl_down_sync_i32(0xFFFFFFFF, x, off)
                off = off // 2
            st(out_ptr + t, x, "gpu", "relaxed")
            st(out_ptr + 64 + t, _butterfly_sum(v), "gpu", "relaxed")
        if MODE == "ballot":
            st(out_ptr + t, __ballot_sync(0xFFFFFFFF, v % 3 == 0), "gpu", "relaxed")
    if MODE == "ballot":
        if lane < 16:                                         # half of each warp: a mask of those lanes
            st(out_ptr + 64 + t, dl.ballot_sync(0x0000FFFF, v % 2 == 0), "gpu", "relaxed")
        else:                                                 # the other half votes apart, with its own mask
            st(out_ptr + 64 + t, dl.ballot_sync(0xFFFF0000, v > 50), "gpu", "relaxed")


def lockstep(world, mode, n=32):
    g = torch.Generator().manual_seed(56 + world.rank)
    src = torch.randint(0, 100, (64,), generator=g, dtype=torch.int32).to(world.device)
    out = torch.full((3 * 64,), -1, dtype=torch.int32, device=world.device)
    lockstep_kernel[(1,)](src, out, n, MODE=mode, num_warps=2)
    return src.cpu().numpy(), out.cpu().numpy().reshape(3, 64)


@ditron.jit
def lane_flag_kernel(flag_ptr, out_ptr):
    """Lane 0 spins on a flag that lane 5 of the same warp sets after a shuffle (the region runs as lockstep
    lanes): on Volta and later GPUs independent thread scheduling lets lane 5 run while lane 0 spins."""
    lane = laneid()
    if tid(0) < 32:
        got = __shfl_sync_i32(0xFFFFFFFF, lane + 100, 31)
        if lane == 0:
            while ld(flag_ptr, "gpu", "acquire") == 0:
                pass
            st(out_ptr, ld(flag_ptr + 1, "gpu", "relaxed"), "gpu", "relaxed")
        if lane == 5:
            st(flag_ptr + 1, got, "gpu", "relaxed")
            st(flag_ptr, 1, "gpu", "release")


@ditron.jit
def lane_signal_kernel(sig_ptr, out_ptr):
    """The same with OpenSHMEM's wait: lane 0 waits for its own rank's signal word, which lane 5 sets."""
    lane = laneid()
    if tid(0) < 32:
        got = __shfl_sync_i32(0xFFFFFFFF, lane + 100, 31)
        if lane == 0:
            shmem.signal_wait_until(sig_ptr, "ge", 1)
            st(out_ptr, ld(out_ptr + 1, "gpu", "relaxed"), "gpu", "relaxed")
        if lane == 5:
            st(out_ptr + 1, got, "gpu", "relaxed")
            shmem.signal_op(sig_ptr, 1, "set", dl.rank())


def lane_flag(world):
    flag = torch.zeros(2, dtype=torch.int32, device=world.device)
    out = torch.zeros(1, dtype=torch.int32, device=world.device)
    lane_flag_kernel[(1,)](flag, out, num_warps=1)
    sig = ditron.symm_zeros((1,), torch.int64, name="lane_sig")
    out2 = torch.zeros(2, dtype=torch.int32, device=world.device)
    lane_signal_kernel[(1,)](sig, out2, num_warps=1)
    return out.item(), out2[0].item()


@ditron.jit
def past_the_end_kernel(out_ptr):
    """Threads 0-7 each store one int, into a 4-element argument: threads 4-7 write past its end."""
    t = tid(0)
    if t < 8:
        st(out_ptr + t, t + 1, "gpu", "relaxed")


def past_the_end(world):
    buf = torch.zeros(8, dtype=torch.int32, device=world.device)
    past_the_end_kernel[(1,)](buf[:4], num_warps=1)          # a view: the writes past it stay in `buf`
    return buf.tolist()
