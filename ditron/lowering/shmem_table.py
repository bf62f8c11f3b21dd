"""OpenSHMEM device functions behind ``ditron.language.shmem``: the exact C
prototype of each NVSHMEM and rocSHMEM function a primitive lowers to.

Argument kinds (see :data:`ditron.lowering.devlib.C_TYPES`): ``ptr`` (void*,
uint64_t*), ``size_t``, ``int``, ``uint64``, ``team``.  The NVSHMEM entries
were checked against the ``define`` lines of libnvshmem_device.bc from
nvidia-nvshmem-cu13 3.4.5; a test re-checks them whenever that bitcode and an
``llvm-dis`` are available.
"""
from __future__ import annotations

_MEM = ["ptr", "ptr", "size_t", "int"]
_SIG = ["ptr", "ptr", "size_t", "ptr", "uint64", "int", "int"]

#: (op kind, nbi, coop) -> (NVSHMEM symbol, return kind, parameter kinds)
NVSHMEM = {}
for _op in ("putmem", "getmem"):
    for _nbi in (False, True):
        sfx = "_nbi" if _nbi else ""
        NVSHMEM[(f"shmem.{_op}", _nbi, "thread")] = (f"nvshmem_{_op}{sfx}", "void", _MEM)
        NVSHMEM[(f"shmem.{_op}", _nbi, "warp")] = (f"nvshmemx_{_op}{sfx}_warp", "void", _MEM)
        NVSHMEM[(f"shmem.{_op}", _nbi, "block")] = (f"nvshmemx_{_op}{sfx}_block", "void", _MEM)
for _nbi in (False, True):
    sfx = "_nbi" if _nbi else ""
    NVSHMEM[("shmem.putmem_signal", _nbi, "thread")] = (f"nvshmem_putmem_signal{sfx}", "void", _SIG)
    NVSHMEM[("shmem.putmem_signal", _nbi, "warp")] = (f"nvshmemx_putmem_signal{sfx}_warp", "void", _SIG)
    NVSHMEM[("shmem.putmem_signal", _nbi, "block")] = (f"nvshmemx_putmem_signal{sfx}_block", "void", _SIG)
NVSHMEM.update({
    ("shmem.my_pe", None, None): ("nvshmem_my_pe", "int", []),
    ("shmem.n_pes", None, None): ("nvshmem_n_pes", "int", []),
    ("shmem.remote_ptr", None, None): ("nvshmem_ptr", "ptr", ["ptr", "int"]),
    ("shmem.remote_mc_ptr", None, None): ("nvshmemx_mc_ptr", "ptr", ["team", "ptr"]),
    ("shmem.signal_op", None, None): ("nvshmemx_signal_op", "void", ["ptr", "uint64", "int", "int"]),
    ("shmem.signal_wait_until", None, None): ("nvshmem_signal_wait_until", "uint64", ["ptr", "int", "uint64"]),
    ("shmem.quiet", None, None): ("nvshmem_quiet", "void", []),
    ("shmem.fence", None, None): ("nvshmem_fence", "void", []),
    ("shmem.barrier_all", None, "thread"): ("nvshmem_barrier_all", "void", []),
    ("shmem.barrier_all", None, "warp"): ("nvshmemx_barrier_all_warp", "void", []),
    ("shmem.barrier_all", None, "block"): ("nvshmemx_barrier_all_block", "void", []),
    ("shmem.sync_all", None, "thread"): ("nvshmem_sync_all", "void", []),
    ("shmem.sync_all", None, "warp"): ("nvshmemx_sync_all_warp", "void", []),
    ("shmem.sync_all", None, "block"): ("nvshmemx_sync_all_block", "void", []),
})

#: NVSHMEM's constants (nvshmem_constants.h; SIGNAL_SET/ADD read from the 3.4.5 bitcode)
NVSHMEM_SIGNAL = {"set": 9, "add": 10}
NVSHMEM_CMP = {"eq": 0, "ne": 1, "gt": 2, "le": 3, "lt": 4, "ge": 5}

