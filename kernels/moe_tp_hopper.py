"""MoE-RS's GEMM on the Gluon Hopper core (issue 52 item 2): :func:`ditron.kernels.moe_tp.moe_rs` (and ``moe_ar``,
which is ``moe_rs`` then an all-gather) with ``core="gluon"``.

    rsc = create_moe_rs_context(max_m, hidden, num_experts, topk, torch.bfloat16, core="gluon")   # sm_90 GPUs
    out = moe_rs(h, plan, w2, topk_weights, rsc)

The protocol is the ``tl`` kernel's (kernels/moe_tp.py :func:`moe_rs_gemm_kernel`), unchanged in meaning; only the
GEMM that produces the partials is the warp-specialised core of :mod:`ditron.kernels.moe_hopper` (a TMA producer
warp, two ``wgmma`` consumer warpgroups in the cooperative schedule):

* the same virtual tiles in the same order: ``T_s = cdiv(m * k, BLOCK_M) + E`` M tiles per segment, each mapped to
  (segment, expert, rows) from the plan's device counts (a tile never mixes experts or segments), walked in
  ``dl.swizzle_scatter`` order (peers' segments first, the own last); virtual tiles past a segment's last
  expert's are skipped by the producer and both consumers alike (the ring's slot / phase arithmetic stays
  shared);
* A (``h``, rows grouped by (segment, expert)) through 2-D TMA boxes, ``w2[e]`` through 3-D ``[1, BK, BN]`` boxes
  (the K tail zero-filled per expert);
* where the partials go: each consumer's block (``BLOCK_M / 2`` rows of the tile) is staged in shared memory, read
  back in a row-major layout and stored with ``st.global`` into the segment owner's slot ``rbuf[p][rank]``
  (``dl.symm_at``), rows past the expert's count masked off (they are another expert's);
* the signal: after its stores, the consumer's partition barrier, then one thread counts the block in the local
  ``seg_count[s]`` (``atom.add.acq_rel.sys``); a tile is counted by both consumers, so the count that completes
  segment ``s`` is its ``2 * tiles(s) * cdiv(N, BN)``-th; that thread resets the count and sets the owner's
  signal word to ``e + 1`` (``atom.exch.release.sys`` through ``dl.symm_at``: the ``tl`` kernel's ``dl.notify``
  of ``set``).  The stores are generic-proxy ``st.global``, as the ``tl`` kernel's, so the memory-model argument is
  its own (stores, the barrier, the acq_rel count, a release that is cumulative over the counted blocks);
  segments with no tile are signalled by program 0's consumer 0 (per-thread release stores: no program barrier
  inside a partition);
* who reduces: unchanged -- the owner's :func:`~ditron.kernels.moe_tp.moe_rs_reduce_kernel`.

The call counter (``ctx.gcalls``, parity ``e % 2``, value ``e + 1``) is read at the start and counted at the end
(:func:`ditron.kernels.gemm_rs_hopper._count_call`) as the ``tl`` kernel's ``epoch_begin`` / ``epoch_end``.

Where it applies: one node, float16 / bfloat16, ``config.mode == "coop"``, ``h`` row-major with 16-byte aligned
rows (``I`` a multiple of 8), ``w2`` with a unit last stride and 16-byte aligned strides, a Hopper GPU: the
context's options are checked when it is created, the operands per call (each refusal names ``core='tl'``).  On
the simulator a ``core="gluon"`` context runs the ``tl`` GEMM with the twin config
(``gemm_hopper.twin_config``: the same tiles and K order), after the same checks.
"""
from __future__ import annotations

import torch

import ditron
import ditron.language as dl

from . import gemm_hopper as H
from ditron.runtime.heap import HEAP_ALIGN as _HEAP_ALIGN

from ._common import cdiv, sm_count
from .gemm_rs_hopper import _count_call
from .moe_hopper import _add, _tma_rows_ok
from .gemm_hopper import (_DTYPES, _partition_barrier, gl, gluon, mbarrier, tma_load, warpgroup_mma,
                          warpgroup_mma_wait)

ALT = "core='tl' (create_moe_rs_context(..., core='tl'))"
#: the symmetric heaps' alignment: every peer offset is a multiple of it (so the remote stores stay 16-byte vectors)
HEAP_ALIGN = gl.constexpr(_HEAP_ALIGN)


# ---------------------------------------------------------------------------
# device code
# ---------------------------------------------------------------------------

