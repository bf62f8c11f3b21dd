"""The zoo's gemm_ar (kernels/gemm_ar.py): sum over ranks of a_r @ b_r against
torch on 4 simulated ranks in CI (on GPUs under torchrun with
DITRON_TEST_BACKEND=p2p|nvshmem; see conftest.py): shapes that are not
multiples of the tile (SIM_CONFIG: 16 x 16 x 32) and M not a multiple of the
world size, fewer tiles than ranks, fp16 and bf16, per-rank K, context reuse
with a delayed rank and methods changing between calls, strided operands and
out, 1, 3 and 2 x 2 ranks, the multimem methods on the simulator and
compiled for sm_90a, auto's choice, errors before launch."""
import importlib

import pytest

import bodies_gemm_ar as B
from conftest import GPU_BACKEND
from ditron.kernels.gemm import GemmConfig

GA = importlib.import_module("ditron.kernels.gemm_ar")

ON_GPU = GPU_BACKEND != "sim"
PLAIN = ["one_shot", "two_shot"]
MULTIMEM = ["multimem_one_shot", "multimem_two_shot"]


def _same_bits(results, calls):
    counts = {r[0] for r in results}
    assert counts == {calls}, counts
    assert all(r[1] == results[0][1] for r in results), "ranks got different bits"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("method", PLAIN)
def test_methods_dtypes(dist, method, dtype):
    # 37 x 40: 3 x 3 tiles with tails, M not a multiple of 4; K = 48: a K tail
    calls = [(method, 37, 40, 48), (method, 6, 40, 64)]
    _same_bits(dist.run(B.gemm_ar_calls, dtype, calls), 2)


def test_reuse_delayed_rank_per_rank_k(dist):
    # call i: rank i % world starts late, so its peers really wait for its tiles;
    # methods change between calls on one context; M = 1: fewer tiles than ranks
    calls = [(m, M, 40, 24) for m, M in zip(PLAIN * 2 + ["one_shot"], (37, 1, 20, 37, 9))]
    _same_bits(dist.run(B.gemm_ar_calls, "bf16", calls, per_rank_k=True, seed=7, delay=0.3), 5)


@pytest.mark.parametrize("method", PLAIN)
def test_out_and_strides(dist, method):
    assert dist.run(B.gemm_ar_out_and_strides, method) == [1] * dist.world_size


@pytest.mark.parametrize("n,nnodes", [(1, 1), (3, 1), (4, 2), (8, 2)])
def test_other_worlds(dist_world, n, nnodes):
    # (4, 2): ranks on the other node get tiles by shmem.putmem_signal_block
    # (8, 2): 4 tiles for M = 19, fewer than ranks
    d = dist_world(n, nnodes)
    calls = [("one_shot", 37, 24, 40), ("two_shot", 19, 24, 40), ("two_shot", 37, 24, 40)][:2 if n == 8 else 3]
    _same_bits(d.run(B.gemm_ar_calls, "bf16", calls, per_rank_k=True, seed=3, delay=0.2 if n > 1 else 0.0),
               len(calls))


def test_multi_node_refuses_multimem(dist_world):
    msgs, auto, multicast = dist_world(4, 2).run(B.multimem_multi_node_error)[0]
    assert len(msgs) == 2 and all("needs every rank on one node" in m for m in msgs)
    assert auto == "one_shot" and not multicast


@pytest.mark.parametrize("method", MULTIMEM)
def test_multimem_on_the_simulator(dist, method):
    if ON_GPU:
        pytest.skip("NVLink multicast (NVLS) is off on the lent GPUs and must never be created; the multimem "
                    "variants are compile-verified (test_multimem_ptx) and run on the simulator")
    calls = [(method, 37, 40, 48), (method, 20, 40, 48)]
    results = dist.run(B.gemm_ar_calls, "fp16", calls, delay=0.2)
    assert {r[0] for r in results} == {2}


def _auto_expected(world_size, prefix=""):
    # two ranks: one-shot moves as many bytes as two-shot in one phase less, so it wins at every size
    if world_size <= 2:
        return [prefix + "one_shot"] * 4
    return [prefix + "one_shot", prefix + "one_shot", prefix + "two_shot", prefix + "two_shot"]


def test_auto_choice(dist):
    got = dist.run(B.auto_choices, False)[0]
    assert got == _auto_expected(dist.world_size)
    if not ON_GPU:
        got = dist.run(B.auto_choices, True)[0]
        assert got == _auto_expected(dist.world_size, "multimem_")


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_auto_choice_other_worlds(dist_world, world_size):
    got = dist_world(world_size).run(B.auto_choices, False)[0]
    assert got == _auto_expected(world_size)


def test_errors_before_launch(dist):
    msgs = dist.run(B.errors)[0]
    assert "M=9 rows, more than the context's max_m=8" in msgs["too_many_rows"]
    assert "empty operands" in msgs["no_rows"]
    assert "N=24 columns, the context was created for n=16" in msgs["wrong_n"]
    assert "torch.bfloat16, the context was created for torch.float16" in msgs["a_dtype"]
    assert "float16 or bfloat16" in msgs["a_fp32"]
    assert "'b' is torch.float32" in msgs["b_dtype"]
    assert "'b' has 16 rows" in msgs["b_rows"]
    assert "2-D" in msgs["a_1d"]
    assert "expected (5, 16)" in msgs["out_shape"]
    assert "'out' is torch.bfloat16" in msgs["out_dtype"]
    assert "unknown method 'three_shot'" in msgs["method"]
    assert "create_gemm_ar_context" in msgs["ctx"]
    assert "float16 or bfloat16" in msgs["ctx_dtype"]
    assert "max_m (0)" in msgs["ctx_size"]
    assert "must be >= 1" in msgs["ctx_programs"]


