"""fp8 GEMMs (issue 55): the core (kernels/gemm.py) and the overlap ops with per-tensor, per-row / per-column
and blockwise scales (kernels/scaling.py), on 1-4 simulated ranks, against torch._scaled_mm (CPU where the
installed torch takes the scales, else the exact product of its semantics; both held to each other, and to
cuBLASLt's on a GPU) and a float32 reference of the blockwise recipe; the simulator's fp8 accumulation check; what sm_90a compiles fp8 to."""
import importlib

import pytest

import ditron

import bodies_fp8 as B

G = importlib.import_module("ditron.kernels.gemm")

E4, E5 = "float8_e4m3fn", "float8_e5m2"
# (M, N, K, recipe, out dtype, dtype of a, dtype of b): tails in M, N and K; K over several 128-groups
CORE_CASES = [
    (37, 45, 70, "tensor", "bfloat16", E4, E4),
    (37, 45, 70, "row", "float32", E4, E4),
    (19, 40, 96, "row", "float16", E5, E4),
    (16, 33, 64, "tensor", "float32", E5, E5),
    (21, 150, 300, "block", "bfloat16", E4, E4),
    (33, 20, 260, "block", "float32", E4, E4),
]


# on GPUs also shapes whose rows are 16-byte aligned: the default config's TMA path (b^T descriptor, TMA-store
# epilogue), with M, N, K tails of the 128 x 256 x 128 tiles
GPU_CORE_CASES = [(256, 384, 512, "row", "bfloat16", E4, E4), (200, 264, 384, "block", "bfloat16", E4, E4),
                  (130, 520, 256, "tensor", "float32", E4, E4), (300, 1032, 640, "block", "float32", E4, E4)]


def test_matmul_fp8_recipes(dist_world):
    from conftest import GPU_BACKEND
    cases = CORE_CASES + (GPU_CORE_CASES if GPU_BACKEND != "sim" else [])
    assert dist_world(1).run(B.matmul_recipes, cases) == [len(cases)]


# (m or M, N, K, recipe, out dtype): M tails, K over two 128-groups for blockwise
RS_CASES = [(5, 24, 70, "tensor", "bfloat16"), (3, 40, 160, "block", "float32"), (4, 18, 64, "row", "bfloat16")]


@pytest.mark.parametrize("n, method", [(1, "scatter"), (2, "ce"), (3, "pull"), (4, "scatter")])
def test_gemm_rs_fp8(dist_world, n, method):
    cases = RS_CASES if n <= 2 else RS_CASES[1:2]
    assert dist_world(n).run(B.gemm_rs_fp8, cases, method) == [len(cases)] * n


@pytest.mark.parametrize("n, method", [(2, "one_shot"), (3, "two_shot"), (2, "rs_ag")])
def test_gemm_ar_fp8(dist_world, n, method):
    cases = [(6, 20, 70, "row", "bfloat16"), (4, 36, 200, "block", "float32")] if n == 2 else \
        [(9, 20, 140, "block", "bfloat16")]
    assert dist_world(n).run(B.gemm_ar_fp8, cases, method) == [len(cases)] * n


@pytest.mark.parametrize("n, producer", [(1, "ce"), (2, "ce"), (3, "sm"), (4, "ce")])
def test_ag_gemm_fp8_scales_travel_with_rows(dist_world, n, producer):
    cases = [(5, 24, 160, "tensor", "bfloat16"), (7, 30, 160, "row", "bfloat16"), (4, 40, 160, "block", "bfloat16")]
    if n > 2:
        cases = cases[::2]
    assert dist_world(n).run(B.ag_gemm_fp8, cases, producer) == [len(cases)] * n


def test_grouped_gemm_fp8_blockwise(dist_world):
    # 3 experts, one without rows, tails in every dimension; with and without the gather of rows (and scales)
    cases = [([7, 0, 12], 40, 160, False), ([5, 9], 24, 130, True)]
    assert dist_world(1).run(B.grouped_gemm_fp8, cases) == [len(cases)]


