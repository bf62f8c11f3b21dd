"""fp8 scaling recipes of the zoo's GEMMs (host side): which recipe a pair of
scale tensors describes, checked before anything is launched.

The operands are fp8 (``torch.float8_e4m3fn``, or ``torch.float8_e5m2``
where the hardware allows: Hopper's fp8 ``wgmma`` takes both, in any pair),
the result is ``(a * scale_a) @ (b * scale_b)`` -- the scales *decode* the
operands, as in ``torch._scaled_mm`` -- accumulated in float32 and rounded
once to the output dtype (bfloat16, float16 or float32).  The scale tensors'
shapes determine the recipe (float32, any strides):

=============================  ==========================  ==============================
recipe                         ``scale_a`` (a: ``[M, K]``)  ``scale_b`` (b: ``[K, N]``)
=============================  ==========================  ==============================
per-tensor                     one element (``()``,         one element
                               ``[1]``, ``[1, 1]``)
per-row / per-column           ``[M, 1]``                   ``[1, N]``
(``torch._scaled_mm``'s
rowwise)
blockwise (DeepSeek-V3)        ``[M, cdiv(K, gk)]``:        ``[cdiv(K, gk), cdiv(N, gn)]``:
                               1 x gk groups of a row       gk x gn blocks of b
=============================  ==========================  ==============================

``scale_block=(gk, gn)`` (default ``(128, 128)``) sizes the blockwise groups.
Per-tensor and per-row / per-column may be mixed (a per-tensor ``scale_a``
with a per-column ``scale_b``, ...); blockwise goes with blockwise.  Where two
readings of a shape coincide (``K <= gk``: a ``[M, 1]`` scale is both
per-row and one 1 x K group) they are the same arithmetic.  For a DeepSeek
weight ``w`` ``[N, K]`` with scales ``s`` ``[cdiv(N, 128), cdiv(K, 128)]``,
pass ``b = w.t()`` and ``scale_b = s.t()`` (views, no copy).

How the kernels apply them (kernels/gemm.py): per-tensor / per-row /
per-column in the epilogue (``acc * scale_a[row] * scale_b[col]``, fp32);
blockwise per K step: each ``BLOCK_K`` slice's fp32 product is multiplied
by its group's ``scale_a[row, g] * scale_b[g, col // gn]`` and added to the
accumulator (``BLOCK_K`` divides ``gk``).
"""
from __future__ import annotations

import dataclasses

import torch

