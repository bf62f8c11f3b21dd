"""The zoo's GEMM core: a persistent Triton GEMM for H100/H200 that the
overlap kernels (ag_gemm, gemm_rs, gemm_ar) share, and that runs alone as
:func:`matmul`.

    from ditron.kernels.gemm import matmul, GemmConfig
    c = matmul(a, b)                      # a: [M, K], b: [K, N] (any strides), fp16 / bf16
    c = matmul(a, b, config=GemmConfig(128, 256, 64, num_stages=3, num_warps=8))
    c = matmul(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)   # fp8 (kernels/scaling.py)

Structure
---------
* :func:`gemm_tile` (``@triton.jit``): one output tile's fp32 accumulator,
  from per-row pointers of A and per-column pointers of B.  Rows / columns
  past the matrix are clamped by the caller (they compute garbage that is
  masked at the store), so the K loop has no row / column masks; the K tail
  is masked only when ``EVEN_K`` is false.  Per-row pointers let a caller
  read different rows from different buffers (ag_gemm reads its own rows
  from ``a`` and the others from the gather buffer) at no cost in the loop.
* :func:`gemm_tile_tma` (``@triton.jit``): the same through TMA tensor
  descriptors (Hopper); out-of-range rows, columns and K are zero-filled by
  the hardware.
* :func:`gemm_kernel`: persistent (``num_programs`` programs, default one
  per SM) over the tiles in ``dl.swizzle_2d`` order.
* kernels/gemm_streamk.py ``gemm_streamk_kernel``: the same with the
  Stream-K hybrid schedule (``GemmConfig(stream_k=True)``, opt-in,
  :func:`matmul` only): full waves data-parallel, the rest of the tiles' K
  steps split evenly over the programs, partial tiles summed by their owner
  in a fixed order.

Configs: :func:`matmul` without ``config=`` looks the shape up in the
measured table of the GPU kind (kernels/gemm_tables/*.json, written by
bench/gemm_core_levers.py --write-table; :func:`table_choice`), else
:func:`default_config` picks tiles by shape (measured on H200: bench/gemm.py
and bench/results/h200x4.md); the overlap kernels use :func:`default_config`.
``config=`` overrides both.  On the simulator (CPU) every kernel uses small
tiles.
"""
from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl

from . import scaling
from ._common import sm_count
from ._common import cdiv

_GEMM_DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False
    #: software-pipeline across tiles of a persistent loop (``tl.range(flatten=True)``)
    flatten: bool = False
    #: TMA-store epilogue in ``epilogue_subtile`` column slices (1 or 2; only with ``tma``)
    epilogue_subtile: int = 1
    #: producer/consumer warp specialisation of the persistent loop (``tl.range(warp_specialize=True)``;
    #: only with ``tma`` and without ``flatten``).  On sm_90 (Triton 3.6 and 3.9) Triton splits the loop
    #: into a producer and two consumer warpgroups only with ``num_warps=4``; with 8 it is a no-op
    #: (tests/test_compile_gemm_hopper.py)
    warp_specialize: bool = False
    #: Stream-K hybrid schedule (kernels/gemm_streamk.py): full waves of tiles data-parallel, the last
    #: ``P + T % P`` tiles' K iterations split evenly over the ``P`` programs, partial tiles summed in a fixed
    #: order (deterministic).  :func:`matmul` only, fp16 / bf16, not with ``warp_specialize``
    stream_k: bool = False

    def validate(self, op="gemm"):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ditron.DitronError(f"{op}: {name}={v} must be a power of two >= 16 (tl.dot)")
        if self.group_m < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ditron.DitronError(f"{op}: group_m, num_warps and num_stages must be >= 1 ({self})")
        if self.epilogue_subtile not in (1, 2):
            raise ditron.DitronError(f"{op}: epilogue_subtile={self.epilogue_subtile} must be 1 or 2")
        if self.warp_specialize and (self.flatten or not self.tma):
            raise ditron.DitronError(f"{op}: warp_specialize needs tma=True and flatten=False ({self})")
        if self.stream_k:
            if self.warp_specialize:
                raise ditron.DitronError(f"{op}: stream_k does not combine with warp_specialize (the Stream-K "
                                         f"phase's fixup waits run outside tl.range's partitions) ({self})")
            if not (op in STREAM_K_OPS or op.startswith("GEMM table")):
                raise ditron.DitronError(f"{op}: stream_k applies to ditron.kernels.gemm.matmul only; the overlap "
                                         f"kernels' tile loops wait and signal per output tile ({self})")
        return self

    def launch_options(self):
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k, GROUP_M=self.group_m,
                    num_warps=self.num_warps, num_stages=self.num_stages)


#: the ops whose configs may ask for ``stream_k`` (:func:`matmul`; ``GemmConfig.validate``'s default op)
STREAM_K_OPS = ("gemm", "matmul")

#: small tiles for the simulator: the interpreter's cost grows with the tile
SIM_CONFIG = GemmConfig(16, 16, 32, group_m=4, num_warps=1, num_stages=1)


def is_sim_device(device) -> bool:
    return torch.device(device).type == "cpu"


