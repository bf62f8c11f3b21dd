"""The simulator's waits, signals and rank bounds at their boundary values,
against the semantics a GPU executes (tests/test_sync_emitted.py pins those in
the emitted code): dl.wait is equality (a word past the value does not end
it), wait_deps is signed >=, signal_wait_until compares with each NVSHMEM
operator; rank -1 and rank = world size are refused, the last rank accepted."""
import pytest

import bodies_sim_semantics as B
from ditron.errors import DitronHangError

# The returning cases run on GPUs too (DITRON_TEST_BACKEND=p2p|nvshmem under torchrun): the same kernels and
# values, so the simulator and the GPU are compared case by case.  The blocked cases and the rank bounds
# are simulator-only: on a GPU a wait that must not return spins forever (or traps under
# DITRON_WAIT_TIMEOUT_S) and a rank out of range traps in the kernel.


def _sim_only(dist):
    if dist.backend != "sim":
        pytest.skip("a blocked wait or an out-of-range rank would hang or trap a GPU")


def test_signal_wait_until_returns_at_and_past_the_boundary(dist):
    seen = dist.run(B.signal_wait_until_returns)
    want = [(cmp, v, v) for cmp, _, values in B.SATISFIED for v in values]
    assert seen == [want] * dist.world_size


def test_waits_return_on_equal_words_and_slots_at_or_past_the_epoch(dist):
    assert dist.run(B.waits_return) == [[1, 1, 1, 1]] * dist.world_size


@pytest.fixture
def quick_hangs(dist):
    """The shared cluster with a 0.5 s deadlock watchdog (instead of the suite's 20 s)."""
    _sim_only(dist)
    cluster = dist.cluster
    saved = cluster.hang_timeout
    cluster.hang_timeout = 0.5
    yield dist
    cluster.hang_timeout = saved


# one run per case: a blocked wait ends the run.  Boundary cases: the word one past (or at) the value.
BLOCKED = [("swu", cmp, want, word, 1) for cmp, want, word in B.UNSATISFIED] + [
    ("swu", "lt", 5, -3, 1),            # NVSHMEM compares uint64 words: -3 is 2**64 - 3, not below 5
    ("wait", None, 7, 8, 1),            # dl.wait is equality: a word past the value never satisfies it
    ("wait", None, 7, 7, 3),            # every word counts: the last of three is still 6
    ("deps", None, 3, 2, 1),            # wait_deps: one below the epoch
    ("deps", None, 3, -1, 1),           # signed: -1 is below 3 (0xFFFFFFFF unsigned would pass)
]


@pytest.mark.parametrize("kind,cmp,want,word,n", BLOCKED)
def test_wait_does_not_return_before_its_condition(quick_hangs, kind, cmp, want, word, n):
    with pytest.raises(DitronHangError) as info:
        quick_hangs.run(B.blocked_wait, kind, cmp, want, word, n)
    assert "deadlock" in str(info.value)


def test_rank_bounds(dist):
    """-1 and world_size are refused by symm_at, notify and putmem_signal, naming the rank and the range;
    world_size - 1 is accepted by each."""
    _sim_only(dist)
    W = dist.world_size
    res = dist.run(B.rank_bounds)
    for msgs, got in res:
        assert len(msgs) == 6 and all(m is not None for m in msgs), msgs
        for m, bad in zip(msgs, (-1, W) * 3):
            assert f"rank {bad} is not in [0, {W})" in m, m
    # rank 0 stored 1 into x, added 1 to sig, put 11 into dst and added 1 to sig64 -- on the last rank only
    assert res[W - 1][1] == (1, 1, 1, 11)
    assert all(r[1] == (0, 0, 0, 0) for r in res[:W - 1])


def test_signal_ops_set_and_add(dist):
    res = dist.run(B.signal_ops)
    W = dist.world_size
    for r, words in enumerate(res):
        assert words == ([5, 8, 5, 8] if r == W - 1 else [3, 3, 3, 3]), (r, words)


def test_device_barrier_waits_for_every_rank(dist):
    assert dist.run(B.barrier_counts) == [dist.world_size] * dist.world_size


def test_a_vector_poll_lends_its_turn(dist_world):
    """Regression (issue 56): a relaxed vector poll (``load_v4_b32(..., semantic="relaxed")``, one load per word)
    read four addresses in turn, which the spin detector took for four different polls: the polling program
    never lent its turn and the program it waited for never ran (Triton-distributed's LL receive)."""
    d = dist_world(1)
    if d.backend != "sim":
        pytest.skip("the simulator's scheduling")
    assert d.run(B.vector_poll, timeout=60) == [19]
