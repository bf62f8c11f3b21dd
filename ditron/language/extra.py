"""Triton-distributed's thread-level helpers (its ``language_extra`` module),
with Triton-distributed's names, argument orders and defaults, built on
``ditron.language``'s primitives (``ditron.language.extra``; also importable
as ``triton_dist.language.extra.language_extra`` and
``triton_dist.language.extra.cuda.language_extra``, see docs/porting.md).

Each helper is one or more of ditron's own ops (``dl.tid``, ``dl.ld``,
``dl.st``, ``dl.atomic_*``, ...) or plain Triton loads and stores, so it
compiles for every target and runs on the simulator wherever those ops do.
Differences from Triton-distributed's inline-PTX versions:

* the defaults here are Triton-distributed's (``ld`` / ``st`` / ``atomic_add``
  relaxed at GPU scope, ``fence`` sequentially consistent), not
  ``ditron.language``'s stronger ones;
* the vector helpers (``load_v4_u32``, ``st_v4_b32``, ``load_v2_b64``, ...)
  are one vector access each (the ``ld_vec`` / ``st_vec`` ops: one
  ``ld``/``st.global.v4`` / ``.v2`` on NVIDIA, one 128-bit global access on AMD,
  one access on the simulator, which checks the alignment a GPU faults on);
* the packed multicast helpers (``multimem_ld_reduce_v4``, ``multimem_st_*``)
  are distributed-IR ops of their own (per thread, like Triton-distributed's
  inline PTX; relaxed at system scope where Triton-distributed leaves the
  ordering weak), so the simulator runs them.

Names that Triton-distributed has and ditron does not (shared-memory and TMA
helpers, ``extern_call``, SIMT vectors) raise an ``AttributeError`` that says
what to use instead (:func:`missing`).
"""
from __future__ import annotations

import triton.language as tl

from .. import _compat
from ..errors import DitronCompileError
from . import core as _dl
from .semantic import emit as _emit

builtin = _compat.builtin


def _c(x):
    return _compat.unwrap(x)


# ---------------------------------------------------------------------------
# thread indices
# ---------------------------------------------------------------------------

@builtin
def tid(axis, _semantic=None, _generator=None):
    """``threadIdx.{x,y,z}`` (``dl.tid``)."""
    return _dl.tid(axis, _semantic=_semantic, _generator=_generator)


@builtin
def ntid(axis, _semantic=None, _generator=None):
    """``blockDim.{x,y,z}``: threads in the program along ``axis`` (Triton
    programs are 1-D, so 1 for axes 1 and 2; ``dl.num_threads``)."""
    if _c(axis) not in (0, 1, 2):
        raise DitronCompileError(f"ntid(axis): axis must be 0, 1 or 2, not {_c(axis)!r}", op="num_threads")
    if _c(axis) != 0:
        return _compat.constexpr(1)
    return _dl.num_threads(_semantic=_semantic, _generator=_generator)


def _launch_num_warps(sem):
    if _compat.is_interpreter(sem):          # the simulator: the launch's num_warps
        from ..lowering import provided
        return int(getattr(provided("launch"), "num_warps", 4) or 4)
    return int(getattr(_compat.builder_options(sem), "num_warps", 4) or 4)


@builtin
def num_warps(_semantic=None, _generator=None):
    """The kernel's ``num_warps``, a constexpr (Triton-distributed's ``language_extra.num_warps``)."""
    return _compat.constexpr(_launch_num_warps(_semantic))


def _warp_size(sem):
    from ..target import target_from_semantic
    t = target_from_semantic(sem)
    return 32 if t.backend == "sim" else int(t.warp_size)     # (the simulator's programs have 32-thread warps)


@builtin
def threads_per_warp(_semantic=None, _generator=None):
    """Threads of a warp (32) or wavefront (64 on AMD), a constexpr."""
    return _compat.constexpr(_warp_size(_semantic))


@builtin
def num_threads(_semantic=None, _generator=None):
    """``num_warps() * threads_per_warp()``, a constexpr."""
    return _compat.constexpr(_launch_num_warps(_semantic) * _warp_size(_semantic))


