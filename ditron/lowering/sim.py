"""Simulator lowering: every distributed-IR op executed on Triton's
interpreter, over the shared-memory heaps of the simulated ranks.

Under the interpreter a "rule" does not emit code: it runs the op on NumPy
tiles when the kernel's Python body reaches it.  Semantics follow the GPU
rules as far as a CPU can:

* memory ordering: loads/stores of the interpreter are plain accesses to
  shared memory; signal words are read and written with atomic operations
  (sequentially consistent), so every ``semantic``/``scope`` is honoured
  (the simulator is at least as strong as the GPU).
* a program is one thread that executes whole tiles ("tile-at-a-time"):
  ``dl.tid()``/``dl.laneid()`` are 0, ``dl.num_threads()`` is 1 and
  ``dl.num_warps()`` is 1; ``ld``/``st``/``atomic_*`` act on every element
  of a tile; ``ballot_sync`` and the ``shfl_*_sync`` helpers treat the
  elements of a 1-D tile as the lanes of a warp (a scalar is one lane);
  ``syncthreads``/``fence`` order nothing further (a single thread is
  already ordered).
* waits spin on the shared heap; while spinning, a program lends its turn to
  the other programs of the launch, and the job's watchdog reports a
  deadlock with this wait's signal, expected and observed values.
* ``shmem.*`` transfers are synchronous copies, so ``quiet``/``fence`` have
  nothing left to complete; ``*_nbi`` variants behave like blocking ones.
* multicast (``remote_mc_ptr`` + ``multimem_*``) is the reduction /
  broadcast over all copies on this node.
"""
from __future__ import annotations

import ctypes
import os
import sys

import time

import numpy as np
import triton.language as tl

from .. import _compat
from ..errors import DitronError
from . import provided, register

BACKEND = "sim"
_MC_TAG = np.uint64(1 << 62)          # marks multicast addresses
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TRITON = os.path.dirname(os.path.abspath(tl.__file__)).rsplit(os.sep, 1)[0]


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _world(ctx):
    world = provided("world")
    if world is None or world.backend != "sim":
        raise ctx.error("needs a simulated ditron world: call ditron.init() (the script runs under "
                        "`ditron sim -n N` or with TRITON_INTERPRET=1)")
    return world, world.transport


def _data(x):
    x = _compat.unwrap(x)
    if hasattr(x, "handle"):
        return np.asarray(x.handle.data)
    return np.asarray([x])


def _int(x) -> int:
    return int(_data(x).reshape(-1)[0])


def _elem_ty(ptr):
    t = ptr.type.element_ty if ptr.type.is_block() else ptr.type
    return t.element_ty


def _elem_bytes(tt) -> int:
    return 8 if tt.is_ptr() else max(1, tt.primitive_bitwidth // 8)


def _scalar(value, tt):
    return _compat.interpreter_value(np.array([value], dtype=_compat.interpreter_np_dtype(tt)), tt)


def _like(ptr_or_value, data, tt=None):
    """A value shaped like ``ptr_or_value`` holding ``data`` (of dtype ``tt``)."""
    ty = ptr_or_value.type
    if tt is not None:
        ty = ty.with_element_ty(tt) if ty.is_block() else tt
    return _compat.interpreter_value(data, ty)


def where() -> str:
    """file:line in the kernel (the first frame outside ditron and Triton)."""
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_HERE) and not fn.startswith(_TRITON):
            return f"{os.path.basename(fn)}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _program():
    return provided("program")


class _Off:
    """Stand-in for a simulator module that is not loaded: its hooks do nothing."""

    def __getattr__(self, name):
        return _nothing


def _nothing(*args, **kwargs):
    return None


_OFF = _Off()


def race():
    """The race finder's hooks (:mod:`ditron.sim.race`, which provides itself)."""
    return provided("race") or _OFF


def access():
    """Polling-loop hooks (:mod:`ditron.sim.access`)."""
    return provided("access") or _OFF


def _launch():
    return provided("launch")


def _skew(event):
    """The skew-injection hook (:mod:`ditron.sim.skew`): nothing unless a plan delays this rank."""
    point = provided("skew")
    if point is not None:
        point(event)


