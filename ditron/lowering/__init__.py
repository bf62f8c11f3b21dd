"""Lowering rules: one per (distributed-IR op, backend).

A rule is a function ``rule(ctx, **operands, **attrs)`` that emits Triton IR
(through ``ctx``) for one verified :class:`~ditron.ir.Op` and returns its
result (or ``None``).  Rules live in one module per backend:

* :mod:`ditron.lowering.cuda` -- NVIDIA: inline PTX, the ditron device
  library, NVSHMEM device functions;
* :mod:`ditron.lowering.hip`  -- AMD: LLVM atomics in the device library,
  rocSHMEM device functions;
* :mod:`ditron.lowering.sim`  -- the CPU simulator (Triton's interpreter).

:func:`lookup` imports the backend module on first use and raises
:class:`~ditron.errors.LoweringError` naming the op and the target when no
rule exists -- never a silent fallback.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from .. import _compat
from ..errors import DitronCompileError, LoweringError

_RULES: dict[tuple[str, str], Callable] = {}
_LOADED: set[str] = set()
_PROVIDERS: dict[str, Callable] = {}


def provide(name: str, fn: Callable):
    """Let rules read run-time state owned by a layer above lowering, which
    lowering never imports: :mod:`ditron.runtime.world` provides ``"world"``
    (the current :class:`~ditron.runtime.world.World` or ``None``),
    :mod:`ditron.sim.executor` provides ``"program"`` and ``"launch"`` (the
    simulated program / launch running on this thread)."""
    _PROVIDERS[name] = fn


def provided(name: str):
    """The value ``name``'s provider returns now; ``None`` when its layer is
    not loaded (then nothing of it can be active)."""
    fn = _PROVIDERS.get(name)
    return None if fn is None else fn()


def register(kind: str, backend: str):
    """Decorator: ``fn`` lowers op ``kind`` on ``backend``."""

    def deco(fn):
        key = (kind, backend)
        if key in _RULES and _RULES[key] is not fn:
            raise RuntimeError(f"two lowering rules for {kind} on {backend}")
        _RULES[key] = fn
        return fn

    return deco


def _load(backend: str):
    if backend not in _LOADED:
        importlib.import_module(f"{__name__}.{backend}")
        _LOADED.add(backend)


def lookup(kind: str, target) -> Callable:
    _load(target.backend)
    rule = _RULES.get((kind, target.backend))
    if rule is None:
        raise LoweringError(f"no lowering rule for this op on the {target.backend} backend", op=kind,
                            target=target.name)
    return rule


def rules_for(backend: str) -> dict[str, Callable]:
    _load(backend)
    return {k: v for (k, b), v in _RULES.items() if b == backend}


@dataclass
class LoweringContext:
    """What a rule may use: the semantic layer (``sem``), the code generator
    (``gen``), the target and the op being lowered."""
    sem: Any
    gen: Any
    target: Any
    op: Any

    # -- diagnostics -----------------------------------------------------------
    def error(self, message, arg=None):
        return DitronCompileError(message, op=self.op.kind, arg=arg, target=self.target.name, loc=self.op.loc)

    # -- options of the kernel being compiled -------------------------------------
    @property
    def options(self):
        return _compat.builder_options(self.sem)

    @property
    def num_warps(self) -> int:
        return int(getattr(self.options, "num_warps", 4) or 4)

    @property
    def num_threads(self) -> int:
        return self.num_warps * self.target.warp_size

    def has_library(self, name: str) -> bool:
        libs = getattr(self.options, "extern_libs", None) or ()
        return any(n == name for n, _ in libs)

    # -- emission helpers ------------------------------------------------------------
    def asm(self, asm, constraints, args, dtype, *, is_pure=False, pack=1):
        return _compat.inline_asm(self.sem, asm, constraints, args, dtype, is_pure=is_pure, pack=pack)

    def call(self, lib, symbol, args, arg_dtypes, ret_dtype, *, is_pure=False):
        """Call a function of a device library (``lib`` has ``.name`` and ``.path``)."""
        return _compat.extern_call(self.sem, lib.name, lib.path(), symbol, args, arg_dtypes, ret_dtype,
                                   is_pure=is_pure)

    def tensor(self, x):
        return _compat.to_tensor(self.sem, x)
