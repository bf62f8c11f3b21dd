"""The GEMM-overlap kernels at a paper shape (LLaMA3-7B, TP = the GPU job's
world size), through the shared test bodies, on GPUs only: at these sizes
the simulator would interpret millions of programs.  Run with
``DITRON_TEST_BACKEND=p2p torchrun --nproc-per-node 4 -m pytest
tests/test_gemm_paper_shapes.py`` (bench/gemm_overlap.sh does)."""
import pytest

import bodies_gemm_paper as B
from conftest import GPU_BACKEND

pytestmark = pytest.mark.skipif(GPU_BACKEND == "sim", reason="paper shapes run on GPUs (see the module docstring)")


@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_paper_shape(dist, op):
    assert dist.run(B.paper_shape, op) == [3] * dist.world_size