def _check_rank(ctx, world, rank, arg, local):
    if not 0 <= rank < world.world_size:
        raise ctx.error(f"rank {rank} is not in [0, {world.world_size})", arg=arg)
    if local and rank // world.local_world_size != world.node:
        raise ctx.error(f"rank {rank} is on node {rank // world.local_world_size}, not on this node "
                        f"({world.node}): peer memory is reachable by load/store only inside a node (use "
                        "shmem.putmem*/getmem* or comm_scope='inter_node' across nodes)", arg=arg)


def _own_offsets(ctx, tr, addrs, arg, nbytes=1):
    """Heap offsets of ``addrs`` in this rank's heap; raises when the pointer
    is not in the symmetric heap."""
    base = tr.heap_base(tr.rank)
    off = addrs.astype(np.int64) - np.int64(base)
    first = int(off.reshape(-1)[0]) if off.size else 0
    lo = int(off.min()) if off.size else 0
    if off.size and (lo < 0 or first + nbytes > tr.heap_size or first >= tr.heap_size):
        launch = _launch()
        hint = launch.describe_arg(int(addrs.reshape(-1)[0])) if launch is not None else None
        what = f"{hint}, which is not symmetric" if hint else tr.describe_addr(int(addrs.reshape(-1)[0]))
        raise ctx.error(f"the pointer is not in this rank's symmetric heap ({what}); allocate the tensor with "
                        "ditron.symm_empty / ditron.symm_zeros", arg=arg)
    return off


def _translate(ctx, tr, world, ptr_data, rank, arg, *, local=True, nbytes=1):
    _check_rank(ctx, world, rank, "rank" if arg != "pe" else "pe", local)
    off = _own_offsets(ctx, tr, ptr_data, arg, nbytes)
    return (np.int64(tr.heap_base(rank)) + off).astype(np.uint64)


def _spin_values(ctx, tr, addrs, dtype, ok, expected_text, primitive):
    from ..sim import memory as M
    _skew("wait")
    launch = _launch()
    prog = _program()
    loc = where()
    world_rank = tr.rank

    def check():
        vals = M.atomic_load(addrs, dtype)
        return bool(ok(vals)), vals

    def describe(vals):
        bad = [i for i, v in enumerate(vals) if not ok(np.asarray([v]))]
        i = bad[0] if bad else 0
        return {"rank": world_rank, "program": prog, "primitive": primitive, "where": loc,
                "signal": tr.describe_addr(int(addrs[i])) + (f" (word {i} of {len(addrs)})" if len(addrs) > 1 else ""),
                "expected": expected_text, "observed": int(vals[i])}

    return tr.spin(check, describe, launch)


def _signal_dtype(ctx, tt, arg, need64=False):
    if not tt.is_int() or tt.primitive_bitwidth not in (32, 64):
        raise ctx.error(f"signal words must be int32/uint32 or int64/uint64, not {tt}", arg=arg)
    if need64 and tt.primitive_bitwidth != 64:
        raise ctx.error("OpenSHMEM signal words are 64-bit: use int64/uint64", arg=arg)
    return np.int64 if tt.primitive_bitwidth == 64 else np.int32


def _signal_update(tr, addr, value, sig_op, dtype):
    from ..sim import memory as M
    access().end_poll()
    if sig_op == "set":
        M.atomic_xchg(addr, value, dtype)
    else:
        M.atomic_add(addr, value, dtype)
    tr.control.progress()
    _skew("signal")


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
    world, tr = _world(ctx)
    tt = _elem_ty(ptr)
    dtype = _signal_dtype(ctx, tt, "ptr", need64=comm_scope == "inter_node")
    r = _int(rank)
    if comm_scope == "gpu" and r != world.rank:
        raise ctx.error(f"comm_scope='gpu' signals this rank only, but rank {r} was given (use 'intra_node')",
                        arg="comm_scope")
    addr = _translate(ctx, tr, world, _data(ptr), r, "ptr", local=comm_scope != "inter_node")
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
    from ..sim import memory as M
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
    from ..sim import memory as M
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


# ---------------------------------------------------------------------------
# thread level: one thread per program, acting on whole tiles
# ---------------------------------------------------------------------------

