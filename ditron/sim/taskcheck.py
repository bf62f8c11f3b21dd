"""Megakernel access checking on the simulator.

While a :class:`~ditron.task.Megakernel` step runs on the simulator, every
plain load and store of its tile functions (``tl.load`` / ``tl.store``) is
checked against what the task declared:

* a store into a tensor of the graph that is not in the task's ``writes=``;
* a load of data some task of the graph writes, from a tensor that is not in
  the task's ``reads=`` (or ``writes=``);
* per tile: a load of an element that another tile wrote in this step
  (read-after-write), a store over an element another tile wrote
  (write-after-write) or read (write-after-read) in this step, where neither
  tile is ordered before the other by the declared ``Dep`` ranges (directly or
  through other tasks).

The order the scheduler happens to run the tiles in does not matter: only the
declared dependencies order two tiles, so a ``Dep`` range that is too narrow
is an error even when the run happens to give the right numbers.

Accesses are collected per program and checked when the tile releases its
scoreboard slot (``dl.release_tile``, which names the work item).  Symmetric
tensors that no task declares (the communication tasks' staging buffers and
signal words, synchronised by signals, not by the scoreboard) are not
checked; the race finder covers them.  ``DITRON_SIM_TASKCHECK=0`` turns the
check off.
"""
from __future__ import annotations

import bisect
import os
import threading

import numpy as np

from ..errors import DitronError

ENV = "DITRON_SIM_TASKCHECK"

_ACTIVE = None
_T = threading.local()
#: ``record`` drops the loads of regions that no task writes (the same answers: tests/test_sim_interp_fast.py)
SKIP_UNWRITTEN = True
#: ``Checker.check`` tells an access inside one region and inside the task's own tensors by its bounds (the same)
BOUNDS_SHORTCUT = True


def enabled() -> bool:
    return os.environ.get(ENV, "1") not in ("0", "")


def active() -> bool:
    return _ACTIVE is not None


def _span(t):
    n = t.numel()
    if n == 0:
        return t.data_ptr(), t.data_ptr()
    extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


class _Spans:
    """A union of byte ranges ``[lo, hi)``, merged and sorted once, so membership of a tile's addresses is
    one binary search each (``covered``) instead of a pass per range; ``index`` tells which of the given
    (disjoint, sorted) ranges holds each address."""

    def __init__(self, spans, merge=True):
        merged = []
        for lo, hi in sorted((int(lo), int(hi)) for lo, hi in spans if hi > lo):
            if merge and merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.lo = np.array([m[0] for m in merged], dtype=np.uint64)
        self.hi = np.array([m[1] for m in merged], dtype=np.uint64)
        self._lo, self._hi = [m[0] for m in merged], [m[1] for m in merged]

    def none_in(self, amin, amax):
        """Whether no range meets ``[amin, amax]`` (the bounds of some addresses: then none of them is covered)."""
        k = bisect.bisect_right(self._lo, amin) - 1
        return bisect.bisect_right(self._lo, amax) - 1 == k and (k < 0 or amin >= self._hi[k])

    def holding(self, amin, amax):
        """The position of the range holding every address of ``[amin, amax]`` (the bounds of some addresses: then
        it holds each of them), -1 if no one range does."""
        k = bisect.bisect_right(self._lo, amin) - 1
        return k if k >= 0 and amax < self._hi[k] else -1

    def index(self, a):
        """Per address: the position of the range holding it, -1 if none."""
        if self.lo.size == 0:
            return np.full(a.shape, -1, dtype=np.int64)
        i = np.searchsorted(self.lo, a, side="right").astype(np.int64) - 1
        inside = i >= 0
        inside[inside] = a[inside] < self.hi[i[inside]]
        return np.where(inside, i, -1)

    def covered(self, a):
        return self.index(a) >= 0


def _ascending_unique(x):
    """``np.unique(x)`` (a 1-D integer array), cheaper when ``x`` holds one value (an access in one region)."""
    if x.size == 0:
        return x
    lo, hi = x.min(), x.max()
    if lo == hi:
        return x[:1]
    return np.unique(x)


