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

#: rocSHMEM (work-group = block, wavefront = warp).  Not checked against a
#: rocSHMEM bitcode: none is available on the development machines.
ROCSHMEM = {}
for (_kind, _nbi, _coop), (_sym, _ret, _params) in NVSHMEM.items():
    _base = _sym.replace("nvshmemx_", "rocshmem_").replace("nvshmem_", "rocshmem_")
    _base = _base.replace("_block", "_wg").replace("_warp", "_wave")
    ROCSHMEM[(_kind, _nbi, _coop)] = (_base, _ret, _params)
ROCSHMEM[("shmem.barrier_all", None, "block")] = ("rocshmem_wg_barrier_all", "void", [])
ROCSHMEM[("shmem.sync_all", None, "block")] = ("rocshmem_wg_sync_all", "void", [])
ROCSHMEM_SIGNAL = {"set": 0, "add": 1}
ROCSHMEM_CMP = dict(NVSHMEM_CMP)


def lookup(table, kind, nbi=None, coop=None):
    for key in ((kind, nbi, coop), (kind, None, coop), (kind, None, None)):
        if key in table:
            return table[key]
    return None
