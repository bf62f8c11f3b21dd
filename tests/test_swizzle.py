"""Tile-order (swizzle) primitives: ``dl.swizzle_2d``, ``dl.swizzle_gather``,
``dl.swizzle_scatter``.

The ordering properties are checked on the host twins (same code as the jit
functions) against an independent brute-force model of rank segments and
arrival / consumption order; the jit versions are then compared with the
twins through Triton's interpreter, the ditron simulator (``dl.rank()`` /
``dl.num_ranks()`` in a real kernel) and the compiler.
"""
import itertools

import pytest

import bodies_swizzle as B
import ditron.language as dl
from ditron.language import swizzle as S

BM, BN = 16, 16
WORLDS = [(1, 1), (2, 1), (2, 2), (3, 1), (4, 1), (4, 2), (8, 1), (8, 2)]
# M per rank: 0 (M < world), < BLOCK_M, == BLOCK_M, not a multiple, > 2 tiles; plus remainder rows
M_PER_RANK = [0, 5, 16, 23, 37]
M_EXTRA = [0, 3]
NS = [7, 40]               # N < BLOCK_N and N not a multiple
GROUPS = [1, 4, 8]


def cdiv(a, b):
    return -(-a // b)


# ---------------------------------------------------------------------------
# independent model
# ---------------------------------------------------------------------------

def segment_bounds(M, world):
    """[start, end) of each rank's rows: M // world each, the last takes the rest."""
    mpr = M // world
    bounds = [(s * mpr, (s + 1) * mpr) for s in range(world)]
    bounds[-1] = (bounds[-1][0], M)
    return bounds


def segments_of_tile(t, M, world):
    """The segments holding the tile's rows, row by row."""
    bounds = segment_bounds(M, world)
    return {next(s for s, (a, b) in enumerate(bounds) if a <= r < b) for r in range(t * BM, min((t + 1) * BM, M))}


def arrival_order(rank, world, nnodes):
    """Gather: own, node ring rank+1.., then next nodes (from the same local rank)."""
    L = world // nnodes
    nr, lr = divmod(rank, L)
    return [((nr + i) % nnodes) * L + (lr + j) % L for i in range(nnodes) for j in range(L)]


def consumption_order(rank, world, nnodes):
    """Scatter: other nodes first (node+1.., from local rank+1), then own node ring rank+1.., own last."""
    L = world // nnodes
    nr, lr = divmod(rank, L)
    return [((nr + 1 + i) % nnodes) * L + (lr + 1 + j) % L for i in range(nnodes) for j in range(L)]


def node_of(s, world, nnodes):
    return s // (world // nnodes)


def cases():
    for world, nnodes in WORLDS:
        for mpr, extra in itertools.product(M_PER_RANK, M_EXTRA):
            M = world * mpr + extra
            if M == 0:
                continue
            for N in NS:
                yield world, nnodes, M, N


# ---------------------------------------------------------------------------
# swizzle_2d
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("G", [1, 2, 4, 8])
def test_swizzle_2d_permutation_and_grouping(G):
    for npm, npn in itertools.product(range(1, 20), range(1, 7)):
        order = [S.swizzle_2d_py(p, npm, npn, G) for p in range(npm * npn)]
        assert sorted(order) == [(m, n) for m in range(npm) for n in range(npn)], (npm, npn)
        # groups of G rows (the last one shorter), column-major inside a group
        expect = []
        for g0 in range(0, npm, G):
            rows = range(g0, min(g0 + G, npm))
            expect += [(m, n) for n in range(npn) for m in rows]
        assert order == expect, (npm, npn, G)


def test_swizzle_2d_group_1_is_row_major():
    assert [S.swizzle_2d_py(p, 3, 4, 1) for p in range(12)] == [(m, n) for m in range(3) for n in range(4)]


# ---------------------------------------------------------------------------
# distributed modes: the sweep
# ---------------------------------------------------------------------------

def check_schedule(mode, order, world, nnodes, rank, M, N, G):
    npm, npn = cdiv(M, BM), cdiv(N, BN)
    ctx = (mode, world, nnodes, rank, M, N, G)
    # a permutation of the tile grid
    assert len(order) == npm * npn and sorted(order) == [(m, n) for m in range(npm) for n in range(npn)], ctx

    segs = [segments_of_tile(t, M, world) for t in range(npm)]
    for t in range(npm):      # tile_segments agrees with the model
        lo, hi = S.tile_segments_py(t, M, BM, world)
        assert set(range(lo, hi + 1)) == segs[t], (ctx, t)

    seq = arrival_order(rank, world, nnodes) if mode == "gather" else consumption_order(rank, world, nnodes)
    assert sorted(seq) == list(range(world))
    pos = {s: i for i, s in enumerate(seq)}
    for s in range(world):
        assert S.segment_position_py(s, rank, world, nnodes, int(mode == "scatter")) == pos[s], (ctx, s)
    pick = max if mode == "gather" else min
    keys = [pick(pos[s] for s in segs[m]) for m, _ in order]
    # ordered by arrival of the last needed segment / by the earliest consumer
    assert all(a <= b for a, b in zip(keys, keys[1:])), (ctx, keys)

    local = [segs[m] == {rank} for m, _ in order]
    on_node = [all(node_of(s, world, nnodes) == node_of(rank, world, nnodes) for s in segs[m]) for m, _ in order]
    if mode == "gather":
        # tiles entirely in the local segment come before any tile needing remote rows
        if True in local:
            assert local == sorted(local, reverse=True), ctx
        # tiles needing only this node's segments come before tiles needing another node's
        assert on_node == sorted(on_node, reverse=True), ctx
    else:
        # the local-only tiles come last; tiles touching another node's segment first
        assert local == sorted(local), ctx
        assert on_node == sorted(on_node), ctx

    # within one key: a contiguous run of M tiles over all N tiles, in swizzle_2d order
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and keys[j] == keys[i]:
            j += 1
        rows = sorted({m for m, _ in order[i:j]})
        assert rows == list(range(rows[0], rows[-1] + 1)) and j - i == len(rows) * npn, ctx
        assert order[i:j] == [(rows[0] + dm, n) for dm, n in
                              (S.swizzle_2d_py(p, len(rows), npn, G) for p in range(j - i))], ctx
        i = j


@pytest.mark.parametrize("mode", ["gather", "scatter"])
def test_distributed_swizzle_sweep(mode):
    count = 0
    for world, nnodes, M, N in cases():
        for rank in range(world):
            for G in GROUPS:
                order = S.tile_order_py(mode, M, N, BM, BN, rank, world, nnodes, G)
                check_schedule(mode, order, world, nnodes, rank, M, N, G)
                count += 1
    assert count > 1000


def test_world_1_is_plain_grouped_order():
    for M, N, G in [(37, 40, 4), (5, 7, 8), (160, 48, 1)]:
        for mode in ("gather", "scatter"):
            assert S.tile_order_py(mode, M, N, BM, BN, 0, 1, 1, G) == S.tile_order_py("2d", M, N, BM, BN, GROUP_M=G)


def test_perfect_shape_examples():
    # 4 ranks, 2 M tiles each, 1 N tile: segment s = M tiles 2s, 2s+1
    g = [m for m, _ in S.tile_order_py("gather", 4 * 32, 16, BM, BN, 1, 4, 1, 8)]
    assert g == [2, 3, 4, 5, 6, 7, 0, 1]
    s = [m for m, _ in S.tile_order_py("scatter", 4 * 32, 16, BM, BN, 1, 4, 1, 8)]
    assert s == [4, 5, 6, 7, 0, 1, 2, 3]
    # 2 nodes x 2: scatter on rank 0 starts with node 1 at local rank 1 (rank 3)
    s = [m for m, _ in S.tile_order_py("scatter", 4 * 32, 16, BM, BN, 0, 4, 2, 8)]
    assert s == [6, 7, 4, 5, 2, 3, 0, 1]
    g = [m for m, _ in S.tile_order_py("gather", 4 * 32, 16, BM, BN, 0, 4, 2, 8)]
    assert g == [0, 1, 2, 3, 4, 5, 6, 7]
    g = [m for m, _ in S.tile_order_py("gather", 4 * 32, 16, BM, BN, 3, 4, 2, 8)]
    assert g == [6, 7, 4, 5, 2, 3, 0, 1]


def test_straddling_tiles():
    # M per rank 24 with BLOCK_M 16: tile 1 (rows 16..31) straddles segments 0 and 1
    M = 4 * 24
    assert S.tile_segments_py(1, M, BM, 4) == (0, 1)
    # rank 1 owns rows 24..47: tile 2 is all local, tile 1 also needs segment 0 (arrives last in the ring)
    g = [m for m, _ in S.tile_order_py("gather", M, 16, BM, BN, 1, 4, 1, 1)]
    assert g == [2, 3, 4, 5, 0, 1]
    # scatter on rank 1 feeds 2, 3, 0, then itself: tile 1 goes with segment 0 (consumed before the own one),
    # tile 4 (segments 2 and 3) with segment 2
    s = [m for m, _ in S.tile_order_py("scatter", M, 16, BM, BN, 1, 4, 1, 1)]
    assert s == [3, 4, 5, 0, 1, 2]


def test_exported_as_dl():
    for name in ("swizzle_2d", "swizzle_gather", "swizzle_scatter", "tile_segments"):
        assert getattr(dl, name) is getattr(S, name)
    assert dl.swizzle_gather_py is S.swizzle_gather_py


# ---------------------------------------------------------------------------
# the jit versions
# ---------------------------------------------------------------------------

def test_jit_matches_host_twin_in_interpreter():
    # the plain @triton.jit kernel of bodies_swizzle.interp_cases (rank, world and nodes as arguments: four cases
    # up to 8 ranks on 2 nodes) in Triton's interpreter, on one simulated rank: its processes run interpreted
    # Triton with torch already imported (a `python script.py` with TRITON_INTERPRET=1 imported both again)
    from conftest import SimDist
    assert SimDist(1).run(B.interp_cases) == [4]


def test_scalar_twin_matches_interpreter():
    # the simulator evaluates _swizzle_dist by its host twin on int32 arithmetic (ditron.sim.scalar_twins): the
    # same tiles as the interpreter running the jit code (and an int64 argument left to it)
    from conftest import SimDist
    assert SimDist(1).run(B.scalar_twin_matches_interpreter) == [7]


def test_jit_in_simulator_with_dl_rank(dist_world):
    # 4 simulated ranks on 2 nodes: dl.rank() / dl.num_ranks() / dl.num_ranks(1) in the kernel equal the host twin's
    d = dist_world(4, 2)
    assert d.run(B.tile_order_matches_twin) == [(r, 2) for r in range(4)]


import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ditron  # noqa: E402


@ditron.jit
def _swizzle_kernel(out_ptr, M, N, MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    if MODE == 0:
        pm, pn = dl.swizzle_gather(pid, M, N, BLOCK_M, BLOCK_N, dl.rank(), dl.num_ranks(), dl.num_ranks(1), GROUP_M)
    else:
        pm, pn = dl.swizzle_scatter(pid, M, N, BLOCK_M, BLOCK_N, dl.rank(), dl.num_ranks(), dl.num_ranks(1), GROUP_M)
    tl.store(out_ptr + pid, pm * 65536 + pn)


@triton.jit
def _swizzle_args_kernel(out_ptr, M, N, rank, world, nnodes, MODE: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    if MODE == 0:
        pm, pn = dl.swizzle_gather(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes, GROUP_M)
    elif MODE == 1:
        pm, pn = dl.swizzle_scatter(pid, M, N, BLOCK_M, BLOCK_N, rank, world, nnodes)
    else:
        pm, pn = dl.swizzle_2d(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    tl.store(out_ptr + pid, pm * 65536 + pn)


@pytest.mark.parametrize("mode", [0, 1])
def test_jit_compiles_with_world_descriptor(mode):
    """Compiled (not interpreted) for sm_90a with rank, world, nnodes read from the world descriptor."""
    ck = ditron.compile(_swizzle_kernel, target="sm_90a", signature={"out_ptr": "*i32", "M": "i32", "N": "i32"},
                        constexprs={"MODE": mode, "BLOCK_M": 128, "BLOCK_N": 256, "GROUP_M": 8})
    assert "__ditron_world" in ck.asm["ptx"]


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("consts", [{}, {"rank": 0, "world": 1, "nnodes": 1}, {"world": 8, "nnodes": 2},
                                    {"M": 1, "N": 1, "world": 1, "nnodes": 1}])
def test_jit_compiles_with_runtime_or_constant_args(mode, consts):
    """Arguments may be runtime values or compile-time constants (Triton makes an argument equal to 1 one)."""
    sig = {"out_ptr": "*i32", "M": "i32", "N": "i32", "rank": "i32", "world": "i32", "nnodes": "i32"}
    sig.update({k: "constexpr" for k in consts})
    ditron.compile(_swizzle_args_kernel, target="sm_90a", signature=sig,
                   constexprs=dict(consts, MODE=mode, BLOCK_M=128, BLOCK_N=256, GROUP_M=8))


def test_scalar_twin_int32_arithmetic_is_the_interpreters():
    # ditron.sim.scalar_twins._I32 (the twin's int32 scalars): //, % (C: truncating, the dividend's sign), +, -, *
    # as Triton's interpreter computes them on int32 scalars, negative operands included; a zero divisor or a
    # result outside int32 is left to the interpreter (_Fallback)
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    from ditron.sim.scalar_twins import _I32, _Fallback
    b = InterpreterBuilder()

    def interp(op, x, y):
        h = getattr(b, op)(TensorHandle(np.array([x], np.int32), tl.int32), TensorHandle(np.array([y], np.int32),
                                                                                         tl.int32))
        return int(h.data[0])

    rng = np.random.default_rng(3)
    pairs = [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 5), (5, 7), (-5, 7), (2**31 - 1, 3), (-2**31 + 1, 7)]
    pairs += [tuple(int(v) for v in rng.integers(-1000, 1000, 2)) for _ in range(200)]
    for x, y in pairs:
        for op, f in (("create_sdiv", lambda p, q: p // q), ("create_srem", lambda p, q: p % q),
                      ("create_add", lambda p, q: p + q), ("create_sub", lambda p, q: p - q),
                      ("create_mul", lambda p, q: p * q)):
            if y == 0 and op in ("create_sdiv", "create_srem"):
                continue
            want = interp(op, x, y)
            for lhs, rhs in ((_I32(x), _I32(y)), (_I32(x), y), (x, _I32(y))):     # tensor op tensor / constant
                try:
                    got = f(lhs, rhs)
                except _Fallback:
                    assert not -2**31 <= f(x, y) < 2**31 or op in ("create_sdiv", "create_srem"), (op, x, y)
                    continue
                assert type(got) is _I32 and got == want, (op, x, y, got, want)
    for bad in (lambda: _I32(3) // 0, lambda: 3 % _I32(0), lambda: _I32(2**31 - 1) + 1, lambda: _I32(2**16) * 2**16):
        with pytest.raises(_Fallback):
            bad()
