"""The attention forward core for Hopper (sm_90a) in Gluon: warp-specialised, FlashAttention-3 style.

    from ditron.kernels.attention_hopper import attention_hopper, HopperAttnConfig
    o, lse = attention_hopper(q, k, v, causal=True)      # q [B, Hq, S, D], k / v [B, Hkv, S, D], CUDA sm_90
    o = flash_attention(q, k, v, causal=True, core="gluon")   # the same through kernels/attention.py

Why
---
The ``tl`` core (kernels/attention_core.py) runs one warpgroup pipeline per
program: the warps that issue ``wgmma`` also compute the softmax, so the
tensor cores idle during every exp2 / row reduction (bench/results/
h100-2026-12-07d-attention-levers: 0.82x SDPA cuDNN on H100, no ``tl`` lever
above 0.84x).  cuDNN and FlashAttention-3 split the work explicitly; this core
does the same in Gluon (kernels/gemm_hopper.py is the GEMM counterpart):

* a **producer** partition (one warp, ``setmaxnreg``-lowered) loads the
  program's Q tile once, then streams K and V tiles with TMA into two
  ``stages``-deep rings of shared memory (a K ring and a V ring: Q K^T of
  tile j+1 is issued before P V of tile j, so K runs one tile ahead of V);
* two **consumer** warpgroups (4 warps each, ``setmaxnreg``-raised) own 64
  query rows each of the program's 128-row Q tile and share the K / V tiles
  (each ring slot is released by both: ``empty`` barriers of count 2);
* **intra-warpgroup overlap**: a consumer issues ``S_{j+1} = Q K_{j+1}^T``
  and ``O += P_j V_j`` back to back (asynchronous ``wgmma``), waits only for
  the first, and runs the softmax of ``S_{j+1}`` while ``P_j V_j`` is still
  on the tensor cores (P stays in registers: the A operand of the second
  ``wgmma``);
* **ping-pong** (``pingpong=True``): the two consumers issue their ``wgmma``
  pairs in turn (``turn`` mbarriers), so that one warpgroup's softmax runs
  while the other's GEMMs occupy the tensor cores.

Pipeline (who waits on which barrier)
-------------------------------------
Barriers (shared memory, ``mbarrier``): ``q_bar`` (count 1, TMA transaction
bytes), ``k_ready[s]`` / ``v_ready[s]`` (count 1, TMA bytes), ``k_empty[s]``
/ ``v_empty[s]`` (count 2: one arrival per consumer), ``turn[c]`` (count 1).
The ``n``-th use of a ring slot ``s = n % STAGES`` is phase ``(n // STAGES)
& 1``; a fresh barrier counts as having completed the phase "before" phase
0, so the producer's first wait on an ``empty`` barrier (parity 1) passes
and the rings start empty.  Key tile ``j`` of the program:

* producer: wait ``k_empty[j % S]`` (parity ``((j // S) & 1) ^ 1``), expect
  + TMA load K_j onto ``k_ready``; the same for V_j on ``v_empty`` / ``v_ready``;
* consumer c, prologue: wait ``q_bar`` (phase 0); [turn]; wait ``k_ready``
  of tile 0, issue S_0; [pass the turn]; wait for S_0; arrive ``k_empty``;
  softmax(S_0) -> P_0;
* consumer c, tile j >= 1: [wait ``turn[c]``]; wait ``k_ready`` of tile j,
  issue S_j; wait ``v_ready`` of tile j-1, issue O += P_{j-1} V_{j-1};
  [arrive ``turn[1-c]``]; ``wgmma.wait_group 1`` (S_j done: arrive
  ``k_empty`` of tile j); softmax(S_j) -> P_j, alpha_j (overlapping the PV
  ``wgmma``); ``wait_group 0`` (arrive ``v_empty`` of tile j-1); O *= alpha_j;
* consumer c, epilogue: [turn]; wait ``v_ready`` of the last tile, issue the
  last PV; [pass]; wait; arrive ``v_empty``; O / l and the LSE to global
  memory (masked stores: rows past the sequence are never written).

Both consumers take ``n + 1`` turns (n: the program's key tiles, the same for
both), so the ping-pong waits stay paired: consumer c's i-th wait on
``turn[c]`` is for parity ``(i & 1) ^ (1 - c)`` (consumer 0's first passes,
consumer 1's first waits for consumer 0's first arrive), kernels/gemm_hopper.py's
scheme.  A consumer never waits for a ring phase more than one ahead of the
producer's (the slot cannot be reused before both consumers released it), so
the parity waits are sound.

Numerics (the ``tl`` core's, kernels/attention_core.py): scores scaled by
``sm_scale * log2(e)`` (one FMA into the exp2), running maximum from a finite
``-1e30`` (a fully masked row gives p = 0, no NaN), P rounded to the input
dtype before P V, fp32 accumulation, ``o = acc / l`` (l = 0 -> 1), the LSE in
natural log ``(m + log2 l) * ln 2``.

The ``tl`` twin (:func:`twin_config`: the tl core on the same 128 x ``block_n``
tiles) performs the same operations in the same order on every element, so it
is meant to give the same bits: per key tile j, ascending from key 0 in both
(causal: the tiles left of the diagonal unmasked, the diagonal / tail tiles
masked to ``-inf``, which changes no unmasked score), ``S = Q K_j^T`` on
``wgmma`` from a zero accumulator (D / 16 k-steps in order), ``m_new =
max(m, rowmax(S) * c)``, ``p = exp2(S * c - m_new)``, ``alpha = exp2(m -
m_new)``, ``l = l * alpha + rowsum(p)``, ``O = O * alpha`` then ``O += bf16(p)
V_j`` (the Gluon consumer multiplies by ``alpha_j`` after ``P_{j-1} V_{j-1}``
and before ``P_j V_j``: the same sequence), ``O / l``.  Both lower through the
same Triton ops (``math.exp2`` -> ``ex2.approx``, one ``tt.reduce`` per row
statistic on the same per-warp ``wgmma`` accumulator layout: 16 rows per warp,
4 lanes per row, the same in-thread then butterfly order; fp32 division) and
the same LLVM FMA contraction.  What could still differ is LLVM's contraction
or scheduling choices on the two kernels' different control flow; the GPU
test tests/gpu/attention_hopper_twin.py is the judge (it prints the number of
differing entries and the largest difference when they are not identical).

Masks: key ``n`` of a tile is masked when ``n >= S`` (the tail: its rows are
the next head's or TMA zeros past the tensor) or, causal, ``n > row``; a
tile is masked only where some key of it can be (a uniform branch per tile).
Rows past ``S`` of the last query tile are computed on the next head's rows
and never stored.

Where it runs: NVIDIA sm_90 only (:func:`supported`), world size 1 (the
whole sequence on one GPU): kernels/attention.py ``flash_attention`` /
``ring_attention`` pick it by default there (``resolve_core``: head dim 64 or
128, fp16 / bf16, contiguous; the config from the GPU's measured table,
kernels/attention_tables/), or with ``core="gluon"``.  The simulator and other
GPUs run the ``tl`` core; :func:`attention_hopper` refuses a CPU tensor and
names the twin (:data:`TWIN`).
"""
from __future__ import annotations

