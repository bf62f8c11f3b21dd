"""AMD lowering (gfx942 / MI300): the ditron device library written in LLVM
IR with AMDGPU intrinsics and LLVM atomics, whose memory-model lowering in the
AMDGPU backend emits the right cache controls (``sc0``/``sc1``,
``buffer_inv``, ``buffer_wbl2``); rocSHMEM device functions for ``shmem.*``
when a rocSHMEM bitcode is given.  Needs no ROCm installation: Triton ships
the LLVM and lld that build the hsaco.

Function names in the library all contain ``ditron`` (and SHMEM wrappers also
``rocshmem``): Triton's AMD backend links an extern library only into modules
that call a function whose name contains the library's key.
"""
from __future__ import annotations

import triton.language as tl

from .. import _compat
from . import common, devlib, register, shmem_rules, shmem_table

BACKEND = "hip"
LIB = devlib.DeviceLibrary("ditron", BACKEND, const_addrspace=4)
devlib.add_world(LIB)

#: ditron scope -> AMDGPU syncscope ("" is system scope)
_SYNCSCOPE = {"cta": 'syncscope("workgroup") ', "gpu": 'syncscope("agent") ', "sys": "",
              "intra_node": "", "inter_node": ""}
_ORDER = {"acquire": "acquire", "release": "release", "acq_rel": "acq_rel", "relaxed": "monotonic",
          "sc": "seq_cst"}
_INT = {16: "i16", 32: "i32", 64: "i64"}
_TL_INT = {16: tl.int16, 32: tl.int32, 64: tl.int64}

_BARRIER = """  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire"""


def _decls():
    for name, text in {
        "llvm.amdgcn.workitem.id.x": "declare i32 @llvm.amdgcn.workitem.id.x()",
        "llvm.amdgcn.workitem.id.y": "declare i32 @llvm.amdgcn.workitem.id.y()",
        "llvm.amdgcn.workitem.id.z": "declare i32 @llvm.amdgcn.workitem.id.z()",
        "llvm.amdgcn.s.barrier": "declare void @llvm.amdgcn.s.barrier()",
        "llvm.amdgcn.mbcnt.lo": "declare i32 @llvm.amdgcn.mbcnt.lo(i32, i32)",
        "llvm.amdgcn.mbcnt.hi": "declare i32 @llvm.amdgcn.mbcnt.hi(i32, i32)",
        "llvm.amdgcn.ballot.i64": "declare i64 @llvm.amdgcn.ballot.i64(i1)",
        "llvm.amdgcn.ds.bpermute": "declare i32 @llvm.amdgcn.ds.bpermute(i32, i32)",
        "llvm.cttz.i32": "declare i32 @llvm.cttz.i32(i32, i1)",
        "llvm.cttz.i64": "declare i64 @llvm.cttz.i64(i64, i1)",
    }.items():
        LIB.declare(name, text)


def _wait_loop(name, bits, order, cmp):
    """``i32 name(i64 p, i32 n, iN v, i32 nt)``: every thread polls words ``tid, tid + nt, ...`` below ``n``
    with an atomic load (``order``: syncscope + ordering) until ``icmp cmp word, v``; then the CTA barrier."""
    ty = _INT[bits]
    return f"""
define i32 @{name}(i64 %p, i32 %n, {ty} %v, i32 %nt) #1 {{
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %base = inttoptr i64 %p to ptr addrspace(1)
  br label %next
next:
  %i = phi i32 [ %tid, %entry ], [ %inext, %got ]
  %more = icmp slt i32 %i, %n
  br i1 %more, label %spin, label %done
spin:
  %off = sext i32 %i to i64
  %a = getelementptr {ty}, ptr addrspace(1) %base, i64 %off
  %w = load atomic {ty}, ptr addrspace(1) %a {order}, align {bits // 8}
  %ok = icmp {cmp} {ty} %w, %v
  br i1 %ok, label %got, label %spin
got:
  %inext = add i32 %i, %nt
  br label %next
done:
{_BARRIER}
  ret i32 0
}}"""


