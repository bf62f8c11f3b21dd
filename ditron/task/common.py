"""What every module of :mod:`ditron.task` shares, at the bottom of the package (imports nothing of it):
the ``EPOCH`` and ``TASK_SLOTS`` argument values, the scalar limit per task, what counts as a tensor argument.

    graph -> runtime -> codegen -> common;  graph -> common
"""
from __future__ import annotations

MAX_SCALARS = 4


class _Epoch:
    """Pass ``dtask.EPOCH`` as an argument value: the tile function receives
    the megakernel's step number (int32, 1 in the first step), e.g. as the
    signal value of a communication tile."""

    def __repr__(self):
        return "dtask.EPOCH"


EPOCH = _Epoch()


class _TaskSlots:
    """Pass ``dtask.TASK_SLOTS`` as an argument value: the tile function receives a pointer to its task's first
    scoreboard slot (int32; slot of tile ``t`` at ``+ t``), for a tile that waits on some of its producers itself
    (``Dep(..., inner=True)``): a producer registered ``d`` slots before the task has its tile ``p`` at
    ``TASK_SLOTS - d + p`` (``dl.wait_deps`` on it before reading what that tile wrote)."""

    def __repr__(self):
        return "dtask.TASK_SLOTS"


TASK_SLOTS = _TaskSlots()


def _is_tensor(v) -> bool:
    return hasattr(v, "data_ptr") and hasattr(v, "element_size")
