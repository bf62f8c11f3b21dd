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


def test_helper_condition_and_kept_values(dist_world):
    # issue 56 item 2 (Triton-distributed's push all-reduces hung at 4 ranks): `if _leader():` on a helper's
    # per-thread result ran in every thread (each program arrived 128 times at the grid barrier), and a value a
    # thread assigned in one region was the last thread's in the next; six barriers flip the top bit six times
    count, totals, kept = dist_world(1).run(B.grid_sync)[0]
    assert count == 0 and totals == [4 * (s + 1) for _ in range(4) for s in range(3)]
    assert kept == [0, 10, 20, 30, 7, 7, 7, 7]


# ---------------------------------------------------------------------------
# warp-collective SHMEM calls in a per-thread branch (issue 56: _forward_push_2d_ll_kernel's putmem_nbi_warp)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3])
def test_warp_collective_call_in_a_warp_uniform_branch(dist_world, n):
    # warps 1 and 2 of 4 each put one segment and add 1 to the peer's signal: once per warp (2), not per lane
    assert dist_world(n).run(B.warp_put, "uniform") == [(True, 2)] * n


sim_only = pytest.mark.skipif(__import__("os").environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                              reason="what the simulator refuses (a GPU hangs or computes garbage)")


@sim_only
@pytest.mark.parametrize("mode,message", [
    ("divergent", "shmem.putmem_nbi_warp is warp-collective, but in warp 1 only lanes 0-7 reached it, lanes 8-31 "
                  "did not"),
    ("args", "shmem.putmem_warp is warp-collective, but lane 1 of warp 1 calls it with other arguments than lane 0"),
    ("after", "`dl.st(sig_ptr, 1)` follows the warp-collective `putmem_warp`"),
])
def test_warp_collective_calls_the_simulator_refuses(dist_world, mode, message):
    from ditron.errors import DitronRankError
    with pytest.raises(DitronRankError) as info:
        dist_world(2).run(B.warp_put, mode)
    text = str(info.value) + (info.value.traceback_text or "")
    assert message in text, text


# ---------------------------------------------------------------------------
# shuffles on per-lane values in a branch on the thread id, and per-thread values passed to a helper outside any
# branch (issue 56 item 1: Triton-distributed's all_to_all_vdev_2d_offset.py; both were refused before)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n,lanes", [(1, 32), (3, 32), (2, 5)])
def test_warp_shuffle_in_a_thread_branch(dist_world, n, lanes):
    import torch
    for rank, (src, out) in enumerate(dist_world(n).run(B.warp_scan, "ok", lanes)):
        for w in range(2):
            vals = src[w * 32:w * 32 + 32].clone()
            vals[lanes:] = 0
            inc, step = vals.clone(), 1                   # the scan's steps on the host, on all 32 lanes
            while step < lanes:
                inc[step:] = inc[step:] + inc[:-step].clone()
                step *= 2
            assert inc[:lanes].tolist() == torch.cumsum(vals, 0)[:lanes].tolist()
            assert out[w * 32:w * 32 + lanes].tolist() == (inc - vals)[:lanes].tolist(), (rank, w)
            assert out[w * 32 + lanes:w * 32 + 32].tolist() == [-1] * (32 - lanes)
            assert out[64 + w].item() == inc[31].item()          # lane 31's sum (the warp's total when 32)
        assert out[66:98].tolist() == [3] * 32                    # lane 0's value, broadcast to warp 1


@sim_only
@pytest.mark.parametrize("mode,message", [
    ("down", "lane 0 of warp 0 reads lane 1's value, which the simulator has not computed yet"),
    ("divergent", "dl.shfl_up_sync is warp-collective, but in warp 0 only lanes 0-15 reached it, lanes 16-31 did "
                  "not"),
])
def test_warp_shuffles_the_simulator_refuses(dist_world, mode, message):
    from ditron.errors import DitronRankError
    with pytest.raises(DitronRankError) as info:
        dist_world(1).run(B.warp_scan, mode)
    text = str(info.value) + (info.value.traceback_text or "")
    assert message in text, text


@pytest.mark.parametrize("enabled", [True, False])
def test_per_thread_value_into_a_helper(dist_world, enabled):
    # create() runs in every thread (its scalar store: thread 0's), each thread keeps its own aggregate, and only
    # thread 33 (is_leader) records; 64 threads add 1 after it
    buf, count = dist_world(1).run(B.tracer, enabled)[0]
    assert count == 64
    assert buf == ([100, 5, 7, 0] if enabled else [0, 0, 0, 0])