import dataclasses
import math

import torch

import ditron
from ditron import _compat

from ._common import cdiv

gluon, gl, _hopper = _compat.gluon_hopper()
mbarrier = _hopper.mbarrier
tma_load, _tma_store = _compat.gluon_tma_ops()
warpgroup_mma, warpgroup_mma_wait = _hopper.warpgroup_mma, _hopper.warpgroup_mma_wait

_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
LOG2E = 1.4426950408889634
#: query rows per consumer warpgroup (one wgmma M of 64 per warpgroup) and per program (two consumers)
WG_ROWS = 64
BLOCK_M = 2 * WG_ROWS
HEAD_DIMS = (64, 128)
SMEM_LIMIT = 227 * 1024

TWIN = ("ditron.kernels.attention.flash_attention (the tl core: core='tl', "
        "config=attention_hopper.twin_config(cfg) -- the same tiles and operation order)")


@dataclasses.dataclass(frozen=True)
class HopperAttnConfig:
    """A launch of the Gluon core: 128 query rows per program (two consumer warpgroups of 64), ``block_n``
    keys per K / V tile, ``stages``-deep K and V rings, ping-pong between the consumers or not, registers
    per thread of the consumers and of the producer (``setmaxnreg``)."""
    block_n: int = 128
    stages: int = 2
    pingpong: bool = True
    consumer_regs: int = 240
    producer_regs: int = 24

    block_m = BLOCK_M

    def smem_bytes(self, head_d=128, elem=2) -> int:
        """Q tile + K and V rings + barriers."""
        return (BLOCK_M * head_d + 2 * self.stages * self.block_n * head_d) * elem + (4 * self.stages + 3) * 8

    def validate(self, op="attention_hopper", head_d=128):
        E = ditron.DitronError
        if self.block_n not in (64, 128):
            raise E(f"{op}: block_n={self.block_n} must be 64 or 128 (a 64 x block_n fp32 score tile per "
                    "consumer warpgroup beside its 64 x head_dim accumulator)")
        if head_d not in HEAD_DIMS:
            raise E(f"{op}: head_dim={head_d}; the Gluon core takes {' or '.join(map(str, HEAD_DIMS))} "
                    f"(other head dims: the tl core, {TWIN})")
        if self.stages < 2:
            raise E(f"{op}: stages={self.stages} must be >= 2 (K runs one tile ahead of V)")
        smem = self.smem_bytes(head_d)
        if smem > SMEM_LIMIT:
            raise E(f"{op}: {smem} bytes of shared memory (Q {BLOCK_M}x{head_d}, {self.stages} stages of K and V "
                    f"{self.block_n}x{head_d}) exceed sm_90's 227 KiB: fewer stages or block_n=64")
        for name in ("consumer_regs", "producer_regs"):
            v = getattr(self, name)
            if v % 8 or not 24 <= v <= 256:
                raise E(f"{op}: {name}={v} must be a multiple of 8 in [24, 256] (setmaxnreg)")
        if 256 * self.consumer_regs + 128 * self.producer_regs > 65536:
            raise E(f"{op}: two consumer warpgroups of {self.consumer_regs} and a producer warpgroup of "
                    f"{self.producer_regs} registers per thread exceed the SM's 64K registers")
        return self

    def label(self) -> str:
        return (f"gluon ws 128x{self.block_n} s{self.stages}{' pingpong' if self.pingpong else ''}"
                + (f" r{self.consumer_regs}/{self.producer_regs}" if (self.consumer_regs, self.producer_regs)
                   != (240, 24) else ""))


