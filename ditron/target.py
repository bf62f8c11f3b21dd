"""Compilation targets: ``sm_90a`` / ``sm_90`` (NVIDIA), ``gfx942`` (AMD), ``sim``.

A :class:`Target` is what lowering rules are keyed by (``backend``) and what
error messages name (``name``).  Parsing never touches a GPU.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from . import _compat
from .errors import DitronCompileError

BACKENDS = ("cuda", "hip", "sim")


@dataclass(frozen=True)
class Target:
    backend: str          # "cuda" | "hip" | "sim"
    arch: object          # int capability (cuda: 90), str (hip: "gfx942"), None (sim)
    warp_size: int

    @property
    def name(self) -> str:
        if self.backend == "cuda":
            return f"sm_{self.arch}a" if self.arch in (90, 100, 101, 120) else f"sm_{self.arch}"
        if self.backend == "hip":
            return str(self.arch)
        return "sim"

    def __str__(self):
        return self.name

    @property
    def capability(self) -> int:
        return int(self.arch) if self.backend == "cuda" else 0

    def to_triton(self):
        if self.backend == "sim":
            raise DitronCompileError("the simulator target runs kernels through Triton's interpreter; "
                                     "it has no binary to compile", target="sim")
        return _compat.gpu_target(self.backend, self.arch, self.warp_size)


_SM = re.compile(r"^sm_?(\d+)(a?)$")
_GFX = re.compile(r"^gfx[0-9a-f]{3,4}$")


#: what :func:`parse_target` accepts, for help texts and errors
ACCEPTED = "sm_NN or sm_NNa with NN >= 70 (e.g. sm_90a, sm_90, sm_80), gfxNNN (e.g. gfx942, gfx90a) or sim"


def parse_target(spec) -> Target:
    """``"sm_90a"``, ``"sm_90"``, ``"gfx942"``, ``"sim"``, a :class:`Target` or
    a Triton ``GPUTarget``."""
    if isinstance(spec, Target):
        return spec
    if hasattr(spec, "backend") and hasattr(spec, "arch") and hasattr(spec, "warp_size"):
        return Target(spec.backend, spec.arch, spec.warp_size)
    s = str(spec).strip().lower()
    if s == "sim":
        return Target("sim", None, 1)
    m = _SM.match(s)
    if m:
        cap = int(m.group(1))
        if cap < 70:
            raise DitronCompileError(f"NVIDIA target {spec!r} is older than sm_70 (Volta); ditron's memory-model "
                                     "primitives need sm_70 or newer")
        return Target("cuda", cap, 32)
    if _GFX.match(s):
        return Target("hip", s, 64 if s.startswith("gfx9") else 32)
    raise DitronCompileError(f"unknown target {spec!r}; accepted: {ACCEPTED}")


def target_from_semantic(sem) -> Target:
    """The target of the kernel being traced, read from the backend options."""
    if _compat.is_interpreter(sem):
        return Target("sim", None, 1)
    opts = _compat.builder_options(sem)
    backend = getattr(opts, "backend_name", None)
    arch = getattr(opts, "arch", None)
    if backend == "cuda":
        m = re.match(r"sm_?(\d+)", str(arch or ""))
        return Target("cuda", int(m.group(1)) if m else 90, 32)
    if backend == "hip":
        return Target("hip", str(arch), int(getattr(opts, "warp_size", 64) or 64))
    raise DitronCompileError(f"unsupported Triton backend {backend!r}")