def default_config(M, N, K, dtype=torch.bfloat16, device="cuda", out_dtype=None) -> GemmConfig:
    """A config for an ``[M, K] @ [K, N]`` GEMM on ``device`` (small tiles on
    the simulator).  On GPUs: TMA descriptors, 128 x 256 x 64 tiles, 3
    stages, 8 warps, the tile loop flattened (the best config at most of the
    paper's per-rank shapes on H200: bench/gemm_core_sweep.py); 128 x 128
    when there are fewer output tiles than SMs.  Where TMA does not apply
    (unaligned or non-contiguous operands) the same tiles run on pointer
    loads."""
    if is_sim_device(device):
        return SIM_CONFIG
    if dtype in scaling.FP8_DTYPES:
        return fp8_config(M, N, K, sm_count(device), out_dtype or torch.bfloat16)
    return gpu_default_config(M, N, K, sm_count(device))


def fp8_config(M, N, K, num_sms, out_dtype=torch.bfloat16) -> GemmConfig:
    """The GPU default for fp8 operands (no device query): 128 x 256 x 128 tiles (K steps of 128: one
    fp32 promotion and, blockwise, one scale group per step), 3 stages, TMA, the tile loop flattened;
    128 x 128 where there are fewer tiles than SMs; the TMA-store epilogue in two slices for float32
    output (shared memory).  TODO(perf): measured on no GPU yet (ditron bench gemm --dtype fp8)."""
    sub = 2 if out_dtype == torch.float32 else 1
    if cdiv(M, 128) * cdiv(N, 256) < num_sms:
        return GemmConfig(128, 128, 128, group_m=8, num_warps=8, num_stages=4, tma=True, flatten=True,
                          epilogue_subtile=sub)
    return GemmConfig(128, 256, 128, group_m=8, num_warps=8, num_stages=3, tma=True, flatten=True,
                      epilogue_subtile=sub)


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_DEVICE_INFO: dict = {}
_CHOICES: dict = {}


def _device_info(device):
    """(name, SM count) of a CUDA device, asked once per device (only when a table is looked up)."""
    key = str(device)
    info = _DEVICE_INFO.get(key)
    if info is None:
        props = torch.cuda.get_device_properties(device)
        info = _DEVICE_INFO[key] = (props.name, props.multi_processor_count)
    return info


def config_from_entry(entry, where="GEMM table"):
    """A table entry's ``(core, config)``: ``("tl", GemmConfig)`` or ``("gluon", HopperGemmConfig)``."""
    fields = dict(entry["config"])
    try:
        if entry["core"] == "gluon":
            from .gemm_hopper import HopperGemmConfig
            return "gluon", HopperGemmConfig(**fields).validate(where)
        return "tl", GemmConfig(**fields).validate(where)
    except TypeError as e:
        raise ditron.DitronError(f"{where}: config {fields}: {e}") from None


def table_choice(M, N, K, dtype=torch.bfloat16, device="cuda", table=None):
    """``(core, config, note)`` from the per-GPU table (kernels/gemm_table.py: the table of ``device``'s GPU
    kind, the nearest entry) for an ``[M, K] @ [K, N]`` GEMM, or None where no table or no entry near enough
    applies (the simulator: always None).  ``table``: a :class:`~ditron.kernels.gemm_table.GemmTable` to use
    instead of the device's.  Cached per shape, dtype and device."""
    if (table is None and is_sim_device(device)) or dtype not in _DTYPE_NAMES:
        return None                 # the tables hold fp16 / bf16 measurements only
    key = (int(M), int(N), int(K), dtype, str(device), id(table) if table is not None else None)
    if key in _CHOICES:
        return _CHOICES[key]
    from . import gemm_table
    if table is None:
        table = gemm_table.table_for(*_device_info(device))
    choice = None
    if table is not None:
        entry, d = table.lookup(M, N, K, _DTYPE_NAMES[dtype])
        if entry is not None:
            core, cfg = config_from_entry(entry, f"GEMM table {table.path}")
            choice = (core, cfg, f"table {os.path.basename(table.path)}: {entry.get('candidate', core)} "
                                 f"(entry {entry['M']}x{entry['N']}x{entry['K']}, distance {d:.2f})")
    _CHOICES[key] = choice
    return choice


def resolve_config(M, N, K, dtype=torch.bfloat16, device="cuda"):
    """What :func:`matmul` runs without a ``config``: ``(core, config, note)`` -- the per-GPU table's entry
    (:func:`table_choice`), else ``("tl", default_config(...), "default rule")``."""
    choice = table_choice(M, N, K, dtype, device)
    if choice is not None:
        return choice
    return "tl", default_config(M, N, K, dtype, device), "default rule"


def gpu_default_config(M, N, K, num_sms) -> GemmConfig:
    """:func:`default_config` on a GPU with ``num_sms`` SMs (no device query:
    compile tests use it on CPUs)."""
    if cdiv(M, 128) * cdiv(N, 256) < num_sms:
        return GemmConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=4, tma=True, flatten=True)
    return GemmConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=3, tma=True, flatten=True)