DEFAULT_CONFIG = HopperAttnConfig()
#: what bench/attention_core_levers.py times (H100, 2026-12-07: bench/results/h100-2026-12-07e-attention-gluon/;
#: the first, DEFAULT_CONFIG, was the best: geomean 1.016x SDPA cuDNN)
CONFIGS = (
    HopperAttnConfig(128, 2, True),
    HopperAttnConfig(128, 2, False),
    HopperAttnConfig(64, 2, True),
    HopperAttnConfig(64, 3, True),
    HopperAttnConfig(128, 3, True),
)


def supported(device) -> bool:
    """Whether the Gluon core runs on ``device``: a CUDA GPU of compute capability 9.x (Hopper).  Queries the
    device only when asked."""
    device = torch.device(device)
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def twin_config(cfg: HopperAttnConfig | None = None):
    """The ``tl`` twin of a Gluon config: kernels/attention.py's :class:`AttnConfig` with the same tiles
    (``128 x block_n``; 8 warps: two warpgroups of 64 query rows, like the two consumers; TMA for K / V on a
    GPU, pointer loads on the simulator) -- the tl core then performs the same operations in the same order
    on every score and output element (the module docstring's "Numerics"), which
    tests/gpu/attention_hopper_twin.py checks bit for bit on a Hopper GPU.  The simulator runs this config
    where a GPU runs the Gluon core."""
    from .attention import AttnConfig
    cfg = cfg or DEFAULT_CONFIG
    return AttnConfig(BLOCK_M, cfg.block_n, 8, 3, tma=True)


