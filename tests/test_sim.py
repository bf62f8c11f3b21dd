"""Simulator-only behaviour: deadlock reports, failing ranks, the launcher,
tile-at-a-time thread helpers, multicast semantics (multicast is off on the
lent GPUs), and the NumPy >= 2.4 interpreter fix."""
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import bodies_sim as B
import ditron
from ditron.errors import DitronError, DitronHangError, DitronRankError

pytestmark = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator tests")


def test_failing_rank_stops_the_others(dist):
    t = time.monotonic()
    with pytest.raises(DitronRankError) as info:
        dist.run(B.fail_on_rank, 2)
    assert time.monotonic() - t < 15
    assert info.value.rank == 2
    assert "planted failure on rank 2" in info.value.traceback_text
    # the cluster is usable afterwards
    dist.run(B.allgather_push, 10, 16)


def test_missing_notify_is_reported_as_deadlock(dist_world):
    from ditron.sim.pool import SimCluster
    with SimCluster(3, hang_timeout=1.5) as cluster:
        t = time.monotonic()
        with pytest.raises(DitronHangError) as info:
            cluster.run(B.missing_notify, 1)
        assert time.monotonic() - t < 1.5 + 10
        report = info.value.report
        blocked = [e for e in report if e["primitive"] == "dl.wait"]
        assert len(blocked) == 1
        e = blocked[0]
        assert e["rank"] == 2 and e["program"] == (0, 0, 0)
        assert e["where"].startswith("bodies_sim.py:")
        assert "'ring_flags'" in e["signal"] and "element offset 1" in e["signal"]
        assert e["expected"] == "== 1" and e["observed"] == 0
        # the cluster recovers
        cluster.run(B.allgather_push, 10, 16)


def test_multimem_reduce_and_broadcast(dist):
    dist.run(B.multimem_sum, 100)


def test_thread_helpers_tile_at_a_time(dist):
    for out, cnt in dist.run(B.thread_helpers):
        assert sorted(out[:32]) == list(range(32))          # 32 lanes incremented one counter
        assert out[32] == sum(1 << i for i in range(1, 32, 2)) - (1 << 32)   # int32 bit pattern
        assert out[33:65] == [i ^ 1 for i in range(32)]
        assert out[65] == 4                                 # ffs(40) = bit 3 -> 4
        assert out[66] == 128 * 100 + 4 * 1000             # outside a tid branch: thread 0 of 4 warps
        assert out[67] == 0 and cnt[1] == 5
        assert out[68] == 9 and cnt[0] == 32


# ---------------------------------------------------------------------------
# the launcher
# ---------------------------------------------------------------------------

RING = textwrap.dedent('''
    import sys, torch, triton.language as tl
    import ditron, ditron.language as dl

    @ditron.jit
    def ring(sig_ptr, skip):
        me = dl.rank()
        if me != skip:
            dl.notify(sig_ptr, (me + 1) % dl.num_ranks(), signal=1, comm_scope="intra_node")
        dl.wait(sig_ptr, 1, "sys", "acquire", waitValue=1)

    world = ditron.init()
    sig = ditron.symm_zeros((1,), torch.int32, name="sig")
    ditron.barrier_all()
    if sys.argv[1] == "raise" and world.rank == 1:
        raise RuntimeError("boom on rank 1")
    ring[(1,)](sig, int(sys.argv[1]) if sys.argv[1] != "raise" else -1)
    ditron.barrier_all()
    print(f"rank {world.rank} of {world.world_size} ok")
    ditron.finalize()
''')


