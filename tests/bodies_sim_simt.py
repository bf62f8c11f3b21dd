"""Bodies of tests/test_sim_simt_region.py: Triton-distributed's SIMT regions (``dl.simt_exec_region``) on the
simulator, per thread as on a GPU: per-thread CAS loops and ld/st across ranks, per-thread atomics, and a
``syncthreads`` inside the region that every thread reaches."""
import torch
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language.extra import atomic_add, atomic_cas, ld, st, __syncthreads


@ditron.jit
def simt_barrier_kernel(flag_ptr, out_ptr, rank, world_size):
    with dl.simt_exec_region() as (thread_idx, block_size):
        if thread_idx < world_size:          # thread i signals peer i, then waits for peer i's signal
            while atomic_cas(dl.symm_at(flag_ptr + rank, thread_idx), 0, 1, "sys", "release") != 0:
                pass
        if thread_idx < world_size:
            while atomic_cas(flag_ptr + thread_idx, 1, 0, "sys", "acquire") != 1:
                pass
        atomic_add(out_ptr + 1, 1, "gpu", "relaxed")              # every thread of the region adds once
        if thread_idx % 2 == 1:
            atomic_add(out_ptr + 2, thread_idx, "gpu", "relaxed")  # the odd threads add their index
        __syncthreads()                                           # all threads' adds before any read below
        if thread_idx == 0:
            st(out_ptr + 3, ld(out_ptr + 1, "gpu", "acquire"), "gpu", "release")
        if thread_idx == block_size - 1:
            st(out_ptr + 4, block_size, "gpu", "release")


def simt_barrier(world, rounds=2):
    n = world.world_size
    flag = ditron.symm_zeros((n,), torch.int32, name="simt_flags")
    outs = []
    for _ in range(rounds):
        out = ditron.symm_zeros((5,), torch.int32, name="simt_out")
        ditron.barrier_all()
        simt_barrier_kernel[(1,)](flag, out, world.rank, n, num_warps=2)
        outs.append(out.cpu().tolist())
    assert flag.cpu().tolist() == [0] * n          # every peer's signal consumed: the barrier completed
    return outs