@builtin
def laneid(_semantic=None, _generator=None):
    """Lane in the warp / wavefront (``dl.laneid``)."""
    return _dl.laneid(_semantic=_semantic, _generator=_generator)


@builtin
def __syncthreads(_semantic=None, _generator=None):
    """``__syncthreads()`` (``dl.syncthreads``)."""
    return _dl.syncthreads(_semantic=_semantic, _generator=_generator)


# ---------------------------------------------------------------------------
# loads, stores, atomics, fences with Triton-distributed's defaults
# ---------------------------------------------------------------------------

@builtin
def ld(ptr, scope="gpu", semantic="relaxed", _semantic=None, _generator=None):
    """Load with ``semantic`` (``"relaxed"``, default, or ``"acquire"``) at
    ``scope`` (``dl.ld``)."""
    return _dl.ld(ptr, scope, semantic, _semantic=_semantic, _generator=_generator)


@builtin
def ld_acquire(ptr, scope="gpu", _semantic=None, _generator=None):
    """``ld(ptr, scope, "acquire")``."""
    return _dl.ld(ptr, scope, "acquire", _semantic=_semantic, _generator=_generator)


@builtin
def ld_b32(ptr, _semantic=None, _generator=None):
    """Relaxed GPU-scope load of an int32 word."""
    return _dl.ld(ptr, "gpu", "relaxed", _semantic=_semantic, _generator=_generator)


@builtin
def st(ptr, val, scope="gpu", semantic="relaxed", _semantic=None, _generator=None):
    """Store with ``semantic`` (``"relaxed"``, default, or ``"release"``) at
    ``scope`` (``dl.st``)."""
    return _dl.st(ptr, val, scope, semantic, _semantic=_semantic, _generator=_generator)


@builtin
def st_b32(ptr, val0, _semantic=None, _generator=None):
    """Relaxed GPU-scope store of an int32 word."""
    return _dl.st(ptr, val0, "gpu", "relaxed", _semantic=_semantic, _generator=_generator)


@builtin
def atomic_add(ptr, value, scope="gpu", semantic="relaxed", _semantic=None, _generator=None):
    """Atomic add returning the old value (``dl.atomic_add``)."""
    return _dl.atomic_add(ptr, value, scope, semantic, _semantic=_semantic, _generator=_generator)


@builtin
def atomic_cas(ptr, value, target_value, scope, semantic, _semantic=None, _generator=None):
    """Compare ``*ptr`` with ``value``, store ``target_value`` if equal;
    returns the old value.  ``scope`` and ``semantic`` are required, as in
    Triton-distributed (``dl.atomic_cas``)."""
    return _dl.atomic_cas(ptr, value, target_value, scope, semantic, _semantic=_semantic, _generator=_generator)


@builtin
def fence(semantic="sc", scope="gpu", _semantic=None, _generator=None):
    """``fence.<semantic>.<scope>`` (default ``sc``, ``gpu``; ``dl.fence``)."""
    return _dl.fence(semantic, scope, _semantic=_semantic, _generator=_generator)


@builtin
def __fence(semantic="sc", scope="gpu", _semantic=None, _generator=None):
    """Same as :func:`fence`."""
    return _dl.fence(semantic, scope, _semantic=_semantic, _generator=_generator)


@builtin
def membar(scope="cta", _semantic=None, _generator=None):
    """``membar.{cta,gl,sys}``: a sequentially consistent fence at ``scope``
    (``"cta"``, ``"gpu"``/``"gl"``, ``"sys"``)."""
    scope = {"gl": "gpu"}.get(_c(scope), _c(scope))
    return _dl.fence("sc", scope, _semantic=_semantic, _generator=_generator)


# warp-level ----------------------------------------------------------------

@builtin
def __ballot_sync(mask, predicate, _semantic=None, _generator=None):
    return _dl.ballot_sync(mask, predicate, _semantic=_semantic, _generator=_generator)


@builtin
def __shfl_sync_i32(mask, value, laneid, _semantic=None, _generator=None):
    return _dl.shfl_sync(mask, value, laneid, _semantic=_semantic, _generator=_generator)


