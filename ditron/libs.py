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


#: the bitcode rocSHMEM builds for each GPU architecture (cmake/DeviceBitcode.cmake, installed in lib/)
ROCSHMEM_BC = "librocshmem_device_{arch}.bc"
_ROCSHMEM_ARCH_BC = re.compile(r"_(gfx[0-9a-f]+)\.bc$")
#: the rocSHMEM whose C exports ditron's rocSHMEM table was checked against (see lowering/shmem_table.py)
ROCSHMEM_SUPPORTED = "3.4.0"


def _rocshmem_dirs():
    dirs = []
    home = os.environ.get("ROCSHMEM_HOME")
    if home:
        dirs += [os.path.join(home, "lib"), home]
    rocm = os.environ.get("ROCM_PATH") or "/opt/rocm"   # ROCm releases ship rocSHMEM in $ROCM_PATH/lib
    dirs.append(os.path.join(rocm, "lib"))
    return dirs


def rocshmem_bitcode(arch: str = "gfx942") -> str | None:
    """Path of rocSHMEM's device bitcode for ``arch``: ``DITRON_ROCSHMEM_BC``,
    else ``librocshmem_device_<arch>.bc`` in ``ROCSHMEM_HOME/lib``,
    ``ROCSHMEM_HOME`` or ``$ROCM_PATH/lib`` (default /opt/rocm), else an older
    layout's single bitcode without an architecture in its name
    (``*rocshmem*.bc``).  None when there is none; a :class:`LibraryError`
    naming ``arch`` and the files found when they are all for other
    architectures (or ``DITRON_ROCSHMEM_BC`` names another architecture's)."""
    env = os.environ.get("DITRON_ROCSHMEM_BC")
    if env:
        m = _ROCSHMEM_ARCH_BC.search(os.path.basename(env))
        if m and m.group(1) != arch:
            raise LibraryError(f"DITRON_ROCSHMEM_BC={env} is rocSHMEM's device bitcode for {m.group(1)}, but the "
                               f"kernel is compiled for {arch}: point it at {ROCSHMEM_BC.format(arch=arch)}")
        return env
    found = []
    for d in _rocshmem_dirs():
        cand = os.path.join(d, ROCSHMEM_BC.format(arch=arch))
        if os.path.isfile(cand):
            return cand
        found += [f for f in sorted(glob.glob(os.path.join(d, "*rocshmem*.bc"))) if f not in found]
    generic = [f for f in found if not _ROCSHMEM_ARCH_BC.search(os.path.basename(f))]
    if generic:
        return generic[0]
    if found:
        raise LibraryError(f"no rocSHMEM device bitcode for {arch}: found only {', '.join(found)}, built for other "
                           f"architectures; build rocSHMEM with -DGPU_TARGETS={arch} (it installs "
                           f"{ROCSHMEM_BC.format(arch=arch)}) or set DITRON_ROCSHMEM_BC")
    return None


def rocshmem_version(bitcode: str) -> str | None:
    """rocSHMEM's version from the ``rocshmem_config.h`` installed with
    ``bitcode`` (``<prefix>/include/rocshmem/``, bitcode in ``<prefix>/lib``)."""
    lib = os.path.dirname(os.path.abspath(bitcode))
    for prefix in (os.path.dirname(lib), lib):
        header = os.path.join(prefix, "include", "rocshmem", "rocshmem_config.h")
        try:
            with open(header) as f:
                m = re.search(r'#define\s+ROCSHMEM_VERSION\s+"([0-9.]+)"', f.read())
        except OSError:
            continue
        if m:
            return m.group(1)
    return None


def _llvm_nm(bitcode):
    import shutil
    rocm = os.environ.get("ROCM_PATH") or "/opt/rocm"
    for cand in (os.path.join(rocm, "llvm", "bin", "llvm-nm"), shutil.which("llvm-nm")):
        if cand and os.path.isfile(cand):
            return cand
    return None


def rocshmem_missing_exports(bitcode: str, symbols, nm=None):
    """The ``symbols`` that ``bitcode`` does not define, read with ``llvm-nm``
    (ROCm's, else one on PATH); None when no llvm-nm can read it."""
    import subprocess
    nm = nm or _llvm_nm(bitcode)
    if nm is None:
        return None
    try:
        out = subprocess.run([nm, "--defined-only", "--format=just-symbols", bitcode], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    defined = set(out.stdout.split())
    return sorted(s for s in symbols if s not in defined)


def _version_tuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v or "")[:3])


