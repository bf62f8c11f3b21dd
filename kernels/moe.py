"""The zoo's grouped GEMM for mixture-of-experts layers: one launch computes
``out[rows of expert e] = a[rows of expert e] @ w[e]`` for every expert.

    from ditron.kernels.moe import grouped_gemm
    out = grouped_gemm(a, w, counts)          # a: [M, K] sorted by expert, w: [E, K, N], counts: int [E]
    out = grouped_gemm(a, w, counts, gather_idx=idx)   # row i of the problem is a[idx[i]]

``counts[e]`` rows belong to expert ``e``, in order: rows ``[off[e], off[e] +
counts[e])`` with ``off`` the exclusive prefix sum of ``counts``.  Any count
is allowed, zero included, and none is read back to the host: the counts live
on the device (what EP dispatch produces) and the kernel derives each tile's
expert from them.  Rows past ``sum(counts)`` are not written; counts that run
past ``M`` are cut at ``M`` (negative counts count as 0).  ``gather_idx``
(int32/int64 ``[M]``) reads problem row ``i`` from ``a[gather_idx[i]]``: the
permutation that groups tokens by expert is fused into the A loads (no
permuted copy of the tokens).  float16 / bfloat16, fp32 accumulation.

Tiles
-----
An expert's rows are cut into ``BLOCK_M`` tiles of their own (a tile never
mixes two experts), so there are at most ``cdiv(M, BLOCK_M) + E`` M tiles:
the kernel walks this *virtual* M range (:func:`expert_tile` maps virtual
tile ``j`` to its expert and first row from the counts -- a prefix sum over
``E`` counts, no host sync) and skips the virtual tiles past the last
expert's.  Programs are persistent; the tile order is ``dl.swizzle_2d`` over
(virtual M tiles, N tiles).  The same helpers serve the TP MoE kernels
(kernels/moe_tp.py), whose virtual tiles are per (rank segment, expert).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import sm_count
from ._common import cdiv, next_pow2
from .all_to_all import _add, _pick     # core builtins only (tl.reduce with our own combine)
from . import scaling
from .gemm import (_GEMM_DTYPES, GemmConfig, check_fp8_config, default_config, gemm_tile, is_sim_device, prepare_tma,
                   scaled_gemm_tile, store_tile)


@triton.jit
def expert_tile(j, counts_ptr, E, row_base, row_limit, BLOCK_M: tl.constexpr, EP: tl.constexpr):
    """Virtual M tile ``j`` of a problem whose rows (from ``row_base``) are
    grouped by expert with ``counts_ptr[0:E]`` rows each.  Returns ``(e, rows,
    row_ok, rows_c)``: the tile's expert (``E`` when ``j`` is past the last
    tile), its row indices, which of them exist (``< row_limit`` and inside
    the expert) and the rows clamped to an existing one (for unmasked loads;
    meaningful only when some row exists)."""
    eidx = tl.arange(0, EP)
    emask = eidx < E
    cnt = tl.maximum(tl.load(counts_ptr + eidx, mask=emask, other=0).to(tl.int64), 0)
    tiles = (cnt + BLOCK_M - 1) // BLOCK_M
    tend = tl.associative_scan(tiles, 0, _add)
    rstart = tl.associative_scan(cnt, 0, _add) - cnt
    e = tl.reduce(tl.where((tend <= j) & emask, 1, 0), 0, _add)
    first = row_base + _pick(rstart, eidx, e) + (j - (_pick(tend, eidx, e) - _pick(tiles, eidx, e))) * BLOCK_M
    end = tl.minimum(row_base + _pick(rstart, eidx, e) + _pick(cnt, eidx, e), row_limit)
    rows = first + tl.arange(0, BLOCK_M)
    row_ok = (rows < end) & (e < E)
    rows_c = tl.maximum(tl.minimum(rows, end - 1), 0)
    return e, rows, row_ok, rows_c


@triton.jit
def expert_tile_acc(a_ptr, idx_ptr, w_ptr, e, rows_c, pid_n, N, K, stride_am, stride_ak, stride_we, stride_wk,
                    stride_wn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, GATHER: tl.constexpr):
    """``(cols, col_ok, acc)``: the fp32 tile ``a[rows] @ w[e][:, cols]``
    (rows through ``idx_ptr`` with ``GATHER``), by kernels/gemm.py's
    :func:`gemm_tile`."""
    if GATHER:
        src = tl.load(idx_ptr + rows_c).to(tl.int64)
    else:
        src = rows_c.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    a_rows = a_ptr + src * stride_am
    b_cols = w_ptr + e.to(tl.int64) * stride_we + cols.to(tl.int64) * stride_wn
    acc = gemm_tile(a_rows, b_cols, col_ok, stride_ak, stride_wk, K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    return cols, col_ok, acc


@triton.jit
def expert_tile_acc_fp8(a_ptr, idx_ptr, w_ptr, e, rows_c, pid_n, N, K, stride_am, stride_ak, stride_we, stride_wk,
                        stride_wn, sa_ptr, sw_ptr, stride_sam, stride_sak, stride_swe, stride_swk, stride_swn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                        GATHER: tl.constexpr, GK: tl.constexpr, GN: tl.constexpr):
    """:func:`expert_tile_acc` for fp8 operands with blockwise scales: ``sa`` per (row of ``a``, K group;
    gathered with the row), ``sw`` per (expert, K group, N group) (kernels/scaling.py)."""
    if GATHER:
        src = tl.load(idx_ptr + rows_c).to(tl.int64)
    else:
        src = rows_c.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    a_rows = a_ptr + src * stride_am
    b_cols = w_ptr + e.to(tl.int64) * stride_we + cols.to(tl.int64) * stride_wn
    sa_rows = sa_ptr + src * stride_sam
    sb_cols = sw_ptr + e.to(tl.int64) * stride_swe + (tl.minimum(cols, N - 1) // GN).to(tl.int64) * stride_swn
    acc = scaled_gemm_tile(a_rows, b_cols, col_ok, stride_ak, stride_wk, K, sa_rows, sb_cols, stride_sak, stride_swk,
                           BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, 2, GK)
    return cols, col_ok, acc


@triton.jit
def expert_tile_acc_tma(a_desc, w_desc, e, first, pid_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """The fp32 tile ``a[first:first + BLOCK_M] @ w[e][:, pid_n * BLOCK_N:]``
    through TMA descriptors of ``a [M, K]`` and ``w [E, K, N]``.  Rows past the
    expert's belong to the next expert (or are zero-filled past ``M``): the
    caller's masked store drops them; K and N tails are zero-filled."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([first, ki * BLOCK_K])
        b = w_desc.load([e, ki * BLOCK_K, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def weight_descriptor(w_ptr, E, K, N, stride_we, stride_wk, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """TMA descriptor of the experts' weights ``w [E, K, N]`` (unit N stride)."""
    return tl.make_tensor_descriptor(w_ptr, shape=[E, K, N], strides=[stride_we, stride_wk, 1],
                                     block_shape=[1, BLOCK_K, BLOCK_N])


@triton.jit
def rows_tile_acc_tma_b(a_rows, w_desc, e, pid_n, K, stride_ak, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The fp32 tile ``a[rows] @ w[e][:, pid_n * BLOCK_N:]`` with A rows
    through pointers (``a_rows``: ``[BLOCK_M]`` row pointers, all valid -- a
    gather by expert) and the weights through TMA (N and K tails zero-filled)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_rows[:, None] + ks[None, :] * stride_ak
    for ki in range(tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(ki * BLOCK_K + ks)[None, :] < K, other=0.0)
        b = w_desc.load([e, ki * BLOCK_K, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
    return acc


@ditron.jit(do_not_specialize=["M", "num_vm"])
def grouped_gemm_kernel(a_ptr, w_ptr, c_ptr, counts_ptr, idx_ptr, M, N, K, E, num_vm, stride_am, stride_ak,
                        stride_we, stride_wk, stride_wn, stride_cm,
                        sa_ptr, sw_ptr, stride_sam, stride_sak, stride_swe, stride_swk, stride_swn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        EVEN_K: tl.constexpr, EP: tl.constexpr, GATHER: tl.constexpr, TMA: tl.constexpr,
                        FP8: tl.constexpr = False, GK: tl.constexpr = 128, GN: tl.constexpr = 128):
    """Persistent grouped GEMM over ``num_vm`` virtual M tiles (see the module
    docstring).  ``TMA``: the weights through a device-side tensor descriptor,
    and A too without ``GATHER`` (with it, A rows are gathered by pointers).
    ``FP8``: fp8 operands with blockwise scales ``sa`` / ``sw`` (pointer
    tiles)."""
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    if TMA:
        w_desc = weight_descriptor(w_ptr, E, K, N, stride_we, stride_wk, BLOCK_N, BLOCK_K)
        if not GATHER:
            a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                               block_shape=[BLOCK_M, BLOCK_K])
    for t in range(tl.program_id(0), num_vm * num_pid_n, tl.num_programs(0)):
        vm, pid_n = dl.swizzle_2d(t, num_vm, num_pid_n, GROUP_M)
        e, rows, row_ok, rows_c = expert_tile(vm, counts_ptr, E, 0, M, BLOCK_M, EP)
        if e < E:
            if TMA:
                if GATHER:
                    src = tl.load(idx_ptr + rows_c).to(tl.int64)
                    acc = rows_tile_acc_tma_b(a_ptr + src * stride_am, w_desc, e, pid_n, K, stride_ak, BLOCK_M,
                                              BLOCK_N, BLOCK_K, EVEN_K)
                else:
                    first = tl.reduce(rows, 0, _min).to(tl.int32)
                    acc = expert_tile_acc_tma(a_desc, w_desc, e, first, pid_n, K, BLOCK_M, BLOCK_N, BLOCK_K)
                cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
                col_ok = cols < N
            elif FP8:
                cols, col_ok, acc = expert_tile_acc_fp8(a_ptr, idx_ptr, w_ptr, e, rows_c, pid_n, N, K, stride_am,
                                                        stride_ak, stride_we, stride_wk, stride_wn, sa_ptr, sw_ptr,
                                                        stride_sam, stride_sak, stride_swe, stride_swk, stride_swn,
                                                        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, GATHER, GK, GN)
            else:
                cols, col_ok, acc = expert_tile_acc(a_ptr, idx_ptr, w_ptr, e, rows_c, pid_n, N, K, stride_am,
                                                    stride_ak, stride_we, stride_wk, stride_wn, BLOCK_M, BLOCK_N,
                                                    BLOCK_K, EVEN_K, GATHER)
            store_tile(c_ptr, stride_cm, 1, rows, row_ok, cols, col_ok, acc)


@triton.jit
def _min(a, b):
    return tl.minimum(a, b)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

#: grouped_gemm's cores: the tl core (every target, the simulator) or the Gluon Hopper core (kernels/moe_hopper.py)
CORES = ("tl", "gluon")


def expert_pow2(E: int) -> int:
    return max(2, next_pow2(int(E)))


def check_counts(op, counts, E, device):
    """A device int tensor of ``E`` counts (a list or tuple is moved there)."""
    if isinstance(counts, (list, tuple)):
        counts = torch.tensor(counts, dtype=torch.int64, device=device)
    if not isinstance(counts, torch.Tensor) or counts.dtype not in (torch.int32, torch.int64) \
            or counts.numel() != E or counts.device.type != torch.device(device).type:
        desc = f"{counts.dtype}{list(counts.shape)} on {counts.device}" if isinstance(counts, torch.Tensor) \
            else type(counts).__name__
        raise ditron.DitronError(f"{op}: argument 'counts' must be an int32/int64 tensor of {E} counts (one per "
                                 f"expert) on {device}, got {desc}")
    return counts.contiguous()


def check_experts_weight(op, a, w, argname="w", fp8_ok=False):
    E_ = ditron.DitronError
    if isinstance(a, torch.Tensor) and a.dim() == 3 and isinstance(w, torch.Tensor) and w.dim() == 3 and \
            a.shape[0] == w.shape[0]:
        raise E_(f"{op}: argument 'a' is 3-D {list(a.shape)}: a low-latency ep_dispatch's recv_x ([experts, "
                 f"capacity, K], expert e's rows first, recv_counts[e] of them) is not grouped_gemm's layout (rows "
                 f"of all experts one after another, [M, K]); compute its experts with torch.bmm(recv_x, w) "
                 f"(the padding rows are computed and ignored by ep_combine), or use a normal-mode EP context, "
                 f"whose 2-D recv_x grouped_gemm takes")
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise E_(f"{op}: argument 'a' must be a 2-D tensor [M, K]")
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        raise E_(f"{op}: argument '{argname}' must be a 3-D tensor [experts, K, N]")
    if fp8_ok and scaling.is_fp8(a):
        if not scaling.is_fp8(w):
            raise E_(f"{op}: argument 'a' is {a.dtype}, '{argname}' is {w.dtype}; fp8 GEMMs take fp8 operands for "
                     "both")
    elif a.dtype not in _GEMM_DTYPES:
        raise E_(f"{op}: argument 'a' is {a.dtype}; use float16 or bfloat16"
                 + (" or fp8 (float8_e4m3fn / float8_e5m2 with blockwise scale_a and scale_w)" if fp8_ok else ""))
    elif w.dtype != a.dtype:
        raise E_(f"{op}: argument '{argname}' is {w.dtype}, 'a' is {a.dtype}")
    if w.device != a.device:
        raise E_(f"{op}: argument '{argname}' is on {w.device}, 'a' on {a.device}")
    if w.shape[1] != a.shape[1]:
        raise E_(f"{op}: '{argname}' has K={w.shape[1]}, 'a' has K={a.shape[1]} columns")
    if w.shape[0] < 1 or w.shape[2] < 1 or a.shape[1] < 1:
        raise E_(f"{op}: empty operands (a is {list(a.shape)}, {argname} is {list(w.shape)})")


def moe_config(M, N, K, dtype, device, config=None) -> GemmConfig:
    if config is not None:
        return config.validate("moe")
    cfg = default_config(M, N, K, dtype, device)
    if dtype in scaling.FP8_DTYPES and not is_sim_device(device):
        cfg = GemmConfig(128, 128, 128, group_m=8, num_warps=8, num_stages=3)     # pointer tiles (TODO(perf): TMA)
    return cfg


def grouped_tma(cfg, a, w) -> bool:
    """TMA operands for the grouped GEMM: the config asks for it, on a GPU,
    ``a [M, K]`` and ``w [E, K, N]`` with unit last strides and 16-byte
    aligned bases and strides (else pointer tiles, which take any layout)."""
    if w.stride(2) != 1 or (w.stride(1) * w.element_size()) % 16 or (w.stride(0) * w.element_size()) % 16:
        return False
    return prepare_tma("grouped_gemm", cfg, is_sim_device(a.device), a, w)


def _fp8_scales(op, a, w, scale_a, scale_w, scale_block):
    """Blockwise scales of an fp8 grouped GEMM: ``scale_a [rows of a, cdiv(K, gk)]`` (a row's scales go with
    it through ``gather_idx``), ``scale_w [E, cdiv(K, gk), cdiv(N, gn)]`` (kernels/scaling.py)."""
    E_ = ditron.DitronError
    E, K, N = w.shape
    gk, gn = scaling.check_scale_block(op, scale_block)
    nk, nn = cdiv(K, gk), cdiv(N, gn)
    for name, s, shape in (("scale_a", scale_a, (a.shape[0], nk)), ("scale_w", scale_w, (E, nk, nn))):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.device != a.device:
            raise E_(f"{op}: fp8 operands need {name}, a float32 tensor on {a.device} (blockwise scales: "
                     f"scale_a [rows, cdiv(K, {gk})], scale_w [E, cdiv(K, {gk}), cdiv(N, {gn})])")
        if tuple(s.shape) != shape:
            raise E_(f"{op}: {name} has shape {list(s.shape)}; the blockwise recipe (scale_block=({gk}, {gn})) needs "
                     f"{list(shape)}")
    return gk, gn


def grouped_gemm(a, w, counts, out=None, gather_idx=None, config: GemmConfig | None = None, num_programs=None, *,
                 scale_a=None, scale_w=None, out_dtype=None, scale_block=(128, 128), core="tl"):
    """``out[M, N]``: the rows of expert ``e`` (``counts[e]`` of them, in
    expert order) times ``w[e]`` (see the module docstring).  ``a``: ``[rows,
    K]`` (``M = rows``, or ``gather_idx.numel()`` with ``gather_idx``), ``w``:
    ``[E, K, N]`` (any strides), ``counts``: int32/int64 ``[E]`` on the
    device.  Wrong shapes, dtypes or devices raise ``DitronError`` before
    launch.

    fp8 operands (DeepSeek-V3's blockwise recipe, kernels/scaling.py):
    ``scale_a [rows, cdiv(K, gk)]`` (per token and 1 x gk group, gathered
    with its row), ``scale_w [E, cdiv(K, gk), cdiv(N, gn)]`` (per expert and
    gk x gn block; a DeepSeek weight ``[E, N, K]`` with scales ``[E, N/128,
    K/128]`` is ``w.transpose(1, 2)``, ``scale_w.transpose(1, 2)``), result in
    ``out_dtype`` (default bfloat16).  Pointer tiles (no TMA yet).

    ``core``: ``"tl"`` (default; every target, the simulator, ``gather_idx``,
    fp8) or ``"gluon"``: the warp-specialised Hopper core
    (kernels/moe_hopper.py; ``config`` a ``HopperGemmConfig`` or None) on
    sm_90 GPUs, float16 / bfloat16, no ``gather_idx``, TMA-able ``a``, ``w``
    and ``out`` -- anything else an error before launch naming
    ``core='tl'``; on the simulator the same checks, then its ``tl`` twin
    (the same tiles and K order: ``gemm_hopper.twin_config(config)``)."""
    op = "grouped_gemm"
    if core not in CORES:
        raise ditron.DitronError(f"{op}: core={core!r}; use one of {', '.join(CORES)}")
    check_experts_weight(op, a, w, fp8_ok=True)
    fp8 = scaling.is_fp8(a)
    E, K, N = w.shape
    if fp8:
        gk, gn = _fp8_scales(op, a, w, scale_a, scale_w, scale_block)
        out_dtype = out_dtype or torch.bfloat16
        if out_dtype not in scaling.OUT_DTYPES:
            raise ditron.DitronError(f"{op}: out_dtype={out_dtype}; fp8 GEMMs write bfloat16, float16 or float32")
    else:
        scaling.no_scales(op, scale_a, scale_w)
        if out_dtype is not None and out_dtype != a.dtype:
            raise ditron.DitronError(f"{op}: out_dtype applies to fp8 operands; fp16 / bf16 write their dtype")
        out_dtype = a.dtype
    counts = check_counts(op, counts, E, a.device)
    if gather_idx is not None:
        if not isinstance(gather_idx, torch.Tensor) or gather_idx.dim() != 1 or \
                gather_idx.dtype not in (torch.int32, torch.int64) or gather_idx.device != a.device:
            raise ditron.DitronError(f"{op}: argument 'gather_idx' must be a 1-D int32/int64 tensor on {a.device}")
        gather_idx = gather_idx.contiguous()
        M = gather_idx.numel()
    else:
        M = a.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    elif not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N) or out.dtype != out_dtype or \
            out.stride(1) != 1:
        raise ditron.DitronError(f"{op}: argument 'out' must be a row-major ({M}, {N}) {out_dtype} tensor")
    if core == "gluon":
        from . import moe_hopper
        hcfg = moe_hopper.check_call(op, a, w, out, gather_idx, fp8, config)
        moe_hopper.check_device(op, a.device)
        if M == 0:
            return out
        if not is_sim_device(a.device):
            return moe_hopper.launch(a, w, counts, out, hcfg, num_programs)
        config = moe_hopper.twin(hcfg)          # the simulator: the tl twin, the same tiles and K order
    if M == 0:
        return out
    cfg = moe_config(M, N, K, a.dtype, a.device, config)
    if fp8:
        check_fp8_config(op, cfg, scaling.Recipe(scaling.BLOCKWISE, "block", (0, 0), (0, 0), gk, gn))
        sargs = (scale_a, scale_w, scale_a.stride(0), scale_a.stride(1)) + tuple(scale_w.stride())
        sconsts = dict(FP8=True, GK=gk, GN=gn)
    else:
        sargs, sconsts = (a, a, 0, 0, 0, 0, 0), {}
    num_vm = cdiv(M, cfg.block_m) + E
    tiles = num_vm * cdiv(N, cfg.block_n)
    P = int(num_programs or (4 if is_sim_device(a.device) else sm_count(a.device)))
    P = max(1, min(P, tiles))
    # with gather_idx: the weights only (A rows are gathered by pointers); fp8: pointer tiles
    tma = not fp8 and grouped_tma(cfg, a, w)
    grouped_gemm_kernel[(P,)](a, w, out, counts, gather_idx if gather_idx is not None else counts, M, N, K, E,
                              num_vm, a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
                              *sargs, EVEN_K=(K % cfg.block_k == 0), EP=expert_pow2(E), GATHER=gather_idx is not None,
                              TMA=tma, **sconsts, **cfg.launch_options())
    return out


def grouped_gemm_reference(a, w, counts, gather_idx=None):
    """torch: a per-expert loop of ``matmul`` in fp32 (the tests' and benchmarks' reference)."""
    rows = a[gather_idx.long()] if gather_idx is not None else a
    counts = [max(0, int(c)) for c in counts.tolist()]
    out = torch.zeros((rows.shape[0], w.shape[2]), dtype=torch.float32)
    off = 0
    for e, c in enumerate(counts):
        c = min(c, rows.shape[0] - off)
        if c > 0:
            out[off:off + c] = rows[off:off + c].float().cpu() @ w[e].float().cpu()
        off += max(c, 0)
    return out
