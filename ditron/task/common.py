"""What every module of :mod:`ditron.task` shares, at the bottom of the package (imports nothing of it):
the ``EPOCH`` argument value, the scalar limit per task, what counts as a tensor argument.

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


def _is_tensor(v) -> bool:
    return hasattr(v, "data_ptr") and hasattr(v, "element_size")
