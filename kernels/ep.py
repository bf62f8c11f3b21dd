"""Expert-parallel (EP) dispatch and combine written in ditron.language, with
DeepEP's contract, in two modes: normal (throughput: prefill, training) and
low-latency (decode: fixed capacity, no host sync, CUDA-graph capturable).

    ctx = create_ep_context(max_tokens, hidden, num_experts, torch.bfloat16)          # collective, once
    recv_x, recv_counts, handle = ep_dispatch(x, topk_idx, topk_weights, ctx)
    y = expert_mlp(recv_x, recv_counts)            # any per-expert computation, same row layout
    out = ep_combine(y, handle, ctx)               # [T, H] = sum_j topk_weights[t, j] * y[row of (t, j)]

    ll = create_ep_context(max_tokens, hidden, num_experts, torch.bfloat16, mode="low_latency", capacity=...)
    recv_x, recv_counts, handle = ep_dispatch(x, topk_idx, topk_weights, ll)     # recv_x: [E_local, W * cap, H]
    out = ep_combine(y, handle, ll)

The kernels are in kernels/ep_kernels.py (routing, normal mode) and
kernels/ep_ll_kernels.py (low-latency mode).

Contract
--------
Tokens ``x [T, H]`` (``T <= max_tokens``, float32 / float16 / bfloat16),
``topk_idx [T, k]`` (int32 / int64 expert ids; ``-1``: slot not routed, as in
DeepEP), ``topk_weights [T, k]`` (float32 or x's dtype).  Each rank owns
``E_local = num_experts / W`` experts: rank ``r`` owns ``[r * E_local, (r + 1)
* E_local)``.  Every (token, slot) pair routed to expert ``e`` is one row at
``e``'s owner (a token routed to two experts of one rank is received twice).

* normal: ``recv_x`` is ``[W * max_tokens * k, H]``; the received rows are
  grouped by local expert (``recv_counts[l]`` rows for local expert ``l``,
  expert after expert, from row 0), inside an expert by source rank, then by
  the source's token order; rows from ``recv_counts.sum()`` on are not
  written.  ``recv_counts`` (int64 ``[E_local]``) stays on the device.
* low-latency: ``recv_x`` is ``[E_local, W * capacity, H]``: local expert
  ``l``'s rows are ``recv_x[l, :recv_counts[l]]``, again by source rank.
  At most ``capacity`` pairs travel from one rank to one expert per call.

``ep_combine(y, handle, ctx)`` takes ``y`` in ``recv_x``'s layout (the expert
outputs, rows beyond the counts ignored) and returns ``out [T, H]`` (x's
dtype): ``out[t] = sum_j topk_weights[t, j] * y[row of (t, j)]`` in fp32, over
the pairs that were delivered.  Each combine must follow the dispatch whose
handle it takes, and every rank calls dispatch and combine in the same order.

Bad input
---------
Before launch (``DitronError``): shapes, dtypes, devices, ``k`` of
``topk_idx`` vs ``topk_weights``, more tokens than ``max_tokens``, a hidden
size or dtype other than the context's, ``num_experts % W``.  Expert ids
outside ``[-1, num_experts)`` are found by a host check (``validate=True``,
the default: one device-to-host read).  With ``validate=False`` (nothing read
back: what CUDA-graph capture needs) such pairs are dropped on the device and
counted in ``handle.dropped[0]``; in low-latency mode the pairs beyond
``capacity`` for one (source, expert) are dropped and counted in
``handle.dropped[1]``.  Dropped pairs contribute nothing to ``ep_combine``.
:func:`check_dropped` reads the counters (a host sync) and raises a
``DitronError`` naming them; nothing is dropped silently.

How (normal mode)
-----------------
Routing, on the device, one launch (``ep_route_kernel``; in low-latency
mode the same steps are the dispatch kernel's first phase; no sort, no torch
op; the pairs split over up to an SM count of programs, which exchange their
counts once through release / wait slots): two passes over blocks of pairs
give the counts per expert and each pair's rank among the earlier pairs of
its expert, hence its
place ``pos`` in the *staging order* (pairs by expert id, stable), which is
also (destination rank, local expert) order, and the staging order's token
of every place; the same pass counts the ids out of range (and, in
low-latency mode, the pairs over the capacity) into ``handle.dropped``.

Dispatch kernel (``ctx.max_programs`` programs, the same on every rank): the
rows for each destination are split over the programs; a program gathers its
rows of ``x`` (through the staging order: the permutation is fused, nothing
is copied first) and stores them into the destination's slot
``buf[p][rank]`` (``dl.symm_at``), program 0 also stores the destination's
counts (``E_local`` counts and the offset of the destination's block in the
staging order) into ``cnt[p][rank]``, and every program sets its signal word
``sig[p][pid][rank]`` on the destination.  Ranks on other nodes: rows and
counts are staged locally and sent by ``shmem.putmem_block`` (counts, then
``shmem.fence``) and ``shmem.putmem_signal_block`` (rows and signal).  Then
each program waits for the words of every program of every rank, reads the
``W x E_local`` counts, and copies its share of every source's rows into
``recv_x`` at their expert-grouped place (its own rows come from ``x``
directly).

Combine kernel: each owner copies the rows of ``y`` for source ``s != rank``
into ``s``'s ``cbuf[p]`` at their staging positions (the block offset came
with the counts), signals ``s`` (itself too); then every rank waits for every
owner and computes ``out[t] = sum_j w[t, j] * row(t, j)``: ``cbuf[p][pos[t,
j]]`` for a peer's row, the row of ``y`` itself for a pair of this rank's own
experts (own rows never travel: at one rank, dispatch is one gather of
``x`` and combine one weighted gather of ``y``).

Low-latency mode
----------------
Data and flag travel in the same 8-byte word (the LL protocol of
kernels/all_reduce.py): low 32 bits one fp32 or two 16-bit elements, high 32
bits ``epoch + 1``.  A pair goes straight to its slot ``lrecv[p][l][rank][slot]``
on the owner (``slot``: its index among this rank's pairs for that expert,
computed by the routing), and the count of each (expert, source) travels as
one flagged word ``lcnt[p][l][rank]``; the owner polls the count words, then
the rows' words, until every flag is this call's.  The routing is the LL
dispatch kernel's first phase (one launch) and needs no exchange between
its programs: program ``q`` owns pairs ``[q * per, (q + 1) * per)``, counts
per expert the pairs before them (one histogram over a few blocks of ids:
decode sizes), ranks its own pairs on top of those counts and sends them at
once (own pairs straight into ``recv_x``, at a row base per local expert
from the count words of the sources before this rank); program 0 counts all
the pairs (``dropped``, the count words).  ``ctx.ll_strided = True`` gives
each program every ``P``-th pair instead (each ranked by a direct count of
the earlier pairs of its expert), so that a copy tile's rows are different
tokens.  Combine sends each row
back to ``lcomb[p][owner][l][slot]`` on the token's rank, which reads the
rows it needs: per tile of tokens and columns all ``k`` packets at once,
their flags checked once, and only when some packet is not this call's yet
are the tile's peers' pairs polled one at a time.  No signal, no host
read, no buffer reset: the calls can be captured in a CUDA graph.  Other nodes: packed rows are staged and sent with
``shmem.putmem_block`` (each word carries its own flag, so the order in
which the words land does not matter).  A pair of this rank's own experts does
not travel: the sending program copies it from ``x`` into ``recv_x``
(dispatch) and the token side reads it from ``y`` (combine); the count words still go to every rank,
this one included.  On GPUs every program is resident (the grids are at
most the SM count).  At one rank the LL kernels are compiled without their
packet paths (``PEERS=False``: no peer, every pair copied or read directly),
which frees the registers for wider copy and reduce tiles.

fp8 payload (low latency, ``use_fp8=True``)
------------------------------------------
The dispatch kernel quantises each row as it sends it, as DeepEP's
``use_fp8=True``: per group of 128 channels ``amax = max(|x|, 1e-4)``, codes
``cvt.rn.satfinite.e4m3(x * (448 / amax))`` (``div_rn``), scale ``amax * (1
/ 448)`` in fp32 (``round_scale``: both powers of two).  A row is ``H / 4``
packets of 4 codes then ``H / 128`` packets of scales (same slots, same
flags); an own pair is quantised straight into the fp8 ``recv_x`` and its
scales (``[E_local, H / 128, W * capacity]`` in memory: returned transposed,
column-major per expert as DeepEP).  The fp8 outputs are made at the first
fp8 dispatch of each call parity.  The combine is unchanged (the context's
dtype).  :func:`fp8_quantize_reference` is the torch reference.

Host side: no allocation, no host read (``validate=False``), two launches
per normal dispatch (routing, then dispatch), one per LL dispatch and one
per combine.  The routing,
the handle's tensors and the outputs live in the context, one set per call
parity: ``recv_x``, ``recv_counts`` and the handle stay valid until the
second next ``ep_dispatch``, the combined output (without ``out=``) until
the second next ``ep_combine`` (one tensor per call parity, the same object
every time, as ``recv_x``).  The checks run in full at the first call of an
argument signature (shapes, strides, dtypes, devices, 16-byte alignment,
options); the call is then planned (``ctx.calls_planned``, :class:`_Call`)
and the next calls of that signature do only the per-call work: the
context's world and heap are still the plan's, no argument lies in the
symmetric heap (else the full checks), the cross-rank call check,
``validate``'s read, the call parity, the launches (the compiled kernels,
directly, after the transport's launch check) and the handle -- no torch op
but metadata reads (tests/test_launch_path.py).  Setting any attribute of the
context drops the plans.  ``ctx.launches`` counts the launches;
``ctx.trace = True`` compiles the kernels with ``TRACE`` (each program
writes ``clock_ns`` at the end of each phase into ``ctx.trace_buf``; see
``ditron bench ep --trace``).

Reuse: device-side call counters (kernels/_common.py; separate ones for
dispatch and combine), parity ``e % 2``, signal / flag value ``e + 1``.  A
rank reuses parity ``p`` at call ``e + 2`` only after call ``e + 1``, which
waited for every peer's call ``e + 1`` (normal: every peer signals every
rank; LL: every peer sends every count word), which followed its call ``e``.
"""
from __future__ import annotations

