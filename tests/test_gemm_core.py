"""The zoo's GEMM core (kernels/gemm.py): matmul against torch on one
simulated rank (non-perfect shapes, both dtypes, strided operands), the
tuner, errors before launch, and what the GPU kernel compiles to for sm_90a."""
import importlib

import pytest

import bodies_gemm_core as B

G = importlib.import_module("ditron.kernels.gemm")
SHAPES = [(37, 45, 70), (16, 16, 32), (5, 17, 33)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_shapes(dist_world, dtype):
    assert dist_world(1).run(B.matmul_shapes, dtype, SHAPES) == [len(SHAPES)]


def test_tune_and_errors(dist_world):
    msgs = dist_world(1).run(B.tune_and_errors)[0]
    assert "float16 or bfloat16" in msgs["dtype"]
    assert "'b' has 60 rows" in msgs["k"]
    assert "expected (37, 45)" in msgs["out"]
    assert "GemmConfig, None or 'tune'" in msgs["config"]
    assert "block_m=24 must be a power of two" in msgs["block"]


_NAMES = ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn",
          "stride_cm", "stride_cn"]


@pytest.mark.parametrize("tma", [False, True])
def test_gpu_kernel_compiles_to_wgmma_with_vector_or_tma_loads(tma):
    """Pointer loads must stay 16-byte cp.async (a clamp of B's columns once
    made them scalar: 20x slower on H200); TMA configs use bulk tensor copies."""
    import ditron
    sig = {n: ("*bf16" if n.endswith("_ptr") else "i32") for n in _NAMES}
    # what a GPU launch specialises: 16-byte aligned tensors, sizes and strides that are multiples of 16
    div = {"a_ptr", "b_ptr", "c_ptr", "N", "K", "stride_am", "stride_bk", "stride_cm"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(_NAMES) if n in div}
    ck = ditron.compile(G.gemm_kernel, target="sm_90a", signature=sig, attrs=attrs, num_warps=8, num_stages=4,
                        constexprs=dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, EVEN_K=True, TMA=tma,
                                        FLATTEN=tma, stride_ak=1, stride_bn=1, stride_cn=1))
    ptx = ck.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    if tma:
        assert "cp.async.bulk.tensor" in ptx
    else:
        assert "cp.async.cg.shared.global" in ptx and "ld.global.b16" not in ptx
