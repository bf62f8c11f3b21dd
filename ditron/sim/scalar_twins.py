"""Scalar helpers of the tile language, evaluated on Python integers when the simulator calls them.

``dl.swizzle_gather`` / ``dl.swizzle_scatter`` (``ditron.language.swizzle._swizzle_dist``) compute one tile
index from a handful of scalars with a loop over the ranks and, per rank, a loop over the segments a tile
touches: a few hundred scalar operations per tile.  Each operation of Triton's interpreter costs tens of
microseconds of Python bookkeeping (the whole suite spent ~9% of its CPU there), while its host twin (the same
code object on Python integers, ``swizzle.host_twins``) takes microseconds.

On the simulator the jit function is therefore evaluated by its twin, with the interpreter's integer semantics:
tensor arguments become :class:`_I32`, an ``int`` whose arithmetic is that of the interpreter's ``int32``
scalars (``//`` truncates and ``%`` takes the dividend's sign, as Triton's ``arith.divsi`` / ``remsi`` and the
interpreter's ``create_idiv`` / ``np.fmod`` do), and so do the results of ``tl.minimum`` / ``tl.maximum`` /
``tl.where`` (builtins that make tensors of Python ints too); ``int`` and ``constexpr`` arguments stay plain
``int``, with Python's semantics, as the interpreter computes them until they meet a tensor.  The results are
the ``int32`` scalar tensors the interpreter would have made.  Where the twin cannot give the interpreter's
answer exactly, the call goes to the interpreter as before:

* an argument is not an ``int32`` scalar tensor, an ``int`` or an integer ``constexpr`` (``int64`` or unsigned
  tensors, blocks, per-thread values of ``dl.tid()`` branches), or the world size is below 1;
* a value leaves the ``int32`` range (the interpreter wraps around; the twin would not);
* a division or remainder by zero.

``ENABLED`` turns it off (tests/bodies_swizzle.py compares the jit code itself with the twin that way, and
tests/test_swizzle.py compares the two paths).  Installed by the executor with the interpreter's other hooks.
"""
from __future__ import annotations

import numpy as np

ENABLED = True
HITS = 0                   # calls the twin answered (tests)
_INSTALLED = False
_LO, _HI = -(1 << 31), 1 << 31


class _Fallback(Exception):
    """The twin cannot answer exactly: the interpreter evaluates the call."""


def _wrap(v):
    if not _LO <= v < _HI:
        raise _Fallback
    return _I32(v)


def _tdiv(a, b):
    if b == 0:
        raise _Fallback
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


class _I32(int):
    """An ``int32`` scalar tensor's value: C arithmetic, in range or :class:`_Fallback`."""

    def __add__(self, o):
        return _wrap(int(self) + int(o)) if isinstance(o, int) else NotImplemented

    __radd__ = __add__

    def __sub__(self, o):
        return _wrap(int(self) - int(o)) if isinstance(o, int) else NotImplemented

    def __rsub__(self, o):
        return _wrap(int(o) - int(self)) if isinstance(o, int) else NotImplemented

    def __mul__(self, o):
        return _wrap(int(self) * int(o)) if isinstance(o, int) else NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return _wrap(_tdiv(int(self), int(o))) if isinstance(o, int) else NotImplemented

    def __rfloordiv__(self, o):
        return _wrap(_tdiv(int(o), int(self))) if isinstance(o, int) else NotImplemented

    def __mod__(self, o):
        if not isinstance(o, int):
            return NotImplemented
        a, b = int(self), int(o)
        return _wrap(a - _tdiv(a, b) * b)

    def __rmod__(self, o):
        if not isinstance(o, int):
            return NotImplemented
        a, b = int(o), int(self)
        return _wrap(a - _tdiv(a, b) * b)

    def __neg__(self):
        return _wrap(-int(self))


def _twin(S, tl):
    """``_swizzle_dist``'s twin (``swizzle.host_twins``) over a ``tl`` whose ``minimum`` / ``maximum`` / ``where``
    give int32 scalars as the interpreter's builtins do (they make tensors of Python ints too); ``cdiv`` is the jit
    function's own expression."""
    import types
    ns = types.SimpleNamespace(minimum=lambda a, b: _wrap(min(int(a), int(b))),
                               maximum=lambda a, b: _wrap(max(int(a), int(b))),
                               where=lambda c, a, b: _wrap(int(a if c else b)),
                               cdiv=lambda x, div: (x + div - 1) // div, constexpr=tl.constexpr)
    return S.host_twins(ns)["_swizzle_dist"]


def _fast_call(orig_call, twin, tl, tensor_handle):
    i32 = tl.int32
    tensor_cls, constexpr_cls = tl.tensor, tl.constexpr

    def scalar(x):
        """The twin's argument for ``x``, or None."""
        t = type(x)
        if t is tensor_cls:
            if x.type != i32:
                return None
            data = x.handle.data
            if data.size != 1:
                return None
            return _I32(int(data.reshape(-1)[0]))
        if t is constexpr_cls:
            x = x.value
            t = type(x)
        if t is int and _LO <= x < _HI:
            return x
        return None

    def out(v):
        return tensor_cls(tensor_handle(np.array([int(v)], dtype=np.int32), i32), i32)

    def __call__(self, *args, **kwargs):
        if ENABLED and not kwargs and len(args) == len(self.arg_names):
            vals = [scalar(a) for a in args]
            if None not in vals and vals[6] >= 1:        # world >= 1: the loop runs, both results are tensors
                try:
                    res = twin(*vals)
                except _Fallback:
                    res = None
                if res is not None and all(type(v) is _I32 for v in res):
                    global HITS
                    HITS += 1
                    return tuple(out(v) for v in res)
        return orig_call(self, *args, **kwargs)

    return __call__


def install():
    """Route the simulator's calls of ``_swizzle_dist`` to its twin (once per process; only where the swizzle
    module's jit functions are interpreted, i.e. it was imported under ``TRITON_INTERPRET=1``)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction, TensorHandle
    from ..language import swizzle as S
    fn = S._swizzle_dist
    if type(fn) is not InterpretedFunction:
        return
    fast = type("InterpretedScalarTwin", (InterpretedFunction,),
                {"__call__": _fast_call(InterpretedFunction.__call__, _twin(S, tl), tl, TensorHandle),
                 "__module__": __name__})
    fn.__class__ = fast          # the same object (callers, analysis and lint see the same jit function)
