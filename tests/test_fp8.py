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
    """Simulator: an fp8 tl.dot that keeps the whole K loop in sm_90's reduced-precision accumulator (Triton's
    default) is refused; with max_num_imprecise_acc <= 128 it runs and gives the exact products' fp32 sum.  GPU
    (the analogue: nothing there refuses): both run, and the promoted one is within the tensor core's
    accumulation bound (bodies_fp8.GPU_FP8_ACCUMULATION) of the exact product."""
    msgs = dist_world(1).run(B.fp8_accumulation)[0]
    if ON_GPU:
        assert msgs["default"] is None, msgs["default"]
    else:
        assert msgs["default"] is not None and "cannot model this fp8 tl.dot" in msgs["default"]
        assert "max_num_imprecise_acc" in msgs["default"]
    assert msgs["promoted"] is None, msgs["promoted"]


def _scaled_case(M, N, K, recipe, seed):
    """Operands, the product magnitudes S and the block of the blockwise scales of one fp8 case (CPU)."""
    block = (128, 128) if recipe == "block" else None
    a, b, sa, sb, _ = B.operands(M, N, K, recipe, seed)
    return a, b, sa, sb, B.product_magnitudes(a, b, sa, sb, block), block


def _h100_result(a, b, sa, sb, block):
    """float64 result of the H100 accumulation model (bodies_fp8.h100_fp8_dot) with the kernels' scaling."""
    parts = B.h100_fp8_dot(a, b)
    if block is None:
        return sum(parts) * sa.double() * sb.double()
    N = b.shape[1]
    return sum(p * sa[:, g].double()[:, None] * sb[g].double().repeat_interleave(block[1])[:N]
               for g, p in enumerate(parts))


class _OnCuda:
    """A CPU tensor that reads as a GPU result to ``bodies_fp8.check`` (its device test only)."""

    def __init__(self, t):
        import torch
        self.t, self.device = t, torch.device("cuda")

    def detach(self):
        return self.t


@pytest.mark.parametrize("M,N,K,recipe,out", [(37, 45, 70, "tensor", "bfloat16"), (37, 40, 208, "row", "bfloat16"),
                                              (128, 200, 320, "row", "bfloat16"), (72, 136, 320, "block", "bfloat16"),
                                              (33, 20, 260, "block", "float32"), (19, 72, 144, "tensor", "float32")])
def test_gpu_bound_takes_the_tensor_core_and_catches_bugs(M, N, K, recipe, out):
    """The GPU bound of bodies_fp8.check on CPU: a model of Hopper's fp8 accumulation (13 fraction bits per
    group of 32 products, promoted every 128) passes with room to spare on shapes of this file; a wrong scale
    (one row's, or one K group's), a missing K step (the last 128-deep step, or the K tail), or a transposed
    output tile -- each fed as the GPU's result -- fail it; and the simulator's check stays one ulp strict (the
    model's result fails it where it rounds differently)."""
    import torch
    out_dtype = getattr(torch, out)
    a, b, sa, sb, S, block = _scaled_case(M, N, K, recipe, 7)
    exact = (B.blockwise_reference(a, b, sa, sb) if block else B.exact_scaled_mm(a, b, sa, sb, torch.float32)).double()
    want = exact.float().to(out_dtype) if out_dtype != torch.float32 else exact.float()
    model = _h100_result(a, b, sa, sb, block)
    ratio = ((model - exact).abs() / (S * 2.0 ** -13)).max().item()
    assert ratio < 1.6, ratio                               # the bound (2 * 2^-13) has >= 25% to spare
    B.check(_OnCuda(model.float().to(out_dtype)), want, out_dtype, "H100 model", S)
    with pytest.raises(AssertionError, match="beyond the bound"):      # the simulator would hide nothing
        B.check(_OnCuda(model.float().to(out_dtype)), want, out_dtype, "H100 model", S / 64)

    def fails(got, what):
        with pytest.raises(AssertionError, match="beyond the bound") as e:
            B.check(_OnCuda(got.float().to(out_dtype)), want, out_dtype, what, S)
        return str(e.value)
    ka = a.double()
    if block:
        sa2 = sa.clone()
        sa2[3, -1] *= 1.02                                  # one row's scale of the last K group, 2% off
        fails(B.blockwise_reference(a, b, sa2, sb), "one group's scale")
        fails(B.blockwise_reference(a[:, :-(K % 128 or 128)], b[:-(K % 128 or 128)], sa, sb), "a missing K step")
    else:
        sa2 = sa.clone() if sa.numel() > 1 else sa.expand(M, 1).clone()
        sa2[3] *= 1.02
        fails(B.exact_scaled_mm(a, b, sa2, sb, torch.float32), "one row's scale")
        keep = (K - 1) // 128 * 128 if K > 128 else K - 16       # the last step, or the K tail of a single step
        fails((ka[:, :keep] @ b[:keep].double()) * sa.double() * sb.double(), "a missing K step")
    t = exact.clone()
    t[:16, :16] = exact[:16, :16].t()
    fails(t, "a transposed 16 x 16 tile")
    if out_dtype != torch.float32:                          # the simulator's check: one ulp, <= 2% differ
        with pytest.raises(AssertionError):
            B.check(model.float().to(out_dtype) + 0 * want, want, out_dtype, "the model on the simulator's check")


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
    assert "three 64 x 256 fp32 accumulators" in msgs["registers"]     # the overlapped promotion (default)
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