# ---------------------------------------------------------------------------
# device code
# ---------------------------------------------------------------------------

@gluon.jit
def _tile_of_program(S, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """``(m0, n_tiles)``: the program's first query row and how many key tiles it reads (causal: the
    longest tiles first, keys ``[0, min(m0 + BM, S))``; else every key)."""
    t = gl.program_id(0)
    if CAUSAL:
        t = gl.cdiv(S, BM) - 1 - t
    m0 = t * BM
    if CAUSAL:
        n_tiles = gl.cdiv(gl.minimum(m0 + BM, S), BN)
    else:
        n_tiles = gl.cdiv(S, BN)
    return m0, n_tiles


@gluon.jit
def _kv_row(S, HQ, HKV):
    """First row of this program's KV head in the ``[B * Hkv * S, D]`` view (GQA: query head ``h`` reads KV
    head ``h // (Hq / Hkv)``)."""
    bh = gl.program_id(1)
    return ((bh // HQ) * HKV + (bh % HQ) // (HQ // HKV)) * S


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, S, HQ, HKV,
              CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """The TMA producer (one warp): the Q tile once, then K_j and V_j of every key tile j into their rings."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    m0, n_tiles = _tile_of_program(S, CAUSAL, BM, BN)
    kv0 = _kv_row(S, HQ, HKV)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [gl.program_id(1) * S + m0, 0], q_bar, q_smem)
    for j in range(n_tiles):
        s = j % STAGES
        ph = (j // STAGES) & 1
        # slot s is free once both consumers released its previous tile (fresh barrier: parity 1 passes)
        mbarrier.wait(k_empty.index(s), ph ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma_load(k_desc, [kv0 + j * BN, 0], k_ready.index(s), k_bufs.index(s))
        mbarrier.wait(v_empty.index(s), ph ^ 1)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma_load(v_desc, [kv0 + j * BN, 0], v_ready.index(s), v_bufs.index(s))


@gluon.jit
def _softmax_tile(s_acc, m_i, l_i, n0, rows, mask_from, S, qk_scale, s_layout: gl.constexpr, CAUSAL: gl.constexpr,
                  BN: gl.constexpr):
    """Online softmax of one score tile (keys ``n0 ...``): ``(p, alpha, m_new, l_new)`` with ``p`` in fp32,
    ``alpha = exp2(m_i - m_new)`` the factor of the accumulator.  The mask (keys >= S; causal: key > row) is
    applied only when the tile reaches ``mask_from`` (a uniform branch)."""
    if n0 + BN > mask_from:
        keys = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        ok = gl.expand_dims(keys < S, 0)
        if CAUSAL:
            ok = ok & (gl.expand_dims(keys, 0) <= gl.expand_dims(rows, 1))
        s_acc = gl.where(ok, s_acc, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s_acc, axis=1) * qk_scale)
    p = gl.exp2(s_acc * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def _consumer(q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn, o_ptr, lse_ptr, S, qk_scale,
              CID: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
              BN: gl.constexpr, D: gl.constexpr):
    """Consumer warpgroup ``CID`` (4 warps): query rows ``[m0 + 64 CID, m0 + 64 CID + 64)`` of the program's
    tile against every key tile (the module docstring's pipeline)."""
    BM: gl.constexpr = 2 * 64
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    m0, n_tiles = _tile_of_program(S, CAUSAL, BM, BN)
    r0 = m0 + CID * 64
    rows = r0 + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
    # tiles below mask_from need no mask: causal, every key < r0 is visible to every row of this warpgroup
    if CAUSAL:
        mask_from = r0
    else:
        mask_from = S
    q = q_smem.slice(CID * 64, 64, dim=0)
    m_i = gl.full([64], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([64], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    o_acc = gl.zeros([64, D], gl.float32, layout=o_layout)
    s_acc = gl.zeros([64, BN], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)

    # prologue: S_0 and its softmax
    if PINGPONG:
        mbarrier.wait(turn.index(CID), 1 ^ CID)
    mbarrier.wait(k_ready.index(0), 0)
    s_acc = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)), s_acc, use_acc=False, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - CID))
    s_acc = warpgroup_mma_wait(0, deps=(s_acc, ))
    mbarrier.arrive(k_empty.index(0))
    p, alpha, m_i, l_i = _softmax_tile(s_acc, m_i, l_i, 0, rows, mask_from, S, qk_scale, s_layout, CAUSAL, BN)
    p = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)

    for j in range(1, n_tiles):
        s = j % STAGES
        sp = (j - 1) % STAGES
        if PINGPONG:
            # this consumer's (j+1)-th turn (i = j): parity (j & 1) ^ (1 - CID)
            mbarrier.wait(turn.index(CID), (j & 1) ^ (1 - CID))
        mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
        s_acc = warpgroup_mma(q, k_bufs.index(s).permute((1, 0)), s_acc, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(sp), ((j - 1) // STAGES) & 1)
        o_acc = warpgroup_mma(p, v_bufs.index(sp), o_acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - CID))
        # S_j done (P_{j-1} V_{j-1} may still run): release K_j, softmax under the PV wgmma
        s_acc = warpgroup_mma_wait(1, deps=(s_acc, ))
        mbarrier.arrive(k_empty.index(s))
        p_new, alpha, m_i, l_i = _softmax_tile(s_acc, m_i, l_i, j * BN, rows, mask_from, S, qk_scale, s_layout,
                                               CAUSAL, BN)
        # P_{j-1} (the PV wgmma's register operand) stays live until the wait
        o_acc, p = warpgroup_mma_wait(0, deps=(o_acc, p))
        mbarrier.arrive(v_empty.index(sp))
        o_acc = o_acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout), assert_trivial=True), 1)
        p = gl.convert_layout(p_new.to(dtype), p_layout, assert_trivial=True)

    # epilogue: the last P V
    last = n_tiles - 1
    if PINGPONG:
        mbarrier.wait(turn.index(CID), (n_tiles & 1) ^ (1 - CID))
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    o_acc = warpgroup_mma(p, v_bufs.index(last % STAGES), o_acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - CID))
    o_acc, p = warpgroup_mma_wait(0, deps=(o_acc, p))
    mbarrier.arrive(v_empty.index(last % STAGES))

    # O / l and the natural-log LSE; rows past S (the next head's) are not stored
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    l_o = gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout), assert_trivial=True)
    o = (o_acc / gl.expand_dims(l_o, 1)).to(dtype)
    bh = gl.program_id(1)
    orows = r0 + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    optrs = o_ptr + (bh.to(gl.int64) * S + gl.expand_dims(orows, 1)) * D + gl.expand_dims(cols, 0)
    gl.store(optrs, o, mask=gl.expand_dims(orows < S, 1))
    gl.store(lse_ptr + bh.to(gl.int64) * S + rows, (m_i + gl.log2(l_safe)) * 0.6931471805599453, mask=rows < S)


