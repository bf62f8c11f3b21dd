"""Triton-version glue, part two: Triton's interpreter, which the simulator runs kernels on.

:mod:`ditron._compat` is the one module the rest of ditron imports Triton internals from; it re-exports the public
names here.  This part holds what only the simulator needs: the interpreter's entry points, the patches that make it
agree with a GPU (per-thread program ids, bf16 dots and round-to-nearest-even casts, per-thread SIMT checks, access
hooks, NumPy-safe indexing, libdevice), and what makes it cheaper without changing a result (the replayed per-launch
patch of ``triton.language``, whole-slice reductions).  It imports nothing from ditron (``_compat`` imports it).
Nothing here probes hardware.
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import threading

import triton
import triton.language as tl
from triton.language import core as _core

# --------------------------------------------------------------------------
# Triton's interpreter (the simulator runs kernels on it)
# --------------------------------------------------------------------------

def interpreter_enabled() -> bool:
    """``TRITON_INTERPRET=1`` (read at the time of the call, like Triton)."""
    return bool(triton.knobs.runtime.interpret)


def interpreter_runtime():
    """The interpreter's C++ helpers (raw-address load/store/atomics)."""
    from triton._C.libtriton import interpreter
    return interpreter


def interpreter_semantic():
    from triton.runtime import interpreter as _interp
    return _interp.interpreter_semantic


def interpreted_function_class():
    from triton.runtime.interpreter import InterpretedFunction
    return InterpretedFunction


_GRID_TLS = threading.local()
_GRID_PATCHED = False


def _install_thread_local_grid():
    """Make the interpreter's program id per thread.

    Triton's interpreter keeps the current program's grid index in one
    global builder and runs programs one after another; the simulator runs
    the programs of a launch concurrently (one thread each), so the index
    must be thread-local.  The grid size stays shared.
    """
    global _GRID_PATCHED
    if _GRID_PATCHED:
        return
    from triton.runtime.interpreter import InterpreterBuilder

    def _get(self):
        return getattr(_GRID_TLS, "idx", None)

    def _set(self, value):
        _GRID_TLS.idx = value

    InterpreterBuilder.grid_idx = property(_get, _set)
    _GRID_PATCHED = True


def _numpy_safe_index(self):
    # Triton 3.6's interpreter does int(<1-element 1-D array>), which NumPy
    # >= 2.4 rejects ("only 0-dimensional arrays can be converted to Python
    # scalars"); reading the single element works with every NumPy.
    return int(self.handle.data.reshape(-1)[0])


_DOT_PATCHED = False


def _install_bf16_dot():
    """Triton 3.6's interpreter multiplies the raw uint16 storage of bf16
    operands in ``tl.dot``; widen bf16 operands to fp32 first (what the GPU's
    tensor cores compute, up to accumulation order)."""
    global _DOT_PATCHED
    if _DOT_PATCHED:
        return
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder
    orig = InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc, _orig=orig):
        if a.dtype == tl.bfloat16 or b.dtype == tl.bfloat16:
            from triton.runtime.interpreter import TensorHandle

            def widen(h):
                if h.dtype != tl.bfloat16:
                    return h
                return TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
            a, b = widen(a), widen(b)
        return _orig(self, a, b, d, input_precision, max_num_imprecise_acc)

    InterpreterBuilder.create_dot = create_dot
    _DOT_PATCHED = True


def f32_to_bf16_bits(x):
    """fp32 values -> bf16 bit patterns (uint16), rounded to nearest even as
    GPUs convert (``cvt.rn.bf16.f32``); NaN stays a (quiet) NaN."""
    import numpy as np
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_bits_to_f32(raw):
    import numpy as np
    return (np.asarray(raw).astype(np.uint32) << 16).view(np.float32)


_CAST_PATCHED = False


def _install_rne_casts():
    """Triton 3.6's interpreter truncates fp32 -> bf16 (and converts bf16 to
    other types from its raw uint16 storage); GPUs round to nearest even.
    Conversions to and from bf16 go through fp32 here, rounding to nearest
    even; fp16 conversions already round to nearest even in NumPy."""
    global _CAST_PATCHED
    if _CAST_PATCHED:
        return
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle, _get_np_dtype
    orig_cast = InterpreterBuilder.cast_impl
    orig_fp_to_fp = InterpreterBuilder.create_fp_to_fp

    def to_f32(h):
        if h.dtype.scalar == tl.bfloat16:
            return bf16_bits_to_f32(h.data)
        return h.data.astype(np.float32)

    def cast_impl(self, src, dst_type, _orig=orig_cast):
        s, d = src.dtype.scalar, dst_type.scalar
        if d == tl.bfloat16 and s != tl.bfloat16:
            return TensorHandle(f32_to_bf16_bits(to_f32(src)), d)
        if s == tl.bfloat16 and d != tl.bfloat16:
            return TensorHandle(bf16_bits_to_f32(src.data).astype(_get_np_dtype(dst_type)), d)
        return _orig(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode, _orig=orig_fp_to_fp):
        from triton._C.libtriton import ir
        s, d = src.dtype.scalar, dst_type.scalar
        if d in (tl.bfloat16, tl.float16) and s in (tl.float32, tl.float64, tl.bfloat16, tl.float16) and \
                rounding_mode in (None, ir.ROUNDING_MODE.RTNE):
            return cast_impl(self, src, dst_type)
        return _orig(self, src, dst_type, rounding_mode)

    InterpreterBuilder.cast_impl = cast_impl      # create_fp_trunc / _ext / _to_si ... call it
    InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    _CAST_PATCHED = True