import torch

import ditron
from ditron.runtime import world as _world_module

from ._common import CollectiveContext, cdiv, enter, op_fields, sm_count
from .ep_kernels import ep_combine_kernel, ep_dispatch_kernel, ep_route_kernel
from .ep_ll_kernels import ep_fp8_quant_kernel, ep_ll_combine_kernel, ep_ll_dispatch_kernel
# the tile constants and the launches' constexprs (pure functions of the sizes), the torch references
from .ep_tiles import (KERNELS, _constexprs, _plan, ep_tiles, launch_constexprs, ll_dispatch_blocks,  # noqa: F401
                       route_blocks)
from .ep_reference import (FP8_GROUP, FP8_MARGIN, FP8_MAX, ep_reference, fp8_dequantize,  # noqa: F401
                           fp8_quantize_reference, fp8_round_trip_bound)

MODES = ("normal", "low_latency")
#: the kernels of one dispatch + combine, in launch order (rows of ``EpContext.trace_buf``)
TRACED = ("route", "dispatch", "combine")
#: trace phases per kernel (column ``i + 1`` of a program's record: ``clock_ns`` at the end of phase ``i``)
PHASES = {"route": ("count", "rank"), "normal": {"dispatch": ("send", "wait", "receive"), "combine": ("send", "wait",
                                                                                              "reduce")},
          "low_latency": {"dispatch": ("count", "rank, send rows", "receive"), "combine": ("send rows", "",
                                                                                          "reduce")}}
