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

Where it applies: one node (``method="ce"``, the default there), float16 / bfloat16 operands, row-major ``a`` and
``b`` with 16-byte aligned bases and rows, ``N`` a multiple of 8 (TMA stores rows of ``cbuf``), a Hopper (sm_90)
GPU.  ``core="gluon"`` where one of these does not hold is an error before launch that says which (the method,
the dtype and the GPU -- e.g. an AMD one -- when the context is created; the operands' layout per call:
:func:`check_applies`).

fp8 operands (:func:`gemm_rs_ws_scaled_kernel`): the Gluon core's fp8 path (``ws_scaled_gemm_body``: per-tensor,
per-row / per-column scales in the epilogue or blockwise ones per K step, the fp32 promotion every ``block_k``
products), the same tiles, order, signals, copies and reduction; the partials are the context's dtype
(bfloat16, float16, or float32: a float32 ``core="gluon"`` context takes fp8 operands only).  ``a`` row-major,
``b = w.t()`` column-major, ``K`` a multiple of 16, the partial's rows 16-byte aligned, blockwise groups of at
least 32 along K: :func:`plan_fp8` checks them once per call shape, on every device (the simulator, which runs
the ``tl`` twin, refuses what the GPU would), each refusal naming a ``core="tl"`` context; the config is the
context's ``gluon_config`` or ``gemm_hopper.fp8_default_config``.  On the simulator the context runs the ``tl`` kernel (the twin: the same
protocol, tile order and reduction; tests/test_gemm_rs.py).
"""
from __future__ import annotations

import torch

import ditron
import ditron.language as dl
from triton.experimental.gluon import language as gl

from . import gemm_hopper as H, scaling
from ._common import sm_count
from .gemm import tma_ok

gluon = H.gluon


@gluon.jit
def _count_call(calls_ptr):
    """Every partition has joined: the last program to get here counts the call (kernels/_common.py
    ``epoch_end``)."""
    done = gl.atomic_add(calls_ptr + 1, 1)
    if done == gl.num_programs(0) - 1:
        gl.store(calls_ptr + 1, 0)
        gl.atomic_add(calls_ptr, 1)


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
    _count_call(calls_ptr)


@ditron.gluon.jit(do_not_specialize=["M"])
def gemm_rs_ws_scaled_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, seg_count_ptr, done_ptr, calls_ptr, M,
                             stride_sam, stride_sak, stride_sbk, stride_sbn,
                             GROUP_M: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                             CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, SA_ROW: gl.constexpr,
                             SB_COL: gl.constexpr, PROMOTE: gl.constexpr, BLOCKWISE: gl.constexpr,
                             GK: gl.constexpr, GN: gl.constexpr, PROMOTE_OVERLAP: gl.constexpr = False):
    """fp8 :func:`gemm_rs_ws_kernel`: this rank's partial ``(a * scale_a) @ (b * scale_b)`` on the fp8 core
    (``gemm_hopper.ws_scaled_gemm_body``: ``b_desc`` of ``b^T``, the fp32 promotion every ``PROMOTE``
    products, epilogue or -- ``BLOCKWISE`` -- per-K-step scales; the scale arguments are
    :meth:`kernels.scaling.Recipe.kernel_args`'), rounded once to ``cbuf``'s dtype; the same tiles, order and
    signals."""
    me = dl.rank()
    W = dl.num_ranks()
    H.ws_scaled_gemm_body(a_desc, a_desc, b_desc, c_desc, M, 0, 0, 0, 0, me, sa_ptr, sb_ptr, stride_sam, stride_sbn,
                          GROUP_M, STAGES, PINGPONG, False, CONSUMER_REGS, PRODUCER_REGS, True, True, SA_ROW, SB_COL,
                          PROMOTE, W, seg_count_ptr, done_ptr, True, True, stride_sak, stride_sbk, BLOCKWISE, GK, GN,
                          PROMOTE_OVERLAP)
    _count_call(calls_ptr)


def check_applies(ctx, a, b, N):
    """Raise when the Gluon GEMM cannot take this fp16 / bf16 call (the reason named; fp8 calls:
    :func:`plan_fp8`)."""
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


def _c_descriptor(ctx, M, N, cfg=None):
    """``cbuf[0]`` as an ``[M, N]`` row-major matrix, a TMA descriptor of the consumers' store blocks (one per
    ``(M, N)`` and config; ``cfg`` default the context's fp16 / bf16 one)."""
    cfg = cfg or ctx.gluon_config
    key = (M, N, cfg)
    desc = ctx._gluon_descs.get(key)
    if desc is None:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
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


#: the tl alternative the fp8 refusals name
TL_ALT = "a core='tl' context (create_gemm_rs_context(..., core='tl'))"


def plan_fp8(ctx, a, b, M, K, N, scale_a, scale_b, scale_block):
    """An fp8 call of a ``core="gluon"`` context, planned once per shape, strides and recipe (``ctx.plan``):
    :func:`gemm_hopper.fp8_plan`'s checks on every device (the simulator, which runs the tl twin, refuses what
    the GPU would: ``a`` row-major, ``b`` column-major ``w.t()``, 16-byte aligned rows, K a multiple of 16, the
    partial's rows -- ``N`` elements of the context's dtype -- 16-byte aligned for the TMA stores, blockwise
    groups of >= 32 along K, the config: ``gluon_config`` or ``fp8_default_config``) and, on a GPU, a Hopper
    device and what :func:`launch_fp8` needs: ``(recipe, config, gpu)``, ``gpu`` None on the simulator."""
    rec, cfg = H.fp8_plan("gemm_rs", a, b, None, scale_a, scale_b, ctx.dtype, ctx.gluon_fp8_config, scale_block,
                          alt=TL_ALT)
    if ctx.sim:
        return rec, cfg, None
    if not H.supported(a.device):
        raise ditron.DitronError(f"gemm_rs: core='gluon' runs on Hopper (sm_90) GPUs only, not on {a.device}; use "
                                 f"{TL_ALT}")
    block = rec.mode == scaling.BLOCKWISE
    P = min(int(ctx.num_programs), H.num_programs(M, N, cfg, sm_count(a.device)))
    consts = dict(H.kernel_constexprs(cfg), **H.scale_constexprs(rec.sa[0] != 0, rec.sb[1] != 0, cfg,
                                                                   (rec.gk, rec.gn) if block else None))
    return rec, cfg, (P, _c_descriptor(ctx, M, N, cfg), consts)


def launch_fp8(ctx, plan, a, b, scale_a, scale_b, M, N):
    """Launch the fp8 Gluon GEMM of a ``"ce"`` call (``plan``: :func:`plan_fp8`'s; a's and b's descriptors made
    per call)."""
    rec, cfg, (P, c_desc, consts) = plan
    la, lb, _ = H.layouts(cfg, a.dtype, ctx.dtype, b_t=True)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k], la)
    b_desc = TensorDescriptor.from_tensor(b.t(), [cfg.block_n, cfg.block_k], lb)
    gemm_rs_ws_scaled_kernel[(P,)](a_desc, b_desc, c_desc, scale_a, scale_b, ctx.seg_count,
                                   ctx.done, ctx.gcalls, M, *rec.sa, *rec.sb, num_warps=4, **consts)


