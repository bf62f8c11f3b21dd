"""Simulator lowering: every distributed-IR op executed on Triton's
interpreter, over the shared-memory heaps of the simulated ranks.

Under the interpreter a "rule" does not emit code: it runs the op on NumPy
tiles when the kernel's Python body reaches it.  Semantics follow the GPU
rules as far as a CPU can:

* memory ordering: loads/stores of the interpreter are plain accesses to
  shared memory; signal words are read and written with atomic operations
  (sequentially consistent), so every ``semantic``/``scope`` is honoured
  (the simulator is at least as strong as the GPU).
* a program executes whole tiles and has ``num_warps * 32`` threads: code on
  ``dl.tid()``/``dl.laneid()`` runs once per simulated thread
  (:mod:`ditron.sim.simt`; outside such code they are thread 0's values);
  primitives with a CTA barrier refuse to run there.  ``ld``/``st``/``atomic_*``
  act on every element of a tile; ``ballot_sync`` and the ``shfl_*_sync``
  helpers treat the elements of a 1-D tile as the lanes of a warp (a scalar
  is one lane); ``syncthreads``/``fence`` order nothing further.
* waits spin on the shared heap; while spinning, a program lends its turn to
  the other programs of the launch, and the job's watchdog reports a
  deadlock with this wait's signal, expected and observed values.
* ``shmem.*`` transfers are synchronous copies, so ``quiet``/``fence`` have
  nothing left to complete; ``*_nbi`` variants behave like blocking ones.
* multicast (``remote_mc_ptr`` + ``multimem_*``) is the reduction /
  broadcast over all copies on this node.
"""
from __future__ import annotations

import numpy as np
import triton.language as tl

from .. import _compat
from . import register
from .sim_base import (BACKEND, _MC_TAG, _data, _elem_bytes, _elem_ty, _int, _like, _own_offsets, _scalar,
                       _signal_dtype, _signal_update, _spin_values, _translate, _wait_bounds, _world, access,
                       not_in_thread_region, race, where)
from . import sim_shmem, sim_thread  # noqa: F401  (their rules register on import)

__all__ = ["where", "race"]       # used by ditron.language.semantic, ditron.sim and ditron.runtime.sim


# ---------------------------------------------------------------------------
# tile level
# ---------------------------------------------------------------------------

@register("rank", BACKEND)
def _rank(ctx, axis):
    world, _ = _world(ctx)
    return _scalar({-1: world.rank, 0: world.local_rank, 1: world.node}[axis], tl.int32)


@register("num_ranks", BACKEND)
def _num_ranks(ctx, axis):
    world, _ = _world(ctx)
    return _scalar({-1: world.world_size, 0: world.local_world_size, 1: world.nnodes}[axis], tl.int32)


@register("symm_at", BACKEND)
def _symm_at(ctx, ptr, rank):
    world, tr = _world(ctx)
    data = _translate(ctx, tr, world, _data(ptr), _int(rank), "ptr")
    return _like(ptr, data.reshape(_data(ptr).shape))


@register("wait", BACKEND)
def _wait(ctx, barrier_ptrs, num_barriers, wait_value, scope, semantic):
    not_in_thread_region(ctx, "dl.wait")
    world, tr = _world(ctx)
    tt = _elem_ty(barrier_ptrs)
    dtype = _signal_dtype(ctx, tt, "barrier_ptrs")
    n = _int(num_barriers)
    want = _int(wait_value)
    if tt.is_int_unsigned() or want >= 2 ** (tt.primitive_bitwidth - 1):
        want = np.array([want], dtype=np.uint64).astype(dtype)[0]   # same bits as the GPU compares
    base = _int(barrier_ptrs)
    if n > 0:
        addrs = np.uint64(base) + np.arange(n, dtype=np.uint64) * np.uint64(_elem_bytes(tt))
        _wait_bounds(ctx, tr, base, n * _elem_bytes(tt), "barrier_ptrs",
                     f"num_barriers={n} words from there are more than the tensor holds")
        _spin_values(ctx, tr, addrs, dtype, lambda v: np.all(v == want), f"== {int(want)}", "dl.wait")
        if semantic == "acquire":
            race().signal_acquire(addrs, scope == "sys")
        else:
            race().signal_relaxed_read(addrs)
    return _scalar(0, tl.int32)


@register("consume_token", BACKEND)
def _consume_token(ctx, value, token):
    return value


