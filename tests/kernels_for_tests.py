"""Small kernels, one (or a few) per primitive, compiled by the tests."""
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem
from ditron.language import extra as lx


@ditron.jit
def k_rank(out):
    tl.store(out, dl.rank() * 1000 + dl.num_ranks() * 100 + dl.rank(0) * 10 + dl.num_ranks(1))


@ditron.jit
def k_symm_at(x, out, peer, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(dl.symm_at(x + offs, peer)))


@ditron.jit
def k_wait(sig, x, out, n, BLOCK: tl.constexpr, SCOPE: tl.constexpr, SEM: tl.constexpr):
    tok = dl.wait(sig, n, SCOPE, SEM, waitValue=7)
    offs = tl.arange(0, BLOCK)
    ptrs = dl.consume_token(x + offs, tok)
    tl.store(out + offs, tl.load(ptrs))


@ditron.jit
def k_wait_scalar_token(sig, x, out):
    tok = dl.wait(sig, 1, "gpu", "acquire")
    v = dl.consume_token(tl.load(x), tok)
    f = dl.consume_token(tl.load(x).to(tl.float32), tok)
    tl.store(out, v + f.to(tl.int32))


@ditron.jit
def k_notify(sig, peer, SIG_OP: tl.constexpr, SCOPE: tl.constexpr):
    dl.notify(sig, peer, signal=3, sig_op=SIG_OP, comm_scope=SCOPE)


@ditron.jit
def k_multimem(mc, out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = dl.multimem_ld_reduce(mc + offs, op="sum")
    tl.store(out + offs, v)
    dl.multimem_st(mc + offs, v)


@ditron.jit
def k_thread_ids(out):
    t = dl.tid(0)
    tl.store(out + t, dl.laneid() + dl.num_threads() * 100 + dl.num_warps() * 10000)


@ditron.jit
def k_ld_st(p, q, SCOPE: tl.constexpr, LD_SEM: tl.constexpr, ST_SEM: tl.constexpr):
    v = dl.ld(p, scope=SCOPE, semantic=LD_SEM)
    dl.st(q, v + 1, scope=SCOPE, semantic=ST_SEM)


@ditron.jit
def k_atomics(p, out, SCOPE: tl.constexpr, SEM: tl.constexpr):
    a = dl.atomic_add(p, 1, scope=SCOPE, semantic=SEM)
    b = dl.atomic_cas(p + 1, 0, a, scope=SCOPE, semantic=SEM)
    tl.store(out, a + b)


@ditron.jit
def k_fadd(p, out):
    tl.store(out, dl.atomic_add(p, 1.5, scope="gpu", semantic="relaxed"))


@ditron.jit
def k_sync_fence(p, SEM: tl.constexpr, SCOPE: tl.constexpr):
    dl.syncthreads()
    dl.fence(SEM, SCOPE)
    tl.store(p, 1)


@ditron.jit
def k_warp(x, out):
    t = dl.tid(0)
    v = tl.load(x + t)
    b = dl.ballot_sync(-1, v > 0)
    s0 = dl.shfl_sync(-1, v, 0)
    s1 = dl.shfl_up_sync(-1, v, 1)
    s2 = dl.shfl_down_sync(-1, v, 1)
    s3 = dl.shfl_xor_sync(-1, v, 1)
    f = dl.ffs(v)
    tl.store(out + t, b.to(tl.int32) + s0 + s1 + s2 + s3 + f)


@ditron.jit
def k_shmem_ids(out):
    tl.store(out, shmem.my_pe() * 10 + shmem.n_pes())


@ditron.jit
def k_shmem_ptrs(x, out, pe):
    p = shmem.remote_ptr(x, pe)
    tl.store(out, tl.load(p))


@ditron.jit
def k_shmem_mc(x, out):
    p = shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, x)
    tl.store(out, tl.load(p))


