"""Skew injection: delay one simulated rank *inside* a kernel.

A protocol bug such as a consumer that waits for one segment too few only
shows when the producer of the missing segment is late.  On the simulator the
ranks usually run in step (and the cross-rank argument check of every zoo op
acts as a host barrier, so a sleep before the call does not help): this
module makes rank ``r`` sleep at its ``k``-th synchronisation event, in the
middle of a kernel or of a host-side copy-engine protocol.

Events (counted per rank process, from the moment the plan is set):

* ``"signal"``: after a signal is delivered -- ``dl.notify``,
  ``dl.release_tile``, ``shmem.putmem_signal`` / ``signal_op`` and the host's
  ``write_value`` (copy-engine protocols).  Everything the rank does after its
  ``k``-th signal is late: the words it has not signalled yet stay unset.
* ``"wait"``: before a wait starts polling (``dl.wait``, ``dl.wait_deps``,
  ``shmem.signal_wait_until``, the host's ``wait_value``).
* ``"program"``: when a program of a kernel starts (``kernel``: a substring
  of the kernel's name, ``program``: its linear program id; either may be
  left out): that program of the rank starts late, its peers' programs not.
  ``stagger=True``: program ``p`` of the rank sleeps ``seconds * (p + 1)``
  (the rank's last programs are the latest).
* ``"any"``: a signal or a wait.

``nth=0`` delays at every such event.  ``until_idle=True`` makes the delay
event-ordered instead of timed: the rank waits until every other rank is
idle -- blocked in a wait (most likely for this rank) or done -- and has made
no progress for a moment, at most ``seconds``.  A correct protocol makes the
others wait for the late rank, so it costs little; a consumer that waits for
too few signals runs to the end on stale data first, whatever the machine's
load.  Use it from code that runs on the
ranks (a test body)::

    from ditron.sim import skew
    with skew.delay(rank=1, at="signal", nth=1, seconds=0.05):
        out = ag_gemm(a, b, ctx)

or for a whole simulated job: ``DITRON_SIM_SKEW="rank=1,at=signal,nth=1,seconds=0.05" ditron sim -n 4 x.py``.
GPUs never consult it: the GPU lowering rules have no hook (free there).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

from ..lowering import provide, provided

EVENTS = ("signal", "wait", "program", "any")
_LOCK = threading.Lock()
_STATE = {"plan": None, "count": 0, "hits": 0}


def _check(rank, at, nth, seconds, kernel=None, program=None, stagger=False, until_idle=False):
    if at not in EVENTS:
        raise ValueError(f"skew: at={at!r}; use one of {', '.join(EVENTS)}")
    if int(nth) < 0 or float(seconds) < 0:
        raise ValueError(f"skew: nth ({nth}) and seconds ({seconds}) must be >= 0")
    if (kernel is not None or program is not None) and at != "program":
        raise ValueError("skew: kernel= and program= select programs: use at='program'")
    if stagger and at != "program":
        raise ValueError("skew: stagger=True staggers program starts: use at='program'")
    return {"rank": int(rank), "at": at, "nth": int(nth), "seconds": float(seconds), "kernel": kernel,
            "program": None if program is None else int(program), "stagger": bool(stagger),
            "until_idle": bool(until_idle)}


def parse(text):
    """``"rank=1,at=signal,nth=2,seconds=0.05"`` -> a plan (at, nth, seconds optional)."""
    kv = dict(p.split("=", 1) for p in text.replace(" ", "").split(",") if p)
    unknown = set(kv) - {"rank", "at", "nth", "seconds", "kernel", "program", "until_idle"}
    if "rank" not in kv or unknown:
        raise ValueError(f"DITRON_SIM_SKEW={text!r}: give rank=R[,at=signal|wait|program|any][,nth=K][,seconds=S]"
                         "[,kernel=NAME][,program=P]")
    return _check(kv["rank"], kv.get("at", "signal"), kv.get("nth", 1), kv.get("seconds", 0.05), kv.get("kernel"),
                  kv.get("program"), until_idle=kv.get("until_idle", "0") not in ("0", ""))


def set_plan(plan):
    with _LOCK:
        _STATE.update(plan=plan, count=0, hits=0)


@contextlib.contextmanager
def delay(rank, at="signal", nth=1, seconds=0.05, kernel=None, program=None, stagger=False, until_idle=False):
    """Make ``rank`` sleep ``seconds`` at its ``nth`` event ``at`` (see the
    module docstring) while the block runs; yields a dict whose ``"hits"`` is
    how many delays happened on this rank."""
    plan = _check(rank, at, nth, seconds, kernel, program, stagger, until_idle)
    saved = _STATE["plan"]
    set_plan(plan)
    try:
        yield _STATE
    finally:
        set_plan(saved)


def point(event, kernel=None, program=None):
    """Called by the simulator at each event of this rank (``kernel`` / ``program``: the name and linear id
    of a starting program)."""
    plan = _STATE["plan"]
    if plan is None or plan["at"] != event and not (plan["at"] == "any" and event != "program"):
        return
    if event == "program" and (plan["kernel"] is not None and plan["kernel"] not in (kernel or "")
                               or plan["program"] is not None and plan["program"] != program):
        return
    world = provided("world")
    if world is None or world.rank != plan["rank"]:
        return
    with _LOCK:
        _STATE["count"] += 1
        hit = plan["nth"] == 0 or _STATE["count"] == plan["nth"]
        if hit:
            _STATE["hits"] += 1
    if hit:
        seconds = plan["seconds"] * ((program or 0) + 1 if plan["stagger"] else 1)
        if plan["until_idle"]:
            _until_others_idle(world, seconds)
        else:
            time.sleep(seconds)


#: how long the other ranks must stay idle (no thread running, no progress) before the late rank goes on
SETTLE_S = 0.05


def _until_others_idle(world, cap):
    from .. import sim_memory as M
    ctl = world.transport.control
    me = world.rank
    end = time.monotonic() + cap
    last, since = None, time.monotonic()
    while True:
        now = time.monotonic()
        if now >= end:
            return
        idle = all(ctl.rank_get(r, M.R_DONE) or ctl.rank_get(r, M.R_ACTIVE) <= 0
                   for r in range(world.world_size) if r != me)
        progress = ctl.get(M.H_PROGRESS)
        if not idle or progress != last:
            last, since = progress, now
        elif now - since >= SETTLE_S:
            return
        time.sleep(0.002)


def plan_from_env():
    """The job's plan, ``DITRON_SIM_SKEW``, as importing this module reads it (none: no plan).  A rank forked
    from a server that imported this module calls it again once it has its own environment."""
    raw = os.environ.get("DITRON_SIM_SKEW")
    set_plan(parse(raw) if raw else None)


plan_from_env()

provide("skew", lambda: point)        # the simulator's rules and transport reach the hook this way