@register("notify", BACKEND)
def _notify(ctx, ptr, rank, signal, sig_op, comm_scope):
    not_in_thread_region(ctx, "dl.notify")
    world, tr = _world(ctx)
    tt = _elem_ty(ptr)
    dtype = _signal_dtype(ctx, tt, "ptr", need64=comm_scope == "inter_node")
    r = _int(rank)
    if comm_scope == "gpu" and r != world.rank:
        raise ctx.error(f"comm_scope='gpu' signals this rank only, but rank {r} was given (use 'intra_node')",
                        arg="comm_scope")
    data = _data(ptr)
    addr = _translate(ctx, tr, world, data, r, "ptr", local=comm_scope != "inter_node",
                      nbytes=_elem_bytes(tt) if data.size == 1 else 1)
    race().signal_release(addr, comm_scope != "gpu")        # st/red.release at the scope's level
    _signal_update(tr, addr, _int(signal), sig_op, dtype)
    return None


def _mc_node_ranks(ctx, world):
    first = world.node * world.local_world_size
    return range(first, first + world.local_world_size)


def _untag(ctx, ptrs, arg):
    data = _data(ptrs)
    if data.size and not np.all(data & _MC_TAG):
        raise ctx.error("not a multicast address: pass pointers from shmem.remote_mc_ptr(team, ptr)", arg=arg)
    return data & ~_MC_TAG


def _to_f32(raw, tt):
    if tt.is_bf16():
        return _compat.bf16_bits_to_f32(raw)
    return raw.astype(np.float64 if tt.is_fp64() else np.float32) if tt.is_floating() else raw


def _from_f32(x, tt, np_dtype):
    if tt.is_bf16():
        return _compat.f32_to_bf16_bits(x)                # round to nearest even
    return np.asarray(x).astype(np_dtype)


@register("multimem_ld_reduce", BACKEND)
def _multimem_ld_reduce(ctx, ptrs, op, acc_dtype):
    from .. import sim_memory as M
    world, tr = _world(ctx)
    tt = _elem_ty(ptrs)
    npd = _compat.interpreter_np_dtype(tt)
    local = _untag(ctx, ptrs, "ptrs")
    off = _own_offsets(ctx, tr, local, "ptrs")
    acc = None
    for r in _mc_node_ranks(ctx, world):
        addrs = (np.int64(tr.heap_base(r)) + off).astype(np.uint64)
        vals = M.load(addrs, npd)
        stale = race().plain_access("read", addrs, None, vals)
        vals = _to_f32(vals if stale is None else stale, tt)
        acc = vals if acc is None else {"sum": np.add, "min": np.minimum, "max": np.maximum}[op](acc, vals)
    out = _from_f32(acc, tt, npd).reshape(local.shape)
    return _like(ptrs, out, tt)


@register("multimem_st", BACKEND)
def _multimem_st(ctx, ptrs, value):
    from .. import sim_memory as M
    world, tr = _world(ctx)
    tt = _elem_ty(ptrs)
    npd = _compat.interpreter_np_dtype(tt)
    local = _untag(ctx, ptrs, "ptrs")
    off = _own_offsets(ctx, tr, local, "ptrs")
    v = ctx.tensor(value)
    raw = _data(v)
    if v.dtype != tt:      # numeric conversion (bf16 is stored as raw uint16)
        raw = _from_f32(_to_f32(raw, v.dtype).astype(np.float64), tt, npd)
    vals = np.broadcast_to(raw, local.shape).astype(npd)
    for r in _mc_node_ranks(ctx, world):
        addrs = (np.int64(tr.heap_base(r)) + off).astype(np.uint64).reshape(-1)
        race().plain_access("write", addrs, None, vals.reshape(-1))
        M.store(addrs, vals.reshape(-1), npd)
    access().end_poll()
    tr.control.progress()
    return None


# packed multicast accesses, per thread (Triton-distributed's language_extra helpers) -------------------------

def _vector_io(tr, starts, nbytes, words=None):
    """One access per ``nbytes``-byte vector at ``starts`` (ditron.sim_memory.vector_load / vector_store, the
    lock stripes by heap offset); loads return ``(n, nbytes // 8)`` int64 words."""
    from .. import sim_memory as M
    starts = np.asarray(starts, dtype=np.uint64).reshape(-1)
    stripes = (starts.astype(np.int64) - int(tr.base0)) >> 4
    abort = lambda: tr.control.abort != 0           # noqa: E731
    if words is None:
        return M.vector_load(starts, nbytes, stripes, tr.control, abort)
    M.vector_store(starts, words, nbytes, stripes, tr.control, abort)
    return None


