"""``shmem.*`` lowering shared by the GPU backends: each backend supplies its
device library, its prototype table (NVSHMEM or rocSHMEM) and its constants;
the rules call exact-prototype wrappers in the device library."""
from __future__ import annotations

import triton.language as tl

from . import common, devlib, register, shmem_table

_TRITON_ARG = {"ptr": tl.int64, "size_t": tl.int64, "int": tl.int32, "team": tl.int32, "uint64": tl.int64}
_TRITON_RET = {"void": tl.int32, "int": tl.int32, "ptr": tl.int64, "uint64": tl.int64}
_PURE = ("shmem.my_pe", "shmem.n_pes")


def wrapper_name(entry):
    return f"ditron_{entry[0]}"


def define_wrappers(lib, table):
    """Define every wrapper up front: the library's content (and so its path
    and Triton's cache key) must not change while kernels are traced."""
    for entry in table.values():
        name = wrapper_name(entry)
        if not lib.has(name):
            devlib.add_c_wrapper(lib, name, *entry)


def define_signal_once(lib, table, tid_intrinsic, entries=None):
    """``ditron_<signal_op>_once``: the signal operation performed by thread 0
    only (``dl.notify(comm_scope="inter_node")`` signals once per program).
    ``entries``: the device functions to wrap (default: the table's signal_op)."""
    lib.declare(tid_intrinsic, f"declare i32 @{tid_intrinsic}()")
    guard = f"  %tid = call i32 @{tid_intrinsic}()\n  %guard = icmp eq i32 %tid, 0"
    for symbol, ret, params in entries or [table[("shmem.signal_op", None, None)]]:
        devlib.add_c_wrapper(lib, f"ditron_{symbol}_once", symbol, ret, params, guard=guard)


def define_wait_then_fetch(lib, name, wait, fetch):
    """``i64 name(i64 sig, i32 cmp, i64 value)``: calls ``wait`` (``void (uint64_t *, int, uint64_t)``),
    then returns ``fetch(sig)`` (``uint64_t (const uint64_t *)``): a signal wait that returns the word,
    for a library whose wait returns nothing.  The word is read after the wait returns, so a peer that
    changes it again in between is seen with its newer value (as a second wait would)."""
    (wsym, wret, wparams), (fsym, fret, fparams) = wait, fetch
    assert (wret, wparams, fret, fparams) == ("void", ["ptr", "int", "uint64"], "uint64", ["ptr"]), (wait, fetch)
    lib.declare(wsym, f"declare void @{wsym}(ptr, i32, i64)")
    lib.declare(fsym, f"declare i64 @{fsym}(ptr)")
    lib.define(name, f"""
define i64 @{name}(i64 %a0, i32 %a1, i64 %a2) #0 {{
  %p = inttoptr i64 %a0 to ptr
  call void @{wsym}(ptr %p, i32 %a1, i64 %a2)
  %r = call i64 @{fsym}(ptr %p)
  ret i64 %r
}}""")
    return name


