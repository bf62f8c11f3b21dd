"""tests/conftest.py's GPU harness (``GpuDist.run``, used under torchrun) on the CPU with a stand-in collective: every
rank learns whether every rank's body passed before the barrier and the results' all-gather, so one rank's failure
fails the test on every rank instead of leaving the others in this test's collectives while it runs the next."""
import contextlib
import types

import pytest

import ditron
from conftest import GpuDist
from ditron.errors import DitronRankError


def _dist(rank, peer_status, monkeypatch, peer_value="peer"):
    """A 2-rank GpuDist on ``rank`` whose peer reports ``peer_status`` (None: passed) and returns ``peer_value``."""
    barriers = []
    monkeypatch.setattr(ditron, "heap_scope", contextlib.nullcontext)
    monkeypatch.setattr(ditron, "barrier_all", lambda: barriers.append(1))

    def all_gather_object(out, obj):
        peer = peer_status if len(gathers) == 0 else peer_value
        gathers.append(obj)
        out[rank], out[1 - rank] = obj, peer
    gathers = []
    d = object.__new__(GpuDist)
    d.world = types.SimpleNamespace(rank=rank, world_size=2)
    d.world_size, d._tdist = 2, types.SimpleNamespace(all_gather_object=all_gather_object)
    return d, barriers, gathers


def test_gpu_harness_passes_when_every_rank_passes(monkeypatch):
    d, barriers, gathers = _dist(0, None, monkeypatch)
    assert d.run(lambda world, x: x + 1, 41) == [42, "peer"]
    assert barriers == [1] and gathers == [None, 42]


def test_gpu_harness_fails_every_rank_on_one_ranks_failure(monkeypatch):
    # the peer (rank 1) failed: this rank's body passed, but the test fails here too, naming rank 1, with no
    # barrier (rank 1 would never reach it) and no results' gather
    d, barriers, gathers = _dist(0, "AssertionError: combine wrong", monkeypatch)
    with pytest.raises(DitronRankError, match="rank 1 failed: AssertionError: combine wrong") as e:
        d.run(lambda world: 1)
    assert e.value.rank == 1 and barriers == [] and gathers == [None]
    # this rank failed: its error (with its traceback) is raised after it told the peer
    d, barriers, gathers = _dist(1, None, monkeypatch)

    def body(world):
        raise AssertionError("out of bounds")
    with pytest.raises(DitronRankError, match="rank 1 failed: out of bounds") as e:
        d.run(body)
    assert "Traceback" in e.value.traceback_text and barriers == [] and gathers == ["AssertionError: out of bounds"]
