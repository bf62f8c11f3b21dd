"""Ring attention (context parallel, forward) written in ditron.

    ctx = create_ring_attention_context(max_batch, max_seq, kv_heads, head_dim, torch.bfloat16)  # collective, once
    out = ring_attention(q, k, v, ctx, causal=True)          # q: [B, Hq, S, D], k / v: [B, Hkv, S, D]
    out, lse = ring_attention(q, k, v, ctx, return_lse=True)

Every rank holds ``S`` rows of the sequence (the same ``S`` on every rank; any
length, not only multiples of the tile) of Q, K and V in SDPA's ``[batch,
heads, seq, head_dim]`` layout; the output is this rank's rows of
``scaled_dot_product_attention`` over the whole sequence of ``W * S`` rows.
GQA: ``Hq`` a multiple of ``Hkv`` (query head ``h`` uses KV head ``h // (Hq //
Hkv)``).  float16 and bfloat16, fp32 accumulation and softmax statistics.

Sharding (``layout``):

* ``"contiguous"``: rank ``r`` holds rows ``[r*S, (r+1)*S)``;
* ``"zigzag"`` (the default with ``causal=True``): the sequence is cut in
  ``2W`` chunks of ``C = S / 2`` rows and rank ``r`` holds chunks ``r`` and
  ``2W-1-r`` (in this order): every rank gets the same causal work.
  :func:`shard` / :func:`unshard` convert on the host.

How (one node; peers reached by load/store):

1. ``ring_attn_stage_kernel`` (only for ``W > 1``): every rank copies its K and
   V into its slot of the context's symmetric buffers (parity ``e % 2`` of the
   call counter, kernels/_common.py), in ``NSPLIT`` pieces per KV head, and
   sets one signal word per piece on every peer (value ``e + 1``).
2. ``ring_attn_fwd_kernel``: one program per ``BLOCK_M`` query rows of one
   head runs the flash-attention loop (kernels/attention_core.py) over the
   sources in ring order ``me, me-1, me-2, ...``: its own K/V first (read from
   the caller's tensors, while the peers are still staging), then each peer's
   copy through tile-level ``dl.symm_at`` loads after ``dl.wait`` on that
   peer's signal words of the head.  All sources feed one online softmax: no
   second pass, no partial outputs.  The last program bumps the call counter.

The staging is a separate launch so that a program never waits for a peer
program that cannot be scheduled (the attention grid is far larger than what
is resident).  A rank is at most one call ahead of a peer (the argument of
kernels/all_gather.py): a call's attention waits for every peer's staging of
the same call, which a peer starts only after its previous call's attention.

Cores (``core=``; :func:`resolve_core` decides when the caller names none):

* ``"gluon"`` (kernels/attention_hopper.py: the warp-specialised FlashAttention-3-style core -- a TMA producer
  warp, two consumer warpgroups of 64 query rows, ping-pong): **the default on Hopper (sm_90) CUDA GPUs at
  world size 1** for the shapes it takes (float16 / bfloat16, head dim 64 or 128, contiguous inputs; any
  sequence length, batch, GQA, causal or not) and that a GPU run has checked it on (the table's ``verified``
  domain: bf16, head dim 128, lengths multiples of 128 today), with the config of the GPU's measured table
  (kernels/attention_table.py, kernels/attention_tables/: H100 measured 2026-12-07,
  bench/results/h100-2026-12-07e-attention-gluon/, ``gluon ws 128x128 s2 pingpong`` 0.999 / 1.042 / 1.067
  / 1.025 / 0.936 / 1.032 x SDPA cuDNN at 8192 / 16384 / 32768 keys non-causal / causal, geomean 1.016x,
  where the tl core gives 0.814x; other Hopper GPUs get the same config, marked as measured on H100);
* ``"tl"`` (kernels/attention_core.py): everywhere else -- the simulator, AMD GPUs, non-Hopper NVIDIA GPUs,
  world size > 1 (the ring loop over peers' K / V), head dims other than 64 / 128, non-contiguous inputs,
  inputs outside the table's ``verified`` domain, ``DITRON_ATTN_TABLE=off``.  With :func:`attention_hopper.twin_config` it is the Gluon core's **twin**: the
  same 128 x ``block_n`` tiles and the same operation order, so that the simulator runs what the GPU runs
  (tests/gpu/attention_hopper_twin.py checks the two bit for bit on a Hopper GPU; docs/zoo.md).

An explicit ``core="tl"`` / ``"gluon"`` is honoured (``"gluon"`` refused where it cannot run, with a message
naming the twin); a ``config`` implies its core (an :class:`AttnConfig`: tl, a ``HopperAttnConfig``: gluon).
The decision is cached per (device, world size, shapes, dtype, causal): a call asks the device once.

Tuning: :class:`AttnConfig` (tiles, warps, stages, TMA descriptors for this
rank's K/V on Hopper, a persistent grid, ``maxnreg``, ``heads_first``); without
one, :func:`default_config` looks the shape up in :data:`RING_TABLE` (set from
``bench/attention_sweep.py``: :data:`GPU_CONFIG`, 128 x 64 tiles on one
warpgroup, with the longest-tiles-first grid for causal up to 8192 keys of the
whole sequence, :data:`GPU_SHORT_CONFIG`, 64 x 64 tiles, for causal up to
:data:`SHORT_SEQ`; both two programs per SM);
:data:`TUNE_CONFIGS` / :data:`LEVER_CONFIGS` are what ``ditron bench ring_attn
--configs all`` / ``levers`` time beside them.  The simulator uses
:data:`SIM_CONFIG`.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import CollectiveContext, enter, epoch_begin, epoch_end, sm_count
from ._common import cdiv
from .attention_core import M_INIT, attend_source, chunk_id, store_rows

LAYOUTS = ("contiguous", "zigzag")
#: the attention cores: ``"tl"`` (kernels/attention_core.py; everywhere) and ``"gluon"`` (kernels/attention_hopper.py:
#: warp-specialised, Hopper GPUs only, world size 1; the default there: :func:`resolve_core`)
CORES = ("tl", "gluon")
_DTYPES = (torch.float16, torch.bfloat16)
#: signal words (pieces) per KV head and source on GPUs / on the simulator
GPU_NSPLIT = 4
SIM_NSPLIT = 2
STAGE_BLOCK_GPU = 8192
STAGE_BLOCK_SIM = 256


@dataclasses.dataclass(frozen=True)
class AttnConfig:
    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3
    #: this rank's K / V through TMA tensor descriptors (Hopper; not on the simulator)
    tma: bool = True
    #: a persistent grid (programs per SM x SMs) looping over the tiles, longest first when causal
    persistent: bool = False
    #: registers per thread (Triton's ``maxnreg``; None: the compiler's choice), e.g. 128 so that two
    #: programs of 8 warps fit an SM's register file
    maxnreg: int | None = None
    #: causal, non-persistent grid: ``(heads, tiles)`` instead of ``(tiles, heads)``, so that the hardware
    #: dispatches the longest tiles of every head first (the tail at 8192 keys: ~6% -> ~0.2% in a schedule
    #: model; the tiles that run together then span every head, not one)
    heads_first: bool = False

    def validate(self, op="ring_attention"):
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ditron.DitronError(f"{op}: {name}={v} must be a power of two >= 16 (tl.dot)")
        if self.num_warps < 1 or self.num_stages < 1:
            raise ditron.DitronError(f"{op}: num_warps and num_stages must be >= 1 ({self})")
        if self.maxnreg is not None and not 24 <= self.maxnreg <= 255:
            raise ditron.DitronError(f"{op}: maxnreg={self.maxnreg} must be in [24, 255] or None")
        return self

    def short(self):
        return (f"{self.block_m}x{self.block_n}w{self.num_warps}s{self.num_stages}{'t' if self.tma else ''}"
                f"{'p' if self.persistent else ''}{f'r{self.maxnreg}' if self.maxnreg else ''}"
                f"{'h' if self.heads_first else ''}")


#: the default on GPUs: 128 query rows on one warpgroup (4 warps) against 64-key tiles, 2 stages: 96 KiB of
#: shared memory and 255 registers (100 bytes of spill stores), so two programs per SM, one's softmax beside
#: the other's wgmma.  bench/attention_sweep.py on one H200 (2026-11-27, bench/results/h200-2026-11-27-attn4/)
#: found it the best of 10 configs non-causal at 8192-32768 and causal at 32768; `ditron bench ring_attn
#: --configs levers` on the same H200 (CUDA-graph replays, x cuDNN): non-causal 0.81 / 0.90 / 0.89 at 8192 /
#: 16384 / 32768, causal 0.93 at 32768, against 0.72 / 0.81 / 0.85 and 0.88 for Triton's Hopper tiles
#: (HOPPER_CONFIG, the default before).
GPU_CONFIG = AttnConfig(128, 64, 4, 2, tma=True)
#: causal from 8192 up to SHORT_SEQ keys of the whole sequence: 64 x 64 tiles, 3 stages, two programs per SM
#: (same run: 0.83 at 16384 against GPU_CONFIG's 0.81; with heads_first 0.78)
GPU_SHORT_CONFIG = AttnConfig(64, 64, 4, 3, tma=True)
SHORT_SEQ = 16384
#: causal up to 8192 keys: GPU_CONFIG with the grid (heads, tiles), the longest tiles of every head first
#: (same run: 0.84 against 0.79 in the (tiles, heads) order and GPU_SHORT_CONFIG's 0.82; at 32768 the
#: order costs L2 reuse: 0.91 against 0.93)
GPU_CAUSAL_SHORT_CONFIG = AttnConfig(128, 64, 4, 2, tma=True, heads_first=True)
#: Triton's Hopper fused-attention tiles, the GPU default before the sweep
HOPPER_CONFIG = AttnConfig(128, 128, 8, 3, tma=True)
#: the GPU default per shape: ``(max whole sequence, causal or None for both, config)``, the first entry
#: that covers a call wins (kernels/attention.default_config); set from bench/attention_sweep.py
RING_TABLE = (
    (8192, True, GPU_CAUSAL_SHORT_CONFIG),
    (SHORT_SEQ, True, GPU_SHORT_CONFIG),
    (1 << 62, None, GPU_CONFIG),
)
#: world size > 1 (not timed yet: one GPU so far): the defaults from before the sweep, since GPU_CONFIG's ring
#: loop over the peers' copies spills 1.6 KB there (255 registers; none at world size 1 but 100 bytes)
RING_TABLE_MULTI = (
    (8192, None, GPU_SHORT_CONFIG),
    (1 << 62, None, HOPPER_CONFIG),
)
#: what ``ditron bench ring_attn --configs all`` sweeps on GPUs beside the defaults: the runners-up of the
#: sweep and the causal grid that dispatches the longest tiles of every head first (heads_first, not yet
#: timed on a GPU)
TUNE_CONFIGS = (
    HOPPER_CONFIG,
    AttnConfig(128, 64, 8, 2, tma=True, maxnreg=128),
    AttnConfig(64, 64, 4, 3, tma=True, heads_first=True),
    GPU_CAUSAL_SHORT_CONFIG,
)
#: the levers bench/attention_levers.sh times against the defaults: the 64 x 64 tiles with the causal grid
#: that dispatches the longest tiles of every head first (0.83 at 8192, 0.78 at 16384 on one H200; GPU_CONFIG
#: on 32-key tiles, 3 or 4 stages, lost everywhere: 0.62-0.75).  What the sm_90a compile of
#: HOPPER_CONFIG shows (ptxas -v, bench/attention_compile.py): wgmma, K / V by TMA, 3 stages, 225 KiB of
#: shared memory and 206 registers, so one program per SM; every ``wgmma.wait_group`` is 0 and CTA-wide
#: bar.sync keep its two warpgroups in lockstep, so its tensor cores idle during the softmax (Triton 3.6 does
#: not warp-specialize this loop on sm_90a).  Two programs per SM overlap one's softmax with the other's
#: wgmma: hence GPU_CONFIG / GPU_SHORT_CONFIG.  Lost in the sweep: 64 x 128 and 64 x 64 with 2 or 4 stages,
#: 64 x 64 without TMA, 128 x 64 with 8 warps and 3 stages, 128 x 128 with 2 stages, the persistent grid.
LEVER_CONFIGS = (
    AttnConfig(64, 64, 4, 3, tma=True, heads_first=True),
)
#: small tiles for the simulator (the interpreter's cost grows with the tile)
SIM_CONFIG = AttnConfig(16, 16, 1, 1, tma=False)

# which core a call runs (issue 52 items 3 and 5): kernels/attention_choice.py
from .attention_choice import (CoreChoice, DeviceKind, choose_core, clear_core_cache, device_kind,  # noqa: E402
                               resolve_core)


# ===========================================================================
# kernels
# ===========================================================================

@ditron.jit
def ring_attn_stage_kernel(k_ptr, v_ptr, kbuf_ptr, vbuf_ptr, sig_ptr, calls_ptr, n_head, maxbh, region,
                           WORLD: tl.constexpr, NSPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``(kv head bh, piece sp)``: copy the piece of this rank's K and
    V of head ``bh`` (``n_head`` elements each) into its own buffers (parity
    ``e % 2``), then set word ``[e % 2][me][bh][sp]`` on every peer to ``e + 1``."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    e = epoch_begin(calls_ptr)
    flag = (e + 1).to(tl.int32)
    par = e % 2
    me = dl.rank()
    piece = (n_head + NSPLIT - 1) // NSPLIT
    lo = sp * piece
    hi = tl.minimum(lo + piece, n_head)
    base = bh.to(tl.int64) * n_head
    kb = kbuf_ptr + par * region + base
    vb = vbuf_ptr + par * region + base
    offs = tl.arange(0, BLOCK)
    for i in range(lo, hi, BLOCK):
        o = i + offs
        m = o < hi
        tl.store(kb + o, tl.load(k_ptr + base + o, mask=m), mask=m)
        tl.store(vb + o, tl.load(v_ptr + base + o, mask=m), mask=m)
    word = sig_ptr + par * (WORLD * maxbh * NSPLIT) + (me * maxbh + bh) * NSPLIT + sp
    for k in tl.static_range(1, WORLD):
        dl.notify(word, (me + k) % WORLD, signal=flag, sig_op="set", comm_scope="intra_node")


@triton.jit
def _ring_attn_tile(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kbuf_ptr, vbuf_ptr, sig_ptr, kdesc, vdesc, t, bhq,
                    S, C, HQ, HKV, maxbh, region, qk_scale, flag, par,
                    WORLD: tl.constexpr, NCH: tl.constexpr, CAUSAL: tl.constexpr, HEAD_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NSPLIT: tl.constexpr, TMA: tl.constexpr,
                    WAIT: tl.constexpr):
    """Query tile ``t`` (over this rank's chunks) of head ``bhq`` (= batch * Hq + head): every source in
    ring order (module docstring), then the output rows and LSE."""
    nqt = (C + BLOCK_M - 1) // BLOCK_M
    qh = t // nqt
    m0 = (t % nqt) * BLOCK_M
    b = bhq // HQ
    kvh = (bhq % HQ) // (HQ // HKV)
    bkv = b * HKV + kvh
    me = dl.rank()
    qg = chunk_id(me, qh, WORLD, NCH)
    offs_m = tl.arange(0, BLOCK_M)
    qidx = m0 + offs_m                   # index within the query chunk
    row_ok = qidx < C
    rows = qh * C + qidx                 # row within this rank's shard
    head_q = bhq.to(tl.int64) * S * HEAD_D
    head_kv = bkv.to(tl.int64) * S * HEAD_D
    offs_d = tl.arange(0, HEAD_D)
    q = tl.load(q_ptr + head_q + rows[:, None] * HEAD_D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    acc = tl.full([BLOCK_M, HEAD_D], 0.0, tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    m_i = tl.full([BLOCK_M], M_INIT, tl.float32)
    # this rank's own K / V first (no wait: the peers stage theirs meanwhile)
    acc, l_i, m_i = attend_source(acc, l_i, m_i, q, k_ptr + head_kv, v_ptr + head_kv, kdesc, vdesc, bkv, qidx, m0,
                                  qg, me, C, qk_scale, WORLD, NCH, CAUSAL, TMA, BLOCK_M, BLOCK_N, HEAD_D)
    if WORLD > 1:
        for s in range(1, WORLD):
            src = (me + WORLD - s) % WORLD
            kb = dl.symm_at(kbuf_ptr + par * region + head_kv, src)
            vb = dl.symm_at(vbuf_ptr + par * region + head_kv, src)
            if WAIT:
                tok = dl.wait(sig_ptr + par * (WORLD * maxbh * NSPLIT) + (src * maxbh + bkv) * NSPLIT, NSPLIT,
                              "sys", "acquire", waitValue=flag)
                kb = dl.consume_token(kb, tok)
                vb = dl.consume_token(vb, tok)
            acc, l_i, m_i = attend_source(acc, l_i, m_i, q, kb, vb, 0, 0, bkv, qidx, m0, qg, src, C, qk_scale,
                                          WORLD, NCH, CAUSAL, False, BLOCK_M, BLOCK_N, HEAD_D)
    store_rows(o_ptr + head_q, lse_ptr + bhq.to(tl.int64) * S, acc, l_i, m_i, rows, row_ok, HEAD_D)


@ditron.jit
def ring_attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kbuf_ptr, vbuf_ptr, sig_ptr, calls_ptr,
                         S, C, HQ, HKV, nbkv, maxbh, region, qk_scale, nbh,
                         WORLD: tl.constexpr, NCH: tl.constexpr, CAUSAL: tl.constexpr, HEAD_D: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NSPLIT: tl.constexpr, TMA: tl.constexpr,
                         WAIT: tl.constexpr, PERSISTENT: tl.constexpr = False, HEADS_FIRST: tl.constexpr = False):
    """Program ``(query tile, batch * Hq + head)``, or with ``PERSISTENT`` a
    1-D grid of programs that each take tiles ``pid, pid + P, ...`` of the
    ``nqt * NCH * nbh`` tiles (``nbh`` = batch * Hq; TMA descriptors made once
    per program).  Causal: the longest tiles first (with ``HEADS_FIRST`` the
    grid is ``(batch * Hq, query tiles)``: those of every head first).
    ``WAIT`` is False only in the planted-bug test (the peers' data are read
    without waiting)."""
    nqt = (C + BLOCK_M - 1) // BLOCK_M
    if TMA:
        kdesc = tl.make_tensor_descriptor(k_ptr, shape=[nbkv, S, HEAD_D], strides=[S * HEAD_D, HEAD_D, 1],
                                          block_shape=[1, BLOCK_N, HEAD_D])
        vdesc = tl.make_tensor_descriptor(v_ptr, shape=[nbkv, S, HEAD_D], strides=[S * HEAD_D, HEAD_D, 1],
                                          block_shape=[1, BLOCK_N, HEAD_D])
    else:
        kdesc = 0
        vdesc = 0
    if WORLD > 1:
        e = epoch_begin(calls_ptr)
        flag = (e + 1).to(tl.int32)
        par = e % 2
    else:
        flag = 0
        par = 0
    if PERSISTENT:
        ntq = NCH * nqt
        for i in range(tl.program_id(0), ntq * nbh, tl.num_programs(0)):
            if CAUSAL:
                # tile rank i // nbh over every head: the longest tiles of all heads first
                t = ntq - 1 - i // nbh
                bhq = i % nbh
            else:
                t = i % ntq
                bhq = i // ntq
            _ring_attn_tile(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kbuf_ptr, vbuf_ptr, sig_ptr, kdesc, vdesc, t, bhq,
                            S, C, HQ, HKV, maxbh, region, qk_scale, flag, par, WORLD, NCH, CAUSAL, HEAD_D,
                            BLOCK_M, BLOCK_N, NSPLIT, TMA, WAIT)
    else:
        if HEADS_FIRST:
            t = tl.program_id(1)
            bhq = tl.program_id(0)
        else:
            t = tl.program_id(0)
            bhq = tl.program_id(1)
        if CAUSAL:
            t = NCH * nqt - 1 - t            # the longest tiles first
        _ring_attn_tile(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kbuf_ptr, vbuf_ptr, sig_ptr, kdesc, vdesc, t,
                        bhq, S, C, HQ, HKV, maxbh, region, qk_scale, flag, par, WORLD, NCH, CAUSAL,
                        HEAD_D, BLOCK_M, BLOCK_N, NSPLIT, TMA, WAIT)
    if WORLD > 1:
        epoch_end(calls_ptr)


# ===========================================================================
# host API
# ===========================================================================

def shard(x, rank, world_size, layout="zigzag", dim=2):
    """This rank's rows of a whole-sequence tensor ``x`` (sequence along
    ``dim``) in ``layout``."""
    n = x.shape[dim]
    if layout not in LAYOUTS:
        raise ditron.DitronError(f"shard: unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if world_size == 1:
        return x.contiguous()
    if layout == "contiguous":
        if n % world_size:
            raise ditron.DitronError(f"shard: sequence {n} is not a multiple of the world size {world_size}")
        s = n // world_size
        return x.narrow(dim, rank * s, s).contiguous()
    if n % (2 * world_size):
        raise ditron.DitronError(f"shard: zig-zag needs a sequence that is a multiple of 2 x world size "
                                 f"({2 * world_size}); got {n}")
    c = n // (2 * world_size)
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world_size - 1 - rank) * c, c)], dim)


def unshard(parts, layout="zigzag", dim=2):
    """The whole-sequence tensor from every rank's shard (``parts[r]``)."""
    W = len(parts)
    if layout == "contiguous" or W == 1:
        return torch.cat(list(parts), dim)
    c = parts[0].shape[dim] // 2
    chunks = [None] * (2 * W)
    for r, p in enumerate(parts):
        chunks[r] = p.narrow(dim, 0, c)
        chunks[2 * W - 1 - r] = p.narrow(dim, c, c)
    return torch.cat(chunks, dim)


