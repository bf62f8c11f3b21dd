"""``@ditron.jit``: a Triton ``JITFunction`` that knows which device
libraries a kernel needs.

A ditron kernel is launched exactly like a Triton kernel
(``kernel[grid](...)``, ``kernel.warmup(...)``) and takes every option of
``triton.jit``.  What it adds:

* the ditron device library (world descriptor, helpers) is attached for the
  target being compiled for; it costs nothing in kernels that do not use it
  (Triton links only needed symbols);
* the OpenSHMEM library (NVSHMEM / rocSHMEM) is attached only to kernels that
  call ``shmem.*``: tracing discovers the need (:class:`~ditron.libs.NeedLibrary`),
  the kernel is compiled again with the library, and the need is remembered;
* the distributed IR of the last compilation is kept (``kernel.dist_ir``);
* a device bitcode that the installed Triton cannot read gives an error that
  names the versions that work.
"""
from __future__ import annotations

from . import _compat
from .ir import recording
from .libs import NeedLibrary, explain_link_failure
from .lowering.common import link_library
from .target import parse_target

_MAX_LIBRARY_RETRIES = 4


def devlib_for(target):
    """The ditron device library of ``target``'s backend."""
    from .lowering import cuda, hip  # importing registers the rules
    if target.backend == "cuda":
        return cuda.current_library()   # variant for the world's transport / bounded waits
    return {"hip": hip.LIB}[target.backend]


_LIB_ENV = ("DITRON_CACHE_DIR", "DITRON_NVSHMEM_BC", "DITRON_NVSHMEM_FULL", "NVSHMEM_HOME", "DITRON_ROCSHMEM_BC", "ROCSHMEM_HOME",
            "ROCM_PATH")
_LIB_CACHE: dict = {}


def library_options(target, needs, user_libs=None):
    """``extern_libs`` for a compilation: the ditron device library first (its
    wrappers reference SHMEM symbols, so it must be linked before SHMEM), then
    the libraries the kernel is known to need, then the user's.

    Cached: this runs on every launch, and finding the NVSHMEM bitcode scans
    site directories (about a millisecond)."""
    import os
    lib = devlib_for(target)
    key = (target, id(lib), frozenset(needs), tuple(sorted(dict(user_libs or {}).items())),
           tuple(os.environ.get(k) for k in _LIB_ENV))
    hit = _LIB_CACHE.get(key)
    if hit is None:
        hit = _LIB_CACHE[key] = _library_options(lib, target, needs, user_libs)
    return dict(hit)


def _library_options(lib, target, needs, user_libs):
    libs = {}
    libs[lib.name] = lib.path()
    for need in sorted(needs):
        name, path = link_library(target) if need in ("libnvshmem_device", "rocshmem") else (need, None)
        if path is not None:
            libs[name] = path
    for k, v in dict(user_libs or {}).items():
        libs.setdefault(k, v)
    return libs


def find_cause(exc, kind):
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def compile_with_libraries(compile_once, target, needs: set, user_libs=None):
    """Run ``compile_once(extern_libs)``; when tracing reports a missing device
    library, add it to ``needs`` and compile again."""
    for _ in range(_MAX_LIBRARY_RETRIES):
        libs = library_options(target, needs, user_libs)
        try:
            return compile_once(libs)
        except Exception as e:  # noqa: BLE001 -- re-raised unless it is a library request
            need = find_cause(e, NeedLibrary)
            if need is not None and need.name not in needs:
                needs.add(need.name)
                continue
            explained = explain_link_failure(str(e), tuple(libs.items()))
            if explained is not None:
                raise explained from e
            raise
    raise RuntimeError("device libraries kept changing while compiling; this is a ditron bug")


