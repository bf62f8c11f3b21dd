"""Host modules of NVSHMEM / rocSHMEM that Triton-distributed's scripts import
(``import nvshmem.core``, ``pynvshmem``, ``pyrocshmem``), under ``ditron sim``.

The simulator needs none of them.  When one is not installed (that is the
environment, not ditron), importing it raises :class:`HostModuleNotInstalled`,
a ``ModuleNotFoundError`` whose message is the two-line port, and
``ditron sim`` prints that one line instead of a traceback.  When the module
*is* installed, this finder steps aside and the real module imports.
"""
from __future__ import annotations

import importlib.abc
import sys

_TOPS = {
    "nvshmem": ("nvshmem4py (import nvshmem.core)", "nvshmem.core.finalize()"),
    "pynvshmem": ("pynvshmem", "pynvshmem.nvshmem_finalize()"),
    "pyrocshmem": ("pyrocshmem", "pyrocshmem.rocshmem_finalize()"),
}


class HostModuleNotInstalled(ModuleNotFoundError):
    """An NVSHMEM / rocSHMEM host module that this environment does not have."""


def message(fullname: str) -> str:
    top = fullname.split(".")[0]
    pkg, fin = _TOPS[top]
    return (f"{pkg} is not installed in this environment; ditron sim needs none of it: port in two lines, delete "
            f"`import {top if top != 'nvshmem' else 'nvshmem.core'}` and `{fin}` (ditron frees its heap in "
            "`triton_dist.utils.finalize_distributed()` or at exit; docs/porting.md section 3.1)")


class HostModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in _TOPS or fullname in sys.modules:
            return None
        for finder in sys.meta_path:            # the real module, when installed, always wins
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except ImportError:
                spec = None
            if spec is not None:
                return spec
        raise HostModuleNotInstalled(message(fullname), name=fullname)


def install():
    if not any(isinstance(f, HostModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, HostModuleFinder())
