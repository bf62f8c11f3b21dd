"""All Triton-version glue lives here (and in :mod:`ditron._compat_interp`, the interpreter's part, named here).

ditron runs on stock Triton (>= 3.5; tested with 3.6.0 and the newest
release).  Anything that touches a Triton internal -- the builtin protocol,
the code generator, the semantic layer, compile entry points, hooks -- goes
through this module so that a Triton upgrade is a one-file change.
Nothing here probes hardware: importing it is safe on a machine without GPUs.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import threading

import triton
import triton.language as tl
from triton.language import core as _core

TRITON_VERSION = tuple(int(p) for p in triton.__version__.split("+")[0].split(".")[:3] if p.isdigit())


def builtin(fn):
    """Turn a Python function into a Triton builtin: the code generator passes
    ``_semantic`` (and ``_generator`` if the function asks for it).

    Under Triton's interpreter (the simulator), Triton patches only the
    builtins of ``triton.language`` to receive the interpreter's semantic
    layer; ditron's builtins pick it up themselves, so ``dl.*`` works in
    every interpreted kernel however it was imported.
    """
    import functools
    inner = _core.builtin(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if kwargs.get("_semantic") is None and interpreter_enabled():
            kwargs["_semantic"] = interpreter_semantic()
        return inner(*args, **kwargs)

    setattr(wrapper, _core.TRITON_BUILTIN, True)
    return wrapper

JITFunction = triton.runtime.jit.JITFunction
constexpr = _core.constexpr
tensor = _core.tensor
CompilationError = triton.compiler.errors.CompilationError


def unwrap(x):
    """The Python value inside a ``tl.constexpr`` (or ``x`` itself)."""
    return _core._unwrap_if_constexpr(x)


# --------------------------------------------------------------------------
# Code-generator access
# --------------------------------------------------------------------------

def builder_options(sem):
    """Backend options (CUDAOptions / HIPOptions / interpreter options) of the
    kernel being traced."""
    builder = getattr(sem, "builder", None)
    return getattr(builder, "options", None)


def is_interpreter(sem) -> bool:
    builder = getattr(sem, "builder", None)
    return type(builder).__name__ == "InterpreterBuilder"


def source_location(gen):
    """(file, line, call-node) of the call currently being generated."""
    if gen is None:
        return None, None, None
    node = getattr(gen, "cur_node", None)
    file_name = getattr(gen, "file_name", None)
    begin = getattr(gen, "begin_line", 0) or 0
    line = begin + node.lineno if node is not None and hasattr(node, "lineno") else None
    return file_name, line, node


def function_name(gen):
    if gen is None:
        return None
    jit_fn = getattr(gen, "jit_fn", None)
    if jit_fn is not None:
        return getattr(jit_fn, "__name__", None) or getattr(getattr(jit_fn, "fn", None), "__name__", None)
    return getattr(gen, "function_name", None)


def _install_dry_run_marker():
    """Triton's code generator visits a ``for`` / ``while`` body twice: once in a block it then erases, to find
    the loop-carried variables (``CodeGenerator._find_carries``: 3.5 to 3.9), and once for real.  Mark the
    generator while the first visit runs, so that the distributed IR records each op of a loop body once."""
    try:
        from triton.compiler.code_generator import CodeGenerator
    except ImportError:                     # pragma: no cover -- a Triton without the code generator module
        return
    orig = getattr(CodeGenerator, "_find_carries", None)
    if orig is None or getattr(orig, "_ditron_marks_dry_run", False):
        return

    def _find_carries(self, *args, _orig=orig, **kwargs):
        self._ditron_dry_run = getattr(self, "_ditron_dry_run", 0) + 1
        try:
            return _orig(self, *args, **kwargs)
        finally:
            self._ditron_dry_run -= 1

    _find_carries._ditron_marks_dry_run = True
    CodeGenerator._find_carries = _find_carries


_install_dry_run_marker()


def in_dry_run(gen) -> bool:
    """Whether ``gen`` is generating a loop body that Triton will erase (see :func:`_install_dry_run_marker`)."""
    return bool(getattr(gen, "_ditron_dry_run", 0))


def call_jit(gen, fn, args):
    """Emit a call to another ``@triton.jit`` function from inside a builtin."""
    return gen.call_JitFunction(fn, list(args), {})


# --------------------------------------------------------------------------
# Value helpers (thin wrappers over tl.core builtins)
# --------------------------------------------------------------------------

def to_tensor(sem, x):
    return sem.to_tensor(x)


def cast(sem, x, dtype):
    return _core.cast(x, dtype, _semantic=sem)


def bitcast(sem, x, dtype):
    return _core.cast(x, dtype, bitcast=True, _semantic=sem)


def add(sem, a, b):
    return to_tensor(sem, a).__add__(b, _semantic=sem)


def mul(sem, a, b):
    return to_tensor(sem, a).__mul__(b, _semantic=sem)


def atomic_add_scalar(sem, ptr, value, order, scope):
    """Triton's ``tl.atomic_add`` on one pointer (``order``: acq_rel, ...;
    ``scope``: gpu, cta, sys); every thread receives the old value."""
    return _core.atomic_add(ptr, value, sem=order, scope=scope, _semantic=sem)


def debug_barrier(sem):
    return _core.debug_barrier(_semantic=sem)


def inline_asm(sem, asm, constraints, args, dtype, *, is_pure=False, pack=1):
    return _core.inline_asm_elementwise(asm, constraints, list(args), dtype, is_pure, pack, _semantic=sem)


def extern_call(sem, lib_name, lib_path, symbol, args, arg_dtypes, ret_dtype, *, is_pure=False):
    """Call ``symbol`` of an LLVM library with exactly ``arg_dtypes``.

    Scalar arguments give a scalar call; a tensor argument makes the call
    elementwise.
    """
    args = [to_tensor(sem, a) for a in args]
    args = [cast(sem, a, t) if a.dtype != t else a for a, t in zip(args, arg_dtypes)]
    return _core.extern_elementwise(lib_name, lib_path, args, {tuple(arg_dtypes): (symbol, ret_dtype)}, is_pure,
                                    _semantic=sem)


# --------------------------------------------------------------------------
# Compilation entry points
# --------------------------------------------------------------------------

def gpu_target(backend: str, arch, warp_size: int):
    from triton.backends.compiler import GPUTarget
    return GPUTarget(backend, arch, warp_size)


def backend_option_names(backend: str):
    """Names of the options Triton's ``backend`` (``"cuda"`` / ``"hip"``)
    accepts: the fields of its ``CUDAOptions`` / ``HIPOptions`` dataclass
    (read from the installed Triton, so new options work without a ditron
    change).  ``extern_libs`` is ditron's to set."""
    import dataclasses
    if backend == "cuda":
        from triton.backends.nvidia.compiler import CUDAOptions as opts
    elif backend == "hip":
        from triton.backends.amd.compiler import HIPOptions as opts
    else:
        return ()
    return tuple(f.name for f in dataclasses.fields(opts) if f.name not in ("extern_libs", "backend_name"))


