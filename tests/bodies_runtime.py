"""Per-rank bodies of the runtime tests (tests/test_dist_runtime.py).

Each body is ``body(world, **params)``: it runs on one rank (a simulated rank
on the CPU, this process's GPU under torchrun) and returns plain Python values
that the test compares across ranks.  Data is random (seeded by rank and case,
so a receiver can regenerate what its peer sent) and checked against torch.
"""
import traceback

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.errors import DitronError
from ditron.language import shmem
from ditron.runtime import world as rt


# ---------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------

@ditron.jit
def k_ids(out, x, pe):
    p = shmem.remote_ptr(x, pe)
    tl.store(out + 0, dl.rank())
    tl.store(out + 1, dl.num_ranks())
    tl.store(out + 2, shmem.my_pe())
    tl.store(out + 3, shmem.n_pes())
    tl.store(out + 4, dl.rank(0))
    tl.store(out + 5, dl.num_ranks(0))
    tl.store(out + 6, tl.load(p))
    tl.store(out + 7, tl.load(dl.symm_at(x, pe)))


@ditron.jit
def k_pingpong(flag, peer, iters, PING: tl.constexpr):
    for i in range(iters):
        if PING:
            dl.notify(flag, peer, signal=i + 1, sig_op="set", comm_scope="intra_node")
            dl.wait(flag, 1, "sys", "acquire", waitValue=i + 1)
        else:
            dl.wait(flag, 1, "sys", "acquire", waitValue=i + 1)
            dl.notify(flag, peer, signal=i + 1, sig_op="set", comm_scope="intra_node")


@ditron.jit
def k_pingpong_shmem(sig, peer, iters, PING: tl.constexpr):
    for i in range(iters):
        if PING:
            shmem.signal_op(sig, i + 1, shmem.NVSHMEM_SIGNAL_SET, peer)
            shmem.signal_wait_until(sig, shmem.NVSHMEM_CMP_EQ, i + 1)
        else:
            shmem.signal_wait_until(sig, shmem.NVSHMEM_CMP_EQ, i + 1)
            shmem.signal_op(sig, i + 1, shmem.NVSHMEM_SIGNAL_SET, peer)


@ditron.jit(do_not_specialize=["nbytes", "pe"], do_not_specialize_on_alignment=["dst", "src"])
def k_chunks(dst, src, nbytes, pe, CHUNK: tl.constexpr, MODE: tl.constexpr):
    """Each program moves one CHUNK-byte piece: MODE 0 putmem_nbi_block, 1
    getmem_nbi_block, 2 putmem (thread), 3 getmem_warp, 4 putmem_block."""
    off = tl.program_id(0).to(tl.int64) * CHUNK
    size = tl.minimum(nbytes - off, CHUNK)
    if size > 0:
        if MODE == 0:
            shmem.putmem_nbi_block(dst + off, src + off, size, pe)
        elif MODE == 1:
            shmem.getmem_nbi_block(dst + off, src + off, size, pe)
        elif MODE == 2:
            shmem.putmem(dst + off, src + off, size, pe)
        elif MODE == 3:
            shmem.getmem_warp(dst + off, src + off, size, pe)
        else:
            shmem.putmem_block(dst + off, src + off, size, pe)
    shmem.quiet()


@ditron.jit(do_not_specialize=["nbytes", "pe", "rnd"])
def k_put_signal(dst, src, nbytes, sig, pe, rnd, recv, got, BLOCK: tl.constexpr, NBI: tl.constexpr):
    if NBI:
        shmem.putmem_signal_nbi_block(dst, src, nbytes, sig, rnd, shmem.NVSHMEM_SIGNAL_SET, pe)
    else:
        shmem.putmem_signal_block(dst, src, nbytes, sig, rnd, shmem.NVSHMEM_SIGNAL_SET, pe)
    v = shmem.signal_wait_until(sig, shmem.NVSHMEM_CMP_GE, rnd)
    tl.store(got, v)
    for start in range(0, nbytes, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < nbytes
        tl.store(recv + offs, tl.load(dst + offs, mask=m), mask=m)


@ditron.jit
def k_signal_add(sig, pe, times, expect, got):
    # shmem.signal_op is thread-level (every thread would add); dl.notify with
    # comm_scope="inter_node" is the once-per-program OpenSHMEM signal
    for i in range(times):
        dl.notify(sig, pe, signal=1, sig_op="add", comm_scope="inter_node")
    v = shmem.signal_wait_until(sig, shmem.NVSHMEM_CMP_EQ, expect)
    tl.store(got, v)


@ditron.jit
def k_barrier_loop(slot, err, iters):
    """iters rounds of: write i+1 into the next rank's slot, barrier, check
    my slot holds i+1 (from the previous rank), barrier."""
    me = dl.rank()
    nxt = (me + 1) % dl.num_ranks()
    bad = 0
    for i in range(iters):
        v = i + 1
        dl.st(dl.symm_at(slot, nxt), v, scope="sys", semantic="relaxed")
        shmem.barrier_all_block()
        got = dl.ld(slot, scope="sys", semantic="relaxed")
        bad += (got != v).to(tl.int32)
        shmem.barrier_all_block()
    tl.store(err, bad)


@ditron.jit
def k_add_next(counter):
    nxt = (dl.rank() + 1) % dl.num_ranks()
    # once per program (dl.atomic_add would add in every thread)
    dl.notify(counter, nxt, signal=1, sig_op="add", comm_scope="intra_node")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _rand_bytes(n, seed, device):
    """Random bytes that any rank can regenerate from ``seed`` (on its own device)."""
    on_gpu = str(device).startswith("cuda")
    g = torch.Generator(device=device if on_gpu else "cpu")
    g.manual_seed(seed)
    out = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g, device=device if on_gpu else "cpu")
    return out if on_gpu else out.to(device)


