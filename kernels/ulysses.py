"""Ulysses sequence parallelism written in ditron: the QKV projection fused
with the all-to-all that turns sequence shards into head shards, attention
on whole sequences, and the all-to-all back fused with the output projection.

    ctx = create_ulysses_context(max_seq, hidden, q_heads, kv_heads, head_dim, torch.bfloat16)   # collective
    y = ulysses_attention(x, w_qkv, w_o, ctx, causal=True)

* ``x``: ``[S, hidden]``, this rank's ``S`` rows of the sequence (rank ``r``
  holds rows ``[r*S, (r+1)*S)``; the same ``S`` on every rank);
* ``w_qkv``: ``[hidden, (Hq + 2*Hkv) * D]`` (columns: the query heads, then
  the key heads, then the value heads), ``w_o``: ``[Hq * D, hidden]``, the
  same on every rank;
* ``y``: ``[S, hidden]``: ``attention(x @ w_qkv) @ w_o`` for this rank's rows
  (SDPA over the whole sequence of ``W * S`` rows, GQA).

``Hq`` and ``Hkv`` must be multiples of the world size: rank ``j`` owns query
heads ``[j*Hq/W, (j+1)*Hq/W)`` and the matching KV heads.

Kernels (one node; peers by load/store):

1. ``ulysses_qkv_a2a_kernel`` -- GEMM + all-to-all: program ``(row tile,
   head)`` computes one head's columns of ``x @ w_qkv`` for its rows (the GEMM
   core's ``gemm_tile``) and stores the tile straight into the owner's receive
   buffer (``dl.symm_at``) at the rows of this rank, in SDPA layout, then adds
   1 to the owner's arrival counter (release).
2. ``ulysses_wait_kernel`` -- one program waits until the counter holds every
   tile of this call from every rank.
3. :func:`kernels.attention.flash_attention` on the received whole-sequence
   head shard (``[1, Hq/W, W*S, D]``).
4. ``ulysses_a2a_back_kernel`` -- each rank's rows of the attention output
   go to their owner's buffer at this rank's head columns; one arrival counter
   per source rank.
5. ``ulysses_a2a_oproj_kernel`` -- all-to-all + GEMM: the output projection's
   K loop runs over the source ranks in ring order starting with this rank,
   waiting for each source's counter before its K chunk (its own part first,
   while the peers' parts are on the way).

Reuse: the call counter of kernels/_common.py; the arrival counters only
grow (a call waits for ``(e + 1) x`` its tile count).  The buffers need no
second parity: a peer writes call ``e + 1``'s data only after its call ``e``
finished, which needed this rank's last step of call ``e``, which comes after
this rank's reads of call ``e``'s data.
"""
from __future__ import annotations

import torch
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import CollectiveContext, enter, epoch_begin, epoch_end
from ._common import cdiv
from .attention import AttnConfig, flash_attention
from .gemm import gemm_tile, tile_rows

_DTYPES = (torch.float16, torch.bfloat16)
#: GEMM tiles (rows, K) on GPUs / on the simulator; a tile's columns are one head (``head_dim``)
GPU_BLOCK_M, GPU_BLOCK_K, GPU_BLOCK_N = 128, 64, 128
SIM_BLOCK_M, SIM_BLOCK_K, SIM_BLOCK_N = 16, 32, 16