class RingAttentionContext(CollectiveContext):
    """Staging buffers and signal words of :func:`ring_attention` (see
    :func:`create_ring_attention_context`)."""

    op = "ring_attention"
    creator = "create_ring_attention_context"

    def __init__(self, max_batch, max_seq, kv_heads, head_dim, dtype, world=None):
        if dtype not in _DTYPES:
            raise ditron.DitronError(f"ring_attention: dtype {dtype} is not supported (use float16 or bfloat16)")
        for name, val in (("max_batch", max_batch), ("max_seq", max_seq), ("kv_heads", kv_heads)):
            if int(val) < 1:
                raise ditron.DitronError(f"ring_attention: {name}={val} must be >= 1")
        if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
            raise ditron.DitronError(f"ring_attention: head_dim={head_dim} must be a power of two in [16, 256]")
        super().__init__(int(max_batch) * int(kv_heads) * int(max_seq) * int(head_dim), dtype, world)
        w = self.world
        if w.nnodes > 1 or w.local_world_size != w.world_size:
            raise ditron.DitronError(f"ring_attention: the world spans {w.nnodes} nodes; this kernel reads peers' "
                                     "K/V by load/store and needs every rank on one node")
        self.max_batch, self.max_seq, self.kv_heads, self.head_dim = int(max_batch), int(max_seq), int(kv_heads), \
            int(head_dim)
        self.maxbh = self.max_batch * self.kv_heads
        self.numel_factor = 1 << 30        # sizes are checked per dimension (_check_inputs), not by numel
        self.sim = w.backend == "sim"
        self.nsplit = SIM_NSPLIT if self.sim else GPU_NSPLIT
        W = self.world_size
        # W == 1: nothing travels, the kernel reads the caller's K / V only
        self.region = self.max_numel if W > 1 else 0
        self.kbuf = self.symm((max(1, 2 * self.region),), dtype, "kbuf")
        self.vbuf = self.symm((max(1, 2 * self.region),), dtype, "vbuf")
        self.sig = self.symm((2 * W * self.maxbh * self.nsplit,), torch.int32, "sig")
        ditron.barrier_all()

    def __repr__(self):
        return (f"RingAttentionContext(max_batch={self.max_batch}, max_seq={self.max_seq}, kv_heads={self.kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, world_size={self.world_size})")


