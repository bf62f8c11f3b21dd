"""All-reduce (sum) written in ditron: one-shot, two-shot, NVLink-SHARP
(multimem) one-shot / two-shot and a low-latency (LL) protocol.

    ctx = create_all_reduce_context(max_numel, torch.bfloat16)   # once, collectively
    out = all_reduce(x, ctx)                                      # any number of times, method="auto"

Every method accumulates in fp32 and gives bitwise the same result on every
rank (fixed summation order, or one owner per element).  All state that
changes between calls lives on the device (the context's call counter, see
``kernels/_common.py``), so calls reuse the context without races and can be
captured in a CUDA graph.

Methods (the protocol of each is documented on its kernel):

* ``ll``                -- small messages: data and flag travel in the same 8-byte
  word, pushed into every peer; the receiver polls the data itself.
* ``one_shot``          -- stage, signal, every rank reads every peer's copy.
* ``two_shot``          -- reduce-scatter (push) + all-gather (pull), per-chunk signals.
* ``multimem_one_shot`` -- stage, signal, ``multimem.ld_reduce`` through the multicast address.
* ``multimem_two_shot`` -- ``ld_reduce`` of the own shard + ``multimem.st`` broadcast.
* ``auto``              -- by size and world size (thresholds below; multimem only
  where the world says multicast is available, never on GPUs for now).
"""
from __future__ import annotations

import os

import torch
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem

from ._common import CollectiveContext, enter, epoch_begin, epoch_end, ll_poll, op_fields as _fields, sm_count
from ._common import next_pow2

METHODS = ("auto", "one_shot", "two_shot", "multimem_one_shot", "multimem_two_shot", "ll")
MULTIMEM_METHODS = ("multimem_one_shot", "multimem_two_shot")

# ---------------------------------------------------------------------------
# automatic choice (to be tuned on GPUs; bytes of the message, per rank)
# ---------------------------------------------------------------------------
#: ``auto`` uses ``ll`` up to this size (and within the context's LL buffer).
AUTO_LL_MAX_BYTES = 256 << 10
#: ``auto`` uses ``one_shot`` up to this size for world sizes <= 4; for larger
#: worlds the threshold shrinks as 4 / world_size (one-shot reads world_size copies).
AUTO_ONE_SHOT_MAX_BYTES = 512 << 10
#: ``auto`` picks the multimem variants only when this is True and the world
#: reports multicast; on GPUs multicast stays off in this release.
AUTO_MULTIMEM_ON_GPU = False

# ---------------------------------------------------------------------------
# buffers and tiling
# ---------------------------------------------------------------------------
#: The LL buffer holds messages up to this many bytes (it costs 4 x this x world_size).
LL_MAX_BYTES = 256 << 10
#: Signal words per parity and phase: a call splits its work into at most this many chunks.
MAX_CHUNKS = 1024
#: Largest tile (elements); buffers are padded to it so that unmasked multimem tiles stay inside.
MAX_BLOCK = 8192
#: Shards of the two-shot methods start at multiples of this many elements (aligned vector access).
SHARD_ALIGN = 16
#: GPU tile size in bytes, and LL tile size in 8-byte words.
GPU_BLOCK_BYTES = 16 << 10
GPU_MIN_BLOCK = 256
GPU_LL_BLOCK_WORDS = 1024
GPU_LL_MAX_PROGRAMS = 64
#: Simulator tiles: small, so that the CPU interpreter stays fast and tests cover many tiles and chunks.
SIM_BLOCK = 64
SIM_MAX_PROGRAMS = 4
SIM_LL_BLOCK_WORDS = 32