@gluon.jit
def attn_fwd_ws_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, S, HQ, HKV, qk_scale, CAUSAL: gl.constexpr,
                       STAGES: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       PRODUCER_REGS: gl.constexpr):
    """Program ``(query tile, batch * Hq + head)`` of attention over ``[B, H, S, D]`` tensors seen as
    ``[B * H * S, D]`` (the descriptors; ``o_ptr`` / ``lse_ptr``: ``o`` ``[B, Hq, S, D]``, ``lse`` ``[B, Hq,
    S]`` fp32).  ``num_warps=4``: the default partition is consumer 0; workers: consumer 1 (4 warps), the
    producer (1 warp)."""
    dtype: gl.constexpr = q_desc.dtype
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = k_desc.block_type.shape[1]
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)        # both consumers release each slot
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    gl.warp_specialize([
        (_consumer, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn, o_ptr, lse_ptr, S,
                     qk_scale, 0, CAUSAL, STAGES, PINGPONG, BN, D)),
        (_consumer, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, turn, o_ptr, lse_ptr, S,
                     qk_scale, 1, CAUSAL, STAGES, PINGPONG, BN, D)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, S,
                     HQ, HKV, CAUSAL, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, _DTYPES[dtype])


def descriptors(q, k, v, cfg: HopperAttnConfig):
    """TMA descriptors of ``q`` (``[128, D]`` blocks), ``k`` and ``v`` (``[block_n, D]``), each tensor seen
    as ``[B * H * S, D]``."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    D = q.shape[-1]
    q2, k2, v2 = (t.reshape(-1, D) for t in (q, k, v))
    return (TensorDescriptor.from_tensor(q2, [BLOCK_M, D], _layout([BLOCK_M, D], q.dtype)),
            TensorDescriptor.from_tensor(k2, [cfg.block_n, D], _layout([cfg.block_n, D], k.dtype)),
            TensorDescriptor.from_tensor(v2, [cfg.block_n, D], _layout([cfg.block_n, D], v.dtype)))


def kernel_constexprs(cfg: HopperAttnConfig, causal) -> dict:
    return dict(CAUSAL=bool(causal), STAGES=cfg.stages, PINGPONG=bool(cfg.pingpong), CONSUMER_REGS=cfg.consumer_regs,
                PRODUCER_REGS=cfg.producer_regs)


def check_inputs(op, q, k, v, out=None, config=None):
    """Every check of a call, device-independent (so that a CPU call is refused for what a GPU would refuse
    too): returns the validated config."""
    E = ditron.DitronError
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise E(f"{op}: argument '{name}' must be a 4-D tensor [batch, heads, seq, head_dim]")
        if t.dtype not in _DTYPES:
            raise E(f"{op}: argument '{name}' is {t.dtype}; the Gluon core takes float16 / bfloat16")
        if not t.is_contiguous():
            raise E(f"{op}: argument '{name}' must be contiguous (TMA reads [B * H * S, D] rows)")
    B, HQ, S, D = q.shape
    if k.dtype != q.dtype or v.dtype != q.dtype or tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or \
            k.shape[2] != S or k.shape[3] != D:
        raise E(f"{op}: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}: "
                "need k / v [B, Hkv, S, D] of q's dtype")
    HKV = k.shape[1]
    if HKV == 0 or HQ % HKV:
        raise E(f"{op}: q has {HQ} heads, not a multiple of k's {HKV} heads (GQA)")
    if S == 0 or B == 0 or HQ == 0:
        raise E(f"{op}: empty input (q {tuple(q.shape)})")
    cfg = (config or DEFAULT_CONFIG)
    if not isinstance(cfg, HopperAttnConfig):
        raise E(f"{op}: config must be a HopperAttnConfig, not {type(cfg).__name__}")
    cfg.validate(op, D)
    if max(B * HQ, B * HKV) * S >= 2 ** 31:
        raise E(f"{op}: {B} x {HQ} heads x {S} rows exceed the int32 row coordinates of the TMA descriptors")
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape) or
                            out.dtype != q.dtype or not out.is_contiguous()):
        raise E(f"{op}: 'out' must be a contiguous {q.dtype} tensor of q's shape {tuple(q.shape)}")
    return cfg


def attention_hopper(q, k, v, causal=False, sm_scale=None, config: HopperAttnConfig | None = None, out=None,
                     return_lse=True):
    """Attention forward on the Gluon core: ``q`` ``[B, Hq, S, D]``, ``k`` / ``v`` ``[B, Hkv, S, D]``
    (contiguous, fp16 / bf16, D 64 or 128, any S), causal or not.  Returns ``(o, lse)`` -- ``o`` like ``q``,
    ``lse`` ``[B, Hq, S]`` fp32 natural-log log-sum-exp -- or ``o`` with ``return_lse=False``: the outputs of
    kernels/attention.py ``flash_attention(..., return_lse=True)``.  CUDA sm_90 only."""
    op = "attention_hopper"
    cfg = check_inputs(op, q, k, v, out, config)
    if q.device.type != "cuda":
        raise ditron.DitronError(f"{op}: the Gluon core runs on Hopper GPUs only; on {q.device} (the simulator) use "
                                 f"the tl twin {TWIN}")
    if not supported(q.device):
        raise ditron.DitronError(f"{op}: {torch.cuda.get_device_name(q.device)} is not sm_90 (Hopper); use the tl "
                                 f"core, {TWIN}")
    B, HQ, S, D = q.shape
    HKV = k.shape[1]
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty((B, HQ, S), dtype=torch.float32, device=q.device)
    scale = (1.0 / math.sqrt(D)) if sm_scale is None else float(sm_scale)
    q_desc, k_desc, v_desc = descriptors(q, k, v, cfg)
    attn_fwd_ws_kernel[(cdiv(S, BLOCK_M), B * HQ)](q_desc, k_desc, v_desc, out, lse, S, HQ, HKV, scale * LOG2E,
                                                   num_warps=4, **kernel_constexprs(cfg, causal))
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------
# compile on a CPU
# ---------------------------------------------------------------------------

def compile_sm90(cfg: HopperAttnConfig | None = None, causal=False, dtype=torch.bfloat16, head_d=128, S=1024,
                 HQ=4, HKV=2, target="sm_90a"):
    """Compile :func:`attn_fwd_ws_kernel` for ``target`` without a GPU (``triton.compile`` of a Gluon AST
    source); returns the compiled kernel (``.asm["ttgir"]``, ``["ptx"]``, ``.metadata``).  The descriptors'
    types come from descriptors on CPU tensors of the given shape."""
    from ditron.target import parse_target
    tgt = parse_target(target)
    if tgt.backend != "cuda" or tgt.capability != 90:
        raise ditron.DitronError(f"attention_hopper: the Gluon core is for sm_90a only, not {tgt.name}; on other "
                                 f"targets (AMD, other NVIDIA GPUs, the simulator) the core is the tl one, {TWIN}")
    cfg = (cfg or DEFAULT_CONFIG).validate("attention_hopper.compile_sm90", head_d)
    q = torch.empty((1, HQ, S, head_d), dtype=dtype)
    k = torch.empty((1, HKV, S, head_d), dtype=dtype)
    descs = descriptors(q, k, k, cfg)
    sig = {"q_desc": _compat.mangle_arg(descs[0]), "k_desc": _compat.mangle_arg(descs[1]),
           "v_desc": _compat.mangle_arg(descs[2]), "o_ptr": "*" + {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype],
           "lse_ptr": "*fp32", "S": "i32", "HQ": "i32", "HKV": "i32", "qk_scale": "fp32"}
    consts = kernel_constexprs(cfg, causal)
    for name in consts:
        sig[name] = "constexpr"
    src = _compat.gluon_ast_source(attn_fwd_ws_kernel, sig, consts)
    return _compat.compile_source(src, tgt.to_triton(), {"num_warps": 4})


__all__ = ["HopperAttnConfig", "DEFAULT_CONFIG", "CONFIGS", "TWIN", "supported", "twin_config", "attention_hopper",
           "attn_fwd_ws_kernel", "compile_sm90", "descriptors", "check_inputs"]
