"""NVIDIA lowering (sm_70+, multimem on sm_90+): inline PTX for memory-model
operations, the ditron device library for the world descriptor, NVSHMEM
device functions (through exact-prototype wrappers) for ``shmem.*``.

PTX is written explicitly (``ld.acquire.gpu``, ``red.release.sys``, ...)
rather than through LLVM atomics because the NVPTX backend shipped with
Triton drops the ordering of ``atomicrmw`` (seen: ``acq_rel`` became a plain
``atom``), while inline PTX says exactly what runs.
"""
from __future__ import annotations

import triton.language as tl

import contextlib
import contextvars

from .. import _compat
from . import common, cuda_bounded, cuda_p2p, devlib, provided, register, shmem_rules, shmem_table

BACKEND = "cuda"
LIB = devlib.DeviceLibrary("ditron", BACKEND, const_addrspace=4)
devlib.add_world(LIB)

# ---------------------------------------------------------------------------
# Library variants: how shmem.* and waits are lowered depends on the world's
# transport and on DITRON_WAIT_TIMEOUT_S, both known when a kernel is compiled.
# Each variant is the same library text under a different header line, so its
# path -- and with it Triton's in-memory and on-disk cache keys -- differs per
# variant, and rules read the variant back from the compilation's extern_libs.
# ---------------------------------------------------------------------------
TRANSPORTS = ("nvshmem", "p2p")
_VARIANT_HEADER = "; ditron variant: transport={transport} waits={waits}"
_VARIANT_LIBS: dict = {}
_VARIANT_OF_PATH: dict = {}
_OVERRIDE = contextvars.ContextVar("ditron_cuda_variant", default=None)


def _variant_key(transport, bounded):
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; use one of {TRANSPORTS}")
    return (transport, bool(bounded))


def _make_library(header=""):
    lib = devlib.DeviceLibrary("ditron", BACKEND, const_addrspace=4, header=header)
    devlib.add_world(lib)
    return lib


def variant_library(transport="nvshmem", bounded=False):
    """The ditron device library compiled into kernels for ``transport``
    (``"nvshmem"`` or ``"p2p"``) with bounded (``DITRON_WAIT_TIMEOUT_S``) or
    plain waits.  ``variant_library()`` is :data:`LIB`."""
    key = _variant_key(transport, bounded)
    lib = _VARIANT_LIBS.get(key)
    if lib is None:
        lib = _make_library(_VARIANT_HEADER.format(transport=key[0], waits="bounded" if key[1] else "plain"))
        _populate(lib)
        _VARIANT_LIBS[key] = lib
    path = lib.path()
    _VARIANT_OF_PATH[path] = key
    return lib


@contextlib.contextmanager
def compile_variant(transport="nvshmem", bounded=False):
    """Compile kernels for ``transport`` / bounded waits regardless of the
    current world (ahead-of-time compilation and tests)::

        with cuda.compile_variant("p2p", bounded=True):
            ditron.compile(kernel, "sm_90a", ...)
    """
    token = _OVERRIDE.set(_variant_key(transport, bounded))
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def current_variant():
    """(transport, bounded) for kernels compiled now: an active
    :func:`compile_variant`, else the current world's transport and wait
    timeout, else ("nvshmem", False)."""
    key = _OVERRIDE.get()
    if key is not None:
        return key
    world = provided("world")
    if world is None:
        return ("nvshmem", False)
    transport = world.transport
    name = getattr(transport, "compile_transport", None) or ("p2p" if world.backend == "p2p" else "nvshmem")
    return _variant_key(name, getattr(transport, "wait_timeout_ns", 0) > 0)


def current_library():
    """The device library for kernels compiled now (see :func:`current_variant`)."""
    return variant_library(*current_variant())


def variant_of(ctx):
    """(transport, bounded) of the compilation ``ctx`` belongs to, read from
    the ditron library attached to it."""
    libs = getattr(ctx.options, "extern_libs", None) or ()
    return variant_of_path(dict(libs).get(LIB.name))


def variant_of_path(path):
    """(transport, bounded) of the ditron device library at ``path`` (None: no ditron library attached, the
    default variant)."""
    if path is None:
        return ("nvshmem", False)
    key = _VARIANT_OF_PATH.get(path)
    if key is None:
        key = ("nvshmem", False)
        try:
            with open(path) as f:
                for line in f.read(4096).splitlines():
                    if line.startswith("; ditron variant:"):
                        kv = dict(p.split("=", 1) for p in line.split(":", 1)[1].split())
                        key = _variant_key(kv.get("transport", "nvshmem"), kv.get("waits") == "bounded")
        except OSError:
            pass
        _VARIANT_OF_PATH[path] = key
    return key

