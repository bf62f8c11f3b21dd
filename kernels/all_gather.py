"""AllGather written in ditron.language: push and pull over the full mesh,
and a ring (for PCIe machines); ranks on other nodes are reached with
``shmem.putmem_signal_block``.  Method ``"ce"`` moves the data with the copy
engine only (:func:`_all_gather_ce`; one node).

    ctx = create_all_gather_context(max_numel_per_rank, torch.bfloat16)   # collective, once
    out = all_gather(x, ctx)                  # [world_size * x.shape[0], *x.shape[1:]]
    out = all_gather(x, ctx, out=buf, method="pull")

``out`` is the concatenation of every rank's ``x`` along dim 0 (rank ``r``'s
elements at ``out.view(-1)[r * n:(r + 1) * n]``; a 0-d ``x`` gives ``[world_size]``),
like ``torch.distributed.all_gather_into_tensor``.

Buffers and signals (allocated once by the context, symmetric):

* ``buf[2][world_size][slot]`` (``dtype``): on every rank, ``buf[p][s]`` is the
  slot of source rank ``s`` in parity ``p``.  *push* and *ring* write source
  ``s``'s elements into the receiver's ``buf[p][s]``; *pull* stages ``x`` into
  the owner's own slot ``buf[p][rank]`` and peers read it there.  Ranks on
  other nodes always receive by ``putmem_signal`` into ``buf[p][s]`` (staged
  in the sender's own slot first, because a remote put reads symmetric memory).
* ``sig[2][max_programs][world_size]`` (int64): word ``[p][g][s]`` says that
  program ``g``'s chunk from source ``s`` (push, pull: source ``s`` is ready;
  ring: chunk of origin ``s``) has arrived / is ready in call ``e`` when it
  equals ``e + 1``.

Reuse (kernels/_common.py): a call reads its epoch ``e`` on the device, uses
parity ``e % 2`` for buffers and signal words and the value ``e + 1``.  A rank
finishes call ``e`` only after every peer has started call ``e`` (it needs a
signal that each peer sends in that call), so a rank is at most one call
ahead: its writes of call ``e + 1`` go to the other parity, and it can write
parity ``e % 2`` again (call ``e + 2``) only when every peer has finished call
``e``.  No host sync, no host epoch: capturable in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem

from ._common import CollectiveContext, enter, epoch_begin, epoch_end, sm_count, take_flag, topology
from ._common import cdiv, next_pow2
from ._common import op_fields as _fields



METHODS = ("push", "pull", "ring", "ce")
_METHOD_ID = {"push": 0, "pull": 1, "ring": 2}     # the kernel's methods; "ce" launches no kernel
_SLOT_ALIGN = 128            # elements: every slot starts 256-byte aligned (vectorised accesses)


# ---------------------------------------------------------------------------
# device helpers
# ---------------------------------------------------------------------------

@triton.jit
def _chunk(n, BLOCK: tl.constexpr):
    """[lo, hi): this program's chunk of an n-element vector (whole tiles,
    the same split on every rank because n and the grid are the same)."""
    G = tl.num_programs(0)
    per = (n + G - 1) // G
    C = (per + BLOCK - 1) // BLOCK * BLOCK
    lo = tl.program_id(0) * C
    hi = tl.minimum(lo + C, n)
    return lo, hi


@triton.jit
def _copy_local(src, dst, lo, hi, BLOCK: tl.constexpr):
    for off in range(lo, hi, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < hi
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _copy_from_peer(src, dst, lo, hi, peer, BLOCK: tl.constexpr):
    """dst[lo:hi] = peer's copy of the symmetric src[lo:hi]."""
    for off in range(lo, hi, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < hi
        tl.store(dst + offs, tl.load(dl.symm_at(src + offs, peer), mask=mask), mask=mask)


@triton.jit
def _copy_to_peer(src, dst, lo, hi, peer, BLOCK: tl.constexpr):
    """peer's copy of the symmetric dst[lo:hi] = src[lo:hi]."""
    for off in range(lo, hi, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < hi
        tl.store(dl.symm_at(dst + offs, peer), tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _put_chunk(dst, src, lo, hi, sig_word, value, peer, ELEM_BYTES: tl.constexpr):
    """Ranks on other nodes: put the local, symmetric src[lo:hi] into the
    peer's dst[lo:hi], then set its signal word to ``value`` (blocking: src
    may be overwritten when it returns)."""
    dl.fence("release", "sys")      # the staging stores of every thread, before the put reads them
    dl.syncthreads()
    nbytes = tl.maximum(hi - lo, 0).to(tl.int64) * ELEM_BYTES
    shmem.putmem_signal_block(dst + lo, src + lo, nbytes, sig_word, value, shmem.NVSHMEM_SIGNAL_SET, peer)
    dl.syncthreads()


# ---------------------------------------------------------------------------
# the kernel
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["n", "slot_stride", "sig_stride"])   # 1 would become a constexpr
def all_gather_kernel(x_ptr, out_ptr, buf_ptr, sig_ptr, calls_ptr, n, slot_stride, sig_stride,
                      METHOD: tl.constexpr, MULTI_NODE: tl.constexpr, ELEM_BYTES: tl.constexpr,
                      BLOCK: tl.constexpr):
    """One call of all_gather.  ``n``: elements per rank; ``slot_stride``:
    elements between two slots of ``buf`` (parity stride = world * slot);
    ``sig_stride``: words between the two parities of ``sig``."""
    e = epoch_begin(calls_ptr)
    par = e % 2
    val = e + 1
    me, W, LW, node, NN, local = topology()
    n64 = n.to(tl.int64)
    ss = slot_stride.to(tl.int64)
    lo, hi = _chunk(n, BLOCK)
    bufp = buf_ptr + par * (W * ss)                       # this call's slots
    sigp = sig_ptr + par * sig_stride + tl.program_id(0) * W   # this program's word per source
    my_slot = bufp + me * ss
    my_out = out_ptr + me * n64

    if METHOD == 2:
        # ---------------- ring: chunk of origin c travels me -> me+1 -> ... ----------------
        nxt = (me + 1) % W
        nxt_local = (nxt // LW) == node
        for off in range(lo, hi, BLOCK):
            offs = off + tl.arange(0, BLOCK)
            mask = offs < hi
            v = tl.load(x_ptr + offs, mask=mask)
            tl.store(my_out + offs, v, mask=mask)
            if MULTI_NODE:
                tl.store(my_slot + offs, v, mask=mask)        # staged: forwarded from here
            else:
                if W > 1:
                    tl.store(dl.symm_at(my_slot + offs, nxt), v, mask=mask)
        if W > 1:
            if MULTI_NODE:
                if nxt_local:
                    _copy_to_peer(my_slot, my_slot, lo, hi, nxt, BLOCK)
                    dl.notify(sigp + me, nxt, signal=val, sig_op="set", comm_scope="intra_node")
                else:
                    _put_chunk(my_slot, my_slot, lo, hi, sigp + me, val, nxt, ELEM_BYTES)
            else:
                dl.notify(sigp + me, nxt, signal=val, sig_op="set", comm_scope="intra_node")
        for s in range(1, W):
            c = (me - s + W) % W
            slot = bufp + c * ss
            dst = out_ptr + c * n64
            tok = dl.wait(sigp + c, 1, "sys", "acquire", waitValue=val)
            slot = dl.consume_token(slot, tok)
            if s < W - 1:
                if MULTI_NODE:
                    _copy_local(slot, dst, lo, hi, BLOCK)
                    if nxt_local:
                        _copy_to_peer(slot, slot, lo, hi, nxt, BLOCK)
                        dl.notify(sigp + c, nxt, signal=val, sig_op="set", comm_scope="intra_node")
                    else:
                        _put_chunk(slot, slot, lo, hi, sigp + c, val, nxt, ELEM_BYTES)
                else:
                    for off in range(lo, hi, BLOCK):
                        offs = off + tl.arange(0, BLOCK)
                        mask = offs < hi
                        v = tl.load(slot + offs, mask=mask)
                        tl.store(dst + offs, v, mask=mask)
                        tl.store(dl.symm_at(slot + offs, nxt), v, mask=mask)
                    dl.notify(sigp + c, nxt, signal=val, sig_op="set", comm_scope="intra_node")
            else:
                _copy_local(slot, dst, lo, hi, BLOCK)
    else:
        # ---------------- full mesh: push (0) or pull (1) inside the node ----------------
        node0 = node * LW
        for off in range(lo, hi, BLOCK):
            offs = off + tl.arange(0, BLOCK)
            mask = offs < hi
            v = tl.load(x_ptr + offs, mask=mask)
            tl.store(my_out + offs, v, mask=mask)
            if METHOD == 1 or MULTI_NODE:
                tl.store(my_slot + offs, v, mask=mask)        # pull: peers read it; remote puts read it
            if METHOD == 0:
                for k in range(1, LW):
                    peer = node0 + (local + k) % LW
                    tl.store(dl.symm_at(my_slot + offs, peer), v, mask=mask)
        if MULTI_NODE:
            for k in range(1, NN):
                for l in range(0, LW):
                    peer = ((node + k) % NN) * LW + (local + l) % LW
                    _put_chunk(my_slot, my_slot, lo, hi, sigp + me, val, peer, ELEM_BYTES)
        # pushed (push) / ready to be read (pull): one signal per peer of the node
        for k in range(1, LW):
            peer = node0 + (local + k) % LW
            dl.notify(sigp + me, peer, signal=val, sig_op="set", comm_scope="intra_node")
        for k in range(1, LW):
            src = node0 + (local + k) % LW
            tok = dl.wait(sigp + src, 1, "sys", "acquire", waitValue=val)
            slot = dl.consume_token(bufp + src * ss, tok)
            if METHOD == 0:
                _copy_local(slot, out_ptr + src * n64, lo, hi, BLOCK)
            else:
                _copy_from_peer(slot, out_ptr + src * n64, lo, hi, src, BLOCK)
        if MULTI_NODE:
            for k in range(1, NN):
                for l in range(0, LW):
                    src = ((node + NN - k) % NN) * LW + (local + l) % LW
                    tok = dl.wait(sigp + src, 1, "sys", "acquire", waitValue=val)
                    slot = dl.consume_token(bufp + src * ss, tok)
                    _copy_local(slot, out_ptr + src * n64, lo, hi, BLOCK)
    epoch_end(calls_ptr)


# ---------------------------------------------------------------------------
# host API
# ---------------------------------------------------------------------------

def _round_up(x, m):
    return (x + m - 1) // m * m


def launch_config(world, numel, elem_bytes, max_programs):
    """(BLOCK, programs, num_warps) for a per-program split of ``numel``
    elements.  GPUs: tiles of up to 32 KiB (16 warps), at least 2 KiB, as many
    programs as ``max_programs`` allows; the simulator: tiles of 128 elements,
    at most 2 programs (each tile operation costs interpreter time)."""
    if world.backend == "sim":
        block = 128 if numel > 64 else 32
        return block, max(1, min(max_programs, 2, cdiv(max(numel, 1), block))), 1
    lo_block = max(128, 2048 // elem_bytes)
    hi_block = 32768 // elem_bytes
    block = min(hi_block, max(lo_block, next_pow2(cdiv(max(numel, 1), max_programs))))
    programs = max(1, min(max_programs, cdiv(max(numel, 1), block)))
    warps = 4 if block * elem_bytes <= 4096 else (8 if block * elem_bytes <= 16384 else 16)
    return block, programs, warps


def detect_fabric(world) -> str:
    """"nvlink" (full-mesh peer access at high bandwidth) or "pcie": the
    ``DITRON_FABRIC`` environment variable, else NVML's NVLink state of this
    GPU (any active link: nvlink), else nvlink.  The simulator is "nvlink"."""
    import os
    env = os.environ.get("DITRON_FABRIC", "").strip().lower()
    if env in ("nvlink", "pcie"):
        return env
    if world.backend == "sim":
        return "nvlink"
    try:
        import pynvml
        pynvml.nvmlInit()
        idx = torch.device(world.device).index or 0
        h = pynvml.nvmlDeviceGetHandleByIndex(idx)
        for link in range(18):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(h, link):
                    return "nvlink"
            except pynvml.NVMLError:
                break
        return "pcie"
    except Exception:  # noqa: BLE001 -- no NVML: assume the common NVLink machine
        return "nvlink"


class AllGatherContext(CollectiveContext):
    """Symmetric buffers and signals of all_gather (see the module docstring)."""

    op = "all_gather"
    creator = "create_all_gather_context"

    def __init__(self, max_numel_per_rank, dtype, world=None, max_programs=None):
        super().__init__(max_numel_per_rank, dtype, world)
        W = self.world_size
        self.multi_node = self.world.nnodes > 1
        self.slot_stride = _round_up(max(self.max_numel, 1), _SLOT_ALIGN)
        if self.world.backend == "sim":
            self.max_programs = int(max_programs or 2)
        else:
            self.max_programs = int(max_programs or min(64, sm_count(self.device)))
        self.buf = self.symm((2, W, self.slot_stride), dtype, "buf")
        self.sig = self.symm((2, self.max_programs, W), torch.int64, "sig")
        self.fabric = detect_fabric(self.world)
        # method "ce": a staging slot of its own and reset flags (see _all_gather_ce)
        self.ce_stage = self.symm((self.slot_stride,), dtype, "ce_stage")
        self.ce_ready = self.symm((W,), torch.int64, "ce_ready")
        self.ce_free = self.symm((W,), torch.int64, "ce_free")
        self.ce_free.fill_(1)
        self._ce_streams = None
        self._ce_views = None
        ditron.barrier_all()          # every rank's zeroed signals exist before any peer writes them

    def choose(self, numel):
        """The method ``auto`` picks: ring on PCIe machines, push for up to
        256 KiB per rank (one-way latency), pull above; the copy engine
        (``ce``) from ``CE_MIN_BYTES`` when that is set (one node, GPUs)."""
        if self.fabric == "pcie" and not self.multi_node:
            return "ring"
        nbytes = numel * self.buf.element_size()
        if nbytes <= (256 << 10):
            return "push"
        if CE_MIN_BYTES is not None and nbytes >= CE_MIN_BYTES and not self.multi_node \
                and self.world.backend != "sim":
            return "ce"
        return "pull"


#: ``auto`` uses the copy engine from this size per rank (one node, GPUs); None: never.  On 4 x H200
#: ``ce`` took 1.5x to 1.8x the time of ``pull`` from 16 MiB to 256 MiB (bench/results/h200x4.md), although
#: the copy engine alone moves three 64 MiB pulls at 352 GB/s: the flag handshakes serialise more than
#: they should (not understood yet), so ``auto`` does not pick it.
CE_MIN_BYTES = None


def create_all_gather_context(max_numel_per_rank, dtype, world=None, max_programs=None):
    """Allocate all_gather's symmetric buffers (``2 * world_size *
    max_numel_per_rank`` elements) and signals.  Collective: every rank calls
    it with the same arguments."""
    return AllGatherContext(max_numel_per_rank, dtype, world, max_programs)


def all_gather(x, ctx, out=None, method="auto"):
    """Gather every rank's ``x`` (same shape on every rank) into ``out``
    (``[world_size * x.shape[0], *x.shape[1:]]``; given or allocated).
    ``method``: ``"auto"``, ``"push"``, ``"pull"``, ``"ring"``; every rank must
    use the same one.  ``x`` may be any contiguous tensor (symmetric or not):
    the kernel stages it where peers need it."""
    enter(ctx, AllGatherContext, "all_gather", lambda: _fields(x, method), x=x, out=out)
    ctx.check_tensor(x, "x")
    W = ctx.world_size
    n = x.numel()
    shape = (W,) if x.dim() == 0 else (W * x.shape[0], *x.shape[1:])
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    else:
        check_out(ctx, out, W * n)
    if method == "auto":
        method = ctx.choose(n)
    if method not in METHODS:
        raise ditron.DitronError(f"all_gather: unknown method {method!r}; use 'auto' or one of {', '.join(METHODS)}")
    if method == "ce":
        return _all_gather_ce(ctx, x, out, n)
    block, programs, warps = launch_config(ctx.world, n, x.element_size(), ctx.max_programs)
    ctx.launch((n, method, x.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0), all_gather_kernel, (programs,),
               (x, out, ctx.buf, ctx.sig, ctx.calls, n, ctx.slot_stride, ctx.max_programs * W),
               dict(METHOD=_METHOD_ID[method], MULTI_NODE=ctx.multi_node, ELEM_BYTES=x.element_size(), BLOCK=block,
                    num_warps=warps))
    return out


def _all_gather_ce(ctx, x, out, n):
    """Method ``"ce"``: copy engine only, no kernel and no SM.

    Every rank stages ``x`` in its ``ce_stage`` slot and raises ``ce_ready[rank]``
    on every peer; every rank pulls each peer's slot into ``out`` with
    ``ditron.rank_copy`` (one stream per peer, so the copies run in parallel),
    after ``ditron.stream_wait_value(ce_ready[s] == 1)``, resets the flag and
    sets ``ce_free[rank]`` on the peer when its copy is done.  A rank restages
    only when every peer's ``ce_free`` flag for it is 1 again.  A flag is set
    again only after its reader reset it, and a slot is rewritten only after
    every reader has finished: no race across calls, and every value is a
    constant, so the calls can be captured in a CUDA graph.  One node only."""
    if ctx.multi_node:
        raise ditron.DitronError("all_gather: method='ce' (copy engine) reaches this node's ranks only; use 'pull' "
                                 "or 'push' across nodes")
    W, me = ctx.world_size, ctx.rank
    transport = ctx.world.transport
    flat = out.view(-1)
    gpu = torch.device(ctx.device).type == "cuda" and ctx.world.backend != "sim"
    if ctx._ce_views is None:
        peers = [(me + k) % W for k in range(1, W)]          # pulled in this order: rank+1 first
        ctx._ce_views = [(s, ditron.peer_tensor(ctx.ce_stage, s), ditron.peer_tensor(ctx.ce_ready[me:me + 1], s),
                          ditron.peer_tensor(ctx.ce_free[me:me + 1], s)) for s in peers]
        if gpu:
            ctx._ce_streams = [torch.cuda.Stream(device=ctx.device) for _ in range(W - 1)]
    cur = torch.cuda.current_stream(x.device) if gpu else None
    streams = ctx._ce_streams if gpu else [None] * (W - 1)
    for st in streams:
        if st is not None:
            st.wait_stream(cur)            # out is allocated and free to write
    # stage x once every peer has read the previous call's slot, then tell the peers
    for s, _, _, _ in ctx._ce_views:
        take_flag(transport, ctx.ce_free[s:s + 1], cur)
    src = x.reshape(-1)
    transport.rank_copy(ctx.ce_stage[:n], src, cur)
    own = flat[me * n:(me + 1) * n]
    if own.data_ptr() != src.data_ptr():         # x may already be out's own part (gemm_ar's rs_ag)
        transport.rank_copy(own, src, cur)
    for _, _, ready, _ in ctx._ce_views:
        transport.write_value(ready, 1, cur)
    # pull every peer's slot
    for st, (s, stage, _, free) in zip(streams, ctx._ce_views):
        take_flag(transport, ctx.ce_ready[s:s + 1], st)
        transport.rank_copy(flat[s * n:(s + 1) * n], stage[:n], st)
        transport.write_value(free, 1, st)
    for st in streams:
        if st is not None:
            cur.wait_stream(st)
            out.record_stream(st)
    ctx.calls[0] += 1         # stream-ordered, like the kernels' count: the methods can be mixed on one context
    return out


def check_out(ctx, out, numel, dtype=None):
    """A clear error before launch for a wrong output tensor."""
    dtype = dtype or ctx.dtype
    if not isinstance(out, torch.Tensor):
        raise ditron.DitronError(f"{ctx.op}: argument 'out' must be a torch.Tensor")
    if out.dtype != dtype:
        raise ditron.DitronError(f"{ctx.op}: argument 'out' is {out.dtype}, expected {dtype}")
    if out.device.type != torch.device(ctx.device).type:
        raise ditron.DitronError(f"{ctx.op}: argument 'out' is on {out.device}, this rank works on {ctx.device}")
    if not out.is_contiguous():
        raise ditron.DitronError(f"{ctx.op}: argument 'out' must be contiguous")
    if out.numel() != numel:
        raise ditron.DitronError(f"{ctx.op}: argument 'out' has {out.numel()} elements, expected {numel}")
