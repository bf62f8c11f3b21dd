"""Device code of EP dispatch / combine (kernels/ep.py has the protocol,
the layouts and the host API): helpers, the routing and the normal-mode
kernels (the low-latency kernels are in kernels/ep_ll_kernels.py)."""
from __future__ import annotations

import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem

from ._common import epoch_begin, epoch_end, topology
from .all_gather import _put_chunk
from .all_to_all import _add, _exclusive_cumsum, _pick


# ---------------------------------------------------------------------------
# device helpers
# ---------------------------------------------------------------------------

@triton.jit
def _row_of(mat, widx, w):
    """Row ``w`` of a ``[WP, ELP]`` tile, as an ``[ELP]`` vector."""
    return tl.reduce(tl.where(widx[:, None] == w, mat, 0), 0, _add)


@triton.jit
def _recv_layout(cnt_ptr, W, Eloc, row_stride, WP: tl.constexpr, ELP: tl.constexpr):
    """The ``W x E_local`` counts (row ``s``: source ``s``, ``row_stride``
    apart): ``(widx, cnt, eoff)``, ``eoff[l]`` where local expert ``l``'s rows
    start in the expert-grouped output (experts in order, inside by source);
    :func:`_src_rows` gives one source's row of them.  No ``tl.associative_scan``
    over the ``[WP, ELP]`` tile (see ``_exclusive_cumsum``)."""
    widx = tl.arange(0, WP)
    lidx = tl.arange(0, ELP)
    m = (widx[:, None] < W) & (lidx[None, :] < Eloc)
    cnt = tl.load(cnt_ptr + widx[:, None] * row_stride + lidx[None, :], mask=m, other=0)
    eoff = _exclusive_cumsum(tl.reduce(cnt, 0, _add))
    return widx, cnt, eoff


@triton.jit
def _src_rows(cnt, widx, eoff, s):
    """Source ``s``'s row of the receive layout: ``(c_row, so_row, do_row)``,
    its counts per local expert, where local expert ``l``'s rows start in
    ``s``'s slot (``so``) and in the expert-grouped output (``do``)."""
    c_row = _row_of(cnt, widx, s)
    so_row = _exclusive_cumsum(c_row)
    do_row = eoff + tl.reduce(tl.where(widx[:, None] < s, cnt, 0), 0, _add)
    return c_row, so_row, do_row


@triton.jit
def _out_rows(r, so_row, cnt_row, do_row, ELP: tl.constexpr):
    """Output rows of slot rows ``r`` (``[BR]``) of one source."""
    lidx = tl.arange(0, ELP)
    le = tl.reduce(tl.where((so_row + cnt_row)[None, :] <= r[:, None], 1, 0), 1, _add)
    delta = tl.reduce(tl.where(lidx[None, :] == le[:, None], (do_row - so_row)[None, :], 0), 1, _add)
    return r + delta


@triton.jit
def _rows_chunk(n, P):
    """[lo, hi): this program's share of ``n`` rows."""
    per = (n + P - 1) // P
    lo = tl.program_id(0) * per
    return lo, tl.minimum(lo + per, n)


@triton.jit
def _copy_rows(src_ptr, src_rows, dst_ptr, dst_rows, ok, H, BH: tl.constexpr):
    """``dst[dst_rows] = src[src_rows]`` (``[BR]`` row indices, int64), all ``H`` columns."""
    for h0 in range(0, H, BH):
        hs = h0 + tl.arange(0, BH)
        m = ok[:, None] & (hs[None, :] < H)
        v = tl.load(src_ptr + src_rows[:, None] * H + hs[None, :], mask=m)
        tl.store(dst_ptr + dst_rows[:, None] * H + hs[None, :], v, mask=m)