#: hooks of the bench's host account (ditron/bench/ep_trace.py): ``hook(name)`` -> a context manager around a launch
LAUNCH_HOOKS = []


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

class EpHandle:
    """What :func:`ep_combine` needs from its dispatch (device tensors only).
    ``dropped`` (int64 ``[2]``): pairs dropped for an expert id out of range
    (``validate=False``) and, in low-latency mode, for the capacity."""

    def __init__(self, mode, T, k, weights, dropped, **tensors):
        self.mode, self.T, self.k, self.weights, self.dropped = mode, T, k, weights, dropped
        self.__dict__.update(tensors)


def _al(t):
    """Whether ``t``'s address is 16-byte aligned (what Triton specialises a pointer on)."""
    return t.data_ptr() % 16 == 0


def _launch(ctx, name, key, kernel, grid, *args, **kwargs):
    """Every EP launch goes through here: counted (``ctx.launches``), and seen
    by the bench's host account (``LAUNCH_HOOKS``)."""
    ctx.launches[name] = ctx.launches.get(name, 0) + 1
    # ``key``: what Triton specialises on besides the context's own buffers (fixed): the call's sizes (they fix
    # every integer argument and the grid) and the 16-byte alignment of the caller's tensors
    key = (name, grid, bool(ctx.trace)) + key
    if LAUNCH_HOOKS:
        with LAUNCH_HOOKS[-1](name):
            ctx.launch(key, kernel, grid, args, kwargs)
    else:
        ctx.launch(key, kernel, grid, args, kwargs)
    return key


class _Call:
    """A planned EP call (a dispatch or a combine) of one argument signature (``EpContext.calls_planned``): made
    after a call of that signature passed every check and launched through Triton's path, it holds what the
    checks found and what the launches take.  The next call with the same signature (shapes, strides, dtypes,
    devices, 16-byte alignment of the caller's tensors, options) does only what depends on more than the
    signature: the context is alive (world and heap generations), no argument lies in the symmetric heap or is
    a symmetric tensor (else the full checks run), the cross-rank call check, ``validate``'s read, the call
    parity, the launches (the transport's launch check included) and the handle."""

    __slots__ = ("world", "gen", "heap", "hgen", "lo", "hi", "fields", "launches", "outs", "counts", "protos", "ll")


def _plan_call(ctx, fields, launches, outs, counts=None, protos=None):
    """A :class:`_Call` of ``launches`` (``(name, kernel, key, per-parity argument tuples, tail)``), or None where a
    launch has no direct entry (the simulator)."""
    planned = []
    for name, kernel, key, pre, post in launches:
        entry = ctx.launch_entry(key)
        if entry is None:
            return None
        planned.append((name, kernel, entry, pre, post))
    w = ctx.world
    heap = w.heap
    if not isinstance(getattr(heap, "base", None), int) or not isinstance(getattr(heap, "size", None), int):
        return None                              # no heap span to test arguments against: every call checked
    c = _Call()
    c.world, c.gen, c.heap = w, _world_module._GEN, heap
    c.hgen, c.lo, c.hi = heap.generation, heap.base, heap.base + heap.size
    c.fields, c.launches, c.outs, c.counts, c.protos = fields, tuple(planned), outs, counts, protos
    c.ll = ctx.mode != "normal"
    return c


def _live(c, p1, t1, p2, t2, p3=0, t3=None):
    """Whether the planned call ``c`` may take its fast path: the world and its heap are the plan's (nothing was
    freed since) and no argument (pointer ``p*`` of tensor ``t*``) starts in the heap or is a symmetric tensor
    (those get :func:`enter`'s full checks)."""
    if c.gen != _world_module._GEN or _world_module._WORLD is not c.world or c.heap.generation != c.hgen or \
            LAUNCH_HOOKS:
        return False
    lo, hi = c.lo, c.hi
    return not (lo <= p1 < hi or lo <= p2 < hi or lo <= p3 < hi or getattr(t1, "_ditron_alloc", None) is not None
                or getattr(t2, "_ditron_alloc", None) is not None or getattr(t3, "_ditron_alloc", None) is not None)


def _launch_planned(ctx, launch, args):
    """One planned launch (an item of ``_Call.launches``) with ``args``, counted like :func:`_launch`."""
    name, kernel, entry = launch[:3]
    launches = ctx.launches
    launches[name] = launches.get(name, 0) + 1
    ctx.launch_direct(entry, kernel, args)


