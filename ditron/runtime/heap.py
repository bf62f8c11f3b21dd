"""The symmetric heap allocator shared by every transport.

Each rank owns one contiguous heap of ``heap_size`` bytes (4 KiB aligned).
Symmetric allocation is collective: every rank makes the same calls in the
same order, so an allocation sits at the same offset in every rank's heap and
``symm_at`` / ``shmem.*`` translate addresses by heap-base arithmetic.

The allocator is a bump allocator with marks (:meth:`SymmetricHeap.mark` /
:meth:`release`): long-lived contexts allocate once; ``ditron.heap_scope()``
frees what was allocated inside it.  Every allocation remembers its shape,
dtype, optional name and the source line that made it, so that a hang report
can say "signal tensor 'flags' (int32[8], made at test.py:30), offset 3"
instead of a raw address.
"""
from __future__ import annotations

import math
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Optional

from ..errors import DitronError

#: alignment of every symmetric allocation (bytes); keeps 16-byte vector
#: accesses and TMA-friendly 128-byte alignment
ALIGN = 256
#: heap bases are aligned to this (``symm_at`` moves pointers in these units)
HEAP_ALIGN = 4096


def parse_size(text) -> int:
    """``"256M"``, ``"1G"``, ``"4096"``, ``"64MiB"`` -> bytes."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace("ib", "").replace("b", "")
    mult = 1
    for suffix, m in (("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40)):
        if s.endswith(suffix):
            s, mult = s[:-1], m
            break
    try:
        return int(float(s) * mult)
    except ValueError:
        raise DitronError(f"cannot read the size {text!r} (use bytes or a suffix K/M/G, e.g. '256M')") from None


def round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def heap_size_from_env(default: int) -> int:
    raw = os.environ.get("DITRON_HEAP_SIZE")
    size = parse_size(raw) if raw else default
    if size <= 0:
        raise DitronError(f"DITRON_HEAP_SIZE must be positive (got {raw!r})")
    return round_up(size, HEAP_ALIGN)


def _call_site() -> str:
    """file:line of the first frame outside ditron (who asked for memory)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for frame in traceback.extract_stack()[::-1]:
        if not os.path.abspath(frame.filename).startswith(here):
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "?"


_ADDRESS_NAMERS: list = []


def add_address_namer(fn):
    """Register ``fn(addr) -> str | None``: a description of a device address
    that a higher layer owns (e.g. a megakernel's scoreboard slot -> task and
    tile).  Hang reports (simulator and bounded GPU waits) put it first."""
    _ADDRESS_NAMERS.append(fn)


def remove_address_namer(fn):
    if fn in _ADDRESS_NAMERS:
        _ADDRESS_NAMERS.remove(fn)


def name_address(addr: int):
    """What a registered namer says about ``addr``, or None."""
    for fn in list(_ADDRESS_NAMERS):
        text = fn(int(addr))
        if text:
            return text
    return None


