"""Megakernels on simulated ranks (GPU ranks under torchrun): small task
graphs and communication tasks checked against torch over repeated steps, and
a planted missing release reported by the deadlock watchdog."""
import os
import time

import pytest

import bodies_mistakes as BM
import bodies_task as B
from ditron.errors import DitronHangError


@pytest.mark.parametrize("n,scheduler", [(1, "round_robin"), (2, "zigzag"), (3, "dynamic")])
def test_chain_graph_matches_torch(dist_world, n, scheduler):
    assert dist_world(n).run(B.run_chain, scheduler, 3, 3) == [5] * n


@pytest.mark.parametrize("n,scheduler", [(1, "round_robin"), (2, "dynamic")])
def test_traced_megakernel_with_prefetch_hooks(dist_world, n, scheduler):
    assert all(us > 0 for us in dist_world(n).run(B.run_chain_traced, scheduler))


@pytest.mark.parametrize("n,scheduler", [(2, "round_robin"), (3, "dynamic"), (1, "zigzag")])
def test_comm_tasks_match_torch(dist_world, n, scheduler):
    assert dist_world(n).run(B.comm_graph_run, scheduler) == [6] * n


def test_comm_tasks_with_a_late_rank(dist_world):
    """One rank allocates its staging late: compile() must not let the others signal into it first."""
    assert dist_world(2).run(B.comm_graph_run, "round_robin", steps=1, stagger=1.0) == [6, 6]


@pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator deadlock report")
def test_planted_missing_release_is_reported():
    from ditron.sim.pool import SimCluster
    with SimCluster(2, hang_timeout=1.5) as cluster:
        t = time.monotonic()
        with pytest.raises(DitronHangError) as info:
            cluster.run(B.planted_missing_release, "b", 2)
        assert time.monotonic() - t < 1.5 + 10
        entries = [e for e in info.value.report if e.get("task") == "b"]
        assert {e["rank"] for e in entries} == {0, 1}
        for e in entries:
            assert e["primitive"] == "dl.wait_deps" and e["tile"] == 2 and e["slot"] == 5 + 2
            assert (e["waiting_task"], e["waiting_tile"]) == ("c", 1)   # c tile 1 needs b tiles [1, 3)
            assert "scoreboard slot 7 = task 'b' tile 2" in e["signal"]
            assert e["expected"] == ">= 1" and e["observed"] == 0
        assert "megakernel 'chain'" in str(info.value)


@pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator race finder")
def test_race_finder_sees_scoreboard_edges():
    """wait_deps / release_tile are acquire / release edges: a complete
    dependency range is race-free, a too-narrow one (b reads two of a's tiles
    but waits on one) is a reported data race -- the static check works per
    task and cannot see it.  The comm tasks run clean."""
    from ditron.errors import DitronRankError
    from ditron.sim.pool import SimCluster
    with SimCluster(2, race=True, hang_timeout=10) as cluster:
        cluster.run(B.narrow_range_dep, True)
        cluster.run(B.comm_graph_run, "dynamic", steps=2)
        with pytest.raises(DitronRankError) as info:        # the race finder alone (access check off) ...
            cluster.run(BM.without_taskcheck, B.narrow_range_dep, False)
        text = info.value.traceback_text
        assert "data race on symmetric tensor 't'" in text and "narrow_megakernel" in text
        with pytest.raises(DitronRankError) as info:        # ... and the megakernel access check (default)
            cluster.run(B.narrow_range_dep, False)
        assert "the Dep of 'b' on 'a' covers tiles [" in info.value.traceback_text
        # ordinary (non-symmetric) tensors shared by the programs of the launch: the race finder sees them too
        cluster.run(BM.without_taskcheck, BM.megakernel_mistake, None)
        with pytest.raises(DitronRankError) as info:
            cluster.run(BM.without_taskcheck, BM.megakernel_mistake, "narrow")
        assert "data race on tensor argument 't1_out' (not symmetric), element" in info.value.traceback_text


@pytest.mark.parametrize("scheduler", ["round_robin", "dynamic"])
def test_cuda_graph_replay(_gpu_dist, scheduler):
    """GPUs only (torchrun, DITRON_TEST_BACKEND=p2p|nvshmem): one captured step replayed with new inputs."""
    _gpu_dist.run(B.cuda_graph_replay, scheduler)
