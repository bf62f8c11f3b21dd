"""``ditron.task`` -- the task level: megakernels from registered tasks.

::

    import ditron.task as dtask
    g = dtask.TaskGraph("decoder")
    a = g.register_task(tile_fn, name="a", num_tiles=4, args={...}, reads=("x",), writes=("y",))
    b = g.register_task(tile_fn2, name="b", num_tiles=4, args={...}, deps=[dtask.Dep(a, "same")], ...)
    mk = g.compile(scheduler="round_robin")      # or "zigzag", "dynamic", a callable
    print(mk.source)
    mk.step()

See ``docs/megakernel.md``.
"""
from .graph import EPOCH, TASK_SLOTS, Dep, Task, TaskGraph, WorkItem
from .runtime import Megakernel
from .schedule import round_robin, zigzag
from . import comm

__all__ = ["EPOCH", "TASK_SLOTS", "TaskGraph", "Task", "Dep", "WorkItem", "Megakernel", "round_robin", "zigzag", "comm"]