_SPLAT_PATCHED = False


def _install_bool_splat():
    """Triton's interpreter tags a comparison's result with its operands' type (``pid >= 0``: data bool, type
    int32), and its ``create_splat`` makes the splat's data of that type: ``mask & (dl.rank() > 0)`` -- a block
    mask with a scalar condition -- became an int32 block that ``tl.load`` / ``tl.store`` reject ("mask has
    unsupported dtype").  A splat to an int1 block of boolean data stays boolean, as on GPUs."""
    global _SPLAT_PATCHED
    if _SPLAT_PATCHED:
        return
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    orig = InterpreterBuilder.create_splat

    def create_splat(self, ret_ty, arg, _orig=orig):
        if arg.data.dtype == np.bool_ and getattr(ret_ty, "scalar", None) == tl.int1:
            fill = arg.data[0] if isinstance(arg.dtype, tl.block_type) else arg.data
            return TensorHandle(np.full(ret_ty.shape, fill, dtype=np.bool_), tl.int1)
        return _orig(self, ret_ty, arg)

    InterpreterBuilder.create_splat = create_splat
    _SPLAT_PATCHED = True


_SIMT = threading.local()


def simt_thread():
    """The simulated GPU thread running a thread-dependent region in this
    program (``ditron.sim.simt``), or None outside such a region."""
    return getattr(_SIMT, "t", None)


def set_simt_thread(t):
    _SIMT.t = t


def simt_warp_calls():
    """The warp-collective calls of the thread-dependent region running in this program (``ditron.sim.simt``
    sets a fresh dict per region: arrivals of each warp's lanes), or None outside one."""
    return getattr(_SIMT, "warp_calls", None)


def set_simt_warp_calls(calls):
    _SIMT.warp_calls = calls


def simt_lanes():
    """The lanes of the thread-dependent region this simulated thread runs in, when the region's threads run as
    cooperative lanes (``ditron.sim.simt.Lanes``: a region with a warp collective), else None."""
    return getattr(_SIMT, "lanes", None)


def set_simt_lanes(lanes):
    _SIMT.lanes = lanes


def _simt_store_check(value):
    """In a thread-dependent region: a scalar store is performed by thread 0
    only (Triton predicates scalar stores to thread 0); False = skip it."""
    t = simt_thread()
    if t is None:
        return True
    if value.data.size > 1:
        raise RuntimeError(f"tl.store of a {value.data.size}-element tile inside a branch or loop on "
                           "dl.tid()/dl.laneid(): on a GPU each thread stores only the elements its layout gives it, "
                           "which the simulator cannot know; store scalars (thread 0 stores) or use dl.st "
                           "(every thread stores)")
    return t == 0


def _simt_atomic_check():
    if simt_thread() is not None:
        raise RuntimeError("tl.atomic_* inside a branch or loop on dl.tid()/dl.laneid(): Triton performs a scalar "
                           "atomic in thread 0 and broadcasts its result through shared memory behind a barrier, "
                           "which a thread-dependent branch breaks; use dl.atomic_add / dl.atomic_cas (every "
                           "thread that reaches them performs them)")


class _AccessHooks:
    """Callbacks of the simulator on the interpreter's memory operations.

    ``load(ptrs, mask, data, volatile)`` after a load (may return replacement
    data), ``store(ptrs, mask, data)`` before a store, ``atomic(phase, ptrs,
    mask, sem, scope)`` before (``"pre"``) and after (``"post"``) an atomic.
    Volatile loads always reach ``load``; plain loads, stores and atomics only
    while ``plain`` is set (the race finder), so the default simulator pays
    one attribute test per access."""
    load = store = atomic = None
    plain = False


ACCESS_HOOKS = _AccessHooks()
_ACCESS_PATCHED = False


def _install_access_hooks():
    global _ACCESS_PATCHED
    if _ACCESS_PATCHED:
        return
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    H = ACCESS_HOOKS
    orig_load, orig_store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store
    orig_rmw, orig_cas = InterpreterBuilder.create_atomic_rmw, InterpreterBuilder.create_atomic_cas

    # the cache arguments differ by version (3.6: cache_modifier, eviction_policy; 3.9: cache_policy) and
    # callers pass them by position or by keyword (tensor descriptors: cache_policy=..., is_volatile=...), so
    # they pass through untouched; is_volatile is the last parameter in both
    def as_handle(mask):
        # Triton 3.6's tensor descriptors pass the mask as a bare NumPy array
        if isinstance(mask, np.ndarray):
            return TensorHandle(mask.astype(bool), tl.int1)
        return mask

    def create_masked_load(self, ptrs, mask, other, *cache_and_volatile, **kw):
        mask = as_handle(mask)
        ret = orig_load(self, ptrs, mask, other, *cache_and_volatile, **kw)
        if "is_volatile" in kw:
            is_volatile = bool(kw["is_volatile"])
        else:
            is_volatile = bool(cache_and_volatile[-1]) if cache_and_volatile else False
        if H.load is not None and (is_volatile or H.plain):
            data = H.load(ptrs.data, mask.data, ret.data, is_volatile)
            if data is not None:
                ret = TensorHandle(data, ret.dtype)
        return ret

    def create_masked_store(self, ptrs, value, mask, *cache, **kw):
        mask = as_handle(mask)
        if mask is not None and mask.data.dtype != bool:
            # Triton 3.9's native store takes only bool masks (3.6's accepted an i1 tile held as integers)
            mask = TensorHandle(mask.data.astype(bool), mask.dtype)
        if _SIMT.__dict__.get("t") is not None and not _simt_store_check(value):
            return None
        if H.plain and H.store is not None:
            H.store(ptrs.data, mask.data, value.data)
        return orig_store(self, ptrs, value, mask, *cache, **kw)

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        _simt_atomic_check()
        if not (H.plain and H.atomic is not None):
            return orig_rmw(self, rmwOp, ptr, val, mask, sem, scope)
        H.atomic("pre", ptr.data, mask.data, str(sem), str(scope))
        ret = orig_rmw(self, rmwOp, ptr, val, mask, sem, scope)
        H.atomic("post", ptr.data, mask.data, str(sem), str(scope))
        return ret

    def create_atomic_cas(self, ptr, cmp, val, sem, scope):
        _simt_atomic_check()
        if not (H.plain and H.atomic is not None):
            return orig_cas(self, ptr, cmp, val, sem, scope)
        H.atomic("pre", ptr.data, None, str(sem), str(scope))
        ret = orig_cas(self, ptr, cmp, val, sem, scope)
        H.atomic("post", ptr.data, None, str(sem), str(scope))
        return ret

    InterpreterBuilder.create_masked_load = create_masked_load       # create_load calls it
    InterpreterBuilder.create_masked_store = create_masked_store     # create_store calls it
    InterpreterBuilder.create_atomic_rmw = create_atomic_rmw
    InterpreterBuilder.create_atomic_cas = create_atomic_cas
    _ACCESS_PATCHED = True


