"""ditron.async_tp (issue 54): torch.compile with the pass rewrites functional all_gather -> mm into ditron.ag_gemm
and mm -> reduce_scatter into ditron.gemm_rs, forward and backward, and outputs / gradients equal those without it
(2 simulated ranks, a gloo process group inside them for torch's functional collectives)."""
import pytest

import bodies_async_tp as B
from conftest import GPU_BACKEND


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
        assert any("adds a bias before the reduce-scatter" in m for m in g["bias_first"]), g
        assert any("reaches no mm / addmm" in m for m in g["dim1"]), g