def _sync(world):
    if world.device is not None and str(world.device).startswith("cuda"):
        torch.cuda.synchronize(world.device)


def _neighbours(world):
    n = world.world_size
    return (world.rank + 1) % n, (world.rank - 1) % n


# ---------------------------------------------------------------------------
# bodies
# ---------------------------------------------------------------------------

def body_ids(world):
    """World descriptor and NVSHMEM module init: rank/size from dl.* and
    shmem.*, remote_ptr and symm_at reads of the next rank's value."""
    nxt, _ = _neighbours(world)
    x = rt.symm_zeros((1,), torch.int32, name="x")
    x.fill_(100 + world.rank)
    out = torch.full((8,), -1, dtype=torch.int32, device=world.device)
    rt.barrier_all()
    k_ids[(1,)](out, x, nxt)
    _sync(world)
    rt.barrier_all()
    return out.tolist()


def body_pingpong(world, iters=100, via="dl"):
    """Pairs (0,1), (2,3), ...: even ranks ping, odd ranks pong, iters rounds."""
    peer = world.rank ^ 1
    if peer >= world.world_size:
        # the last rank of an odd world has no partner, but it takes part in the same barriers as the others
        # (a rank that skips a collective barrier leaves the others one barrier ahead: a hang or a race later)
        rt.barrier_all()
        rt.barrier_all()
        return "alone"
    ping = world.rank % 2 == 0
    with rt.heap_scope():
        if via == "dl":
            flag = rt.symm_zeros((1,), torch.int32, name="pingpong_flag")
            rt.barrier_all()
            k_pingpong[(1,)](flag, peer, iters, PING=ping)
        else:
            flag = rt.symm_zeros((1,), torch.uint64 if hasattr(torch, "uint64") else torch.int64, name="pingpong_sig")
            rt.barrier_all()
            k_pingpong_shmem[(1,)](flag, peer, iters, PING=ping)
        _sync(world)
        rt.barrier_all()
        return int(flag.view(torch.int64 if flag.element_size() == 8 else torch.int32).item())


def body_put_get(world, nbytes, mode, dst_off=0, src_off=0, chunk=1 << 20):
    """Every rank puts (mode 0, 2, 4) its random bytes into the next rank, or
    gets (mode 1, 3) the previous rank's; returns whether what arrived equals
    what the peer generated."""
    nxt, prv = _neighbours(world)
    pad = 64
    with rt.heap_scope():
        src = rt.symm_empty((nbytes + pad,), torch.uint8, name="src")
        dst = rt.symm_empty((nbytes + pad,), torch.uint8, name="dst")
        mine = _rand_bytes(nbytes, 1000 * world.rank + nbytes % 997, world.device)
        src[src_off:src_off + nbytes].copy_(mine)
        dst.fill_(0xAB)                       # poison
        rt.barrier_all()
        grid = (triton.cdiv(nbytes, chunk),)
        if mode in (1, 3):       # get from the previous rank
            k_chunks[grid](dst[dst_off:], src[src_off:], nbytes, prv, CHUNK=chunk, MODE=mode)
        else:
            k_chunks[grid](dst[dst_off:], src[src_off:], nbytes, nxt, CHUNK=chunk, MODE=mode)
        _sync(world)
        rt.barrier_all()
        expect = _rand_bytes(nbytes, 1000 * prv + nbytes % 997, world.device)
        got = dst[dst_off:dst_off + nbytes]
        ok = bool(torch.equal(got, expect))
        untouched = bool((dst[:dst_off] == 0xAB).all()) and bool((dst[dst_off + nbytes:] == 0xAB).all())
        bad = int((got != expect).sum().item()) if not ok else 0
        rt.barrier_all()
        return {"ok": ok, "untouched": untouched, "bad_bytes": bad}