_SCOPE = {"cta": "cta", "gpu": "gpu", "sys": "sys", "intra_node": "sys", "inter_node": "sys"}


def _bits(dtype):
    return dtype.primitive_bitwidth


def _reg(bits):
    return {16: "h", 32: "r", 64: "l"}[bits]


def _elem(ctx, value, arg):
    t = ctx.tensor(value).type
    t = t.element_ty if t.is_block() else t
    if t.is_ptr():
        t = t.element_ty
    if t.is_block() or t.primitive_bitwidth not in (16, 32, 64):
        raise ctx.error(f"elements of {t} are not supported (16-, 32- or 64-bit only)", arg=arg)
    return t


_INT_OF = {16: tl.int16, 32: tl.int32, 64: tl.int64}


def _raw(ctx, value, t):
    """``value`` converted to ``t`` and viewed as an integer of the same width
    (inline asm operands are registers; a float next to a pointer would not
    broadcast)."""
    v = _compat.cast(ctx.sem, ctx.tensor(value), t)
    return _compat.bitcast(ctx.sem, v, _INT_OF[_bits(t)]) if t.is_floating() else v


def _cooked(ctx, value, t):
    return _compat.bitcast(ctx.sem, value, t) if t.is_floating() else value


def _ptx_type(t, *, arith=False):
    """PTX type suffix: ``b32`` for moves; ``u32``/``s32``/``f32`` for arithmetic."""
    bits = _bits(t)
    if not arith:
        return f"b{bits}"
    if t.is_floating():
        return {16: "f16", 32: "f32", 64: "f64"}[bits] if not t.is_bf16() else "bf16"
    return f"{'s' if t.is_int_signed() else 'u'}{bits}"


# ---------------------------------------------------------------------------
# tile level
# ---------------------------------------------------------------------------

@register("rank", BACKEND)
def _rank(ctx, axis):
    return common.world_field(ctx, LIB, common.RANK_FIELD[axis])


@register("num_ranks", BACKEND)
def _num_ranks(ctx, axis):
    return common.world_field(ctx, LIB, common.SIZE_FIELD[axis])


@register("symm_at", BACKEND)
def _symm_at(ctx, ptr, rank):
    return common.symm_at(ctx, LIB, ctx.tensor(ptr), rank)


@register("wait", BACKEND)
def _wait(ctx, barrier_ptrs, num_barriers, wait_value, scope, semantic):
    """Every thread polls words tid, tid+ntid, ... < num_barriers with
    ``ld.<semantic>.<scope>``; then ``bar.sync 0`` joins the CTA."""
    bits = common.signal_width(ctx, ctx.tensor(barrier_ptrs), "barrier_ptrs")
    if variant_of(ctx)[1]:
        # DITRON_WAIT_TIMEOUT_S: the same loop in the device library, with a
        # %globaltimer check that reports past the world's timeout and leaves the kernel (cuda_bounded.py)
        n = _compat.cast(ctx.sem, ctx.tensor(num_barriers), tl.int32)
        vty = tl.int64 if bits == 64 else tl.int32
        val = _compat.cast(ctx.sem, ctx.tensor(wait_value), vty)
        return ctx.call(LIB, f"ditron_wait_bounded_{semantic}_{scope}_i{bits}",
                        [common.ptr_to_int(ctx, barrier_ptrs), n, val], [tl.int64, tl.int32, vty], tl.int32)
    r = _reg(bits)
    wide = "mul.wide.u32 %off, %i, 8;" if bits == 64 else "mul.wide.u32 %off, %i, 4;"
    asm = f"""{{
    .reg .pred %p<2>; .reg .b{bits} %v; .reg .u32 %i, %nt; .reg .u64 %off, %a;
    mov.u32 %i, %tid.x;
    mov.u32 %nt, %ntid.x;
    L_next_${{:uid}}:
    setp.ge.u32 %p0, %i, $2;
    @%p0 bra L_done_${{:uid}};
    {wide}
    add.u64 %a, $1, %off;
    L_spin_${{:uid}}:
    ld.{semantic}.{scope}.global.b{bits} %v, [%a];
    setp.ne.b{bits} %p1, %v, $3;
    @%p1 bra L_spin_${{:uid}};
    add.u32 %i, %i, %nt;
    bra L_next_${{:uid}};
    L_done_${{:uid}}:
    bar.sync 0;
    mov.u32 $0, 0;
    }}"""
    n = _compat.cast(ctx.sem, ctx.tensor(num_barriers), tl.int32)
    val = _compat.cast(ctx.sem, ctx.tensor(wait_value), tl.int64 if bits == 64 else tl.int32)
    return ctx.asm(asm, f"=r,l,r,{r}", [barrier_ptrs, n, val], tl.int32)


