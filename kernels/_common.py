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

import functools

import torch
import triton
import triton.language as tl

import ditron
from ditron.runtime import sharing
import ditron.language as dl
from ditron.runtime.consistency import CallBoard
from ditron import _compat
from ditron.runtime import world as _world_module
from triton.runtime.driver import driver as _driver
from ditron.runtime.world import check_live_tensor

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def cdiv(x, y):
    """``triton.cdiv`` for host code: the same ``(x + y - 1) // y``, without the cost of calling a Triton
    ``constexpr_function`` from Python (Triton 3.9: ~2 us a call, on every eager op)."""
    return (x + y - 1) // y


def next_pow2(n):
    """``triton.next_power_of_2`` for host code (the same results: 0 for n <= 0; see :func:`cdiv`)."""
    n = int(n)
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


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
def _imax(a, b):
    return tl.maximum(a, b)


@triton.jit
def ll_poll(ptrs, mask, flag):
    """The LL packets at ``ptrs`` (a 2-D tile) once every one under ``mask``
    carries ``flag`` in its high 32 bits.  Bounded like ``dl.wait`` under
    ``DITRON_WAIT_TIMEOUT_S``: the report names a packet not yet arrived and
    the flag it holds (``dl.poll_timeout``; nothing is emitted
    without a timeout)."""
    pk = tl.load(ptrs, mask=mask, other=0, volatile=True)
    t0 = dl.clock_ns()
    # only the packets are loop-carried (a carried bool tile trips Triton 3.6's layout pass)
    while tl.reduce(tl.reduce((((pk >> 32).to(tl.int32) != flag) & mask).to(tl.int32), 1, _imax), 0, _imax) > 0:
        dl.poll_timeout(t0, ptrs, flag, pk >> 32, ((pk >> 32).to(tl.int32) != flag) & mask)
        pk = tl.load(ptrs, mask=mask, other=0, volatile=True)
    return pk


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
    """Streaming multiprocessors of ``device`` this rank may fill (cached: it is asked on every launch): all of
    them, or this rank's share when ranks of the world share the GPU (ditron.runtime.sharing), so that persistent
    grids of the ranks on one GPU can all be resident at once."""
    key = str(device)
    n = _SM_COUNTS.get(key)
    if n is None:
        try:
            n = torch.cuda.get_device_properties(device).multi_processor_count
        except Exception:  # noqa: BLE001 -- no CUDA device properties (CPU simulator, AMD without torch.cuda)
            n = 132
        _SM_COUNTS[key] = n
    try:
        index = torch.device(device).index
    except (RuntimeError, TypeError):
        index = None
    return sharing.usable_sms(index, n)


def waiting_programs(items: int, device, sim: bool, sim_programs: int = 2) -> int:
    """Programs for a kernel whose programs wait for other ranks (e.g. a reduction waiting for the peers'
    partials), one per work item, each looping over ``items / programs`` items when fewer.  When ranks of the
    world share this GPU (ditron.runtime.sharing) at most this rank's share of the SMs (:func:`sm_count`): waiting
    programs beyond it could fill the GPU while the kernel they wait for -- a peer's, on the same GPU -- has no
    SM to start on.  With one GPU per rank: one program per item (a peer's kernel runs on its own GPU).  On the
    simulator at most ``sim_programs``, so the loop over several items runs in CI."""
    items = max(1, int(items))
    if sim:
        return min(items, sim_programs)
    if sharing.shared():
        return min(items, sm_count(device))
    return items


def _guarded_init(init):
    """Wrap a context's ``__init__``: a creation that fails gives its
    symmetric allocations back (the heap is not leaked); a successful one
    records the heap span it owns (for the aliasing check) and its
    allocations (to notice a ``heap_scope`` that freed them)."""
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if getattr(self, "_creating", False):          # a subclass's __init__ calling super().__init__
            return init(self, *args, **kwargs)
        world = kwargs.get("world") or next((a for a in args if isinstance(a, ditron.World)), None)
        world = world or ditron.current_world()
        heap = world.heap
        mark = heap.mark()
        self._creating = True
        try:
            init(self, *args, **kwargs)
        except BaseException:
            heap.release(mark)
            raise
        finally:
            self._creating = False
        self._heap_span = (mark[0], heap.top)
        self._allocations = tuple(heap.allocations[mark[1]:])
    return __init__