def _build_library():
    _decls()
    for axis in "xyz":
        LIB.define(f"ditron_tid_{axis}", f"""
define i32 @ditron_tid_{axis}() #0 {{
  %t = call i32 @llvm.amdgcn.workitem.id.{axis}()
  ret i32 %t
}}""")
    LIB.define("ditron_laneid", """
define i32 @ditron_laneid() #0 {
  %lo = call i32 @llvm.amdgcn.mbcnt.lo(i32 -1, i32 0)
  %l = call i32 @llvm.amdgcn.mbcnt.hi(i32 -1, i32 %lo)
  ret i32 %l
}""")
    LIB.define("ditron_syncthreads", f"""
define i32 @ditron_syncthreads() #1 {{
{_BARRIER}
  ret i32 0
}}""")
    for scope in ("gpu", "sys"):
        for semantic in ("acquire", "relaxed"):
            for bits in (32, 64):
                name = f"ditron_wait_{semantic}_{scope}_{_INT[bits]}"
                LIB.define(name, _wait_loop(name, bits, f"{_SYNCSCOPE[scope]}{_ORDER[semantic]}", "eq"))
    # dl.wait_deps: scoreboard slots, satisfied at >= epoch (signed), acquire at agent scope
    LIB.define("ditron_wait_deps_i32", _wait_loop("ditron_wait_deps_i32", 32, f"{_SYNCSCOPE['gpu']}acquire", "sge"))
    for scope in ("gpu", "sys"):
        ss = _SYNCSCOPE[scope]
        for bits in (32, 64):
            ty = _INT[bits]
            for sig_op, op_ir in (("set", f"store atomic {ty} %v, ptr addrspace(1) %a {ss}release, align {bits // 8}"),
                                  ("add", f"%o = atomicrmw add ptr addrspace(1) %a, {ty} %v {ss}release, "
                                          f"align {bits // 8}")):
                LIB.define(f"ditron_notify_{sig_op}_{scope}_{ty}", f"""
define i32 @ditron_notify_{sig_op}_{scope}_{ty}(i64 %p, {ty} %v) #1 {{
entry:
{_BARRIER}
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %do, label %done
do:
  %a = inttoptr i64 %p to ptr addrspace(1)
  {op_ir}
  br label %done
done:
  ret i32 0
}}""")
    for scope in ("cta", "gpu", "sys"):
        ss = _SYNCSCOPE[scope]
        for bits in (16, 32, 64):
            ty, al = _INT[bits], bits // 8
            for semantic in ("acquire", "relaxed", "volatile"):
                load = (f"load volatile {ty}, ptr addrspace(1) %a, align {al}" if semantic == "volatile" else
                        f"load atomic {ty}, ptr addrspace(1) %a {ss}{_ORDER[semantic]}, align {al}")
                LIB.define(f"ditron_ld_{semantic}_{scope}_{ty}", f"""
define {ty} @ditron_ld_{semantic}_{scope}_{ty}(i64 %p) #0 {{
  %a = inttoptr i64 %p to ptr addrspace(1)
  %v = {load}
  ret {ty} %v
}}""")
            for semantic in ("release", "relaxed", "volatile"):
                store = (f"store volatile {ty} %v, ptr addrspace(1) %a, align {al}" if semantic == "volatile" else
                         f"store atomic {ty} %v, ptr addrspace(1) %a {ss}{_ORDER[semantic]}, align {al}")
                LIB.define(f"ditron_st_{semantic}_{scope}_{ty}", f"""
define i32 @ditron_st_{semantic}_{scope}_{ty}(i64 %p, {ty} %v) #0 {{
  %a = inttoptr i64 %p to ptr addrspace(1)
  {store}
  ret i32 0
}}""")
        for semantic in ("acquire", "release", "acq_rel", "relaxed"):
            order = _ORDER[semantic]
            fail = "acquire" if semantic in ("acquire", "acq_rel") else "monotonic"
            for ty, op in (("i32", "add"), ("i64", "add"), ("float", "fadd"), ("double", "fadd")):
                al = 4 if ty in ("i32", "float") else 8
                LIB.define(f"ditron_atomic_add_{semantic}_{scope}_{ty}", f"""
define {ty} @ditron_atomic_add_{semantic}_{scope}_{ty}(i64 %p, {ty} %v) #0 {{
  %a = inttoptr i64 %p to ptr addrspace(1)
  %o = atomicrmw {op} ptr addrspace(1) %a, {ty} %v {ss}{order}, align {al}
  ret {ty} %o
}}""")
            for ty in ("i32", "i64"):
                al = 4 if ty == "i32" else 8
                LIB.define(f"ditron_atomic_cas_{semantic}_{scope}_{ty}", f"""
define {ty} @ditron_atomic_cas_{semantic}_{scope}_{ty}(i64 %p, {ty} %c, {ty} %v) #0 {{
  %a = inttoptr i64 %p to ptr addrspace(1)
  %r = cmpxchg ptr addrspace(1) %a, {ty} %c, {ty} %v {ss}{order} {fail}, align {al}
  %o = extractvalue {{ {ty}, i1 }} %r, 0
  ret {ty} %o
}}""")
        for semantic in ("acquire", "release", "acq_rel", "sc"):
            LIB.define(f"ditron_fence_{semantic}_{scope}", f"""
define i32 @ditron_fence_{semantic}_{scope}() #0 {{
  fence {ss}{_ORDER[semantic]}
  ret i32 0
}}""")
    LIB.define("ditron_ballot", """
define i64 @ditron_ballot(i32 %pred) #1 {
  %b = icmp ne i32 %pred, 0
  %m = call i64 @llvm.amdgcn.ballot.i64(i1 %b)
  ret i64 %m
}""")
    # shuffles through ds_bpermute (byte address = source lane * 4); a source
    # lane outside the wavefront keeps the caller's value, as CUDA's up/down do
    lane_src = {
        "idx": "  %src = and i32 %x, 63",
        "up": "  %s0 = sub i32 %lane, %x\n  %in = icmp sge i32 %s0, 0\n  %src = select i1 %in, i32 %s0, i32 %lane",
        "down": "  %s0 = add i32 %lane, %x\n  %in = icmp slt i32 %s0, 64\n  %src = select i1 %in, i32 %s0, i32 %lane",
        "xor": "  %s0 = xor i32 %lane, %x\n  %in = icmp slt i32 %s0, 64\n  %src = select i1 %in, i32 %s0, i32 %lane",
    }
    for mode, src in lane_src.items():
        LIB.define(f"ditron_shfl_{mode}_i32", f"""
define i32 @ditron_shfl_{mode}_i32(i32 %v, i32 %x) #1 {{
  %lo = call i32 @llvm.amdgcn.mbcnt.lo(i32 -1, i32 0)
  %lane = call i32 @llvm.amdgcn.mbcnt.hi(i32 -1, i32 %lo)
{src}
  %addr = shl i32 %src, 2
  %r = call i32 @llvm.amdgcn.ds.bpermute(i32 %addr, i32 %v)
  ret i32 %r
}}""")
        LIB.define(f"ditron_shfl_{mode}_i64", f"""
define i64 @ditron_shfl_{mode}_i64(i64 %v, i32 %x) #1 {{
  %l = trunc i64 %v to i32
  %h64 = lshr i64 %v, 32
  %h = trunc i64 %h64 to i32
  %rl = call i32 @ditron_shfl_{mode}_i32(i32 %l, i32 %x)
  %rh = call i32 @ditron_shfl_{mode}_i32(i32 %h, i32 %x)
  %zl = zext i32 %rl to i64
  %zh = zext i32 %rh to i64
  %sh = shl i64 %zh, 32
  %r = or i64 %sh, %zl
  ret i64 %r
}}""")
    LIB.declare("llvm.amdgcn.s.memrealtime", "declare i64 @llvm.amdgcn.s.memrealtime()")
    LIB.define("ditron_clock_ns", """
define i64 @ditron_clock_ns() #0 {
  %t = call i64 @llvm.amdgcn.s.memrealtime()
  %ns = mul i64 %t, 10
  ret i64 %ns
}""")
    for ty in ("i32", "i64"):
        LIB.define(f"ditron_ffs_{ty}", f"""
define i32 @ditron_ffs_{ty}({ty} %x) #0 {{
  %z = icmp eq {ty} %x, 0
  %c = call {ty} @llvm.cttz.{ty}({ty} %x, i1 true)
{"  %c32 = add i32 %c, 0" if ty == "i32" else "  %c32 = trunc i64 %c to i32"}
  %c1 = add i32 %c32, 1
  %r = select i1 %z, i32 0, i32 %c1
  ret i32 %r
}}""")


