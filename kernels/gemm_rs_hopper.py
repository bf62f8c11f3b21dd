"""GEMM-RS on the Gluon Hopper core (issue 52 item 2): the GEMM of :mod:`ditron.kernels.gemm_rs`'s copy-engine
method on the warp-specialised core of :mod:`ditron.kernels.gemm_hopper`.

    ctx = create_gemm_rs_context(max_m, n, torch.bfloat16, core="gluon")   # sm_90 GPUs; the simulator: the tl twin
    out = gemm_rs(a, b, ctx)

The protocol is the ``tl`` kernel's ``"ce"`` one (kernels/gemm_rs.py, :func:`gemm_rs_gemm_kernel` with ``CE``),
unchanged in meaning; only the GEMM kernel is another:

* the same tiles in the same order: ``dl.swizzle_scatter`` for this rank (the ``tl`` kernel's own function, called
  from the Gluon producer and consumers): the peers' segments ``rank+1, rank+2, ...`` first, the own segment last;
  program ``p`` takes tiles ``p, p + P, ...``;
* where partial tiles go: the whole partial product into this rank's own ``cbuf[0]`` (``[M, N]`` row-major),
  through a TMA descriptor of it (rows past ``M`` and columns past ``N`` clipped by the TMA unit);
* the signal: per stored block, for every peer segment ``s`` its rows touch, ``seg_count[s]`` counts it
  (``atom.add.acq_rel.sys``); the block that completes segment ``s`` resets the count and sets the local
  ``done[s] = 1`` (``atom.exch.release.sys``), on which this rank's copy engine waits
  (``cuStreamWaitValue64``) before it copies the segment's rows to their owner;
* who reduces: unchanged -- the owner's reduction kernel (:func:`gemm_rs_reduce_kernel`) after the peers' copies
  (``ready`` flags), then ``ce_release``; the host sequence (side stream, copies, reduction) is the same code.

The one difference in the count's unit: a *block* is one consumer warpgroup's part of a tile, ``SUB_M`` rows
(``config.consumer_rows``: 64 for ``"coop"``, whose two consumers each store half of a 128-row tile; 128 for
``"pingpong"``), so segment ``s`` is complete after ``(SUB_M-row blocks touching s) * cdiv(N, BN)`` counts
instead of ``(BLOCK_M-row tiles touching s) * cdiv(N, BN)``.  Every such block is stored by exactly one consumer of
one program (its tile exists: its first row is below ``M``), so the count reaches the threshold exactly once, after
the last of them.  ``m`` need not be a multiple of the tile (a block may straddle segments and counts in each).

Signals after TMA stores (the PTX memory model)
-----------------------------------------------
A consumer's epilogue writes the block to shared memory and the TMA unit stores it to ``cbuf``: the store is
issued by one elected thread *per warp* of the warpgroup (Triton splits a 128-byte-swizzled box into 64-column
boxes, one per warp), as a bulk async-group of that thread, and its global writes are made by the **async
proxy**.  The signal is a generic-proxy atomic of one thread.  So, for block ``i`` (at the next block's
epilogue, or after the loop for the last one -- the staging buffer is waited for there anyway, so the store
keeps draining under the next mainloop):

1. every thread of the warpgroup runs ``cp.async.bulk.wait_group 0`` -- **not** ``.read``, which
   ``tma.store_wait`` emits and which only waits until the shared-memory source has been read: without
   ``.read`` the issuing thread waits until its bulk stores have *completed* and their writes are visible to it
   (threads that issued nothing pass at once);
2. every thread runs ``fence.proxy.async.global``: the issuing thread's completed async-proxy writes to global
   memory are ordered before its later generic-proxy operations;
3. the partition's barrier (``bar.sync`` of the warpgroup's named barrier: a warp-specialised partition has no
   program-wide barrier, and ``dl.syncthreads`` -- ``bar.sync 0`` of every thread -- would hang): the four
   issuers' steps 1-2 happen before everything any thread of the warpgroup does after it (CTA-scope
   synchronisation);
4. one thread (element 0 of a 128-element tensor over the warpgroup, masked) does the count
   ``atom.add.acq_rel.sys`` and, if it completes the segment, the store of 0 and ``atom.exch.release.sys`` of
   ``done[s]``.  Release is cumulative: it orders every write that happens before it -- the block's TMA writes
   by steps 1-3, and (acquire half of the count) every other block of the segment, whose counts were released
   the same way by other threads or programs -- before the flag.  The copy engine reads the segment after its
   stream wait observes ``done[s] == 1`` (as with the ``tl`` kernel, whose stores are generic-proxy
   ``st.global`` followed by ``bar.sync 0`` and the same atomics).

Deadlock freedom is the ``tl`` kernel's: the GEMM never waits for anything outside itself.

Where it applies: one node (``method="ce"``, the default there), float16 / bfloat16 operands (fp8 operands are
the ``tl`` core's), row-major ``a`` and ``b`` with 16-byte aligned bases and rows, ``N`` a multiple of 8 (TMA
stores rows of ``cbuf``), a Hopper (sm_90) GPU.  ``core="gluon"`` where one of these does not hold is an error
before launch that says which (the method, the dtype and the GPU -- e.g. an AMD one -- when the context is
created; fp8 operands and the operands' layout per call: :func:`check_applies`).  On the simulator the context runs the ``tl`` kernel (the twin: the same
protocol, tile order and reduction; tests/test_gemm_rs.py).
"""
from __future__ import annotations

