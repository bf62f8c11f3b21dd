"""Schedulers: which program of the persistent kernel runs which work item.

A static scheduler is a callable ``(items, num_programs) -> list[list[int]]``
giving, per program, the indices of the items it runs, each queue in
increasing topological order.  With every program co-resident (grid <= SMs)
any such schedule is deadlock-free: the smallest unfinished item always has
all its producers finished or running.  ``"dynamic"`` is not a queue: the
programs take items in topological order from a device counter
(``dl.fetch_task``).
"""
from __future__ import annotations

from ..errors import DitronError

DYNAMIC = "dynamic"


def round_robin(items, num_programs):
    """Item ``j`` -> program ``j % P``."""
    queues = [[] for _ in range(num_programs)]
    for j in range(len(items)):
        queues[j % num_programs].append(j)
    return queues


def zigzag(items, num_programs):
    """Rounds of ``P`` items; even rounds go to programs 0..P-1, odd rounds
    P-1..0 (so the program that got the last item of a round gets the first
    of the next: consecutive items -- often producer/consumer -- stay close)."""
    queues = [[] for _ in range(num_programs)]
    for j in range(len(items)):
        r, k = divmod(j, num_programs)
        queues[k if r % 2 == 0 else num_programs - 1 - k].append(j)
    return queues


SCHEDULERS = {"round_robin": round_robin, "zigzag": zigzag}


def resolve(scheduler):
    """(name, callable or None for dynamic)."""
    if scheduler == DYNAMIC:
        return DYNAMIC, None
    if isinstance(scheduler, str):
        if scheduler not in SCHEDULERS:
            raise DitronError(f"unknown scheduler {scheduler!r}; use one of {sorted(SCHEDULERS) + [DYNAMIC]} "
                              "or a callable (items, num_programs) -> list of item-index lists")
        return scheduler, SCHEDULERS[scheduler]
    if callable(scheduler):
        return getattr(scheduler, "__name__", "user scheduler"), scheduler
    raise DitronError(f"scheduler must be a name or a callable, not {scheduler!r}")


def make_queues(scheduler, items, num_programs):
    """Run ``scheduler`` and check its result: ``num_programs`` queues, every
    item exactly once, each queue in increasing topological order."""
    name, fn = resolve(scheduler)
    if fn is None:
        return None
    queues = fn(items, num_programs)
    try:
        queues = [[int(j) for j in q] for q in queues]
    except (TypeError, ValueError):
        raise DitronError(f"scheduler {name}: must return a list of lists of item indices") from None
    if len(queues) != num_programs:
        raise DitronError(f"scheduler {name}: returned {len(queues)} queues for {num_programs} programs")
    seen = {}
    for p, q in enumerate(queues):
        for a, b in zip(q, q[1:]):
            if b <= a:
                raise DitronError(f"scheduler {name}: program {p}'s queue is not in increasing topological order "
                                  f"(item {b} after item {a}); a program may only run items in order, else the "
                                  "persistent kernel can deadlock")
        for j in q:
            if not 0 <= j < len(items):
                raise DitronError(f"scheduler {name}: item index {j} out of range [0, {len(items)})")
            if j in seen:
                raise DitronError(f"scheduler {name}: item {j} ({items[j]}) is in the queues of programs "
                                  f"{seen[j]} and {p}")
            seen[j] = p
    if len(seen) != len(items):
        lost = [items[j] for j in range(len(items)) if j not in seen][:5]
        raise DitronError(f"scheduler {name}: {len(items) - len(seen)} item(s) are in no queue, e.g. {lost}")
    return queues
