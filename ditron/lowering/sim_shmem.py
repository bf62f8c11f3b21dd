"""Simulator rules of the OpenSHMEM-style primitives (``shmem.*``): synchronous copies between the
simulated ranks' heaps, signals, barriers."""
from __future__ import annotations

import ctypes

import numpy as np
import triton.language as tl

from .. import _compat
from . import register
from .sim_base import (_threads_per_program, BACKEND, _MC_TAG, _check_rank, _data, _elem_ty, _int, _launch, _like, _own_offsets, _program,
                       _scalar, _signal_dtype, _tensor_bounds, _signal_update, _spin_values, _translate, _world, access,
                       not_in_thread_region, race, where)


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
    team = _int(team)
    if team not in (0, 2):
        raise ctx.error(f"the simulator knows NVSHMEM_TEAM_WORLD (0) and NVSHMEMX_TEAM_NODE (2) only, not team "
                        f"{team}", arg="team")
    if world.nnodes > 1 and team == 0:             # NODE: this node's ranks (_mc_node_ranks)
        raise ctx.error("multicast memory spans one NVLink domain; TEAM_WORLD has ranks on several nodes "
                        "(use NVSHMEMX_TEAM_NODE)", arg="team")
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
        from .. import sim_memory as M
        unit = np.uint16 if nbytes % 2 == 0 and int(src_addr) % 2 == 0 and int(dst_addr) % 2 == 0 else np.uint8
        step = np.dtype(unit).itemsize
        rel = np.arange(0, nbytes, step, dtype=np.uint64)
        src_addrs = np.uint64(int(src_addr)) + rel
        race().plain_access("read", src_addrs, None, None, itemsize=step)
        race().plain_access("write", np.uint64(int(dst_addr)) + rel, None, M.load(src_addrs, unit))
    if nbytes:
        ctypes.memmove(int(dst_addr), int(src_addr), nbytes)
    tr.control.progress()


