"""AllGather-GEMM written in ditron.language: ``C = all_gather(A) @ B``.

    ctx = create_ag_gemm_context(max_m_per_rank, k, torch.bfloat16)   # collective, once
    c = ag_gemm(a, b, ctx)            # a: this rank's [m, K] shard, b: [K, N]; c: [world * m, N]
    c = ag_gemm(a, b, ctx, out=c)

Every rank passes a shard ``a`` of the same shape ``[m, K]`` (any ``m >= 1``,
not necessarily a multiple of the tile) and its own ``b`` (the same on every
rank, or per-rank weights: each rank computes ``all_gather(a) @ b`` with its
``b``).  ``c`` is in ``a``'s dtype (float16 / bfloat16); the GEMM accumulates in
float32.  Rows ``[s * m, (s + 1) * m)`` of ``c`` come from rank ``s``'s shard.

Two kernels per call
--------------------
* **producer** (:func:`ag_gemm_producer_kernel`, ``P = ctx.producer_programs``
  programs): every program takes a contiguous chunk of the shard (``m * K``
  elements), stores it into every node peer's gather buffer with
  ``dl.symm_at`` (SM push), then signals each peer with ``dl.notify``.  Ranks
  on other nodes get the chunk and the signal in one
  ``shmem.putmem_signal_block`` (staged first in the sender's own slot,
  because a remote put reads symmetric memory), as in all_gather.
* **consumer** (:func:`ag_gemm_consumer_kernel`): a Triton GEMM (``tl.dot``,
  ``BLOCK_M/N/K``, masked tails), one program per output tile, in
  ``dl.swizzle_gather`` order (tiles whose rows are local first, then the
  segments in arrival order).  Before loading A, a program waits for every
  signal word of every segment in ``dl.tile_segments`` of its M tile except
  its own (a tile straddling segments waits for all of them); rows of the own
  segment are read straight from ``a`` (no wait, no copy), the others from the
  gather buffer.

Buffers and signals (symmetric, allocated once by the context):

* ``buf[2][world][slot]`` (dtype): ``buf[p][s]`` holds rank ``s``'s shard
  (row-major ``[m, K]``) in parity ``p``; written by rank ``s`` only.
* ``sig[2][world][P]`` (int64): word ``[p][s][g]`` equals ``e + 1`` when chunk
  ``g`` of source ``s`` has arrived in call ``e``.  A consumer waits on the
  ``P`` consecutive words of a segment (one ``dl.wait``; segments ``lo..hi``
  of a tile are consecutive too, so one wait covers the peers below the own
  rank and one those above).

Reuse (kernels/_common.py): the producer and the consumer each have their own
device-side call counter (``ctx.pcalls`` and ``ctx.calls``; both count the
calls, so they agree on the epoch ``e`` even when the kernels run on
different streams).  Signals carry ``e + 1``; buffers and signal words of
parity ``e % 2`` are used.  A rank's consumer finishes call ``e`` only after
every peer's producer of call ``e`` has run, and a producer of call ``e + 1``
starts only after its own rank's consumer of call ``e`` (stream order), so a
producer writes parity ``e % 2`` again (call ``e + 2``) only after every peer
has finished reading it (call ``e``).  No host epoch, no host sync.

Streams: by default both kernels go to the current stream, producer first
(correct everywhere, no overlap of communication with the GEMM).
``create_ag_gemm_context(..., overlap=True)`` on GPUs launches the producer
on a side stream (``torch.cuda.Stream``) that waits for the current stream,
and makes the current stream wait for it after the consumer.
TODO(perf): overlap with a side stream relies on the producer's programs
being scheduled although the consumer's spinning programs may occupy the
SMs; the robust form is a fused persistent kernel (a few producer programs
plus persistent GEMM programs, or copy-engine ``rank_copy`` pushes on a side
stream).  Untested on GPUs so far.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import CollectiveContext, epoch_begin, epoch_end, topology
from .all_gather import _chunk, _put_chunk, _round_up, _sm_count

_SLOT_ALIGN = 128          # elements: every slot starts 256-byte aligned
_GEMM_DTYPES = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------
# producer: push this rank's shard into every peer's gather buffer
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["n", "slot_stride"])
def ag_gemm_producer_kernel(a_ptr, buf_ptr, sig_ptr, calls_ptr, n, slot_stride,
                            MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr, BLOCK: tl.constexpr):
    """``n``: elements of the shard (``m * K``); ``slot_stride``: elements
    between two slots of ``buf``.  Program ``g`` pushes its chunk and sets word
    ``[par][rank][g]`` of every peer's ``sig`` to ``e + 1``."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    me, W, LW, node, NN, local = topology()
    P = tl.num_programs(0)
    ss = slot_stride.to(tl.int64)
    lo, hi = _chunk(n, BLOCK)
    my_slot = buf_ptr + par * (W * ss) + me * ss
    sig_word = sig_ptr + par * (W * P) + me * P + tl.program_id(0)
    node0 = node * LW
    for off in range(lo, hi, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < hi
        v = tl.load(a_ptr + offs, mask=mask)
        if MULTI_NODE:
            tl.store(my_slot + offs, v, mask=mask)        # staged: remote puts read it
        for k in range(1, LW):
            peer = node0 + (local + k) % LW
            tl.store(dl.symm_at(my_slot + offs, peer), v, mask=mask)
    if MULTI_NODE:
        for k in range(1, NN):
            for l in range(0, LW):
                peer = ((node + k) % NN) * LW + (local + l) % LW
                _put_chunk(my_slot, my_slot, lo, hi, sig_word, val, peer, ELEM_BYTES)
    for k in range(1, LW):
        peer = node0 + (local + k) % LW
        dl.notify(sig_word, peer, signal=val, sig_op="set", comm_scope="intra_node")
    epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# consumer: GEMM over the gathered rows, in gather-swizzle order
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["m", "N", "K", "slot_stride", "stride_bk", "stride_bn", "P"])
def ag_gemm_consumer_kernel(a_ptr, b_ptr, c_ptr, buf_ptr, sig_ptr, calls_ptr, m, N, K, slot_stride,
                            stride_bk, stride_bn, P,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr):
    """``c[W*m, N] = gathered_a[W*m, K] @ b[K, N]``; ``a`` (``[m, K]``, row-major)
    is this rank's shard, the others are read from ``buf`` of this call's
    parity once their ``P`` signal words equal ``e + 1``."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    me = dl.rank()
    W = dl.num_ranks()
    NN = dl.num_ranks(1)
    M = W * m
    pid = tl.program_id(0)
    pid_m, pid_n = dl.swizzle_gather(pid, M, N, BLOCK_M, BLOCK_N, me, W, NN, GROUP_M)
    lo, hi = dl.tile_segments(pid_m, M, BLOCK_M, W)
    # wait for the tile's remote segments: [lo, me - 1] and [me + 1, hi]
    sigp = sig_ptr + par * (W * P)
    n_below = tl.maximum(tl.minimum(hi, me - 1) - lo + 1, 0)
    tok1 = dl.wait(sigp + lo * P, n_below * P, "sys", "acquire", waitValue=val)
    s_above = tl.maximum(lo, me + 1)
    n_above = tl.maximum(hi - s_above + 1, 0)
    tok2 = dl.wait(sigp + s_above * P, n_above * P, "sys", "acquire", waitValue=val)
    ss = slot_stride.to(tl.int64)
    bufp = dl.consume_token(dl.consume_token(buf_ptr + par * (W * ss), tok1), tok2)

    K64 = K.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    seg = tl.minimum(rows // m, W - 1)
    rows64 = rows.to(tl.int64)
    seg64 = seg.to(tl.int64)
    in_seg = rows64 - seg64 * m                       # row inside its segment
    a_rows = tl.where(seg == me, a_ptr + in_seg * K64, bufp + seg64 * ss + in_seg * K64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    b_cols = b_ptr + cols.to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_rows[:, None] + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_cols[None, :] + ks.to(tl.int64)[:, None] * stride_bk, mask=k_ok[:, None] & col_ok[None, :],
                    other=0.0)
        acc = tl.dot(a, b, acc)
    c_ptrs = c_ptr + rows64[:, None] * N + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

class AgGemmContext(CollectiveContext):
    """Symmetric gather buffer and signals of ag_gemm (see the module docstring)."""

    op = "ag_gemm"

    def __init__(self, max_m_per_rank, k, dtype, world=None, producer_programs=None, block_m=None, block_n=None,
                 block_k=None, group_m=8, num_warps=None, num_stages=None, overlap=False):
        if dtype not in _GEMM_DTYPES:
            raise ditron.DitronError(f"ag_gemm: dtype {dtype} is not supported (use float16 or bfloat16)")
        if int(max_m_per_rank) < 1 or int(k) < 1:
            raise ditron.DitronError(f"ag_gemm: max_m_per_rank ({max_m_per_rank}) and k ({k}) must be >= 1")
        super().__init__(int(max_m_per_rank) * int(k), dtype, world)
        W = self.world_size
        self.max_m = int(max_m_per_rank)
        self.k = int(k)
        self.multi_node = self.world.nnodes > 1
        self.sim = self.world.backend == "sim"
        self.slot_stride = _round_up(self.max_m * self.k, _SLOT_ALIGN)
        if self.sim:
            self.producer_programs = int(producer_programs or 2)
        else:
            self.producer_programs = int(producer_programs or min(32, _sm_count(self.device)))
        if self.producer_programs < 1:
            raise ditron.DitronError("ag_gemm: producer_programs must be >= 1")
        self.block_m = int(block_m or (16 if self.sim else 128))
        self.block_n = int(block_n or (16 if self.sim else 128))
        self.block_k = int(block_k or (32 if self.sim else 64))
        for name, v in (("block_m", self.block_m), ("block_n", self.block_n), ("block_k", self.block_k)):
            if v < 16 or v & (v - 1):
                raise ditron.DitronError(f"ag_gemm: {name}={v} must be a power of two >= 16 (tl.dot)")
        self.group_m = int(group_m)
        self.num_warps = int(num_warps or (1 if self.sim else 8))
        self.num_stages = int(num_stages or (1 if self.sim else 3))
        self.overlap = bool(overlap) and not self.sim and torch.device(self.device).type == "cuda"
        self._side_stream = None
        self.pcalls = torch.zeros(2, dtype=torch.int64, device=self.device)   # the producer's call counter
        self.buf = self.symm((2, W, self.slot_stride), dtype, "buf")
        self.sig = self.symm((2, W, self.producer_programs), torch.int64, "sig")
        ditron.barrier_all()          # every rank's zeroed signals exist before any peer writes them

    def side_stream(self):
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device=self.device)
        return self._side_stream


def create_ag_gemm_context(max_m_per_rank, k, dtype, world=None, **options):
    """Allocate ag_gemm's gather buffer (``2 * world * max_m_per_rank * k``
    elements, symmetric) and signals.  Collective: every rank calls it with the
    same arguments.  ``options``: ``producer_programs``, ``block_m``,
    ``block_n``, ``block_k``, ``group_m``, ``num_warps``, ``num_stages``,
    ``overlap`` (GPUs: producer on a side stream; see the module docstring)."""
    return AgGemmContext(max_m_per_rank, k, dtype, world, **options)


def _check(ctx, a, b, out):
    E = ditron.DitronError
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise E("ag_gemm: argument 'a' must be a 2-D tensor [m, K] (this rank's shard)")
    m, K = a.shape
    if m < 1:
        raise E("ag_gemm: argument 'a' has no rows (m must be >= 1)")
    if m > ctx.max_m:
        raise E(f"ag_gemm: argument 'a' has {m} rows, more than the context's max_m_per_rank={ctx.max_m}; "
                f"create a larger context")
    if K != ctx.k:
        raise E(f"ag_gemm: argument 'a' has K={K}, the context was created for k={ctx.k}")
    ctx.check_tensor(a, "a")        # dtype, device, layout
    if not isinstance(b, torch.Tensor) or b.dim() != 2:
        raise E("ag_gemm: argument 'b' must be a 2-D tensor [K, N]")
    if b.dtype != a.dtype:
        raise E(f"ag_gemm: argument 'b' is {b.dtype}, 'a' is {a.dtype}")
    if b.device.type != a.device.type or (b.device.index not in (None, a.device.index)
                                          and a.device.index is not None):
        raise E(f"ag_gemm: argument 'b' is on {b.device}, 'a' on {a.device}")
    if b.shape[0] != K:
        raise E(f"ag_gemm: 'b' has {b.shape[0]} rows, 'a' has K={K} columns")
    N = b.shape[1]
    if N < 1:
        raise E("ag_gemm: 'b' has no columns")
    shape = (ctx.world_size * m, N)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise E("ag_gemm: argument 'out' must be a torch.Tensor")
        if out.dtype != a.dtype:
            raise E(f"ag_gemm: argument 'out' is {out.dtype}, expected {a.dtype}")
        if out.device.type != a.device.type:
            raise E(f"ag_gemm: argument 'out' is on {out.device}, 'a' on {a.device}")
        if tuple(out.shape) != shape:
            raise E(f"ag_gemm: argument 'out' has shape {tuple(out.shape)}, expected {shape}")
        if not out.is_contiguous():
            raise E("ag_gemm: argument 'out' must be contiguous")
    return m, K, N


def ag_gemm(a, b, ctx, out=None):
    """``all_gather(a) @ b`` (``[world * m, N]``, ``a``'s dtype).  Every rank
    must call it with the same ``m`` and ``K`` (``N`` and ``b`` may differ per
    rank), in the same order as its other calls on ``ctx``.  Wrong shapes,
    dtypes or devices raise ``DitronError`` before anything is launched."""
    m, K, N = _check(ctx, a, b, out)
    W = ctx.world_size
    if out is None:
        out = torch.empty((W * m, N), dtype=a.dtype, device=a.device)
    P = ctx.producer_programs
    if W > 1:
        n = m * K
        block = 128 if ctx.sim else max(256, min(4096, triton.next_power_of_2(triton.cdiv(n, P))))
        warps = 1 if ctx.sim else 4
        producer = ag_gemm_producer_kernel[(P,)]
        args = (a, ctx.buf, ctx.sig, ctx.pcalls, n, ctx.slot_stride)
        kw = dict(MULTI_NODE=ctx.multi_node, ELEM_BYTES=a.element_size(), BLOCK=block, num_warps=warps)
        if ctx.overlap:
            side = ctx.side_stream()
            cur = torch.cuda.current_stream(a.device)
            side.wait_stream(cur)              # the previous call's consumer (and a's producer) first
            with torch.cuda.stream(side):
                producer(*args, **kw)
            a.record_stream(side)
        else:
            producer(*args, **kw)
    grid = (triton.cdiv(W * m, ctx.block_m) * triton.cdiv(N, ctx.block_n),)
    ag_gemm_consumer_kernel[grid](a, b, out, ctx.buf, ctx.sig, ctx.calls, m, N, K, ctx.slot_stride,
                                  b.stride(0), b.stride(1), P, BLOCK_M=ctx.block_m, BLOCK_N=ctx.block_n,
                                  BLOCK_K=ctx.block_k, GROUP_M=ctx.group_m,
                                  num_warps=ctx.num_warps,
                                  num_stages=ctx.num_stages)
    if W > 1 and ctx.overlap:
        torch.cuda.current_stream(a.device).wait_stream(ctx.side_stream())   # later writes to a wait for it
    return out