@builtin
def __shfl_up_sync_i32(mask, value, delta, _semantic=None, _generator=None):
    return _dl.shfl_up_sync(mask, value, delta, _semantic=_semantic, _generator=_generator)


@builtin
def __shfl_down_sync_i32(mask, value, delta, _semantic=None, _generator=None):
    return _dl.shfl_down_sync(mask, value, delta, _semantic=_semantic, _generator=_generator)


@builtin
def __shfl_xor_sync_i32(mask, value, delta, _semantic=None, _generator=None):
    return _dl.shfl_xor_sync(mask, value, delta, _semantic=_semantic, _generator=_generator)


# clocks --------------------------------------------------------------------

@builtin
def globaltimer(_semantic=None, _generator=None):
    """Nanoseconds (``dl.clock_ns``; only differences are meaningful)."""
    return _dl.clock_ns(_semantic=_semantic, _generator=_generator)


# ---------------------------------------------------------------------------
# tile level with Triton-distributed's defaults
# ---------------------------------------------------------------------------

@builtin
def notify(ptr, rank, signal=1, sig_op="set", comm_scope="inter_node", _semantic=None, _generator=None):
    """``dl.notify`` with Triton-distributed's default ``comm_scope="inter_node"``
    (an OpenSHMEM signal operation: 64-bit signal words, NVSHMEM / rocSHMEM on
    GPUs).  ``triton_dist.language.notify`` is this function."""
    return _dl.notify(ptr, rank, signal, sig_op, comm_scope, _semantic=_semantic, _generator=_generator)


# ---------------------------------------------------------------------------
# vector loads and stores: one access per vector (see the module docstring)
# ---------------------------------------------------------------------------

_SUFFIX = {"u32": tl.uint32, "s32": tl.int32, "b32": tl.int32, "b64": tl.int64}


def _as_ptr(ptr, ty, sem):
    return tl.cast(ptr, tl.pointer_type(ty), bitcast=True, _semantic=sem)


def _vec_attrs(name, scope, semantic):
    scope, semantic = scope or "", semantic or ""
    if scope and not semantic:
        raise DitronCompileError(f"{name}: scope={scope!r} needs a semantic (\"relaxed\" / \"acquire\" for "
                                 "loads, \"relaxed\" / \"release\" for stores): PTX has no scope on a weak "
                                 "access", op=name, arg="scope")
    if semantic in ("relaxed", "acquire", "release") and not scope:
        scope = "gpu"
    if semantic == "volatile":
        scope = ""
    return {"scope": scope, "semantic": semantic}


def _load_words(ptr, n, suffix, scope, semantic, sem, gen, name):
    """One vector access of ``n`` words (the ``ld_vec`` op): a GPU performs an aligned 16-byte access of one
    thread as one access, which LL protocols (a data word and its flag word) rely on."""
    p = _as_ptr(ptr, _SUFFIX[suffix], sem)
    words = _emit("ld_vec", {"ptr": p}, dict(words=n, **_vec_attrs(name, scope, semantic)), sem, gen,
                  params=("ptr",))
    return tl.tuple(list(words))


def _store_words(ptr, vals, suffix, scope, semantic, sem, gen, name):
    ty = _SUFFIX[suffix]
    p = _as_ptr(ptr, ty, sem)
    words = []
    for v in vals:
        vt = _compat.to_tensor(sem, v).dtype
        # a float word of the same width is stored as its bits (a b32 register), as the PTX vector store does
        words.append(tl.cast(v, ty, bitcast=vt.is_floating() and vt.primitive_bitwidth == ty.primitive_bitwidth,
                             _semantic=sem))
    # every calling thread stores (as st.global.v4 does), one access per vector
    _emit("st_vec", {"ptr": p, "values": tuple(words)}, _vec_attrs(name, scope, semantic), sem, gen,
          params=("ptr",))


@builtin
def load_v4_u32(ptr, _semantic=None, _generator=None):
    """Four uint32 words at ``ptr`` (``ld.global.v4.u32``), as a tuple."""
    return _load_words(ptr, 4, "u32", "", "", _semantic, _generator, "load_v4_u32")