_SAFE_INDEX_INSTALLED = False


def _install_numpy_safe_index():
    """Every time Triton's interpreter patches ``triton.language`` -- at each
    launch and at every call of a ``@triton.jit`` helper from a kernel --
    install the NumPy-safe ``tensor.__index__`` instead of Triton 3.6's
    ``int(<1-element array>)``, never the broken one even for a moment (the
    simulator's programs are threads: one may be in ``range()`` while another
    calls a helper)."""
    global _SAFE_INDEX_INSTALLED
    if _SAFE_INDEX_INSTALLED:
        return
    from triton.runtime import interpreter as _interp
    scope_cls = getattr(_interp, "_LangPatchScope", None)
    if scope_cls is not None:
        orig = scope_cls.set_attr

        def set_attr(self, obj, name, value, _orig=orig):
            if name == "__index__" and obj is _core.tensor:
                value = _numpy_safe_index
            return _orig(self, obj, name, value)

        scope_cls.set_attr = set_attr
    _SAFE_INDEX_INSTALLED = True


_LIBDEVICE_MODULES = ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice",
                      "triton.language.extra.hip.libdevice")


def _patch_libdevice(_interp, scope):
    """Triton's interpreter hands its semantic layer only to the builtins of
    ``triton.language``; give it to the (already imported) libdevice modules
    too, so that ``libdevice.exp(x)`` reaches the builder's
    ``create_extern_elementwise`` (which the simulator implements).

    The generic ``triton.language.extra.libdevice`` holds stubs that return
    None: Triton's code generator replaces them by the backend's functions
    (``get_module_map``), the interpreter calls them as they are.  For the
    launch, each stub's code calls the CUDA module's function of its name (the
    HIP module's where CUDA has none), so ``libdevice.asin(x)`` and a stub
    imported by name (``from triton.language.extra.libdevice import asin``)
    both compute."""
    import sys
    for name in _LIBDEVICE_MODULES:
        mod = sys.modules.get(name)
        if mod is not None:
            _interp._patch_builtin(mod, _interp.interpreter_builder, scope)
    generic = sys.modules.get("triton.language.extra.libdevice")
    if generic is None:
        return
    backends = [m for m in (sys.modules.get("triton.language.extra.cuda.libdevice"),
                            sys.modules.get("triton.language.extra.hip.libdevice")) if m is not None]

    def dispatch(fname, args, kwargs):
        for mod in backends:
            fn = getattr(mod, fname, None)
            if fn is not None:
                return fn(*args, **{k: v for k, v in kwargs.items() if k != "_semantic"})
        raise NotImplementedError(f"triton.language.extra.libdevice.{fname}: no backend module defines it")

    scope.set_attr(generic, "__ditron_libdevice_dispatch__", dispatch)
    for fname, stub in list(vars(generic).items()):
        code = _generic_stub_code(stub, fname)
        if code is not None:
            scope.set_attr(stub, "__code__", code)


#: builtins of ``triton.language.extra.cuda.utils`` (also exported by ``triton.language.extra.cuda``) that stock
#: Triton's interpreter cannot call (they read the compiler's options or are inline PTX)
_CUDA_UTILS = ("num_warps", "num_threads", "globaltimer", "smid")
_CUDA_UTILS_CODE = None


def _cuda_utils_code():
    global _CUDA_UTILS_CODE
    if _CUDA_UTILS_CODE is None:
        src = ("def _make(fn):\n    def wrapper(*args, **kwargs):\n"
               "        return __ditron_cuda_utils__(fn, args, kwargs)\n    return wrapper\n")
        ns: dict = {}
        exec(compile(src, "<ditron: triton.language.extra.cuda.utils>", "exec"), {}, ns)
        _CUDA_UTILS_CODE = ns["_make"](None).__code__
    return _CUDA_UTILS_CODE