@triton.jit
def _copy_rows_x2(src_ptr, src_rows, dst_ptr, dst_rows, ok, H, BH: tl.constexpr):
    """``_copy_rows`` with two column blocks per step, both loaded before either is stored (twice the bytes in
    flight per program, half the dependent steps)."""
    for h0 in range(0, H, 2 * BH):
        ha = h0 + tl.arange(0, BH)
        hb = ha + BH
        ma = ok[:, None] & (ha[None, :] < H)
        mb = ok[:, None] & (hb[None, :] < H)
        va = tl.load(src_ptr + src_rows[:, None] * H + ha[None, :], mask=ma)
        vb = tl.load(src_ptr + src_rows[:, None] * H + hb[None, :], mask=mb)
        tl.store(dst_ptr + dst_rows[:, None] * H + ha[None, :], va, mask=ma)
        tl.store(dst_ptr + dst_rows[:, None] * H + hb[None, :], vb, mask=mb)


@triton.jit
def _copy_rows_to_peer(src_ptr, src_rows, dst_ptr, dst_rows, ok, H, peer, BH: tl.constexpr):
    """The same into ``peer``'s copy of the symmetric ``dst``."""
    for h0 in range(0, H, BH):
        hs = h0 + tl.arange(0, BH)
        m = ok[:, None] & (hs[None, :] < H)
        v = tl.load(src_ptr + src_rows[:, None] * H + hs[None, :], mask=m)
        tl.store(dl.symm_at(dst_ptr + dst_rows[:, None] * H + hs[None, :], peer), v, mask=m)


@triton.jit
def _stamp(trace_ptr, i, TRACE: tl.constexpr):
    """Trace (``TRACE``): this program's ``clock_ns`` at the end of phase ``i``
    into ``trace[pid][i]`` (4 words per program; word 0: the kernel's start)."""
    if TRACE:
        tl.store(trace_ptr + tl.program_id(0) * 4 + i, dl.clock_ns())


# ---------------------------------------------------------------------------
# routing (both modes): the staging order without a sort, over several programs
# ---------------------------------------------------------------------------

@triton.jit
def _route_block(idx_ptr, i, hi, E, eidx):
    """Keys (``E``: not sent), one-hot ``[BLK, EP]`` and the ids out of range
    of pairs ``i`` (``< hi``)."""
    inr = i < hi
    ids = tl.load(idx_ptr + i, mask=inr, other=-1).to(tl.int64)
    valid = (ids >= 0) & (ids < E)
    key = tl.where(valid, ids, E)
    hot = ((key[:, None] == eidx[None, :]) & inr[:, None]).to(tl.int32)
    return inr, valid, key, hot, (inr & ~valid & (ids != -1)).to(tl.int32)


@triton.jit
def _route_count(idx_ptr, lo, hi, E, EP: tl.constexpr, BLK: tl.constexpr):
    """The count phase of the routing (both modes): ``(cnt, bad)``, the pairs
    ``[lo, hi)`` per key (``[EP]`` int32; key ``E``: not sent) and how many
    of them hold an id out of range (not ``-1``), in blocks of ``BLK``."""
    bb = tl.arange(0, BLK)
    cnt = tl.zeros((EP,), tl.int32)
    bad = tl.zeros((BLK,), tl.int32)
    for b0 in range(lo, hi, BLK):
        i = b0 + bb
        inr = i < hi
        ids = tl.load(idx_ptr + i, mask=inr, other=-1).to(tl.int64)
        valid = (ids >= 0) & (ids < E)
        cnt += tl.histogram(tl.where(valid, ids, E).to(tl.int32), EP, mask=inr)
        bad += (inr & ~valid & (ids != -1)).to(tl.int32)
    return cnt, tl.sum(bad, 0)


@triton.jit
def _route_rank(idx_ptr, i, hi, E, eidx, carry):
    """The rank phase of the routing (both modes), pairs ``i`` (``< hi``):
    ``(inr, valid, key, hot, rank, carry)``, ``rank`` the number of earlier
    pairs of the same key, ``carry`` (``[EP]``: the pairs of each key before
    ``i[0]``) moved past the block."""
    inr, valid, key, hot, b = _route_block(idx_ptr, i, hi, E, eidx)
    R: tl.constexpr = i.shape[0]
    if R <= 64:
        # small blocks (the LL dispatch's rows, short routings): the earlier pairs of the same key counted by a
        # [R, R] comparison, no tl.associative_scan (Triton 3.6 aborts on a scan over a [R, EP] tile that the
        # layout passes give a wider vectorised layout; see all_to_all._exclusive_cumsum)
        jj = tl.arange(0, R)
        same = (key[None, :] == key[:, None]) & inr[None, :] & (jj[None, :] < jj[:, None])
        rank = tl.where(inr, tl.sum(same.to(tl.int32), 1) + tl.sum(hot * carry[None, :], 1), 0)
    else:
        below = tl.associative_scan(hot, 0, _add) - hot + carry[None, :]
        rank = tl.sum(hot * below, 1)
    return inr, valid, key, hot, rank, carry + tl.sum(hot, 0)