@builtin
def load_v4_b32(ptr, scope="", semantic="", _semantic=None, _generator=None):
    """Four int32 words at ``ptr`` (16-byte aligned), one access
    (``ld.global{.semantic}{.scope}.v4.b32``): weak by default, or
    ``semantic`` ``"relaxed"`` / ``"acquire"`` / ``"volatile"`` at ``scope``
    (``"gpu"`` when only the semantic is given)."""
    return _load_words(ptr, 4, "b32", _c(scope), _c(semantic), _semantic, _generator, "load_v4_b32")


@builtin
def load_v4_s32(ptr, _semantic=None, _generator=None):
    """Four int32 words at ``ptr``, as a tuple."""
    return _load_words(ptr, 4, "s32", "", "", _semantic, _generator, "load_v4_s32")


@builtin
def load_v2_b64(ptr, _semantic=None, _generator=None):
    """Two int64 words at ``ptr`` (16-byte aligned; one
    ``ld.volatile.global.v2.b64``), as a tuple."""
    return _load_words(ptr, 2, "b64", "", "volatile", _semantic, _generator, "load_v2_b64")


@builtin
def st_v4_u32(ptr, val0, val1, val2, val3, _semantic=None, _generator=None):
    """Store four uint32 words at ``ptr``."""
    _store_words(ptr, (val0, val1, val2, val3), "u32", "", "", _semantic, _generator, "st_v4_u32")


@builtin
def st_v4_b32(ptr, val0, val1, val2, val3, scope="", semantic="", _semantic=None, _generator=None):
    """Store four int32 words at ``ptr`` (16-byte aligned), one access: weak
    by default, or ``semantic`` ``"relaxed"`` / ``"release"`` /
    ``"volatile"`` at ``scope``."""
    _store_words(ptr, (val0, val1, val2, val3), "b32", _c(scope), _c(semantic), _semantic, _generator,
                 "st_v4_b32")


@builtin
def st_v2_u32(ptr, val0, val1, _semantic=None, _generator=None):
    """Store two uint32 words at ``ptr`` (8-byte aligned; one
    ``st.volatile.global.v2.b32``)."""
    _store_words(ptr, (val0, val1), "u32", "", "volatile", _semantic, _generator, "st_v2_u32")


@builtin
def pack_b32_v2(val0, val1, _semantic=None, _generator=None):
    """``{val1, val0}`` as one 64-bit word (``mov.b64 $0, {$1, $2}``: ``val0``
    in the low half), ``uint64``."""
    lo = tl.cast(tl.cast(val0, tl.uint32, bitcast=True, _semantic=_semantic), tl.uint64, _semantic=_semantic)
    hi = tl.cast(tl.cast(val1, tl.uint32, bitcast=True, _semantic=_semantic), tl.uint64, _semantic=_semantic)
    return hi.__lshift__(32, _semantic=_semantic).__or__(lo, _semantic=_semantic)


# ---------------------------------------------------------------------------
# packed multicast (NVLink SHARP) accesses, per thread
# ---------------------------------------------------------------------------

def _mm_elem(ptr, name, sem):
    t = _compat.to_tensor(sem, ptr).type
    t = t.element_ty if t.is_block() else t
    if not t.is_ptr():
        raise DitronCompileError(f"{name}: expected a pointer (from shmem.remote_mc_ptr), got {t}", op=name,
                                 arg="ptr")
    return t.element_ty


def _mm_ld(ptr, mask, acc_dtype, name, sem, gen):
    elem = _mm_elem(ptr, name, sem)
    if not (elem.is_fp32() or elem.is_fp16() or elem.is_bf16()):
        raise DitronCompileError(f"{name}: only fp16 / bf16 / fp32 pointers are supported, not {elem} (as in "
                                 "Triton-distributed)", op=name, arg="ptr")
    acc = _c(acc_dtype)
    if acc is not None and acc != tl.float32:
        raise DitronCompileError(f"{name}: acc_dtype must be tl.float32 or None, not {acc} (fp16 / bf16 lanes "
                                 "accumulate in fp32; Triton-distributed refuses fp16 accumulation as well)",
                                 op=name, arg="acc_dtype")
    words = _emit("multimem_ld_reduce_v4", {"ptr": ptr, "mask": mask}, {"acc_dtype": acc}, sem, gen,
                  params=("ptr", "mask", "acc_dtype"))
    return tl.tuple(list(words))