def test_fp8_errors_before_launch(dist_world):
    msgs = dist_world(1).run(B.error_cases)[0]
    assert "need scale_a" in msgs["no_scales"]
    assert "scales must be float32" in msgs["scale_dtype"]
    assert "scale_a has shape [7, 1]" in msgs["scale_a_shape"] and "[20, 1] (per-row)" in msgs["scale_a_shape"]
    assert "scale_b has shape [1, 5]" in msgs["scale_b_shape"]
    assert "blockwise scales" in msgs["block_b_shape"] and "[2, 1]" in msgs["block_b_shape"]
    assert "blockwise scales" in msgs["mixed"]
    assert "fp8 operands (float8_e4m3fn or float8_e5m2) for both" in msgs["b_dtype"]
    assert "write bfloat16, float16 or float32" in msgs["out_dtype"]
    assert "expected torch.bfloat16" in msgs["out"]
    assert "apply to fp8 operands only" in msgs["bf16_scales"]
    assert "block_k <= 128" in msgs["block_k"]
    assert "scale_a has shape [20, 2]" in msgs["block_group"] and "[M, cdiv(K, 32)] = [20, 8]" in msgs["block_group"]
    assert "power of two" in msgs["scale_block"]
    assert "scale_w has shape [2, 1]" in msgs["moe_scales"]


