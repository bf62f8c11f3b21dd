"""Test body (run on every rank; see conftest.py) for the tile-order primitives in a real kernel:
``dl.rank()``, ``dl.num_ranks()`` and ``dl.num_ranks(1)`` feed ``dl.swizzle_gather`` / ``dl.swizzle_scatter``,
and every program's tile equals the host twin's order for this rank."""
import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import swizzle as S


@ditron.jit
def _order_kernel(out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    rank = dl.rank()
    world = dl.num_ranks()
    nnodes = dl.num_ranks(1)
    gm, gn = dl.swizzle_gather(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M)
    sm, sn = dl.swizzle_scatter(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M)
    tl.store(out_ptr + 4 * pid, gm)
    tl.store(out_ptr + 4 * pid + 1, gn)
    tl.store(out_ptr + 4 * pid + 2, sm)
    tl.store(out_ptr + 4 * pid + 3, sn)


def tile_order_matches_twin(world):
    M, N = world.world_size * 23 + 3, 40
    total = triton.cdiv(M, 16) * triton.cdiv(N, 16)
    out = torch.full((4 * total,), -1, dtype=torch.int32, device=world.device)
    _order_kernel[(total,)](out, M, N, BLOCK_M=16, BLOCK_N=16, GROUP_M=2)
    got = out.cpu().view(-1, 4).tolist()
    g = S.tile_order_py("gather", M, N, 16, 16, world.rank, world.world_size, world.nnodes, 2)
    s = S.tile_order_py("scatter", M, N, 16, 16, world.rank, world.world_size, world.nnodes, 2)
    assert [tuple(r[:2]) for r in got] == g, (world.rank, got, g)
    assert [tuple(r[2:]) for r in got] == s, (world.rank, got, s)
    return (world.rank, world.nnodes)


@triton.jit
def _plain_kernel(out_ptr, M, N, rank, world, nnodes, MODE: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    if MODE == 0:
        pm, pn = dl.swizzle_2d(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    elif MODE == 1:
        pm, pn = dl.swizzle_gather(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M)
    else:
        pm, pn = dl.swizzle_scatter(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M=GROUP_M)
    tl.store(out_ptr + 2 * pid, pm)
    tl.store(out_ptr + 2 * pid + 1, pn)


def interp_cases(world):
    """The jit swizzles in a plain ``@triton.jit`` kernel (rank, world size and nodes passed as arguments, not
    read from the world) equal the host twins' tile order, program by program, for 2-D grouping, gather and
    scatter up to 8 ranks on 2 nodes.  Returns the number of cases checked."""
    n = 0
    for mode, M, N, rank, ws, nnodes, G in [(0, 100, 40, 0, 1, 1, 4), (1, 4 * 23 + 3, 20, 2, 4, 1, 2),
                                            (2, 4 * 23 + 3, 20, 1, 4, 2, 2), (1, 8 * 5, 7, 5, 8, 2, 8)]:
        total = triton.cdiv(M, 16) * triton.cdiv(N, 16)
        out = torch.full((2 * total,), -1, dtype=torch.int32, device=world.device)
        _plain_kernel[(total,)](out, M, N, rank, ws, nnodes, MODE=mode, BLOCK_M=16, BLOCK_N=16, GROUP_M=G)
        got = [tuple(p) for p in out.cpu().view(-1, 2).tolist()]
        want = S.tile_order_py(["2d", "gather", "scatter"][mode], M, N, 16, 16, rank, ws, nnodes, G)
        assert got == want, (mode, M, N, rank, ws, nnodes, G, got, want)
        n += 1
    return n
