"""A host model of the Gluon GEMM core's synchronisation (kernels/gemm_hopper.py), run under random schedules.

What a CPU cannot run is the kernel; what it can check is its protocol: the ring's ready / empty mbarriers
(parity waits, arrival counts, TMA transaction bytes), the consumers' one-MMA-in-flight release rule and the
ping-pong turn barriers, with the same counter and phase arithmetic as ``_producer`` / ``_consumer``.  The model
plays one program's three partitions as coroutines; a random scheduler interleaves them and lands TMA copies and
retires MMAs at arbitrary later times.  It checks that every schedule finishes (no deadlock), that every MMA
reads the k-slice of the tile it meant (no slot overwritten before its MMA retired, no parity wait passing a
phase early) and that every tile gets all its k-steps.  If the kernel's arithmetic changes, change it here too
(the functions below mirror it line by line); the GPU check is bench/gemm_core_levers.sh --check.
"""
import random

import pytest


class Barrier:
    """mbarrier: ``count`` arrivals plus the expected transaction bytes complete a phase."""

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phases = count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phases += 1
            self.pending = self.count

    def arrive(self):
        assert self.pending > 0
        self.pending -= 1
        self._maybe_complete()

    def expect(self, nbytes):          # mbarrier.expect = arrive.expect_tx
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        assert self.tx >= 0
        self._maybe_complete()

    def passes(self, parity):          # try_wait.parity: the phase of this parity has completed
        return (self.phases & 1) != parity


class Machine:
    def __init__(self, stages, pingpong, rng):
        self.rng = rng
        self.stages = stages
        self.ready = [Barrier(1) for _ in range(stages)]
        self.empty = [Barrier(1 if pingpong else 2) for _ in range(stages)]
        self.turn = [Barrier(1) for _ in range(2)]
        self.slot = [None] * stages        # what the last landed TMA copy wrote
        self.in_flight_tma = []            # (slot, tag)
        self.done = {}                     # (consumer, tile) -> k-steps accumulated


def producer(m, tiles, k_steps):
    count = 0
    for tile in tiles:
        for ki in range(k_steps):
            s = count % m.stages
            yield ("wait", m.empty[s], ((count // m.stages) & 1) ^ 1)
            m.ready[s].expect(2)                            # A and B: 2 "bytes" of transactions
            m.in_flight_tma.append((s, (tile, ki)))
            count += 1


def consumer(m, tiles, k_steps, cid, pingpong):
    my = tiles[cid::2] if pingpong else tiles
    count = cid * k_steps if pingpong else 0
    mma = []                                                # issued, not retired: (slot, tag)

    def retire(keep):
        while len(mma) > keep:
            s, tag = mma.pop(0)
            assert m.slot[s] == tag, f"consumer {cid}: MMA of {tag} read slot {s} holding {m.slot[s]}"
            m.done[(cid, tag[0])] = m.done.get((cid, tag[0]), 0) + 1
    for i, tile in enumerate(my):
        if pingpong:
            yield ("wait", m.turn[cid], (i & 1) ^ (1 - cid))
        for ki in range(k_steps):
            s = count % m.stages
            yield ("wait", m.ready[s], (count // m.stages) & 1)
            assert m.slot[s] == (tile, ki), f"consumer {cid}: {(tile, ki)} passed its wait on slot {s} holding {m.slot[s]}"
            mma.append((s, (tile, ki)))
            yield ("mma",)                                   # the MMA may read at any time until it retires
            retire(1)                                        # warpgroup_mma_wait(1)
            if ki > 0:
                m.empty[(count + m.stages - 1) % m.stages].arrive()
            count += 1
        if pingpong:
            m.turn[1 - cid].arrive()
        retire(0)                                            # warpgroup_mma_wait(0)
        m.empty[(count + m.stages - 1) % m.stages].arrive()
        if pingpong:
            count += k_steps


def run(tiles, k_steps, stages, pingpong, seed):
    rng = random.Random(seed)
    m = Machine(stages, pingpong, rng)
    parts = {"producer": producer(m, tiles, k_steps), "c0": consumer(m, tiles, k_steps, 0, pingpong),
             "c1": consumer(m, tiles, k_steps, 1, pingpong)}
    blocked = {name: None for name in parts}           # name -> (barrier, parity) it waits on
    live = set(parts)

    def step(name):
        try:
            op = next(parts[name])
        except StopIteration:
            live.discard(name)
            return
        blocked[name] = (op[1], op[2]) if op[0] == "wait" else None
    for name in list(parts):
        step(name)
    for _ in range(100000):
        if not live and not m.in_flight_tma:
            break
        runnable = [n for n in live if blocked[n] is None or blocked[n][0].passes(blocked[n][1])]
        choices = runnable + (["tma"] if m.in_flight_tma else [])
        assert choices, f"deadlock: {[(n, blocked[n][1]) for n in live]}"
        pick = rng.choice(choices)
        if pick == "tma":                                   # a random in-flight copy lands
            s, tag = m.in_flight_tma.pop(rng.randrange(len(m.in_flight_tma)))
            m.slot[s] = tag
            m.ready[s].complete_tx(2)
        else:
            blocked[pick] = None
            step(pick)
    else:
        raise AssertionError("did not finish")
    for cid in (0, 1):
        mine = tiles[cid::2] if pingpong else tiles
        for t in mine:
            assert m.done.get((cid, t)) == k_steps, (cid, t, m.done.get((cid, t)))
    assert sum(m.done.values()) == k_steps * len(tiles) * (1 if pingpong else 2)


@pytest.mark.parametrize("pingpong", [False, True], ids=["coop", "pingpong"])
@pytest.mark.parametrize("n_tiles,k_steps,stages", [(1, 1, 2), (1, 5, 3), (2, 1, 2), (3, 7, 3), (5, 2, 4),
                                                    (4, 16, 3), (6, 3, 6), (7, 9, 5)])
def test_protocol_random_schedules(pingpong, n_tiles, k_steps, stages):
    tiles = [7 + 3 * i for i in range(n_tiles)]       # program p's tiles p, p + P, ...
    for seed in range(60):
        run(tiles, k_steps, stages, pingpong, seed)


def test_model_catches_the_unordered_pingpong():
    """The model can fail: ping-pong without the turn barriers lets consumer 1 pass a parity wait for a slot two
    phases ahead (k-steps >= 2 x stages), reading a k-slice of the wrong tile."""
    global consumer
    real = consumer

    def unordered(m, tiles, k_steps, cid, pingpong):
        for op in real(m, tiles, k_steps, cid, pingpong):
            if op[0] == "wait" and any(op[1] is t for t in m.turn):
                continue
            yield op
    consumer = unordered
    try:
        with pytest.raises(AssertionError):
            for seed in range(200):
                run([1, 2, 3, 4], 8, 3, True, seed)
    finally:
        consumer = real
