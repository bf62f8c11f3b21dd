"""The MoE grouped GEMM on the Gluon Hopper core (issue 52 item 2): :func:`ditron.kernels.moe.grouped_gemm`'s
``out[rows of expert e] = a[rows of e] @ w[e]`` on the warp-specialised core of :mod:`ditron.kernels.gemm_hopper`.

    out = grouped_gemm(a, w, counts, core="gluon")     # sm_90 GPUs; the simulator: the tl twin

The core's structure, unchanged: a persistent program per SM, a producer warp streaming A and B tiles with TMA
into a ``stages``-deep shared-memory ring (a *ready* and an *empty* mbarrier per slot), two consumer warpgroups
issuing asynchronous ``wgmma`` on it (``"coop"``: both on one tile, half its rows each; ``"pingpong"``: alternate
tiles), the epilogue's TMA store draining under the next tile's mainloop.  What is the grouped GEMM's own:

Tiles
-----
Virtual M tiles as :func:`ditron.kernels.moe.expert_tile` cuts them: expert ``e``'s rows ``[off[e], off[e] +
counts[e])`` (``off`` the exclusive prefix sum of the counts, negative counts 0) in ``BLOCK_M`` tiles of their
own, so a tile never mixes two experts.  The counts stay on the device: each partition loads them once
(:func:`_expert_table`, a vector of ``E`` lanes: prefix sums by ``gl.associative_scan``) and maps a virtual tile to
``(expert, first row, end row)`` with three reductions (:func:`_expert_tile`).  Counts running past ``M`` are cut at
``M`` *before* the tiles are counted, so every virtual tile below the device-side total has at least one row:
the producer and both consumers walk the same list of real tiles with no skips, which is what keeps the ring's
slot / phase arithmetic (a function of the running k-step count) and the ping-pong turns exactly the core's.  (The
``tl`` kernel walks ``cdiv(M, BLOCK_M) + E`` virtual tiles and skips the empty ones; the tiles that exist are the
same, with the same rows.)  Tile order: ``dl.swizzle_2d``'s grouped order over (virtual M tiles, N tiles), program
``p`` taking tiles ``p, p + P, ...``.  Tile order does not change a single bit of the output: every output element
is computed by one tile in K order.

Operands
--------
* A: a TMA descriptor of ``a [M, K]``; a tile loads ``BLOCK_M`` rows from its first row.  Rows past the expert's
  end are the next expert's (or zero-fill past ``M``): they only feed accumulator rows that are never stored.
* B: a **3-D** TMA descriptor of ``w [E, K, N]`` with ``[1, BLOCK_K, BLOCK_N]`` boxes at ``(e, k, n)``, read by
  ``wgmma`` through a 2-D view of the slot.  Not a 2-D ``[E*K, N]`` view: where ``K`` is not a multiple of
  ``BLOCK_K`` the last K step of expert ``e`` would read expert ``e + 1``'s first rows; they meet A's zero-filled
  columns, so they add exact zeros -- unless a weight is inf or NaN, when ``0 * inf`` would put NaN into expert
  ``e``'s output.  The 3-D box is zero-filled past ``K`` per expert, as the ``tl`` twin's descriptor is.

Stores: rows past an expert's count must not be written
------------------------------------------------------
TMA stores clip only at the tensor's end, and the next expert's rows follow an expert's last rows in ``out``.  A
consumer block (``SUB_M`` rows) that lies wholly inside its expert is stored through the TMA descriptor of
``out`` (columns past ``N`` clipped by the TMA unit); the block holding an expert's last, partial rows is staged
the same way and read back from the staging buffer in a row-major layout of 16-byte vectors, then stored with
``st.global`` masked to ``rows < end`` and ``cols < N`` (one such block per expert and N tile; storing straight from
the accumulator's registers made ptxas serialise the ``wgmma``s, C7514); a block wholly past the end stores
nothing.  Chosen over per-expert descriptors (a device-side descriptor per expert needs a global scratch
allocation and a descriptor fence per tile) and over a 3-D view of ``out`` (the experts' rows are at arbitrary
offsets: no stride makes an expert a slice of one dimension).  The two kinds of store write disjoint rows, so they
need no ordering between them; the staging buffer's reuse waits for the TMA store that read it
(``tma.store_wait``, as in the core), and the masked store's reads of it sit between two barriers of the
consumer's partition (staged by every thread before, read by every thread after).

Numerics: fp32 accumulation by ``wgmma`` in K order, ``BLOCK_K`` at a time, one rounding to the output dtype: the
``tl`` twin's (:func:`twin_config`, the same tiles and K order) bit for bit on the GPU
(tests/test_moe_hopper.py ``test_grouped_gemm_gluon_matches_twin_on_gpu``).

Where it runs: NVIDIA sm_90.  On the simulator ``core="gluon"`` runs the twin (after the same checks, so the
simulator refuses what the GPU would); on another GPU it is refused naming ``core='tl'``.  Not on this core (each an
error before launch naming ``core='tl'``): ``gather_idx``, fp8 operands, operands TMA cannot read (``a``, ``out``
row-major with 16-byte aligned rows and bases; ``w`` with a unit last stride and 16-byte aligned strides).
"""
from __future__ import annotations