_build_library()


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _elem(ctx, ptr, arg="ptr"):
    t = ctx.tensor(ptr).type
    t = t.element_ty if t.is_block() else t
    elem = t.element_ty if t.is_ptr() else t
    if elem.is_block() or elem.primitive_bitwidth not in (16, 32, 64):
        raise ctx.error(f"elements of {elem} are not supported (16-, 32- or 64-bit only)", arg=arg)
    return elem


def _as_int(ctx, value, elem):
    """``value`` converted to ``elem`` and viewed as the integer of its width."""
    v = _compat.cast(ctx.sem, ctx.tensor(value), elem)
    ity = _TL_INT[elem.primitive_bitwidth]
    return v if elem == ity else _compat.bitcast(ctx.sem, v, ity)


def _from_int(ctx, value, elem):
    ity = _TL_INT[elem.primitive_bitwidth]
    return value if elem == ity else _compat.bitcast(ctx.sem, value, elem)


def _call(ctx, symbol, args, arg_types, ret, is_pure=False):
    return ctx.call(LIB, symbol, args, arg_types, ret, is_pure=is_pure)


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
    bits = common.signal_width(ctx, ctx.tensor(barrier_ptrs), "barrier_ptrs")
    ity = _TL_INT[bits]
    return _call(ctx, f"ditron_wait_{semantic}_{scope}_{_INT[bits]}",
                 [common.ptr_to_int(ctx, barrier_ptrs), num_barriers, wait_value, ctx.num_threads],
                 [tl.int64, tl.int32, ity, tl.int32], tl.int32)