def body_put_signal(world, nbytes=4096 + 5, nbi=False):
    """putmem_signal to the next rank, signal_wait_until on my word; the data
    read inside the kernel after the wait must be the previous rank's; twice
    (signal values 1 then 2) to check reuse."""
    nxt, prv = _neighbours(world)
    u64 = torch.uint64 if hasattr(torch, "uint64") else torch.int64
    results = []
    with rt.heap_scope():
        src = rt.symm_empty((nbytes,), torch.uint8, name="ps_src")
        dst = rt.symm_zeros((nbytes,), torch.uint8, name="ps_dst")
        sig = rt.symm_zeros((1,), u64, name="ps_sig")
        recv = torch.zeros(nbytes, dtype=torch.uint8, device=world.device)
        got = torch.zeros(1, dtype=torch.int64, device=world.device)
        for rnd in (1, 2):
            mine = _rand_bytes(nbytes, 77 * world.rank + rnd, world.device)
            src.copy_(mine)
            recv.zero_()
            rt.barrier_all()
            k_put_signal[(1,)](dst, src, nbytes, sig, nxt, rnd, recv, got, BLOCK=1024, NBI=nbi)
            _sync(world)
            rt.barrier_all()
            expect = _rand_bytes(nbytes, 77 * prv + rnd, world.device)
            results.append({"signal": int(got.item()), "data_ok": bool(torch.equal(recv, expect))})
        sig_add = rt.symm_zeros((1,), u64, name="add_sig")
        rt.barrier_all()
        k_signal_add[(1,)](sig_add, nxt, 3, 3, got)
        _sync(world)
        results.append({"add": int(got.item())})
        rt.barrier_all()
    return results


def body_rank_copy(world, nbytes=(1 << 20) + 3):
    """rank_copy pull from the previous rank and push into the next rank."""
    nxt, prv = _neighbours(world)
    with rt.heap_scope():
        a = rt.symm_empty((nbytes,), torch.uint8, name="rc_a")
        pushed = rt.symm_zeros((nbytes,), torch.uint8, name="rc_pushed")
        a.copy_(_rand_bytes(nbytes, 31 * world.rank + 5, world.device))
        pulled = torch.zeros(nbytes, dtype=torch.uint8, device=world.device)
        rt.barrier_all()
        rt.rank_copy(pulled, a, src_rank=prv)
        rt.rank_copy(pushed, a, dst_rank=nxt)
        _sync(world)
        rt.barrier_all()
        expect = _rand_bytes(nbytes, 31 * prv + 5, world.device)
        r = {"pull": bool(torch.equal(pulled, expect)), "push": bool(torch.equal(pushed, expect))}
        if str(world.device).startswith("cuda"):
            s = torch.cuda.Stream(world.device)
            pulled.zero_()
            torch.cuda.current_stream(world.device).synchronize()
            rt.rank_copy(pulled, a, src_rank=prv, stream=s)
            s.synchronize()
            r["stream"] = bool(torch.equal(pulled, expect))
        rt.barrier_all()
        return r


def body_barrier_loop(world, device_iters=10_000, host_iters=10_000, checked_iters=1000):
    """The device barrier (shmem.barrier_all_block) reused device_iters times
    in one kernel with a check each round; the host barrier host_iters times;
    and checked_iters rounds of kernel + host barrier with a counter."""
    with rt.heap_scope():
        slot = rt.symm_zeros((1,), torch.int64, name="bl_slot")
        err = torch.full((1,), -1, dtype=torch.int32, device=world.device)
        rt.barrier_all()
        k_barrier_loop[(1,)](slot, err, device_iters)
        _sync(world)
        rt.barrier_all()
        for _ in range(host_iters):
            rt.barrier_all()
        counter = rt.symm_zeros((1,), torch.int32, name="bl_counter")
        rt.barrier_all()
        for _ in range(checked_iters):
            k_add_next[(1,)](counter)
            rt.barrier_all()
        _sync(world)
        rt.barrier_all()
        return {"device_errors": int(err.item()), "counter": int(counter.item())}


def body_errors(world):
    """Non-symmetric tensors and bad ranks are clear DitronErrors naming the argument."""
    out = {}
    plain = torch.zeros(16, dtype=torch.float32, device=world.device)
    symm = rt.symm_zeros((16,), torch.float32, name="err_symm")
    nxt, _ = _neighbours(world)
    for key, fn in (("peer_tensor", lambda: rt.peer_tensor(plain, nxt)),
                    ("rank_copy_src", lambda: rt.rank_copy(symm, plain, src_rank=nxt)),
                    ("rank_copy_dst", lambda: rt.rank_copy(plain, symm, dst_rank=nxt)),
                    ("bad_rank", lambda: rt.peer_tensor(symm, world.world_size + 3)),
                    ("shape", lambda: rt.rank_copy(symm[:8], symm, src_rank=nxt))):
        try:
            fn()
            out[key] = None
        except DitronError as e:
            out[key] = str(e)
        except Exception as e:  # noqa: BLE001
            out[key] = f"WRONG {type(e).__name__}: {e}\n{traceback.format_exc()}"
    out["is_symmetric"] = (rt.is_symmetric(symm), rt.is_symmetric(plain))
    rt.barrier_all()
    return out
