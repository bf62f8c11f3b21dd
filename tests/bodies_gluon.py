"""Bodies of tests/test_gluon.py: distributed Gluon kernels (``@ditron.gluon.jit``) and their ``tl`` twins.

``ring_push``: every rank pushes its row into the next rank's symmetric buffer (``dl.symm_at``), signals it
(``dl.notify``), waits for the previous rank's signal (``dl.wait`` + ``dl.consume_token``) and copies what it
received out.  On GPUs the Gluon kernel runs; on the simulator its twin ``ring_push_tl`` (the same protocol in
``tl``)."""
import torch
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import ditron
import ditron.language as dl


@ditron.jit
def ring_push_tl(x_ptr, buf_ptr, sig_ptr, out_ptr, n, BLOCK: tl.constexpr, WARP: tl.constexpr):
    me = dl.rank()
    peer = (me + 1) % dl.num_ranks()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dl.symm_at(buf_ptr, peer) + offs, tl.load(x_ptr + offs, mask=m), mask=m)
    dl.notify(sig_ptr + tl.program_id(0), peer, signal=1, sig_op="add", comm_scope="intra_node")
    tok = dl.wait(sig_ptr + tl.program_id(0), 1, "sys", "acquire")
    tl.store(out_ptr + offs, tl.load(dl.consume_token(buf_ptr, tok) + offs, mask=m), mask=m)


@ditron.gluon.jit(twin=ring_push_tl)
def ring_push(x_ptr, buf_ptr, sig_ptr, out_ptr, n, BLOCK: gl.constexpr, WARP: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([BLOCK // (WARP * 4)], [WARP], [4], [0])
    me = dl.rank()
    peer = (me + 1) % dl.num_ranks()
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    m = offs < n
    gl.store(dl.symm_at(buf_ptr, peer) + offs, gl.load(x_ptr + offs, mask=m), mask=m)
    dl.notify(sig_ptr + gl.program_id(0), peer, signal=1, sig_op="add", comm_scope="intra_node")
    tok = dl.wait(sig_ptr + gl.program_id(0), 1, "sys", "acquire")
    gl.store(out_ptr + offs, gl.load(dl.consume_token(buf_ptr, tok) + offs, mask=m), mask=m)


def _row(rank, n, device):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(n, generator=g, dtype=torch.float32).to(torch.float16).to(device)


def gluon_ring(w, n, block=512):
    """Each rank's output equals the previous rank's row; returns (rank, True) or the first wrong index."""
    dev = w.device
    x = _row(w.rank, n, dev)
    buf = ditron.symm_zeros((n,), torch.float16, name="gluon_ring_buf")
    grid = (triton_cdiv(n, block),)
    sig = ditron.symm_zeros((grid[0],), torch.int32, name="gluon_ring_sig")
    out = torch.full((n,), -1.0, dtype=torch.float16, device=dev)
    ditron.barrier_all()
    ring_push[grid](x, buf, sig, out, n, BLOCK=block, WARP=32)
    want = _row((w.rank - 1) % w.world_size, n, dev)
    ditron.barrier_all()
    bad = (out != want).nonzero()
    return (w.rank, True if bad.numel() == 0 else int(bad[0]))


def triton_cdiv(a, b):
    return (a + b - 1) // b


def no_twin_refused(w):
    """A Gluon kernel without a twin, launched on the simulator: the message."""
    @ditron.gluon.jit
    def lonely(x_ptr, n, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = gl.arange(0, BLOCK, layout=layout)
        gl.store(x_ptr + offs, gl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(8)
    try:
        lonely[(1,)](x, 8, BLOCK=128)
    except ditron.DitronError as e:
        return str(e)
    return None


@gluon.jit
def _partition_poll(sig_ptr, x_ptr, out_ptr, BLOCK: gl.constexpr):
    """One warp: poll the flag per thread (acquire, system scope: no program-wide barrier), then copy."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    while dl.ld(sig_ptr, "sys", "acquire") != 1:
        pass
    offs = gl.arange(0, BLOCK, layout=layout)
    gl.store(out_ptr + offs, gl.load(x_ptr + offs))


@gluon.jit
def _partition_idle(sig_ptr, x_ptr, out_ptr, BLOCK: gl.constexpr):
    pass


@ditron.gluon.jit
def partition_waiter(sig_ptr, x_ptr, out_ptr, BLOCK: gl.constexpr):
    """A warp-specialised kernel whose one-warp worker partition waits for a peer's flag."""
    gl.warp_specialize([(_partition_idle, (sig_ptr, x_ptr, out_ptr, BLOCK)),
                        (_partition_poll, (sig_ptr, x_ptr, out_ptr, BLOCK))], [1], [48])