@register("tid", BACKEND)
def _tid(ctx, axis):
    return _scalar(0, tl.int32)


@register("laneid", BACKEND)
def _laneid(ctx):
    return _scalar(0, tl.int32)


@register("num_threads", BACKEND)
def _num_threads(ctx):
    return _scalar(1, tl.int32)


@register("num_warps", BACKEND)
def _num_warps(ctx):
    return _scalar(1, tl.int32)


# task level: scoreboard and work queue -------------------------------------------

def _slot_word(ctx, ptr, arg):
    tt = _elem_ty(ptr)
    if not (tt.is_int() and tt.primitive_bitwidth == 32):
        raise ctx.error(f"scoreboard slots and work counters are int32 words, not {tt}", arg=arg)
    return tt


@register("wait_deps", BACKEND)
def _wait_deps(ctx, slot_ptr, num_slots, epoch):
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
    world, tr = _world(ctx)
    _slot_word(ctx, slot_ptr, "slot_ptr")
    addr = np.asarray([_int(slot_ptr)], dtype=np.uint64)
    race().signal_release(addr, False)
    _signal_update(tr, addr, _int(epoch), "set", np.int32)
    return None


@register("fetch_task", BACKEND)
def _fetch_task(ctx, counter_ptr):
    from ..sim import memory as M
    world, tr = _world(ctx)
    _slot_word(ctx, counter_ptr, "counter_ptr")
    addr = np.asarray([_int(counter_ptr)], dtype=np.uint64)
    access().end_poll()
    race().rmw("pre", addr, "acq_rel", False)
    old = M.atomic_add(addr, 1, np.int32)
    race().rmw("post", addr, "acq_rel", False)
    tr.control.progress()
    return _scalar(int(np.asarray(old).reshape(-1)[0]), tl.int32)


def _heap_ptrs(ctx, ptr):
    return _data(ptr).astype(np.uint64)


@register("ld", BACKEND)
def _ld(ctx, ptr, scope, semantic):
    from ..sim import memory as M
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    addrs = _heap_ptrs(ctx, ptr)
    if tt.is_int() and tt.primitive_bitwidth in (32, 64):
        vals = M.atomic_load(addrs.reshape(-1), npd)
        if semantic == "acquire":
            race().signal_acquire(addrs, scope == "sys")
        else:
            race().signal_relaxed_read(addrs)
    else:
        vals = M.load(addrs.reshape(-1), npd)
        stale = race().plain_access("read", addrs, None, vals) if semantic != "volatile" else None
        vals = vals if stale is None else stale
    access().polled(addrs, None, vals, "dl.ld")
    return _like(ptr, vals.reshape(addrs.shape), tt)


@register("st", BACKEND)
def _st(ctx, ptr, value, scope, semantic):
    from ..sim import memory as M
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    addrs = _heap_ptrs(ctx, ptr).reshape(-1)
    vals = np.broadcast_to(_data(ctx.tensor(value)).astype(npd), _data(ptr).shape).reshape(-1)
    if tt.is_int() and tt.primitive_bitwidth in (32, 64):
        if semantic == "release":
            race().signal_release(addrs, scope == "sys")
        else:
            race().signal_relaxed_write(addrs)
        M.atomic_xchg(addrs, vals, npd)
    else:
        if semantic != "volatile":
            race().plain_access("write", addrs, None, vals)
        M.store(addrs, vals, npd)
    _progress()
    return None


def _progress():
    access().end_poll()
    world = provided("world")
    if world is not None and world.backend == "sim":
        world.transport.control.progress()


@register("atomic_add", BACKEND)
def _atomic_add(ctx, ptr, value, scope, semantic):
    I = _compat.interpreter_runtime()
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    addrs = _heap_ptrs(ctx, ptr).reshape(-1)
    vals = np.broadcast_to(_data(ctx.tensor(value)).astype(npd), _data(ptr).shape).reshape(-1).copy()
    op = I.RMW_OP.FADD if tt.is_floating() else I.RMW_OP.ADD
    race().rmw("pre", addrs, semantic, scope == "sys")
    old = I.atomic_rmw(op, addrs, vals, np.ones(addrs.shape, dtype=bool), I.MEM_SEMANTIC.ACQUIRE_RELEASE)
    race().rmw("post", addrs, semantic, scope == "sys")
    _progress()
    return _like(ptr, old.reshape(_data(ptr).shape), tt)


