"""The zoo's GEMM core (kernels/gemm.py): matmul against torch on one
simulated rank (non-perfect shapes, both dtypes, strided operands), the
tuner, errors before launch, and what the GPU kernel compiles to for sm_90a."""
import importlib

import pytest

import ditron

import bodies_gemm_core as B
from conftest import tma_loads, tma_stores

G = importlib.import_module("ditron.kernels.gemm")
SHAPES = [(37, 45, 70), (16, 16, 32), (5, 17, 33)]
# on GPUs also shapes where the default config runs on TMA descriptors (16-byte aligned rows) and none of
# M, N, K is a multiple of its tile, a grid of fewer tiles than SMs, and one N like the paper's 7392
GPU_SHAPES = [(130, 264, 200), (1000, 7392, 520), (4100, 2056, 1032)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_shapes(dist_world, dtype):
    from conftest import GPU_BACKEND
    shapes = SHAPES + (GPU_SHAPES if GPU_BACKEND != "sim" else [])
    assert dist_world(1).run(B.matmul_shapes, dtype, shapes) == [len(shapes)]


def test_tune_and_errors(dist_world):
    msgs = dist_world(1).run(B.tune_and_errors)[0]
    assert "float16 or bfloat16" in msgs["dtype"]
    assert "'b' has 60 rows" in msgs["k"]
    assert "expected (37, 45)" in msgs["out"]
    assert "GemmConfig, None or 'tune'" in msgs["config"]
    assert "block_m=24 must be a power of two" in msgs["block"]


_NAMES = ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn",
          "stride_cm", "stride_cn", "sa_ptr", "sb_ptr", "stride_sam", "stride_sak", "stride_sbk", "stride_sbn"]


def compile_core(cfg, tma, ab="*bf16", c="*bf16", scale=0, gk=1, gn=1, b_t=False, unit=("stride_ak", "stride_bn",
                                                                                          "stride_cn"),
                 with_shared=False):
    """PTX of gemm_kernel for sm_90a as a GPU launch specialises it: 16-byte aligned tensors, sizes and
    strides that are multiples of 16, the unit strides in ``unit`` (``b_t``: b column-major, its
    ``stride_bk`` is 1); fp8 with ``ab="*fp8e4nv"`` and a scale recipe (``scale``, ``gk``, ``gn``)."""
    import ditron
    names = [n for n in _NAMES if n not in unit]
    sig = {n: (ab if n in ("a_ptr", "b_ptr") else c if n == "c_ptr" else "*fp32" if n in ("sa_ptr", "sb_ptr")
               else "i32") for n in names}
    div = {"a_ptr", "b_ptr", "c_ptr", "sa_ptr", "sb_ptr", "N", "K", "stride_am", "stride_bk", "stride_bn",
           "stride_cm"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in div}
    ck = ditron.compile(G.gemm_kernel, target="sm_90a", signature=sig, attrs=attrs, num_warps=cfg.num_warps,
                        num_stages=cfg.num_stages,
                        constexprs=dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                        GROUP_M=cfg.group_m, EVEN_K=True, TMA=tma, FLATTEN=cfg.flatten,
                                        SUBTILE=cfg.epilogue_subtile if tma else 1,
                                        WARP_SPEC=cfg.warp_specialize and tma, SCALE=scale, GK=gk, GN=gn, B_T=b_t,
                                        **{u: 1 for u in unit}))
    return (ck.asm["ptx"], ck.metadata.shared) if with_shared else ck.asm["ptx"]


def _compile_core(cfg, tma):
    return compile_core(cfg, tma)


@pytest.mark.parametrize("shape", [(8192, 4096, 5504), (8192, 26624, 16384), (1024, 512, 4096)])
def test_default_config_compiles_to_tma_and_wgmma(shape):
    """The default GPU config (per shape) loads through TMA descriptors, stores
    its epilogue through TMA, and multiplies with wgmma."""
    cfg = G.gpu_default_config(*shape, num_sms=132)
    assert cfg.tma
    ptx = _compile_core(cfg, tma=True)
    assert "wgmma.mma_async" in ptx
    assert tma_loads(ptx)
    assert tma_stores(ptx)                  # TMA-store epilogue


@pytest.mark.parametrize("cfg", [G.GemmConfig(128, 256, 64, 8, 8, 3, tma=True, flatten=True, epilogue_subtile=2),
                                 G.GemmConfig(128, 256, 64, 8, 8, 3, tma=True, warp_specialize=True)],
                         ids=["subtile2", "warp_specialize"])
def test_tma_variants_compile(cfg):
    ptx = _compile_core(cfg, tma=True)
    assert "wgmma.mma_async" in ptx and tma_loads(ptx) and tma_stores(ptx)


def test_pointer_fallback_keeps_vector_loads():
    """Pointer loads (the fallback where TMA does not apply) must stay 16-byte
    cp.async: a clamp of B's columns once made them scalar (20x slower on
    H200)."""
    ptx = _compile_core(G.GemmConfig(128, 256, 64, 8, 8, 4), tma=False)
    assert "wgmma.mma_async" in ptx
    assert "cp.async.cg.shared.global" in ptx and "ld.global.b16" not in ptx
    assert "cp.async.bulk.tensor" not in ptx


def test_config_validation():
    with pytest.raises(ditron.DitronError, match="epilogue_subtile=3"):
        G.GemmConfig(epilogue_subtile=3).validate()
    with pytest.raises(ditron.DitronError, match="warp_specialize needs tma=True and flatten=False"):
        G.GemmConfig(tma=True, flatten=True, warp_specialize=True).validate()
