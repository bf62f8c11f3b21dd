"""Training with ditron (issue 54): the backward passes of ``torch.ops.ditron.*`` and of the ``ditron.nn``
layers against plain torch autograd on the whole data, on 1 to 4 simulated ranks (CI) or the torchrun world on
GPUs (DITRON_TEST_BACKEND=p2p|nvshmem, see conftest.py)."""
import pytest

import bodies_train as B

GEMM_OPS = ["ag_gemm", "gemm_ar", "gemm_rs"]
COLLECTIVES = ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ops_backward_match_torch(dist_world, n):
    assert dist_world(n).run(B.ops_backward_match_torch, "bf16") == [sorted(COLLECTIVES + GEMM_OPS)] * n


def test_collectives_backward_fp32(dist_world):
    assert dist_world(2).run(B.ops_backward_match_torch, "fp32") == [COLLECTIVES] * 2