@register("consume_token", BACKEND)
def _consume_token(ctx, value, token):
    return common.consume_token(ctx, value, token)


@register("notify", BACKEND)
def _notify(ctx, ptr, rank, signal, sig_op, comm_scope):
    ptr = ctx.tensor(ptr)
    bits = common.signal_width(ctx, ptr, "ptr")
    if comm_scope == "inter_node":
        if bits != 64:
            raise ctx.error("inter_node signals are OpenSHMEM signal words: use int64/uint64", arg="ptr")
        _compat.debug_barrier(ctx.sem)
        _shmem_call(ctx, "shmem.signal_op", [ptr, signal, rank], extra={"sig_op": sig_op}, suffix="_once")
        return None
    remote = common.symm_at(ctx, LIB, ptr, rank)
    scope = "gpu" if comm_scope == "gpu" else "sys"
    _call(ctx, f"ditron_notify_{sig_op}_{scope}_{_INT[bits]}", [common.ptr_to_int(ctx, remote), signal],
          [tl.int64, _TL_INT[bits]], tl.int32)
    return None


# task level: scoreboard and work queue ----------------------------------------

@register("wait_deps", BACKEND)
def _wait_deps(ctx, slot_ptr, num_slots, epoch, acquire="fence"):   # (acquire: NVIDIA only)
    common.slot_word(ctx, ctx.tensor(slot_ptr), "slot_ptr")
    return _call(ctx, "ditron_wait_deps_i32", [common.ptr_to_int(ctx, slot_ptr), num_slots, epoch, ctx.num_threads],
                 [tl.int64, tl.int32, tl.int32, tl.int32], tl.int32)


@register("release_tile", BACKEND)
def _release_tile(ctx, slot_ptr, epoch):
    """``s_barrier``, then thread 0 stores ``epoch`` with an agent-scope
    release store (the same library function as ``notify`` at GPU scope)."""
    common.slot_word(ctx, ctx.tensor(slot_ptr), "slot_ptr")
    _call(ctx, "ditron_notify_set_gpu_i32", [common.ptr_to_int(ctx, slot_ptr), epoch], [tl.int64, tl.int32], tl.int32)
    return None


