"""The code of docs/zoo.md's porting walk-through: a plain Triton GEMM
(``matmul_kernel``, step 0) turned into a minimal AllGather-GEMM
(``ag_matmul_kernel``, step 3) with its host side (:func:`tutorial_ag_gemm`).
tests/test_ag_gemm.py runs both on the simulator against torch.  The zoo's
production version (persistent, TMA, reusable context) is kernels/ag_gemm.py.
"""
import torch
import triton
import triton.language as tl

import ditron
from ._common import cdiv
import ditron.language as dl


# step 0: a Triton GEMM as users write it (one program per output tile)
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0) // tl.cdiv(N, BLOCK_N)
    pid_n = tl.program_id(0) % tl.cdiv(N, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


# step 3: the same GEMM over all_gather(a): @ditron.jit, gather-swizzled tile
# order (step 1), a wait per tile on the segments it reads (step 2), rows of
# the other ranks from the symmetric gather buffer (step 3)
@ditron.jit
def ag_matmul_kernel(a_ptr, b_ptr, c_ptr, buf_ptr, ready_ptr, m, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    me = dl.rank()
    W = dl.num_ranks()
    M = W * m
    pid_m, pid_n = dl.swizzle_gather(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, me, W)          # step 1
    lo, hi = dl.tile_segments(pid_m, M, BLOCK_M, W)                                           # step 2
    tok = dl.wait(ready_ptr + lo, hi - lo + 1, "sys", "acquire", waitValue=1)
    buf = dl.consume_token(buf_ptr, tok)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    seg = tl.minimum(rows // m, W - 1)                                                        # step 3
    a_rows = tl.where(seg == me, a_ptr + (rows - seg * m) * K, buf + rows * K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows[:, None] + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def tutorial_ag_gemm(a, b, blocks=(16, 16, 32)):
    """One-shot host side (no reuse: a fresh buffer per call; see
    kernels/ag_gemm.py for the reusable context): every rank pushes its shard
    into every peer's slot with the copy engine and raises the peer's flag."""
    me, W = ditron.current_world().rank, ditron.current_world().world_size
    m, K = a.shape
    N = b.shape[1]
    buf = ditron.symm_zeros((W * m, K), a.dtype, name="tutorial.buf")
    ready = ditron.symm_zeros((W,), torch.int64, name="tutorial.ready")
    ready[me] = 1                         # the own segment is read from `a`
    ditron.barrier_all()                  # every rank's buffer and flags exist
    for k in range(1, W):
        peer = (me - k) % W
        ditron.rank_copy(buf[me * m:(me + 1) * m], a, dst_rank=peer)
        ditron.stream_write_value(ready[me:me + 1], 1, rank=peer)
    c = torch.empty((W * m, N), dtype=a.dtype, device=a.device)
    BM, BN, BK = blocks
    ag_matmul_kernel[(cdiv(W * m, BM) * cdiv(N, BN),)](a, b, c, buf, ready, m, N, K,
                                                                    BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK)
    ditron.barrier_all()                  # nobody frees its buffer while a peer still reads it
    return c
