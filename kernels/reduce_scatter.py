"""ReduceScatter written in ditron.language: full mesh (push, then a local
fp32 reduction) and ring (fp32 partial sums travel around the ring); ranks on
other nodes are reached with ``shmem.putmem_signal_block``.

    ctx = create_reduce_scatter_context(max_numel, torch.bfloat16)   # collective, once
    out = reduce_scatter(x, ctx)             # x: world_size * m elements -> m elements
    out = reduce_scatter(x, ctx, out=buf, method="ring")

Rank ``r`` gets ``sum over ranks of x.view(-1)[r * m:(r + 1) * m]``, accumulated in
fp32 and rounded once to ``x``'s dtype.  ``out`` has shape
``[x.shape[0] // world_size, *x.shape[1:]]`` when ``x.shape[0]`` is a multiple of
the world size, else ``[m]``.

Buffers and signals (allocated once by the context, symmetric):

* mesh: ``buf[2][world_size][slot]`` (``dtype``): rank ``s`` writes its shard
  ``r`` into rank ``r``'s ``buf[p][s]``; the receiver adds the ``world_size - 1``
  slots to its own shard in fp32.  Nothing is staged: ``x`` is read in place.
* ring: ``rbuf[2][world_size][slot]`` (fp32): step ``s``'s partial sum lands in
  the next rank's ``rbuf[p][s]``; partial sums travel in fp32 (twice the bytes
  of a 16-bit ``x``: the price of one rounding only).  ``rbuf[p][world_size - 1]``
  stages a partial sum that crosses nodes.
* ``sig[2][max_programs][world_size]`` (int64): word ``[p][g][k]`` holds ``e + 1``
  when program ``g``'s chunk from source ``k`` (mesh) / of step ``k`` (ring)
  has arrived in call ``e``.

Reuse follows kernels/_common.py (see kernels/all_gather.py for the argument):
parity ``e % 2``, signal value ``e + 1``, no host epoch, no host sync.
"""
from __future__ import annotations

import torch
import triton.language as tl

import ditron
import ditron.language as dl

from ._common import CollectiveContext, enter, epoch_begin, epoch_end, sm_count, topology
from ._common import op_fields as _fields
from .all_gather import (_SLOT_ALIGN, _chunk, _copy_local, _copy_to_peer, _put_chunk, _round_up,
                         check_out, detect_fabric, launch_config)

METHODS = ("mesh", "ring")
_METHOD_ID = {"mesh": 0, "ring": 1}