@ditron.jit
def ulysses_qkv_a2a_kernel(x_ptr, w_ptr, recv_ptr, cnt_ptr, S, HID, NCOL, qreg, kreg, HQ, HKV,
                           WORLD: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    pid_m = tl.program_id(0)
    c = tl.program_id(1)                      # head column: q heads, then k heads, then v heads
    me = dl.rank()
    rows, row_ok, rows_c = tile_rows(pid_m, S, BLOCK_M)
    cols = c * HEAD_D + tl.arange(0, HEAD_D)
    acc = gemm_tile(x_ptr + rows_c.to(tl.int64) * HID, w_ptr + cols, cols < NCOL, 1, NCOL, HID, BLOCK_M, HEAD_D,
                    BLOCK_K, EVEN_K)
    is_q = c < HQ
    is_k = (c >= HQ) & (c < HQ + HKV)
    hh = tl.where(is_q, c, tl.where(is_k, c - HQ, c - HQ - HKV))
    per = tl.where(is_q, HQ // WORLD, HKV // WORLD)
    base = tl.where(is_q, 0, tl.where(is_k, qreg, qreg + kreg))
    dst = hh // per
    hl = hh % per
    offs_d = tl.arange(0, HEAD_D)
    p = recv_ptr + base + (hl.to(tl.int64) * S * WORLD + me * S + rows)[:, None] * HEAD_D + offs_d[None, :]
    tl.store(dl.symm_at(p, dst), acc.to(recv_ptr.dtype.element_ty), mask=row_ok[:, None])
    dl.notify(cnt_ptr, dst, signal=1, sig_op="add", comm_scope="intra_node")


@ditron.jit
def ulysses_wait_kernel(cnt_ptr, calls_ptr, per_call):
    e = epoch_begin(calls_ptr)
    dl.wait(cnt_ptr, 1, "sys", "acquire", waitValue=(e + 1) * per_call)


@ditron.jit
def ulysses_a2a_back_kernel(o_ptr, abuf_ptr, cnt_ptr, S, HL, HQ, WORLD: tl.constexpr, HEAD_D: tl.constexpr,
                            BLOCK_M: tl.constexpr):
    """Program ``(local head, destination x row tile)``."""
    h = tl.program_id(0)
    t = tl.program_id(1)
    nt = (S + BLOCK_M - 1) // BLOCK_M
    dst = t // nt
    rows = (t % nt) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < S
    offs_d = tl.arange(0, HEAD_D)
    me = dl.rank()
    v = tl.load(o_ptr + (h.to(tl.int64) * S * WORLD + dst * S + rows)[:, None] * HEAD_D + offs_d[None, :],
                mask=ok[:, None])
    p = abuf_ptr + rows.to(tl.int64)[:, None] * (HQ * HEAD_D) + ((me * HL + h) * HEAD_D + offs_d)[None, :]
    tl.store(dl.symm_at(p, dst), v, mask=ok[:, None])
    dl.notify(cnt_ptr + 1 + me, dst, signal=1, sig_op="add", comm_scope="intra_node")


@ditron.jit
def ulysses_a2a_oproj_kernel(abuf_ptr, w_ptr, out_ptr, cnt_ptr, calls_ptr, S, HID, KC, per_src,
                             WORLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, WAIT: tl.constexpr):
    """Tile ``(pid_m, pid_n)`` of ``abuf @ w_o``, K chunk by source rank.
    ``WAIT`` is False only in the planted-bug test."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = epoch_begin(calls_ptr)
    me = dl.rank()
    rows, row_ok, rows_c = tile_rows(pid_m, S, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < HID
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    for s in range(0, WORLD):
        src = (me + s) % WORLD
        a_rows = abuf_ptr + rows_c.to(tl.int64) * (WORLD * KC) + src * KC
        if WAIT:
            tok = dl.wait(cnt_ptr + 1 + src, 1, "sys", "acquire", waitValue=(e + 1) * per_src)
            a_rows = dl.consume_token(a_rows, tok)
        acc += gemm_tile(a_rows, w_ptr + src.to(tl.int64) * KC * HID + cols, col_ok, 1, HID, KC, BLOCK_M, BLOCK_N,
                         BLOCK_K, EVEN_K)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * HID + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])
    epoch_end(calls_ptr)


class UlyssesContext(CollectiveContext):
    """Receive buffers and arrival counters of :func:`ulysses_attention`."""

    op = "ulysses"
    creator = "create_ulysses_context"

    def __init__(self, max_seq, hidden, q_heads, kv_heads, head_dim, dtype, world=None):
        E = ditron.DitronError
        if dtype not in _DTYPES:
            raise E(f"ulysses: dtype {dtype} is not supported (use float16 or bfloat16)")
        if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
            raise E(f"ulysses: head_dim={head_dim} must be a power of two in [16, 256]")
        if q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
            raise E(f"ulysses: q_heads={q_heads} must be a positive multiple of kv_heads={kv_heads}")
        super().__init__(int(max_seq) * int(hidden), dtype, world)
        w = self.world
        W = self.world_size
        if q_heads % W or kv_heads % W:
            raise E(f"ulysses: {q_heads} query / {kv_heads} KV heads cannot be split over {W} ranks (both must be "
                    f"multiples of the world size: each rank owns whole heads)")
        if w.nnodes > 1 or w.local_world_size != W:
            raise E(f"ulysses: the world spans {w.nnodes} nodes; these kernels need every rank on one node")
        self.max_seq, self.hidden, self.q_heads, self.kv_heads, self.head_dim = int(max_seq), int(hidden), q_heads, \
            kv_heads, head_dim
        self.numel_factor = 1 << 30          # shapes are checked per dimension
        self.sim = w.backend == "sim"
        n_all = W * self.max_seq
        self.qreg = (q_heads // W) * n_all * head_dim
        self.kreg = (kv_heads // W) * n_all * head_dim
        self.recv = self.symm((self.qreg + 2 * self.kreg,), dtype, "recv")
        self.abuf = self.symm((self.max_seq * q_heads * head_dim,), dtype, "abuf")
        self.cnt = self.symm((1 + W,), torch.int64, "cnt")
        ditron.barrier_all()


def create_ulysses_context(max_seq, hidden, q_heads, kv_heads, head_dim, dtype, world=None):
    """Allocate (collectively) the buffers of :func:`ulysses_attention` for up
    to ``max_seq`` rows per rank.  Heads not divisible by the world size are
    an error here."""
    return UlyssesContext(max_seq, hidden, q_heads, kv_heads, head_dim, dtype, world)


def ulysses_attention(x, w_qkv, w_o, ctx: UlyssesContext, causal=False, sm_scale=None,
                      attn_config: AttnConfig | None = None, _plant_no_wait=False):
    """``attention(x @ w_qkv) @ w_o`` for this rank's rows (module docstring)."""
    E = ditron.DitronError
    enter(ctx, UlyssesContext, "ulysses", [("x.shape", tuple(x.shape) if isinstance(x, torch.Tensor) else None),
                                           ("causal", bool(causal))], x=x, w_qkv=w_qkv, w_o=w_o)
    W, HQ, HKV, D = ctx.world_size, ctx.q_heads, ctx.kv_heads, ctx.head_dim
    for name, t in (("x", x), ("w_qkv", w_qkv), ("w_o", w_o)):
        ctx.check_tensor(t, name)
    if x.dim() != 2 or x.shape[1] != ctx.hidden or not 1 <= x.shape[0] <= ctx.max_seq:
        raise E(f"ulysses: x is {tuple(x.shape)}; expected [rows <= {ctx.max_seq}, hidden={ctx.hidden}]")
    ncol = (HQ + 2 * HKV) * D
    if tuple(w_qkv.shape) != (ctx.hidden, ncol):
        raise E(f"ulysses: w_qkv is {tuple(w_qkv.shape)}; expected [hidden={ctx.hidden}, (Hq + 2*Hkv)*D={ncol}]")
    if tuple(w_o.shape) != (HQ * D, ctx.hidden):
        raise E(f"ulysses: w_o is {tuple(w_o.shape)}; expected [Hq*D={HQ * D}, hidden={ctx.hidden}]")
    S = x.shape[0]
    HL, KL = HQ // W, HKV // W
    n_all = W * S
    bm, bk, bn = (SIM_BLOCK_M, SIM_BLOCK_K, SIM_BLOCK_N) if ctx.sim else (GPU_BLOCK_M, GPU_BLOCK_K, GPU_BLOCK_N)
    nw = 1 if ctx.sim else 8
    mt = cdiv(S, bm)
    qreg, kreg = HL * n_all * D, KL * n_all * D
    ulysses_qkv_a2a_kernel[(mt, HQ + 2 * HKV)](x, w_qkv, ctx.recv, ctx.cnt, S, ctx.hidden, ncol, qreg, kreg, HQ, HKV,
                                               WORLD=W, HEAD_D=D, BLOCK_M=bm, BLOCK_K=bk,
                                               EVEN_K=ctx.hidden % bk == 0, num_warps=nw, num_stages=1 if ctx.sim else 3)
    ulysses_wait_kernel[(1,)](ctx.cnt, ctx.calls, W * mt * (HL + 2 * KL), num_warps=1)
    q = ctx.recv[:qreg].view(1, HL, n_all, D)
    k = ctx.recv[qreg:qreg + kreg].view(1, KL, n_all, D)
    v = ctx.recv[qreg + kreg:qreg + 2 * kreg].view(1, KL, n_all, D)
    o = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, config=attn_config)   # None: by length
    ulysses_a2a_back_kernel[(HL, W * mt)](o, ctx.abuf, ctx.cnt, S, HL, HQ, WORLD=W, HEAD_D=D, BLOCK_M=bm,
                                          num_warps=1 if ctx.sim else 4)
    out = torch.empty((S, ctx.hidden), dtype=x.dtype, device=x.device)
    ulysses_a2a_oproj_kernel[(mt, cdiv(ctx.hidden, bn))](ctx.abuf, w_o, out, ctx.cnt, ctx.calls, S, ctx.hidden,
                                                                HL * D, HL * mt, WORLD=W, BLOCK_M=bm, BLOCK_N=bn,
                                                                BLOCK_K=bk, EVEN_K=(HL * D) % bk == 0,
                                                                WAIT=not _plant_no_wait, num_warps=nw,
                                                                num_stages=1 if ctx.sim else 3)
    return out


__all__ = ["UlyssesContext", "create_ulysses_context", "ulysses_attention"]