# ---------------------------------------------------------------------------
# compiled for sm_90a (no GPU needed)
# ---------------------------------------------------------------------------

_PTRS = ("a_ptr", "b_ptr", "out_ptr", "part_ptr", "red_ptr", "res_ptr")
_SIGS = ("flag_ptr", "done_ptr", "calls_ptr")


def _ptx(method, multi_node, transport, tma=False):
    import ditron
    from ditron.lowering import cuda
    k = GA.gemm_ar_kernel
    cfg = GemmConfig(64, 64, 32, num_warps=4, num_stages=2)
    constexprs = dict(METHOD=GA._METHOD_ID[method], WORLD=4, MULTI_NODE=multi_node, ELEM_BYTES=2,
                      BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                      EVEN_K=True, TMA=tma, SCALE=0, GK=1, GN=1, B_T=False)
    names = [p for p in k.arg_names if p not in constexprs]
    sig = {p: "*bf16" if p in _PTRS else "*i64" if p in _SIGS else "*fp32" if p in ("sa_ptr", "sb_ptr") else "i32"
           for p in names}
    sig.update(stride_ak="constexpr", stride_bn="constexpr", stride_cn="constexpr")
    constexprs.update(stride_ak=1, stride_bn=1, stride_cn=1)
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(sig) if p in _PTRS + _SIGS}
    with cuda.compile_variant(transport):
        return ditron.compile(k, target="sm_90a", signature=sig, constexprs=constexprs, attrs=attrs,
                              num_warps=cfg.num_warps, num_stages=cfg.num_stages).asm["ptx"]


@pytest.mark.parametrize("method", MULTIMEM)
def test_multimem_ptx(nvshmem_bc, method):
    ptx = _ptx(method, False, "nvshmem")
    assert "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.bf16x2" in ptx
    assert ("multimem.st.relaxed.sys.global.bf16x2" in ptx) == (method == "multimem_two_shot")
    assert "nvshmemx_mc_ptr" in ptx and "mma" in ptx


@pytest.mark.parametrize("method", PLAIN)
def test_plain_ptx(nvshmem_bc, method):
    # one node: peer loads/stores and release/acquire signals, no NVSHMEM;
    # two nodes: the putmem_signal path compiles too
    ptx = _ptx(method, False, "p2p")
    assert "ld.acquire.sys.global.b64" in ptx and "st.release.sys.global.b64" in ptx and "mma" in ptx
    assert "nvshmem" not in ptx
    assert "nvshmemx_putmem_signal_block" in _ptx(method, True, "nvshmem")


def test_rs_ag_copy_engine_composition(dist):
    """gemm_ar's "rs_ag": gemm_rs (copy engine) into the own rows, all_gather (copy engine) in place."""
    res = dist.run(B.rs_ag_calls)
    # the error case: M not a multiple of the world size; one rank has none, its body passes no rows instead
    want = "multiple of the world size" if dist.world_size > 1 else "empty operands"
    for calls, msgs in res:
        assert calls == 3
        assert any(want in m for m in msgs), msgs


# core="gluon": method "rs_ag" with GEMM-RS's GEMM on the Gluon Hopper core (kernels/gemm_rs_hopper.py); on the
# simulator its tl twin
@pytest.mark.parametrize("n", [1, 3])
def test_gemm_ar_gluon_core(dist_world, n):
    res = dist_world(n).run(B.rs_ag_calls, calls=2, method="auto", core="gluon")
    assert [calls for calls, _ in res] == [2] * n


def test_gemm_ar_gluon_core_on_the_job_world(dist):
    # the suite's world (4 simulated ranks; on GPUs whatever torchrun started); m = 200 rows per rank on GPUs
    m = 200 if ON_GPU else 6
    res = dist.run(B.rs_ag_calls, calls=2, m=m, method="auto", core="gluon")
    assert [calls for calls, _ in res] == [2] * dist.world_size


@pytest.mark.parametrize("nnodes", [1, 2])
def test_gemm_ar_gluon_errors_before_launch(dist, dist_world, nnodes):
    d = dist if nnodes == 1 else dist_world(4, 2)
    msgs = d.run(B.gluon_errors)[0]
    if nnodes == 2:
        assert "core='gluon' runs method='rs_ag' (the copy engine: one node); this world has 2 nodes" in \
            msgs["gluon_nodes"]
        return
    assert "core='cublas'; use one of tl, gluon" in msgs["core"]
    assert msgs["gluon_fp32"] is None           # fp8 operands writing float32 (tests/test_fp8.py)
    assert "gluon_config applies to core='gluon'" in msgs["gluon_config_tl"]
    assert "gluon_config must be a ditron.kernels.gemm_hopper.HopperGemmConfig" in msgs["gluon_config_type"]
    assert "core='gluon' runs method='rs_ag'" in msgs["gluon_method"] and "'one_shot' is the tl core's" in \
        msgs["gluon_method"]
    # fp8 operands run the Gluon core's fp8 path (tests/test_fp8.py), which takes b = w.t() (column-major)
    assert "gemm_ar: 'b' must be column-major" in msgs["gluon_fp8"] and "create_gemm_ar_context(..., core='tl')" in \
        msgs["gluon_fp8"]
    if d.world_size > 1:
        assert "multiple of the world size" in msgs["gluon_m"] and "create the context with core='tl'" in \
            msgs["gluon_m"]


def test_tma_config_compiles_for_sm90a():
    """config.tma: the GEMM programs load their operands through tensor descriptors."""
    ptx = _ptx("two_shot", False, "p2p", tma=True)
    assert "cp.async.bulk.tensor" in ptx and "mma" in ptx
