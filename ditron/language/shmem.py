"""OpenSHMEM-style chunk-level primitives (``ditron.language.shmem``, also
importable as ``ditron.language.libshmem_device``).

Semantics are NVSHMEM's: plain names act in the calling thread, ``_warp``
variants are collective over a warp, ``_block`` variants over the whole
program (CTA).  In a Triton program every thread runs a scalar call, so use
the ``_block`` variants for one transfer per program, or guard a thread
variant with ``if dl.tid(0) == 0:``.  Pointers are symmetric addresses (the
local address of a symmetric allocation); sizes are in bytes; signal words are
uint64.

NVIDIA: calls into NVSHMEM's device bitcode (``libnvshmem_device.bc`` from the
nvidia-nvshmem pip package or ``NVSHMEM_HOME``) through wrappers with the exact
C prototypes; the library is linked only into kernels that call these
functions.  AMD: rocSHMEM 3.4.0+'s C exports (``librocshmem_device_<arch>.bc``,
found through ``DITRON_ROCSHMEM_BC``, ``ROCSHMEM_HOME`` or ``ROCM_PATH``), with
rocSHMEM's own constants (docs/language.md has the table); otherwise a
compile-time error naming the missing file.
"""
from __future__ import annotations

from .. import _compat
from ..lowering.shmem_table import NVSHMEM_CMP, NVSHMEM_SIGNAL
from .semantic import emit

builtin = _compat.builtin

#: NVSHMEM's constant values (also accepted: the strings "set"/"add", "eq"/...)
NVSHMEM_SIGNAL_SET = NVSHMEM_SIGNAL["set"]
NVSHMEM_SIGNAL_ADD = NVSHMEM_SIGNAL["add"]
NVSHMEM_CMP_EQ = NVSHMEM_CMP["eq"]
NVSHMEM_CMP_NE = NVSHMEM_CMP["ne"]
NVSHMEM_CMP_GT = NVSHMEM_CMP["gt"]
NVSHMEM_CMP_LE = NVSHMEM_CMP["le"]
NVSHMEM_CMP_LT = NVSHMEM_CMP["lt"]
NVSHMEM_CMP_GE = NVSHMEM_CMP["ge"]
#: team handles (NVSHMEM's predefined teams; ``remote_mc_ptr`` takes WORLD or NODE)
NVSHMEM_TEAM_INVALID = -1
NVSHMEM_TEAM_WORLD = 0
NVSHMEM_TEAM_SHARED = 1
NVSHMEMX_TEAM_NODE = 2
NVSHMEMX_TEAM_SAME_MYPE_NODE = 3
NVSHMEMI_TEAM_SAME_GPU = 4
NVSHMEMI_TEAM_GPU_LEADERS = 5

_SIG_NAMES = {v: k for k, v in NVSHMEM_SIGNAL.items()}
_CMP_NAMES = {v: k for k, v in NVSHMEM_CMP.items()}


def _canon(value, table):
    raw = _compat.unwrap(value)
    if isinstance(raw, int) and not isinstance(raw, bool) and raw in table:
        return table[raw]
    return value


def _e(kind, operands, attrs, sem, gen, params):
    return emit(kind, operands, attrs, sem, gen, params=params)


@builtin
def my_pe(_semantic=None, _generator=None):
    """This PE's index (``nvshmem_my_pe``)."""
    return _e("shmem.my_pe", {}, {}, _semantic, _generator, ())


@builtin
def n_pes(_semantic=None, _generator=None):
    """Number of PEs (``nvshmem_n_pes``)."""
    return _e("shmem.n_pes", {}, {}, _semantic, _generator, ())


@builtin
def remote_ptr(ptr, pe, _semantic=None, _generator=None):
    """Address of ``ptr``'s symmetric counterpart on ``pe`` usable with loads
    and stores, or null when ``pe`` is not reachable by load/store
    (``nvshmem_ptr``).  Prefer :func:`ditron.language.symm_at`, which keeps
    pointer alignment and works on tensors."""
    return _e("shmem.remote_ptr", {"ptr": ptr, "pe": pe}, {}, _semantic, _generator, ("ptr", "pe"))


@builtin
def remote_mc_ptr(team, ptr, _semantic=None, _generator=None):
    """Multicast address of ``ptr`` for ``team`` (``nvshmemx_mc_ptr``; NVIDIA
    sm_90+ with NVLink SHARP), for :func:`multimem_ld_reduce` /
    :func:`multimem_st`."""
    return _e("shmem.remote_mc_ptr", {"team": team, "ptr": ptr}, {}, _semantic, _generator, ("team", "ptr"))


def _mem_family(kind, nbi, coop):
    def fn(dst, src, nbytes, pe, _semantic=None, _generator=None):
        return _e(kind, {"dst": dst, "src": src, "nbytes": nbytes, "pe": pe}, {"nbi": nbi, "coop": coop}, _semantic,
                  _generator, ("dst", "src", "nbytes", "pe"))
    return fn