def ast_source(fn, signature, constexprs, attrs):
    """``triton.compile``'s source of ``fn``: a ``GluonASTSource`` for a Gluon kernel (``@gluon.jit`` or
    ``@ditron.gluon.jit``: ``fn.is_gluon()``), else an ``ASTSource``."""
    is_gluon = getattr(fn, "is_gluon", None)
    if is_gluon is not None and is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource
        return GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compiler.ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)


# --------------------------------------------------------------------------
# Gluon (triton.experimental.gluon): the Hopper GEMM core (kernels/gemm_hopper.py)
# --------------------------------------------------------------------------
# What the core uses is the same in 3.6.0 and 3.9.0: gl.warp_specialize(functions_and_args, worker_num_warps,
# worker_num_regs) (3.6 requires worker_num_regs), tma.async_copy_global_to_shared / async_copy_shared_to_global /
# store_wait, mbarrier.init / expect / wait / arrive (expect's byte count is positional: 3.6 names it ``bytes``,
# 3.9 ``bytes_per_cta``), warpgroup_mma / warpgroup_mma_wait(num, deps), NVMMADistributedLayout(version,
# warps_per_cta, instr_shape), NVMMASharedLayout.get_default_for and GluonASTSource(fn, signature, constexprs).
# Differences: the TMA copies are tma.async_copy_global_to_shared / async_copy_shared_to_global in 3.6 and
# tma.async_load / async_store in 3.9 (the old names raise there; same arguments: gluon_tma_ops); the
# partition-wide barrier is gl.thread_barrier in 3.6 and gl.barrier in 3.9 (gluon_barrier; the core's GEMM-RS
# epilogue uses it).