@gluon.jit
def _seg_tile(pid_m, T_s, counts_ptr, E, rows_per_seg, BM: gl.constexpr, EP: gl.constexpr, WARPS: gl.constexpr):
    """Virtual M tile ``pid_m``'s ``(segment, expert, first row, end row, is a tile, the segment's tiles)``: the
    ``tl`` kernel's ``_virtual_tile`` (``kernels.moe.expert_tile`` over the segment's counts, row ``seg *
    rows_per_seg`` on) and ``_segment_tiles``, on a ``WARPS``-warp layout of at least one lane per thread."""
    seg = pid_m // T_s
    j = pid_m % T_s
    LANES: gl.constexpr = EP if EP > 32 * WARPS else 32 * WARPS
    layout: gl.constexpr = gl.BlockedLayout([LANES // (32 * WARPS)], [32], [WARPS], [0])
    eidx = gl.arange(0, LANES, layout=layout)
    emask = eidx < E
    cnt = gl.maximum(gl.load(counts_ptr + seg * (E + 1) + eidx, mask=emask, other=0).to(gl.int64), 0)
    tiles = (cnt + BM - 1) // BM
    tend = gl.associative_scan(tiles, 0, _add)
    rstart = gl.associative_scan(cnt, 0, _add) - cnt
    e = gl.sum(gl.where((tend <= j) & emask, 1, 0), 0)
    sel = eidx == e
    t0 = gl.sum(gl.where(sel, tend - tiles, 0), 0)
    r0 = gl.sum(gl.where(sel, rstart, 0), 0)
    c = gl.sum(gl.where(sel, cnt, 0), 0)
    base = seg.to(gl.int64) * rows_per_seg
    first = base + r0 + (j - t0) * BM
    end = gl.minimum(base + r0 + c, base + rows_per_seg)
    # every tile of an expert is computed and counted, as the tl kernel's (``ex < E``): the count's threshold
    # is the segment's tiles; a plan's tiles always have rows (rows past the segment are masked off anyway)
    ok = e < E
    return seg, e, first.to(gl.int32), end.to(gl.int32), ok, gl.sum(tiles, 0)


@gluon.jit
def _rs_producer(h_desc, w_desc, a_bufs, b_bufs, ready, empty, counts_ptr, E, rows_per_seg, T_s, me, W,
                 GROUP_M: gl.constexpr, STAGES: gl.constexpr, EP: gl.constexpr):
    """The TMA producer (one warp): each tile with rows, its A rows of ``h`` and ``w2[e]``'s boxes into the ring."""
    BM: gl.constexpr = h_desc.block_type.shape[0]
    BK: gl.constexpr = h_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[2]
    K = h_desc.shape[1]
    N = w_desc.shape[2]
    VM = W * T_s
    num_pid_n = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    nbytes: gl.constexpr = h_desc.block_type.nbytes + w_desc.block_type.nbytes
    count = 0
    for tile in range(gl.program_id(0), VM * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = dl.swizzle_scatter(tile, VM * BM, N, BM, BN, me, W, 1, GROUP_M)
        seg, e, first, end, ok, seg_tiles = _seg_tile(pid_m, T_s, counts_ptr, E, rows_per_seg, BM, EP, 1)
        if ok:
            for ki in range(k_steps):
                s = count % STAGES
                mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)
                bar = ready.index(s)
                mbarrier.expect(bar, nbytes)
                tma_load(h_desc, [first, ki * BK], bar, a_bufs.index(s))
                tma_load(w_desc, [e, ki * BK, pid_n * BN], bar, b_bufs.index(s))
                count += 1


#: the most ranks a core='gluon' MoE-RS context takes (one node): the peers' heap offsets travel as that many scalars
MAX_RANKS = 8


@gluon.jit
def _peer_delta(seg, d0, d1, d2, d3, d4, d5, d6, d7):
    """Rank ``seg``'s symmetric-heap offset in bytes (``d<r>``: resolved by ``dl.symm_at`` before the partitions
    start: its device-library lookup inside a consumer partition made ptxas spill the accumulator and serialise
    the ``wgmma``s, C7512)."""
    d = gl.where(seg == 1, d1, d0)
    d = gl.where(seg == 2, d2, d)
    d = gl.where(seg == 3, d3, d)
    d = gl.where(seg == 4, d4, d)
    d = gl.where(seg == 5, d5, d)
    d = gl.where(seg == 6, d6, d)
    return gl.where(seg == 7, d7, d)


@gluon.jit
def _rs_count(seg, threshold, count_ptr, peer_sig, val):
    """One thread counts the block in ``seg_count[seg]``; the count that reaches ``threshold`` resets it and sets
    the owner's signal word ``peer_sig`` (``dl.symm_at(sig_word, seg)``) to ``val`` with a system-scope release."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    lane = gl.arange(0, 128, layout=layout)
    one = lane == 0
    zero = lane * 0
    c = gl.atomic_add(count_ptr + seg + zero, zero + 1, mask=one, sem="acq_rel", scope="sys")
    last = one & (c.to(gl.int64) == threshold - 1)
    gl.store(count_ptr + seg + zero, zero, mask=last)        # nobody counts this segment again in this call
    gl.atomic_xchg(peer_sig + zero, (zero + val).to(gl.int64), mask=last, sem="release", scope="sys")


@gluon.jit
def _rs_consumer(h_desc, w_desc, a_bufs, b_bufs, ready, empty, rbuf_ptr, sig_ptr, count_ptr, counts_ptr, E,
                 rows_per_seg, T_s, slot_rows, par, val, me, W, d0, d1, d2, d3, d4, d5, d6, d7, n8,
                 GROUP_M: gl.constexpr, STAGES: gl.constexpr, CID: gl.constexpr, EP: gl.constexpr,
                 C_LAYOUT: gl.constexpr):
    """One consumer warpgroup of the cooperative schedule (rows ``[CID * BM/2, (CID + 1) * BM/2)`` of each tile):
    the core's mainloop, then the partials into the owner's slot and the count (see the module docstring)."""
    BM: gl.constexpr = h_desc.block_type.shape[0]
    BK: gl.constexpr = h_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[2]
    SUB_M: gl.constexpr = BM // 2
    dtype: gl.constexpr = h_desc.dtype
    ELEM: gl.constexpr = dtype.primitive_bitwidth // 8
    K = h_desc.shape[1]
    N = n8 * 8                                  # w_desc.shape[2], a multiple of 8 the compiler can see (16-byte stores)
    VM = W * T_s
    num_pid_n = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    c_smem = gl.allocate_shared_memory(dtype, [SUB_M, BN], C_LAYOUT)
    row0: gl.constexpr = CID * SUB_M
    slot = slot_rows.to(gl.int64) * N
    my_slot = rbuf_ptr + (par * W + me) * slot
    sig_word = sig_ptr + par * W + me
    count = 0
    for tile in range(gl.program_id(0), VM * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = dl.swizzle_scatter(tile, VM * BM, N, BM, BN, me, W, 1, GROUP_M)
        seg, e, first, end, ok, seg_tiles = _seg_tile(pid_m, T_s, counts_ptr, E, rows_per_seg, BM, EP, 4)
        if ok:
            acc = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout)
            for ki in range(k_steps):
                s = count % STAGES
                mbarrier.wait(ready.index(s), (count // STAGES) & 1)
                a = a_bufs.index(s).slice(row0, SUB_M, dim=0)
                b = b_bufs.index(s).reshape([BK, BN])
                acc = warpgroup_mma(a, b, acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc, ))
                mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=ki > 0)
                count += 1
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
            # the block's rows below the expert's end, into the owner's slot (local row: row - seg * rows_per_seg):
            # one scalar base pointer, int32 offsets inside the block (per-element int64 row arithmetic on the
            # segment made ptxas spill and serialise the wgmmas, C7512)
            c_smem.store(acc.to(dtype))
            _partition_barrier()                    # every thread's part of the block is staged
            r0 = first + row0
            delta = _peer_delta(seg, d0, d1, d2, d3, d4, d5, d6, d7)
            base = my_slot + ((delta // HEAP_ALIGN) * (HEAP_ALIGN // ELEM) + (r0 - seg * rows_per_seg).to(gl.int64) * N
                              + pid_n * BN)
            ci = gl.arange(0, BN, layout=gl.SliceLayout(0, out_layout))
            c_ok = gl.expand_dims(ci < N - pid_n * BN, 0)
            for r in gl.static_range(0, SUB_M, 16):         # 16 rows at a time: few live addresses
                x = c_smem.slice(r, 16, dim=0).load(out_layout)
                ri = r + gl.arange(0, 16, layout=gl.SliceLayout(1, out_layout))
                mask = gl.expand_dims(ri < end - r0, 1) & c_ok
                gl.store(base + (gl.expand_dims(ri * N, 1) + gl.expand_dims(ci, 0)), x, mask=mask)
            _partition_barrier()                    # every thread's stores (and reads of c_smem) before the count
            _rs_count(seg, 2 * seg_tiles * num_pid_n, count_ptr, sig_word + delta // 8, val)
    if CID == 0:
        if gl.program_id(0) == 0:
            # segments without a tile (every pair dropped) are complete at once
            for s in range(0, W):
                _, _, _, _, _, st = _seg_tile(s * T_s, T_s, counts_ptr, E, rows_per_seg, BM, EP, 4)
                if st == 0:
                    dl.st(sig_word + _peer_delta(s, d0, d1, d2, d3, d4, d5, d6, d7) // 8, val, "sys", "release")


@ditron.gluon.jit(do_not_specialize=["rows_per_seg", "T_s", "slot_rows", "n8"])
def moe_rs_ws_kernel(h_desc, w_desc, rbuf_ptr, sig_ptr, count_ptr, counts_ptr, calls_ptr, rows_per_seg, E, T_s,
                     slot_rows, n8, GROUP_M: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                     PRODUCER_REGS: gl.constexpr, EP: gl.constexpr, C_LAYOUT: gl.constexpr):
    """This rank's partial ``h @ w2[e]`` per pair row into the owners' ``rbuf[p][rank]`` (the module docstring):
    ``h_desc`` of ``h [W * m * k, I]``, ``w_desc`` of ``w2 [E, I, H]`` (3-D boxes); ``num_warps=4`` (the default
    partition is consumer 0; workers: consumer 1, the producer); ``n8``: ``H / 8``."""
    e = gl.load(calls_ptr)
    par = e % 2
    val = e + 1
    me = dl.rank()
    W = dl.num_ranks()
    # the peers' heap offsets (bytes), resolved here rather than in the consumer partitions (see _peer_delta);
    # ranks past the world's repeat the last one (never selected)
    at = sig_ptr.to(gl.int64)
    d0 = dl.symm_at(sig_ptr, 0).to(gl.int64) - at
    d1 = dl.symm_at(sig_ptr, gl.minimum(1, W - 1)).to(gl.int64) - at
    d2 = dl.symm_at(sig_ptr, gl.minimum(2, W - 1)).to(gl.int64) - at
    d3 = dl.symm_at(sig_ptr, gl.minimum(3, W - 1)).to(gl.int64) - at
    d4 = dl.symm_at(sig_ptr, gl.minimum(4, W - 1)).to(gl.int64) - at
    d5 = dl.symm_at(sig_ptr, gl.minimum(5, W - 1)).to(gl.int64) - at
    d6 = dl.symm_at(sig_ptr, gl.minimum(6, W - 1)).to(gl.int64) - at
    d7 = dl.symm_at(sig_ptr, gl.minimum(7, W - 1)).to(gl.int64) - at
    dtype: gl.constexpr = h_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + h_desc.block_type.shape, h_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    gl.warp_specialize([
        (_rs_consumer, (h_desc, w_desc, a_bufs, b_bufs, ready, empty, rbuf_ptr, sig_ptr, count_ptr, counts_ptr, E,
                        rows_per_seg, T_s, slot_rows, par, val, me, W, d0, d1, d2, d3, d4, d5, d6, d7, n8,
                        GROUP_M, STAGES, 0, EP, C_LAYOUT)),
        (_rs_consumer, (h_desc, w_desc, a_bufs, b_bufs, ready, empty, rbuf_ptr, sig_ptr, count_ptr, counts_ptr, E,
                        rows_per_seg, T_s, slot_rows, par, val, me, W, d0, d1, d2, d3, d4, d5, d6, d7, n8,
                        GROUP_M, STAGES, 1, EP, C_LAYOUT)),
        (_rs_producer, (h_desc, w_desc, a_bufs, b_bufs, ready, empty, counts_ptr, E, rows_per_seg, T_s, me, W,
                        GROUP_M, STAGES, EP)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    _count_call(calls_ptr)


# ---------------------------------------------------------------------------
# host
# ---------------------------------------------------------------------------

def check_context(op, ctx, gluon_config):
    """A ``core="gluon"`` context's options, when it is created: ``(HopperGemmConfig, its tl twin config)``."""
    E_ = ditron.DitronError
    if gluon_config is not None and not isinstance(gluon_config, H.HopperGemmConfig):
        raise E_(f"{op}: gluon_config must be a ditron.kernels.gemm_hopper.HopperGemmConfig")
    cfg = (gluon_config or H.DEFAULT_CONFIG).validate(op)
    if cfg.mode != "coop":
        raise E_(f"{op}: core='gluon' runs the cooperative schedule (mode='coop'; virtual tiles past a segment's "
                 "experts are skipped, which the ping-pong turns do not allow), not "
                 f"mode={cfg.mode!r}; use mode='coop' or {ALT}")
    if cfg.epilogue_split != 1:
        raise E_(f"{op}: core='gluon' stores the partials from one staging buffer (epilogue_split=1), not "
                 f"epilogue_split={cfg.epilogue_split}")
    if ctx.multi_node:
        raise E_(f"{op}: core='gluon' runs on one node (the partials go straight into the owners' slots); this "
                 f"world has {ctx.world.nnodes} nodes: use {ALT}")
    dev = torch.device(ctx.device)
    if not ctx.sim and (dev.type != "cuda" or not H.supported(dev)):
        raise E_(f"{op}: core='gluon' runs on Hopper (sm_90) GPUs only, not on {dev}: use {ALT}")
    return cfg, H.twin_config(cfg).validate(op)


def check_call(op, h, w2):
    """The operands of a ``core="gluon"`` call, on every device (the simulator refuses what the GPU would)."""
    if w2.shape[2] % 8:
        raise ditron.DitronError(f"{op}: core='gluon' needs w2's columns (hidden) a multiple of 8, not {w2.shape[2]}: "
                                 f"use {ALT}")
    for name, t in (("h", h), ("w2", w2)):
        if not _tma_rows_ok(t):
            raise ditron.DitronError(f"{op}: core='gluon' reads '{name}' through TMA: it needs a unit last stride and "
                                     f"16-byte aligned base and strides (got strides {tuple(t.stride())} of "
                                     f"{t.dtype}); make it .contiguous() with a multiple of 8 columns, or use {ALT}")


def _layouts(cfg, dtype):
    g = _DTYPES[dtype]
    return (gl.NVMMASharedLayout.get_default_for([cfg.block_m, cfg.block_k], g),
            gl.NVMMASharedLayout.get_default_for([1, cfg.block_k, cfg.block_n], g),
            gl.NVMMASharedLayout.get_default_for([cfg.block_m // 2, cfg.block_n], g))


def constexprs(cfg, E):
    from .moe import expert_pow2
    return dict(GROUP_M=cfg.group_m, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
                PRODUCER_REGS=cfg.producer_regs, EP=expert_pow2(E), C_LAYOUT=_layouts(cfg, torch.bfloat16)[2])


def launch(ctx, h, w2, plan, T_s):
    """Launch the Gluon GEMM of a ``moe_rs`` call (descriptors of ``h`` and ``w2`` per call)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    cfg = ctx.gluon_config
    la, lw, lc = _layouts(cfg, h.dtype)
    h_desc = TensorDescriptor.from_tensor(h, [cfg.block_m, cfg.block_k], la)
    w_desc = TensorDescriptor.from_tensor(w2, [1, cfg.block_k, cfg.block_n], lw)
    E, _, N = w2.shape
    tiles = ctx.world_size * T_s * cdiv(N, cfg.block_n)
    P = max(1, min(int(ctx.num_programs or sm_count(h.device)), tiles))
    consts = constexprs(cfg, E)
    consts["C_LAYOUT"] = lc
    moe_rs_ws_kernel[(P,)](h_desc, w_desc, ctx.rbuf, ctx.sig, ctx.seg_count, plan.counts, ctx.gcalls,
                           plan.m * plan.k, E, T_s, ctx.slot_rows, N // 8, num_warps=4, **consts)


def compile_sm90(cfg: H.HopperGemmConfig | None = None, dtype=torch.bfloat16, rows=1024, I=1024, hidden=1024, E=8):
    """Compile :func:`moe_rs_ws_kernel` for sm_90a without a GPU (``ditron.compile``; descriptor types from
    descriptors on CPU tensors of these shapes)."""
    from ditron import _compat
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    cfg = (cfg or H.DEFAULT_CONFIG).validate("moe_rs")
    la, lw, lc = _layouts(cfg, dtype)
    h_desc = TensorDescriptor.from_tensor(torch.empty((rows, I), dtype=dtype), [cfg.block_m, cfg.block_k], la)
    w_desc = TensorDescriptor.from_tensor(torch.empty((E, I, hidden), dtype=dtype), [1, cfg.block_k, cfg.block_n],
                                          lw)
    ptr = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    sig = {"h_desc": _compat.mangle_arg(h_desc), "w_desc": _compat.mangle_arg(w_desc), "rbuf_ptr": ptr,
           "sig_ptr": "*i64", "count_ptr": "*i32", "counts_ptr": "*i64", "calls_ptr": "*i64", "rows_per_seg": "i32",
           "E": "i32", "T_s": "i32", "slot_rows": "i32", "n8": "i32"}
    consts = constexprs(cfg, E)
    consts["C_LAYOUT"] = lc
    return ditron.compile(moe_rs_ws_kernel, target="sm_90a", signature=sig, constexprs=consts, num_warps=4)


__all__ = ["moe_rs_ws_kernel", "check_context", "check_call", "launch", "compile_sm90"]