@builtin
def multimem_ld_reduce_v4(ptr, acc_dtype=None, _semantic=None, _generator=None):
    """The 16 bytes at the multicast address ``ptr`` summed over every rank's
    copy on the node (``multimem.ld_reduce.relaxed.sys.global.add[.acc::f32].v4``),
    per thread: a tuple of four 32-bit words -- fp32 values for an fp32
    pointer, int32 words of two packed fp16 / bf16 lanes (the lower address in
    the low half) otherwise.  16-bit lanes accumulate in fp32 and are rounded
    once (to nearest even).  ``ptr`` must be 16-byte aligned."""
    return _mm_ld(ptr, None, acc_dtype, "multimem_ld_reduce_v4", _semantic, _generator)


@builtin
def multimem_ld_reduce_p_v4(ptr, mask, _semantic=None, _generator=None):
    """:func:`multimem_ld_reduce_v4` where ``mask`` holds (acquire, system
    scope); elsewhere no access and the words are 0.  ditron branches around
    the instruction instead of predicating it (Triton-distributed's source
    notes that ptxas mishandles a predicated multimem)."""
    return _mm_ld(ptr, mask, None, "multimem_ld_reduce_p_v4", _semantic, _generator)


def _mm_st(ptr, values, mask, form, name, sem, gen):
    elem = _mm_elem(ptr, name, sem)
    if form in ("v2", "v4") and not (elem.is_fp32() or elem.is_fp16() or elem.is_bf16()):
        raise DitronCompileError(f"{name}: only fp16 / bf16 / fp32 pointers are supported, not {elem} (as in "
                                 "Triton-distributed)", op=name, arg="ptr")
    bits = 64 if form == "b64" else 32
    for i, v in enumerate(values):
        t = _compat.to_tensor(sem, v).type
        t = t.element_ty if t.is_block() else t
        if t.primitive_bitwidth != bits:
            raise DitronCompileError(f"{name}: value {i} is {t}; a {bits}-bit value is needed (its bits are "
                                     "stored)", op=name, arg=f"val{i}")
    _emit("multimem_st_packed", {"ptr": ptr, "values": tuple(values), "mask": mask}, {"form": form}, sem, gen,
          params=("ptr",))


@builtin
def multimem_st_b32(ptr, val0, _semantic=None, _generator=None):
    """Store the 32 bits of ``val0`` at the multicast address ``ptr``: every
    rank's copy on the node receives them (``multimem.st.relaxed.sys.global.b32``), per thread."""
    _mm_st(ptr, (val0,), None, "b32", "multimem_st_b32", _semantic, _generator)


@builtin
def multimem_st_b64(ptr, val0, _semantic=None, _generator=None):
    """Store the 64 bits of ``val0`` (e.g. :func:`pack_b32_v2`) at the
    multicast address ``ptr`` (8-byte aligned), per thread."""
    _mm_st(ptr, (val0,), None, "b64", "multimem_st_b64", _semantic, _generator)


@builtin
def multimem_st_v2(ptr, val0, val1, _semantic=None, _generator=None):
    """Store two 32-bit words (fp32 values, or packed fp16 / bf16 pairs) at
    the multicast address ``ptr`` (8-byte aligned), per thread."""
    _mm_st(ptr, (val0, val1), None, "v2", "multimem_st_v2", _semantic, _generator)


@builtin
def multimem_st_v4(ptr, val0, val1, val2, val3, _semantic=None, _generator=None):
    """Store four 32-bit words (fp32 values, or packed fp16 / bf16 pairs) at
    the multicast address ``ptr`` (16-byte aligned), per thread."""
    _mm_st(ptr, (val0, val1, val2, val3), None, "v4", "multimem_st_v4", _semantic, _generator)