def gluon_hopper():
    """``(gluon, gluon.language, gluon.language.nvidia.hopper)``."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia import hopper
    return gluon, gl, hopper


def gluon_tma_ops():
    """``(load, store)``: the Gluon TMA builtins global -> shared (``desc, coord, barrier, dst[, pred]``) and
    shared -> global (``desc, coord, src``) of the installed Triton."""
    from triton.experimental.gluon.language.nvidia.hopper import tma
    load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    return load, store


def gluon_barrier():
    """The Gluon builtin that synchronises the calling threads -- inside a ``gl.warp_specialize`` partition,
    that partition's warps (a named barrier): ``gl.thread_barrier`` (3.6) or ``gl.barrier`` (3.9)."""
    from triton.experimental.gluon import language as gl
    return getattr(gl, "barrier", None) or gl.thread_barrier


def mangle_arg(arg) -> str:
    """The signature type Triton's launcher gives ``arg`` (e.g. a Gluon
    ``TensorDescriptor`` -> ``tensordesc<bf16[128, 64],NVMMASharedLayout(...)>``):
    for compiling with ``triton.compile`` without a GPU."""
    from triton.runtime.jit import mangle_type
    return mangle_type(arg)


def gluon_ast_source(fn, signature, constexprs):
    """``triton.compile`` source of a ``@gluon.jit`` kernel; ``signature``
    maps every parameter name to a type string (``"constexpr"`` for those in
    ``constexprs``, keyed by name)."""
    from triton.experimental.gluon._runtime import GluonASTSource
    names = list(signature)
    consts = {(names.index(k),): v for k, v in constexprs.items()}
    return GluonASTSource(fn, signature, consts)


def fp_fusion_default() -> bool:
    """ditron's ``enable_fp_fusion`` where the caller does not pass one: True (LLVM may contract an fp32 ``a * b
    + c`` into one ``fma``; ptxas likewise), the setting every ditron kernel was validated and measured with --
    Triton 3.6's default, while Triton 3.9 warns that its own default turns to False in 3.10, which would
    silently change ditron's kernels (the megakernel's FMA GEMV path among them) with a Triton upgrade.  The
    user's choice wins: ``TRITON_DEFAULT_FP_FUSION`` when set (Triton's knob), ``TRITON_FORCE_DISABLE_FP_FUSION``
    (Triton 3.9 applies it over any request), or ``enable_fp_fusion=`` in a launch / ``ditron.compile``."""
    if os.environ.get("TRITON_FORCE_DISABLE_FP_FUSION", "0").lower() in ("1", "true", "on", "yes"):
        return False
    if os.environ.get("TRITON_DEFAULT_FP_FUSION") is not None:
        return bool(triton.knobs.language.default_fp_fusion)
    return True