@register("consume_token", BACKEND)
def _consume_token(ctx, value, token):
    return common.consume_token(ctx, value, token)


@register("notify", BACKEND)
def _notify(ctx, ptr, rank, signal, sig_op, comm_scope):
    """``bar.sync 0`` (all threads' writes are done), then thread 0 performs a
    release store / release reduction at the scope's level; release is
    cumulative, so the whole CTA's writes become visible before the signal."""
    ptr = ctx.tensor(ptr)
    bits = common.signal_width(ctx, ptr, "ptr")
    if comm_scope == "inter_node":
        if bits != 64:
            raise ctx.error("inter_node signals are OpenSHMEM signal words: use int64/uint64", arg="ptr")
        _compat.debug_barrier(ctx.sem)
        _shmem_call(ctx, "shmem.signal_op", [ptr, signal, rank], extra={"sig_op": sig_op}, suffix="_once")
        return None
    remote = common.symm_at(ctx, LIB, ptr, rank)
    scope = _SCOPE[comm_scope]
    if sig_op == "set":
        instr = f"st.release.{scope}.global.b{bits} [$1], $2;"
    else:
        instr = f"red.release.{scope}.global.add.u{bits} [$1], $2;"
    asm = f"""{{
    .reg .pred %p; .reg .u32 %t;
    bar.sync 0;
    mov.u32 %t, %tid.x;
    setp.eq.u32 %p, %t, 0;
    @%p {instr}
    mov.u32 $0, 0;
    }}"""
    val = _compat.cast(ctx.sem, ctx.tensor(signal), tl.int64 if bits == 64 else tl.int32)
    ctx.asm(asm, f"=r,l,{_reg(bits)}", [remote, val], tl.int32)
    return None


# task level: scoreboard and work queue ----------------------------------------

