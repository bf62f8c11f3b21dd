"""Arithmetic of the simulator as a GPU computes it.

Triton's interpreter (3.6 and 3.9) stores bf16 as raw ``uint16`` and fp8 as
raw ``uint8`` and, outside conversions and ``tl.dot``, computes on that
storage: ``x + x`` on bf16 ``[1, -2]`` gives ``[1.7e38, -0]``.  Its fp32 ->
fp8 conversion truncates the exponent (``500 -> 256``), and functions of
``tl.extra.cuda.libdevice`` have no implementation.  This module patches the
interpreter's builder, once per process:

* bf16 element-wise arithmetic (``+ - * /``, ``%``, min/max, comparisons,
  clamp, ``tl.fma``, negation, the ``sum``/``max``/``min`` reductions) is
  computed in fp32 (fp64 for ``fma``, which a GPU rounds once) and rounded to
  nearest even to bf16, as GPUs do (sm_90 ``add.rn.bf16``/``fma.rn.bf16``, or
  fp32 and ``cvt.rn.bf16.f32``: for one operation both give the same bits).
  Reductions add in a pairwise tree, rounding to bf16 after every addition
  as a GPU's reduction tree does (its order depends on the layout, so sums of
  many values agree up to order).
* fp32/fp16/bf16 -> fp8e4nv (e4m3fn) and fp8e5 (e5m2) round to nearest even
  and saturate as Triton's sm_90 lowering (``cvt.rn.satfinite.*``): values
  beyond the largest finite number (infinities too) become it, NaN stays NaN.
  fp8 -> wider types, and fp8 operands of ``tl.dot``, are exact (torch's float8 tables).  An fp8 ``tl.dot``
  sums its exact products in fp32 (sm_90's tensor core keeps 13 fraction bits per chain: a GPU result may
  differ by up to about 2^-13 of the sum of the products' magnitudes, not modelled); one whose sm_90
  tensor-core accumulation chain is longer than 128 products (``max_num_imprecise_acc``, sm_90's default
  being the whole K loop) is refused (:func:`check_fp8_accumulation`).
* ``libdevice`` functions (``tl.extra.cuda.libdevice``, the generic
  ``tl.extra.libdevice``, ``tl.extra.hip.libdevice``) compute as a GPU does
  (:mod:`ditron.sim.libdevice`); ``rcp64h`` is refused with an error naming it.
* fp32 / fp64 ``tl.fma`` rounds once (Triton 3.6's interpreter rounds twice).
"""
from __future__ import annotations


import numpy as np
import triton.language as tl

from .. import _compat
from ..errors import DitronError

_INSTALLED = False


# ---------------------------------------------------------------------------
# bf16
# ---------------------------------------------------------------------------

def _is_bf16(h):
    return getattr(h, "dtype", None) is not None and h.dtype.scalar == tl.bfloat16