def test_reference_when_scaled_mm_refuses_rowwise_on_cpu(monkeypatch):
    """torch 2.11's CPU build refuses rowwise scales in torch._scaled_mm (per-tensor only; 2.13 takes them): the
    reference is then the exact product of the same semantics, which agrees with torch._scaled_mm wherever that
    runs, and a wrong scale is caught."""
    import torch
    real = torch._scaled_mm

    def cpu_211(a, b, scale_a=None, scale_b=None, out_dtype=None, **kw):
        if a.device.type == "cpu" and (scale_a.numel() != 1 or scale_b.numel() != 1):
            raise RuntimeError('(scale_a.numel() == 1 && scale_b.numel() == 1) INTERNAL ASSERT FAILED at '
                               '"/pytorch/aten/src/ATen/native/mkldnn/Linear.cpp":516, please report a bug to '
                               'PyTorch. Now _scaled_mm only supports per-tensor scaling for CPU backend')
        return real(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", cpu_211)
    B.SCALED_MM_REFUSED.clear()
    for i, (recipe, out_dtype, da, db) in enumerate([("row", torch.bfloat16, B.E4, B.E4),
                                                     ("row", torch.float32, B.E5, B.E4),
                                                     ("tensor", torch.float16, B.E4, B.E4)]):
        a, b, sa, sb, _ = B.operands(37, 45, 70, recipe, 3 + i, da, db)
        got = B.scaled_mm_reference(a, b, sa, sb, out_dtype)
        exact = B.exact_scaled_mm(a, b, sa, sb, out_dtype)
        if recipe == "row":
            assert "per-tensor scaling for CPU" in B.SCALED_MM_REFUSED["cpu"]
            assert torch.equal(got, exact)
        try:
            vendor = real(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        except RuntimeError:
            continue                                  # this torch's CPU build refuses it too: nothing to compare
        B.check(vendor, got, out_dtype, f"torch._scaled_mm vs the reference ({recipe})")
        with pytest.raises(AssertionError):
            B.check(vendor, B.exact_scaled_mm(a, b, sa, sb * 1.01, out_dtype), out_dtype, "a wrong scale")


def test_simulator_refuses_unmodelled_fp8_accumulation(dist_world):
    """An fp8 tl.dot that keeps the whole K loop in sm_90's reduced-precision accumulator (Triton's default) is
    refused; with max_num_imprecise_acc <= 128 it runs."""
    msgs = dist_world(1).run(B.fp8_accumulation)[0]
    assert msgs["default"] is not None and "cannot model this fp8 tl.dot" in msgs["default"]
    assert "max_num_imprecise_acc" in msgs["default"]
    assert msgs["promoted"] is None


_UNIT_FP8 = ("stride_ak", "stride_bk", "stride_cn")        # b column-major (w.t()): K-major for wgmma


@pytest.mark.parametrize("scale", [1, 2], ids=["rowwise", "blockwise"])
@pytest.mark.parametrize("c", ["*bf16", "*fp32"])
def test_fp8_core_compiles_to_fp8_wgmma_and_tma(scale, c):
    """The GPU default config for fp8 at a paper shape: TMA loads of a and of b^T (K-major), fp8 wgmma
    (e4m3 x e4m3 -> f32), the TMA-store epilogue, and shared memory within an H100's 227 KiB."""
    from conftest import tma_loads, tma_stores
    import torch
    from test_gemm_core import compile_core
    cfg = G.fp8_config(8192, 7168, 2048, 132, torch.float32 if c == "*fp32" else torch.bfloat16)
    ptx, shared = compile_core(cfg, True, ab="*fp8e4nv", c=c, scale=scale, gk=128, gn=128, b_t=True, unit=_UNIT_FP8,
                               with_shared=True)
    assert "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3" in ptx
    assert tma_loads(ptx) and tma_stores(ptx)
    assert shared <= 232448, shared


def test_fp8_pointer_tiles_and_e5m2_compile():
    """Pointer tiles (b of any layout) and an e5m2 operand also reach fp8 wgmma."""
    from test_gemm_core import compile_core
    cfg = G.GemmConfig(128, 128, 128, 8, 8, 3)
    ptx = compile_core(cfg, False, ab="*fp8e4nv", scale=2, gk=128, gn=128)
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in ptx
    ptx = compile_core(cfg, False, ab="*fp8e5", scale=1, unit=_UNIT_FP8)
    assert ".f32.e5m2.e5m2" in ptx


def test_fp8_grouped_gemm_compiles_for_sm90a():
    from test_moe import grouped_gemm_signature
    from ditron.kernels.moe import grouped_gemm_kernel
    ck = ditron.compile(grouped_gemm_kernel, target="sm_90a", signature=grouped_gemm_signature("*fp8e4nv"),
                        constexprs=dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, EVEN_K=True, EP=64,
                                        GATHER=True, TMA=False, FP8=True, GK=128, GN=128), num_warps=8, num_stages=3)
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in ck.asm["ptx"]


# the Gluon core (kernels/gemm_hopper.py) through matmul(core="gluon"): on the simulator its tl twin -- the same
# tiles (128 x 128 x 128 by default) and K order -- with the same checks; on an sm_90 GPU the Gluon kernel.  M, N
# not multiples of the tiles, K with a tail of the 128-step; e4m3 and e5m2; coop and pingpong configs; blockwise
# (DeepSeek-V3 1 x 128 / 128 x 128: the default config, one K group per step; and 128 x 64 groups with 64-deep
# steps, two per group, two column groups per tile) against the float32 reference of the recipe.  Blockwise K step
# counts 1 to 5 cover the overlapped consumer's prologue, two-step loop and odd / even tails (kernels/gemm_hopper.py
# ``_block_mainloop``: coop and pingpong, bf16 and fp32 out, the last N tile past N), beside the serial consumer
# (``block_overlap=False``); on the GPU each is also bitwise its tl twin
GLUON_CASES = [
    (37, 40, 208, "row", "bfloat16", E4, E4, None),
    (19, 72, 144, "tensor", "float32", E4, E4, None),
    (45, 24, 96, "row", "float32", E5, E4, dict(block_m=64, block_n=128, block_k=128, stages=4, mode="pingpong")),
    (130, 136, 272, "row", "float16", E4, E4, dict(block_m=128, block_n=128, block_k=64, stages=4, mode="coop")),
    (33, 16, 128, "tensor", "bfloat16", E5, E5, dict(block_m=64, block_n=64, block_k=128, stages=3,
                                                       mode="pingpong")),
    (37, 200, 272, "block", "bfloat16", E4, E4, None),
    (45, 96, 160, "block", "float32", E4, E4, dict(block_m=64, block_n=128, block_k=64, stages=4, mode="pingpong",
                                                   scale_block=(128, 64))),
    (21, 136, 128, "block", "bfloat16", E4, E4, None),
    (70, 264, 256, "block", "bfloat16", E4, E4, dict(block_m=64, block_n=128, block_k=128, stages=4, mode="pingpong")),
    (129, 136, 528, "block", "float32", E4, E4, dict(block_m=128, block_n=128, block_k=128, stages=5, mode="coop")),
    (100, 256, 512, "block", "bfloat16", E4, E4, None),
    (100, 256, 512, "block", "bfloat16", E4, E4, dict(block_m=128, block_n=128, block_k=128, stages=6, mode="coop",
                                                      block_overlap=False)),
]


def test_matmul_fp8_gluon_core(dist_world):
    assert dist_world(1).run(B.gluon_core_recipes, GLUON_CASES) == [len(GLUON_CASES)]


def test_fp8_gluon_errors_before_launch(dist_world):
    msgs = dist_world(1).run(B.gluon_error_cases)[0]
    assert "'b' must be column-major, b = w.t()" in msgs["b_row_major"] and "strides (24, 1)" in msgs["b_row_major"]
    assert "'a' must be row-major" in msgs["a_col_major"]
    assert "scale_a has shape [7, 1]" in msgs["scale_a_shape"]
    assert "scale_b has shape [24, 1]" in msgs["scale_b_shape"]
    assert "groups of 16 along K (scale_block=(16, 128)) are not in the Gluon core" in msgs["blockwise"]
    assert "core='tl'" in msgs["blockwise"]
    assert "need block_k dividing 64" in msgs["block_k_group"] and "got block_k=128" in msgs["block_k_group"]
    assert "core='tl'" in msgs["block_k_group"]
    assert "takes a HopperGemmConfig" in msgs["tl_config"]
    assert "two 64 x 256 fp32 accumulators" in msgs["registers"]
    assert "shared memory" in msgs["smem"] and "227 KiB" in msgs["smem"]
    assert "32 <= block_k <= 128" in msgs["block_k"]
    assert "core='cutlass'" in msgs["core"]
    assert "'a' must be row-major with 16-byte aligned rows" in msgs["unaligned_k"]


def test_fp8_matmul_defaults_to_the_gluon_core_on_hopper(monkeypatch):
    """Without ``core`` or ``config``, fp8 ``matmul`` with per-tensor / per-row scales goes to the Gluon core on
    a Hopper GPU (measured faster: bench/results/h100-2026-12-07-fp8-gluon/) where its layout holds; a ``b`` the
    Gluon core cannot take (row-major) and blockwise scales stay on the tl core.  CPU tensors stand in for the
    GPU's: ``supported`` and both launches are patched (only the routing is under test)."""
    import functools
    import torch
    import ditron.kernels.gemm as G
    import ditron.kernels.gemm_hopper as H
    calls = []
    monkeypatch.setattr(H, "supported", lambda device: True)
    monkeypatch.setattr(G, "is_sim_device", lambda device: False)
    monkeypatch.setattr(H, "launch_scaled", lambda *a, **k: calls.append("gluon") or "gluon")

    class TlCore:
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append("tl")
    monkeypatch.setattr(G, "gemm_kernel", TlCore())
    M, N, K = 256, 256, 256
    a = torch.randn(M, K).to(torch.float8_e4m3fn)
    w = torch.randn(N, K).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5
    mm = functools.partial(G.matmul, num_programs=4)
    assert mm(a, w.t(), scale_a=sa, scale_b=sb) == "gluon"
    assert mm(a, w.t(), scale_a=torch.tensor(0.5), scale_b=torch.tensor(2.0)) == "gluon"
    mm(a, w.t().contiguous(), scale_a=sa, scale_b=sb)                        # b row-major: the tl core
    mm(a, w.t(), scale_a=sa, scale_b=sb, core="tl")
    mm(a, w.t(), scale_a=torch.rand(M, K // 128), scale_b=torch.rand(K // 128, N // 128))   # blockwise
    assert calls == ["gluon", "gluon", "tl", "tl", "tl"], calls