@register("wait_deps", BACKEND)
def _wait_deps(ctx, slot_ptr, num_slots, epoch, acquire="fence"):
    """Threads poll slots tid, tid+ntid, ... with ``ld.relaxed.gpu`` until
    ``slot >= epoch`` (signed), four slots per thread at a time (tid,
    tid+ntid, tid+2ntid, tid+3ntid: independent loads, one memory round trip
    for up to 4 x ntid slots, where one slot per round trip cost a consumer of
    256-384 producer tiles 2-3 us per dependency wait on a loaded H200),
    sleeping ``nanosleep`` 64 ns before polling a group again while one of its
    slots is not ready; a thread that polled at least one slot then issues
    ``fence.acq_rel.gpu`` (relaxed read + fence = acquire); then ``bar.sync
    0``.  Polling with ``ld.acquire`` instead would invalidate the SM's L1 on
    every poll -- under the feet of the other programs on the SM -- and a
    tight loop floods L2 with requests while the producers stream their data.
    ``acquire="load"``: the polls are ``ld.acquire.gpu`` and there is no
    fence (the fence is ``MEMBAR.ALL.GPU``, which also waits for the thread's
    own loads and copies in flight: a wait inside a software-pipelined loop
    would drain its weight stream; an acquire load orders only what follows
    it, and the ``bar.sync`` passes that on to the other threads, as for the
    fence)."""
    common.slot_word(ctx, ctx.tensor(slot_ptr), "slot_ptr")
    n = _compat.cast(ctx.sem, ctx.tensor(num_slots), tl.int32)
    val = _compat.cast(ctx.sem, ctx.tensor(epoch), tl.int32)
    if variant_of(ctx)[1]:
        return ctx.call(LIB, "ditron_wait_deps_bounded_i32", [common.ptr_to_int(ctx, slot_ptr), n, val],
                        [tl.int64, tl.int32, tl.int32], tl.int32)
    # slots beyond n are not loaded: their registers keep the epoch (ready)
    ld = "ld.acquire.gpu" if acquire == "load" else "ld.relaxed.gpu"
    asm = """{
    .reg .pred %p<7>; .reg .b32 %v<4>; .reg .u32 %i, %nt, %nt4, %j; .reg .u64 %off, %a, %a1, %a2, %a3, %st;
    mov.u32 %i, %tid.x;
    mov.u32 %nt, %ntid.x;
    mul.lo.u32 %nt4, %nt, 4;
    mul.wide.u32 %st, %nt, 4;
    setp.lt.u32 %p6, %i, $2;
    L_next_${:uid}:
    setp.ge.u32 %p0, %i, $2;
    @%p0 bra L_done_${:uid};
    mul.wide.u32 %off, %i, 4;
    add.u64 %a, $1, %off;
    add.u64 %a1, %a, %st;
    add.u64 %a2, %a1, %st;
    add.u64 %a3, %a2, %st;
    add.u32 %j, %i, %nt;
    setp.lt.u32 %p1, %j, $2;
    add.u32 %j, %j, %nt;
    setp.lt.u32 %p2, %j, $2;
    add.u32 %j, %j, %nt;
    setp.lt.u32 %p3, %j, $2;
    L_spin_${:uid}:
    mov.b32 %v1, $3;
    mov.b32 %v2, $3;
    mov.b32 %v3, $3;
    LD.global.b32 %v0, [%a];
    @%p1 LD.global.b32 %v1, [%a1];
    @%p2 LD.global.b32 %v2, [%a2];
    @%p3 LD.global.b32 %v3, [%a3];
    setp.lt.s32 %p4, %v0, $3;
    @%p4 bra L_sleep_${:uid};
    setp.lt.s32 %p4, %v1, $3;
    @%p4 bra L_sleep_${:uid};
    setp.lt.s32 %p4, %v2, $3;
    @%p4 bra L_sleep_${:uid};
    setp.lt.s32 %p4, %v3, $3;
    @!%p4 bra L_ready_${:uid};
    L_sleep_${:uid}:
    nanosleep.u32 64;
    bra L_spin_${:uid};
    L_ready_${:uid}:
    add.u32 %i, %i, %nt4;
    bra L_next_${:uid};
    L_done_${:uid}:
    FENCE
    bar.sync 0;
    mov.u32 $0, 0;
    }""".replace("LD", ld).replace("FENCE", "" if acquire == "load" else "@%p6 fence.acq_rel.gpu;")
    return ctx.asm(asm, "=r,l,r,r", [slot_ptr, n, val], tl.int32)


@register("release_tile", BACKEND)
def _release_tile(ctx, slot_ptr, epoch):
    """``bar.sync 0`` (every thread's writes of the tile are done), then thread
    0 stores ``epoch`` with ``st.release.gpu`` (cumulative: the CTA's writes
    are visible before the slot)."""
    common.slot_word(ctx, ctx.tensor(slot_ptr), "slot_ptr")
    asm = """{
    .reg .pred %p; .reg .u32 %t;
    bar.sync 0;
    mov.u32 %t, %tid.x;
    setp.eq.u32 %p, %t, 0;
    @%p st.release.gpu.global.b32 [$1], $2;
    mov.u32 $0, 0;
    }"""
    val = _compat.cast(ctx.sem, ctx.tensor(epoch), tl.int32)
    ctx.asm(asm, "=r,l,r", [slot_ptr, val], tl.int32)
    return None


@register("fetch_task", BACKEND)
def _fetch_task(ctx, counter_ptr):
    return common.fetch_task(ctx, counter_ptr)


_MM_OPS = {"sum": "add", "min": "min", "max": "max"}


def _mm_type(ctx, t, op, acc):
    if t.is_fp32():
        if op != "sum":
            raise ctx.error("fp32 multimem reductions support op='sum' only", arg="op")
        return "f32", ""
    if t.is_fp16() or t.is_bf16():
        name = "f16" if t.is_fp16() else "bf16"
        if acc is not None and acc.is_fp32() and op == "sum":
            return name, ".acc::f32"
        return name, ""
    if t.is_int() and t.primitive_bitwidth in (32, 64):
        return f"{'s' if t.is_int_signed() else 'u'}{t.primitive_bitwidth}", ""
    raise ctx.error(f"multimem does not support {t} elements", arg="ptrs")