def _patch_cuda_utils(scope, num_warps):
    """Make Triton's ``triton.language.extra.cuda.utils`` builtins compute in a simulated launch, however they
    were imported (``from triton.language.extra.cuda.utils import num_warps``, as Triton-distributed's
    all-reduces do): ``num_warps()`` / ``num_threads()`` are the launch's (constexprs, as on a GPU),
    ``globaltimer()`` is nanoseconds; ``smid()`` is refused (the simulator has no SMs).  Each builtin's wrapper
    code is swapped for the launch (restored with the scope), since a name imported by value never sees a
    module attribute that is patched."""
    import sys
    import time
    import numpy as np
    mod = sys.modules.get("triton.language.extra.cuda.utils")
    if mod is None:
        return

    def dispatch(fn, args, kwargs):
        name = fn.__name__
        if name == "num_warps":
            return _core.constexpr(num_warps)
        if name == "num_threads":
            return _core.constexpr(num_warps * 32)
        if name == "globaltimer":
            return interpreter_value(np.array([time.monotonic_ns()], dtype=np.int64), tl.int64)
        raise interpreter_error(f"triton.language.extra.cuda.utils.{name}(): the simulator has no streaming "
                                "multiprocessors (no SM id); code that depends on the SM cannot be simulated")

    scope.set_attr(_core, "__ditron_cuda_utils__", dispatch)
    code = _cuda_utils_code()
    for name in _CUDA_UTILS:
        fn = getattr(mod, name, None)
        if fn is not None and getattr(fn, "__code__", None) is not None and \
                fn.__code__.co_freevars == code.co_freevars and getattr(fn, "__globals__", None) is vars(_core):
            scope.set_attr(fn, "__code__", code)


_STUB_CODE: dict = {}
_STUB_CODE: dict = {}


def _generic_stub_code(stub, fname):
    """The code that makes a generic libdevice stub dispatch (None: not a stub of the module)."""
    import types
    if not isinstance(stub, types.FunctionType) or stub.__module__ != "triton.language.extra.libdevice" or \
            fname.startswith("_"):
        return None
    code = stub.__code__
    hit = _STUB_CODE.get(code)
    if hit is not None or code in _STUB_CODE.values():
        return hit
    if code.co_freevars:
        return None
    src = f"def {fname}(*args, **kwargs):\n    return __ditron_libdevice_dispatch__({fname!r}, args, kwargs)\n"
    ns: dict = {}
    exec(compile(src, "<ditron: triton.language.extra.libdevice>", "exec"), {}, ns)
    _STUB_CODE[code] = ns[fname].__code__
    return _STUB_CODE[code]


_OVERFLOW_SKIP_INSTALLED = False


def _install_overflow_check_skip():
    """Skip the interpreter's dead integer-overflow check.

    With ``sanitize_overflow`` on (the interpreter's default), every int32 ``+``, ``-`` and ``*`` first
    computes the result again in int64, compares it with both bounds and hands the condition to
    ``device_assert`` -- which, with the interpreter's ``debug=False``, returns without looking at it.  So
    the check changes nothing but costs four extra interpreted ops per integer op (a quarter of the CPU of
    the simulated tile-index arithmetic).  It is skipped only for the interpreter's builder, only while its
    options say ``debug=False``, and only if this Triton's ``device_assert`` is verified (once, here) to
    ignore a false condition then; with ``debug=True`` the check runs as before.  Compiled code is untouched."""
    global _OVERFLOW_SKIP_INSTALLED
    if _OVERFLOW_SKIP_INSTALLED:
        return
    _OVERFLOW_SKIP_INSTALLED = True
    try:
        import numpy as np
        from triton.runtime import interpreter as _interp
        from triton.language.semantic import TritonSemantic
        builder_cls = _interp.InterpreterBuilder
        orig = TritonSemantic.binary_op_sanitize_overflow_impl
        builder = _interp.interpreter_builder
        if getattr(builder.options, "debug", True):
            return
        probe = tl.tensor(_interp.TensorHandle(np.array([False]), tl.int1), tl.int1)
        TritonSemantic(builder).device_assert(probe, "ditron probe: device_assert is off", None)
    except Exception:  # noqa: BLE001 -- the assert fired, or this Triton differs: keep its check
        return

    def binary_op_sanitize_overflow_impl(self, *args, _orig=orig, _cls=builder_cls, **kwargs):
        b = self.builder
        if isinstance(b, _cls) and not b.options.debug:
            return None       # device_assert would ignore the condition (see above)
        return _orig(self, *args, **kwargs)

    TritonSemantic.binary_op_sanitize_overflow_impl = binary_op_sanitize_overflow_impl


_LAZY_TUPLE_NAME_INSTALLED = False


def _install_lazy_tuple_type_name():
    """Triton 3.6's ``tl.core.tuple_type`` formats its ``name`` (``'[:int32,:int32]'``) when it is built -- and
    the interpreter builds one for the shape of every tensor it makes (``tensor.__init__`` wraps the shape in a
    ``tl.tuple``): about a tenth of the CPU of a simulated program, for a string that is almost never read.
    Triton 3.9 computes it on first use (a ``functools.cached_property``); this gives 3.6 the same: the same
    string from the same ``fields`` and ``types``, computed when read.  Versions whose ``name`` is already lazy,
    or whose ``tuple_type`` differs, are left alone."""
    global _LAZY_TUPLE_NAME_INSTALLED
    if _LAZY_TUPLE_NAME_INSTALLED:
        return
    _LAZY_TUPLE_NAME_INSTALLED = True
    import functools
    import inspect
    cls = getattr(_core, "tuple_type", None)
    if cls is None or "name" in vars(cls):
        return          # already lazy (3.9) or unknown
    try:
        src = inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return
    # exactly 3.6's constructor (anything else: keep it)
    expected = ("self.types = types", "self.fields = fields or [''] * len(types)",
                "self.name = '[' + ','.join([f\"{k}:{v}\" for k, v in zip(self.fields, self.types)]) + ']'")
    body = [line.strip() for line in src.splitlines()[1:] if line.strip()]
    if body != list(expected):
        return

    def __init__(self, types, fields=None):
        self.types = types
        self.fields = fields or [''] * len(types)

    def name(self):
        return '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']'

    prop = functools.cached_property(name)
    prop.__set_name__(cls, "name")
    __init__.eager_init = cls.__init__        # Triton's own (for tests)
    cls.__init__ = __init__
    cls.name = prop


