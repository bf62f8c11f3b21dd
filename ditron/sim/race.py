"""The race finder (``ditron sim --race``, ``DITRON_SIM_RACE=1``).

Memory model (see docs/simulator.md, "The race finder"):

* every simulated thread -- the host of a rank and each program of a launch
  -- has a **vector clock** with one component per (rank, thread slot):
  ``1 + SLOTS`` slots per rank (slot 0: the host; program ``p`` of a launch:
  slot ``1 + p % SLOTS``);
* **happens-before** comes only from: program order; a launch (its programs
  start after the host's earlier work and the host continues after all of
  them); release -> acquire pairs on the same word (``dl.notify``,
  ``dl.st(semantic="release")``, release/acq_rel atomics, ``putmem_signal`` /
  ``signal_op``, the host's ``write_value`` -> ``dl.wait``,
  ``dl.ld(semantic="acquire")``, acquire/acq_rel atomics,
  ``signal_wait_until``, ``wait_value``); fences (a release fence makes later
  relaxed signal writes releases, an acquire fence makes earlier relaxed
  signal reads acquires); host and device barriers; and the boundaries
  between runs of a :class:`~ditron.sim.pool.SimCluster`;
* **scopes**: a release and an acquire synchronise only when both are
  system-scope ("sys", ``comm_scope`` "intra_node"/"inter_node") or both run
  on the same rank (a "gpu"/"cta"-scope wait does not see another rank's
  release);
* every **plain** access of a kernel to the symmetric heap (``tl.load`` /
  ``tl.store``, non-atomic ``dl.ld``/``dl.st``, ``multimem_*``, the data of
  ``shmem.putmem*``/``getmem*``) is checked against the last write and the
  last read of the same 2-byte granule (a shadow memory shared by all
  ranks): a conflicting access that does not happen-before it is a **data
  race**, reported with both source lines, ranks, programs and the
  symmetric tensor + element offset.  A plain load that races with a write
  may return the value from before that write (a stale value), chosen by a
  seeded random generator;
* the programs of a launch start in a seeded random order and may yield at
  every synchronisation operation (``DITRON_SIM_SEED``).

Signal words (accessed with atomics, waits, volatile loads) are not data:
mixed plain/atomic accesses to one word are not checked.  Host code (torch
operations on symmetric tensors, ``rank_copy``) is not checked either.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from ..errors import DitronError
from ..lowering import provide
from .. import sim_memory as M
from .events import LaunchObserver

ENV = "DITRON_SIM_RACE"
SEED_ENV = "DITRON_SIM_SEED"
SLOTS = 32                   # program slots per rank (programs beyond share: fewer races found, none invented)
NBUCKETS = 4096              # signal words with a published clock
CLOCK_BITS = 40
CLOCK_MASK = (1 << CLOCK_BITS) - 1
MAGIC = 0x4449545241434531   # "DITRACE1"
HEADER = 8
_GRAN = 1                    # log2 of the granule in bytes
SAME = 4                     # writers of an unchanged value remembered per granule
_ARRAYS = 5 + SAME


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def job_default() -> bool:
    """Whether a ``ditron sim`` job (and ``ditron demo``) runs under the race finder when neither ``--race`` nor
    ``--no-race`` is given: yes, unless ``DITRON_SIM_RACE`` says otherwise (``0``: off).  A missing ``dl.wait``
    or a signal before its data usually passes a plain simulation bitwise (the ranks run in step); the race
    finder reports it, at a small cost for a job (``ditron demo``: within its run-to-run noise)."""
    raw = os.environ.get(ENV)
    return True if raw is None or raw.strip() == "" else raw.strip() != "0"


def seed() -> int:
    raw = os.environ.get(SEED_ENV, "0")
    try:
        return int(raw)
    except ValueError:
        raise DitronError(f"{SEED_ENV}={raw!r} is not an integer") from None


class DitronRaceError(DitronError):
    """Data races found by the race finder; ``races`` holds one text per race."""

    def __init__(self, message, races):
        super().__init__(message + "\n" + "\n".join(races))
        self.races = list(races)


# ---------------------------------------------------------------------------
# the shared race file: sync table + shadow memory
# ---------------------------------------------------------------------------

def _layout(world_size, heap_size):
    dims = world_size * (1 + SLOTS)
    table = NBUCKETS * (2 + dims) + world_size * dims       # + the start clock of each rank's latest launch
    granules = (world_size * heap_size) >> _GRAN
    return dims, table, granules, 8 * (HEADER + table + _ARRAYS * granules)


def race_path(sim_dir):
    return os.path.join(sim_dir, "race")


def create_race_file(sim_dir, world_size, heap_size):
    """Create the (sparse) shared file of a simulated job in race mode."""
    *_, nbytes = _layout(world_size, heap_size)
    with open(race_path(sim_dir), "wb") as f:
        f.write(np.array([MAGIC, world_size, heap_size], dtype=np.int64).tobytes())
        f.truncate(nbytes)


class _Shared:
    def __init__(self, sim_dir, world_size, heap_size):
        import mmap
        dims, table, granules, nbytes = _layout(world_size, heap_size)
        path = race_path(sim_dir)
        if not os.path.exists(path):
            raise DitronError(f"{ENV}=1 but the simulated job has no race file ({path}): start it with "
                              "`ditron sim --race` or set the variable before the job starts")
        self._f = open(path, "r+b")
        self._mm = mmap.mmap(self._f.fileno(), nbytes)
        words = np.frombuffer(self._mm, dtype=np.int64)
        if words[0] != MAGIC or words[1] != world_size or words[2] != heap_size:
            raise DitronError(f"{path} was made for another job")
        self.dims = dims
        ntab = NBUCKETS * (2 + dims)
        self.table = words[HEADER:HEADER + ntab].reshape(NBUCKETS, 2 + dims)
        self.table_addr = self.table.ctypes.data
        self.launch_start = words[HEADER + ntab:HEADER + table].reshape(world_size, dims)
        s = words[HEADER + table:]
        self.w_ep, self.w_info, self.r_ep, self.r_info, self.old, *same = (s[i * granules:(i + 1) * granules]
                                                                           for i in range(_ARRAYS))
        self.same = same          # epochs of writes that stored the value already there

    def _bucket(self, key, create):
        i = (key * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF) >> 52
        for k in range(NBUCKETS):
            b = (i + k) % NBUCKETS
            cur = int(self.table[b, 0])
            if cur == key:
                return b
            if cur == 0:
                if not create:
                    return None
                addr = self.table_addr + 8 * b * (2 + self.dims)
                old = int(M.atomic_cas(addr, 0, key)[0])
                if old in (0, key):
                    return b
        raise DitronError(f"race finder: more than {NBUCKETS} signal words carry clocks")

    def publish(self, key, vc):
        b = self._bucket(key, True)
        lock = self.table_addr + 8 * (b * (2 + self.dims) + 1)
        while int(M.atomic_cas(lock, 0, 1)[0]) != 0:
            time.sleep(0)
        try:
            np.maximum(self.table[b, 2:], vc, out=self.table[b, 2:])
        finally:
            M.atomic_xchg(lock, 0)

    def clock(self, key):
        b = self._bucket(key, False)
        return None if b is None else self.table[b, 2:]


# ---------------------------------------------------------------------------
# per-process state
# ---------------------------------------------------------------------------

class _Thread:
    __slots__ = ("vc", "tid", "pid", "pend_local", "pend_sys", "fence_vc", "fence_sys", "launch")

    def __init__(self, vc, tid, pid, launch=None):
        self.vc, self.tid, self.pid, self.launch = vc, tid, pid, launch
        self.pend_local = self.pend_sys = None
        self.fence_vc, self.fence_sys = None, False


class _State:
    def __init__(self, tr):
        self.tr = tr
        self.rank, self.world = tr.rank, tr.world_size
        self.shared = _Shared(tr.sim_dir, tr.world_size, tr.heap_size)
        self.dims = self.shared.dims
        self.lo = tr.heap_base(0)
        self.hi = self.lo + tr.world_size * tr.heap_size
        self.host = _Thread(np.zeros(self.dims, dtype=np.int64), self.rank * (1 + SLOTS), None)
        self.host.vc[self.host.tid] = 1
        self.local = {}                   # signal word -> clock of this rank's releases (any scope)
        self.lock = threading.Lock()
        self.locs, self.loc_ids = [], {}
        self.peer_locs = {}
        self.seen = set()
        self.pending_reports = []
        self.launches = 0
        self.seed = seed()
        self.rng = np.random.default_rng([self.seed, self.rank])

    # -- source locations, shared through one small file per rank --------------------
    def loc_id(self, text):
        i = self.loc_ids.get(text)
        if i is None:
            i = self.loc_ids[text] = len(self.locs)
            self.locs.append(text)
            with open(os.path.join(self.tr.sim_dir, f"race-locs-{self.rank}"), "a") as f:
                f.write(text.replace("\n", " ") + "\n")
        return (self.rank << 24) | i

    def loc_text(self, lid):
        rank, i = lid >> 24, lid & 0xFFFFFF
        if rank == self.rank and i < len(self.locs):
            return self.locs[i]
        try:
            with open(os.path.join(self.tr.sim_dir, f"race-locs-{rank}")) as f:
                lines = f.read().splitlines()
            return lines[i]
        except (OSError, IndexError):
            return "?"

    # -- happens-before --------------------------------------------------------------
    def release(self, t, keys, sys_scope, vc=None):
        vc = t.vc if vc is None else vc
        with self.lock:
            for k in keys:
                cur = self.local.get(k)
                if cur is None:
                    self.local[k] = vc.copy()
                else:
                    np.maximum(cur, vc, out=cur)
        if sys_scope:
            for k in keys:
                self.shared.publish(k, vc)
        t.vc[t.tid] += 1

    def gather(self, keys, sys_scope):
        out = None
        for k in keys:
            for c in (self.local.get(k), self.shared.clock(k) if sys_scope else None):
                if c is not None:
                    out = c.copy() if out is None else np.maximum(out, c)
        return out

    def observed(self, addrs, sys_scope):
        """Clocks a read of ``addrs`` may acquire from plain stores there: the
        start of the writer's latest launch (kernel boundaries are full fences
        on GPUs, so a store of a kernel is a relaxed write after a fence; this
        lets the LL protocol's data-carried flags order later launches)."""
        a = np.asarray(addrs).reshape(-1).astype(np.uint64)
        a = a[(a >= np.uint64(self.lo)) & (a < np.uint64(self.hi))]
        if a.size == 0:
            return None
        w = self.shared.w_ep[((a - np.uint64(self.lo)) >> np.uint64(_GRAN)).astype(np.int64)]
        ranks = np.unique((w[w != 0] >> CLOCK_BITS) // (1 + SLOTS))
        out = None
        for r in ranks:
            if int(r) == self.rank or sys_scope:
                c = self.shared.launch_start[int(r)]
                out = c.copy() if out is None else np.maximum(out, c)
        return out

    def acquire(self, t, keys, sys_scope, addrs=None):
        for c in (self.gather(keys, sys_scope), self.observed(addrs, sys_scope) if addrs is not None else None):
            if c is not None:
                np.maximum(t.vc, c, out=t.vc)

    def relaxed_read(self, t, keys, addrs=None):
        """A relaxed read of signal words: an acquire fence (or the end of the
        kernel) later makes it an acquire."""
        for attr, scope in (("pend_local", False), ("pend_sys", True)):
            for c in (self.gather(keys, scope), self.observed(addrs, scope) if addrs is not None else None):
                if c is not None:
                    cur = getattr(t, attr)
                    setattr(t, attr, c if cur is None else np.maximum(cur, c))

    def fence(self, t, semantic, sys_scope):
        if semantic in ("acquire", "acq_rel", "sc"):
            for c in (t.pend_local, t.pend_sys if sys_scope else None):
                if c is not None:
                    np.maximum(t.vc, c, out=t.vc)
        if semantic in ("release", "acq_rel", "sc"):
            t.fence_vc, t.fence_sys = t.vc.copy(), sys_scope
            t.vc[t.tid] += 1

    def relaxed_write(self, t, keys):
        """A relaxed signal write after a release fence is a release of the fence's clock."""
        if t.fence_vc is not None:
            self.release(t, keys, t.fence_sys, vc=t.fence_vc)

    # -- plain accesses --------------------------------------------------------------
    def access(self, t, kind, addrs, mask, data, where, itemsize=None, group=None):
        shape = np.shape(addrs)
        addrs = np.asarray(addrs).reshape(-1).astype(np.uint64, copy=False)
        live = np.asarray(mask).reshape(-1).astype(bool) if mask is not None else None
        sel = (addrs >= np.uint64(self.lo)) & (addrs < np.uint64(self.hi))
        if live is not None:
            sel &= live
        out = self._access(t, kind, addrs, shape, sel, data, where, itemsize, self.shared, self.lo,
                           self.tr.describe_addr, group) if sel.any() else None
        # ordinary (non-symmetric) tensor arguments: shared by the programs of this launch (a megakernel's
        # activations), checked against a shadow of the launch
        lr = getattr(t, "launch", None)
        if lr is not None and lr.local:
            for sh in lr.local:
                sel = (addrs >= np.uint64(sh.lo)) & (addrs < np.uint64(sh.hi))
                if live is not None:
                    sel &= live
                if sel.any():
                    got = self._access(t, kind, addrs, shape, sel, data if out is None else out, where, itemsize,
                                       sh.arrays(), sh.lo, sh.describe, group)
                    out = got if got is not None else out
        return out

    def _access(self, t, kind, addrs, shape, sel, data, where, itemsize, sh, lo, describe, group=None):
        idx = np.flatnonzero(sel)
        a = addrs[idx]
        g = ((a - np.uint64(lo)) >> np.uint64(_GRAN)).astype(np.int64)
        if (itemsize or (data.dtype.itemsize if data is not None else 2)) == 1:
            # byte accesses: only granules whose two bytes this access covers (neighbouring bytes of
            # another program are not a race); no stale values or same-value writes for them
            _, inv, cnt = np.unique(g, return_inverse=True, return_counts=True)
            keep = (cnt[inv] >= 2) & (a % np.uint64(2) == 0)
            idx, a, g, data = idx[keep], a[keep], g[keep], None
            if idx.size == 0:
                return None
        me = (t.tid << CLOCK_BITS) | int(t.vc[t.tid])
        info = self._info(t, where)
        w = sh.w_ep[g]
        bad_w = self._unordered(t, w)
        out = None
        if kind == "read":
            if bad_w.any():
                # a write of the same value that happens before the read justifies it as well
                for s in sh.same:
                    sv = s[g]
                    bad_w &= ~((sv != 0) & ~self._unordered(t, sv))
            if bad_w.any():
                self._report(t, "write", "read", a, bad_w, sh.w_info[g], w, info, describe)
                out = self._stale(data, idx, g, bad_w, sh, group)
            sh.r_ep[g] = me
            sh.r_info[g] = info
        else:
            r = sh.r_ep[g]
            bad_r = self._unordered(t, r)
            if data is not None:
                before = _raw_bits(M.load(a, data.dtype))
                new = _raw_bits(np.broadcast_to(np.asarray(data), shape).reshape(-1)[idx])
                # (also over a value no checked store wrote -- the host's data, a launch boundary before: no
                # read of these bytes can return anything else, whatever the order, e.g. a putmem of a segment
                # onto itself while other programs read it)
                same = before == new
            else:
                before, same = None, np.zeros(idx.size, dtype=bool)
            if same.any():
                # storing the value that is already there (every program of a kernel writing the same count):
                # not a race; remembered so that readers ordered after this write are justified
                gs = g[same]
                slot = sh.same[int(t.tid) % SAME]
                slot[gs] = me
                keep = ~same
                g, idx, a, w, r, bad_w, bad_r = g[keep], idx[keep], a[keep], w[keep], r[keep], bad_w[keep], \
                    bad_r[keep]
                before = before[keep] if before is not None else None
                if not keep.any():
                    return None
            if bad_w.any():
                self._report(t, "write", "write", a, bad_w, sh.w_info[g], w, info, describe)
            if bad_r.any():
                self._report(t, "read", "write", a, bad_r, sh.r_info[g], r, info, describe)
            if before is not None:
                sh.old[g] = before
            sh.w_ep[g] = me
            sh.w_info[g] = info
            sh.r_ep[g] = 0
            for s in sh.same:
                s[g] = 0
        return out

    def _unordered(self, t, ep):
        tid = (ep >> CLOCK_BITS).astype(np.int64)
        clk = ep & CLOCK_MASK
        return (ep != 0) & (tid != t.tid) & (t.vc[np.minimum(tid, self.dims - 1)] < clk)

    def _info(self, t, where):
        lid = self.loc_id(where)
        x, y, z = t.pid if t.pid is not None else (0xFFFF, 0xFF, 0xFF)
        return (lid << 32) | ((x & 0xFFFF) << 16) | ((y & 0xFF) << 8) | (z & 0xFF)

    def _who(self, info, ep):
        lid = int(info) >> 32
        tid = int(ep) >> CLOCK_BITS
        rank, slot = divmod(tid, 1 + SLOTS)
        x, y, z = (int(info) >> 16) & 0xFFFF, (int(info) >> 8) & 0xFF, int(info) & 0xFF
        prog = "host" if slot == 0 else f"program ({x}, {y}, {z})"
        return f"rank {rank}, {prog}, at {self.loc_text(lid)}"

    def _report(self, t, first, second, addrs, bad, infos, eps, info, describe=None):
        i = int(np.flatnonzero(bad)[0])
        key = (first, second, int(infos[i]) >> 32, info >> 32)
        if key in self.seen:
            return
        self.seen.add(key)
        n = int(bad.sum())
        text = (f"data race on {(describe or self.tr.describe_addr)(int(addrs[i]))}"
                + (f" (and {n - 1} more elements of this access)" if n > 1 else "") + ":\n"
                f"    {first:<5} by {self._who(infos[i], eps[i])}\n"
                f"    {second:<5} by {self._who(info, (t.tid << CLOCK_BITS))}\n"
                f"    neither happens before the other (no release/acquire pair of the right scope, "
                f"barrier or launch boundary orders them)")
        self.pending_reports.append(text)

    def _stale(self, data, idx, g, bad, sh=None, group=None):
        if group:
            # one vector access (ld_vec): the racing granules of a vector are all stale or none is
            _, inv = np.unique(idx[np.flatnonzero(bad)] // group, return_inverse=True)
            pick = (self.rng.random(int(inv.max()) + 1 if inv.size else 0) < 0.5)[inv]
        else:
            pick = self.rng.random(int(bad.sum())) < 0.5
        if data is None or not pick.any():
            return None
        out = np.array(data, copy=True)
        flat = out.reshape(-1)
        which = idx[np.flatnonzero(bad)[pick]]
        old = (sh or self.shared).old[g[np.flatnonzero(bad)[pick]]]
        flat[which] = _from_raw_bits(old, out.dtype)
        return out


def _uint(dtype):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]


def _raw_bits(values):
    v = np.asarray(values)
    return v.view(_uint(v.dtype)).astype(np.uint64).view(np.int64)


def _from_raw_bits(raw, dtype):
    return np.asarray(raw).view(np.uint64).astype(_uint(dtype)).view(dtype)


_STATE = None
_T = threading.local()


def state():
    """The race finder of this process (None when race mode is off)."""
    global _STATE
    if not enabled():
        return None
    from ..runtime.world import current_world
    world = current_world(required=False)
    if world is None or world.backend != "sim":
        return None
    if _STATE is None or _STATE.tr is not world.transport:
        _STATE = _State(world.transport)
    return _STATE


def _thread(st):
    t = getattr(_T, "t", None)
    return t if t is not None else st.host


# ---------------------------------------------------------------------------
# hooks: executor, lowering rules, transport
# ---------------------------------------------------------------------------

class LaunchRace(LaunchObserver):
    def __init__(self, st, launch):
        self.st = st
        st.launches += 1
        st.seen.clear()             # each pair of racing lines is reported once per launch
        st.pending_reports.clear()  # those of a launch that failed with another error went with it
        self.rng = np.random.default_rng([st.seed, st.rank, st.launches])
        self.start = st.host.vc.copy()
        self.join = st.host.vc.copy()
        np.copyto(st.shared.launch_start[st.rank], self.start)
        self.lock = threading.Lock()
        self.local = _local_shadows(st, launch)

    def order(self, programs):
        perm = self.rng.permutation(len(programs))
        return [programs[i] for i in perm]

    def program_begin(self, pid, linear):
        vc = self.start.copy()
        tid = self.st.rank * (1 + SLOTS) + 1 + linear % SLOTS
        vc[tid] += 1
        t = _Thread(vc, tid, pid, self)
        t.fence_vc, t.fence_sys = self.start, True        # a kernel starts after a full fence
        _T.t = t

    def program_end(self):
        t = getattr(_T, "t", None)
        _T.t = None
        if t is not None:
            self.st.fence(t, "acquire", True)              # and ends with one
            with self.lock:
                np.maximum(self.join, t.vc, out=self.join)

    def end(self, name, failed=False):
        st = self.st
        # the host continues after every program, also those of a failed launch (their accesses stay in the
        # shadow memory: without this join they would race with everything this rank does next, e.g. the next
        # run of a SimCluster reusing the heap)
        np.maximum(st.host.vc, self.join, out=st.host.vc)
        st.host.vc[st.host.tid] += 1
        if failed:
            st.pending_reports.clear()     # the launch's own error is the one reported
            return
        take_reports(f"kernel {name}")


#: bytes of ordinary tensor arguments a launch shadows at most (beyond: fewer races found, none invented)
LOCAL_SHADOW_BYTES = 256 << 20


class _LocalShadow:
    """Shadow memory of one ordinary tensor argument range of a launch (this process only: no other rank can
    reach it), allocated at its first access."""

    def __init__(self, lo, hi, names):
        self.lo, self.hi, self.names = lo, hi, names
        self._arrays = None

    def arrays(self):
        if self._arrays is None:
            n = ((self.hi - self.lo) >> _GRAN) + 1
            a = [np.zeros(n, dtype=np.int64) for _ in range(_ARRAYS)]
            ns = type("_Arrays", (), {})()
            ns.w_ep, ns.w_info, ns.r_ep, ns.r_info, ns.old, *ns.same = a
            self._arrays = ns
        return self._arrays

    def describe(self, addr):
        for name, lo, nbytes, elem in self.names:
            if lo <= addr < lo + nbytes:
                return f"tensor argument '{name}' (not symmetric), element {(addr - lo) // elem}"
        return f"address {addr:#x} (an ordinary tensor argument)"


def _local_shadows(st, launch):
    spans = []
    for name, lo, nbytes in getattr(launch, "tensor_args", ()):
        if nbytes <= 0 or st.lo <= lo < st.hi:
            continue
        elem = dict(getattr(launch, "tensor_elems", {})).get(name, 1)
        spans.append((lo, lo + nbytes, name, elem))
    out, total = [], 0
    for lo, hi, name, elem in sorted(spans):
        if out and lo < out[-1].hi:
            out[-1].hi = max(out[-1].hi, hi)
            out[-1].names.append((name, lo, hi - lo, elem))
            continue
        if total + (hi - lo) > LOCAL_SHADOW_BYTES:
            continue
        total += hi - lo
        out.append(_LocalShadow(lo, hi, [(name, lo, hi - lo, elem)]))
    return out


def take_reports(what):
    st = _STATE
    if st is None or not st.pending_reports:
        return
    races, st.pending_reports = st.pending_reports, []
    raise DitronRaceError(f"race finder: {len(races)} data race(s) in {what} on rank {st.rank} "
                          f"({SEED_ENV}={st.seed}):", races)


def launch_begin(launch):
    st = state()
    return LaunchRace(st, launch) if st is not None else None


def maybe_yield():
    """At a synchronisation operation a program may let others run first."""
    st = _STATE
    t = getattr(_T, "t", None)
    if st is None or t is None:
        return
    from .events import current_launch
    launch = current_launch()
    if launch is None or launch.race is None or launch.race.rng.random() >= 0.25:
        return
    launch.blocked(+1)
    try:
        time.sleep(0.0005)
    finally:
        launch.blocked(-1)


def plain_access(kind, ptrs, mask, data, where=None, itemsize=None, group=None):
    """A plain load (``kind="read"``, ``data``: the values loaded) or store
    (``"write"``, ``data``: the values to store) of the calling program;
    returns replacement data for a load that reads stale values, else None.
    ``group``: elements per access (a vector load of ``group`` granules is
    one access: its stale values are the whole vector's or none)."""
    st = state()
    if st is None:
        return None
    if where is None:
        from ..lowering.sim import where as _where
        where = _where()
    return st.access(_thread(st), kind, ptrs, mask, data, where, itemsize, group)


#: keys of the barriers' clocks (heap words are keyed by their offset in the job's heaps + 1, which is
#: the same in every rank process; other words by their address, private to the process)
HOST_BARRIER, DEVICE_BARRIER, RUN_BOUNDARY = 1 << 62, (1 << 62) + 2, (1 << 62) + 4


def _keys(st, addrs, mask=None):
    a = np.asarray(addrs).reshape(-1).astype(np.uint64)
    if mask is not None:
        a = a[np.asarray(mask).reshape(-1).astype(bool)]
    # ascending, each once (np.unique's answer): a set of Python ints is cheaper for the few words that a signal
    # operation names (np.unique sorts a copy, ~10x the time for a handful)
    words = sorted(set(a.tolist())) if a.size <= 256 else [int(x) for x in np.unique(a)]
    lo, hi = st.lo, st.hi
    return [x - lo + 1 if lo <= x < hi else x for x in words]


def signal_release(addrs, sys_scope, mask=None):
    st = state()
    if st is not None:
        maybe_yield()
        st.release(_thread(st), _keys(st, addrs, mask), sys_scope)


def _live(addrs, mask):
    a = np.asarray(addrs).reshape(-1)
    return a if mask is None else a[np.asarray(mask).reshape(-1).astype(bool)]


def signal_acquire(addrs, sys_scope, mask=None):
    st = state()
    if st is not None:
        st.acquire(_thread(st), _keys(st, addrs, mask), sys_scope, _live(addrs, mask))


def signal_relaxed_read(addrs, mask=None):
    st = state()
    if st is not None:
        st.relaxed_read(_thread(st), _keys(st, addrs, mask), _live(addrs, mask))


def signal_relaxed_write(addrs, mask=None):
    st = state()
    if st is not None:
        st.relaxed_write(_thread(st), _keys(st, addrs, mask))


def fence(semantic, sys_scope):
    st = state()
    if st is not None:
        st.fence(_thread(st), semantic, sys_scope)


def rmw(phase, addrs, semantic, sys_scope, mask=None):
    """An atomic read-modify-write: the release half before (``"pre"``), the
    acquire half after (``"post"``) the memory operation."""
    if phase == "pre":
        if semantic in ("release", "acq_rel"):
            signal_release(addrs, sys_scope, mask)
        else:
            signal_relaxed_write(addrs, mask)
    else:
        if semantic in ("acquire", "acq_rel"):
            signal_acquire(addrs, sys_scope, mask)
        else:
            signal_relaxed_read(addrs, mask)


_SEM = {"MEM_SEMANTIC.ACQUIRE_RELEASE": "acq_rel", "MEM_SEMANTIC.ACQUIRE": "acquire",
        "MEM_SEMANTIC.RELEASE": "release", "MEM_SEMANTIC.RELAXED": "relaxed"}


def atomic_access(phase, ptrs, mask, sem, scope, where=None):
    """Triton's own atomics (``tl.atomic_*``)."""
    if _STATE is None and not enabled():
        return
    rmw(phase, ptrs, _SEM.get(sem, "acq_rel"), scope.endswith("SYSTEM"), mask)


def barrier(kind, gen, phase):
    """A barrier of all ranks (``kind``: ``"host"`` or ``"device"``, its
    generation ``gen``): every participant publishes its clock
    (``"arrive"``) and, once all arrived, joins everybody's (``"leave"``)."""
    st = state()
    if st is None:
        return
    key = {"host": HOST_BARRIER, "device": DEVICE_BARRIER}[kind] + gen % 2
    t = _thread(st)
    if phase == "arrive":
        st.shared.publish(key, t.vc)
        t.vc[t.tid] += 1
    else:
        c = st.shared.clock(key)
        if c is not None:
            np.maximum(t.vc, c, out=t.vc)


def run_boundary(phase):
    """Runs of a SimCluster: every rank's run ``k`` happens before run ``k+1``."""
    st = state()
    if st is None:
        return
    key = RUN_BOUNDARY
    if phase == "end":
        st.shared.publish(key, st.host.vc)
        st.host.vc[st.host.tid] += 1
    else:
        c = st.shared.clock(key)
        if c is not None:
            np.maximum(st.host.vc, c, out=st.host.vc)


def _provided():
    return sys.modules[__name__] if enabled() else None


provide("race", _provided)        # the sim lowering rules and the transport reach the race finder this way