def _mm_packed(ctx, tr, ptr, mask, nbytes, name, store):
    """Heap offsets (in this rank's heap) of the 2-byte halves of the ``nbytes``-byte accesses at the multicast
    pointers ``ptr`` (shape: pointers x halves) and the mask per pointer (``None``: all)."""
    if store and ptr.type.is_block() and _compat.simt_thread() is not None:
        raise ctx.error(f"{name} on a tile inside a branch or loop on dl.tid()/dl.laneid(): on a GPU each thread "
                        "stores the elements its layout gives it, which the simulator cannot know; use one scalar "
                        "pointer per thread there", arg="ptr")
    local = _untag(ctx, ptr, "ptr").reshape(-1)
    live = None
    if mask is not None:
        live = np.broadcast_to(_data(ctx.tensor(mask)).astype(bool).reshape(-1) if ptr.type.is_block()
                               else _data(ctx.tensor(mask)).astype(bool).reshape(-1)[:1], local.shape)
    act = local if live is None else local[live]
    bad = act[act % np.uint64(nbytes) != 0]
    if bad.size:
        raise ctx.error(f"{name}: a {nbytes}-byte multicast access needs a {nbytes}-byte aligned address, not "
                        f"{int(bad[0]) % 4096:#x} (mod 4096): a GPU faults (misaligned address)", arg="ptr")
    if act.size:
        _own_offsets(ctx, tr, act[:1], "ptr", nbytes=nbytes)
    off = _own_offsets(ctx, tr, local, "ptr")
    halves = off[:, None] + np.arange(0, nbytes, 2, dtype=np.int64)[None, :]
    return halves, live


def _mm_lanes(raw_u16, tt):
    """The 16-bit halves of a packed access as lanes of ``tt``, in fp32 (fp32 lanes: pairs of halves)."""
    if tt.is_fp32():
        return np.ascontiguousarray(raw_u16).view(np.float32)
    if tt.is_bf16():
        return _compat.bf16_bits_to_f32(raw_u16)
    return raw_u16.view(np.float16).astype(np.float32)


@register("multimem_ld_reduce_v4", BACKEND)
def _multimem_ld_reduce_v4(ctx, ptr, mask, acc_dtype):
    """Per pointer, the 16 bytes summed over the node's copies, lane by lane in fp32 (in rank order), rounded once
    to the lane type (to nearest even: ``.acc::f32`` then the conversion of the result), as four 32-bit words."""
    world, tr = _world(ctx)
    tt = _elem_ty(ptr)
    halves, live = _mm_packed(ctx, tr, ptr, mask, 16, "multimem_ld_reduce_v4", store=False)
    n = halves.shape[0]
    sel = None if live is None else np.repeat(live, halves.shape[1])
    acc = None
    rows = np.arange(n) if live is None else np.flatnonzero(live)
    for r in _mc_node_ranks(ctx, world):
        addrs = (np.int64(tr.heap_base(r)) + halves).astype(np.uint64).reshape(-1)
        raw = np.zeros((n, 8), dtype=np.uint16)
        if rows.size:               # each copy's 16 bytes read as one access (as the switch reads them)
            raw[rows] = np.ascontiguousarray(_vector_io(tr, addrs.reshape(n, 8)[rows, 0], 16)).view(np.uint16)
        raw = raw.reshape(-1)
        stale = race().plain_access("read", addrs, sel, raw, group=8)
        raw = (raw if stale is None else stale).reshape(n, 8)
        lanes = _mm_lanes(raw, tt)
        acc = lanes if acc is None else acc + lanes          # fp32 arithmetic, one rounding per addition
    if tt.is_fp32():
        words = acc.astype(np.float32).view(np.uint32)
    elif tt.is_bf16():
        words = np.ascontiguousarray(_compat.f32_to_bf16_bits(acc).astype(np.uint16)).view(np.uint32)
    else:
        words = np.ascontiguousarray(acc.astype(np.float16)).view(np.uint32)
    words = words.reshape(n, 4)
    if live is not None:
        words = np.where(live[:, None], words, np.uint32(0))
    out_t = tl.float32 if tt.is_fp32() else tl.int32
    npd = np.float32 if tt.is_fp32() else np.int32
    shape = _data(ptr).shape
    return tuple(_like(ptr, np.ascontiguousarray(words[:, i]).view(npd).reshape(shape), out_t) for i in range(4))


