"""Ahead-of-time compilation without a GPU: ``ditron.compile``.

    ck = ditron.compile(kernel, target="sm_90a", signature={"x": "*fp16", "n": "i32", "BLOCK": "constexpr"},
                        constexprs={"BLOCK": 1024})
    ck.asm["dist_ir"], ck.asm["ttir"], ck.asm["ptx"], ck.asm["cubin"]

Works for ``sm_90a``/``sm_90`` (PTX + cubin through Triton's bundled ptxas) and
``gfx942`` (AMDGCN + hsaco through Triton's bundled LLVM / lld) on a machine
with no GPU and no ROCm.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import _compat
from .errors import DitronCompileError
from .ir import Module, recording
from .jit import compile_with_libraries
from .target import Target, parse_target


@dataclass
class CompiledKernel:
    """The result of :func:`compile`: ``asm`` maps a stage name (``dist_ir``,
    ``ttir``, ``ttgir``, ``llir``, ``ptx``/``cubin`` or ``amdgcn``/``hsaco``) to
    its text or bytes."""
    name: str
    target: Target
    asm: dict
    dist_ir: Module
    libraries: list = field(default_factory=list)
    triton_kernel: object = None
    #: findings of the compile-time lint (:mod:`ditron.lint`), also issued as DitronLintWarning
    lint: list = field(default_factory=list)

    @property
    def metadata(self):
        return getattr(self.triton_kernel, "metadata", None)


def _as_jit_function(kernel):
    if isinstance(kernel, _compat.JITFunction):
        return kernel
    if callable(kernel):
        from .jit import DitronJITFunction
        return DitronJITFunction(kernel)
    raise DitronCompileError(f"ditron.compile expects a @ditron.jit kernel, got {type(kernel).__name__}")


def normalize_signature(fn, signature, constexprs):
    """Complete a signature: every parameter needs a type string; parameters
    given in ``constexprs`` may be left out (they become ``"constexpr"``)."""
    params = _compat.jit_function_params(fn)
    if isinstance(signature, (list, tuple)):
        if len(signature) != len(params):
            raise DitronCompileError(f"signature lists {len(signature)} types for {len(params)} parameters "
                                     f"{params}")
        signature = dict(zip(params, signature))
    signature = dict(signature or {})
    constexprs = dict(constexprs or {})
    unknown = sorted((set(signature) | set(constexprs)) - set(params))
    if unknown:
        raise DitronCompileError(f"kernel {fn.__name__} has no parameter(s) {unknown}; its parameters are {params}")
    for name in constexprs:
        signature.setdefault(name, "constexpr")
    missing = [p for p in params if p not in signature]
    if missing:
        raise DitronCompileError(f"signature of {fn.__name__} is missing parameter(s) {missing} "
                                 f"(give a type such as '*fp16' or 'i32', or a value in constexprs)")
    for name, ty in signature.items():
        if ty == "constexpr" and name not in constexprs:
            raise DitronCompileError(f"parameter {name!r} is constexpr but has no value in constexprs")
    ordered = {p: signature[p] for p in params}
    return ordered, {(params.index(k),): v for k, v in constexprs.items()}


def compile(kernel, target="sm_90a", signature=None, constexprs=None, attrs=None, *, aligned=True,
            extern_libs=None, **options):
    """Compile ``kernel`` for ``target`` without launching it.

    ``signature``: parameter name -> Triton type string (``"*fp16"``, ``"i32"``,
    ``"constexpr"``), as for Triton's ``ASTSource``.  ``constexprs``: values of
    constexpr parameters.  ``aligned`` (default True) tells the compiler that
    pointer arguments are 16-byte aligned, as they are for tensors from torch;
    ``attrs`` overrides per-argument attributes.  Other keywords are backend
    options: every field of the installed Triton's ``CUDAOptions`` / ``HIPOptions`` (``num_warps``,
    ``num_stages``, ``maxnreg``, ``matrix_instr_nonkdim``, ``waves_per_eu``, ...); others are an error
    that lists the valid ones.
    """
    fn = _as_jit_function(kernel)
    tgt = parse_target(target)
    if tgt.backend == "sim":
        raise DitronCompileError("the 'sim' target has no binary: run the kernel under `ditron sim` instead",
                                 target="sim")
    known = _compat.backend_option_names(tgt.backend)
    unknown = set(options) - set(known)
    if unknown:
        raise DitronCompileError(f"unknown compile option(s) {sorted(unknown)} for {tgt.name} (Triton's "
                                 f"{tgt.backend} backend); valid options: {sorted(known)}", target=tgt.name)
    sig, cexprs = normalize_signature(fn, signature, constexprs)
    if attrs is None:
        attrs = {}
        if aligned:
            for i, ty in enumerate(sig.values()):
                if isinstance(ty, str) and ty.startswith("*"):
                    attrs[(i,)] = _compat.divisibility_attr(16)
    name = fn.__name__ if hasattr(fn, "__name__") else fn.fn.__name__
    needs = set()

    def once(libs):
        src = _compat.ast_source(fn, sig, cexprs, attrs)
        with recording(name, tgt.name) as module, _compat.always_compile():
            ck = _compat.compile_source(src, tgt.to_triton(), dict(options, extern_libs=libs))
        return ck, module

    ck, module = compile_with_libraries(once, tgt, needs, extern_libs)
    asm = dict(ck.asm)
    asm["dist_ir"] = module.text()
    from . import lint
    findings = lint.lint(fn, module, constexprs) if module.ops else []
    lint.report(name, findings)
    return CompiledKernel(name=name, target=tgt, asm=asm, dist_ir=module, libraries=sorted(needs), triton_kernel=ck,
                          lint=findings)