class EpContext(CollectiveContext):
    """Symmetric buffers, signals and call counters of EP dispatch / combine
    (see the module docstring)."""

    op = "ep"

    def __setattr__(self, name, value):
        d = self.__dict__
        plans = d.get("plans")
        if plans and name in d.get("tile_attrs", ()):
            plans.clear()                       # a tuning attribute changed: the launches' constants follow it
        planned = d.get("calls_planned")
        if planned and name not in ("dcalls_host", "ccalls_host"):
            planned.clear()                     # any attribute (a buffer, trace, a size): the calls are planned again
        object.__setattr__(self, name, value)

    def __init__(self, max_tokens, hidden, num_experts, topk, dtype, world=None, mode="normal", capacity=None,
                 max_programs=None):
        E = ditron.DitronError
        if mode not in MODES:
            raise E(f"ep: mode={mode!r}; use one of {', '.join(MODES)}")
        for name, v in (("max_tokens", max_tokens), ("hidden", hidden), ("num_experts", num_experts),
                        ("topk", topk)):
            if int(v) < 1:
                raise E(f"ep: {name} must be >= 1 (got {v})")
        super().__init__(int(max_tokens) * int(hidden), dtype, world)
        W = self.world_size
        if int(num_experts) % W:
            raise E(f"ep: num_experts={num_experts} is not a multiple of the world size {W} (each rank owns "
                    f"num_experts / world_size experts)")
        self.max_tokens, self.topk = int(max_tokens), int(topk)
        sim = self.world.backend == "sim"
        if mode != "normal" and capacity is not None and int(capacity) < 1:
            raise E(f"ep: capacity must be >= 1 (got {capacity})")
        # the tile constants (kernel constexprs, warps, grids): a pure function of the sizes, shared with the
        # compile tests (tests/test_ep_compile.py), which sweep what it can pick
        tiles = vars(ep_tiles(mode, W, num_experts, hidden, dtype, sim=sim,
                              sms=None if sim else sm_count(self.device), nnodes=self.world.nnodes,
                              max_programs=max_programs))
        self.__dict__.update(tiles)
        self.tile_attrs = frozenset(tiles)
        self.ccalls = torch.zeros(2, dtype=torch.int64, device=self.device)     # combine's call counter
        TK, H, El = self.max_tokens * self.topk, self.hidden, self.local_experts
        self.slot_rows = TK
        if mode == "normal":
            P = self.max_programs
            self.buf = self.symm((2, W, TK * H), dtype, "buf")
            self.cnt = self.symm((2, W, El + 1), torch.int64, "cnt")
            self.sig = self.symm((2, P, W), torch.int64, "sig")
            self.csig = self.symm((2, P, W), torch.int64, "csig")
            self.cbuf = self.symm((2, TK * H), dtype, "cbuf")
            mn = self.multi_node
            self.stage = self.symm((2, TK * H) if mn else (1,), dtype, "stage")
            self.cstage = self.symm((2, W, El + 1) if mn else (1,), torch.int64, "cstage")
            self.ystage = self.symm((2, W, TK * H) if mn else (1,), dtype, "ystage")
        else:
            cap = int(capacity if capacity is not None else self.max_tokens)
            self.capacity = cap
            self.lrecv = self.symm((2, El, W, cap, self.hw), torch.int64, "lrecv")
            self.lcnt = self.symm((2, El, W), torch.int64, "lcnt")
            self.lcomb = self.symm((2, W, El, cap, self.hw), torch.int64, "lcomb")
            words = max(2 * TK * self.hw + 2 * W * El, 2 * W * cap * self.hw) if self.multi_node else 1
            self.lstage = self.symm((words,), torch.int64, "lstage")
        # the data path allocates nothing: per call parity (host counters), the routing, the handle's tensors and
        # the outputs live here (an op's outputs stay valid until the second next call of that op)
        dev, i64 = self.device, torch.int64
        self.dcalls_host, self.ccalls_host = 0, 0
        # (kernel, call sizes, options) -> its constexprs and warps, computed once (_plan); emptied when a tile
        # attribute (ep_tiles: e.g. ll_strided) is set on the context
        self.plans = {}
        # a call's argument signature -> its _Call (checked, launches direct): the eager path's fast path
        self.calls_planned = {}
        self.launches = {}
        self.trace = False
        self.route_hist = torch.zeros(self.route_programs * (self.route_ep + 1), dtype=torch.int32, device=dev)
        self.route_slots = torch.zeros(self.route_programs, dtype=torch.int32, device=dev)
        self.rcalls = torch.zeros(2, dtype=i64, device=dev)
        self.trace_buf = torch.zeros((len(TRACED), max(self.max_programs, self.route_programs), 4), dtype=i64,
                                     device=dev)
        recv_shape = (W * TK, H) if mode == "normal" else (El, W * self.capacity, H)
        self.slots = []
        for _ in range(2):
            b = {n: torch.empty(TK, dtype=i64, device=dev) for n in ("key", "pos", "pslot", "tok", "skey", "sslot")}
            b.update(cnt=torch.empty(self.num_experts + 1, dtype=i64, device=dev),
                     start=torch.empty(self.num_experts + 1, dtype=i64, device=dev),
                     dropped=torch.empty(2, dtype=i64, device=dev),
                     rc=torch.empty((W, El + 1) if mode == "normal" else (El, W), dtype=i64, device=dev),
                     recv_counts=torch.empty(El, dtype=i64, device=dev),
                     recv_x=torch.empty(recv_shape, dtype=dtype, device=dev),
                     out=torch.empty((self.max_tokens, H), dtype=dtype, device=dev))
            self.slots.append(b)
        ditron.barrier_all()        # every rank's zeroed signals exist before any peer writes them

    def blocks(self):
        """(BR, BH or BW): rows and columns (LL: words) of a tile (fixed by the context: made once)."""
        return self.tile_blocks


def create_ep_context(max_tokens, hidden, num_experts, topk, dtype, world=None, mode="normal", capacity=None,
                      max_programs=None):
    """Allocate EP's symmetric buffers for up to ``max_tokens`` tokens of
    ``hidden`` elements per rank, routed to ``topk`` of ``num_experts``
    experts.  ``mode``: ``"normal"`` or ``"low_latency"`` (``capacity``: most
    pairs one rank sends to one expert per call; default ``max_tokens``).
    Collective: every rank calls it with the same arguments.  Memory per rank
    (elements): normal ``4 * W * max_tokens * topk * hidden`` (x3 on several
    nodes' staging), low-latency ``4 * num_experts * capacity * hidden`` in
    8-byte words per 1 (fp32) or 2 (fp16 / bf16) elements."""
    return EpContext(max_tokens, hidden, num_experts, topk, dtype, world, mode, capacity, max_programs)


