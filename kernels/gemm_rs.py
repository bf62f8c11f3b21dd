"""GEMM-ReduceScatter written in ditron.language: the row-parallel layer of
tensor parallelism, ``out = (sum over ranks s of a_s @ b_s)[rank segment]``.

    ctx = create_gemm_rs_context(max_m, n, torch.bfloat16)          # collective, once
    out = gemm_rs(a, b, ctx)            # a: [M, K], b: [K, N]; out: [M // world, N]
    out = gemm_rs(a, b, ctx, out=out)
    ctx = create_gemm_rs_context(max_m, n, torch.bfloat16, method="scatter")

Every rank passes its own ``a`` ``[M, K]`` and ``b`` ``[K, N]`` (any strides;
``M``, ``N`` and ``K`` the same on every rank, ``M`` a multiple of the world
size ``W``, ``N`` the context's ``n``).  Rank ``r`` gets rows
``[r * m, (r + 1) * m)`` (``m = M // W``) of ``sum_s a_s @ b_s`` in ``a``'s
dtype (float16 / bfloat16), like torch's ``fused_matmul_reduce_scatter``:
the GEMM accumulates in fp32, each rank's partial product is rounded once to
the dtype (what travels), the reduction sums the ``W`` partials in fp32.
``m`` need not be a multiple of ``BLOCK_M`` (a tile then straddles two or
more ranks' segments), nor ``N`` and ``K`` of the tile.

Methods (``method=`` of the context; ``"auto"``, the default: ``"ce"`` on one
node, ``"scatter"`` on several):

* ``"ce"`` (copy engine; one node only): the GEMM stores locally at full
  speed, the copy engine moves each finished peer segment, no SM is spent on
  communication (remote SM stores slow the GEMM down on H200);
* ``"scatter"``: the GEMM epilogue stores straight into the owners' buffers;
* ``"pull"``: the GEMM stores locally, the owners' reductions load from it.

Two kernels per call on the current stream (and, ``"ce"``, copies on a side stream)
------------------------------------------------------------------------------------
* **GEMM** (:func:`gemm_rs_gemm_kernel`, ``ctx.num_programs`` persistent
  programs): the tiles of ``a @ b`` in ``dl.swizzle_scatter`` order (tiles of
  the other nodes' segments first, then the node's ring ``rank+1, ...``, the
  own segment last), each computed by kernels/gemm.py's :func:`gemm_tile`
  (or :func:`gemm_tile_tma`).  The epilogue depends on the method:

  - ``"ce"``: the whole tile goes into this rank's own ``cbuf[0]``; the
    program then counts the tile in ``seg_count[s]`` (local, ``atomic_add``
    acq_rel, system scope) for every peer segment ``s`` its rows touch.  The
    program that completes segment ``s`` (its ``(M tiles touching s) *
    num_pid_n``-th tile) resets the count to 0 and sets the local flag
    ``done[s] = 1`` (``atomic_xchg`` release, system scope);
  - ``"scatter"``: the rows of the tile that belong to rank ``o`` go
    straight into ``o``'s slot ``buf[p][rank]`` (``dl.symm_at`` stores; a
    straddling tile stores each part to its owner);
  - ``"pull"``: the whole tile goes into this rank's own ``cbuf[p]``, where
    the owners read it.

  scatter / pull: then the program counts the tile in ``count[pid_m]`` (a
  local counter per M tile, ``atomic_add`` acq_rel).  The program that
  completes an M tile's row (its ``num_pid_n``-th tile) resets the counter
  and signals each owner ``o`` of the row's segments: ``dl.notify`` sets word
  ``sig[p][pid_m][rank]`` on ``o`` to ``e + 1``.  Owners on other nodes
  cannot be reached by stores: the tiles' rows for them are staged in the
  own ``cbuf[p]`` (scatter) or are there already (pull), and the completing
  program sends the owner's rows of the M tile (contiguous: all ``N``
  columns) with ``shmem.putmem_signal_block`` into the owner's
  ``buf[p][rank]``, setting the same signal word.
* **copies** (``"ce"``, :func:`_copy_ce`; on GPUs on the context's side
  stream, which waits for the current stream *before* the GEMM is queued, so
  it starts with the GEMM, not after it): for each peer ``o`` in the order the
  GEMM finishes their segments, ``rank+1, rank+2, ...``:
  ``stream_wait_value(done[o] == 1)``, ``done[o] = 0``,
  ``stream_wait_value(free[o] == 1)`` (``o`` has finished reading this
  rank's previous copy), ``free[o] = 0``, ``rank_copy`` of ``cbuf`` rows
  ``[o*m, (o+1)*m)`` (contiguous, ``m * N`` elements) into ``o``'s
  ``buf[0][rank]``, then ``o``'s ``ready[rank] = 1`` (stream write values:
  ``cuStreamWaitValue64`` / ``cuStreamWriteValue64``, no SM).  After the
  reduction is queued, the current stream waits for the side stream.
* **reduction** (:func:`gemm_rs_reduce_kernel`, one program per
  ``[RBLOCK_M, RBLOCK_N]`` tile of ``out``, or fewer looping over the tiles:
  when ranks share a GPU at most this rank's share of the SMs, since spinning
  reduction programs that fill the GPU would keep a peer's GEMM on the same
  GPU from starting -- :func:`reduce_programs`): waits until its partials are in
  place, then sums the ``W`` partials in fp32 (sources in the order
  ``rank, rank+1, ...``, so the peers do not all read the same rank at once)
  and stores ``out``.  ``"ce"``: waits (two ``dl.wait`` over consecutive
  words) for ``ready[s] == 1`` of every peer ``s``, reads the own partial
  from the local ``cbuf[0]`` and peer ``s``'s from the local ``buf[0][s]``;
  every program ends with kernels/_common.py's ``ce_release``: the last one resets
  ``ready[*]`` to 0, then sets ``free[rank] = 1`` on every peer
  (``dl.notify``, release).  scatter / pull: waits (one ``dl.wait``) until
  the ``W`` words of every M tile its rows touch equal ``e + 1``; a partial
  is read from the local ``buf[p][s]`` (scatter; pull from a rank on
  another node) or with ``dl.symm_at`` loads from source ``s``'s ``cbuf[p]``
  (pull inside the node).

Buffers and signals (symmetric, allocated once by the context; ``p`` =
parity of the call, always 0 with ``"ce"``, ``max_rows = W * (max_m // W)``):

* ``buf[parities][W][slot]`` (dtype; ce, scatter, or several nodes): on owner
  ``o``, ``buf[p][s]`` is source ``s``'s partial of ``o``'s segment,
  row-major ``[m, N]``; written by rank ``s`` only (ce: by its copy engine).
* ``cbuf[parities][max_rows * n]`` (dtype; ce, pull, or several nodes): this
  rank's partial product ``[M, N]``, row-major (ce: the copies' source; pull:
  read by the owners; several nodes: the staging area of the puts, which
  read symmetric memory).
* ``parities``: 1 with ``"ce"`` (flags that are reset), else 2 (epochs).
* ``ce`` flags (int64 ``[W]`` each): ``done[o]`` (local use: segment ``o`` of
  ``cbuf`` is complete in this call), ``ready[s]`` (``s``'s copy has landed
  in ``buf[0][s]``), ``free[o]`` (owner ``o`` has finished reading this
  rank's previous copy; 1 at creation); ``seg_count[W]`` (int32, local):
  finished tiles per segment in the running call (0 between calls).
* ``sig[2][T][W]`` (int64; scatter / pull; ``T``: M tiles of ``max_rows``
  rows for the context's ``config.block_m``, or for the smallest, 16, when
  the config is chosen per call): word ``[p][t][s]`` equals ``e + 1`` once
  source ``s``'s rows of M tile ``t`` for this rank are in place in call
  ``e``.  The words a reduction program needs (M tiles ``t_lo .. t_hi``,
  every source) are consecutive: one ``dl.wait``.
* ``count[T]`` (int32, local; scatter / pull): tiles of each M tile's row
  finished by this rank's GEMM in the running call (0 between calls).

Ordering: a program's tile stores (local or peer), ``syncthreads``, then its
count (``atomic_add`` acq_rel, system scope); the completing program acquired
every earlier count of the row (segment), and its release (``dl.notify``, or
the ``done`` exchange) is cumulative, so an owner that acquires the signal,
or the copy engine that follows the stream wait on ``done``, sees all the
tiles.  ``"ce"``: the copy's ``ready`` write is stream-ordered after the copy
(with a fence), so a reduction that acquires ``ready[s]`` sees the slot.

Reuse with ``"ce"`` (flags that are reset, one buffer; every value is a
constant, so calls can be captured in a CUDA graph).  Each flag has one
setter and one resetter, and each set follows the previous reset:

* ``done[o]`` (on ``r``): set by ``r``'s GEMM, reset by ``r``'s side stream
  right after its wait on it.  The next set is by the GEMM of the next call,
  which the current stream queues after ``wait_stream(side)`` of this call,
  so after the reset; the side stream of the next call starts after this
  call's side stream (same stream) and waits for the next set.
* ``ready[s]`` (on ``o``): set by ``s``'s side stream after its copy, reset by
  ``o``'s reduction's last program (after every program has read the
  slots), which *then* sets ``free[o]`` on ``s`` (release).  ``s``'s next set
  follows its wait for that ``free[o] == 1``, so it follows the reset.
* ``free[o]`` (on ``r``): set by ``o``'s reduction's last program, reset by
  ``r``'s side stream after its wait on it, before the copy.  ``o``'s next set
  is at the end of its next reduction, which waited for ``ready[r]``, set by
  ``r`` after the reset.
* ``buf[0][r]`` on ``o`` is overwritten only after ``free[o]``, i.e. after
  ``o``'s reduction has read it; ``cbuf`` (read by this rank's copies and
  its own reduction) is overwritten by the next GEMM only after
  ``wait_stream(side)`` and the reduction (current stream);
  ``seg_count`` is reset by the completing program in the same call.

A waiter therefore never sees a stale set: a flag is 1 only between its set
and its (single) reset in the same call.  Deadlock freedom: the GEMM never
waits; the side stream waits for its own GEMM (``done``) and for peers'
earlier reductions (``free``); a reduction waits for peers' copies of the
same call, which follow only GEMMs and earlier reductions.  Nothing of the
side stream needs an SM, so spinning reductions cannot starve it.  On the
simulator streams are synchronous: the GEMM runs to completion, then the
copy sequence (its waits block the host), then the reduction.

Reuse with scatter / pull (kernels/_common.py): the GEMM and the reduction
each keep a device-side call counter (``ctx.gcalls`` and ``ctx.calls``; both
count the calls, so they agree on the epoch ``e``); call ``e`` uses parity
``p = e % 2`` and the signal value ``e + 1``.  Every reduction program of
rank ``r`` waits for a signal from every rank ``s``'s GEMM of the same call
(``m >= 1``, so every source contributes to every row of ``r``'s segment),
and each rank runs GEMM ``e``, reduction ``e``, GEMM ``e + 1``, ... in
stream order.  So when rank ``s``'s GEMM of call ``e + 2`` writes parity
``p`` again (into ``r``'s ``buf[p][s]``, into its own ``cbuf[p]``, or
``r``'s word ``sig[p][t][s]``): it runs after ``s``'s reduction ``e + 1``,
which waited for ``r``'s GEMM ``e + 1``, which ran after ``r``'s reduction
``e`` -- the last reader of parity ``p`` on ``r`` (and of ``s``'s
``cbuf[p]`` by ``r``).  A signal word of parity ``p`` is written once per
call of that parity, after its reader of the previous such call has
finished, so a waiter never misses its value.  Signal values are absolute
(``e + 1``) rather than counts, so a call with other ``M`` or ``BLOCK_M``
than the previous ones (other tiles, other owners) needs nothing reset; the
per-row count is the GEMM's own and back to 0 when the row's last tile is
done.  No host epoch, no host sync: the calls can be captured in a CUDA
graph.  Deadlock freedom: the GEMM never waits, and a reduction waits only
for GEMMs of the same call, which follow reductions of earlier calls only.

Streams: scatter / pull run everything on the current stream; the remote
stores (scatter) already overlap the communication with the GEMM, only the
reduction of the received partials follows it.  ``"ce"`` overlaps the
copies of finished segments with the rest of the GEMM.
TODO(perf): an ``overlap`` option that runs the reduction on a side stream
next to the GEMM needs the GEMM's programs to be scheduled even when
spinning reduction programs occupy the SMs: a fused persistent kernel (a
few reduction programs next to the GEMM programs, started last) would be the
robust form.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import (CollectiveContext, enter, op_fields, ce_release, ce_send, epoch_begin, epoch_end, sm_count,
                      take_flag, topology, waiting_programs)
from ._common import cdiv
from .all_gather import _SLOT_ALIGN, _put_chunk, _round_up
from . import scaling
from .gemm import (GemmConfig, _GEMM_DTYPES, check_fp8_config, check_operands, default_config, ensure_tma_allocator,
                   fp8_tma_ok, gemm_tile_at, is_sim_device, operand_descriptors, scale_key, scale_plan, store_tile,
                   tma_ok)

METHODS = ("auto", "ce", "scatter", "pull")
#: the GEMM's core: the tl core (every target, the simulator) or the Gluon Hopper core (kernels/gemm_rs_hopper.py)
CORES = ("tl", "gluon")
_MIN_BLOCK_M = 16            # GemmConfig.validate's smallest BLOCK_M: sizes the signal array


# ---------------------------------------------------------------------------
# GEMM: tiles in scatter order, epilogue stores to the owners, per-row signals
# ---------------------------------------------------------------------------

@triton.jit
def _row_done(pid_m, lo, hi, num_pid_n, m, N, LW, node, my_slot, cbufp, sig_row, count_ptr, val,
              BLOCK_M: tl.constexpr, MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr):
    """Count one finished tile of M tile ``pid_m``; the program finishing the
    row's last tile signals every owner ``lo .. hi`` of its rows (``sig_row``:
    this rank's word of the row, ``sig[p][pid_m][rank]``)."""
    dl.syncthreads()                  # every thread's stores of the tile, before the count releases them
    done = tl.atomic_add(count_ptr + pid_m, 1, sem="acq_rel", scope="sys")
    if done == num_pid_n - 1:
        tl.store(count_ptr + pid_m, 0)        # nobody counts this row again in this call
        for o in range(lo, hi + 1):
            if o // LW == node:
                dl.notify(sig_row, o, signal=val, sig_op="set", comm_scope="intra_node")
            else:
                if MULTI_NODE:
                    # the owner's rows of this M tile, all N columns: contiguous in cbuf and in its slot
                    r0 = tl.maximum(pid_m * BLOCK_M, o * m)
                    r1 = tl.minimum(pid_m * BLOCK_M + BLOCK_M, o * m + m)
                    _put_chunk(my_slot + (r0 - o * m).to(tl.int64) * N, cbufp + r0.to(tl.int64) * N, 0,
                               (r1 - r0).to(tl.int64) * N, sig_row, val, o, ELEM_BYTES)