@dataclass
class Allocation:
    index: int
    offset: int
    nbytes: int
    shape: tuple
    dtype: object
    name: Optional[str]
    site: str
    #: why the allocation is gone (its heap_scope ended, ditron.finalize(), a failed context creation),
    #: None while it is live; tensors made by :meth:`SymmetricHeap.alloc` carry their Allocation
    freed: Optional[str] = None

    def label(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        shape = "x".join(str(s) for s in self.shape) or "scalar"
        who = f"'{self.name}'" if self.name else f"#{self.index}"
        return f"symmetric tensor {who} ({dt}[{shape}], allocated at {self.site})"


#: how many times any heap of this process released allocations (heap_scope ends, finalize, failed context
#: creations): while it is 0 no symmetric tensor can be freed, and a launch need not look for one
RELEASES = [0]


class SymmetricHeap:
    """Bump allocator over this rank's heap buffer (a 1-D ``torch.uint8``
    tensor on the world's device)."""

    def __init__(self, buffer, rank: int, owner: str):
        import torch
        if buffer.dtype != torch.uint8 or buffer.dim() != 1:
            raise AssertionError("heap buffer must be a 1-D uint8 tensor")
        self.buffer = buffer
        self.base = buffer.data_ptr()
        self.size = buffer.numel()
        self.rank = rank
        self.owner = owner            # transport name, for messages
        self.top = 0
        self.allocations: list[Allocation] = []
        self.generation = 0           # bumped when allocations are released (positions restart)
        #: ``on_alloc(allocation, generation)`` before an allocation is made (the cross-rank check of
        #: :mod:`ditron.runtime.alloccheck`); it may raise
        self.on_alloc = None

    # -- allocation -----------------------------------------------------------
    def alloc(self, shape, dtype, *, name=None):
        import torch
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise DitronError(f"symmetric tensor shape {shape} has a negative size")
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(shape) * elem
        offset = round_up(self.top, ALIGN)
        if offset + nbytes > self.size:
            used = self.top
            raise DitronError(
                f"symmetric heap of rank {self.rank} is full: {nbytes} bytes requested, "
                f"{self.size - used} of {self.size} free ({self.owner}); set DITRON_HEAP_SIZE (e.g. "
                f"DITRON_HEAP_SIZE=2G) before ditron.init(), or free allocations with ditron.heap_scope()")
        alloc = Allocation(len(self.allocations), offset, nbytes, shape, dtype, name, _call_site())
        if self.on_alloc is not None:
            self.on_alloc(alloc, self.generation)
        self.top = offset + nbytes
        self.allocations.append(alloc)
        view = self.buffer[offset:offset + nbytes].view(dtype)
        view = view.view(shape) if shape else view.view(())
        view._ditron_alloc = alloc            # lets a later use of a freed tensor say so (world.check_live_tensor)
        return view

    def mark(self):
        return (self.top, len(self.allocations))

    def release(self, mark, why="the ditron.heap_scope it was allocated in has ended"):
        self.top, n = mark
        self.generation += 1          # every release, so ranks that run the same scopes stay aligned
        RELEASES[0] += 1
        for a in self.allocations[n:]:
            a.freed = why
        del self.allocations[n:]

    def release_all(self, why):
        """Mark every allocation freed (the heap itself goes away)."""
        self.release((0, 0), why)

    # -- queries ----------------------------------------------------------------
    def contains_ptr(self, ptr: int, nbytes: int = 1) -> bool:
        return self.base <= ptr and ptr + max(nbytes, 1) <= self.base + self.size

    def offset_of(self, t) -> int:
        """Heap offset of tensor ``t`` (which must be in this heap)."""
        return t.data_ptr() - self.base

    def contains(self, t) -> bool:
        """Whether the whole of tensor ``t`` lies in this heap (asked for kernel arguments on every launch:
        an address outside the heap answers before anything else is read)."""
        try:
            ptr = t.data_ptr()
        except Exception:  # noqa: BLE001 -- not a tensor
            return False
        base = self.base
        if not base <= ptr < base + self.size:
            return False
        if getattr(t, "device", None) is not None and t.device != self.buffer.device:
            return False
        if t.is_contiguous():
            span = t.numel() * t.element_size()
        else:
            span = (t.numel() and (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1)) * t.element_size()
        return self.contains_ptr(ptr, span)

    def allocation_at(self, offset: int):
        """The live :class:`Allocation` holding heap byte ``offset``, or None (alignment gap, unused heap)."""
        import bisect
        starts = [a.offset for a in self.allocations]
        i = bisect.bisect_right(starts, offset) - 1
        if i >= 0 and offset < self.allocations[i].offset + self.allocations[i].nbytes:
            return self.allocations[i]
        return None

    def describe_gap(self, offset: int) -> str:
        """Where heap byte ``offset`` (in no live allocation) is: past the end of which tensor."""
        import torch
        prev = [a for a in self.allocations if a.offset + a.nbytes <= offset]
        if not prev:
            return f"heap offset {offset}, before every live symmetric tensor"
        a = prev[-1]
        elem = torch.empty((), dtype=a.dtype).element_size()
        return (f"heap offset {offset}, element {(offset - a.offset) // elem} of {a.label()}, past its end "
                f"({a.nbytes // elem} elements)")

    def bounds_lists(self):
        """(starts, ends) of the live allocations as Python lists (cached until the allocations change)."""
        key = (len(self.allocations), self.top)
        cache = self.__dict__.get("_bounds_l")
        if cache is None or cache[0] != key:
            cache = self._bounds_l = (key, [a.offset for a in self.allocations],
                                      [a.offset + a.nbytes for a in self.allocations])
        return cache[1], cache[2]

    def bounds_tables(self):
        """(starts, ends) of the live allocations as int64 arrays (cached until the allocations change)."""
        import numpy as np
        key = (len(self.allocations), self.top, self.allocations[-1].offset if self.allocations else -1)
        cache = self.__dict__.get("_bounds")
        if cache is None or cache[0] != key:
            starts = np.array([a.offset for a in self.allocations], dtype=np.int64)
            ends = np.array([a.offset + a.nbytes for a in self.allocations], dtype=np.int64)
            cache = self._bounds = (key, starts, ends)
        return cache[1], cache[2]

    def describe_offset(self, offset: int) -> str:
        """A symmetric tensor and element offset for a heap byte offset."""
        for a in reversed(self.allocations):
            if a.offset <= offset < a.offset + max(a.nbytes, 1):
                import torch
                elem = torch.empty((), dtype=a.dtype).element_size()
                return f"{a.label()}, element offset {(offset - a.offset) // elem}"
        return f"heap offset {offset} (not inside a live symmetric allocation)"