@register("fetch_task", BACKEND)
def _fetch_task(ctx, counter_ptr):
    return common.fetch_task(ctx, counter_ptr)


# ---------------------------------------------------------------------------
# thread level
# ---------------------------------------------------------------------------

@register("tid", BACKEND)
def _tid(ctx, axis):
    return _call(ctx, f"ditron_tid_{'xyz'[axis]}", [], [], tl.int32, is_pure=True)


@register("laneid", BACKEND)
def _laneid(ctx):
    return _call(ctx, "ditron_laneid", [], [], tl.int32, is_pure=True)


@register("num_threads", BACKEND)
def _num_threads(ctx):
    return ctx.tensor(ctx.num_threads)


@register("simt_region", BACKEND)
def _simt_region(ctx):
    return _tid(ctx, 0), _num_threads(ctx)


@register("num_warps", BACKEND)
def _num_warps(ctx):
    return ctx.tensor(ctx.num_warps)


@register("ld", BACKEND)
def _ld(ctx, ptr, scope, semantic):
    elem = _elem(ctx, ptr)
    bits = elem.primitive_bitwidth
    v = _call(ctx, f"ditron_ld_{semantic}_{scope}_{_INT[bits]}", [common.ptr_to_int(ctx, ptr)], [tl.int64],
              _TL_INT[bits])
    return _from_int(ctx, v, elem)


@register("st", BACKEND)
def _st(ctx, ptr, value, scope, semantic):
    elem = _elem(ctx, ptr)
    bits = elem.primitive_bitwidth
    _call(ctx, f"ditron_st_{semantic}_{scope}_{_INT[bits]}", [common.ptr_to_int(ctx, ptr), _as_int(ctx, value, elem)],
          [tl.int64, _TL_INT[bits]], tl.int32)
    return None


# one vector access per thread (ld_vec / st_vec): one global_load_dwordx4 / _dwordx2 / global_store_* of a VGPR
# tuple, in inline asm (a library function returns one value, and Triton has no 128-bit type), through four
# fixed VGPRs that the asm clobbers; cache controls as LLVM's GFX942 memory model gives them
_VEC_CACHE = {"cta": "sc0", "gpu": "sc1", "sys": "sc0 sc1"}


def _vec_regs(n):
    return f"v[0:{n - 1}]", [f"v{i}" for i in range(n)]


@register("ld_vec", BACKEND)
def _ld_vec(ctx, ptr, words, scope, semantic):
    elem = _elem(ctx, ptr)
    bits = elem.primitive_bitwidth
    n = words * bits // 32                                   # 32-bit registers
    tup, regs = _vec_regs(n)
    cache = {"": "", "volatile": "sc0 sc1"}.get(semantic, _VEC_CACHE.get(scope, "sc0 sc1"))
    lines = [f"global_load_dwordx{n} {tup}, ${n}, off {cache}".rstrip(), "s_waitcnt vmcnt(0)"]
    if semantic == "acquire":
        lines.append(f"buffer_inv {_VEC_CACHE[scope]}")
    lines += [f"v_mov_b32 ${i}, {r}" for i, r in enumerate(regs)]
    cons = ",".join(["=&v"] * n) + ",v," + ",".join("~{" + r + "}" for r in regs)
    got = ctx.asm("\n".join(lines), cons, [common.ptr_to_int(ctx, ptr)], [tl.int32] * n)
    if bits == 32:
        return tuple(_from_int(ctx, w, elem) for w in got)
    out = []
    for lo, hi in zip(got[0::2], got[1::2]):                # little-endian halves of each 64-bit word
        lo64 = _compat.cast(ctx.sem, _compat.bitcast(ctx.sem, lo, tl.uint32), tl.int64)
        hi64 = _compat.cast(ctx.sem, hi, tl.int64)
        w = hi64.__lshift__(32, _semantic=ctx.sem).__or__(lo64, _semantic=ctx.sem)
        out.append(_from_int(ctx, w, elem))
    return tuple(out)