def f64_to_bf16_bits(x):
    """float64 -> bf16 bits, rounded once to nearest even (through fp32
    rounded to odd, which then rounds to bf16 without double rounding)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        inexact = np.isfinite(x) & (f.astype(np.float64) != x)
        # truncate toward zero, then set the last bit (round to odd)
        too_big = inexact & (np.abs(f.astype(np.float64)) > np.abs(x))
        f = np.where(too_big, np.nextafter(f, np.float32(0)), f)
        bits = f.view(np.uint32) | np.where(inexact, np.uint32(1), np.uint32(0))
    return _compat.f32_to_bf16_bits(bits.view(np.float32))


def _f32(h):
    return _compat.bf16_bits_to_f32(h.data) if _is_bf16(h) else h.data


_FLOAT_BINARY = {np.add, np.subtract, np.multiply, np.divide, np.fmod, np.minimum, np.maximum, np.fmin, np.fmax,
                 np.less, np.greater, np.less_equal, np.greater_equal, np.equal, np.not_equal, np.true_divide}


def _install_bf16(IB, TensorHandle):
    orig_binary, orig_ternary, orig_unary, orig_fma = IB.binary_op, IB.ternary_op, IB.unary_op, IB.create_fma
    try:        # Triton >= 3.7 rounds fp32 / fp64 fma once itself (C++ helpers)
        from triton._C.libtriton import interpreter as _native
        exact_fma = hasattr(_native, "fma_fp32") and hasattr(_native, "fma_fp64")
    except ImportError:
        exact_fma = False

    def binary_op(self, lhs, rhs, op, _orig=orig_binary):
        if (_is_bf16(lhs) or _is_bf16(rhs)) and op in _FLOAT_BINARY:
            with np.errstate(all="ignore"):
                out = op(_f32(lhs), _f32(rhs))
            if out.dtype == np.bool_:
                return TensorHandle(out, tl.int1)
            return TensorHandle(_compat.f32_to_bf16_bits(out.astype(np.float32)), tl.bfloat16)
        return _orig(self, lhs, rhs, op)

    def ternary_op(self, lhs, rhs, other, op, _orig=orig_ternary):
        if op is np.clip and _is_bf16(lhs):
            out = np.clip(_f32(lhs), _f32(rhs), _f32(other))
            return TensorHandle(_compat.f32_to_bf16_bits(out), tl.bfloat16)
        return _orig(self, lhs, rhs, other, op)

    def unary_op(self, arg, op, _orig=orig_unary):
        if _is_bf16(arg):
            with np.errstate(all="ignore"):
                out = op(_f32(arg))
            if out.dtype == np.bool_:
                return TensorHandle(out, tl.int1)
            return TensorHandle(_compat.f32_to_bf16_bits(np.asarray(out, dtype=np.float32)), tl.bfloat16)
        return _orig(self, arg, op)

    def create_fma(self, x, y, z, _orig=orig_fma):
        if _is_bf16(z):
            wide = [np.asarray(_f32(h), dtype=np.float64) for h in (x, y, z)]
            return TensorHandle(f64_to_bf16_bits(wide[0] * wide[1] + wide[2]), tl.bfloat16)
        dt = np.asarray(z.data).dtype
        if not exact_fma and dt in (np.float32, np.float64):
            # Triton 3.6's interpreter computes x * y + z with two roundings; a GPU's fma.rn rounds once
            a, b, c = np.broadcast_arrays(x.data, y.data, z.data)
            out = fma_f32(a, b, c) if dt == np.float32 else _libdevice().fma_exact(a, b, c)
            return TensorHandle(out, z.dtype.scalar)
        return _orig(self, x, y, z)

    IB.binary_op, IB.ternary_op, IB.unary_op, IB.create_fma = binary_op, ternary_op, unary_op, create_fma
    if not hasattr(IB, "get_bf16"):       # a bf16 constant (``x_bf16 * 2.5``): rounded to nearest even
        IB.get_bf16 = lambda self, value: TensorHandle(
            _compat.f32_to_bf16_bits(np.array([value], dtype=np.float32)), tl.bfloat16)
    if hasattr(IB, "create_fneg"):
        orig_neg = IB.create_fneg

        def create_fneg(self, arg, _orig=orig_neg):
            if _is_bf16(arg):
                return TensorHandle(arg.data ^ np.uint16(0x8000), tl.bfloat16)
            return _orig(self, arg)
        IB.create_fneg = create_fneg


def _tree_sum_bf16(f32, axis, keepdims):
    """Pairwise sum along ``axis`` rounding to bf16 after every addition."""
    a = np.moveaxis(np.asarray(f32, dtype=np.float32), axis, -1)
    while a.shape[-1] > 1:
        n = a.shape[-1]
        half = n // 2
        s = a[..., :half] + a[..., half:2 * half]
        s = _compat.bf16_bits_to_f32(_compat.f32_to_bf16_bits(s))
        a = np.concatenate([s, a[..., 2 * half:]], axis=-1) if n % 2 else s
    out = a[..., 0] if a.shape[-1] else np.zeros(a.shape[:-1], dtype=np.float32)
    if keepdims:
        out = np.expand_dims(out, axis)
    return out


def _bf16_like(out):
    """fp32 result(s) of a reduction -> bf16 bits of the same shape (a NumPy scalar for a 0-d result, as the
    interpreter's own reductions give)."""
    bits = _compat.f32_to_bf16_bits(np.asarray(out, dtype=np.float32)).reshape(np.shape(out))
    return bits[()] if bits.ndim == 0 else bits


def _install_bf16_reductions(interp):
    RO = interp.ReduceOps
    orig_sum, orig_min_max = RO.sum, RO.min_max

    def bits(t):
        return _compat.bf16_bits_to_f32(t.handle.data)

    def reduce_sum(self, input, _orig=orig_sum):
        if input.dtype.scalar != tl.bfloat16:
            return _orig(self, input)
        data = bits(input)
        axis = self.axis
        if axis is None:
            data, axis = data.reshape(-1), 0
        out = _tree_sum_bf16(data, axis, self.keep_dims)
        return self.to_tensor(_bf16_like(out), input.dtype)

    def min_max(self, input, val_reduce_op, idx_reduce_op=None, _orig=orig_min_max):
        x = input[0] if isinstance(input, tuple) else input
        if x.dtype.scalar != tl.bfloat16:
            return _orig(self, input, val_reduce_op, idx_reduce_op)
        f = bits(x)
        val = idx = None
        if val_reduce_op:
            val = self.to_tensor(_bf16_like(val_reduce_op(f, axis=self.axis, keepdims=self.keep_dims)), x.dtype)
        if idx_reduce_op:
            idx = self.to_tensor(idx_reduce_op(f, axis=self.axis, keepdims=self.keep_dims), tl.int32)
        if val is not None and idx is not None:
            return val, idx
        return val if val is not None else idx

    RO.sum, RO.min_max = reduce_sum, min_max


# ---------------------------------------------------------------------------
# fp8
# ---------------------------------------------------------------------------

_FP8 = {}


def _fp8_table(tt):
    """(values of all 256 codes as float32, sorted finite non-negative values, their codes, max finite)."""
    key = str(tt)
    if key not in _FP8:
        import torch
        tdt = {"fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2}[key]
        vals = torch.arange(256, dtype=torch.uint8).view(tdt).float().numpy()
        pos = np.arange(128)
        finite = np.isfinite(vals[pos])
        codes = pos[finite]
        _FP8[key] = (vals, vals[codes].astype(np.float64), codes.astype(np.uint8), float(vals[codes].max()))
    return _FP8[key]


def f32_to_fp8_bits(x, tt):
    """fp32 values -> fp8 codes as sm_90's ``cvt.rn.satfinite``: round to
    nearest even, saturate to the largest finite value (infinities too),
    NaN -> 0x7F."""
    _, fin, codes, _ = _fp8_table(tt)
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    hi = np.clip(np.searchsorted(fin, a, side="left"), 0, len(fin) - 1)
    lo = np.clip(hi - 1, 0, len(fin) - 1)
    dlo, dhi = a - fin[lo], fin[hi] - a
    take_hi = (dhi < dlo) | ((dhi == dlo) & (codes[hi] % 2 == 0))
    idx = np.where(a <= fin[0], 0, np.where(a >= fin[-1], len(fin) - 1, np.where(take_hi, hi, lo)))
    out = codes[idx] | np.where(np.signbit(x), np.uint8(0x80), np.uint8(0))
    return np.where(np.isnan(x), np.uint8(0x7F), out).astype(np.uint8)


def _is_fp8(t):
    return str(t) in ("fp8e4nv", "fp8e5")


def _install_fp8(IB, TensorHandle, interp):
    from triton._C.libtriton import ir
    orig_fp_to_fp, orig_cast = IB.create_fp_to_fp, IB.cast_impl

    def to_f32(h):
        s = h.dtype.scalar
        if _is_fp8(s):
            return _fp8_table(s)[0][h.data]
        if s == tl.bfloat16:
            return _compat.bf16_bits_to_f32(h.data)
        return h.data.astype(np.float32)

    def create_fp_to_fp(self, src, dst_type, rounding_mode, _orig=orig_fp_to_fp):
        s, d = src.dtype.scalar, dst_type.scalar
        if _is_fp8(d) and not _is_fp8(s) and rounding_mode in (None, ir.ROUNDING_MODE.RTNE):
            return TensorHandle(f32_to_fp8_bits(to_f32(src), d), d)
        if _is_fp8(s) and d in (tl.float32, tl.float16, tl.bfloat16, tl.float64):
            f = to_f32(src)
            if d == tl.bfloat16:
                return TensorHandle(_compat.f32_to_bf16_bits(f), d)
            return TensorHandle(f.astype(interp._get_np_dtype(d)), d)
        return _orig(self, src, dst_type, rounding_mode)

    def cast_impl(self, src, dst_type, _orig=orig_cast):
        s, d = src.dtype.scalar, dst_type.scalar
        if _is_fp8(s) and not _is_fp8(d):      # fp8 -> int: through fp32, exactly
            return TensorHandle(to_f32(src).astype(interp._get_np_dtype(d)), d)
        return _orig(self, src, dst_type)

    IB.create_fp_to_fp, IB.cast_impl = create_fp_to_fp, cast_impl
    orig_dot = IB.create_dot

    def create_dot(self, a, b, d, *args, _orig=orig_dot):
        # fp8 operands: exact fp32 values (the interpreter multiplies raw codes (3.6) or goes through its fp16
        # conversion (3.9), which maps e4m3fn's NaN to a number)
        if _is_fp8(a.dtype.scalar) or _is_fp8(b.dtype.scalar):
            if _is_fp8(a.dtype.scalar) and _is_fp8(b.dtype.scalar):
                imprecise = args[1] if len(args) > 1 else None
                check_fp8_accumulation(a.data.shape[-1], imprecise, d.data)
            a = TensorHandle(to_f32(a), tl.float32) if _is_fp8(a.dtype.scalar) else a
            b = TensorHandle(to_f32(b), tl.float32) if _is_fp8(b.dtype.scalar) else b
        return _orig(self, a, b, d, *args)

    IB.create_dot = create_dot
    # ``max_num_imprecise_acc`` left out of ``tl.dot`` is the backend's default: sm_90's (2**30: the whole K
    # in the tensor core's accumulator), not the interpreter's 0 (which would read as "promote every step")
    orig_init = IB.__init__

    def __init__(self, *a, _orig=orig_init, **kw):
        _orig(self, *a, **kw)
        _sm90_fp8_default(self)

    IB.__init__ = __init__
    _sm90_fp8_default(getattr(interp, "interpreter_builder", None))


#: sm_90's ``max_num_imprecise_acc_default`` (triton/backends/nvidia/compiler.py): fp8 dots accumulate the whole
#: K in the tensor core unless ``tl.dot(..., max_num_imprecise_acc=n)`` asks for a promotion every ``n`` products
SM90_IMPRECISE_DEFAULT = 2 ** 30
#: the longest run of fp8 products the simulator lets the tensor core accumulate before an fp32 promotion
FP8_MAX_IMPRECISE = 128


def _sm90_fp8_default(builder):
    import dataclasses
    opts = getattr(builder, "options", None)
    if opts is not None and getattr(opts, "max_num_imprecise_acc_default", None) == 0:
        builder.options = dataclasses.replace(opts, max_num_imprecise_acc_default=SM90_IMPRECISE_DEFAULT)


def check_fp8_accumulation(k, imprecise, acc):
    """Refuse an fp8 x fp8 ``tl.dot`` whose GPU result the simulator cannot reproduce.

    The simulator multiplies fp8 operands exactly and sums in fp32.  sm_90's fp8 ``wgmma`` sums in the
    tensor core with a narrower accumulator (products aligned to the largest addend, 13 fraction bits kept;
    DeepSeek-V3 measured 2% relative error at K = 4096 without promotion); Triton promotes that partial sum
    into a true fp32 add every ``max_num_imprecise_acc`` products only when ``max_num_imprecise_acc <= K`` of
    the dot (else the incoming accumulator itself is the tensor core's and the chain never ends).  Up to
    :data:`FP8_MAX_IMPRECISE` products per chain the GPU's result is within about ``2^-13 * sum_k |a_k b_k|``
    of the simulator's (an H100 gave at most 1.2 times that, 2026-12-07e: not fp32 rounding, which GPU tests
    must allow for -- tests/bodies_fp8.py ``GPU_FP8_ACCUMULATION``); a longer chain -- or an unpromoted dot
    that continues a non-zero accumulator across a K loop -- drifts with the sum's magnitude and is refused."""
    if imprecise is None or imprecise == 0:
        return                              # promoted after every instruction
    if imprecise <= k:
        if imprecise <= FP8_MAX_IMPRECISE:
            return
        chain = f"{imprecise} products"
    else:                                   # no promotion: the chain runs through the incoming accumulator
        if k <= FP8_MAX_IMPRECISE and not np.any(np.asarray(acc)):
            return
        chain = (f"the whole K loop (max_num_imprecise_acc={imprecise} > K={k} of this dot: the accumulator "
                 "passed in stays in the tensor core)")
    raise DitronError(
        "the simulator cannot model this fp8 tl.dot: on sm_90 the tensor core accumulates " + chain + " in its "
        "reduced-precision accumulator (about 14 bits kept), which the simulator's exact fp32 sum would hide; "
        f"pass tl.dot(a, b, acc, max_num_imprecise_acc=n) with n <= min(K of the dot, {FP8_MAX_IMPRECISE}) so that "
        "the partial sums are promoted to fp32 (what torch._scaled_mm's use_fast_accum=False does)")


# ---------------------------------------------------------------------------
# libdevice
# ---------------------------------------------------------------------------

def _libdevice():
    from . import libdevice
    return libdevice


def fma_f32(a, b, c):
    """fp32 ``a * b + c`` rounded once to nearest even: the product is exact in fp64, the fp64 sum's error is
    exact (TwoSum), and it decides the one case where rounding the fp64 sum to fp32 rounds twice (a tie)."""
    a64, b64, c64 = (np.asarray(v, np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = a64 * b64
        s = p + c64
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)
        f = s.astype(np.float32)
        other = np.nextafter(f, np.where(f.astype(np.float64) < s, np.float32(np.inf), np.float32(-np.inf)))
        mid = (f.astype(np.float64) + other.astype(np.float64)) / 2
        tie = np.isfinite(s) & (mid == s) & (e != 0)
        up = np.maximum(f, other)
        down = np.minimum(f, other)
    return np.where(tie, np.where(e > 0, up, down), f).astype(np.float32)


def libdevice_function(symbol):
    """(name, implementation) for a libdevice / OCML symbol, or (name, None) (see :mod:`ditron.sim.libdevice`)."""
    from . import libdevice
    return libdevice.implementation(symbol)


def _install_libdevice(IB, TensorHandle, interp):
    def create_extern_elementwise(self, libName, libPath, symbol, argList, retType, isPure):
        name, fn = libdevice_function(symbol)
        if fn is None:
            raise DitronError(f"the simulator has no implementation of the libdevice function {symbol!r} "
                              f"({libName or 'libdevice'}): its GPU result is the hardware's approximation; "
                              f"compute it from triton.language functions instead")
        ret = retType
        scalar = ret.element_ty if hasattr(ret, "element_ty") and hasattr(ret, "shape") else ret
        args = []
        for h in argList:
            s = h.dtype.scalar
            if s == tl.bfloat16:
                args.append(_compat.bf16_bits_to_f32(h.data))
            else:
                args.append(h.data)
        npd = interp._get_np_dtype(scalar)
        work = np.dtype(np.float32) if scalar == tl.bfloat16 else np.dtype(npd)
        with np.errstate(all="ignore"):
            out = np.asarray(fn(args, work))
        if scalar == tl.bfloat16:
            data = _compat.f32_to_bf16_bits(out.astype(np.float32))
        else:
            data = out.astype(npd)          # an int result wraps as two's complement (uint32 declared int32)
        return TensorHandle(data, scalar)

    IB.create_extern_elementwise = create_extern_elementwise


def _ir_type_to_tl(builder, t):
    return t


LIBDEVICE_MODULES = ("triton.language.extra.cuda.libdevice", "triton.language.extra.libdevice",
                     "triton.language.extra.hip.libdevice", "triton.language.math")


def install():
    """Patch Triton's interpreter builder (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from triton.runtime import interpreter as interp
    IB, TensorHandle = interp.InterpreterBuilder, interp.TensorHandle
    _install_bf16(IB, TensorHandle)
    _install_bf16_reductions(interp)
    _install_fp8(IB, TensorHandle, interp)
    _install_libdevice(IB, TensorHandle, interp)
    _compat.install_libdevice_for_triton_launches()     # plain @triton.jit kernels launched by Triton too
    _INSTALLED = True
