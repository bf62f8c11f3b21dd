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

import dataclasses
from collections import defaultdict

from . import _compat
from .ir import recording
from .libs import NeedLibrary, explain_link_failure
from .lowering.common import link_library
from .target import parse_target
from .runtime import world as _world_module
from .runtime.world import check_kernel_args
from .lowering.cuda import _OVERRIDE
from triton.runtime.driver import driver as _driver

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
    """A ``triton.runtime.JITFunction`` with ditron's library handling.

    The launch path costs what Triton's does plus one frame and two compares.  The device libraries a kernel
    links depend on the compile variant (the world's transport and bounded waits, or an explicit
    ``compile_variant``) and are attached when Triton compiles (:meth:`_do_compile`), not passed on every
    launch: each variant has its own set of Triton's per-device caches (``device_caches``), chosen when the
    world or the variant changes (:meth:`_switch_state`), so a kernel compiled for one variant is never launched
    under another.  Tracing work (the distributed IR, the lint) runs only when Triton compiles.
    ``DITRON_DEBUG=1`` adds nothing here (cross-rank checks live in the zoo's ops)."""

    def __init__(self, fn, **kwargs):
        super().__init__(fn, **kwargs)
        self._needs: dict[str, set] = {}
        self.dist_ir = None
        self._linted = False
        self._caches = {}                 # compile variant -> Triton's device_caches for it
        self._state = (None, None, None)  # (world generation, id(world), compile override) of device_caches
        self.libraries = None             # extern_libs of the last compilation (ditron's, the user's, Triton's)

    def parse(self):
        """Triton's AST of the function, with ``with f() as (a, b):`` (tuple
        targets, as Triton-distributed's ``dl.simt_exec_region`` uses) turned
        into ``with f() as tmp:`` + ``a = tmp[0]`` ..., which stock Triton's
        code generator compiles."""
        return _unpack_with_targets(super().parse())

    def _target(self):
        return parse_target(_driver.active.get_current_target())

    def _switch_state(self, world, override):
        """The world or the compile variant changed since the last launch: use Triton's caches of the variant
        now in force (made on its first use).  Keyed by the variant and the environment that locates the
        libraries, never by the world object (a finalized world's heap must be freed); a new world with the
        same variant finds its kernels compiled."""
        import os
        if world is not None and world.backend == "sim":
            from .errors import DitronError
            raise DitronError(f"kernel {self._name()} was defined for GPUs, but the world is simulated: the "
                              "simulator needs TRITON_INTERPRET=1 before kernels are defined (start the "
                              "script with `ditron sim`)")
        from .lowering import cuda
        variant = (cuda.current_variant(), tuple(os.environ.get(k) for k in _LIB_ENV))
        caches = self._caches.get(variant)
        if caches is None:
            if len(self._caches) >= 8:     # variants and environments come and go: keep it small
                self._caches.clear()
            caches = self._caches[variant] = defaultdict(self.create_binder)
        self.device_caches = caches
        self._state = (_world_module._GEN, id(world), override)

    def _name(self):
        return self.__name__ if hasattr(self, "__name__") else self.fn.__name__

    def __getitem__(self, grid):
        """``kernel[grid](...)``: launch (see :meth:`_launcher`)."""
        return self._launcher(grid, False)

    def run(self, *args, grid, warmup, **kwargs):
        """Triton's entry point (``warmup``, ``@triton.autotune`` and other callers of ``run``)."""
        return self._launcher(grid, warmup)(*args, **kwargs)

    def _launcher(self, grid, warmup):
        """The launch function of ``grid``: one frame between the caller and Triton's ``run`` (as Triton's
        own ``kernel[grid]``); the caches of the compile variant are found by comparing three values with
        the last launch's."""
        def launch(*args, **kwargs):
            if "extern_libs" in kwargs:
                return self._run_with_user_libs(args, grid, warmup, kwargs)
            world = _world_module._WORLD
            override = _OVERRIDE.get()
            state = self._state
            if state[0] != _world_module._GEN or state[1] != id(world) or state[2] is not override:
                self._switch_state(world, override)
            if world is not None and not warmup:
                check_kernel_args(self, args, kwargs, world)
                world.transport.before_launch(self, args, _driver.active.get_current_device())
            try:
                return _JITRun(self, *args, grid=grid, warmup=warmup, **kwargs)
            except Exception as e:  # noqa: BLE001 -- re-raised unless it is a library request
                self._after_failure(e)
            return self._retry(args, grid, warmup, kwargs)
        return launch

    def _retry(self, args, grid, warmup, kwargs):
        """The kernel asked for a device library it did not have: launch again (the compilation attaches it)."""
        for _ in range(_MAX_LIBRARY_RETRIES):
            try:
                return _JITRun(self, *args, grid=grid, warmup=warmup, **kwargs)
            except Exception as e:  # noqa: BLE001 -- re-raised unless it is a library request
                self._after_failure(e)
        raise RuntimeError("device libraries kept changing while compiling; this is a ditron bug")

    def _after_failure(self, e):
        """A failed launch: when tracing asked for a device library the kernel did not have, remember the need
        (the next compilation attaches it); otherwise re-raise, explained where a library could not be linked."""
        need = find_cause(e, NeedLibrary)
        target = self._target()
        needs = self._needs.setdefault(target.backend, set())
        if need is not None and need.name not in needs:
            needs.add(need.name)
            return
        explained = explain_link_failure(str(e), tuple((self.libraries or {}).items()))
        if explained is not None:
            raise explained from e
        raise e

    def _run_with_user_libs(self, args, grid, warmup, kwargs):
        """A launch with the caller's own ``extern_libs`` (rare): the libraries are looked up per launch."""
        target = self._target()
        needs = self._needs.setdefault(target.backend, set())
        user_libs = kwargs.pop("extern_libs")
        world = _world_module._WORLD
        self._switch_state(world, _OVERRIDE.get())
        if world is not None and not warmup:
            check_kernel_args(self, args, kwargs, world)
            world.transport.before_launch(self, args, _driver.active.get_current_device())

        def once(libs):
            return _compat.JITFunction.run(self, *args, grid=grid, warmup=warmup, extern_libs=libs, **kwargs)

        return compile_with_libraries(once, target, needs, user_libs)

    def _pack_args(self, backend, kwargs, bound_args, specialization, options):
        """Triton parses the launch's options where it compiles (a launch found no binary in its in-memory cache):
        ditron's ``enable_fp_fusion`` where the launch passed none (``_compat.fp_fusion_default``: FMA contraction
        on under every Triton, as ``ditron.compile``), not Triton's own default, which turns off in 3.10."""
        return super()._pack_args(backend, _compat.with_fp_fusion(kwargs), bound_args, specialization, options)

    def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        """Triton compiles (a launch found no binary in its in-memory cache): trace under a recording of the
        distributed IR, keep it (``dist_ir``), and lint the kernel once."""
        name = self._name()
        target = parse_target(self.device_caches[device][2])
        libs = library_options(target, self._needs.setdefault(target.backend, set()))
        lib = devlib_for(target)
        if lib.name in libs:
            lib.path()    # its file again, if a cache cleaner took it since the libraries were looked up
        for k, v in getattr(options, "extern_libs", None) or ():
            libs.setdefault(k, v)        # the user's, then Triton's own (libdevice / ocml, ockl) after ditron's
        options = dataclasses.replace(options, extern_libs=tuple(libs.items()))
        self.libraries = libs
        with recording(name, target.name) as module:
            kernel = super()._do_compile(key, signature, device, constexprs, options, attrs, warmup)
        if module.ops:
            self.dist_ir = module
            if not self._linted:            # once per kernel: the lint reads the source, not the binary
                self._linted = True
                from . import lint
                consts = {p.name: constexprs[(p.num,)] for p in self.params
                          if p.is_constexpr and (p.num,) in constexprs}
                lint.report(name, lint.lint(self, module, consts), stacklevel=6)
        return kernel


_JITRun = _compat.JITFunction.run


def check_jit_options(who, kwargs):
    """``triton.jit``'s options only (``who``: the decorator, for the message)."""
    unknown = set(kwargs) - _compat.jit_kwargs_signature()
    if unknown:
        raise TypeError(f"{who} got unknown option(s) {sorted(unknown)}; it takes triton.jit's options: "
                        f"{sorted(_compat.jit_kwargs_signature())}")


def jit(fn=None, **kwargs):
    """Decorate a kernel: ``@ditron.jit`` or ``@ditron.jit(do_not_specialize=[...], ...)``.

    Takes the options of ``triton.jit``.  Under ``TRITON_INTERPRET=1`` the
    kernel runs on Triton's interpreter through the simulator's executor
    (:class:`ditron.sim.executor.SimKernel`): programs run concurrently, so
    producer/consumer protocols between programs complete.
    """
    check_jit_options("ditron.jit", kwargs)

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