_ST_BYTES = {"b32": 4, "b64": 8, "v2": 8, "v4": 16}


@register("multimem_st_packed", BACKEND)
def _multimem_st_packed(ctx, ptr, values, mask, form):
    """Per pointer, the bits of the values (32-bit words, or one 64-bit word) stored into every copy on the node."""
    from .. import sim_memory as M
    world, tr = _world(ctx)
    nbytes = _ST_BYTES[form]
    halves, live = _mm_packed(ctx, tr, ptr, mask, nbytes, f"multimem_st ({form})", store=True)
    n = halves.shape[0]
    cols = []
    for v in values:
        raw = np.ascontiguousarray(_data(ctx.tensor(v)))
        bits = raw.view(np.uint64 if raw.dtype.itemsize == 8 else np.uint32)
        cols.append(np.broadcast_to(bits.reshape(-1) if bits.size > 1 else bits.reshape(-1)[:1], (n,)))
    words = np.ascontiguousarray(np.stack(cols, axis=1))            # (n, words): little-endian, as on a GPU
    u16 = words.view(np.uint16).reshape(n, nbytes // 2)
    if live is not None:
        halves, u16 = halves[live], u16[live]
    u16 = np.ascontiguousarray(u16)
    for r in _mc_node_ranks(ctx, world):
        addrs = (np.int64(tr.heap_base(r)) + halves).astype(np.uint64).reshape(-1)
        race().plain_access("write", addrs, None, u16.reshape(-1))
        starts = addrs.reshape(halves.shape)[:, 0] if halves.size else np.zeros(0, np.uint64)
        if nbytes >= 8:             # one access per copy, as the switch writes it
            _vector_io(tr, starts, nbytes, u16.view(np.int64).reshape(-1, nbytes // 8))
        elif starts.size:
            M.atomic_xchg(starts, u16.view(np.int32).reshape(-1), np.int32)
    access().end_poll()
    tr.control.progress()
    return None


# task level: scoreboard and work queue -------------------------------------------

def _slot_word(ctx, ptr, arg):
    tt = _elem_ty(ptr)
    if not (tt.is_int() and tt.primitive_bitwidth == 32):
        raise ctx.error(f"scoreboard slots and work counters are int32 words, not {tt}", arg=arg)
    return tt


@register("wait_deps", BACKEND)
def _wait_deps(ctx, slot_ptr, num_slots, epoch, acquire="fence"):   # (acquire: NVIDIA only)
    not_in_thread_region(ctx, "dl.wait_deps")
    world, tr = _world(ctx)
    _slot_word(ctx, slot_ptr, "slot_ptr")
    n = _int(num_slots)
    want = _int(epoch)
    if n > 0:
        addrs = np.uint64(_int(slot_ptr)) + np.arange(n, dtype=np.uint64) * np.uint64(4)
        _spin_values(ctx, tr, addrs, np.int32, lambda v: np.all(v >= want), f">= {want}", "dl.wait_deps")
        race().signal_acquire(addrs, False)
    return _scalar(0, tl.int32)


@register("release_tile", BACKEND)
def _release_tile(ctx, slot_ptr, epoch):
    not_in_thread_region(ctx, "dl.release_tile")
    world, tr = _world(ctx)
    _slot_word(ctx, slot_ptr, "slot_ptr")
    addr = np.asarray([_int(slot_ptr)], dtype=np.uint64)
    access().tile_released(int(addr[0]))           # megakernel access check of the tile this ends
    race().signal_release(addr, False)
    _signal_update(tr, addr, _int(epoch), "set", np.int32)
    return None


@register("fetch_task", BACKEND)
def _fetch_task(ctx, counter_ptr):
    not_in_thread_region(ctx, "dl.fetch_task")
    from .. import sim_memory as M
    world, tr = _world(ctx)
    _slot_word(ctx, counter_ptr, "counter_ptr")
    addr = np.asarray([_int(counter_ptr)], dtype=np.uint64)
    access().end_poll()
    race().rmw("pre", addr, "acq_rel", False)
    old = M.atomic_add(addr, 1, np.int32)
    race().rmw("post", addr, "acq_rel", False)
    tr.control.progress()
    return _scalar(int(np.asarray(old).reshape(-1)[0]), tl.int32)


