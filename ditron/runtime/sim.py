"""The simulator transport: N rank processes on one CPU machine.

Every rank maps one shared file holding all ranks' symmetric heaps
(``world_size x heap_size`` bytes, rank ``r``'s heap at ``r * heap_size``), so
a remote view is plain address arithmetic and remote loads, stores and atomics
are real shared-memory accesses between the rank processes.  A small control
block (also shared) holds the host barrier, the abort flag and, per rank, how
many threads are running or blocked: the watchdog (:class:`Watchdog`, run by
the launcher) declares a deadlock when no rank has made progress for
``DITRON_HANG_TIMEOUT_S`` seconds (default 30) while some are blocked, and
every blocked wait then raises with a report of what it was waiting for.

The launcher (``ditron sim``, :mod:`ditron.sim.launcher`) creates the files
and sets ``DITRON_SIM_DIR``; a single process with ``TRITON_INTERPRET=1`` and
no launcher gets a private one-rank world (with an in-process watchdog).
"""
from __future__ import annotations

import atexit
import mmap
import os
import shutil
import threading
import time

import numpy as np

from ..errors import DitronError, DitronHangError
from .. import sim_memory as M
from .heap import SymmetricHeap, heap_size_from_env, parse_size, round_up, HEAP_ALIGN
from .transport import Transport, World

DEFAULT_SIM_HEAP = 64 << 20
DEFAULT_HANG_TIMEOUT_S = 30.0