def _sig_family(nbi, coop):
    def fn(dst, src, nbytes, sig_addr, signal, sig_op, pe, _semantic=None, _generator=None):
        return _e("shmem.putmem_signal", {"dst": dst, "src": src, "nbytes": nbytes, "sig_addr": sig_addr,
                                          "signal": signal, "pe": pe},
                  {"nbi": nbi, "coop": coop, "sig_op": _canon(sig_op, _SIG_NAMES)}, _semantic, _generator,
                  ("dst", "src", "nbytes", "sig_addr", "signal", "sig_op", "pe"))
    return fn


_DOC_MEM = {
    "putmem": "Copy ``nbytes`` bytes from local ``src`` to ``dst`` on ``pe``",
    "getmem": "Copy ``nbytes`` bytes from ``src`` on ``pe`` to local ``dst``",
}
_COOP_DOC = {"thread": "by the calling thread", "warp": "collectively by a warp", "block": "collectively by the program"}

_g = globals()
for _op in ("putmem", "getmem"):
    for _nbi in (False, True):
        for _coop in ("thread", "warp", "block"):
            _name = _op + ("_nbi" if _nbi else "") + ("" if _coop == "thread" else f"_{_coop}")
            _f = _mem_family(f"shmem.{_op}", _nbi, _coop)
            _f.__name__ = _f.__qualname__ = _name
            _f.__doc__ = (f"{_DOC_MEM[_op]}, {_COOP_DOC[_coop]}; "
                          + ("returns at once (complete after :func:`quiet`)." if _nbi else
                             "returns when the local buffer is reusable" + (" and the data is delivered." if _op == "getmem" else ".")))
            _g[_name] = builtin(_f)
for _nbi in (False, True):
    for _coop in ("thread", "warp", "block"):
        _name = "putmem_signal" + ("_nbi" if _nbi else "") + ("" if _coop == "thread" else f"_{_coop}")
        _f = _sig_family(_nbi, _coop)
        _f.__name__ = _f.__qualname__ = _name
        _f.__doc__ = ("Copy ``nbytes`` from ``src`` to ``dst`` on ``pe``, then update the 64-bit signal word "
                      "``sig_addr`` on ``pe`` with ``signal`` (``sig_op``: NVSHMEM_SIGNAL_SET / _ADD or 'set' / "
                      f"'add') once the data is visible there; {_COOP_DOC[_coop]}"
                      + ("; non-blocking." if _nbi else "."))
        _g[_name] = builtin(_f)


@builtin
def signal_op(sig_addr, signal, sig_op, pe, _semantic=None, _generator=None):
    """Set or add ``signal`` to the 64-bit word ``sig_addr`` on ``pe``
    (``nvshmemx_signal_op``)."""
    return _e("shmem.signal_op", {"sig_addr": sig_addr, "signal": signal, "pe": pe},
              {"sig_op": _canon(sig_op, _SIG_NAMES)}, _semantic, _generator, ("sig_addr", "signal", "sig_op", "pe"))


@builtin
def signal_wait_until(sig_addr, cmp, cmp_value, _semantic=None, _generator=None):
    """Wait until the local 64-bit signal word satisfies ``word <cmp>
    cmp_value`` (``cmp``: NVSHMEM_CMP_* or 'eq'/'ne'/'gt'/'ge'/'lt'/'le');
    returns the word.  Acquire semantics (``nvshmem_signal_wait_until``)."""
    return _e("shmem.signal_wait_until", {"sig_addr": sig_addr, "cmp_value": cmp_value},
              {"cmp": _canon(cmp, _CMP_NAMES)}, _semantic, _generator, ("sig_addr", "cmp", "cmp_value"))


@builtin
def quiet(_semantic=None, _generator=None):
    """Complete every outstanding non-blocking put/get of this thread
    (``nvshmem_quiet``)."""
    return _e("shmem.quiet", {}, {}, _semantic, _generator, ())


@builtin
def fence(_semantic=None, _generator=None):
    """Order this thread's puts to each PE (``nvshmem_fence``)."""
    return _e("shmem.fence", {}, {}, _semantic, _generator, ())


def _coll(kind, coop, name, doc):
    def fn(_semantic=None, _generator=None):
        return _e(kind, {}, {"coop": coop}, _semantic, _generator, ())
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return builtin(fn)


barrier_all = _coll("shmem.barrier_all", "thread", "barrier_all",
                    "Barrier of all PEs that also completes outstanding puts (``nvshmem_barrier_all``); one thread "
                    "per PE calls it.")
barrier_all_warp = _coll("shmem.barrier_all", "warp", "barrier_all_warp", "Warp-collective :func:`barrier_all`: every lane of the warp calls it (``nvshmemx_barrier_all_warp``).")
barrier_all_block = _coll("shmem.barrier_all", "block", "barrier_all_block",
                          "Program-collective :func:`barrier_all` (``nvshmemx_barrier_all_block``).")
sync_all = _coll("shmem.sync_all", "thread", "sync_all",
                 "Barrier of all PEs without completing puts (``nvshmem_sync_all``).")
sync_all_warp = _coll("shmem.sync_all", "warp", "sync_all_warp", "Warp-collective :func:`sync_all`: every lane of the warp calls it (``nvshmemx_sync_all_warp``).")
sync_all_block = _coll("shmem.sync_all", "block", "sync_all_block", "Program-collective :func:`sync_all`: every thread of the program calls it (``nvshmemx_sync_all_block``).")

del _g, _op, _nbi, _coop, _name, _f