def _cdiv(a, b):
    return -(-a // b)


def _roundup(a, b):
    return _cdiv(a, b) * b


# ===========================================================================
# kernels
# ===========================================================================
# Only builtins and this module's own @triton.jit functions are used in the
# kernels: Triton's library functions (tl.zeros, tl.max, ...) are not
# interpretable in ditron.sim.pool's workers, which import Triton before
# TRITON_INTERPRET=1 is set.

@ditron.jit
def all_reduce_ll_kernel(x_ptr, out_ptr, ll_ptr, calls_ptr, n, nwords, ntiles, slot,
                         WORLD: tl.constexpr, EPW: tl.constexpr, BW: tl.constexpr):
    """LL: each rank pushes 8-byte packets (low 32 bits: one fp32 or two
    16-bit elements, high 32 bits: the flag ``epoch + 1``) into its slot of
    every peer's LL buffer (parity ``epoch % 2``), then polls its own buffer
    until every packet of every peer carries this call's flag, and sums in
    rank order in fp32.  No separate signal: the flag travels with the data."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    e = epoch_begin(calls_ptr)
    flag = (e + 1).to(tl.int32)
    fl64 = flag.to(tl.int64) << 32
    me = dl.rank()
    box = ll_ptr + (e % 2) * (WORLD * slot)          # this parity: [WORLD source slots][slot words]
    wr = tl.arange(0, BW)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    for t in range(pid, ntiles, nprog):              # send: one (vector) store per peer and tile
        w = t * BW + wr
        mw = w < nwords
        if EPW == 1:
            word = tl.load(x_ptr + w, mask=mw, other=0.0).to(tl.int32, bitcast=True)
        else:
            o2 = w[:, None] * 2 + tl.arange(0, 2)[None, :]
            b2 = tl.load(x_ptr + o2, mask=o2 < n, other=0.0).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            lo2, hi2 = tl.split(b2)
            word = lo2 | (hi2 << 16)
        pkt = fl64 | (word.to(tl.int64) & 0xFFFFFFFF)
        for k in tl.static_range(1, WORLD):
            tl.store(dl.symm_at(box + me * slot + w, (me + k) % WORLD), pkt, mask=mw)
    for t in range(pid, ntiles, nprog):              # receive: poll the packets themselves
        w = t * BW + wr
        mw = w < nwords
        if EPW == 1:
            o = w
            xv = tl.load(x_ptr + o, mask=o < n, other=0.0)
        else:
            o = w[:, None] * 2 + tl.arange(0, 2)[None, :]
            xv = tl.load(x_ptr + o, mask=o < n, other=0.0)
        acc = tl.full(o.shape, 0.0, tl.float32)
        for q in tl.static_range(WORLD):
            if q == me:
                acc += xv.to(tl.float32)
            else:
                p = box + q * slot + w
                pk = tl.reshape(ll_poll(p[:, None], mw[:, None], flag), [BW])
                word = pk.to(tl.int32)
                if EPW == 1:
                    acc += word.to(tl.float32, bitcast=True)
                else:
                    lo = (word & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
                    hi = ((word >> 16) & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
                    acc += tl.join(lo, hi)
        tl.store(out_ptr + o, acc.to(out_ptr.dtype.element_ty), mask=o < n)
    epoch_end(calls_ptr)


@ditron.jit
def all_reduce_one_shot_kernel(x_ptr, out_ptr, buf_ptr, sig_ptr, calls_ptr, n, chunk, nchunks, region,
                               WORLD: tl.constexpr, BLOCK: tl.constexpr, MAXCH: tl.constexpr):
    """One-shot: stage ``x`` in this rank's buffer (parity ``epoch % 2``),
    signal every rank per chunk; then per chunk wait for all ranks and read
    every rank's copy with ``symm_at`` (all loads in flight at once), sum in
    fp32 in rank order."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    e = epoch_begin(calls_ptr)
    flag = (e + 1).to(tl.int32)
    me = dl.rank()
    buf = buf_ptr + (e % 2) * region
    sig = sig_ptr + (e % 2) * (MAXCH * WORLD)
    offs = tl.arange(0, BLOCK)
    for c in range(pid, nchunks, nprog):
        lo = c * chunk
        for i in range(lo, tl.minimum(lo + chunk, n), BLOCK):
            o = i + offs
            m = o < n
            tl.store(buf + o, tl.load(x_ptr + o, mask=m), mask=m)
        for k in tl.static_range(WORLD):                # signal every rank
            dl.notify(sig + c * WORLD + me, (me + k) % WORLD, signal=flag, sig_op="set", comm_scope="intra_node")
    for c in range(pid, nchunks, nprog):
        tok = dl.wait(sig + c * WORLD, WORLD, "sys", "acquire", waitValue=flag)
        src = dl.consume_token(buf, tok)
        lo = c * chunk
        for i in range(lo, tl.minimum(lo + chunk, n), BLOCK):
            o = i + offs
            m = o < n
            acc = tl.full([BLOCK], 0.0, tl.float32)
            for q in tl.static_range(WORLD):
                acc += tl.load(dl.symm_at(src + o, q), mask=m, other=0.0).to(tl.float32)
            tl.store(out_ptr + o, acc.to(out_ptr.dtype.element_ty), mask=m)
    epoch_end(calls_ptr)


@ditron.jit
def all_reduce_two_shot_kernel(x_ptr, out_ptr, buf_ptr, sig_ptr, sig2_ptr, calls_ptr, n, shard, chunk, nchunks,
                               region, WORLD: tl.constexpr, BLOCK: tl.constexpr, MAXCH: tl.constexpr):
    """Two-shot.  Rank ``r`` owns elements ``[r*shard, (r+1)*shard)``.
    Reduce-scatter: every rank pushes its part of shard ``q`` into slot
    ``me`` of rank ``q``'s buffer (parity ``epoch % 2``) and signals ``q`` per
    chunk; the owner waits, sums the slots in rank order in fp32, writes the
    result to ``out`` and into its own slot, and signals every rank.
    All-gather: every rank pulls the reduced chunks of the other shards from
    their owners with ``symm_at``.  No copy of ``x`` into a buffer is made."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    e = epoch_begin(calls_ptr)
    flag = (e + 1).to(tl.int32)
    me = dl.rank()
    buf = buf_ptr + (e % 2) * region                  # [WORLD slots][shard]
    sig = sig_ptr + (e % 2) * (MAXCH * WORLD)
    sig2 = sig2_ptr + (e % 2) * (MAXCH * WORLD)
    offs = tl.arange(0, BLOCK)
    # reduce-scatter, push
    for c in range(pid, nchunks, nprog):
        lo = c * chunk
        hi = tl.minimum(lo + chunk, shard)
        for k in tl.static_range(WORLD):
            q = (me + k) % WORLD
            for i in range(lo, hi, BLOCK):
                o = i + offs
                g = q * shard + o
                m = (o < shard) & (g < n)
                tl.store(dl.symm_at(buf + me * shard + o, q), tl.load(x_ptr + g, mask=m), mask=m)
            dl.notify(sig + c * WORLD + me, q, signal=flag, sig_op="set", comm_scope="intra_node")
    # reduce the own shard
    for c in range(pid, nchunks, nprog):
        tok = dl.wait(sig + c * WORLD, WORLD, "sys", "acquire", waitValue=flag)
        src = dl.consume_token(buf, tok)
        lo = c * chunk
        for i in range(lo, tl.minimum(lo + chunk, shard), BLOCK):
            o = i + offs
            g = me * shard + o
            m = (o < shard) & (g < n)
            acc = tl.full([BLOCK], 0.0, tl.float32)
            for q in tl.static_range(WORLD):
                acc += tl.load(src + q * shard + o, mask=m, other=0.0).to(tl.float32)
            r = acc.to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + g, r, mask=m)
            tl.store(buf + me * shard + o, r, mask=m)
        for k in tl.static_range(WORLD):                # signal every rank
            dl.notify(sig2 + c * WORLD + me, (me + k) % WORLD, signal=flag, sig_op="set", comm_scope="intra_node")
    # all-gather, pull
    for c in range(pid, nchunks, nprog):
        tok = dl.wait(sig2 + c * WORLD, WORLD, "sys", "acquire", waitValue=flag)
        src = dl.consume_token(buf, tok)
        lo = c * chunk
        for k in tl.static_range(1, WORLD):
            q = (me + k) % WORLD
            for i in range(lo, tl.minimum(lo + chunk, shard), BLOCK):
                o = i + offs
                g = q * shard + o
                m = (o < shard) & (g < n)
                tl.store(out_ptr + g, tl.load(dl.symm_at(src + q * shard + o, q), mask=m), mask=m)
    epoch_end(calls_ptr)


@ditron.jit
def all_reduce_multimem_one_shot_kernel(x_ptr, out_ptr, buf_ptr, sig_ptr, calls_ptr, n, chunk, nchunks, region,
                                        WORLD: tl.constexpr, BLOCK: tl.constexpr, MAXCH: tl.constexpr):
    """Multimem one-shot: stage ``x`` (zero-padded to whole tiles) in this
    rank's buffer, signal every rank per chunk, wait for all, then one
    ``multimem.ld_reduce`` per element through the multicast address sums
    every rank's copy (fp32 accumulation in the switch)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    e = epoch_begin(calls_ptr)
    flag = (e + 1).to(tl.int32)
    me = dl.rank()
    buf = buf_ptr + (e % 2) * region
    mc = shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, buf_ptr) + (e % 2) * region
    sig = sig_ptr + (e % 2) * (MAXCH * WORLD)
    offs = tl.arange(0, BLOCK)
    for c in range(pid, nchunks, nprog):
        lo = c * chunk
        for i in range(lo, tl.minimum(lo + chunk, n), BLOCK):
            o = i + offs
            tl.store(buf + o, tl.load(x_ptr + o, mask=o < n, other=0.0))
        for k in tl.static_range(WORLD):                # signal every rank
            dl.notify(sig + c * WORLD + me, (me + k) % WORLD, signal=flag, sig_op="set", comm_scope="intra_node")
    for c in range(pid, nchunks, nprog):
        tok = dl.wait(sig + c * WORLD, WORLD, "sys", "acquire", waitValue=flag)
        lo = c * chunk
        for i in range(lo, tl.minimum(lo + chunk, n), BLOCK):
            o = i + offs
            v = dl.multimem_ld_reduce(dl.consume_token(mc + o, tok), op="sum")
            tl.store(out_ptr + o, v.to(out_ptr.dtype.element_ty), mask=o < n)
    epoch_end(calls_ptr)