@register("multimem_ld_reduce", BACKEND)
def _multimem_ld_reduce(ctx, ptrs, op, acc_dtype):
    """``multimem.ld_reduce.relaxed.sys.global.<op>`` per element: the NVLink
    switch reads every rank's copy behind the multicast address and reduces."""
    ptrs = ctx.tensor(ptrs)
    t = _elem(ctx, ptrs, "ptrs")
    acc = _compat.unwrap(acc_dtype)
    if acc is None and (t.is_fp16() or t.is_bf16()):
        acc = tl.float32
    ty, accq = _mm_type(ctx, t, op, acc)
    if _bits(t) == 16:
        # 16-bit data moves in pairs (.f16x2/.bf16x2): each thread reduces two
        # adjacent elements with one instruction at the first one's address
        asm = f"multimem.ld_reduce.relaxed.sys.global.{_MM_OPS[op]}{accq}.{ty}x2 $0, [$1];"
        return ctx.asm(asm, "=r,l,l", [ptrs], t, pack=2)
    asm = f"multimem.ld_reduce.relaxed.sys.global.{_MM_OPS[op]}{accq}.{ty} $0, [$1];"
    return ctx.asm(asm, f"={_reg(_bits(t))},l", [ptrs], t)


@register("multimem_st", BACKEND)
def _multimem_st(ctx, ptrs, value):
    """``multimem.st.relaxed.sys.global`` per element: one store reaches every
    rank's copy behind the multicast address."""
    ptrs = ctx.tensor(ptrs)
    t = _elem(ctx, ptrs, "ptrs")
    ty, _ = _mm_type(ctx, t, "sum", None)
    value = _raw(ctx, value, t)
    if _bits(t) == 16:
        asm = f"multimem.st.relaxed.sys.global.{ty}x2 [$1], $3; mov.b32 $0, 0;"
        ctx.asm(asm, "=r,l,l,r", [ptrs, value], tl.int16, pack=2)
        return None
    asm = f"multimem.st.relaxed.sys.global.{ty} [$1], $2; mov.u32 $0, 0;"
    ctx.asm(asm, f"=r,l,{_reg(_bits(t))}", [ptrs, value], tl.int32)
    return None


def _mm_vec_type(ctx, ptr):
    t = _elem(ctx, ptr, "ptr")
    if t.is_fp32():
        return t, "f32"
    if t.is_fp16() or t.is_bf16():
        return t, "f16x2" if t.is_fp16() else "bf16x2"
    raise ctx.error(f"packed multimem accesses support fp16 / bf16 / fp32 pointers, not {t}", arg="ptr")


def _mm_guard(ctx, mask, body, pre=""):
    """``body`` run where ``mask`` holds: a branch around it, not a predicate on the multimem instruction
    (Triton-distributed's source notes that ptxas mishandles predicated multimem instructions)."""
    if mask is None:
        return "{\n" + pre + body + "\n}", []
    return ("{\n.reg .pred %p_mm;\n" + pre + "setp.eq.s32 %p_mm, $MASK, 0;\n@%p_mm bra L_mm_skip_${:uid};\n"
            + body + "\nL_mm_skip_${:uid}:\n}"), [_compat.cast(ctx.sem, ctx.tensor(mask), tl.int32)]


@register("multimem_ld_reduce_v4", BACKEND)
def _multimem_ld_reduce_v4(ctx, ptr, mask, acc_dtype):
    """``multimem.ld_reduce.<relaxed|acquire>.sys.global.add[.acc::f32].v4.<f32|f16x2|bf16x2>`` per thread: four
    32-bit registers (relaxed; ``acquire`` with a mask, as Triton-distributed's ``_p`` variant)."""
    t, ty = _mm_vec_type(ctx, ptr)
    accq = "" if t.is_fp32() else ".acc::f32"
    sem = "relaxed" if mask is None else "acquire"
    body = f"multimem.ld_reduce.{sem}.sys.global.add{accq}.v4.{ty} {{$0, $1, $2, $3}}, [$4];"
    pre = "" if mask is None else "mov.b32 $0, 0;\nmov.b32 $1, 0;\nmov.b32 $2, 0;\nmov.b32 $3, 0;\n"
    asm, extra = _mm_guard(ctx, mask, body, pre)
    asm = asm.replace("$MASK", "$5")
    words = ctx.asm(asm, "=r,=r,=r,=r,l" + (",r" if extra else ""), [ptr] + extra, [tl.int32] * 4)
    if t.is_fp32():
        words = [_compat.bitcast(ctx.sem, w, tl.float32) for w in words]
    return tuple(words)


_ST_FORMS = {"b32": (1, 32), "b64": (1, 64), "v2": (2, 32), "v4": (4, 32)}


