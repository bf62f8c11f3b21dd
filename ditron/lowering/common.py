"""Lowering pieces that both GPU backends use (world access, pointer
translation, token dependencies, SHMEM argument handling).  Backend modules
call these from their own rules; each backend still registers its own rule."""
from __future__ import annotations

import triton.language as tl

from .. import _compat
from ..libs import NeedLibrary, nvshmem_linkable, shmem_library
from . import devlib, shmem_table

RANK_FIELD = {-1: "rank", 0: "local_rank", 1: "node"}
SIZE_FIELD = {-1: "world_size", 0: "local_world_size", 1: "nnodes"}


def world_field(ctx, lib, field: str):
    idx = devlib.WORLD_FIELDS[field]
    v = ctx.call(lib, "ditron_world_get", [idx], [tl.int32], tl.int64, is_pure=True)
    return _compat.cast(ctx.sem, v, tl.int32)


def pointer_elem_bytes(ctx, ptr, arg="ptr"):
    t = ptr.type.element_ty if ptr.type.is_block() else ptr.type
    elem = t.element_ty
    if elem.is_block():
        raise ctx.error("block pointers (tl.make_block_ptr) are not supported; pass a tensor of pointers", arg=arg)
    if elem.is_ptr():
        return 8
    return max(1, elem.primitive_bitwidth // 8)


def symm_at(ctx, lib, ptr, rank):
    """``ptr`` moved to ``rank``'s copy of the symmetric heap.

    The world descriptor stores heap deltas in HEAP_ALIGN units; multiplying
    by a constant keeps Triton's alignment analysis intact, so vectorised
    loads/stores through the remote pointer stay vectorised."""
    sem = ctx.sem
    delta = ctx.call(lib, "ditron_symm_delta", [rank], [tl.int32], tl.int64, is_pure=True)
    elems = devlib.HEAP_ALIGN // pointer_elem_bytes(ctx, ptr)
    return _compat.add(sem, ptr, _compat.mul(sem, delta, elems))


def is_tensor_descriptor(value):
    """``value`` is a tensor descriptor (``tl.make_tensor_descriptor`` or a host ``TensorDescriptor`` argument)."""
    return isinstance(_compat.unwrap(value), getattr(tl.core, "tensor_descriptor_base", ()))


def consume_token(ctx, value, token):
    """``value`` with a data dependency on ``token`` (which is 0 at run time
    but opaque to the compiler).  Pointers get ``token * 128`` elements added,
    which keeps their alignment for the vectoriser."""
    sem = ctx.sem
    if is_tensor_descriptor(value):
        # a descriptor value cannot carry an arithmetic dependency on stock Triton: it is passed through, and
        # its loads are ordered after the wait by the wait itself (a barrier and a memory-clobbering asm)
        return value
    value = ctx.tensor(value)
    tok = _compat.cast(sem, ctx.tensor(token), tl.int32)
    t = value.type.element_ty if value.type.is_block() else value.type
    if t.is_ptr():
        return _compat.add(sem, value, _compat.mul(sem, tok, 128))
    if t.is_int():
        return _compat.add(sem, value, _compat.cast(sem, tok, t))
    if t.is_floating():
        ity = {16: tl.int16, 32: tl.int32, 64: tl.int64}.get(t.primitive_bitwidth)
        if ity is None:
            raise ctx.error(f"cannot attach a token to {t} values", arg="value")
        as_int = _compat.bitcast(sem, value, ity)
        as_int = _compat.add(sem, as_int, _compat.cast(sem, tok, ity))
        return _compat.bitcast(sem, as_int, t)
    raise ctx.error(f"cannot attach a token to {t} values", arg="value")


def signal_width(ctx, ptr, arg):
    t = ptr.type.element_ty if ptr.type.is_block() else ptr.type
    elem = t.element_ty
    if not elem.is_int() or elem.primitive_bitwidth not in (32, 64):
        raise ctx.error(f"signal words must be int32/uint32 or int64/uint64, not {elem}", arg=arg)
    return elem.primitive_bitwidth


def link_library(target):
    """(name, path) of the SHMEM library to link for ``target``: on NVIDIA, the
    part of NVSHMEM's bitcode that ditron's NVSHMEM table can reach
    (:func:`ditron.libs.nvshmem_linkable`)."""
    name, path = shmem_library(target)
    if target.backend == "cuda":
        path = nvshmem_linkable(path, {entry[0] for entry in shmem_table.NVSHMEM.values()})
    return name, path


def require_shmem(ctx):
    """(name, path) of the SHMEM library; raises NeedLibrary when this
    compilation has not attached it (the driver then attaches it and retries)."""
    name, path = link_library(ctx.target)
    if not ctx.has_library(name):
        raise NeedLibrary(name)
    return name, path


def ptr_to_int(ctx, ptr):
    return _compat.cast(ctx.sem, ctx.tensor(ptr), tl.int64)


def int_to_ptr_like(ctx, value, like):
    return _compat.cast(ctx.sem, value, like.type)


def slot_word(ctx, ptr, arg):
    """Scoreboard slots and work-queue counters are int32 words."""
    t = ptr.type.element_ty if ptr.type.is_block() else ptr.type
    elem = t.element_ty
    if not elem.is_int() or elem.primitive_bitwidth != 32:
        raise ctx.error(f"scoreboard slots and work counters are int32 words, not {elem}", arg=arg)


def fetch_task(ctx, counter_ptr):
    """One ticket per program: Triton's scalar atomic add (one thread performs
    the acq_rel / gpu-scope add, the old value is broadcast through shared
    memory to every thread of the program)."""
    ptr = ctx.tensor(counter_ptr)
    slot_word(ctx, ptr, "counter_ptr")
    return _compat.atomic_add_scalar(ctx.sem, ptr, 1, "acq_rel", "gpu")