import torch

import ditron
import ditron.language as dl
from triton.experimental.gluon import language as gl

from . import gemm_hopper as H
from ._common import sm_count
from .gemm import tma_ok


@ditron.gluon.jit(do_not_specialize=["M"])
def gemm_rs_ws_kernel(a_desc, b_desc, c_desc, seg_count_ptr, done_ptr, calls_ptr, M,
                      GROUP_M: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """This rank's partial ``a @ b`` (``[M, N]``) into ``cbuf[0]`` (``c_desc``), tiles in ``dl.swizzle_scatter``
    order, each stored block signalled by the copy-engine protocol's segment counts (see the module docstring);
    ``calls_ptr``: the GEMM's call counter (``ctx.gcalls``, as the ``tl`` kernel's ``epoch_end``)."""
    me = dl.rank()
    W = dl.num_ranks()
    H.ws_gemm_body(a_desc, a_desc, b_desc, c_desc, M, 0, 0, 0, 0, me, GROUP_M, STAGES, PINGPONG, False,
                   CONSUMER_REGS, PRODUCER_REGS, W, seg_count_ptr, done_ptr, True, True)
    # every partition has joined: the last program to get here counts the call (kernels/_common.py epoch_end)
    done = gl.atomic_add(calls_ptr + 1, 1)
    if done == gl.num_programs(0) - 1:
        gl.store(calls_ptr + 1, 0)
        gl.atomic_add(calls_ptr, 1)


def check_applies(ctx, a, b, N):
    """Raise when the Gluon GEMM cannot take this call (the reason named; fp8 operands are refused by the
    caller on every backend)."""
    why = None
    if a.stride(1) != 1 or b.stride(1) != 1:
        why = f"a and b must be row-major (a strides {a.stride()}, b strides {b.stride()})"
    elif (N * a.element_size()) % 16:
        why = f"N={N}: the partial product's rows must be 16-byte aligned for its TMA stores (N a multiple of 8)"
    elif not tma_ok(a, b):
        why = "TMA needs 16-byte aligned bases and rows of a and b"
    elif a.device.type != "cuda" or not H.supported(a.device):
        why = "it runs on Hopper (sm_90) GPUs only"
    if why:
        raise ditron.DitronError(f"gemm_rs: core='gluon' cannot take this call: {why}; create the context with "
                                 "core='tl'")


def _c_descriptor(ctx, M, N):
    """``cbuf[0]`` as an ``[M, N]`` row-major matrix, a TMA descriptor of the consumers' store blocks (one per
    ``(M, N)``)."""
    key = (M, N)
    desc = ctx._gluon_descs.get(key)
    if desc is None:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        cfg = ctx.gluon_config
        c = ctx.cbuf[0, :M * N].view(M, N)
        desc = ctx._gluon_descs[key] = TensorDescriptor.from_tensor(
            c, [cfg.consumer_rows, cfg.block_n // cfg.epilogue_split], H.layouts(cfg, c.dtype)[2])
    return desc


def launch(ctx, a, b, M, K, N):
    """Launch the Gluon GEMM of a ``"ce"`` call (a's and b's descriptors made per call, cbuf's once per shape)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    cfg = ctx.gluon_config
    la, lb, _ = H.layouts(cfg, a.dtype)
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k], la)
    b_desc = TensorDescriptor.from_tensor(b, [cfg.block_k, cfg.block_n], lb)
    P = min(int(ctx.num_programs), H.num_programs(M, N, cfg, sm_count(a.device)))
    gemm_rs_ws_kernel[(P,)](a_desc, b_desc, _c_descriptor(ctx, M, N), ctx.seg_count, ctx.done, ctx.gcalls, M,
                            num_warps=4, **H.kernel_constexprs(cfg))


def compile_sm90(cfg: H.HopperGemmConfig | None = None, dtype=torch.bfloat16, M=1024, N=1024, K=1024):
    """Compile :func:`gemm_rs_ws_kernel` for sm_90a without a GPU (``ditron.compile``; descriptor types from
    descriptors on CPU tensors of these shapes)."""
    from ditron import _compat
    cfg = (cfg or H.DEFAULT_CONFIG).validate("gemm_rs")
    a, b, c = (torch.empty(shape, dtype=dtype) for shape in ((M, K), (K, N), (M, N)))
    descs = H.descriptors(a, b, c, cfg)
    sig = {n: _compat.mangle_arg(d) for n, d in zip(("a_desc", "b_desc", "c_desc"), descs)}
    sig.update(seg_count_ptr="*i32", done_ptr="*i64", calls_ptr="*i64", M="i32")
    return ditron.compile(gemm_rs_ws_kernel, target="sm_90a", signature=sig, constexprs=H.kernel_constexprs(cfg),
                          num_warps=4)


__all__ = ["gemm_rs_ws_kernel", "check_applies", "launch", "compile_sm90"]