#: what :func:`tune` tries on GPUs: the default and the configs that won at some paper shape on H200
TUNE_CONFIGS = (
    GemmConfig(128, 256, 64, 8, 8, 3, tma=True, flatten=True),
    GemmConfig(128, 256, 64, 8, 8, 3, tma=True, flatten=True, epilogue_subtile=2),
    GemmConfig(128, 256, 64, 8, 4, 3, tma=True, warp_specialize=True),
    GemmConfig(128, 256, 64, 16, 8, 3, tma=True, flatten=True),
    GemmConfig(256, 128, 64, 8, 8, 3, tma=True, flatten=True),
    GemmConfig(128, 128, 64, 8, 8, 4, tma=True, flatten=True),
    GemmConfig(128, 256, 64, 8, 8, 4),
)
#: what :func:`tune` tries on the simulator (exercises the tuner; the timings mean nothing there)
SIM_TUNE_CONFIGS = (SIM_CONFIG, GemmConfig(16, 32, 32, group_m=4, num_warps=1, num_stages=1))
_TUNED: dict = {}


def tune(M, N, K, dtype=torch.bfloat16, device="cuda", candidates=None, warmup=3, iters=10) -> GemmConfig:
    """The fastest of ``candidates`` (default :data:`TUNE_CONFIGS`) for an
    ``[M, K] @ [K, N]`` GEMM on ``device``, timed on random inputs and cached
    per shape, dtype and device.  Candidates that do not compile (shared
    memory) or do not apply (TMA alignment) are skipped.

    For :func:`matmul` (``config="tune"``) only: ranks time independently and
    may pick different configs, which the overlap kernels' signal layouts do
    not allow -- give them one explicit ``config``."""
    import time
    key = (int(M), int(N), int(K), dtype, str(device), tuple(candidates or ()))
    hit = _TUNED.get(key)
    if hit is not None:
        return hit
    sim = is_sim_device(device)
    cands = tuple(candidates or (SIM_TUNE_CONFIGS if sim else TUNE_CONFIGS))
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(M, K, generator=g).to(dtype).to(device)
    b = torch.randn(K, N, generator=g).to(dtype).to(device)
    best, best_t, errors = None, float("inf"), []
    for cfg in cands:
        try:
            for _ in range(warmup):
                matmul(a, b, config=cfg)
            if sim:
                t0 = time.perf_counter()
                for _ in range(iters):
                    matmul(a, b, config=cfg)
                t = time.perf_counter() - t0
            else:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    matmul(a, b, config=cfg)
                end.record()
                end.synchronize()
                t = start.elapsed_time(end)
        except Exception as e:  # noqa: BLE001 -- a config that does not compile or apply is skipped
            errors.append(f"{cfg}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        if t < best_t:
            best, best_t = cfg, t
    if best is None:
        raise ditron.DitronError(f"gemm.tune: no candidate config ran for M={M}, N={N}, K={K}:\n  "
                                 + "\n  ".join(errors))
    _TUNED[key] = best
    return best


_ALLOCATOR_SET = False


def ensure_tma_allocator():
    """Device-side tensor descriptors need a global scratch allocator."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        def alloc(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8, device="cuda")
        triton.set_allocator(alloc)
        _ALLOCATOR_SET = True


# ---------------------------------------------------------------------------
# device helpers
# ---------------------------------------------------------------------------

@triton.jit
def tile_rows(pid_m, M, BLOCK_M: tl.constexpr):
    """(rows, row_ok, clamped rows) of tile row ``pid_m``."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    return rows, row_ok, tl.minimum(rows, M - 1)


@triton.jit
def load_k_step(a_ptrs, b_ptrs, col_ok, k0, ks, K, EVEN_K: tl.constexpr):
    """One ``BLOCK_K`` step's A and B tiles of :func:`gemm_tile` / :func:`scaled_gemm_tile` (K masked unless
    ``EVEN_K``; B's missing columns read as 0)."""
    if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs, mask=col_ok[None, :], other=0.0)
    else:
        k_ok = (k0 + ks) < K
        a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
    return a, b


@triton.jit
def gemm_tile(a_rows, b_cols, col_ok, stride_ak, stride_bk, K,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """fp32 ``[BLOCK_M, BLOCK_N]`` accumulator of one tile: ``a_rows`` are
    pointers to the tile's A rows (``[BLOCK_M]``, all valid: clamp the rows
    past M), ``b_cols`` pointers to its B columns (``[BLOCK_N]``) and
    ``col_ok`` which of them exist.  Keep B's columns unclamped and N
    specialised (not in ``do_not_specialize``) so that B loads stay
    vectorised: the mask is constant over 16 columns when N is a multiple of
    16 (a clamp would hide the contiguity and cost 20x)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_rows[:, None] + ks[None, :] * stride_ak
    b_ptrs = b_cols[None, :] + ks[:, None] * stride_bk
    for k0 in range(0, K, BLOCK_K):
        a, b = load_k_step(a_ptrs, b_ptrs, col_ok, k0, ks, K, EVEN_K)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def scale_step(acc, part, sa_rows, sb_cols, col_ok, k0, stride_sak, stride_sbk, GK: tl.constexpr):
    """Blockwise fp8: ``acc + part * (scale_a[rows, g] * scale_b[g, cols])`` for the K group ``g`` of ``k0``: the
    scales' product first (rounded once), then a multiply-add per element, which the GPU fuses (one rounding;
    the simulator rounds the product and the sum apart).  The Gluon core's promotion computes the same
    expression (kernels/gemm_hopper.py ``_promote``; where a tile's columns share one ``scale_b`` it multiplies
    the scales once per row) -- DeepGEMM's order."""
    g = k0 // GK
    sa = tl.load(sa_rows + g * stride_sak)
    sb = tl.load(sb_cols + g * stride_sbk, mask=col_ok, other=0.0)
    return acc + part * (sa[:, None] * sb[None, :])


