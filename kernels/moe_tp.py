"""Tensor-parallel MoE written in ditron.language, on the grouped GEMM of
kernels/moe.py: the experts' weights are split over the ranks along the
intermediate dimension (as in the Ditron paper's AG-MoE / MoE-RS / MoE-AR).

    agc = create_ag_moe_context(max_m, hidden, num_experts, topk, torch.bfloat16)   # collective, once
    rsc = create_moe_rs_context(max_m, hidden, num_experts, topk, torch.bfloat16)
    h, plan = ag_moe(x, topk_idx, w1, agc)       # x: this rank's [m, H] tokens; w1: [E, H, I / W]
    h = act(h)                                   # [W * m * k, I / W], rows grouped by (rank segment, expert)
    out = moe_rs(h, plan, w2, topk_weights, rsc)           # w2: [E, I / W, H]; out: [m, H] (this rank's tokens)

    arc = create_moe_ar_context(max_tokens, hidden, num_experts, topk, torch.bfloat16)
    plan = moe_plan(topk_idx_all, world_size)    # the same routing of all T tokens on every rank
    h = act(plan_gemm(x_all, w1, plan))         # replicated tokens: the first GEMM needs no communication
    out = moe_ar(h, plan, w2, topk_weights_all, arc)       # [T, H] on every rank

Layout of the pairs (the *plan*)
--------------------------------
Rank ``s``'s ``m`` tokens form segment ``s``; each token has ``k`` pairs
(token, slot).  The ``W * m * k`` rows of ``h`` are segment-major: segment
``s`` owns rows ``[s * m * k, (s + 1) * m * k)``, inside it grouped by
expert (stable: token order inside an expert), pairs whose expert id is out
of range (``validate=False``) last and never computed.  :class:`MoePlan`
holds, on the device, ``counts [W, E + 1]`` (pairs per segment and expert;
column ``E``: the dropped ones), ``perm`` (row -> global pair index ``(s * m
+ t) * k + j``) and ``pos`` (this rank's pair ``t * k + j`` -> its row inside
the own segment, ``-1`` if dropped).  It is built with ``torch.sort`` and
``index_add`` on the device: no host sync unless ``validate=True`` (the
default) checks the ids.

ag_moe
------
The routing (``topk_idx``, a few bytes per token) is all-gathered first with
the zoo's all_gather (the int32 ids travel bit-exactly as float32 words), the
plan is built, then two kernels run: the **producer**
(:func:`ag_moe_producer_kernel`) pushes this rank's ``x`` into every peer's
gather buffer ``buf[p][rank]`` and signals it per program (ranks on other
nodes by ``shmem.putmem_signal_block``), and the **consumer**
(:func:`ag_moe_kernel`), a persistent grouped GEMM over *virtual* M tiles:
``T_s = cdiv(m * k, BLOCK_M) + E`` per segment, so every segment has the
same number of M tiles and ``dl.swizzle_gather`` orders them (the own
segment first, then the peers' in arrival order, tiles never straddle a
segment).  A tile maps to (segment, expert, rows) from the counts
(:func:`~kernels.moe.expert_tile`), waits for its segment's signals only
(none for the own segment), and loads its A rows through ``perm`` (the
gather by expert is fused into the loads: the own rows from ``x``, the
others from the gather buffer).  On GPUs the producer runs on a side stream,
next to the consumer (which leaves it ``producer_programs`` SMs).

moe_rs / moe_ar
---------------
**GEMM** (:func:`moe_rs_gemm_kernel`): the grouped GEMM ``h @ w2[e]`` over
the same virtual tiles in ``dl.swizzle_scatter`` order (peers' segments
first, the own last); each tile's rows go straight into the segment owner's
slot ``rbuf[p][rank]`` (``dl.symm_at`` stores; owners on other nodes: staged
in the local ``cbuf[p]``), then the tile is counted in the local
``seg_count[s]`` (``atomic_add`` acq_rel); the program completing segment
``s`` resets the count and signals ``s`` (``dl.notify``; other nodes: one
``shmem.putmem_signal_block`` of the whole segment).  Segments with no tile
(every pair dropped) are signalled by program 0.  **Reduction**
(:func:`moe_rs_reduce_kernel`, on the owner): waits for every source's
signal, then ``out[t] = sum_j w[t, j] * sum_s rbuf[p][s][pos[t, j]]`` in
fp32 (the top-k weighted combine and the reduce-scatter in one pass: the
weights never leave their rank).  ``moe_ar`` is ``moe_rs`` followed by the
zoo's all_gather of the reduced segments (a two-shot all-reduce), with
``m = T / W``.

Reuse: device-side call counters (kernels/_common.py), parity ``e % 2``,
signal value ``e + 1``.  ag_moe: as kernels/ag_gemm.py's SM producer (the
producer and the consumer count calls separately and agree on ``e``).
moe_rs: as kernels/gemm_rs.py's scatter method (GEMM ``e + 2`` of rank ``s``
follows its reduction ``e + 1``, which waited for every rank's GEMM ``e +
1``, which followed their reduction ``e``, the last reader of parity ``p``).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem

from ._common import CollectiveContext, epoch_begin, epoch_end, sm_count, topology
from ._common import cdiv, next_pow2
from .ag_gemm import ag_gemm_producer_kernel
from .all_gather import _put_chunk, all_gather, create_all_gather_context
from .gemm import GemmConfig, gemm_tile, is_sim_device, store_tile
from .moe import (_add, check_experts_weight, expert_pow2, expert_tile, expert_tile_acc, grouped_gemm, grouped_tma,
                  moe_config, rows_tile_acc_tma_b, weight_descriptor)

_SLOT_ALIGN = 128


# ---------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------

# the producer is ag_gemm's: it pushes any row-major shard into every peer's slot and signals per chunk
ag_moe_producer_kernel = ag_gemm_producer_kernel


@triton.jit
def _virtual_tile(pid_m, T_s, counts_ptr, E, rows_per_seg, BLOCK_M: tl.constexpr, EP: tl.constexpr):
    """(segment, expert, rows, row_ok, rows_c) of virtual M tile ``pid_m``."""
    seg = pid_m // T_s
    base = seg.to(tl.int64) * rows_per_seg
    ex, rows, row_ok, rows_c = expert_tile(pid_m % T_s, counts_ptr + seg * (E + 1), E, base, base + rows_per_seg,
                                           BLOCK_M, EP)
    return seg, ex, rows, row_ok, rows_c


@ditron.jit(do_not_specialize=["m", "T_s", "slot_rows", "P_prod"])
def ag_moe_kernel(x_ptr, w_ptr, h_ptr, buf_ptr, sig_ptr, counts_ptr, perm_ptr, calls_ptr, m, N, K, E, KT, T_s,
                  slot_rows, stride_we, stride_wk, stride_wn, P_prod,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  EVEN_K: tl.constexpr, EP: tl.constexpr, TMA: tl.constexpr):
    """``h[rows of (segment s, expert e)] = x_all[tokens of those pairs] @ w[e]``
    (``x`` and the gather slots are row-major ``[m, K]``).  ``TMA``: the
    weights through a tensor descriptor (the token rows are gathered by
    pointers either way)."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    me = dl.rank()
    W = dl.num_ranks()
    NN = dl.num_ranks(1)
    rows_per_seg = m * KT
    sr = slot_rows.to(tl.int64)
    bufp = buf_ptr + par * (W * sr) * K
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    VM = W * T_s
    if TMA:
        w_desc = weight_descriptor(w_ptr, E, K, N, stride_we, stride_wk, BLOCK_N, BLOCK_K)
    for tile in range(tl.program_id(0), VM * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = dl.swizzle_gather(tile, VM * BLOCK_M, N, BLOCK_M, BLOCK_N, me, W, NN, GROUP_M)
        seg, ex, rows, row_ok, rows_c = _virtual_tile(pid_m, T_s, counts_ptr, E, rows_per_seg, BLOCK_M, EP)
        if ex < E:
            nw = tl.where(seg == me, 0, P_prod)
            tok = dl.wait(sig_ptr + (par * W + seg) * P_prod, nw, "sys", "acquire", waitValue=val)
            src = dl.consume_token(bufp, tok)
            t = tl.load(perm_ptr + rows_c).to(tl.int64) // KT - seg.to(tl.int64) * m     # token inside the segment
            a_rows = tl.where(seg == me, x_ptr + t * K, src + (seg.to(tl.int64) * sr + t) * K)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            if TMA:
                acc = rows_tile_acc_tma_b(a_rows, w_desc, ex, pid_n, K, 1, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
            else:
                b_cols = w_ptr + ex.to(tl.int64) * stride_we + cols.to(tl.int64) * stride_wn
                acc = gemm_tile(a_rows, b_cols, col_ok, 1, stride_wk, K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
            store_tile(h_ptr, N, 1, rows, row_ok, cols, col_ok, acc)
    epoch_end(calls_ptr)


@triton.jit
def _segment_tiles(seg, counts_ptr, E, BLOCK_M: tl.constexpr, EP: tl.constexpr):
    eidx = tl.arange(0, EP)
    cnt = tl.maximum(tl.load(counts_ptr + seg * (E + 1) + eidx, mask=eidx < E, other=0).to(tl.int64), 0)
    return tl.reduce((cnt + BLOCK_M - 1) // BLOCK_M, 0, _add)


@ditron.jit(do_not_specialize=["rows_per_seg", "T_s", "slot_rows"])
def moe_rs_gemm_kernel(h_ptr, w_ptr, rbuf_ptr, cbuf_ptr, sig_ptr, count_ptr, counts_ptr, calls_ptr, rows_per_seg, N,
                       K, E, T_s, slot_rows, stride_hm, stride_we, stride_wk, stride_wn,
                       MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       EVEN_K: tl.constexpr, EP: tl.constexpr):
    """This rank's partial ``h @ w2`` per pair row, into the owners' ``rbuf[p][rank]``."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    me, W, LW, node, NN, local = topology()
    slot = slot_rows.to(tl.int64) * N
    my_slot = rbuf_ptr + (par * W + me) * slot
    cbp = cbuf_ptr + par * W * slot
    sig_word = sig_ptr + par * W + me
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    VM = W * T_s
    for tile in range(tl.program_id(0), VM * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = dl.swizzle_scatter(tile, VM * BLOCK_M, N, BLOCK_M, BLOCK_N, me, W, NN, GROUP_M)
        seg, ex, rows, row_ok, rows_c = _virtual_tile(pid_m, T_s, counts_ptr, E, rows_per_seg, BLOCK_M, EP)
        if ex < E:
            cols, col_ok, acc = expert_tile_acc(h_ptr, h_ptr, w_ptr, ex, rows_c, pid_n, N, K, stride_hm, 1, stride_we,
                                                stride_wk, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, False)
            lr = rows - seg.to(tl.int64) * rows_per_seg
            ptrs = lr[:, None] * N + cols[None, :]
            msk = row_ok[:, None] & col_ok[None, :]
            val_t = acc.to(rbuf_ptr.dtype.element_ty)
            if seg // LW == node:
                tl.store(dl.symm_at(my_slot + ptrs, seg), val_t, mask=msk)
            else:
                tl.store(cbp + seg.to(tl.int64) * slot + ptrs, val_t, mask=msk)
            dl.syncthreads()              # every thread's stores of the tile, before the count releases them
            done = tl.atomic_add(count_ptr + seg, 1, sem="acq_rel", scope="sys")
            if done == _segment_tiles(seg, counts_ptr, E, BLOCK_M, EP) * num_pid_n - 1:
                tl.store(count_ptr + seg, 0)          # nobody counts this segment again in this call
                if seg // LW == node:
                    dl.notify(sig_word, seg, signal=val, sig_op="set", comm_scope="intra_node")
                else:
                    if MULTI_NODE:
                        _put_chunk(my_slot, cbp + seg.to(tl.int64) * slot, 0, rows_per_seg.to(tl.int64) * N,
                                   sig_word, val, seg, ELEM_BYTES)
    if tl.program_id(0) == 0:
        for s in range(0, W):             # segments without a tile (every pair dropped) are complete at once
            if _segment_tiles(s, counts_ptr, E, BLOCK_M, EP) == 0:
                if s // LW == node:
                    dl.notify(sig_word, s, signal=val, sig_op="set", comm_scope="intra_node")
                else:
                    if MULTI_NODE:
                        _put_chunk(my_slot, cbp + s * slot, 0, 0, sig_word, val, s, ELEM_BYTES)
    epoch_end(calls_ptr)


@ditron.jit(do_not_specialize=["m", "slot_rows"])
def moe_rs_reduce_kernel(out_ptr, rbuf_ptr, sig_ptr, pos_ptr, w_ptr, calls_ptr, m, KT, N, slot_rows,
                         BT: tl.constexpr, BN: tl.constexpr):
    """``out[t] = sum_j w[t, j] * sum_s rbuf[p][s][pos[t, j]]`` (fp32)."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    W = dl.num_ranks()
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    slot = slot_rows.to(tl.int64) * N
    tok = dl.wait(sig_ptr + par * W, W, "sys", "acquire", waitValue=val)
    box = dl.consume_token(rbuf_ptr + par * W * slot, tok)
    for t0 in range(pid * BT, m, P * BT):
        t = (t0 + tl.arange(0, BT)).to(tl.int64)
        t_ok = t < m
        for n0 in range(0, N, BN):
            cols = n0 + tl.arange(0, BN)
            c_ok = cols < N
            acc = tl.full((BT, BN), 0.0, tl.float32)
            for j in range(0, KT):
                p = tl.load(pos_ptr + t * KT + j, mask=t_ok, other=-1)
                wt = tl.load(w_ptr + t * KT + j, mask=t_ok, other=0.0)
                msk = (p >= 0)[:, None] & c_ok[None, :]
                part = tl.full((BT, BN), 0.0, tl.float32)
                for s in range(0, W):
                    part += tl.load(box + s * slot + p[:, None] * N + cols[None, :], mask=msk, other=0.0).to(
                        tl.float32)
                acc += wt[:, None] * part
            tl.store(out_ptr + t[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                     mask=t_ok[:, None] & c_ok[None, :])
    epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class MoePlan:
    """Where each (token, slot) pair of every rank's segment is (see the module docstring)."""
    world_size: int
    m: int
    k: int
    num_experts: int
    counts: torch.Tensor      # int64 [W, E + 1]
    perm: torch.Tensor        # int64 [W * m * k]: row -> global pair index
    pos: torch.Tensor         # int64 [m * k]: own pair -> row inside the own segment (-1: dropped)
    dropped: torch.Tensor     # int64 [1]: pairs of all segments with an expert id out of range

    @property
    def rows(self):
        return self.world_size * self.m * self.k


def moe_plan(topk_idx_all, world_size, rank=None, num_experts=None, validate=True):
    """The plan of ``topk_idx_all`` (``[W * m, k]``: every rank's routing,
    segment ``s`` = rows ``[s * m, (s + 1) * m)``), on its device."""
    W = int(world_size)
    rank = ditron.current_world().rank if rank is None else rank
    if not isinstance(topk_idx_all, torch.Tensor) or topk_idx_all.dim() != 2 or \
            topk_idx_all.dtype not in (torch.int32, torch.int64) or topk_idx_all.shape[0] % W:
        raise ditron.DitronError(f"moe: topk_idx must be an int32/int64 tensor [tokens, k] with tokens a multiple "
                                 f"of the world size {W}")
    E = int(num_experts)
    Tall, k = topk_idx_all.shape
    m = Tall // W
    dev = topk_idx_all.device
    ids = topk_idx_all.reshape(-1).to(torch.int64)
    valid = (ids >= 0) & (ids < E)
    if validate and ids.numel() and not bool(valid.all()):
        i = int((~valid).nonzero()[0, 0])
        raise ditron.DitronError(f"moe: topk_idx[{i // k}, {i % k}] = {int(ids[i])} (rank {i // k // max(m, 1)}'s "
                                 f"token {i // k % max(m, 1)}) is not an expert id in [0, {E})")
    seg = torch.arange(ids.numel(), device=dev) // max(m * k, 1)
    key = seg * (E + 1) + torch.where(valid, ids, E)
    _, perm = torch.sort(key, stable=True)
    counts = torch.zeros(W * (E + 1), dtype=torch.int64, device=dev).index_add_(0, key, torch.ones_like(key))
    rowpos = torch.empty_like(perm)
    rowpos[perm] = torch.arange(perm.numel(), device=dev)
    own = slice(rank * m * k, (rank + 1) * m * k)
    pos = torch.where(valid[own], rowpos[own] - rank * m * k, -1)
    dropped = (~valid).sum().reshape(1)
    return MoePlan(W, m, k, E, counts.view(W, E + 1), perm, pos.contiguous(), dropped)


def plan_gemm(x_all, w, plan, out=None, **options):
    """``h`` in the plan's row order without communication: ``x_all`` (``[W *
    m, K]``: every rank's tokens, e.g. replicated ones before :func:`moe_ar`)
    times the experts' ``w`` (``[E, K, N]``); one grouped GEMM per segment."""
    W, m, k, E = plan.world_size, plan.m, plan.k, plan.num_experts
    if not isinstance(x_all, torch.Tensor) or x_all.dim() != 2 or x_all.shape[0] != W * m:
        raise ditron.DitronError(f"plan_gemm: x_all must be [{W * m}, K] (every rank's tokens)")
    check_experts_weight("plan_gemm", x_all, w)
    rows = W * m * k
    if out is None:
        out = torch.empty((rows, w.shape[2]), dtype=x_all.dtype, device=x_all.device)
    tok = plan.perm // k
    for s in range(W):
        r = slice(s * m * k, (s + 1) * m * k)
        grouped_gemm(x_all, w, plan.counts[s, :E], out=out[r], gather_idx=tok[r], **options)
    return out


def _programs(sim, device, num_programs, tiles, reserve=0):
    P = int(num_programs) if num_programs else (4 if sim else sm_count(device) - reserve)
    return max(1, min(P, tiles))


class _MoeContext(CollectiveContext):
    def __init__(self, max_m, hidden, num_experts, topk, dtype, world, config, num_programs):
        E_ = ditron.DitronError
        if dtype not in (torch.float16, torch.bfloat16):
            raise E_(f"{self.op}: dtype {dtype} is not supported (use float16 or bfloat16)")
        for name, v in (("max_m", max_m), ("hidden", hidden), ("num_experts", num_experts), ("topk", topk)):
            if int(v) < 1:
                raise E_(f"{self.op}: {name} must be >= 1 (got {v})")
        super().__init__(int(max_m) * int(hidden), dtype, world)
        self.max_m, self.hidden, self.num_experts, self.topk = int(max_m), int(hidden), int(num_experts), int(topk)
        self.multi_node = self.world.nnodes > 1
        self.sim = self.world.backend == "sim" or is_sim_device(self.device)
        self.config = config.validate(self.op) if config is not None else None
        self.num_programs = num_programs

    def cfg(self, M, N, K):
        return self.config or moe_config(M, N, K, self.dtype, self.device)


class AgMoeContext(_MoeContext):
    op = "ag_moe"

    def __init__(self, max_m, hidden, num_experts, topk, dtype, world=None, config: GemmConfig | None = None,
                 num_programs=None, producer_programs=None):
        super().__init__(max_m, hidden, num_experts, topk, dtype, world, config, num_programs)
        W = self.world_size
        self.producer_programs = int(producer_programs or (2 if self.sim else min(16, sm_count(self.device))))
        self.overlap = not self.sim and torch.device(self.device).type == "cuda"
        align = _SLOT_ALIGN // math.gcd(self.hidden, _SLOT_ALIGN)
        self.slot_rows = (self.max_m + align - 1) // align * align
        self.pcalls = torch.zeros(2, dtype=torch.int64, device=self.device)
        self.buf = self.symm((2, W, self.slot_rows * self.hidden), dtype, "buf")
        self.sig = self.symm((2, W, self.producer_programs), torch.int64, "sig")
        self.ids = create_all_gather_context(self.max_m * self.topk, torch.float32, self.world)
        ditron.barrier_all()


#: moe_rs / moe_ar's GEMM cores: the tl kernel (every target, the simulator) or the Gluon Hopper core
#: (kernels/moe_tp_hopper.py)
CORES = ("tl", "gluon")


class MoeRsContext(_MoeContext):
    op = "moe_rs"

    def __init__(self, max_m, hidden, num_experts, topk, dtype, world=None, config: GemmConfig | None = None,
                 num_programs=None, core="tl", gluon_config=None):
        super().__init__(max_m, hidden, num_experts, topk, dtype, world, config, num_programs)
        W = self.world_size
        E_ = ditron.DitronError
        if core not in CORES:
            raise E_(f"{self.op}: core={core!r}; use one of {', '.join(CORES)}")
        self.core = core
        self.gluon_config = None
        if core == "gluon":
            from . import moe_tp_hopper
            if config is not None:
                raise E_(f"{self.op}: config (a GemmConfig) is for core='tl'; a core='gluon' context takes "
                         "gluon_config (a HopperGemmConfig)")
            if W > moe_tp_hopper.MAX_RANKS:
                raise E_(f"{self.op}: core='gluon' takes up to {moe_tp_hopper.MAX_RANKS} ranks (one node); this world "
                         f"has {W}: use {moe_tp_hopper.ALT}")
            if self.hidden % 8:
                raise E_(f"{self.op}: core='gluon' needs hidden a multiple of 8 (16-byte rows of w2 and of the "
                         f"partials), not {self.hidden}: use {moe_tp_hopper.ALT}")
            # the Hopper config; the simulator runs the tl GEMM with its twin (same tiles and K order)
            self.gluon_config, self.config = moe_tp_hopper.check_context(self.op, self, gluon_config)
        elif gluon_config is not None:
            raise E_(f"{self.op}: gluon_config applies to core='gluon'")
        self.slot_rows = self.max_m * self.topk
        self.gcalls = torch.zeros(2, dtype=torch.int64, device=self.device)
        self.rbuf = self.symm((2, W, self.slot_rows * self.hidden), dtype, "rbuf")
        self.cbuf = self.symm((2, W, self.slot_rows * self.hidden) if self.multi_node else (1,), dtype, "cbuf")
        self.sig = self.symm((2, W), torch.int64, "sig")
        self.seg_count = torch.zeros(W, dtype=torch.int32, device=self.device)
        ditron.barrier_all()


class MoeArContext(MoeRsContext):
    op = "moe_ar"

    def __init__(self, max_tokens, hidden, num_experts, topk, dtype, world=None, config=None, num_programs=None,
                 core="tl", gluon_config=None):
        w = world or ditron.current_world()
        super().__init__(-(-int(max_tokens) // w.world_size), hidden, num_experts, topk, dtype, w, config,
                         num_programs, core, gluon_config)
        self.ag = create_all_gather_context(self.max_m * self.hidden, dtype, self.world)


def create_ag_moe_context(max_m, hidden, num_experts, topk, dtype, world=None, **options):
    """ag_moe's gather buffer (``2 * W * max_m * hidden`` elements), signals and
    the routing all-gather, for up to ``max_m`` tokens per rank.  Collective.
    ``options``: ``config`` (:class:`~kernels.gemm.GemmConfig`), ``num_programs``,
    ``producer_programs``."""
    return AgMoeContext(max_m, hidden, num_experts, topk, dtype, world, **options)


def create_moe_rs_context(max_m, hidden, num_experts, topk, dtype, world=None, **options):
    """moe_rs's partial buffers (``2 * W * max_m * topk * hidden`` elements) and
    signals, for up to ``max_m`` tokens per rank.  Collective.  ``options``:
    ``config`` (:class:`~kernels.gemm.GemmConfig`), ``num_programs``,
    ``core`` (``"tl"``, default, or ``"gluon"``: the GEMM on the
    warp-specialised Hopper core, kernels/moe_tp_hopper.py -- one node, up
    to 8 ranks, ``hidden`` a multiple of 8, sm_90 GPUs; the simulator runs
    the tl twin) and ``gluon_config`` (a ``HopperGemmConfig``, mode
    ``"coop"``)."""
    return MoeRsContext(max_m, hidden, num_experts, topk, dtype, world, **options)


def create_moe_ar_context(max_tokens, hidden, num_experts, topk, dtype, world=None, **options):
    """moe_ar's buffers for up to ``max_tokens`` tokens in all (a multiple of
    the world size per call).  Collective."""
    return MoeArContext(max_tokens, hidden, num_experts, topk, dtype, world, **options)


def _check_x_idx(ctx, x, topk_idx):
    E_ = ditron.DitronError
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != ctx.hidden:
        shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise E_(f"{ctx.op}: x must be [m, hidden={ctx.hidden}], got {shape}")
    m = x.shape[0]
    if m < 1 or m > ctx.max_m:
        raise E_(f"{ctx.op}: x has {m} tokens; the context takes 1 .. max_m={ctx.max_m} per rank")
    ctx.check_tensor(x, "x")
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype not in (torch.int32, torch.int64) or \
            topk_idx.dim() != 2 or topk_idx.shape[0] != m:
        raise E_(f"{ctx.op}: topk_idx must be an int32/int64 tensor [m={m}, k]")
    if topk_idx.shape[1] != ctx.topk:
        raise E_(f"{ctx.op}: topk_idx has k={topk_idx.shape[1]}, the context was created for topk={ctx.topk}")
    return m


def ag_moe(x, topk_idx, w1, ctx, out=None, validate=True):
    """``(h, plan)``: every rank's tokens, gathered, times their experts'
    ``w1`` shard (``[E, H, N]``); ``h`` is ``[W * m * k, N]`` in the plan's
    row order.  Every rank calls it with the same ``m``."""
    m = _check_x_idx(ctx, x, topk_idx)
    check_experts_weight(ctx.op, x, w1, "w1")
    E, K, N = w1.shape
    if E != ctx.num_experts:
        raise ditron.DitronError(f"{ctx.op}: w1 has {E} experts, the context was created for {ctx.num_experts}")
    W, k = ctx.world_size, ctx.topk
    ids = topk_idx.to(torch.int32).contiguous()
    ids_all = all_gather(ids.view(torch.float32), ctx.ids).view(torch.int32).view(W * m, k)
    plan = moe_plan(ids_all, W, ctx.rank, E, validate)
    rows = W * m * k
    if out is None:
        out = torch.empty((rows, N), dtype=x.dtype, device=x.device)
    elif not isinstance(out, torch.Tensor) or tuple(out.shape) != (rows, N) or out.dtype != x.dtype or \
            not out.is_contiguous():
        raise ditron.DitronError(f"{ctx.op}: argument 'out' must be a contiguous ({rows}, {N}) {x.dtype} tensor")
    cfg = ctx.cfg(rows, N, K)
    if W > 1:
        P = ctx.producer_programs
        n = m * K
        block = 128 if ctx.sim else max(256, min(4096, next_pow2(cdiv(n, P))))
        args = (x, ctx.buf, ctx.sig, ctx.pcalls, n, ctx.slot_rows * K, x, ctx.buf, 0, 1)     # no scales
        kw = dict(MULTI_NODE=ctx.multi_node, ELEM_BYTES=x.element_size(), BLOCK=block, num_warps=1 if ctx.sim else 4,
                  SCALES=False)
        if ctx.overlap:
            side = ctx.side_stream()
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                ag_moe_producer_kernel[(P,)](*args, **kw)
            x.record_stream(side)
        else:
            ag_moe_producer_kernel[(P,)](*args, **kw)
    T_s = cdiv(m * k, cfg.block_m) + E
    tiles = W * T_s * cdiv(N, cfg.block_n)
    P = _programs(ctx.sim, x.device, ctx.num_programs, tiles, ctx.producer_programs if ctx.overlap else 0)
    ag_moe_kernel[(P,)](x, w1, out, ctx.buf, ctx.sig, plan.counts, plan.perm, ctx.calls, m, N, K, E, k, T_s,
                        ctx.slot_rows, w1.stride(0), w1.stride(1), w1.stride(2), ctx.producer_programs,
                        EVEN_K=(K % cfg.block_k == 0), EP=expert_pow2(E), TMA=grouped_tma(cfg, x, w1),
                        **cfg.launch_options())
    if W > 1 and ctx.overlap:
        torch.cuda.current_stream(x.device).wait_stream(ctx.side_stream())
    return out, plan


def _check_rs(ctx, h, plan, w2, topk_weights):
    E_ = ditron.DitronError
    if not isinstance(plan, MoePlan) or plan.world_size != ctx.world_size:
        raise E_(f"{ctx.op}: plan must be a MoePlan of this world (from ag_moe or moe_plan)")
    if plan.k != ctx.topk or plan.num_experts != ctx.num_experts:
        raise E_(f"{ctx.op}: the plan has k={plan.k}, {plan.num_experts} experts; the context was created for "
                 f"topk={ctx.topk}, {ctx.num_experts} experts")
    if plan.m > ctx.max_m:
        raise E_(f"{ctx.op}: the plan has {plan.m} tokens per rank, more than the context's max_m={ctx.max_m}")
    if not isinstance(h, torch.Tensor) or h.dim() != 2 or h.shape[0] != plan.rows:
        raise E_(f"{ctx.op}: h must be [{plan.rows}, I] (the plan's rows)")
    check_experts_weight(ctx.op, h, w2, "w2")
    if w2.shape[0] != ctx.num_experts or w2.shape[2] != ctx.hidden:
        raise E_(f"{ctx.op}: w2 must be [{ctx.num_experts}, I, hidden={ctx.hidden}], got {list(w2.shape)}")
    if h.dtype != ctx.dtype or h.stride(1) != 1:
        raise E_(f"{ctx.op}: h must be a row-major {ctx.dtype} tensor")
    if not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != (plan.m, plan.k) or \
            topk_weights.dtype not in (torch.float32, ctx.dtype):
        raise E_(f"{ctx.op}: topk_weights must be a float32 or {ctx.dtype} tensor [{plan.m}, {plan.k}] (this "
                 f"rank's tokens)")


def moe_rs(h, plan, w2, topk_weights, ctx, out=None):
    """``out [m, H]``: this rank's tokens of ``sum over ranks of the top-k
    weighted h @ w2[e]`` (see the module docstring)."""
    _check_rs(ctx, h, plan, w2, topk_weights)
    W, m, k, E = ctx.world_size, plan.m, plan.k, plan.num_experts
    _, K, N = w2.shape
    if out is None:
        out = torch.empty((m, N), dtype=h.dtype, device=h.device)
    elif not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, N) or out.dtype != h.dtype or \
            not out.is_contiguous():
        raise ditron.DitronError(f"{ctx.op}: argument 'out' must be a contiguous ({m}, {N}) {h.dtype} tensor")
    cfg = ctx.cfg(plan.rows, N, K)          # core='gluon': the twin of its Hopper config (the same tiles)
    T_s = cdiv(m * k, cfg.block_m) + E
    tiles = W * T_s * cdiv(N, cfg.block_n)
    if ctx.core == "gluon":
        from . import moe_tp_hopper
        moe_tp_hopper.check_call(ctx.op, h, w2)
    if ctx.core == "gluon" and not ctx.sim:
        moe_tp_hopper.launch(ctx, h, w2, plan, T_s)
    else:
        P = _programs(ctx.sim, h.device, ctx.num_programs, tiles)
        moe_rs_gemm_kernel[(P,)](h, w2, ctx.rbuf, ctx.cbuf, ctx.sig, ctx.seg_count, plan.counts, ctx.gcalls, m * k, N,
                                 K, E, T_s, ctx.slot_rows, h.stride(0), w2.stride(0), w2.stride(1), w2.stride(2),
                                 MULTI_NODE=ctx.multi_node, ELEM_BYTES=h.element_size(),
                                 EVEN_K=(K % cfg.block_k == 0), EP=expert_pow2(E), **cfg.launch_options())
    bt, bn = (4, 32) if ctx.sim else (8, max(64, min(1024, next_pow2(N))))
    rp = max(1, min(cdiv(m, bt), 2 if ctx.sim else sm_count(h.device)))
    moe_rs_reduce_kernel[(rp,)](out, ctx.rbuf, ctx.sig, plan.pos, topk_weights.to(torch.float32).contiguous(),
                                ctx.calls, m, k, N, ctx.slot_rows, BT=bt, BN=bn, num_warps=1 if ctx.sim else 4)
    return out


def moe_ar(h, plan, w2, topk_weights_all, ctx, out=None):
    """``out [T, H]`` on every rank: ``sum over ranks of the top-k weighted h @
    w2[e]`` for all ``T = W * m`` tokens of the plan (built from the routing
    of all tokens, e.g. by :func:`moe_plan`); ``topk_weights_all`` is ``[T, k]``."""
    W = ctx.world_size
    if not isinstance(plan, MoePlan):
        raise ditron.DitronError(f"{ctx.op}: plan must be a MoePlan of this world (from ag_moe or moe_plan)")
    T = plan.m * W
    if not isinstance(topk_weights_all, torch.Tensor) or tuple(topk_weights_all.shape) != (T, plan.k):
        raise ditron.DitronError(f"{ctx.op}: topk_weights must be [{T}, {plan.k}] (every token's weights)")
    mine = topk_weights_all[ctx.rank * plan.m:(ctx.rank + 1) * plan.m]
    seg = moe_rs(h, plan, w2, mine, ctx)
    if out is None:
        out = torch.empty((T, ctx.hidden), dtype=h.dtype, device=h.device)
    return all_gather(seg, ctx.ag, out=out)


def moe_reference(x_all, topk_idx_all, topk_weights_all, w1_full, w2_full, act):
    """torch (fp32): the whole TP MoE layer, ``sum_j w[t, j] * act(x[t] @ w1[e]) @ w2[e]``."""
    out = torch.zeros(x_all.shape[0], w2_full.shape[2])
    xf = x_all.float()
    for j in range(topk_idx_all.shape[1]):
        for e in range(w1_full.shape[0]):
            msk = topk_idx_all[:, j] == e
            if msk.any():
                out[msk] += topk_weights_all[msk, j].float()[:, None] * (act(xf[msk] @ w1_full[e].float())
                                                                         @ w2_full[e].float())
    return out