@register("atomic_cas", BACKEND)
def _atomic_cas(ctx, ptr, cmp, value, scope, semantic):
    from ..sim import memory as M
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    shape = _data(ptr).shape
    addrs = _heap_ptrs(ctx, ptr).reshape(-1)
    c = np.broadcast_to(_data(ctx.tensor(cmp)).astype(npd), shape).reshape(-1)
    v = np.broadcast_to(_data(ctx.tensor(value)).astype(npd), shape).reshape(-1)
    race().rmw("pre", addrs, semantic, scope == "sys")
    old = np.stack([M.atomic_cas(a, ci, vi, npd)[0] for a, ci, vi in zip(addrs, c, v)]) if addrs.size else \
        np.zeros(0, dtype=npd)
    race().rmw("post", addrs, semantic, scope == "sys")
    _progress()
    return _like(ptr, old.reshape(shape), tt)


@register("syncthreads", BACKEND)
def _syncthreads(ctx):
    return None


@register("fence", BACKEND)
def _fence(ctx, semantic, scope):
    race().fence(semantic, scope == "sys")
    return None


def _lanes(ctx, value):
    v = ctx.tensor(value)
    data = _data(v)
    if data.ndim > 1:
        raise ctx.error("the simulator treats the elements of a 1-D tile as lanes; got a "
                        f"{data.ndim}-D tile", arg="value")
    return v, data


@register("ballot_sync", BACKEND)
def _ballot_sync(ctx, mask, pred):
    _, data = _lanes(ctx, pred)
    bits = 0
    for i, p in enumerate(data.reshape(-1)[:32]):
        if p:
            bits |= 1 << i
    m = _int(mask) & 0xFFFFFFFF
    return _scalar(np.array([bits & m], dtype=np.uint32).view(np.int32)[0], tl.int32)


def _shfl(kind):
    def rule(ctx, mask, value, lane):
        v, data = _lanes(ctx, value)
        n = data.size
        if not v.type.is_block():
            return v
        idx = np.arange(n)
        k = _data(ctx.tensor(lane)).astype(np.int64)
        k = np.broadcast_to(k, (n,)) if k.size in (1, n) else k[:n]
        if kind == "idx":
            src = k % n
        elif kind == "up":
            src = np.where(idx - k >= 0, idx - k, idx)
        elif kind == "down":
            src = np.where(idx + k < n, idx + k, idx)
        else:
            x = idx ^ k
            src = np.where(x < n, x, idx)
        return _like(v, data[src])
    return rule


register("shfl_sync", BACKEND)(_shfl("idx"))
register("shfl_up_sync", BACKEND)(_shfl("up"))
register("shfl_down_sync", BACKEND)(_shfl("down"))
register("shfl_xor_sync", BACKEND)(_shfl("xor"))


@register("clock_ns", BACKEND)
def _clock_ns(ctx):
    return _scalar(time.monotonic_ns(), tl.int64)


@register("poll_timeout", BACKEND)
def _poll_timeout(ctx, start, ptr, expected, observed, pending):
    """Nothing: the simulator's watchdog reports a program that only polls
    (see ditron.sim.access.polled)."""
    return None


@register("prefetch_l2", BACKEND)
def _prefetch_l2(ctx, ptr, mask):
    """No effect; every unmasked address must lie in a tensor argument of the launch."""
    launch = _launch()
    if launch is None:
        return None
    addrs = _data(ptr).astype(np.uint64).reshape(-1)
    m = np.broadcast_to(_data(mask).astype(bool), _data(ptr).shape).reshape(-1) if hasattr(mask, "type") else \
        np.full(addrs.shape, bool(mask))
    for a in np.unique(addrs[m]):
        if launch.describe_arg(int(a)) is None:
            raise ctx.error(f"dl.prefetch_l2: address {int(a):#x} is outside every tensor argument of the launch "
                            "(mask the elements past the tensor's end)", arg="ptr")
    return None


