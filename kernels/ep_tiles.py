"""EP's tile constants and launch constexprs (kernels/ep.py): pure functions of a context's sizes and a call's, which
the compile tests (tests/test_ep_compile.py) sweep without a context."""
import types

import torch

from ._common import cdiv, next_pow2


def ep_tiles(mode, world_size, num_experts, hidden, dtype, *, sim=False, sms=132, nnodes=1, max_programs=None):
    """The tile constants of an EP context of these sizes (``EpContext`` takes them as attributes): the kernels'
    constexprs, warps and grids follow from them and the call's sizes (:func:`launch_constexprs`).  ``sms``:
    the SMs a rank may fill (the GPU's; ignored with ``sim``).  A pure function: the compile tests sweep it."""
    W, E, H = int(world_size), int(num_experts), int(hidden)
    El = E // W
    esize = torch.empty((), dtype=dtype).element_size()
    ll = mode != "normal"
    t = types.SimpleNamespace(mode=mode, world_size=W, num_experts=E, hidden=H, local_experts=El, sim=bool(sim),
                              multi_node=int(nnodes) > 1)
    t.wp = max(2, next_pow2(W))
    t.elp = max(2, next_pow2(El + 1))
    # the LL payload: 4-byte words of epw elements, hw of them per row
    t.epw = 4 // esize
    t.hw = (H + t.epw - 1) // t.epw
    # persistent grids; several programs on the simulator too (LL: a polling load lends its turn), so that the
    # work-unit split of every phase is exercised
    t.max_programs = int(max_programs or ((3 if ll else 2) if sim else sms))
    # the combine's reduce tiles: [BR, reduce_cols] elements (LL: [reduce_rows, reduce_cols]), k loads of them
    # in flight per program.  LL at one rank (every pair its own, no packet path compiled: PEERS=False): tiles
    # of 4 x 1024 16-bit elements on 8 warps, 64 KB in flight per program and no spill (ptxas, sm_90a: 165
    # registers; with the packet paths compiled in, it spilled 340 B and 8 x 1024 on 16 warps 3.7 KB)
    ll1 = ll and W == 1
    t.reduce_cols = 16 if sim else (2048 // esize if ll1 else 256)
    t.reduce_rows = 4 if sim or ll1 else 8
    t.combine_warps = 1 if sim else 8
    # the LL dispatch: at most ll_rows pairs per step, own rows copied ll_copy_cols columns at a time (two steps
    # in flight), on dispatch_warps warps.  One rank, H200, 128 tokens (bench/results/h200-2026-11-27): 2 x
    # [8, 512] 16-bit tiles on 4 warps 9.9 us (kernel), [8, 1024] on 8 warps 10.4, [8, 2048] on 8 warps 12.3
    t.ll_rows = 4 if sim else (8 if ll1 else 4)
    t.ll_copy_cols = 32 if sim else (1024 if ll1 else 2048) // esize
    t.dispatch_warps = 1 if sim else 4
    # the LL dispatch with use_fp8: groups of 128 channels quantised per step (a [ll_rows, 128 * groups] tile)
    t.ll_fp8_groups = 1 if sim else 4
    # use_fp8: each token quantised once by ep_fp8_quant_kernel (tiles of fp8_quant_rows tokens x ll_fp8_groups
    # groups), the dispatch then moving its words per pair (True), or each pair's row quantised by the dispatch
    # (False: a token's k pairs quantise it k times; on one H100 the send phase took 14 us against bf16's 8:
    # bench/results/h100-2026-12-07f-fp8/)
    t.ll_fp8_prequant = False
    # use_fp8 without prequant or ll_strided: each token of a block quantised once in the dispatch (a one-row tile of
    # ll_fp8_once_groups groups per step) and stored to the block's pairs of that token (True), or each pair's row
    # quantised (False; at k = 8 a block of 8 consecutive pairs is one token's: 8 times the same arithmetic)
    t.ll_fp8_once = False
    # 16 groups (2048 channels) a step on GPUs: the benchmark's launch (world size 1, 4 warps, H specialised) on
    # Triton 3.6 takes 216 registers, no spills (tests/test_ep.py; bench/diag/ep_fp8_sweep.py has the others)
    t.ll_fp8_once_groups = 2 if sim else 16
    t.ll_fp8_once_prefetch = True       # its next step's row loaded before this step's work (two in flight)
    t.fp8_quant_rows = 4 if sim else 8
    # the LL dispatch's pairs per program: a contiguous share (False) or every P-th pair (True: a copy tile's rows
    # are different tokens; each pair ranked by a direct count)
    t.ll_strided = False
    # the routing: blocks of route_blk pairs, at most route_programs programs (resident: they wait for each
    # other once), their counts in route_hist, their release slots in route_slots (epochs: never reset)
    t.route_ep = next_pow2(E + 1)
    t.route_blk = 4 if sim else max(16, min(512, 8192 // t.route_ep))
    t.route_programs = 4 if sim else max(1, int(sms) // 2)      # half the SMs: resident at ease
    if sim:
        t.tile_blocks = 4, 32
    elif not ll:
        t.tile_blocks = 8, max(64, min(1024, next_pow2(H)))
    else:
        t.tile_blocks = 4, max(32, min(512, next_pow2(t.hw)))
    return t


def route_blocks(ctx, TK):
    """The routing launch of ``TK`` pairs (normal mode): ``(BLK, pairs per program, programs)``.  Blocks no
    larger than needed to give every routing program one (a ``[BLK, EP]`` scan per block: at 128 x 8 pairs one
    block of 512 per program on 2 programs took 5 us on an H200, blocks of 32 spread them over 32)."""
    nprog = ctx.route_programs
    blk = ctx.route_blk if ctx.sim else max(32, min(ctx.route_blk, next_pow2(cdiv(max(TK, 1), nprog))))
    nblk = max(1, cdiv(TK, blk))
    per = blk * cdiv(nblk, min(nblk, nprog))          # pairs per program, whole blocks
    return blk, per, cdiv(max(TK, 1), per)


def ll_dispatch_blocks(ctx, TK):
    """The low-latency dispatch of ``TK`` pairs: ``(pairs per program, BR, BLK)``: program ``q`` ranks and
    sends pairs ``[q * lper, (q + 1) * lper)``, in blocks of ``BR``, after counting the pairs before them
    (blocks of ``BLK``)."""
    lper = cdiv(max(TK, 1), ctx.max_programs)
    if ctx.sim:
        return lper, ctx.ll_rows, 4
    return lper, min(ctx.ll_rows, max(2, next_pow2(lper))), max(32, min(4096, next_pow2(max(TK, 1))))


#: the kernels each mode launches (dispatch, then combine)
KERNELS = {"normal": ("ep_route_kernel", "ep_dispatch_kernel", "ep_combine_kernel"),
           "low_latency": ("ep_ll_dispatch_kernel", "ep_ll_combine_kernel")}


def launch_constexprs(ctx, TK, k, dtype, use_fp8=False, round_scale=False, trace=False):
    """``{kernel name: (constexprs, num_warps)}``: what a dispatch of ``TK`` pairs (``k`` per token) of
    ``dtype`` rows and its combine launch on ``ctx`` (an ``EpContext`` or :func:`ep_tiles`); the launches take
    theirs from :func:`_constexprs`."""
    names = KERNELS[ctx.mode]
    if use_fp8 and getattr(ctx, "ll_fp8_prequant", False):
        names = ("ep_fp8_quant_kernel",) + names
    return {name: _constexprs(ctx, name, TK, k, dtype.itemsize, use_fp8, round_scale, trace) for name in names}


def _plan(ctx, name, TK, k, esize, use_fp8=False, round_scale=False, trace=False):
    """:func:`_constexprs` of a context's call, computed at the first call of these sizes and options and found
    again in O(1) (``ctx.plans``): the eager path's per-call work (issue 51)."""
    key = (name, TK, k, esize, use_fp8, round_scale, trace)
    plan = ctx.plans.get(key)
    if plan is None:
        plan = ctx.plans[key] = _constexprs(ctx, name, TK, k, esize, use_fp8, round_scale, trace)
    return plan


def _constexprs(ctx, name, TK, k, esize, use_fp8=False, round_scale=False, trace=False):
    br, bh = ctx.tile_blocks
    W, TR = ctx.world_size, bool(trace)
    if name == "ep_ll_dispatch_kernel":
        _, ll_br, ll_blk = ll_dispatch_blocks(ctx, TK)
        return dict(MULTI_NODE=ctx.multi_node, PEERS=W > 1, EPW=ctx.epw, WP=ctx.wp, ELP=ctx.elp, EP=ctx.route_ep,
                    BLK=ll_blk, BR=ll_br, BW=bh, CB=ctx.ll_copy_cols, STRIDED=bool(ctx.ll_strided), TRACE=TR,
                    FP8=bool(use_fp8), ROUND=bool(round_scale), BG=ctx.ll_fp8_groups,
                    PRE=bool(use_fp8) and bool(ctx.ll_fp8_prequant),
                    ONCE=bool(use_fp8 and ctx.ll_fp8_once and not ctx.ll_fp8_prequant and not ctx.ll_strided),
                    BGO=ctx.ll_fp8_once_groups, ONCE_PF=bool(ctx.ll_fp8_once_prefetch)), ctx.dispatch_warps
    if name == "ep_fp8_quant_kernel":
        return dict(BR=ctx.fp8_quant_rows, BG=ctx.ll_fp8_groups, ROUND=bool(round_scale)), ctx.dispatch_warps
    if name == "ep_ll_combine_kernel":
        return dict(MULTI_NODE=ctx.multi_node, PEERS=W > 1, EPW=ctx.epw, WP=ctx.wp, ELP=ctx.elp, BR=br, BW=bh,
                    KT=k, RB=ctx.reduce_rows, RW=ctx.reduce_cols // ctx.epw, TRACE=TR), ctx.combine_warps
    if name == "ep_route_kernel":
        return dict(EP=ctx.route_ep, BLK=route_blocks(ctx, TK)[0], QB=4 if ctx.sim else 32, TRACE=TR), \
            1 if ctx.sim else 8
    if name == "ep_dispatch_kernel":
        return dict(MULTI_NODE=ctx.multi_node, ELEM_BYTES=esize, WP=ctx.wp, ELP=ctx.elp, BR=br, BH=bh,
                    TRACE=TR), ctx.dispatch_warps
    assert name == "ep_combine_kernel", name
    return dict(MULTI_NODE=ctx.multi_node, ELEM_BYTES=esize, WP=ctx.wp, ELP=ctx.elp, BR=br, BH=bh, KT=k,
                RH=ctx.reduce_cols, TRACE=TR), 1 if ctx.sim else 4
