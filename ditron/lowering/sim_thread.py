"""Simulator rules of the thread-level primitives: thread ids (per simulated thread inside the
thread-dependent regions of :mod:`ditron.sim.simt`), ``ld``/``st``/``atomic_*`` with memory semantics,
fences, warp votes and shuffles (the elements of a 1-D tile are the lanes), clocks, prefetches."""
from __future__ import annotations

import time

import numpy as np
import triton.language as tl

from .. import _compat
from . import provided, register
from .sim_base import (BACKEND, _data, _elem_ty, _int, _launch, _like, _scalar, _threads_per_program, access,
                       not_in_thread_region, race)


# ---------------------------------------------------------------------------
# thread level
# ---------------------------------------------------------------------------

@register("tid", BACKEND)
def _tid(ctx, axis):
    """The simulated thread of a thread-dependent region (ditron.sim.simt); 0 outside one (what the GPU's
    thread 0 -- the thread that performs scalar stores -- computes).  Programs are 1-D: axes 1 and 2 are 0."""
    t = _compat.simt_thread()
    return _scalar(t if (t is not None and axis == 0) else 0, tl.int32)


@register("laneid", BACKEND)
def _laneid(ctx):
    t = _compat.simt_thread()
    return _scalar(0 if t is None else t % 32, tl.int32)


@register("num_threads", BACKEND)
def _num_threads(ctx):
    return _scalar(_threads_per_program(), tl.int32)


@register("simt_region", BACKEND)
def _simt_region(ctx):
    """``(thread_idx, block_size)`` of ``dl.simt_exec_region``: ditron.sim.simt runs the region's body once per
    simulated thread (split at its top-level ``syncthreads``), so the thread is the region's current one."""
    t = _compat.simt_thread()
    if t is None:
        raise ctx.error("dl.simt_exec_region: the region was not rewritten into per-thread code (ditron.sim.simt "
                        "rewrites `with dl.simt_exec_region() as (thread_idx, block_size):` statements of "
                        "@ditron.jit kernels and their @triton.jit helpers); enter it with a `with` statement")
    return _scalar(t, tl.int32), _scalar(_threads_per_program(), tl.int32)


