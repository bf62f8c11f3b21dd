"""AllToAll written in ditron.language: equal splits and variable splits
whose token counts are known only on the device.

    ctx = create_all_to_all_context(max_tokens, hidden, torch.bfloat16)    # collective, once
    out = all_to_all(x, ctx)                        # x: [world_size * t, hidden]
    out, recv_counts = all_to_all_v(x, splits, ctx) # splits: device int tensor [world_size]

``max_tokens`` bounds the rows of ``x`` on every rank (so one rank can receive
at most ``world_size * max_tokens`` rows).

Equal splits: rows ``[j * t, (j + 1) * t)`` of ``x`` go to rank ``j``; ``out`` rows
``[s * t, (s + 1) * t)`` come from rank ``s`` (``torch.distributed.all_to_all_single``
with equal splits).

Variable splits: ``x``'s rows are grouped by destination: the first
``splits[0]`` rows go to rank 0, the next ``splits[1]`` to rank 1, ...  (the
splits should sum to ``x.shape[0]``; on the device, negative counts count as 0
and counts past the end of ``x`` are cut).  ``out`` is ``[world_size * max_tokens,
hidden]``: the received rows packed in source order -- rank ``s``'s rows start at
row ``sum(recv_counts[:s])`` -- and rows from ``recv_counts.sum()`` on are left as
they were.  ``recv_counts`` (int64 ``[world_size]``, on the device) holds the rows
received from each rank.  Nothing is read back to the host.

How: each program of the sender copies its chunk of the rows for rank ``j``
(and, with variable splits, the count) into ``j``'s receive slot, then sets
one signal word on ``j``; the counts travel in the same release as the data,
so the receiver knows where source ``s``'s rows go once ``s``'s signal arrives.
The receiver waits for every source's word (one ``dl.wait`` over
``world_size`` words), computes its packed offsets from the counts and copies
the slots into ``out``.  Ranks on other nodes receive by
``shmem.putmem_block`` (count) + ``putmem_signal_block`` (rows), staged in the
sender's own slot.

Buffers and signals (symmetric, allocated once):

* ``buf[2][world_size][max_tokens * hidden]`` (``dtype``): ``buf[p][s]`` receives
  rank ``s``'s rows.
* ``cnt[2 * max_programs * world_size + 2 * max_programs]`` (int64):
  ``cnt[(p * max_programs + q) * world_size + s]`` receives rank ``s``'s row count from its program ``q`` (every
  program of a sender sends the count beside its rows and signal, each to its own word: the receiving program
  ``q`` reads the word its own wait orders, and no two programs write one word); the rest stages counts for
  remote puts.
* ``sig[2][max_programs][world_size]`` (int64).

Reuse follows kernels/_common.py (parity ``e % 2``, signal value ``e + 1``; see
kernels/all_gather.py for why a rank is at most one call ahead).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem

from ._common import CollectiveContext, enter, epoch_begin, epoch_end, sm_count, topology
from ._common import next_pow2
from ._common import op_fields as _fields
from .all_gather import (_SLOT_ALIGN, _chunk, _copy_local, _copy_to_peer, _put_chunk, _round_up,
                         check_out, launch_config)


# Core builtins only (tl.reduce / tl.associative_scan with our own combine
# function): the standard library's @jit helpers (tl.sum, tl.cumsum, tl.cdiv)
# are not callable in simulated ranks whose Triton was imported before
# TRITON_INTERPRET=1 was set (the test pool's workers).
@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _pick(vec, idx, i):
    """vec[i] as a scalar (vec: a small 1-D tile indexed by idx)."""
    return tl.reduce(tl.where(idx == i, vec, 0), 0, _add)


@triton.jit
def _exclusive_cumsum(vec):
    """Exclusive prefix sums of a 1-D tile.  Up to 64 elements (ranks, local experts) a masked
    ``[N, N]`` reduction, not ``tl.associative_scan``: Triton 3.6's scan lowering aborts
    (``ScanOpToLLVM.cpp:265``, ``AddPartialReduceOneWarp``) on a blocked layout that holds more
    elements per thread along a dimension than the tile has there, which the layout passes give a
    small tile next to a vectorised row copy (``sizePerThread = [1, 8]`` on a 2-wide tile);
    reductions lower on any layout (tests/test_ep_compile.py)."""
    N: tl.constexpr = vec.shape[0]
    if N <= 64:
        i = tl.arange(0, N)
        return tl.reduce(tl.where(i[:, None] < i[None, :], vec[:, None], 0), 0, _add)
    else:
        return tl.associative_scan(vec, 0, _add) - vec


@triton.jit
def _sum_below(vec, idx, i):
    """``sum(vec[j] for j < i)`` as a scalar (vec: a small 1-D tile indexed by idx)."""
    return tl.reduce(tl.where(idx < i, vec, 0), 0, _add)


@ditron.jit(do_not_specialize=["t_equal", "x_rows", "H", "slot_stride", "max_programs"])   # 1 -> constexpr
def all_to_all_kernel(x_ptr, out_ptr, splits_ptr, recv_counts_ptr, buf_ptr, cnt_ptr, sig_ptr, calls_ptr,
                      t_equal, x_rows, H, slot_stride, max_programs,
                      EQUAL: tl.constexpr, MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr, WP: tl.constexpr,
                      BLOCK: tl.constexpr):
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    pid = tl.program_id(0)
    me, W, LW, node, NN, local = topology()
    H64 = H.to(tl.int64)
    ss = slot_stride.to(tl.int64)
    sigp = sig_ptr + (par * max_programs + pid) * W
    bufp = buf_ptr + par * (W * ss)
    my_slot = bufp + me * ss
    cntp = cnt_ptr + (par * max_programs + pid) * W      # this program's count words (see the docstring)
    ridx = tl.arange(0, WP)
    rmask = ridx < W

    # rows this rank sends to each rank, and where they start in x
    if EQUAL:
        sends = tl.where(rmask, t_equal, 0).to(tl.int64)
    else:
        sends = tl.maximum(tl.load(splits_ptr + ridx, mask=rmask, other=0).to(tl.int64), 0)
    soff = _exclusive_cumsum(sends)
    sends = tl.minimum(sends, tl.maximum(x_rows - soff, 0))

    # ---------------- send: ranks of this node by stores, the others by puts ----------------
    node0 = node * LW
    for k in range(1, LW):
        peer = node0 + (local + k) % LW
        cnt = _pick(sends, ridx, peer)
        lo, hi = _chunk(cnt * H64, BLOCK)
        _copy_to_peer(x_ptr + _pick(soff, ridx, peer) * H64, my_slot, lo, hi, peer, BLOCK)
        if not EQUAL:
            tl.store(dl.symm_at(cntp + me, peer), cnt)
        dl.notify(sigp + me, peer, signal=val, sig_op="set", comm_scope="intra_node")
    if MULTI_NODE:
        stage_cnt = cnt_ptr + 2 * max_programs * W + par * max_programs + pid
        for k in range(1, NN):
            for l in range(0, LW):
                peer = ((node + k) % NN) * LW + (local + l) % LW
                cnt = _pick(sends, ridx, peer)
                row0 = _pick(soff, ridx, peer) * H64
                lo, hi = _chunk(cnt * H64, BLOCK)
                seg = my_slot + row0                      # staged where the rows sit in x (own slot is free)
                _copy_local(x_ptr + row0, seg, lo, hi, BLOCK)
                if not EQUAL:
                    tl.store(stage_cnt, cnt)
                    dl.fence("release", "sys")
                    dl.syncthreads()
                    shmem.putmem_block(cntp + me, stage_cnt, 8, peer)
                    shmem.fence()                         # the count lands before the rows' signal
                _put_chunk(my_slot, seg, lo, hi, sigp + me, val, peer, ELEM_BYTES)

    # ---------------- receive: every source's chunk, then pack into out ----------------
    dl.notify(sigp + me, me, signal=val, sig_op="set", comm_scope="gpu")
    tok = dl.wait(sigp, W, "sys", "acquire", waitValue=val)
    bufp = dl.consume_token(bufp, tok)
    if EQUAL:
        recv = sends
    else:
        recv = tl.load(dl.consume_token(cntp, tok) + ridx, mask=rmask, other=0)
        recv = tl.where(ridx == me, sends, recv)
        if pid == 0:
            tl.store(recv_counts_ptr + ridx, recv, mask=rmask)
    roff = _exclusive_cumsum(recv)
    for k in range(0, W):
        src = (me + k) % W
        lo, hi = _chunk(_pick(recv, ridx, src) * H64, BLOCK)
        dst = out_ptr + _pick(roff, ridx, src) * H64
        if k == 0:
            _copy_local(x_ptr + _pick(soff, ridx, me) * H64, dst, lo, hi, BLOCK)
        else:
            _copy_local(bufp + src * ss, dst, lo, hi, BLOCK)
    epoch_end(calls_ptr)


class AllToAllContext(CollectiveContext):
    """Symmetric buffers and signals of all_to_all (see the module docstring)."""

    op = "all_to_all"
    creator = "create_all_to_all_context"

    def __init__(self, max_tokens, hidden, dtype, world=None, max_programs=None):
        if int(hidden) < 1:
            raise ditron.DitronError("all_to_all: hidden must be >= 1")
        super().__init__(int(max_tokens) * int(hidden), dtype, world)
        W = self.world_size
        self.max_tokens = int(max_tokens)
        self.hidden = int(hidden)
        self.multi_node = self.world.nnodes > 1
        self.slot_stride = _round_up(max(self.max_numel, 1), _SLOT_ALIGN)
        if self.world.backend == "sim":
            self.max_programs = int(max_programs or 2)
        else:
            self.max_programs = int(max_programs or min(64, sm_count(self.device)))
        self.buf = self.symm((2, W, self.slot_stride), dtype, "buf")
        self.cnt = self.symm((2 * self.max_programs * W + 2 * self.max_programs,), torch.int64, "cnt")
        self.sig = self.symm((2, self.max_programs, W), torch.int64, "sig")
        self.wp = max(2, next_pow2(W))
        ditron.barrier_all()

    def check_x(self, x):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden:
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ditron.DitronError(f"all_to_all: x must be [tokens, hidden={self.hidden}], got {shape}")
        if x.shape[0] > self.max_tokens:
            raise ditron.DitronError(f"all_to_all: x has {x.shape[0]} tokens, more than the context's "
                                     f"max_tokens={self.max_tokens}; create a larger context")
        self.check_tensor(x, "x")


def create_all_to_all_context(max_tokens, hidden, dtype, world=None, max_programs=None):
    """Allocate all_to_all's symmetric buffers (``2 * world_size * max_tokens *
    hidden`` elements) and signals for inputs of up to ``max_tokens`` rows of
    ``hidden`` elements.  Collective: every rank calls it with the same arguments."""
    return AllToAllContext(max_tokens, hidden, dtype, world, max_programs)


def _launch(ctx, x, out, splits, recv_counts, t_equal, seg_numel, equal):
    block, programs, warps = launch_config(ctx.world, seg_numel, x.element_size(), ctx.max_programs)
    key = (t_equal, seg_numel, equal, x.shape[0], x.dtype, getattr(splits, "dtype", None)) + tuple(
        t.data_ptr() % 16 == 0 if isinstance(t, torch.Tensor) else t for t in (x, out, splits, recv_counts))
    ctx.launch(key, all_to_all_kernel, (programs,),
               (x, out, splits, recv_counts, ctx.buf, ctx.cnt, ctx.sig, ctx.calls, t_equal, x.shape[0], ctx.hidden,
                ctx.slot_stride, ctx.max_programs),
               dict(EQUAL=equal, MULTI_NODE=ctx.multi_node, ELEM_BYTES=x.element_size(), WP=ctx.wp, BLOCK=block,
                    num_warps=warps))


def all_to_all(x, ctx, out=None):
    """Equal splits: ``x`` is ``[world_size * t, hidden]`` (the same ``t`` on
    every rank); returns ``out`` ``[world_size * t, hidden]`` with rank ``s``'s
    rows ``[rank * t, (rank + 1) * t)`` at rows ``[s * t, (s + 1) * t)``."""
    enter(ctx, AllToAllContext, "all_to_all", lambda: _fields(x), x=x, out=out)
    ctx.check_x(x)
    W = ctx.world_size
    if x.shape[0] % W:
        raise ditron.DitronError(f"all_to_all: x has {x.shape[0]} tokens, not a multiple of the world size {W} "
                                 "(use all_to_all_v for unequal splits)")
    if out is None:
        out = torch.empty_like(x)
    else:
        check_out(ctx, out, x.numel())
    t = x.shape[0] // W
    _launch(ctx, x, out, x, x, t, t * ctx.hidden, True)
    return out


def all_to_all_v(x, splits, ctx, out=None, recv_counts=None):
    """Variable splits known only on the device: ``splits`` (int32/int64
    ``[world_size]``, on x's device) gives the rows of ``x`` for each rank, in
    order.  Returns ``(out, recv_counts)``: ``out`` ``[world_size * max_tokens,
    hidden]`` with the received rows packed in source order, and the int64
    ``[world_size]`` counts received from each rank (see the module docstring)."""
    enter(ctx, AllToAllContext, "all_to_all_v", lambda: _fields(x, rows=False), x=x, out=out, splits=splits,
          recv_counts=recv_counts)
    ctx.check_x(x)
    W = ctx.world_size
    if not isinstance(splits, torch.Tensor) or splits.dtype not in (torch.int32, torch.int64) or \
            splits.numel() != W or splits.device.type != torch.device(ctx.device).type or \
            not splits.is_contiguous():
        desc = f"{splits.dtype}{list(splits.shape)} on {splits.device}" if isinstance(splits, torch.Tensor) else \
            type(splits).__name__
        raise ditron.DitronError(f"all_to_all_v: splits must be a contiguous int32/int64 tensor of {W} counts on "
                                 f"{ctx.device}, got {desc}")
    if out is None:
        out = torch.empty((W * ctx.max_tokens, ctx.hidden), dtype=x.dtype, device=x.device)
    else:
        check_out(ctx, out, W * ctx.max_numel)
    if recv_counts is None:
        recv_counts = torch.empty(W, dtype=torch.int64, device=x.device)
    else:
        check_out(ctx, recv_counts, W, dtype=torch.int64)
    _launch(ctx, x, out, splits, recv_counts, 0, ctx.max_numel, False)
    return out, recv_counts
