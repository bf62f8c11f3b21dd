"""ditron.async_tp (issue 54): torch.compile with the pass rewrites functional all_gather -> mm into ditron.ag_gemm
and mm -> reduce_scatter into ditron.gemm_rs, forward and backward, and outputs / gradients equal those without it
(2 simulated ranks, a gloo process group inside them for torch's functional collectives); plain DTensor models
parallelised by parallelize_module get the same rewrite."""
import pytest

import bodies_async_tp as B
from conftest import GPU_BACKEND

pytestmark = pytest.mark.inductor     # torch.compile (inductor) of torch's graphs: CI's README environment only


@pytest.mark.skipif(GPU_BACKEND != "sim", reason="builds its own gloo process group inside the simulated ranks")
def test_funcol_rewritten_and_equal(dist_world, tmp_path):
    got = dist_world(2).run(B.funcol_forward_backward, str(tmp_path / "store"))
    for g in got:
        assert g["off_fwd"] == [] and g["off_train"] == []
        assert g["on_fwd"] == ["ag_gemm", "gemm_rs"], g
        # forward: one each; backward: dh = all_gather(dy) @ w2^T (ag_gemm), dx = reduce_scatter(dg @ w1^T) (gemm_rs)
        assert g["on_train"] == ["ag_gemm", "ag_gemm", "gemm_rs", "gemm_rs"], g
        assert g["global"] == ["ag_gemm", "gemm_rs"], g
        assert g["code_on"] == ["ag_gemm", "gemm_rs"] and g["code_off"] == [], g
        assert g["not_matched"] == [], g


@pytest.mark.skipif(GPU_BACKEND != "sim", reason="builds its own gloo process group inside the simulated ranks")
def test_3d_bias_subgroup_patterns(dist_world, tmp_path):
    got = dist_world(2).run(B.more_patterns, str(tmp_path / "store"))
    for r, g in enumerate(got):
        assert g["off"] == []
        assert g["fwd"] == ["ag_gemm", "gemm_rs"], g
        # backward: dh = all_gather(dy) @ w2^T (ag_gemm) and dx = reduce_scatter(dg @ w1) (gemm_rs), 3-D both
        assert g["train"] == ["ag_gemm", "ag_gemm", "gemm_rs", "gemm_rs"], g
        assert g["same_group"] == ["ag_gemm", "gemm_rs"], g
        if r == 0:
            assert g["sub"][0] == [], g
            assert any("is not the ditron world's" in m and "[0]" in m for m in g["sub"][1]), g
        assert g["bias_first"] == ["gemm_rs"], g
        assert any("before the reduce-scatter (only a bias row" in m for m in g["full_addend"]), g
        assert any("reaches no mm / addmm" in m for m in g["dim1"]), g


AG, RS, AR = ("_c10d_functional.all_gather_into_tensor", "_c10d_functional.reduce_scatter_tensor",
              "_c10d_functional.all_reduce")
AG_GEMM, GEMM_RS = "torch.ops.ditron.ag_gemm", "torch.ops.ditron.gemm_rs"


@pytest.mark.skipif(GPU_BACKEND != "sim", reason="builds its own gloo process group inside the simulated ranks")
def test_dtensor_block_sequence_parallel(dist_world, tmp_path):
    """A plain ``x + mlp(norm(x))`` block with biases, ``[S, B, H]`` activations, parallelised by
    ``parallelize_module`` (SequenceParallel norm, ColwiseParallel(input_layouts=Shard(0)),
    RowwiseParallel(output_layouts=Shard(0))), compiled fullgraph with ``ditron.async_tp.enable()``: Inductor's
    forward and backward code call ditron.ag_gemm / gemm_rs and no reduce-scatter is left (the row-parallel bias,
    DTensor's ``addmm(bias / W, ...)``, is summed by an all_reduce of its N elements); loss and gradients equal
    those without the pass and single-device torch's (checked in the body)."""
    got = dist_world(2).run(B.dtensor_tp, str(tmp_path / "store"), kind="block", bias=True)
    for g in got:
        off, on = g[False], g[True]
        assert off["codes"] == [[AG, RS], [AG, RS]] and off["log"] == [], off
        fwd, bwd = on["codes"]
        assert fwd == sorted([AG, AR, AG_GEMM, GEMM_RS]), fwd      # the gathered x is saved for dW: AG stays
        assert bwd == sorted([AG, AG_GEMM, GEMM_RS]), bwd          # all_gather(dY) stays for net2's dW
        assert on["log"] == ["ag_gemm", "ag_gemm", "gemm_rs", "gemm_rs"] and on["skipped"] == [], on


@pytest.mark.skipif(GPU_BACKEND != "sim", reason="builds its own gloo process group inside the simulated ranks")
def test_dtensor_mlp_torch_pattern(dist_world, tmp_path):
    """torch's micro-pipeline TP test's model (``net1 -> relu -> net2``, no bias, 2-D ``[T, H]`` tokens, the same
    plan): both GEMMs fused forward and backward with the pass; loss and gradients equal single-device torch's."""
    got = dist_world(2).run(B.dtensor_tp, str(tmp_path / "store"), kind="mlp", bias=False, with_off=False)
    for g in got:
        on = g[True]
        assert on["codes"] == [sorted([AG, AG_GEMM, GEMM_RS])] * 2, on
        assert on["log"] == ["ag_gemm", "ag_gemm", "gemm_rs", "gemm_rs"] and on["skipped"] == [], on
