"""Attention tiles of the decoder step: q/k-norm + RoPE with the paged KV append, flash-decoding splits and
their combine.  Conventions: :mod:`.tiles`."""
from __future__ import annotations

import triton
import triton.language as tl



@triton.jit
def _kv_rows(bt_ptr, b, pos, layer, num_pages, max_pages, KH, kvh, PAGE: tl.constexpr, mask):
    """int64 row index (in units of ``HEAD_D``) of positions ``pos`` of sequence ``b``, kv head ``kvh`` in the
    paged cache ``[L, num_pages, PAGE, KH, HEAD_D]``: page ``block_table[b, pos // PAGE]``, row ``pos % PAGE``."""
    page = tl.load(bt_ptr + b * max_pages + pos // PAGE, mask=mask, other=0).to(tl.int64)
    return ((layer.to(tl.int64) * num_pages + page) * PAGE + pos % PAGE) * KH + kvh


@triton.jit
def _rope_head(j, b, kvh, qkv_ptr, qn_ptr, kn_ptr, q_ptr, kc_ptr, vc_ptr, cache, pos, layer, QH, KH, G, eps,
               inv_ptr, HEAD_D: tl.constexpr, BLOCK_H: tl.constexpr, QK_NORM: tl.constexpr):
    """Head ``j`` of kv group ``kvh`` of batch row ``b`` (:func:`qk_norm_rope_tile`); ``cache``: the row offset
    (elements) of position ``pos`` of the sequence's kv head ``kvh`` in the paged cache."""
    HALF: tl.constexpr = HEAD_D // 2
    i = tl.arange(0, BLOCK_H)
    m = i < HALF
    if j < G:
        head = kvh * G + j
    elif j == G:
        head = QH + kvh
    else:
        head = QH + KH + kvh
    src = qkv_ptr + (b * (QH + 2 * KH) + head) * HEAD_D
    x1 = tl.load(src + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=m, other=0.0).to(tl.float32)
    if j == G + 1:
        tl.store(vc_ptr + cache + i, x1.to(vc_ptr.dtype.element_ty), mask=m)
        tl.store(vc_ptr + cache + HALF + i, x2.to(vc_ptr.dtype.element_ty), mask=m)
    else:
        if QK_NORM:
            if j < G:
                w1 = tl.load(qn_ptr + layer * HEAD_D + i, mask=m, other=0.0).to(tl.float32)
                w2 = tl.load(qn_ptr + layer * HEAD_D + HALF + i, mask=m, other=0.0).to(tl.float32)
            else:
                w1 = tl.load(kn_ptr + layer * HEAD_D + i, mask=m, other=0.0).to(tl.float32)
                w2 = tl.load(kn_ptr + layer * HEAD_D + HALF + i, mask=m, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HEAD_D + eps)
            y1 = (x1 * rstd * w1).to(tl.bfloat16).to(tl.float32)
            y2 = (x2 * rstd * w2).to(tl.bfloat16).to(tl.float32)
        else:
            y1 = x1
            y2 = x2
        inv_freq = tl.load(inv_ptr + i, mask=m, other=0.0)
        ang = pos.to(tl.float32) * inv_freq
        c = tl.cos(ang)
        s = tl.sin(ang)
        o1 = y1 * c - y2 * s
        o2 = y2 * c + y1 * s
        if j < G:
            dst = q_ptr + (b * QH + head) * HEAD_D
            tl.store(dst + i, o1.to(q_ptr.dtype.element_ty), mask=m)
            tl.store(dst + HALF + i, o2.to(q_ptr.dtype.element_ty), mask=m)
        else:
            tl.store(kc_ptr + cache + i, o1.to(kc_ptr.dtype.element_ty), mask=m)
            tl.store(kc_ptr + cache + HALF + i, o2.to(kc_ptr.dtype.element_ty), mask=m)


@triton.jit
def qk_norm_rope_tile(tile, qkv_ptr, qn_ptr, kn_ptr, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, layer, B, QH, KH,
                      num_pages, max_pages, eps, inv_ptr, PAGE: tl.constexpr, HEAD_D: tl.constexpr,
                      BLOCK_H: tl.constexpr, QK_NORM: tl.constexpr):
    """One head of one batch row of the QKV output ``[B, (QH + 2 KH) * D]`` (q heads, k heads, v heads).
    Tiles are ordered ``(b, kv head, j)`` with ``j < G``: q head ``kvh * G + j``, ``j == G``: k head ``kvh``,
    ``j == G + 1``: v head ``kvh`` (``G = QH / KH``), so the tiles one attention tile needs are contiguous.
    :func:`qk_norm_rope_group_tile`: one tile per ``(b, kv head)`` instead.
    q / k: per-head RMSNorm with ``qn[layer]`` / ``kn[layer]`` (rounded to bf16 like Qwen3's q_norm / k_norm),
    then rotary embedding (rotate-half form, angle ``pos * inv_freq[i]`` in float32, ``inv_ptr``: the ``[D / 2]`` float32
    table of :meth:`~.config.DecoderConfig.inv_freq`, RoPE scaling included); ``QK_NORM=False`` (Llama): no q / k norm at ``pos = seq[b] - 1``;
    q goes to ``q[B, QH, D]``, k and v to the paged cache at position ``pos`` of sequence ``b`` (:func:`_kv_rows`).
    """
    _rope_group(tile, qkv_ptr, qn_ptr, kn_ptr, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, layer, QH, KH, num_pages,
                max_pages, eps, inv_ptr, PAGE, HEAD_D, BLOCK_H, False, QK_NORM)


@triton.jit
def qk_norm_rope_group_tile(tile, qkv_ptr, qn_ptr, kn_ptr, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, layer, B, QH, KH,
                            num_pages, max_pages, eps, inv_ptr, PAGE: tl.constexpr, HEAD_D: tl.constexpr,
                            BLOCK_H: tl.constexpr, QK_NORM: tl.constexpr):
    """:func:`qk_norm_rope_tile` with one tile per ``(b, kv head)`` doing all ``G + 2`` heads of the group
    (``TileConfig.rope_group``: ``G + 2`` times fewer tiles, one rope dependency per attention tile)."""
    _rope_group(tile, qkv_ptr, qn_ptr, kn_ptr, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, layer, QH, KH, num_pages,
                max_pages, eps, inv_ptr, PAGE, HEAD_D, BLOCK_H, True, QK_NORM)


@triton.jit
def _rope_group(tile, qkv_ptr, qn_ptr, kn_ptr, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, layer, QH, KH, num_pages,
                max_pages, eps, inv_ptr, PAGE: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_H: tl.constexpr,
                GROUP: tl.constexpr, QK_NORM: tl.constexpr):
    G = QH // KH
    if GROUP:
        bh = tile
    else:
        bh = tile // (G + 2)
    b = bh // KH
    kvh = bh % KH
    pos = tl.load(seq_ptr + b) - 1
    cache = _kv_rows(bt_ptr, b, pos, layer, num_pages, max_pages, KH, kvh, PAGE, pos >= 0) * HEAD_D
    if GROUP:
        for j in range(0, G + 2):
            _rope_head(j, b, kvh, qkv_ptr, qn_ptr, kn_ptr, q_ptr, kc_ptr, vc_ptr, cache, pos, layer, QH, KH, G, eps,
                       inv_ptr, HEAD_D, BLOCK_H, QK_NORM)
    else:
        _rope_head(tile % (G + 2), b, kvh, qkv_ptr, qn_ptr, kn_ptr, q_ptr, kc_ptr, vc_ptr, cache, pos, layer, QH,
                   KH, G, eps, inv_ptr, HEAD_D, BLOCK_H, QK_NORM)


@triton.jit
def _attn_block(p0, q, m_i, l_i, acc, kc_ptr, vc_ptr, bt_ptr, b, layer, num_pages, max_pages, KH, kvh, stop,
                sm_scale, offs_d, md, PAGE: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_P: tl.constexpr,
                EARLY_V: tl.constexpr):
    """One online-softmax step of :func:`attn_split_tile` over positions ``[p0, p0 + BLOCK_P)`` (``< stop``);
    ``EARLY_V``: the V block's load is issued with K's, before the scores (both in flight at once)."""
    offs_p = p0 + tl.arange(0, BLOCK_P)
    mp = offs_p < stop
    rows = _kv_rows(bt_ptr, b, offs_p, layer, num_pages, max_pages, KH, kvh, PAGE, mp)
    kv_off = rows[:, None] * HEAD_D + offs_d[None, :]
    kv_mask = mp[:, None] & md[None, :]
    k = tl.load(kc_ptr + kv_off, mask=kv_mask, other=0.0)
    if EARLY_V:
        v = tl.load(vc_ptr + kv_off, mask=kv_mask, other=0.0)
    sc = tl.dot(q, tl.trans(k)) * sm_scale
    sc = tl.where(mp[None, :], sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(sc - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if not EARLY_V:
        v = tl.load(vc_ptr + kv_off, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _v_block(p0, vc_ptr, bt_ptr, b, layer, num_pages, max_pages, KH, kvh, stop, offs_d, md, PAGE: tl.constexpr,
             HEAD_D: tl.constexpr, BLOCK_P: tl.constexpr):
    """The V rows of positions ``[p0, p0 + BLOCK_P)`` (``< stop``; zeros past it) of :func:`attn_split_tile`."""
    offs_p = p0 + tl.arange(0, BLOCK_P)
    mp = offs_p < stop
    rows = _kv_rows(bt_ptr, b, offs_p, layer, num_pages, max_pages, KH, kvh, PAGE, mp)
    return tl.load(vc_ptr + rows[:, None] * HEAD_D + offs_d[None, :], mask=mp[:, None] & md[None, :], other=0.0)


@triton.jit
def _attn_block_v(p0, v, q, m_i, l_i, acc, kc_ptr, bt_ptr, b, layer, num_pages, max_pages, KH, kvh, stop, sm_scale,
                  offs_d, md, PAGE: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_P: tl.constexpr):
    """:func:`_attn_block` with the block's V rows ``v`` loaded before (one block ahead, in registers)."""
    offs_p = p0 + tl.arange(0, BLOCK_P)
    mp = offs_p < stop
    rows = _kv_rows(bt_ptr, b, offs_p, layer, num_pages, max_pages, KH, kvh, PAGE, mp)
    k = tl.load(kc_ptr + rows[:, None] * HEAD_D + offs_d[None, :], mask=mp[:, None] & md[None, :], other=0.0)
    sc = tl.dot(q, tl.trans(k)) * sm_scale
    sc = tl.where(mp[None, :], sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(sc - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def attn_split_tile(tile, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, o_ptr, lse_ptr, layer, B, QH, KH, num_pages,
                    max_pages, nsplit, sm_scale, PAGE: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_G: tl.constexpr, SPLIT: tl.constexpr, BLOCK_P: tl.constexpr):
    """Flash-decoding partial: tile ``(b, kvh, s)`` (``s`` fastest) attends the ``G`` q heads of kv head ``kvh``
    over positions ``[s * SPLIT, min((s + 1) * SPLIT, seq[b]))`` of sequence ``b`` (each position's page looked
    up in the block table, :func:`_kv_rows`; splits past a short sequence's context are empty).  K and V are read
    once for the ``G`` q heads (one ``[BLOCK_G, D] x [D, BLOCK_P]`` product).  Writes the normalised partial
    output ``o[b, h, s, :]`` (float32) and its log-sum-exp ``lse[b, h, s]`` (``-inf`` for an empty split).
    :func:`attn_split_pipe_tile`: the same with the loop over positions software-pipelined."""
    _attn_split(tile, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, o_ptr, lse_ptr, layer, QH, KH, num_pages, max_pages,
                nsplit, sm_scale, PAGE, HEAD_D, BLOCK_D, BLOCK_G, SPLIT, BLOCK_P, 0, False, False, q_ptr, q_ptr, 0.0,
                q_ptr, True)


@triton.jit
def attn_split_pipe_tile(tile, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, o_ptr, lse_ptr, layer, B, QH, KH, num_pages,
                         max_pages, nsplit, sm_scale, PAGE: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_G: tl.constexpr, SPLIT: tl.constexpr, BLOCK_P: tl.constexpr, STAGES: tl.constexpr,
                         PREFETCH_V: tl.constexpr):
    """:func:`attn_split_tile` with the loop over ``BLOCK_P`` positions as ``tl.range(..., num_stages=STAGES)``
    (``TileConfig.attn_stages``; 0: a plain loop): Triton's software pipeliner copies the next blocks' K (and
    their page indices) into shared memory (``cp.async``) while the current block is reduced, and each block's V
    load is issued with its K load (before the scores), so both are in flight at once.  ``PREFETCH_V``
    (``TileConfig.attn_prefetch_v``): the next block's V rows are loaded into registers while the current block
    is reduced (Triton 3.6 does not pipeline V, the second product's operand, into shared memory)."""
    _attn_split(tile, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, o_ptr, lse_ptr, layer, QH, KH, num_pages, max_pages,
                nsplit, sm_scale, PAGE, HEAD_D, BLOCK_D, BLOCK_G, SPLIT, BLOCK_P, STAGES, PREFETCH_V, False, q_ptr,
                q_ptr, 0.0, q_ptr, True)


@triton.jit
def attn_rope_split_tile(tile, qkv_ptr, qn_ptr, kn_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, o_ptr, lse_ptr, layer, B, QH,
                         KH, num_pages, max_pages, nsplit, sm_scale, eps, inv_ptr, PAGE: tl.constexpr,
                         HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr, SPLIT: tl.constexpr,
                         BLOCK_P: tl.constexpr, STAGES: tl.constexpr, PREFETCH_V: tl.constexpr,
                         QK_NORM: tl.constexpr):
    """:func:`attn_split_pipe_tile` with the rope stage fused in (``TileConfig.attn_fuse_rope``): tile ``(b, kvh,
    s)`` reads its ``G`` q heads from the QKV output ``[B, (QH + 2 KH) * D]`` and applies q_norm and RoPE in
    registers (as :func:`qk_norm_rope_tile` does, bf16-rounded the same way); the one split whose positions hold
    the new token's (``seq[b] - 1``) also normalises / rotates k and appends k and v to the paged cache before its
    loop reads them.  No rope tiles and no ``q`` buffer: the attention tiles wait on the QKV tiles of their group's
    q, k and v heads."""
    _attn_split(tile, qkv_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, o_ptr, lse_ptr, layer, QH, KH, num_pages, max_pages,
                nsplit, sm_scale, PAGE, HEAD_D, BLOCK_D, BLOCK_G, SPLIT, BLOCK_P, STAGES, PREFETCH_V, True, qn_ptr,
                kn_ptr, eps, inv_ptr, QK_NORM)


@triton.jit
def _qk_norm_rope(src_ptr, rows, mr, w_ptr, pos, eps, inv_ptr, offs_d, HEAD_D: tl.constexpr, QK_NORM: tl.constexpr):
    """float32 ``[R, BLOCK_D]``: RMSNorm (weights ``w[HEAD_D]``, rounded to bf16) and RoPE at position ``pos`` of the
    heads starting at elements ``rows`` (``[R]``, masked by ``mr``) of ``src``: :func:`qk_norm_rope_tile`'s maths
    on whole rows (element ``d``'s rotate-half partner ``d +- D/2`` loaded alongside)."""
    HALF: tl.constexpr = HEAD_D // 2
    md = offs_d < HEAD_D
    lo = offs_d < HALF
    dp = tl.where(lo, offs_d + HALF, offs_d - HALF)
    m = mr[:, None] & md[None, :]
    x = tl.load(src_ptr + rows[:, None] + offs_d[None, :], mask=m, other=0.0).to(tl.float32)
    xp = tl.load(src_ptr + rows[:, None] + dp[None, :], mask=m, other=0.0).to(tl.float32)
    if QK_NORM:
        w = tl.load(w_ptr + offs_d, mask=md, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + dp, mask=md, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_D + eps)
        y = (x * rstd[:, None] * w[None, :]).to(tl.bfloat16).to(tl.float32)
        yp = (xp * rstd[:, None] * wp[None, :]).to(tl.bfloat16).to(tl.float32)
    else:
        y = x
        yp = xp
    i = tl.where(lo, offs_d, offs_d - HALF)
    ang = pos.to(tl.float32) * tl.load(inv_ptr + i, mask=md, other=0.0)
    sign = tl.where(lo, -1.0, 1.0)
    return y * tl.cos(ang)[None, :] + sign[None, :] * yp * tl.sin(ang)[None, :]


@triton.jit
def _attn_split(tile, q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, o_ptr, lse_ptr, layer, QH, KH, num_pages, max_pages,
                nsplit, sm_scale, PAGE: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_G: tl.constexpr, SPLIT: tl.constexpr, BLOCK_P: tl.constexpr, STAGES: tl.constexpr,
                PREFETCH_V: tl.constexpr, FUSE_ROPE: tl.constexpr, qn_ptr, kn_ptr, eps, inv_ptr,
                QK_NORM: tl.constexpr):
    """The flash-decoding tiles' body; ``FUSE_ROPE``: ``q_ptr`` is the QKV output and the tile does the rope
    stage's work itself (:func:`attn_rope_split_tile`)."""
    s = tile % nsplit
    bh = tile // nsplit
    b = bh // KH
    kvh = bh % KH
    G = QH // KH
    seq = tl.load(seq_ptr + b)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mg = offs_g < G
    md = offs_d < HEAD_D
    heads = b * QH + kvh * G + offs_g
    start = s * SPLIT
    stop = tl.minimum(start + SPLIT, seq)
    if FUSE_ROPE:
        pos = seq - 1
        row0 = (b * (QH + 2 * KH) + kvh * G) * HEAD_D                # q head kvh * G of row b of the QKV output
        q = _qk_norm_rope(q_ptr, row0 + offs_g * HEAD_D, mg, qn_ptr + layer * HEAD_D, pos, eps, inv_ptr, offs_d,
                          HEAD_D, QK_NORM).to(kc_ptr.dtype.element_ty)
        if (pos >= start) & (pos < start + SPLIT):                  # this split appends the new position's k, v
            krow = (b * (QH + 2 * KH) + QH + kvh) * HEAD_D
            one = offs_g == 0
            k_new = _qk_norm_rope(q_ptr, krow + offs_g * 0, one, kn_ptr + layer * HEAD_D, pos, eps, inv_ptr,
                                  offs_d, HEAD_D, QK_NORM)
            cache = _kv_rows(bt_ptr, b, pos, layer, num_pages, max_pages, KH, kvh, PAGE, pos >= 0) * HEAD_D
            tl.store(kc_ptr + cache + offs_g[:, None] * 0 + offs_d[None, :], k_new.to(kc_ptr.dtype.element_ty),
                     mask=one[:, None] & md[None, :])
            v_new = tl.load(q_ptr + krow + KH * HEAD_D + offs_d, mask=md, other=0.0)
            tl.store(vc_ptr + cache + offs_d, v_new.to(vc_ptr.dtype.element_ty), mask=md)
            tl.debug_barrier()              # the loop below reads the appended row (other threads of this program)
    else:
        q = tl.load(q_ptr + heads[:, None] * HEAD_D + offs_d[None, :], mask=mg[:, None] & md[None, :], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    if PREFETCH_V:
        v_nx = _v_block(start, vc_ptr, bt_ptr, b, layer, num_pages, max_pages, KH, kvh, stop, offs_d, md, PAGE,
                        HEAD_D, BLOCK_P)
        if STAGES > 0:
            for p0 in tl.range(start, stop, BLOCK_P, num_stages=STAGES):
                v = v_nx
                v_nx = _v_block(p0 + BLOCK_P, vc_ptr, bt_ptr, b, layer, num_pages, max_pages, KH, kvh, stop, offs_d,
                                md, PAGE, HEAD_D, BLOCK_P)
                m_i, l_i, acc = _attn_block_v(p0, v, q, m_i, l_i, acc, kc_ptr, bt_ptr, b, layer, num_pages,
                                              max_pages, KH, kvh, stop, sm_scale, offs_d, md, PAGE, HEAD_D, BLOCK_P)
        else:
            for p0 in range(start, stop, BLOCK_P):
                v = v_nx
                v_nx = _v_block(p0 + BLOCK_P, vc_ptr, bt_ptr, b, layer, num_pages, max_pages, KH, kvh, stop, offs_d,
                                md, PAGE, HEAD_D, BLOCK_P)
                m_i, l_i, acc = _attn_block_v(p0, v, q, m_i, l_i, acc, kc_ptr, bt_ptr, b, layer, num_pages,
                                              max_pages, KH, kvh, stop, sm_scale, offs_d, md, PAGE, HEAD_D, BLOCK_P)
    elif STAGES > 0:
        for p0 in tl.range(start, stop, BLOCK_P, num_stages=STAGES):
            m_i, l_i, acc = _attn_block(p0, q, m_i, l_i, acc, kc_ptr, vc_ptr, bt_ptr, b, layer, num_pages, max_pages,
                                        KH, kvh, stop, sm_scale, offs_d, md, PAGE, HEAD_D, BLOCK_P, True)
    else:
        for p0 in range(start, stop, BLOCK_P):
            m_i, l_i, acc = _attn_block(p0, q, m_i, l_i, acc, kc_ptr, vc_ptr, bt_ptr, b, layer, num_pages, max_pages,
                                        KH, kvh, stop, sm_scale, offs_d, md, PAGE, HEAD_D, BLOCK_P, False)
    nonempty = l_i > 0
    lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    part = heads * nsplit + s
    tl.store(o_ptr + part[:, None] * HEAD_D + offs_d[None, :], out, mask=mg[:, None] & md[None, :])
    tl.store(lse_ptr + part, lse, mask=mg)


@triton.jit
def _combine_head(hd, o_ptr, lse_ptr, out_ptr, nsplit, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_S: tl.constexpr):
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    ms = offs_s < nsplit
    md = offs_d < HEAD_D
    lse = tl.load(lse_ptr + hd * nsplit + offs_s, mask=ms, other=float("-inf"))
    mx = tl.max(lse, axis=0)                       # split 0 is never empty (seq >= 1)
    w = tl.exp(lse - mx)
    o = tl.load(o_ptr + (hd * nsplit + offs_s)[:, None] * HEAD_D + offs_d[None, :], mask=ms[:, None] & md[None, :],
                other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + hd * HEAD_D + offs_d, out.to(out_ptr.dtype.element_ty), mask=md)


@triton.jit
def attn_combine_tile(tile, o_ptr, lse_ptr, out_ptr, nsplit, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_S: tl.constexpr):
    """Head ``tile`` (``b * QH + h``): combines the ``nsplit`` flash-decoding partials by their log-sum-exp
    weights into ``out[b, h * D:(h + 1) * D]`` (bf16; ``out`` is ``[B, QH * D]``, the o_proj input)."""
    _combine_head(tile, o_ptr, lse_ptr, out_ptr, nsplit, HEAD_D, BLOCK_D, BLOCK_S)


@triton.jit
def attn_combine_group_tile(tile, o_ptr, lse_ptr, out_ptr, nsplit, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_S: tl.constexpr, GROUP: tl.constexpr):
    """:func:`attn_combine_tile` of heads ``[tile * GROUP, +GROUP)`` (``TileConfig.comb_group``: ``GROUP = G``,
    the q heads of one kv head, whose partials one row of attention tiles wrote)."""
    for g in tl.static_range(GROUP):
        _combine_head(tile * GROUP + g, o_ptr, lse_ptr, out_ptr, nsplit, HEAD_D, BLOCK_D, BLOCK_S)
