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


class _jit_code:
    """The simulator evaluates ``_swizzle_dist`` by its host twin (ditron.sim.scalar_twins): these bodies compare
    the jit code itself with the twin, so they turn that off."""

    def __enter__(self):
        from ditron.sim import scalar_twins
        self.old, scalar_twins.ENABLED = scalar_twins.ENABLED, False

    def __exit__(self, *exc):
        from ditron.sim import scalar_twins
        scalar_twins.ENABLED = self.old


def tile_order_matches_twin(world):
    with _jit_code():
        return _tile_order_matches_twin(world)


def _tile_order_matches_twin(world):
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
    with _jit_code():
        return _interp_cases(world)


def _interp_cases(world):
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


@triton.jit
def _dist_kernel(out_ptr, M, N, rank, world, nnodes, SCATTER: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, M_C: tl.constexpr, WORLD_C: tl.constexpr,
                 PAST: tl.constexpr):
    pid = tl.program_id(0)
    # constexpr M / world where given (M_C, WORLD_C > 0): the twin's plain-int (Python) arithmetic for them
    m = M_C if M_C > 0 else M
    w = WORLD_C if WORLD_C > 0 else world
    pm, pn = S._swizzle_dist(pid, m, N, BLOCK_M, BLOCK_N, rank, w, nnodes, GROUP_M, SCATTER)
    tl.store(out_ptr + 4 * pid, pm)
    tl.store(out_ptr + 4 * pid + 1, pn)
    # a persistent loop's tile index is a Python int in the interpreter (range with constexpr bounds): program 0
    # computes tiles 0 .. PAST - 1 that way
    if pid == 0:
        for t in range(0, PAST):
            qm, qn = S._swizzle_dist(t, m, N, BLOCK_M, BLOCK_N, rank, w, nnodes, GROUP_M, SCATTER)
            tl.store(out_ptr + 4 * t + 2, qm)
            tl.store(out_ptr + 4 * t + 3, qn)


def scalar_twin_matches_interpreter(world):
    """``_swizzle_dist`` evaluated by its twin (ditron.sim.scalar_twins) gives what the interpreter computes from
    the jit code, program by program (also past the grid): gather and scatter, runtime or constexpr M and world,
    non-multiple shapes, M smaller than the world, up to 8 ranks on 2 nodes, and an int64 argument (which the
    twin leaves to the interpreter).  Returns the number of cases."""
    from ditron.sim import scalar_twins as T
    n = 0
    # M, N, rank, world, nodes, GROUP_M, scatter, M and world as constexpr, the rank as int64
    cases = [(100, 16, 0, 1, 1, 4, 0, False, False), (4 * 23 + 3, 20, 2, 4, 1, 2, 1, True, False),
             (4 * 23 + 3, 20, 1, 4, 2, 2, 0, False, False), (8 * 5, 7, 5, 8, 2, 8, 1, False, False),
             (3, 16, 2, 3, 1, 1, 0, True, False), (7 * 16, 17, 6, 7, 1, 3, 1, False, False),
             (4 * 23 + 3, 20, 3, 4, 2, 2, 1, False, True)]
    for M, N, rank, ws, nnodes, G, scatter, const, big in cases:
        total = triton.cdiv(M, 16) * triton.cdiv(N, 16) + 3          # 3 programs past the grid
        got = []
        for enabled in (True, False):
            T.ENABLED = enabled
            try:
                out = torch.full((4 * total,), -7, dtype=torch.int32, device=world.device)
                hits = T.HITS
                _dist_kernel[(total,)](out, M, N, rank + (1 << 32 if big else 0), ws, nnodes, SCATTER=scatter,
                                       BLOCK_M=16, BLOCK_N=16, GROUP_M=G, M_C=M if const else 0,
                                       WORLD_C=ws if const else 0, PAST=3)
                got.append((out.cpu().tolist(), T.HITS - hits))
            finally:
                T.ENABLED = True
        (fast, hits), (slow, none) = got
        assert fast == slow, (M, N, rank, ws, nnodes, G, scatter, const, big, fast, slow)
        assert none == 0 and hits == (0 if big else total + 3), (hits, none, total, big)
        n += 1
    return n
