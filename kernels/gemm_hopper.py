"""The GEMM core for Hopper (sm_90a) in Gluon: warp-specialised, persistent.

    from ditron.kernels.gemm_hopper import matmul_hopper, HopperGemmConfig
    c = matmul_hopper(a, b)                                   # a [M, K], b [K, N], fp16 / bf16, CUDA sm_90
    c = matmul_hopper(a, b, config=HopperGemmConfig(128, 128, 64, stages=4, mode="pingpong"))

Why
---
The ``tl.dot`` core (:mod:`ditron.kernels.gemm`) runs one warpgroup
pipeline per program: the same warps issue the TMA loads, the ``wgmma``s and
the epilogue.  ``tl.range(warp_specialize=True)`` does not split that loop on
sm_90 with Triton 3.6 or 3.9 (issue 52; see :func:`ws_partitions` and
tests/test_compile_gemm_hopper.py).  This core writes the split explicitly,
as cuBLAS / CUTLASS do on Hopper:

* a **producer** partition (one warp, few registers) streams A and B tiles
  with TMA into a ``stages``-deep ring of shared-memory buffers; each slot has
  a *ready* mbarrier (TMA transaction bytes) and an *empty* mbarrier (the
  consumers are done with it);
* two **consumer** warpgroups (4 warps each, ``setmaxnreg``-raised) issue
  asynchronous ``warpgroup_mma`` on the ring, keeping one in flight, and
  release each slot as soon as the MMA that read it has retired;
* the **epilogue** of a tile (fp32 -> fp16/bf16, registers -> shared memory
  -> TMA store) is asynchronous: the next tile's mainloop starts while the
  store drains (``tma.store_wait`` only before the staging buffer is reused).

Two consumer schedules (``mode``):

* ``"coop"`` (cooperative): both consumers work on the same ``BM x BN`` tile,
  consumer ``c`` on rows ``[c * BM/2, (c + 1) * BM/2)`` (128 x 256 tiles: 64 x
  256 fp32 per warpgroup).  Each slot is released by both (count 2).
* ``"pingpong"``: each consumer owns whole tiles, alternately (consumer 0 the
  program's even tiles, 1 the odd ones), ``BM x BN`` each.  The producer fills
  the ring in tile order, so the consumers' mainloops alternate by
  construction and one's epilogue runs under the other's mainloop.

The ring is shared; the slot / phase of every load is a function of the
program's running k-step count, which both sides compute the same way.

Tile order: ``dl.swizzle_2d``'s grouped order (the same formula), program
``p`` takes tiles ``p, p + P, ...`` like the ``tl`` core, so any signal
protocol keyed on tiles (issue 52 item 2) reads the same.

Hooks of the overlap kernels (:func:`ws_gemm_body`'s arguments; off by
default, so the plain GEMM and AG-GEMM compile to what they did):
``GATHER`` (AG-GEMM, kernels/ag_gemm_hopper.py): the producer polls a
segment's flag before loading its rows from the gather buffer;
``SCATTER`` / ``SIGNAL`` (GEMM-RS, kernels/gemm_rs_hopper.py): tiles in
``dl.swizzle_scatter`` order, and each consumer signals a stored block of C
(the copy-engine protocol's segment counts) once its TMA stores have
completed -- ``cp.async.bulk.wait_group 0`` (not ``.read``), the async-proxy
fence, the partition's barrier, then one thread's release (the memory-model
argument is in kernels/gemm_rs_hopper.py).

Numerics: fp32 accumulation by ``wgmma`` in K order, ``BK`` at a time, then
one rounding to the output dtype: the same as the ``tl`` core with the same
``BLOCK_K`` on sm_90 (tests/gpu/test_gemm_hopper_twin.py checks bit
equality on the GPU).

Known noise: on Triton 3.9 (nanobind) a cold compile of an ``epilogue_split=2`` config prints a
"nanobind: leaked ..." dump at interpreter exit: Gluon's ``reshape`` of an NVMMA-layout tensor keeps IR
objects alive (a 10-line Gluon kernel doing only that reproduces it); 3.6 (pybind11) has no such check.

Where it runs: NVIDIA sm_90 only (:func:`supported`); the ``tl`` core stays
the core for AMD, for other NVIDIA GPUs and for the simulator, which runs
the ``tl`` twin (:data:`TWIN`) instead (:func:`matmul_hopper` refuses a CPU
tensor and names it).
"""
from __future__ import annotations

import dataclasses

import torch

import ditron
import ditron.language as dl
from ditron import _compat

from . import scaling
from ._common import cdiv, sm_count

gluon, gl, _hopper = _compat.gluon_hopper()
tma, mbarrier = _hopper.tma, _hopper.mbarrier
tma_load, tma_store = _compat.gluon_tma_ops()
_partition_barrier = _compat.gluon_barrier()
warpgroup_mma, warpgroup_mma_wait, fence_async_shared = (_hopper.warpgroup_mma, _hopper.warpgroup_mma_wait,
                                                        _hopper.fence_async_shared)

_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32,
           torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}