def launch_int_specialization(value: int, specialize: bool = True):
    """``(type, spec)`` Triton's launch gives an integer argument ``value``: ``("constexpr", 1)`` for 1 (the kernel
    is compiled with the constant), else ``("i32" | "i64", "D" | "")`` -- ``"D"``: divisible by 16, which the
    compiler may use (vector accesses, folded masks).  ``specialize=False`` (``do_not_specialize``): neither."""
    try:
        from triton.runtime.jit import native_specialize_impl
        from triton.backends.compiler import BaseBackend
        ty, spec = native_specialize_impl(BaseBackend, int(value), False, bool(specialize), True)
        return ty, (spec or "")
    except ImportError:          # a Triton without the native helper: its documented rule
        v = int(value)
        ty = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
        if not specialize:
            return ty, ""
        return ("constexpr", 1) if v == 1 else (ty, "D" if v % 16 == 0 else "")


def _compile_options(options):
    options = dict(options or {})
    if "enable_fp_fusion" not in options:
        # ditron's default, explicit (fp_fusion_default): the same result under every Triton, and no per-compile
        # warning from Triton >= 3.9 about its own default changing
        options["enable_fp_fusion"] = fp_fusion_default()
    return options


def with_fp_fusion(kwargs):
    """A JIT launch's ``kwargs`` with ditron's ``enable_fp_fusion`` (:func:`fp_fusion_default`) where the launch
    did not pass one -- used where Triton compiles (``JITFunction._pack_args``), not on every launch."""
    if "enable_fp_fusion" in kwargs:
        return kwargs
    return dict(kwargs, enable_fp_fusion=fp_fusion_default())


def compile_source(src, target, options):
    return triton.compile(src, target=target, options=_compile_options(options))


class FrontEnd:
    """The front end of ``triton.compile`` alone (Python AST -> Triton IR), as
    ``triton.compile`` runs it: ``module`` is the TTIR before any pass,
    ``text`` its printed form (what :func:`compile_front_end` keys the cache
    with).  Holds the MLIR context the module lives in."""

    def __init__(self, src, target, options):
        from triton._C.libtriton import ir
        from triton.compiler.compiler import make_backend
        backend = make_backend(target)
        opts = backend.parse_options(dict(_compile_options(options), **src.parse_options()))
        self.context = ir.context()
        ir.load_dialects(self.context)
        backend.load_dialects(self.context)
        self.module = src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(),
                                  self.context)
        self.text = str(self.module)