_VECTOR_REDUCE_INSTALLED = False
_ELEMENTWISE_COMBINE: dict = {}      # code object -> whether the combine function is elementwise (see below)
_COMBINE_TL_CALLS = frozenset({"maximum", "minimum", "where", "abs"})
_COMBINE_NODES = (ast.Return, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Load, ast.Constant, ast.Attribute,
                  ast.Call, ast.operator, ast.unaryop, ast.cmpop)


def _elementwise_combine(fn) -> bool:
    """Whether ``fn`` (a ``tl.reduce`` combine function) is one ``return`` of arithmetic, bitwise and comparison
    operators on its arguments and constants, ``tl.maximum`` / ``tl.minimum`` / ``tl.where`` / ``tl.abs`` and
    ``.to(...)`` casts: then, applied to whole tiles, it computes element by element exactly what it computes on
    one element (no branch, no ``and`` / ``or``, no helper, no memory access, no side effect)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    hit = _ELEMENTWISE_COMBINE.get(code)
    if hit is None:
        hit = _ELEMENTWISE_COMBINE[code] = _check_elementwise_combine(fn)
    return hit


def _check_elementwise_combine(fn) -> bool:
    try:
        import textwrap
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        fdef = tree.body[0]
    except Exception:  # noqa: BLE001 -- no source: not provably elementwise
        return False
    if not isinstance(fdef, ast.FunctionDef):
        return False
    a = fdef.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs or len(fdef.body) != 1 \
            or not isinstance(fdef.body[0], ast.Return) or fdef.body[0].value is None:
        return False
    params = {x.arg for x in a.args}
    g = getattr(fn, "__globals__", {})
    for node in ast.walk(fdef.body[0]):
        if not isinstance(node, _COMBINE_NODES):
            return False
        if isinstance(node, ast.Name) and node.id not in params and g.get(node.id) is not tl:
            return False
        if isinstance(node, ast.Attribute) and not (
                (isinstance(node.value, ast.Name) and g.get(node.value.id) is tl and node.value.id not in params
                 and node.attr in _COMBINE_TL_CALLS) or node.attr == "to"):
            return False
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Attribute) or node.keywords and node.func.attr != "to":
                return False
            if node.func.attr == "to" and not all(isinstance(k.value, (ast.Constant, ast.Attribute, ast.Name))
                                                  for k in node.keywords):
                return False
    return True


_INT_COMBINE: dict = {}      # code object -> "add" / "max" / "min" / None


def _integer_combine(fn):
    """``"add"``, ``"max"`` or ``"min"`` when ``fn`` is exactly ``return a + b`` / ``tl.maximum(a, b)`` /
    ``tl.minimum(a, b)`` of its two arguments (either order), else None."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    if code not in _INT_COMBINE:
        kind = None
        try:
            import textwrap
            fdef = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
            a = fdef.args
            ret = fdef.body[0].value if len(fdef.body) == 1 and isinstance(fdef.body[0], ast.Return) else None
            params = [x.arg for x in a.args]
            plain = not (a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs) and len(params) == 2

            def pair(x, y):
                return isinstance(x, ast.Name) and isinstance(y, ast.Name) and sorted((x.id, y.id)) == sorted(params)

            g = getattr(fn, "__globals__", {})
            if plain and isinstance(ret, ast.BinOp) and isinstance(ret.op, ast.Add) and pair(ret.left, ret.right):
                kind = "add"
            elif plain and isinstance(ret, ast.Call) and isinstance(ret.func, ast.Attribute) and not ret.keywords \
                    and isinstance(ret.func.value, ast.Name) and g.get(ret.func.value.id) is tl \
                    and ret.func.attr in ("maximum", "minimum") and len(ret.args) == 2 and pair(*ret.args):
                kind = "max" if ret.func.attr == "maximum" else "min"
        except Exception:  # noqa: BLE001 -- no source: Triton's path
            kind = None
        _INT_COMBINE[code] = kind
    return _INT_COMBINE[code]