def rocshmem_report(symbols, arch: str = "gfx942"):
    """(bitcode or None, one line for ``ditron doctor``); ``symbols``: the
    rocSHMEM functions ditron calls (``lowering.shmem_table.rocshmem_symbols()``)."""
    try:
        path = rocshmem_bitcode(arch)
    except LibraryError as e:
        return None, str(e)
    if path is None or not os.path.exists(path):
        where = f" ({path} does not exist)" if path else ""
        return None, (f"not found for {arch}{where}: shmem.* on AMD unavailable (dl.* primitives need no library). "
                      f"ditron targets rocSHMEM {ROCSHMEM_SUPPORTED}'s C exports (ROCm/rocm-systems "
                      "projects/rocshmem); set DITRON_ROCSHMEM_BC or ROCSHMEM_HOME")
    ver = rocshmem_version(path)
    notes = []
    if ver is None:
        notes.append(f"version unknown (no include/rocshmem/rocshmem_config.h beside it; supported: "
                     f"{ROCSHMEM_SUPPORTED})")
    elif _version_tuple(ver) < _version_tuple(ROCSHMEM_SUPPORTED):
        notes.append(f"version {ver} is OLDER than the supported {ROCSHMEM_SUPPORTED} (older rocSHMEM exports only "
                     "C++ names; kernels calling shmem.* will not link)")
    else:
        notes.append(f"version {ver} (supported: {ROCSHMEM_SUPPORTED})")
    missing = rocshmem_missing_exports(path, symbols)
    if missing is None:
        notes.append("exports not checked (no llvm-nm: ROCm's $ROCM_PATH/llvm/bin/llvm-nm or one on PATH)")
    elif missing:
        notes.append(f"MISSING {len(missing)} of the C functions ditron calls: {', '.join(missing)}")
    else:
        notes.append(f"defines all {len(symbols)} C functions ditron calls")
    return path, f"{path} ({arch}): " + "; ".join(notes)


_LINKABLE: dict = {}
#: bump when the reduction below changes (the file name carries it)
_REDUCED_FORMAT = 1


def nvshmem_linkable(path: str, symbols) -> str:
    """The library to link for NVSHMEM's bitcode ``path``: the functions
    ``symbols`` (those ditron's NVSHMEM table can call), with everything they use, cut out of the
    31 MB bitcode once and kept under ``$DITRON_CACHE_DIR/devlib``.  Triton
    parses the whole library on every compilation that links it (about 5
    CPU-seconds for the full bitcode); linking only what a kernel needs gives
    the same module either way (tests/test_compile_shmem.py compares the PTX).
    ``DITRON_NVSHMEM_FULL=1`` links the full bitcode; so does any failure to
    cut it (the compilation then reports the bitcode itself)."""
    if os.environ.get("DITRON_NVSHMEM_FULL") == "1":
        return path
    try:
        st = os.stat(path)
    except OSError:
        return path
    symbols = tuple(sorted(symbols))
    key = repr((os.path.realpath(path), st.st_size, st.st_mtime_ns, _compat.triton.__version__, symbols,
                _REDUCED_FORMAT))
    out = _LINKABLE.get((key, _compat.ditron_cache_dir()))
    if out is not None and os.path.exists(out):
        return out
    import hashlib
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    directory = os.path.join(_compat.ditron_cache_dir(), "devlib")
    out = os.path.join(directory, f"libnvshmem_device_needed_{digest}.ll")
    if not os.path.exists(out):
        try:
            text = _compat.link_needed_functions(path, symbols)
        except Exception:  # noqa: BLE001 -- an unreadable bitcode is reported by the compilation that links it
            return path
        os.makedirs(directory, exist_ok=True)
        tmp = f"{out}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, out)
    _LINKABLE[(key, _compat.ditron_cache_dir())] = out
    return out


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
        path = rocshmem_bitcode(str(target.arch))
        if path is None or not os.path.exists(path):
            where = f" ({path} does not exist)" if path else ""
            raise LibraryError(f"shmem.* on {target.name} needs the rocSHMEM device bitcode "
                               f"{ROCSHMEM_BC.format(arch=target.arch)} (rocSHMEM {ROCSHMEM_SUPPORTED} or newer, with "
                               f"the C exports of src/device/rocshmem_wrapper.cc), which was not found{where}: "
                               "set DITRON_ROCSHMEM_BC to its .bc file (or ROCSHMEM_HOME / ROCM_PATH). Tile- and "
                               "thread-level primitives (dl.*) need no library on AMD")
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
    try:
        roc = rocshmem_bitcode()
    except LibraryError:
        roc = None
    return {"nvshmem_bitcode": path, "nvshmem_version": ver, "nvshmem_status": status, "rocshmem_bitcode": roc}


__all__ = ["NVSHMEM_LIB", "ROCSHMEM_LIB", "NeedLibrary", "nvshmem_bitcode", "nvshmem_version", "rocshmem_bitcode",
           "rocshmem_version", "rocshmem_report",
           "shmem_library", "nvshmem_linkable", "explain_link_failure", "compatibility_report", "DitronCompileError"]
