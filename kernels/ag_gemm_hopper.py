"""AG-GEMM on the Gluon Hopper core (issue 52 item 2): ``all_gather(a) @ b`` with the copy-engine producer of
:mod:`ditron.kernels.ag_gemm` and the warp-specialised consumer of :mod:`ditron.kernels.gemm_hopper`.

    ctx = create_ag_gemm_context(m, k, torch.bfloat16, core="gluon")   # sm_90 GPUs; the simulator: the tl twin
    c = ag_gemm(a, b, ctx)

The protocol is the ``tl`` consumer's copy-engine one (kernels/ag_gemm.py), unchanged in meaning:

* peers' copy engines push their shards into this rank's gather buffer (slot ``s`` = rank ``s``'s rows) and set
  ``ready[s] = 1`` behind each copy;
* the consumer walks the ``[W * m, N]`` tiles in the core's grouped order with the m-tiles rotated so that this
  rank's own rows come first (nothing to wait for), then rank ``me + 1``'s, ... (the order they arrive in);
* the core's TMA **producer** partition (one warp) loads a tile's A rows from ``a`` (own rows) or from the gather
  buffer after polling ``ready[s]`` -- per thread, ``dl.ld(..., "sys", "acquire")``: a partition has no
  program-wide barrier (ditron/gluon.py) -- and a ``fence.proxy.async.global`` (the TMA reads through the async
  proxy what the acquire made visible);
* when every program is done, the last one resets the ``ready`` flags and gives each peer its slot back
  (``free[me] = 1`` on the peer, a system-scope release store), as ``ce_release`` does.

Where it applies: one node, ``producer="ce"``, float16 / bfloat16, ``m % block_m == 0`` (tiles never straddle
shards), row-major ``b``, TMA-aligned operands, a Hopper GPU.  ``core="gluon"`` where one of these does not hold is
an error before launch that says which; on the simulator the context runs the ``tl`` consumer (the twin: the same
protocol and tile order class, tests/test_ag_gemm.py).

fp8 contexts (:func:`ag_gemm_ws_scaled_kernel`; per-tensor, rowwise and blockwise scales, e4m3 / e5m2): the
consumer is the Gluon core's fp8 path (``ws_scaled_gemm_body``) and the A scales travel with their rows, as in
the ``tl`` consumer, but in one gathered ``[W * m, SK]`` float32 matrix at the start of ``sbuf[0]`` (rank ``s``'s
rows at ``[s * m, (s + 1) * m)``; ``SK`` 1, or ``cdiv(K, gk)`` blockwise; a per-tensor ``scale_a`` becomes per
row), so that the consumers read row ``r``'s scales at ``r * SK``: the host copies this shard's scales into its
rows (one small copy on the current stream, before the side stream starts), and each copy-engine push to a
peer sends the scales first, then the rows, then sets ``ready[me]`` -- the consumers' scale loads follow the
producer partition's acquire of ``ready[s]`` through the ring's mbarriers (its release-arrive, their acquire
wait), so they see segment ``s``'s scales.  ``b = w.t()`` column-major, ``K`` a multiple of 16, the output's
rows 16-byte aligned, blockwise groups of at least 32 along K, ``m`` a multiple of the config's ``block_m``:
:func:`plan_fp8` checks them once per call shape on every device (the simulator, which runs the ``tl``
consumer, refuses what the GPU would), each refusal naming a ``core="tl"`` context; the config is the
context's ``gluon_config`` or ``gemm_hopper.fp8_default_config``."""
from __future__ import annotations

import torch

import ditron
import ditron.language as dl
from triton.experimental.gluon import language as gl

from . import gemm_hopper as H, scaling
from ._common import cdiv, sm_count
from .gemm import tma_ok

gluon = H.gluon


@gluon.jit
def _release_slots(ready_ptr, free_ptr, calls_ptr, me, W):
    """The copy-engine protocol's end of call (kernels/_common.py ``ce_release``), without a program-wide
    barrier: the caller's partitions have joined (their TMA reads of the gather buffer, and their loads of the
    rows' scales, completed before their MMAs / epilogues consumed them); the last program resets the
    ``ready`` flags and gives each peer its slot back (``free[me] = 1`` on the peer, a system-scope release)."""
    done = gl.atomic_add(calls_ptr + 1, 1)
    if done == gl.num_programs(0) - 1:
        for s in range(0, W):
            gl.store(ready_ptr + s, 0)
        for k in range(1, W):
            dl.st(dl.symm_at(free_ptr + me, (me + k) % W), 1, "sys", "release")
        gl.store(calls_ptr + 1, 0)
        gl.atomic_add(calls_ptr, 1)


