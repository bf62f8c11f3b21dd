"""The zoo's ag_gemm (kernels/ag_gemm.py): all_gather(a) @ b against torch on
4 simulated ranks in CI (on GPUs under torchrun with
DITRON_TEST_BACKEND=p2p|nvshmem; see conftest.py): shard sizes that are not
multiples of the tile (m = 1, 5, 24 with BLOCK_M 16: straddling tiles, tiles
spanning several segments), N with a tail, fp16 and bf16, same and per-rank
weights, context reuse, 1 rank and 2 nodes, errors before launch."""
import pytest

import bodies_ag_gemm as B
from conftest import tma_loads, tma_stores, GPU_BACKEND
from ditron._compat import TRITON_VERSION

ON_GPU = GPU_BACKEND != "sim"
K = 32
#: (m, N, K): every call of one body reuses one context
SHAPES = [(m, n, K) for m in (1, 5, 24) for n in (16, 40)]
REUSE = [(5, 40, K)] * 3
SIM_BLOCKS = {} if ON_GPU else dict(block_m=16, block_n=16, block_k=32)


@pytest.mark.parametrize("dtype,producer", [("fp16", "ce"), ("bf16", "sm")])
def test_ag_gemm_shapes(dist, dtype, producer):
    assert dist.run(B.ag_gemm_calls, dtype, SHAPES, producer=producer, **SIM_BLOCKS) == [len(SHAPES)] * dist.world_size


@pytest.mark.parametrize("dtype,producer", [("bf16", "ce"), ("fp16", "sm")])
def test_ag_gemm_reuse_per_rank_weights(dist, dtype, producer):
    # call i: rank i % world starts late, so its peers really wait for its segment
    assert dist.run(B.ag_gemm_calls, dtype, REUSE, per_rank_b=True, seed=7, delay=0.5, producer=producer,
                    **SIM_BLOCKS) == [3] * dist.world_size


def test_ag_gemm_out_and_strided_b(dist):
    assert dist.run(B.ag_gemm_out_and_strided_b) == [1] * dist.world_size


@pytest.mark.parametrize("n,nnodes", [(1, 1), (4, 2)])
def test_ag_gemm_other_worlds(dist_world, n, nnodes):
    # (4, 2): ranks on the other node get the shard by shmem.putmem_signal_block
    d = dist_world(n, nnodes)
    shapes = [(5, 40, K), (24, 16, K)]
    assert d.run(B.ag_gemm_calls, "bf16", shapes, per_rank_b=True, seed=3, **SIM_BLOCKS) == [2] * n


def test_ag_gemm_errors_before_launch(dist):
    msgs = dist.run(B.errors)[0]
    assert "9 rows, more than the context's max_m_per_rank=8" in msgs["too_many_rows"]
    assert "m must be >= 1" in msgs["no_rows"]
    assert "K=16, the context was created for k=32" in msgs["wrong_k"]
    assert "torch.bfloat16, the context was created for torch.float16" in msgs["a_dtype"]
    assert "'b' is torch.float32" in msgs["b_dtype"]
    assert "'b' has 16 rows" in msgs["b_rows"]
    assert "2-D" in msgs["a_1d"]
    assert f"expected ({5 * dist.world_size}, 16)" in msgs["out_shape"]
    assert "float16 or bfloat16" in msgs["ctx_dtype"]
    assert "use one of auto, ce, sm" in msgs["producer"]
    assert "unknown option(s) block_q" in msgs["option"]
    assert "core='cublas'; use one of tl, gluon" in msgs["core"]
    assert "core='gluon' runs the copy-engine protocol" in msgs["gluon_sm"]
    assert msgs["gluon_fp8"] is None            # fp8 contexts run the Gluon core's fp8 path (tests/test_fp8.py)
    assert "gluon_config applies to core='gluon'" in msgs["gluon_config_tl"]
    assert "gluon_config must be a ditron.kernels.gemm_hopper.HopperGemmConfig" in msgs["gluon_config_type"]


# core="gluon" (kernels/ag_gemm_hopper.py): on GPUs the warp-specialised Gluon consumer (m a multiple of its
# 128-row tiles; N and K with tails), on the simulator its tl twin (the tl consumer, small tiles)
GLUON_SHAPES = ([(128, 200, 96), (256, 40, 96), (128, 200, 96)] if ON_GPU else
                [(16, 40, K), (32, 16, K), (16, 40, K)])