@register("num_warps", BACKEND)
def _num_warps(ctx):
    return _scalar(_threads_per_program() // 32, tl.int32)


def _heap_ptrs(ctx, ptr):
    return _data(ptr).astype(np.uint64)


@register("ld", BACKEND)
def _ld(ctx, ptr, scope, semantic):
    from .. import sim_memory as M
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
    from .. import sim_memory as M
    _thread_copies(ctx, ptr, "dl.st")        # every thread stores the same scalar: once is the same
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    addrs = _heap_ptrs(ctx, ptr).reshape(-1)
    access().thread_write_bounds(addrs, np.dtype(npd).itemsize, "dl.st")
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


# vector accesses (ld_vec / st_vec): one access per vector ------------------------------------------------------

def _vec_where(ctx, ptr, nbytes, primitive):
    """The vectors' addresses, their lock stripes (by heap offset: the same in every rank process) and the job's
    control block; refuses a misaligned address (a GPU faults)."""
    addrs = _heap_ptrs(ctx, ptr).reshape(-1)
    bad = addrs[addrs % np.uint64(nbytes) != 0]
    if bad.size:
        raise ctx.error(f"{primitive}: a {nbytes}-byte vector access needs a {nbytes}-byte aligned address, not "
                        f"{int(bad[0]):#x}: a GPU faults (misaligned address)", arg="ptr")
    world = provided("world")
    tr = getattr(world, "transport", None) if world is not None and world.backend == "sim" else None
    control = getattr(tr, "control", None)
    base = int(getattr(tr, "base0", 0) or 0)
    stripes = ((addrs.astype(np.int64) - base) >> 4) if control is not None else (addrs.astype(np.int64) >> 4)
    abort = (lambda: control.abort != 0) if control is not None else None
    return addrs, stripes, control, abort


def _granules(addrs, nbytes):
    return (addrs[:, None] + np.arange(0, nbytes, 2, dtype=np.uint64)[None, :]).reshape(-1)


def _vec_name(words, bits, kind):
    return f"{kind}.v{words}.b{bits}"


@register("ld_vec", BACKEND)
def _ld_vec(ctx, ptr, words, scope, semantic):
    """One access per vector (ditron.sim_memory.vector_load): a concurrent write lands wholly before or wholly
    after it.  Weak (``""``): a plain read for the race finder, one access (a stale value is the whole vector's
    or none); relaxed / volatile / acquire: a read of signal words."""
    from .. import sim_memory as M
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    bits = tt.primitive_bitwidth
    nbytes = words * bits // 8
    name = _vec_name(words, bits, "ld")
    addrs, stripes, control, abort = _vec_where(ctx, ptr, nbytes, name)
    raw = M.vector_load(addrs, nbytes, stripes, control, abort)          # (n, nbytes // 8) int64
    elems = (addrs[:, None] + np.arange(0, nbytes, bits // 8, dtype=np.uint64)[None, :]).reshape(-1)
    if semantic == "":
        access().plain_vector("read", elems, bits // 8)
        u16 = np.ascontiguousarray(raw).view(np.uint16).reshape(-1)
        stale = race().plain_access("read", _granules(addrs, nbytes), None, u16, group=nbytes // 2)
        if stale is not None:
            raw = np.ascontiguousarray(stale).view(np.int64).reshape(raw.shape)
    elif semantic == "acquire":
        race().signal_acquire(elems, scope == "sys")
    else:
        race().signal_relaxed_read(elems)
    vals = np.ascontiguousarray(raw).view(npd).reshape(addrs.size, words)
    access().polled(elems, None, vals.reshape(-1), _vec_name(words, bits, "ld"))
    shape = _data(ptr).shape
    return tuple(_like(ptr, np.ascontiguousarray(vals[:, i]).reshape(shape), tt) for i in range(words))


@register("st_vec", BACKEND)
def _st_vec(ctx, ptr, values, scope, semantic):
    """One access per vector with respect to other vector accesses (ditron.sim_memory.vector_store).  Weak:
    a plain write for the race finder; relaxed / volatile / release: a write of signal words."""
    from .. import sim_memory as M
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    bits = tt.primitive_bitwidth
    words = len(values)
    nbytes = words * bits // 8
    name = _vec_name(words, bits, "st")
    _thread_copies(ctx, ptr, name)           # every thread stores the same scalar vector: once is the same
    addrs, stripes, control, abort = _vec_where(ctx, ptr, nbytes, name)
    access().thread_write_bounds(addrs, nbytes, name)
    n = addrs.size
    cols = [np.broadcast_to(_data(ctx.tensor(v)).astype(npd).reshape(-1), (n,)) if _data(ctx.tensor(v)).size in (1, n)
            else _data(ctx.tensor(v)).astype(npd).reshape(-1)[:n] for v in values]
    vals = np.ascontiguousarray(np.stack(cols, axis=1))                      # (n, words), little-endian
    elems = (addrs[:, None] + np.arange(0, nbytes, bits // 8, dtype=np.uint64)[None, :]).reshape(-1)
    access().end_poll()
    if semantic == "":
        access().plain_vector("write", elems, bits // 8)
        race().plain_access("write", _granules(addrs, nbytes), None, vals.view(np.uint16).reshape(-1))
    elif semantic == "release":
        race().signal_release(elems, scope == "sys")
    else:
        race().signal_relaxed_write(elems)
    M.vector_store(addrs, vals.view(np.int64).reshape(n, nbytes // 8) if nbytes >= 8 else None, nbytes, stripes,
                   control, abort)
    _progress()
    return None


def _progress():
    access().end_poll()
    world = provided("world")
    if world is not None and world.backend == "sim":
        world.transport.control.progress()


def _thread_copies(ctx, ptr, primitive):
    """How many threads of the program perform a per-thread primitive (inline asm on a GPU, which no
    thread predicate guards): in a thread-dependent region, the simulated thread (a tile is refused: which
    elements a thread holds depends on the layout); outside one, a scalar is performed by every thread."""
    block = ptr.type.is_block()
    if _compat.simt_thread() is not None:
        if block:
            raise ctx.error(f"{primitive} on a tile inside a branch or loop on dl.tid()/dl.laneid(): on a GPU each "
                            "thread acts on the elements its layout gives it, which the simulator cannot know; "
                            "use scalar pointers there (one per thread)", arg="ptr")
        return 1
    return 1 if block else _threads_per_program()


@register("atomic_add", BACKEND)
def _atomic_add(ctx, ptr, value, scope, semantic):
    I = _compat.interpreter_runtime()
    copies = _thread_copies(ctx, ptr, "dl.atomic_add")
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    addrs = _heap_ptrs(ctx, ptr).reshape(-1)
    access().thread_write_bounds(addrs, np.dtype(npd).itemsize, "dl.atomic_add")
    vals = np.broadcast_to(_data(ctx.tensor(value)).astype(npd), _data(ptr).shape).reshape(-1).copy()
    op = I.RMW_OP.FADD if tt.is_floating() else I.RMW_OP.ADD
    race().rmw("pre", addrs, semantic, scope == "sys")
    old = I.atomic_rmw(op, addrs, vals, np.ones(addrs.shape, dtype=bool), I.MEM_SEMANTIC.ACQUIRE_RELEASE)
    for _ in range(copies - 1):          # the other threads' additions (thread 0's old value is returned)
        I.atomic_rmw(op, addrs, vals, np.ones(addrs.shape, dtype=bool), I.MEM_SEMANTIC.ACQUIRE_RELEASE)
    race().rmw("post", addrs, semantic, scope == "sys")
    _progress()
    return _like(ptr, old.reshape(_data(ptr).shape), tt)


@register("atomic_cas", BACKEND)
def _atomic_cas(ctx, ptr, cmp, value, scope, semantic):
    from .. import sim_memory as M
    copies = _thread_copies(ctx, ptr, "dl.atomic_cas")
    tt = _elem_ty(ptr)
    npd = _compat.interpreter_np_dtype(tt)
    shape = _data(ptr).shape
    addrs = _heap_ptrs(ctx, ptr).reshape(-1)
    access().thread_write_bounds(addrs, np.dtype(npd).itemsize, "dl.atomic_cas")
    c = np.broadcast_to(_data(ctx.tensor(cmp)).astype(npd), shape).reshape(-1)
    v = np.broadcast_to(_data(ctx.tensor(value)).astype(npd), shape).reshape(-1)
    race().rmw("pre", addrs, semantic, scope == "sys")
    old = np.stack([M.atomic_cas(a, ci, vi, npd)[0] for a, ci, vi in zip(addrs, c, v)]) if addrs.size else \
        np.zeros(0, dtype=npd)
    wrote = bool(np.any(old == c)) if addrs.size else False
    for _ in range(copies - 1):          # the other threads' attempts (thread 0's result is returned)
        for a, ci, vi in zip(addrs, c, v):
            wrote |= bool(M.atomic_cas(a, ci, vi, npd)[0] == ci)
    race().rmw("post", addrs, semantic, scope == "sys")
    if wrote:
        _progress()
    else:
        # a compare-and-swap that fails writes nothing: a loop of them (`while atomic_cas(p, 0, 1, ...) != 0`,
        # a spin lock or flag barrier) is a polling loop, which lends its turn like a dl.ld poll
        access().polled(addrs, None, old, "dl.atomic_cas")
    return _like(ptr, old.reshape(shape), tt)


@register("syncthreads", BACKEND)
def _syncthreads(ctx):
    not_in_thread_region(ctx, "dl.syncthreads")
    return None


@register("fence", BACKEND)
def _fence(ctx, semantic, scope):
    race().fence(semantic, scope == "sys")
    return None


_NOT_SEEN = ("the simulator runs a branch or loop on dl.tid()/dl.laneid() in lockstep lanes when it sees a warp "
             "collective in it (called directly or through the @jit helpers it calls by name), and did not see "
             "this one (a call through an aggregate's method or a variable), so it ran the threads one after "
             "another, lower lanes first")


def _scalar_per_lane(ctx, primitive, v, arg):
    if v.type.is_block():
        raise ctx.error(f"{primitive} on a tile inside a branch or loop on dl.tid()/dl.laneid(): the simulator "
                        "models it there per thread, on one scalar per lane", arg=arg)


@register("ballot_sync", BACKEND)
def _ballot_sync(ctx, mask, pred):
    t = _compat.simt_thread()
    if t is not None:
        lanes = _compat.simt_lanes()
        if lanes is None:
            raise ctx.error(f"dl.ballot_sync inside a branch or loop on dl.tid()/dl.laneid(): a warp vote needs "
                            f"every lane's value at once; {_NOT_SEEN}; call the helper by name, or vote on a tile "
                            "outside the branch (the elements of a 1-D tile are the lanes of a warp)")
        p = ctx.tensor(pred)
        _scalar_per_lane(ctx, "dl.ballot_sync", p, "pred")
        m = _int(mask) & 0xFFFFFFFF
        from .sim_base import where
        _in_mask(ctx, "dl.ballot_sync", t, m)

        def resolve(parts, me):
            bits = sum(1 << i for i, b in parts.items() if b) & m
            word = np.array([bits], dtype=np.uint32).view(np.int32)[0]
            return {i: word for i in parts}
        word = lanes.meet(t, where(), "dl.ballot_sync", m, bool(_data(p).reshape(())), resolve)
        return _scalar(word, tl.int32)
    _, data = _lanes(ctx, pred)
    bits = 0
    for i, p in enumerate(data.reshape(-1)[:32]):
        if p:
            bits |= 1 << i
    m = _int(mask) & 0xFFFFFFFF
    return _scalar(np.array([bits & m], dtype=np.uint32).view(np.int32)[0], tl.int32)


def _in_mask(ctx, primitive, t, m):
    if not m >> (t % 32) & 1:
        raise ctx.error(f"{primitive}: lane {t % 32} of warp {t // 32} makes the call, but its mask {m:#010x} does "
                        "not name it (undefined on a GPU)", arg="mask")


def _lanes(ctx, value):
    v = ctx.tensor(value)
    data = _data(v)
    if data.ndim > 1:
        raise ctx.error("the simulator treats the elements of a 1-D tile as lanes; got a "
                        f"{data.ndim}-D tile", arg="value")
    return v, data




def _shfl_source(kind, idx, k, n):
    """The lane each lane reads (NVIDIA's shfl.sync with the segment the whole warp: a source outside it reads
    the lane's own value)."""
    if kind == "idx":
        return k % n
    if kind == "up":
        return np.where(idx - k >= 0, idx - k, idx)
    if kind == "down":
        return np.where(idx + k < n, idx + k, idx)
    x = idx ^ k
    return np.where(x < n, x, idx)


def _shfl_in_thread(ctx, t, kind, primitive, mask, v, lane):
    """A shuffle in a thread-dependent region, performed by simulated thread ``t``.  In a region the simulator
    runs as lockstep lanes (ditron.sim.simt.Lanes: it saw the shuffle), every lane of the warp named in the mask
    makes its n-th call of the shuffle before any lane reads: each reads its source lane's value, as on a GPU; a
    source lane outside the mask is the GPU's undefined value (refused).  Otherwise (a shuffle the simulator did
    not see in the region) the threads run one after another, lower lanes first: a lane reads a lower lane's
    value, recorded when that lane reached the call, and a higher lane's is refused."""
    _scalar_per_lane(ctx, primitive, v, "value")
    m = _int(mask) & 0xFFFFFFFF
    from .sim_base import where
    site, warp, me = where(), t // 32, t % 32
    val = _data(v).reshape(())
    k = _int(lane)
    lanes = _compat.simt_lanes()
    if lanes is not None:
        _in_mask(ctx, primitive, t, m)

        def resolve(parts, last):
            out = {}
            for i, (x, ki) in parts.items():
                src = int(_shfl_source(kind, np.int64(i), np.int64(ki), 32))
                if src not in parts:
                    raise ctx.error(f"{primitive}: lane {i} of warp {warp} reads lane {src}, which its mask "
                                    f"{m:#010x} does not name (on a GPU the value is undefined): name every source "
                                    "lane in the mask", arg="mask")
                out[i] = parts[src][0]
            return out
        got = lanes.meet(t, site, primitive, m, (val, k), resolve)
        return _like(v, np.asarray(got, dtype=val.dtype).reshape(_data(v).shape))
    calls = _compat.simt_warp_calls()
    if calls is None:
        raise ctx.error(f"{primitive} in a thread-dependent region the simulator did not set up")
    counter = ("n", site, t)                       # the how-manieth time this lane makes this call
    nth = calls.get(counter, 0)
    calls[counter] = nth + 1
    need = [i for i in range(32) if m >> i & 1]
    entry = calls.setdefault((site, warp, nth), {"primitive": primitive, "lanes": [], "values": {}, "need": need})
    _in_mask(ctx, primitive, t, m)
    entry["lanes"].append(t)
    entry["values"][me] = val
    src = int(_shfl_source(kind, np.int64(me), np.int64(k), 32))
    if src == me:
        return v
    if src > me:
        raise ctx.error(f"{primitive} inside a branch or loop on dl.tid()/dl.laneid(): lane {me} of warp {warp} "
                        f"reads lane {src}'s value, which the simulator has not computed yet: {_NOT_SEEN}; call "
                        "the helper by name, or shuffle a tile outside the branch (the elements of a 1-D tile are "
                        "the lanes of a warp)")
    if src not in entry["values"]:
        raise ctx.error(f"{primitive}: lane {me} of warp {warp} reads lane {src}, which did not reach this call"
                        f"{' (call ' + str(nth + 1) + ')' if nth else ''} (on a GPU the result is undefined): "
                        "every lane of the mask must make the call", arg="mask")
    return _like(v, np.asarray(entry["values"][src], dtype=val.dtype).reshape(_data(v).shape))


def _shfl(kind):
    name = "dl.shfl_" + ("" if kind == "idx" else kind + "_") + "sync"

    def rule(ctx, mask, value, lane):
        v, data = _lanes(ctx, value)
        t = _compat.simt_thread()
        if t is not None:
            return _shfl_in_thread(ctx, t, kind, name, mask, v, lane)
        n = data.size
        if not v.type.is_block():
            return v
        idx = np.arange(n)
        k = _data(ctx.tensor(lane)).astype(np.int64)
        k = np.broadcast_to(k, (n,)) if k.size in (1, n) else k[:n]
        return _like(v, data[_shfl_source(kind, idx, k, n)])
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