MODES = ("coop", "pingpong")
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclasses.dataclass(frozen=True)
class HopperGemmConfig:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 3
    #: "coop": two consumer warpgroups split each BM x BN tile by rows; "pingpong": they take alternate tiles
    mode: str = "coop"
    group_m: int = 8
    #: registers per thread of the consumer worker partition and of the producer (``setmaxnreg``)
    consumer_regs: int = 232
    producer_regs: int = 40
    #: the epilogue stores each consumer's tile in ``epilogue_split`` column slices through one staging buffer
    #: of that width (1 or 2): less shared memory (a 4th stage for 128 x 256 coop), one more store wait
    epilogue_split: int = 1
    #: blockwise fp8 only: each consumer issues step k+1's ``wgmma`` (into a second partial accumulator) before
    #: it waits for step k's and promotes it, so its tensor-core work runs under its own promotion FMAs and
    #: scale loads (three 64 x 128 fp32 accumulators per warpgroup); False: wait for every step's ``wgmma``
    #: before promoting it (the first Gluon blockwise consumer, bench/results/h100-2026-12-07d-fp8-block).
    #: The same fp32 operations in the same K order either way: the output is bitwise the same.
    block_overlap: bool = True
    #: per-tensor / rowwise fp8: the same overlapped consumer for their fp32 promotion (``acc + part`` every
    #: ``block_k`` products; three accumulators), where False each step's ``wgmma`` is waited for before its
    #: promotion and only the other consumer warpgroup's work overlaps it.  Bitwise the same output either way
    #: (checked on an H100); 0.80-1.12x -> 0.89-1.09x ``torch._scaled_mm`` rowwise, per-tensor 0.68-1.03x ->
    #: 0.71-1.15x at the paper's TP=8 shapes (bench/results/h100-2026-12-07f-fp8/)
    promote_overlap: bool = True

    @property
    def consumer_rows(self) -> int:
        return self.block_m // 2 if self.mode == "coop" else self.block_m

    def smem_bytes(self, elem=2, out_elem=None) -> int:
        """Shared memory of a launch: the ring of ``elem``-byte operands, two staging buffers of the output
        (``out_elem`` bytes, default ``elem``) and the barriers."""
        ring = self.stages * (self.block_m * self.block_k + self.block_k * self.block_n) * elem
        staging = 2 * self.consumer_rows * (self.block_n // self.epilogue_split) * (out_elem or elem)
        return ring + staging + 2 * self.stages * 8

    def validate(self, op="matmul_hopper", elem=2, out_elem=None, overlap=False):
        """Raise a DitronError naming what does not fit; ``elem`` / ``out_elem``: operand / output bytes (1 /
        2 or 4 for fp8 operands: the fp8 limits below apply too); ``overlap``: the launch runs the overlapped
        fp8 promotion (:func:`promotion_overlap`: three accumulators per consumer warpgroup)."""
        E = ditron.DitronError
        if self.mode not in MODES:
            raise E(f"{op}: mode={self.mode!r}; use one of {', '.join(MODES)}")
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise E(f"{op}: {name}={v} must be a power of two >= 16")
        if self.consumer_rows not in (64, 128):
            raise E(f"{op}: each consumer warpgroup computes {self.consumer_rows} rows ({self.mode}, block_m="
                    f"{self.block_m}); wgmma needs 64 or 128 (coop: block_m 128 or 256; pingpong: 64 or 128)")
        if self.block_n > 256:
            raise E(f"{op}: block_n={self.block_n} > 256 (the widest wgmma)")
        if self.consumer_rows * self.block_n > 128 * 128:
            raise E(f"{op}: a {self.consumer_rows} x {self.block_n} fp32 accumulator is "
                    f"{self.consumer_rows * self.block_n // 128} registers per thread of a warpgroup; at most 128 "
                    "fit beside the addresses (64 x 256 or 128 x 128 per consumer)")
        if self.epilogue_split not in (1, 2):
            raise E(f"{op}: epilogue_split={self.epilogue_split} must be 1 or 2")
        if self.stages < 2:
            raise E(f"{op}: stages={self.stages} must be >= 2")
        if self.group_m < 1:
            raise E(f"{op}: group_m={self.group_m} must be >= 1")
        if elem == 1:
            if self.block_k > 128 or self.block_k < 32:
                raise E(f"{op}: fp8 operands need 32 <= block_k <= 128 (got {self.block_k}): one wgmma K step is 32 "
                        "and the fp32 promotion comes every block_k products, as the tl core's")
            n_acc = 3 if overlap else 2
            if self.consumer_rows * self.block_n > 64 * 128:
                raise E(f"{op}: fp8 with the fp32 promotion keeps {('two', 'three')[n_acc - 2]} {self.consumer_rows} x {self.block_n} fp32 "
                        f"accumulators per consumer warpgroup ({n_acc * self.consumer_rows * self.block_n // 128} "
                        f"registers per thread); at most {64 * n_acc} fit beside the addresses (64 x 128 per "
                        "consumer: coop 128 x 128 or pingpong 64 x 128)")
        smem = self.smem_bytes(elem, out_elem)
        if smem > 227 * 1024:
            raise E(f"{op}: {smem} bytes of shared memory ({self.stages} stages of "
                    f"{self.block_m}x{self.block_k} + {self.block_k}x{self.block_n}, two {self.consumer_rows}x"
                    f"{self.block_n // self.epilogue_split} staging buffers) exceed sm_90's 227 KiB: fewer stages or smaller tiles")
        for name in ("consumer_regs", "producer_regs"):
            v = getattr(self, name)
            if v % 8 or not 24 <= v <= 256:
                raise E(f"{op}: {name}={v} must be a multiple of 8 in [24, 256] (setmaxnreg)")
        return self

    def label(self) -> str:
        return (f"gluon {self.mode} {self.block_m}x{self.block_n}x{self.block_k} s{self.stages}"
                + (f" epi/{self.epilogue_split}" if self.epilogue_split > 1 else "")
                + (f" g{self.group_m}" if self.group_m != 8 else "")
                + ("" if self.block_overlap else " serial") + ("" if self.promote_overlap else " pserial"))


DEFAULT_CONFIG = HopperGemmConfig()

def _elem(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def fp8_default_config(M, N, K, num_sms, out_dtype=torch.bfloat16, group_k=None) -> HopperGemmConfig:
    """The Gluon core's default for fp8 operands (no device query): 128 x 128 x 128 coop tiles (two
    64 x 128 consumers: the fp32 promotion keeps a second accumulator, so 64 x 256 per consumer would spill),
    6 stages (bf16 / fp16 output) or 5 (fp32 output: twice the staging).  ``group_k``: blockwise scales'
    group along K; ``block_k`` is ``min(128, group_k)`` (it must divide the group).  TODO(perf): pending GPU
    measurement (bench/fp8_gluon.sh)."""
    stages = 5 if out_dtype == torch.float32 else 6
    block_k = 128 if group_k is None else max(32, min(128, int(group_k)))
    return HopperGemmConfig(128, 128, block_k, stages=stages, mode="coop")


def scale_constexprs(sa_row: bool, sb_col: bool, cfg: HopperGemmConfig, block=None) -> dict:
    """The fp8 constexprs of :func:`scaled_gemm_ws_kernel`: per-row ``scale_a`` / per-column ``scale_b`` or
    one element each, and the fp32 promotion every ``block_k`` products; ``block``: ``(gk, gn)`` of
    blockwise scales (then the scales apply per K step, not in the epilogue)."""
    gk, gn = block or (128, 128)
    return dict(SA_ROW=bool(sa_row), SB_COL=bool(sb_col), PROMOTE=cfg.block_k, BLOCKWISE=block is not None,
                GK=int(gk), GN=int(gn), PROMOTE_OVERLAP=promotion_overlap(cfg, block))


def promotion_overlap(cfg: HopperGemmConfig, block) -> bool:
    """Whether an fp8 launch runs the overlapped consumer (:func:`_overlap_mainloop`).  Blockwise (``block =
    (gk, gn)``): :attr:`HopperGemmConfig.block_overlap` and the tile's columns in one ``scale_b`` group (``gn`` a
    multiple of ``block_n``: one scalar per step; per-column scales of two steps in flight would spill beside
    three accumulators); per-tensor / rowwise (``block`` None): :attr:`HopperGemmConfig.promote_overlap` in coop
    mode (pingpong keeps the serial promotion: with fp32 output and per-row scales ptxas spilled 8 bytes, and
    pingpong fp8 was the slower mode at every shape measured).  Otherwise the serial loop -- the same numbers
    either way."""
    if block is None:
        return bool(cfg.promote_overlap and cfg.mode == "coop")
    return bool(cfg.block_overlap and int(block[1]) % cfg.block_n == 0)


#: the ``tl`` core's config whose tiles and K order match :data:`DEFAULT_CONFIG` (the simulator's twin)
def twin_config(cfg: HopperGemmConfig | None = None):
    from .gemm import GemmConfig
    cfg = cfg or DEFAULT_CONFIG
    return GemmConfig(cfg.block_m, cfg.block_n, cfg.block_k, group_m=cfg.group_m, num_warps=8,
                      num_stages=min(cfg.stages, 3), tma=True)


TWIN = "ditron.kernels.gemm.matmul (the tl core; config=ditron.kernels.gemm_hopper.twin_config(cfg))"


def supported(device) -> bool:
    """Whether the Gluon core runs on ``device``: a CUDA GPU of compute
    capability 9.x (Hopper).  Queries the device only when asked."""
    device = torch.device(device)
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


# ---------------------------------------------------------------------------
# device code
# ---------------------------------------------------------------------------

@gluon.jit
def _tile_mn(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """``dl.swizzle_2d``'s grouped order (same formula)."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = gl.minimum(num_pid_m - first_pid_m, GROUP_M)
    in_group = tile % num_pid_in_group
    return first_pid_m + in_group % group_size_m, in_group // group_size_m


@gluon.jit
def _fence_proxy_async_global():
    """``fence.proxy.async.global``: this thread's generic-proxy view of global memory (e.g. data a peer's
    release made visible to its acquire) ordered before its later async-proxy (TMA) accesses."""
    gl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _tile_at(tile, M, N, num_pid_m, num_pid_n, ROT, me, world, BM: gl.constexpr, BN: gl.constexpr,
             GROUP_M: gl.constexpr, SCATTER: gl.constexpr):
    """Tile ``tile``'s ``(pid_m, pid_n)``: ``dl.swizzle_2d``'s grouped order with the m-tiles rotated by ``ROT``,
    or (``SCATTER``, GEMM-RS) ``dl.swizzle_scatter``'s order for rank ``me`` of ``world`` on one node (the
    tl kernel's own function: other ranks' segments first, ``me + 1, me + 2, ...``, the own segment last)."""
    if SCATTER:
        pid_m, pid_n = dl.swizzle_scatter(tile, M, N, BM, BN, me, world, 1, GROUP_M)
    else:
        pid_m, pid_n = _tile_mn(tile, num_pid_m, num_pid_n, GROUP_M)
        pid_m = (pid_m + ROT) % num_pid_m
    return pid_m, pid_n


@gluon.jit
def _producer(a_desc, g_desc, b_desc, a_bufs, b_bufs, ready, empty, M, ROT, flags_ptr, m_local, slot_rows, me,
              world, GROUP_M: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, B_T: gl.constexpr,
              SCATTER: gl.constexpr):
    """The TMA producer (one warp).  ``GATHER`` (AG-GEMM, kernels/ag_gemm_hopper.py): the rows of C are the
    world's shards, ``m_local`` each; this rank's come from ``a_desc``, rank ``s``'s from row ``s * slot_rows``
    of the gather buffer ``g_desc`` once ``flags_ptr[s] == 1`` -- polled per thread (``dl.ld``, system-scope
    acquire: a warp-specialised partition has no program-wide barrier), then a proxy fence before the TMA loads.
    Tiles in the consumers' order (:func:`_tile_at`; ``ROT``: m-tiles rotated so that this rank's come
    first).  ``B_T``: ``b_desc`` describes ``b^T`` ``[N, K]`` (K-major ``[BN, BK]`` tiles: fp8)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0 if B_T else 1]
    K = a_desc.shape[1]
    N = b_desc.shape[0 if B_T else 1]
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    count = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_at(tile, M, N, num_pid_m, num_pid_n, ROT, me, world, BM, BN, GROUP_M, SCATTER)
        off_m = pid_m * BM
        off_n = pid_n * BN
        row = off_m
        remote = False
        if GATHER:
            seg = off_m // m_local
            remote = seg != me
            if remote:
                while dl.ld(flags_ptr + seg, "sys", "acquire") != 1:
                    pass
                _fence_proxy_async_global()
                row = seg * slot_rows + (off_m - seg * m_local)
            else:
                row = off_m - me * m_local
        for ki in range(k_steps):
            s = count % STAGES
            # a fresh barrier is in phase 0: waiting for phase 1 passes (the ring starts empty)
            mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            if remote:
                tma_load(g_desc, [row, ki * BK], bar, a_bufs.index(s))
            else:
                tma_load(a_desc, [row, ki * BK], bar, a_bufs.index(s))
            if B_T:
                tma_load(b_desc, [off_n, ki * BK], bar, b_bufs.index(s))
            else:
                tma_load(b_desc, [ki * BK, off_n], bar, b_bufs.index(s))
            count += 1


