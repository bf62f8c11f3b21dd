"""Helpers of the simulator lowering (:mod:`ditron.lowering.sim`): values of the interpreter, the
simulated world, address translation between the ranks' heaps, spinning on signal words, the
simulator modules' hooks."""
from __future__ import annotations

import os
import sys

import numpy as np
import triton.language as tl

from .. import _compat
from . import provided

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
    if _launch() is None:
        # a plain @triton.jit kernel launched directly: on GPUs it has no device library attached and fails to
        # link (ptxas: Unresolved extern function 'ditron_world_get'); the simulator refuses it as well
        raise ctx.error("distributed primitives need a @ditron.jit kernel: this one was launched as a plain "
                        "@triton.jit kernel, which on GPUs fails to link (no ditron device library: 'Unresolved "
                        "extern function ditron_world_get'). Decorate the launched kernel with @ditron.jit "
                        "(helpers it calls may stay @triton.jit); see docs/language.md")
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


_FILES: dict = {}     # absolute co_filename -> its base name if outside ditron and Triton, else None


def _kernel_file(co_filename):
    """The base name of a frame's file when it is outside ditron and Triton, else None (cached per absolute
    file name: ``where`` runs at every checked access)."""
    hit = _FILES.get(co_filename, False)
    if hit is not False:
        return hit
    fn = os.path.abspath(co_filename)
    out = None if fn.startswith(_HERE) or fn.startswith(_TRITON) else os.path.basename(fn)
    if os.path.isabs(co_filename):      # a relative name depends on the working directory: not cached
        _FILES[co_filename] = out
    return out


def where() -> str:
    """file:line in the kernel (the first frame outside ditron and Triton)."""
    f = sys._getframe(1)
    while f is not None:
        base = _kernel_file(f.f_code.co_filename)
        if base is not None:
            return f"{base}:{f.f_lineno}"
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


def _skew(event):
    """The skew-injection hook (:mod:`ditron.sim.skew`): nothing unless a plan delays this rank."""
    point = provided("skew")
    if point is not None:
        point(event)


def _launch():
    return provided("launch")


def _check_rank(ctx, world, rank, arg, local):
    if not 0 <= rank < world.world_size:
        raise ctx.error(f"rank {rank} is not in [0, {world.world_size})", arg=arg)
    if local and rank // world.local_world_size != world.node:
        raise ctx.error(f"rank {rank} is on node {rank // world.local_world_size}, not on this node "
                        f"({world.node}): peer memory is reachable by load/store only inside a node (use "
                        "shmem.putmem*/getmem* or comm_scope='inter_node' across nodes)", arg=arg)


def _tensor_bounds(ctx, tr, first, nbytes, arg, rank, fix="the size is too large for the tensor"):
    """``nbytes`` bytes from heap offset ``first`` must lie in one live symmetric tensor (not merely in the heap:
    a put past a tensor's end overwrites the peer's next tensor)."""
    heap = tr.heap
    alloc = heap.allocation_at(first)
    on = f" of rank {rank}" if rank is not None else ""
    if alloc is None:
        raise ctx.error(f"the pointer{on} is in no live symmetric tensor: {heap.describe_gap(first)}", arg=arg)
    end = alloc.offset + alloc.nbytes
    if first + nbytes > end:
        import torch
        elem = torch.empty((), dtype=alloc.dtype).element_size()
        raise ctx.error(f"{nbytes} bytes from element {(first - alloc.offset) // elem} of {alloc.label()}{on} run "
                        f"{first + nbytes - end} bytes past its end ({alloc.nbytes // elem} elements, "
                        f"{alloc.nbytes} bytes): {fix}", arg=arg)


def _own_offsets(ctx, tr, addrs, arg, nbytes=1, rank=None):
    """Heap offsets of ``addrs`` in this rank's heap; raises when the pointer
    is not in the symmetric heap, and (``nbytes`` > 1: the exact extent of a
    put, get or signal) when the extent leaves the symmetric tensor."""
    base = tr.heap_base(tr.rank)
    off = addrs.astype(np.int64) - np.int64(base)
    first = int(off.reshape(-1)[0]) if off.size else 0
    lo = int(off.min()) if off.size else 0
    if off.size and 0 <= lo and first < tr.heap_size and nbytes > 1:
        _tensor_bounds(ctx, tr, first, nbytes, arg, rank)
    if off.size and (lo < 0 or first + nbytes > tr.heap_size or first >= tr.heap_size):
        launch = _launch()
        hint = launch.describe_arg(int(addrs.reshape(-1)[0])) if launch is not None else None
        what = f"{hint}, which is not symmetric" if hint else tr.describe_addr(int(addrs.reshape(-1)[0]))
        raise ctx.error(f"the pointer is not in this rank's symmetric heap ({what}); allocate the tensor with "
                        "ditron.symm_empty / ditron.symm_zeros", arg=arg)
    return off


def _wait_bounds(ctx, tr, addr, nbytes, arg, fix):
    """The ``nbytes`` signal bytes a wait reads from ``addr`` must lie in one live symmetric tensor when ``addr``
    is in some rank's symmetric heap (a stray word past a tensor's end is another tensor's data or unused heap:
    the wait would hang, or pass on whatever is there).  An address outside every heap is ordinary memory (a
    wait between the programs of one rank on a tensor argument) and is not checked here."""
    where = tr.owner_of(addr)
    if where is None:
        return
    rank, off = where
    import bisect
    starts, ends = tr.heap.bounds_lists()
    i = bisect.bisect_right(starts, off) - 1
    if i >= 0 and off + nbytes <= ends[i]:
        return
    _tensor_bounds(ctx, tr, off, nbytes, arg, rank, fix)


def _translate(ctx, tr, world, ptr_data, rank, arg, *, local=True, nbytes=1):
    _check_rank(ctx, world, rank, "rank" if arg != "pe" else "pe", local)
    off = _own_offsets(ctx, tr, ptr_data, arg, nbytes, rank)
    return (np.int64(tr.heap_base(rank)) + off).astype(np.uint64)


def _spin_values(ctx, tr, addrs, dtype, ok, expected_text, primitive):
    from .. import sim_memory as M
    _skew("wait")
    launch = _launch()
    prog = _program()
    loc = where()
    world_rank = tr.rank

    lanes = _compat.simt_lanes()

    def check():
        vals = M.atomic_load(addrs, dtype)
        done = bool(ok(vals))
        if not done and lanes is not None:
            # a lane of a region run as lockstep lanes (ditron.sim.simt.Lanes): the program's other lanes run
            # first (one of them may write the word)
            lanes.spin(_compat.simt_thread())
            vals = M.atomic_load(addrs, dtype)
            done = bool(ok(vals))
        return done, vals

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
    from .. import sim_memory as M
    access().end_poll()
    if sig_op == "set":
        M.atomic_xchg(addr, value, dtype)
    else:
        M.atomic_add(addr, value, dtype)
    tr.control.progress()
    _skew("signal")



def _threads_per_program():
    launch = _launch()
    return int(getattr(launch, "num_warps", 4) or 4) * 32


def not_in_thread_region(ctx, primitive):
    """Primitives with a CTA barrier (bar.sync) cannot run in a thread-dependent branch: refuse."""
    if _compat.simt_thread() is not None:
        raise ctx.error(f"{primitive} inside a branch or loop on dl.tid()/dl.laneid(): on a GPU it synchronises "
                        "all threads of the program (bar.sync), which threads that skip the branch never reach "
                        "(the GPU hangs); call it outside the thread-dependent branch, or use dl.ld / dl.st / "
                        "dl.atomic_* per thread")