# ---------------------------------------------------------------------------
# the overlap ops on the Gluon core (core="gluon"; kernels/ag_gemm_hopper.py, kernels/gemm_rs_hopper.py): on the
# simulator the tl twin, whose results must equal a core="tl" context's bit for bit; on an sm_90 GPU (torchrun,
# DITRON_TEST_BACKEND=p2p) the Gluon kernels, against the same references and bit for bit against the tl core on
# the Gluon config's twin (gemm_hopper.twin_config).  The Gluon path's checks run on every device, so the shapes
# are ones it takes: b = w.t(), K a multiple of 16, the output rows 16-byte aligned, AG-GEMM's m a multiple of
# the config's block_m (a 64-row ping-pong config on the simulator; the default 128 x 128 x 128 on GPUs)
# ---------------------------------------------------------------------------

from conftest import GPU_BACKEND  # noqa: E402

ON_GPU = GPU_BACKEND != "sim"
PP64 = dict(block_m=64, block_n=128, block_k=128, stages=4, mode="pingpong")
if ON_GPU:
    GLUON_AG = [(128, 200, 320, "row", "bfloat16"), (256, 136, 320, "block", "bfloat16"),
                (128, 264, 320, "tensor", "bfloat16"), (128, 200, 320, "block", "bfloat16")]
    GLUON_RS = [(200, 264, 384, "row", "bfloat16"), (72, 136, 320, "block", "bfloat16"),
                (128, 264, 384, "tensor", "bfloat16", True), (200, 260, 320, "block", "float32")]
    GLUON_AR = [(400, 264, 384, "row", "bfloat16"), (144, 136, 320, "block", "float32")]
else:
    GLUON_AG = [(64, 24, 160, "tensor", "bfloat16"), (64, 40, 160, "row", "bfloat16"),
                (64, 16, 160, "block", "bfloat16")]
    GLUON_RS = [(5, 24, 160, "tensor", "bfloat16"), (3, 16, 160, "block", "bfloat16"),
                (4, 24, 64, "row", "bfloat16", True), (3, 20, 160, "block", "float32")]
    GLUON_AR = [(6, 24, 160, "row", "bfloat16"), (6, 20, 160, "block", "float32")]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_ag_gemm_fp8_gluon_core(dist_world, n):
    # the scales travel with the rows through the Gluon consumer's copy-engine protocol; one context, calls of
    # every recipe on it (the previous call's scales must not leak).  Simulator, 1 rank: the default config
    # (128-row tiles: m = 128)
    cases, cfg = (GLUON_AG if n <= 2 else GLUON_AG[::2]), None if ON_GPU else PP64
    if not ON_GPU and n == 1:
        cases, cfg = [(128, 16, 160, "row", "bfloat16"), (128, 24, 160, "block", "bfloat16")], None
    assert dist_world(n).run(B.gluon_ag_gemm_fp8, cases, cfg) == [len(cases)] * n


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_gemm_rs_fp8_gluon_core(dist_world, n):
    cases = GLUON_RS if n <= 2 else GLUON_RS[1::2]
    assert dist_world(n).run(B.gluon_gemm_rs_fp8, cases) == [len(cases)] * n


