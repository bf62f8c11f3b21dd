"""Vector loads and stores (``load_v4_b32``, ``st_v4_b32``, ``load_v2_b64``,
...) as one access each: a reader polling a 16-byte vector that a peer
rewrites never observes it torn (issue 56: the LL protocol's data word and
flag word are read together)."""
import torch
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import extra as lx


@ditron.jit
def vec_writer_kernel(symm_buf, K, VECTOR: tl.constexpr, WEAK: tl.constexpr):
    """Rewrite rank 0's 16 bytes K times: round k stores (k, k, k, k).  VECTOR: one st_v4_b32 per round;
    else four separate relaxed stores, the last word first (a writer that is not one access).  WEAK: weak
    vector stores (st_v4_u32: plain data for the race finder)."""
    dst = dl.symm_at(symm_buf, 0)
    for k in range(1, K + 1):
        if WEAK:
            lx.st_v4_u32(dst, k, k, k, k)
        elif VECTOR:
            lx.st_v4_b32(dst, k, k, k, k, scope="sys", semantic="relaxed")
        else:
            for j in tl.static_range(4):
                dl.st(dst + 3 - j, k, "sys", "relaxed")


@ditron.jit
def vec_reader_kernel(symm_buf, out, K, WEAK: tl.constexpr):
    """Poll the vector until it holds K; count the observations that memory never held.  The writer's states
    are (k, k, k, k) (vector writer) or old words below new ones, one round apart (word-by-word writer):
    a <= b <= c <= d <= a + 1 in every state either writer leaves."""
    bad = 0
    seen = 0
    a = 0
    while a != K:
        if WEAK:
            a, b, c, d = lx.load_v4_u32(symm_buf)
        else:
            a, b, c, d = lx.load_v4_b32(symm_buf, scope="sys", semantic="relaxed")
        ok = (a <= b) & (b <= c) & (c <= d) & (d <= a + 1)
        bad += tl.where(ok, 0, 1)
        seen += 1
    tl.store(out, bad)
    tl.store(out + 1, seen)


def concurrent_vector(world, K=400, vector=True, weak=False):
    """Rank 0 polls, rank 1 writes, at once; returns rank 0's (torn observations, polls)."""
    buf = ditron.symm_zeros((4,), torch.int32)
    out = torch.zeros(2, dtype=torch.int32, device=world.device)
    ditron.barrier_all()
    if world.rank == 0:
        vec_reader_kernel[(1,)](buf, out, K, weak)
    elif world.rank == 1:
        vec_writer_kernel[(1,)](buf, K, vector, weak)
    ditron.barrier_all()
    return out.cpu().tolist() if world.rank == 0 else None


@ditron.jit
def vec_misaligned_kernel(p, out):
    a, b, c, d = lx.load_v4_b32(p + 1)
    tl.store(out, a + b + c + d)


def misaligned(world):
    p = torch.zeros(8, dtype=torch.int32, device=world.device)
    out = torch.zeros(1, dtype=torch.int32, device=world.device)
    vec_misaligned_kernel[(1,)](p, out)


# a spin of failed compare-and-swaps (a spin lock / flag barrier) is a polling loop: it lends its turn ------------

@ditron.jit
def cas_spin_kernel(flag, out):
    pid = tl.program_id(0)
    if pid == 0:                      # waits for a later program of the same launch (one SM each on a GPU)
        while dl.atomic_cas(flag, 1, 2, "gpu", "acquire") != 1:
            pass
        tl.store(out, 1)
    else:
        dl.st(flag, 1, "gpu", "release")


def cas_spin(world):
    flag = torch.zeros(1, dtype=torch.int32, device=world.device)
    out = torch.zeros(1, dtype=torch.int32, device=world.device)
    cas_spin_kernel[(2,)](flag, out)
    return flag.item(), out.item()