def make_shmem_call(lib, table, consts, composed=None, refused=None):
    """``composed``: kind -> ``fn(ctx, call_entry, args, extra, suffix)`` for operations the library
    lacks but that are built from what it exports; ``refused``: kind -> what to use instead, for
    operations that cannot be built (a compile-time error naming the op and the target)."""
    composed, refused = composed or {}, refused or {}

    def shmem_call(ctx, kind, args, extra=None, suffix=""):
        """Call the device function for ``kind`` (variant from the op's
        ``nbi``/``coop`` attributes) with ``args`` in prototype order; ``extra``
        supplies the constants (sig_op, cmp)."""
        if kind in refused:
            raise ctx.error(f"not available: {refused[kind]}")
        extra = extra or {}
        if kind in composed:
            common.require_shmem(ctx)
            return composed[kind](ctx, call_entry, args, extra, suffix)
        entry = shmem_table.lookup(table, kind, ctx.op.attrs.get("nbi"), ctx.op.attrs.get("coop"))
        if entry is None:
            raise ctx.error("no device function for this variant")
        common.require_shmem(ctx)
        return call_entry(ctx, kind, entry, args, extra, suffix)

    def call_entry(ctx, kind, entry, args, extra, suffix=""):
        """Call ``entry`` = (symbol, return kind, parameter kinds) through its wrapper."""
        symbol, ret, params = entry
        args = list(args)
        # prototype order: putmem_signal (.., signal, sig_op, pe), signal_op (sig, signal, sig_op, pe),
        # signal_wait_until (sig, cmp, value)
        if "sig_op" in extra:
            args.insert(len(args) - 1, consts["sig_op"][extra["sig_op"]])
        if "cmp" in extra:
            args.insert(1, consts["cmp"][extra["cmp"]])
        assert len(args) == len(params), (symbol, len(args), params)
        conv = []
        for a, kind_ in zip(args, params):
            v = ctx.tensor(a)
            if kind_ == "ptr":
                v = common.ptr_to_int(ctx, v)
            conv.append(v)
        return ctx.call(lib, wrapper_name(entry) + suffix, conv, [_TRITON_ARG[k] for k in params], _TRITON_RET[ret],
                        is_pure=kind in _PURE)
    return shmem_call


def register_shmem(backend, shmem_call):
    """Register the shmem.* rules of ``backend`` in terms of its ``shmem_call``."""

    @register("shmem.my_pe", backend)
    def _my_pe(ctx):
        return shmem_call(ctx, "shmem.my_pe", [])

    @register("shmem.n_pes", backend)
    def _n_pes(ctx):
        return shmem_call(ctx, "shmem.n_pes", [])

    def _one_pointer(ctx, ptr):
        ptr = ctx.tensor(ptr)
        if ptr.type.is_block():
            raise ctx.error("takes one pointer; use dl.symm_at for tensors of pointers", arg="ptr")
        return ptr

    @register("shmem.remote_ptr", backend)
    def _remote_ptr(ctx, ptr, pe):
        ptr = _one_pointer(ctx, ptr)
        return common.int_to_ptr_like(ctx, shmem_call(ctx, "shmem.remote_ptr", [ptr, pe]), ptr)

    @register("shmem.remote_mc_ptr", backend)
    def _remote_mc_ptr(ctx, team, ptr):
        ptr = _one_pointer(ctx, ptr)
        return common.int_to_ptr_like(ctx, shmem_call(ctx, "shmem.remote_mc_ptr", [team, ptr]), ptr)

    def _mem(kind):
        def rule(ctx, dst, src, nbytes, pe, nbi, coop):
            for name, p in (("dst", dst), ("src", src)):
                if ctx.tensor(p).type.is_block():
                    raise ctx.error("takes one pointer (the start of the chunk), not a tensor", arg=name)
            shmem_call(ctx, kind, [dst, src, nbytes, pe])
            return None
        return rule

    register("shmem.putmem", backend)(_mem("shmem.putmem"))
    register("shmem.getmem", backend)(_mem("shmem.getmem"))

    def _sig64(ctx, sig_addr):
        if common.signal_width(ctx, ctx.tensor(sig_addr), "sig_addr") != 64:
            raise ctx.error("OpenSHMEM signal words are 64-bit (uint64)", arg="sig_addr")

    @register("shmem.putmem_signal", backend)
    def _putmem_signal(ctx, dst, src, nbytes, sig_addr, signal, pe, nbi, coop, sig_op):
        _sig64(ctx, sig_addr)
        shmem_call(ctx, "shmem.putmem_signal", [dst, src, nbytes, sig_addr, signal, pe], extra={"sig_op": sig_op})
        return None

    @register("shmem.signal_op", backend)
    def _signal_op(ctx, sig_addr, signal, pe, sig_op):
        _sig64(ctx, sig_addr)
        shmem_call(ctx, "shmem.signal_op", [sig_addr, signal, pe], extra={"sig_op": sig_op})
        return None

    @register("shmem.signal_wait_until", backend)
    def _signal_wait_until(ctx, sig_addr, cmp_value, cmp):
        _sig64(ctx, sig_addr)
        return shmem_call(ctx, "shmem.signal_wait_until", [sig_addr, cmp_value], extra={"cmp": cmp})

    def _plain(kind):
        def rule(ctx, **attrs):
            shmem_call(ctx, kind, [])
            return None
        return rule

    for k in ("shmem.quiet", "shmem.fence", "shmem.barrier_all", "shmem.sync_all"):
        register(k, backend)(_plain(k))


