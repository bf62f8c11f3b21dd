"""Device code of EP's low-latency (LL) mode (kernels/ep.py has the
protocol, the layouts and the host API): the dispatch kernel with its
routing, and the combine kernel; data and flag travel in one 8-byte word."""
from __future__ import annotations

import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem

from ._common import epoch_begin, epoch_end, ll_poll, topology
from .all_to_all import _add, _pick, _sum_below
from .ep_kernels import _copy_rows_x2, _route_count, _route_rank, _stamp


# ---------------------------------------------------------------------------
# LL packets
# ---------------------------------------------------------------------------

@triton.jit
def _pack(x_ptr, rows, ok, w, HW, H, flag64, EPW: tl.constexpr):
    """LL packets ``[BR, BW]`` of words ``w`` of rows ``rows`` of ``x``."""
    m = ok[:, None] & (w[None, :] < HW)
    if EPW == 1:
        word = tl.load(x_ptr + rows[:, None] * H + w[None, :], mask=m, other=0.0).to(tl.int32, bitcast=True)
    else:
        c = w[None, :] * 2
        lo = tl.load(x_ptr + rows[:, None] * H + c, mask=m & (c < H), other=0.0)
        hi = tl.load(x_ptr + rows[:, None] * H + c + 1, mask=m & (c + 1 < H), other=0.0)
        lo = lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        hi = hi.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        word = lo | (hi << 16)
    return flag64 | (word.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _unpack_store(pk, out_ptr, rows, ok, w, HW, H, EPW: tl.constexpr, DT: tl.constexpr):
    m = ok[:, None] & (w[None, :] < HW)
    word = pk.to(tl.int32)
    if EPW == 1:
        tl.store(out_ptr + rows[:, None] * H + w[None, :], word.to(tl.float32, bitcast=True).to(DT), mask=m)
    else:
        c = w[None, :] * 2
        lo = (word & 0xFFFF).to(tl.int16).to(DT, bitcast=True)
        hi = ((word >> 16) & 0xFFFF).to(tl.int16).to(DT, bitcast=True)
        tl.store(out_ptr + rows[:, None] * H + c, lo, mask=m & (c < H))
        tl.store(out_ptr + rows[:, None] * H + c + 1, hi, mask=m & (c + 1 < H))


@triton.jit
def _send_packets(x_ptr, t, ok, anyp, WN, XS, fl64, dst, rbox, drow, rowsz, node0, local, LW, lstage_ptr, par, TK, r,
                  ww, XE: tl.constexpr, MULTI_NODE: tl.constexpr):
    """The LL dispatch's peer rows as packets: ``WN`` words of rows ``t`` of ``x`` (``XS`` elements apart, ``XE``
    elements per word: :func:`_pack`) to the owner of each pair (``ok``, ``dst``) at row ``drow`` of its ``rbox``,
    and (``MULTI_NODE``) to this rank's staging for the inter-node puts; no word at all when ``anyp`` is False
    (every pair of the block is this rank's own or not sent)."""
    for w0 in range(0, tl.where(anyp, WN, 0), ww.shape[0]):
        w = w0 + ww
        pkt = _pack(x_ptr, t, ok, w, WN, XS, fl64, XE)
        for k in range(1, LW):                   # k = 0: this rank, copied by the caller
            peer = node0 + (local + k) % LW
            m = (ok & (dst == peer))[:, None] & (w[None, :] < WN)
            tl.store(dl.symm_at(rbox + drow[:, None] * rowsz + w[None, :], peer), pkt, mask=m)
        if MULTI_NODE:
            tl.store(lstage_ptr + (par * TK + r.to(tl.int64))[:, None] * rowsz + w[None, :], pkt,
                     mask=ok[:, None] & (w[None, :] < WN))


@triton.jit
def _fp8_quant(x_ptr, rows, ok, g0, H, G, BG: tl.constexpr, ROUND: tl.constexpr):
    """Groups ``[g0, g0 + BG)`` of 128 channels of rows ``rows`` of ``x``
    (``[BR]``, loaded where ``ok``) quantised to e4m3 as DeepEP's
    ``use_fp8=True``: ``amax = max(|x|, 1e-4)`` per group, ``scale = 448 /
    amax`` (round to nearest: ``div_rn``), codes ``cvt.rn.satfinite(x *
    scale)``, stored scale ``amax * (1 / 448)``; ``ROUND``: both scales powers
    of two (``2 ** ceil(log2(amax / 448))``, DeepEP's ``round_scale``).
    Returns ``(words, sinv)``: ``[BR, 32 * BG]`` int32 words of 4 codes
    (channel ``4 w + i`` in byte ``i``) and the ``[BR, BG]`` fp32 scales."""
    return _fp8_codes(_fp8_load(x_ptr, rows, ok, g0, H, G, BG), BG, ROUND)


@triton.jit
def _fp8_load(x_ptr, rows, ok, g0, H, G, BG: tl.constexpr):
    """The ``[BR, 128 * BG]`` elements of :func:`_fp8_quant` (zero where not ``ok`` or past the ``G`` groups), in
    ``x``'s dtype."""
    cols = g0 * 128 + tl.arange(0, BG * 128)
    m = ok[:, None] & (cols[None, :] < G * 128)
    return tl.load(x_ptr + rows[:, None].to(tl.int64) * H + cols[None, :], mask=m, other=0.0)


@triton.jit
def _fp8_codes(v, BG: tl.constexpr, ROUND: tl.constexpr):
    """:func:`_fp8_quant` of the loaded elements ``v`` (:func:`_fp8_load`)."""
    BR: tl.constexpr = v.shape[0]
    v3 = tl.reshape(v.to(tl.float32), (BR, BG, 128))
    amax = tl.maximum(tl.max(tl.abs(v3), 2), 1e-4)
    if ROUND:
        bits = (amax * 0.002232142857142857).to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)      # biased exponent of the ceiling
        sinv = (e << 23).to(tl.float32, bitcast=True)
        scale = ((254 - e) << 23).to(tl.float32, bitcast=True)
    else:
        sinv = amax * 0.002232142857142857
        scale = tl.math.div_rn(tl.full(amax.shape, 448.0, tl.float32), amax)
    q = (v3 * scale[:, :, None]).to(tl.float8e4nv).to(tl.int8, bitcast=True).to(tl.int32) & 0xFF
    # channel 4 w + 2 a + b in byte 2 a + b of word w: two splits of the trailing (2, 2), no reduction (a sum of
    # the shifted bytes over a trailing axis of 4 lost byte 3 of every other word on an H100, Triton 3.6:
    # bench/results/h100-2026-12-07f-fp8/; the simulator packed it right)
    lo, hi = tl.split(tl.reshape(q, (BR, BG * 32, 2, 2)))          # channels 4 w + 2 a (b = 0) / + 1 (b = 1)
    b0, b2 = tl.split(lo)
    b1, b3 = tl.split(hi)
    words = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)
    return words, sinv