@triton.jit
def _segments_done(lo, hi, me, m, num_pid_n, seg_count_ptr, done_ptr, BLOCK_M: tl.constexpr):
    """``"ce"``: count one finished tile in every peer segment ``lo .. hi``
    its rows touch; the program completing a segment (its ``(M tiles
    touching it) * num_pid_n``-th tile) resets the count and sets this rank's
    local ``done[s] = 1`` (release, system scope: the copy engine reads the
    segment's rows after a stream wait on the flag)."""
    dl.syncthreads()                  # every thread's stores of the tile, before the count releases them
    for s in range(lo, hi + 1):
        if s != me:                   # the own segment is read by the reduction, later on this stream
            c = tl.atomic_add(seg_count_ptr + s, 1, sem="acq_rel", scope="sys")
            tiles_m = (s * m + m - 1) // BLOCK_M - (s * m) // BLOCK_M + 1
            if c == tiles_m * num_pid_n - 1:
                tl.store(seg_count_ptr + s, 0)            # nobody counts this segment again in this call
                tl.atomic_xchg(done_ptr + s, 1, sem="release", scope="sys")


@ditron.jit(do_not_specialize=["M", "sig_stride"])
def gemm_rs_gemm_kernel(a_ptr, b_ptr, buf_ptr, cbuf_ptr, sig_ptr, count_ptr, seg_count_ptr, done_ptr, calls_ptr,
                        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, slot_stride, cbuf_stride, sig_stride,
                        sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn,
                        PULL: tl.constexpr, CE: tl.constexpr, MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        EVEN_K: tl.constexpr, TMA: tl.constexpr, SCALE: tl.constexpr = 0, GK: tl.constexpr = 1,
                        GN: tl.constexpr = 1, B_T: tl.constexpr = False):
    """This rank's partial ``a @ b`` (``[M, N]``), persistent over the tiles
    in ``dl.swizzle_scatter`` order, delivered to the owners of its rows
    (scatter: their ``buf[p][rank]``; pull: this rank's ``cbuf[p]``) and
    signalled per M tile, or (``CE``) kept in this rank's ``cbuf[0]`` and
    flagged per peer segment in the local ``done`` (see the module
    docstring).  ``slot_stride``: elements between two slots of ``buf``;
    ``cbuf_stride``: between the two parities of ``cbuf``; ``sig_stride``:
    words between the two parities of ``sig``.  fp8 operands: ``SCALE`` and the scale arguments
    (kernels/scaling.py; ``B_T``: b's TMA descriptor is of ``b^T``); the partials are the context's dtype."""
    e = epoch_begin(calls_ptr)
    if CE:
        par = 0                       # one buffer: flags that are reset, not epochs
    else:
        par = e % 2
    val = e + 1
    me, W, LW, node, NN, local = topology()
    m = M // W
    ss = slot_stride.to(tl.int64)
    my_slot = buf_ptr + par * (W * ss) + me * ss              # on every owner: this rank's slot
    cbufp = cbuf_ptr + par * cbuf_stride.to(tl.int64)
    sigp = sig_ptr + par * sig_stride.to(tl.int64) + me       # this rank's word of M tile t: sigp + t * W
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    a_desc, b_desc = operand_descriptors(a_ptr, b_ptr, M, N, K, stride_am, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, TMA,
                                         B_T, stride_bn)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = dl.swizzle_scatter(tile, M, N, BLOCK_M, BLOCK_N, me, W, NN, GROUP_M)
        rows, row_ok, cols, col_ok, acc = gemm_tile_at(a_ptr, b_ptr, a_desc, b_desc, pid_m, pid_n, M, N, K,
                                                       stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N,
                                                       BLOCK_K, EVEN_K, TMA, sa_ptr, sb_ptr, stride_sam, stride_sak,
                                                       stride_sbk, stride_sbn, SCALE, GK, GN, B_T)
        lo, hi = dl.tile_segments(pid_m, M, BLOCK_M, W)          # the owners of the tile's rows
        if PULL or CE:
            store_tile(cbufp, N, 1, rows, row_ok, cols, col_ok, acc)
        else:
            for o in range(lo, hi + 1):
                part = row_ok & (rows >= o * m) & (rows < o * m + m)
                if o // LW == node:
                    store_tile(dl.symm_at(my_slot, o), N, 1, rows - o * m, part, cols, col_ok, acc)
                else:
                    if MULTI_NODE:
                        store_tile(cbufp, N, 1, rows, part, cols, col_ok, acc)     # staged for the put
        if CE:
            _segments_done(lo, hi, me, m, num_pid_n, seg_count_ptr, done_ptr, BLOCK_M)
        else:
            _row_done(pid_m, lo, hi, num_pid_n, m, N, LW, node, my_slot, cbufp, sigp + pid_m * W, count_ptr, val,
                      BLOCK_M, MULTI_NODE, ELEM_BYTES)
    epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# reduction: wait per row block, sum the W partials of this rank's segment
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["M", "sig_stride"])
def gemm_rs_reduce_kernel(out_ptr, buf_ptr, cbuf_ptr, sig_ptr, ready_ptr, free_ptr, calls_ptr, M, N,
                          stride_om, stride_on, slot_stride, cbuf_stride, sig_stride,
                          PULL: tl.constexpr, CE: tl.constexpr, MULTI_NODE: tl.constexpr, WORLD: tl.constexpr,
                          BLOCK_M: tl.constexpr, RBLOCK_M: tl.constexpr, RBLOCK_N: tl.constexpr):
    """``out[m, N]`` = the sum of the ``WORLD`` partials of this rank's
    segment, in ``[RBLOCK_M, RBLOCK_N]`` tiles (row-major tile index ``t``:
    ``(t // cdiv(N, RBLOCK_N), t % ...)``); program ``i`` reduces tiles ``i,
    i + P, ...`` (``P`` programs, at most this rank's share of the SMs when
    ranks share a GPU: see :func:`reduce_programs`), each once the GEMM tiles
    of its rows (``BLOCK_M``: the GEMM's) are signalled, or (``CE``) once
    every peer's copy has landed (``ready[s] == 1``); the ``CE`` reduction
    ends with :func:`kernels._common.ce_release`."""
    me, W, LW, node, NN, local = topology()
    m = M // W
    num_c = tl.cdiv(N, RBLOCK_N)
    ntiles = tl.cdiv(m, RBLOCK_M) * num_c
    seg0 = me * m                                             # first row of this rank's segment in C
    ss = slot_stride.to(tl.int64)
    if CE:
        # every peer's slot: ready words [0, me - 1] and [me + 1, W - 1]
        tok1 = dl.wait(ready_ptr, me, "sys", "acquire", waitValue=1)
        tok2 = dl.wait(ready_ptr + me + 1, W - 1 - me, "sys", "acquire", waitValue=1)
        bufp0 = dl.consume_token(dl.consume_token(buf_ptr, tok1), tok2)
        cbufp0 = cbuf_ptr                                     # the own partial: this stream's GEMM wrote it
    else:
        e = epoch_begin(calls_ptr)
        par = e % 2
        val = e + 1
        bufp0 = buf_ptr + par * (W * ss)
        cbufp0 = cbuf_ptr + par * cbuf_stride.to(tl.int64)
        sigp = sig_ptr + par * sig_stride.to(tl.int64)
    for t in range(tl.program_id(0), ntiles, tl.num_programs(0)):
        pid_r = t // num_c
        pid_c = t % num_c
        r0 = pid_r * RBLOCK_M
        if CE:
            bufp = bufp0
            cbufp = cbufp0
        else:
            t_lo = (seg0 + r0) // BLOCK_M
            t_hi = (seg0 + tl.minimum(r0 + RBLOCK_M, m) - 1) // BLOCK_M
            tok = dl.wait(sigp + t_lo * W, (t_hi - t_lo + 1) * W, "sys", "acquire", waitValue=val)
            bufp = dl.consume_token(bufp0, tok)
            cbufp = dl.consume_token(cbufp0, tok)
        rows = r0 + tl.arange(0, RBLOCK_M)
        cols = pid_c * RBLOCK_N + tl.arange(0, RBLOCK_N)
        mask = (rows < m)[:, None] & (cols < N)[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]             # in a slot (rows of the segment)
        coffs = offs + seg0.to(tl.int64) * N                              # in cbuf (rows of C)
        acc = tl.zeros((RBLOCK_M, RBLOCK_N), dtype=tl.float32)
        for q in tl.static_range(WORLD):             # unrolled: the W loads overlap
            s = (me + q) % WORLD
            if CE:
                if q == 0:
                    v = tl.load(cbufp + coffs, mask=mask)                     # own partial, local
                else:
                    v = tl.load(bufp + s * ss + offs, mask=mask)              # copied here by s
            elif PULL:
                if MULTI_NODE:
                    if s // LW == node:
                        v = tl.load(dl.symm_at(cbufp, s) + coffs, mask=mask)
                    else:
                        v = tl.load(bufp + s * ss + offs, mask=mask)          # put here by s
                else:
                    v = tl.load(dl.symm_at(cbufp, s) + coffs, mask=mask)
            else:
                v = tl.load(bufp + s * ss + offs, mask=mask)
            acc += v.to(tl.float32)
        out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :] * stride_on
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    if CE:
        dl.syncthreads()          # every thread's loads of the slots are done before the slots are freed
        ce_release(calls_ptr, ready_ptr, free_ptr, me, W)
    else:
        epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