@ditron.jit
def all_reduce_multimem_two_shot_kernel(x_ptr, out_ptr, buf_ptr, sig_ptr, sig2_ptr, calls_ptr, n, shard, sstride,
                                        chunk, nchunks, region,
                                        WORLD: tl.constexpr, BLOCK: tl.constexpr, MAXCH: tl.constexpr):
    """Multimem two-shot: stage ``x`` shard by shard (stride ``sstride``, whole
    tiles, zero-padded), signal every rank per chunk; the owner of a shard
    reduces it with ``multimem.ld_reduce`` and writes the sum into every rank's
    copy with one ``multimem.st``, then signals every rank; every rank copies
    the reduced shards from its own buffer to ``out``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    e = epoch_begin(calls_ptr)
    flag = (e + 1).to(tl.int32)
    me = dl.rank()
    buf = buf_ptr + (e % 2) * region                  # [WORLD shards][sstride]
    mc = shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, buf_ptr) + (e % 2) * region + me * sstride
    sig = sig_ptr + (e % 2) * (MAXCH * WORLD)
    sig2 = sig2_ptr + (e % 2) * (MAXCH * WORLD)
    offs = tl.arange(0, BLOCK)
    for c in range(pid, nchunks, nprog):
        lo = c * chunk
        hi = tl.minimum(lo + chunk, shard)
        for q in tl.static_range(WORLD):
            for i in range(lo, hi, BLOCK):
                o = i + offs
                g = q * shard + o
                tl.store(buf + q * sstride + o, tl.load(x_ptr + g, mask=(o < shard) & (g < n), other=0.0))
        for k in tl.static_range(WORLD):                # signal every rank
            dl.notify(sig + c * WORLD + me, (me + k) % WORLD, signal=flag, sig_op="set", comm_scope="intra_node")
    for c in range(pid, nchunks, nprog):
        tok = dl.wait(sig + c * WORLD, WORLD, "sys", "acquire", waitValue=flag)
        lo = c * chunk
        for i in range(lo, tl.minimum(lo + chunk, shard), BLOCK):
            p = dl.consume_token(mc + i + offs, tok)
            dl.multimem_st(p, dl.multimem_ld_reduce(p, op="sum"))
        for k in tl.static_range(WORLD):                # signal every rank
            dl.notify(sig2 + c * WORLD + me, (me + k) % WORLD, signal=flag, sig_op="set", comm_scope="intra_node")
    for c in range(pid, nchunks, nprog):
        tok = dl.wait(sig2 + c * WORLD, WORLD, "sys", "acquire", waitValue=flag)
        src = dl.consume_token(buf, tok)
        lo = c * chunk
        hi = tl.minimum(lo + chunk, shard)
        for q in tl.static_range(WORLD):
            for i in range(lo, hi, BLOCK):
                o = i + offs
                g = q * shard + o
                m = (o < shard) & (g < n)
                tl.store(out_ptr + g, tl.load(src + q * sstride + o, mask=m), mask=m)
    epoch_end(calls_ptr)


# ===========================================================================
# host API
# ===========================================================================

def multicast_available(world=None) -> bool:
    """Whether ``world`` can use NVLink SHARP multicast (``multimem``).

    A transport says so with a ``multicast`` attribute (a bool or a callable);
    none of the GPU transports does in this release (multicast is off on the
    lent machines and is never created), so the answer there is False.  On the
    simulator, which implements multicast on every node, it is True only when
    requested with ``DITRON_SIM_MULTICAST=1``.
    """
    world = world or ditron.current_world()
    cap = getattr(world.transport, "multicast", None)
    if cap is not None:
        return bool(cap() if callable(cap) else cap)
    if world.backend == "sim":
        return os.environ.get("DITRON_SIM_MULTICAST", "") == "1"
    return False


class AllReduceContext(CollectiveContext):
    """Buffers of :func:`all_reduce` for messages up to ``max_numel`` elements
    of ``dtype`` (see :func:`create_all_reduce_context`)."""

    op = "all_reduce"
    creator = "create_all_reduce_context"

    def __init__(self, max_numel, dtype, world=None, multicast=None):
        super().__init__(max_numel, dtype, world)
        w = self.world
        if w.nnodes > 1 or w.local_world_size != w.world_size:
            raise ditron.DitronError(f"all_reduce: the world spans {w.nnodes} nodes; these kernels reach peers "
                                     "by load/store and need every rank on one node")
        W = self.world_size
        self.esize = torch.empty((), dtype=dtype).element_size()
        self.sim = w.backend == "sim"
        self.num_sms = SIM_MAX_PROGRAMS
        if not self.sim and torch.device(self.device).type == "cuda":
            self.num_sms = sm_count(self.device)         # this rank's share when ranks share the GPU
        if multicast is None:
            multicast = multicast_available(w)
        elif multicast and not self.sim and not multicast_available(w):
            raise ditron.DitronError("all_reduce: multicast=True, but this world has no NVLink multicast "
                                     "(it is switched off on these machines)")
        self.multicast = bool(multicast)
        # shard bound for the two-shot methods, and the padded data region of one parity
        smax = _roundup(_cdiv(max(self.max_numel, 1), W), SHARD_ALIGN)
        self.region = W * _roundup(smax, MAX_BLOCK)
        if self.region >= 2 ** 31:
            raise ditron.DitronError(f"all_reduce: max_numel={self.max_numel} is too large (at most 2**31 elements "
                                     "per parity)")
        self.epw = 4 // self.esize                                  # elements per LL word
        self.ll_max_numel = min(self.max_numel, LL_MAX_BYTES // self.esize)
        self.ll_slot = max(1, _cdiv(self.ll_max_numel, self.epw))   # LL words per source rank
        # symmetric state, allocated collectively (same order on every rank)
        self.buf = self.symm((2 * self.region,), dtype, "buf")
        self.sig = self.symm((2 * MAX_CHUNKS * W,), torch.int32, "sig")
        self.sig2 = self.symm((2 * MAX_CHUNKS * W,), torch.int32, "sig2")
        self.ll = self.symm((2 * W * self.ll_slot,), torch.int64, "ll")
        # every rank's copies must be zeroed before any peer writes into them
        # (a peer's first call may start while this rank is still allocating)
        ditron.barrier_all()

    def __repr__(self):
        return (f"AllReduceContext(max_numel={self.max_numel}, dtype={self.dtype}, world_size={self.world_size}, "
                f"multicast={self.multicast})")


def create_all_reduce_context(max_numel, dtype, world=None, multicast=None) -> AllReduceContext:
    """Allocate (collectively: every rank calls it, in the same order as its
    other symmetric allocations) the buffers of :func:`all_reduce` for
    messages of up to ``max_numel`` elements of ``dtype`` (float32, float16,
    bfloat16).  ``multicast``: allow the multimem methods in ``auto`` (default:
    what the world reports, see :func:`multicast_available`)."""
    return AllReduceContext(max_numel, dtype, world, multicast)


def choose_method(ctx: AllReduceContext, numel: int) -> str:
    """What ``method="auto"`` runs for ``numel`` elements."""
    nbytes = numel * ctx.esize
    W = ctx.world_size
    mm = ctx.multicast and (ctx.sim or AUTO_MULTIMEM_ON_GPU)
    if nbytes <= AUTO_LL_MAX_BYTES and numel <= ctx.ll_max_numel:
        return "ll"
    if nbytes <= AUTO_ONE_SHOT_MAX_BYTES * 4 // max(4, W):
        return "multimem_one_shot" if mm else "one_shot"
    return "multimem_two_shot" if mm else "two_shot"


def _tile_plan(ctx, span, block, chunk, programs):
    """(BLOCK, chunk, nchunks, grid, num_warps) for ``span`` elements split in chunks."""
    if block is None:
        if ctx.sim:
            block = min(SIM_BLOCK, max(16, next_pow2(span)))
        else:
            block = min(GPU_BLOCK_BYTES // ctx.esize, max(GPU_MIN_BLOCK, next_pow2(span)))
    if block < 16 or block > MAX_BLOCK or block & (block - 1):
        raise ditron.DitronError(f"all_reduce: block={block} must be a power of two in [16, {MAX_BLOCK}]")
    if chunk is None:
        chunk = max(block, _roundup(_cdiv(span, MAX_CHUNKS), block))
    if chunk % block or chunk <= 0:
        raise ditron.DitronError(f"all_reduce: chunk={chunk} must be a positive multiple of block={block}")
    nchunks = _cdiv(span, chunk)
    if nchunks > MAX_CHUNKS:
        raise ditron.DitronError(f"all_reduce: {nchunks} chunks of {chunk} elements, more than {MAX_CHUNKS}; "
                                 "use a larger chunk")
    grid = min(nchunks, programs or ctx.num_sms)
    num_warps = min(16, max(4, block * ctx.esize // 1024))
    return block, chunk, nchunks, grid, num_warps


def all_reduce(x, ctx: AllReduceContext, out=None, method="auto", *, block=None, chunk=None, programs=None):
    """Sum of ``x`` over all ranks, in ``out`` (default: a new tensor like
    ``x``; ``out`` may be ``x``).  Collective: every rank calls it with the same
    shape, method and tuning arguments.  ``method``: one of :data:`METHODS`.
    ``block`` (tile elements; LL: words), ``chunk`` (elements per signal) and
    ``programs`` (grid bound) are tuning knobs; the defaults follow the size.
    Returns ``out``."""
    enter(ctx, AllReduceContext, "all_reduce", lambda: _fields(x, method) + [("block", block), ("chunk", chunk),
                                                                              ("programs", programs)], x=x, out=out)
    if method not in METHODS:
        raise ditron.DitronError(f"all_reduce: unknown method {method!r}; use one of {', '.join(METHODS)}")
    ctx.check_tensor(x, "x")
    if out is None:
        out = torch.empty_like(x)
    else:
        ctx.check_tensor(out, "out", numel=x.numel())
    n = x.numel()
    if n == 0:
        return out
    key = (n, method, block, chunk, programs)
    kern, grid, tail, consts = ctx.plan(key, _launch_plan, ctx, n, method, block, chunk, programs)
    ctx.launch(key + (x.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0), kern, grid, (x, out) + tail, consts)
    return out


def _launch_plan(ctx, n, method, block, chunk, programs):
    """(kernel, grid, arguments after x and out, keyword arguments) of a call of ``n`` elements: a function of
    the context and the call's sizes and knobs only, made once per such call (AllReduceContext.plan) and
    checked then."""
    W = ctx.world_size
    if method == "auto":
        method = choose_method(ctx, n)
    if method in MULTIMEM_METHODS and not ctx.sim and not ctx.multicast:
        raise ditron.DitronError(f"all_reduce: method={method!r} needs NVLink multicast, which this world does not "
                                 "have (it is off on these machines); use one_shot, two_shot or ll")
    if programs is not None and programs < 1:
        raise ditron.DitronError("all_reduce: programs must be >= 1")
    if method == "ll":
        if n > ctx.ll_max_numel:
            raise ditron.DitronError(f"all_reduce: method='ll' handles at most {ctx.ll_max_numel} elements with this "
                                     f"context (LL_MAX_BYTES={LL_MAX_BYTES}); got {n}")
        nwords = _cdiv(n, ctx.epw)
        # ranks sharing a GPU: no more polling programs than this rank's share of the SMs (kernels/_common.py)
        maxp = programs or (SIM_MAX_PROGRAMS if ctx.sim else min(GPU_LL_MAX_PROGRAMS, ctx.num_sms))
        if block is None:
            bw = min(SIM_LL_BLOCK_WORDS if ctx.sim else GPU_LL_BLOCK_WORDS, next_pow2(nwords))
            bw = max(bw, next_pow2(_cdiv(nwords, maxp)), 16)
        else:
            bw = block
            if bw < 16 or bw & (bw - 1):
                raise ditron.DitronError(f"all_reduce: block={bw} must be a power of two >= 16")
        ntiles = _cdiv(nwords, bw)
        grid = min(ntiles, maxp)
        return (all_reduce_ll_kernel, (grid,), (ctx.ll, ctx.calls, n, nwords, ntiles, ctx.ll_slot),
                dict(WORLD=W, EPW=ctx.epw, BW=bw, num_warps=min(16, max(4, bw * 8 // 1024))))
    if method in ("one_shot", "multimem_one_shot"):
        bl, ch, nch, grid, nw = _tile_plan(ctx, n, block, chunk, programs)
        kern = all_reduce_one_shot_kernel if method == "one_shot" else all_reduce_multimem_one_shot_kernel
        return (kern, (grid,), (ctx.buf, ctx.sig, ctx.calls, n, ch, nch, ctx.region),
                dict(WORLD=W, BLOCK=bl, MAXCH=MAX_CHUNKS, num_warps=nw))
    shard = _roundup(_cdiv(n, W), SHARD_ALIGN)
    bl, ch, nch, grid, nw = _tile_plan(ctx, shard, block, chunk, programs)
    consts = dict(WORLD=W, BLOCK=bl, MAXCH=MAX_CHUNKS, num_warps=nw)
    if method == "two_shot":
        return (all_reduce_two_shot_kernel, (grid,), (ctx.buf, ctx.sig, ctx.sig2, ctx.calls, n, shard, ch, nch,
                                                      ctx.region), consts)
    return (all_reduce_multimem_two_shot_kernel, (grid,), (ctx.buf, ctx.sig, ctx.sig2, ctx.calls, n, shard,
                                                           _roundup(shard, bl), ch, nch, ctx.region), consts)


__all__ = ["METHODS", "AllReduceContext", "create_all_reduce_context", "all_reduce", "choose_method",
           "multicast_available", "AUTO_LL_MAX_BYTES", "AUTO_ONE_SHOT_MAX_BYTES", "LL_MAX_BYTES"]
