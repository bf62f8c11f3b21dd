"""AllGather-GEMM written in ditron.language: ``C = all_gather(A) @ B``.

    ctx = create_ag_gemm_context(max_m_per_rank, k, torch.bfloat16)   # collective, once
    c = ag_gemm(a, b, ctx)            # a: this rank's [m, K] shard, b: [K, N]; c: [world * m, N]
    c = ag_gemm(a, b, ctx, out=c)

Every rank passes a shard ``a`` of the same shape ``[m, K]`` (any ``m >= 1``,
not necessarily a multiple of the tile) and its own ``b`` (the same on every
rank, or per-rank weights: each rank computes ``all_gather(a) @ b`` with its
``b``).  ``c`` is in ``a``'s dtype (float16 / bfloat16); the GEMM accumulates in
float32.  Rows ``[s * m, (s + 1) * m)`` of ``c`` come from rank ``s``'s shard.

Producer and consumer
---------------------
The **consumer** (:func:`ag_gemm_consumer_kernel`) is the zoo's persistent GEMM
(kernels/gemm.py: pointer loads or TMA descriptors): ``P`` programs walk the
output tiles in ``dl.swizzle_gather`` order (tiles whose rows are local first,
then the peers' segments in arrival order ``rank+1, rank+2, ...``).  Before a
tile it waits for the signals of every remote segment in
``dl.tile_segments`` of its M tile (a tile straddling segments waits for all of
them); its own rows are read straight from ``a`` (no copy), the others from
the gather buffer.

The **producer** brings the shards, one of two ways (``producer=`` of the
context):

* ``"ce"`` (copy engine; default on one node): on a side stream, for the
  peers ``rank-1, rank-2, ...`` (so that every rank receives ``rank+1`` first,
  the order the consumer computes in): ``ditron.stream_wait_value`` until the
  peer is done reading this rank's previous shard, ``ditron.rank_copy`` of
  ``a`` into the peer's gather buffer, ``ditron.stream_write_value`` of the
  peer's ``ready`` flag.  No SM is used, so the GEMM keeps every SM and the
  copies run at copy-engine speed under it.
* ``"sm"`` (SM push; needed for several nodes): the kernel
  :func:`ag_gemm_producer_kernel` (``producer_programs`` programs) stores
  chunks of ``a`` into every node peer's buffer with ``dl.symm_at`` and
  ``dl.notify``-s them; ranks on other nodes get chunk and signal in one
  ``shmem.putmem_signal_block`` (staged in the sender's own slot first, as in
  all_gather).  With ``overlap=True`` it runs on a side stream and the
  consumer leaves it ``producer_programs`` SMs.

Buffers, signals and reuse
--------------------------
``buf[parities][world][slot]`` (symmetric, ``dtype``): ``buf[p][s]`` holds
rank ``s``'s shard, row-major ``[m, K]`` (slots are ``slot_rows`` rows apart,
so ``buf[p]`` is also one ``[world * slot_rows, K]`` matrix for TMA).

* ``"ce"`` -- flags that are reset, one buffer (``parities = 1``): ``ready[s]``
  (on the receiver) becomes 1 when ``s``'s shard has landed; ``free[r]`` (on
  the sender) is 1 when rank ``r`` has finished reading the sender's previous
  shard (1 at creation).  The sender waits ``free[r] == 1``, sets it to 0,
  copies, sets ``r``'s ``ready[s]``.  The consumer's last program (all other
  programs have finished reading) resets its ``ready`` flags to 0, then sets
  ``free[rank]`` on every peer (release).  A shard is therefore overwritten
  only after its reader has finished, and a ``ready`` flag is set again only
  after it was reset.  Every value is a constant, so a call can be captured in
  a CUDA graph and replayed.
* ``"sm"`` -- epochs (kernels/_common.py), ``parities = 2``: the producer and
  the consumer each have a device-side call counter (``ctx.pcalls``,
  ``ctx.calls``); signal word ``sig[p][s][g]`` equals ``e + 1`` when chunk
  ``g`` of source ``s`` arrived in call ``e``; parity ``e % 2``.  A rank's
  consumer finishes call ``e`` only after every peer's producer of call ``e``
  has run, and a producer of call ``e + 1`` starts only after its own rank's
  consumer of call ``e`` (stream order), so parity ``e % 2`` is written again
  (call ``e + 2``) only after every peer has finished reading it (call ``e``).

Persistent programs and spinning: the consumer's programs spin on flags set
by the producer.  With ``"ce"`` nothing the producer does needs an SM.  With
``"sm"`` on one stream the producer has finished before the consumer starts;
with ``overlap=True`` the consumer runs ``SMs - producer_programs`` programs
(one per SM at its tile sizes) so the producer's programs always find SMs.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import (CollectiveContext, enter, op_fields, ce_release, ce_send, epoch_begin, epoch_end, sm_count,
                      take_flag, topology)
from ._common import cdiv, next_pow2
from . import scaling
from .gemm import (GemmConfig, check_fp8_config, check_operands, default_config, ensure_tma_allocator, fp8_tma_ok,
                   is_sim_device, scale_key, scaled_gemm_tile, scaled_gemm_tile_tma, store_tile,
                   store_tile_tma,
                   tile_rows, tma_ok)
from .all_gather import _chunk, _put_chunk

_SLOT_ALIGN = 128          # elements: every slot starts 256-byte aligned
_GEMM_DTYPES = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------
# producer: push this rank's shard into every peer's gather buffer
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["n", "slot_stride", "ns", "s_slot"])
def ag_gemm_producer_kernel(a_ptr, buf_ptr, sig_ptr, calls_ptr, n, slot_stride, s_ptr, sbuf_ptr, ns, s_slot,
                            MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr, BLOCK: tl.constexpr,
                            SCALES: tl.constexpr = False):
    """``n``: elements of the shard (``m * K``); ``slot_stride``: elements
    between two slots of ``buf``.  Program ``g`` pushes its chunk and sets word
    ``[par][rank][g]`` of every peer's ``sig`` to ``e + 1``.  ``SCALES`` (fp8,
    one node): it first pushes its chunk of the shard's ``ns`` scale values
    (``s_ptr``, contiguous) into the peers' ``sbuf`` slots (``s_slot``
    elements apart), so that the rows' scales arrive with the rows."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    me, W, LW, node, NN, local = topology()
    P = tl.num_programs(0)
    ss = slot_stride.to(tl.int64)
    lo, hi = _chunk(n, BLOCK)
    my_slot = buf_ptr + par * (W * ss) + me * ss
    sig_word = sig_ptr + par * (W * P) + me * P + tl.program_id(0)
    node0 = node * LW
    for off in range(lo, hi, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < hi
        v = tl.load(a_ptr + offs, mask=mask)
        if MULTI_NODE:
            tl.store(my_slot + offs, v, mask=mask)        # staged: remote puts read it
        for k in range(1, LW):
            peer = node0 + (local + k) % LW
            tl.store(dl.symm_at(my_slot + offs, peer), v, mask=mask)
    if MULTI_NODE:
        for k in range(1, NN):
            for l in range(0, LW):
                peer = ((node + k) % NN) * LW + (local + l) % LW
                _put_chunk(my_slot, my_slot, lo, hi, sig_word, val, peer, ELEM_BYTES)
    if SCALES:
        my_sslot = sbuf_ptr + par * (W * s_slot.to(tl.int64)) + me * s_slot.to(tl.int64)
        slo, shi = _chunk(ns, BLOCK)
        for off in range(slo, shi, BLOCK):
            offs = off + tl.arange(0, BLOCK)
            mask = offs < shi
            v = tl.load(s_ptr + offs, mask=mask)
            for k in range(1, LW):
                peer = node0 + (local + k) % LW
                tl.store(dl.symm_at(my_sslot + offs, peer), v, mask=mask)
    for k in range(1, LW):
        peer = node0 + (local + k) % LW
        dl.notify(sig_word, peer, signal=val, sig_op="set", comm_scope="intra_node")
    epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# consumer: persistent GEMM over the gathered rows, in gather-swizzle order
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["m", "slot_rows", "P", "s_slot"])
def ag_gemm_consumer_kernel(a_ptr, b_ptr, c_ptr, buf_ptr, sig_ptr, ready_ptr, free_ptr, calls_ptr, m, N, K,
                            slot_rows, stride_am, stride_bk, stride_bn, P,
                            sa_ptr, sbuf_ptr, sb_ptr, stride_sam, stride_sak, stride_sbk, stride_sbn, s_slot,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, CE: tl.constexpr, TMA: tl.constexpr,
                            FLATTEN: tl.constexpr = False, SUBTILE: tl.constexpr = 1, SCALE: tl.constexpr = 0,
                            GK: tl.constexpr = 1, GN: tl.constexpr = 1, B_T: tl.constexpr = False):
    """``c[W*m, N] = gathered_a[W*m, K] @ b[K, N]``; ``a`` (``[m, K]``,
    row-major) is this rank's shard, the others are read from ``buf`` once
    their signals say they have arrived (``ready[s] == 1`` with ``CE``, else
    the ``P`` words of ``sig[e % 2][s]`` equal ``e + 1``).  ``stride_am`` is
    ``K`` (``a`` and the slots are row-major), a separate argument so that it
    is specialised (alignment) even where ``K`` is not.  ``TMA``: tiles never
    straddle segments (``m % BLOCK_M == 0``); each tile builds a descriptor
    of its segment (``a`` or the slot), so one K loop and one set of shared
    memory buffers serve both.

    fp8 (``SCALE``, kernels/scaling.py): the A scales travel with their rows:
    row ``r`` of a segment has its scales at ``r * stride_sam`` (+ ``g *
    stride_sak`` for K group ``g``) in this rank's ``sa`` (its own rows) or
    in the segment's slot of ``sbuf`` (``s_slot`` elements apart), which the
    producer fills before it signals the rows; ``sb``: b's scales; ``B_T``:
    b's TMA descriptor is of ``b^T`` (K-major)."""
    if CE:
        par = 0
        val = 1
    else:
        e = epoch_begin(calls_ptr)
        par = e % 2
        val = e + 1
    me = dl.rank()
    W = dl.num_ranks()
    NN = dl.num_ranks(1)
    M = W * m
    sr = slot_rows.to(tl.int64)
    bufp = buf_ptr + par * (W * sr) * stride_am
    ss = s_slot.to(tl.int64)
    sbufp = sbuf_ptr + par * (W * ss)
    if CE:
        sigp = ready_ptr
        per_seg = 1
    else:
        sigp = sig_ptr + par * (W * P)
        per_seg = P
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * num_pid_n
    if TMA:
        # m % BLOCK_M == 0: no tile straddles segments, and the gather order starts with the local tiles.
        # Three operand descriptors, built once: the local shard, the gather buffer (one [W * slot_rows, K]
        # matrix), B; the result leaves through a TMA-store epilogue.
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[m, K], strides=[stride_am, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        g_desc = tl.make_tensor_descriptor(bufp, shape=[W * slot_rows, K], strides=[stride_am, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        if B_T:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1],
                                               block_shape=[BLOCK_N, BLOCK_K])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                               block_shape=[BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1],
                                           block_shape=[BLOCK_M, BLOCK_N // SUBTILE])
        local_tiles = (m // BLOCK_M) * num_pid_n
        # local tiles: nothing to wait for, so the loop is software-pipelined across tiles
        for tile in tl.range(tl.program_id(0), local_tiles, tl.num_programs(0), flatten=FLATTEN):
            pid_m, pid_n = dl.swizzle_gather(tile, M, N, BLOCK_M, BLOCK_N, me, W, NN, GROUP_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            in_rows = pid_m * BLOCK_M - me * m + tl.arange(0, BLOCK_M)
            acc = scaled_gemm_tile_tma(a_desc, b_desc, pid_m * BLOCK_M - me * m, pid_n * BLOCK_N, K,
                                       sa_ptr + in_rows.to(tl.int64) * stride_sam,
                                       sb_ptr + (tl.minimum(cols, N - 1) // GN).to(tl.int64) * stride_sbn, cols < N,
                                       stride_sak, stride_sbk, BLOCK_M, BLOCK_N, BLOCK_K, SCALE, GK, B_T)
            store_tile_tma(c_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, acc, BLOCK_M, BLOCK_N, SUBTILE,
                           c_ptr.dtype.element_ty)
        # remote tiles, continuing each program's round robin: wait for the segment, then read it. Not
        # flattened: the next tile's loads must not be issued before its wait.
        P_ = tl.num_programs(0)
        first = local_tiles + ((tl.program_id(0) - local_tiles) % P_ + P_) % P_
        for tile in range(first, num_tiles, P_):
            pid_m, pid_n = dl.swizzle_gather(tile, M, N, BLOCK_M, BLOCK_N, me, W, NN, GROUP_M)
            seg = (pid_m * BLOCK_M) // m
            tok = dl.wait(sigp + seg * per_seg, per_seg, "sys", "acquire", waitValue=val)
            row0 = dl.consume_token(seg * slot_rows + (pid_m * BLOCK_M - seg * m), tok)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            g_rows = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)          # rows of the gather buffer
            srows = sbufp + (g_rows // slot_rows) * ss + (g_rows % slot_rows) * stride_sam
            acc = scaled_gemm_tile_tma(g_desc, b_desc, row0, pid_n * BLOCK_N, K, srows,
                                       sb_ptr + (tl.minimum(cols, N - 1) // GN).to(tl.int64) * stride_sbn, cols < N,
                                       stride_sak, stride_sbk, BLOCK_M, BLOCK_N, BLOCK_K, SCALE, GK, B_T)
            store_tile_tma(c_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, acc, BLOCK_M, BLOCK_N, SUBTILE,
                           c_ptr.dtype.element_ty)
    else:
        for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            pid_m, pid_n = dl.swizzle_gather(tile, M, N, BLOCK_M, BLOCK_N, me, W, NN, GROUP_M)
            lo, hi = dl.tile_segments(pid_m, M, BLOCK_M, W)
            # wait for the tile's remote segments: [lo, me - 1] and [me + 1, hi]
            n_below = tl.maximum(tl.minimum(hi, me - 1) - lo + 1, 0)
            tok1 = dl.wait(sigp + lo * per_seg, n_below * per_seg, "sys", "acquire", waitValue=val)
            s_above = tl.maximum(lo, me + 1)
            n_above = tl.maximum(hi - s_above + 1, 0)
            tok2 = dl.wait(sigp + s_above * per_seg, n_above * per_seg, "sys", "acquire", waitValue=val)
            rows, row_ok, rows_c = tile_rows(pid_m, M, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            src = dl.consume_token(dl.consume_token(bufp, tok1), tok2)
            seg = tl.minimum(rows_c // m, W - 1)
            seg64 = seg.to(tl.int64)
            in_seg = rows_c.to(tl.int64) - seg64 * m                     # row inside its segment
            a_rows = tl.where(seg == me, a_ptr + in_seg * stride_am, src + (seg64 * sr + in_seg) * stride_am)
            b_cols = b_ptr + cols.to(tl.int64) * stride_bn
            ssrc = dl.consume_token(dl.consume_token(sbufp, tok1), tok2)
            sa_rows = tl.where(seg == me, sa_ptr + in_seg * stride_sam, ssrc + seg64 * ss + in_seg * stride_sam)
            sb_cols = sb_ptr + (tl.minimum(cols, N - 1) // GN).to(tl.int64) * stride_sbn
            acc = scaled_gemm_tile(a_rows, b_cols, col_ok, 1, stride_bk, K, sa_rows, sb_cols, stride_sak, stride_sbk,
                                   BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SCALE, GK)
            store_tile(c_ptr, N, 1, rows, row_ok, cols, col_ok, acc)
    if CE:
        ce_release(calls_ptr, ready_ptr, free_ptr, me, W)
    else:
        epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

PRODUCERS = ("auto", "ce", "sm")
#: consumers: the tl core (every target, the simulator) or the Gluon Hopper core (kernels/ag_gemm_hopper.py)
CORES = ("tl", "gluon")


class AgGemmContext(CollectiveContext):
    """Gather buffer, signals and GEMM config of ag_gemm (see the module docstring)."""

    op = "ag_gemm"
    creator = "create_ag_gemm_context"
    dtypes = _GEMM_DTYPES + scaling.FP8_DTYPES

    def __init__(self, max_m_per_rank, k, dtype, world=None, producer="auto", producer_programs=None,
                 config: GemmConfig | None = None, num_programs=None, overlap=None, tma=None, out_dtype=None,
                 scale_block=(128, 128), core="tl", gluon_config=None, **tile_options):
        E = ditron.DitronError
        if core not in CORES:
            raise E(f"ag_gemm: core={core!r}; use one of {', '.join(CORES)}")
        fp8 = dtype in scaling.FP8_DTYPES
        if dtype not in _GEMM_DTYPES and not fp8:
            raise E(f"ag_gemm: dtype {dtype} is not supported (use float16 or bfloat16, or an fp8 dtype: "
                    "float8_e4m3fn / float8_e5m2)")
        if fp8:
            out_dtype = out_dtype or torch.bfloat16
            if out_dtype not in scaling.OUT_DTYPES:
                raise E(f"ag_gemm: out_dtype={out_dtype}; fp8 GEMMs write bfloat16, float16 or float32")
        elif out_dtype is not None and out_dtype != dtype:
            raise E(f"ag_gemm: out_dtype={out_dtype} applies to fp8 contexts; fp16 / bf16 GEMMs write their dtype")
        self.fp8 = fp8
        self.out_dtype = out_dtype or dtype
        self.scale_block = scaling.check_scale_block("ag_gemm", scale_block)
        if int(max_m_per_rank) < 1 or int(k) < 1:
            raise ditron.DitronError(f"ag_gemm: max_m_per_rank ({max_m_per_rank}) and k ({k}) must be >= 1")
        if producer not in PRODUCERS:
            raise ditron.DitronError(f"ag_gemm: producer={producer!r}; use one of {', '.join(PRODUCERS)}")
        super().__init__(int(max_m_per_rank) * int(k), dtype, world)
        W = self.world_size
        self.max_m = int(max_m_per_rank)
        self.k = int(k)
        self.multi_node = self.world.nnodes > 1
        self.sim = self.world.backend == "sim" or is_sim_device(self.device)
        if producer == "auto":
            producer = "sm" if self.multi_node else "ce"
        if producer == "ce" and self.multi_node:
            raise ditron.DitronError("ag_gemm: producer='ce' (copy engine) reaches this node's ranks only; this "
                                     f"world has {self.world.nnodes} nodes: use producer='sm'")
        self.producer = producer
        self.core = core
        self.gluon_config = None
        if core == "gluon":
            # the Gluon consumer (kernels/ag_gemm_hopper.py): the copy-engine protocol; fp16 / bf16 on the core's
            # default config, fp8 on its fp8 core (fp8_default_config per call shape unless gluon_config is given)
            if producer != "ce":
                raise E("ag_gemm: core='gluon' runs the copy-engine protocol (one node, producer='ce'); this "
                        f"context's producer is {producer!r}: use core='tl'")
            from .gemm_hopper import DEFAULT_CONFIG, HopperGemmConfig
            from .gemm_rs import _check_gluon_device
            if gluon_config is not None and not isinstance(gluon_config, HopperGemmConfig):
                raise E("ag_gemm: gluon_config must be a ditron.kernels.gemm_hopper.HopperGemmConfig")
            _check_gluon_device("ag_gemm", self)            # a GPU that is not a Hopper one (the simulator: anywhere)
            if fp8:
                self.gluon_config = gluon_config and gluon_config.validate(
                    "ag_gemm", elem=1, out_elem=torch.empty((), dtype=self.out_dtype).element_size())
            else:
                self.gluon_config = (gluon_config or DEFAULT_CONFIG).validate("ag_gemm")
        elif gluon_config is not None:
            raise E("ag_gemm: gluon_config applies to core='gluon'")
        self.config = self._config(config, tile_options)
        self.num_programs = num_programs
        self.tma = tma            # None: where it applies (GPU, m % block_m == 0, aligned operands)
        if self.sim:
            self.producer_programs = int(producer_programs or 2)
        else:
            self.producer_programs = int(producer_programs or min(32, sm_count(self.device)))
        if self.producer_programs < 1:
            raise ditron.DitronError("ag_gemm: producer_programs must be >= 1")
        on_gpu = not self.sim and torch.device(self.device).type == "cuda"
        # the copy engine always runs beside the GEMM; the SM producer only when asked
        self.overlap = on_gpu and (producer == "ce" or bool(overlap))
        self._plans = {}
        # slots of whole rows, each starting 256-byte aligned: buf[p] is also a [W * slot_rows, K] matrix
        align_rows = _SLOT_ALIGN // math.gcd(self.k, _SLOT_ALIGN)
        self.slot_rows = (self.max_m + align_rows - 1) // align_rows * align_rows
        parities = 1 if producer == "ce" else 2
        self.pcalls = torch.zeros(2, dtype=torch.int64, device=self.device)   # the SM producer's call counter
        self.buf = self.symm((parities, W, self.slot_rows * self.k), dtype, "buf")
        self.sig = self.symm((2, W, self.producer_programs), torch.int64, "sig")
        self.ready = self.symm((W,), torch.int64, "ready")
        self.free = self.symm((W,), torch.int64, "free")
        self.free.fill_(1)
        # fp8: the A scales of every slot's rows (room for blockwise: cdiv(k, gk) per row; per-row uses 1)
        if fp8 and self.multi_node:
            raise E("ag_gemm: fp8 across nodes is not supported yet (the rows' scales travel by intra-node "
                    "stores); use one node, or dequantise to bf16")
        self.s_slot = self.slot_rows * cdiv(self.k, self.scale_block[0]) if fp8 else 1
        self.sbuf = self.symm((parities, W, self.s_slot), torch.float32, "sbuf") if fp8 else None
        ditron.barrier_all()          # every rank's flags exist (and are initialised) before any peer writes them

    def _config(self, config, tile_options):
        if config is not None and tile_options:
            raise ditron.DitronError("ag_gemm: give either config= or block_m/block_n/block_k/... options")
        if tile_options:
            known = {f.name for f in dataclasses.fields(GemmConfig)}
            bad = sorted(set(tile_options) - known)
            if bad:
                raise ditron.DitronError(f"ag_gemm: unknown option(s) {', '.join(bad)}")
            base = default_config(1 << 14, 1 << 14, self.k, self.dtype, self.device)
            config = dataclasses.replace(base, **{k: int(v) for k, v in tile_options.items() if v is not None})
        return config.validate("ag_gemm") if config is not None else None


def create_ag_gemm_context(max_m_per_rank, k, dtype, world=None, **options):
    """Allocate ag_gemm's gather buffer (``world * max_m_per_rank * k``
    elements, twice with ``producer="sm"``; symmetric) and signals.
    Collective: every rank calls it with the same arguments.

    ``options``: ``producer`` (``"auto"``: ``"ce"`` on one node, ``"sm"`` on
    several), ``config`` (a :class:`~ditron.kernels.gemm.GemmConfig`; default
    by shape) or its fields ``block_m``, ``block_n``, ``block_k``,
    ``group_m``, ``num_warps``, ``num_stages``; ``num_programs`` (persistent
    GEMM programs; default one per SM), ``tma`` (``None``: where it applies),
    ``producer_programs`` and ``overlap`` (``"sm"`` producer on a side
    stream).

    fp8 (``dtype`` ``torch.float8_e4m3fn`` / ``float8_e5m2``; one node):
    the gather buffer holds fp8 rows and a float32 buffer their scales
    (``cdiv(k, gk)`` per row); ``out_dtype`` (default bfloat16; float16,
    float32) is the result's dtype, ``scale_block=(gk, gn)`` the blockwise
    groups (kernels/scaling.py).

    ``core``: the consumer's GEMM core -- ``"tl"`` (default; every target and
    the simulator) or ``"gluon"``, the warp-specialised Hopper core
    (kernels/ag_gemm_hopper.py: one node, sm_90; float16 / bfloat16, or
    fp8 with the scales travelling with their rows on the core's fp8 path;
    ``gluon_config`` a ``HopperGemmConfig``, for fp8 default
    ``gemm_hopper.fp8_default_config``); on the simulator a ``"gluon"``
    context runs the tl consumer, its twin (an fp8 call is checked there
    as the Gluon consumer would check it)."""
    return AgGemmContext(max_m_per_rank, k, dtype, world, **options)


def _check(ctx, a, b, out):
    E = ditron.DitronError
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise E("ag_gemm: argument 'a' must be a 2-D tensor [m, K] (this rank's shard)")
    m, K = a.shape
    if m < 1:
        raise E("ag_gemm: argument 'a' has no rows (m must be >= 1)")
    if m > ctx.max_m:
        raise E(f"ag_gemm: argument 'a' has {m} rows, more than the context's max_m_per_rank={ctx.max_m}; "
                f"create a larger context")
    if K != ctx.k:
        raise E(f"ag_gemm: argument 'a' has K={K}, the context was created for k={ctx.k}")
    ctx.check_tensor(a, "a")        # dtype, device, layout
    shape = (ctx.world_size * m, b.shape[1] if isinstance(b, torch.Tensor) and b.dim() == 2 else -1)
    check_operands("ag_gemm", a, b, out, shape, ctx.out_dtype if ctx.fp8 else None)
    if out is not None and not out.is_contiguous():
        raise E("ag_gemm: argument 'out' must be contiguous")
    return m, K, b.shape[1]


def _ce_plan(ctx, m, K, ns=0, compact=False):
    """Per shard size (and ``ns`` scale values per shard, fp8): for each peer
    ``rank-1, rank-2, ...`` the views the copy-engine producer needs (built
    once: the host path of a call is a few driver calls).  ``compact`` (the
    Gluon consumer, kernels/ag_gemm_hopper.py): the scales go to elements
    ``[rank * ns, (rank + 1) * ns)`` of the peer's ``sbuf[0]``, so that the
    gathered rows' scales are one ``[W * m, ns // m]`` matrix; else to the
    rank's slot of ``sbuf[0]`` (the tl consumer's layout)."""
    plan = ctx._plans.get((m, ns, compact))
    if plan is None:
        W, me = ctx.world_size, ctx.rank
        slot = ctx.buf[0, me, :m * K]
        sslot = ctx.sbuf[0].reshape(-1)[me * ns:(me + 1) * ns] if compact else ctx.sbuf[0, me, :ns] if ns else None
        plan = []
        for k in range(1, W):
            peer = (me - k) % W
            sdst = ditron.peer_tensor(sslot, peer) if ns else None
            plan.append((ctx.free[peer:peer + 1], ditron.peer_tensor(slot, peer),
                         ditron.peer_tensor(ctx.ready[me:me + 1], peer), sdst))
        ctx._plans = {(m, ns, compact): plan}
    return plan


def _produce_ce(ctx, a, m, K, srows=None, compact=False):
    """Copy-engine pushes of ``a`` into every peer's slot ``rank`` (see the module docstring); fp8: its
    rows' scales ``srows`` (contiguous) into the peer's ``sbuf`` first (``compact``: :func:`_ce_plan`),
    under the same ``free`` / ``ready`` flags (the rows and their scales land before ``ready`` is set)."""
    transport = ctx.world.transport
    stream = None
    if ctx.overlap:
        stream = ctx.side_stream()
        stream.wait_stream(torch.cuda.current_stream(a.device))          # a is written
    src = a.reshape(-1)
    ns = 0 if srows is None else srows.numel()
    for free, dst, ready, sdst in _ce_plan(ctx, m, K, ns, compact):
        if ns:
            take_flag(transport, free, stream)
            transport.rank_copy(sdst, srows.reshape(-1), stream)
            transport.rank_copy(dst, src, stream)
            transport.write_value(ready, 1, stream)
        else:
            ce_send(transport, free, dst, src, ready, stream)
    if stream is not None:
        a.record_stream(stream)
        if ns:
            srows.record_stream(stream)


def _produce_sm(ctx, a, m, K, srows=None):
    P = ctx.producer_programs
    n = m * K
    block = 128 if ctx.sim else max(256, min(4096, next_pow2(cdiv(n, P))))
    producer = ag_gemm_producer_kernel[(P,)]
    if srows is None:
        sargs = (a, ctx.buf, 0, 1)
    else:
        sargs = (srows, ctx.sbuf, srows.numel(), ctx.s_slot)
    args = (a, ctx.buf, ctx.sig, ctx.pcalls, n, ctx.slot_rows * ctx.k) + sargs
    kw = dict(MULTI_NODE=ctx.multi_node, ELEM_BYTES=a.element_size(), BLOCK=block, num_warps=1 if ctx.sim else 4,
              SCALES=srows is not None)
    if ctx.overlap:
        side = ctx.side_stream()
        side.wait_stream(torch.cuda.current_stream(a.device))   # the previous call's consumer (and a's producer)
        with torch.cuda.stream(side):
            producer(*args, **kw)
        a.record_stream(side)
    else:
        producer(*args, **kw)


def _consumer_plan(ctx, a, b, m, K, N, aligned, rec=None, sconsts=scaling.DUMMY_CONSTS):
    """(grid, arguments after a, b and out, keyword arguments) of the consumer kernel for a call of these
    shapes and strides (made once per such call: AgGemmContext.plan)."""
    M = ctx.world_size * m
    cfg = ctx.config or default_config(M, N, K, a.dtype, a.device, ctx.out_dtype)
    if rec is not None:
        check_fp8_config("ag_gemm", cfg, rec)
    # ctx.tma (not config.tma) decides here: None = wherever it applies
    b_major = b.stride(0) == 1 if rec is not None else b.stride(1) == 1
    tma = (not ctx.sim and ctx.tma is not False and m % cfg.block_m == 0 and b_major and aligned)
    if ctx.tma and not tma:
        raise ditron.DitronError(f"ag_gemm: tma=True needs m % block_m == 0 (m={m}, block_m={cfg.block_m}), "
                                 f"{'column-major (K-major) b for fp8' if rec is not None else 'row-major b'} "
                                 "and 16-byte aligned rows; on GPUs only")
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    if ctx.num_programs:
        P = int(ctx.num_programs)
    elif ctx.sim:
        P = 4
    else:
        P = sm_count(a.device) - (ctx.producer_programs if ctx.overlap and ctx.producer == "sm" else 0)
    P = max(1, min(P, tiles))
    tail = (ctx.buf, ctx.sig, ctx.ready, ctx.free, ctx.calls, m, N, K, ctx.slot_rows, a.stride(0), b.stride(0),
            b.stride(1), ctx.producer_programs)
    consts = dict(EVEN_K=(K % cfg.block_k == 0), CE=(ctx.producer == "ce"), TMA=tma, FLATTEN=cfg.flatten and tma,
                  SUBTILE=cfg.epilogue_subtile if tma else 1, B_T=tma and rec is not None, **sconsts,
                  **cfg.launch_options())
    return (P,), tail, consts


def _scale_rows(ctx, rec, scale_a, m):
    """fp8: this shard's A scales as the rows' contiguous ``[m, SK]`` (``SK`` 1, or ``cdiv(K, gk)``
    blockwise): what travels with the rows and what the consumer reads for its own rows.  A per-tensor
    scale becomes per-row (one small copy): every rank's shard keeps its own scale."""
    if rec.mode == scaling.BLOCKWISE:
        srows = scale_a.contiguous()
    else:
        srows = scale_a.reshape(-1, 1).expand(m, 1).contiguous()
    return srows, srows.shape[1]


def ag_gemm(a, b, ctx, out=None, *, scale_a=None, scale_b=None):
    """``all_gather(a) @ b`` (``[world * m, N]``, ``a``'s dtype).  Every rank
    must call it with the same ``m`` and ``K`` (``N`` and ``b`` may differ per
    rank), in the same order as its other calls on ``ctx``.  Wrong shapes,
    dtypes or devices raise ``DitronError`` before anything is launched.

    fp8 contexts: ``scale_a`` is this shard's (one element, ``[m, 1]`` or
    ``[m, cdiv(K, gk)]``; it travels with the rows: the gathered row of rank
    ``s`` is scaled by rank ``s``'s scale), ``scale_b`` b's (kernels/scaling.py);
    the result is the context's ``out_dtype``."""
    enter(ctx, AgGemmContext, "ag_gemm", lambda: op_fields(a, name="a"), a=a, b=b, out=out)
    m, K, N = _check(ctx, a, b, out)
    W = ctx.world_size
    M = W * m
    if out is None:
        out = torch.empty((M, N), dtype=ctx.out_dtype, device=a.device)
    ptrs = (a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0)
    if ctx.fp8:
        rec = scaling.recipe("ag_gemm", m, K, N, scale_a, scale_b, a.device, ctx.scale_block)
        if ctx.core == "gluon":
            # the fp8 Gluon consumer (kernels/ag_gemm_hopper.py), planned once per call shape; its checks run on
            # every device (the simulator, which runs the tl twin below, refuses what the GPU would)
            from . import ag_gemm_hopper
            gkey = (("gluon", m, K, N, a.dtype, b.dtype, out.dtype) + tuple(a.stride()) + tuple(b.stride())
                    + tuple(out.stride()) + ptrs + scale_key(rec, scale_a, scale_b))
            plan = ctx.plan(gkey, ag_gemm_hopper.plan_fp8, ctx, a, b, out, m, K, N, scale_a, scale_b)
            if not ctx.sim:
                ensure_tma_allocator()
                ag_gemm_hopper.launch_fp8(ctx, plan, a, b, out, scale_a, scale_b, m, K)
                if W > 1 and ctx.overlap:
                    torch.cuda.current_stream(a.device).wait_stream(ctx.side_stream())   # later writes to a wait
                return out
        srows, sk = _scale_rows(ctx, rec, scale_a, m)
        sargs = (srows, ctx.sbuf, scale_b, sk, 1 if rec.mode == scaling.BLOCKWISE else 0) + rec.sb + (ctx.s_slot,)
        sconsts = rec.consts()
    else:
        scaling.no_scales("ag_gemm", scale_a, scale_b)
        rec, srows, sconsts = None, None, scaling.DUMMY_CONSTS
        sargs = (a, a, a, 0, 0, 0, 0, 1)
    aligned = not ctx.sim and (fp8_tma_ok(a, b, out) if ctx.fp8 else tma_ok(a, b, out))
    key = (m, K, N, a.dtype, b.dtype, out.dtype, a.stride(0), b.stride(0), b.stride(1), aligned) + scale_key(
        rec, srows, scale_b)
    if ctx.core == "gluon" and not ctx.sim and not ctx.fp8:
        from . import ag_gemm_hopper
        ag_gemm_hopper.check_applies(ctx, a, b, out, m, aligned)
        ensure_tma_allocator()
        if W > 1:
            _produce_ce(ctx, a, m, K)
        ag_gemm_hopper.launch(ctx, a, b, out, m, K, N)
        if W > 1 and ctx.overlap:
            torch.cuda.current_stream(a.device).wait_stream(ctx.side_stream())   # later writes to a wait for it
        return out
    grid, tail, consts = ctx.plan(key, _consumer_plan, ctx, a, b, m, K, N, aligned, rec, sconsts)
    if consts["TMA"]:
        ensure_tma_allocator()
    if W > 1:
        (_produce_ce if ctx.producer == "ce" else _produce_sm)(ctx, a, m, K, srows)
    ctx.launch(key + ptrs, ag_gemm_consumer_kernel, grid, (a, b, out) + tail + sargs, consts)
    if W > 1 and ctx.overlap:
        torch.cuda.current_stream(a.device).wait_stream(ctx.side_stream())   # later writes to a wait for it
    return out
