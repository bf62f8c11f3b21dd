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
