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


def define_signal_once(lib, table, tid_intrinsic):
    """``ditron_<signal_op>_once``: the signal operation performed by thread 0
    only (``dl.notify(comm_scope="inter_node")`` signals once per program)."""
    symbol, ret, params = table[("shmem.signal_op", None, None)]
    lib.declare(tid_intrinsic, f"declare i32 @{tid_intrinsic}()")
    guard = f"  %tid = call i32 @{tid_intrinsic}()\n  %guard = icmp eq i32 %tid, 0"
    devlib.add_c_wrapper(lib, f"ditron_{symbol}_once", symbol, ret, params, guard=guard)


def make_shmem_call(lib, table, consts):
    def shmem_call(ctx, kind, args, extra=None, suffix=""):
        """Call the device function for ``kind`` (variant from the op's
        ``nbi``/``coop`` attributes) with ``args`` in prototype order; ``extra``
        supplies the constants (sig_op, cmp)."""
        entry = shmem_table.lookup(table, kind, ctx.op.attrs.get("nbi"), ctx.op.attrs.get("coop"))
        if entry is None:
            raise ctx.error("no device function for this variant")
        common.require_shmem(ctx)
        symbol, ret, params = entry
        args = list(args)
        extra = extra or {}
        # prototype order: putmem_signal (.., signal, sig_op, pe), signal_op (sig, signal, sig_op, pe),
        # signal_wait_until (sig, cmp, value)
        if "sig_op" in extra:
            args.insert(len(args) - 1, consts["sig_op"][extra["sig_op"]])
        if "cmp" in extra:
            args.insert(1, consts["cmp"][extra["cmp"]])
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