@register("st_vec", BACKEND)
def _st_vec(ctx, ptr, values, scope, semantic):
    elem = _elem(ctx, ptr)
    bits = elem.primitive_bitwidth
    halves = []
    for v in values:
        w = _as_int(ctx, v, elem)
        if bits == 32:
            halves.append(w)
        else:
            halves.append(_compat.cast(ctx.sem, w, tl.int32))                                   # low half
            halves.append(_compat.cast(ctx.sem, w.__rshift__(32, _semantic=ctx.sem), tl.int32))  # high half
    n = len(halves)
    tup, regs = _vec_regs(n)
    cache = {"": "", "volatile": "sc0 sc1"}.get(semantic, _VEC_CACHE.get(scope, "sc0 sc1"))
    lines = []
    if semantic == "release":
        if scope != "cta":
            lines.append(f"buffer_wbl2 {_VEC_CACHE[scope]}")
        lines.append("s_waitcnt vmcnt(0) lgkmcnt(0)")
    lines += [f"v_mov_b32 {r}, ${i + 2}" for i, r in enumerate(regs)]
    lines.append(f"global_store_dwordx{n} $1, {tup}, off {cache}".rstrip())
    if semantic == "volatile":
        lines.append("s_waitcnt vmcnt(0)")
    lines.append("v_mov_b32 $0, 0")
    cons = "=v,v," + ",".join(["v"] * n) + "," + ",".join("~{" + r + "}" for r in regs)
    ctx.asm("\n".join(lines), cons, [common.ptr_to_int(ctx, ptr)] + halves, tl.int32)
    return None


@register("atomic_add", BACKEND)
def _atomic_add(ctx, ptr, value, scope, semantic):
    elem = _elem(ctx, ptr)
    bits = elem.primitive_bitwidth
    if bits == 16:
        raise ctx.error("16-bit atomic_add is not supported", arg="ptr")
    if elem.is_floating():
        ty, tty = ("float", tl.float32) if bits == 32 else ("double", tl.float64)
    else:
        ty, tty = _INT[bits], _TL_INT[bits]
    v = _compat.cast(ctx.sem, ctx.tensor(value), elem)
    if not elem.is_floating() and elem != tty:
        v = _compat.bitcast(ctx.sem, v, tty)
    old = _call(ctx, f"ditron_atomic_add_{semantic}_{scope}_{ty}", [common.ptr_to_int(ctx, ptr), v],
                [tl.int64, tty], tty)
    return old if elem == tty else _compat.bitcast(ctx.sem, old, elem)


@register("atomic_cas", BACKEND)
def _atomic_cas(ctx, ptr, cmp, value, scope, semantic):
    elem = _elem(ctx, ptr)
    bits = elem.primitive_bitwidth
    if bits == 16:
        raise ctx.error("16-bit atomic_cas is not supported", arg="ptr")
    old = _call(ctx, f"ditron_atomic_cas_{semantic}_{scope}_{_INT[bits]}",
                [common.ptr_to_int(ctx, ptr), _as_int(ctx, cmp, elem), _as_int(ctx, value, elem)],
                [tl.int64, _TL_INT[bits], _TL_INT[bits]], _TL_INT[bits])
    return _from_int(ctx, old, elem)


@register("syncthreads", BACKEND)
def _syncthreads(ctx):
    _compat.debug_barrier(ctx.sem)
    return None


@register("fence", BACKEND)
def _fence(ctx, semantic, scope):
    _call(ctx, f"ditron_fence_{semantic}_{scope}", [], [], tl.int32)
    return None


@register("ballot_sync", BACKEND)
def _ballot_sync(ctx, mask, pred):
    return _call(ctx, "ditron_ballot", [_compat.cast(ctx.sem, ctx.tensor(pred), tl.int32)], [tl.int32], tl.int64)


def _shfl(mode):
    def rule(ctx, mask, value, lane):
        value = ctx.tensor(value)
        elem = value.type.element_ty if value.type.is_block() else value.type
        if elem.is_ptr() or elem.primitive_bitwidth not in (32, 64):
            raise ctx.error(f"shuffles move 32- or 64-bit values, not {elem}", arg="value")
        bits = elem.primitive_bitwidth
        r = _call(ctx, f"ditron_shfl_{mode}_{_INT[bits]}", [_as_int(ctx, value, elem), lane],
                  [_TL_INT[bits], tl.int32], _TL_INT[bits])
        return _from_int(ctx, r, elem)
    return rule