@triton.jit
def _store_fp8_own(out_ptr, scale_ptr, words, sinv, g0, orow, sbase, scol, NR, DW, G, m):
    """Step ``g0`` of the fp8 rows ``m`` that are this rank's own pairs: ``words`` (``[BR, 32 * BG]``) into
    ``recv_x`` row ``orow``, the scales ``sinv`` (``[BR, BG]``) at ``(sbase + group) * NR + scol`` (column-major, as
    DeepEP's)."""
    BG: tl.constexpr = sinv.shape[1]
    wi = g0 * 32 + tl.arange(0, BG * 32)
    gi = g0 + tl.arange(0, BG)
    tl.store(out_ptr + orow[:, None] * DW + wi[None, :], words, mask=m[:, None] & (wi < DW)[None, :])
    tl.store(scale_ptr + (sbase[:, None] + gi[None, :]) * NR + scol[:, None], sinv, mask=m[:, None] & (gi < G)[None, :])


@triton.jit
def _send_fp8_packets(words, sinv, g0, m, dst, rbox, drow, rowsz, fl64, node0, local, LW, lstage_ptr, par, TK, r, DW,
                      G, MULTI_NODE: tl.constexpr):
    """Step ``g0`` of the fp8 rows ``m`` that are peers' pairs, as LL packets (codes, then scales) into row ``drow``
    of the owner's ``rbox``, and (``MULTI_NODE``) into this rank's staging, every peer pair (the puts: the caller)."""
    BG: tl.constexpr = sinv.shape[1]
    wi = g0 * 32 + tl.arange(0, BG * 32)
    gi = g0 + tl.arange(0, BG)
    wm = (wi < DW)[None, :]
    gm = (gi < G)[None, :]
    pw = fl64 | (words.to(tl.int64) & 0xFFFFFFFF)
    ps = fl64 | (sinv.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)
    for k in range(1, LW):
        peer = node0 + (local + k) % LW
        okp = m & (dst == peer)
        tl.store(dl.symm_at(rbox + drow[:, None] * rowsz + wi[None, :], peer), pw, mask=okp[:, None] & wm)
        tl.store(dl.symm_at(rbox + drow[:, None] * rowsz + DW + gi[None, :], peer), ps, mask=okp[:, None] & gm)
    if MULTI_NODE:
        srow = (par * TK + r.to(tl.int64)) * rowsz
        tl.store(lstage_ptr + srow[:, None] + wi[None, :], pw, mask=m[:, None] & wm)
        tl.store(lstage_ptr + srow[:, None] + DW + gi[None, :], ps, mask=m[:, None] & gm)