def _install_vector_reduce():
    """``tl.reduce`` with a combine function of the kernel's own (``_add``, ``_imax``, ``_fmax`` of the ditron
    kernels) takes the interpreter's slow path, ``ReduceOps.generic_reduce``: one interpreted call of the combine
    function per element, e.g. 16 x 64 calls to reduce a 16 x 64 attention tile along its rows.  When the
    combine function is elementwise (:func:`_elementwise_combine`) and the tile has more than one dimension, the
    same reduction runs over whole slices instead: for every position ``k`` along the axis, one call combines the
    accumulator tile with slice ``k``.  Every output element is still ``f(...f(f(x0, x1), x2)..., xn)`` in the
    same order, from the same values stored back into the input's dtype after each step: the same results, bit
    for bit (float rounding included).  Other reductions (1-D tiles, ``axis=None``, other combine functions) run
    as before.  A combine function that is exactly ``a + b``, ``tl.maximum(a, b)`` or ``tl.minimum(a, b)`` on 32-
    or 64-bit integers is exact in any order (the sum wraps modulo 2**bits either way): one NumPy reduction,
    whatever the tile's shape."""
    global _VECTOR_REDUCE_INSTALLED
    if _VECTOR_REDUCE_INSTALLED:
        return
    _VECTOR_REDUCE_INSTALLED = True
    from triton.runtime import interpreter as _interp
    cls = getattr(_interp, "ReduceOps", None)
    orig = getattr(cls, "generic_reduce", None)
    if orig is None or not all(hasattr(cls, m) for m in ("unravel", "to_tensor")):
        return
    import numpy as np

    ufuncs = {"add": np.add, "max": np.maximum, "min": np.minimum}

    def integer_reduce(self, flat, axis, original_axis, kind):
        data = flat[0].handle.data
        out = ufuncs[kind].reduce(data, axis=axis, dtype=data.dtype) if kind == "add" else \
            ufuncs[kind].reduce(data, axis=axis)
        out = np.asarray(out, dtype=data.dtype)
        if self.keep_dims:
            if original_axis is not None:
                out = np.expand_dims(out, axis)
            else:
                for _ in range(data.ndim):
                    out = np.expand_dims(out, 0)
        elif original_axis is None:
            out = out.item()
        return [self.to_tensor(out, flat[0].dtype)]

    def generic_reduce(self, input, _orig=orig):
        fn = getattr(self.combine_fn, "fn", None)
        if fn is None:
            return _orig(self, input)
        kind = _integer_combine(fn)
        if kind is not None and len(input) == 1:
            dt = input[0].dtype
            npd = input[0].handle.data.dtype
            if dt.is_int() and not dt.is_bool() and dt.primitive_bitwidth >= 32 and npd.kind in "iu" \
                    and npd.itemsize * 8 == dt.primitive_bitwidth \
                    and input[0].handle.data.size:
                # 32 / 64-bit integer +, max, min: exact (+ wraps modulo 2**bits at every step either way),
                # so the order of the fold does not matter: one NumPy reduction
                flat, axis = self.unravel(input, self.axis)
                return integer_reduce(self, flat, axis, self.axis, kind)
        if not _elementwise_combine(fn):
            return _orig(self, input)
        original_axis = self.axis
        flat, axis = self.unravel(input, self.axis)
        shape = flat[0].handle.data.shape
        if original_axis is None or len(shape) < 2 or not shape[axis] or \
                any(x.handle.data.shape != shape for x in flat):
            return _orig(self, input)
        data = [x.handle.data for x in flat]
        out_shape = shape[:axis] + shape[axis + 1:]
        out = [np.zeros(out_shape, dtype=d.dtype) for d in data]
        for o, d, x in zip(out, data, flat):
            o[...] = self.to_tensor(np.take(d, 0, axis=axis), x.dtype).handle.data
        for k in range(1, shape[axis]):
            acc = tuple(self.to_tensor(o, x.dtype) for o, x in zip(out, flat))
            cur = tuple(self.to_tensor(np.take(d, k, axis=axis), x.dtype) for d, x in zip(data, flat))
            ret = self.combine_fn.fn(*acc, *cur)
            ret = (ret, ) if not isinstance(ret, tuple) else ret
            for o, r in zip(out, ret):
                o[...] = r.handle.data if isinstance(r, tl.core.tensor) else r
        res = []
        for o, x in zip(out, flat):
            if self.keep_dims:
                o = np.expand_dims(o, axis)
            res.append(self.to_tensor(o, x.dtype))
        return res

    generic_reduce.interpreter_generic_reduce = orig      # Triton's own, one call per element (for tests)
    cls.generic_reduce = generic_reduce


_LAUNCHES = 0                # ditron launches in progress in this process (triton.language patched by their scope)
_NESTED_SKIP_INSTALLED = False


def _install_nested_patch_skip():
    """Triton's interpreter re-patches ``triton.language`` at *every* call of a ``@triton.jit`` helper from a
    kernel (``InterpretedFunction.__call__`` -> ``_patch_lang``: ``inspect.getmembers`` of ``tl``, ``tl.core``,
    ``tl.tensor``, ``tl.math``, ... and a new wrapper per builtin, about 2 ms a call; ``tl.sum``, ``tl.max`` and
    ``tl.cdiv`` are such helpers).  Inside a ditron launch :func:`interpreter_launch` has already patched
    ``tl`` and ``tl.core`` (a superset of what a helper's patch touches: it only patches the ``tl`` / ``tl.core``
    modules its globals hold) with the same wrappers of the same builder, so the helper's patch changes nothing
    and is skipped.  A helper whose module holds neither still gets Triton's own patch (and its error).

    Outside ditron's launches (a plain ``@triton.jit`` kernel launched by Triton's ``GridExecutor`` on the
    simulator, and its helpers) the patch also covers the libdevice modules (:func:`_patch_libdevice`), as
    :func:`interpreter_launch` does for ditron's, so that their functions compute instead of failing."""
    global _NESTED_SKIP_INSTALLED
    if _NESTED_SKIP_INSTALLED:
        return
    from triton.runtime import interpreter as _interp
    scope_cls = getattr(_interp, "_LangPatchScope", None)
    orig = getattr(_interp, "_patch_lang", None)
    if scope_cls is not None and orig is not None:

        def _patch_lang(fn, *args, _orig=orig, _scope=scope_cls, **kwargs):
            if _LAUNCHES > 0 and not args and not kwargs and \
                    any(v is tl or v is _core for v in list(fn.__globals__.values())):
                return _patch_named_builtins(fn, _scope())      # tl / tl.core already patched
            scope = _orig(fn, *args, **kwargs)
            if _LAUNCHES > 0 and not args and not kwargs:
                _patch_named_builtins(fn, scope)
            if _LAUNCHES == 0:
                _patch_libdevice(_interp, scope)
            return scope

        _patch_lang.__wrapped__ = orig
        _interp._patch_lang = _patch_lang
    _NESTED_SKIP_INSTALLED = True