register("shfl_sync", BACKEND)(_shfl("idx"))
register("shfl_up_sync", BACKEND)(_shfl("up"))
register("shfl_down_sync", BACKEND)(_shfl("down"))
register("shfl_xor_sync", BACKEND)(_shfl("xor"))


@register("clock_ns", BACKEND)
def _clock_ns(ctx):
    return _call(ctx, "ditron_clock_ns", [], [], tl.int64)


@register("poll_timeout", BACKEND)
def _poll_timeout(ctx, start, ptr, expected, observed, pending):
    """Nothing: waits are not bounded on AMD yet (dl.wait neither)."""
    return None


@register("prefetch_l2", BACKEND)
def _prefetch_l2(ctx, ptr, mask):
    """Nothing: CDNA3 (gfx942) has no L2 prefetch instruction; the hint is dropped."""
    return None


@register("ffs", BACKEND)
def _ffs(ctx, x):
    x = ctx.tensor(x)
    elem = x.type.element_ty if x.type.is_block() else x.type
    if elem.primitive_bitwidth not in (32, 64):
        raise ctx.error(f"ffs takes 32- or 64-bit integers, not {elem}", arg="x")
    bits = elem.primitive_bitwidth
    return _call(ctx, f"ditron_ffs_{_INT[bits]}", [_as_int(ctx, x, elem)], [_TL_INT[bits]], tl.int32, is_pure=True)


# ---------------------------------------------------------------------------
# chunk level: rocSHMEM (the C exports of rocshmem_wrapper.cc, see shmem_table)
# ---------------------------------------------------------------------------
_T = shmem_table
#: rocSHMEM exports no signal wait that returns the word: its uint64 wait, then a signal fetch
_WAIT_FETCH = ("rocshmem_uint64_wait_until_then_signal_fetch", "uint64", ["ptr", "int", "uint64"])


def _rocshmem_signal_op(ctx, call_entry, args, extra, suffix):
    """shmem.signal_op: rocshmem_uint64_atomic_set / _add (dest, value, pe), the order of ``args``."""
    entry = _T.ROCSHMEM_PARTS[_T.ROCSHMEM_SIGNAL_ATOMIC[extra["sig_op"]]]
    return call_entry(ctx, "shmem.signal_op", entry, args, {}, suffix)


def _rocshmem_signal_wait_until(ctx, call_entry, args, extra, suffix):
    """shmem.signal_wait_until: rocshmem_uint64_wait_until (void), then rocshmem_signal_fetch."""
    if suffix:
        raise ctx.error(f"no {suffix} variant of the rocSHMEM signal wait")
    return call_entry(ctx, "shmem.signal_wait_until", _WAIT_FETCH, args, extra)


_shmem_call = shmem_rules.make_shmem_call(
    LIB, _T.ROCSHMEM, {"sig_op": _T.ROCSHMEM_SIGNAL, "cmp": _T.ROCSHMEM_CMP},
    composed={"shmem.signal_op": _rocshmem_signal_op, "shmem.signal_wait_until": _rocshmem_signal_wait_until},
    refused=_T.ROCSHMEM_REFUSED)
shmem_rules.register_shmem(BACKEND, _shmem_call)
shmem_rules.define_wrappers(LIB, _T.ROCSHMEM)
shmem_rules.define_wrappers(LIB, _T.ROCSHMEM_PARTS)
shmem_rules.define_wait_then_fetch(LIB, shmem_rules.wrapper_name(_WAIT_FETCH), _T.ROCSHMEM_PARTS["uint64_wait_until"],
                                   _T.ROCSHMEM_PARTS["signal_fetch"])
shmem_rules.define_signal_once(LIB, _T.ROCSHMEM, "llvm.amdgcn.workitem.id.x",
                               entries=[_T.ROCSHMEM_PARTS[k] for k in _T.ROCSHMEM_SIGNAL_ATOMIC.values()])