@triton.jit
def _send_fp8_once(x_ptr, t, snd, dst, me, orow, out_ptr, scale_ptr, sbase, scol, NR, drow, rbox, rowsz, fl64, node0,
                   local, LW, lstage_ptr, par, TK, r, H, G, DW, BGO: tl.constexpr, ROUND: tl.constexpr,
                   PEERS: tl.constexpr, MULTI_NODE: tl.constexpr, PF: tl.constexpr):
    """The fp8 LL dispatch's pairs ``snd`` of one block (rows ``t`` of ``x``), each token quantised once
    (``ONCE``): per token of the block and per step of ``BGO`` groups, its codes and scales as a one-row tile
    (:func:`_fp8_quant`, the same arithmetic as the per-pair path), broadcast to the block's rows and stored where
    a row is that token's, as the per-pair path stores its rows: an own pair (``dst == me``) by
    :func:`_store_fp8_own`, a peer's by :func:`_send_fp8_packets`.  ``PF``: the next step's elements are loaded
    before this step is quantised and stored (two steps in flight, as the bf16 row copy's ``_copy_rows_x2``)."""
    BR: tl.constexpr = t.shape[0]
    tmin = tl.min(tl.where(snd, t, TK), 0)
    tmax = tl.max(tl.where(snd, t, -1), 0)
    one = tl.zeros([1], tl.int64)
    for tok in range(tmin, tmax + 1):
        sel = snd & (t == tok)
        row = one + tok
        if PF:
            v = _fp8_load(x_ptr, row, one == 0, 0, H, G, BGO)
        for g0 in range(0, G, BGO):
            if PF:
                nxt = _fp8_load(x_ptr, row, one == 0, g0 + BGO, H, G, BGO)     # (past G: masked, no access)
                words, sinv = _fp8_codes(v, BGO, ROUND)
                v = nxt
            else:
                words, sinv = _fp8_quant(x_ptr, row, one == 0, g0, H, G, BGO, ROUND)
            wb = tl.broadcast_to(words, (BR, BGO * 32))
            sb = tl.broadcast_to(sinv, (BR, BGO))
            _store_fp8_own(out_ptr, scale_ptr, wb, sb, g0, orow, sbase, scol, NR, DW, G, sel & (dst == me))
            if PEERS:
                _send_fp8_packets(wb, sb, g0, sel & (dst != me), dst, rbox, drow, rowsz, fl64, node0, local, LW,
                                  lstage_ptr, par, TK, r, DW, G, MULTI_NODE)


