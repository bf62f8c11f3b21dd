"""Where a megakernel step spends its time: per-item timestamps from a
kernel compiled with ``trace=True`` (``g.compile(trace=True)``), summed per
kind of task.

Each item records ``clock_ns`` at its start (before the prefetch and the
dependency wait), when its dependencies were satisfied, and after its
release, plus the program that ran it.  :func:`summarize` groups the items of
tasks that differ only in a trailing ``.<number>`` (``qkv.0`` ... ``qkv.35``
are the kind ``qkv``) and reports, per kind:

* ``tiles``: items run;
* ``wait_us``: time programs spent in the kind's dependency waits (summed
  over items: program-microseconds);
* ``run_us``: time from the satisfied wait to the release (summed);
* ``span_us``: per task instance, last release minus first ready, summed over
  the kind's instances: how long the kind was "in progress" on the timeline
  (instances of different kinds overlap, so spans do not add up to the step).

``step_us`` is the first start to the last release over all items; ``busy``
is the summed run time over ``programs x step_us``: the fraction of program
time spent running tiles rather than waiting or idling.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


def kind_of(task_name: str) -> str:
    """``qkv.12`` -> ``qkv``; names without a trailing number are their own kind."""
    return re.sub(r"\.\d+$", "", task_name)


@dataclass
class KindRow:
    kind: str
    tiles: int = 0
    instances: int = 0
    wait_us: float = 0.0
    run_us: float = 0.0
    span_us: float = 0.0


@dataclass
class Profile:
    step_us: float
    programs: int
    rows: list = field(default_factory=list)

    @property
    def busy(self) -> float:
        total = self.programs * self.step_us
        return sum(r.run_us for r in self.rows) / total if total > 0 else 0.0

    def table(self) -> str:
        out = [f"step {self.step_us:.1f} us on {self.programs} programs; programs busy running tiles "
               f"{100 * self.busy:.1f}% of the time",
               "| kind | instances | tiles | span us (sum) | run us (sum over tiles) | wait us (sum over tiles) | "
               "run us / tile |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in sorted(self.rows, key=lambda r: -r.span_us):
            out.append(f"| {r.kind} | {r.instances} | {r.tiles} | {r.span_us:.1f} | {r.run_us:.1f} | "
                       f"{r.wait_us:.1f} | {r.run_us / max(r.tiles, 1):.2f} |")
        return "\n".join(out)


def summarize(items, records, programs: int) -> Profile:
    """``records``: ``[n_items][4]`` ints (start, ready, end in ns; program) in item order."""
    if not len(items):
        return Profile(0.0, programs)
    t0 = min(int(r[0]) for r in records)
    t_end = max(int(r[2]) for r in records)
    rows: dict = {}
    inst: dict = {}
    for it, r in zip(items, records):
        start, ready, end = (int(v) for v in r[:3])
        kind = kind_of(it.task.name)
        row = rows.setdefault(kind, KindRow(kind))
        row.tiles += 1
        row.wait_us += (ready - start) / 1e3
        row.run_us += (end - ready) / 1e3
        lo, hi = inst.get(it.task.name, (ready, end))
        inst[it.task.name] = (min(lo, ready), max(hi, end))
    for name, (lo, hi) in inst.items():
        row = rows[kind_of(name)]
        row.instances += 1
        row.span_us += (hi - lo) / 1e3
    return Profile((t_end - t0) / 1e3, programs, list(rows.values()))


@dataclass
class PathRow:
    kind: str
    items: int = 0           # tiles of this kind on the critical path
    run_us: float = 0.0      # their run time (satisfied wait -> release)
    signal_us: float = 0.0   # the last producer's release -> the tile's satisfied wait (scoreboard latency)
    queue_us: float = 0.0    # the program's previous tile's release -> the satisfied wait, where the producers were
    #                          done before the tile started (the loop's row loads, a wait that finds every slot set)
    waited: int = 0          # tiles of this kind (anywhere in the step) whose producers were not done at their start
    lag_us: float = 0.0      # their summed signal latency (release of the last producer -> satisfied wait)


@dataclass
class CriticalPath:
    """The chain of tiles that ends the step, walked back from the last release: at each tile, to the producer
    tile that released last if it released after the tile started (a dependency wait), else to the previous tile
    of the same program (the tile waited for its program).  ``run_us + signal_us + queue_us`` over the rows is the
    step (first start to last release)."""
    step_us: float
    rows: list = field(default_factory=list)

    def table(self) -> str:
        run = sum(r.run_us for r in self.rows)
        sig = sum(r.signal_us for r in self.rows)
        que = sum(r.queue_us for r in self.rows)
        out = [f"critical path of the step ({self.step_us:.1f} us): tiles running {run:.1f} us, scoreboard signal "
               f"latency {sig:.1f} us, program queue {que:.1f} us",
               "| kind | tiles on path | run us | signal us | queue us | waited tiles (all) | mean signal lag us |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in sorted(self.rows, key=lambda r: -(r.run_us + r.signal_us + r.queue_us)):
            lag = r.lag_us / r.waited if r.waited else 0.0
            out.append(f"| {r.kind} | {r.items} | {r.run_us:.1f} | {r.signal_us:.1f} | {r.queue_us:.1f} | "
                       f"{r.waited} | {lag:.2f} |")
        return "\n".join(out)


def critical_path(items, records) -> CriticalPath:
    """:class:`CriticalPath` of one traced step (``records`` as for :func:`summarize`; item ``i`` holds
    scoreboard slot ``i``)."""
    import numpy as np
    n = len(items)
    if not n:
        return CriticalPath(0.0)
    rec = np.asarray(records, dtype=np.int64).reshape(n, 4)
    start, ready, end, pid = rec[:, 0], rec[:, 1], rec[:, 2], rec[:, 3]
    t0 = int(start.min())
    # the producer tile that released last, per item (-1: no dependency)
    last = np.full(n, -1, dtype=np.int64)
    last_end = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    for i, it in enumerate(items):
        for first, count in it.task.tile_ranges(it.tile):
            if count <= 0:
                continue
            j = first + int(np.argmax(end[first:first + count]))
            if end[j] > last_end[i]:
                last[i], last_end[i] = j, end[j]
    # the previous tile of the same program (by start time)
    prev = np.full(n, -1, dtype=np.int64)
    order = np.lexsort((start, pid))
    same = pid[order][1:] == pid[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    rows: dict = {}

    def row(i):
        k = kind_of(items[i].task.name)
        return rows.setdefault(k, PathRow(k))

    waited = (last >= 0) & (last_end > start)
    for i in np.nonzero(waited)[0]:
        r = row(i)
        r.waited += 1
        r.lag_us += (ready[i] - last_end[i]) / 1e3
    cur = int(np.argmax(end))
    t_end = int(end[cur])
    seen = 0
    while cur >= 0 and seen <= n:
        seen += 1
        r = row(cur)
        r.items += 1
        r.run_us += (end[cur] - ready[cur]) / 1e3
        if waited[cur]:
            r.signal_us += (ready[cur] - last_end[cur]) / 1e3
            cur = int(last[cur])
        else:
            p = int(prev[cur])
            r.queue_us += (ready[cur] - (end[p] if p >= 0 else t0)) / 1e3
            cur = p
    for r in rows.values():
        r.run_us, r.signal_us, r.queue_us, r.lag_us = (float(v) for v in (r.run_us, r.signal_us, r.queue_us,
                                                                           r.lag_us))
    return CriticalPath((t_end - t0) / 1e3, list(rows.values()))
