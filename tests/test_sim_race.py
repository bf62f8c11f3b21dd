"""The race finder (``ditron sim --race``): racy producer/consumer protocols
are reported with both accesses; correct ones (release/acquire, fences) pass."""
import os
import subprocess
import sys
import textwrap

import pytest

import bodies_sim_rel as B
from ditron.errors import DitronRankError

pytestmark = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator tests")


def _line(marker):
    with open(B.__file__) as f:
        for i, text in enumerate(f, 1):
            if marker in text:
                return f"bodies_sim_rel.py:{i}"
    raise AssertionError(marker)


@pytest.fixture(scope="module")
def race_cluster():
    from ditron.sim.pool import SimCluster
    with SimCluster(3, race=True, hang_timeout=10) as c:
        yield c


@pytest.mark.parametrize("mode", ["ok", "fences_ok"])
def test_correct_protocols_pass(race_cluster, mode):
    assert race_cluster.run(B.push, mode, timeout=120) == [True] * 3


@pytest.mark.parametrize("mode", ["relaxed_flag", "signal_first", "no_wait", "gpu_wait", "relaxed_wait"])
def test_racy_protocols_are_reported(race_cluster, mode):
    with pytest.raises(DitronRankError) as info:
        race_cluster.run(B.push, mode, timeout=120)
    text = info.value.traceback_text
    assert "DitronRaceError" in text and "data race on symmetric tensor 'rx'" in text, text
    assert "element offset" in text and "in rank" in text
    store, load = _line("RACE_STORE"), _line("RACE_LOAD")
    assert "write by rank" in text and f"at {store}" in text, text
    assert f"at {load}" in text, text
    assert "program (0, 0, 0)" in text
    race_cluster.run(B.push, "ok", timeout=120)         # the cluster is usable afterwards


PUSH_SCRIPT = textwrap.dedent('''
    import sys
    sys.path.insert(0, {tests!r})
    import ditron
    import bodies_sim_rel as B
    world = ditron.init()
    for mode in sys.argv[1:]:
        assert B.push(world, mode), mode
        print(f"rank {{world.rank}}: {{mode}} passed", flush=True)
    ditron.finalize()
''')


def test_ditron_sim_race_cli(tmp_path):
    """One job: the correct protocol passes, then the relaxed-flag producer is reported."""
    script = tmp_path / "push.py"
    script.write_text(PUSH_SCRIPT.format(tests=os.path.dirname(os.path.abspath(B.__file__))))
    p = subprocess.run([sys.executable, "-m", "ditron.sim", "-n", "2", "--race", "--seed", "3", str(script), "ok",
                        "relaxed_flag"], capture_output=True, text=True, timeout=300)
    assert "rank 0: ok passed" in p.stdout and "rank 1: ok passed" in p.stdout, (p.stdout, p.stderr)
    assert "relaxed_flag passed" not in p.stdout
    assert p.returncode != 0
    assert "DitronRaceError" in p.stderr and "DITRON_SIM_SEED=3" in p.stderr, p.stderr
    assert "data race on symmetric tensor 'rx'" in p.stderr
    assert f"at {_line('RACE_STORE')}" in p.stderr and f"at {_line('RACE_LOAD')}" in p.stderr


# the zoo under the race finder, on an odd world size: context reuse across calls of every method (the
# full zoo suite runs clean with DITRON_SIM_RACE=1 too; these keep CI short)
ZOO = {
    "all_reduce": ("bodies_zoo_all_reduce", "reuse", (8, ["ll", "one_shot", "two_shot", "multimem_one_shot",
                                                           "multimem_two_shot"], 120, "bfloat16")),
    "all_gather": ("bodies_zoo_ag_rs_a2a", "all_gather_reuse", (6,)),
    "reduce_scatter": ("bodies_zoo_ag_rs_a2a", "reduce_scatter_reuse", (6,)),
    "all_to_all": ("bodies_zoo_ag_rs_a2a", "all_to_all_reuse", (4,)),
    "ag_gemm": ("bodies_ag_gemm", "ag_gemm_calls", ("bf16", [(5, 40, 32)] * 2),
                dict(block_m=16, block_n=16, block_k=32)),
    "gemm_rs": ("bodies_gemm_rs", "gemm_rs_calls", ("bf16", "scatter", [(1, 48), (5, 32)], 40)),
    "gemm_ar": ("bodies_gemm_ar", "gemm_ar_calls", ("bf16", [("one_shot", 9, 40, 24), ("two_shot", 9, 40, 24)])),
}


@pytest.mark.parametrize("op", list(ZOO))
def test_zoo_runs_clean_under_the_race_finder(race_cluster, op):
    import importlib
    module, name, args, *kw = ZOO[op]
    body = getattr(importlib.import_module(module), name)
    race_cluster.run(body, *args, **(kw[0] if kw else {}), timeout=600)