_NAMED_BUILTINS: dict = {}      # id(a helper's module globals) -> (globals, names of tl.core builtins bound there)


def _patch_named_builtins(fn, scope):
    """A helper whose module imported ``triton.language`` builtins by name (``from triton.language.core import
    to_tensor``, as Triton-distributed's profiler does): Triton's interpreter patches the ``tl`` / ``tl.core``
    module attributes only, so the name still held the unpatched builtin (``_semantic argument must be
    provided``).  For the helper's call the module's name is pointed at the patched builtin (restored with the
    scope).  The names are found once per module."""
    import sys
    g = fn.__globals__
    hit = _NAMED_BUILTINS.get(id(g))
    if hit is None or hit[0] is not g:
        names = tuple(n for n, v in list(g.items()) if _core.is_builtin(v) and hasattr(_core, n))
        hit = _NAMED_BUILTINS[id(g)] = (g, names)
    if hit[1]:
        mod = sys.modules.get(g.get("__name__"))
        if mod is not None and getattr(mod, "__dict__", None) is g:
            for n in hit[1]:
                # only a name that holds the very builtin Triton's patch wrapped (its wrapper keeps it as the
                # `member` default); a name bound to another builtin (ditron's, an alias's) is left alone
                cur = getattr(_core, n, None)
                wrapped = (getattr(cur, "__kwdefaults__", None) or {}).get("member")
                if wrapped is not None and wrapped is g.get(n):
                    scope.set_attr(mod, n, cur)
    return scope


def install_libdevice_for_triton_launches():
    """For plain ``@triton.jit`` kernels that Triton's interpreter launches (the simulator installs it in every
    rank): libdevice (see :func:`_install_nested_patch_skip`) and the GPU semantics that :func:`interpreter_launch`
    gives ditron's kernels -- the NumPy-safe ``tensor.__index__``, bf16 ``tl.dot`` on values, round-to-nearest-even
    casts to and from bf16, boolean splats of scalar conditions.  Without them a plain kernel launched before any of
    ditron's in a process truncated fp32 -> bf16, multiplied bf16 storage in ``tl.dot``, refused ``mask & (flag >
    0)`` (Triton 3.9) and failed ``range(0, tl.where(...))`` (Triton 3.6), and the same kernel computed right once a
    ditron kernel had run (tests/test_sim_plain_first.py)."""
    _install_nested_patch_skip()
    _install_gpu_semantics()


def _install_gpu_semantics():
    """The interpreter builder's patches that make a kernel compute as on a GPU, whoever launches it (ditron's
    :func:`interpreter_launch` or Triton's own launcher of a plain kernel): process-wide, each installed once."""
    _install_numpy_safe_index()
    _install_bf16_dot()
    _install_rne_casts()
    _install_bool_splat()


def _patch_lang_now(_interp, fn):
    """Triton's own ``_patch_lang`` (not the helper-call skip of :func:`_install_nested_patch_skip`)."""
    patch = _interp._patch_lang
    return getattr(patch, "__wrapped__", patch)(fn)


# Triton's patch of ``triton.language`` for one launch (``_patch_lang`` + the libdevice modules): ~2.5 ms of
# ``inspect.getmembers`` and new wrappers per launch, the same wrappers of the same builder every time.  The
# first launch records what it set; later launches set the recorded values again when nothing they touch has
# changed since (every patched attribute still holds the original it replaced, no attribute was added to a
# patched module or class, the same libdevice modules are loaded, the same interpreter builder / semantic), and
# otherwise patch afresh (and record that).  A launch nested in another (triton.language already patched)
# always patches afresh and records nothing.
_LANG_PLAN = None       # (key, patched objects, [(obj, name, original, patched)], Triton's 'missing' marker)


def _lang_plan_key(_interp, objs):
    import sys
    return (id(getattr(_interp, "interpreter_builder", None)), id(getattr(_interp, "interpreter_semantic", None)),
            tuple(id(sys.modules.get(name)) for name in _LIBDEVICE_MODULES),
            tuple((id(o), len(getattr(o, "__dict__", ()))) for o in objs))


def _record_lang_patch(_interp, scope):
    global _LANG_PLAN
    changes = getattr(scope, "_changes", None)
    if _LAUNCHES > 0 or not isinstance(changes, list):
        return
    missing = getattr(_interp, "_MISSING", None)
    if missing is None:
        return
    # an attribute patched twice (tl and tl.core hold the same classes) is one entry: the original before the
    # first patch, the value after the last
    first = {}
    for obj, name, original in changes:
        first.setdefault((id(obj), name), (obj, name, original))
    plan = [(obj, name, original, getattr(obj, name)) for obj, name, original in first.values()]
    objs = list({id(obj): obj for obj, _, _, _ in plan}.values())
    # the key is taken with the patch removed (as the next launch will see it): restore, key, re-apply
    for obj, name, original, _ in reversed(plan):
        if original is missing:
            delattr(obj, name)
        else:
            setattr(obj, name, original)
    key = _lang_plan_key(_interp, objs)
    for obj, name, _, patched in plan:
        setattr(obj, name, patched)
    _LANG_PLAN = (key, objs, plan, missing)