@triton.jit
def scale_epilogue(acc, sa_rows, sb_cols, col_ok, SCALE: tl.constexpr):
    """Per-tensor / per-row / per-column fp8: ``acc * scale_a[rows] * scale_b[cols]`` (``SCALE == 1``)."""
    if SCALE == 1:
        sa = tl.load(sa_rows)
        sb = tl.load(sb_cols, mask=col_ok, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    return acc


@triton.jit
def scaled_gemm_tile(a_rows, b_cols, col_ok, stride_ak, stride_bk, K, sa_rows, sb_cols, stride_sak, stride_sbk,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                     SCALE: tl.constexpr, GK: tl.constexpr):
    """:func:`gemm_tile` with fp8 scales (kernels/scaling.py): ``SCALE`` 0 is :func:`gemm_tile` itself;
    1 scales the accumulator in the epilogue; 2 (blockwise) scales each ``BLOCK_K`` step's product.
    ``sa_rows``: pointers to the tile rows' ``scale_a`` entries (group 0), ``sb_cols``: to its columns'
    ``scale_b`` entries (group 0).  fp8 products are summed in the tensor core for one ``BLOCK_K`` step
    at most, then promoted to fp32 (``max_num_imprecise_acc``; ``BLOCK_K <= 128``), as
    ``torch._scaled_mm`` without fast accumulation."""
    if SCALE == 0:
        acc = gemm_tile(a_rows, b_cols, col_ok, stride_ak, stride_bk, K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = a_rows[:, None] + ks[None, :] * stride_ak
        b_ptrs = b_cols[None, :] + ks[:, None] * stride_bk
        for k0 in range(0, K, BLOCK_K):
            a, b = load_k_step(a_ptrs, b_ptrs, col_ok, k0, ks, K, EVEN_K)
            if SCALE == 2:
                part = tl.dot(a, b, max_num_imprecise_acc=BLOCK_K)
                acc = scale_step(acc, part, sa_rows, sb_cols, col_ok, k0, stride_sak, stride_sbk, GK)
            else:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        acc = scale_epilogue(acc, sa_rows, sb_cols, col_ok, SCALE)
    return acc


@triton.jit
def scaled_gemm_tile_tma(a_desc, b_desc, off_am, off_n, K, sa_rows, sb_cols, col_ok, stride_sak, stride_sbk,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE: tl.constexpr,
                         GK: tl.constexpr, B_T: tl.constexpr):
    """:func:`gemm_tile_tma` with fp8 scales (as :func:`scaled_gemm_tile`).  ``B_T``: ``b_desc`` describes
    ``b`` transposed (``[N, K]``, K-major: what Hopper's fp8 ``wgmma`` reads; :func:`operand_descriptors`)."""
    if SCALE == 0:
        acc = gemm_tile_tma(a_desc, b_desc, off_am, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, B_T)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([off_am, ki * BLOCK_K])
            if B_T:
                b = b_desc.load([off_n, ki * BLOCK_K]).T
            else:
                b = b_desc.load([ki * BLOCK_K, off_n])
            if SCALE == 2:
                part = tl.dot(a, b, max_num_imprecise_acc=BLOCK_K)
                acc = scale_step(acc, part, sa_rows, sb_cols, col_ok, ki * BLOCK_K, stride_sak, stride_sbk, GK)
            else:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        acc = scale_epilogue(acc, sa_rows, sb_cols, col_ok, SCALE)
    return acc


@triton.jit
def scale_ptrs(sa_ptr, sb_ptr, rows_c, cols, stride_sam, stride_sbn, GN: tl.constexpr):
    """(``sa_rows``, ``sb_cols``) of :func:`scaled_gemm_tile` for clamped rows and columns."""
    return sa_ptr + rows_c.to(tl.int64) * stride_sam, sb_ptr + (cols // GN).to(tl.int64) * stride_sbn


@triton.jit
def gemm_tile_tma(a_desc, b_desc, off_am, off_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, B_T: tl.constexpr = False):
    """The accumulator of the tile at rows ``off_am`` of ``a_desc``'s matrix
    and columns ``off_n`` of ``b_desc``'s, through TMA."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_am, ki * BLOCK_K])
        if B_T:
            b = b_desc.load([off_n, ki * BLOCK_K]).T
        else:
            b = b_desc.load([ki * BLOCK_K, off_n])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def operand_descriptors(a_ptr, b_ptr, M, N, K, stride_am, stride_bk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, TMA: tl.constexpr, B_T: tl.constexpr = False, stride_bn=1):
    """TMA descriptors of row-major A ``[M, K]`` and B ``[K, N]`` (placeholders without ``TMA``); with
    ``B_T`` B is column-major (``stride_bk == 1``) and its descriptor is of ``B^T`` ``[N, K]`` (K-major
    tiles, as Hopper's fp8 ``wgmma`` needs them)."""
    if TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        if B_T:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1],
                                               block_shape=[BLOCK_N, BLOCK_K])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                               block_shape=[BLOCK_K, BLOCK_N])
    else:
        a_desc = 0
        b_desc = 0
    return a_desc, b_desc


@triton.jit
def gemm_tile_at(a_ptr, b_ptr, a_desc, b_desc, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 TMA: tl.constexpr, sa_ptr=0, sb_ptr=0, stride_sam=0, stride_sak=0, stride_sbk=0, stride_sbn=0,
                 SCALE: tl.constexpr = 0, GK: tl.constexpr = 1, GN: tl.constexpr = 1, B_T: tl.constexpr = False):
    """Tile ``(pid_m, pid_n)`` of ``a @ b``: ``(rows, row_ok, cols, col_ok,
    acc)`` through TMA (:func:`operand_descriptors`) or pointer loads; fp8
    operands with their scales (``SCALE``: kernels/scaling.py's recipe
    mode; ``sa_ptr`` ... ``stride_sbn``: the scale tensors and their
    strides, :meth:`kernels.scaling.Recipe.kernel_args`)."""
    rows, row_ok, rows_c = tile_rows(pid_m, M, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if SCALE == 0:
        if TMA:
            acc = gemm_tile_tma(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_M, BLOCK_N, BLOCK_K, B_T)
        else:
            a_rows = a_ptr + rows_c.to(tl.int64) * stride_am
            b_cols = b_ptr + cols.to(tl.int64) * stride_bn
            acc = gemm_tile(a_rows, b_cols, col_ok, stride_ak, stride_bk, K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    else:
        sa_rows, sb_cols = scale_ptrs(sa_ptr, sb_ptr, rows_c, tl.minimum(cols, N - 1), stride_sam, stride_sbn, GN)
        if TMA:
            acc = scaled_gemm_tile_tma(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, sa_rows, sb_cols, col_ok,
                                       stride_sak, stride_sbk, BLOCK_M, BLOCK_N, BLOCK_K, SCALE, GK, B_T)
        else:
            a_rows = a_ptr + rows_c.to(tl.int64) * stride_am
            b_cols = b_ptr + cols.to(tl.int64) * stride_bn
            acc = scaled_gemm_tile(a_rows, b_cols, col_ok, stride_ak, stride_bk, K, sa_rows, sb_cols, stride_sak,
                                   stride_sbk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SCALE, GK)
    return rows, row_ok, cols, col_ok, acc


@triton.jit
def store_tile(c_ptr, stride_cm, stride_cn, rows, row_ok, cols, col_ok, acc):
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def store_tile_tma(c_desc, off_m, off_n, acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SUBTILE: tl.constexpr, DTYPE: tl.constexpr):
    """TMA-store epilogue of one tile into ``c_desc`` (block ``[BLOCK_M,
    BLOCK_N // SUBTILE]``): in ``SUBTILE`` column slices, so that the shared
    memory staging buffer is smaller (more pipeline stages fit) and the first
    slice's store overlaps the second's conversion.  The hardware clips rows
    and columns past the matrix.  The stores are asynchronous: they are
    complete at the end of the kernel, not before a following signal (use
    :func:`store_tile` where a flag announces the data)."""
    if SUBTILE == 2:
        acc3 = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        c0, c1 = tl.split(acc3)
        c_desc.store([off_m, off_n], c0.to(DTYPE))
        c_desc.store([off_m, off_n + BLOCK_N // 2], c1.to(DTYPE))
    else:
        c_desc.store([off_m, off_n], acc.to(DTYPE))


@ditron.jit(do_not_specialize=["M"])
def gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                EVEN_K: tl.constexpr, TMA: tl.constexpr, FLATTEN: tl.constexpr, SUBTILE: tl.constexpr,
                WARP_SPEC: tl.constexpr, SCALE: tl.constexpr = 0, GK: tl.constexpr = 1, GN: tl.constexpr = 1,
                B_T: tl.constexpr = False):
    """Persistent ``c = a @ b``: program ``p`` computes tiles ``p, p + P, ...``
    of the ``dl.swizzle_2d`` order.  ``TMA``: operands and result through
    device-side tensor descriptors (TMA loads, TMA-store epilogue), the tile
    loop software-pipelined across tiles (``FLATTEN``) or warp-specialised
    (``WARP_SPEC``); otherwise pointer loads and masked stores.  fp8
    operands: ``SCALE`` and the scale arguments (kernels/scaling.py), ``B_T``:
    B's descriptor is of ``B^T`` (K-major)."""
    P = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    if TMA:
        a_desc, b_desc = operand_descriptors(a_ptr, b_ptr, M, N, K, stride_am, stride_bk, BLOCK_M, BLOCK_N,
                                             BLOCK_K, TMA, B_T, stride_bn)
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                           block_shape=[BLOCK_M, BLOCK_N // SUBTILE])
        for tile in tl.range(tl.program_id(0), num_tiles, P, flatten=FLATTEN, warp_specialize=WARP_SPEC):
            pid_m, pid_n = dl.swizzle_2d(tile, num_pid_m, num_pid_n, GROUP_M)
            if SCALE == 0:
                acc = gemm_tile_tma(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                    B_T)
            else:
                _r, _rok, rows_c = tile_rows(pid_m, M, BLOCK_M)
                cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
                sa_rows, sb_cols = scale_ptrs(sa_ptr, sb_ptr, rows_c, tl.minimum(cols, N - 1), stride_sam,
                                              stride_sbn, GN)
                acc = scaled_gemm_tile_tma(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, sa_rows, sb_cols,
                                           cols < N, stride_sak, stride_sbk, BLOCK_M, BLOCK_N, BLOCK_K, SCALE, GK,
                                           B_T)
            store_tile_tma(c_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, acc, BLOCK_M, BLOCK_N, SUBTILE,
                           c_ptr.dtype.element_ty)
    else:
        for tile in tl.range(tl.program_id(0), num_tiles, P, flatten=FLATTEN):
            pid_m, pid_n = dl.swizzle_2d(tile, num_pid_m, num_pid_n, GROUP_M)
            rows, row_ok, cols, col_ok, acc = gemm_tile_at(a_ptr, b_ptr, 0, 0, pid_m, pid_n, M, N, K, stride_am,
                                                           stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N,
                                                           BLOCK_K, EVEN_K, TMA, sa_ptr, sb_ptr, stride_sam,
                                                           stride_sak, stride_sbk, stride_sbn, SCALE, GK, GN)
            store_tile(c_ptr, stride_cm, stride_cn, rows, row_ok, cols, col_ok, acc)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

def check_operands(op, a, b, out=None, out_shape=None, out_dtype=None):
    """Shape / dtype / device checks shared by the GEMM kernels (errors name ``op``).  fp8 operands
    (kernels/scaling.py) write ``out_dtype``; fp16 / bf16 ones their own dtype."""
    E = ditron.DitronError
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise E(f"{op}: argument 'a' must be a 2-D tensor")
    if not isinstance(b, torch.Tensor) or b.dim() != 2:
        raise E(f"{op}: argument 'b' must be a 2-D tensor [K, N]")
    if scaling.is_fp8(a):
        scaling.check_fp8_operands(op, a, b, out_dtype or torch.bfloat16)
    elif a.dtype not in _GEMM_DTYPES:
        raise E(f"{op}: argument 'a' is {a.dtype}; use float16 or bfloat16 (or fp8: float8_e4m3fn / float8_e5m2 "
                "with scale_a and scale_b)")
    elif b.dtype != a.dtype:
        raise E(f"{op}: argument 'b' is {b.dtype}, 'a' is {a.dtype}")
    out_dtype = out_dtype or a.dtype
    if b.device != a.device:
        raise E(f"{op}: argument 'b' is on {b.device}, 'a' on {a.device}")
    if b.shape[0] != a.shape[1]:
        raise E(f"{op}: 'b' has {b.shape[0]} rows, 'a' has K={a.shape[1]} columns")
    if a.shape[0] < 1 or a.shape[1] < 1 or b.shape[1] < 1:
        raise E(f"{op}: empty operands (a is {list(a.shape)}, b is {list(b.shape)})")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise E(f"{op}: argument 'out' must be a torch.Tensor")
        if out.dtype != out_dtype:
            raise E(f"{op}: argument 'out' is {out.dtype}, expected {out_dtype}")
        if out.device != a.device:
            raise E(f"{op}: argument 'out' is on {out.device}, 'a' on {a.device}")
        if out_shape is not None and tuple(out.shape) != tuple(out_shape):
            raise E(f"{op}: argument 'out' has shape {tuple(out.shape)}, expected {tuple(out_shape)}")


def tma_ok(*tensors) -> bool:
    """TMA needs a unit last stride, 16-byte aligned bases and row strides."""
    for t in tensors:
        if t.stride(-1) != 1 or (t.data_ptr() % 16) or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


def prepare_tma(op, cfg, sim, *tensors) -> bool:
    """Whether a launch uses TMA: ``cfg.tma``, on a GPU, and every tensor
    (operands, and the output where the epilogue stores through TMA) has a
    unit last stride and 16-byte aligned rows.  Otherwise the launch falls
    back to pointer tiles of the same sizes (pointer loads need no
    alignment), so a config never fails on an operand's layout.  Installs the
    descriptors' scratch allocator."""
    if not cfg.tma or sim or not tma_ok(*tensors):
        return False
    ensure_tma_allocator()
    return True


def fp8_tma_ok(a, b, out=None) -> bool:
    """TMA for fp8 operands: ``a`` and ``out`` as :func:`tma_ok`, ``b`` column-major (``b = w.t()`` of a
    row-major ``[N, K]`` weight, as ``torch._scaled_mm`` takes it): its descriptor is of ``w``, whose
    K-major tiles Hopper's fp8 ``wgmma`` reads without a transpose."""
    return tma_ok(a, *(() if out is None else (out,))) and b.stride(0) == 1 and tma_ok(b.t())


CORES = ("tl", "gluon")


def matmul(a, b, out=None, config: GemmConfig | str | None = None, num_programs=None, *, scale_a=None,
           scale_b=None, out_dtype=None, scale_block=(128, 128), core=None):
    """``a @ b`` with the zoo's GEMM core (fp32 accumulation, ``a``'s dtype).
    ``config``: a :class:`GemmConfig`, ``None`` or ``"tune"`` (:func:`tune`:
    the fastest candidate for this shape, timed once and cached).  ``None``:
    for fp16 / bf16, the measured table of this GPU kind (:func:`table_choice`,
    kernels/gemm_tables/; its entry may name the Gluon core, which runs on
    sm_90 with TMA-able operands, else its ``tl`` twin), else
    :func:`default_config`.  The overlap kernels do not read the table.
    A config with ``stream_k=True`` runs kernels/gemm_streamk.py ``gemm_streamk_kernel`` (fp16 / bf16;
    ``num_programs`` at most the SM count on GPUs).

    fp8 operands (``float8_e4m3fn`` / ``float8_e5m2``) need ``scale_a`` and
    ``scale_b`` (float32), whose shapes choose the recipe -- per-tensor,
    per-row / per-column (``torch._scaled_mm``'s) or blockwise with
    ``scale_block=(gk, gn)`` groups (DeepSeek-V3's 1 x 128 / 128 x 128):
    kernels/scaling.py -- and write ``out_dtype`` (default bfloat16; float16,
    float32).  ``b`` column-major (``w.t()``) is the fast layout on Hopper.

    ``core``: ``None`` (the table's choice for fp16 / bf16; for fp8 with per-tensor / per-row scales on a Hopper
    GPU the Gluon core where its layout holds, :func:`_gluon_fp8_default`; else the ``tl`` core), ``"tl"`` or
    ``"gluon"``:
    the warp-specialised Gluon core (kernels/gemm_hopper.py; ``config`` a ``HopperGemmConfig`` or None) on
    sm_90 GPUs -- fp16 / bf16 with row-major TMA-able operands, fp8 with per-tensor, per-row / per-column or
    blockwise scales (``block_k`` dividing the K group), ``b`` column-major
    (:func:`~ditron.kernels.gemm_hopper.fp8_plan` checks it before launch, on every device) -- and elsewhere
    (the simulator, other GPUs) its ``tl`` twin, the same tiles and K order
    (:func:`~ditron.kernels.gemm_hopper.twin_config`)."""
    if core is not None and core not in CORES:
        raise ditron.DitronError(f"matmul: core={core!r}; use None, 'tl' or 'gluon'")
    if core == "gluon":
        return _matmul_gluon(a, b, out, config, num_programs, scale_a, scale_b, out_dtype, scale_block)
    fp8 = scaling.is_fp8(a)
    if fp8:
        out_dtype = out_dtype or torch.bfloat16
    else:
        scaling.no_scales("matmul", scale_a, scale_b)
        if out_dtype is not None and out_dtype != getattr(a, "dtype", None):
            raise ditron.DitronError(f"matmul: out_dtype={out_dtype} applies to fp8 operands; fp16 / bf16 "
                                     "GEMMs write their operands' dtype")
    check_operands("matmul", a, b, out, (a.shape[0], b.shape[1]), out_dtype)
    M, K = a.shape
    N = b.shape[1]
    rec = scaling.recipe("matmul", M, K, N, scale_a, scale_b, a.device, scale_block) if fp8 else None
    if fp8 and core is None and config is None and rec.mode != scaling.BLOCKWISE and not is_sim_device(a.device):
        hit = _gluon_fp8_default(a, b, out, scale_a, scale_b, out_dtype, num_programs, scale_block)
        if hit is not None:
            return hit
    if isinstance(config, str):
        if config != "tune":
            raise ditron.DitronError(f"matmul: config={config!r}; give a GemmConfig, None or 'tune'")
        if fp8:
            raise ditron.DitronError("matmul: config='tune' is for fp16 / bf16 operands; give fp8 GEMMs a "
                                     "GemmConfig or None (fp8_config)")
        config = tune(M, N, K, a.dtype, a.device)
    if config is None and not fp8 and core is None:          # the table holds fp16 / bf16 measurements
        choice = table_choice(M, N, K, a.dtype, a.device)
        if choice is not None:
            core, config, _ = choice
            if core == "gluon":
                from . import gemm_hopper
                if out is None:
                    out = torch.empty((M, N), dtype=a.dtype, device=a.device)
                if gemm_hopper.supported(a.device) and tma_ok(a, b, out):
                    return gemm_hopper.matmul_hopper(a, b, out=out, config=config, num_programs_=num_programs)
                config = gemm_hopper.twin_config(config)        # same tiles on the tl core
    cfg = (config or default_config(M, N, K, a.dtype, a.device, out_dtype)).validate("matmul")
    if fp8:
        check_fp8_config("matmul", cfg, rec)
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype or a.dtype, device=a.device)
    sim = is_sim_device(a.device)
    if fp8:
        tma = cfg.tma and not sim and fp8_tma_ok(a, b, out)
        if tma:
            ensure_tma_allocator()
        sargs, sconsts = rec.kernel_args(scale_a, scale_b), rec.consts()
    else:
        tma = prepare_tma("matmul", cfg, sim, a, b, out)
        sargs, sconsts = scaling.dummy_args(a), scaling.DUMMY_CONSTS
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    if cfg.stream_k:
        if fp8:
            raise ditron.DitronError("matmul: stream_k is for fp16 / bf16 operands (the fp8 recipes' scales are "
                                     "not split over K segments); give fp8 GEMMs a config without stream_k")
        from .gemm_streamk import matmul_streamk
        return matmul_streamk(a, b, out, cfg, num_programs, tma, tiles, sim)
    P = max(1, min(tiles, int(num_programs or (4 if sim else sm_count(a.device)))))
    gemm_kernel[(P,)](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                      out.stride(1), *sargs, EVEN_K=(K % cfg.block_k == 0), TMA=tma, FLATTEN=cfg.flatten,
                      SUBTILE=cfg.epilogue_subtile if tma else 1, WARP_SPEC=cfg.warp_specialize and tma,
                      B_T=fp8 and tma, **sconsts, **cfg.launch_options())
    return out


def _gluon_fp8_default(a, b, out, scale_a, scale_b, out_dtype, num_programs, scale_block):
    """fp8 with per-tensor or per-row / per-column scales on a Hopper GPU, without a ``config`` or ``core``: the
    Gluon core (measured on an H100 at the paper's TP=8 shapes, bench/results/h100-2026-12-07-fp8-gluon/: rowwise
    0.97x ``torch._scaled_mm`` by geomean against the tl core's 0.70x, per-tensor 0.86x against 0.61x), where its
    layout holds (``b`` column-major, TMA-aligned; :func:`~ditron.kernels.gemm_hopper.fp8_plan`); else None (the
    tl core, which takes any layout).  Blockwise scales stay on the tl core until the Gluon path is measured."""
    from . import gemm_hopper as H
    if not H.supported(a.device):
        return None
    try:
        rec, cfg = H.fp8_plan("matmul", a, b, out, scale_a, scale_b, out_dtype, None, scale_block)
    except ditron.DitronError:
        return None             # a layout the Gluon core does not take: the tl core's path checks and runs it
    return H.launch_scaled(a, b, scale_a, scale_b, out_dtype, out, rec, cfg, num_programs)


def _matmul_gluon(a, b, out, config, num_programs, scale_a, scale_b, out_dtype, scale_block):
    """``matmul(..., core="gluon")``: the Gluon core where it runs, else its tl twin with the same checks."""
    from . import gemm_hopper as H
    if config is not None and not isinstance(config, H.HopperGemmConfig):
        raise ditron.DitronError(f"matmul: core='gluon' takes a HopperGemmConfig (or None), not {config!r}")
    if scaling.is_fp8(a):
        out_dtype = out_dtype or torch.bfloat16
        rec, cfg = H.fp8_plan("matmul", a, b, out, scale_a, scale_b, out_dtype, config, scale_block)
        if a.device.type == "cuda" and H.supported(a.device):
            return H.launch_scaled(a, b, scale_a, scale_b, out_dtype, out, rec, cfg, num_programs)
        return matmul(a, b, out=out, config=H.twin_config(cfg), num_programs=num_programs, scale_a=scale_a,
                      scale_b=scale_b, out_dtype=out_dtype, scale_block=scale_block, core="tl")
    scaling.no_scales("matmul", scale_a, scale_b)
    cfg = (config or H.DEFAULT_CONFIG).validate("matmul")
    if out is None and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    if (isinstance(a, torch.Tensor) and a.device.type == "cuda" and H.supported(a.device)
            and tma_ok(a, b, out)):
        return H.matmul_hopper(a, b, out=out, config=cfg, num_programs_=num_programs)
    return matmul(a, b, out=out, config=H.twin_config(cfg), num_programs=num_programs, out_dtype=out_dtype,
                  core="tl")


def scale_plan(op, a, b, M, K, N, scale_a, scale_b, scale_block):
    """For the overlap ops: ``(recipe, scale kernel arguments, scale constexprs)`` of a call
    (``recipe`` None and placeholders for fp16 / bf16 operands; kernels/scaling.py)."""
    if not scaling.is_fp8(a):
        scaling.no_scales(op, scale_a, scale_b)
        return None, scaling.dummy_args(a), scaling.DUMMY_CONSTS
    rec = scaling.recipe(op, M, K, N, scale_a, scale_b, a.device, scale_block)
    return rec, rec.kernel_args(scale_a, scale_b), rec.consts()


def scale_key(rec, scale_a, scale_b):
    """What a launch key needs of the scales: the recipe (strides, groups) and the tensors' 16-byte alignment."""
    if rec is None:
        return (None,)
    return (rec, scale_a.data_ptr() % 16 == 0, scale_b.data_ptr() % 16 == 0)


def scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, out=None, config=None, num_programs=None,
              scale_block=(128, 128)):
    """``torch._scaled_mm``'s call on the zoo's fp8 core: ``(a * scale_a) @ (b * scale_b)`` in
    ``out_dtype`` (:func:`matmul` with fp8 operands; kernels/scaling.py for the recipes)."""
    return matmul(a, b, out=out, config=config, num_programs=num_programs, scale_a=scale_a, scale_b=scale_b,
                  out_dtype=out_dtype, scale_block=scale_block)


def check_fp8_config(op, cfg, rec):
    """fp8 constraints of a config: ``block_k <= 128`` (one promotion to fp32 per K step, what the
    simulator models: ditron/sim/numerics.py) and, blockwise, ``block_k`` dividing the scale group."""
    E = ditron.DitronError
    if cfg.block_k > 128:
        raise E(f"{op}: fp8 operands need block_k <= 128 (got {cfg.block_k}): the fp8 products of one K step "
                "are summed in the tensor core's narrower accumulator before the fp32 promotion")
    if rec is not None and rec.mode == scaling.BLOCKWISE and rec.gk % cfg.block_k:
        raise E(f"{op}: blockwise scales with groups of {rec.gk} along K need block_k dividing {rec.gk} "
                f"(got block_k={cfg.block_k})")
