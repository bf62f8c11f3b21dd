"""The simulator's view of the interpreter's memory operations and of
polling loops.

* :func:`polled`: a polling load (``dl.ld``, ``tl.load(volatile=True)``);
  a program that keeps reading the same value counts as blocked and lends
  its turn (``SimTransport.poll``), so the watchdog reports the hang;
* ``interp_load`` / ``interp_store`` / ``interp_atomic``: the hooks that
  ``ditron._compat.ACCESS_HOOKS`` calls on Triton's loads, stores and
  atomics (polling, and the race finder's checks in race mode).
"""
from __future__ import annotations

import sys

import numpy as np

from .. import _compat
from ..lowering import provide
from . import race, taskcheck
from .events import current_launch, current_program


def polled(addrs, mask, vals, primitive):
    """A polling load of the current program (``dl.ld``, ``tl.load(volatile=True)``)
    read ``vals``: a program that keeps reading the same value there counts
    as blocked and lends its turn (see ``SimTransport.poll``)."""
    from ..lowering.sim import where
    launch = current_launch()
    if launch is None or launch.transport is None:
        return
    tr = launch.transport
    addrs = np.asarray(addrs).reshape(-1)
    if addrs.size == 0:
        return
    live = np.flatnonzero(np.asarray(mask).reshape(-1)) if mask is not None else np.arange(addrs.size)
    if live.size == 0:
        return
    loc = where()
    prog = current_program()
    key = (loc, addrs.size)

    def describe():
        i = live[0]
        flat = np.asarray(vals).reshape(-1)
        return {"rank": tr.rank, "program": prog, "primitive": primitive, "where": loc,
                "signal": "polled " + tr.describe_addr(int(addrs[i])) +
                          (f" (element 0 of {live.size} polled)" if live.size > 1 else ""),
                "expected": "another value (a polling loop; nobody writes this address)",
                "observed": flat[i].item() if flat.size > i else None}

    tr.poll(key, np.asarray(vals).reshape(-1)[live], describe, launch, addr=int(addrs[live[0]]))
    lanes = _compat.simt_lanes()
    if lanes is not None:
        # a lane of a region run as cooperative lanes (ditron.sim.simt.Lanes) that reads the same value again
        # spins: the other lanes of its program run first (one of them may set the flag)
        from ..runtime.sim import _POLL
        if _POLL.__dict__.get("repeats", 0) >= 1:
            lanes.spin(_compat.simt_thread())


def end_poll():
    """A writing op of a program ends any polling loop it was in."""
    from ..runtime.sim import _POLL
    if _POLL.__dict__:
        launch = current_launch()
        if launch is not None and launch.transport is not None:
            launch.transport.poll_end(launch)


_RACE = [False]


def plain_hooks() -> bool:
    """Whether plain loads and stores reach the hooks: always on the simulator (tensor bounds of symmetric
    accesses, the megakernel access check, the race finder).  Called at each launch."""
    _RACE[0] = race.enabled()
    return True


def _where():
    from ..lowering.sim import where
    return where()


def interp_load(ptrs, mask, data, volatile):
    """Hook on the interpreter's loads (``_compat.ACCESS_HOOKS``)."""
    if volatile:
        if _compat.ACCESS_HOOKS.plain:
            race.signal_relaxed_read(ptrs, mask)      # a relaxed read of a flag (race finder)
        polled(ptrs, mask, data, "tl.load(volatile=True)")
        return None
    itemsize = np.asarray(data).dtype.itemsize
    heap_bounds(ptrs, mask, itemsize, "read")
    taskcheck.record("read", ptrs, mask, itemsize, _where)
    return race.plain_access("read", ptrs, mask, data) if _RACE[0] else None


def plain_vector(kind, ptrs, itemsize):
    """A weak vector load / store (``ld_vec`` / ``st_vec``) at the element addresses ``ptrs``: the tensor bounds
    and the megakernel access check of a plain access (the race finder is called by the rule itself)."""
    heap_bounds(ptrs, None, itemsize, kind)
    taskcheck.record(kind, ptrs, None, itemsize, _where)


def interp_store(ptrs, mask, data):
    end_poll()
    itemsize = np.asarray(data).dtype.itemsize
    heap_bounds(ptrs, mask, itemsize, "write")
    taskcheck.record("write", ptrs, mask, itemsize, _where)
    if _RACE[0]:
        race.plain_access("write", ptrs, mask, data)


def _elem_size(dtype):
    import torch
    return torch.empty((), dtype=dtype).element_size()


#: how far past the end (or before the start) of a tensor argument a per-thread write counts as an index past it
_NEAR = 1 << 16


