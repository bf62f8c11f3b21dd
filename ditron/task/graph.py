"""Task graphs: tasks wrapping tile functions, per-tile dependencies, and the
static hazard check (a read / write of a tensor that an earlier task touches
must be ordered after it by a chain of :class:`Dep`).

See ``docs/megakernel.md``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .. import _compat
from ..errors import DitronError
from .common import EPOCH, MAX_SCALARS, TASK_SLOTS, _is_tensor


class Dep:
    """A dependency of a consumer task on tiles of an earlier ``task``.

    ``Dep(p)``: every tile of ``p``; ``Dep(p, "same")``: consumer tile ``i``
    needs producer tile ``i``; ``Dep(p, f)``: consumer tile ``i`` needs
    producer tiles ``range(*f(i))`` (``f(i) -> (lo, hi)``, an empty range is
    allowed).

    ``inner=True``: the consumer's tile function waits on these producer
    tiles itself (``dl.wait_deps`` on ``dtask.TASK_SLOTS`` inside the tile, e.g.
    per K chunk of a GEMV, so that its weight stream starts before the last
    producer is done), not the megakernel before calling it.  The dependency
    still orders the tasks (hazard check, upstream sets); the tile must have
    waited on every producer tile of the range before it reads what they
    wrote, overwrites what they read, and before it returns (its release then
    passes their writes on: causality is transitive)."""

    def __init__(self, task: "Task", tiles: Union[None, str, Callable[[int], tuple]] = None, inner: bool = False):
        if not isinstance(task, Task):
            raise DitronError(f"Dep(...) takes a task returned by register_task, not {type(task).__name__}")
        if tiles is not None and tiles != "same" and not callable(tiles):
            raise DitronError(f"Dep(task '{task.name}', tiles={tiles!r}): tiles must be None (all tiles), "
                              "'same' or a callable i -> (lo, hi)")
        self.task = task
        self.tiles = tiles
        self.inner = bool(inner)

    def ranges(self, consumer: "Task", i: int) -> list:
        """Producer tile ranges ``[(lo, hi)]`` that consumer tile ``i`` needs."""
        p = self.task
        if self.tiles is None:
            return [(0, p.num_tiles)]
        if self.tiles == "same":
            if i >= p.num_tiles:
                raise DitronError(f"task '{consumer.name}' tile {i}: Dep('{p.name}', 'same') but '{p.name}' has "
                                  f"only {p.num_tiles} tiles")
            return [(i, i + 1)]
        got = self.tiles(i)
        try:
            lo, hi = (int(v) for v in got)
        except (TypeError, ValueError):
            raise DitronError(f"task '{consumer.name}' tile {i}: the Dep on '{p.name}' returned {got!r}, not "
                              "a pair (lo, hi)") from None
        if not 0 <= lo <= hi <= p.num_tiles:
            raise DitronError(f"task '{consumer.name}' tile {i}: the Dep on '{p.name}' asks for producer tiles "
                              f"[{lo}, {hi}), outside [0, {p.num_tiles})")
        return [(lo, hi)] if hi > lo else []

    def __repr__(self):
        what = "all" if self.tiles is None else self.tiles if isinstance(self.tiles, str) else "range"
        return f"Dep({self.task.name!r}, {what}{', inner' if self.inner else ''})"


@dataclass(eq=False)           # identity: tasks hold tensors, which do not compare to a bool
class Task:
    """One registered task: ``num_tiles`` calls ``fn(tile, **args, **scalars)``."""
    graph: Any
    index: int
    name: str
    fn: Any
    num_tiles: int
    args: dict
    reads: tuple
    writes: tuple
    deps: list
    scalars: dict
    params: list                        # [(name, is_constexpr)] of fn
    prefetch: Any = None                # tile function run before the dependency wait (or None)
    prefetch_params: list = field(default_factory=list)
    slot_base: int = 0                  # first scoreboard slot of this task
    upstream: set = field(default_factory=set)   # indices of tasks ordered before this one (transitively)

    def tile_ranges(self, i: int) -> list:
        """Scoreboard slot ranges ``[(first_slot, count)]`` tile ``i`` depends on (``inner`` ones included)."""
        return self.wait_ranges(i, inner=True)

    def wait_ranges(self, i: int, inner: bool = False) -> list:
        """The ranges of :meth:`tile_ranges` that the megakernel waits on before calling tile ``i`` (``inner``:
        also those the tile waits on itself)."""
        out = []
        for d in self.deps:
            if d.inner and not inner:
                continue
            for lo, hi in d.ranges(self, i):
                out.append((d.task.slot_base + lo, hi - lo))
        return out

    def __repr__(self):
        return f"Task({self.name!r}, tiles={self.num_tiles})"


def _span(t):
    """(storage pointer, first byte, last byte + 1) of tensor ``t``."""
    try:
        storage = t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 -- not a torch tensor
        storage = None
    if t.numel() == 0:
        return storage, t.data_ptr(), t.data_ptr()
    extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
    return storage, t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _overlap(a, b) -> bool:
    sa, lo_a, hi_a = _span(a)
    sb, lo_b, hi_b = _span(b)
    if sa is not None and sb is not None and sa != sb:
        return False
    return lo_a < hi_b and lo_b < hi_a


class TaskGraph:
    """Tasks registered in a topological order; ``compile`` turns the graph
    into one persistent kernel (:class:`ditron.task.Megakernel`)."""

    def __init__(self, name: str = "megakernel"):
        if not name.isidentifier():
            raise DitronError(f"TaskGraph name {name!r} must be a Python identifier (it names the kernel)")
        self.name = name
        self.tasks: list[Task] = []
        self._by_name: dict[str, Task] = {}

    @property
    def num_slots(self) -> int:
        return sum(t.num_tiles for t in self.tasks)

    def task(self, name: str) -> Task:
        return self._by_name[name]

    # -- registration --------------------------------------------------------------
    def register_task(self, fn, name: str, num_tiles: int, args: Optional[dict] = None, reads=(), writes=(),
                      deps=(), scalars: Optional[dict] = None, prefetch=None) -> Task:
        """Register ``num_tiles`` tiles of the tile function ``fn`` (first
        parameter: the tile index; the others are filled by name from ``args``
        and ``scalars``).  ``prefetch``: an optional tile function called with
        the same tile index *before* the tile's dependency wait, to start
        reading data that no producer writes (weights: ``dl.prefetch_l2``); its
        parameters are filled by name from the same ``args`` / ``scalars``
        (parameters only it has are allowed).  See the module docs for the
        rules."""
        args = dict(args or {})
        scalars = dict(scalars or {})
        where = f"register_task('{name}')"
        if name in self._by_name:
            raise DitronError(f"{where}: a task named '{name}' is already registered")
        params = _compat.tile_function_params(fn)
        if params is None:
            raise DitronError(f"{where}: fn must be a @triton.jit or @ditron.jit tile function, not {fn!r}")
        if not isinstance(num_tiles, int) or num_tiles < 1:
            raise DitronError(f"{where}: num_tiles must be a positive int, got {num_tiles!r}")
        if not params:
            raise DitronError(f"{where}: the tile function needs a first parameter (the tile index)")
        if len(scalars) > MAX_SCALARS:
            raise DitronError(f"{where}: at most {MAX_SCALARS} scalars per task, got {len(scalars)}")
        names = [p for p, _ in params[1:]]
        const = {p for p, c in params if c}
        pf_params = []
        if prefetch is not None:
            pf_params = _compat.tile_function_params(prefetch)
            if pf_params is None or not pf_params:
                raise DitronError(f"{where}: prefetch must be a @triton.jit / @ditron.jit tile function (first "
                                  f"parameter: the tile index), not {prefetch!r}")
            pconst = {p for p, c in pf_params if c}
            flip = [p for p, _ in pf_params[1:] if p in names and (p in pconst) != (p in const)]
            if flip:
                raise DitronError(f"{where}: parameter(s) {flip} are tl.constexpr in only one of "
                                  f"{fn.fn.__name__} and the prefetch function {prefetch.fn.__name__}")
        # the prefetch function's own parameters are filled from args / scalars like fn's
        names = names + [p for p, _ in pf_params[1:] if p not in names]
        const |= {p for p, c in pf_params if c}
        for k in list(args) + list(scalars):
            if k not in names:
                raise DitronError(f"{where}: '{k}' is not a parameter of {fn.fn.__name__}{tuple(names)}"
                                  + (f" or of the prefetch function {prefetch.fn.__name__}" if prefetch else ""))
        both = set(args) & set(scalars)
        if both:
            raise DitronError(f"{where}: {sorted(both)} given in both args and scalars")
        missing = [p for p in names if p not in args and p not in scalars]
        if missing:
            raise DitronError(f"{where}: no value for parameter(s) {missing} of {fn.fn.__name__}"
                              + (f" / {prefetch.fn.__name__}" if prefetch else ""))
        for k, v in scalars.items():
            if k in const or isinstance(v, bool) or not isinstance(v, int) or not -2**31 <= v < 2**31:
                raise DitronError(f"{where}: scalar '{k}' must be an int32 value for a runtime (non-constexpr) "
                                  f"parameter, got {v!r}")
        for k, v in args.items():
            if _is_tensor(v):
                if k in const:
                    raise DitronError(f"{where}: tensor '{k}' is passed to a tl.constexpr parameter")
            elif v is EPOCH or v is TASK_SLOTS:
                if k in const:
                    raise DitronError(f"{where}: {v!r} is a runtime value; '{k}' is a tl.constexpr parameter")
            elif not isinstance(v, (bool, int, float)) and not (k in const and isinstance(v, str)):
                raise DitronError(f"{where}: argument '{k}' is a {type(v).__name__}; pass tensors, ints or floats "
                                  "(strings only to tl.constexpr parameters)")
        for role, keys in (("reads", reads), ("writes", writes)):
            if isinstance(keys, str):
                raise DitronError(f"{where}: {role} must be a tuple of argument names, not a string")
            for k in keys:
                if k not in args or not _is_tensor(args[k]):
                    raise DitronError(f"{where}: {role} names '{k}', which is not a tensor argument")
        deps = list(deps)
        for d in deps:
            if not isinstance(d, Dep):
                raise DitronError(f"{where}: deps must be dtask.Dep objects, got {d!r}")
            if d.task.graph is not self or self.tasks[d.task.index] is not d.task:
                raise DitronError(f"{where}: Dep on task '{d.task.name}', which is not an earlier task of this graph")
        task = Task(self, len(self.tasks), name, fn, num_tiles, args, tuple(reads), tuple(writes), deps, scalars,
                    params, prefetch=prefetch, prefetch_params=pf_params, slot_base=self.num_slots)
        for i in range(num_tiles):            # validates every range now, not at launch
            task.tile_ranges(i)
        for d in deps:
            task.upstream.add(d.task.index)
            task.upstream |= d.task.upstream
        self._check_hazards(task)
        self.tasks.append(task)
        self._by_name[name] = task
        return task

    def _check_hazards(self, task: Task):
        """Read-after-write, write-after-read and write-after-write on
        overlapping bytes of the same storage need a Dep chain to the earlier task."""
        for prev in reversed(self.tasks):
            if prev.index in task.upstream:
                continue
            pairs = [("reads", r, "writes", w) for r in task.reads for w in prev.writes] + \
                    [("writes", w, "reads", r) for w in task.writes for r in prev.reads] + \
                    [("writes", w, "writes", w2) for w in task.writes for w2 in prev.writes]
            for mine, a, theirs, b in pairs:
                if _overlap(task.args[a], prev.args[b]):
                    kind = {"reads": "read-after-write", "writes": "write-after-" +
                            ("read" if theirs == "reads" else "write")}[mine]
                    raise DitronError(
                        f"missing dependency: task '{task.name}' {mine[:-1]}s tensor '{a}', which the earlier task "
                        f"'{prev.name}' {theirs[:-1]}s (as '{b}'; {kind}), but '{task.name}' has no Dep on "
                        f"'{prev.name}' (directly or through other tasks): add dtask.Dep(<task '{prev.name}'>, ...) to its "
                        "deps")

    # -- items and compilation ------------------------------------------------------
    def items(self) -> list:
        """The work items ``(task, tile)`` in topological order."""
        return [WorkItem(len_before + i, t, i) for len_before, t in _bases(self.tasks) for i in range(t.num_tiles)]

    def compile(self, scheduler="round_robin", num_programs: Optional[int] = None, num_warps: int = 4,
                trace: bool = False, maxnreg: Optional[int] = None, programs_per_sm: Optional[int] = None,
                **debug):
        """One persistent kernel for the whole graph; see
        :class:`ditron.task.Megakernel`.  ``trace``: record per-item
        timestamps (``mk.trace()``, ``mk.profile()``; costs three clock reads
        and four stores per item).  ``maxnreg``: registers per thread allowed
        to ptxas (NVIDIA GPUs; ``None``: ptxas chooses, up to 255).
        ``programs_per_sm``: the default grid (``num_programs=None``) per SM
        (``None``: 2), shrunk to what the compiled kernel lets be resident.
        ``wait_acquire`` (keyword): ``"fence"`` (default) or ``"load"``, the
        ``dl.wait_deps(acquire=...)`` of the waits before each tile.
        ``noinline_branches`` (keyword, default False): each task kind's
        tile function is called (a ``noinline`` Triton function) instead of
        inlined into the item loop, so that the values it computes before its
        own loops are not hoisted out of the item loop and held in registers
        across every other kind (fewer spills in kernels of many kinds)."""
        from .runtime import Megakernel
        return Megakernel(self, scheduler=scheduler, num_programs=num_programs, num_warps=num_warps, trace=trace,
                          maxnreg=maxnreg, programs_per_sm=programs_per_sm, **debug)


@dataclass(frozen=True)
class WorkItem:
    index: int          # position in topological order (= ticket of the dynamic scheduler)
    task: Task
    tile: int

    @property
    def slot(self) -> int:
        return self.task.slot_base + self.tile

    def __repr__(self):
        return f"WorkItem({self.index}: {self.task.name}[{self.tile}])"


def _bases(tasks):
    n = 0
    for t in tasks:
        yield n, t
        n += t.num_tiles
