"""Distributed flash-decoding written in ditron: one query token per
sequence against a KV cache sharded along the sequence over the ranks.

    ctx = create_flash_decode_context(max_batch, q_heads, kv_heads, head_dim, torch.bfloat16)  # collective
    out = flash_decode(q, k_cache, v_cache, lens, ctx)      # every rank gets the whole result

* ``q``: ``[B, Hq, D]`` (the same on every rank); ``k_cache`` / ``v_cache``:
  ``[B, Hkv, cap, D]`` this rank's part of the cache (rows ``[0, lens[b])`` of
  sequence ``b`` are used); ``lens``: int32 ``[B]`` on the device, this rank's
  context length per sequence (ragged: any length from 0 to ``cap`` on each
  rank; every sequence needs at least one key on some rank).
* ``out``: ``[B, Hq, D]``, softmax attention of each query over the keys of
  every rank (``scaled_dot_product_attention`` on the concatenated cache);
  with ``return_lse`` also the fp32 natural-log LSE ``[B, Hq]``.

How:

1. ``flash_decode_split_kernel``, program ``(split, b * Hkv + kv head)``: the
   ``G = Hq / Hkv`` query heads of a KV head as one ``[BLOCK_H, D]`` tile
   (GQA: every key is read once for all of them) against its split of this
   rank's keys, online softmax in exp2 with fp32 accumulation; writes the
   split's normalised output and LSE (an empty split writes LSE -1e30).
2. ``flash_decode_combine_kernel``, over units (one query-head row of one
   ``(b, kv head)`` item, or a column slice of it when there are few rows):
   combines the splits into this rank's partial (output, LSE) in parallel --
   every split's LSE as one vector, the partial rows as one ``[splits,
   columns]`` tile (no chain of dependent loads); with more than one rank it
   pushes the partial into every peer's LL buffer (low-latency protocol: each
   8-byte packet carries one fp32 value and the call's flag, no separate
   signal; kernels/_common.py ``ll_poll``), then polls the packets of every
   rank and combines them in rank order (the same bits on every rank).  With
   several ranks the grid is persistent, at most one program per SM, and
   every program pushes all its units before it polls, so no program waits
   for one that cannot run.

Reuse: the call counter of kernels/_common.py (LL parity ``e % 2``, flag ``e + 1``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import CollectiveContext, enter, epoch_begin, epoch_end, ll_poll, sm_count
from ._common import cdiv, next_pow2
from .attention_core import _fadd, _fmax

_DTYPES = (torch.float16, torch.bfloat16)
EMPTY_LSE = tl.constexpr(-1.0e30)
#: GPU tiles: keys per tile, warps, pipeline stages of the split kernel (128-key tiles, 3 stages: on one
#: H100 as fast as 64 at batch 1 and 3-6% faster at batch 16 / 64, 2026-11-26 and -27, bench/attention_levers.sh)
GPU_BLOCK_N = 128
GPU_WARPS = 4
GPU_STAGES = 4
SIM_BLOCK_N = 16
#: world size 1: the split kernel's last program per item combines (no combine launch), up to this many splits
GPU_FUSE_COMBINE = False
FUSE_MAX_SPLITS = 64


@ditron.jit
def flash_decode_split_kernel(q_ptr, k_ptr, v_ptr, lens_ptr, po_ptr, pl_ptr, cap, nsplit, qk_scale,
                              out_ptr, lse_ptr, cnt_ptr,
                              G: tl.constexpr, HKV: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_H: tl.constexpr,
                              BLOCK_N: tl.constexpr, FUSE: tl.constexpr = False, SPLIT_CHUNK: tl.constexpr = 16):
    """Split ``sp`` of this rank's keys of one (sequence, KV head).  ``FUSE``
    (world size 1, ``nsplit <= SPLIT_CHUNK``): the last split program of the
    item to finish (a per-item counter, ``cnt_ptr``, reset by that program)
    combines the item's splits into ``out_ptr`` / ``lse_ptr`` -- no second
    launch."""
    sp = tl.program_id(0)
    bkv = tl.program_id(1)
    b = bkv // HKV
    L = tl.load(lens_ptr + b)
    per = ((L + nsplit - 1) // nsplit + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    lo = sp * per
    hi = tl.minimum(lo + per, L)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_D)
    offs_n = tl.arange(0, BLOCK_N)
    h_ok = offs_h < G
    q = tl.load(q_ptr + (bkv * G + offs_h)[:, None] * HEAD_D + offs_d[None, :], mask=h_ok[:, None], other=0.0)
    kb = k_ptr + bkv.to(tl.int64) * cap * HEAD_D
    vb = v_ptr + bkv.to(tl.int64) * cap * HEAD_D
    acc = tl.full([BLOCK_H, HEAD_D], 0.0, tl.float32)
    l_i = tl.full([BLOCK_H], 0.0, tl.float32)
    m_i = tl.full([BLOCK_H], EMPTY_LSE, tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        kidx = n0 + offs_n
        ok = kidx < hi
        k = tl.load(kb + kidx[:, None] * HEAD_D + offs_d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(vb + kidx[:, None] * HEAD_D + offs_d[None, :], mask=ok[:, None], other=0.0)
        qk = tl.where(ok[None, :], tl.dot(q, tl.trans(k)), float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(qk, 1, _fmax) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.reduce(p, 1, _fadd)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, EMPTY_LSE, (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    part = bkv.to(tl.int64) * nsplit + sp
    tl.store(po_ptr + part * (BLOCK_H * HEAD_D) + offs_h[:, None] * HEAD_D + offs_d[None, :], acc / l_safe[:, None],
             mask=h_ok[:, None])
    tl.store(pl_ptr + part * BLOCK_H + offs_h, lse, mask=h_ok)
    if FUSE:
        tl.debug_barrier()              # every thread's partial stores before the release below
        done = tl.atomic_add(cnt_ptr + bkv, 1, sem="acq_rel", scope="gpu")
        if done == nsplit - 1:
            _combine_item(po_ptr, pl_ptr, out_ptr, lse_ptr, bkv, nsplit, G, HEAD_D, BLOCK_H, SPLIT_CHUNK)
            tl.store(cnt_ptr + bkv, 0)


@triton.jit
def _combine_item(po_ptr, pl_ptr, out_ptr, lse_ptr, bkv, nsplit, G: tl.constexpr, HEAD_D: tl.constexpr,
                  BLOCK_H: tl.constexpr, SPLIT_CHUNK: tl.constexpr):
    """The ``nsplit <= SPLIT_CHUNK`` partials of item ``bkv`` (every query-head row at once: no loop, every
    load independent) into its output rows and LSE (natural log)."""
    offs_s = tl.arange(0, SPLIT_CHUNK)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_D)
    s_ok = offs_s < nsplit
    rows = bkv.to(tl.int64) * nsplit + offs_s
    lse2 = tl.load(pl_ptr + rows[:, None] * BLOCK_H + offs_h[None, :], mask=s_ok[:, None] & (offs_h < G)[None, :],
                   other=float("-inf"), cache_modifier=".cg")
    m = tl.maximum(tl.reduce(lse2, 0, _fmax), EMPTY_LSE)
    w2 = tl.exp(lse2 - m[None, :])
    ssum = tl.reduce(w2, 0, _fadd)
    for g in tl.static_range(G):
        o = tl.load(po_ptr + (rows * BLOCK_H + g)[:, None] * HEAD_D + offs_d[None, :], mask=s_ok[:, None], other=0.0,
                    cache_modifier=".cg")
        w = tl.reduce(tl.where(offs_h[None, :] == g, w2, 0.0), 1, _fadd)
        sg = tl.reduce(tl.where(offs_h == g, ssum, 0.0), 0, _fadd)
        mg = tl.reduce(tl.where(offs_h == g, m, EMPTY_LSE), 0, _fmax)
        orow = (bkv * G + g).to(tl.int64)
        tl.store(out_ptr + orow * HEAD_D + offs_d, (tl.reduce(o * w[:, None], 0, _fadd) / sg).to(
            out_ptr.dtype.element_ty))
        tl.store(lse_ptr + orow + offs_d, tl.full([HEAD_D], 0.0, tl.float32) + (mg + tl.log(sg)), mask=offs_d == 0)


@triton.jit
def _merge(acc, s, mx, o, lse):
    """Add a normalised partial ``o`` (a row) with log-sum-exp ``lse`` (a
    scalar) to the running (``acc``, sum ``s``, max ``mx``), natural-log units."""
    m_new = tl.maximum(mx, lse)
    a = tl.exp(mx - m_new)
    w = tl.exp(lse - m_new)
    return acc * a + o * w, s * a + w, m_new


@ditron.jit
def flash_decode_combine_kernel(po_ptr, pl_ptr, out_ptr, lse_ptr, llo_ptr, lll_ptr, calls_ptr, nitems, nsplit,
                                maxitems, G: tl.constexpr, WORLD: tl.constexpr, HEAD_D: tl.constexpr,
                                BLOCK_H: tl.constexpr, DSPLIT: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
                                WAIT: tl.constexpr):
    """Units ``pid, pid + P, ...``; a unit is one query-head row ``g`` of one
    item (sequence, KV head) and one of ``DSPLIT`` column slices of it.  Its
    splits are combined in parallel: the LSEs of ``SPLIT_CHUNK`` splits as one
    vector (their maximum first), then the partial rows as ``[SPLIT_CHUNK,
    HEAD_D / DSPLIT]`` tiles weighted and summed -- no chain of dependent
    loads.  With several ranks: LL push of the unit's slice (and, from slice
    0, the row's LSE) to every rank, then poll and combine in rank order.
    ``WAIT`` is False only in the planted-bug test (the packets are read
    without polling for the flag)."""
    DCH: tl.constexpr = HEAD_D // DSPLIT
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nunits = nitems * (G * DSPLIT)
    offs_c = tl.arange(0, DCH)
    offs_s = tl.arange(0, SPLIT_CHUNK)
    if WORLD > 1:
        e = epoch_begin(calls_ptr)
        flag = (e + 1).to(tl.int32)
        fl64 = flag.to(tl.int64) << 32
        par = e % 2
        me = dl.rank()
    for u in range(pid, nunits, nprog):
        it = u // (G * DSPLIT)
        g = (u // DSPLIT) % G
        cols = (u % DSPLIT) * DCH + offs_c
        # pass 1: the largest LSE over the splits
        mx = tl.full([SPLIT_CHUNK], float("-inf"), tl.float32)
        for s0 in range(0, nsplit, SPLIT_CHUNK):
            sp = s0 + offs_s
            lse_s = tl.load(pl_ptr + (it.to(tl.int64) * nsplit + sp) * BLOCK_H + g, mask=sp < nsplit,
                            other=float("-inf"))
            mx = tl.maximum(mx, lse_s)
        m = tl.reduce(mx, 0, _fmax)
        # pass 2: the weighted partial rows (independent loads)
        acc = tl.full([DCH], 0.0, tl.float32)
        wsum = tl.full([SPLIT_CHUNK], 0.0, tl.float32)
        for s0 in range(0, nsplit, SPLIT_CHUNK):
            sp = s0 + offs_s
            s_ok = sp < nsplit
            row = (it.to(tl.int64) * nsplit + sp) * BLOCK_H + g
            w = tl.exp(tl.load(pl_ptr + row, mask=s_ok, other=float("-inf")) - m)
            o = tl.load(po_ptr + row[:, None] * HEAD_D + cols[None, :], mask=s_ok[:, None], other=0.0)
            acc = acc + tl.reduce(o * w[:, None], 0, _fadd)
            wsum = wsum + w
        ssum = tl.reduce(wsum, 0, _fadd)
        o = acc / ssum
        lse = m + tl.log(ssum)
        orow = (it * G + g).to(tl.int64)
        if WORLD == 1:
            tl.store(out_ptr + orow * HEAD_D + cols, o.to(out_ptr.dtype.element_ty))
            tl.store(lse_ptr + orow + offs_c, tl.full([DCH], 0.0, tl.float32) + lse, mask=(offs_c == 0) & (cols < DCH))
        else:
            po = fl64 | (o.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)
            pl = fl64 | ((tl.full([DCH], 0.0, tl.float32) + lse).to(tl.int32, bitcast=True).to(tl.int64)
                         & 0xFFFFFFFF)
            slot = (par * WORLD + me) * maxitems + it
            for k in tl.static_range(WORLD):
                dst = (me + k) % WORLD
                tl.store(dl.symm_at(llo_ptr + (slot * BLOCK_H + g) * HEAD_D + cols, dst), po)
                tl.store(dl.symm_at(lll_ptr + slot * BLOCK_H + g + offs_c, dst), pl,
                         mask=(offs_c == 0) & (cols < DCH))
    if WORLD > 1:
        for u in range(pid, nunits, nprog):
            it = u // (G * DSPLIT)
            g = (u // DSPLIT) % G
            cols = (u % DSPLIT) * DCH + offs_c
            acc = tl.full([DCH], 0.0, tl.float32)
            s = 0.0
            mx = EMPTY_LSE
            for q in tl.static_range(WORLD):
                slot = (par * WORLD + q) * maxitems + it
                po_p = llo_ptr + (slot * BLOCK_H + g) * HEAD_D + cols
                pl_p = lll_ptr + slot * BLOCK_H + g + offs_c
                if WAIT:
                    pko = tl.reshape(ll_poll(po_p[None, :], offs_c[None, :] < DCH, flag), [DCH])
                    pkl = tl.reshape(ll_poll(pl_p[None, :], offs_c[None, :] < 1, flag), [DCH])
                else:
                    pko = tl.load(po_p)
                    pkl = tl.load(pl_p, mask=offs_c < 1, other=0)
                lse_q = tl.reduce(tl.where(offs_c < 1, pkl.to(tl.int32).to(tl.float32, bitcast=True),
                                           float("-inf")), 0, _fmax)
                acc, s, mx = _merge(acc, s, mx, pko.to(tl.int32).to(tl.float32, bitcast=True), lse_q)
            orow = (it * G + g).to(tl.int64)
            tl.store(out_ptr + orow * HEAD_D + cols, (acc / s).to(out_ptr.dtype.element_ty))
            tl.store(lse_ptr + orow + offs_c, tl.full([DCH], 0.0, tl.float32) + (mx + tl.log(s)),
                     mask=(offs_c == 0) & (cols < DCH))
        epoch_end(calls_ptr)


# ===========================================================================
# host API
# ===========================================================================

class FlashDecodeContext(CollectiveContext):
    """LL buffers of :func:`flash_decode` (see :func:`create_flash_decode_context`)."""

    op = "flash_decode"
    creator = "create_flash_decode_context"

    def __init__(self, max_batch, q_heads, kv_heads, head_dim, dtype, world=None):
        if dtype not in _DTYPES:
            raise ditron.DitronError(f"flash_decode: dtype {dtype} is not supported (use float16 or bfloat16)")
        if q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
            raise ditron.DitronError(f"flash_decode: q_heads={q_heads} must be a positive multiple of "
                                     f"kv_heads={kv_heads} (GQA)")
        if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
            raise ditron.DitronError(f"flash_decode: head_dim={head_dim} must be a power of two in [16, 256]")
        super().__init__(int(max_batch) * q_heads * head_dim, dtype, world)
        w = self.world
        if w.nnodes > 1 or w.local_world_size != w.world_size:
            raise ditron.DitronError(f"flash_decode: the world spans {w.nnodes} nodes; the partials travel by "
                                     "load/store and need every rank on one node")
        self.max_batch, self.q_heads, self.kv_heads, self.head_dim = int(max_batch), q_heads, kv_heads, head_dim
        self.group = q_heads // kv_heads
        self.numel_factor = 1 << 30        # the cache's capacity is the caller's; shapes are checked per dimension
        self.block_h = max(16, next_pow2(self.group))
        self.maxitems = self.max_batch * kv_heads
        self.sim = w.backend == "sim"
        W = self.world_size
        n = 2 * W * self.maxitems if W > 1 else 1
        self.llo = self.symm((n * self.block_h * head_dim,), torch.int64, "llo")
        self.lll = self.symm((n * self.block_h,), torch.int64, "lll")
        # world size 1, fused combine: one arrival counter per item (each call's last program resets its item's)
        self.cnt = torch.zeros((self.maxitems,), dtype=torch.int32, device=self.device)
        ditron.barrier_all()

    def __repr__(self):
        return (f"FlashDecodeContext(max_batch={self.max_batch}, heads={self.q_heads}/{self.kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, world_size={self.world_size})")


def create_flash_decode_context(max_batch, q_heads, kv_heads, head_dim, dtype, world=None):
    """Allocate (collectively) the LL buffers of :func:`flash_decode` for up
    to ``max_batch`` sequences of ``q_heads`` / ``kv_heads`` heads."""
    return FlashDecodeContext(max_batch, q_heads, kv_heads, head_dim, dtype, world)


def split_stages(block_n, head_dim):
    """Pipeline stages of the split kernel: K and V tiles of ``block_n`` keys per stage within ~200 KiB of
    shared memory (4 stages at 64 keys of head dim 128, 3 at 128)."""
    per_stage = 2 * block_n * head_dim * 2
    return max(1, min(GPU_STAGES, (200 << 10) // per_stage))


def default_splits(ctx, items, cap, block_n):
    """Splits per (sequence, KV head), at least one tile each.  Few items (batch 1-8 of 8 KV heads): one
    program per SM, ``SMs // items`` splits each (its 4-stage pipeline keeps enough bytes in flight, and
    more, shorter splits pay the pipeline fill again on a loop of a few tiles: on one H100 at batch 1,
    16 splits gave 0.82 / 0.91 of the copy bandwidth at 32k / 64k keys, 33 splits 0.79 / 0.89, 66 splits
    0.75 / 0.87); otherwise about 4 programs per SM."""
    if ctx.sim:
        return max(1, min(3, cdiv(cap, block_n)))
    sms = sm_count(ctx.device)
    ns = sms // items if 2 * items <= sms else cdiv(4 * sms, items)
    return max(1, min(cdiv(cap, block_n), ns))


def combine_shape(ctx, items, nsplit):
    """(``DSPLIT``, ``SPLIT_CHUNK``, programs) of the combine kernel: column slices per query-head row
    (more units when there are few rows), splits per load, and the grid (one program per unit at world
    size 1; at most one per SM with several ranks, whose programs push every unit before they poll)."""
    D = ctx.head_dim
    rows = items * ctx.group
    if ctx.sim:
        # two slices of a row and two splits per load: the sliced stores, the chunk loop and its masked tail
        # all run on the simulator's tiny shapes
        dsplit = 2 if D >= 16 else 1
        return dsplit, 2, min(rows * dsplit, 2)
    sms = sm_count(ctx.device)
    dsplit = 1
    while dsplit < 4 and D // (2 * dsplit) >= 16 and rows * dsplit < 4 * sms:
        dsplit *= 2
    chunk = max(2, min(64, next_pow2(nsplit)))
    units = rows * dsplit
    progs = units if ctx.world_size == 1 else min(units, sms)
    return dsplit, chunk, progs


def flash_decode(q, k_cache, v_cache, lens, ctx: FlashDecodeContext, sm_scale=None, return_lse=False, out=None,
                 splits=None, block_n=None, num_warps=None, num_stages=None, fuse_combine=None,
                 _plant_no_wait=False):
    """Attention of one query token per sequence over the KV cache of every
    rank (module docstring).  Collective: every rank calls it with the same
    ``q`` shape and tuning arguments (``lens`` and the cache capacity may
    differ).  Tuning (GPUs; None: the defaults): ``splits`` per (sequence,
    KV head), ``block_n`` keys per tile, ``num_warps`` / ``num_stages`` of
    the split kernel, ``fuse_combine`` (world size 1, at most
    :data:`FUSE_MAX_SPLITS` splits: the split kernel's last program per item
    combines, no second launch; None: :data:`GPU_FUSE_COMBINE` on GPUs, off on
    the simulator).  Returns ``out`` ``[B, Hq, D]`` or ``(out, lse)``."""
    E = ditron.DitronError
    enter(ctx, FlashDecodeContext, "flash_decode",
          [("q.shape", tuple(q.shape) if isinstance(q, torch.Tensor) else None), ("splits", splits),
           ("block_n", block_n), ("num_warps", num_warps), ("num_stages", num_stages),
           ("fuse_combine", fuse_combine)], q=q, k_cache=k_cache, v_cache=v_cache, out=out)
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise E("flash_decode: argument 'q' must be a 3-D tensor [batch, q_heads, head_dim]")
    B, HQ, D = q.shape
    if HQ != ctx.q_heads or D != ctx.head_dim or B > ctx.max_batch or B < 1:
        raise E(f"flash_decode: q is {tuple(q.shape)}; the context was created for up to {ctx.max_batch} sequences "
                f"of {ctx.q_heads} heads of dimension {ctx.head_dim}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        ctx.check_tensor(t, name)
    if k_cache.dim() != 4 or tuple(k_cache.shape) != tuple(v_cache.shape) or k_cache.shape[0] != B or \
            k_cache.shape[1] != ctx.kv_heads or k_cache.shape[3] != D:
        raise E(f"flash_decode: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must both be "
                f"[batch={B}, kv_heads={ctx.kv_heads}, capacity, head_dim={D}]")
    if not isinstance(lens, torch.Tensor) or lens.dtype != torch.int32 or tuple(lens.shape) != (B,) or \
            lens.device != q.device:
        raise E(f"flash_decode: lens must be an int32 tensor [{B}] on {q.device} (this rank's context lengths)")
    cap = k_cache.shape[2]
    G, HKV = ctx.group, ctx.kv_heads
    items = B * HKV
    bn = block_n or (SIM_BLOCK_N if ctx.sim else GPU_BLOCK_N)
    if bn < 16 or bn & (bn - 1):
        raise E(f"flash_decode: block_n={bn} must be a power of two >= 16")
    ns = int(splits or default_splits(ctx, items, max(cap, 1), bn))
    if ns < 1:
        raise E("flash_decode: splits must be >= 1")
    fuse = (GPU_FUSE_COMBINE and not ctx.sim and ctx.world_size == 1 and ns <= FUSE_MAX_SPLITS) \
        if fuse_combine is None else bool(fuse_combine)
    if fuse and (ctx.world_size > 1 or ns > FUSE_MAX_SPLITS):
        raise E(f"flash_decode: fuse_combine needs world size 1 and at most {FUSE_MAX_SPLITS} splits "
                f"(world size {ctx.world_size}, {ns} splits)")
    if out is None:
        out = torch.empty_like(q)
    else:
        ctx.check_tensor(out, "out", numel=q.numel())
    lse = torch.empty((B, HQ), dtype=torch.float32, device=q.device)
    po = torch.empty((items * ns * ctx.block_h * D,), dtype=torch.float32, device=q.device)
    pl = torch.empty((items * ns * ctx.block_h,), dtype=torch.float32, device=q.device)
    scale = (1.0 / math.sqrt(D)) if sm_scale is None else float(sm_scale)
    flash_decode_split_kernel[(ns, items)](q, k_cache, v_cache, lens, po, pl, max(cap, 1), ns,
                                           scale * 1.4426950408889634, out, lse, ctx.cnt, G=G, HKV=HKV, HEAD_D=D,
                                           BLOCK_H=ctx.block_h, BLOCK_N=bn, FUSE=fuse,
                                           SPLIT_CHUNK=max(2, next_pow2(ns)) if fuse else 16,
                                           num_warps=1 if ctx.sim else (num_warps or GPU_WARPS),
                                           num_stages=1 if ctx.sim else (num_stages or split_stages(bn, D)))
    if fuse:
        return (out, lse) if return_lse else out
    dsplit, chunk, progs = combine_shape(ctx, items, ns)
    flash_decode_combine_kernel[(progs,)](po, pl, out, lse, ctx.llo, ctx.lll, ctx.calls, items, ns, ctx.maxitems,
                                          G=G, WORLD=ctx.world_size, HEAD_D=D, BLOCK_H=ctx.block_h,
                                          DSPLIT=dsplit, SPLIT_CHUNK=chunk, WAIT=not _plant_no_wait,
                                          num_warps=1 if ctx.sim else 4)
    return (out, lse) if return_lse else out


__all__ = ["FlashDecodeContext", "create_flash_decode_context", "flash_decode"]