def compile_sm90(cfg: H.HopperGemmConfig | None = None, dtype=torch.bfloat16, M=1024, N=1024, K=1024,
                 out_dtype=None, scales="row", scale_block=(128, 128)):
    """Compile :func:`gemm_rs_ws_kernel` -- or for fp8 ``dtype`` :func:`gemm_rs_ws_scaled_kernel` (``scales``
    ``"row"``, ``"tensor"`` or ``"block"``; ``out_dtype``, the partials' dtype, default bfloat16) -- for sm_90a
    without a GPU (``ditron.compile``; descriptor types from descriptors on CPU tensors of these shapes)."""
    from ditron import _compat
    fp8 = dtype in scaling.FP8_DTYPES
    if fp8:
        out_dtype = out_dtype or torch.bfloat16
        if scales not in ("row", "tensor", "block"):
            raise ditron.DitronError(f"gemm_rs_hopper.compile_sm90: scales={scales!r}; use 'row', 'tensor' or "
                                     "'block'")
        block = scaling.check_scale_block("gemm_rs", scale_block) if scales == "block" else None
        cfg = cfg or H.fp8_default_config(M, N, K, 132, out_dtype, block[0] if block else None)
        cfg.validate("gemm_rs", elem=1, out_elem=torch.empty((), dtype=out_dtype).element_size(),
                     overlap=H.promotion_overlap(cfg, block))
        a, c = torch.empty((M, K), dtype=dtype), torch.empty((M, N), dtype=out_dtype)
        b = torch.empty((N, K), dtype=dtype).t()
    else:
        cfg = (cfg or H.DEFAULT_CONFIG).validate("gemm_rs")
        a, b, c = (torch.empty(shape, dtype=dtype) for shape in ((M, K), (K, N), (M, N)))
    descs = H.descriptors(a, b, c, cfg)
    sig = {n: _compat.mangle_arg(d) for n, d in zip(("a_desc", "b_desc", "c_desc"), descs)}
    consts = H.kernel_constexprs(cfg)
    kernel = gemm_rs_ws_kernel
    if fp8:
        sig.update(sa_ptr="*fp32", sb_ptr="*fp32")
        consts.update(H.scale_constexprs(scales != "tensor", scales != "tensor", cfg, block))
        kernel = gemm_rs_ws_scaled_kernel
    sig.update(seg_count_ptr="*i32", done_ptr="*i64", calls_ptr="*i64", M="i32")
    if fp8:
        sig.update(stride_sam="i32", stride_sak="i32", stride_sbk="i32", stride_sbn="i32")
    return ditron.compile(kernel, target="sm_90a", signature=sig, constexprs=consts, num_warps=4)


__all__ = ["gemm_rs_ws_kernel", "gemm_rs_ws_scaled_kernel", "check_applies", "launch", "plan_fp8", "launch_fp8",
           "compile_sm90"]