def _sim(tmp_path, n, *args, timeout=120, hang=None):
    script = tmp_path / "ring.py"
    script.write_text(RING)
    cmd = [sys.executable, "-m", "ditron.sim", "-n", str(n)]
    if hang is not None:
        cmd += ["--hang-timeout", str(hang)]
    t = time.monotonic()
    p = subprocess.run(cmd + [str(script), *args], capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t


def test_launcher_runs_ranks(tmp_path):
    p, _ = _sim(tmp_path, 3, "-1")
    assert p.returncode == 0, p.stderr
    assert sorted(re.findall(r"rank (\d) of 3 ok", p.stdout)) == ["0", "1", "2"]


def test_launcher_reports_a_planted_deadlock(tmp_path):
    p, elapsed = _sim(tmp_path, 3, "0", hang=2)     # rank 0 never notifies rank 1
    assert p.returncode == 3, (p.stdout, p.stderr)
    err = p.stderr
    assert "deadlock: no rank made progress for 2 s" in err
    line = [ln for ln in err.splitlines() if "rank 1, program (0, 0, 0)" in ln]
    assert line, err
    assert "blocked in dl.wait at ring.py:10" in line[0]
    assert "symmetric tensor 'sig' (int32[1]" in line[0] and "element offset 0" in line[0]
    assert "expected: == 1" in line[0] and "observed: 0" in line[0]
    # the other ranks wait in the host barrier after their launch
    assert re.search(r"rank [02], host: blocked in ditron.barrier_all at ring.py:\d+", err), err


def test_launcher_shows_failing_rank_traceback(tmp_path):
    p, elapsed = _sim(tmp_path, 3, "raise", hang=30)
    assert p.returncode == 1
    assert "rank 1 failed" in p.stderr and "RuntimeError: boom on rank 1" in p.stderr
    assert elapsed < 60        # the others were stopped, not left to the 30 s watchdog


def test_range_over_runtime_value_with_new_numpy(dist_world):
    d = dist_world(1)
    assert d.run(B.runtime_range, 9) == [sum(range(9)) + 5]


def test_ditron_demo_runs_and_verifies():
    p = subprocess.run([sys.executable, "-m", "ditron", "demo"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("matches torch") == 4
    assert "verified on all 4 ranks" in p.stdout


def test_out_of_heap_pointer_is_an_error(dist):
    with pytest.raises(DitronRankError) as info:
        dist.run(B.out_of_heap)
    msg = info.value.traceback_text
    assert "dl.symm_at, argument 'ptr', target sim: the pointer is not in this rank's symmetric heap" in msg
    assert "(at bodies_sim.py:" in msg


def test_bench_harness_smoke_on_the_simulator(tmp_path):
    """The benchmark harness's code paths (checks against torch, table, JSON) on 2 simulated ranks;
    the numbers are meaningless here."""
    import json
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "2", "-m", "ditron.bench", "all_reduce",
                        "--sizes", "1K,4K", "--peers", "", "--methods", "auto,two_shot", "--iters", "5",
                        "--warmup", "1", "--out", str(tmp_path), "--tag", "smoke"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((tmp_path / "smoke-all_reduce-bf16.json").read_text())
    assert len(data["rows"]) == 4 and all(r["ok"] for r in data["rows"]), data["rows"]
    assert "| 4 KiB |" in (tmp_path / "smoke-all_reduce-bf16.md").read_text()


def test_launcher_splits_its_options_from_the_script(tmp_path):
    from ditron.sim.launcher import _split_argv
    assert _split_argv(["-n", "2", "-m", "mod", "-n", "5"]) == (["-n", "2"], ["-m", "mod", "-n", "5"])
    assert _split_argv(["--nnodes", "2", "s.py", "--x"]) == (["--nnodes", "2"], ["s.py", "--x"])


def test_run_time_limit_catches_hangs_the_watchdog_cannot_see():
    from ditron.sim.pool import SimCluster
    with SimCluster(1) as cluster:
        t = time.monotonic()
        with pytest.raises(DitronHangError, match="did not finish within the run's time limit"):
            cluster.run(B.plain_poll_forever, timeout=3)
        assert time.monotonic() - t < 20
        cluster.run(B.topology)            # restarted and usable


def test_bf16_dot_on_the_simulator(dist_world):
    # Triton 3.6's interpreter multiplies bf16 bit patterns; ditron widens the operands
    dist_world(1).run(B.bf16_dot)
