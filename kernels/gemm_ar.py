"""GEMM-AllReduce written in ditron.language: ``out = sum_s(a_s @ b_s)`` on
every rank (the row-parallel layer of tensor parallelism).

    ctx = create_gemm_ar_context(max_m, n, torch.bfloat16)   # collective, once
    out = gemm_ar(a, b, ctx)                  # a: [M, K_r], b: [K_r, N]; out: [M, N] on every rank
    out = gemm_ar(a, b, ctx, out=out, method="two_shot")

Every rank passes its own ``a`` (``[M, K_r]``) and ``b`` (``[K_r, N]``): ``M``
(``1 <= M <= max_m``, any value) and ``N`` (``== n``) are the same on every
rank, ``K_r`` may differ.  ``out`` is in ``a``'s dtype (float16 / bfloat16);
the GEMM accumulates in float32, each rank's partial product is rounded once
to the dtype, and the reduction sums the partials in float32.  ``a``, ``b``
and ``out`` may have any strides.

One launch: persistent GEMM + all-reduce consumers
--------------------------------------------------
:func:`gemm_ar_kernel` runs ``G + R`` programs.  Programs ``0 .. G-1`` are a
persistent GEMM (the zoo's core, :func:`kernels.gemm.gemm_tile`): program
``g`` computes tiles ``g, g + G, ...`` of the ``dl.swizzle_2d`` order (the
same order on every rank, so every rank finishes tile ``t`` at about the same
time and the reduction of the early tiles overlaps the GEMM of the later
ones), hands each tile to the reduction and signals it.  Programs
``G .. G+R-1`` are the consumers: consumer ``c`` takes the tiles
``c, c + R, ...`` in the same order, waits for them and reduces them.

On GPUs ``G + R`` is at most the number of SMs (checked when the context is
created; each program needs at most one SM's resources), so all programs are
resident at once and the spinning consumers can never keep a GEMM program
from being scheduled (a kernel running concurrently on another stream can
only delay them, unless it spins too).  The GEMM programs also have the lower
program ids, so they are dispatched first.  On the simulator a waiting
program lends its turn to the others, so the protocol runs there unchanged.

Methods (``M`` rows, ``T`` tiles of ``BLOCK_M x BLOCK_N``, ``W`` ranks):

* ``one_shot``: a GEMM program stores its tile into this rank's partial
  buffer and signals every rank; a consumer waits until all ``W`` sources
  signalled tile ``t``, reads the ``W`` partial tiles (``dl.symm_at`` loads
  on the node), sums them in rank order in fp32 and writes ``out``.  Every
  rank reads ``W`` tiles per output tile; lowest latency.
* ``two_shot``: tile ``t`` is owned by rank ``t % W``.  A GEMM program pushes
  its tile into the owner's reduction slot for this source and signals the
  owner; the owner's consumers sum the ``W`` contributions, write ``out``
  and every other rank's result buffer and signal it; every rank's consumers
  copy the tiles it does not own from its result buffer into ``out``.  Each
  rank moves ``2 (W - 1) / W`` of the output: for large outputs.
* ``multimem_one_shot`` / ``multimem_two_shot``: the same tile schemes, with
  ``dl.multimem_ld_reduce`` over the partial buffers' multicast address
  (``shmem.remote_mc_ptr``) instead of ``W`` loads, and (two-shot) one
  ``dl.multimem_st`` into every rank's result buffer.  One node only; NVLink
  multicast is off on the lent GPUs, so on GPUs these are compile-verified
  (tests compile them for sm_90a) and run on the simulator.
* ``rs_ag``: no fused kernel: :func:`kernels.gemm_rs.gemm_rs` with the
  copy-engine method (the partials travel by copy engine under the GEMM)
  into this rank's rows of ``out``, then :func:`kernels.all_gather.all_gather`'s
  copy-engine method in place.  One node, ``M`` a multiple of ``W``.
* ``auto``: :func:`choose_method`.

Ranks on other nodes (``one_shot``, ``two_shot``): a tile is staged in the
sender's own partial buffer and sent with ``shmem.putmem_signal_block``
(data and the 64-bit signal in one call), as in kernels/all_gather.py;
ranks of the node use ``dl.symm_at`` stores / loads and ``dl.notify``.

Buffers and signals (symmetric, allocated once by the context; ``TM``: tiles
of a ``max_m x n`` output).  Tiles are stored whole and contiguous
(``BLOCK_M * BLOCK_N`` elements, tile ``t`` at ``t * BLOCK_M * BLOCK_N``):
one ``putmem_signal`` moves a tile, multimem needs no masks, and the rows /
columns past the matrix hold finite values that the final store to ``out``
masks off.

* ``part[2][S][TM tiles]`` (dtype): slot 0 holds this rank's partial tiles
  (node peers read it there with ``symm_at``); slots ``1 .. S-1``
  (``S = 1 + W - ranks_per_node``) receive the partial tiles of the ranks
  on other nodes (one_shot), see :func:`_slot`.
* ``red[2][W][ceil(TM / W) tiles]`` (dtype): two-shot contributions; on the
  owner of tile ``t``, slot ``s`` tile ``t // W`` holds source ``s``'s tile.
* ``res[2][TM tiles]`` (dtype): two-shot reduced tiles, written by their owner.
* ``flag[2][TM][W]`` (int64): word ``[p][t][s]`` equals ``e + 1`` when source
  ``s``'s tile ``t`` of call ``e`` is readable by this rank (one-shot: in
  ``s``'s partial buffer, or pushed here; two-shot, only on the owner: in
  ``red``).  A consumer waits for the ``W`` consecutive words of a tile at once.
* ``done[2][TM]`` (int64): word ``[p][t]`` equals ``e + 1`` when reduced tile
  ``t`` of call ``e`` is in this rank's ``res`` (two-shot).

Reuse (kernels/_common.py): a call reads its epoch ``e`` from the device-side
counter ``ctx.calls``, signals and waits for the value ``e + 1`` and uses
parity ``e % 2`` of every buffer and signal word.  In every method, every
rank's consumers wait for tile 0, whose reduction needs a signal that every
rank's GEMM programs send in this call (one-shot: they wait for all ``W``
sources of every tile; two-shot: rank 0 owns tile 0 and waits for all
sources, every other rank waits for rank 0's result).  So no rank finishes
call ``e`` before every rank has started call ``e``: a rank is at most one
call ahead of any peer, its writes of call ``e + 1`` go to the other
parity, and it writes parity ``e % 2`` again (call ``e + 2``, after its own
call ``e + 1`` completed, which needed every rank to start call ``e + 1``,
i.e. to finish call ``e``) only when every rank has finished reading it.
Signal words are never reset; a wait for ``e + 1`` cannot be satisfied by an
older call.  Methods may change from call to call (the same word is always
written by the same source for the same tile and epoch).  No host epoch, no
host sync: calls can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem

from ._common import CollectiveContext, enter, op_fields, epoch_begin, epoch_end, sm_count, topology
from ._common import cdiv
from .all_gather import _put_chunk
from .all_reduce import AUTO_MULTIMEM_ON_GPU, AUTO_ONE_SHOT_MAX_BYTES, multicast_available
from . import scaling
from .gemm import (GemmConfig, check_fp8_config, check_operands, default_config, ensure_tma_allocator, fp8_tma_ok,
                   gemm_tile_at, operand_descriptors, scale_key, scale_plan, store_tile, tile_rows, tma_ok)

METHODS = ("auto", "one_shot", "two_shot", "multimem_one_shot", "multimem_two_shot", "rs_ag")
#: the GEMM's core: the tl core (every method, target and the simulator) or the Gluon Hopper core, which runs
#: method "rs_ag" (GEMM-RS's copy-engine GEMM on it: kernels/gemm_rs_hopper.py)
CORES = ("tl", "gluon")
MULTIMEM_METHODS = ("multimem_one_shot", "multimem_two_shot")
_METHOD_ID = {"one_shot": 0, "two_shot": 1, "multimem_one_shot": 2, "multimem_two_shot": 3}
_GEMM_DTYPES = (torch.float16, torch.bfloat16)

#: GPU default of reduce programs (the rest of the SMs run the GEMM).
#: TODO(perf): tune on GPUs (the kernel has not run on GPUs yet).
GPU_REDUCE_PROGRAMS = 16
#: Simulator defaults: every program is interpreted, keep the grid small.
SIM_GEMM_PROGRAMS = 2
SIM_REDUCE_PROGRAMS = 2


# ---------------------------------------------------------------------------
# device helpers
# ---------------------------------------------------------------------------

@triton.jit
def _slot(src, rcv, LW, NN):
    """Slot of source ``src``'s partial tiles in receiver ``rcv``'s ``part``:
    0 when ``src`` is on ``rcv``'s node (``rcv`` reads ``src``'s own slot 0
    with ``symm_at``), else ``1 +`` the position of ``src`` among the ranks of
    the other nodes, counted from the node after ``rcv``'s."""
    dn = (src // LW - rcv // LW + NN) % NN
    return tl.where(dn == 0, 0, 1 + (dn - 1) * LW + src % LW)


@triton.jit
def _off_node(rank, node, LW, MULTI_NODE: tl.constexpr):
    """Whether ``rank`` is on another node than ``node`` (a constant False in
    one-node kernels, so that their branches for other nodes are not compiled)."""
    if MULTI_NODE:
        return rank // LW != node
    else:
        return False


@triton.jit
def _tile_offsets(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]`` element offsets of a tile stored contiguously."""
    return tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]


@triton.jit
def _tile_pid(t, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile ``t`` of the ``dl.swizzle_2d`` order: the same
    order on every rank, for the GEMM and the reduce programs."""
    return dl.swizzle_2d(t, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)


@triton.jit
def _store_out(out_ptr, stride_cm, stride_cn, t, M, N, v, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               GROUP_M: tl.constexpr):
    """The valid part of tile ``t`` (``v``: ``[BLOCK_M, BLOCK_N]``) into ``out``."""
    pid_m, pid_n = _tile_pid(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows, row_ok, _r = tile_rows(pid_m, M, BLOCK_M)
    cols, col_ok, _c = tile_rows(pid_n, N, BLOCK_N)
    store_tile(out_ptr, stride_cm, stride_cn, rows, row_ok, cols, col_ok, v)


# ---------------------------------------------------------------------------
# the kernel
# ---------------------------------------------------------------------------

# M, max_tiles, G: 1 would become a constexpr (and they change from call to call);
# N and K stay specialised, as in kernels.gemm.gemm_kernel (vectorised B loads)
@ditron.jit(do_not_specialize=["M", "max_tiles", "G"])
def gemm_ar_kernel(a_ptr, b_ptr, out_ptr, part_ptr, red_ptr, res_ptr, flag_ptr, done_ptr, calls_ptr,
                   M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, max_tiles, G,
                   sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn,
                   METHOD: tl.constexpr, WORLD: tl.constexpr, MULTI_NODE: tl.constexpr,
                   ELEM_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr,
                   SCALE: tl.constexpr = 0, GK: tl.constexpr = 1, GN: tl.constexpr = 1, B_T: tl.constexpr = False):
    """One call of gemm_ar (see the module docstring).  ``METHOD``: 0
    one_shot, 1 two_shot, 2 multimem_one_shot, 3 multimem_two_shot.
    ``max_tiles``: tiles of the context's ``max_m x n`` (buffer capacity);
    ``G``: GEMM programs, the other ``num_programs - G`` reduce.  fp8
    operands: ``SCALE`` and the scale arguments (kernels/scaling.py; ``B_T``:
    b's TMA descriptor is of ``b^T``); the partials are the context's dtype."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    me, W, LW, node, NN, local = topology()
    TILE: tl.constexpr = BLOCK_M * BLOCK_N
    DT: tl.constexpr = part_ptr.dtype.element_ty
    mt = max_tiles.to(tl.int64)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    offs = _tile_offsets(BLOCK_M, BLOCK_N)
    # this call's parity of every buffer and signal array
    part = part_ptr + par * ((1 + W - LW) * mt * TILE)          # own partial tiles: slot 0
    red = red_ptr + par * (WORLD * ((mt + WORLD - 1) // WORLD) * TILE)
    red_slot = (mt + WORLD - 1) // WORLD * TILE
    res = res_ptr + par * (mt * TILE)
    flag = flag_ptr + par * (mt * WORLD)
    done = done_ptr + par * mt
    pid = tl.program_id(0)

    if pid < G:
        # ------------------------- persistent GEMM -------------------------
        a_desc, b_desc = operand_descriptors(a_ptr, b_ptr, M, N, K, stride_am, stride_bk, BLOCK_M, BLOCK_N,
                                             BLOCK_K, TMA, B_T, stride_bn)
        for t in range(pid, num_tiles, G):
            pid_m, pid_n = _tile_pid(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            _r, _rok, _c, _cok, acc = gemm_tile_at(a_ptr, b_ptr, a_desc, b_desc, pid_m, pid_n, M, N, K, stride_am,
                                                   stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K,
                                                   EVEN_K, TMA, sa_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk,
                                                   stride_sbn, SCALE, GK, GN, B_T)
            v = acc.to(DT)
            t64 = tl.cast(t, tl.int64)
            own = part + t64 * TILE
            sig = flag + t64 * WORLD + me              # word [t][me]
            if METHOD == 1:
                # two-shot: into the owner's red slot for this source
                o = t % WORLD
                dst = red + me * red_slot + (t64 // WORLD) * TILE
                if _off_node(o, node, LW, MULTI_NODE):
                    tl.store(own + offs, v)           # staged: the remote put reads it
                    _put_chunk(dst, own, 0, TILE, sig, val, o, ELEM_BYTES)
                else:
                    tl.store(dl.symm_at(dst + offs, o), v)
                    dl.notify(sig, o, signal=val, sig_op="set", comm_scope="intra_node")
            else:
                tl.store(own + offs, v)
                if METHOD == 3:
                    dl.notify(sig, t % WORLD, signal=val, sig_op="set", comm_scope="intra_node")
                else:
                    if MULTI_NODE:
                        for k in range(1, NN):
                            for l in range(0, LW):
                                peer = ((node + k) % NN) * LW + (local + l) % LW
                                dst = part + _slot(me, peer, LW, NN) * (mt * TILE) + t64 * TILE
                                _put_chunk(dst, own, 0, TILE, sig, val, peer, ELEM_BYTES)
                    for k in range(0, LW):
                        peer = node * LW + (local + k) % LW
                        dl.notify(sig, peer, signal=val, sig_op="set", comm_scope="intra_node")
    else:
        # ------------------------- reduce programs -------------------------
        c = pid - G
        R = tl.num_programs(0) - G
        if METHOD == 0 or METHOD == 2:
            if METHOD == 2:
                mc = shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, part_ptr) + par * (mt * TILE)
            for t in range(c, num_tiles, R):
                t64 = tl.cast(t, tl.int64)
                tok = dl.wait(flag + t64 * WORLD, WORLD, "sys", "acquire", waitValue=val)
                if METHOD == 2:
                    acc = dl.multimem_ld_reduce(dl.consume_token(mc + t64 * TILE + offs, tok), op="sum")
                else:
                    base = dl.consume_token(part + t64 * TILE + offs, tok)
                    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                    for s in tl.static_range(WORLD):      # rank order: the same bits on every rank
                        if _off_node(s, node, LW, MULTI_NODE):
                            p = base + _slot(s, me, LW, NN) * (mt * TILE)     # pushed here
                        else:
                            p = dl.symm_at(base, s)
                        acc += tl.load(p).to(tl.float32)
                _store_out(out_ptr, stride_cm, stride_cn, t, M, N, acc, BLOCK_M, BLOCK_N, GROUP_M)
        else:
            if METHOD == 3:
                mc = shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, part_ptr) + par * (mt * TILE)
                mc_res = shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, res_ptr) + par * (mt * TILE)
            # phase 1: reduce the tiles this rank owns (t % W == me)
            for t in range(me + c * WORLD, num_tiles, R * WORLD):
                t64 = tl.cast(t, tl.int64)
                tok = dl.wait(flag + t64 * WORLD, WORLD, "sys", "acquire", waitValue=val)
                mine = res + t64 * TILE
                if METHOD == 3:
                    v = dl.multimem_ld_reduce(dl.consume_token(mc + t64 * TILE + offs, tok), op="sum").to(DT)
                    dl.multimem_st(mc_res + t64 * TILE + offs, v)      # every rank's res, this one's too
                else:
                    src = dl.consume_token(red + (t64 // WORLD) * TILE + offs, tok)
                    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                    for s in tl.static_range(WORLD):
                        acc += tl.load(src + s * red_slot).to(tl.float32)
                    v = acc.to(DT)
                    if MULTI_NODE:
                        tl.store(mine + offs, v)      # staged: the remote puts read it
                        for k in range(1, NN):
                            for l in range(0, LW):
                                peer = ((node + k) % NN) * LW + (local + l) % LW
                                _put_chunk(mine, mine, 0, TILE, done + t64, val, peer, ELEM_BYTES)
                    for k in range(1, LW):
                        tl.store(dl.symm_at(mine + offs, node * LW + (local + k) % LW), v)
                _store_out(out_ptr, stride_cm, stride_cn, t, M, N, v, BLOCK_M, BLOCK_N, GROUP_M)
                for k in range(1, LW):
                    dl.notify(done + t64, node * LW + (local + k) % LW, signal=val, sig_op="set",
                              comm_scope="intra_node")
            # phase 2: copy the tiles the other ranks reduced
            for t in range(c, num_tiles, R):
                if t % WORLD != me:
                    t64 = tl.cast(t, tl.int64)
                    tok = dl.wait(done + t64, 1, "sys", "acquire", waitValue=val)
                    v = tl.load(dl.consume_token(res + t64 * TILE + offs, tok))
                    _store_out(out_ptr, stride_cm, stride_cn, t, M, N, v, BLOCK_M, BLOCK_N, GROUP_M)
    epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

class GemmArContext(CollectiveContext):
    """Symmetric buffers and signals of :func:`gemm_ar` (see the module docstring)."""

    op = "gemm_ar"
    creator = "create_gemm_ar_context"

    def __init__(self, max_m, n, dtype, world=None, config: GemmConfig | None = None, gemm_programs=None,
                 reduce_programs=None, multicast=None, core="tl", gluon_config=None):
        E = ditron.DitronError
        if core not in CORES:
            raise E(f"gemm_ar: core={core!r}; use one of {', '.join(CORES)}")
        if dtype not in _GEMM_DTYPES + (torch.float32,):
            raise E(f"gemm_ar: dtype {dtype} is not supported (use float16 or bfloat16, or float32 with fp8 "
                    "operands: the partials' and the result's dtype)")
        if int(max_m) < 1 or int(n) < 1:
            raise E(f"gemm_ar: max_m ({max_m}) and n ({n}) must be >= 1")
        super().__init__(int(max_m) * int(n), dtype, world)
        w = self.world
        W = self.world_size
        self.max_m = int(max_m)
        self.n = int(n)
        self.sim = w.backend == "sim"
        self.multi_node = w.nnodes > 1
        self.esize = torch.empty((), dtype=dtype).element_size()
        # K is per rank and unknown here; default_config chooses by the output's tiles
        self.config = (config or default_config(self.max_m, self.n, 0, dtype, self.device)).validate("gemm_ar")
        if self.sim:
            self.gemm_programs = int(gemm_programs or SIM_GEMM_PROGRAMS)
            self.reduce_programs = int(reduce_programs or SIM_REDUCE_PROGRAMS)
        else:
            sms = sm_count(self.device)
            self.reduce_programs = int(reduce_programs or GPU_REDUCE_PROGRAMS)
            self.gemm_programs = int(gemm_programs or max(1, sms - self.reduce_programs))
            if self.gemm_programs + self.reduce_programs > sms:
                raise E(f"gemm_ar: gemm_programs ({self.gemm_programs}) + reduce_programs "
                        f"({self.reduce_programs}) must not exceed the {sms} SMs: the reduce programs spin "
                        "until tiles are ready, so every program must be resident at once")
        if self.gemm_programs < 1 or self.reduce_programs < 1:
            raise E(f"gemm_ar: gemm_programs ({self.gemm_programs}) and reduce_programs "
                    f"({self.reduce_programs}) must be >= 1")
        if multicast is None:
            multicast = multicast_available(w)
        elif multicast and not self.sim and not multicast_available(w):
            raise E("gemm_ar: multicast=True, but this world has no NVLink multicast (it is switched off on "
                    "these machines)")
        self.multicast = bool(multicast) and not self.multi_node
        self._rs_ag = None          # method "rs_ag": (gemm_rs context, all_gather context), made at its first call
        self.core = core
        self.gluon_config = self.gluon_fp8_config = self._gluon_given = None
        if core == "gluon":
            # method "rs_ag" only: gemm_rs's copy-engine GEMM on the Gluon core, then all_gather's copy engine
            if self.multi_node:
                raise E("gemm_ar: core='gluon' runs method='rs_ag' (the copy engine: one node); this world has "
                        f"{w.nnodes} nodes: use core='tl'")
            from .gemm_rs import gluon_core_config
            self.gluon_config, self.gluon_fp8_config = gluon_core_config("gemm_ar", self, dtype, gluon_config)
            self._gluon_given = gluon_config        # what rs_ag's GEMM-RS context is created with
            # the fused kernel's buffers are not needed: rs_ag's two contexts hold what it uses
            self.max_tiles = 0
            self.part = self.red = self.res = self.flag = self.done = None
            ditron.barrier_all()
            return
        if gluon_config is not None:
            raise E("gemm_ar: gluon_config applies to core='gluon'")
        cfg = self.config
        self.max_tiles = cdiv(self.max_m, cfg.block_m) * cdiv(self.n, cfg.block_n)
        tile = cfg.block_m * cfg.block_n
        slots = 1 + W - w.local_world_size
        self.part = self.symm((2, slots, self.max_tiles * tile), dtype, "part")
        self.red = self.symm((2, W, cdiv(self.max_tiles, W) * tile), dtype, "red")
        self.res = self.symm((2, self.max_tiles * tile), dtype, "res")
        self.flag = self.symm((2, self.max_tiles, W), torch.int64, "flag")
        self.done = self.symm((2, self.max_tiles), torch.int64, "done")
        ditron.barrier_all()          # every rank's zeroed signals exist before any peer writes them

    def __repr__(self):
        return (f"GemmArContext(max_m={self.max_m}, n={self.n}, dtype={self.dtype}, world_size={self.world_size}, "
                f"config={self.config}, gemm_programs={self.gemm_programs}, "
                f"reduce_programs={self.reduce_programs}, multicast={self.multicast}"
                + (f", core='gluon', gluon_config={self.gluon_config}" if self.core == "gluon" else "") + ")")


def create_gemm_ar_context(max_m, n, dtype, world=None, **options) -> GemmArContext:
    """Allocate gemm_ar's symmetric buffers and signals for outputs of up to
    ``max_m`` rows and exactly ``n`` columns of ``dtype`` (float16 /
    bfloat16).  Collective: every rank calls it with the same arguments, in
    the same order as its other symmetric allocations.  ``options``:

    * ``config``: a :class:`kernels.gemm.GemmConfig` (default
      :func:`kernels.gemm.default_config`; the simulator's small tiles there);
      the buffers are laid out in its tiles.  ``config.flatten`` is not used:
      the persistent loop signals after every tile;
    * ``gemm_programs``, ``reduce_programs``: the programs of each role
      (GPU: ``SMs - 16`` and 16, at most the SM count together; simulator: 2 and 2);
    * ``multicast``: let ``auto`` pick the multimem methods (default: what
      the world reports, see :func:`kernels.all_reduce.multicast_available`).

    Memory per rank: about ``(2 * (S + 2)) * max_m * n`` elements (``S = 1 +
    ranks on other nodes``, tiles rounded up) and ``2 * (W + 1)`` int64 words
    per tile.

    * ``core``: the GEMM's core -- ``"tl"`` (default; every method, target
      and the simulator) or ``"gluon"``, the warp-specialised Hopper core
      (sm_90, one node; float16 / bfloat16 operands, or fp8 operands with
      their scales on the core's fp8 path, a float32 context taking fp8
      operands only): such a context runs
      method ``"rs_ag"`` (``"auto"`` picks it), whose GEMM-RS runs on the
      Gluon core (kernels/gemm_rs_hopper.py; ``gluon_config`` a
      ``HopperGemmConfig``), and allocates no buffers of the fused methods;
      on the simulator it runs the tl GEMM, the Gluon GEMM's twin."""
    return GemmArContext(max_m, n, dtype, world, **options)


def choose_method(ctx: GemmArContext, m: int) -> str:
    """What ``method="auto"`` runs for an ``[m, n]`` output of ``S`` bytes.

    Per rank, one-shot reads the ``W - 1`` peers' partials (``(W - 1) S``
    bytes) in one phase; two-shot reads and writes ``(W - 1) / W * S`` each in
    two phases with a signal between them.  At ``W = 2`` both move ``S`` bytes,
    so one-shot, with one phase less, wins at every size (measured on 2 x H200
    at the paper's shapes: one_shot 1.06x, two_shot 0.94x cuBLAS+NCCL,
    shared/bench/h200x2-2026-11-23.md); above 2 ranks one-shot up to
    all_reduce's one-shot threshold (smaller for more than 4 ranks, since
    every rank reads ``W`` partials), two-shot above (4 x H200: two_shot 0.97x,
    one_shot 0.84x; bench/results/h200x4.md).  The multimem variants where the
    context allows multicast (the simulator, one node, or a GPU world with
    multicast and ``AUTO_MULTIMEM_ON_GPU``).  A ``core="gluon"`` context: ``"rs_ag"``, its one method."""
    if ctx.core == "gluon":
        return "rs_ag"
    nbytes = m * ctx.n * ctx.esize
    mm = ctx.multicast and (ctx.sim or AUTO_MULTIMEM_ON_GPU)
    if ctx.world_size <= 2 or nbytes <= AUTO_ONE_SHOT_MAX_BYTES * 4 // max(4, ctx.world_size):
        return "multimem_one_shot" if mm else "one_shot"
    return "multimem_two_shot" if mm else "two_shot"


def _check(ctx, a, b, out, method):
    E = ditron.DitronError
    if not isinstance(ctx, GemmArContext):
        raise E("gemm_ar: ctx must come from create_gemm_ar_context()")
    if method not in METHODS:
        raise E(f"gemm_ar: unknown method {method!r}; use one of {', '.join(METHODS)}")
    fp8 = scaling.is_fp8(a)
    check_operands("gemm_ar", a, b, out, (a.shape[0], ctx.n) if isinstance(a, torch.Tensor) else None,
                   ctx.dtype if fp8 else None)
    M, N = a.shape[0], b.shape[1]
    if not fp8 and a.dtype != ctx.dtype:
        raise E(f"gemm_ar: argument 'a' is {a.dtype}, the context was created for {ctx.dtype} (fp8 operands "
                "write the context's dtype; fp16 / bf16 operands must be of it)")
    dev = torch.device(ctx.device)
    if a.device.type != dev.type or (dev.index is not None and a.device.index != dev.index):
        raise E(f"gemm_ar: argument 'a' is on {a.device}, this rank works on {ctx.device}")
    if M > ctx.max_m:
        raise E(f"gemm_ar: argument 'a' has M={M} rows, more than the context's max_m={ctx.max_m}; "
                "create a larger context")
    if N != ctx.n:
        raise E(f"gemm_ar: argument 'b' has N={N} columns, the context was created for n={ctx.n}")
    gluon = ctx.core == "gluon"
    if gluon and method not in ("auto", "rs_ag"):
        raise E(f"gemm_ar: core='gluon' runs method='rs_ag' (GEMM-RS's copy-engine GEMM on the Gluon core, then "
                f"the copy-engine all-gather); method={method!r} is the tl core's: create the context with "
                "core='tl'")
    if gluon and not fp8:
        from .gemm_rs import check_gluon_16bit
        check_gluon_16bit("gemm_ar", ctx)
    if method == "rs_ag" or gluon:
        if ctx.multi_node:
            raise E("gemm_ar: method='rs_ag' (copy engine) needs every rank on one node; use one_shot or two_shot")
        if M % ctx.world_size:
            raise E(f"gemm_ar: method='rs_ag' needs M ({M}) to be a multiple of the world size "
                    f"({ctx.world_size}); " + ("the other methods take any M: create the context with core='tl'"
                                               if gluon else "use one_shot or two_shot"))
        if out is not None and not out.is_contiguous():
            raise E("gemm_ar: method='rs_ag' needs a contiguous 'out'")
    if method in MULTIMEM_METHODS:
        if ctx.multi_node:
            raise E(f"gemm_ar: method={method!r} needs every rank on one node (multicast spans one NVLink "
                    f"domain; this world has {ctx.world.nnodes} nodes); use one_shot or two_shot")
        if not ctx.sim and not ctx.multicast:
            raise E(f"gemm_ar: method={method!r} needs NVLink multicast, which this world does not have (it is "
                    "off on these machines); use one_shot or two_shot")
    return M, a.shape[1], N


def _gemm_ar_rs_ag(a, b, ctx, out, M, scales):
    """Method ``"rs_ag"``: GEMM-ReduceScatter with the copy engine
    (kernels/gemm_rs.py, method ``"ce"``) straight into this rank's rows of
    ``out``, then all_gather's copy-engine method in place.  The partials
    travel under the GEMM; only the reduction of the own rows and the
    gather of the reduced rows follow it.  One node, ``M`` a multiple of the
    world size, ``out`` contiguous.  Its two contexts are created at the
    first such call (collectively: every rank makes the same calls)."""
    from .all_gather import all_gather, create_all_gather_context
    from .gemm_rs import create_gemm_rs_context, gemm_rs
    W, me = ctx.world_size, ctx.rank
    m = M // W
    if ctx._rs_ag is None:
        rs = create_gemm_rs_context(W * (ctx.max_m // W), ctx.n, ctx.dtype, ctx.world, method="ce",
                                    config=ctx.config, core=ctx.core, gluon_config=ctx._gluon_given)
        ag = create_all_gather_context((ctx.max_m // W) * ctx.n, ctx.dtype, ctx.world)
        ctx._rs_ag = (rs, ag)
    rs, ag = ctx._rs_ag
    own = out[me * m:(me + 1) * m]
    gemm_rs(a, b, rs, out=own, **scales)
    all_gather(own, ag, out=out, method="ce")
    return out


def gemm_ar(a, b, ctx: GemmArContext, out=None, method="auto", *, scale_a=None, scale_b=None,
            scale_block=(128, 128)):
    """``sum over ranks of a @ b`` (``[M, n]``, ``a``'s dtype) on every rank, in
    ``out`` (given or allocated).  Collective: every rank calls it with the
    same ``M`` and ``method``, in the same order as its other calls on ``ctx``
    (``K`` and ``b`` may differ per rank).  ``method``: one of
    :data:`METHODS`.  Wrong shapes, dtypes, devices or methods raise
    ``DitronError`` before anything is launched.  Returns ``out``.

    fp8 operands (kernels/scaling.py): ``scale_a`` / ``scale_b`` (their
    shapes choose the recipe; ``scale_block`` the blockwise groups); each
    rank's partial is rounded once to the context's dtype (bfloat16, float16
    or float32), the result's dtype; the reduction sums in fp32."""
    enter(ctx, GemmArContext, "gemm_ar",         # (K may differ per rank: not compared)
          lambda: [("M", getattr(a, "shape", (None,))[0])] + op_fields(a, method, name="a")[1:], a=a, b=b, out=out)
    M, K, N = _check(ctx, a, b, out, method)
    if method == "auto":
        method = choose_method(ctx, M)
    rec, sargs, sconsts = scale_plan("gemm_ar", a, b, M, K, N, scale_a, scale_b, scale_block)
    if out is None:
        out = torch.empty((M, N), dtype=ctx.dtype, device=a.device)
    if ctx.core == "gluon" and rec is not None:
        # the fp8 Gluon GEMM's checks (kernels/gemm_hopper.py fp8_plan), once per call shape, before rs_ag's
        # contexts are made (its GEMM-RS plans the same call again, named gemm_rs)
        from . import gemm_hopper as H
        gkey = (("gluon", M, K, N, a.dtype, b.dtype) + tuple(a.stride()) + tuple(b.stride())
                + (a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0) + scale_key(rec, scale_a, scale_b))
        ctx.plan(gkey, H.fp8_plan, "gemm_ar", a, b, None, scale_a, scale_b, ctx.dtype, ctx.gluon_fp8_config,
                 scale_block, "a core='tl' context (create_gemm_ar_context(..., core='tl'))")
    if method == "rs_ag":
        return _gemm_ar_rs_ag(a, b, ctx, out, M, dict(scale_a=scale_a, scale_b=scale_b, scale_block=scale_block)
                              if rec is not None else {})
    aligned = not ctx.sim and (fp8_tma_ok(a, b) if rec is not None else tma_ok(a, b))
    key = (M, K, N, method, a.dtype, b.dtype, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
           out.stride(1), aligned) + scale_key(rec, scale_a, scale_b)
    grid, tail, consts = ctx.plan(key, _launch_plan, ctx, a, b, out, M, K, N, method, aligned, rec, sconsts)
    if consts["TMA"]:
        ensure_tma_allocator()
    ctx.launch(key + (a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0), gemm_ar_kernel,
               grid, (a, b, out) + tail + sargs, consts)
    return out


def _launch_plan(ctx, a, b, out, M, K, N, method, aligned, rec=None, sconsts=scaling.DUMMY_CONSTS):
    """(grid, arguments after a, b and out, keyword arguments) of a call of these shapes, strides and method
    (made once per such call: GemmArContext.plan)."""
    cfg = ctx.config
    if rec is not None:
        check_fp8_config("gemm_ar", cfg, rec)
    tma = bool(cfg.tma and aligned)
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    G = min(ctx.gemm_programs, tiles)
    R = min(ctx.reduce_programs, tiles)
    return ((G + R,), (ctx.part, ctx.red, ctx.res, ctx.flag, ctx.done, ctx.calls, M, N, K, a.stride(0),
                       a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), ctx.max_tiles, G),
            dict(METHOD=_METHOD_ID[method], WORLD=ctx.world_size, MULTI_NODE=ctx.multi_node,
                 ELEM_BYTES=ctx.esize, EVEN_K=(K % cfg.block_k == 0), TMA=tma, B_T=tma and rec is not None,
                 **sconsts, **cfg.launch_options()))


__all__ = ["METHODS", "GemmArContext", "create_gemm_ar_context", "gemm_ar", "choose_method"]