import ditron

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: ``SCALE`` constexpr of the kernels: none (fp16 / bf16 operands), epilogue (per-tensor, per-row /
#: per-column), blockwise
NONE, EPILOGUE, BLOCKWISE = 0, 1, 2


def is_fp8(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a launch needs of a pair of scale tensors: ``mode`` (:data:`EPILOGUE` / :data:`BLOCKWISE`),
    ``name`` (``"tensor"``, ``"row"``, ``"block"``, ... for messages and keys), the element strides
    ``sa = (per row, per K group)`` of ``scale_a`` and ``sb = (per K group, per column group)`` of
    ``scale_b`` (0 where the scale does not vary), and the group sizes ``gk``, ``gn`` (1 where unused)."""
    mode: int
    name: str
    sa: tuple
    sb: tuple
    gk: int = 1
    gn: int = 1

    def kernel_args(self, scale_a, scale_b):
        """The scale arguments of the kernels, in their order: ``sa_ptr, sb_ptr, stride_sam, stride_sak,
        stride_sbk, stride_sbn``."""
        return (scale_a, scale_b) + self.sa + self.sb

    def consts(self):
        return dict(SCALE=self.mode, GK=self.gk, GN=self.gn)


def _shape(t):
    return tuple(t.shape)


def check_scale_block(op, scale_block):
    E = ditron.DitronError
    try:
        gk, gn = (int(v) for v in scale_block)
    except (TypeError, ValueError):
        raise E(f"{op}: scale_block={scale_block!r} must be a pair (gk, gn) of ints") from None
    for name, v in (("gk", gk), ("gn", gn)):
        if v < 16 or v & (v - 1):
            raise E(f"{op}: scale_block {name}={v} must be a power of two >= 16")
    return gk, gn


def recipe(op, M, K, N, scale_a, scale_b, device, scale_block=(128, 128)) -> Recipe:
    """The :class:`Recipe` of ``scale_a`` / ``scale_b`` for an ``[M, K] @ [K, N]`` fp8 GEMM, or a
    ``DitronError`` naming the accepted shapes (see the module docstring)."""
    E = ditron.DitronError
    gk, gn = check_scale_block(op, scale_block)
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s is None:
            raise E(f"{op}: fp8 operands need {name} (float32; the shapes of scale_a and scale_b choose the recipe: "
                    "per-tensor, per-row / per-column or blockwise; see kernels/scaling.py)")
        if not isinstance(s, torch.Tensor):
            raise E(f"{op}: {name} must be a float32 torch.Tensor, not {type(s).__name__}")
        if s.dtype != torch.float32:
            raise E(f"{op}: {name} is {s.dtype}; scales must be float32")
        if s.device != torch.device(device):
            raise E(f"{op}: {name} is on {s.device}, the operands on {device}")
        if s.dim() > 2:
            raise E(f"{op}: {name} has {s.dim()} dimensions ({_shape(s)}); scales have at most 2")
    nk, nn = -(-K // gk), -(-N // gn)
    sa, sb = scale_a, scale_b
    sa2 = sa.reshape(1, 1) if sa.numel() == 1 and sa.dim() < 2 else sa
    sb2 = sb.reshape(1, 1) if sb.numel() == 1 and sb.dim() < 2 else sb
    block_b = sb2.dim() == 2 and _shape(sb2) == (nk, nn) and not (_shape(sb2) == (1, 1) or _shape(sb2) == (1, N))
    block_a = sa2.dim() == 2 and _shape(sa2) == (M, nk) and not (sa2.numel() == 1 or _shape(sa2) == (M, 1))
    if block_b or block_a:
        if _shape(sa2) != (M, nk) or _shape(sb2) != (nk, nn):
            raise E(f"{op}: blockwise scales (scale_block=({gk}, {gn})) need scale_a [M, cdiv(K, {gk})] = "
                    f"[{M}, {nk}] and scale_b [cdiv(K, {gk}), cdiv(N, {gn})] = [{nk}, {nn}]; got scale_a "
                    f"{list(sa.shape)} and scale_b {list(sb.shape)}")
        return Recipe(BLOCKWISE, "block", (sa2.stride(0), sa2.stride(1)), (sb2.stride(0), sb2.stride(1)), gk, gn)
    if sa2.numel() == 1:
        a_name, a_str = "tensor", (0, 0)
    elif sa2.dim() == 2 and _shape(sa2) == (M, 1):
        a_name, a_str = "row", (sa2.stride(0), 0)
    else:
        raise E(f"{op}: scale_a has shape {list(sa.shape)}; use one element (per-tensor), [M, 1] = [{M}, 1] "
                f"(per-row) or [M, cdiv(K, {gk})] = [{M}, {nk}] (blockwise 1 x {gk}, with a blockwise scale_b)")
    if sb2.numel() == 1:
        b_name, b_str = "tensor", (0, 0)
    elif sb2.dim() == 2 and _shape(sb2) == (1, N):
        b_name, b_str = "col", (0, sb2.stride(1))
    else:
        raise E(f"{op}: scale_b has shape {list(sb.shape)}; use one element (per-tensor), [1, N] = [1, {N}] "
                f"(per-column) or [cdiv(K, {gk}), cdiv(N, {gn})] = [{nk}, {nn}] (blockwise {gk} x {gn}, with a "
                "blockwise scale_a)")
    return Recipe(EPILOGUE, f"{a_name}/{b_name}", a_str, b_str)


def check_fp8_operands(op, a, b, out_dtype):
    """dtype checks of an fp8 GEMM's operands and output dtype (shapes are the caller's)."""
    E = ditron.DitronError
    if not is_fp8(b):
        raise E(f"{op}: argument 'a' is {a.dtype}, argument 'b' is "
                f"{getattr(b, 'dtype', type(b).__name__)}; fp8 GEMMs take fp8 operands "
                "(float8_e4m3fn or float8_e5m2) for both")
    if out_dtype not in OUT_DTYPES:
        raise E(f"{op}: out_dtype={out_dtype}; fp8 GEMMs write bfloat16, float16 or float32")


def no_scales(op, scale_a, scale_b):
    if scale_a is not None or scale_b is not None:
        raise ditron.DitronError(f"{op}: scale_a / scale_b apply to fp8 operands only (these are not fp8)")


def dummy_args(t):
    """Scale arguments of a launch without scales (fp16 / bf16): any pointer, strides 0."""
    return (t, t, 0, 0, 0, 0)


DUMMY_CONSTS = dict(SCALE=NONE, GK=1, GN=1)