@register("ffs", BACKEND)
def _ffs(ctx, x):
    v = ctx.tensor(x)
    data = _data(v).astype(np.int64) & ((1 << v.dtype.primitive_bitwidth) - 1)
    low = data & -data
    out = np.where(data == 0, 0, np.floor(np.log2(np.where(low == 0, 1, low))).astype(np.int64) + 1)
    return _like(v, out.astype(np.int32), tl.int32)


# ---------------------------------------------------------------------------
# chunk level (OpenSHMEM semantics, synchronous copies)
# ---------------------------------------------------------------------------

@register("shmem.my_pe", BACKEND)
def _my_pe(ctx):
    world, _ = _world(ctx)
    return _scalar(world.rank, tl.int32)


@register("shmem.n_pes", BACKEND)
def _n_pes(ctx):
    world, _ = _world(ctx)
    return _scalar(world.world_size, tl.int32)


@register("shmem.remote_ptr", BACKEND)
def _remote_ptr(ctx, ptr, pe):
    world, tr = _world(ctx)
    r = _int(pe)
    _check_rank(ctx, world, r, "pe", local=False)
    if r // world.local_world_size != world.node:
        return _like(ptr, np.zeros(_data(ptr).shape, dtype=np.uint64))     # not load/store reachable: null
    return _like(ptr, _translate(ctx, tr, world, _data(ptr), r, "ptr").reshape(_data(ptr).shape))


@register("shmem.remote_mc_ptr", BACKEND)
def _remote_mc_ptr(ctx, team, ptr):
    world, tr = _world(ctx)
    if _int(team) != 0:
        raise ctx.error("the simulator knows NVSHMEM_TEAM_WORLD (0) only", arg="team")
    if world.nnodes > 1:
        raise ctx.error("multicast memory spans one NVLink domain; TEAM_WORLD has ranks on several nodes",
                        arg="team")
    data = _data(ptr)
    _own_offsets(ctx, tr, data, "ptr")
    return _like(ptr, (data.astype(np.uint64) | _MC_TAG).reshape(data.shape))


def _ptr0(ctx, p, arg):
    data = _data(p)
    if data.size == 0:
        raise ctx.error("empty pointer tile", arg=arg)
    return data.reshape(-1)[:1].astype(np.uint64)


def _copy(ctx, tr, dst_addr, src_addr, nbytes):
    if nbytes < 0:
        raise ctx.error(f"negative byte count {nbytes}", arg="nbytes")
    access().end_poll()
    if nbytes and race().enabled():
        from ..sim import memory as M
        unit = np.uint16 if nbytes % 2 == 0 and int(src_addr) % 2 == 0 and int(dst_addr) % 2 == 0 else np.uint8
        step = np.dtype(unit).itemsize
        rel = np.arange(0, nbytes, step, dtype=np.uint64)
        src_addrs = np.uint64(int(src_addr)) + rel
        race().plain_access("read", src_addrs, None, None, itemsize=step)
        race().plain_access("write", np.uint64(int(dst_addr)) + rel, None, M.load(src_addrs, unit))
    if nbytes:
        ctypes.memmove(int(dst_addr), int(src_addr), nbytes)
    tr.control.progress()


@register("shmem.putmem", BACKEND)
def _putmem(ctx, dst, src, nbytes, pe, nbi, coop):
    world, tr = _world(ctx)
    n = _int(nbytes)
    remote = _translate(ctx, tr, world, _ptr0(ctx, dst, "dst"), _int(pe), "dst", local=False, nbytes=n)
    _copy(ctx, tr, remote[0], _ptr0(ctx, src, "src")[0], n)
    return None


@register("shmem.getmem", BACKEND)
def _getmem(ctx, dst, src, nbytes, pe, nbi, coop):
    world, tr = _world(ctx)
    n = _int(nbytes)
    remote = _translate(ctx, tr, world, _ptr0(ctx, src, "src"), _int(pe), "src", local=False, nbytes=n)
    _copy(ctx, tr, _ptr0(ctx, dst, "dst")[0], remote[0], n)
    return None