import functools

import torch

import ditron
from ditron import _compat

from ._common import cdiv, sm_count
from .gemm_hopper import (DEFAULT_CONFIG, HopperGemmConfig, _DTYPES, _partition_barrier, _tile_mn,
                          fence_async_shared, gl, gluon, kernel_constexprs, mbarrier, tma, tma_load, tma_store,
                          twin_config, warpgroup_mma, warpgroup_mma_wait)

#: the core's twin on the simulator (and what a GPU test compares the Gluon kernel with, bit for bit)
TWIN = ("ditron.kernels.moe.grouped_gemm(..., core='tl', config=ditron.kernels.gemm_hopper.twin_config(cfg)) "
        "(the tl grouped GEMM with the same tiles and K order)")


# ---------------------------------------------------------------------------
# device code
# ---------------------------------------------------------------------------

@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _expert_table(counts_ptr, E, M, BM: gl.constexpr, EP: gl.constexpr, WARPS: gl.constexpr):
    """The experts' rows and virtual tiles from the device counts, once per partition (a ``WARPS``-warp layout
    of ``max(EP, 32 * WARPS) >= E`` lanes): ``(rstart, cnt, tend, tiles, num_vm)`` -- expert ``e``'s first row, its rows below
    ``M`` (negative counts 0; counts cut at ``M``), the inclusive prefix sum of its ``BM``-row tiles, its tiles,
    and the number of virtual tiles (every one of them has a row)."""
    # at least one lane per thread: no replicated lanes in the scans and reductions
    LANES: gl.constexpr = EP if EP > 32 * WARPS else 32 * WARPS
    layout: gl.constexpr = gl.BlockedLayout([LANES // (32 * WARPS)], [32], [WARPS], [0])
    eidx = gl.arange(0, LANES, layout=layout)
    cnt = gl.load(counts_ptr + eidx, mask=eidx < E, other=0).to(gl.int64)
    cnt = gl.maximum(cnt, 0)
    rend = gl.associative_scan(cnt, 0, _add)
    rstart = rend - cnt
    cnt = gl.maximum(gl.minimum(rend, M) - rstart, 0)          # cut at M
    tiles = (cnt + BM - 1) // BM
    tend = gl.associative_scan(tiles, 0, _add)
    return rstart, cnt, tend, tiles, gl.sum(tiles, 0).to(gl.int32)


@gluon.jit
def _expert_tile(j, rstart, cnt, tend, tiles, BM: gl.constexpr):
    """Virtual tile ``j``'s ``(expert, first row, end row)`` (``j`` below the table's ``num_vm``): the expert whose
    tiles' range holds ``j``, as :func:`ditron.kernels.moe.expert_tile`."""
    e = gl.sum(gl.where(tend <= j, 1, 0), 0)
    sel = gl.arange(0, tend.shape[0], layout=tend.type.layout) == e
    t0 = gl.sum(gl.where(sel, tend - tiles, 0), 0)
    r0 = gl.sum(gl.where(sel, rstart, 0), 0)
    first = r0 + (j - t0) * BM
    end = r0 + gl.sum(gl.where(sel, cnt, 0), 0)
    return e, first.to(gl.int32), end.to(gl.int32)


@gluon.jit
def _grouped_producer(a_desc, w_desc, a_bufs, b_bufs, ready, empty, counts_ptr, E, GROUP_M: gl.constexpr,
                      STAGES: gl.constexpr, EP: gl.constexpr):
    """The TMA producer (one warp): for each of this program's tiles, its expert's A rows and ``w[e]``'s
    ``[BK, BN]`` boxes into the ring (``gemm_hopper._producer``'s slot / phase arithmetic)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[2]
    M = a_desc.shape[0]
    K = a_desc.shape[1]
    N = w_desc.shape[2]
    rstart, cnt, tend, tiles, num_vm = _expert_table(counts_ptr, E, M, BM, EP, 1)
    num_pid_n = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + w_desc.block_type.nbytes
    count = 0
    for tile in range(gl.program_id(0), num_vm * num_pid_n, gl.num_programs(0)):
        vm, pid_n = _tile_mn(tile, num_vm, num_pid_n, GROUP_M)
        e, first, end = _expert_tile(vm, rstart, cnt, tend, tiles, BM)
        off_n = pid_n * BN
        for ki in range(k_steps):
            s = count % STAGES
            # a fresh barrier is in phase 0: waiting for phase 1 passes (the ring starts empty)
            mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            tma_load(a_desc, [first, ki * BK], bar, a_bufs.index(s))
            tma_load(w_desc, [e, ki * BK, off_n], bar, b_bufs.index(s))
            count += 1


@gluon.jit
def _store_rows(c_smem, c_ptr, stride_cm, r0, end, c0, N, SUB_M: gl.constexpr, EPI_N: gl.constexpr):
    """``st.global`` of the staged block's rows below ``end`` and columns below ``N`` (an expert's last, partial
    block: rows past it are the next expert's), read back from the staging buffer in a row-major layout of 16-byte
    vectors.  (Storing from the ``wgmma`` accumulator's registers instead costs a pointer per element pair and
    makes ptxas serialise the consumer's ``wgmma``s, C7514.)"""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    _partition_barrier()                        # every thread's part of the block is staged
    x = c_smem.load(layout)
    _partition_barrier()                        # read by every thread before the buffer is written again
    rows = r0 + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, layout))
    cols = c0 + gl.arange(0, EPI_N, layout=gl.SliceLayout(0, layout))
    ptrs = c_ptr + gl.expand_dims(rows.to(gl.int64) * stride_cm, 1) + gl.expand_dims(cols, 0)
    mask = gl.expand_dims(rows < end, 1) & gl.expand_dims(cols < N, 0)
    gl.store(ptrs, x, mask=mask)


@gluon.jit
def _grouped_consumer(a_desc, w_desc, c_desc, c_ptr, stride_cm, a_bufs, b_bufs, ready, empty, turn, counts_ptr, E,
                      GROUP_M: gl.constexpr, STAGES: gl.constexpr, CID: gl.constexpr, PINGPONG: gl.constexpr,
                      EP: gl.constexpr):
    """One consumer warpgroup (``CID`` 0 or 1): ``gemm_hopper._consumer``'s fp16 / bf16 mainloop (one ``wgmma``
    in flight, a slot released when the MMA that read it has retired; ping-pong turns) on the grouped tiles,
    and the epilogue of the module docstring (TMA store of a block inside its expert, masked register store of
    an expert's partial last block)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[2]
    SUB_M: gl.constexpr = c_desc.block_type.shape[0]
    EPI_N: gl.constexpr = c_desc.block_type.shape[1]
    dtype: gl.constexpr = c_desc.dtype
    M = a_desc.shape[0]
    K = a_desc.shape[1]
    N = w_desc.shape[2]
    rstart, cnt, tend, tiles, num_vm = _expert_table(counts_ptr, E, M, BM, EP, 4)
    num_pid_n = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    c_smem = gl.allocate_shared_memory(dtype, [SUB_M, EPI_N], c_desc.layout)
    if PINGPONG:
        start = gl.program_id(0) + CID * gl.num_programs(0)
        step = 2 * gl.num_programs(0)
        row0: gl.constexpr = 0
    else:
        start = gl.program_id(0)
        step = gl.num_programs(0)
        row0: gl.constexpr = CID * SUB_M
    count = 0
    if PINGPONG:
        count = CID * k_steps                   # the other consumer's first tile comes first in the ring
    i = 0
    for tile in range(start, num_vm * num_pid_n, step):
        vm, pid_n = _tile_mn(tile, num_vm, num_pid_n, GROUP_M)
        e, first, end = _expert_tile(vm, rstart, cnt, tend, tiles, BM)
        acc = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout)
        if PINGPONG:
            mbarrier.wait(turn.index(CID), (i & 1) ^ (1 - CID))
        for ki in range(k_steps):
            s = count % STAGES
            mbarrier.wait(ready.index(s), (count // STAGES) & 1)
            a = a_bufs.index(s)
            if not PINGPONG:
                a = a.slice(row0, SUB_M, dim=0)
            b = b_bufs.index(s).reshape([BK, BN])
            acc = warpgroup_mma(a, b, acc, is_async=True)
            # keep this MMA in flight; the previous one has retired: its slot is free
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=ki > 0)
            count += 1
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - CID))     # every MMA of this tile is issued: the other's turn
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        i += 1
        if PINGPONG:
            count += k_steps                    # skip the other consumer's tile
        r0 = first + row0
        off_n = pid_n * BN
        out = acc.to(dtype)
        if r0 < end:
            # whole: the block lies in its expert -- TMA store (columns past N clipped), draining under the next
            # mainloop; else the expert's partial last block (rows from end on are the next expert's): staged the
            # same way, stored with a row mask
            whole = r0 + SUB_M <= end
            if EPI_N == BN:
                tma.store_wait(0)
                c_smem.store(out)
                if whole:
                    fence_async_shared()
                    tma_store(c_desc, [r0, off_n], c_smem)
                else:
                    _store_rows(c_smem, c_ptr, stride_cm, r0, end, off_n, N, SUB_M, EPI_N)
            else:
                lo, hi = out.reshape([SUB_M, 2, EPI_N]).permute(0, 2, 1).split()
                tma.store_wait(0)
                c_smem.store(lo)
                if whole:
                    fence_async_shared()
                    tma_store(c_desc, [r0, off_n], c_smem)
                    tma.store_wait(0)
                else:
                    _store_rows(c_smem, c_ptr, stride_cm, r0, end, off_n, N, SUB_M, EPI_N)
                c_smem.store(hi)
                if whole:
                    fence_async_shared()
                    tma_store(c_desc, [r0, off_n + EPI_N], c_smem)
                else:
                    _store_rows(c_smem, c_ptr, stride_cm, r0, end, off_n + EPI_N, N, SUB_M, EPI_N)
    tma.store_wait(0)


@gluon.jit
def grouped_gemm_ws_kernel(a_desc, w_desc, c_desc, c_ptr, stride_cm, counts_ptr, E, GROUP_M: gl.constexpr,
                           STAGES: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                           PRODUCER_REGS: gl.constexpr, EP: gl.constexpr):
    """Persistent warp-specialised grouped GEMM (``num_warps=4``: the default partition is consumer 0; workers:
    consumer 1 (4 warps), the producer (1 warp)): ``a_desc`` of ``a [M, K]``, ``w_desc`` of ``w [E, K, N]``
    (3-D boxes), ``c_desc`` of ``out [M, N]`` and ``c_ptr`` / ``stride_cm`` for the masked partial blocks,
    ``counts_ptr[0:E]`` on the device (``EP``: a power of two >= ``E``)."""
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1 if PINGPONG else 2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    gl.warp_specialize([
        (_grouped_consumer, (a_desc, w_desc, c_desc, c_ptr, stride_cm, a_bufs, b_bufs, ready, empty, turn,
                             counts_ptr, E, GROUP_M, STAGES, 0, PINGPONG, EP)),
        (_grouped_consumer, (a_desc, w_desc, c_desc, c_ptr, stride_cm, a_bufs, b_bufs, ready, empty, turn,
                             counts_ptr, E, GROUP_M, STAGES, 1, PINGPONG, EP)),
        (_grouped_producer, (a_desc, w_desc, a_bufs, b_bufs, ready, empty, counts_ptr, E, GROUP_M, STAGES, EP)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---------------------------------------------------------------------------
# host
# ---------------------------------------------------------------------------

ALT = "core='tl'"


def _tma_rows_ok(t) -> bool:
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(
        (s * t.element_size()) % 16 == 0 for s in t.stride()[:-1])


def check_call(op, a, w, out, gather_idx, fp8, config):
    """The checks of a ``core="gluon"`` call, on every device (the simulator refuses what the GPU would), after
    grouped_gemm's own: returns the validated :class:`HopperGemmConfig`."""
    E_ = ditron.DitronError
    if gather_idx is not None:
        raise E_(f"{op}: core='gluon' does not take gather_idx yet (its A rows come through TMA boxes of "
                 f"contiguous rows); use {ALT}, which fuses the gather into its A loads")
    if fp8:
        raise E_(f"{op}: core='gluon' takes float16 / bfloat16 operands; fp8 grouped GEMMs run on {ALT}")
    if config is not None and not isinstance(config, HopperGemmConfig):
        raise E_(f"{op}: core='gluon' takes config=a ditron.kernels.gemm_hopper.HopperGemmConfig (or None), not "
                 f"{type(config).__name__}; a GemmConfig is for {ALT}")
    cfg = (config or DEFAULT_CONFIG).validate(op)
    for name, t in (("a", a), ("w", w), ("out", out)):
        if not _tma_rows_ok(t):
            raise E_(f"{op}: core='gluon' reads '{name}' through TMA: it needs a unit last stride and 16-byte "
                     f"aligned base and strides (got strides {tuple(t.stride())} of {t.dtype}); make it "
                     f".contiguous() with a multiple of 8 columns, or use {ALT}")
    return cfg


def supported(device) -> bool:
    from .gemm_hopper import supported as _sup
    return _sup(device)


def check_device(op, device):
    """A CUDA device that is not a Hopper one (e.g. an AMD GPU): refused naming ``core='tl'``."""
    if torch.device(device).type == "cuda" and not supported(device):
        raise ditron.DitronError(f"{op}: core='gluon' runs on Hopper (sm_90) GPUs only, not on "
                                 f"{torch.cuda.get_device_name(device)}: use {ALT}")


@functools.lru_cache(maxsize=64)
def _layouts(cfg: HopperGemmConfig, dtype):
    g = _DTYPES[dtype]
    return (gl.NVMMASharedLayout.get_default_for([cfg.block_m, cfg.block_k], g),
            gl.NVMMASharedLayout.get_default_for([1, cfg.block_k, cfg.block_n], g),
            gl.NVMMASharedLayout.get_default_for([cfg.consumer_rows, cfg.block_n // cfg.epilogue_split], g))


def descriptors(a, w, out, cfg: HopperGemmConfig):
    """TMA descriptors of ``a [M, K]``, ``w [E, K, N]`` (3-D ``[1, BK, BN]`` boxes) and ``out [M, N]``."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    la, lw, lc = _layouts(cfg, a.dtype)
    return (TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k], la),
            TensorDescriptor.from_tensor(w, [1, cfg.block_k, cfg.block_n], lw),
            TensorDescriptor.from_tensor(out, [cfg.consumer_rows, cfg.block_n // cfg.epilogue_split], lc))


def num_programs(M, N, E, cfg: HopperGemmConfig, sms: int) -> int:
    """Programs of a launch: at most one per SM, and no more than the virtual tiles can feed
    (``cdiv(M, BM) + E`` M tiles at most; pingpong: two tiles a program)."""
    tiles = (cdiv(M, cfg.block_m) + E) * cdiv(N, cfg.block_n)
    if cfg.mode == "pingpong":
        return max(1, min(sms, cdiv(tiles, 2)))
    return max(1, min(sms, tiles))


def launch(a, w, counts, out, cfg: HopperGemmConfig, num_programs_=None):
    """Launch the Gluon grouped GEMM (the call checked by :func:`check_call`, on a Hopper GPU)."""
    from .moe import expert_pow2
    M = a.shape[0]
    E, _, N = w.shape
    a_desc, w_desc, c_desc = descriptors(a, w, out, cfg)
    P = int(num_programs_ or num_programs(M, N, E, cfg, sm_count(a.device)))
    grouped_gemm_ws_kernel[(P,)](a_desc, w_desc, c_desc, out, out.stride(0), counts, E, num_warps=4,
                                 EP=expert_pow2(E), **kernel_constexprs(cfg))
    return out


def twin(cfg: HopperGemmConfig):
    """The tl grouped GEMM's config with the Gluon kernel's tiles and K order (:func:`gemm_hopper.twin_config`)."""
    return twin_config(cfg)


# ---------------------------------------------------------------------------
# compile on a CPU
# ---------------------------------------------------------------------------

def compile_sm90(cfg: HopperGemmConfig | None = None, dtype=torch.bfloat16, M=1024, N=1024, K=1024, E=8,
                 target="sm_90a"):
    """Compile :func:`grouped_gemm_ws_kernel` for ``target`` without a GPU (descriptor types from CPU tensors of
    the given shapes); returns the compiled kernel (``.asm["ttgir"]``, ``["ptx"]``, ``.metadata``)."""
    from ditron.target import parse_target
    from .moe import expert_pow2
    tgt = parse_target(target)
    if tgt.backend != "cuda" or tgt.capability != 90:
        raise ditron.DitronError(f"moe_hopper: the Gluon grouped GEMM is for sm_90a only, not {tgt.name}; "
                                 f"elsewhere grouped_gemm runs {ALT}")
    cfg = (cfg or DEFAULT_CONFIG).validate("moe_hopper")
    a = torch.empty((M, K), dtype=dtype)
    w = torch.empty((E, K, N), dtype=dtype)
    c = torch.empty((M, N), dtype=dtype)
    descs = descriptors(a, w, c, cfg)
    sig = {"a_desc": _compat.mangle_arg(descs[0]), "w_desc": _compat.mangle_arg(descs[1]),
           "c_desc": _compat.mangle_arg(descs[2]), "c_ptr": "*bf16" if dtype == torch.bfloat16 else "*fp16",
           "stride_cm": "i32", "counts_ptr": "*i32", "E": "i32"}
    consts = dict(kernel_constexprs(cfg), EP=expert_pow2(E))
    for k in consts:
        sig[k] = "constexpr"
    src = _compat.gluon_ast_source(grouped_gemm_ws_kernel, sig, consts)
    return _compat.compile_source(src, tgt.to_triton(), {"num_warps": 4})


__all__ = ["grouped_gemm_ws_kernel", "compile_sm90", "check_call", "launch", "descriptors", "num_programs", "TWIN",
           "twin"]