class _Region:
    """Merged byte range of overlapping graph tensors, with per-granule shadows."""

    def __init__(self, lo, hi, gran):
        self.lo, self.hi, self.gran = lo, hi, gran
        n = (hi - lo + gran - 1) // gran
        self.writer = np.full(n, -1, dtype=np.int64)
        self.reader = np.full(n, -1, dtype=np.int64)

    def reset(self):
        self.writer.fill(-1)
        self.reader.fill(-1)


class Checker:
    """The declarations of one megakernel, and the shadows of one step."""

    def __init__(self, mk, is_symmetric):
        self.mk = mk
        self.name = mk.graph.name
        self.items = mk.items
        self.waits = mk._waits
        self.slots_base = mk.slots.data_ptr()
        self._closure = {}
        self._after_mask = {}
        tasks = mk.graph.tasks
        declared_anywhere = set()
        for t in tasks:
            for k in t.reads + t.writes:
                declared_anywhere.add(id(t.args[k]))
        # per task: spans of tensor args by role; [(lo, hi, arg name, tensor)]
        self.args = []
        self.read_spans, self.write_spans = [], []
        all_spans, written = [], []
        for t in tasks:
            mine = []
            for k, v in t.args.items():
                if not (hasattr(v, "data_ptr") and hasattr(v, "element_size")):
                    continue
                lo, hi = _span(v)
                if hi <= lo:
                    continue
                if id(v) not in declared_anywhere and is_symmetric(v):
                    continue                     # signal-synchronised staging: the race finder's job
                mine.append((lo, hi, k, v))
                all_spans.append((lo, hi, v.element_size()))
            self.args.append(mine)
            self.read_spans.append([(lo, hi) for lo, hi, k, _ in mine if k in t.reads or k in t.writes])
            self.write_spans.append([(lo, hi) for lo, hi, k, _ in mine if k in t.writes])
            written += self.write_spans[-1]
        self.written = written
        self.regions = []
        for lo, hi, g in sorted(all_spans):
            if self.regions and lo < self.regions[-1][1]:
                r = self.regions[-1]
                r[1], r[2] = max(r[1], hi), min(r[2], g)
            else:
                self.regions.append([lo, hi, g])
        self.regions = [_Region(lo, hi, g) for lo, hi, g in self.regions]
        self._read_sets = [_Spans(sp) for sp in self.read_spans]
        self._write_sets = [_Spans(sp) for sp in self.write_spans]
        self._written_set = _Spans(self.written)
        self._region_set = _Spans([(r.lo, r.hi) for r in self.regions], merge=False)   # disjoint, sorted: index = region
        # the regions some task writes: a load anywhere else (the weights, say) can never be a hazard or an
        # undeclared read of written data, and its reader shadow is never consulted (a store there is an
        # undeclared write, an error before any shadow is read), so ``record`` drops such loads before ``check``
        wlo, whi = self._written_set.lo, self._written_set.hi
        self._written_regions = _Spans([(r.lo, r.hi) for r in self.regions
                                        if ((wlo < np.uint64(r.hi)) & (whi > np.uint64(r.lo))).any()], merge=False)
        self.lo = min((r.lo for r in self.regions), default=0)
        self.hi = max((r.hi for r in self.regions), default=0)

    # -- ordering ----------------------------------------------------------------------
    def closure(self, i):
        """Bit set (a Python int) of the items item ``i`` is ordered after by its Deps."""
        c = self._closure.get(i)
        if c is None:
            stack, order = [i], []
            while stack:                         # iterative post-order (deep chains)
                j = stack[-1]
                if j in self._closure:
                    stack.pop()
                    continue
                pending = [s for f, n in self.waits[j] for s in range(f, f + n) if s not in self._closure]
                if pending:
                    stack.extend(pending)
                    continue
                stack.pop()
                bits = 0
                for f, n in self.waits[j]:
                    for s in range(f, f + n):
                        bits |= (1 << s) | self._closure[s]
                self._closure[j] = bits
            c = self._closure[i]
        return c

    def _after(self, i, others):
        """Mask: item ``i`` is ordered after each of ``others`` (or is it)."""
        ok = self._after_mask.get(i)
        if ok is None:
            # per item, once: element x tells whether bit x of the closure is set, or x is i (no sort per access)
            c = self.closure(i) | (1 << i)               # (bits: item indices, below len(self.items))
            bits = np.frombuffer(c.to_bytes((len(self.items) + 7) // 8, "little"), dtype=np.uint8)
            ok = self._after_mask[i] = np.unpackbits(bits, bitorder="little").astype(bool)
        return ok[others]

    # -- reports -----------------------------------------------------------------------
    def _tensor(self, task, addr):
        """(name, element text) of the graph tensor holding ``addr``, preferring the task's own arguments."""
        cands = self.args[task.index] + [a for k, lst in enumerate(self.args) if k != task.index for a in lst]
        for lo, hi, k, v in cands:
            if lo <= addr < hi:
                who = f"'{k}'" if any(a is v for *_, a in self.args[task.index]) else \
                    f"'{k}' (an argument of another task)"
                el = (addr - lo) // v.element_size()
                idx = ""
                if v.is_contiguous() and v.dim() > 1:
                    idx = f" = index {tuple(int(x) for x in np.unravel_index(el, tuple(v.shape)))}"
                return who, f"element {el}{idx}"
        return f"at address {addr:#x}", "?"

    def _item(self, j):
        it = self.items[int(j)]
        return f"task '{it.task.name}' tile {it.tile}"

    def _error(self, item, text, where, prog, rank):
        return DitronError(f"megakernel '{self.name}': task '{item.task.name}' tile {item.tile} (rank {rank}, "
                           f"program {prog}) {text} (at {where})")

    def _dep_hint(self, item, other):
        o = self.items[int(other)]
        if o.task.index > item.task.index:          # the later task must wait for this one
            item, o = o, item
        deps = [d for d in item.task.deps if d.task is o.task]
        if deps:
            rng = [r for d in deps for r in d.ranges(item.task, item.tile)]
            have = "tiles " + ", ".join(f"[{lo}, {hi})" for lo, hi in rng) if rng else "no tiles"
            return (f"the Dep of '{item.task.name}' on '{o.task.name}' covers {have} of '{o.task.name}' for tile "
                    f"{item.tile}, not tile {o.tile}: widen the Dep range")
        return f"'{item.task.name}' has no Dep (direct or through other tasks) on '{o.task.name}' tile {o.tile}"

    # -- the check ---------------------------------------------------------------------
    def check(self, item, kind, a, itemsize, where, prog, rank):
        task = item.task
        i = item.index
        own_set = (self._write_sets if kind == "write" else self._read_sets)[task.index]
        if BOUNDS_SHORTCUT:
            # the common access: all its addresses in one region, and in the task's own declared tensors (then
            # nothing is undeclared): told by the bounds, without a search per address
            amin, amax = int(a.min()), int(a.max())
            one = self._region_set.holding(amin, amax)
            whole = own_set.holding(amin, amax) >= 0
        else:
            one, whole = -1, False
        region = None if one >= 0 else self._region_set.index(a)
        if not whole:
            own = own_set.covered(a)
            if kind == "write":
                bad = ~own if region is None else (region >= 0) & ~own
                if bad.any():
                    addr = int(a[np.flatnonzero(bad)[0]])
                    name, el = self._tensor(task, addr)
                    raise self._error(item, f"stores to tensor {name} {el}, but that tensor is not in its writes=: "
                                      f"declare it (register_task('{task.name}', ..., writes=(...)))", where, prog,
                                      rank)
            else:
                bad = self._written_set.covered(a) & ~own
                if bad.any():
                    addr = int(a[np.flatnonzero(bad)[0]])
                    name, el = self._tensor(task, addr)
                    raise self._error(item, f"loads tensor {name} {el}, which tasks of the graph write, but that "
                                      f"tensor is not in its reads=: declare it (register_task('{task.name}', ..., "
                                      "reads=(...))) so the graph can order it", where, prog, rank)
        if region is None:
            groups = ((one, a),)
        else:                                               # ascending: the regions' order
            groups = [(int(ri), a[region == ri]) for ri in _ascending_unique(region[region >= 0])]
        for ri, aa in groups:
            r = self.regions[ri]
            g = ((aa - np.uint64(r.lo)) // np.uint64(r.gran)).astype(np.int64)
            per = max(1, itemsize // r.gran)
            if per > 1:
                g = (g[:, None] + np.arange(per)[None, :]).reshape(-1)
                aa = np.repeat(aa, per)
            g = np.minimum(g, r.writer.size - 1)
            w = r.writer[g]
            has_w = w >= 0
            if has_w.any():
                bad = np.zeros(g.shape, dtype=bool)
                bad[has_w] = ~self._after(i, w[has_w])
                if bad.any():
                    k = int(np.flatnonzero(bad)[0])
                    name, el = self._tensor(task, int(aa[k]))
                    what = "loads" if kind == "read" else "stores to"
                    hazard = "read-after-write" if kind == "read" else "write-after-write"
                    raise self._error(item, f"{what} tensor {name} {el}, which {self._item(w[k])} wrote in this "
                                      f"step, but the tiles are not ordered ({hazard}): "
                                      f"{self._dep_hint(item, w[k])}", where, prog, rank)
            if kind == "read":
                r.reader[g] = i
            else:
                rd = r.reader[g]
                has_r = (rd >= 0) & (rd != i)
                if has_r.any():
                    bad = np.zeros(g.shape, dtype=bool)
                    bad[has_r] = ~self._after(i, rd[has_r])
                    if bad.any():
                        k = int(np.flatnonzero(bad)[0])
                        name, el = self._tensor(task, int(aa[k]))
                        raise self._error(item, f"stores to tensor {name} {el}, which {self._item(rd[k])} read in "
                                          f"this step, but the tiles are not ordered (write-after-read): "
                                          f"{self._dep_hint(item, rd[k])}", where, prog, rank)
                r.writer[g] = i
                r.reader[g] = -1


class checking:
    """Context manager around one megakernel step on the simulator."""

    def __init__(self, mk, is_symmetric):
        self.mk = mk
        self.is_symmetric = is_symmetric

    def __enter__(self):
        global _ACTIVE
        if not enabled():
            return self
        ck = self.mk.__dict__.get("_taskcheck")
        if ck is None:
            ck = self.mk._taskcheck = Checker(self.mk, self.is_symmetric)
        for r in ck.regions:
            r.reset()
        _ACTIVE = ck
        return self

    def __exit__(self, *exc):
        global _ACTIVE
        _ACTIVE = None
        return False


def record(kind, ptrs, mask, itemsize, where):
    """A plain load or store of the calling program (``where``: a callable giving the source line)."""
    ck = _ACTIVE
    if ck is None:
        return
    a = np.asarray(ptrs).reshape(-1).astype(np.uint64, copy=False)
    if mask is not None:
        a = a[np.asarray(mask).reshape(-1).astype(bool)]
    if a.size == 0:
        return
    amin, amax = int(a.min()), int(a.max())
    if kind == "read" and SKIP_UNWRITTEN:
        if ck._written_regions.none_in(amin, amax):
            return                                   # loads of regions no task writes (weights): nothing to check
        if not BOUNDS_SHORTCUT or ck._written_regions.holding(amin, amax) < 0:
            a = a[ck._written_regions.covered(a)]    # (all in one written region: all of them are kept)
    elif amax < ck.lo or amin >= ck.hi:
        return
    elif amin < ck.lo or amax >= ck.hi:
        a = a[(a >= np.uint64(ck.lo)) & (a < np.uint64(ck.hi))]
    if a.size == 0:
        return
    pend = getattr(_T, "pending", None)
    if pend is None or _T.checker is not ck:
        pend = _T.pending = []
        _T.checker = ck
    pend.append((kind, a.copy(), itemsize, where()))


def released(slot_addr, prog, rank):
    """``dl.release_tile`` of the calling program: check the accesses of the tile it ends."""
    ck = _ACTIVE
    if ck is None:
        return
    pend = getattr(_T, "pending", None) or []
    _T.pending = []
    _T.checker = ck
    slot = (int(slot_addr) - ck.slots_base) // 4
    if not 0 <= slot < len(ck.items):
        return                                   # the sink slot (a planted missing release)
    item = ck.items[slot]
    for kind, a, itemsize, where in pend:
        ck.check(item, kind, a, itemsize, where, prog, rank)