#: coop of the ops without a cooperation attribute (quiet, fence, ...) is "thread"
_P2P_MEM = {"shmem.putmem": "putmem", "shmem.getmem": "getmem", "shmem.putmem_signal": "putmem_signal"}


def make_p2p_call(lib, sig_consts, cmp_consts):
    """``shmem_call`` for the P2P transport (NVIDIA, one node): the same
    operations as NVSHMEM's, done with loads, stores and atomics through the
    symmetric-heap deltas of the world descriptor (``ditron_p2p_*`` in the
    device library, see :mod:`ditron.lowering.cuda_p2p`).  No SHMEM library is
    linked."""

    def p2p_call(ctx, kind, args, extra=None, suffix="", bounded=False):
        extra = extra or {}
        coop = ctx.op.attrs.get("coop") or "thread"
        i64, i32 = tl.int64, tl.int32

        def ptr(a):
            return common.ptr_to_int(ctx, ctx.tensor(a))

        def call(symbol, values, types, ret=tl.int32, pure=False):
            return ctx.call(lib, symbol, values, types, ret, is_pure=pure)

        if kind == "shmem.my_pe":
            return common.world_field(ctx, lib, "rank")
        if kind == "shmem.n_pes":
            return common.world_field(ctx, lib, "world_size")
        if kind == "shmem.remote_ptr":
            p, pe = args
            return call("ditron_p2p_ptr", [ptr(p), pe], [i64, i32], i64, pure=True)
        if kind == "shmem.remote_mc_ptr":
            raise ctx.error("multicast addresses need NVSHMEM with NVLink SHARP; the P2P transport has none "
                            "(initialise ditron with backend='nvshmem', or use dl.symm_at loads/stores)")
        if kind in ("shmem.putmem", "shmem.getmem"):
            dst, src, nbytes, pe = args
            return call(f"ditron_p2p_{_P2P_MEM[kind]}_{coop}", [ptr(dst), ptr(src), nbytes, pe], [i64, i64, i64, i32])
        if kind == "shmem.putmem_signal":
            dst, src, nbytes, sig, signal, pe = args
            return call(f"ditron_p2p_putmem_signal_{coop}",
                        [ptr(dst), ptr(src), nbytes, ptr(sig), signal, sig_consts[extra["sig_op"]], pe],
                        [i64, i64, i64, i64, i64, i32, i32])
        if kind == "shmem.signal_op":
            sig, signal, pe = args
            symbol = "ditron_p2p_signal_op_once" if suffix == "_once" else "ditron_p2p_signal_op"
            return call(symbol, [ptr(sig), signal, sig_consts[extra["sig_op"]], pe], [i64, i64, i32, i32])
        if kind == "shmem.signal_wait_until":
            sig, value = args
            symbol = "ditron_signal_wait_until" + ("_bounded" if bounded else "")
            return call(symbol, [ptr(sig), cmp_consts[extra["cmp"]], value], [i64, i32, i64], i64)
        if kind == "shmem.quiet":
            return call("ditron_p2p_quiet", [], [])
        if kind == "shmem.fence":
            return call("ditron_p2p_fence", [], [])
        if kind in ("shmem.barrier_all", "shmem.sync_all"):
            return call(f"ditron_p2p_barrier_{coop}" + ("_bounded" if bounded else ""), [], [])
        raise ctx.error("no P2P lowering for this op")

    return p2p_call
