"""``triton_dist.kernels``: Triton-distributed's kernel library, which ditron
does not ship.  ditron has its own kernel zoo, ``ditron.kernels``
(docs/zoo.md).  Importing anything under this name (``from
triton_dist.kernels.nvidia.allgather_gemm import create_ag_gemm_context``,
``from triton_dist.kernels.nvidia import create_ag_gemm_context``, ...) raises
:class:`KernelLibraryNotProvided`, an ``ImportError`` whose message names the
zoo's equivalent (or the runtime call that replaces a ``common_ops`` helper).

The package itself (and its ``nvidia`` / ``amd`` / ``metax`` sub-packages)
import, empty, only so that the error can name the module or the attribute
asked for; nothing in them is usable.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__path__: list = []          # no submodules on disk: the finder below answers every one of them

_PACKAGES = ("triton_dist.kernels.nvidia", "triton_dist.kernels.amd", "triton_dist.kernels.metax")

# (substrings of the module or attribute name, ditron's equivalent), first match wins
_ZOO = [
    (("allgather_group_gemm", "ag_moe", "threadblock_swizzle_ag_moe"),
     "ditron.kernels.create_ag_moe_context / ag_moe"),
    (("moe_reduce_rs", "moe_rs"), "ditron.kernels.create_moe_rs_context / moe_rs"),
    (("moe_reduce_ar", "moe_ar"), "ditron.kernels.create_moe_ar_context / moe_ar"),
    (("allgather_gemm", "ag_gemm"), "ditron.kernels.create_ag_gemm_context / ag_gemm"),
    (("gemm_reduce_scatter", "gemm_rs"), "ditron.kernels.create_gemm_rs_context / gemm_rs"),
    (("gemm_allreduce", "gemm_ar"), "ditron.kernels.create_gemm_ar_context / gemm_ar"),
    (("reduce_scatter", "ring_reduce"), "ditron.kernels.create_reduce_scatter_context / reduce_scatter"),
    (("allgather", "all_gather"), "ditron.kernels.create_all_gather_context / all_gather"),
    (("allreduce", "all_reduce"), "ditron.kernels.create_all_reduce_context / all_reduce"),
    (("ep_a2a", "ep_all2all", "low_latency_all_to_all", "ep_"),
     "ditron.kernels.create_ep_context / ep_dispatch / ep_combine"),
    (("all_to_all", "a2a", "all2all", "ulysses", "ulysess"),
     "ditron.kernels.create_all_to_all_context / all_to_all / all_to_all_v"),
    (("flash_decode",), "ditron.kernels.create_flash_decode_context / flash_decode"),
    (("sp_ag_attention",), "ditron.kernels.create_ring_attention_context / ring_attention"),
    (("group_gemm",), "ditron.kernels.grouped_gemm"),
    (("gemm",), "ditron.kernels.matmul"),
    (("common_ops", "barrier", "wait_eq", "set_signal", "memory_ops", "memcpy", "p2p"),
     "ditron.barrier_all(stream) for barrier_all_on_stream / barrier_all_intra_node_*, "
     "ditron.stream_write_value / ditron.stream_wait_value for set_signal / wait_eq on a stream, "
     "ditron.rank_copy for peer copies; inside kernels dl.wait / dl.notify"),
]


def equivalent(name: str):
    """ditron's replacement for a Triton-distributed kernel module or name, or None."""
    low = name.lower()
    for keys, what in _ZOO:
        if any(k in low for k in keys):
            return what
    return None


class KernelLibraryNotProvided(ImportError):
    """``triton_dist.kernels...`` asked for: ditron does not ship it."""


def _error(name: str) -> KernelLibraryNotProvided:
    what = equivalent(name)
    hint = f"use {what}" if what else "see ditron.kernels (docs/zoo.md) for the collectives and overlapped kernels"
    return KernelLibraryNotProvided(
        f"{name}: ditron does not ship Triton-distributed's kernel library (triton_dist.kernels); {hint} "
        "(docs/porting.md section 3.2)", name=name)


def _stub_package(fullname: str):
    mod = types.ModuleType(fullname, f"{fullname}: not provided by ditron (see triton_dist.kernels)")
    mod.__path__ = []

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise _error(f"{fullname}.{attr}")
    mod.__getattr__ = __getattr__
    return mod


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        if fullname in _PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        raise _error(fullname)

    def create_module(self, spec):
        return _stub_package(spec.name)

    def exec_module(self, module):
        pass


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    if f"{__name__}.{attr}" in _PACKAGES:       # triton_dist.kernels.nvidia.<name>: the error names <name>
        import importlib
        return importlib.import_module(f"{__name__}.{attr}")
    raise _error(f"{__name__}.{attr}")


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
