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
from .executor import current_launch, current_program


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
    key = (loc, int(addrs[live[0]]), addrs.size)

    def describe():
        i = live[0]
        flat = np.asarray(vals).reshape(-1)
        return {"rank": tr.rank, "program": prog, "primitive": primitive, "where": loc,
                "signal": "polled " + tr.describe_addr(int(addrs[i])) +
                          (f" (element 0 of {live.size} polled)" if live.size > 1 else ""),
                "expected": "another value (a polling loop; nobody writes this address)",
                "observed": flat[i].item() if flat.size > i else None}

    tr.poll(key, np.asarray(vals).reshape(-1)[live], describe, launch)


def end_poll():
    """A writing op of a program ends any polling loop it was in."""
    from ..runtime.sim import _POLL
    if _POLL.__dict__:
        launch = current_launch()
        if launch is not None and launch.transport is not None:
            launch.transport.poll_end(launch)


def plain_hooks() -> bool:
    """Whether plain loads and stores must reach the hooks (race finder, megakernel access check)."""
    return race.enabled() or taskcheck.active()


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
    taskcheck.record("read", ptrs, mask, np.asarray(data).dtype.itemsize, _where)
    return race.plain_access("read", ptrs, mask, data)


def interp_store(ptrs, mask, data):
    end_poll()
    taskcheck.record("write", ptrs, mask, np.asarray(data).dtype.itemsize, _where)
    race.plain_access("write", ptrs, mask, data)


def tile_released(slot_addr):
    """``dl.release_tile``: the megakernel access check of the tile it ends."""
    launch = current_launch()
    taskcheck.released(slot_addr, current_program(), launch.transport.rank if launch and launch.transport else 0)


def interp_atomic(phase, ptrs, mask, sem, scope):
    if phase == "pre":
        end_poll()
    race.atomic_access(phase, ptrs, mask, sem, scope)


provide("access", lambda: sys.modules[__name__])     # the sim lowering rules reach the polling hooks this way