def _callers(ctx, coop, primitive, args=()):
    """How many times a GPU performs a ``shmem.*`` call of cooperation level ``coop``: a thread-level call
    runs in every thread that reaches it (all threads of the program outside a thread-dependent region;
    the simulated thread inside one), a warp-level call once per warp, a block-level call once.

    Inside a thread-dependent region a warp-level call is legal when every lane of the warp reaches it with the
    same ``args``.  The region makes a warp-collective call, so the simulator runs its threads as lockstep lanes
    (ditron.sim.simt.Lanes): the lanes meet at the call, the last one to arrive performs it once (1; 0 for the
    others) before any lane goes on; lanes with other arguments, or lanes that never arrive, are reported.  (A
    call the rewrite did not see runs in the region's one-after-another order: performed when the warp's last
    lane arrives, a divergent warp refused at the end of the region.)  A block-level call is refused: it
    needs every thread of the program, which threads that skip the branch never provide."""
    t = _compat.simt_thread()
    if t is not None:
        if coop == "block":
            raise ctx.error(f"{primitive}_{coop} inside a branch or loop on dl.tid()/dl.laneid(): a {coop}-"
                            f"cooperative call needs every thread of the {coop}, which threads that skip the branch "
                            "never provide (the GPU hangs); call it outside the branch, or the thread variant inside")
        if coop == "warp":
            return _warp_arrival(ctx, t, primitive, args)
        return 1
    return {"thread": _threads_per_program(), "warp": max(1, _threads_per_program() // 32)}.get(coop, 1)


def _warp_arrival(ctx, t, primitive, args):
    sig = tuple(int(a) for a in args)
    lanes = _compat.simt_lanes()
    if lanes is not None:
        # lockstep lanes (ditron.sim.simt.Lanes): the warp's lanes meet at the call; the last one to arrive
        # performs it before any lane goes on
        warp = t // 32

        def resolve(parts, last):
            first = min(parts)
            for i in sorted(parts):
                if parts[i] != parts[first]:
                    raise ctx.error(f"{primitive}_warp is warp-collective, but lane {i} of warp {warp} calls it with "
                                    f"other arguments than lane {first} ({_show(parts[i])} vs "
                                    f"{_show(parts[first])}): every lane of the warp must pass the same values (on "
                                    "a GPU the result is undefined)")
            return {i: int(i == last) for i in parts}
        return lanes.meet(t, where(), f"{primitive}_warp", 0xFFFFFFFF, sig, resolve)
    calls = _compat.simt_warp_calls()
    if calls is None:
        raise ctx.error(f"{primitive}_warp in a thread-dependent region the simulator did not set up")
    site, warp = where(), t // 32
    counter = ("n", site, t)                       # the how-manieth time this lane makes this call
    nth = calls.get(counter, 0)
    calls[counter] = nth + 1
    entry = calls.setdefault((site, warp, nth), {"primitive": f"{primitive}_warp", "args": sig, "lanes": []})
    if entry["args"] != sig:
        first = entry["lanes"][0] - warp * 32
        raise ctx.error(f"{primitive}_warp is warp-collective, but lane {t - warp * 32} of warp {warp} calls it "
                        f"with other arguments than lane {first} ({_show(sig)} vs {_show(entry['args'])}): every "
                        "lane of the warp must pass the same values (on a GPU the result is undefined)")
    entry["lanes"].append(t)
    return 1 if len(entry["lanes"]) == 32 else 0


def _named(primitive, nbi):
    return primitive + ("_nbi" if _int(nbi) else "")


def _show(sig):
    return "(" + ", ".join(hex(v) if abs(v) > 1 << 20 else str(v) for v in sig) + ")"


def _local_side(ctx, tr, addr, nbytes, arg):
    """The local buffer of a put / get: when it is in this rank's symmetric heap, its extent must stay in
    its tensor (an ordinary tensor's extent is not known here)."""
    off = int(addr[0]) - tr.heap_base(tr.rank)
    if nbytes > 0 and 0 <= off < tr.heap_size:
        _tensor_bounds(ctx, tr, off, nbytes, arg, tr.rank)


@register("shmem.putmem", BACKEND)
def _putmem(ctx, dst, src, nbytes, pe, nbi, coop):
    world, tr = _world(ctx)
    n = _int(nbytes)
    remote = _translate(ctx, tr, world, _ptr0(ctx, dst, "dst"), _int(pe), "dst", local=False, nbytes=n)
    _local_side(ctx, tr, _ptr0(ctx, src, "src"), n, "src")
    src0 = _ptr0(ctx, src, "src")[0]
    # every caller copies the same bytes: once is the same
    if _callers(ctx, coop, _named("shmem.putmem", nbi), (remote[0], src0, n, _int(pe))):
        _copy(ctx, tr, remote[0], src0, n)
    return None


@register("shmem.getmem", BACKEND)
def _getmem(ctx, dst, src, nbytes, pe, nbi, coop):
    world, tr = _world(ctx)
    n = _int(nbytes)
    remote = _translate(ctx, tr, world, _ptr0(ctx, src, "src"), _int(pe), "src", local=False, nbytes=n)
    _local_side(ctx, tr, _ptr0(ctx, dst, "dst"), n, "dst")
    dst0 = _ptr0(ctx, dst, "dst")[0]
    if _callers(ctx, coop, _named("shmem.getmem", nbi), (dst0, remote[0], n, _int(pe))):
        _copy(ctx, tr, dst0, remote[0], n)
    return None


@register("shmem.putmem_signal", BACKEND)
def _putmem_signal(ctx, dst, src, nbytes, sig_addr, signal, pe, nbi, coop, sig_op):
    world, tr = _world(ctx)
    n, r = _int(nbytes), _int(pe)
    dtype = _signal_dtype(ctx, _elem_ty(sig_addr), "sig_addr", need64=True)
    remote = _translate(ctx, tr, world, _ptr0(ctx, dst, "dst"), r, "dst", local=False, nbytes=n)
    sig = _translate(ctx, tr, world, _ptr0(ctx, sig_addr, "sig_addr"), r, "sig_addr", local=False, nbytes=8)
    _local_side(ctx, tr, _ptr0(ctx, src, "src"), n, "src")
    src0 = _ptr0(ctx, src, "src")[0]
    callers = _callers(ctx, coop, _named("shmem.putmem_signal", nbi), (remote[0], src0, n, sig[0], _int(signal), r))
    if not callers:
        return None
    _copy(ctx, tr, remote[0], src0, n)
    race().signal_release(sig, True)        # the signal is delivered after the data
    for _ in range(callers if sig_op == "add" else 1):    # every caller adds; a set is the same once
        _signal_update(tr, sig, _int(signal), sig_op, dtype)
    return None


@register("shmem.signal_op", BACKEND)
def _signal_op(ctx, sig_addr, signal, pe, sig_op):
    callers = _callers(ctx, "thread", "shmem.signal_op")
    world, tr = _world(ctx)
    dtype = _signal_dtype(ctx, _elem_ty(sig_addr), "sig_addr", need64=True)
    sig = _translate(ctx, tr, world, _ptr0(ctx, sig_addr, "sig_addr"), _int(pe), "sig_addr", local=False,
                     nbytes=8)
    race().signal_release(sig, True)
    for _ in range(callers if sig_op == "add" else 1):        # thread-level: every calling thread adds
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
    not_in_thread_region(ctx, primitive)
    from .. import sim_memory as M
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