@pytest.mark.parametrize("n", [2, 3])
def test_gemm_ar_fp8_gluon_core(dist_world, n):
    cases = GLUON_AR if n == 2 else GLUON_AR[1:]
    assert dist_world(n).run(B.gluon_gemm_ar_fp8, cases) == [len(cases)] * n


def test_fp8_gluon_overlap_errors_before_launch(dist_world):
    msgs = dist_world(2).run(B.gluon_overlap_error_cases)[0]
    tl_ag, tl_rs = "create_ag_gemm_context(..., core='tl')", "create_gemm_rs_context(..., core='tl')"
    assert "m=5 rows per rank to be a multiple of the Gluon config's block_m=128" in msgs["ag_m"] and \
        tl_ag in msgs["ag_m"]
    assert "'b' must be column-major, b = w.t()" in msgs["ag_b_row_major"] and tl_ag in msgs["ag_b_row_major"]
    assert "'a' must be row-major with 16-byte aligned rows" in msgs["ag_k"] and "K=72" in msgs["ag_k"]
    assert "groups of 16 along K" in msgs["ag_groups"] and tl_ag in msgs["ag_groups"]
    assert "N=20 rows of torch.bfloat16 are not 16-byte aligned" in msgs["ag_n"] and tl_ag in msgs["ag_n"]
    assert "two 64 x 256 fp32 accumulators" in msgs["ag_config"]
    assert "'b' must be column-major" in msgs["rs_b_row_major"] and tl_rs in msgs["rs_b_row_major"]
    assert "N=20 rows of torch.bfloat16 are not 16-byte aligned" in msgs["rs_n"] and tl_rs in msgs["rs_n"]
    # scale_block (64, 128): the default config's block_k is 64 (it runs); a given 128-deep config does not divide
    assert msgs["rs_block_k"] is None
    assert "need block_k dividing 64" in msgs["rs_block_k_cfg"] and tl_rs in msgs["rs_block_k_cfg"]
    assert "gluon_config fits fp8 operands only" in msgs["rs_fp8_only_cfg"] and "shared memory" in \
        msgs["rs_fp8_only_cfg"]
    assert "the context was created for torch.float32" in msgs["rs_fp32_bf16"]
    assert "shared memory (4 stages of 128x128 + 128x256" in msgs["rs_cfg_neither"]     # the 16-bit reason
    assert "'b' must be column-major" in msgs["ar_b_row_major"] and "core='tl'" in msgs["ar_b_row_major"]


def test_fp8_gluon_overlap_plans_refuse_other_gpus():
    """On a GPU world (not the simulator) the plans of the fp8 Gluon paths refuse a device that is not a Hopper
    one, naming the tl context (CPU tensors stand in: ``supported`` is False for them)."""
    import types
    import torch
    from ditron.kernels import ag_gemm_hopper as AH, gemm_rs_hopper as RH
    a, b, sa, sb, _ = B.operands(128, 24, 160, "row", 1)
    ctx = types.SimpleNamespace(sim=False, out_dtype=torch.bfloat16, dtype=torch.bfloat16, gluon_config=None,
                                gluon_fp8_config=None, scale_block=(128, 128))
    out = torch.empty(256, 24, dtype=torch.bfloat16)
    with pytest.raises(ditron.DitronError, match=r"runs on Hopper \(sm_90\) GPUs only, not on cpu.*core='tl'"):
        AH.plan_fp8(ctx, a, b, out, 128, 160, 24, sa, sb)
    with pytest.raises(ditron.DitronError, match=r"runs on Hopper \(sm_90\) GPUs only, not on cpu.*core='tl'"):
        RH.plan_fp8(ctx, a, b, 128, 160, 24, sa, sb, (128, 128))