def test_race_finder_sees_tensor_descriptor_accesses(race_cluster):
    # TMA stores into the peer's copy and loads of one's own, without a signal (tests/bodies_sim_fidelity.py)
    import bodies_sim_fidelity as F
    assert race_cluster.run(F.desc_peer, False, timeout=120) == [1.0, 2.0, 3.0]
    with pytest.raises(DitronRankError) as info:
        race_cluster.run(F.desc_peer, True, timeout=120)
    assert "data race on symmetric tensor 'tma_buf'" in info.value.traceback_text


# ---------------------------------------------------------------------------
# one fixture per report path of the race finder (bodies_sim_semantics.race_kernel)
# ---------------------------------------------------------------------------

def _sem_line(marker):
    import bodies_sim_semantics as S
    with open(S.__file__) as f:
        for i, text in enumerate(f, 1):
            if marker in text:
                return f"bodies_sim_semantics.py:{i}"
    raise AssertionError(marker)


@pytest.mark.parametrize("mode,first,first_kind", [("ww", "RACE_FIRST_WRITE", "write"),
                                                    ("rw", "RACE_FIRST_READ", "read")])
def test_race_report_paths(race_cluster, mode, first, first_kind):
    """A write after an unordered write (write-write) or after an unordered read (read-write) is reported
    with both accesses: the first by rank 1, the second by rank 0."""
    import bodies_sim_semantics as S
    with pytest.raises(DitronRankError) as info:
        race_cluster.run(S.race_case, mode, timeout=120)
    text = info.value.traceback_text
    assert "DitronRaceError" in text and "data race on symmetric tensor 'buf'" in text, text
    assert f"{first_kind:<5} by rank 1, program (0, 0, 0), at {_sem_line(first)}" in text, text
    assert f"write by rank 0, program (0, 0, 0), at {_sem_line('RACE_SECOND_WRITE')}" in text, text


@pytest.mark.parametrize("mode,value", [("same", 20), ("ordered", 21), ("swu_ordered", 21)])
def test_race_finder_quiet_paths(race_cluster, mode, value):
    """Storing the value already there after an unordered write is not a race; a write ordered by
    notify / acquire wait, or by signal_op / signal_wait_until, is not either."""
    import bodies_sim_semantics as S
    assert race_cluster.run(S.race_case, mode, timeout=120)[0] == value


def test_a_stopped_run_leaves_no_false_races():
    """Regression (issue 56): the launches a failing run stops on the other ranks had written a peer's memory;
    their programs' clocks must still reach the host, or the next run's accesses to the same heap addresses
    were reported as races with them (port_check's table listed kernels as racy after a failing case)."""
    import bodies_sim_semantics as S
    from ditron.sim.pool import SimCluster
    with SimCluster(3, race=True, hang_timeout=10) as c:
        with pytest.raises(DitronRankError) as info:
            c.run(S.stranded_then_clean, True, timeout=120)
        assert "rank 0 stops the run" in info.value.traceback_text, info.value.traceback_text
        assert c.run(S.stranded_then_clean, False, timeout=120) == [0, 0, 0]


def test_a_put_onto_itself_is_not_a_race(race_cluster):
    """Regression (issue 56): a program copying a segment onto itself (the values already there, written by the
    host) while another program reads it was reported (tutorial 02 launched as written); the same-value rule
    held only over values an earlier kernel store wrote.  A store of other values is still reported.  (Each
    launch starts its programs in another seeded order: four launches see both orders.)"""
    import bodies_sim_semantics as S
    for _ in range(4):
        assert race_cluster.run(S.self_put, False, timeout=120) == [120 + 16 * r for r in range(3)]
    with pytest.raises(DitronRankError) as info:
        race_cluster.run(S.self_put, True, timeout=120)
    text = info.value.traceback_text
    assert "data race on symmetric tensor 'seg'" in text and _sem_line("SELF_OTHER") in text, text


def test_signal_keys_are_np_unique_s_words():
    """The words a signal operation names (``race._keys``: ascending, each once, heap words as heap offsets + 1)
    are np.unique's, for few words (a set of Python ints) and many (np.unique), masked or not."""
    import types

    import numpy as np

    from ditron.sim import race
    rng = np.random.default_rng(3)
    st = types.SimpleNamespace(lo=1 << 40, hi=(1 << 40) + 4096)
    for size in [0, 1, 2, 5, 64, 256, 257, 1000]:
        for _ in range(5):
            inside = st.lo + rng.integers(0, 4096, size)
            outside = rng.integers(0, 1 << 62, size)
            addrs = np.where(rng.random(size) < 0.7, inside, outside).astype(np.uint64)
            addrs[rng.random(size) < 0.3] = addrs[0] if size else 0        # repeats
            mask = rng.random(size) < 0.6
            for m in (None, mask):
                a = addrs if m is None else addrs[m]
                want = [int(x) - st.lo + 1 if st.lo <= int(x) < st.hi else int(x) for x in np.unique(a)]
                got = race._keys(st, addrs.reshape(-1, 1) if size % 2 else addrs, m)
                assert got == want and all(type(x) is int for x in got), (size, m is None)