@register("multimem_st_packed", BACKEND)
def _multimem_st_packed(ctx, ptr, values, mask, form):
    """``multimem.st.relaxed.sys.global.<b32|b64>`` or ``.v2`` / ``.v4.<f32|f16x2|bf16x2>`` per thread: the values'
    bits reach every rank's copy behind the multicast address."""
    count, bits = _ST_FORMS[form]
    regs = [_compat.bitcast(ctx.sem, ctx.tensor(v), _INT_OF[bits]) if ctx.tensor(v).dtype.is_floating()
            else ctx.tensor(v) for v in values]
    ops = ", ".join(f"${i + 2}" for i in range(count))
    if form in ("b32", "b64"):
        body = f"multimem.st.relaxed.sys.global.{form} [$1], {ops};"
    else:
        _, ty = _mm_vec_type(ctx, ptr)
        body = f"multimem.st.relaxed.sys.global.{form}.{ty} [$1], {{{ops}}};"
    asm, extra = _mm_guard(ctx, mask, body)
    asm = asm.replace("$MASK", f"${count + 2}") + "\nmov.u32 $0, 0;"
    cons = "=r,l," + ",".join(_reg(bits) for _ in range(count)) + (",r" if extra else "")
    ctx.asm(asm, cons, [ptr] + regs + extra, tl.int32)
    return None


# ---------------------------------------------------------------------------
# thread level (per thread, exactly as in CUDA)
# ---------------------------------------------------------------------------

def _special(ctx, reg):
    return ctx.asm(f"mov.u32 $0, {reg};", "=r", [], tl.int32, is_pure=True)


@register("tid", BACKEND)
def _tid(ctx, axis):
    return _special(ctx, "%tid." + "xyz"[axis])


@register("laneid", BACKEND)
def _laneid(ctx):
    return _special(ctx, "%laneid")


@register("num_threads", BACKEND)
def _num_threads(ctx):
    return _special(ctx, "%ntid.x")


@register("simt_region", BACKEND)
def _simt_region(ctx):
    return _tid(ctx, 0), _num_threads(ctx)


@register("num_warps", BACKEND)
def _num_warps(ctx):
    return ctx.asm("{ .reg .u32 %n; mov.u32 %n, %ntid.x; shr.u32 $0, %n, 5; }", "=r", [], tl.int32, is_pure=True)


def _sem_scope(semantic, scope):
    if semantic == "volatile":
        return "volatile"
    return f"{semantic}.{scope}"


@register("ld", BACKEND)
def _ld(ctx, ptr, scope, semantic):
    t = _elem(ctx, ptr, "ptr")
    asm = f"ld.{_sem_scope(semantic, scope)}.global.b{_bits(t)} $0, [$1];"
    return _cooked(ctx, ctx.asm(asm, f"={_reg(_bits(t))},l", [ptr], _INT_OF[_bits(t)] if t.is_floating() else t), t)


@register("st", BACKEND)
def _st(ctx, ptr, value, scope, semantic):
    t = _elem(ctx, ptr, "ptr")
    value = _raw(ctx, value, t)
    asm = f"st.{_sem_scope(semantic, scope)}.global.b{_bits(t)} [$1], $2; mov.u32 $0, 0;"
    ctx.asm(asm, f"=r,l,{_reg(_bits(t))}", [ptr, value], tl.int32)
    return None


def _vec_q(semantic, scope):
    """``ld``/``st`` qualifiers of a vector access: weak (""), ``volatile.``, or ``<semantic>.<scope>.``."""
    if not semantic:
        return ""
    return _sem_scope(semantic, scope) + "."


@register("ld_vec", BACKEND)
def _ld_vec(ctx, ptr, words, scope, semantic):
    """One ``ld{.sem.scope}.global.v<words>.b<bits>`` per pointer (per thread): an aligned vector access that
    the GPU performs at once (LL protocols poll a data word and its flag word with it)."""
    t = _elem(ctx, ptr, "ptr")
    bits = _bits(t)
    outs = ", ".join(f"${i}" for i in range(words))
    asm = f"ld.{_vec_q(semantic, scope)}global.v{words}.b{bits} {{{outs}}}, [${words}];"
    ity = _INT_OF[bits] if t.is_floating() else t
    got = ctx.asm(asm, ",".join([f"={_reg(bits)}"] * words) + ",l", [ptr], [ity] * words)
    return tuple(_cooked(ctx, w, t) for w in got)


