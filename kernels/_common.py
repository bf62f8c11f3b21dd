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

Copy-engine protocol (reset flags)
----------------------------------
Transfers by the copy engine (``ditron.rank_copy`` on a side stream) are
ordered by stream memory operations, whose values are fixed when queued, so
they use flags that go 1 -> 0 instead of epochs.  A receiver has
``ready[src]`` (1: ``src``'s data has landed), a sender ``free[dst]`` (1:
``dst`` has finished reading the sender's previous data; 1 at creation).  The
sender :func:`ce_send`: takes ``free[dst]`` (waits for 1, resets it), copies,
sets ``dst``'s ``ready[rank]``.  The receiver's kernel waits for its ``ready``
flags; its last program (:func:`ce_release`) resets them and then sets
``free[rank]`` on every peer.  A flag is set again only after it was reset,
and a buffer is rewritten only after its reader has finished.
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


@triton.jit
def ce_release(calls_ptr, ready_ptr, free_ptr, me, W):
    """End of a receiver's call in the copy-engine protocol, by every program:
    the last one resets this rank's ``ready`` flags, tells every peer that its
    data may be overwritten (``free[rank] = 1`` there) and counts the call."""
    dl.syncthreads()          # every warp's last loads of the received data are done
    done = tl.atomic_add(calls_ptr + 1, 1)
    if done == tl.num_programs(0) - 1:
        for s in range(0, W):
            tl.store(ready_ptr + s, 0)
        for k in range(1, W):
            dl.notify(free_ptr + me, (me + k) % W, signal=1, sig_op="set", comm_scope="intra_node")
        tl.store(calls_ptr + 1, 0)
        tl.atomic_add(calls_ptr, 1)


def take_flag(transport, word, stream):
    """Stream-ordered: wait until the local flag ``word`` is 1, then reset it."""
    transport.wait_value(word, 1, stream)
    transport.write_value(word, 0, stream)


def ce_send(transport, free, dst, src, ready, stream):
    """A sender's step of the copy-engine protocol: take the receiver's
    ``free`` flag (kept on this rank), copy ``src`` into ``dst`` (the
    receiver's buffer), set ``ready`` (the receiver's flag for this rank)."""
    take_flag(transport, free, stream)
    transport.rank_copy(dst, src, stream)
    transport.write_value(ready, 1, stream)


_SM_COUNTS: dict = {}


def sm_count(device) -> int:
    """Streaming multiprocessors of ``device`` (cached: it is asked on every launch)."""
    key = str(device)
    n = _SM_COUNTS.get(key)
    if n is None:
        try:
            n = torch.cuda.get_device_properties(device).multi_processor_count
        except Exception:  # noqa: BLE001 -- no CUDA device properties (CPU simulator, AMD without torch.cuda)
            n = 132
        _SM_COUNTS[key] = n
    return n


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

    def side_stream(self):
        """This context's second CUDA stream (created at first use), for work
        that runs beside the kernels of the current stream."""
        if getattr(self, "_side_stream", None) is None:
            self._side_stream = torch.cuda.Stream(device=self.device)
        return self._side_stream

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
