"""Triton-distributed's import names, provided by ditron.

A Triton-distributed program ports to ditron by installing ditron instead of
Triton-distributed: ``import triton_dist``, ``triton_dist.jit``,
``triton_dist.language`` (as ``dl``), ``triton_dist.language.extra``
(``libshmem_device``, ``language_extra``, ``cuda.language_extra``,
``cuda.libnvshmem_device``) and ``triton_dist.utils`` (symmetric tensors,
barriers, rank queries) are thin aliases of ditron's own implementation
(``ditron.language``, ``ditron.language.extra``, ``ditron.language.shmem``,
``ditron.runtime``).  What differs, and every kernel body that has to change,
is in docs/porting.md.

This package is ditron's, not Triton-distributed's: it cannot be installed
next to Triton-distributed (both own the name ``triton_dist``).
"""
from ditron import aliases as _aliases
from ditron import jit

_aliases.install()

__all__ = ["jit", "language", "utils"]


def __getattr__(name):
    if name in ("language", "utils", "kernels"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'triton_dist' has no attribute {name!r} (ditron provides triton_dist.jit, "
                         "triton_dist.language and triton_dist.utils; see docs/porting.md)")