@register("shmem.putmem_signal", BACKEND)
def _putmem_signal(ctx, dst, src, nbytes, sig_addr, signal, pe, nbi, coop, sig_op):
    world, tr = _world(ctx)
    n, r = _int(nbytes), _int(pe)
    dtype = _signal_dtype(ctx, _elem_ty(sig_addr), "sig_addr", need64=True)
    remote = _translate(ctx, tr, world, _ptr0(ctx, dst, "dst"), r, "dst", local=False, nbytes=n)
    sig = _translate(ctx, tr, world, _ptr0(ctx, sig_addr, "sig_addr"), r, "sig_addr", local=False, nbytes=8)
    _copy(ctx, tr, remote[0], _ptr0(ctx, src, "src")[0], n)
    race().signal_release(sig, True)        # the signal is delivered after the data
    _signal_update(tr, sig, _int(signal), sig_op, dtype)
    return None


@register("shmem.signal_op", BACKEND)
def _signal_op(ctx, sig_addr, signal, pe, sig_op):
    world, tr = _world(ctx)
    dtype = _signal_dtype(ctx, _elem_ty(sig_addr), "sig_addr", need64=True)
    sig = _translate(ctx, tr, world, _ptr0(ctx, sig_addr, "sig_addr"), _int(pe), "sig_addr", local=False,
                     nbytes=8)
    race().signal_release(sig, True)
    _signal_update(tr, sig, _int(signal), sig_op, dtype)
    return None


_CMP = {"eq": np.equal, "ne": np.not_equal, "gt": np.greater, "ge": np.greater_equal, "lt": np.less,
        "le": np.less_equal}
_CMP_TEXT = {"eq": "==", "ne": "!=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}


@register("shmem.signal_wait_until", BACKEND)
def _signal_wait_until(ctx, sig_addr, cmp_value, cmp):
    world, tr = _world(ctx)
    tt = _elem_ty(sig_addr)
    _signal_dtype(ctx, tt, "sig_addr", need64=True)
    dtype = np.uint64       # nvshmem_signal_wait_until compares uint64_t words, whatever the tensor's signedness
    addr = _ptr0(ctx, sig_addr, "sig_addr")
    _own_offsets(ctx, tr, addr, "sig_addr", 8)
    want = np.array([_int(cmp_value)]).astype(dtype)[0]
    vals = _spin_values(ctx, tr, addr, dtype, lambda v: bool(_CMP[cmp](v, want).all()),
                        f"{_CMP_TEXT[cmp]} {int(want)}", "shmem.signal_wait_until")
    race().signal_acquire(addr, True)
    return _scalar(np.asarray(vals).astype(np.int64)[0], tl.int64)


@register("shmem.quiet", BACKEND)
def _quiet(ctx):
    return None


@register("shmem.fence", BACKEND)
def _shmem_fence(ctx):
    return None


def _device_barrier(ctx, primitive):
    from ..sim import memory as M
    world, tr = _world(ctx)
    ctl = tr.control
    gen_w, cnt_w = M.H_DEV_BAR_GEN, M.H_DEV_BAR_COUNT
    gen = ctl.get(gen_w)
    race().barrier("device", gen, "arrive")
    if ctl.add(cnt_w, 1) + 1 == world.world_size:
        ctl.set(cnt_w, 0)
        ctl.add(gen_w, 1)
        ctl.progress()
        race().barrier("device", gen, "leave")
        return None
    prog, loc = _program(), where()

    def check():
        return ctl.get(gen_w) != gen, ctl.get(cnt_w)

    def describe(count):
        return {"rank": world.rank, "program": prog, "primitive": primitive, "where": loc,
                "signal": "device barrier of all PEs", "expected": f"{world.world_size} PEs arrived",
                "observed": f"{count} arrived"}

    tr.spin(check, describe, _launch())
    race().barrier("device", gen, "leave")
    return None


@register("shmem.barrier_all", BACKEND)
def _barrier_all(ctx, coop):
    return _device_barrier(ctx, "shmem.barrier_all")


@register("shmem.sync_all", BACKEND)
def _sync_all(ctx, coop):
    return _device_barrier(ctx, "shmem.sync_all")
