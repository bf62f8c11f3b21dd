"""Shared-memory primitives of the simulator: atomics on raw addresses and
the control block that the ranks and the launcher share.

Atomics go through Triton's interpreter runtime (C++ ``std::atomic`` on the
address), which is lock-free for 32- and 64-bit integers and therefore atomic
across the rank processes that map the same file.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from . import _compat

_I = None


def _interp():
    global _I
    if _I is None:
        _I = _compat.interpreter_runtime()
    return _I


def _addr(addr):
    return np.asarray(addr, dtype=np.uint64).reshape(-1)


_ONE_TRUE = np.ones(1, dtype=bool)
_ONE_TRUE.setflags(write=False)


def _mask(shape):
    """All-true mask of ``shape`` (one shared read-only array for a single address: the polls' case)."""
    return _ONE_TRUE if shape == (1,) else np.ones(shape, dtype=bool)


def _values(value, shape, dtype):
    """``value`` as a new ``dtype`` array of ``shape``: ``np.broadcast_to(np.asarray(value, dtype), shape).copy()``,
    without its cost for one Python ``int`` at one address (the control block's and the polls' case): the same
    value, and the same ``OverflowError`` for one that ``dtype`` cannot hold."""
    if value.__class__ is int and shape == (1,):
        return np.array((value,), dtype=dtype)
    return np.broadcast_to(np.asarray(value, dtype=dtype), shape).copy()


def atomic_add(addr, value, dtype=np.int64):
    """``*addr += value``; returns the old value(s)."""
    I = _interp()
    addr = _addr(addr)
    return I.atomic_rmw(I.RMW_OP.ADD, addr, _values(value, addr.shape, dtype), _mask(addr.shape),
                        I.MEM_SEMANTIC.ACQUIRE_RELEASE)


def atomic_xchg(addr, value, dtype=np.int64):
    I = _interp()
    addr = _addr(addr)
    return I.atomic_rmw(I.RMW_OP.XCHG, addr, _values(value, addr.shape, dtype), _mask(addr.shape),
                        I.MEM_SEMANTIC.ACQUIRE_RELEASE)


def atomic_cas(addr, cmp, value, dtype=np.int64):
    I = _interp()
    addr = _addr(addr)
    return I.atomic_cas(addr, _values(cmp, addr.shape, dtype), _values(value, addr.shape, dtype),
                        I.MEM_SEMANTIC.ACQUIRE_RELEASE)


def atomic_load(addr, dtype=np.int64):
    """Acquire load (an atomic add of zero, so it is ordered like the GPU's
    ``ld.acquire``)."""
    return atomic_add(addr, 0, dtype)


def load(addr, dtype):
    """Plain loads of ``dtype`` values at the addresses ``addr``."""
    I = _interp()
    addr = _addr(addr)
    return I.load(addr, np.ones(addr.shape, dtype=bool), np.zeros(addr.shape, dtype=dtype), np.dtype(dtype))


def store(addr, value, dtype):
    I = _interp()
    addr = _addr(addr)
    vals = np.broadcast_to(np.asarray(value, dtype=dtype), addr.shape).copy()
    I.store(addr, vals, np.ones(addr.shape, dtype=bool))


# ---------------------------------------------------------------------------
# Vector accesses: one access per 8- or 16-byte vector
# ---------------------------------------------------------------------------
# A GPU performs an aligned 16-byte access of one thread (ld.global.v4.b32, global_load_dwordx4) at once; LL
# protocols rely on it (a data word and its flag word read together).  The host has no 16-byte atomic that
# Python reaches, so a vector access here is made one access two ways:
# * against other vector accesses: a lock word per 16-byte granule stripe (in the job's control block, shared
#   by the rank processes; the heap offset picks the stripe, the same in every process), held around the access;
# * a vector load against any other write (a put's memmove, a tl.store, a dl.st): its 8-byte words are read
#   with atomic loads until two reads in a row agree -- a set of values the memory held at one instant
#   between the two reads (a "double collect"), never half of a write that lands between its words.

VLOCKS = 64        # lock words of the vector accesses (after the control block's per-rank words)
_LOCAL_LOCKS = np.zeros(VLOCKS, dtype=np.int64)        # a process without a job's control block


def _lock_words(stripes, control):
    if control is None:
        base = _LOCAL_LOCKS.ctypes.data
        return sorted({base + 8 * (int(s) % VLOCKS) for s in stripes})
    return sorted({control.vlock_addr(int(s)) for s in stripes})


def _lock(words, abort=None):
    import time
    got = []
    try:
        for w in words:
            spins = 0
            while int(atomic_cas(w, 0, 1)[0]) != 0:
                spins += 1
                time.sleep(0 if spins < 100 else 1e-5)      # (lets a program thread of this process finish)
                if abort is not None and spins % 1000 == 0 and abort():
                    raise RuntimeError("simulated job aborted while waiting for a vector-access lock")
            got.append(w)
    except BaseException:
        _unlock(got)
        raise
    return got


def _unlock(words):
    for w in reversed(words):
        atomic_xchg(w, 0)


def _collect(words64):
    first = atomic_add(words64, 0, np.int64)
    while True:
        again = atomic_add(words64, 0, np.int64)
        if np.array_equal(first, again):
            return first
        first = again


def vector_load(addrs, nbytes, stripes, control=None, abort=None):
    """The ``nbytes`` (8 or 16) bytes at each of ``addrs`` (aligned), each vector read as one access (see
    above); returns a ``(len(addrs), nbytes // 8)`` int64 array (little-endian 8-byte words)."""
    addrs = _addr(addrs)
    k = nbytes // 8
    words64 = (addrs[:, None] + np.arange(0, nbytes, 8, dtype=np.uint64)[None, :]).reshape(-1)
    held = _lock(_lock_words(stripes, control), abort)
    try:
        return _collect(words64).reshape(addrs.size, k) if words64.size else np.zeros((0, k), np.int64)
    finally:
        _unlock(held)


def vector_store(addrs, words, nbytes, stripes, control=None, abort=None):
    """Store ``words`` (``(len(addrs), nbytes // 8)`` int64, little-endian) at ``addrs``, one access per vector
    with respect to other vector accesses (see above)."""
    addrs = _addr(addrs)
    words64 = (addrs[:, None] + np.arange(0, nbytes, 8, dtype=np.uint64)[None, :]).reshape(-1)
    held = _lock(_lock_words(stripes, control), abort)
    try:
        if words64.size:
            atomic_xchg(words64, np.ascontiguousarray(words, dtype=np.int64).reshape(-1), np.int64)
    finally:
        _unlock(held)


# ---------------------------------------------------------------------------
# Control block: one small shared file per simulated job
# ---------------------------------------------------------------------------
CONTROL_WORDS_HEADER = 16
RANK_WORDS = 8
MAGIC = 0x4449545253494D31  # "DITRSIM1"

# header words
H_MAGIC, H_ABORT, H_PROGRESS, H_BAR_COUNT, H_BAR_GEN, H_FAILED_RANK, H_WORLD = 0, 1, 2, 3, 4, 5, 6
H_DEV_BAR_COUNT, H_DEV_BAR_GEN = 7, 8
# per-rank words
R_ACTIVE, R_BLOCKED, R_DONE, R_PID, R_HEARTBEAT = 0, 1, 2, 3, 4

ABORT_NONE, ABORT_DEADLOCK, ABORT_RANK_FAILED, ABORT_STOP = 0, 1, 2, 3
ABORT_REASONS = {ABORT_DEADLOCK: "deadlock", ABORT_RANK_FAILED: "another rank failed",
                 ABORT_STOP: "stopped by the launcher"}


def control_size(world_size: int) -> int:
    return 8 * (CONTROL_WORDS_HEADER + RANK_WORDS * world_size + VLOCKS)


def create_control(path: str, world_size: int):
    with open(path, "wb") as f:
        words = np.zeros(control_size(world_size) // 8, dtype=np.int64)
        words[H_MAGIC] = MAGIC
        words[H_WORLD] = world_size
        words[H_FAILED_RANK] = -1
        f.write(words.tobytes())


def create_heap_file(path: str, nbytes: int):
    with open(path, "wb") as f:
        f.truncate(nbytes)      # sparse: pages appear when touched


class Control:
    """The mapped control block."""

    def __init__(self, path: str, world_size: int):
        self.path = path
        self._f = open(path, "r+b")
        self._mm = mmap.mmap(self._f.fileno(), control_size(world_size))
        self.words = np.frombuffer(self._mm, dtype=np.int64)
        if self.words[H_MAGIC] != MAGIC or self.words[H_WORLD] != world_size:
            raise RuntimeError(f"{path} is not a simulator control block for {world_size} ranks")
        self.world_size = world_size
        self.base = self.words.ctypes.data

    def addr(self, word: int) -> int:
        return self.base + 8 * word

    def rank_word(self, rank: int, field: int) -> int:
        return CONTROL_WORDS_HEADER + RANK_WORDS * rank + field

    def add(self, word: int, value: int) -> int:
        return int(atomic_add(self.addr(word), value)[0])

    def get(self, word: int) -> int:
        return int(atomic_load(self.addr(word))[0])

    def set(self, word: int, value: int) -> int:
        return int(atomic_xchg(self.addr(word), value)[0])

    # -- conveniences -----------------------------------------------------------
    def progress(self):
        self.add(H_PROGRESS, 1)

    @property
    def abort(self) -> int:
        return int(self.words[H_ABORT])

    def request_abort(self, reason: int, failed_rank: int = -1):
        if int(atomic_cas(self.addr(H_ABORT), ABORT_NONE, reason)[0]) == ABORT_NONE and failed_rank >= 0:
            self.set(H_FAILED_RANK, failed_rank)

    def vlock_addr(self, stripe: int) -> int:
        """The lock word of vector-access stripe ``stripe`` (:func:`vector_load`)."""
        return self.addr(CONTROL_WORDS_HEADER + RANK_WORDS * self.world_size + stripe % VLOCKS)

    def rank_add(self, rank: int, field: int, value: int):
        return self.add(self.rank_word(rank, field), value)

    def rank_get(self, rank: int, field: int) -> int:
        return int(self.words[self.rank_word(rank, field)])

    def rank_set(self, rank: int, field: int, value: int):
        return self.set(self.rank_word(rank, field), value)

    def reset(self):
        """Clear abort/barrier/progress state (only when every rank is idle)."""
        for w in (H_ABORT, H_PROGRESS, H_BAR_COUNT, H_BAR_GEN, H_DEV_BAR_COUNT, H_DEV_BAR_GEN):
            self.set(w, 0)
        self.set(H_FAILED_RANK, -1)
        for r in range(self.world_size):
            for fld in (R_ACTIVE, R_BLOCKED, R_DONE):
                self.rank_set(r, fld, 0)

    def close(self):
        self.words = None
        try:
            self._mm.close()
        except BufferError:
            pass
        self._f.close()


def sim_dir_paths(sim_dir: str):
    return os.path.join(sim_dir, "control"), os.path.join(sim_dir, "heap")


# ---------------------------------------------------------------------------
# Job directories: owned by a process; those of dead owners are stale
# ---------------------------------------------------------------------------
JOB_PREFIX = "ditron-sim-"
OWNER_FILE = "owner"


def _start_time(pid: int):
    """Start time of process ``pid`` (clock ticks since boot), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"


def make_job_dir() -> str:
    """A new job directory owned by this process (see :func:`clean_stale_jobs`)."""
    import tempfile
    clean_stale_jobs()
    sim_dir = tempfile.mkdtemp(prefix=JOB_PREFIX)
    with open(os.path.join(sim_dir, OWNER_FILE), "w") as f:
        f.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
    return sim_dir


def job_is_stale(sim_dir: str) -> bool:
    """True when the process that made ``sim_dir`` is gone (killed before it
    could remove it); directories without an owner file are left alone."""
    try:
        with open(os.path.join(sim_dir, OWNER_FILE)) as f:
            pid, started = f.read().split()
    except (OSError, ValueError):
        return False
    now = _start_time(int(pid))
    return now is None or (now != "?" and started != "?" and now != started)


def clean_stale_jobs(tmp_dir=None) -> list:
    """Remove the job directories (heap files) of simulated jobs whose owner
    was killed; returns the removed paths."""
    import shutil
    import tempfile
    tmp_dir = tmp_dir or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(tmp_dir) if n.startswith(JOB_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(tmp_dir, name)
        if os.path.isdir(path) and job_is_stale(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def die_with_parent():
    """In a child process: ask Linux to kill it when its parent dies (a
    launcher killed with SIGKILL leaves no ranks behind)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