def create_ring_attention_context(max_batch, max_seq, kv_heads, head_dim, dtype, world=None):
    """Allocate (collectively) the buffers of :func:`ring_attention` for up to
    ``max_batch`` x ``kv_heads`` KV heads of ``max_seq`` rows per rank and
    ``head_dim`` (a power of two in [16, 256]), float16 or bfloat16.  At world
    size 1 nothing is staged and the buffers are tiny."""
    return RingAttentionContext(max_batch, max_seq, kv_heads, head_dim, dtype, world)


def _heads_first(cfg, causal):
    """The ``HEADS_FIRST`` of a launch: only a causal, non-persistent grid orders by tile length."""
    return bool(cfg.heads_first and causal and not cfg.persistent)


def _grid(cfg, nch, C, nbh, device, sim, causal=False):
    """The launch grid: ``(query tiles, batch * Hq)`` (``(batch * Hq, query tiles)`` with
    :func:`_heads_first`), or with ``cfg.persistent`` one program per SM (two on the simulator) looping
    over the tiles."""
    tiles = nch * cdiv(C, cfg.block_m)
    if not cfg.persistent:
        return (nbh, tiles) if _heads_first(cfg, causal) else (tiles, nbh)
    return (min(tiles * nbh, 2 if sim else sm_count(device)),)