@pytest.mark.parametrize("op,scales,out,b_dtype", [("ag", "row", "bfloat16", E4), ("ag", "block", "float32", E4),
                                                   ("rs", "tensor", "bfloat16", E5), ("rs", "block", "float32", E4)])
def test_fp8_gluon_overlap_kernels_compile_for_sm90a(op, scales, out, b_dtype):
    """The fp8 Gluon kernels of AG-GEMM and GEMM-RS compile for sm_90a without a GPU (Triton 3.6 and 3.9): the
    warp-specialised core's fp8 wgmma on K-major tiles (e4m3 / e5m2), shared memory within an H100's 227 KiB;
    AG-GEMM: the producer's per-thread acquire poll of ready[s], the proxy fence before its TMA loads, the
    release of the peers' slots; GEMM-RS: each block's full completion wait of its TMA stores, the async-proxy
    fence, the partition barrier, the acq_rel count and the release of done[s]; neither has a program-wide
    barrier or a dl.wait / dl.notify inside the partitions."""
    import re
    import torch
    from conftest import code_lines
    from ditron.kernels import ag_gemm_hopper as AH, gemm_rs_hopper as RH
    out_dtype = getattr(torch, out)
    if op == "ag":
        ck = AH.compile_sm90(dtype=torch.float8_e4m3fn, scales=scales, out_dtype=out_dtype)
    else:
        ck = RH.compile_sm90(dtype=getattr(torch, b_dtype), scales=scales, out_dtype=out_dtype)
    ptx, ir = ck.asm["ptx"], ck.asm["dist_ir"]
    kind = "e4m3" if b_dtype == E4 else "e5m2"
    assert f"wgmma.mma_async.sync.aligned.m64n128k32.f32.{kind}.{kind}" in ptx and "setmaxnreg" in ptx
    assert ck.metadata.shared <= 232448, ck.metadata.shared
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx                        # the TMA-store epilogue
    assert not re.search(r"bar\.sync\s+0;", ptx)                                       # no program-wide barrier
    assert "dist.wait(" not in ir and "dist.notify(" not in ir
    if op == "ag":
        assert "ld.acquire.sys" in ptx and "fence.proxy.async.global" in ptx and "st.release.sys" in ptx
    else:
        lines = code_lines(ptx)
        kinds = [ln.split()[1] if ln.startswith("@") else ln.split()[0] for ln in lines
                 if re.match(r"(cp\.async\.bulk\.wait_group 0;|fence\.proxy\.async\.global;|bar\.sync\s+\d+, 128;"
                             r"|@%p\d+ atom\.global\.sys\.(acq_rel\.add|release\.exch))", ln)]
        pubs = [k for k, x in enumerate(kinds) if x == "cp.async.bulk.wait_group"]
        assert len(pubs) >= 3, kinds
        for k in pubs:
            rest = kinds[k:]
            assert rest[1] == "fence.proxy.async.global;" and rest[2] == "bar.sync", rest[:6]
            assert "atom.global.sys.release.exch.b64" in rest[rest.index("atom.global.sys.acq_rel.add.u32"):]


