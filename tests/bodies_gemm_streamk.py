"""Test bodies for the Stream-K schedule of the GEMM core (kernels/gemm_streamk.py, ``GemmConfig(stream_k=True)``), run
on one simulated rank (or a GPU rank): against torch in fp32, run-to-run bit equality, and (simulator only) the
exact fp32 summation order that the kernel documents, replayed on the host."""
import importlib

import numpy as np
import torch

from bodies_ag_gemm import error_messages
from bodies_gemm_core import _close, _rand

G = importlib.import_module("ditron.kernels.gemm")
S = importlib.import_module("ditron.kernels.gemm_streamk")

#: the simulator's Stream-K config (SIM_CONFIG's tiles)
SK = G.GemmConfig(16, 16, 32, group_m=4, num_warps=1, num_stages=1, stream_k=True)


def schedule(tiles, k_steps, P):
    """The host replica of the kernel's schedule (``streamk_split`` and the ranges): ``(dp, segments)``,
    ``segments[s]`` the list of ``(program, kb, ke)`` of Stream-K tile ``s`` in program order (the first is the
    owner: it holds ``k = 0``)."""
    rem = tiles % P
    dp = tiles - (0 if rem == 0 else rem + min(tiles // P, 1) * P)
    total = (tiles - dp) * k_steps
    segs = [[] for _ in range(tiles - dp)]
    for p in range(P):
        lo, hi = p * total // P, (p + 1) * total // P
        assert lo < hi or total == 0, (tiles, k_steps, P, p)        # no empty range where there is work
        it = lo
        while it < hi:
            s, kb = divmod(it, k_steps)
            ke = min(hi - s * k_steps, k_steps)
            segs[s].append((p, kb, ke))
            it = s * k_steps + ke
    return dp, segs


def streamk_calls(world, dtype, cases):
    """``cases``: ``(M, N, K, P)``; per case ``matmul`` with the Stream-K config on ``P`` programs against torch
    (a transposed ``b`` too), twice (bit-identical).  Returns per case ``(programs launched, dp tiles, tiles
    split, most segments of one tile)`` so the test can tell that Stream-K did split tiles."""
    dtype = getattr(torch, dtype)
    info = []
    for i, (M, N, K, P) in enumerate(cases):
        a = _rand((M, K), dtype, 10 + i).to(world.device)
        b = _rand((K, N), dtype, 110 + i).to(world.device)
        ref = a.float().cpu() @ b.float().cpu()
        out = torch.full((M, N), float("nan"), dtype=dtype, device=world.device)
        assert G.matmul(a, b, out=out, config=SK, num_programs=P) is out
        _close(out, ref, f"stream-K {M}x{N}x{K} on {P} programs")
        again = G.matmul(a, b, config=SK, num_programs=P)
        assert torch.equal(out, again), f"stream-K {M}x{N}x{K} on {P} programs: two runs differ"
        bt = _rand((N, K), dtype, 210 + i).to(world.device)
        _close(G.matmul(a, bt.t(), config=SK, num_programs=P), a.float().cpu() @ bt.float().cpu().t(),
               f"stream-K {M}x{N}x{K} on {P} programs, b transposed")
        tiles = G.cdiv(M, SK.block_m) * G.cdiv(N, SK.block_n)
        ks = G.cdiv(K, SK.block_k)
        launched = S.streamk_programs(tiles, ks, P)
        dp, segs = schedule(tiles, ks, launched)
        info.append((launched, dp, sum(len(s) > 1 for s in segs), max((len(s) for s in segs), default=0)))
    return info


def _one_product_per_step(M, N, K, dtype, seed, bk):
    """Operands whose K steps each hold one nonzero product per output (column ``s * bk`` of ``a``, row ``s *
    bk`` of ``b``): signed powers of two (2^-12, 1 or 2^12), so each step's dot is exact in fp32, equal magnitudes of
    opposite signs cancel often, and the small terms that an fp32 sum drops next to 2^24 depend on its order."""
    g = torch.Generator().manual_seed(seed)
    ks = torch.arange(0, K, bk)

    def pow2(shape):
        sign = torch.randint(0, 2, shape, generator=g) * 2.0 - 1.0
        return sign * torch.pow(2.0, 12.0 * torch.randint(-1, 2, shape, generator=g).double()).float()
    a = torch.zeros(M, K)
    b = torch.zeros(K, N)
    a[:, ks] = pow2((M, len(ks)))
    b[ks, :] = pow2((len(ks), N))
    return a.to(dtype), b.to(dtype)


def exact_order(world, dtype, cases):
    """The kernel's fp32 summation order, bit for bit: data-parallel tiles sum their K steps in order; a split
    tile sums each segment's steps in order from 0, then the owner adds the contributors' partials in program
    order (kernels/gemm_streamk.py ``gemm_streamk_kernel``).  Replayed with NumPy float32 on the host from the schedule
    replica (:func:`schedule`).  Returns per case the number of output entries where the exact order and the
    plain K order (no split) differ, so the test can tell that the order is observable."""
    dtype = getattr(torch, dtype)
    bm, bn, bk = SK.block_m, SK.block_n, SK.block_k
    observable = []
    for i, (M, N, K, P) in enumerate(cases):
        a, b = _one_product_per_step(M, N, K, dtype, 300 + i, bk)
        got = G.matmul(a.to(world.device), b.to(world.device), config=SK, num_programs=P).cpu()
        ks = range(0, K, bk)
        # per K step the exact product (a column times a row: one nonzero term)
        v = np.stack([(a[:, k:k + 1].float() @ b[k:k + 1, :].float()).numpy() for k in ks]).astype(np.float32)
        nm, nn = G.cdiv(M, bm), G.cdiv(N, bn)
        tiles, steps = nm * nn, len(ks)
        launched = S.streamk_programs(tiles, steps, P)
        dp, segs = schedule(tiles, steps, launched)

        def seg_sum(lo, hi):
            acc = np.zeros((M, N), np.float32)
            for s in range(lo, hi):
                acc = (acc + v[s]).astype(np.float32)
            return acc
        plain = seg_sum(0, steps)
        want = plain.copy()
        for s, parts in enumerate(segs):
            pm, pn = swizzle_2d(dp + s, nm, nn, SK.group_m)
            rows, cols = slice(pm * bm, (pm + 1) * bm), slice(pn * bn, (pn + 1) * bn)
            acc = seg_sum(parts[0][1], parts[0][2])[rows, cols]
            for _p, kb, ke in parts[1:]:
                acc = (acc + seg_sum(kb, ke)[rows, cols]).astype(np.float32)
            want[rows, cols] = acc
        want_t = torch.from_numpy(want).to(dtype)
        bad = int((got != want_t).sum())
        assert bad == 0, f"{M}x{N}x{K} on {launched} programs: {bad} entries differ from the documented order"
        observable.append(int((want_t != torch.from_numpy(plain).to(dtype)).sum()))
    return observable


def swizzle_2d(tile, num_pid_m, num_pid_n, group_m):
    """Host replica of ``dl.swizzle_2d`` (grouped row-major order), checked against the kernel by
    :func:`exact_order` itself (a wrong tile position fails it)."""
    width = group_m * num_pid_n
    group = tile // width
    first_m = group * group_m
    size_m = min(num_pid_m - first_m, group_m)
    return first_m + (tile % width) % size_m, (tile % width) // size_m


def streamk_errors(world):
    a = _rand((37, 70), torch.bfloat16, 1).to(world.device)
    b = _rand((70, 45), torch.bfloat16, 2).to(world.device)
    import dataclasses
    cases = {
        "ws": lambda: G.matmul(a, b, config=dataclasses.replace(SK, tma=True, warp_specialize=True)),
        "overlap_op": lambda: SK.validate("ag_gemm"),
    }
    return error_messages(cases)


def workspace_state(world, calls):
    """The Stream-K state is allocated once per (device, programs, tile) and reused (no allocation per call); the
    launch counter counts the launches (every program ran ``epoch_end``) and each contributor's flag holds the
    last launch's epoch, the other flags 0 (never reset)."""
    M, N, K, P = 37, 45, 70, 6              # 9 tiles, 3 K steps: all 9 split over 6 programs
    a = _rand((M, K), torch.bfloat16, 5).to(world.device)
    b = _rand((K, N), torch.bfloat16, 6).to(world.device)
    first = S.streamk_workspace(world.device, P, SK.block_m, SK.block_n)
    assert int(first[2][0]) == 0 and not bool(first[1].any())
    for _ in range(calls):
        G.matmul(a, b, config=SK, num_programs=P)
    again = S.streamk_workspace(world.device, P, SK.block_m, SK.block_n)
    assert all(x is y for x, y in zip(first, again)), "the Stream-K state was allocated again"
    tiles = G.cdiv(M, SK.block_m) * G.cdiv(N, SK.block_n)
    _dp, segs = schedule(tiles, G.cdiv(K, SK.block_k), P)
    contributors = sorted(p for parts in segs for p, _kb, _ke in parts[1:])
    return int(again[2][0]), int(again[2][1]), again[1].tolist(), contributors


def streamk_planted(world, plant):
    """One split-K case (a single tile summed from 4 programs' partials) with the Stream-K kernel's fixup wait
    (``plant`` 1) or release (2) removed (``gemm_streamk._STREAMK_PLANT``): the simulator must report it."""
    S._STREAMK_PLANT = plant
    try:
        a = _rand((10, 200), torch.bfloat16, 7).to(world.device)
        b = _rand((200, 12), torch.bfloat16, 8).to(world.device)
        out = G.matmul(a, b, config=SK, num_programs=4)
        _close(out, a.float().cpu() @ b.float().cpu(), "stream-K, planted bug")
        return "not caught"
    finally:
        S._STREAMK_PLANT = 0
