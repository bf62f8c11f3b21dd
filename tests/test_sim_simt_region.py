"""dl.simt_exec_region on the simulator (issue 56): the region's body runs in every simulated thread with its
own thread_idx, as on a GPU; a top-level syncthreads splits it (every thread's code before the barrier runs
before any thread's code after it).  Before, the simulator refused the region."""
import pytest

import bodies_sim_simt as B


@pytest.mark.parametrize("n", [1, 2, 3])
def test_simt_region_runs_per_thread(dist_world, n):
    # num_warps=2: 64 threads; 64 adds; the odd threads' indices sum to 32 * 32 = 1024; thread 0 reads 64 after
    # the barrier; the last thread stores block_size
    assert dist_world(n).run(B.simt_barrier) == [[[0, 64, 1024, 64, 64]] * 2] * n