def _emulate_scaled_ws(named, a, b, M, N, K):
    """What ``gemm_hopper.ws_scaled_gemm_body`` computes from its scale arguments (``named``: a launch's
    arguments by name), in float64: the per-row / per-column epilogue or the blockwise per-K-group scales, read
    through the pointers and element strides the launch passed."""
    import torch
    sa, sb = named["sa_ptr"], named["sb_ptr"]
    ssam, ssak, ssbk, ssbn = (int(named[k]) for k in ("stride_sam", "stride_sak", "stride_sbk", "stride_sbn"))
    prod = a.double() @ b.double()
    if named["BLOCKWISE"]:
        gk, gn = named["GK"], named["GN"]
        nk, nn = -(-K // gk), -(-N // gn)
        sav = sa.as_strided((M, nk), (ssam, ssak)).double()
        sbv = sb.as_strided((nk, nn), (ssbk, ssbn)).double().repeat_interleave(gn, dim=1)[:, :N]
        out = torch.zeros(M, N, dtype=torch.float64)
        for g in range(nk):
            out += (a[:, g * gk:(g + 1) * gk].double() @ b[g * gk:(g + 1) * gk].double()) * sav[:, g:g + 1] * sbv[g]
        return out
    row = sa.as_strided((M, 1), (ssam, 0)).double() if named["SA_ROW"] else sa.reshape(-1)[0].double()
    col = sb.as_strided((1, N), (0, ssbn)).double() if named["SB_COL"] else sb.reshape(-1)[0].double()
    return prod * row * col


class _Recorder:
    """Stands in for a Gluon kernel: records a launch's arguments by name."""

    def __init__(self, kernel):
        self.names = kernel.arg_names
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            named = dict(zip(self.names, args), **kw)
            assert set(self.names) <= set(named), sorted(set(self.names) - set(named))
            self.launches.append(named)
        return launch


@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_fp8_gluon_overlap_launch_arguments(monkeypatch, recipe):
    """The host side of the fp8 Gluon paths on a GPU (planned, then launched), on CPU tensors with the kernels
    replaced by recorders (one rank): every parameter is passed, and the scale pointers, strides and constexprs
    they get make the core compute the recipe -- emulated from the recorded arguments -- for AG-GEMM (the shard's
    scales copied into its rows of the gathered scales) and GEMM-RS."""
    import types
    import torch
    from ditron.kernels import ag_gemm_hopper as AH, gemm_hopper as H, gemm_rs_hopper as RH
    monkeypatch.setattr(H, "supported", lambda device: True)
    rec_ag, rec_rs = _Recorder(AH.ag_gemm_ws_scaled_kernel), _Recorder(RH.gemm_rs_ws_scaled_kernel)
    monkeypatch.setattr(AH, "ag_gemm_ws_scaled_kernel", rec_ag)
    monkeypatch.setattr(RH, "gemm_rs_ws_scaled_kernel", rec_rs)
    m, N, K = 128, 40, 288
    a, b, sa, sb, ref = B.operands(m, N, K, recipe, 5)
    if ref is None:
        ref = B.exact_scaled_mm(a, b, sa, sb, torch.float32)
    sk = -(-K // 128)
    ctx = types.SimpleNamespace(sim=False, out_dtype=torch.bfloat16, dtype=torch.bfloat16, gluon_config=None,
                                gluon_fp8_config=None, scale_block=(128, 128), world_size=1, rank=0, slot_rows=m,
                                num_programs=2, sbuf=torch.full((1, 1, m * sk), float("nan")),
                                buf=torch.zeros(1, 1, m * K, dtype=a.dtype), ready=torch.zeros(1, dtype=torch.int64),
                                free=torch.ones(1, dtype=torch.int64), calls=torch.zeros(2, dtype=torch.int64),
                                seg_count=torch.zeros(1, dtype=torch.int32), done=torch.zeros(1, dtype=torch.int64),
                                gcalls=torch.zeros(2, dtype=torch.int64), cbuf=torch.zeros(1, m * N),
                                _gluon_descs={})
    out = torch.empty(m, N, dtype=torch.bfloat16)
    AH.launch_fp8(ctx, AH.plan_fp8(ctx, a, b, out, m, K, N, sa, sb), a, b, out, sa, sb, m, K)
    ctx.cbuf = ctx.cbuf.to(torch.bfloat16)
    RH.launch_fp8(ctx, RH.plan_fp8(ctx, a, b, m, K, N, sa, sb, (128, 128)), a, b, sa, sb, m, N)
    for rec in (rec_ag, rec_rs):
        named = rec.launches[0]
        assert named["PROMOTE"] == 128 and named["BLOCKWISE"] == (recipe == "block")
        got = _emulate_scaled_ws(named, a, b, m, N, K).float()
        torch.testing.assert_close(got, ref.float(), rtol=1e-6, atol=1e-6 * ref.abs().max().item())
    assert rec_ag.launches[0]["m_local"] == m and rec_ag.launches[0]["slot_rows"] == m
    assert rec_ag.launches[0]["SA_ROW"]                      # per row in AG-GEMM: each shard's rows keep their scale
    assert rec_rs.launches[0]["M"] == m
