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
protocol and tile order class, tests/test_ag_gemm.py)."""
from __future__ import annotations

import torch

import ditron
import ditron.language as dl
from triton.experimental.gluon import language as gl

from . import gemm_hopper as H
from ._common import sm_count


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
    # the copy-engine protocol's end of call (kernels/_common.py ce_release), without a program-wide barrier:
    # every partition has joined (its TMA reads of the gather buffer completed before its MMAs consumed them)
    done = gl.atomic_add(calls_ptr + 1, 1)
    if done == gl.num_programs(0) - 1:
        for s in range(0, W):
            gl.store(ready_ptr + s, 0)
        for k in range(1, W):
            dl.st(dl.symm_at(free_ptr + me, (me + k) % W), 1, "sys", "release")
        gl.store(calls_ptr + 1, 0)
        gl.atomic_add(calls_ptr, 1)


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


def compile_sm90(cfg: H.HopperGemmConfig | None = None, dtype=torch.bfloat16, m=256, N=1024, K=1024, world=2):
    """Compile :func:`ag_gemm_ws_kernel` for sm_90a without a GPU (``ditron.compile``; descriptor types from
    descriptors on CPU tensors of these shapes)."""
    from ditron import _compat
    cfg = (cfg or H.DEFAULT_CONFIG).validate("ag_gemm")
    a, b, c = (torch.empty(shape, dtype=dtype) for shape in ((m, K), (K, N), (world * m, N)))
    a_desc, b_desc, c_desc = H.descriptors(a, b, c, cfg)
    g_desc = _gather_descriptor(torch.empty((world * m, K), dtype=dtype), cfg)
    sig = {n: _compat.mangle_arg(d) for n, d in zip(("a_desc", "g_desc", "b_desc", "c_desc"),
                                                     (a_desc, g_desc, b_desc, c_desc))}
    sig.update(ready_ptr="*i64", free_ptr="*i64", calls_ptr="*i64", m_local="i32", slot_rows="i32")
    return ditron.compile(ag_gemm_ws_kernel, target="sm_90a", signature=sig, constexprs=H.kernel_constexprs(cfg),
                          num_warps=4)


__all__ = ["ag_gemm_ws_kernel", "check_applies", "launch", "compile_sm90"]
