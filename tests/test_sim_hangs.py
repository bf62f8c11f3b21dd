"""Polling loops on the simulator: a polling load lends its turn (a spin
between programs of one launch completes), and a poll that nobody satisfies
is reported as a deadlock naming the rank, program, line and address."""
import os
import re
import time

import pytest

import bodies_sim_rel as B
from ditron.errors import DitronHangError

pytestmark = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator tests")

HANG_S = 1.5


def _line(marker):
    with open(B.__file__) as f:
        for i, text in enumerate(f, 1):
            if marker in text:
                return f"bodies_sim_rel.py:{i}"
    raise AssertionError(marker)


@pytest.mark.parametrize("use_ld", [True, False], ids=["dl.ld", "volatile"])
def test_spin_on_a_flag_of_a_later_program_completes(dist_world, use_ld):
    assert dist_world(1).run(B.program_spin, use_ld, timeout=60) == [7]


@pytest.mark.parametrize("use_ld", [True, False], ids=["dl.ld", "volatile"])
def test_polling_loop_hang_is_reported(use_ld):
    from ditron.sim.pool import SimCluster
    with SimCluster(2, hang_timeout=HANG_S) as cluster:
        t = time.monotonic()
        with pytest.raises(DitronHangError) as info:
            cluster.run(B.poll_hang, use_ld, 1, timeout=60)
        assert time.monotonic() - t < HANG_S + 10
        polls = [e for e in info.value.report if e["program"] is not None]
        assert len(polls) == 1, info.value.report
        e = polls[0]
        assert e["rank"] == 1 and tuple(e["program"]) == (0, 0, 0)
        assert e["primitive"] == ("dl.ld" if use_ld else "tl.load(volatile=True)")
        assert e["where"] == _line("POLL_LD" if use_ld else "POLL_VOLATILE")
        assert "'never_set'" in e["signal"] and "element offset 1" in e["signal"] and "rank 1's copy" in e["signal"]
        assert e["observed"] == 0
        # rank 0 waits in the host barrier
        assert any(x["rank"] == 0 and x["primitive"] == "ditron.barrier_all" for x in info.value.report)
        cluster.run(B.program_spin, True)          # usable afterwards


def test_ll_all_reduce_with_a_skipped_call_is_reported(tmp_path):
    from ditron.sim.pool import SimCluster
    with SimCluster(3, hang_timeout=HANG_S) as cluster:
        with pytest.raises(DitronHangError) as info:
            cluster.run(B.ll_skipped_call, 0, str(tmp_path), timeout=120)
        reported = time.time()
        # the bound, from the moment the hang began (the last rank finished the good first call)
        began = max(float((tmp_path / f"rank{r}").read_text()) for r in range(3))
        assert reported - began < HANG_S + 10, reported - began
        # ranks 1 and 2 are reported blocked: in the cross-rank argument check that every zoo op runs first on
        # the simulator (it names the rank that skipped), or, where that check passed, in the ll kernel's poll
        blocked = [e for e in info.value.report if e["rank"] in (1, 2)]
        assert {e["rank"] for e in blocked} == {1, 2}, info.value.report
        for e in blocked:
            if e["primitive"] == "tl.load(volatile=True)":
                assert re.match(r"all_reduce\.py:\d+$", e["where"]), e
                assert "in rank %d's copy" % e["rank"] in e["signal"], e
            else:
                assert e["primitive"].startswith("all_reduce (cross-rank argument check"), e
                assert "ranks [0] have not made this call" in e["signal"], e