def _check_inputs(ctx, x, topk_idx, topk_weights):
    E = ditron.DitronError
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != ctx.hidden:
        shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise E(f"ep_dispatch: x must be [tokens, hidden={ctx.hidden}], got {shape}")
    T = x.shape[0]
    if T > ctx.max_tokens:
        raise E(f"ep_dispatch: x has {T} tokens, more than the context's max_tokens={ctx.max_tokens}; create a "
                f"larger context")
    ctx.check_tensor(x, "x")
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.shape[0] != T or \
            topk_idx.dtype not in (torch.int32, torch.int64):
        desc = f"{topk_idx.dtype}{list(topk_idx.shape)}" if isinstance(topk_idx, torch.Tensor) else \
            type(topk_idx).__name__
        raise E(f"ep_dispatch: topk_idx must be an int32/int64 tensor [tokens={T}, k], got {desc}")
    k = topk_idx.shape[1]
    if k != ctx.topk:
        raise E(f"ep_dispatch: topk_idx has k={k}, the context was created for topk={ctx.topk}")
    if not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != (T, k):
        shape = list(topk_weights.shape) if isinstance(topk_weights, torch.Tensor) else type(topk_weights).__name__
        raise E(f"ep_dispatch: topk_weights must be [tokens={T}, k={k}] like topk_idx, got {shape}")
    if topk_weights.dtype not in (torch.float32, x.dtype):
        raise E(f"ep_dispatch: topk_weights is {topk_weights.dtype}; use float32 or x's dtype {x.dtype}")
    for name, t in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
        if t.device != x.device:
            raise E(f"ep_dispatch: argument '{name}' is on {t.device}, x on {x.device}")
    return T, k


def _validate_ids(ctx, topk_idx, k):
    """``validate=True``: the host check of the expert ids (one device-to-host read)."""
    ids = topk_idx.reshape(-1)
    if ids.numel():
        E = ctx.num_experts
        bad = (ids < -1) | (ids >= E)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ditron.DitronError(f"ep_dispatch: topk_idx[{i // k}, {i % k}] = {int(ids[i])} is not an expert "
                                     f"id in [0, {E}) (or -1: not routed); rank {ctx.rank}")


def _trace_args(ctx, row):
    return (ctx.trace_buf[row] if ctx.trace else ctx.trace_buf), bool(ctx.trace)


def ep_dispatch(x, topk_idx, topk_weights, ctx, validate=True, use_fp8=False, round_scale=False):
    """Send every (token, slot) pair to its expert's rank; returns ``(recv_x,
    recv_counts, handle)`` (see the module docstring for the layouts).  Two
    launches (the routing, then the dispatch kernel; low latency: one), no allocation, no host
    read unless ``validate``; ``recv_x``, ``recv_counts`` and the handle are
    the context's and stay valid until the second next ``ep_dispatch``.

    ``use_fp8`` (low-latency mode; ``hidden % 128 == 0``): the rows travel as
    e4m3 with one fp32 scale per 128 channels, quantised on the fly as
    DeepEP's ``use_fp8=True`` (module docstring, fp8 payload); ``recv_x`` is
    then the pair ``(codes, scales)``: ``float8_e4m3fn [E_local, W *
    capacity, hidden]`` and fp32 ``[E_local, W * capacity, hidden / 128]``
    (column-major in its last two dimensions, as DeepEP).  ``round_scale``:
    power-of-two scales.  The combine stays in the context's dtype."""
    return _dispatch(x, topk_idx, topk_weights, ctx, validate, use_fp8, round_scale)


def _check_fp8(ctx, use_fp8, round_scale):
    E = ditron.DitronError
    if round_scale and not use_fp8:
        raise E("ep_dispatch: round_scale=True needs use_fp8=True (it rounds the fp8 scales)")
    if use_fp8:
        if ctx.mode != "low_latency":
            raise E("ep_dispatch: use_fp8=True is a low-latency option (create the context with "
                    "mode='low_latency'); normal mode sends x as it is")
        if ctx.hidden % 128:
            raise E(f"ep_dispatch: use_fp8=True needs hidden % 128 == 0 (one scale per 128 channels); the context "
                    f"has hidden={ctx.hidden}")


