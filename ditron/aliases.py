"""Triton-distributed's module names under the ``triton.`` namespace.

Triton-distributed ships a Triton fork, so some of its kernels import modules
that stock Triton does not have (``triton.language.extra.cuda.language_extra``,
``triton.language.extra.libshmem_device``, ``triton.distributed.language``).
ditron never writes into Triton's installed package; instead :func:`install`
(run by ``import ditron`` and ``import triton_dist``) puts a meta-path
finder first that answers for exactly the names in :data:`ALIASES`, and only when
the installed Triton has no module of that name: the import then returns the
``triton_dist`` module (ditron's stand-in, shipped with ditron) it maps to,
the same module object under both names.

Such an import therefore works once ``ditron`` or ``triton_dist`` has been
imported (as it is in every ``@triton_dist.jit`` / ``@ditron.jit`` program,
and always under ``ditron sim``); before that, it fails as it would on stock
Triton.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

#: Triton-namespace name -> the module that provides it
ALIASES = {
    "triton.distributed": "triton_dist",
    "triton.distributed.language": "triton_dist.language",
    "triton.language.extra.libshmem_device": "triton_dist.language.extra.libshmem_device",
    "triton.language.extra.language_extra": "triton_dist.language.extra.language_extra",
    "triton.language.extra.cuda.language_extra": "triton_dist.language.extra.cuda.language_extra",
    "triton.language.extra.cuda.libnvshmem_device": "triton_dist.language.extra.cuda.libnvshmem_device",
    "triton.language.extra.hip.language_extra": "triton_dist.language.extra.hip.language_extra",
    "triton.language.extra.hip.librocshmem_device": "triton_dist.language.extra.hip.librocshmem_device",
}


_PACKAGES = ("triton_dist", "triton_dist.language")


class _Loader(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.own_spec        # the import system set it to the alias's spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the names of :data:`ALIASES`, unless the installed Triton has a
    module of that name (which then always wins).  First on ``sys.meta_path``,
    so that ``triton.distributed.language`` is the ``triton_dist.language``
    module rather than a second copy loaded from the aliased package's path."""

    def find_spec(self, fullname, path=None, target=None):
        dest = ALIASES.get(fullname)
        if dest is None:
            return None
        # (below triton.distributed, ``path`` is the aliased triton_dist package's: no check there)
        if not fullname.startswith("triton.distributed") and \
                importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
            return None
        return importlib.util.spec_from_loader(fullname, _Loader(dest), is_package=dest in _PACKAGES)


def install():
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
