"""Communication tasks: all-reduce, all-gather and barrier tiles inside a
megakernel, written with the existing primitives (``dl.symm_at`` stores,
``dl.notify`` / ``dl.wait`` at system scope).

Each tile pushes its slice of ``x`` into every rank's symmetric staging
buffer, signals each rank with the step number (``dtask.EPOCH``), waits for
every rank's signal of the same tile, and combines the slices in rank order
(identical results on every rank).  Staging buffers and signal words are
double-buffered by epoch parity: a rank can run at most one step ahead of a
peer's reads (it needs the peer's push of the next step to get further), so
back-to-back steps never overwrite data a peer still reads.  Calls of the
same kind and shape share one pool (indexed by the per-instance scalar
``inst``), so e.g. 36 layers' all-reduces share one branch of the kernel.

With world size 1 the same code is a copy (all_reduce / all_gather) or a
no-op wait on its own signal (barrier).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import language as dl
from ..errors import DitronError
from .common import EPOCH

#: instances per pool (a pool holds staging for this many calls of one kind and shape)
POOL_INSTANCES = 64


@triton.jit
def exchange_tile(tile, x, out, stage, sig, n, inst, epoch, CAP: tl.constexpr, NTILES: tl.constexpr,
                  REDUCE: tl.constexpr, BLOCK: tl.constexpr):
    """Tile ``tile`` (BLOCK elements of n) of an all-reduce (REDUCE) or
    all-gather.  stage: [2, CAP, world, n]; sig: [2, CAP, world, NTILES] int32."""
    me = dl.rank()
    world = dl.num_ranks()
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    row = ((epoch % 2) * CAP + inst) * world           # this step's block of `world` rows
    v = tl.load(x + offs, mask=m)
    for peer in range(0, world):
        tl.store(dl.symm_at(stage + (row + me) * n + offs, peer), v, mask=m)
        dl.notify(sig + (row + me) * NTILES + tile, peer, signal=epoch, sig_op="set", comm_scope="intra_node")
    acc = tl.zeros((BLOCK,), tl.float32)
    for src in range(0, world):
        tok = dl.wait(sig + (row + src) * NTILES + tile, 1, "sys", "acquire", waitValue=epoch)
        got = tl.load(dl.consume_token(stage + (row + src) * n + offs, tok), mask=m)
        if REDUCE:
            acc += got.to(tl.float32)
        else:
            tl.store(out + src * n + offs, got, mask=m)
    if REDUCE:
        tl.store(out + offs, acc.to(out.dtype.element_ty), mask=m)


@triton.jit
def barrier_tile(tile, sig, inst, epoch, CAP: tl.constexpr):
    """Every rank signals every rank, then waits for all: sig [2, CAP, world] int32."""
    me = dl.rank()
    world = dl.num_ranks()
    row = ((epoch % 2) * CAP + inst) * world
    for peer in range(0, world):
        dl.notify(sig + row + me, peer, signal=epoch, sig_op="set", comm_scope="intra_node")
    dl.wait(sig + row, world, "sys", "acquire", waitValue=epoch)


def _world_size(what):
    from ..runtime.world import current_world
    w = current_world(required=False)
    if w is None:
        raise DitronError(f"{what}: communication tasks need a ditron world: call ditron.init() first")
    return w.world_size


def _pool(graph, key, make):
    """(buffers, instance index) of the next free instance of pool ``key``."""
    pools = graph.__dict__.setdefault("_comm_pools", {})
    entry = pools.get(key)
    if entry is None or entry["used"] >= POOL_INSTANCES:
        entry = {"buffers": make(), "used": 0}
        pools[key] = entry
    inst = entry["used"]
    entry["used"] += 1
    return entry["buffers"], inst


def _exchange(graph, name, x, out, deps, block, reduce):
    import torch

    import ditron
    what = f"{'all_reduce' if reduce else 'all_gather'} '{name}'"
    ws = _world_size(what)
    for arg, t in (("x", x), ("out", out)):
        if not t.is_contiguous():
            raise DitronError(f"{what}: {arg} must be contiguous")
    n = x.numel()
    if n == 0:
        raise DitronError(f"{what}: x is empty")
    if out.numel() != (n if reduce else ws * n) or out.dtype != x.dtype:
        raise DitronError(f"{what}: out must be a {x.dtype} tensor of {n if reduce else f'world_size x {n}'} "
                          f"elements, got {out.dtype} with {out.numel()}")
    block = min(block, triton.next_power_of_2(n))
    ntiles = triton.cdiv(n, block)

    def make():
        kind = "all_reduce" if reduce else "all_gather"
        stage = ditron.symm_zeros((2, POOL_INSTANCES, ws, n), x.dtype,
                                  name=f"megakernel {graph.name}: {kind} staging (n={n})")
        sig = ditron.symm_zeros((2, POOL_INSTANCES, ws, ntiles), torch.int32,
                                name=f"megakernel {graph.name}: {kind} signals (n={n})")
        return stage, sig

    (stage, sig), inst = _pool(graph, ("reduce" if reduce else "gather", str(x.dtype), n, block), make)
    return graph.register_task(
        exchange_tile, name=name, num_tiles=ntiles,
        args={"x": x, "out": out, "stage": stage, "sig": sig, "n": n, "epoch": EPOCH, "CAP": POOL_INSTANCES,
              "NTILES": ntiles, "REDUCE": reduce, "BLOCK": block},
        reads=("x",), writes=("out",), deps=list(deps), scalars={"inst": inst})


def all_reduce(graph, name, x, out, deps=(), block=1024):
    """Register a task: ``out = sum over ranks of x`` (elementwise, fp32
    accumulation, same order on every rank).  ``x`` and ``out`` are ordinary
    tensors (not symmetric); ``out`` may be ``x``.  Tiles of ``block``
    elements (a masked tail); later tasks ``Dep`` on the returned task ("same"
    gives tile i = elements [i*block, (i+1)*block))."""
    return _exchange(graph, name, x, out, deps, block, True)


def all_gather(graph, name, x, out, deps=(), block=1024):
    """Register a task: ``out[r * n : (r + 1) * n] = x`` of rank ``r`` for
    every rank (``out`` holds world_size x n elements)."""
    if out.data_ptr() == x.data_ptr():
        raise DitronError(f"all_gather '{name}': out must not alias x")
    return _exchange(graph, name, x, out, deps, block, False)


def barrier(graph, name, deps=()):
    """Register a one-tile task that completes on every rank only after every
    rank reached it (and everything its deps wrote was released)."""
    import torch

    import ditron
    ws = _world_size(f"barrier '{name}'")

    def make():
        return (ditron.symm_zeros((2, POOL_INSTANCES, ws), torch.int32,
                                  name=f"megakernel {graph.name}: barrier signals"),)

    (sig,), inst = _pool(graph, ("barrier",), make)
    return graph.register_task(barrier_tile, name=name, num_tiles=1,
                               args={"sig": sig, "epoch": EPOCH, "CAP": POOL_INSTANCES},
                               deps=list(deps), scalars={"inst": inst})
