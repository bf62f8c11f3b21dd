"""Pieces every zoo collective shares: the context base class and the
device-side call counter that makes contexts reusable (and CUDA-graph
capturable) without host-side epochs.

Reuse protocol
--------------
Every context owns ``calls``, a local ``int64[2]`` tensor on the device:
``calls[0]`` counts completed calls, ``calls[1]`` counts programs that have
finished the current call.  A kernel reads ``e = calls[0]`` when it starts
(:func:`epoch_begin`), uses ``e + 1`` as the value of every signal it sends
and waits for in this call (signal words are never reset: the values only
grow, so a signal from the previous call can never satisfy this call's wait),
and picks data buffers by ``e % 2`` (double buffering: a rank can run at most
one call ahead of a peer, because every call waits for all peers' signals of
that call).  The last program to finish bumps ``calls[0]``
(:func:`epoch_end`); the next launch on the stream starts after it.
All state lives on the device, so the ops can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def topology():
    """(rank, world size, ranks per node, node, nodes, local rank) from the
    world descriptor: the preamble every zoo kernel needs."""
    return dl.rank(), dl.num_ranks(), dl.num_ranks(0), dl.rank(1), dl.num_ranks(1), dl.rank(0)


@triton.jit
def epoch_begin(calls_ptr):
    """The number of completed calls of this context (int64 scalar)."""
    return tl.load(calls_ptr)


@triton.jit
def epoch_end(calls_ptr):
    """Called once by every program at its very end: the last one to finish
    resets the program counter and counts the call as completed."""
    done = tl.atomic_add(calls_ptr + 1, 1)
    if done == tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2) - 1:
        tl.store(calls_ptr + 1, 0)
        tl.atomic_add(calls_ptr, 1)


class CollectiveContext:
    """Base of the zoo's contexts: the world, the device, the call counter and
    the symmetric buffers (allocated once, collectively, at creation)."""

    op = "collective"

    def __init__(self, max_numel: int, dtype, world=None):
        self.world = world or ditron.current_world()
        if dtype not in _FLOAT_DTYPES:
            raise ditron.DitronError(f"{self.op}: dtype {dtype} is not supported (use float32, float16 or bfloat16)")
        if int(max_numel) < 0:
            raise ditron.DitronError(f"{self.op}: max_numel must be >= 0")
        self.max_numel = int(max_numel)
        self.dtype = dtype
        self.device = self.world.device
        self.calls = torch.zeros(2, dtype=torch.int64, device=self.device)

    @property
    def rank(self):
        return self.world.rank

    @property
    def world_size(self):
        return self.world.world_size

    def symm(self, shape, dtype, name):
        return ditron.symm_zeros(shape, dtype, name=f"{self.op}.{name}")

    def check_tensor(self, t, argname, numel=None, dtype=None):
        """A clear error before launch for a wrong dtype, device, size or layout."""
        dtype = dtype or self.dtype
        if not isinstance(t, torch.Tensor):
            raise ditron.DitronError(f"{self.op}: argument '{argname}' must be a torch.Tensor")
        if t.dtype != dtype:
            raise ditron.DitronError(f"{self.op}: argument '{argname}' is {t.dtype}, the context was created for "
                                     f"{dtype}")
        if t.device != torch.device(self.device) and not (t.device.type == torch.device(self.device).type
                                                         and t.device.index in (None, torch.device(self.device).index)):
            raise ditron.DitronError(f"{self.op}: argument '{argname}' is on {t.device}, this rank works on "
                                     f"{self.device}")
        if not t.is_contiguous():
            raise ditron.DitronError(f"{self.op}: argument '{argname}' must be contiguous")
        if numel is not None and t.numel() != numel:
            raise ditron.DitronError(f"{self.op}: argument '{argname}' has {t.numel()} elements, expected {numel}")
        if t.numel() > self.max_numel * max(1, getattr(self, "numel_factor", 1)):
            raise ditron.DitronError(f"{self.op}: argument '{argname}' has {t.numel()} elements, more than the "
                                     f"context's max_numel={self.max_numel}; create a larger context")


def tl_dtype(dtype):
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def default_block(numel: int, lo=128, hi=4096) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(1, numel))))