def _launch_opts(cfg, sim):
    """Backend options of the launch beyond warps and stages (GPUs only)."""
    return {"maxnreg": cfg.maxnreg} if cfg.maxnreg and not sim else {}


def default_config(device, seq=None, causal=False, world_size=1) -> AttnConfig:
    """The config for ``device``, a whole sequence of ``seq`` keys (all ranks), ``causal`` and the world
    size: the simulator's tiles, else the first entry of :data:`RING_TABLE` (:data:`RING_TABLE_MULTI`
    with several ranks) that covers the shape (GPU_CONFIG when ``seq`` is unknown)."""
    if torch.device(device).type == "cpu":
        return SIM_CONFIG
    if seq is None:
        return GPU_CONFIG
    for max_seq, c, cfg in (RING_TABLE if world_size == 1 else RING_TABLE_MULTI):
        if seq <= max_seq and (c is None or c == bool(causal)):
            return cfg
    return GPU_CONFIG



def _check_inputs(ctx, q, k, v, layout):
    E = ditron.DitronError
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise E(f"ring_attention: argument '{name}' must be a 4-D tensor [batch, heads, seq, head_dim]")
        ctx.check_tensor(t, name)
    B, HQ, S, D = q.shape
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or k.shape[2] != S or k.shape[3] != D:
        raise E(f"ring_attention: k {tuple(k.shape)} and v {tuple(v.shape)} must be [batch={B}, kv_heads, seq={S}, "
                f"head_dim={D}] like q {tuple(q.shape)}")
    HKV = k.shape[1]
    if HQ % HKV:
        raise E(f"ring_attention: q has {HQ} heads, not a multiple of k's {HKV} heads (GQA)")
    if D != ctx.head_dim:
        raise E(f"ring_attention: head_dim {D}, the context was created for head_dim={ctx.head_dim}")
    if B * HKV > ctx.maxbh or S > ctx.max_seq:
        raise E(f"ring_attention: {B} x {HKV} KV heads of {S} rows; the context holds up to {ctx.max_batch} x "
                f"{ctx.kv_heads} heads of {ctx.max_seq} rows: create a larger context")
    if layout not in LAYOUTS:
        raise E(f"ring_attention: unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if layout == "zigzag" and ctx.world_size > 1 and S % 2:
        raise E(f"ring_attention: zig-zag sharding gives each rank two chunks of equal length; this rank's "
                f"sequence has {S} rows (odd)")
    if S == 0:
        raise E("ring_attention: empty sequence")


def ring_attention(q, k, v, ctx: RingAttentionContext, causal=False, layout=None, sm_scale=None,
                   config=None, return_lse=False, out=None, _plant_no_wait=False, core=None):
    """This rank's rows of attention over the whole sequence (module
    docstring).  Collective: every rank calls it with the same shapes,
    ``causal``, ``layout`` and ``config``.  Returns ``out`` (``[B, Hq, S, D]``)
    or ``(out, lse)`` with the fp32 natural-log log-sum-exp ``[B, Hq, S]``.

    ``core``: None (the default: :func:`resolve_core` -- the Gluon core on a Hopper GPU at world size 1 where
    it takes the shape, with the config of the GPU's measured table; else the tl core), ``"tl"`` (``config``
    an :class:`AttnConfig` or None: :func:`default_config`) or ``"gluon"``: the warp-specialised Gluon core
    (kernels/attention_hopper.py; ``config`` a ``HopperAttnConfig`` or None) at world size 1 on a Hopper GPU
    -- refused elsewhere (the simulator, other GPUs, several ranks) with a message naming its tl twin."""
    if core is not None and core not in CORES:
        raise ditron.DitronError(f"ring_attention: core={core!r}; use one of {', '.join(CORES)}")
    if layout is None:
        layout = "zigzag" if causal else "contiguous"
    seq = q.shape[2] * ctx.world_size if isinstance(q, torch.Tensor) and q.dim() == 4 and \
        isinstance(ctx, RingAttentionContext) else None
    world = ctx.world_size if isinstance(ctx, RingAttentionContext) else 1
    if core is None:
        choice = resolve_core(q, k, causal, world, None, config)
        core, config = choice.core, choice.config
    if core == "gluon":
        cfg = _gluon_config("ring_attention", config)
    else:
        if config is not None and not isinstance(config, AttnConfig):
            raise ditron.DitronError(f"ring_attention: core='tl' takes an AttnConfig (or None), not {config!r}")
        cfg = (config or default_config(q.device, seq, causal, world)).validate()
    enter(ctx, RingAttentionContext, "ring_attention",
          [("q.shape", tuple(q.shape) if isinstance(q, torch.Tensor) else None),
           ("k.shape", tuple(k.shape) if isinstance(k, torch.Tensor) else None),
           ("causal", bool(causal)), ("layout", layout),
           ("config", cfg.label() if core == "gluon" else cfg.short())], q=q, k=k, v=v, out=out)
    _check_inputs(ctx, q, k, v, layout)
    if core == "gluon":
        if ctx.world_size > 1:
            raise ditron.DitronError(f"ring_attention: core='gluon' runs at world size 1 only (the Gluon core has no "
                                     f"ring loop over peers' K / V yet); this world has {ctx.world_size} ranks: use "
                                     "core='tl'")
        if out is not None:
            ctx.check_tensor(out, "out", numel=q.numel())
        res = _run_gluon("ring_attention", q, k, v, causal, sm_scale, cfg, out)
        return res if return_lse else res[0]
    B, HQ, S, D = q.shape
    HKV = k.shape[1]
    W = ctx.world_size
    # one chunk per rank unless zig-zag matters (causal across ranks)
    nch = 2 if (layout == "zigzag" and causal and W > 1) else 1
    C = S // nch
    if out is None:
        out = torch.empty_like(q)
    else:
        ctx.check_tensor(out, "out", numel=q.numel())
    lse = torch.empty((B, HQ, S), dtype=torch.float32, device=q.device)
    scale = (1.0 / math.sqrt(D)) if sm_scale is None else float(sm_scale)
    tma = cfg.tma and not ctx.sim
    if tma:
        from .gemm import ensure_tma_allocator
        ensure_tma_allocator()
    if W > 1:
        block = STAGE_BLOCK_SIM if ctx.sim else STAGE_BLOCK_GPU
        ring_attn_stage_kernel[(B * HKV, ctx.nsplit)](k, v, ctx.kbuf, ctx.vbuf, ctx.sig, ctx.calls, S * D,
                                                      ctx.maxbh, ctx.region, WORLD=W, NSPLIT=ctx.nsplit,
                                                      BLOCK=block, num_warps=4)
    ring_attn_fwd_kernel[_grid(cfg, nch, C, B * HQ, q.device, ctx.sim, causal)](
        q, k, v, out, lse, ctx.kbuf, ctx.vbuf, ctx.sig, ctx.calls, S, C, HQ, HKV, B * HKV, ctx.maxbh, ctx.region,
        scale * 1.4426950408889634, B * HQ, WORLD=W, NCH=nch, CAUSAL=bool(causal), HEAD_D=D, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, NSPLIT=ctx.nsplit, TMA=tma, WAIT=not _plant_no_wait, PERSISTENT=cfg.persistent,
        HEADS_FIRST=_heads_first(cfg, causal),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_launch_opts(cfg, ctx.sim))
    return (out, lse) if return_lse else out


def _gluon_config(op, config):
    """The validated ``HopperAttnConfig`` of a ``core="gluon"`` call (None: its default)."""
    from . import attention_hopper as H
    if config is not None and not isinstance(config, H.HopperAttnConfig):
        raise ditron.DitronError(f"{op}: core='gluon' takes a HopperAttnConfig (or None), not {config!r}")
    return config or H.DEFAULT_CONFIG


def _run_gluon(op, q, k, v, causal, sm_scale, cfg, out):
    """``(out, lse)`` from the Gluon core after its checks (kernels/attention_hopper.py), or the refusal
    naming the tl core where it cannot run."""
    from . import attention_hopper as H
    H.check_inputs(op, q, k, v, out, cfg)
    if q.device.type != "cuda" or not H.supported(q.device):
        where = "the simulator" if q.device.type == "cpu" else str(q.device)
        raise ditron.DitronError(f"{op}: core='gluon' (the warp-specialised Gluon core) runs on Hopper GPUs only, "
                                 f"not on {where}; use core='tl', its tl twin: config=attention_hopper.twin_config("
                                 f"cfg) = AttnConfig{dataclasses.astuple(H.twin_config(cfg))} (the same "
                                 f"{H.BLOCK_M} x {cfg.block_n} tiles and operation order)")
    return H.attention_hopper(q, k, v, causal=causal, sm_scale=sm_scale, config=cfg, out=out, return_lse=True)


def flash_attention(q, k, v, causal=False, sm_scale=None, config=None, return_lse=False, out=None, core=None):
    """Single-device attention with the same cores (no context, no
    communication): ``q`` ``[B, Hq, S, D]``, ``k`` / ``v`` ``[B, Hkv, S, D]``
    (any tensors, symmetric or not; contiguous), fp16 / bf16.  Used by
    Ulysses (kernels/ulysses.py) on its whole-sequence head shards.
    ``core``: None (the default: :func:`resolve_core` -- the Gluon core on a Hopper GPU where it takes the
    shape, else the tl core), ``"tl"`` (``config`` an :class:`AttnConfig`) or ``"gluon"`` (Hopper GPUs only;
    ``config`` a ``HopperAttnConfig``; D 64 or 128), as :func:`ring_attention`."""
    E = ditron.DitronError
    if core is not None and core not in CORES:
        raise E(f"flash_attention: core={core!r}; use one of {', '.join(CORES)}")
    if core is None:
        choice = resolve_core(q, k, causal, 1, None, config)
        core, config = choice.core, choice.config
    if core == "gluon":
        res = _run_gluon("flash_attention", q, k, v, causal, sm_scale, _gluon_config("flash_attention", config), out)
        return res if return_lse else res[0]
    if config is not None and not isinstance(config, AttnConfig):
        raise E(f"flash_attention: core='tl' takes an AttnConfig (or None), not {config!r}")
    cfg = (config or default_config(q.device, q.shape[2] if q.dim() == 4 else None, causal)).validate(
        "flash_attention")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_contiguous() or t.dtype not in _DTYPES:
            raise E(f"flash_attention: argument '{name}' must be a contiguous 4-D float16 / bfloat16 tensor")
    B, HQ, S, D = q.shape
    HKV = k.shape[1]
    if k.dtype != q.dtype or v.dtype != q.dtype or tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or \
            k.shape[2] != S or k.shape[3] != D or HQ % HKV or D < 16 or D > 256 or D & (D - 1):
        raise E(f"flash_attention: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} "
                f"{v.dtype}: need k / v [B, Hkv, S, D] of q's dtype, Hq a multiple of Hkv, D a power of two in [16, 256]")
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty((B, HQ, S), dtype=torch.float32, device=q.device)
    tma = cfg.tma and q.device.type != "cpu"
    if tma:
        from .gemm import ensure_tma_allocator
        ensure_tma_allocator()
    scale = (1.0 / math.sqrt(D)) if sm_scale is None else float(sm_scale)
    sim = q.device.type == "cpu"
    ring_attn_fwd_kernel[_grid(cfg, 1, S, B * HQ, q.device, sim, causal)](
        q, k, v, out, lse, k, v, lse, lse, S, S, HQ, HKV, B * HKV, B * HKV, 0, scale * 1.4426950408889634, B * HQ,
        WORLD=1, NCH=1, CAUSAL=bool(causal), HEAD_D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NSPLIT=1, TMA=tma,
        WAIT=True, PERSISTENT=cfg.persistent, HEADS_FIRST=_heads_first(cfg, causal), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **_launch_opts(cfg, sim))
    return (out, lse) if return_lse else out


__all__ = ["AttnConfig", "RingAttentionContext", "flash_attention", "create_ring_attention_context", "ring_attention", "shard",
           "unshard", "LAYOUTS", "TUNE_CONFIGS", "LEVER_CONFIGS", "GPU_CONFIG", "GPU_SHORT_CONFIG", "SHORT_SEQ", "SIM_CONFIG",
           "default_config", "RING_TABLE", "RING_TABLE_MULTI", "HOPPER_CONFIG", "GPU_CAUSAL_SHORT_CONFIG", "CORES",
           "DeviceKind", "CoreChoice", "choose_core", "resolve_core", "device_kind", "clear_core_cache"]