def compile_front_end(src, target, options, front: FrontEnd, key: str):
    """``triton.compile(src)`` whose front end already ran (``front``): Triton
    takes ``front.module`` instead of running its front end again, and its
    on-disk cache key gets ``key`` added (with Triton's own cache-invalidating
    environment).  A cache hit skips the backend stages (TTIR passes, LLVM,
    ptxas / lld); a miss runs them and stores the result, as any Triton compile."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    env = dict(get_cache_invalidating_env_vars())
    env["DITRON_KEY"] = key
    src.make_ir = lambda *args, **kwargs: front.module   # this ASTSource only
    try:
        return triton.compile(src, target=target, options=_compile_options(options), _env_vars=env)
    finally:
        # the compiled kernel keeps ``src`` (Triton's CompiledKernel.src): not the front end's module and MLIR
        # context through this closure, which would stay alive to the end of the process (under nanobind, Triton
        # >= 3.7, its exit then printed a "nanobind: leaked ..." dump)
        del src.make_ir


@contextlib.contextmanager
def _knob(group, name, value):
    """Set the Triton knob ``group.name`` to ``value`` inside the block, then restore it and leave the process
    environment as it was: Triton 3.9's knobs write their ``TRITON_*`` variable into ``os.environ`` when set
    (a later ``ditron sim`` job would inherit it; its zygote then declines the job).  Yields the old value."""
    import os
    before = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
    old = getattr(group, name)
    setattr(group, name, value)
    try:
        yield old
    finally:
        setattr(group, name, old)
        for k in [k for k in os.environ if k.startswith("TRITON_") and k not in before]:
            del os.environ[k]
        os.environ.update(before)


@contextlib.contextmanager
def always_compile():
    """Bypass Triton's on-disk cache (the front end must run to record the
    distributed IR)."""
    with _knob(triton.knobs.compilation, "always_compile", True):
        yield


class _PtxasTee:
    """``sys.stdout`` while any thread is inside :func:`ptxas_log`: a thread that is collecting gets the ptxas logs
    it prints (Triton prints each log in the thread that compiles), every other write goes on to the stream that
    was ``sys.stdout`` before."""

    def __init__(self, out):
        self.out = out
        self.local = threading.local()

    def write(self, s):
        st = getattr(self.local, "st", None)
        if st is None:
            return self.out.write(s)
        after_log, st["last_was_log"] = st["last_was_log"], _PTXAS_LINE.match(s) is not None
        if st["last_was_log"]:
            st["logs"].append(s)
            return self.out.write(s) if st["show"] else len(s)
        if s == "\n" and after_log and not st["show"]:
            return 1                               # the newline print() writes after the log
        return self.out.write(s)

    def __getattr__(self, name):
        return getattr(self.out, name)


_PTXAS_LINE = re.compile(r"ptxas[\w-]* ")
_PTXAS_LOCK = threading.Lock()
_PTXAS_STATE = {"users": 0, "tee": None, "knob": None}


@contextlib.contextmanager
def ptxas_log():
    """Collect the ``ptxas -v`` logs of the cubins Triton assembles inside the block: Triton runs ptxas with
    ``-v`` and prints the log (one ``print``) when ``knobs.nvidia.dump_ptxas_log`` is on.  Yields a list that gets
    each log's text (none when the backend stages came from Triton's cache, or this Triton has no such knob).
    Whatever else is printed goes on to ``sys.stdout``, the logs too when the user had turned the knob on.
    Threads may collect at once: the knob stays on and ``sys.stdout`` stays one :class:`_PtxasTee` until the last
    of them leaves, and each thread gets its own logs."""
    knobs = getattr(triton.knobs, "nvidia", None)
    logs = []
    if knobs is None or not hasattr(knobs, "dump_ptxas_log"):
        yield logs
        return
    import sys
    with _PTXAS_LOCK:
        state = _PTXAS_STATE
        if state["users"] == 0:
            state["knob"] = _knob(knobs, "dump_ptxas_log", True)
            state["show"] = bool(state["knob"].__enter__())     # the user's own setting: logs shown too
            state["tee"] = _PtxasTee(sys.stdout)
            sys.stdout = state["tee"]
        state["users"] += 1
        tee = state["tee"]
    tee.local.st = {"logs": logs, "last_was_log": False, "show": state["show"]}
    try:
        yield logs
    finally:
        tee.local.st = None
        with _PTXAS_LOCK:
            state["users"] -= 1
            if state["users"] == 0:
                if sys.stdout is tee:
                    sys.stdout = tee.out
                knob, state["knob"], state["tee"] = state["knob"], None, None
                knob.__exit__(None, None, None)


def cuobjdump_path() -> str:
    """Triton's bundled ``cuobjdump`` (its ``knobs.nvidia.cuobjdump`` tool, where the knob exists)."""
    try:
        from triton import knobs
        return knobs.nvidia.cuobjdump.path
    except (ImportError, AttributeError):
        return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def ptxas_run_is_plain(metadata) -> bool:
    """Whether the ptxas run that Triton made for a kernel with ``metadata`` gives the numbers of ``ptxas -v
    --gpu-name=ARCH`` on its PTX alone (:func:`ditron.compiler.ptxas_usage`).  Triton 3.6 adds ``-lineinfo``
    (line tables; the allocation is the same: checked on every kernel whose usage() the tests ask for), and ``--fmad=false`` /
    ``ptx_options`` / ``--opt-level 0`` when asked (not plain).  Triton 3.9 adds ``--regAllocOptLevel=2`` to
    every run, which allocates differently (up to ~200 more bytes of spills on the decoder's steps): not plain."""
    if TRITON_VERSION[:2] != (3, 6) or metadata is None:
        return False
    knobs = getattr(triton.knobs, "nvidia", None)
    return (getattr(metadata, "enable_fp_fusion", None) is True and not getattr(metadata, "ptx_options", None)
            and not getattr(knobs, "disable_ptxas_opt", True))


