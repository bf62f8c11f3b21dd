"""Triton-distributed's packed multicast helpers (``multimem_ld_reduce_v4``,
``multimem_ld_reduce_p_v4``, ``multimem_st_b32`` / ``_b64`` / ``_v2`` / ``_v4``
/ ``_p_b32``) in kernels written the way its all-reduces use them: per thread,
one 128-bit reduction per loop step (``allreduce_one_shot_multimem``), a
reduction stored back through the multicast address as two packed 64-bit
words (``allreduce_two_shot_multimem``).  ditron's own kernels (nothing of
Triton-distributed is copied); results are compared bitwise with the GPU's
arithmetic: lanes summed in fp32 in rank order, rounded once to nearest
even."""
import torch
import triton
import triton.language as tl

import triton_dist
from triton_dist.language.extra import libshmem_device
from triton_dist.language.extra.cuda.language_extra import (multimem_ld_reduce_p_v4, multimem_ld_reduce_v4,
                                                            multimem_st_b32, multimem_st_b64, multimem_st_p_b32,
                                                            multimem_st_v2, multimem_st_v4, ntid, pack_b32_v2,
                                                            st_v4_b32, tid)
from triton_dist.utils import nvshmem_barrier_all_on_stream, nvshmem_create_tensor

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@triton_dist.jit
def one_shot_kernel(symm_in, out, elems):
    """allreduce_one_shot_multimem's loop: thread t reduces 16-byte vectors t, t + ntid, ..."""
    thread_idx = tid(axis=0)
    mc = libshmem_device.remote_mc_ptr(libshmem_device.NVSHMEMX_TEAM_NODE, symm_in)
    VEC: tl.constexpr = 128 // symm_in.dtype.element_ty.primitive_bitwidth
    for idx in range(thread_idx, elems // VEC, ntid(axis=0)):
        val0, val1, val2, val3 = multimem_ld_reduce_v4(mc + idx * VEC)
        st_v4_b32(out + idx * VEC, val0, val1, val2, val3)


@triton_dist.jit
def two_shot_kernel(symm, elems, rank, world_size):
    """allreduce_two_shot_multimem's loop: this rank reduces its slice and stores it into every copy."""
    per_rank = elems // world_size
    mc = libshmem_device.remote_mc_ptr(libshmem_device.NVSHMEMX_TEAM_NODE, symm) + rank * per_rank
    VEC: tl.constexpr = 128 // symm.dtype.element_ty.primitive_bitwidth
    for idx in range(tid(0), per_rank // VEC, ntid(0)):
        val0, val1, val2, val3 = multimem_ld_reduce_v4(mc + idx * VEC)
        multimem_st_b64(mc + idx * VEC, pack_b32_v2(val0, val1))
        multimem_st_b64(mc + idx * VEC + VEC // 2, pack_b32_v2(val2, val3))


def _data(rank, n, dtype):
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(n, generator=g)
    # ties for the final rounding: 1 + 2**-8 (+ 2**-8 ...) rounds differently when every partial sum is rounded
    x[:4] = torch.tensor([1.0, 2.0 ** -8, 3 * 2.0 ** -9, -1.0]) if rank == 0 else torch.tensor([2.0 ** -8] * 4)
    return x.to(dtype)


def _reference(world, n, dtype):
    first = world.rank - world.local_rank
    acc = torch.zeros(n, dtype=torch.float32)
    for q in range(first, first + world.local_world_size):          # fp32, in rank order, one rounding
        acc = acc + _data(q, n, dtype).float()
    return acc.to(dtype)


def one_shot(world, dtype_name, n=256):
    dtype = DTYPES[dtype_name]
    x = nvshmem_create_tensor((n,), dtype)
    x.copy_(_data(world.rank, n, dtype).to(world.device))
    out = torch.zeros(n, dtype=dtype, device=world.device)
    nvshmem_barrier_all_on_stream()
    one_shot_kernel[(1,)](x, out, n, num_warps=1)
    nvshmem_barrier_all_on_stream()
    ref = _reference(world, n, dtype)
    assert torch.equal(out.cpu().view(torch.int16 if dtype != torch.float32 else torch.int32),
                       ref.view(torch.int16 if dtype != torch.float32 else torch.int32)), (out[:8], ref[:8])
    return out[:4].float().tolist()


def two_shot(world, dtype_name, n=512):
    dtype = DTYPES[dtype_name]
    x = nvshmem_create_tensor((n,), dtype)
    x.copy_(_data(world.rank, n, dtype).to(world.device))
    nvshmem_barrier_all_on_stream()
    two_shot_kernel[(1,)](x, n, world.rank, world.world_size, num_warps=1)
    nvshmem_barrier_all_on_stream()
    ref = _reference(world, n, dtype)
    got = x.cpu().clone()
    nvshmem_barrier_all_on_stream()
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16)), (got[:8], ref[:8])
    return got[:4].float().tolist()


@triton_dist.jit
def stores_kernel(dst, src, mask_src):
    """Each form once, per thread (threads 0..4), plus the masked ones; dst is fp32, 64 words per form."""
    t = tid(0)
    mc = libshmem_device.remote_mc_ptr(libshmem_device.NVSHMEMX_TEAM_NODE, dst)
    if t < 4:
        w = tl.load(src + t * 4 + tl.arange(0, 4))
        w0 = tl.sum(tl.where(tl.arange(0, 4) == 0, w, 0))
        w1 = tl.sum(tl.where(tl.arange(0, 4) == 1, w, 0))
        w2 = tl.sum(tl.where(tl.arange(0, 4) == 2, w, 0))
        w3 = tl.sum(tl.where(tl.arange(0, 4) == 3, w, 0))
        multimem_st_b32(mc + t, w0.to(tl.int32, bitcast=True))
        multimem_st_v2(mc + 16 + t * 2, w0, w1)
        multimem_st_v4(mc + 32 + t * 4, w0, w1, w2, w3)
        multimem_st_b64(mc + 48 + t * 2, pack_b32_v2(w0.to(tl.int32, bitcast=True), w1.to(tl.int32, bitcast=True)))
        on = tl.load(mask_src + t) != 0
        multimem_st_p_b32(mc + 64 + t, w3.to(tl.int32, bitcast=True), on)


@triton_dist.jit
def masked_reduce_kernel(symm_in, out, mask_src):
    t = tid(0)
    mc = libshmem_device.remote_mc_ptr(libshmem_device.NVSHMEMX_TEAM_NODE, symm_in)
    if t < 4:
        on = tl.load(mask_src + t) != 0
        val0, val1, val2, val3 = multimem_ld_reduce_p_v4(mc + t * 4, on)
        st_v4_b32(out + t * 4, val0, val1, val2, val3)


def stores_and_masks(world):
    dst = nvshmem_create_tensor((80,), torch.float32)
    dst.zero_()
    src = torch.arange(16, dtype=torch.float32, device=world.device) + 0.5
    mask = torch.tensor([1, 0, 1, 0], dtype=torch.int32, device=world.device)
    nvshmem_barrier_all_on_stream()
    if world.local_rank == 0:                     # one rank broadcasts into every copy on its node
        stores_kernel[(1,)](dst, src, mask, num_warps=1)
    nvshmem_barrier_all_on_stream()
    got = dst.cpu().clone()
    s = src.cpu()
    assert torch.equal(got[:4], s[0::4]), got[:4]                                  # b32: word 0 of each thread
    assert torch.equal(got[16:24], torch.stack([s[0::4], s[1::4]], 1).reshape(-1)), got[16:24]      # v2
    assert torch.equal(got[32:48], s), got[32:48]                                                     # v4
    assert torch.equal(got[48:56], torch.stack([s[0::4], s[1::4]], 1).reshape(-1)), got[48:56]      # b64
    assert got[64:68].tolist() == [3.5, 0.0, 11.5, 0.0], got[64:68]                                   # p_b32
    # masked 128-bit reductions: masked-off threads read nothing and get zero words
    x = nvshmem_create_tensor((16,), torch.float32)
    x.copy_(torch.arange(16, dtype=torch.float32) * (world.rank + 1))
    out = torch.full((16,), -1.0, device=world.device)
    nvshmem_barrier_all_on_stream()
    masked_reduce_kernel[(1,)](x, out, mask, num_warps=1)
    nvshmem_barrier_all_on_stream()
    k = world.local_world_size
    first = world.rank - world.local_rank
    total = torch.arange(16, dtype=torch.float32) * sum(q + 1 for q in range(first, first + k))
    want = torch.where(torch.tensor([1, 0, 1, 0]).repeat_interleave(4).bool(), total, torch.zeros(16))
    assert torch.equal(out.cpu(), want), (out, want)
    return "ok"


@triton_dist.jit
def misaligned_kernel(symm_in, out):
    mc = libshmem_device.remote_mc_ptr(libshmem_device.NVSHMEMX_TEAM_NODE, symm_in)
    val0, val1, val2, val3 = multimem_ld_reduce_v4(mc + 2)          # bf16: 4 bytes past a 16-byte boundary
    st_v4_b32(out, val0, val1, val2, val3)


def misaligned(world):
    x = nvshmem_create_tensor((64,), torch.bfloat16)
    out = torch.zeros(8, dtype=torch.bfloat16, device=world.device)
    try:
        misaligned_kernel[(1,)](x, out)
    except Exception as e:                        # noqa: BLE001 (the message is the result)
        return str(e)
    return "no error"