class GemmRsContext(CollectiveContext):
    """Symmetric partial-product buffers and signals of gemm_rs (see the
    module docstring)."""

    op = "gemm_rs"
    creator = "create_gemm_rs_context"

    def __init__(self, max_m, n, dtype, world=None, method="auto", config: GemmConfig | None = None,
                 num_programs=None, core="tl", gluon_config=None):
        E = ditron.DitronError
        if core not in CORES:
            raise E(f"gemm_rs: core={core!r}; use one of {', '.join(CORES)}")
        if dtype not in _GEMM_DTYPES + (torch.float32,):
            raise E(f"gemm_rs: dtype {dtype} is not supported (use float16 or bfloat16, or float32 with fp8 "
                    "operands: the partials' and the result's dtype)")
        if method not in METHODS:
            raise E(f"gemm_rs: unknown method {method!r}; use one of {', '.join(METHODS)}")
        super().__init__(int(max_m) * int(n), dtype, world)
        W = self.world_size
        if int(max_m) < W:
            raise E(f"gemm_rs: max_m={max_m} is less than the world size {W} (M must be a multiple of it)")
        if int(n) < 1:
            raise E(f"gemm_rs: n={n} must be >= 1")
        if config is not None and not isinstance(config, GemmConfig):
            raise E(f"gemm_rs: config must be a GemmConfig, not {type(config).__name__}")
        self.multi_node = self.world.nnodes > 1
        if method == "auto":
            method = "scatter" if self.multi_node else "ce"
        if method == "ce" and self.multi_node:
            raise E("gemm_rs: method='ce' (copy engine) reaches this node's ranks only; this world has "
                    f"{self.world.nnodes} nodes: use method='scatter'")
        self.config = config.validate("gemm_rs") if config is not None else None
        self.core = core
        self.gluon_config = self.gluon_fp8_config = None
        self._gluon_descs = {}
        if core == "gluon":
            # the Gluon GEMM (kernels/gemm_rs_hopper.py): the copy-engine protocol; fp16 / bf16 operands, or fp8
            if method != "ce":
                raise E("gemm_rs: core='gluon' runs the copy-engine protocol (one node, method='ce'); this "
                        f"context's method is {method!r}: use core='tl'")
            self.gluon_config, self.gluon_fp8_config = gluon_core_config("gemm_rs", self, dtype, gluon_config)
        elif gluon_config is not None:
            raise E("gemm_rs: gluon_config applies to core='gluon'")
        self.method = method
        self.max_m = int(max_m)
        self.n = int(n)
        self.sim = self.world.backend == "sim" or is_sim_device(self.device)
        self.num_programs = int(num_programs or (4 if self.sim else sm_count(self.device)))
        if self.num_programs < 1:
            raise E(f"gemm_rs: num_programs={num_programs} must be >= 1")
        ce = method == "ce"
        # the copy engine runs beside the GEMM on GPUs (on the simulator, streams are synchronous)
        self.overlap = ce and not self.sim and torch.device(self.device).type == "cuda"
        self._plans = {}
        max_rows = self.max_m // W * W
        max_tiles_m = cdiv(max_rows, self.config.block_m if self.config else _MIN_BLOCK_M)
        self.slot_stride = _round_up(max_rows // W * self.n, _SLOT_ALIGN)
        self.cbuf_stride = _round_up(max_rows * self.n, _SLOT_ALIGN)
        parities = 1 if ce else 2                          # ce: flags that are reset, one buffer
        push = method in ("scatter", "ce") or self.multi_node      # receives partials in buf
        pull = method in ("pull", "ce") or self.multi_node         # keeps its partial in cbuf
        self.buf = self.symm((parities, W, self.slot_stride) if push else (2, 1, _SLOT_ALIGN), dtype, "buf")
        self.cbuf = self.symm((parities, self.cbuf_stride) if pull else (2, _SLOT_ALIGN), dtype, "cbuf")
        self.sig = self.symm((2, 1 if ce else max_tiles_m, W), torch.int64, "sig")
        self.count = torch.zeros(1 if ce else max_tiles_m, dtype=torch.int32, device=self.device)
        self.gcalls = torch.zeros(2, dtype=torch.int64, device=self.device)   # the GEMM's call counter
        # ce flags (see the module docstring): done[o] (local: segment o of cbuf is complete), ready[s]
        # (s's copy has landed here), free[o] (o has finished reading this rank's previous copy; 1 at first)
        self.seg_count = torch.zeros(W, dtype=torch.int32, device=self.device)
        self.done = self.symm((W,), torch.int64, "done")
        self.ready = self.symm((W,), torch.int64, "ready")
        self.free = self.symm((W,), torch.int64, "free")
        self.free.fill_(1)
        ditron.barrier_all()          # every rank's flags exist (and are initialised) before any peer writes them

    def reduce_tile(self):
        """(RBLOCK_M, RBLOCK_N, num_warps) of the reduction kernel."""
        return (16, 64, 1) if self.sim else (32, 128, 4)


def gluon_core_config(op, ctx, dtype, gluon_config):
    """The Hopper configs of a ``core="gluon"`` context (GEMM-RS, GEMM-AR's rs_ag), checked when it is created
    (a ``HopperGemmConfig`` or None; a Hopper GPU or the simulator): ``(config of fp16 / bf16 calls, config of
    fp8 calls)``.  The context's ``dtype`` is the partials' and the result's: fp16 / bf16 operands of that
    dtype, or fp8 operands (a float32 context: fp8 operands only).  Without ``gluon_config``: the core's
    :data:`DEFAULT_CONFIG` for fp16 / bf16 calls, and None for fp8 ones (``fp8_default_config`` per call
    shape).  A given config serves both where it fits; one that fits only fp8 operands (e.g. 128 x 128 x 128
    at 6 stages) is the fp8 calls' (fp16 / bf16 calls then say why it does not fit them); the fp8 limits of a
    config are checked when an fp8 call is planned (:func:`kernels.gemm_hopper.fp8_plan`)."""
    from .gemm_hopper import DEFAULT_CONFIG, HopperGemmConfig
    if dtype not in _GEMM_DTYPES + (torch.float32,):
        raise ditron.DitronError(f"{op}: core='gluon' takes float16 / bfloat16 contexts, or float32 ones for fp8 "
                                 f"operands (not {dtype}): use core='tl'")
    if gluon_config is not None and not isinstance(gluon_config, HopperGemmConfig):
        raise ditron.DitronError(f"{op}: gluon_config must be a ditron.kernels.gemm_hopper.HopperGemmConfig")
    _check_gluon_device(op, ctx)
    out_elem = torch.empty((), dtype=dtype).element_size()
    if gluon_config is None:
        return (DEFAULT_CONFIG if dtype in _GEMM_DTYPES else None), None
    if dtype not in _GEMM_DTYPES:
        return None, gluon_config.validate(op, elem=1, out_elem=out_elem)
    try:
        return gluon_config.validate(op), gluon_config
    except ditron.DitronError as e16:
        try:
            gluon_config.validate(op, elem=1, out_elem=out_elem)
        except ditron.DitronError:
            raise e16 from None
        return None, gluon_config


def check_gluon_16bit(op, ctx):
    """An fp16 / bf16 call of a ``core="gluon"`` context whose ``gluon_config`` fits fp8 operands only: the
    reason, before launch."""
    if ctx.gluon_config is None:
        try:
            ctx.gluon_fp8_config.validate(op)
        except ditron.DitronError as e:
            raise ditron.DitronError(f"{op}: this context's gluon_config fits fp8 operands only: {e}; create the "
                                     "context with a config for both, or one per operand type") from None


def _check_gluon_device(op, ctx):
    """A ``core="gluon"`` context on a GPU that is not a Hopper (sm_90) one, e.g. an AMD GPU: refused when it is
    created (the simulator runs the tl twin, anywhere)."""
    from .gemm_hopper import supported
    if ctx.world.backend == "sim" or is_sim_device(ctx.device) or supported(ctx.device):
        return
    dev = torch.device(ctx.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
    raise ditron.DitronError(f"{op}: core='gluon' runs on Hopper (sm_90) GPUs only, not on {name}: use core='tl'")


def create_gemm_rs_context(max_m, n, dtype, world=None, method="auto", **options):
    """Allocate gemm_rs's symmetric buffers for ``M <= max_m`` (total rows of
    ``a``) and ``N = n``: ce ``2 * max_m * n`` elements of ``dtype`` (one
    copy-target buffer, one partial product), scatter ``2 * max_m * n``,
    pull the same, several nodes twice that; plus the signals.  Collective:
    every rank calls it with the same arguments.  ``method``: ``"auto"``
    (default: ``"ce"`` on one node, ``"scatter"`` on several), ``"ce"``
    (copy engine, one node only), ``"scatter"`` (fused scatter) or
    ``"pull"``.  ``options``: ``config`` (a
    :class:`~ditron.kernels.gemm.GemmConfig`, the same on every rank; default
    :func:`~ditron.kernels.gemm.default_config` per call; its ``flatten`` is
    not used: the tile loop's epilogue signals), ``num_programs``
    (persistent GEMM programs; default one per SM, 4 on the simulator).

    ``core``: the GEMM's core -- ``"tl"`` (default; every target and the
    simulator) or ``"gluon"``, the warp-specialised Hopper core
    (kernels/gemm_rs_hopper.py: ``method="ce"``, one node, sm_90; float16 /
    bfloat16 operands, row-major TMA-aligned ``a`` and ``b``, ``N`` a
    multiple of 8; or fp8 operands with ``b = w.t()``, on the core's fp8
    path -- a float32 context takes fp8 operands only; ``gluon_config`` a
    ``HopperGemmConfig``: :func:`gluon_core_config`); on the simulator a
    ``"gluon"`` context runs the tl GEMM (``config``), its twin (an fp8
    call is checked there as the Gluon GEMM would check it)."""
    return GemmRsContext(max_m, n, dtype, world, method, **options)


def reduce_programs(ctx, M, N):
    """Programs of the reduction kernel for ``M`` rows: one per ``reduce_tile`` of this rank's ``[M // W, N]``
    segment, but no more than this rank's share of the SMs when ranks share the GPU (its programs spin until a
    peer's GEMM has delivered; a reduction filling the GPU would keep that GEMM, on the same GPU, from starting),
    and one on the simulator, so that CI runs the loop over several tiles (m = 24 rows: two tiles) (kernels/_common.py's
    ``waiting_programs``)."""
    rbm, rbn, _ = ctx.reduce_tile()
    tiles = cdiv(M // ctx.world_size, rbm) * cdiv(N, rbn)
    return waiting_programs(tiles, ctx.device, ctx.sim, sim_programs=1)


def _check(ctx, a, b, out):
    E = ditron.DitronError
    fp8 = scaling.is_fp8(a)
    check_operands("gemm_rs", a, b, out_dtype=ctx.dtype if fp8 else None)
    M, K = a.shape
    N = b.shape[1]
    W = ctx.world_size
    if not fp8 and a.dtype != ctx.dtype:
        raise E(f"gemm_rs: argument 'a' is {a.dtype}, the context was created for {ctx.dtype} (fp8 operands "
                "write the context's dtype; fp16 / bf16 operands must be of it)")
    dev = torch.device(ctx.device)
    if a.device.type != dev.type or a.device.index not in (None, dev.index) and dev.index is not None:
        raise E(f"gemm_rs: argument 'a' is on {a.device}, this rank works on {ctx.device}")
    if M % W:
        raise E(f"gemm_rs: argument 'a' has M={M} rows, not a multiple of the world size {W}")
    if M > ctx.max_m:
        raise E(f"gemm_rs: argument 'a' has M={M} rows, more than the context's max_m={ctx.max_m}; "
                f"create a larger context")
    if N != ctx.n:
        raise E(f"gemm_rs: argument 'b' has N={N} columns, the context was created for n={ctx.n}")
    if out is not None:
        check_operands("gemm_rs", a, b, out, (M // W, N), ctx.dtype if fp8 else None)
    return M, K, N


def _ce_plan(ctx, m, N):
    """Per segment size ``m``: for each peer ``o`` in the order the GEMM
    completes their segments (``rank+1, rank+2, ...``) the views the
    copy-engine sequence needs (built once: the host path of a call is a few
    driver calls)."""
    plan = ctx._plans.get(m)
    if plan is None:
        W, me = ctx.world_size, ctx.rank
        n = m * N
        slot = ctx.buf[0, me, :n]                  # this rank's slot, on every owner
        plan = []
        for k in range(1, W):
            o = (me + k) % W
            plan.append((ctx.done[o:o + 1], ctx.free[o:o + 1], ditron.peer_tensor(slot, o),
                         ctx.cbuf[0, o * n:(o + 1) * n], ditron.peer_tensor(ctx.ready[me:me + 1], o)))
        ctx._plans = {m: plan}
    return plan


def _copy_ce(ctx, m, N, stream):
    """The copy-engine sequence of a ``"ce"`` call (see the module
    docstring), queued on ``stream`` (the side stream; ``None``: the current
    one, synchronous on the simulator)."""
    transport = ctx.world.transport
    for done, free, dst, src, ready in _ce_plan(ctx, m, N):
        take_flag(transport, done, stream)             # our GEMM has finished segment o (in cbuf)
        ce_send(transport, free, dst, src, ready, stream)   # rows [o*m, (o+1)*m) of cbuf -> o's buf[0][rank]


def _launch_plan(ctx, a, b, out, M, K, N, aligned, rec, sconsts):
    """((grid, arguments after a and b, keyword arguments) of the GEMM kernel, (grid, arguments after out,
    keyword arguments) of the reduction kernel) for a call of these shapes and strides (made once per such
    call: GemmRsContext.plan)."""
    W = ctx.world_size
    cfg = ctx.config or default_config(M, N, K, a.dtype, a.device, ctx.dtype)
    if rec is not None and not (ctx.core == "gluon" and not ctx.sim):       # (else the Gluon GEMM runs: its plan)
        check_fp8_config("gemm_rs", cfg, rec)
    tma = cfg.tma and aligned
    pull = ctx.method == "pull"
    ce = ctx.method == "ce"
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    sig_stride = ctx.sig.shape[1] * W
    gemm = ((min(tiles, ctx.num_programs),),
            (ctx.buf, ctx.cbuf, ctx.sig, ctx.count, ctx.seg_count, ctx.done, ctx.gcalls, M, N, K, a.stride(0),
             a.stride(1), b.stride(0), b.stride(1), ctx.slot_stride, ctx.cbuf_stride, sig_stride),
            dict(PULL=pull, CE=ce, MULTI_NODE=ctx.multi_node, ELEM_BYTES=ctx.cbuf.element_size(),
                 EVEN_K=(K % cfg.block_k == 0), TMA=tma, B_T=tma and rec is not None, **sconsts,
                 **cfg.launch_options()))
    rbm, rbn, warps = ctx.reduce_tile()
    reduce = ((reduce_programs(ctx, M, N),),
              (ctx.buf, ctx.cbuf, ctx.sig, ctx.ready, ctx.free, ctx.calls, M, N, out.stride(0), out.stride(1),
               ctx.slot_stride, ctx.cbuf_stride, sig_stride),
              dict(PULL=pull, CE=ce, MULTI_NODE=ctx.multi_node, WORLD=W, BLOCK_M=cfg.block_m, RBLOCK_M=rbm,
                   RBLOCK_N=rbn, num_warps=warps))
    return gemm, reduce


def gemm_rs(a, b, ctx, out=None, *, scale_a=None, scale_b=None, scale_block=(128, 128)):
    """This rank's rows of ``sum over ranks of a @ b`` (``[M // world, N]``,
    ``a``'s dtype; see the module docstring).  Every rank must call it with
    the same ``M``, ``K`` and ``N``, in the same order as its other calls on
    ``ctx``.  Wrong shapes, dtypes or devices raise ``DitronError`` before
    anything is launched.

    fp8 operands (kernels/scaling.py): ``scale_a`` / ``scale_b`` (their
    shapes choose the recipe; ``scale_block`` the blockwise groups); each
    rank's partial is rounded once to the context's dtype (bfloat16, float16
    or float32), which is the result's dtype; the reduction sums in fp32."""
    enter(ctx, GemmRsContext, "gemm_rs", lambda: op_fields(a, name="a") + op_fields(b, name="b")[:1], a=a, b=b,
          out=out)
    M, K, N = _check(ctx, a, b, out)
    W = ctx.world_size
    fp8 = scaling.is_fp8(a)
    gluon = ctx.core == "gluon" and not ctx.sim          # on the simulator: the tl GEMM, the Gluon GEMM's twin
    if ctx.core == "gluon" and not fp8:
        check_gluon_16bit("gemm_rs", ctx)
    if gluon and not fp8:
        from . import gemm_rs_hopper
        gemm_rs_hopper.check_applies(ctx, a, b, N)
    if out is None:
        out = torch.empty((M // W, N), dtype=ctx.dtype, device=a.device)
    rec, sargs, sconsts = scale_plan("gemm_rs", a, b, M, K, N, scale_a, scale_b, scale_block)
    aligned = not ctx.sim and (fp8_tma_ok(a, b) if rec is not None else tma_ok(a, b))
    key = (M, K, N, a.dtype, b.dtype, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
           out.stride(1), aligned) + scale_key(rec, scale_a, scale_b)
    ptrs = (a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0)
    gplan = None
    if ctx.core == "gluon" and fp8:
        # the fp8 Gluon GEMM (kernels/gemm_rs_hopper.py), planned once per call shape; its checks run on every
        # device (the simulator, which runs the tl twin, refuses what the GPU would)
        from . import gemm_rs_hopper
        gplan = ctx.plan(("gluon",) + key + ptrs, gemm_rs_hopper.plan_fp8, ctx, a, b, M, K, N, scale_a, scale_b,
                         scale_block)
    (ggrid, gtail, gconsts), (rgrid, rtail, rconsts) = ctx.plan(key, _launch_plan, ctx, a, b, out, M, K, N, aligned,
                                                                rec, sconsts)
    if gconsts["TMA"] or gluon:
        ensure_tma_allocator()
    copies = gconsts["CE"] and W > 1
    side = cur = None
    if copies and ctx.overlap:
        cur = torch.cuda.current_stream(a.device)
        side = ctx.side_stream()
        # recorded BEFORE the GEMM is queued: the side stream follows this rank's previous call (its
        # reduction, so no peer's ready/free word is touched early) but not this call's GEMM, which it
        # runs beside, segment by segment (done flags)
        side.wait_stream(cur)
    key += ptrs
    if gluon and fp8:
        gemm_rs_hopper.launch_fp8(ctx, gplan, a, b, scale_a, scale_b, M, N)
    elif gluon:
        gemm_rs_hopper.launch(ctx, a, b, M, K, N)
    else:
        ctx.launch(("gemm",) + key, gemm_rs_gemm_kernel, ggrid, (a, b) + gtail + sargs, gconsts)
    if copies:
        _copy_ce(ctx, M // W, N, side)
    ctx.launch(("reduce",) + key, gemm_rs_reduce_kernel, rgrid, (out,) + rtail, rconsts)
    if side is not None:
        cur.wait_stream(side)         # the next GEMM overwrites cbuf only after the copies have read it
    return out
