"""dl.simt_exec_region on the simulator (issue 56): the region's body runs in every simulated thread with its
own thread_idx, as on a GPU; a top-level syncthreads splits it (every thread's code before the barrier runs
before any thread's code after it).  Before, the simulator refused the region."""
import numpy as np
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


@pytest.mark.parametrize("n", [1, 2])
def test_warp_collective_call_then_lane_code(dist_world, n):
    # each lane of warp 1 reads the peer's buffer back right after the (blocking) warp put: the lanes meet at the
    # call, so every lane reads the delivered data (before lockstep lanes, the simulator refused the read after
    # the call in the same branch)
    assert dist_world(n).run(B.warp_put, "after") == [(True, 32)] * n


@sim_only
@pytest.mark.parametrize("mode,message", [
    ("divergent", "shmem.putmem_nbi_warp is warp-collective, but in warp 1 only lanes 0-7 reached it, lanes 8-31 "
                  "did not (lanes 8-31 left the region without making it)"),
    ("args", "shmem.putmem_warp is warp-collective, but lane 1 of warp 1 calls it with other arguments than lane 0"),
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


def test_shfl_down_reads_a_higher_lane(dist_world):
    # lane i reads lane i + 1 (lane 31: its own value, outside the warp); before lockstep lanes: refused ("lane 0
    # of warp 0 reads lane 1's value, which the simulator has not computed yet")
    src, out = dist_world(1).run(B.warp_scan, "down")[0]
    assert out[:32].tolist() == [5 * (i + 1) for i in range(31)] + [155]


def _scan_ref(vals, n):
    vals = vals.copy()
    vals[n:] = 0
    return np.cumsum(vals)


@pytest.mark.parametrize("n,lanes", [(1, 32), (2, 32), (1, 7)])
def test_warp_prefix_sum_then_broadcast_from_the_last_lane(dist_world, n, lanes):
    # Triton-distributed's single_block_prefix_sum_kernel_scan_scan: a warp prefix sum (shfl.up), then
    # __shfl_sync(mask, inclusive, lanes - 1) gives every lane the last lane's total; and shfl.idx from lane
    # 31 - lane reverses the warp
    for src, out in dist_world(n).run(B.lockstep, "scan_bcast", lanes):
        for w in range(2):
            vals = src[32 * w:32 * w + 32]
            inc = _scan_ref(vals, lanes)
            sl = slice(32 * w, 32 * w + 32)
            assert out[0, sl][:lanes].tolist() == inc[:lanes].tolist(), w
            assert out[1, sl].tolist() == [int(inc[lanes - 1])] * 32, w
            assert out[2, sl].tolist() == vals[::-1].tolist(), w


@pytest.mark.parametrize("n", [1, 3])
def test_shfl_down_and_xor_reductions(dist_world, n):
    for src, out in dist_world(n).run(B.lockstep, "reduce"):
        for w in range(2):
            x = src[32 * w:32 * w + 32].astype(np.int64)
            for off in (16, 8, 4, 2, 1):                    # shfl.down: a source past lane 31 reads its own value
                x = x + np.where(np.arange(32) + off < 32, np.roll(x, -off), x)
            assert out[0, 32 * w:32 * w + 32].tolist() == x.tolist(), w
            assert out[0, 32 * w] == src[32 * w:32 * w + 32].sum()
            assert out[1, 32 * w:32 * w + 32].tolist() == [int(src[32 * w:32 * w + 32].sum())] * 32, w


def _bits(pred):
    return int(sum(1 << i for i, p in enumerate(pred) if p))


def _i32(u):
    return u - (1 << 32) if u >= 1 << 31 else u


def test_ballot_in_a_thread_branch(dist_world):
    # a full-warp ballot inside a branch on the thread id, and two half-warp ballots with their own masks (one in
    # each arm of a branch on the lane): the lanes of each mask vote together
    src, out = dist_world(1).run(B.lockstep, "ballot")[0]
    for w in range(2):
        vals = src[32 * w:32 * w + 32]
        full = _i32(_bits(vals % 3 == 0))
        low = _bits(vals % 2 == 0) & 0xFFFF
        high = _bits(vals > 50) & 0xFFFF0000
        assert out[0, 32 * w:32 * w + 32].tolist() == [full] * 32, w
        assert out[1, 32 * w:32 * w + 32].tolist() == [low] * 16 + [_i32(high)] * 16, w


def test_a_lane_spins_on_a_flag_another_lane_sets(dist_world):
    # lane 0 polls a flag that lane 5 sets after the shuffle: the spinning lane lends its turn to its warp's
    # other lanes, as independent thread scheduling does on Volta and later GPUs
    # (a dl.ld loop, and shmem.signal_wait_until)
    assert dist_world(1).run(B.lane_flag) == [(131, 131)]


@sim_only
@pytest.mark.parametrize("mode,message", [
    ("outside_mask", "dl.shfl_down_sync: lane 15 of warp 0 reads lane 16, which its mask 0x0000ffff does not name"),
    ("divergent", "dl.shfl_up_sync is warp-collective, but in warp 0 only lanes 0-15 reached it, lanes 16-31 did "
                  "not (lanes 16-31 left the region without making it)"),
    ("mismatched", "dl.shfl_up_sync is warp-collective, but in warp 0 only lanes 0-15 reached it, lanes 16-31 did "
                   "not (lanes 16-31 wait at dl.ballot_sync at bodies_sim_simt.py:"),
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


@sim_only
def test_a_per_thread_store_past_a_tensor_is_reported(dist_world):
    # dl.st writes raw addresses; before, a store past the end of an argument silently wrote whatever memory
    # followed it (on the simulator: the host's heap -- Triton-distributed's prefix sum with MAJOR_ALIGN > 1 crashed
    # its rank with "malloc_consolidate(): invalid chunk size")
    from ditron.errors import DitronRankError
    with pytest.raises(DitronRankError) as info:
        dist_world(1).run(B.past_the_end)
    text = str(info.value) + (info.value.traceback_text or "")
    assert "dl.st writes element 4 of argument 'out_ptr', past its end (4 elements)" in text, text
