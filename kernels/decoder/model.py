"""The decoder step as a task graph, and the megakernel built from it.

:func:`decoder_tasks` lists the step's tasks (:class:`TaskSpec`: tile
function, tiles, arguments, reads / writes, tile-range dependencies) for one
rank; :func:`build_megakernel` registers them in a :class:`ditron.task.TaskGraph`
(the two all-reduces of each layer through ``ditron.task.comm.all_reduce``)
and compiles one persistent kernel.  Per layer ``l`` (``j = 2l`` / ``2l + 1``
index the stacked norm weights)::

    qkv.l      rms_linear_tile    cdiv(Nqkv, BN)   qkv = rms(resid + delta) @ Wqkv[l]^T  (resid + delta: x at l = 0)
    res_a.l    add_resid_tile     cdiv(B*H, BLK)   resid += delta (after every qkv.l tile read resid)
    rope.l     qk_norm_rope_tile  B*KH*(G+2)       q / k norm, RoPE, paged KV append <- the qkv tiles of its head
    attn.l     attn_split_tile    B*KH*S           flash-decoding split             <- rope tiles of its kv group
               (TileConfig.attn_fuse_rope: no rope.l; attn_rope_split_tile does its work <- the qkv tiles of its group)
    comb.l     attn_combine_tile  B*QH             combine the S splits             <- attn tiles of its head
    o.l        linear_tile        cdiv(H, BN)      partial = attn @ Wo[l]^T (fp32)  <- all of comb.l
    ar_attn.l  all-reduce                          delta = sum over ranks of partial (after res_a.l)
    gu.l       rms_gate_up_tile   cdiv(I_r, BN)    act = silu(h @ Wg^T) * (h @ Wu^T), h = rms(resid + delta)
    res_m.l    add_resid_tile     cdiv(B*H, BLK)   resid += delta (after every gu.l tile)
    down.l     linear_tile        cdiv(H, BN)      partial = act @ Wd[l]^T (fp32)
    ar_mlp.l   all-reduce                          delta = sum over ranks of partial (after res_m.l)
               (TileConfig.down_split_k = S > 1: down.l has cdiv(H, BN) * S split-K tiles writing partial_k[S, B, H],
               each after the gu.l tiles of its K slice; dsum.l (sum_splits_tile, one tile per all-reduce chunk)
               adds the slices into partial; ar_mlp.l tile i waits for dsum.l tile i)
    final      add_rmsnorm_tile   B tiles          resid += delta; out = h = rms(resid)

On one rank with ``TileConfig(direct_tp1=True)`` (``qwen3_8b()``'s default) there are no ``ar_attn.l`` / ``ar_mlp.l``
tasks: ``o.l`` and ``down.l`` (``dsum.l`` with split-K) write ``delta`` themselves, after the residual commit that
reads it (``res_a.l`` / ``res_m.l``), and the consumers wait for them instead.  With the norms fused in as well,
``TileConfig.fold_resid`` moves the residual commit into ``o.l`` / ``down.l`` (``linear_resid_tile``: no ``res_a`` /
``res_m`` tasks), and ``TileConfig.prenorm`` has them add their output to ``resid`` at once and write the next
norm's input ``hn = bf16(r * w)`` with per-tile sums of squares (``linear_resnorm_tile``), read by plain GEMV tiles
scaled by ``rstd`` (``linear_rstd_tile`` for ``qkv.l``, ``l > 0``; ``gate_up_rstd_tile``).  There o_proj, down_proj
and gate/up may have masked tiles of fewer columns than their width (``TileConfig.o_cols`` / ``down_cols`` /
``gate_up_cols``: ``cdiv(N, cols)`` tiles of ``cols`` columns each).

preceded by ``advance`` (one tile: ``seq[b] += 1`` for every sequence).  The KV cache is paged
(:class:`~.weights.PagedKV`: pages ``[L, num_pages, page_size, KH, D]`` and a block table ``[B, max_pages]``);
each sequence has its own context length (``seq[b]``), so a batch may be ragged.  With ``TileConfig(fuse_norm=False)``
(the default above batch 2)
the norms are tasks of their own (``norm_a.l`` / ``norm_m.l``: ``add_rmsnorm_tile``,
``B`` tiles, ``h = rms(resid += delta)``) and qkv / gate-up read ``h``.  Activation buffers are
shared by all layers (stacked weights + a ``layer`` scalar), so each task kind
is one branch of the generated kernel whatever the number of layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ditron.errors import DitronError

from . import tiles as T
from . import tiles_gemv as TG
from .config import DecoderConfig, cdiv, next_pow2
from . import tiles_head as TH
from .weights import Head, PagedKV, Weights, contexts


@dataclass
class TaskSpec:
    name: str
    fn: object
    num_tiles: int
    args: dict
    reads: tuple = ()
    writes: tuple = ()
    deps: list = field(default_factory=list)     # [(task name, None | "same" | callable[, inner])]
    scalars: dict = field(default_factory=dict)
    comm: Optional[str] = None                   # "all_reduce": args {"x", "out"} (registered by the comm helper)
    prefetch: object = None                      # prefetch hook (runs before the dependency wait)


@dataclass
class Buffers:
    """This rank's activation buffers (shared by every layer)."""
    x: torch.Tensor          # [B, H] bf16: the step's input hidden states
    resid: torch.Tensor      # [B, H] fp32: the residual stream
    delta: torch.Tensor      # [B, H] fp32: the last all-reduce's result
    partial: torch.Tensor    # [B, H] fp32: row-parallel partial sums (o_proj, down_proj)
    h: torch.Tensor          # [B, H] bf16: normalised activations; after the step: the output
    qkv: torch.Tensor        # [B, (QH + 2 KH) * D] bf16
    q: torch.Tensor          # [B, QH, D] bf16 (after q_norm and RoPE)
    o_part: torch.Tensor     # [B, QH, S, D] fp32: flash-decoding partials
    lse: torch.Tensor        # [B, QH, S] fp32
    attn: torch.Tensor       # [B, QH * D] bf16
    act: torch.Tensor        # [B, I_r] bf16
    seq: torch.Tensor        # [B] int32: each sequence's valid KV positions (its context length)
    partial_k: torch.Tensor = None   # [down_split_k, B, H] fp32: the split-K slices of down_proj (split only)
    hn: torch.Tensor = None          # [B, H] bf16: r * norm weight, the next GEMV's input (TileConfig.prenorm)
    ss_a: torch.Tensor = None        # [B, o tiles] fp32: o_proj tiles' partial sums of r^2 (prenorm)
    ss_m: torch.Tensor = None        # [B, down tiles] fp32: down_proj tiles' partial sums of r^2 (prenorm)
    # the model's ends (a Head: issue 53); the sampling parameters are per sequence, set between steps
    tok: torch.Tensor = None         # [B] int32: this step's input tokens; after the step: the sampled next tokens
    logits: torch.Tensor = None      # [B, V_r] bf16: this rank's LM-head output (vocab-parallel)
    cand_part: torch.Tensor = None   # [B, NSPLIT, 2K] fp32: each chunk's top candidates (values, column ids)
    cand: torch.Tensor = None        # [B, 2K] fp32: this rank's top candidates (values, token ids)
    cand_all: torch.Tensor = None    # [W, B, 2K] fp32: every rank's (the all-gather's output; cand at one rank)
    temperature: torch.Tensor = None  # [B] fp32 (<= 0: greedy)
    top_k: torch.Tensor = None       # [B] int32 (0: max_top_k)
    top_p: torch.Tensor = None       # [B] fp32 (1: off)
    seed: torch.Tensor = None        # [B] int32: the sampler's Philox seed per sequence