#: rocSHMEM: the C-callable device exports of the newest rocSHMEM (ROCm/rocm-systems,
#: projects/rocshmem, ``src/device/rocshmem_wrapper.cc``: ``extern "C"`` functions forwarding to
#: ``rocshmem::``; read at commits 2922ab56 and fc82b313, CMake VERSION_STRING 3.4.0).  Older rocSHMEM
#: (2.x, 3.2) exports only C++ (mangled) names in ``namespace rocshmem`` and is not supported.
#: Work-group = block, wavefront = warp.  tests/test_rocshmem_table.py pins every entry to the
#: prototypes read from those files.
ROCSHMEM_VERSION = "3.4.0"
ROCSHMEM_SOURCE = "ROCm/rocm-systems projects/rocshmem (src/device/rocshmem_wrapper.cc, commit fc82b313)"
_ROC_COOP = {"thread": "", "warp": "_wave", "block": "_wg"}
ROCSHMEM = {}
for _op in ("putmem", "getmem", "putmem_signal"):
    for _nbi in (False, True):
        for _coop, _csfx in _ROC_COOP.items():
            ROCSHMEM[(f"shmem.{_op}", _nbi, _coop)] = (f"rocshmem_{_op}{'_nbi' if _nbi else ''}{_csfx}", "void",
                                                      _SIG if _op == "putmem_signal" else _MEM)
for _coop, _csfx in _ROC_COOP.items():
    ROCSHMEM[("shmem.barrier_all", None, _coop)] = (f"rocshmem_barrier_all{_csfx}", "void", [])
    ROCSHMEM[("shmem.sync_all", None, _coop)] = (f"rocshmem_sync_all{_csfx}", "void", [])
ROCSHMEM.update({
    ("shmem.my_pe", None, None): ("rocshmem_my_pe", "int", []),
    ("shmem.n_pes", None, None): ("rocshmem_n_pes", "int", []),
    ("shmem.remote_ptr", None, None): ("rocshmem_ptr", "ptr", ["ptr", "int"]),
    ("shmem.quiet", None, None): ("rocshmem_quiet", "void", []),
    ("shmem.fence", None, None): ("rocshmem_fence", "void", []),
})

#: rocSHMEM has no signal_op, signal_wait_until or mc_ptr export: ditron builds the first two from
#: these exports (signal_op "set"/"add" -> the uint64 atomics; signal_wait_until -> the uint64 wait,
#: which returns nothing, then rocshmem_signal_fetch for the word's value)
ROCSHMEM_PARTS = {
    "uint64_atomic_set": ("rocshmem_uint64_atomic_set", "void", ["ptr", "uint64", "int"]),
    "uint64_atomic_add": ("rocshmem_uint64_atomic_add", "void", ["ptr", "uint64", "int"]),
    "uint64_wait_until": ("rocshmem_uint64_wait_until", "void", ["ptr", "int", "uint64"]),
    "signal_fetch": ("rocshmem_signal_fetch", "uint64", ["ptr"]),
}
#: shmem.signal_op's sig_op -> the rocSHMEM atomic that performs it
ROCSHMEM_SIGNAL_ATOMIC = {"set": "uint64_atomic_set", "add": "uint64_atomic_add"}
#: operations no rocSHMEM export can build: refused at compile time (op -> what to use instead)
ROCSHMEM_REFUSED = {
    "shmem.remote_mc_ptr": "rocSHMEM has no multicast address (no rocshmem_mc_ptr export, and AMD GPUs have no "
                           "NVLink SHARP multicast); use shmem.remote_ptr / dl.symm_at per peer instead",
}

#: rocSHMEM's own constants (include/rocshmem/rocshmem_common.hpp: enum ROCSHMEM_SIGNAL_OPS and
#: enum rocshmem_cmps, EQ, NE, GT, GE, LT, LE).  The order differs from NVSHMEM's (LE = 3, GE = 5).
ROCSHMEM_SIGNAL = {"set": 0, "add": 1}
ROCSHMEM_CMP = {"eq": 0, "ne": 1, "gt": 2, "ge": 3, "lt": 4, "le": 5}


def rocshmem_symbols():
    """Every rocSHMEM symbol ditron may call, with its (return kind, parameter kinds)."""
    out = {sym: (ret, params) for sym, ret, params in ROCSHMEM.values()}
    out.update({sym: (ret, params) for sym, ret, params in ROCSHMEM_PARTS.values()})
    return out


def lookup(table, kind, nbi=None, coop=None):
    for key in ((kind, nbi, coop), (kind, None, coop), (kind, None, None)):
        if key in table:
            return table[key]
    return None
