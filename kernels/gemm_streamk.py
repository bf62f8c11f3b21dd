"""Stream-K for the zoo's GEMM core (``GemmConfig(stream_k=True)``, opt-in, fp16 / bf16, :func:`~.gemm.matmul`
only): :func:`gemm_streamk_kernel` runs the full waves of tiles data-parallel as :func:`~.gemm.gemm_kernel` does,
then splits the rest of the tiles' K steps evenly over the persistent programs (:func:`streamk_split`); a tile's
partial sums are added by its owner in a fixed order (deterministic), the contributors' partials passed through a
per-program fp32 workspace with ``dl.release_tile`` / ``dl.wait_deps`` flags (:func:`streamk_workspace`; never
reset: a per-launch epoch counted in the kernel).  The tile helpers are kernels/gemm.py's."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import cdiv, epoch_begin, epoch_end, sm_count
from .gemm import (gemm_tile_at, gemm_tile_tma, load_k_step, operand_descriptors, store_tile, store_tile_tma,
                   tile_rows)


@triton.jit
def gemm_range_tma(a_desc, b_desc, off_m, off_n, kb, ke, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """:func:`gemm_tile_tma` over the K steps ``[kb, ke)`` only (a Stream-K segment)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(kb, ke):
        a = a_desc.load([off_m, ki * BLOCK_K])
        b = b_desc.load([ki * BLOCK_K, off_n])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def gemm_range(a_rows, b_cols, col_ok, stride_ak, stride_bk, K, kb, ke, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """:func:`gemm_tile` over the K steps ``[kb, ke)`` only (a Stream-K segment)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ks = tl.arange(0, BLOCK_K)
    k_first = kb.to(tl.int64) * BLOCK_K
    a_ptrs = a_rows[:, None] + (k_first + ks[None, :]) * stride_ak
    b_ptrs = b_cols[None, :] + (k_first + ks[:, None]) * stride_bk
    for ki in range(kb, ke):
        a, b = load_k_step(a_ptrs, b_ptrs, col_ok, ki * BLOCK_K, ks, K, EVEN_K)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def streamk_split(num_tiles, KI, P):
    """The Stream-K hybrid schedule of ``num_tiles`` tiles of ``KI`` K steps on ``P`` programs:
    ``(dp, total)``.  Tiles ``[0, dp)`` run data-parallel (``dp`` is ``num_tiles`` when ``P`` divides it,
    else ``(num_tiles // P - 1) * P``, at least 0); the ``total = (num_tiles - dp) * KI`` K steps of the rest,
    flattened tile-major, are split into ``P`` contiguous ranges, program ``p`` taking
    ``[p * total // P, (p + 1) * total // P)`` (the host launches ``P <= total`` where ``total > 0``, so
    no range is empty)."""
    rem = num_tiles % P
    dp = num_tiles - tl.where(rem == 0, 0, rem + tl.minimum(num_tiles // P, 1) * P)
    return dp, (num_tiles - dp).to(tl.int64) * KI


@ditron.jit(do_not_specialize=["M"])
def gemm_streamk_kernel(a_ptr, b_ptr, c_ptr, ws_ptr, flag_ptr, calls_ptr, M, N, K, stride_am, stride_ak,
                        stride_bk, stride_bn, stride_cm, stride_cn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        EVEN_K: tl.constexpr, TMA: tl.constexpr, FLATTEN: tl.constexpr, SUBTILE: tl.constexpr,
                        PLANT: tl.constexpr = 0):
    """:func:`gemm_kernel` (fp16 / bf16) with the Stream-K hybrid schedule (:func:`streamk_split`).

    Data-parallel phase: tiles ``[0, dp)`` as :func:`gemm_kernel` does them (program ``p``: ``p, p + P, ...``).
    Stream-K phase: program ``p`` walks its K-step range; where it crosses a tile boundary it starts the next
    tile, so it computes one *segment* (a K-step sub-range) of each tile it touches, in tile order.

    Fixup (deterministic): a tile's **owner** is the program whose range holds the tile's first K step
    (``k = 0``).  Every other program touching the tile (a *contributor*) starts its range inside the tile, so
    the tile is its **first** segment: it stores its fp32 partial to its workspace slot ``ws[p]`` (one slot per
    program suffices: only a first segment can be a contribution) and releases ``flag[p] = epoch``
    (``dl.release_tile``: release at GPU scope).  Where the tile has contributors, the owner's segment is its
    **last** one (its range ends inside the tile); after computing it the owner waits for the contributors
    ``p + 1 .. last`` (``dl.wait_deps`` on their consecutive flags: acquire at GPU scope), adds their partials
    in that fixed order (bit-identical results run to run, whatever the timing) and runs the epilogue.  Deadlock-free: a
    program waits only at its last segment, and only for contributions that other programs make in their first
    segment, before any wait of their own (the data-parallel phase has no waits); the grid must be resident
    (``P`` at most the SM count: :func:`matmul` checks it).  Owning the tile's *last* segment instead would
    chain the waits across all programs (each owner waiting for its predecessor's last segment, which follows
    that program's own wait).

    Flags are never reset: ``epoch`` is this launch's number (``calls_ptr``: completed launches and a
    program counter, kernels/_common.py ``epoch_begin`` / ``epoch_end``, advanced in the kernel so that
    CUDA-graph replays advance it too), a flag ``>= epoch`` was released in this launch."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    epoch = (epoch_begin(calls_ptr) + 1).to(tl.int32)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    KI = tl.cdiv(K, BLOCK_K)
    dp, total = streamk_split(num_tiles, KI, P)
    if TMA:
        a_desc, b_desc = operand_descriptors(a_ptr, b_ptr, M, N, K, stride_am, stride_bk, BLOCK_M, BLOCK_N,
                                             BLOCK_K, TMA)
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                           block_shape=[BLOCK_M, BLOCK_N // SUBTILE])
        for tile in tl.range(pid, dp, P, flatten=FLATTEN):
            pid_m, pid_n = dl.swizzle_2d(tile, num_pid_m, num_pid_n, GROUP_M)
            acc = gemm_tile_tma(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_M, BLOCK_N, BLOCK_K)
            store_tile_tma(c_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, acc, BLOCK_M, BLOCK_N, SUBTILE,
                           c_ptr.dtype.element_ty)
    else:
        for tile in tl.range(pid, dp, P, flatten=FLATTEN):
            pid_m, pid_n = dl.swizzle_2d(tile, num_pid_m, num_pid_n, GROUP_M)
            rows, row_ok, cols, col_ok, acc = gemm_tile_at(a_ptr, b_ptr, 0, 0, pid_m, pid_n, M, N, K, stride_am,
                                                           stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N,
                                                           BLOCK_K, EVEN_K, TMA)
            store_tile(c_ptr, stride_cm, stride_cn, rows, row_ok, cols, col_ok, acc)
    # the Stream-K phase
    lo = (pid.to(tl.int64) * total) // P
    hi = ((pid + 1).to(tl.int64) * total) // P
    ii = tl.arange(0, BLOCK_M)
    jj = tl.arange(0, BLOCK_N)
    ws_offs = ii[:, None] * BLOCK_N + jj[None, :]
    it = lo
    while it < hi:
        s = it // KI
        kb = (it - s * KI).to(tl.int32)
        ke = tl.minimum(hi - s * KI, KI).to(tl.int32)
        pid_m, pid_n = dl.swizzle_2d(dp + s.to(tl.int32), num_pid_m, num_pid_n, GROUP_M)
        rows, row_ok, rows_c = tile_rows(pid_m, M, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        if TMA:
            acc = gemm_range_tma(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, kb, ke, BLOCK_M, BLOCK_N,
                                 BLOCK_K)
        else:
            acc = gemm_range(a_ptr + rows_c.to(tl.int64) * stride_am, b_ptr + cols.to(tl.int64) * stride_bn,
                             col_ok, stride_ak, stride_bk, K, kb, ke, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
        if kb > 0:
            # a contributor (this is its first segment): publish the partial
            tl.store(ws_ptr + pid.to(tl.int64) * (BLOCK_M * BLOCK_N) + ws_offs, acc)
            if PLANT != 2:                                          # (tests only: PLANT 2 drops the release)
                dl.release_tile(flag_ptr + pid, epoch)
        else:
            # the owner (its last segment): the programs holding the tile's other K steps are pid + 1 .. last,
            # last = the program of the tile's last step (s + 1) * KI - 1, i.e. ceil((s + 1) * KI * P / total) - 1
            last = (((s + 1) * KI * P + total - 1) // total - 1).to(tl.int32)
            if last > pid:
                if PLANT == 1:                                      # (tests only: PLANT 1 drops the wait)
                    wsp = ws_ptr
                else:
                    tok = dl.wait_deps(flag_ptr + pid + 1, last - pid, epoch)
                    wsp = dl.consume_token(ws_ptr, tok)
                for q in range(pid + 1, last + 1):
                    acc += tl.load(wsp + q * (BLOCK_M * BLOCK_N) + ws_offs)       # P * BLOCK_M * BLOCK_N < 2^31
            if TMA:
                store_tile_tma(c_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, acc, BLOCK_M, BLOCK_N, SUBTILE,
                               c_ptr.dtype.element_ty)
            else:
                store_tile(c_ptr, stride_cm, stride_cn, rows, row_ok, cols, col_ok, acc)
        it = s * KI + ke
    epoch_end(calls_ptr)


#: (device, programs, BLOCK_M * BLOCK_N) -> [ws, flags, calls, stream of the last eager launch]
_STREAMK_WS: dict = {}


def streamk_workspace(device, P, block_m, block_n):
    """The Stream-K state of a launch of ``P`` programs with ``block_m x block_n`` tiles on ``device``, allocated
    once and cached: ``(ws, flags, calls)`` -- ``ws`` fp32 ``[P, block_m * block_n]`` (one partial tile per
    program), ``flags`` int32 ``[P]`` and ``calls`` int64 ``[2]`` (completed launches and a program counter: the
    launch epoch, so the flags are never reset; :func:`gemm_streamk_kernel`), zeroed once (one fill: both live in
    one int64 buffer).

    Two launches must not use the state at the same time.  Launches on one stream are ordered; where an eager
    call comes on another stream than the previous one, that stream first waits for the previous one (an event
    wait, only when the stream changes).  A call being captured into a CUDA graph is not ordered so (the replay's
    stream is unknown): do not replay a graph concurrently with another Stream-K launch of the same state.  The
    state is allocated outside any capture where the first call is eager (warm up before capturing); a first call
    under capture allocates it in the graph's pool, zeroed by the graph at each replay."""
    dev = torch.device(device)
    key = (str(dev), int(P), int(block_m) * int(block_n))
    hit = _STREAMK_WS.get(key)
    if hit is None:
        state = torch.zeros(2 + (P + 1) // 2, dtype=torch.int64, device=dev)
        hit = _STREAMK_WS[key] = [torch.empty((P, block_m * block_n), dtype=torch.float32, device=dev),
                                  state[2:].view(torch.int32)[:P], state[:2], None]
    if dev.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        stream = torch.cuda.current_stream(dev)
        if hit[3] is not None and hit[3] != stream:
            stream.wait_stream(hit[3])
        hit[3] = stream
    return hit[0], hit[1], hit[2]


def streamk_programs(tiles, k_steps, requested):
    """Programs of a Stream-K launch: ``requested`` (the SM count by default), at most one per K step of all
    tiles (``tiles * k_steps``), so that no program's range of K steps is empty (:func:`streamk_split`).  With
    fewer tiles than programs every tile is split over K (split-K); where ``requested`` divides ``tiles`` the
    schedule is the data-parallel one."""
    return max(1, min(int(requested), tiles * k_steps))


#: tests only (tests/test_gemm_streamk.py): 1 launches the Stream-K kernel without its fixup wait, 2 without its
#: release -- bugs the simulator must catch (a race, a hang)
_STREAMK_PLANT = 0


def matmul_streamk(a, b, out, cfg, num_programs, tma, tiles, sim):
    """:func:`~.gemm.matmul` with ``cfg.stream_k``: :func:`gemm_streamk_kernel` on :func:`streamk_programs`
    programs (fp16 / bf16; the checks of :func:`~.gemm.matmul` are done)."""
    M, K = a.shape
    N = b.shape[1]
    sms = None if sim else sm_count(a.device)
    requested = int(num_programs or (4 if sim else sms))
    if sms is not None and requested > sms:
        raise ditron.DitronError(f"matmul: stream_k with num_programs={requested} > {sms} SMs: the Stream-K fixup "
                                 "waits need every program of the grid resident at once (one per SM at most)")
    P = streamk_programs(tiles, cdiv(K, cfg.block_k), requested)
    ws, flags, calls = streamk_workspace(a.device, P, cfg.block_m, cfg.block_n)
    gemm_streamk_kernel[(P,)](a, b, out, ws, flags, calls, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                              b.stride(1), out.stride(0), out.stride(1), EVEN_K=(K % cfg.block_k == 0), TMA=tma,
                              FLATTEN=cfg.flatten, SUBTILE=cfg.epilogue_subtile if tma else 1,
                              PLANT=_STREAMK_PLANT, **cfg.launch_options())
    return out