def make_buffers(cfg: DecoderConfig, world_size: int, batch: int, max_ctx: int, ctx, device,
                 symmetric: bool = False, head: Optional[Head] = None) -> Buffers:
    """This rank's activation buffers (``ctx``: the sequences' context lengths, an int or one per sequence;
    ``max_ctx``: positions a block table can hold); ``symmetric``: on the symmetric heap (``ditron.symm_zeros``),
    where the simulator's race finder checks every access (tests)."""
    sh = cfg.shard(world_size)
    B, H, D, S = batch, cfg.hidden, cfg.head_dim, sh.splits(max_ctx, batch)
    bf, f32 = torch.bfloat16, torch.float32

    def z(name, shape, dtype):
        if symmetric:
            import ditron
            return ditron.symm_zeros(shape, dtype, name=name)
        return torch.zeros(shape, dtype=dtype, device=device)
    buf = Buffers(x=z("x", (B, H), bf), resid=z("resid", (B, H), f32), delta=z("delta", (B, H), f32),
                  partial=z("partial", (B, H), f32), h=z("h", (B, H), bf), qkv=z("qkv", (B, sh.qkv_cols), bf),
                  q=z("q", (B, sh.q_heads, D), bf), o_part=z("o_part", (B, sh.q_heads, S, D), f32),
                  lse=z("lse", (B, sh.q_heads, S), f32), attn=z("attn", (B, sh.attn_cols), bf),
                  act=z("act", (B, sh.inter), bf), seq=z("seq", (B,), torch.int32))
    if cfg.tiles.down_split_k > 1:
        buf.partial_k = z("partial_k", (cfg.tiles.down_split_k, B, H), f32)
    if cfg.tiles.prenorm_for(B):
        dot = cfg.tiles.dot_for(B)
        buf.hn = z("hn", (B, H), bf)
        buf.ss_a = z("ss_a", (B, -(-H // cfg.tiles.cols("o", dot))), f32)
        buf.ss_m = z("ss_m", (B, -(-H // cfg.tiles.cols("down", dot))), f32)
    if head is not None:
        K = head.max_top_k
        buf.tok = z("tok", (B,), torch.int32)
        buf.logits = z("logits", (B, head.lm.shape[1]), bf)
        buf.cand_part = z("cand_part", (B, TH.topk_splits(head.lm.shape[1])[0], 2 * K), f32)
        buf.cand = z("cand", (B, 2 * K), f32)
        buf.cand_all = z("cand_all", (world_size, B, 2 * K), f32) if world_size > 1 else buf.cand
        buf.temperature = z("temperature", (B,), f32)
        buf.top_k = z("top_k", (B,), torch.int32)
        buf.top_p = z("top_p", (B,), f32)
        buf.top_p.fill_(1.0)
        buf.seed = z("seed", (B,), torch.int32)
    buf.seq.copy_(torch.tensor(contexts(ctx, B), dtype=torch.int32))
    return buf


def check_cache(cfg: DecoderConfig, world_size: int, cache: PagedKV, batch: int):
    """Shapes and dtypes of a :class:`PagedKV` for a compiled batch of ``batch`` sequences (at build time)."""
    sh = cfg.shard(world_size)
    k, v, bt = cache
    L, KH, D = cfg.n_layers, sh.kv_heads, cfg.head_dim
    if k.dim() != 5 or tuple(k.shape[:1] + k.shape[3:]) != (L, KH, D) or tuple(v.shape) != tuple(k.shape):
        raise DitronError(f"decoder: paged KV cache shapes k {tuple(k.shape)} / v {tuple(v.shape)}; expected "
                          f"[{L}, num_pages, page_size, {KH}, {D}] (layers, pages, positions per page, kv heads "
                          f"per rank, head_dim) for both")
    if bt.dim() != 2 or bt.dtype != torch.int32 or bt.shape[0] != batch:
        raise DitronError(f"decoder: block table {tuple(bt.shape)} {bt.dtype}; expected [{batch}, max_pages] int32 "
                          f"(one row of page indices per sequence of the compiled batch)")


def decoder_tasks(cfg: DecoderConfig, world_size: int, w: Weights, cache: PagedKV, buf: Buffers,
                  head: Optional[Head] = None) -> list:
    """The step's tasks on one rank, in topological order (``cache``: this rank's :class:`PagedKV`; ``head``: the
    token embedding before the layers and the LM head + sampler after the final norm, :func:`head_tasks`)."""
    sh = cfg.shard(world_size)
    tc = cfg.tiles
    B, H, D, L = buf.x.shape[0], cfg.hidden, cfg.head_dim, cfg.n_layers
    QH, KH, G, IL = sh.q_heads, sh.kv_heads, cfg.group, sh.inter
    k_cache, v_cache, bt = cache
    P, NP, MP = cache.page_size, cache.num_pages, cache.max_pages
    S = sh.splits(cache.max_ctx, B)
    dot = tc.dot_for(B)
    fuse = tc.fuse_for(B)
    BN = {p: tc.block_n(p, dot) for p in ("qkv", "o", "gate_up", "down")}
    wdot = dot and tc.gu_wdot > 0               # TileConfig.gu_wdot: gate/up weight rows on the MMA's M side
    ring = tc.ring_for(B)                       # the streamed tl.dot path's ring budget at this batch
    if wdot:
        BN["gate_up"] = tc.gu_wdot

    def prefetch_arg(proj):         # the GEMV tiles' PREFETCH_K (TileConfig.prefetch_for), where the hook runs
        pk = tc.prefetch_for(proj)
        return {"PREFETCH_K": pk} if pk else {}

    def gemv_c(proj):
        BB, BK, stream = max(tc.dot_pad, next_pow2(B)) if dot else next_pow2(B), tc.block_k(proj, dot), tc.stream_for(B)
        if dot and stream and ring:
            # pipeline depth from the ring's budget: a stage holds the weight rows (gate and up: twice) and the
            # activation rows of one K chunk (bf16; float32 resid and delta when the norm is fused in)
            stage = BK * (2 * BN[proj] * (2 if proj == "gate_up" else 1)
                          + BB * (8 if fuse and proj in ("qkv", "gate_up") else 2))
            stream = max(2, 1 + ring // stage)
        return dict(BLOCK_B=BB, BLOCK_N=BN[proj], BLOCK_K=BK, DOT=dot, STREAM=stream, **prefetch_arg(proj))

    def gemv_wdot_c():              # the gate/up tiles of TileConfig.gu_wdot (gate_up_wdot_tile)
        BB, BK, bn = max(8, next_pow2(B)), tc.gu_wdot_k or tc.dot_block_k, tc.gu_wdot
        stream = tc.stream_for(B)
        if stream and ring:      # a stage: 2 x bn weight rows and BB activation rows of one K chunk (bf16)
            while not tc.gu_wdot_k and BK > 64 and ring // (BK * 2 * (2 * bn + BB)) < 2:
                BK //= 2                # gu_wdot_k=0: chunks small enough for 2 in flight (batch 16: 128 deep)
            # Triton 3.6 gives this loop STREAM - 1 buffers for 8 activation rows, STREAM buffers for 16 or more
            # (its shared memory by ptxas on the CPU: tests/test_decoder_batch.py); Triton 3.9 STREAM for 8 rows
            # too, which the 48 KiB ring of batches up to 8 (TileConfig.dot_ring_small) leaves room for
            stream = max(2, (1 if BB < 16 else 0) + ring // (BK * 2 * (2 * bn + BB)))
        return dict(BLOCK_B=BB, BLOCK_N=bn, BLOCK_K=BK, STREAM=max(1, stream), **prefetch_arg("gate_up"))

    kdot = dot and tc.dot_ksplit > 1

    def gemv_kdot_c(proj):          # the plain / prenorm qkv, o, down tiles of TileConfig.dot_ksplit (tiles_batch)
        S, BB, BK = tc.dot_ksplit, max(8, next_pow2(B)), tc.block_k(proj, dot)
        stream = tc.stream_for(B)
        if stream and ring:
            stream = max(2, 1 + ring // (BK * 2 * (BN[proj] + BB)))
        return dict(BLOCK_B=BB, BLOCK_N=BN[proj], BLOCK_K=BK, S=S, STREAM=max(1, stream), **prefetch_arg(proj))

    def prefetch_of(proj, cols=False):
        # (by projection: every gate/up tile reads the layer's stacked [2 x N, K] gate and up rows; the prenorm
        # gate/up tiles of batch 1 had linear_prefetch, which read one layer's worth of rows at the wrong offset;
        # cols: a task whose tiles hold COLS rows each, TileConfig.o_cols / down_cols / gate_up_cols)
        if not tc.prefetch_for(proj):
            return None
        if proj == "gate_up":
            return T.gate_up_cols_prefetch if cols else T.gate_up_prefetch
        return T.linear_cols_prefetch if cols else T.linear_prefetch
    check_cache(cfg, world_size, cache, B)
    rope_table = w.inv_freq
    if rope_table is None or rope_table.dtype != torch.float32:
        raise DitronError(f"decoder: Weights.inv_freq must be the [{D // 2}] float32 RoPE table "
                          "(DecoderConfig.inv_freq()), got "
                          f"{None if rope_table is None else (tuple(rope_table.shape), rope_table.dtype)}")
    specs = [TaskSpec("advance", T.advance_tile, 1, {"seq_ptr": buf.seq, "B": B, "BLOCK_B": next_pow2(B)},
                      reads=("seq_ptr",), writes=("seq_ptr",))]
    start = [("advance", None)]             # what layer 0's first task waits for
    if head is not None:
        if buf.tok is None:
            raise DitronError("decoder: a Head needs the buffers made with it (make_buffers(..., head=head))")
        specs.append(TaskSpec("embed", TH.embed_tile, B,
                              {"tok_ptr": buf.tok, "emb_ptr": head.embed, "x_ptr": buf.x, "H": H,
                               "BLOCK": min(1024, next_pow2(H))},
                              reads=("tok_ptr", "emb_ptr"), writes=("x_ptr",)))
        start.append(("embed", None))

    def norm(name, j, deps):
        specs.append(TaskSpec(
            name, T.add_rmsnorm_tile, B,
            {"x_ptr": buf.x, "delta_ptr": buf.delta, "resid_ptr": buf.resid, "w_ptr": w.norm, "out_ptr": buf.h,
             "N": H, "eps": cfg.rms_eps, "BLOCK": min(tc.norm_block, next_pow2(H))},
            reads=("x_ptr", "delta_ptr", "resid_ptr", "w_ptr"), writes=("resid_ptr", "out_ptr"), deps=deps,
            scalars={"layer": j, "first": int(j == 0)}))

    def linear(name, proj, x, wt, out, N, K, l, deps, fn=T.linear_tile):
        gc = gemv_c(proj)
        if kdot and fn is T.linear_tile:         # TileConfig.dot_ksplit: K chunks over the warps
            fn, gc = T.linear_kdot_tile, gemv_kdot_c(proj)
        specs.append(TaskSpec(name, fn, cdiv(N, BN[proj]),
                              {"x_ptr": x, "w_ptr": wt, "out_ptr": out, "B": B, "N": N, "K": K, **gc},
                              reads=("x_ptr", "w_ptr"), writes=("out_ptr",), deps=deps, scalars={"layer": l},
                              prefetch=prefetch_of(proj)))

    # all-reduce tile i sums elements [i * blk, (i + 1) * blk) of the flattened [B, H] partial sums (the comm
    # helper's tiling, checked after registration): when blk divides H it needs only the producer tiles of
    # those columns, so the first chunks travel while the other GEMV tiles still run
    blk = min(tc.comm_block, next_pow2(B * H))
    ar_tiles = cdiv(B * H, blk)

    def ar_cols(bn):
        def cols(i):
            c0 = (i * blk) % H
            return c0 // bn, cdiv(c0 + blk, bn)
        return cols

    def all_reduce(name, producer, proj, extra):
        tiles = ar_cols(BN[proj]) if H % blk == 0 else None
        specs.append(TaskSpec(name, None, ar_tiles, {"x": buf.partial, "out": buf.delta},
                              deps=[(producer, tiles)] + extra, comm="all_reduce", scalars={"block": blk}))

    def rope_qkv_tiles(t):          # rope tile t -> the qkv tiles holding its head's columns
        j, kvh = t % (G + 2), (t // (G + 2)) % KH
        head = kvh * G + j if j < G else QH + kvh if j == G else QH + KH + kvh
        return head * D // BN["qkv"], cdiv((head + 1) * D, BN["qkv"])

    def heads_qkv_tiles(first, n, per=1):   # tile t of kv head (t // per) % KH -> the qkv tiles of heads
        def tiles(t):                       # [first(kvh), first(kvh) + n)
            h0 = first((t // per) % KH)
            return h0 * D // BN["qkv"], cdiv((h0 + n) * D, BN["qkv"])
        return tiles

    def group_qkv_deps(per):        # a tile of kv group (t // per) % KH needs its G q heads, its k and v head
        return [heads_qkv_tiles(lambda kvh: kvh * G, G, per), heads_qkv_tiles(lambda kvh: QH + kvh, 1, per),
                heads_qkv_tiles(lambda kvh: QH + KH + kvh, 1, per)]
    rope_group_deps = group_qkv_deps(1)             # TileConfig.rope_group: rope tile (b, kvh)
    attn_qkv_deps = group_qkv_deps(S)               # TileConfig.attn_fuse_rope: attention tile (b, kvh, s)
    rope_per = 1 if tc.rope_group else G + 2         # rope tiles per (b, kvh)
    pipe_attn = bool(tc.attn_stages or tc.attn_prefetch_v)     # attn_split_pipe_tile (attn_rope_split_tile: always)

    def attn_rope_tiles(t):         # attention tile (b, kvh, s) -> rope tiles of (b, kvh, *)
        bh = t // S
        return bh * rope_per, (bh + 1) * rope_per

    def comb_attn_tiles(t):         # combine tile (b, h) -> attention tiles of (b, h // G, *)
        b, hq = divmod(t, QH)
        bh = b * KH + hq // G
        return bh * S, (bh + 1) * S

    def comb_group_attn_tiles(t):   # TileConfig.comb_group: combine tile (b, kvh) -> attention tiles of (b, kvh, *)
        return t * S, (t + 1) * S

    def rms_linear(name, proj, fn, wt, out, N, l, j, deps):      # the fused-norm GEMV over the residual stream
        specs.append(TaskSpec(name, fn, cdiv(N, BN[proj]),
                              {"x_ptr": buf.x, "resid_ptr": buf.resid, "delta_ptr": buf.delta, "nw_ptr": w.norm,
                               "w_ptr": wt, "out_ptr": out, "B": B, "eps": cfg.rms_eps, "N": N, "K": H,
                               **gemv_c(proj)},
                              reads=("x_ptr", "resid_ptr", "delta_ptr", "nw_ptr", "w_ptr"), writes=("out_ptr",),
                              deps=deps, scalars={"layer": l, "norm": j, "first": int(j == 0)},
                              prefetch=prefetch_of(proj)))

    def commit(name, j, deps):                               # resid = x / resid + delta, once
        specs.append(TaskSpec(name, T.add_resid_tile, cdiv(B * H, tc.norm_block),
                              {"x_ptr": buf.x, "resid_ptr": buf.resid, "delta_ptr": buf.delta, "N": B * H,
                               "BLOCK": tc.norm_block},
                              reads=("x_ptr", "resid_ptr", "delta_ptr"), writes=("resid_ptr",), deps=deps,
                              scalars={"first": int(j == 0)}))

    SK = tc.down_split_k
    if SK > 1 and (IL % SK or (IL // SK) % 8):
        raise DitronError(f"TileConfig.down_split_k={SK}: the down projection's K (intermediate per rank {IL}) must "
                          f"split into slices of a multiple of 8 columns (16-byte rows)")

    def down_split(l):              # split-K down_proj: slices into partial_k, added per all-reduce chunk
        KS, BNg, BNd = IL // SK, GU, BN["down"]

        def gu_tiles(t):            # down tile (n, s) -> the gate/up tiles writing act columns of slice s
            s = t % SK
            return s * KS // BNg, cdiv((s + 1) * KS, BNg)

        def split_tiles(i):         # dsum tile i (elements [i * blk, +blk) of [B, H]) -> down tiles of its columns
            if H % blk:
                return 0, cdiv(H, BNd) * SK
            c0 = (i * blk) % H
            return c0 // BNd * SK, cdiv(c0 + blk, BNd) * SK
        specs.append(TaskSpec(f"down.{l}", T.linear_split_tile, cdiv(H, BNd) * SK,
                              {"x_ptr": buf.act, "w_ptr": w.down, "out_ptr": buf.partial_k, "B": B, "N": H, "K": IL,
                               "SPLIT_K": SK, **{k: v for k, v in gemv_c("down").items() if k != "PREFETCH_K"}},
                              reads=("x_ptr", "w_ptr"), writes=("out_ptr",), deps=[(f"gu.{l}", gu_tiles)],
                              scalars={"layer": l}))
        specs.append(TaskSpec(f"dsum.{l}", T.sum_splits_tile, ar_tiles,
                              {"x_ptr": buf.partial_k, "out_ptr": red, "N": B * H, "SPLITS": SK, "BLOCK": blk},
                              reads=("x_ptr",), writes=("out_ptr",),
                              deps=[(f"down.{l}", split_tiles)] + ([(f"res_m.{l}", None)] if direct and fuse else [])))

    # one rank (TileConfig.direct_tp1): the sum over one rank is a copy, so o_proj and down_proj (dsum with split-K)
    # write delta themselves and there is no all-reduce task: two stages fewer per layer.  They then overwrite
    # delta, so they also wait for its readers (the residual commits; the fused-norm GEMVs read it before them)
    direct = world_size == 1 and tc.direct_tp1
    red = buf.delta if direct else buf.partial

    # ... and with the norms fused in (TileConfig.fold_resid), they commit the pending residual add of their own
    # columns too (linear_resid_tile): no res_a / res_m tasks, and down waits for gate/up only
    # TileConfig.prenorm (on top of the fold): o / down write r itself (no delta), hn = bf16(r * w_norm) and their
    # tiles' partial sums of r^2; the next qkv / gate-up tiles are plain GEMVs over hn scaled by rstd
    # (at every batch: above fuse_upto it also replaces the separate norm tasks but layer 0's)
    pre = direct and tc.prenorm_for(B)
    fold = pre or (direct and fuse and tc.fold_resid)
    # act columns per gate/up tile: TileConfig.gate_up_cols / gu_wdot_cols on the prenorm tiles (cols: the tile width
    # elsewhere): gate/up tile p writes act[:, p * GU : +GU], which every reader of act by gate/up tile
    # (down's in-loop waits, split-K's slices) assumes
    GU = tc.cols("gate_up", dot) if pre else BN["gate_up"]

    def stream_wait(proj, fn, plain, producer, pn, deps, args, scalars):
        """TileConfig.stream_wait: the plain streamed prenorm GEMV ``plain`` over ``producer``'s output (``pn``
        columns per producer tile) waits on it inside its K loop (Dep(inner=True)); returns (fn, deps)."""
        seg = tc.wait_segment()
        on = seg and fn is plain and proj in tc.wait_projs() and args["STREAM"] > 0
        if not on:
            return fn, deps
        import ditron.task as dtask
        ptask = next(s for s in specs if s.name == producer)
        if cdiv(args["K"], pn) != ptask.num_tiles:
            raise DitronError(f"TileConfig.stream_wait: {proj}'s K={args['K']} in producer tiles of {pn} columns is "
                              f"{cdiv(args['K'], pn)} tiles, but '{producer}' has {ptask.num_tiles}")
        # the producer's first scoreboard slot relative to this task's: the tiles of the specs registered from it on
        # (checked by register())
        off = -sum(s.num_tiles for s in specs[specs.index(ptask):])
        args.update(task_slots=dtask.TASK_SLOTS, epoch=dtask.EPOCH, WAIT_OFF=off, WAIT_PN=pn, WAIT_SEG=seg,
                    WAIT_EXACT=tc.stream_wait_exact, WAIT_LOAD=tc.stream_wait_load)
        sw = {T.linear_resnorm_tile: TG.linear_resnorm_sw_tile, T.linear_rstd_tile: TG.linear_rstd_sw_tile,
              T.gate_up_rstd_tile: TG.gate_up_rstd_sw_tile}[plain]
        return sw, [(n, t, True) if n == producer else (n, t) for n, t in deps]

    def resnorm(name, proj, x, wt, K, l, j, first, ss, deps, producer=None, pn=0):   # r = x0 | resid + x @ wt^T;
        cols = tc.cols(proj, dot)              # columns per tile (o_cols / down_cols: a masked tile)   hn, ss (j)
        fn = T.linear_resnorm_early_tile if dot and tc.pn_early else T.linear_resnorm_tile     # TileConfig.pn_early
        gc = gemv_c(proj)
        if kdot:                                                                               # ... dot_ksplit
            fn, gc = T.linear_resnorm_kdot_tile, gemv_kdot_c(proj)
        args = {"x_ptr": x, "w_ptr": wt, "x0_ptr": buf.x, "resid_ptr": buf.resid, "nw_ptr": w.norm,
                "hn_ptr": buf.hn, "ss_ptr": ss, "B": B, "N": H, "K": K, "COLS": cols, **gc}
        scalars = {"layer": l, "norm": j, "first": first}
        if producer is not None:
            fn, deps = stream_wait(proj, fn, T.linear_resnorm_tile, producer, pn, deps, args, scalars)
        specs.append(TaskSpec(name, fn, cdiv(H, cols), args,
                              reads=("x_ptr", "w_ptr", "x0_ptr", "resid_ptr", "nw_ptr"),
                              writes=("resid_ptr", "hn_ptr", "ss_ptr"), deps=deps,
                              scalars=scalars, prefetch=prefetch_of(proj, cols=True)))

    def rstd_gemv(name, proj, fn, wt, out, N, l, ss, deps, producer=None, pn=0):   # rstd(ss) * (hn @ wt^T)
        nt = ss.shape[1]                                                          # (gate/up: then silu * up)
        gc = gemv_c(proj)
        plain = fn
        early = dot and tc.pn_early                         # TileConfig.pn_early: rstd loaded before the stream
        cols = BN[proj]
        if wdot and proj == "gate_up":
            fn, gc = T.gate_up_rstd_wdot_early_tile if early else T.gate_up_rstd_wdot_tile, gemv_wdot_c()
        elif kdot and proj != "gate_up":
            fn, gc = T.linear_rstd_kdot_tile, gemv_kdot_c(proj)
        elif early:
            fn = T.gate_up_rstd_early_tile if proj == "gate_up" else T.linear_rstd_early_tile
        if proj == "gate_up":       # TileConfig.gate_up_cols / gu_wdot_cols: tiles of COLS columns (0: all)
            cols = GU
            gc = {**gc, "COLS": cols % BN[proj]}
        args = {"x_ptr": buf.hn, "ss_ptr": ss, "w_ptr": wt, "out_ptr": out, "B": B, "eps": cfg.rms_eps,
                "N": N, "K": H, "NT": nt, "BLOCK_T": next_pow2(nt), **gc}
        scalars = {"layer": l}
        pf = prefetch_of(proj, cols=cols != BN[proj])
        if producer is not None:
            fn, deps = stream_wait(proj, fn, plain, producer, pn, deps, args, scalars)
        specs.append(TaskSpec(name, fn, cdiv(N, cols), args,
                              reads=("x_ptr", "ss_ptr", "w_ptr"), writes=("out_ptr",), deps=deps,
                              scalars=scalars, prefetch=pf))

    def folded(name, proj, x, wt, K, l, first, deps):       # delta = x @ wt^T after resid = x0 | resid + delta
        specs.append(TaskSpec(name, T.linear_resid_tile, cdiv(H, BN[proj]),
                              {"x_ptr": x, "w_ptr": wt, "x0_ptr": buf.x, "resid_ptr": buf.resid,
                               "delta_ptr": buf.delta, "B": B, "N": H, "K": K, **gemv_c(proj)},
                              reads=("x_ptr", "w_ptr", "x0_ptr", "resid_ptr", "delta_ptr"),
                              writes=("resid_ptr", "delta_ptr"), deps=deps, scalars={"layer": l, "first": first},
                              prefetch=prefetch_of(proj)))

    def after_attn(l):              # the task whose completion puts layer l's attention output in delta
        return f"o.{l}" if direct else f"ar_attn.{l}"

    def after_mlp(l):               # ... and its MLP output
        return (f"dsum.{l}" if SK > 1 else f"down.{l}") if direct else f"ar_mlp.{l}"
    for l in range(L):
        # attention block: (norm) -> qkv -> rope -> attention -> combine -> o_proj -> all-reduce
        if pre and l:
            rstd_gemv(f"qkv.{l}", "qkv", T.linear_rstd_tile, w.qkv, buf.qkv, sh.qkv_cols, l, buf.ss_m,
                      [(f"down.{l - 1}", None)], f"down.{l - 1}", tc.cols("down", dot))
        elif fuse:
            rms_linear(f"qkv.{l}", "qkv", T.rms_linear_tile, w.qkv, buf.qkv, sh.qkv_cols, l, 2 * l,
                       ([(after_mlp(l - 1), None)] + ([] if fold else [(f"res_m.{l - 1}", None)])) if l
                       else start)
            if not fold:
                commit(f"res_a.{l}", 2 * l, [(f"qkv.{l}", None)])    # after every qkv tile read the old resid
        else:
            norm(f"norm_a.{l}", 2 * l, [(after_mlp(l - 1), None)] if l else start)
            linear(f"qkv.{l}", "qkv", buf.h, w.qkv, buf.qkv, sh.qkv_cols, H, l, [(f"norm_a.{l}", None)])
        attn_c = {"kc_ptr": k_cache, "vc_ptr": v_cache, "bt_ptr": bt, "seq_ptr": buf.seq, "o_ptr": buf.o_part,
                  "lse_ptr": buf.lse, "B": B, "QH": QH, "KH": KH, "num_pages": NP, "max_pages": MP, "nsplit": S,
                  "sm_scale": 1.0 / math.sqrt(D), "PAGE": P, "HEAD_D": D, "BLOCK_D": max(16, next_pow2(D)),
                  "BLOCK_G": max(16, next_pow2(G)), "SPLIT": sh.attn_split(cache.max_ctx, B),
                  "BLOCK_P": tc.attn_block}
        pipe_c = {"STAGES": tc.attn_stages, "PREFETCH_V": tc.attn_prefetch_v}
        # TileConfig.attn_prefetch_o: the attention tiles ask L2 for this layer's o_proj weight rows, a share each
        o_pf = {}
        if tc.attn_prefetch_o:
            attn_c = {**attn_c, "wo_ptr": w.o, "O_N": H, "O_K": sh.attn_cols, "O_ROWS": cdiv(H, B * KH * S),
                      "O_LINES": next_pow2(cdiv(sh.attn_cols, 64))}
            o_pf = {"prefetch": T.o_weight_prefetch}
        if tc.attn_fuse_rope:
            # TileConfig.attn_fuse_rope: no rope task; each attention tile norms / rotates its q heads itself and
            # the split holding the new position appends k and v (attn_rope_split_tile)
            specs.append(TaskSpec(
                f"attn.{l}", T.attn_rope_split_tile, B * KH * S,
                {"qkv_ptr": buf.qkv, "qn_ptr": w.q_norm, "kn_ptr": w.k_norm, "eps": cfg.rms_eps,
                 "inv_ptr": rope_table, "QK_NORM": cfg.qk_norm, **attn_c, **pipe_c},
                reads=("qkv_ptr", "qn_ptr", "kn_ptr", "inv_ptr", "kc_ptr", "vc_ptr", "bt_ptr", "seq_ptr"),
                writes=("kc_ptr", "vc_ptr", "o_ptr", "lse_ptr"),
                deps=[(f"qkv.{l}", f) for f in attn_qkv_deps], scalars={"layer": l}, **o_pf))
        else:
            specs.append(TaskSpec(
                f"rope.{l}", T.qk_norm_rope_group_tile if tc.rope_group else T.qk_norm_rope_tile,
                B * KH * rope_per,
                {"qkv_ptr": buf.qkv, "qn_ptr": w.q_norm, "kn_ptr": w.k_norm, "q_ptr": buf.q, "kc_ptr": k_cache,
                 "vc_ptr": v_cache, "bt_ptr": bt, "seq_ptr": buf.seq, "B": B, "QH": QH, "KH": KH, "num_pages": NP,
                 "max_pages": MP, "eps": cfg.rms_eps, "inv_ptr": rope_table, "PAGE": P,
                 "HEAD_D": D, "BLOCK_H": next_pow2(D // 2), "QK_NORM": cfg.qk_norm},
                reads=("qkv_ptr", "qn_ptr", "kn_ptr", "inv_ptr", "bt_ptr", "seq_ptr"),
                writes=("q_ptr", "kc_ptr", "vc_ptr"),
                deps=([(f"qkv.{l}", f) for f in rope_group_deps] if tc.rope_group
                      else [(f"qkv.{l}", rope_qkv_tiles)]),
                scalars={"layer": l}))
            specs.append(TaskSpec(
                f"attn.{l}", T.attn_split_pipe_tile if pipe_attn else T.attn_split_tile, B * KH * S,
                {"q_ptr": buf.q, **attn_c, **(pipe_c if pipe_attn else {})},
                reads=("q_ptr", "kc_ptr", "vc_ptr", "bt_ptr", "seq_ptr"), writes=("o_ptr", "lse_ptr"),
                deps=[(f"rope.{l}", attn_rope_tiles)], scalars={"layer": l}, **o_pf))
        # BLOCK_S at least 16: with attn_tiles a few splits (batch 16 at 4096: 3 -> 4 rows) made ptxas spill 60-64
        # bytes elsewhere in the 168-register batch-16 step (16 rows: none; tests/test_decoder.py)
        specs.append(TaskSpec(
            f"comb.{l}", T.attn_combine_group_tile if tc.comb_group else T.attn_combine_tile,
            B * KH if tc.comb_group else B * QH,
            {"o_ptr": buf.o_part, "lse_ptr": buf.lse, "out_ptr": buf.attn, "nsplit": S, "HEAD_D": D,
             "BLOCK_D": next_pow2(D), "BLOCK_S": max(16, next_pow2(S)), **({"GROUP": G} if tc.comb_group else {})},
            reads=("o_ptr", "lse_ptr"), writes=("out_ptr",),
            deps=[(f"attn.{l}", comb_group_attn_tiles if tc.comb_group else comb_attn_tiles)]))
        if pre:             # o tile n: resid[:, cols n] = (x | resid) + attn @ Wo^T; hn, ss of norm 2l + 1
            resnorm(f"o.{l}", "o", buf.attn, w.o, sh.attn_cols, l, 2 * l + 1, int(l == 0), buf.ss_a,
                    [(f"comb.{l}", None)], *((f"comb.{l}", D) if B == 1 and not tc.comb_group else ()))
        elif fold:          # o tile n: resid[:, cols n] = x | resid + delta (layer l's pending add), then delta
            folded(f"o.{l}", "o", buf.attn, w.o, sh.attn_cols, l, int(l == 0), [(f"comb.{l}", None)])
        else:
            linear(f"o.{l}", "o", buf.attn, w.o, red, H, sh.attn_cols, l,
                   [(f"comb.{l}", None)] + ([(f"res_a.{l}", None)] if direct and fuse else []))
        if not direct:
            all_reduce(f"ar_attn.{l}", f"o.{l}", "o", [(f"res_a.{l}", None)] if fuse else [])
        # MLP block: (norm) -> gate/up -> down -> all-reduce
        if pre:
            rstd_gemv(f"gu.{l}", "gate_up", T.gate_up_rstd_tile, w.gate_up, buf.act, IL, l, buf.ss_a,
                      [(f"o.{l}", None)], f"o.{l}", tc.cols("o", dot))
        elif fuse:
            rms_linear(f"gu.{l}", "gate_up", T.rms_gate_up_tile, w.gate_up, buf.act, IL, l, 2 * l + 1,
                       [(after_attn(l), None)] + ([] if fold else [(f"res_a.{l}", None)]))
            if not fold:
                commit(f"res_m.{l}", 2 * l + 1, [(f"gu.{l}", None)])
        else:
            norm(f"norm_m.{l}", 2 * l + 1, [(after_attn(l), None)])
            if wdot:
                specs.append(TaskSpec(f"gu.{l}", T.gate_up_wdot_tile, cdiv(IL, BN["gate_up"]),
                                      {"x_ptr": buf.h, "w_ptr": w.gate_up, "out_ptr": buf.act, "B": B, "N": IL,
                                       "K": H, **gemv_wdot_c()},
                                      reads=("x_ptr", "w_ptr"), writes=("out_ptr",), deps=[(f"norm_m.{l}", None)],
                                      scalars={"layer": l}, prefetch=prefetch_of("gate_up")))
            else:
                linear(f"gu.{l}", "gate_up", buf.h, w.gate_up, buf.act, IL, H, l, [(f"norm_m.{l}", None)],
                       fn=T.gate_up_tile)
        if SK > 1:
            down_split(l)
            if not direct:
                specs.append(TaskSpec(f"ar_mlp.{l}", None, ar_tiles, {"x": buf.partial, "out": buf.delta},
                                      deps=[(f"dsum.{l}", "same")] + ([(f"res_m.{l}", None)] if fuse else []),
                                      comm="all_reduce", scalars={"block": blk}))
        elif pre:
            resnorm(f"down.{l}", "down", buf.act, w.down, IL, l, 2 * l + 2, 0, buf.ss_m, [(f"gu.{l}", None)],
                    f"gu.{l}", GU)
        elif fold:
            folded(f"down.{l}", "down", buf.act, w.down, IL, l, 0, [(f"gu.{l}", None)])
        else:
            linear(f"down.{l}", "down", buf.act, w.down, red, H, IL, l,
                   [(f"gu.{l}", None)] + ([(f"res_m.{l}", None)] if direct and fuse else []))
            if not direct:
                all_reduce(f"ar_mlp.{l}", f"down.{l}", "down", [(f"res_m.{l}", None)] if fuse else [])
    if pre:                 # resid holds the final residual (no pending delta): the norm of resid itself
        specs.append(TaskSpec(
            "final", T.add_rmsnorm_tile, B,
            {"x_ptr": buf.resid, "delta_ptr": buf.delta, "resid_ptr": buf.resid, "w_ptr": w.norm, "out_ptr": buf.h,
             "N": H, "eps": cfg.rms_eps, "BLOCK": min(tc.norm_block, next_pow2(H))},
            reads=("x_ptr", "resid_ptr", "w_ptr"), writes=("resid_ptr", "out_ptr"),
            deps=[(f"down.{L - 1}", None)], scalars={"layer": 2 * L, "first": 1}))
    else:
        norm("final", 2 * L, [(after_mlp(L - 1), None)])
    if head is not None:
        head_tasks(specs, cfg, world_size, head, buf, gemv_kdot_c if kdot else gemv_c, kdot)
    return specs


def head_tasks(specs, cfg: DecoderConfig, world_size: int, head: Head, buf: Buffers, gemv_c, kdot):
    """After ``final`` (``h = rms(resid)``): the LM head over this rank's vocabulary rows (``lm_head``, the qkv
    projection's GEMV tiles), the sampler's stage 1 (``topk_part``: each chunk's best candidates, as soon as its LM-head
    tiles are done; ``topk``: this rank's best candidates per row), at TP > 1 their
    all-gather (``gather``), and stage 2 (``sample``: the next token of every row into ``tok``); see
    :mod:`.tiles_head`."""
    B, H = buf.x.shape[0], cfg.hidden
    K, VR = head.max_top_k, head.lm.shape[1]
    gc = gemv_c("qkv")
    fn = T.linear_kdot_tile if kdot else T.linear_tile
    # the qkv tiles' L2 prefetch where the config has one (TileConfig.prefetch_for): each program's first LM-head
    # tile pulls its weight rows in while the final norm is still pending
    specs.append(TaskSpec("lm_head", fn, cdiv(VR, gc["BLOCK_N"]),
                          {"x_ptr": buf.h, "w_ptr": head.lm, "out_ptr": buf.logits, "B": B, "N": VR, "K": H, **gc},
                          reads=("x_ptr", "w_ptr"), writes=("out_ptr",), deps=[("final", None)],
                          scalars={"layer": 0}, prefetch=T.linear_prefetch if "PREFETCH_K" in gc else None))
    nsplit, chunk = TH.topk_splits(VR)
    bn = gc["BLOCK_N"]

    def chunk_lm_tiles(t):          # topk_part tile t -> the LM-head tiles holding its chunk's columns
        lo = (t % nsplit) * chunk
        return lo // bn, cdiv(min(lo + chunk, VR), bn)
    specs.append(TaskSpec("topk_part", TH.topk_part_tile, B * nsplit,
                          {"logits_ptr": buf.logits, "part_ptr": buf.cand_part, "temp_ptr": buf.temperature,
                           "n_valid": head.n_valid, "N": VR, "K": K, "NSPLIT": nsplit, "CHUNK": chunk,
                           "BLOCK": min(1024, next_pow2(chunk))},
                          reads=("logits_ptr", "temp_ptr"), writes=("part_ptr",), deps=[("lm_head", chunk_lm_tiles)]))
    specs.append(TaskSpec("topk", TH.topk_merge_tile, B,
                          {"part_ptr": buf.cand_part, "cand_ptr": buf.cand, "temp_ptr": buf.temperature,
                           "v_off": head.v_off, "K": K, "NSPLIT": nsplit,
                           "BLOCK": min(1024, next_pow2(nsplit * K))},
                          reads=("part_ptr", "temp_ptr"), writes=("cand_ptr",),
                          deps=[("topk_part", lambda t: (t * nsplit, (t + 1) * nsplit))]))
    last = "topk"
    if world_size > 1:
        n = buf.cand.numel()
        specs.append(TaskSpec("gather", None, cdiv(n, min(1024, next_pow2(n))), {"x": buf.cand, "out": buf.cand_all},
                              deps=[("topk", None)], comm="all_gather", scalars={"block": min(1024, next_pow2(n))}))
        last = "gather"
    specs.append(TaskSpec("sample", TH.sample_tile, B,
                          {"cand_ptr": buf.cand_all, "tok_ptr": buf.tok, "seq_ptr": buf.seq,
                           "temp_ptr": buf.temperature, "topk_ptr": buf.top_k, "topp_ptr": buf.top_p,
                           "seed_ptr": buf.seed, "B": B, "W": world_size, "K": K,
                           "NC": max(16, next_pow2(world_size * K))},
                          reads=("cand_ptr", "seq_ptr", "temp_ptr", "topk_ptr", "topp_ptr", "seed_ptr"),
                          writes=("tok_ptr",), deps=[(last, None)]))


class DecoderMegakernel:
    """The compiled decoder step of this rank: ``step(x=None) -> out`` (``[B, H]`` bf16, the final norm's
    output; ``x``, if given, is copied into the input buffer first).  ``mk`` is the
    :class:`ditron.task.Megakernel` (``mk.source``: the generated kernel); ``cache`` the paged KV cache it reads
    and appends to, ``seq`` the sequences' context lengths (``[B]`` int32, advanced by each step).  A serving
    engine updates ``seq`` and ``cache.block_table`` in place between steps (the kernel holds their addresses)."""

    def __init__(self, mk, graph, buffers: Buffers, specs, cache: PagedKV = None, head: Optional[Head] = None):
        self.mk, self.graph, self.buf, self.specs, self.cache, self.head = mk, graph, buffers, specs, cache, head

    @property
    def source(self) -> str:
        return self.mk.source

    @property
    def seq(self):
        return self.buf.seq

    @property
    def batch(self) -> int:
        return int(self.buf.x.shape[0])

    @property
    def tokens(self):
        """``[B]`` int32 (with a :class:`~.weights.Head`): the step's input tokens; after the step the sampled ones."""
        return self.buf.tok

    @property
    def logits(self):
        """``[B, V_r]`` bf16 (with a Head): this rank's LM-head output of the last step (vocab-parallel columns)."""
        return self.buf.logits

    def set_sampling(self, temperature=0.0, top_k=0, top_p=1.0, seed=0):
        """The sampler's parameters, one value for every sequence or one per sequence (the same on every rank):
        ``temperature <= 0``: greedy; ``top_k``: 0 (all ``max_top_k`` candidates) or ``1..max_top_k``; ``top_p`` in
        ``(0, 1]``; ``seed``: the Philox seed (int32).  Checked here, before any launch."""
        if self.head is None:
            raise DitronError("set_sampling: this megakernel has no Head (no LM head, no sampler)")
        B, K = self.batch, self.head.max_top_k

        def per_seq(name, v, dtype):
            vals = list(v) if isinstance(v, (list, tuple)) else [v] * B
            if len(vals) != B:
                raise DitronError(f"set_sampling: {len(vals)} values of {name} for a batch of {B}")
            return torch.tensor(vals, dtype=dtype)
        t = per_seq("temperature", temperature, torch.float32)
        k = per_seq("top_k", top_k, torch.int64)
        p = per_seq("top_p", top_p, torch.float32)
        sd = per_seq("seed", seed, torch.int64)
        if ((k < 0) | (k > K)).any():
            raise DitronError(f"set_sampling: top_k {k.tolist()} must be in 0..{K} (the compiled max_top_k; 0: all)")
        if ((p <= 0) | (p > 1)).any() or torch.isnan(p).any():
            raise DitronError(f"set_sampling: top_p {p.tolist()} must be in (0, 1]")
        if torch.isnan(t).any() or torch.isinf(t).any():
            raise DitronError(f"set_sampling: temperature {t.tolist()} must be finite")
        if ((t > 0) & (K == 1)).any():
            raise DitronError("set_sampling: temperature > 0 with max_top_k=1 would sample from one candidate; "
                              "build with a larger max_top_k")
        if ((sd < -2 ** 31) | (sd >= 2 ** 31)).any():
            raise DitronError(f"set_sampling: seed {sd.tolist()} must fit int32")
        self.buf.temperature.copy_(t)
        self.buf.top_k.copy_(k.to(torch.int32))
        self.buf.top_p.copy_(p)
        self.buf.seed.copy_(sd.to(torch.int32))

    def check_inputs(self, x=None):
        """Raise a :class:`DitronError` naming the sequence and the values if the next step would read or write
        out of bounds: ``x`` with more rows than the compiled batch, a context past its block table, a page index
        outside the cache, two sequences appending to the same page row.  Reads ``seq`` and the block table back
        to the host (a synchronisation: :meth:`step` skips it while a CUDA graph is being captured)."""
        B = self.batch
        if x is not None and (x.dim() != 2 or x.shape[0] != B or x.shape[1] != self.buf.x.shape[1]):
            raise DitronError(f"decoder step: input of shape {tuple(x.shape)}; the megakernel was compiled for a batch "
                              f"of {B} sequences of hidden size {self.buf.x.shape[1]} (build another one for a larger "
                              f"batch; pad a smaller one)")
        if self.head is not None:
            tok = self.buf.tok.cpu()
            bad = ((tok < 0) | (tok >= self.head.vocab)).nonzero()
            if len(bad):
                b = int(bad[0, 0])
                raise DitronError(f"decoder step: token {int(tok[b])} of sequence {b} is not in the vocabulary "
                                  f"(0..{self.head.vocab - 1})")
        if self.cache is None:
            return
        seq = [int(v) for v in self.buf.seq.cpu()]
        bt = self.cache.block_table.cpu()
        P, NP, MP = self.cache.page_size, self.cache.num_pages, self.cache.max_pages
        owner = {}
        for b, n in enumerate(seq):
            if n < 0:
                raise DitronError(f"decoder step: sequence {b} has context length {n} < 0")
            need = n // P + 1                       # pages holding positions 0..n (n: the new token's position)
            if need > MP:
                raise DitronError(f"decoder step: sequence {b} appends position {n} (context {n} + 1), past its block "
                                  f"table of {MP} pages x {P} positions = {MP * P}")
            pages = bt[b, :need]
            bad = ((pages < 0) | (pages >= NP)).nonzero()
            if len(bad):
                i = int(bad[0, 0])
                p = int(pages[i])
                raise DitronError(f"decoder step: block_table[{b}, {i}] = {p} is not a page of the cache (0..{NP - 1}; "
                                  f"sequence {b} needs pages 0..{need - 1} of its row for context {n} + 1)")
            key = (int(pages[-1]), n % P)
            if key in owner:
                raise DitronError(f"decoder step: sequences {owner[key]} and {b} both append to row {key[1]} of page "
                                  f"{key[0]}")
            owner[key] = b

    def step(self, x=None, tokens=None):
        """One step; returns the final norm's output ``h`` or, with a Head, the sampled tokens ``[B]`` int32
        (``tokens``: this step's input tokens, copied in first; default: the last step's sampled ones)."""
        import torch
        if tokens is not None:
            if self.head is None:
                raise DitronError("decoder step: tokens given, but this megakernel has no Head (pass x)")
            tokens = torch.as_tensor(tokens, dtype=torch.int32)
            if tuple(tokens.shape) != (self.batch,):
                raise DitronError(f"decoder step: tokens of shape {tuple(tokens.shape)}; the megakernel was compiled "
                                  f"for a batch of {self.batch}")
            self.buf.tok.copy_(tokens)
        elif x is not None and self.head is not None:
            raise DitronError("decoder step: this megakernel embeds its tokens itself (pass tokens, not x)")
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if not capturing:
            self.check_inputs(x)
        if x is not None:
            self.buf.x.copy_(x)
        self.mk.step()
        return self.buf.tok if self.head is not None else self.buf.h


def register(graph, specs, all_reduce: Optional[Callable] = None) -> dict:
    """Register ``specs`` in ``graph``; returns ``{name: task}``.  ``all_reduce(graph, name, x, out, deps, block)``
    registers a comm spec (default ``ditron.task.comm.all_reduce``; ``scalars`` of a comm spec are its keyword
    arguments)."""
    import ditron.task as dtask
    if all_reduce is None:
        all_reduce = dtask.comm.all_reduce
    tasks = {}
    for s in specs:
        deps = [dtask.Dep(tasks[d[0]], d[1], inner=len(d) > 2 and bool(d[2])) for d in s.deps]
        inner = [d[0] for d in s.deps if len(d) > 2 and d[2]]
        if "WAIT_OFF" in s.args and inner and tasks[inner[0]].slot_base - graph.num_slots != s.args["WAIT_OFF"]:
            raise DitronError(f"decoder: task '{s.name}' waits on '{inner[0]}' at slot offset {s.args['WAIT_OFF']}, "
                              f"but '{inner[0]}' starts {graph.num_slots - tasks[inner[0]].slot_base} slots before it")
        if s.comm == "all_gather":
            t = dtask.comm.all_gather(graph, s.name, s.args["x"], s.args["out"], deps=deps, **s.scalars)
            if t.num_tiles != s.num_tiles:
                raise DitronError(f"decoder: all-gather task '{s.name}' has {t.num_tiles} tiles; expected "
                                  f"{s.num_tiles}")
            tasks[s.name] = t
        elif s.comm == "all_reduce":
            t = all_reduce(graph, s.name, s.args["x"], s.args["out"], deps=deps, **s.scalars)
            if t.num_tiles != s.num_tiles or t.args.get("BLOCK", s.scalars["block"]) != s.scalars["block"]:
                raise DitronError(f"decoder: all-reduce task '{s.name}' has {t.num_tiles} tiles of "
                                  f"{t.args.get('BLOCK')} elements; its consumers' dependency ranges assume "
                                  f"{s.num_tiles} tiles of {s.scalars['block']}")
            tasks[s.name] = t
        else:
            tasks[s.name] = graph.register_task(s.fn, name=s.name, num_tiles=s.num_tiles, args=s.args,
                                                reads=s.reads, writes=s.writes, deps=deps, scalars=s.scalars,
                                                prefetch=s.prefetch)
    return tasks


def check_target(cfg: DecoderConfig, target: str) -> DecoderConfig:
    """``cfg`` for compiling to ``target`` (``"sm_90a"``, ``"gfx942"``, ``"gfx"``: any AMD target), with clear errors
    before compiling: ``TileConfig.stream_wait`` is NVIDIA-only (AMD's stream pipeliner cannot predicate the
    scoreboard wait inside the pipelined K loop), so its auto default (``None``) is off on AMD and an explicit
    ``stream_wait > 0`` raises (:meth:`TileConfig.for_target`)."""
    return cfg.for_target(target)


def build_megakernel(cfg: DecoderConfig, weights: Weights, cache: PagedKV, *, world_size: int, batch: int, ctx,
                     scheduler="round_robin", num_programs=None, buffers: Optional[Buffers] = None,
                     all_reduce=None, name="decoder", target: Optional[str] = None, head: Optional[Head] = None,
                     **compile_kw) -> DecoderMegakernel:
    """Register this rank's decoder step (``cache``: :class:`PagedKV`; ``ctx``: the sequences' context lengths,
    an int or one per sequence) and compile it into one persistent kernel for ``batch`` sequences.  ``target``: the
    device code it will be compiled to (``"sm_90a"``, ``"gfx942"``; default: the runtime's), for the target-dependent
    defaults of ``cfg`` (:func:`check_target`)."""
    import ditron.task as dtask
    if not isinstance(cache, PagedKV):
        raise DitronError(f"build_megakernel: cache must be a PagedKV (k, v, block_table), got {type(cache).__name__}")
    check_cache(cfg, world_size, cache, batch)
    if target is None:                  # the runtime's: AMD under a ROCm torch on a GPU, else NVIDIA / the simulator
        target = "gfx" if getattr(torch.version, "hip", None) and cache.k.is_cuda else "sm"
    cfg = check_target(cfg, target)
    if head is not None:
        check_head(cfg, world_size, head)
    buf = buffers or make_buffers(cfg, world_size, batch, cache.max_ctx, ctx, cache.k.device, head=head)
    specs = decoder_tasks(cfg, world_size, weights, cache, buf, head)
    g = dtask.TaskGraph(name)
    register(g, specs, all_reduce)
    if cfg.tiles.wait_acquire != "fence":
        compile_kw.setdefault("wait_acquire", cfg.tiles.wait_acquire)
    if cfg.tiles.noinline_branches:
        compile_kw.setdefault("noinline_branches", True)
    mk = g.compile(scheduler=scheduler, num_programs=num_programs, num_warps=cfg.tiles.num_warps,
                   maxnreg=cfg.tiles.max_regs or None, programs_per_sm=cfg.tiles.programs_per_sm or None,
                   **compile_kw)
    dm = DecoderMegakernel(mk, g, buf, specs, cache, head)
    dm.check_inputs()
    return dm


def check_head(cfg: DecoderConfig, world_size: int, head: Head):
    """Shapes of a :class:`~.weights.Head` for this config and TP size (at build time)."""
    V, H = head.vocab, cfg.hidden
    VR = cdiv(V, world_size)
    if tuple(head.embed.shape) != (V, H) or head.embed.dtype != torch.bfloat16:
        raise DitronError(f"decoder: Head.embed {tuple(head.embed.shape)} {head.embed.dtype}; expected [{V}, {H}] bf16")
    if tuple(head.lm.shape) != (1, VR, H) or head.lm.dtype != torch.bfloat16:
        raise DitronError(f"decoder: Head.lm {tuple(head.lm.shape)} {head.lm.dtype}; expected [1, {VR}, {H}] bf16 "
                          f"(this rank's rows of the vocab-parallel LM head, cdiv({V}, {world_size}))")
    if head.vocab >= 1 << 24:
        raise DitronError(f"decoder: vocabulary of {V} tokens: the sampler carries token ids in float32 (< 2**24)")