@register("st_vec", BACKEND)
def _st_vec(ctx, ptr, values, scope, semantic):
    """One ``st{.sem.scope}.global.v<n>.b<bits>`` per pointer (per thread)."""
    t = _elem(ctx, ptr, "ptr")
    bits = _bits(t)
    regs = [_raw(ctx, v, t) for v in values]
    ins = ", ".join(f"${i + 2}" for i in range(len(regs)))
    asm = f"st.{_vec_q(semantic, scope)}global.v{len(regs)}.b{bits} [$1], {{{ins}}}; mov.u32 $0, 0;"
    ctx.asm(asm, "=r,l," + ",".join(_reg(bits) for _ in regs), [ptr] + regs, tl.int32)
    return None


@register("atomic_add", BACKEND)
def _atomic_add(ctx, ptr, value, scope, semantic):
    t = _elem(ctx, ptr, "ptr")
    if _bits(t) == 16:
        raise ctx.error("16-bit atomic_add is not supported", arg="ptr")
    value = _raw(ctx, value, t)
    ty = _ptx_type(t, arith=True)
    if ty.startswith("s") and ty != "s32":
        ty = "u64"
    asm = f"atom.{semantic}.{scope}.global.add.{ty} $0, [$1], $2;"
    old = ctx.asm(asm, f"={_reg(_bits(t))},l,{_reg(_bits(t))}", [ptr, value], _INT_OF[_bits(t)] if t.is_floating() else t)
    return _cooked(ctx, old, t)


@register("atomic_cas", BACKEND)
def _atomic_cas(ctx, ptr, cmp, value, scope, semantic):
    t = _elem(ctx, ptr, "ptr")
    if _bits(t) == 16:
        raise ctx.error("16-bit atomic_cas is not supported", arg="ptr")
    cmp = _raw(ctx, cmp, t)
    value = _raw(ctx, value, t)
    r = _reg(_bits(t))
    asm = f"atom.{semantic}.{scope}.global.cas.b{_bits(t)} $0, [$1], $2, $3;"
    return _cooked(ctx, ctx.asm(asm, f"={r},l,{r},{r}", [ptr, cmp, value], _INT_OF[_bits(t)] if t.is_floating() else t), t)


@register("syncthreads", BACKEND)
def _syncthreads(ctx):
    _compat.debug_barrier(ctx.sem)
    return None


@register("fence", BACKEND)
def _fence(ctx, semantic, scope):
    sem = "sc" if semantic == "sc" else "acq_rel"
    ctx.asm(f"fence.{sem}.{scope}; mov.u32 $0, 0;", "=r", [], tl.int32)
    return None


@register("ballot_sync", BACKEND)
def _ballot_sync(ctx, mask, pred):
    p = _compat.cast(ctx.sem, ctx.tensor(pred), tl.int32)
    m = _compat.cast(ctx.sem, ctx.tensor(mask), tl.int32)
    asm = "{ .reg .pred %p; setp.ne.u32 %p, $2, 0; vote.sync.ballot.b32 $0, %p, $1; }"
    return ctx.asm(asm, "=r,r,r", [m, p], tl.int32)


def _shfl(mode, clamp):
    def rule(ctx, mask, value, lane):
        value = ctx.tensor(value)
        t = value.type.element_ty if value.type.is_block() else value.type
        if t.is_ptr() or _bits(t) not in (32, 64):
            raise ctx.error(f"shuffles move 32- or 64-bit values, not {t}", arg="value")
        m = _compat.cast(ctx.sem, ctx.tensor(mask), tl.int32)
        ln = _compat.cast(ctx.sem, ctx.tensor(lane), tl.int32)
        if _bits(t) == 32:
            asm = f"shfl.sync.{mode}.b32 $0, $1, $2, {clamp}, $3;"
            return ctx.asm(asm, "=r,r,r,r", [value, ln, m], t)
        asm = (f"{{ .reg .b32 %lo, %hi; mov.b64 {{%lo, %hi}}, $1; "
               f"shfl.sync.{mode}.b32 %lo, %lo, $2, {clamp}, $3; shfl.sync.{mode}.b32 %hi, %hi, $2, {clamp}, $3; "
               f"mov.b64 $0, {{%lo, %hi}}; }}")
        return ctx.asm(asm, "=l,l,r,r", [value, ln, m], t)
    return rule