def hang_timeout_s() -> float:
    raw = os.environ.get("DITRON_HANG_TIMEOUT_S")
    if not raw:
        return DEFAULT_HANG_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise DitronError(f"DITRON_HANG_TIMEOUT_S={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise DitronError("DITRON_HANG_TIMEOUT_S must be positive")
    return value


def _race():
    """The race finder's hooks (:mod:`ditron.sim.race` provides itself; the
    runtime never imports the simulator above it)."""
    from ..lowering.sim import race
    return race()


def _skew(event):
    """The skew-injection hook (:mod:`ditron.sim.skew`, which provides itself)."""
    from ..lowering.sim_base import _skew as hook
    hook(event)


_POLL = threading.local()     # per program thread: the polling loop it may be in
_POLL_WORDS = 64              # words of one place remembered (beyond: a scan, not a spin)


class Blocked(Exception):
    """Raised inside a blocked wait when the job is aborted; ``info`` says
    what the wait was waiting for."""

    def __init__(self, info, reason):
        self.info = info
        self.reason = reason
        super().__init__(f"{reason}: {info}")


class SimTransport(Transport):
    name = "sim"

    def __init__(self, topo, heap_size, sim_dir, owns_dir):
        rank, world_size, local_rank, lws, nnodes, node = topo
        self.rank, self.world_size = rank, world_size
        self.local_world_size = lws
        self.sim_dir, self.owns_dir = sim_dir, owns_dir
        control_path, heap_path = M.sim_dir_paths(sim_dir)
        self.control = M.Control(control_path, world_size)
        self.heap_size = heap_size
        self._heap_file = open(heap_path, "r+b")
        total = os.fstat(self._heap_file.fileno()).st_size
        if total != heap_size * world_size:
            raise DitronError(f"simulator heap file {heap_path} holds {total} bytes, expected "
                              f"{world_size} x {heap_size}; was it made by another launch?")
        self._mm = mmap.mmap(self._heap_file.fileno(), total)
        import torch
        self.all_heaps = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.base0 = self.all_heaps.data_ptr()
        buf = self.all_heaps[rank * heap_size:(rank + 1) * heap_size]
        self.heap = SymmetricHeap(buf, rank, "simulator")
        from .alloccheck import FileLedger
        self.heap.on_alloc = FileLedger(sim_dir, rank, world_size)      # ranks allocate alike
        self.control.rank_set(rank, M.R_PID, os.getpid())
        self.control.rank_set(rank, M.R_ACTIVE, 1)     # this (main) thread runs host code
        self.control.rank_set(rank, M.R_DONE, 0)
        self._lock = threading.Lock()
        self._watchdog_thread = None
        if owns_dir:
            self._start_local_watchdog()

    # -- addresses ------------------------------------------------------------------
    def heap_base(self, rank: int) -> int:
        return self.base0 + rank * self.heap_size

    def owner_of(self, addr: int):
        """(rank, heap offset) of an address in some rank's heap, or None."""
        off = addr - self.base0
        if 0 <= off < self.heap_size * self.world_size:
            return off // self.heap_size, off % self.heap_size
        return None

    def describe_addr(self, addr: int) -> str:
        from .heap import name_address
        named = name_address(addr)
        plain = self._describe_heap_addr(addr)
        return f"{named}; {plain}" if named else plain

    def _describe_heap_addr(self, addr: int) -> str:
        where = self.owner_of(int(addr))
        if where is None:
            return f"address {int(addr):#x} (not in the symmetric heap)"
        rank, off = where
        return f"{self.heap.describe_offset(off)}, in rank {rank}'s copy"

    def peer_tensor(self, t, rank):
        off = t.data_ptr() - self.heap.base
        start = rank * self.heap_size + off
        span = (max((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1 if t.numel() else 0) * t.element_size()
        flat = self.all_heaps[start:start + span].view(t.dtype)
        return flat.as_strided(t.shape, t.stride())

    # -- activity accounting (for the deadlock watchdog) ---------------------------
    def active(self, delta: int):
        self.control.rank_add(self.rank, M.R_ACTIVE, delta)

    # -- polling loops (``while dl.ld(...) < v``, ``tl.load(volatile=True)``) -------
    def poll(self, key, observed, describe, launch=None, addr=None):
        """A polling load at ``key`` (source line and size) of the words at
        ``addr`` returned ``observed``.  The same values read again at the same
        place means the program spins: from the second repeat on it counts as
        blocked (the watchdog can see the hang), lends its turn to the other
        programs (sleeping a little per poll) and raises :class:`Blocked` with
        ``describe()`` when the job is aborted.  A poll of several words in
        turn at one place (``load_v4_b32(..., semantic="relaxed")``: one load
        per word) spins when each word repeats.  A new value or any other
        ditron operation ends the spin (:meth:`poll_end`)."""
        st = _POLL.__dict__
        seen = st.get("seen") if st.get("key") == key else None
        if seen is None or len(seen) > _POLL_WORDS:
            self.poll_end(launch)
            st.update(key=key, seen={addr: np.array(observed, copy=True)}, repeats=0, launch=launch)
            return
        prev = seen.get(addr)
        if prev is None or not np.array_equal(prev, observed):
            seen[addr] = np.array(observed, copy=True)
            if prev is not None:                 # a new value: not spinning
                if st.pop("blocked", False):
                    self._leave_blocked(st.get("launch", launch))
                st["repeats"] = 0
            return
        st["repeats"] += 1
        if st["repeats"] < 2:
            return
        if not st.get("blocked"):
            st["blocked"], st["delay"] = True, 0.0
            self._enter_blocked(launch)
        abort = self.control.abort
        if abort:
            self.poll_end(launch)
            raise Blocked(describe(), M.ABORT_REASONS.get(abort, "aborted"))
        if launch is not None and launch.failed:
            self.poll_end(launch)
            raise Blocked(describe(), "another program of this launch failed")
        time.sleep(st["delay"])
        st["delay"] = min(st["delay"] * 2 or 2e-5, 2e-3)

    def poll_end(self, launch=None):
        """The calling thread stops polling (if it was)."""
        st = _POLL.__dict__
        if st.pop("blocked", False):
            self._leave_blocked(st.get("launch", launch))
        st.pop("key", None)
        st.pop("seen", None)

    def _enter_blocked(self, launch):
        if launch is not None:
            launch.blocked(+1)
        else:
            self.active(-1)
        self.control.rank_add(self.rank, M.R_BLOCKED, 1)

    def _leave_blocked(self, launch):
        self.control.rank_add(self.rank, M.R_BLOCKED, -1)
        if launch is not None:
            launch.blocked(-1)
        else:
            self.active(+1)

    def spin(self, check, describe, launch=None):
        """Wait until ``check()`` returns ``(True, observed)``.

        Counts this thread as blocked while it spins; raises :class:`Blocked`
        with ``describe(observed)`` when the job is aborted (deadlock or a
        failed rank) or when another program of ``launch`` failed.
        """
        self.poll_end(launch)
        done, observed = check()
        if done:
            return observed
        ctl = self.control
        self._enter_blocked(launch)
        delay = 0.0
        try:
            while True:
                done, observed = check()
                if done:
                    ctl.progress()
                    return observed
                abort = ctl.abort
                if abort:
                    raise Blocked(describe(observed), M.ABORT_REASONS.get(abort, "aborted"))
                if launch is not None and launch.failed:
                    raise Blocked(describe(observed), "another program of this launch failed")
                time.sleep(delay)
                # back off to 10 ms: every wake-up takes the GIL from the rank's running programs (at 2 ms the
                # decoder-attention tests spent ~8% more CPU, and more wall time, than now)
                delay = min(delay * 2 or 1e-4, 1e-2)
        finally:
            self._leave_blocked(launch)

    # -- host collectives ------------------------------------------------------------
    def barrier(self, stream=None, primitive="ditron.barrier_all"):
        from .heap import _call_site
        race = _race()
        ctl = self.control
        gen = ctl.get(M.H_BAR_GEN)
        race.barrier("host", gen, "arrive")
        arrived = ctl.add(M.H_BAR_COUNT, 1) + 1
        if arrived == self.world_size:
            ctl.set(M.H_BAR_COUNT, 0)
            ctl.add(M.H_BAR_GEN, 1)
            ctl.progress()
            race.barrier("host", gen, "leave")
            return
        site = _call_site()

        def check():
            g = ctl.get(M.H_BAR_GEN)
            return g != gen, ctl.get(M.H_BAR_COUNT)

        def describe(count):
            return {"rank": self.rank, "program": None, "primitive": primitive, "where": site,
                    "signal": "host barrier", "expected": f"{self.world_size} ranks arrived",
                    "observed": f"{count} arrived"}
        try:
            self.spin(check, describe)
        except Blocked as b:
            raise DitronHangError(f"rank {self.rank}: {primitive} did not complete ({b.reason})",
                                  [b.info]) from None
        race.barrier("host", gen, "leave")

    def rank_copy(self, dst, src, stream=None):
        dst.copy_(src)
        self.control.progress()

    def write_value(self, word, value, stream=None):
        race = _race()
        race.signal_release(word.data_ptr(), True)
        M.atomic_xchg(word.data_ptr(), value)
        self.control.progress()
        _skew("signal")

    def wait_value(self, word, value, stream=None):
        from .heap import _call_site
        _skew("wait")
        addr = word.data_ptr()
        site = _call_site()

        def check():
            v = M.atomic_load(addr)
            return v == value, v

        def describe(observed):
            return {"rank": self.rank, "program": None, "primitive": "ditron.stream_wait_value", "where": site,
                    "signal": self.describe_addr(addr), "expected": f"== {value}", "observed": observed}
        try:
            self.spin(check, describe)
        except Blocked as b:
            raise DitronHangError(f"rank {self.rank}: ditron.stream_wait_value did not complete ({b.reason})",
                                  [b.info]) from None
        race = _race()
        race.signal_acquire(addr, True)

    # -- teardown -----------------------------------------------------------------------
    def finalize(self):
        if self.control is None:
            return
        hang = None
        if not self.control.abort:
            try:
                self.barrier(primitive="ditron.finalize")
            except DitronHangError as e:
                hang = e
        self._stop_watchdog = True
        self.control.rank_set(self.rank, M.R_DONE, 1)
        self.control.rank_set(self.rank, M.R_ACTIVE, 0)
        self.heap = _ClosedHeap()
        self.all_heaps = None
        self.control.close()
        self.control = None
        try:
            self._mm.close()
        except BufferError:
            pass   # tensors that alias the heap are still alive; the mapping goes with the process
        self._heap_file.close()
        if self.owns_dir:
            shutil.rmtree(self.sim_dir, ignore_errors=True)
        if hang is not None:
            raise hang

    # -- in-process watchdog (no launcher) ------------------------------------------------
    def _start_local_watchdog(self):
        self._stop_watchdog = False
        dog = Watchdog(self.control, hang_timeout_s())

        def loop():
            while not self._stop_watchdog and self.control is not None:
                try:
                    dog.poll()
                except Exception:  # noqa: BLE001 -- the control block went away
                    return
                time.sleep(0.05)

        self._watchdog_thread = threading.Thread(target=loop, name="ditron-sim-watchdog", daemon=True)
        self._watchdog_thread.start()


class _ClosedHeap:
    base = size = 0

    def contains(self, t):
        return False

    def __getattr__(self, name):
        raise DitronError("the ditron world was finalized; call ditron.init() again")


class Watchdog:
    """Declares a deadlock when, for ``timeout`` seconds, every live rank is
    blocked or finished (no thread running), some wait is blocked, and the
    global progress counter has not moved."""

    def __init__(self, control, timeout, alive=None):
        self.control = control
        self.timeout = timeout
        self.alive = alive or (lambda r: True)
        self.since = None
        self.last = None

    def stuck(self) -> bool:
        c = self.control
        any_blocked = False
        for r in range(c.world_size):
            if not self.alive(r) or c.rank_get(r, M.R_DONE):
                continue
            if c.rank_get(r, M.R_ACTIVE) > 0:
                return False
            if c.rank_get(r, M.R_BLOCKED) > 0:
                any_blocked = True
        return any_blocked

    def poll(self) -> bool:
        """True once a deadlock has been declared (the abort flag is set)."""
        c = self.control
        if c.abort:
            return c.abort == M.ABORT_DEADLOCK
        now = time.monotonic()
        progress = c.get(M.H_PROGRESS)
        if not self.stuck() or progress != self.last:
            self.since, self.last = now, progress
            return False
        if now - self.since >= self.timeout:
            c.request_abort(M.ABORT_DEADLOCK)
            return True
        return False


def make_sim_transport(topo, heap_size=None) -> World:
    rank, world_size, local_rank, lws, nnodes, node = topo
    sim_dir = os.environ.get("DITRON_SIM_DIR")
    owns = False
    job_heap = os.environ.get("DITRON_SIM_HEAP_SIZE")
    if sim_dir:
        if not job_heap:
            raise DitronError("DITRON_SIM_DIR is set but DITRON_SIM_HEAP_SIZE is not; start ranks with ditron sim")
        size = int(job_heap)
        if heap_size is not None and round_up(parse_size(heap_size), HEAP_ALIGN) > size:
            raise DitronError(f"ditron.init(heap_size={heap_size!r}) is larger than the simulated job's heap "
                              f"({size} bytes); pass --heap-size to ditron sim")
    else:
        if world_size != 1:
            raise DitronError(f"WORLD_SIZE={world_size} but no simulated job is running: start the script with "
                              f"`ditron sim -n {world_size} script.py` (or torchrun on GPUs)")
        size = round_up(parse_size(heap_size), HEAP_ALIGN) if heap_size is not None else \
            heap_size_from_env(DEFAULT_SIM_HEAP)
        sim_dir = M.make_job_dir()
        control_path, heap_path = M.sim_dir_paths(sim_dir)
        M.create_control(control_path, 1)
        M.create_heap_file(heap_path, size)
        race = _race()
        if race.enabled():        # the race finder is on (DITRON_SIM_RACE) and loaded
            race.create_race_file(sim_dir, 1, size)
        owns = True
        atexit.register(shutil.rmtree, sim_dir, True)
    transport = SimTransport(topo, size, sim_dir, owns)
    import torch
    return World(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=lws, nnodes=nnodes,
                 node=node, device=torch.device("cpu"), backend="sim", heap_size=size, transport=transport)