def _gluon_calls(d):
    return d.run(B.ag_gemm_calls, "bf16", GLUON_SHAPES, per_rank_b=True, seed=5, delay=0.3, core="gluon",
                 **SIM_BLOCKS)


@pytest.mark.parametrize("n", [1, 3])
def test_ag_gemm_gluon_core(dist_world, n):
    assert _gluon_calls(dist_world(n)) == [len(GLUON_SHAPES)] * n


def test_ag_gemm_gluon_core_on_the_job_world(dist):
    # the suite's world (4 simulated ranks; on GPUs whatever torchrun started)
    assert _gluon_calls(dist) == [len(GLUON_SHAPES)] * dist.world_size


def test_ag_gemm_gluon_consumer_compiles_for_sm90a():
    from ditron.kernels import ag_gemm_hopper as AH
    ck = AH.compile_sm90()
    ptx, ir = ck.asm["ptx"], ck.asm["dist_ir"]
    assert "wgmma.mma_async" in ptx and "setmaxnreg" in ptx            # the warp-specialised core
    # the producer's per-thread acquire poll of ready[s], the proxy fence before its TMA loads, the release of
    # the peers' slots; no program-wide dl.wait / dl.notify inside the partitions
    assert "ld.acquire.sys" in ptx and "fence.proxy.async.global" in ptx and "st.release.sys" in ptx
    assert "dist.ld(" in ir and "dist.st(" in ir and "dist.wait(" not in ir and "dist.notify(" not in ir


def consumer_signature(ab="*bf16", c="*bf16"):
    sig = {"a_ptr": ab, "b_ptr": ab, "c_ptr": c, "buf_ptr": ab, "sig_ptr": "*i64",
           "ready_ptr": "*i64", "free_ptr": "*i64", "calls_ptr": "*i64", "m": "i32", "N": "i32", "K": "i32",
           "slot_rows": "i32", "stride_am": "i32", "stride_bk": "i32", "stride_bn": "i32", "P": "i32",
           "sa_ptr": "*fp32", "sbuf_ptr": "*fp32", "sb_ptr": "*fp32", "stride_sam": "i32", "stride_sak": "i32",
           "stride_sbk": "i32", "stride_sbn": "i32", "s_slot": "i32"}
    return sig


#: every combination under Triton 3.6 (the GPU machines' Triton, which CI runs too); under a newer Triton a cover in
#: which each of ce, tma and fp8 takes both values (CI's time: ~2 s a compile on its 2 cores)
_CONSUMER_CASES = [(True, True, False), (False, True, False), (True, False, False), (False, False, False),
                   (True, True, True), (False, False, True)]
if TRITON_VERSION[:2] != (3, 6):
    _CONSUMER_CASES = [(True, True, False), (False, False, True)]


@pytest.mark.parametrize("ce,tma,fp8", _CONSUMER_CASES)
def test_ag_gemm_consumer_compiles_for_sm90a(ce, tma, fp8):
    """The GPU consumer compiles without a GPU: wgmma; with TMA, descriptor
    loads, the local tiles' loop flattened, and a TMA-store epilogue.  fp8
    (blockwise scales that travel with the rows): e4m3 wgmma, b through a
    descriptor of b^T (K-major)."""
    import ditron
    from ditron.kernels.ag_gemm import ag_gemm_consumer_kernel
    sig = consumer_signature("*fp8e4nv" if fp8 else "*bf16")
    extra = dict(SCALE=2, GK=128, GN=128, B_T=tma) if fp8 else dict(SCALE=0, GK=1, GN=1, B_T=False)
    ck = ditron.compile(ag_gemm_consumer_kernel, target="sm_90a", signature=sig,
                        constexprs=dict(BLOCK_M=128, BLOCK_N=256 if not fp8 else 128, BLOCK_K=64 if not fp8 else 128,
                                        GROUP_M=8, EVEN_K=True, CE=ce, TMA=tma, FLATTEN=tma, SUBTILE=1, **extra),
                        num_warps=8, num_stages=3)
    ptx = ck.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    assert (".e4m3.e4m3" in ptx) == fp8
    assert tma_loads(ptx) == tma
    assert tma_stores(ptx) == tma           # TMA-store epilogue


def test_porting_walkthrough_code(dist):
    """The walk-through's plain GEMM and its AllGather-GEMM (docs/zoo.md) are correct."""
    assert dist.run(B.tutorial) == [5 * dist.world_size] * dist.world_size
