"""Collects the distributed ops of the compilation in progress.

The front end records every op it creates into the active :class:`Module`
(if any); :func:`ditron.compile` and the JIT launcher open a recording around
Triton's compilation and keep the result.
"""
from __future__ import annotations

import contextlib
import contextvars

from .ops import Module, Op

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("ditron_dist_module", default=None)


@contextlib.contextmanager
def recording(name: str, target: str = ""):
    module = Module(name=name, target=target)
    token = _ACTIVE.set(module)
    try:
        yield module
    finally:
        _ACTIVE.reset(token)
        module.detach()


def record(op: Op) -> Op:
    module = _ACTIVE.get()
    if module is not None:
        module.add(op)
    return op


def active():
    return _ACTIVE.get()