def _unpack_with_targets(tree):
    import ast

    class Rewrite(ast.NodeTransformer):
        count = 0

        def visit_With(self, node):
            self.generic_visit(node)
            prologue = []
            for item in node.items:
                target = item.optional_vars
                if isinstance(target, (ast.Tuple, ast.List)):
                    Rewrite.count += 1
                    tmp = f"_ditron_with_{Rewrite.count}"
                    item.optional_vars = ast.copy_location(ast.Name(tmp, ast.Store()), target)
                    for i, elt in enumerate(target.elts):
                        value = ast.Subscript(ast.Name(tmp, ast.Load()), ast.Constant(i), ast.Load())
                        prologue.append(ast.copy_location(ast.Assign([elt], value), target))
            if prologue:
                node.body[:0] = prologue
                ast.fix_missing_locations(node)
            return node

    return Rewrite().visit(tree)


class DitronJITFunction(_compat.JITFunction):
    """A ``triton.runtime.JITFunction`` with ditron's library handling."""

    def __init__(self, fn, **kwargs):
        super().__init__(fn, **kwargs)
        self._needs: dict[str, set] = {}
        self.dist_ir = None
        self._linted = False

    def parse(self):
        """Triton's AST of the function, with ``with f() as (a, b):`` (tuple
        targets, as Triton-distributed's ``dl.simt_exec_region`` uses) turned
        into ``with f() as tmp:`` + ``a = tmp[0]`` ..., which stock Triton's
        code generator compiles."""
        return _unpack_with_targets(super().parse())

    def _target(self):
        from triton.runtime import driver
        return parse_target(driver.active.get_current_target())

    def run(self, *args, grid, warmup, **kwargs):
        target = self._target()
        needs = self._needs.setdefault(target.backend, set())
        user_libs = kwargs.pop("extern_libs", None)
        name = self.__name__ if hasattr(self, "__name__") else self.fn.__name__
        if not warmup:
            from .runtime.world import check_kernel_args, current_world
            world = current_world(required=False)
            if world is not None:
                if world.backend == "sim":
                    from .errors import DitronError
                    raise DitronError(f"kernel {name} was defined for GPUs, but the world is simulated: the "
                                      "simulator needs TRITON_INTERPRET=1 before kernels are defined (start the "
                                      "script with `ditron sim`)")
                check_kernel_args(self, args, kwargs, world)
                world.transport.before_launch(self, args)

        def once(libs):
            with recording(name, target.name) as module:
                result = _compat.JITFunction.run(self, *args, grid=grid, warmup=warmup, extern_libs=libs, **kwargs)
            if module.ops:
                self.dist_ir = module
                if not self._linted:            # once per kernel: the lint reads the source, not the binary
                    self._linted = True
                    from . import lint
                    lint.report(name, lint.lint(self, module, kwargs), stacklevel=5)
            return result

        return compile_with_libraries(once, target, needs, user_libs)


def jit(fn=None, **kwargs):
    """Decorate a kernel: ``@ditron.jit`` or ``@ditron.jit(do_not_specialize=[...], ...)``.

    Takes the options of ``triton.jit``.  Under ``TRITON_INTERPRET=1`` the
    kernel runs on Triton's interpreter through the simulator's executor
    (:class:`ditron.sim.executor.SimKernel`): programs run concurrently, so
    producer/consumer protocols between programs complete.
    """
    unknown = set(kwargs) - _compat.jit_kwargs_signature()
    if unknown:
        raise TypeError(f"ditron.jit got unknown option(s) {sorted(unknown)}; it takes triton.jit's options: "
                        f"{sorted(_compat.jit_kwargs_signature())}")

    def decorator(f):
        if _compat.interpreter_enabled():
            from .sim import access, race  # noqa: F401 -- the executor's observers provide themselves
            from .sim.executor import SimKernel
            opts = {k: v for k, v in kwargs.items() if k in ("version", "repr", "launch_metadata", "do_not_specialize",
                                                             "do_not_specialize_on_alignment", "debug",
                                                             "noinline")}
            return SimKernel(f, **opts)
        return DitronJITFunction(f, **kwargs)

    return decorator(fn) if fn is not None else decorator