@ditron.jit(do_not_specialize=["TK", "E", "cap", "per"])
def ep_route_kernel(idx_ptr, key_ptr, pos_ptr, pslot_ptr, tok_ptr, skey_ptr, sslot_ptr, cnt_ptr, start_ptr,
                    dropped_ptr, hist_ptr, rslot_ptr, rcalls_ptr, trace_ptr, TK, K, E, cap, per,
                    EP: tl.constexpr, BLK: tl.constexpr, QB: tl.constexpr, TRACE: tl.constexpr):
    """The routing of ``TK = T * K`` pairs ``idx_ptr`` (expert ids, natural
    order; ``-1`` or out of range: not sent, key ``E``).  Program ``q`` owns
    pairs ``[q * per, (q + 1) * per)`` (blocks of ``BLK``): it counts them per
    key into its row of ``hist`` (``[P, EP]`` int32, then ``P`` words of ids
    out of range) and releases its slot (``rslot_ptr[q] = epoch``,
    ``dl.release_tile``); once every program's slot holds this call's epoch
    (``dl.wait_deps``) it reads the counts of all programs, hence the counts
    per key (``cnt_ptr[E + 1]``), their exclusive prefix sums (``start_ptr``)
    and what the programs before it counted, and ranks its pairs: ``pslot``
    (the rank among the earlier pairs of its key), ``pos = start[key] +
    rank`` (``-1``: not sent), and the staging order (stable by key) ``tok``,
    ``skey``, ``sslot`` at ``pos``.  ``dropped``: ids out of range, pairs at a
    rank ``>= cap`` (the first ``cap`` pairs of each expert are kept).  The
    grid is resident (at most the SM count); the epochs count calls
    (``rcalls_ptr``), so the slots are never reset."""
    _stamp(trace_ptr, 0, TRACE)
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    epoch = (epoch_begin(rcalls_ptr) + 1).to(tl.int32)
    eidx = tl.arange(0, EP)
    bb = tl.arange(0, BLK)
    lo = pid * per
    hi = tl.minimum(lo + per, TK)
    cnt, bad = _route_count(idx_ptr, lo, hi, E, EP, BLK)
    tl.store(hist_ptr + pid * EP + eidx, cnt)
    tl.store(hist_ptr + P * EP + pid, bad)
    dl.release_tile(rslot_ptr + pid, epoch)
    tok = dl.wait_deps(rslot_ptr, P, epoch)
    hist_ptr = dl.consume_token(hist_ptr, tok)
    _stamp(trace_ptr, 1, TRACE)
    # every program's counts: the totals and this program's base per key
    tot = tl.zeros((EP,), tl.int32)
    before = tl.zeros((EP,), tl.int32)
    nbad = tl.zeros((QB,), tl.int32)
    qq = tl.arange(0, QB)
    for q0 in range(0, P, QB):
        q = q0 + qq
        h = tl.load(hist_ptr + q[:, None] * EP + eidx[None, :], mask=(q < P)[:, None], other=0)
        tot += tl.sum(h, 0)
        before += tl.sum(tl.where((q < pid)[:, None], h, 0), 0)
        nbad += tl.load(hist_ptr + P * EP + q, mask=q < P, other=0)
    start = _exclusive_cumsum(tot)
    if pid == 0:
        tl.store(cnt_ptr + eidx, tot.to(tl.int64), mask=eidx <= E)
        tl.store(start_ptr + eidx, start.to(tl.int64), mask=eidx <= E)
        over = tl.sum(tl.where(eidx < E, tl.maximum(tot - cap, 0), 0), 0)
        tl.store(dropped_ptr, tl.sum(nbad, 0).to(tl.int64))
        tl.store(dropped_ptr + 1, over.to(tl.int64))
    carry = before
    for b0 in range(lo, hi, BLK):
        i = b0 + bb
        inr, valid, key, hot, rank, carry = _route_rank(idx_ptr, i, hi, E, eidx, carry)
        p = tl.sum(hot * start[None, :], 1) + rank
        tl.store(key_ptr + i, key, mask=inr)
        tl.store(pslot_ptr + i, rank.to(tl.int64), mask=inr)
        tl.store(pos_ptr + i, tl.where(valid, p, -1).to(tl.int64), mask=inr)
        tl.store(tok_ptr + p, (i // K).to(tl.int64), mask=inr)
        tl.store(skey_ptr + p, key, mask=inr)
        tl.store(sslot_ptr + p, rank.to(tl.int64), mask=inr)
    _stamp(trace_ptr, 2, TRACE)
    epoch_end(rcalls_ptr)


# ---------------------------------------------------------------------------
# normal mode
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["TK", "slot_rows", "Eloc"])
def ep_dispatch_kernel(x_ptr, tok_ptr, send_ptr, out_ptr, rc_ptr, rcnt_ptr, buf_ptr, cnt_ptr, stage_ptr, cstage_ptr,
                       sig_ptr, calls_ptr, trace_ptr, TK, H, slot_rows, Eloc,
                       MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr, WP: tl.constexpr, ELP: tl.constexpr,
                       BR: tl.constexpr, BH: tl.constexpr, TRACE: tl.constexpr):
    """``tok_ptr[i]``: token of staged row ``i``; ``send_ptr``: ``[W, E_local]``
    counts this rank sends; ``rc_ptr`` (out): ``[W, E_local + 1]`` counts
    received from each source and the offset of this rank's block in the
    source's staging order; ``rcnt_ptr`` (out): ``[E_local]`` rows received
    per local expert.  ``cnt`` rows are ``E_local + 1`` words apart.  Trace
    phases: sent, every source's signal seen, received."""
    _stamp(trace_ptr, 0, TRACE)
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    me, W, LW, node, NN, local = topology()
    CW = Eloc + 1
    slot = slot_rows.to(tl.int64) * H
    bufp = buf_ptr + par * W * slot
    cntp = cnt_ptr + par * W * CW
    sigp = sig_ptr + (par * P + pid) * W
    widx = tl.arange(0, WP)
    lidx = tl.arange(0, ELP)
    lmask = lidx < Eloc
    sm = (widx[:, None] < W) & lmask[None, :]
    sends = tl.load(send_ptr + widx[:, None] * Eloc + lidx[None, :], mask=sm, other=0)
    ndst = tl.reduce(sends, 1, _add)
    soff = _exclusive_cumsum(ndst)
    rr = tl.arange(0, BR)

    # ---------------- send: rows and counts to every rank of this node ----------------
    node0 = node * LW
    for k in range(0, LW):
        peer = node0 + (local + k) % LW
        n = _pick(ndst, widx, peer)
        s0 = _pick(soff, widx, peer)
        if pid == 0:
            row = _row_of(sends, widx, peer)
            tl.store(dl.symm_at(cntp + me * CW + lidx, peer), row, mask=lmask)
            tl.store(dl.symm_at(cntp + me * CW + Eloc, peer), s0)
        if k > 0:
            lo, hi = _rows_chunk(n, P)
            for r0 in range(lo, hi, BR):
                r = r0 + rr
                ok = r < hi
                t = tl.load(tok_ptr + s0 + r, mask=ok, other=0).to(tl.int64)
                _copy_rows_to_peer(x_ptr, t, bufp + me * slot, r.to(tl.int64), ok, H, peer, BH)
        dl.notify(sigp + me, peer, signal=val, sig_op="set", comm_scope="intra_node")
    if MULTI_NODE:
        stg = stage_ptr + par * TK * H
        for k in range(1, NN):
            for l in range(0, LW):
                peer = ((node + k) % NN) * LW + (local + l) % LW
                n = _pick(ndst, widx, peer)
                s0 = _pick(soff, widx, peer)
                lo, hi = _rows_chunk(n, P)
                for r0 in range(lo, hi, BR):
                    r = r0 + rr
                    ok = r < hi
                    t = tl.load(tok_ptr + s0 + r, mask=ok, other=0).to(tl.int64)
                    _copy_rows(x_ptr, t, stg, (s0 + r).to(tl.int64), ok, H, BH)
                if pid == 0:
                    ci = cstage_ptr + (par * W + peer) * CW
                    tl.store(ci + lidx, _row_of(sends, widx, peer), mask=lmask)
                    tl.store(ci + Eloc, s0)
                    dl.fence("release", "sys")
                    dl.syncthreads()
                    shmem.putmem_block(cntp + me * CW, ci, CW * 8, peer)
                    shmem.fence()                     # the counts land before the rows' signal
                _put_chunk(bufp + me * slot, stg + s0 * H, lo * H, hi * H, sigp + me, val, peer, ELEM_BYTES)

    _stamp(trace_ptr, 1, TRACE)
    # ---------------- receive: every source's rows, into the expert-grouped output ----------------
    tok = dl.wait(sig_ptr + par * P * W, P * W, "sys", "acquire", waitValue=val)
    cntp = dl.consume_token(cntp, tok)
    bufp = dl.consume_token(bufp, tok)
    _stamp(trace_ptr, 2, TRACE)
    widx, cnt, eoff = _recv_layout(cntp, W, Eloc, CW, WP, ELP)
    if pid == 0:
        rcm = (widx[:, None] < W) & (lidx[None, :] < CW)
        tl.store(rc_ptr + widx[:, None] * CW + lidx[None, :],
                 tl.load(cntp + widx[:, None] * CW + lidx[None, :], mask=rcm), mask=rcm)
        tl.store(rc_ptr + widx * CW + Eloc, tl.load(cntp + widx * CW + Eloc, mask=widx < W), mask=widx < W)
        tl.store(rcnt_ptr + lidx, tl.reduce(cnt, 0, _add), mask=lmask)
    my_s0 = _pick(soff, widx, me)
    for s in range(0, W):
        c_row, so_row, do_row = _src_rows(cnt, widx, eoff, s)
        n = tl.reduce(c_row, 0, _add)
        lo, hi = _rows_chunk(n, P)
        for r0 in range(lo, hi, BR):
            r = r0 + rr
            ok = r < hi
            dst = _out_rows(r, so_row, c_row, do_row, ELP).to(tl.int64)
            if s == me:
                t = tl.load(tok_ptr + my_s0 + r, mask=ok, other=0).to(tl.int64)
                _copy_rows(x_ptr, t, out_ptr, dst, ok, H, BH)
            else:
                _copy_rows(bufp + s * slot, r.to(tl.int64), out_ptr, dst, ok, H, BH)
    _stamp(trace_ptr, 3, TRACE)
    epoch_end(calls_ptr)


@ditron.jit(do_not_specialize=["T", "TK", "slot_rows", "Eloc"])
def ep_combine_kernel(y_ptr, out_ptr, pos_ptr, w_ptr, rc_ptr, cbuf_ptr, stage_ptr, sig_ptr, calls_ptr, trace_ptr,
                      T, TK, H, slot_rows, Eloc,
                      MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr, WP: tl.constexpr, ELP: tl.constexpr,
                      BR: tl.constexpr, BH: tl.constexpr, KT: tl.constexpr, RH: tl.constexpr, TRACE: tl.constexpr):
    """Send ``y``'s rows back to their tokens' ranks (into ``cbuf`` at the
    staging positions), then ``out[t] = sum_j w[t, j] * row(pos[t, j])``:
    ``cbuf[pos]`` for a peer's rows, ``y`` itself for this rank's own rows
    (they do not travel).  The reduce works on ``[BR, RH]`` tiles, its ``KT``
    loads unrolled (all in flight at once).  Trace phases: sent, every
    owner's signal seen, reduced."""
    _stamp(trace_ptr, 0, TRACE)
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    me, W, LW, node, NN, local = topology()
    CW = Eloc + 1
    cbp = cbuf_ptr + par * TK * H
    sigp = sig_ptr + (par * P + pid) * W
    widx, cnt, eoff = _recv_layout(rc_ptr, W, Eloc, CW, WP, ELP)
    boff = tl.load(rc_ptr + widx * CW + Eloc, mask=widx < W, other=0)      # my block in each source's order
    rr = tl.arange(0, BR)
    node0 = node * LW
    for k in range(0, LW):
        s = node0 + (local + k) % LW
        if k > 0:                                    # this rank's own rows are read from y by the reduce
            c_row, so_row, do_row = _src_rows(cnt, widx, eoff, s)
            b = _pick(boff, widx, s)
            lo, hi = _rows_chunk(tl.reduce(c_row, 0, _add), P)
            for r0 in range(lo, hi, BR):
                r = r0 + rr
                ok = r < hi
                src = _out_rows(r, so_row, c_row, do_row, ELP).to(tl.int64)
                _copy_rows_to_peer(y_ptr, src, cbp, (b + r).to(tl.int64), ok, H, s, BH)
        dl.notify(sigp + me, s, signal=val, sig_op="set", comm_scope="intra_node")
    if MULTI_NODE:
        stg = stage_ptr + par * W * slot_rows.to(tl.int64) * H
        for k in range(1, NN):
            for l in range(0, LW):
                s = ((node + k) % NN) * LW + (local + l) % LW
                c_row, so_row, do_row = _src_rows(cnt, widx, eoff, s)
                b = _pick(boff, widx, s)
                lo, hi = _rows_chunk(tl.reduce(c_row, 0, _add), P)
                sst = stg + s * slot_rows.to(tl.int64) * H
                for r0 in range(lo, hi, BR):
                    r = r0 + rr
                    ok = r < hi
                    src = _out_rows(r, so_row, c_row, do_row, ELP).to(tl.int64)
                    _copy_rows(y_ptr, src, sst, r.to(tl.int64), ok, H, BH)
                _put_chunk(cbp + b * H, sst, lo * H, hi * H, sigp + me, val, s, ELEM_BYTES)
    _stamp(trace_ptr, 1, TRACE)

    # ---------------- reduce the k rows of each token ----------------
    tok = dl.wait(sig_ptr + par * P * W, P * W, "sys", "acquire", waitValue=val)
    cbp = dl.consume_token(cbp, tok)
    _stamp(trace_ptr, 2, TRACE)
    # this rank's own pairs: staging positions [b_me, b_me + n_me) are rows of y
    c_me, so_me, do_me = _src_rows(cnt, widx, eoff, me)
    b_me = _pick(boff, widx, me)
    n_me = tl.reduce(c_me, 0, _add)
    # work units (token block, column block) over all programs
    nhc = (H + RH - 1) // RH
    for u in range(pid, ((T + BR - 1) // BR) * nhc, P):
        t = (u // nhc) * BR + rr
        tok_ok = t < T
        hs = (u % nhc) * RH + tl.arange(0, RH)
        hm = hs < H
        acc = tl.full((BR, RH), 0.0, tl.float32)
        for j in tl.static_range(KT):
            p = tl.load(pos_ptr + t.to(tl.int64) * KT + j, mask=tok_ok, other=-1)
            wt = tl.load(w_ptr + t.to(tl.int64) * KT + j, mask=tok_ok, other=0.0).to(tl.float32)
            r = p - b_me
            own = (p >= 0) & (r >= 0) & (r < n_me)
            yrow = _out_rows(r, so_me, c_me, do_me, ELP).to(tl.int64)
            m = (p >= 0)[:, None] & hm[None, :]
            v = tl.load(cbp + p[:, None] * H + hs[None, :], mask=m & ~own[:, None], other=0.0).to(tl.float32)
            v += tl.load(y_ptr + yrow[:, None] * H + hs[None, :], mask=m & own[:, None], other=0.0).to(tl.float32)
            acc += wt[:, None] * v
        tl.store(out_ptr + t.to(tl.int64)[:, None] * H + hs[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=tok_ok[:, None] & hm[None, :])
    _stamp(trace_ptr, 3, TRACE)
    epoch_end(calls_ptr)