# ---------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["T"])
def ep_fp8_quant_kernel(x_ptr, q_ptr, T, H, G, BR: tl.constexpr, BG: tl.constexpr, ROUND: tl.constexpr):
    """Each token of ``x`` (``[T, H]``, 16-bit) quantised once, as :func:`_fp8_quant`, into ``q`` (int32
    ``[T, H / 4 + H / 128]``): its ``H / 4`` words of 4 e4m3 codes, then its ``H / 128`` fp32 scales as raw bits
    -- the fp8 LL packet's words.  Grid ``(cdiv(T, BR), cdiv(G, BG))``.  The LL dispatch with ``PRE`` then moves
    words (1 byte per channel) per pair instead of quantising each of a token's ``k`` pairs again."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    ok = rows < T
    g0 = tl.program_id(1) * BG
    words, sinv = _fp8_quant(x_ptr, rows, ok, g0, H, G, BG, ROUND)
    DW = H // 4
    NW = DW + G
    r64 = rows.to(tl.int64)[:, None]
    wi = g0 * 32 + tl.arange(0, BG * 32)
    gi = g0 + tl.arange(0, BG)
    tl.store(q_ptr + r64 * NW + wi[None, :], words, mask=ok[:, None] & (wi < DW)[None, :])
    tl.store(q_ptr + r64 * NW + DW + gi[None, :], sinv.to(tl.int32, bitcast=True), mask=ok[:, None] & (gi < G)[None, :])


@triton.jit
def _ll_prologue(calls_ptr, Eloc, HW):
    """The start of both LL kernels: ``(par, flag, fl64, pid, P, me, W, LW,
    node, local, E, rowsz)`` -- the call's buffer parity, its flag (``epoch +
    1``; ``fl64``: in a packet's high 32 bits), the program, the topology,
    the expert count and the words per row."""
    e = epoch_begin(calls_ptr)
    flag = (e + 1).to(tl.int32)
    me, W, LW, node, NN, local = topology()
    return (e % 2, flag, flag.to(tl.int64) << 32, tl.program_id(0), tl.num_programs(0), me, W, LW, node, local,
            Eloc * W, HW.to(tl.int64))


@triton.jit
def _route_rank_direct(idx_ptr, r, TK, E, BLK: tl.constexpr):
    """The routing of pairs ``r`` (any set, ``< TK``) counted directly:
    ``(inr, valid, key, rank)``, ``rank`` the number of pairs before each one
    with its key (a ``[BR, BLK]`` comparison per block of the ids before the
    last of them)."""
    inr = r < TK
    ids = tl.load(idx_ptr + r, mask=inr, other=-1).to(tl.int64)
    valid = (ids >= 0) & (ids < E)
    key = tl.where(valid, ids, E)
    bb = tl.arange(0, BLK)
    rank = tl.zeros_like(r).to(tl.int32)
    rmax = tl.max(tl.where(inr, r, 0), 0)
    for b0 in range(0, rmax, BLK):
        j = b0 + bb
        jid = tl.load(idx_ptr + j, mask=j < rmax, other=-1).to(tl.int64)
        jkey = tl.where((jid >= 0) & (jid < E), jid, E)
        rank += tl.sum(((jkey[None, :] == key[:, None]) & (j[None, :] < r[:, None])).to(tl.int32), 1)
    return inr, valid, key, rank


@ditron.jit(do_not_specialize=["TK", "Eloc", "cap", "per"])
def ep_ll_dispatch_kernel(x_ptr, idx_ptr, key_ptr, pslot_ptr, dropped_ptr, out_ptr, scale_ptr, lrc_ptr, rcnt_ptr,
                          lrecv_ptr, lcnt_ptr, lstage_ptr, calls_ptr, trace_ptr, TK, K, H, HW, Eloc, cap, per,
                          MULTI_NODE: tl.constexpr, PEERS: tl.constexpr, EPW: tl.constexpr, WP: tl.constexpr,
                          ELP: tl.constexpr, EP: tl.constexpr, BLK: tl.constexpr, BR: tl.constexpr, BW: tl.constexpr,
                          CB: tl.constexpr, STRIDED: tl.constexpr, TRACE: tl.constexpr, FP8: tl.constexpr = False,
                          ROUND: tl.constexpr = False, BG: tl.constexpr = 1,
                          PRE: tl.constexpr = False, ONCE: tl.constexpr = False, BGO: tl.constexpr = 1,
                          ONCE_PF: tl.constexpr = False):
    """The LL dispatch with its routing, one launch, no exchange between its
    programs.  ``idx_ptr``: the ``TK = T * K`` expert ids (natural order).
    Program ``q`` owns pairs ``[q * per, (q + 1) * per)`` (``STRIDED``: pairs
    ``q, q + P, q + 2 P, ...``, each ranked by a direct count,
    ``_route_rank_direct``, so that a block's rows are different tokens): it
    counts the pairs before them per key (``_route_count``; program 0 counts them all:
    ``dropped`` and the count words, one flagged word per (local expert,
    destination), capped at the capacity, to every rank, this one included),
    then in blocks of ``BR`` ranks its pairs (slot: rank among the earlier
    pairs of its expert; ``key_ptr`` / ``pslot_ptr``, natural order: the
    combine's handle) and sends them at once: a peer's pair as packets into
    its slot on the owner, an own pair straight into ``recv_x`` (row base per
    local expert: the count words of the sources before this rank; ``CB``
    columns per copy step, two steps in flight).  Receive: the count words
    give ``lrc`` (``[E_local, W]``) and ``recv_counts``; work units (row
    block, local expert, source ``!= rank``) poll and unpack the peers' rows.
    The epochs (``e + 1`` of ``calls_ptr``) make the slots never need a
    reset; the grid is resident (at most the SM count).  Trace phases:
    counted, rows sent, received.

    ``FP8``: each row is quantised on the fly (``_fp8_quant``, ``BG`` groups
    of 128 channels per step) and travels as ``H / 4`` words of 4 e4m3 codes
    then ``H / 128`` words of fp32 scales (``HW`` stays the slot stride);
    ``out_ptr`` is the int32 view of the e4m3 ``recv_x`` (``[E_local, W *
    cap, H / 4]``) and ``scale_ptr`` the fp32 scales ``[E_local, H / 128, W
    * cap]`` (column-major per expert, as DeepEP returns them); an own pair
    is quantised straight into them.  ``PRE`` (with ``FP8``): ``x_ptr`` is
    :func:`ep_fp8_quant_kernel`'s output (int32 ``[T, NW]``, each token
    quantised once): the pairs move its words, codes and scales, as they are.
    ``ONCE`` (with ``FP8``, not ``PRE`` or ``STRIDED``): each token of a block is
    quantised once (a one-row tile of ``BGO`` groups per step, ``ONCE_PF``:
    the next step's loads issued before this one's work,
    :func:`_send_fp8_once`) and its codes and scales stored to every pair of
    the block that is that token's, own or a peer's (a block of consecutive
    pairs holds one or two tokens' pairs: at ``k = 8`` and 8 rows per block
    the default path quantises the same row 8 times)."""
    _stamp(trace_ptr, 0, TRACE)
    par, flag, fl64, pid, P, me, W, LW, node, local, E, rowsz = _ll_prologue(calls_ptr, Eloc, HW)
    rbox = lrecv_ptr + par * (Eloc * W * cap) * rowsz          # [E_local][W][cap][HW]
    cbox = lcnt_ptr + par * Eloc * W                         # [E_local][W]
    rr = tl.arange(0, BR)
    ww = tl.arange(0, BW)
    widx = tl.arange(0, WP)
    lidx = tl.arange(0, ELP)
    lmask = lidx < Eloc
    node0 = node * LW
    eidx = tl.arange(0, EP)
    # FP8: a row's words (codes, then scales) and its place in the scales (``NR``: rows per local expert)
    if FP8:
        DW = H // 4
        G = H // 128
        NW = DW + G
    else:
        DW = HW
        G = 0
        NW = HW
    NR = W * cap
    # ---------------- routing: the counts before this program's pairs (program 0: all of them) ----------------
    lo = tl.minimum(pid * per, TK)
    hi = tl.minimum(lo + per, TK)
    if STRIDED:
        before = tl.zeros((EP,), tl.int32)
    else:
        before, _ = _route_count(idx_ptr, 0, lo, E, EP, BLK)
    if pid == 0:
        tot, nbad = _route_count(idx_ptr, 0, TK, E, EP, BLK)
        over = tl.sum(tl.where(eidx < E, tl.maximum(tot - cap, 0), 0), 0)
        tl.store(dropped_ptr, nbad.to(tl.int64))
        tl.store(dropped_ptr + 1, over.to(tl.int64))
        # counts: one flagged word per (local expert, destination), capped at the capacity
        for d in range(0, W):
            c = tl.sum(tl.where(eidx[None, :] == (d * Eloc + lidx)[:, None], tot[None, :], 0), 1)
            word = fl64 | tl.minimum(c, cap).to(tl.int64)
            if d // LW == node:
                tl.store(dl.symm_at(cbox + lidx * W + me, d), word, mask=lmask)
            else:
                if MULTI_NODE:
                    st = lstage_ptr + (2 * TK) * rowsz + par * W * Eloc + d * Eloc
                    tl.store(st + lidx, word, mask=lmask)
                    dl.fence("release", "sys")
                    dl.syncthreads()
                    for l in range(0, Eloc):
                        shmem.putmem_block(cbox + l * W + me, st + l, 8, d)
    _stamp(trace_ptr, 1, TRACE)
    # ---------------- rank this program's pairs and send them ----------------
    # own pairs go to recv_x at row obase[l] + slot of local expert l's block (obase: the sources before this rank)
    cm = lmask[:, None] & (widx < me)[None, :]
    cwb = ll_poll(cbox + lidx[:, None] * W + widx[None, :], cm, flag)
    obase = tl.sum(tl.where(cm, cwb & 0xFFFFFFFF, 0), 1)
    carry = before
    # STRIDED: the program's pairs are pid, pid + P, pid + 2 P, ... (a block's rows: tokens P / k apart), each
    # ranked directly; otherwise [lo, hi) (a block's rows: consecutive pairs, mostly one token's)
    if STRIDED:
        npairs = (TK - pid + P - 1) // P
    else:
        npairs = hi - lo
    for b in range(0, (npairs + BR - 1) // BR):
        if STRIDED:
            r = (b * BR + rr) * P + pid
            inr, valid, eid, sl = _route_rank_direct(idx_ptr, r, TK, E, BLK)
        else:
            r = lo + b * BR + rr
            inr, valid, eid, hot, sl, carry = _route_rank(idx_ptr, r, hi, E, eidx, carry)
        tl.store(key_ptr + r, eid, mask=inr)
        tl.store(pslot_ptr + r, sl.to(tl.int64), mask=inr)
        sl = sl.to(tl.int64)
        dst = eid // Eloc
        ok = inr & valid & (sl < cap)
        t = (r // K).to(tl.int64)
        le = (eid % Eloc).to(tl.int64)
        own = ok & (dst == me)
        if FP8 and ONCE:
            # every pair of the block that goes anywhere (own, or a peer's when PEERS), each token quantised once
            ob = tl.sum(tl.where(le[:, None] == lidx[None, :], obase[None, :], 0), 1)
            _send_fp8_once(x_ptr, t, ok if PEERS else own, dst, me, le * NR + ob + sl, out_ptr, scale_ptr,
                           le * G, ob + sl, NR, (le * W + me) * cap + sl, rbox, rowsz, fl64, node0, local, LW,
                           lstage_ptr, par, TK, r, H, G, DW, BGO, ROUND, PEERS, MULTI_NODE, ONCE_PF)
        elif tl.sum(own.to(tl.int32), 0) > 0:
            ob = tl.sum(tl.where(le[:, None] == lidx[None, :], obase[None, :], 0), 1)
            if FP8:
                orow = le * NR + ob + sl
                if PRE:
                    for w0 in range(0, NW, BW):
                        w = w0 + ww
                        v = tl.load(x_ptr + t[:, None] * NW + w[None, :], mask=own[:, None] & (w < NW)[None, :],
                                    other=0)
                        tl.store(out_ptr + orow[:, None] * DW + w[None, :], v, mask=own[:, None] & (w < DW)[None, :])
                        tl.store(scale_ptr + (le[:, None] * G + (w - DW)[None, :]) * NR + (ob + sl)[:, None],
                                 v.to(tl.float32, bitcast=True), mask=own[:, None] & ((w >= DW) & (w < NW))[None, :])
                else:
                    for g0 in range(0, G, BG):
                        words, sinv = _fp8_quant(x_ptr, t, own, g0, H, G, BG, ROUND)
                        _store_fp8_own(out_ptr, scale_ptr, words, sinv, g0, orow, le * G, ob + sl, NR, DW, G, own)
            else:
                _copy_rows_x2(x_ptr, t, out_ptr, le * (W * cap) + ob + sl, own, H, CB)
        if PEERS:
            ok = ok & (dst != me)
            drow = (le * W + me) * cap + sl
            anyp = tl.sum(ok.to(tl.int32), 0) > 0
            if FP8 and ONCE:
                pass                                    # sent above (_send_fp8_once)
            elif FP8:
                if PRE:
                    # the token's staged words (codes, then scales) as they are, NW words per packet row
                    _send_packets(x_ptr, t, ok, anyp, NW, NW, fl64, dst, rbox, drow, rowsz, node0, local, LW,
                                  lstage_ptr, par, TK, r, ww, 1, MULTI_NODE)
                else:
                    # codes and scales of BG groups per step, the same packets to whichever peer owns each pair
                    for g0 in range(0, tl.where(anyp, G, 0), BG):
                        words, sinv = _fp8_quant(x_ptr, t, ok, g0, H, G, BG, ROUND)
                        _send_fp8_packets(words, sinv, g0, ok, dst, rbox, drow, rowsz, fl64, node0, local, LW,
                                          lstage_ptr, par, TK, r, DW, G, MULTI_NODE)
            else:
                _send_packets(x_ptr, t, ok, anyp, HW, H, fl64, dst, rbox, drow, rowsz, node0, local, LW, lstage_ptr,
                              par, TK, r, ww, EPW, MULTI_NODE)
            if MULTI_NODE:
                dl.fence("release", "sys")
                dl.syncthreads()
                for i in range(0, BR):
                    d_i = _pick(dst, rr, i)
                    if _pick(ok.to(tl.int32), rr, i) != 0:
                        if d_i // LW != node:
                            shmem.putmem_block(rbox + _pick(drow, rr, i) * rowsz,
                                               lstage_ptr + (par * TK + _pick(r, rr, i)) * rowsz, NW * 8, d_i)
    _stamp(trace_ptr, 2, TRACE)
    # ---------------- receive ----------------
    # every count word (every source, this rank included): lrc and recv_counts
    for l in range(pid, Eloc, P):
        cw = ll_poll((cbox + l * W + widx)[:, None], (widx < W)[:, None], flag)
        cnt = tl.reduce((cw & 0xFFFFFFFF), 1, _add)
        tl.store(lrc_ptr + l * W + widx, cnt, mask=widx < W)
        tl.store(rcnt_ptr + l, tl.reduce(cnt, 0, _add))
    if PEERS:
        # the peers' rows: work units (row block qb, local expert l, source s != rank) over all programs, row blocks
        # outermost, so that the non-empty units (low qb) spread over every program
        nls = Eloc * (W - 1)
        for u in range(pid, nls * ((cap + BR - 1) // BR), P):
            qb = u // nls
            l = (u % nls) // (W - 1)
            s = (me + 1 + u % (W - 1)) % W
            cw = ll_poll((cbox + l * W + widx)[:, None], (widx < W)[:, None], flag)
            cnt = tl.reduce((cw & 0xFFFFFFFF), 1, _add)
            n = _pick(cnt, widx, s)
            q0 = qb * BR
            if q0 < n:
                base = _sum_below(cnt, widx, s)
                q = q0 + rr
                qok = q < n
                orow = l * (W * cap) + base + q.to(tl.int64)
                src = (l * W + s) * cap + q.to(tl.int64)
                for w0 in range(0, NW, BW):
                    w = w0 + ww
                    m = qok[:, None] & (w[None, :] < NW)
                    pk = ll_poll(rbox + src[:, None] * rowsz + w[None, :], m, flag)
                    if FP8:
                        word = pk.to(tl.int32)
                        isd = (w < DW)[None, :]
                        tl.store(out_ptr + orow[:, None] * DW + w[None, :], word, mask=m & isd)
                        tl.store(scale_ptr + (l * G + (w - DW))[None, :].to(tl.int64) * NR + (base + q.to(tl.int64))[:, None],
                                 word.to(tl.float32, bitcast=True), mask=m & (~isd))
                    else:
                        _unpack_store(pk, out_ptr, orow, qok, w, HW, H, EPW, out_ptr.dtype.element_ty)
    _stamp(trace_ptr, 3, TRACE)
    epoch_end(calls_ptr)


@triton.jit
def _ll_peer_sum(box, peid_ptr, pslot_ptr, w_ptr, t, tok_ok, w, wm, rowsz, Eloc, E, cap, me, flag,
                 KT: tl.constexpr, EPW: tl.constexpr, DT: tl.constexpr, POLL: tl.constexpr):
    """Token side of the LL combine, the pairs of peers' experts of tokens
    ``t`` (``[RB]``), packet words ``w`` (``[RW]``): ``(lo, hi, bad)``, the
    ``topk_weights``-weighted fp32 sums of the words' low (``EPW == 1``: the
    only) and high elements, and the packets whose flag is not this call's.
    ``POLL``: each pair's packets are polled (``ll_poll``) until they carry
    the flag (``bad`` stays 0); otherwise all ``KT`` pairs are read at once
    (volatile loads, all in flight) and the caller polls again when ``bad``
    is not 0."""
    lo = tl.zeros((t.shape[0], w.shape[0]), tl.float32)
    hi = tl.zeros((t.shape[0], w.shape[0]), tl.float32)
    bad = tl.zeros((t.shape[0], w.shape[0]), tl.int32)
    t64 = t.to(tl.int64)
    for j in tl.static_range(KT):
        eid = tl.load(peid_ptr + t64 * KT + j, mask=tok_ok, other=E)
        sl = tl.load(pslot_ptr + t64 * KT + j, mask=tok_ok, other=cap).to(tl.int64)
        wt = tl.load(w_ptr + t64 * KT + j, mask=tok_ok, other=0.0).to(tl.float32)
        peer = tok_ok & (eid < E) & (sl < cap) & ((eid // Eloc) != me)
        m = peer[:, None] & wm[None, :]
        ptrs = box + (eid.to(tl.int64) * cap + sl)[:, None] * rowsz + w[None, :]     # [owner][l][slot] = [eid][slot]
        if POLL:
            pk = ll_poll(ptrs, m, flag)
        else:
            pk = tl.load(ptrs, mask=m, other=0, volatile=True)
            bad |= (((pk >> 32).to(tl.int32) != flag) & m).to(tl.int32)
        word = pk.to(tl.int32)
        if EPW == 1:
            lo += wt[:, None] * word.to(tl.float32, bitcast=True)
        else:
            lo += wt[:, None] * (word & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
            hi += wt[:, None] * ((word >> 16) & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
    return lo, hi, bad


@ditron.jit(do_not_specialize=["T", "TK", "Eloc", "cap"])
def ep_ll_combine_kernel(y_ptr, out_ptr, peid_ptr, pslot_ptr, w_ptr, lrc_ptr, lcomb_ptr, lstage_ptr, calls_ptr,
                         trace_ptr, T, TK, H, HW, Eloc, cap,
                         MULTI_NODE: tl.constexpr, PEERS: tl.constexpr, EPW: tl.constexpr, WP: tl.constexpr,
                         ELP: tl.constexpr, BR: tl.constexpr, BW: tl.constexpr, KT: tl.constexpr, RB: tl.constexpr,
                         RW: tl.constexpr,
                         TRACE: tl.constexpr):
    """Owner side: row ``r`` of (local expert ``l``, source ``s``) goes back to
    ``lcomb[p][rank][l][r]`` on ``s``.  Token side: pair ``(t, j)`` (expert
    ``peid``, slot ``pslot``; skipped when not delivered) is read there; a
    pair of this rank's own experts is read from ``y`` (it does not travel).
    The token side works on ``[RB, RW]`` word tiles (``[RB, RW * EPW]``
    elements), as the normal combine's reduce: the ``KT`` rows of ``y`` and
    the ``KT`` peers' packets of a tile are all loaded at once (the metadata
    loads depend on nothing, the packets are read without a poll); only when
    some packet does not carry this call's flag yet are the peers' pairs
    polled one at a time (``_ll_peer_sum``).  Trace phases: rows sent,
    (nothing), reduced."""
    _stamp(trace_ptr, 0, TRACE)
    par, flag, fl64, pid, P, me, W, LW, node, local, E, rowsz = _ll_prologue(calls_ptr, Eloc, HW)
    box = lcomb_ptr + par * (W * Eloc * cap) * rowsz           # [W owners][E_local][cap][HW]
    rr = tl.arange(0, BR)
    ww = tl.arange(0, BW)
    widx = tl.arange(0, WP)
    # owner side: work units (row block rb, local expert l, source s != rank) over all programs, row blocks
    # outermost; this rank's own rows are read from y by the token side (none at world size 1)
    if PEERS:
        nls = Eloc * (W - 1)
        for u in range(pid, nls * ((cap + BR - 1) // BR), P):
            rb = u // nls
            l = (u % nls) // (W - 1)
            s = (me + 1 + u % (W - 1)) % W
            cnt = tl.load(lrc_ptr + l * W + widx, mask=widx < W, other=0)
            n = _pick(cnt, widx, s)
            r0 = rb * BR
            if r0 < n:
                base = _sum_below(cnt, widx, s)
                remote = (s // LW) != node
                r = r0 + rr
                ok = r < n
                yrow = l * (W * cap) + base + r.to(tl.int64)
                drow = (me * Eloc + l) * cap + r.to(tl.int64)
                for w0 in range(0, HW, BW):
                    w = w0 + ww
                    pkt = _pack(y_ptr, yrow, ok, w, HW, H, fl64, EPW)
                    m = ok[:, None] & (w[None, :] < HW)
                    if MULTI_NODE:
                        if remote:
                            tl.store(lstage_ptr + (par * W * cap + s * cap + r.to(tl.int64))[:, None] * rowsz
                                     + w[None, :], pkt, mask=m)
                        else:
                            tl.store(dl.symm_at(box + drow[:, None] * rowsz + w[None, :], s), pkt, mask=m)
                    else:
                        tl.store(dl.symm_at(box + drow[:, None] * rowsz + w[None, :], s), pkt, mask=m)
                if MULTI_NODE:
                    if remote:
                        dl.fence("release", "sys")
                        dl.syncthreads()
                        nr = tl.minimum(n - r0, BR)
                        shmem.putmem_block(box + ((me * Eloc + l) * cap + r0) * rowsz,
                                           lstage_ptr + (par * W * cap + s * cap + r0) * rowsz, nr * HW * 8, s)
    _stamp(trace_ptr, 1, TRACE)
    _stamp(trace_ptr, 2, TRACE)
    # ---------------- token side: the k rows of each token ----------------
    # own pairs: row obase[l] + slot of local expert l's block of y (obase: rows from the sources before this rank)
    lidx = tl.arange(0, ELP)
    obase = tl.sum(tl.load(lrc_ptr + lidx[:, None] * W + widx[None, :],
                           mask=(lidx < Eloc)[:, None] & (widx < me)[None, :], other=0), 1).to(tl.int64)
    tt = tl.arange(0, RB)
    # work units (token block, word chunk) over all programs
    nwc = (HW + RW - 1) // RW
    for u in range(pid, ((T + RB - 1) // RB) * nwc, P):
        t = (u // nwc) * RB + tt
        t64 = t.to(tl.int64)
        tok_ok = t < T
        w0 = (u % nwc) * RW
        w = w0 + tl.arange(0, RW)
        wm = w < HW
        cols = w0 * EPW + tl.arange(0, RW * EPW)
        cm = cols < H
        acc = tl.zeros((RB, RW * EPW), tl.float32)
        for j in tl.static_range(KT):
            eid = tl.load(peid_ptr + t64 * KT + j, mask=tok_ok, other=E)
            sl = tl.load(pslot_ptr + t64 * KT + j, mask=tok_ok, other=cap).to(tl.int64)
            wt = tl.load(w_ptr + t64 * KT + j, mask=tok_ok, other=0.0).to(tl.float32)
            own = tok_ok & (eid < E) & (sl < cap) & ((eid // Eloc) == me)
            l = (eid % Eloc).to(tl.int64)
            ob = tl.sum(tl.where(l[:, None] == lidx[None, :], obase[None, :], 0), 1)
            yrow = l * (W * cap) + ob + sl
            vy = tl.load(y_ptr + yrow[:, None] * H + cols[None, :], mask=own[:, None] & cm[None, :], other=0.0)
            acc += wt[:, None] * vy.to(tl.float32)
        if PEERS:
            lo, hi, bad = _ll_peer_sum(box, peid_ptr, pslot_ptr, w_ptr, t, tok_ok, w, wm, rowsz, Eloc, E, cap, me,
                                       flag, KT, EPW, out_ptr.dtype.element_ty, False)
            if tl.sum(tl.sum(bad, 1), 0) > 0:          # some peer's row not here yet: poll pair by pair
                lo, hi, bad = _ll_peer_sum(box, peid_ptr, pslot_ptr, w_ptr, t, tok_ok, w, wm, rowsz, Eloc, E, cap,
                                           me, flag, KT, EPW, out_ptr.dtype.element_ty, True)
            if EPW == 1:
                acc += lo
            else:
                acc += tl.reshape(tl.join(lo, hi), (RB, RW * 2))
        tl.store(out_ptr + t64[:, None] * H + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=tok_ok[:, None] & cm[None, :])
    _stamp(trace_ptr, 3, TRACE)
    epoch_end(calls_ptr)