register("shfl_sync", BACKEND)(_shfl("idx", "0x1f"))
register("shfl_up_sync", BACKEND)(_shfl("up", "0x0"))
register("shfl_down_sync", BACKEND)(_shfl("down", "0x1f"))
register("shfl_xor_sync", BACKEND)(_shfl("bfly", "0x1f"))


@register("clock_ns", BACKEND)
def _clock_ns(ctx):
    return ctx.asm("mov.u64 $0, %globaltimer;", "=l", [], tl.int64)


@register("poll_timeout", BACKEND)
def _poll_timeout(ctx, start, ptr, expected, observed, pending):
    """Nothing unless the kernel is compiled bounded (DITRON_WAIT_TIMEOUT_S);
    then the device library's timer check, elementwise over ``ptr``, which
    reports for an expired pending element and leaves the kernel (cuda_bounded.py)."""
    if not variant_of(ctx)[1]:
        return None
    args = [_compat.cast(ctx.sem, ctx.tensor(start), tl.int64), common.ptr_to_int(ctx, ptr),
            _compat.cast(ctx.sem, ctx.tensor(expected), tl.int64), _compat.cast(ctx.sem, ctx.tensor(observed), tl.int64),
            _compat.cast(ctx.sem, ctx.tensor(pending), tl.int32)]
    ctx.call(LIB, "ditron_poll_timeout", args, [tl.int64] * 4 + [tl.int32], tl.int32)
    return None


@register("prefetch_l2", BACKEND)
def _prefetch_l2(ctx, ptr, mask):
    """``prefetch.global.L2::evict_last`` per element, predicated on ``mask``."""
    asm = ("{ .reg .pred %p; setp.ne.b32 %p, $2, 0; @%p prefetch.global.L2::evict_last [$1]; "
           "mov.u32 $0, 0; }")
    m = _compat.cast(ctx.sem, ctx.tensor(mask), tl.int32)
    ctx.asm(asm, "=r,l,r", [common.ptr_to_int(ctx, ptr), m], tl.int32)
    return None


@register("ffs", BACKEND)
def _ffs(ctx, x):
    x = ctx.tensor(x)
    t = x.type.element_ty if x.type.is_block() else x.type
    b = _bits(t)
    if b not in (32, 64):
        raise ctx.error(f"ffs takes 32- or 64-bit integers, not {t}", arg="x")
    asm = (f"{{ .reg .b{b} %t; .reg .u32 %c; .reg .pred %z; brev.b{b} %t, $1; clz.b{b} %c, %t; "
           f"add.u32 %c, %c, 1; setp.eq.u{b} %z, $1, 0; selp.b32 $0, 0, %c, %z; }}")
    return ctx.asm(asm, f"=r,{_reg(b)}", [x], tl.int32, is_pure=True)


# ---------------------------------------------------------------------------
# chunk level: NVSHMEM
# ---------------------------------------------------------------------------
_nvshmem_call = shmem_rules.make_shmem_call(LIB, shmem_table.NVSHMEM,
                                            {"sig_op": shmem_table.NVSHMEM_SIGNAL, "cmp": shmem_table.NVSHMEM_CMP})
_p2p_call = shmem_rules.make_p2p_call(LIB, cuda_p2p.P2P_SIGNAL, shmem_table.NVSHMEM_CMP)


def _shmem_call(ctx, kind, args, extra=None, suffix=""):
    """``shmem.*`` for the compilation's variant: NVSHMEM's device functions,
    or loads/stores through the heap deltas on the P2P transport.  Under
    bounded waits, signal_wait_until polls with a timeout on either transport
    (NVSHMEM's own loop has none)."""
    transport, bounded = variant_of(ctx)
    if transport == "p2p":
        return _p2p_call(ctx, kind, args, extra, suffix, bounded=bounded)
    if bounded and kind == "shmem.signal_wait_until":
        return _p2p_call(ctx, kind, args, extra, suffix, bounded=True)
    return _nvshmem_call(ctx, kind, args, extra, suffix)


def _populate(lib):
    """Everything a ditron CUDA library defines (all variants hold the same functions)."""
    shmem_rules.define_wrappers(lib, shmem_table.NVSHMEM)
    shmem_rules.define_signal_once(lib, shmem_table.NVSHMEM, "llvm.nvvm.read.ptx.sreg.tid.x")
    cuda_p2p.add_p2p(lib)
    cuda_bounded.add_bounded(lib)


shmem_rules.register_shmem(BACKEND, _shmem_call)
_populate(LIB)
_VARIANT_LIBS[("nvshmem", False)] = LIB