@ditron.gluon.jit
def ag_gemm_ws_kernel(a_desc, g_desc, b_desc, c_desc, ready_ptr, free_ptr, calls_ptr, m_local, slot_rows,
                      GROUP_M: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """``c[W*m, N] = gathered_a @ b`` (see the module docstring); ``a_desc`` this rank's ``[m, K]`` shard,
    ``g_desc`` the gather buffer as one ``[W * slot_rows, K]`` matrix."""
    me = dl.rank()
    W = dl.num_ranks()
    BM: gl.constexpr = a_desc.block_type.shape[0]
    H.ws_gemm_body(a_desc, g_desc, b_desc, c_desc, W * m_local, me * (m_local // BM), ready_ptr, m_local,
                   slot_rows, me, GROUP_M, STAGES, PINGPONG, True, CONSUMER_REGS, PRODUCER_REGS)
    _release_slots(ready_ptr, free_ptr, calls_ptr, me, W)


@ditron.gluon.jit
def ag_gemm_ws_scaled_kernel(a_desc, g_desc, b_desc, c_desc, sa_ptr, sb_ptr, ready_ptr, free_ptr, calls_ptr,
                             m_local, slot_rows, stride_sam, stride_sak, stride_sbk, stride_sbn,
                             GROUP_M: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                             CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, SA_ROW: gl.constexpr,
                             SB_COL: gl.constexpr, PROMOTE: gl.constexpr, BLOCKWISE: gl.constexpr,
                             GK: gl.constexpr, GN: gl.constexpr, PROMOTE_OVERLAP: gl.constexpr = False):
    """fp8 :func:`ag_gemm_ws_kernel`: ``c[W*m, N] = (gathered_a * scale_a) @ (b * scale_b)`` on the fp8 core
    (``gemm_hopper.ws_scaled_gemm_body``: ``b_desc`` of ``b^T``, the fp32 promotion every ``PROMOTE``
    products, epilogue or -- ``BLOCKWISE`` -- per-K-step scales).  ``sa_ptr``: the gathered rows' A scales as
    one ``[W * m, SK]`` matrix (row ``r`` of ``c`` at ``r * stride_sam``, K group ``g`` at ``+ g *
    stride_sak``): this rank's own rows' copied there by the host, each peer's pushed by its copy engine
    before it set ``ready[s]`` -- the scales travel with their rows (see :func:`launch_fp8`)."""
    me = dl.rank()
    W = dl.num_ranks()
    BM: gl.constexpr = a_desc.block_type.shape[0]
    H.ws_scaled_gemm_body(a_desc, g_desc, b_desc, c_desc, W * m_local, me * (m_local // BM), ready_ptr, m_local,
                          slot_rows, me, sa_ptr, sb_ptr, stride_sam, stride_sbn, GROUP_M, STAGES, PINGPONG, True,
                          CONSUMER_REGS, PRODUCER_REGS, True, True, SA_ROW, SB_COL, PROMOTE, 1, 0, 0, False, False,
                          stride_sak, stride_sbk, BLOCKWISE, GK, GN, PROMOTE_OVERLAP)
    _release_slots(ready_ptr, free_ptr, calls_ptr, me, W)


def check_applies(ctx, a, b, out, m, aligned):
    """Raise when the Gluon consumer cannot take this call (the reason named)."""
    cfg = ctx.gluon_config
    why = None
    if a.device.type != "cuda" or not H.supported(a.device):
        why = "it runs on Hopper (sm_90) GPUs only"
    elif m % cfg.block_m:
        why = f"m={m} is not a multiple of block_m={cfg.block_m} (tiles must not straddle shards)"
    elif b.stride(1) != 1:
        why = "b must be row-major"
    elif not aligned:
        why = "TMA needs 16-byte aligned bases and rows"
    if why:
        raise ditron.DitronError(f"ag_gemm: core='gluon' cannot take this call: {why}; create the context with "
                                 "core='tl'")


def _gather_descriptor(g, cfg):
    """The gather buffer (one ``[W * slot_rows, K]`` matrix) as a TMA descriptor of A's blocks and layout."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor.from_tensor(g, [cfg.block_m, cfg.block_k], H.layouts(cfg, g.dtype)[0])


def launch(ctx, a, b, out, m, K, N):
    """Launch the Gluon consumer for this call (descriptors of ``a``, ``b``, ``out`` made per call; the gather
    buffer's once per shard size)."""
    cfg = ctx.gluon_config
    gkey = ("gluon_g", m, K)
    g_desc = ctx._plans.get(gkey)
    if g_desc is None:
        g_desc = ctx._plans[gkey] = _gather_descriptor(ctx.buf[0].view(ctx.world_size * ctx.slot_rows, K), cfg)
    a_desc, b_desc, c_desc = H.descriptors(a, b, out, cfg)
    P = int(ctx.num_programs or H.num_programs(ctx.world_size * m, N, cfg, sm_count(a.device)))
    ag_gemm_ws_kernel[(P,)](a_desc, g_desc, b_desc, c_desc, ctx.ready, ctx.free, ctx.calls, m, ctx.slot_rows,
                            num_warps=4, **H.kernel_constexprs(cfg))


#: the tl alternative the fp8 refusals name
TL_ALT = "a core='tl' context (create_ag_gemm_context(..., core='tl'))"


def plan_fp8(ctx, a, b, out, m, K, N, scale_a, scale_b):
    """An fp8 call of a ``core="gluon"`` context, planned once per shape, strides and recipe (``ctx.plan``):
    the checks, on every device (the simulator, which runs the tl twin, refuses what the GPU would) --
    :func:`gemm_hopper.fp8_plan`'s (``a`` row-major, ``b`` column-major ``w.t()``, 16-byte aligned rows, K
    a multiple of 16, blockwise groups of >= 32 along K, the config), ``m`` a multiple of the config's
    ``block_m`` (tiles must not straddle shards), a TMA-aligned ``out`` -- and, on a GPU, a Hopper device
    and what :func:`launch_fp8` needs: ``(recipe, config, gpu)``, ``gpu`` None on the simulator."""
    E = ditron.DitronError
    rec, cfg = H.fp8_plan("ag_gemm", a, b, None, scale_a, scale_b, ctx.out_dtype, ctx.gluon_config, ctx.scale_block,
                          alt=TL_ALT)
    if m % cfg.block_m:
        raise E(f"ag_gemm: core='gluon' needs m={m} rows per rank to be a multiple of the Gluon config's block_m="
                f"{cfg.block_m} (tiles must not straddle shards); use {TL_ALT}")
    if not tma_ok(out):
        raise E(f"ag_gemm: core='gluon' stores through TMA: 'out' needs 16-byte aligned rows and base (strides "
                f"{tuple(out.stride())}); use {TL_ALT}")
    if ctx.sim:
        return rec, cfg, None
    if not H.supported(a.device):
        raise E(f"ag_gemm: core='gluon' runs on Hopper (sm_90) GPUs only, not on {a.device}; use {TL_ALT}")
    W, me = ctx.world_size, ctx.rank
    block = rec.mode == scaling.BLOCKWISE
    sk = cdiv(K, rec.gk) if block else 1
    # the rows' scales as one [W * m, sk] matrix in sbuf: rank s's at rows [s * m, (s + 1) * m)
    gathered = ctx.sbuf[0].reshape(-1)[:W * m * sk].view(W * m, sk)
    own = gathered[me * m:(me + 1) * m]
    g_desc = _gather_descriptor(ctx.buf[0].view(W * ctx.slot_rows, K), cfg)
    P = int(ctx.num_programs or H.num_programs(W * m, N, cfg, sm_count(a.device)))
    consts = dict(H.kernel_constexprs(cfg), **H.scale_constexprs(True, rec.sb[1] != 0, cfg,
                                                                   (rec.gk, rec.gn) if block else None))
    return rec, cfg, (own, gathered, g_desc, P, (sk, 1 if block else 0) + rec.sb, consts)


def launch_fp8(ctx, plan, a, b, out, scale_a, scale_b, m, K):
    """An fp8 call on the Gluon consumer (``plan``: :func:`plan_fp8`'s): this shard's A scales into its rows of
    the gathered scales (one small copy; a per-tensor scale becomes per-row, each rank's shard keeping its
    own), the copy-engine pushes of the shard and its scales -- scales first, rows, then ``ready`` -- into
    every peer, then the consumer."""
    from .ag_gemm import _produce_ce
    _, cfg, (own, gathered, g_desc, P, sargs, consts) = plan
    own.copy_(scale_a)
    if ctx.world_size > 1:
        _produce_ce(ctx, a, m, K, own, compact=True)
    a_desc, b_desc, c_desc = H.descriptors(a, b, out, cfg)
    ag_gemm_ws_scaled_kernel[(P,)](a_desc, g_desc, b_desc, c_desc, gathered, scale_b, ctx.ready, ctx.free, ctx.calls,
                                   m, ctx.slot_rows, *sargs, num_warps=4, **consts)


def compile_sm90(cfg: H.HopperGemmConfig | None = None, dtype=torch.bfloat16, m=256, N=1024, K=1024, world=2,
                 out_dtype=None, scales="row", scale_block=(128, 128)):
    """Compile :func:`ag_gemm_ws_kernel` -- or for fp8 ``dtype`` :func:`ag_gemm_ws_scaled_kernel` (``scales``
    ``"row"``, ``"tensor"`` (per-tensor ``scale_b``; the A scales are per row: they travel with the rows) or
    ``"block"``; ``out_dtype`` default bfloat16) -- for sm_90a without a GPU (``ditron.compile``; descriptor
    types from descriptors on CPU tensors of these shapes)."""
    from ditron import _compat
    fp8 = dtype in scaling.FP8_DTYPES
    if fp8:
        out_dtype = out_dtype or torch.bfloat16
        if scales not in ("row", "tensor", "block"):
            raise ditron.DitronError(f"ag_gemm_hopper.compile_sm90: scales={scales!r}; use 'row', 'tensor' or 'block'")
        block = scaling.check_scale_block("ag_gemm", scale_block) if scales == "block" else None
        cfg = cfg or H.fp8_default_config(world * m, N, K, 132, out_dtype, block[0] if block else None)
        cfg.validate("ag_gemm", elem=1, out_elem=torch.empty((), dtype=out_dtype).element_size(),
                     overlap=H.promotion_overlap(cfg, block))
        a, c = torch.empty((m, K), dtype=dtype), torch.empty((world * m, N), dtype=out_dtype)
        b = torch.empty((N, K), dtype=dtype).t()
    else:
        cfg = (cfg or H.DEFAULT_CONFIG).validate("ag_gemm")
        a, b, c = (torch.empty(shape, dtype=dtype) for shape in ((m, K), (K, N), (world * m, N)))
    a_desc, b_desc, c_desc = H.descriptors(a, b, c, cfg)
    g_desc = _gather_descriptor(torch.empty((world * m, K), dtype=dtype), cfg)
    sig = {n: _compat.mangle_arg(d) for n, d in zip(("a_desc", "g_desc", "b_desc", "c_desc"),
                                                     (a_desc, g_desc, b_desc, c_desc))}
    consts = H.kernel_constexprs(cfg)
    kernel = ag_gemm_ws_kernel
    if fp8:
        sig.update(sa_ptr="*fp32", sb_ptr="*fp32")
        consts.update(H.scale_constexprs(True, scales != "tensor", cfg, block))
        kernel = ag_gemm_ws_scaled_kernel
    sig.update(ready_ptr="*i64", free_ptr="*i64", calls_ptr="*i64", m_local="i32", slot_rows="i32")
    if fp8:
        sig.update(stride_sam="i32", stride_sak="i32", stride_sbk="i32", stride_sbn="i32")
    return ditron.compile(kernel, target="sm_90a", signature=sig, constexprs=consts, num_warps=4)


__all__ = ["ag_gemm_ws_kernel", "ag_gemm_ws_scaled_kernel", "check_applies", "launch", "plan_fp8", "launch_fp8",
           "compile_sm90"]