@gluon.jit
def _scale_acc(acc, sa_ptr, sb_ptr, stride_sam, stride_sbn, off_m, off_n, M, N, acc_layout: gl.constexpr,
               SUB_M: gl.constexpr, BN: gl.constexpr, SA_ROW: gl.constexpr, SB_COL: gl.constexpr):
    """``(acc * scale_a[rows]) * scale_b[cols]`` in fp32 (per-tensor scales: one element each); rows and
    columns past the matrix read scale 0 (the TMA store clips them)."""
    if SA_ROW:
        rows = off_m + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, acc_layout))
        sa = gl.load(sa_ptr + rows.to(gl.int64) * stride_sam, mask=rows < M, other=0.0)
        acc = acc * gl.expand_dims(sa, 1)
    else:
        acc = acc * gl.load(sa_ptr)
    if SB_COL:
        cols = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
        sb = gl.load(sb_ptr + cols.to(gl.int64) * stride_sbn, mask=cols < N, other=0.0)
        acc = acc * gl.expand_dims(sb, 0)
    else:
        acc = acc * gl.load(sb_ptr)
    return acc


@gluon.jit
def _block_scales(sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn, off_m, off_n, M, N, g,
                  acc_layout: gl.constexpr, SUB_M: gl.constexpr, BN: gl.constexpr, GN: gl.constexpr):
    """Blockwise fp8 (DeepSeek-V3): the K group ``g``'s scales of this consumer's rows and the tile's columns,
    shaped to broadcast against the accumulator: ``scale_a[rows, g]`` ``[SUB_M, 1]`` and ``scale_b[g, cols //
    GN]`` -- one scalar where ``GN`` is a multiple of ``BN`` (the tile's columns lie in one group: the tile
    starts at a multiple of ``BN``), else ``[1, BN]`` -- the values of the tl core's ``scale_step`` loads (rows
    past ``M`` read 0; columns past ``N`` read 0 from the per-column load, the group's scale from the scalar
    one: their products are TMA zero-fill and the TMA store clips them either way)."""
    rows = off_m + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, acc_layout))
    sa = gl.load(sa_ptr + rows.to(gl.int64) * stride_sam + g * stride_sak, mask=rows < M, other=0.0)
    if GN % BN == 0:
        sb = gl.load(sb_ptr + (off_n // GN).to(gl.int64) * stride_sbn + g * stride_sbk)
        # the tile's columns share one scale_b: the combined scale sa * sb per row, once (:func:`_promote`)
        return gl.expand_dims(sa * sb, 1), sb
    else:
        cols = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
        sb = gl.expand_dims(gl.load(sb_ptr + (cols // GN).to(gl.int64) * stride_sbn + g * stride_sbk,
                                    mask=cols < N, other=0.0), 0)
        return gl.expand_dims(sa, 1), sb


@gluon.jit
def _promote(acc, part, sa, sb, BN: gl.constexpr, GN: gl.constexpr, BLOCKWISE: gl.constexpr):
    """``acc + part * (scale_a * scale_b)`` in fp32 -- the tl core's :func:`~.gemm.scale_step`: the two scales'
    product first (rounded once), then one fused multiply-add per element (DeepGEMM's promotion); ``acc + part``
    where not ``BLOCKWISE``.  ``sa, sb``:
    :func:`_block_scales`'s pair -- where the tile's columns share one ``scale_b`` ``sa`` is already the product
    (one multiply per row instead of one per element: the promotion's cost per element halves), else the per-row
    and per-column scales, multiplied here."""
    if not BLOCKWISE:
        return acc + part          # per-tensor / rowwise: the fp32 promotion alone (scales in the epilogue)
    elif GN % BN == 0:
        return acc + part * sa
    else:
        return acc + part * (sa * sb)


@gluon.jit
def _registers_fence(x):
    """``x`` unchanged (an empty volatile ``asm`` per register, in and out tied: no instruction), as an ordering
    point: what computes ``x`` stays before the next volatile ``asm`` -- a ``wgmma`` -- where LLVM would otherwise
    sink pure arithmetic past it (CUTLASS's ``warpgroup_fence_operand``)."""
    return gl.inline_asm_elementwise("", "=f,0", [x], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _step_scales(sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn, off_m, off_n, M, N, g,
                 acc_layout: gl.constexpr, SUB_M: gl.constexpr, BN: gl.constexpr, GN: gl.constexpr,
                 BLOCKWISE: gl.constexpr):
    """K group ``g``'s scales for :func:`_promote` (:func:`_block_scales`) where ``BLOCKWISE``; else none
    (per-tensor / rowwise scales apply in the epilogue): two unused fp32 zeros."""
    if BLOCKWISE:
        return _block_scales(sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn, off_m, off_n, M, N, g,
                             acc_layout, SUB_M, BN, GN)
    else:
        z = gl.to_tensor(0.0)
        return z, z


@gluon.jit
def _overlap_mainloop(a_bufs, b_bufs, ready, empty, acc, part0, part1, count, k_steps, sa_ptr, sb_ptr, stride_sam,
                      stride_sak, stride_sbk, stride_sbn, off_m, off_n, M, N, acc_layout: gl.constexpr,
                      row0: gl.constexpr, SUB_M: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GK: gl.constexpr,
                      GN: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, B_T: gl.constexpr,
                      BLOCKWISE: gl.constexpr):
    """One tile's fp8 mainloop with the fp32 promotion overlapped (:func:`promotion_overlap`): step ``k``'s
    product goes to ``part0`` (``k`` even) or ``part1`` (odd); step ``k + 1``'s ``wgmma`` is issued before the
    wait for step ``k``'s (``warpgroup_mma_wait(1)``: all but the newest group have retired), so the tensor core
    works on ``k + 1`` while this warpgroup adds step ``k``'s product to ``acc`` -- ``part_k * scale_a *
    scale_b`` where ``BLOCKWISE`` (each step's scales loaded a step ahead), ``part_k`` itself otherwise (per-tensor
    / rowwise: the scales apply in the epilogue).  The loop takes two steps per iteration (the partial
    accumulators' roles are fixed, so no register moves of an accumulator in flight), the last one or two steps
    after it.

    Numerics: ``acc`` receives, in K order, ``acc + part_k * (sa_k * sb_k)`` (blockwise; fp32, :func:`_promote`:
    the same expression as the serial loop and the tl core's ``scale_step``) or ``acc + part_k``, and ``part_k`` is
    step ``k``'s products summed by the tensor core from zero (``use_acc=False``): only the time the promotion
    happens moves, so the output is bitwise that of the serial loop and the tl twin.  Returns ``(acc, part0,
    part1, count)``."""
    s = count % STAGES
    a, b = _ring_operands(a_bufs, b_bufs, ready, s, count, row0, SUB_M, STAGES, PINGPONG, B_T)
    p0 = warpgroup_mma(a, b, part0, use_acc=False, is_async=True)
    sa0, sb0 = _step_scales(sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn, off_m, off_n, M, N,
                            0, acc_layout, SUB_M, BN, GN, BLOCKWISE)
    # invariant at each iteration: step ki's wgmma (into p0) is in flight, sa0 / sb0 are its scales, ki + 2 < k_steps
    for ki in range(0, k_steps - 2, 2):
        s1 = (count + 1) % STAGES
        sa1, sb1 = _step_scales(sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn, off_m, off_n, M,
                                N, ((ki + 1) * BK) // GK, acc_layout, SUB_M, BN, GN, BLOCKWISE)
        a, b = _ring_operands(a_bufs, b_bufs, ready, s1, count + 1, row0, SUB_M, STAGES, PINGPONG, B_T)
        p1 = warpgroup_mma(a, b, part1, use_acc=False, is_async=True)
        part0 = warpgroup_mma_wait(1, deps=(p0, ))                # step ki retired; ki + 1 runs
        mbarrier.arrive(empty.index(count % STAGES))
        acc = _registers_fence(_promote(acc, part0, sa0, sb0, BN, GN, BLOCKWISE))  # part0 read before it is reused
        s2 = (count + 2) % STAGES
        sa0, sb0 = _step_scales(sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn, off_m, off_n, M,
                                N, ((ki + 2) * BK) // GK, acc_layout, SUB_M, BN, GN, BLOCKWISE)
        a, b = _ring_operands(a_bufs, b_bufs, ready, s2, count + 2, row0, SUB_M, STAGES, PINGPONG, B_T)
        p0 = warpgroup_mma(a, b, part0, use_acc=False, is_async=True)
        part1 = warpgroup_mma_wait(1, deps=(p1, ))                # step ki + 1 retired; ki + 2 runs
        mbarrier.arrive(empty.index(s1))
        acc = _registers_fence(_promote(acc, part1, sa1, sb1, BN, GN, BLOCKWISE))  # part1 read before it is reused
        count += 2
    # the last step (k_steps odd) or two (even): step count's wgmma is in flight in p0
    if k_steps % 2 == 0:
        s1 = (count + 1) % STAGES
        sa1, sb1 = _step_scales(sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn, off_m, off_n, M,
                                N, ((k_steps - 1) * BK) // GK, acc_layout, SUB_M, BN, GN, BLOCKWISE)
        a, b = _ring_operands(a_bufs, b_bufs, ready, s1, count + 1, row0, SUB_M, STAGES, PINGPONG, B_T)
        p1 = warpgroup_mma(a, b, part1, use_acc=False, is_async=True)
        part0 = warpgroup_mma_wait(1, deps=(p0, ))
        mbarrier.arrive(empty.index(count % STAGES))
        acc = _registers_fence(_promote(acc, part0, sa0, sb0, BN, GN, BLOCKWISE))  # promoted while the last runs
        part1 = warpgroup_mma_wait(0, deps=(p1, ))
        mbarrier.arrive(empty.index(s1))
        acc = _promote(acc, part1, sa1, sb1, BN, GN, BLOCKWISE)
        count += 2
    else:
        part0 = warpgroup_mma_wait(0, deps=(p0, ))
        mbarrier.arrive(empty.index(count % STAGES))
        acc = _promote(acc, part0, sa0, sb0, BN, GN, BLOCKWISE)
        count += 1
    return acc, part0, part1, count


@gluon.jit
def _store_complete_fence():
    """``cp.async.bulk.wait_group 0`` -- not ``.read`` (``tma.store_wait``): this thread's bulk stores have
    *completed*, their writes visible to it -- then ``fence.proxy.async.global``: those async-proxy writes
    ordered before this thread's later generic-proxy accesses (the signal's release).  Every thread runs it;
    a thread without outstanding bulk groups passes the wait at once."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.u32 $0, 0;", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _signal_segments(r0, SUB_M: gl.constexpr, M, me, world, num_pid_n, seg_count_ptr, done_ptr):
    """GEMM-RS's copy-engine epilogue protocol (kernels/gemm_rs.py ``_segments_done``) for one consumer's
    finished ``SUB_M``-row block of C starting at row ``r0`` (``r0 < 0``: none): count it in
    ``seg_count[s]`` (``atom.add.acq_rel.sys``) for every peer segment ``s`` its rows touch; the block that
    completes segment ``s`` -- its ``(SUB_M-row blocks touching s) * num_pid_n``-th -- resets the count and sets
    the local ``done[s] = 1`` (``atom.exch.release.sys``).  One thread (element 0 of a 4-warp tensor) does
    the atomics; the caller has made the block's TMA stores complete and visible to it (see the module
    docstring, "Signals after TMA stores")."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    lane = gl.arange(0, 128, layout=layout)
    one = lane == 0
    zero = lane * 0
    m = M // world
    if r0 >= 0:
        if r0 < M:
            lo = r0 // m
            hi = (gl.minimum(r0 + SUB_M, M) - 1) // m
            for s in range(lo, hi + 1):
                if s != me:                 # the own segment is read by the reduction, later on this stream
                    c = gl.atomic_add(seg_count_ptr + s + zero, zero + 1, mask=one, sem="acq_rel", scope="sys")
                    blocks = (s * m + m - 1) // SUB_M - (s * m) // SUB_M + 1
                    last = one & (c == blocks * num_pid_n - 1)
                    gl.store(seg_count_ptr + s + zero, zero, mask=last)    # nobody counts s again in this call
                    gl.atomic_xchg(done_ptr + s + zero, (zero + 1).to(gl.int64), mask=last, sem="release",
                                   scope="sys")


@gluon.jit
def _publish(prev_r0, SUB_M: gl.constexpr, M, me, world, num_pid_n, seg_count_ptr, done_ptr):
    """Signal the previous block (``prev_r0``) of this consumer: every thread completes its bulk stores and
    fences (:func:`_store_complete_fence`), the partition's barrier orders that before the one thread's
    release (:func:`_signal_segments`)."""
    _store_complete_fence()
    _partition_barrier()
    _signal_segments(prev_r0, SUB_M, M, me, world, num_pid_n, seg_count_ptr, done_ptr)


@gluon.jit
def _ring_operands(a_bufs, b_bufs, ready, s, count, row0: gl.constexpr, SUB_M: gl.constexpr, STAGES: gl.constexpr,
                   PINGPONG: gl.constexpr, B_T: gl.constexpr):
    """Wait for ring slot ``s`` (the ``count``-th load) and return its A rows of this consumer and its B tile
    as ``wgmma`` reads them (``B_T``: K-major ``[BN, BK]``, permuted)."""
    mbarrier.wait(ready.index(s), (count // STAGES) & 1)
    a = a_bufs.index(s)
    if not PINGPONG:
        a = a.slice(row0, SUB_M, dim=0)
    b = b_bufs.index(s)
    if B_T:
        b = b.permute((1, 0))
    return a, b


@gluon.jit
def _consumer(a_desc, b_desc, c_desc, a_bufs, b_bufs, ready, empty, turn, M, ROT, sa_ptr, sb_ptr, stride_sam,
              stride_sbn, me, world, seg_count_ptr, done_ptr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
              CID: gl.constexpr, PINGPONG: gl.constexpr, B_T: gl.constexpr, SCALE: gl.constexpr,
              SA_ROW: gl.constexpr, SB_COL: gl.constexpr, PROMOTE: gl.constexpr, SCATTER: gl.constexpr,
              SIGNAL: gl.constexpr, stride_sak, stride_sbk, BLOCKWISE: gl.constexpr, GK: gl.constexpr,
              GN: gl.constexpr, OVERLAP: gl.constexpr):
    """One consumer warpgroup (4 warps): ``CID`` 0 or 1.

    Ping-pong: the consumers' mainloops take turns (``turn[c]``: consumer
    ``c`` may start its next mainloop; the other arrives on it when its own
    mainloop has issued its last MMA).  Besides the overlap this is what keeps
    the ring's parity waits sound: a consumer never waits for a slot more than
    one phase ahead of the last phase observed.

    fp8 (:func:`ws_scaled_gemm_body`): ``B_T``, B's ring slots hold K-major ``[BN, BK]`` tiles, read
    permuted (Hopper's fp8 ``wgmma`` takes both operands K-major); ``PROMOTE`` (> 0): the products of each
    ``wgmma`` (one ``BK`` step, ``PROMOTE == BK``) are summed in a zeroed tensor-core accumulator and added to
    the fp32 accumulator in fp32 (``max_num_imprecise_acc``: the tl core's ``tl.dot(..., max_num_imprecise_acc=
    BLOCK_K)``, ``torch._scaled_mm`` without fast accumulation); ``SCALE``: the epilogue multiplies by
    ``scale_a`` (per row where ``SA_ROW``, else the one element) and then by ``scale_b`` (per column where
    ``SB_COL``) in fp32 before the one rounding to the output dtype -- ``(acc * sa) * sb``, the tl core's order.
    ``BLOCKWISE`` (DeepSeek-V3 scales, with ``PROMOTE``; no epilogue scale): each step's product ``part`` (K
    group ``g = k0 // GK``, ``BK`` dividing ``GK``) is added as ``acc + part * scale_a[rows, g] * scale_b[g,
    cols // GN]`` in fp32 -- ``part * (sa * sb)``, one fused multiply-add (:func:`_promote`, the tl core's
    ``scale_step``) -- the scales
    loaded while the step's ``wgmma`` runs (:func:`_block_scales`; element strides ``stride_sam``,
    ``stride_sak`` of ``scale_a``, ``stride_sbk``, ``stride_sbn`` of ``scale_b``).

    ``SIGNAL`` (GEMM-RS, copy-engine protocol): each finished block is signalled (:func:`_signal_segments`)
    once its TMA stores have completed -- at the next block's epilogue, which waits for the staging buffer
    anyway (so the store still drains under the next mainloop), and after the loop for the last one."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0 if B_T else 1]
    SUB_M: gl.constexpr = c_desc.block_type.shape[0]        # rows of this warpgroup's accumulator
    dtype: gl.constexpr = c_desc.dtype
    K = a_desc.shape[1]
    N = b_desc.shape[0 if B_T else 1]
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    INSTR_K: gl.constexpr = 256 // a_desc.dtype.primitive_bitwidth        # wgmma's K: 16 (16-bit), 32 (fp8)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, INSTR_K])
    EPI_N: gl.constexpr = c_desc.block_type.shape[1]        # columns per epilogue store
    c_smem = gl.allocate_shared_memory(dtype, [SUB_M, EPI_N], c_desc.layout)
    if PINGPONG:
        first = gl.program_id(0) + CID * gl.num_programs(0)
        step = 2 * gl.num_programs(0)
        row0: gl.constexpr = 0
    else:
        first = gl.program_id(0)
        step = gl.num_programs(0)
        row0: gl.constexpr = CID * SUB_M
    count = 0
    if PINGPONG:
        count = CID * k_steps                   # the other consumer's first tile comes first in the ring
    i = 0
    prev_r0 = -1                                # SIGNAL: first row of the block stored last, not yet signalled
    for tile in range(first, num_pid_m * num_pid_n, step):
        pid_m, pid_n = _tile_at(tile, M, N, num_pid_m, num_pid_n, ROT, me, world, BM, BN, GROUP_M, SCATTER)
        acc = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout)
        if PINGPONG:
            # consumer 1's i-th mainloop follows consumer 0's i-th; consumer 0's i-th follows consumer 1's (i-1)-th
            # (for i = 0 the wait is for the phase "before" a fresh barrier's first: it passes)
            mbarrier.wait(turn.index(CID), (i & 1) ^ (1 - CID))
        if PROMOTE > 0:
            # fp8 with the fp32 promotion: each step's products are summed in a zeroed tensor-core accumulator
            # (``use_acc=False``), then added to ``acc`` in fp32 (acc + part: Triton's max_num_imprecise_acc
            # promotion, the tl twin's numerics).  Blockwise with ``OVERLAP``: two partial accumulators, step
            # k + 1's wgmma in flight while step k is promoted (:func:`_overlap_mainloop`).  Otherwise the wait is
            # for this step's MMA and the overlap comes from the other consumer warpgroup only.  (Reading one
            # partial sum while a wgmma writes another is fine for ptxas as long as no instruction touches the
            # in-flight one's registers: LLVM sinking the promotion below the next wgmma -- then a register copy
            # of the partial sum it overwrites -- is what serialises, ptxas C7515; :func:`_registers_fence`.)
            part = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout)
            if OVERLAP:
                # step k + 1's wgmma issued before step k's promotion (:func:`_overlap_mainloop`)
                part_b = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout)
                acc, part, part_b, count = _overlap_mainloop(
                    a_bufs, b_bufs, ready, empty, acc, part, part_b, count, k_steps, sa_ptr, sb_ptr, stride_sam,
                    stride_sak, stride_sbk, stride_sbn, pid_m * BM + row0, pid_n * BN, M, N, acc_layout, row0,
                    SUB_M, BN, BK, GK, GN, STAGES, PINGPONG, B_T, BLOCKWISE)
            else:
                for ki in range(k_steps):
                    s = count % STAGES
                    a, b = _ring_operands(a_bufs, b_bufs, ready, s, count, row0, SUB_M, STAGES, PINGPONG, B_T)
                    part = warpgroup_mma(a, b, part, use_acc=False, is_async=True)
                    # the step's scales (blockwise), loaded under its MMA
                    sa, sb = _step_scales(sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn,
                                          pid_m * BM + row0, pid_n * BN, M, N, (ki * BK) // GK, acc_layout, SUB_M,
                                          BN, GN, BLOCKWISE)
                    part = warpgroup_mma_wait(0, deps=(part, ))
                    mbarrier.arrive(empty.index(s))          # the MMA that read the slot has retired
                    acc = _promote(acc, part, sa, sb, BN, GN, BLOCKWISE)
                    count += 1
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - CID))     # every MMA of this tile is issued: the other's turn
        else:
            for ki in range(k_steps):
                s = count % STAGES
                a, b = _ring_operands(a_bufs, b_bufs, ready, s, count, row0, SUB_M, STAGES, PINGPONG, B_T)
                acc = warpgroup_mma(a, b, acc, is_async=True)
                # keep this MMA in flight; the previous one has retired: its slot is free
                acc = warpgroup_mma_wait(1, deps=(acc, ))
                mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=ki > 0)
                count += 1
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - CID))     # every MMA of this tile is issued: the other's turn
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        i += 1
        if PINGPONG:
            count += k_steps                    # skip the other consumer's tile
        if SCALE and not BLOCKWISE:
            acc = _scale_acc(acc, sa_ptr, sb_ptr, stride_sam, stride_sbn, pid_m * BM + row0, pid_n * BN, M, N,
                             acc_layout, SUB_M, BN, SA_ROW, SB_COL)
        # epilogue: the previous tile's TMA store has read the staging buffer before it is overwritten
        out = acc.to(dtype)
        if EPI_N == BN:
            tma.store_wait(0)
            if SIGNAL:
                _publish(prev_r0, SUB_M, M, me, world, num_pid_n, seg_count_ptr, done_ptr)
            c_smem.store(out)
            fence_async_shared()
            tma_store(c_desc, [pid_m * BM + row0, pid_n * BN], c_smem)
        else:
            # two column halves: [SUB_M, BN] -> [SUB_M, 2, BN/2] -> [SUB_M, BN/2, 2] -> split
            lo, hi = out.reshape([SUB_M, 2, EPI_N]).permute(0, 2, 1).split()
            tma.store_wait(0)
            if SIGNAL:
                _publish(prev_r0, SUB_M, M, me, world, num_pid_n, seg_count_ptr, done_ptr)
            c_smem.store(lo)
            fence_async_shared()
            tma_store(c_desc, [pid_m * BM + row0, pid_n * BN], c_smem)
            tma.store_wait(0)
            c_smem.store(hi)
            fence_async_shared()
            tma_store(c_desc, [pid_m * BM + row0, pid_n * BN + EPI_N], c_smem)
        prev_r0 = pid_m * BM + row0
    tma.store_wait(0)
    if SIGNAL:
        _publish(prev_r0, SUB_M, M, me, world, num_pid_n, seg_count_ptr, done_ptr)


@gluon.jit
def ws_gemm_body(a_desc, g_desc, b_desc, c_desc, M, ROT, flags_ptr, m_local, slot_rows, me,
                 GROUP_M: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, GATHER: gl.constexpr,
                 CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, world=1, seg_count_ptr=0, done_ptr=0,
                 SCATTER: gl.constexpr = False, SIGNAL: gl.constexpr = False):
    """The persistent warp-specialised mainloop over the ``M`` rows of ``c`` (the kernels below; the
    producer's ``GATHER`` arguments are described at :func:`_producer`): shared-memory ring, mbarriers, the
    default partition is consumer 0; workers: consumer 1 (4 warps), the producer (1 warp).

    GEMM-RS's hooks (kernels/gemm_rs_hopper.py): ``SCATTER`` takes the tiles in ``dl.swizzle_scatter``'s
    order for rank ``me`` of ``world`` (:func:`_tile_at`); ``SIGNAL`` signals each stored block of C by the
    copy-engine protocol's segment counts (``seg_count_ptr``, ``done_ptr``: :func:`_signal_segments`), each
    after its TMA stores have completed.  Off (the defaults), the core is the plain GEMM / AG-GEMM's."""
    ws_scaled_gemm_body(a_desc, g_desc, b_desc, c_desc, M, ROT, flags_ptr, m_local, slot_rows, me, 0, 0, 0, 0,
                        GROUP_M, STAGES, PINGPONG, GATHER, CONSUMER_REGS, PRODUCER_REGS, False, False, False, False,
                        0, world, seg_count_ptr, done_ptr, SCATTER, SIGNAL)


@gluon.jit
def ws_scaled_gemm_body(a_desc, g_desc, b_desc, c_desc, M, ROT, flags_ptr, m_local, slot_rows, me, sa_ptr, sb_ptr,
                        stride_sam, stride_sbn, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                        PINGPONG: gl.constexpr, GATHER: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                        PRODUCER_REGS: gl.constexpr, B_T: gl.constexpr, SCALE: gl.constexpr, SA_ROW: gl.constexpr,
                        SB_COL: gl.constexpr, PROMOTE: gl.constexpr, world=1, seg_count_ptr=0, done_ptr=0,
                        SCATTER: gl.constexpr = False, SIGNAL: gl.constexpr = False, stride_sak=0, stride_sbk=0,
                        BLOCKWISE: gl.constexpr = False, GK: gl.constexpr = 128, GN: gl.constexpr = 128,
                        OVERLAP: gl.constexpr = False):
    """:func:`ws_gemm_body` with the fp8 arguments (described at :func:`_consumer`): ``b_desc`` of ``b^T``
    (``B_T``), the fp32 promotion every ``PROMOTE`` products, the epilogue scales ``sa_ptr`` / ``sb_ptr``
    (element strides ``stride_sam`` per row, ``stride_sbn`` per column), or with ``BLOCKWISE`` the scales of
    each K step (``stride_sak`` / ``stride_sbk`` per K group, groups of ``GK`` x ``GN``: :func:`_consumer`);
    GEMM-RS's hooks as :func:`ws_gemm_body`."""
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1 if PINGPONG else 2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, c_desc, a_bufs, b_bufs, ready, empty, turn, M, ROT, sa_ptr, sb_ptr, stride_sam,
                     stride_sbn, me, world, seg_count_ptr, done_ptr, GROUP_M, STAGES, 0, PINGPONG, B_T, SCALE, SA_ROW,
                     SB_COL, PROMOTE, SCATTER, SIGNAL, stride_sak, stride_sbk, BLOCKWISE, GK, GN, OVERLAP)),
        (_consumer, (a_desc, b_desc, c_desc, a_bufs, b_bufs, ready, empty, turn, M, ROT, sa_ptr, sb_ptr, stride_sam,
                     stride_sbn, me, world, seg_count_ptr, done_ptr, GROUP_M, STAGES, 1, PINGPONG, B_T, SCALE, SA_ROW,
                     SB_COL, PROMOTE, SCATTER, SIGNAL, stride_sak, stride_sbk, BLOCKWISE, GK, GN, OVERLAP)),
        (_producer, (a_desc, g_desc, b_desc, a_bufs, b_bufs, ready, empty, M, ROT, flags_ptr, m_local, slot_rows,
                     me, world, GROUP_M, STAGES, GATHER, B_T, SCATTER)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


@gluon.jit
def gemm_ws_kernel(a_desc, b_desc, c_desc, GROUP_M: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                   CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """Persistent warp-specialised ``c = a @ b`` (``num_warps=4``: the
    default partition is consumer 0; workers: consumer 1 (4 warps), the
    producer (1 warp))."""
    ws_gemm_body(a_desc, a_desc, b_desc, c_desc, a_desc.shape[0], 0, 0, 0, 0, 0, GROUP_M, STAGES, PINGPONG, False,
                 CONSUMER_REGS, PRODUCER_REGS)


@gluon.jit
def scaled_gemm_ws_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn,
                          GROUP_M: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, SA_ROW: gl.constexpr,
                          SB_COL: gl.constexpr, PROMOTE: gl.constexpr, BLOCKWISE: gl.constexpr, GK: gl.constexpr,
                          GN: gl.constexpr, PROMOTE_OVERLAP: gl.constexpr):
    """Persistent warp-specialised fp8 ``c = (a * scale_a) @ (b * scale_b)``: ``a_desc`` of ``a [M, K]``,
    ``b_desc`` of ``b^T [N, K]`` (both K-major), per-tensor or per-row / per-column scales in the epilogue, or
    (``BLOCKWISE``) DeepSeek-V3 blockwise scales per K step (``num_warps=4``, partitions as
    :func:`gemm_ws_kernel`; the scale arguments are :meth:`ditron.kernels.scaling.Recipe.kernel_args`')."""
    ws_scaled_gemm_body(a_desc, a_desc, b_desc, c_desc, a_desc.shape[0], 0, 0, 0, 0, 0, sa_ptr, sb_ptr, stride_sam,
                        stride_sbn, GROUP_M, STAGES, PINGPONG, False, CONSUMER_REGS, PRODUCER_REGS, True, True,
                        SA_ROW, SB_COL, PROMOTE, 1, 0, 0, False, False, stride_sak, stride_sbk, BLOCKWISE, GK, GN,
                        PROMOTE_OVERLAP)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

def layouts(cfg: HopperGemmConfig, dtype, out_dtype=None, b_t=False):
    """Shared-memory layouts of the A, B and C blocks (128-byte swizzle where the rows allow); ``b_t``: B's
    block is ``[BN, BK]`` of ``b^T`` (fp8)."""
    g = _DTYPES[dtype]
    b_block = [cfg.block_n, cfg.block_k] if b_t else [cfg.block_k, cfg.block_n]
    return (gl.NVMMASharedLayout.get_default_for([cfg.block_m, cfg.block_k], g),
            gl.NVMMASharedLayout.get_default_for(b_block, g),
            gl.NVMMASharedLayout.get_default_for([cfg.consumer_rows, cfg.block_n // cfg.epilogue_split],
                                                 _DTYPES[out_dtype or dtype]))


def descriptors(a, b, c, cfg: HopperGemmConfig):
    """TMA descriptors of ``a``, ``b`` and ``c``; for fp8 operands ``b`` is column-major (``w.t()``) and its
    descriptor is of ``b.t()`` ``[N, K]`` (K-major ``[BN, BK]`` blocks)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    b_t = a.dtype in _FP8_DTYPES
    la, lb, lc = layouts(cfg, a.dtype, c.dtype, b_t)
    return (TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k], la),
            TensorDescriptor.from_tensor(b.t(), [cfg.block_n, cfg.block_k], lb) if b_t else
            TensorDescriptor.from_tensor(b, [cfg.block_k, cfg.block_n], lb),
            TensorDescriptor.from_tensor(c, [cfg.consumer_rows, cfg.block_n // cfg.epilogue_split], lc))


def kernel_constexprs(cfg: HopperGemmConfig) -> dict:
    return dict(GROUP_M=cfg.group_m, STAGES=cfg.stages, PINGPONG=cfg.mode == "pingpong",
                CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs)


def num_programs(M, N, cfg: HopperGemmConfig, sms: int) -> int:
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    if cfg.mode == "pingpong":
        return max(1, min(sms, cdiv(tiles, 2)) if tiles > 1 else 1)
    return max(1, min(sms, tiles))


def matmul_hopper(a, b, out=None, config: HopperGemmConfig | None = None, num_programs_=None):
    """``a @ b`` on the Gluon core (fp32 accumulation, ``a``'s dtype): CUDA
    sm_90 only, row-major operands with 16-byte aligned rows (TMA)."""
    from .gemm import check_operands, tma_ok
    check_operands("matmul_hopper", a, b, out, (a.shape[0], b.shape[1]))
    if a.device.type != "cuda":
        raise ditron.DitronError(f"matmul_hopper: the Gluon core runs on Hopper GPUs only; on {a.device} use the "
                                 f"tl twin {TWIN}")
    if not supported(a.device):
        raise ditron.DitronError(f"matmul_hopper: {torch.cuda.get_device_name(a.device)} is not sm_90; use "
                                 "ditron.kernels.gemm.matmul")
    cfg = (config or DEFAULT_CONFIG).validate()
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if not tma_ok(a, b, out):
        raise ditron.DitronError("matmul_hopper: TMA needs row-major operands with 16-byte aligned rows "
                                 f"(a strides {a.stride()}, b strides {b.stride()}, out strides {out.stride()}); "
                                 "use ditron.kernels.gemm.matmul")
    a_desc, b_desc, c_desc = descriptors(a, b, out, cfg)
    P = int(num_programs_ or num_programs(M, N, cfg, sm_count(a.device)))
    gemm_ws_kernel[(P,)](a_desc, b_desc, c_desc, num_warps=4, **kernel_constexprs(cfg))
    return out


def fp8_plan(op, a, b, out, scale_a, scale_b, out_dtype, config: HopperGemmConfig | None,
             scale_block=(128, 128), alt="ditron.kernels.gemm.matmul(..., core='tl')"):
    """Checks of an fp8 call of the Gluon core, all before launch and device-independent (so that the
    simulator's twin refuses what the GPU would): ``(recipe, config)``.  fp8 ``a [M, K]`` row-major, ``b
    [K, N]`` column-major (``w.t()`` of a row-major ``[N, K]`` weight, as ``torch._scaled_mm`` takes it), per-
    tensor or per-row / per-column float32 scales (``[]`` / ``[1]`` / ``[1, 1]``, ``scale_a [M, 1]``,
    ``scale_b [1, N]``) or blockwise ones (``scale_a [M, cdiv(K, gk)]``, ``scale_b [cdiv(K, gk), cdiv(N,
    gn)]``, ``scale_block=(gk, gn)``: ``block_k`` must divide ``gk``, so ``gk >= 32``; the default config's
    ``block_k`` is ``min(128, gk)``), 16-byte aligned rows (TMA).  ``alt``: the ``tl`` alternative the
    refusals name (the overlap ops: their ``core='tl'`` contexts)."""
    from .gemm import check_operands, tma_ok
    E = ditron.DitronError
    if not scaling.is_fp8(a):
        raise E(f"{op}: argument 'a' is {getattr(a, 'dtype', type(a).__name__)}; the fp8 Gluon core takes "
                "float8_e4m3fn / float8_e5m2 operands (fp16 / bf16: matmul_hopper)")
    check_operands(op, a, b, out, (a.shape[0], b.shape[1]), out_dtype)
    M, K = a.shape
    N = b.shape[1]
    rec = scaling.recipe(op, M, K, N, scale_a, scale_b, a.device, scale_block)
    block = rec.mode == scaling.BLOCKWISE
    if block and rec.gk < 32:
        raise E(f"{op}: blockwise scales with groups of {rec.gk} along K (scale_block={tuple(scale_block)}) are not "
                "in the Gluon core: its fp8 K step (block_k, 32 to 128) must lie in one group; use "
                f"{alt}")
    if a.stride(1) != 1 or not tma_ok(a):
        raise E(f"{op}: 'a' must be row-major with 16-byte aligned rows (strides {tuple(a.stride())}, K={K}: "
                f"K a multiple of 16 for fp8); use {alt}")
    if b.stride(0) != 1 or not tma_ok(b.t()):
        raise E(f"{op}: 'b' must be column-major, b = w.t() of a row-major [N, K] weight as torch._scaled_mm "
                f"takes it (got strides {tuple(b.stride())}; K-major tiles are what Hopper's fp8 wgmma reads), "
                f"with 16-byte aligned columns; pass w.t() or b.t().contiguous().t(), or use {alt}")
    if out is not None and not tma_ok(out):
        raise E(f"{op}: 'out' must be row-major with 16-byte aligned rows (strides {tuple(out.stride())})")
    if out is None and (N * _elem(out_dtype)) % 16:
        raise E(f"{op}: N={N} rows of {out_dtype} are not 16-byte aligned (the TMA-store epilogue); "
                f"use {alt}")
    cfg = config or fp8_default_config(M, N, K, 132, out_dtype, rec.gk if block else None)
    if not isinstance(cfg, HopperGemmConfig):
        raise E(f"{op}: config must be a HopperGemmConfig, not {type(cfg).__name__}")
    cfg.validate(op, elem=1, out_elem=_elem(out_dtype),
                 overlap=promotion_overlap(cfg, (rec.gk, rec.gn) if block else None))
    if block and rec.gk % cfg.block_k:
        raise E(f"{op}: blockwise scales with groups of {rec.gk} along K need block_k dividing {rec.gk} (one K "
                f"group per K step; got block_k={cfg.block_k}); give the Gluon core a config with block_k="
                f"{min(128, rec.gk)} or use {alt}")
    return rec, cfg


def scaled_matmul_hopper(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, out=None,
                         config: HopperGemmConfig | None = None, num_programs_=None, scale_block=(128, 128)):
    """``torch._scaled_mm(a, b, scale_a, scale_b, out_dtype)`` on the Gluon core: fp8 ``a [M, K]`` row-major,
    ``b [K, N]`` column-major (``w.t()``), per-tensor, rowwise or blockwise scales (:func:`fp8_plan`;
    kernels/scaling.py); fp32 accumulation with the fp32 promotion every ``block_k`` products (no fast
    accumulation), the per-tensor / rowwise scales in the epilogue (``(acc * scale_a[row]) * scale_b[col]``
    in fp32), blockwise ones per K step (``acc + part * scale_a[row, g] * scale_b[g, col // gn]`` in fp32, the
    tl core's order), one rounding to ``out_dtype`` (bfloat16, float16, float32).  CUDA sm_90 only; on CPU
    the tl twin is ``ditron.kernels.gemm.matmul(a, b, scale_a=, scale_b=, core="gluon")``."""
    op = "scaled_matmul_hopper"
    rec, cfg = fp8_plan(op, a, b, out, scale_a, scale_b, out_dtype, config, scale_block)
    if a.device.type != "cuda":
        raise ditron.DitronError(f"{op}: the Gluon core runs on Hopper GPUs only; on {a.device} use the tl twin "
                                 "ditron.kernels.gemm.matmul(a, b, scale_a=, scale_b=, core='gluon')")
    if not supported(a.device):
        raise ditron.DitronError(f"{op}: {torch.cuda.get_device_name(a.device)} is not sm_90; use "
                                 "ditron.kernels.gemm.matmul")
    return launch_scaled(a, b, scale_a, scale_b, out_dtype, out, rec, cfg, num_programs_)


def launch_scaled(a, b, scale_a, scale_b, out_dtype, out, rec, cfg: HopperGemmConfig, num_programs_=None):
    """Launch the fp8 Gluon core with the ``(recipe, config)`` :func:`fp8_plan` made (and checked) for this call
    on a Hopper GPU (:func:`scaled_matmul_hopper`; ``ditron.kernels.gemm.matmul``, which has planned the call)."""
    M = a.shape[0]
    N = b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    a_desc, b_desc, c_desc = descriptors(a, b, out, cfg)
    P = int(num_programs_ or num_programs(M, N, cfg, sm_count(a.device)))
    block = (rec.gk, rec.gn) if rec.mode == scaling.BLOCKWISE else None
    scaled_gemm_ws_kernel[(P,)](a_desc, b_desc, c_desc, *rec.kernel_args(scale_a, scale_b), num_warps=4,
                                **kernel_constexprs(cfg), **scale_constexprs(rec.sa[0] != 0, rec.sb[1] != 0, cfg,
                                                                             block))
    return out


# ---------------------------------------------------------------------------
# compile on a CPU
# ---------------------------------------------------------------------------

def compile_sm90(cfg: HopperGemmConfig | None = None, dtype=torch.bfloat16, M=1024, N=1024, K=1024, target="sm_90a",
                 out_dtype=None, scales="row", b_dtype=None, scale_block=(128, 128)):
    """Compile :func:`gemm_ws_kernel` (fp16 / bf16) or, for fp8 ``dtype``, :func:`scaled_gemm_ws_kernel`
    (``scales``: ``"row"`` -- ``scale_a [M, 1]``, ``scale_b [1, N]`` --, ``"tensor"`` or ``"block"`` --
    blockwise, ``scale_block=(gk, gn)``; ``out_dtype`` default bfloat16; ``b_dtype`` default ``dtype``) for
    ``target`` without a GPU (``triton.compile`` of a
    Gluon AST source); returns the compiled kernel (``.asm["ttgir"]``, ``["ptx"]``, ``.metadata``).  The
    descriptors' types come from descriptors on CPU tensors of the given shape."""
    from ditron.target import parse_target
    tgt = parse_target(target)
    if tgt.backend != "cuda" or tgt.capability != 90:
        raise ditron.DitronError(f"gemm_hopper: the Gluon core is for sm_90a only, not {tgt.name}; on other targets "
                                 "(AMD, other NVIDIA GPUs, the simulator) the core is ditron.kernels.gemm.gemm_kernel")
    fp8 = dtype in _FP8_DTYPES
    if fp8:
        out_dtype = out_dtype or torch.bfloat16
        gk = scaling.check_scale_block("gemm_hopper.compile_sm90", scale_block)[0] if scales == "block" else None
        cfg = cfg or fp8_default_config(M, N, K, 132, out_dtype, gk)
        cfg.validate(elem=1, out_elem=_elem(out_dtype),
                     overlap=promotion_overlap(cfg, scaling.check_scale_block("gemm_hopper.compile_sm90", scale_block)
                                               if scales == "block" else None))
        a = torch.empty((M, K), dtype=dtype)
        b = torch.empty((N, K), dtype=b_dtype or dtype).t()
        c = torch.empty((M, N), dtype=out_dtype)
    else:
        cfg = (cfg or DEFAULT_CONFIG).validate()
        a = torch.empty((M, K), dtype=dtype)
        b = torch.empty((K, N), dtype=dtype)
        c = torch.empty((M, N), dtype=dtype)
    descs = descriptors(a, b, c, cfg)
    sig = {"a_desc": _compat.mangle_arg(descs[0]), "b_desc": _compat.mangle_arg(descs[1]),
           "c_desc": _compat.mangle_arg(descs[2])}
    consts = kernel_constexprs(cfg)
    if fp8:
        if scales not in ("row", "tensor", "block"):
            raise ditron.DitronError(f"gemm_hopper.compile_sm90: scales={scales!r}; use 'row', 'tensor' or 'block'")
        sig.update(sa_ptr="*fp32", sb_ptr="*fp32", stride_sam="i32", stride_sak="i32", stride_sbk="i32",
                   stride_sbn="i32")
        block = scaling.check_scale_block("gemm_hopper.compile_sm90", scale_block) if scales == "block" else None
        consts.update(scale_constexprs(scales != "tensor", scales != "tensor", cfg, block))
        kernel = scaled_gemm_ws_kernel
    else:
        kernel = gemm_ws_kernel
    for k in consts:
        sig[k] = "constexpr"
    src = _compat.gluon_ast_source(kernel, sig, consts)
    return _compat.compile_source(src, tgt.to_triton(), {"num_warps": 4})


__all__ = ["HopperGemmConfig", "DEFAULT_CONFIG", "MODES", "TWIN", "twin_config", "supported", "matmul_hopper",
           "gemm_ws_kernel", "compile_sm90", "descriptors", "layouts", "scaled_matmul_hopper", "scaled_gemm_ws_kernel",
           "fp8_default_config", "fp8_plan"]