def divisibility_attr(n=16):
    return [["tt.divisibility", n]]


def jit_function_params(jit_fn):
    """Names of a JITFunction's parameters, in order."""
    return [p.name for p in jit_fn.params]


def tile_function_params(fn):
    """``[(name, is_constexpr), ...]`` of a ``@triton.jit`` / ``@ditron.jit``
    function (compiled or interpreted), or None when ``fn`` is not one."""
    py = getattr(fn, "fn", None)
    if py is None or not callable(py) or not hasattr(fn, "arg_names"):
        return None
    out = []
    for p in inspect.signature(py).parameters.values():
        ann = p.annotation
        const = ann is tl.constexpr or (isinstance(ann, str) and "constexpr" in ann) or \
            getattr(ann, "__name__", "") == "constexpr"
        out.append((p.name, bool(const)))
    return out


def jit_kwargs_signature():
    """Keyword options accepted by ``triton.jit``."""
    return set(inspect.signature(triton.jit).parameters) - {"fn"}


def warm_triton_key() -> None:
    """Compute Triton's compiler key now (``triton.runtime.cache.triton_key``: a hash of Triton's compiler
    sources and of its ~400 MB shared library, ~0.4 CPU-s, remembered per process).  Both Triton's compile and
    torch inductor's cache key (``torch.compile``) ask for it; a process that forks many others (the simulator's
    fork servers and zygote) computes it once for all of them.  Where it cannot, the process that needs it
    computes it and reports why."""
    try:
        from triton.runtime.cache import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 -- a process that needs it computes it and reports the failure
        pass


def ditron_cache_dir():
    base = os.environ.get("DITRON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ditron")
    return base


# Triton's interpreter (the simulator runs kernels on it): ditron/_compat_interp.py, named here
from ._compat_interp import (  # noqa: E402,F401
    interpreter_enabled, interpreter_runtime, interpreter_semantic, interpreted_function_class, f32_to_bf16_bits,
    bf16_bits_to_f32, simt_thread, set_simt_thread, simt_warp_calls, set_simt_warp_calls, simt_lanes,
    set_simt_lanes, ACCESS_HOOKS,
    interpreter_launch, interpreter_convert_arg, interpreter_normalize_annotation, interpreter_error,
    interpreter_value, interpreter_np_dtype, install_libdevice_for_triton_launches, install_interpreted_aggregates)

# --------------------------------------------------------------------------
# Runtime hooks (GPU runtime, ditron/runtime/gpu.py): kernel module load/unload
# --------------------------------------------------------------------------
# Triton calls ``kernel_load_end_hook(module, function, name, metadata_group,
# hash)`` right after loading a kernel's binary (CUmodule handle as int),
# before its first launch (3.6 and 3.9: a HookChain; older: one callable).
# Triton >= 3.9 also unloads modules when kernels are freed and calls
# ``kernel_unload_hook`` with the same arguments first.

def _hook_add(attr, fn):
    knobs = triton.knobs.runtime
    if not hasattr(knobs, attr):
        return False
    hook = getattr(knobs, attr)
    if hasattr(hook, "add"):
        hook.add(fn)
    elif hook is None or hook is fn:
        setattr(knobs, attr, fn)
    else:
        prev = hook

        def chained(*args, **kwargs):
            prev(*args, **kwargs)
            fn(*args, **kwargs)
        chained._ditron_wrapped = (prev, fn)
        setattr(knobs, attr, chained)
    return True


def _hook_remove(attr, fn):
    knobs = triton.knobs.runtime
    hook = getattr(knobs, attr, None)
    if hook is None:
        return
    if hasattr(hook, "remove"):
        hook.remove(fn)
    elif hook is fn:
        setattr(knobs, attr, None)
    elif getattr(hook, "_ditron_wrapped", (None, None))[1] is fn:
        setattr(knobs, attr, hook._ditron_wrapped[0])