def _replay_lang_patch(_interp):
    """A scope with the recorded patch set again, or None (patch afresh)."""
    hit = _LANG_PLAN
    if hit is None or _LAUNCHES > 0:
        return None
    key, objs, plan, missing = hit
    if _lang_plan_key(_interp, objs) != key:
        return None
    for obj, name, original, _ in plan:
        if getattr(obj, name, missing) is not original:
            return None
    scope = _interp._LangPatchScope()
    changes = scope._changes
    for obj, name, original, patched in plan:
        setattr(obj, name, patched)
        changes.append((obj, name, original))
    return scope


@contextlib.contextmanager
def interpreter_launch(grid, num_warps=4):
    """Patch ``triton.language`` for the interpreter (as Triton's own
    ``GridExecutor`` does) for the duration of one launch and yield the
    interpreter builder with ``grid`` set.  Restores everything afterwards.
    ``num_warps``: the launch's (``triton.language.extra.cuda.utils.num_warps()``)."""
    from triton.runtime import interpreter as _interp
    _install_thread_local_grid()
    _install_gpu_semantics()
    _install_access_hooks()
    _install_nested_patch_skip()
    _install_overflow_check_skip()
    _install_lazy_tuple_type_name()
    _install_vector_reduce()

    class _Scope:
        pass

    global _LAUNCHES
    holder = _Scope()
    holder.__globals__ = {"tl": tl, "core": _core}
    scope = _replay_lang_patch(_interp)
    if scope is None:
        scope = _patch_lang_now(_interp, holder)
        _patch_libdevice(_interp, scope)
        _record_lang_patch(_interp, scope)
    _patch_cuda_utils(scope, int(num_warps))
    builder = _interp.interpreter_builder
    builder.set_grid_dim(*grid)
    _LAUNCHES += 1
    try:
        yield builder
    finally:
        _LAUNCHES -= 1
        scope.restore()


def interpreter_convert_arg(arg):
    """A kernel argument as the interpreter passes it (tensors -> pointers)."""
    from triton.runtime import interpreter as _interp
    if isinstance(arg, bool):
        # Triton 3.6's interpreter builds an int32 array for an i1 type and rejects it
        from triton.runtime.interpreter import TensorHandle
        import numpy as np
        return tl.tensor(TensorHandle(np.array([arg], dtype=bool), tl.int1), tl.int1)
    return _interp._implicit_cvt(arg)


def interpreter_normalize_annotation(ty):
    from triton.runtime.jit import _normalize_ty
    return _normalize_ty(ty)


def interpreter_error(message):
    from triton.runtime.interpreter import InterpreterError
    return InterpreterError(message)


def interpreter_value(data, ty):
    """A ``tl.tensor`` of the interpreter holding NumPy ``data`` of Triton type
    ``ty`` (a scalar/pointer dtype or a block type)."""
    from triton.runtime.interpreter import TensorHandle
    scalar = ty.scalar if hasattr(ty, "scalar") else ty
    if getattr(ty, "is_block", lambda: False)():
        scalar = ty.element_ty
    return tl.tensor(TensorHandle(data, scalar), ty)


def interpreter_np_dtype(tt):
    """NumPy storage dtype the interpreter uses for Triton dtype ``tt``
    (bf16 is stored as uint16, fp8 as uint8)."""
    from triton.runtime.interpreter import _get_np_dtype
    return _get_np_dtype(tt)


def install_interpreted_aggregates():
    """``@tl.core._aggregate`` classes keep their ``@triton.jit`` methods under the interpreter too.  Triton's
    ``_aggregate`` copies the members that are functions or ``JITCallable``s onto the value class it builds; under
    ``TRITON_INTERPRET=1`` ``triton.jit`` returns an ``InterpretedFunction``, which is neither, so a method such
    as Triton-distributed's ``Profiler.create`` / ``.record`` is missing (``AttributeError``) in every simulated
    rank.  Wrapped once at ``import ditron``: the interpreted methods are copied too (compiled Triton unchanged)."""
    import triton.language.core as core
    orig = getattr(core, "_aggregate", None)
    if orig is None or getattr(orig, "__ditron_wrapped__", False):
        return

    def _aggregate(cls, _orig=orig):
        out = _orig(cls)
        if not interpreter_enabled():
            return out
        interpreted = interpreted_function_class()
        for name, member in vars(cls).items():
            if isinstance(member, interpreted) and name not in vars(out):
                setattr(out, name, _BoundOnInstance(member))
        # a constexpr argument is a plain Python value when interpreted: a `tl.constexpr` field gets it wrapped
        # (the annotations are the user class's: Triton 3.6's value class checks them without copying them)
        annotations = dict(getattr(cls, "__annotations__", {}), **getattr(out, "__annotations__", {}))
        consts = {n for n, t in annotations.items() if t is core.constexpr}
        if consts:
            setter = out.__setattr__

            def __setattr__(self, name, value, _setter=setter):
                if name in consts and not isinstance(value, core.constexpr):
                    value = core.constexpr(value)
                _setter(self, name, value)
            out.__setattr__ = __setattr__
        return out

    _aggregate.__ditron_wrapped__ = True
    _aggregate.__wrapped__ = orig
    core._aggregate = _aggregate


class _BoundOnInstance:
    """An interpreted ``@triton.jit`` method of an aggregate: ``obj.m(x)`` calls it with ``obj`` first (an
    ``InterpretedFunction`` is no descriptor); ``Cls.m`` is the function itself (``Profiler.create(...)``)."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, owner=None):
        if obj is None:
            return self.fn
        import functools
        return functools.partial(self.fn, obj)