def thread_write_bounds(addrs, itemsize, primitive):
    """A write of a per-thread primitive (``dl.st``, ``dl.atomic_*``: raw addresses, which the simulator writes
    in the host's memory): in the symmetric heaps, inside a live symmetric tensor (as ``tl.store``); elsewhere,
    not just past the end (or before the start) of a tensor argument of the launch -- an index past the tensor,
    which on a GPU overwrites whatever follows it (and on the simulator the host's memory).  Addresses far from
    every argument (a pointer read from memory) are not checked."""
    launch = current_launch()
    if launch is None or launch.transport is None:
        return
    tr = launch.transport
    lo = tr.heap_base(0)
    hi = lo + tr.world_size * tr.heap_size
    a = np.asarray(addrs).reshape(-1)
    if a.size == 1:                        # the common case (one thread's scalar): Python ints
        x = int(a[0])
        if lo <= x < hi:
            heap_bounds(a, None, itemsize, "write", primitive)
            return
        args = launch.tensor_args
        if any(start <= x and x + itemsize <= start + max(nbytes, 1) for _, start, nbytes in args):
            return
        for name, start, nbytes in args:
            end = start + nbytes
            if end < x + itemsize <= end + _NEAR or start - _NEAR <= x < start:
                _past(launch, tr, name, start, nbytes, x, itemsize, primitive)
        return
    heap_bounds(a, None, itemsize, "write", primitive)
    args = launch.tensor_args
    if not args:
        return
    a = a.astype(np.int64)
    a = a[(a < lo) | (a >= hi)]
    if a.size == 0:
        return
    inside = np.zeros(a.size, dtype=bool)
    for _, start, nbytes in args:
        inside |= (a >= start) & (a + itemsize <= start + max(nbytes, 1))
    a = a[~inside]
    for name, start, nbytes in args:
        end = start + nbytes
        near = a[((a + itemsize > end) & (a < end + _NEAR)) | ((a < start) & (a >= start - _NEAR))]
        if near.size:
            _past(launch, tr, name, start, nbytes, int(near[0]), itemsize, primitive)


def _past(launch, tr, name, start, nbytes, addr, itemsize, primitive):
    from ..lowering.sim import where
    elem = launch.tensor_elems.get(name, itemsize) or itemsize
    el = (addr - start) // elem
    side = "past its end" if el >= 0 else "before its start"
    raise _bounds_error(f"rank {tr.rank}, program {current_program()}, at {where()}: {primitive} writes element {el} "
                        f"of argument '{name}', {side} ({nbytes // elem} elements): on a GPU it overwrites whatever "
                        "memory is there; guard the index")


def heap_bounds(ptrs, mask, itemsize, kind, primitive=None):
    """Tensor bounds, not heap bounds: a plain load / store (``tl.load`` / ``tl.store``, also through
    ``dl.symm_at``) whose lanes in the symmetric heaps leave the symmetric tensor of its lowest lane (or fall
    outside every live tensor) is an error naming the tensor, the element and the rank."""
    launch = current_launch()
    if launch is None or launch.transport is None:
        return
    tr = launch.transport
    a = np.asarray(ptrs).reshape(-1)
    if a.size == 0:
        return
    lo = tr.heap_base(0)
    hi = lo + tr.world_size * tr.heap_size
    amin, amax = int(a.min()), int(a.max())
    if amax < lo or amin >= hi:
        return                                     # no lane in the heaps (an ordinary tensor): the common case
    if mask is not None:
        m = np.asarray(mask).reshape(-1)
        a = a[m if m.dtype == bool else m.astype(bool)]
        if a.size == 0:
            return
        amin, amax = int(a.min()), int(a.max())
    hs = tr.heap_size
    if lo <= amin and amax < hi and (amin - lo) // hs == (amax - lo) // hs:
        # fast path: one rank's copy, inside the tensor of the lowest lane
        import bisect
        starts, ends = tr.heap.bounds_lists()
        o_min, o_max = (amin - lo) % hs, (amax - lo) % hs
        i = bisect.bisect_right(starts, o_min) - 1
        if i >= 0 and o_max + itemsize <= ends[i]:
            return
    a = a.astype(np.int64)
    a = a[(a >= lo) & (a < hi)]
    starts, ends = tr.heap.bounds_tables()
    rel = a - lo
    off = rel % tr.heap_size
    idx = np.searchsorted(starts, off, side="right") - 1
    first = int(np.argmin(a))
    home = int(idx[first])
    ok = (idx == home) & (home >= 0)
    if home >= 0:
        ok &= off + itemsize <= ends[home]
    if ok.all():
        return
    bad = int(np.flatnonzero(~ok)[0])
    rank = int(rel[bad] // tr.heap_size)
    verb = "stores to" if kind == "write" else "loads from"
    from ..lowering.sim import where
    prog = current_program()
    who = f"rank {tr.rank}, program {prog}, at {where()}"
    prim = primitive or f"tl.{'store' if kind == 'write' else 'load'}"
    if home < 0:
        raise _bounds_error(f"{who}: {prim} {verb} rank "
                            f"{int(rel[first] // tr.heap_size)}'s copy of the symmetric heap outside every live "
                            f"symmetric tensor: {tr.heap.describe_gap(int(off[first]))}")
    alloc = tr.heap.allocations[home]
    elem = _elem_size(alloc.dtype)
    el = (int(off[bad]) - alloc.offset) // elem
    n = alloc.nbytes // elem
    other = tr.heap.allocation_at(int(off[bad]))
    into = f"; the address is in {other.label()}" if other is not None else ""
    raise _bounds_error(f"{who}: {prim} {verb} {alloc.label()} on rank {rank} "
                        f"at element {el}, past its end ({n} elements){into}: mask the lanes past the tensor")


def _bounds_error(text):
    from ..errors import DitronError
    return DitronError("out of bounds: " + text)


def tile_released(slot_addr):
    """``dl.release_tile``: the megakernel access check of the tile it ends."""
    launch = current_launch()
    taskcheck.released(slot_addr, current_program(), launch.transport.rank if launch and launch.transport else 0)


def interp_atomic(phase, ptrs, mask, sem, scope):
    if not _RACE[0]:
        return                   # as before the plain-access hooks were always on: atomics are the race finder's
    if phase == "pre":
        end_poll()
    race.atomic_access(phase, ptrs, mask, sem, scope)


provide("access", lambda: sys.modules[__name__])     # the sim lowering rules reach the polling hooks this way