def add_kernel_load_hook(fn):
    """Call ``fn(module, function, name, metadata_group, hash)`` after Triton
    loads a kernel binary, before its first launch."""
    if not _hook_add("kernel_load_end_hook", fn):
        raise RuntimeError(f"Triton {triton.__version__} has no kernel_load_end_hook; ditron's GPU runtime needs "
                           "Triton >= 3.5")


def remove_kernel_load_hook(fn):
    _hook_remove("kernel_load_end_hook", fn)


def add_kernel_unload_hook(fn):
    """``fn`` runs before Triton unloads a kernel's module (Triton >= 3.9;
    older versions never unload, and this does nothing)."""
    return _hook_add("kernel_unload_hook", fn)


def remove_kernel_unload_hook(fn):
    _hook_remove("kernel_unload_hook", fn)


def metadata_extern_libs(metadata_group):
    """``extern_libs`` a loaded kernel was compiled with, read from the
    metadata JSON in the ``metadata_group`` Triton passes to the load hook."""
    import json
    for key, path in dict(metadata_group or {}).items():
        if str(key).endswith(".json") and not str(key).startswith("__grp__"):
            try:
                with open(path) as f:
                    return [tuple(x) for x in json.load(f).get("extern_libs") or ()]
            except (OSError, ValueError):
                return []
    return []


def link_needed_functions(library_path: str, symbols) -> str:
    """LLVM IR text of the functions (and the globals they use) that
    ``symbols`` need from the device library ``library_path``: Triton's own
    link step (LinkOnlyNeeded) run once against a module that only declares
    ``symbols``.  Triton marks linked functions internal; they are made
    external again so that the text links like the original library."""
    import re
    import tempfile
    from triton._C.libtriton import ir, llvm
    decls = "".join(f"  llvm.func @{s}()\n" for s in sorted(symbols))
    with tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False) as f:
        f.write("module {\n" + decls + "}\n")
    try:
        ctx = ir.context()
        ir.load_dialects(ctx)
        mod = ir.parse_mlir_module(f.name, ctx)
    finally:
        os.unlink(f.name)
    llvm.init_targets()
    lctx = llvm.context()
    lmod = llvm.to_module(mod, lctx)
    llvm.link_extern_libs(lmod, [library_path])
    text = str(lmod)
    return re.sub(r"^define internal ", "define ", text, flags=re.M)


def is_compiled_kernel(obj) -> bool:
    """Whether ``obj`` is what a launch of a ``JITFunction`` returns on GPUs (a loaded ``CompiledKernel``)."""
    from triton.compiler.compiler import CompiledKernel
    return isinstance(obj, CompiledKernel)


from triton.runtime.driver import driver as _DRIVER  # noqa: E402 -- the launch path's driver (Triton's own object)


def launch_compiled(compiled, device, grid, args):
    """Launch the compiled kernel ``compiled`` on ``device``'s current stream, ``grid`` a 3-tuple and ``args``
    every parameter of the kernel in order (constexprs included, as ``JITFunction.run`` passes them): Triton's own
    last step of a launch, without its argument binding, specialisation and cache lookup.  The caller guarantees
    that ``compiled`` is the binary those arguments select (same specialisation)."""
    rt = triton.knobs.runtime
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    stream = _DRIVER.active.get_current_stream(device)
    if not (getattr(enter, "calls", True) or getattr(leave, "calls", True)):
        # Triton >= 3.5's hooks are chains, always set: with no hook in either, the launcher is told there is none
        # (what it would call does nothing) and no launch metadata is made for it (a LazyDict per launch)
        enter = leave = meta = None
    else:
        meta = compiled.launch_metadata(grid, stream, *args) if enter is not None else None
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, meta, enter, leave,
                 *args)