@builtin
def multimem_st_p_b32(ptr, val, mask, _semantic=None, _generator=None):
    """:func:`multimem_st_b32` where ``mask`` holds (a branch around the
    store, not a predicate: see :func:`multimem_ld_reduce_p_v4`)."""
    _mm_st(ptr, (val,), mask, "b32", "multimem_st_p_b32", _semantic, _generator)


#: Triton-distributed names ditron does not define, and what to use instead
MISSING = {
    "ld_vector": "dl.ld on a tile of pointers (ptr + tl.arange(0, N))",
    "st_vector": "dl.st on a tile of pointers",
    "tma_sync": "Triton's tensor descriptors (tl.make_tensor_descriptor) and their loads/stores",
    "red_release": "dl.notify(ptr, rank, signal, sig_op='add') or dl.atomic_add(ptr, v, 'gpu', 'release')",
    "arrive_inc": "dl.atomic_add(ptr, v, scope, 'release') guarded by `if dl.tid(0) == 0:` after dl.syncthreads()",
    "arrive_inc_asm": "dl.atomic_add(ptr, v, scope, 'release')",
    "atomic_add_per_warp": "dl.atomic_add guarded by `if dl.laneid() == 0:`",
    "smid": "nothing: ditron does not expose the SM id",
    "globaltimer_lo": "globaltimer() / dl.clock_ns()",
    "globaltimer_hi": "globaltimer() / dl.clock_ns()",
    "pack": "tl.cast(..., bitcast=True) on tiles",
    "unpack": "tl.cast(..., bitcast=True) on tiles",
    "extern_call": "tl.inline_asm_elementwise or a @ditron.jit helper",
    "vector": "tiles (tl.arange) instead of SIMT vectors",
    "make_vector": "tiles (tl.arange) instead of SIMT vectors",
    "zeros_vector": "tl.zeros",
    "extract": "tiles: tl.sum(tl.where(idx == i, x, 0))",
    "insert": "tiles: tl.where(idx == i, v, x)",
    "allocate_smem": "tiles (Triton allocates shared memory itself)",
    "smem_load": "tiles (Triton allocates shared memory itself)",
    "smem_store": "tiles (Triton allocates shared memory itself)",
    "smem_index": "tiles (Triton allocates shared memory itself)",
    "smem_get_ptr": "tiles (Triton allocates shared memory itself)",
    "smem_dealloc": "tiles (Triton allocates shared memory itself)",
    "get_smem_shared_address_u32": "tiles (Triton allocates shared memory itself)",
    "SharedMemoryDesc": "tiles (Triton allocates shared memory itself)",
    "SMEM_GENERIC_POINTER_ADDR_SPACE": "tiles (Triton allocates shared memory itself)",
    "tma": "Triton's tensor descriptors (tl.make_tensor_descriptor)",
}


def missing(module, name):
    """The ``AttributeError`` for a Triton-distributed name that ditron does
    not define (module ``__getattr__`` of the alias modules)."""
    if name.startswith("__") and name.endswith("__"):
        return AttributeError(name)
    instead = MISSING.get(name)
    if instead is None:
        return AttributeError(f"module {module!r} has no attribute {name!r}: ditron does not provide this "
                              "Triton-distributed name (docs/porting.md lists what it provides)")
    return AttributeError(f"{module}.{name} is Triton-distributed's and has no ditron equivalent; use {instead} "
                          "(docs/porting.md)")


__all__ = ["notify", "tid", "ntid", "num_warps", "threads_per_warp", "num_threads", "laneid", "__syncthreads", "ld", "ld_acquire", "ld_b32", "st", "st_b32", "atomic_add",
           "atomic_cas", "fence", "__fence", "membar", "__ballot_sync", "__shfl_sync_i32", "__shfl_up_sync_i32",
           "__shfl_down_sync_i32", "__shfl_xor_sync_i32", "globaltimer", "load_v4_u32", "load_v4_b32",
           "load_v4_s32", "load_v2_b64", "st_v4_u32", "st_v4_b32", "st_v2_u32", "pack_b32_v2",
           "multimem_ld_reduce_v4", "multimem_ld_reduce_p_v4", "multimem_st_b64", "multimem_st_b32",
           "multimem_st_v2", "multimem_st_v4", "multimem_st_p_b32"]
