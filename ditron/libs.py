"""Finding OpenSHMEM device libraries (NVSHMEM, rocSHMEM) and checking that
the installed Triton can link them.  Nothing here touches a GPU.
"""
from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import sysconfig

from . import _compat
from .errors import DitronCompileError, LibraryError

NVSHMEM_LIB = "libnvshmem_device"     # key in Triton's extern_libs
ROCSHMEM_LIB = "rocshmem"             # AMD links a library when a called symbol contains its key

#: (Triton version prefix, NVSHMEM version) pairs seen to link; and pairs seen to fail
KNOWN_GOOD = [("3.6", "3.4.5"), ("3.9", "3.4.5"), ("3.9", "3.8.0")]
#: Triton versions that CI runs the whole test suite on (.ci/run: 3.6.0 pinned, and the newest pip resolves)
CI_TESTED_TRITON = ("3.6.0", "3.9.0")
KNOWN_BAD = [("3.6", "3.8.0")]


class NeedLibrary(Exception):
    """Raised while tracing when a kernel calls into a device library that the
    compilation did not attach; the JIT / compile driver attaches it and
    compiles again (libraries are attached only to kernels that call them)."""

    def __init__(self, name):
        super().__init__(f"kernel needs device library {name}")
        self.name = name


def _site_dirs():
    dirs = []
    for key in ("purelib", "platlib"):
        d = sysconfig.get_path(key)
        if d and d not in dirs:
            dirs.append(d)
    try:
        import nvidia  # namespace package of NVIDIA's pip wheels
        for d in getattr(nvidia, "__path__", []):
            parent = os.path.dirname(d)
            if parent not in dirs:
                dirs.append(parent)
    except ImportError:
        pass
    return dirs


def nvshmem_bitcode() -> str | None:
    """Path of ``libnvshmem_device.bc``: ``DITRON_NVSHMEM_BC``, then
    ``NVSHMEM_HOME/lib``, then the nvidia-nvshmem-cu12/cu13 pip package."""
    env = os.environ.get("DITRON_NVSHMEM_BC")
    if env:
        return env
    home = os.environ.get("NVSHMEM_HOME")
    if home:
        for cand in (os.path.join(home, "lib", "libnvshmem_device.bc"), os.path.join(home, "libnvshmem_device.bc")):
            if os.path.exists(cand):
                return cand
    for d in _site_dirs():
        lib = os.path.join(d, "nvidia", "nvshmem", "lib")
        # NVSHMEM <= 3.4 ships one bitcode; newer releases one per architecture
        for name in ("libnvshmem_device.bc", "libnvshmem_device_sm_90.bc"):
            if os.path.exists(os.path.join(lib, name)):
                return os.path.join(lib, name)
    return None


def nvshmem_version() -> str | None:
    for dist in ("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def rocshmem_bitcode() -> str | None:
    env = os.environ.get("DITRON_ROCSHMEM_BC")
    if env:
        return env
    home = os.environ.get("ROCSHMEM_HOME")
    if home:
        for cand in glob.glob(os.path.join(home, "lib", "*rocshmem*.bc")):
            return cand
    return None


def shmem_library(target):
    """(name, path) of the OpenSHMEM device library for ``target``; raises a
    :class:`DitronCompileError` that says how to get it when it is missing."""
    if target.backend == "cuda":
        path = nvshmem_bitcode()
        if path is None or not os.path.exists(path):
            where = f" ({path} does not exist)" if path else ""
            raise LibraryError(f"shmem.* on {target.name} needs NVSHMEM's device bitcode libnvshmem_device.bc{where}: "
                               "pip install nvidia-nvshmem-cu13 (or -cu12), or set NVSHMEM_HOME / DITRON_NVSHMEM_BC")
        return NVSHMEM_LIB, path
    if target.backend == "hip":
        path = rocshmem_bitcode()
        if path is None or not os.path.exists(path):
            raise LibraryError(f"shmem.* on {target.name} needs the rocSHMEM device bitcode, which was not found: "
                               "set DITRON_ROCSHMEM_BC to its .bc file (or ROCSHMEM_HOME). Tile- and thread-level "
                               "primitives (dl.*) need no library on AMD")
        return ROCSHMEM_LIB, path
    raise LibraryError(f"no OpenSHMEM library for target {target.name}")


def explain_link_failure(message: str, extern_libs) -> Exception | None:
    """Turn Triton's 'Failed to parse library at PATH' into an error that names
    the versions that work together."""
    m = re.search(r"Failed to parse library at (\S+)", message)
    if not m:
        return None
    path = m.group(1)
    names = {p: n for n, p in (extern_libs or ())}
    name = names.get(path, "")
    if name != NVSHMEM_LIB and "nvshmem" not in path:
        return LibraryError(f"Triton {_compat.triton.__version__} could not read the device library {path}")
    good = "; ".join(f"Triton {t}.x + nvidia-nvshmem {n}" for t, n in KNOWN_GOOD)
    from_pkg = os.path.join("nvidia", "nvshmem", "lib") in path and nvshmem_version()
    which = f" (from the installed nvidia-nvshmem {from_pkg})" if from_pkg else ""
    return LibraryError(
        f"Triton {_compat.triton.__version__}'s LLVM cannot read the NVSHMEM device bitcode {path}{which}: "
        f"it was probably written by a newer LLVM. Versions known to work: {good}. "
        "Install a matching nvidia-nvshmem-cu13 (e.g. pip install nvidia-nvshmem-cu13==3.4.5 for Triton 3.6) "
        "or point DITRON_NVSHMEM_BC / NVSHMEM_HOME at a compatible build.")


def compatibility_report():
    """Lines for ``ditron doctor``."""
    path = nvshmem_bitcode()
    ver = nvshmem_version()
    tv = _compat.triton.__version__
    status = "not found"
    if path and os.path.exists(path):
        status = "unknown compatibility"
        for t, n in KNOWN_GOOD:
            if tv.startswith(t) and ver == n:
                status = "known to work"
        for t, n in KNOWN_BAD:
            if tv.startswith(t) and ver == n:
                status = "KNOWN NOT TO WORK (Triton's LLVM cannot parse it)"
    return {"nvshmem_bitcode": path, "nvshmem_version": ver, "nvshmem_status": status,
            "rocshmem_bitcode": rocshmem_bitcode()}


__all__ = ["NVSHMEM_LIB", "ROCSHMEM_LIB", "NeedLibrary", "nvshmem_bitcode", "nvshmem_version", "rocshmem_bitcode",
           "shmem_library", "explain_link_failure", "compatibility_report", "DitronCompileError"]