def _fp8_out(ctx, b):
    """The slot's e4m3 ``recv_x`` and its scales (made at the first fp8 dispatch of the slot)."""
    if "recv_x8" not in b:
        El, N, H = ctx.local_experts, ctx.world_size * ctx.capacity, ctx.hidden
        b["recv_x8"] = torch.empty((El, N, H), dtype=torch.float8_e4m3fn, device=ctx.device)
        b["recv_x8_words"] = b["recv_x8"].view(torch.int32)
        b["recv_scale"] = torch.empty((El, H // 128, N), dtype=torch.float32, device=ctx.device)
        b["recv_scale_t"] = b["recv_scale"].transpose(1, 2)
    return b


def _fp8_stage(ctx):
    """The context's ``[max_tokens, H / 4 + H / 128]`` int32 staging of the pre-quantised tokens
    (``ll_fp8_prequant``; made at the first such dispatch)."""
    q = ctx.__dict__.get("fp8_stage")
    if q is None:
        H = ctx.hidden
        q = torch.empty((ctx.max_tokens, H // 4 + H // 128), dtype=torch.int32, device=ctx.device)
        object.__setattr__(ctx, "fp8_stage", q)
    return q


def _dispatch(x, topk_idx, topk_weights, ctx, validate=True, use_fp8=False, round_scale=False, counts=None):
    """:func:`ep_dispatch`; ``counts``: another ``[E_local]`` tensor for ``recv_counts`` (low latency; DeepEP's
    int32 counts).  A call whose signature was planned (:class:`_Call`) takes the fast path."""
    try:
        px, pi, pw = x.data_ptr(), topk_idx.data_ptr(), topk_weights.data_ptr()
        key = (x.shape, x.stride(), x.dtype, x.device, px % 16 == 0, topk_idx.shape, topk_idx.stride(),
               topk_idx.dtype, topk_idx.device, pi % 16 == 0, topk_weights.shape, topk_weights.stride(),
               topk_weights.dtype, topk_weights.device, use_fp8, round_scale, ctx.trace,
               None if counts is None else (counts.shape, counts.stride(), counts.dtype, counts.device,
                                            counts.data_ptr() % 16 == 0))
        c = ctx.calls_planned.get(key)
    except (AttributeError, TypeError, RuntimeError):   # not tensors, not an EP context: the checks say what
        c = key = None
    if c is None or not _live(c, px, x, pi, topk_idx, pw, topk_weights):
        return _dispatch_checked(x, topk_idx, topk_weights, ctx, validate, use_fp8, round_scale, counts, key)
    ctx.board.check("ep_dispatch", c.fields)
    if validate:
        _validate_ids(ctx, topk_idx, ctx.topk)
    d = ctx.__dict__                              # (the host counters are no tile attribute: no __setattr__)
    n = d["dcalls_host"]
    d["dcalls_host"] = n + 1
    p = n % 2
    h = EpHandle.__new__(EpHandle)
    h.__dict__.update(c.protos[p])
    h.weights = topk_weights
    launch = c.launches[0]
    if c.ll:
        rc = c.counts[p] if counts is None else counts
        if len(c.launches) == 2:            # fp8 pre-quantised: each token once into the staging, whose words
            _launch_planned(ctx, launch, (x,) + launch[3][p] + launch[4])     # the dispatch then moves
            x, launch = launch[3][p][0], c.launches[1]
        _launch_planned(ctx, launch, (x, topk_idx) + launch[3][p] + (rc,) + launch[4])
        return c.outs[p], rc, h
    _launch_planned(ctx, launch, (topk_idx,) + launch[3][p] + launch[4])
    launch = c.launches[1]
    _launch_planned(ctx, launch, (x,) + launch[3][p] + launch[4])
    return c.outs[p], c.counts[p], h


def _dispatch_checked(x, topk_idx, topk_weights, ctx, validate, use_fp8, round_scale, counts, key):
    """:func:`_dispatch` through every check; plans the call's signature ``key`` (None: none to plan) when it
    passed them with contiguous arguments."""
    _check_fp8(ctx, use_fp8, round_scale)
    T, k = _check_inputs(ctx, x, topk_idx, topk_weights)
    # the cross-rank check of every zoo op (token counts may differ across ranks: rows are not compared)
    enter(ctx, EpContext, "ep_dispatch", lambda: _dispatch_fields(x, k, ctx), x=x, topk_idx=topk_idx,
          topk_weights=topk_weights)
    if key is not None and not (x.is_contiguous() and topk_idx.is_contiguous() and topk_weights.is_contiguous()):
        key = None                                # copies are made below: their alignment is not the key's
    if not x.is_contiguous():
        x = x.contiguous()
    if not topk_idx.is_contiguous():
        topk_idx = topk_idx.contiguous()
    if not topk_weights.is_contiguous():
        topk_weights = topk_weights.contiguous()
    if validate:
        _validate_ids(ctx, topk_idx, k)
    El, H, E = ctx.local_experts, ctx.hidden, ctx.num_experts
    TK = T * k
    b = ctx.slots[ctx.dcalls_host % 2]
    ctx.dcalls_host += 1
    cap = ctx.capacity if ctx.mode != "normal" else TK + 1
    if ctx.mode != "normal":
        # low latency: the routing is the dispatch kernel's first phase (one launch)
        P = ctx.max_programs
        lper = ll_dispatch_blocks(ctx, TK)[0]
        tr, _ = _trace_args(ctx, 1)
        recv_x, rc = b["recv_x"], b["rc"]
        recv_counts = b["recv_counts"] if counts is None else counts
        if use_fp8:
            _fp8_out(ctx, b)
            out, scale = b["recv_x8_words"], b["recv_scale"]
        else:
            out, scale = recv_x, rc           # scale: unused without FP8
        launches = []
        if use_fp8 and ctx.ll_fp8_prequant:
            # each token quantised once into the staging; the dispatch moves its words
            stage = _fp8_stage(ctx)
            qconst, qwarps = _plan(ctx, "ep_fp8_quant_kernel", TK, k, x.element_size(), use_fp8, round_scale)
            G = H // 128
            qpost = (T, H, G)
            qkey = _launch(ctx, "fp8_quant", (T, _al(x), round_scale), ep_fp8_quant_kernel,
                           (cdiv(max(T, 1), qconst["BR"]), cdiv(G, qconst["BG"])), x, stage, *qpost, **qconst,
                           num_warps=qwarps)
            launches.append(("fp8_quant", ep_fp8_quant_kernel, qkey, [(stage,)] * 2, qpost))
            xin = stage
        else:
            xin = x
        const, warps = _plan(ctx, "ep_ll_dispatch_kernel", TK, k, x.element_size(), use_fp8, round_scale,
                             bool(ctx.trace))
        post = (ctx.lrecv, ctx.lcnt, ctx.lstage, ctx.calls, tr, TK, k, H, ctx.hw, El, cap, lper)
        lkey = _launch(ctx, "dispatch", (TK, k, _al(xin), _al(topk_idx), topk_idx.dtype, use_fp8, round_scale,
                                         recv_counts.dtype), ep_ll_dispatch_kernel, (P,),
                       xin, topk_idx, b["key"], b["pslot"], b["dropped"], out, scale, rc, recv_counts, *post,
                       **const, num_warps=warps)
        if use_fp8:
            recv_x = (b["recv_x8"], b["recv_scale_t"])
        if key is not None:
            pre, outs = [], []
            for s in ctx.slots:
                if use_fp8:
                    _fp8_out(ctx, s)
                pre.append((s["key"], s["pslot"], s["dropped"]) + ((s["recv_x8_words"], s["recv_scale"]) if use_fp8
                                                                   else (s["recv_x"], s["rc"])) + (s["rc"],))
                outs.append((s["recv_x8"], s["recv_scale_t"]) if use_fp8 else s["recv_x"])
            _remember(ctx, key, _plan_call(
                ctx, _dispatch_fields(x, k, ctx), launches + [("dispatch", ep_ll_dispatch_kernel, lkey, pre, post)],
                outs,
                [s["recv_counts"] for s in ctx.slots],
                [dict(mode="low_latency", T=T, k=k, dropped=s["dropped"], peid=s["key"], pslot=s["pslot"],
                      lrc=s["rc"]) for s in ctx.slots]))
        return recv_x, recv_counts, EpHandle("low_latency", T, k, topk_weights, b["dropped"], peid=b["key"],
                                             pslot=b["pslot"], lrc=rc)
    _, per, rp = route_blocks(ctx, TK)
    tr, _ = _trace_args(ctx, 0)
    const, warps = _plan(ctx, "ep_route_kernel", TK, k, x.element_size(), trace=bool(ctx.trace))
    rpost = (ctx.route_hist, ctx.route_slots, ctx.rcalls, tr, TK, k, E, cap, per)
    rkey = _launch(ctx, "route", (TK, k, _al(topk_idx), topk_idx.dtype), ep_route_kernel, (rp,), topk_idx,
                   *_route_pre(b), *rpost, **const, num_warps=warps)
    tr, _ = _trace_args(ctx, 1)
    recv_x, recv_counts, rc = b["recv_x"], b["recv_counts"], b["rc"]
    const, warps = _plan(ctx, "ep_dispatch_kernel", TK, k, x.element_size(), trace=bool(ctx.trace))
    dpost = (ctx.buf, ctx.cnt, ctx.stage, ctx.cstage, ctx.sig, ctx.calls, tr, TK, H, ctx.slot_rows, El)
    dkey = _launch(ctx, "dispatch", (TK, _al(x)), ep_dispatch_kernel, (ctx.max_programs,),
                   x, *_dispatch_pre(b), *dpost, **const, num_warps=warps)
    if key is not None:
        _remember(ctx, key, _plan_call(
            ctx, _dispatch_fields(x, k, ctx), [("route", ep_route_kernel, rkey, [_route_pre(s) for s in ctx.slots],
                                                rpost),
                                               ("dispatch", ep_dispatch_kernel, dkey,
                                                [_dispatch_pre(s) for s in ctx.slots], dpost)],
            [s["recv_x"] for s in ctx.slots], [s["recv_counts"] for s in ctx.slots],
            [dict(mode="normal", T=T, k=k, dropped=s["dropped"], pos=s["pos"], rc=s["rc"]) for s in ctx.slots]))
    return recv_x, recv_counts, EpHandle("normal", T, k, topk_weights, b["dropped"], pos=b["pos"], rc=rc)


def _route_pre(b):
    return b["key"], b["pos"], b["pslot"], b["tok"], b["skey"], b["sslot"], b["cnt"], b["start"], b["dropped"]


def _dispatch_pre(b):
    return b["tok"], b["cnt"], b["recv_x"], b["rc"], b["recv_counts"]


def _dispatch_fields(x, k, ctx):
    """The cross-rank check's fields of a dispatch (:func:`enter`)."""
    return op_fields(x, rows=False) + [("topk", k), ("mode", ctx.mode)]


def _remember(ctx, key, call):
    """Keep the planned call ``call`` (None: nothing to keep) under its signature ``key``."""
    if call is not None:
        plans = ctx.calls_planned
        if len(plans) >= 256:                    # a caller sweeping shapes: the memory stays bounded
            plans.clear()
        plans[key] = call


def ep_combine(y, handle, ctx, out=None, topk_weights=None):
    """``out [T, H]``: for each token the ``topk_weights``-weighted sum of its
    pairs' rows of ``y`` (``recv_x``'s layout), accumulated in fp32.  One
    launch; without ``out`` the result is the context's and stays valid until
    the second next ``ep_combine``.  ``topk_weights`` (``[T, k]``, float32 or
    y's dtype): weights other than the dispatch's (DeepEP's low-latency
    combine takes them here)."""
    return _combine(y, handle, ctx, out, topk_weights)


def _combine(y, handle, ctx, out=None, topk_weights=None, rows=None):
    """:func:`ep_combine`; ``rows`` (normal mode): ``y`` may be any ``[n, H]`` with ``n >= rows``, the rows
    received (known to the caller).  A call whose signature was planned (:class:`_Call`) takes the fast path."""
    try:
        w = handle.weights if topk_weights is None else topk_weights
        py, pw = y.data_ptr(), w.data_ptr()
        po = 0 if out is None else out.data_ptr()
        key = (type(handle), handle.mode, handle.T, handle.k, y.shape, y.stride(), y.dtype, y.device, py % 16 == 0,
               w.dtype, pw % 16 == 0, None if topk_weights is None else (w.shape, w.stride(), w.device),
               None if out is None else (out.shape, out.stride(), out.dtype, out.device, po % 16 == 0), rows,
               ctx.trace)
        c = ctx.calls_planned.get(key)
    except (AttributeError, TypeError, RuntimeError):   # not tensors, not a handle or an EP context: the checks say
        c = key = None
    if c is None or not _live(c, py, y, po, out):
        return _combine_checked(y, handle, ctx, out, topk_weights, rows, key)
    ctx.board.check("ep_combine", c.fields)
    d = ctx.__dict__
    n = d["ccalls_host"]
    if out is None:
        out = c.outs[n % 2]
    d["ccalls_host"] = n + 1
    launch = c.launches[0]
    if c.ll:
        _launch_planned(ctx, launch, (y, out, handle.peid, handle.pslot, w, handle.lrc) + launch[4])
    else:
        _launch_planned(ctx, launch, (y, out, handle.pos, w, handle.rc) + launch[4])
    return out


def _combine_checked(y, handle, ctx, out, topk_weights, rows, key):
    """:func:`_combine` through every check; plans the call's signature ``key`` (None: none to plan) when it
    passed them."""
    E = ditron.DitronError
    if not isinstance(handle, EpHandle) or handle.mode != ctx.mode:
        raise E(f"ep_combine: handle must come from ep_dispatch on this {ctx.mode} context")
    W, El, H = ctx.world_size, ctx.local_experts, ctx.hidden
    shape = (W * ctx.slot_rows, H) if ctx.mode == "normal" else (El, W * ctx.capacity, H)
    if rows is not None and isinstance(y, torch.Tensor) and y.dim() == 2 and y.shape[0] >= rows and \
            y.shape[1] == H:
        shape = tuple(y.shape)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != shape:
        got = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise E(f"ep_combine: y must have recv_x's shape {list(shape)}, got {got}")
    weights = handle.weights
    if topk_weights is not None:
        if not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != (handle.T, handle.k):
            got = list(topk_weights.shape) if isinstance(topk_weights, torch.Tensor) else \
                type(topk_weights).__name__
            raise E(f"ep_combine: topk_weights must be [tokens={handle.T}, k={handle.k}] like the dispatch's "
                    f"topk_idx, got {got}")
        if topk_weights.dtype not in (torch.float32, y.dtype):
            raise E(f"ep_combine: topk_weights is {topk_weights.dtype}; use float32 or y's dtype {y.dtype}")
        if topk_weights.device != y.device:
            raise E(f"ep_combine: topk_weights is on {topk_weights.device}, y on {y.device}")
        if not topk_weights.is_contiguous():
            key = None                          # a copy is made: its alignment is not the key's
        weights = topk_weights.contiguous()
    ctx.check_tensor(y.reshape(-1)[:0], "y")
    if not y.is_contiguous():
        raise E("ep_combine: argument 'y' must be contiguous")
    enter(ctx, EpContext, "ep_combine", lambda: _combine_fields(y, ctx), y=y, out=out)
    T, k = handle.T, handle.k
    own = out is None
    if own:
        out = ctx.slots[ctx.ccalls_host % 2]["out"][:T]
    elif not isinstance(out, torch.Tensor) or tuple(out.shape) != (T, H) or out.dtype != y.dtype or \
            not out.is_contiguous():
        raise E(f"ep_combine: argument 'out' must be a contiguous ({T}, {H}) {y.dtype} tensor")
    ctx.ccalls_host += 1
    tr, _ = _trace_args(ctx, 2)
    if ctx.mode == "normal":
        const, warps = _plan(ctx, "ep_combine_kernel", 0, k, y.element_size(), trace=bool(ctx.trace))
        kernel = ep_combine_kernel
        post = (ctx.cbuf, ctx.ystage, ctx.csig, ctx.ccalls, tr, T, ctx.slot_rows, H, ctx.slot_rows, El)
        lkey = _launch(ctx, "combine", (T, k, _al(y), _al(out), _al(weights), weights.dtype), kernel,
                       (ctx.max_programs,), y, out, handle.pos, weights, handle.rc, *post, **const, num_warps=warps)
    else:
        const, warps = _plan(ctx, "ep_ll_combine_kernel", 0, k, y.element_size(), trace=bool(ctx.trace))
        kernel = ep_ll_combine_kernel
        post = (ctx.lcomb, ctx.lstage, ctx.ccalls, tr, T, T * k, H, ctx.hw, El, ctx.capacity)
        lkey = _launch(ctx, "combine", (T, k, _al(y), _al(out), _al(weights), weights.dtype), kernel,
                       (ctx.max_programs,), y, out, handle.peid, handle.pslot, weights, handle.lrc, *post, **const,
                       num_warps=warps)
    if key is not None:
        # the context's output of each parity: one view each, made once (as recv_x, the same tensor every call)
        outs = [s["out"][:T] for s in ctx.slots] if own else None
        _remember(ctx, key, _plan_call(ctx, _combine_fields(y, ctx), [("combine", kernel, lkey, None, post)], outs))
    return out


def _combine_fields(y, ctx):
    """The cross-rank check's fields of a combine (:func:`enter`)."""
    return op_fields(y, rows=False, name="y") + [("mode", ctx.mode)]


def check_dropped(handle):
    """Raise ``DitronError`` if the dispatch of ``handle`` dropped pairs (reads
    two counters back: a host sync); returns ``handle`` otherwise."""
    bad, over = (int(v) for v in handle.dropped.tolist())
    if bad or over:
        parts = []
        if bad:
            parts.append(f"{bad} pair(s) routed to an expert id out of range")
        if over:
            parts.append(f"{over} pair(s) over the low-latency capacity (create the context with a larger "
                         f"capacity)")
        raise ditron.DitronError("ep_dispatch dropped " + " and ".join(parts))
    return handle