@ditron.jit
def k_shmem_put_get(dst, src, nbytes, pe):
    shmem.putmem(dst, src, nbytes, pe)
    shmem.putmem_nbi(dst, src, nbytes, pe)
    shmem.putmem_block(dst, src, nbytes, pe)
    shmem.putmem_nbi_block(dst, src, nbytes, pe)
    shmem.putmem_warp(dst, src, nbytes, pe)
    shmem.putmem_nbi_warp(dst, src, nbytes, pe)
    shmem.getmem(dst, src, nbytes, pe)
    shmem.getmem_nbi(dst, src, nbytes, pe)
    shmem.getmem_block(dst, src, nbytes, pe)
    shmem.getmem_nbi_block(dst, src, nbytes, pe)
    shmem.getmem_warp(dst, src, nbytes, pe)
    shmem.getmem_nbi_warp(dst, src, nbytes, pe)


@ditron.jit
def k_shmem_signal(dst, src, nbytes, sig, pe, out):
    shmem.putmem_signal(dst, src, nbytes, sig, 1, shmem.NVSHMEM_SIGNAL_SET, pe)
    shmem.putmem_signal_nbi(dst, src, nbytes, sig, 1, shmem.NVSHMEM_SIGNAL_ADD, pe)
    shmem.putmem_signal_block(dst, src, nbytes, sig, 1, "set", pe)
    shmem.putmem_signal_nbi_block(dst, src, nbytes, sig, 1, "add", pe)
    shmem.putmem_signal_warp(dst, src, nbytes, sig, 1, "set", pe)
    shmem.putmem_signal_nbi_warp(dst, src, nbytes, sig, 1, "set", pe)
    shmem.signal_op(sig, 5, shmem.NVSHMEM_SIGNAL_ADD, pe)
    v = shmem.signal_wait_until(sig, shmem.NVSHMEM_CMP_GE, 5)
    tl.store(out, v)


@ditron.jit
def k_shmem_sync():
    shmem.quiet()
    shmem.fence()
    shmem.barrier_all()
    shmem.barrier_all_block()
    shmem.barrier_all_warp()
    shmem.sync_all()
    shmem.sync_all_block()
    shmem.sync_all_warp()


@ditron.jit
def k_notify_inter(sig, peer):
    dl.notify(sig, peer, signal=1, sig_op="add", comm_scope="inter_node")


@triton.jit
def helper_remote_load(x, peer):
    return tl.load(dl.symm_at(x, peer))


@ditron.jit
def k_uses_helper(x, out, peer):
    tl.store(out, helper_remote_load(x, peer))


@ditron.jit(do_not_specialize=["peer"])
def k_plain(x, out, peer):
    tl.store(out, tl.load(x) + peer)


@ditron.jit
def k_poll_bounded(flags, out, flag, BLOCK: tl.constexpr):
    """A user polling loop bounded with dl.clock_ns / dl.poll_timeout."""
    offs = tl.arange(0, BLOCK)
    t0 = dl.clock_ns()
    v = tl.load(flags + offs, volatile=True)
    while tl.sum((v != flag).to(tl.int32), 0) > 0:
        dl.poll_timeout(t0, flags + offs, flag, v, v != flag)
        v = tl.load(flags + offs, volatile=True)
    tl.store(out, dl.clock_ns() - t0)


@triton.jit
def k_prefetch_l2(w, out, n, LINES: tl.constexpr):
    """dl.prefetch_l2 of the first LINES lines of w (masked past n), then a load that uses them."""
    offs = tl.arange(0, LINES) * 64
    dl.prefetch_l2(w + offs, mask=offs < n)
    tl.store(out, tl.sum(tl.load(w + offs, mask=offs < n, other=0.0).to(tl.float32), 0))


@ditron.jit
def k_vec_access(p, q, SCOPE: tl.constexpr, LD_SEM: tl.constexpr, ST_SEM: tl.constexpr):
    a, b, c, d = lx.load_v4_b32(p, scope=SCOPE, semantic=LD_SEM)
    lx.st_v4_b32(q, a + 1, b, c, d, scope=SCOPE, semantic=ST_SEM)
    x, y = lx.load_v2_b64(p + 4)
    lx.st_v2_u32(q + 4, x.to(tl.int32), y.to(tl.int32))
    e, f, g, h = lx.load_v4_u32(p + 8)
    lx.st_v4_u32(q + 8, e, f, g, h)