@ditron.jit(do_not_specialize=["m", "slot_stride", "sig_stride"])   # 1 would become a constexpr
def reduce_scatter_kernel(x_ptr, out_ptr, buf_ptr, rbuf_ptr, sig_ptr, calls_ptr, m, slot_stride, sig_stride,
                          METHOD: tl.constexpr, MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr,
                          WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """One call of reduce_scatter; ``m``: elements of the shard each rank gets."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    me, W, LW, node, NN, local = topology()
    m64 = m.to(tl.int64)
    ss = slot_stride.to(tl.int64)
    lo, hi = _chunk(m, BLOCK)
    sigp = sig_ptr + par * sig_stride + tl.program_id(0) * W
    out_ty = out_ptr.dtype.element_ty

    if METHOD == 0:
        # ---------------- mesh: push shard `peer` into peer's slot `me`, reduce locally ----------------
        bufp = buf_ptr + par * (W * ss)
        my_slot = bufp + me * ss
        node0 = node * LW
        for k in range(1, LW):
            peer = node0 + (local + k) % LW
            _copy_to_peer(x_ptr + peer * m64, my_slot, lo, hi, peer, BLOCK)
            dl.notify(sigp + me, peer, signal=val, sig_op="set", comm_scope="intra_node")
        if MULTI_NODE:
            for k in range(1, NN):
                for l in range(0, LW):
                    peer = ((node + k) % NN) * LW + (local + l) % LW
                    _copy_local(x_ptr + peer * m64, my_slot, lo, hi, BLOCK)     # stage (own slot is free)
                    _put_chunk(my_slot, my_slot, lo, hi, sigp + me, val, peer, ELEM_BYTES)
        dl.notify(sigp + me, me, signal=val, sig_op="set", comm_scope="gpu")
        tok = dl.wait(sigp, W, "sys", "acquire", waitValue=val)           # every source's chunk is here
        bufp = dl.consume_token(bufp, tok)
        mine = x_ptr + me * m64
        for off in range(lo, hi, BLOCK):
            offs = off + tl.arange(0, BLOCK)
            mask = offs < hi
            acc = tl.load(mine + offs, mask=mask).to(tl.float32)
            for q in tl.static_range(1, WORLD):         # unrolled: the slot loads overlap
                src = (me + q) % WORLD
                acc += tl.load(bufp + src * ss + offs, mask=mask).to(tl.float32)
            tl.store(out_ptr + offs, acc.to(out_ty), mask=mask)
    else:
        # ---------------- ring: step s adds shard (me - s - 1) and passes it on ----------------
        rb = rbuf_ptr + par * (W * ss)
        stage = rb + (W - 1) * ss
        nxt = (me + 1) % W
        nxt_local = (nxt // LW) == node
        for s in range(0, W):
            c = (me + 2 * W - s - 1) % W
            xs = x_ptr + c * m64
            prev = rb + (s - 1) * ss
            if s > 0:
                tok = dl.wait(sigp + (s - 1), 1, "sys", "acquire", waitValue=val)
                prev = dl.consume_token(prev, tok)
            last = s == W - 1
            for off in range(lo, hi, BLOCK):
                offs = off + tl.arange(0, BLOCK)
                mask = offs < hi
                acc = tl.load(xs + offs, mask=mask).to(tl.float32)
                if s > 0:
                    acc += tl.load(prev + offs, mask=mask)
                if last:
                    tl.store(out_ptr + offs, acc.to(out_ty), mask=mask)
                else:
                    if MULTI_NODE:
                        if nxt_local:
                            tl.store(dl.symm_at(rb + s * ss + offs, nxt), acc, mask=mask)
                        else:
                            tl.store(stage + offs, acc, mask=mask)
                    else:
                        tl.store(dl.symm_at(rb + s * ss + offs, nxt), acc, mask=mask)
            if not last:
                if MULTI_NODE:
                    if nxt_local:
                        dl.notify(sigp + s, nxt, signal=val, sig_op="set", comm_scope="intra_node")
                    else:
                        _put_chunk(rb + s * ss, stage, lo, hi, sigp + s, val, nxt, 4)
                else:
                    dl.notify(sigp + s, nxt, signal=val, sig_op="set", comm_scope="intra_node")
    epoch_end(calls_ptr)


class ReduceScatterContext(CollectiveContext):
    """Symmetric buffers and signals of reduce_scatter (see the module docstring)."""

    op = "reduce_scatter"
    creator = "create_reduce_scatter_context"

    def __init__(self, max_numel, dtype, world=None, max_programs=None, methods=METHODS):
        super().__init__(max_numel, dtype, world)
        W = self.world_size
        bad = [mth for mth in methods if mth not in METHODS]
        if bad or not methods:
            raise ditron.DitronError(f"reduce_scatter: unknown method(s) {bad}; use some of {', '.join(METHODS)}")
        self.methods = tuple(methods)
        self.multi_node = self.world.nnodes > 1
        self.max_shard = (self.max_numel + W - 1) // W
        self.slot_stride = _round_up(max(self.max_shard, 1), _SLOT_ALIGN)
        if self.world.backend == "sim":
            self.max_programs = int(max_programs or 2)
        else:
            self.max_programs = int(max_programs or min(64, sm_count(self.device)))
        dummy = (2, 1, _SLOT_ALIGN)
        self.buf = self.symm((2, W, self.slot_stride) if "mesh" in methods else dummy, dtype, "buf")
        self.rbuf = self.symm((2, W, self.slot_stride) if "ring" in methods else dummy, torch.float32, "rbuf")
        self.sig = self.symm((2, self.max_programs, W), torch.int64, "sig")
        self.fabric = detect_fabric(self.world)
        ditron.barrier_all()

    def choose(self, numel):
        """``auto``: ring on PCIe machines (one node), else mesh."""
        if "ring" in self.methods and (self.fabric == "pcie" and not self.multi_node or "mesh" not in self.methods):
            return "ring"
        return "mesh"


def create_reduce_scatter_context(max_numel, dtype, world=None, max_programs=None, methods=METHODS):
    """Allocate reduce_scatter's symmetric buffers for inputs of up to
    ``max_numel`` elements (mesh: ``2 * max_numel`` elements of ``dtype``; ring:
    ``2 * max_numel`` fp32; ``methods`` limits what is allocated) and signals.
    Collective: every rank calls it with the same arguments."""
    return ReduceScatterContext(max_numel, dtype, world, max_programs, methods)


def reduce_scatter(x, ctx, out=None, method="auto"):
    """Sum ``x`` (``world_size * m`` elements, the same shape on every rank)
    over ranks and keep shard ``rank`` (``m`` elements) in ``out``.  ``method``:
    ``"auto"``, ``"mesh"``, ``"ring"`` (the same on every rank).  ``x`` is
    read in place (symmetric or not)."""
    enter(ctx, ReduceScatterContext, "reduce_scatter", lambda: _fields(x, method), x=x, out=out)
    ctx.check_tensor(x, "x")
    W = ctx.world_size
    if x.numel() % W:
        raise ditron.DitronError(f"reduce_scatter: x has {x.numel()} elements, not a multiple of the world size {W}")
    m = x.numel() // W
    if out is None:
        shape = (x.shape[0] // W, *x.shape[1:]) if x.dim() >= 1 and x.shape[0] % W == 0 else (m,)
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    else:
        check_out(ctx, out, m)
    if method == "auto":
        method = ctx.choose(x.numel())
    if method not in _METHOD_ID:
        raise ditron.DitronError(f"reduce_scatter: unknown method {method!r}; use 'auto' or one of "
                                 f"{', '.join(METHODS)}")
    if method not in ctx.methods:
        raise ditron.DitronError(f"reduce_scatter: the context was created with methods={ctx.methods}; "
                                 f"'{method}' has no buffers")
    block, programs, warps = launch_config(ctx.world, m, 4, ctx.max_programs)
    ctx.launch((m, method, x.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0), reduce_scatter_kernel, (programs,),
               (x, out, ctx.buf, ctx.rbuf, ctx.sig, ctx.calls, m, ctx.slot_stride, ctx.max_programs * W),
               dict(METHOD=_METHOD_ID[method], MULTI_NODE=ctx.multi_node, ELEM_BYTES=x.element_size(), WORLD=W,
                    BLOCK=block, num_warps=warps))
    return out