class CollectiveContext:
    """Base of the zoo's contexts: the world, the device, the call counter and
    the symmetric buffers (allocated once, collectively, at creation)."""

    op = "collective"
    #: the function that creates this kind of context (for error messages)
    creator = "its create_*_context function"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _guarded_init(cls.__dict__["__init__"])

    #: element types of the context's buffers (a subclass widens it: ag_gemm gathers fp8 rows)
    dtypes = _FLOAT_DTYPES

    def __init__(self, max_numel: int, dtype, world=None):
        self.world = world or ditron.current_world()
        if dtype not in self.dtypes:
            raise ditron.DitronError(f"{self.op}: dtype {dtype} is not supported (use float32, float16 or bfloat16)")
        if int(max_numel) < 0:
            raise ditron.DitronError(f"{self.op}: max_numel must be >= 0")
        self.max_numel = int(max_numel)
        self.dtype = dtype
        self.device = self.world.device
        self.calls = torch.zeros(2, dtype=torch.int64, device=self.device)
        self.board = CallBoard(self.world, self.op)

    def check_alive(self, op):
        """A clear error for a context whose world or buffers are gone (per call: the buffers are looked at
        again only after the heap released allocations, which bumps its generation)."""
        w = self.world
        if w.finalized:
            raise ditron.DitronError(f"{op}: this {self.op} context belongs to a world that was finalized "
                                     "(ditron.finalize()); create a new context after ditron.init()")
        if _world_module._WORLD is not w:
            raise ditron.DitronError(f"{op}: this {self.op} context belongs to another ditron world than the "
                                     "current one; create a new context in this world")
        gen = w.heap.generation
        if self.__dict__.get("_alive_generation") == gen:
            return
        gone = next((a for a in getattr(self, "_allocations", ()) if a.freed), None)
        if gone is not None:
            raise ditron.DitronError(f"{op}: this {self.op} context's symmetric buffers were freed ({gone.freed}: "
                                     f"{gone.label()}); a context must not outlive the ditron.heap_scope it was "
                                     "created in. Create it again (or outside the scope)")
        if getattr(self, "_allocations", None) is not None:     # (still being created: look again next time)
            self._alive_generation = gen

    def check_not_aliased(self, t, argname, op):
        """Reject an argument that overlaps this context's symmetric buffers
        (peers write into them during the call: the result would be wrong)."""
        span = getattr(self, "_heap_span", None)
        heap = self.world.heap
        if span is None or t.numel() == 0 or not heap.contains(t):
            return
        lo = t.data_ptr() - heap.base
        hi = lo + (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()
        if lo < span[1] and span[0] < hi:
            raise ditron.DitronError(f"{op}: argument '{argname}' overlaps this context's own buffers "
                                     f"({heap.describe_offset(max(lo, span[0]))}); peers write there during the "
                                     "call. Pass a tensor of your own")

    def plan(self, key, make, *args):
        """``make(*args)`` once per ``key`` for this context: what a call launches (kernel, grid, arguments) is
        a function of the context and the call's sizes and knobs, so the second call of a shape finds it in
        one dictionary lookup (the argument checks that depend on the tensors themselves still run per call).
        ``make`` raises for a bad combination; nothing is kept then."""
        plans = self.__dict__.get("_launch_plans")
        if plans is None:
            plans = self.__dict__["_launch_plans"] = {}
        hit = plans.get(key)
        if hit is None:
            if len(plans) >= 256:         # a caller sweeping sizes: keep the memory bounded
                plans.clear()
            hit = plans[key] = make(*args)
        return hit

    def launch(self, key, kernel, grid, args, consts):
        """``kernel[grid](*args, **consts)`` for this context.  ``key`` must determine everything Triton
        specialises the kernel on besides ``args`` themselves: the plan's sizes and knobs, and the 16-byte
        alignment of every tensor argument that is not the context's own (the caller puts those bits in the key).
        From the second launch with the same key the compiled kernel is launched directly (Triton's last step,
        :func:`ditron._compat.launch_compiled`): no argument binding, specialisation or cache lookup.  The
        transport's launch check (device, expired bounded waits) runs every time; the symmetric-argument check
        ran at the first launch (the context's own buffers are the only symmetric arguments, and they do not
        change)."""
        fast = self.__dict__.get("_fast_launches")
        if fast is None:
            fast = self.__dict__["_fast_launches"] = {}
        hit = fast.get(key)
        if hit is not None and hit[0] == _world_module._GEN:
            self.launch_direct(hit, kernel, args)
            return
        compiled = kernel[grid](*args, **consts)
        names = getattr(kernel, "arg_names", None)
        if names is None or not _compat.is_compiled_kernel(compiled):
            return
        rest = names[len(args):]
        if any(n not in consts for n in rest):
            return                          # a parameter left to its default: Triton's path every time
        if len(fast) >= 256:
            fast.clear()
        fast[key] = (_world_module._GEN, compiled, tuple(grid) + (1,) * (3 - len(grid)), tuple(consts[n] for n in rest))

    def launch_entry(self, key):
        """The direct launch :meth:`launch` keeps for ``key`` once a launch through Triton's path made it: ``(world
        generation, compiled kernel, 3-D grid, the constexprs' values)``, or None (no launch yet, or none direct:
        the simulator, a parameter left to its default).  An op that plans its whole call (kernels/ep.py) keeps the
        entry and launches it with :meth:`launch_direct` while the generation is the world's
        (``ditron.runtime.world._GEN``)."""
        return self.__dict__.get("_fast_launches", {}).get(key)

    def launch_direct(self, entry, kernel, args):
        """Launch an entry of :meth:`launch_entry` with ``args`` (the kernel's non-constexpr arguments): the
        transport's launch check (device, expired bounded waits), then the compiled kernel."""
        device = _driver.active.get_current_device()
        self.world.transport.before_launch(kernel, args, device)
        _compat.launch_compiled(entry[1], device, entry[2], args + entry[3])

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
        dev = t.device
        mine = self.__dict__.get("_torch_device")
        if mine is None:
            mine = self._torch_device = torch.device(self.device)
        if dev != mine and not (dev.type == mine.type and dev.index in (None, mine.index)):
            raise ditron.DitronError(f"{self.op}: argument '{argname}' is on {t.device}, this rank works on "
                                     f"{self.device}")
        if not t.is_contiguous():
            raise ditron.DitronError(f"{self.op}: argument '{argname}' must be contiguous")
        if numel is not None and t.numel() != numel:
            raise ditron.DitronError(f"{self.op}: argument '{argname}' has {t.numel()} elements, expected {numel}")
        if t.numel() > self.max_numel * max(1, getattr(self, "numel_factor", 1)):
            raise ditron.DitronError(f"{self.op}: argument '{argname}' has {t.numel()} elements, more than the "
                                     f"context's max_numel={self.max_numel}; create a larger context")


def enter(ctx, cls, op, fields=(), **tensors):
    """The checks at the entry of every zoo op, before anything is launched:

    * ``ctx`` is a context of the right kind (``cls``);
    * the context is alive: its world was not finalized and its buffers were
      not freed by the end of a ``heap_scope``;
    * no tensor argument (``tensors``: name -> tensor or None) is a freed
      symmetric tensor or overlaps the context's own symmetric buffers;
    * every rank makes this call with the same ``fields`` (``(name, value)``
      pairs: sizes, dtypes, method; or a function that returns them, called only where the fields are
      compared -- :mod:`ditron.runtime.consistency`: always on the simulator, with ``DITRON_DEBUG=1`` on GPUs).
    """
    if not isinstance(ctx, cls):
        want = f"a context from {cls.creator}()"
        if isinstance(ctx, CollectiveContext):
            raise ditron.DitronError(f"{op}: ctx is a {ctx.op} context ({type(ctx).__name__}, from "
                                     f"{type(ctx).creator}()); {op} needs {want}")
        raise ditron.DitronError(f"{op}: ctx must be {want}, got {type(ctx).__name__}")
    ctx.check_alive(op)
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            alloc = getattr(t, "_ditron_alloc", None)
            if alloc is not None and alloc.freed:
                check_live_tensor(t, name, op)
            ctx.check_not_aliased(t, name, op)
    ctx.board.check(op, fields)


def op_fields(x, method=None, rows=True, name="x"):
    """The fingerprint fields of a tensor argument (shape, or only its row
    length when ``rows`` is False, and dtype) and the method, for :func:`enter`."""
    if isinstance(x, torch.Tensor):
        shape = tuple(x.shape) if rows else tuple(x.shape[1:])
        fields = [(f"{name}.shape" if rows else f"{name}.shape[1:]", shape),
                  (f"{name}.dtype", str(x.dtype).replace("torch.", ""))]
    else:
        fields = [(name, type(x).__name__)]
    return fields + ([("method", method)] if method is not None else [])


def tl_dtype(dtype):
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def default_block(numel: int, lo=128, hi=4096) -> int:
    return max(lo, min(hi, next_pow2(max(1, numel))))
