"""Bodies for test_sim_semantics.py: the simulator's waits, signals and rank
bounds at their boundary values (the same semantics tests/test_sync_emitted.py
pins in the code a GPU executes), and one fixture per race-finder report path."""
import torch
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem
from ditron.language.extra import load_v4_b32

# ---------------------------------------------------------------------------
# waits at the boundary
# ---------------------------------------------------------------------------


@ditron.jit
def swu_kernel(sig_ptr, out_ptr, want, CMP: tl.constexpr):
    tl.store(out_ptr, shmem.signal_wait_until(sig_ptr, CMP, want))


@ditron.jit
def wait_kernel(sig_ptr, out_ptr, n, want):
    tok = dl.wait(sig_ptr, n, "sys", "acquire", waitValue=want)
    tl.store(dl.consume_token(out_ptr, tok), 1)


@ditron.jit
def deps_kernel(slots_ptr, out_ptr, n, epoch):
    tok = dl.wait_deps(slots_ptr, n, epoch)
    tl.store(dl.consume_token(out_ptr, tok), 1)


#: (cmp, awaited value, word values that satisfy it -- the boundary and past it)
SATISFIED = [("eq", 5, [5]), ("ne", 5, [4, 6]), ("gt", 5, [6, 9]), ("ge", 5, [5, 9]), ("lt", 5, [4, 0]),
             ("le", 5, [5, 0])]
#: (cmp, awaited value, a word value that must keep the wait spinning)
UNSATISFIED = [("eq", 5, 6), ("ne", 5, 5), ("gt", 5, 5), ("ge", 5, 4), ("lt", 5, 5), ("le", 5, 6)]


def signal_wait_until_returns(world):
    """Every satisfying word (the boundary and past it) ends the wait at once; the wait returns the word."""
    sig = ditron.symm_zeros((1,), torch.int64, name="sig")
    out = torch.zeros(1, dtype=torch.int64)
    seen = []
    for cmp, want, values in SATISFIED:
        for v in values:
            sig.fill_(v)
            swu_kernel[(1,)](sig, out, want, CMP=cmp)
            seen.append((cmp, v, int(out[0])))
    ditron.barrier_all()
    return seen


def blocked_wait(world, kind, cmp=None, want=0, word=0, n=1):
    """A wait that must not return: ``kind`` "swu" (signal_wait_until(cmp, want) on a word holding ``word``),
    "wait" (dl.wait for ``want`` on ``n`` words holding ``word``; the last word holds ``want - 1``) or
    "deps" (wait_deps for epoch ``want`` on slots holding ``word``)."""
    out = torch.zeros(1, dtype=torch.int64 if kind == "swu" else torch.int32)
    if kind == "swu":
        sig = ditron.symm_zeros((1,), torch.int64, name="sig")
        sig.fill_(word)
        swu_kernel[(1,)](sig, out, want, CMP=cmp)
    elif kind == "wait":
        sig = ditron.symm_zeros((n,), torch.int32, name="sig")
        sig.fill_(word)
        if n > 1:
            sig[n - 1] = want - 1
        wait_kernel[(1,)](sig, out, n, want)
    else:
        slots = torch.full((n,), word, dtype=torch.int32)
        deps_kernel[(1,)](slots, out, n, want)
    return int(out[0])


def waits_return(world):
    """dl.wait returns on n words all equal to the value; wait_deps on slots at or past the epoch (signed)."""
    W = world.world_size
    sig = ditron.symm_zeros((W + 2,), torch.int32, name="sig")
    out = torch.zeros(1, dtype=torch.int32)
    sig.fill_(7)
    wait_kernel[(1,)](sig, out, W + 2, 7)
    res = [int(out[0])]
    for slots in ([3, 3], [3, 4, 100], [2 ** 31 - 1]):
        out.zero_()
        deps_kernel[(1,)](torch.tensor(slots, dtype=torch.int32), out, len(slots), 3)
        res.append(int(out[0]))
    ditron.barrier_all()
    return res


# ---------------------------------------------------------------------------
# rank bounds
# ---------------------------------------------------------------------------


@ditron.jit
def peer_store_kernel(x_ptr, peer):
    tl.store(dl.symm_at(x_ptr, peer), dl.rank() + 1)


@ditron.jit
def peer_notify_kernel(sig_ptr, peer):
    dl.notify(sig_ptr, peer, signal=1, sig_op="add", comm_scope="intra_node")


@ditron.jit
def peer_put_kernel(dst_ptr, src_ptr, sig_ptr, peer):
    # a thread-level put: every thread that calls it puts and signals (as on a GPU), so thread 0 alone calls it
    if dl.tid(0) == 0:
        shmem.putmem_signal(dst_ptr, src_ptr, 8, sig_ptr, 1, "add", peer)


def rank_bounds(world):
    """Peers -1 and world_size are refused (with the rank and the range in the message) by symm_at, notify
    and putmem_signal; the last rank is accepted by each.  Returns (messages, what the last rank received)."""
    W = world.world_size
    x = ditron.symm_zeros((1,), torch.int32, name="x")
    sig = ditron.symm_zeros((1,), torch.int32, name="sig")
    sig64 = ditron.symm_zeros((1,), torch.int64, name="sig64")
    dst = ditron.symm_zeros((1,), torch.int64, name="dst")
    src = ditron.symm_zeros((1,), torch.int64, name="src")
    src.fill_(11)
    msgs = []
    launches = [lambda p: peer_store_kernel[(1,)](x, p), lambda p: peer_notify_kernel[(1,)](sig, p),
                lambda p: peer_put_kernel[(1,)](dst, src, sig64, p)]
    for launch in launches:
        for bad in (-1, W):
            try:
                launch(bad)
                msgs.append(None)
            except ditron.DitronError as e:
                msgs.append(str(e))
    ditron.barrier_all()
    if world.rank == 0:
        for launch in launches:
            launch(W - 1)
    ditron.barrier_all()
    got = (int(x[0]), int(sig[0]), int(sig64[0]), int(dst[0]))
    ditron.barrier_all()
    return msgs, got


# ---------------------------------------------------------------------------
# race-finder report paths (a race cluster: ditron.sim.pool.SimCluster(race=True))
# ---------------------------------------------------------------------------


@ditron.jit
def race_kernel(buf_ptr, flag_ptr, out_ptr, MODE: tl.constexpr):
    """Rank 1 touches element 0 of rank 0's ``buf`` first, then rank 0 writes it.  Rank 1 tells rank 0
    with a relaxed flag (``ww``, ``rw``, ``same``: the flag orders them in time but not for the memory
    model, so the race finder must report) or with notify + an acquire wait (``ordered``: no race).
    ww: rank 1 writes 20, rank 0 writes 21;  rw: rank 1 reads, rank 0 writes 21;  same: both write 20
    (storing the value already there is not a race)."""
    me = dl.rank()
    if me == 1:
        if MODE == "rw":
            tl.store(out_ptr, tl.load(dl.symm_at(buf_ptr, 0)))                 # RACE_FIRST_READ
        else:
            tl.store(dl.symm_at(buf_ptr, 0), 20)                               # RACE_FIRST_WRITE
        if MODE == "ordered":
            dl.notify(flag_ptr, 0, signal=1, sig_op="set", comm_scope="intra_node")
        else:
            dl.st(dl.symm_at(flag_ptr, 0), 1, scope="sys", semantic="relaxed")
    if me == 0:
        if MODE == "ordered":
            tok = dl.wait(flag_ptr, 1, "sys", "acquire", waitValue=1)
        else:
            tok = dl.wait(flag_ptr, 1, "sys", "relaxed", waitValue=1)
        tl.store(dl.consume_token(buf_ptr, tok), 20 if MODE == "same" else 21)    # RACE_SECOND_WRITE


@ditron.jit
def swu_race_kernel(buf_ptr, sig_ptr):
    """Rank 1 writes rank 0's buf and signals with shmem.signal_op; rank 0 waits with signal_wait_until
    (acquire) and writes: ordered, no race."""
    me = dl.rank()
    if me == 1:
        tl.store(dl.symm_at(buf_ptr, 0), 20)
        shmem.fence()                          # the put is ordered before the signal (as NVSHMEM requires)
        shmem.signal_op(sig_ptr, 1, "set", 0)
    if me == 0:
        v = shmem.signal_wait_until(sig_ptr, "eq", 1)
        tl.store(buf_ptr + v - 1, 21)


def race_case(world, mode):
    if mode == "swu_ordered":
        buf = ditron.symm_zeros((4,), torch.int32, name="buf")
        sig = ditron.symm_zeros((1,), torch.int64, name="sig")
        ditron.barrier_all()
        swu_race_kernel[(1,)](buf, sig)
        ditron.barrier_all()
        return int(buf[0])
    buf = ditron.symm_zeros((4,), torch.int32, name="buf")
    flag = ditron.symm_zeros((1,), torch.int32, name="flag")
    out = torch.zeros(1, dtype=torch.int32)
    ditron.barrier_all()
    race_kernel[(1,)](buf, flag, out, MODE=mode)
    ditron.barrier_all()
    return int(buf[0])


@ditron.jit
def vector_poll_kernel(words_ptr, out_ptr):
    """Program 0 polls four words with one relaxed vector load per iteration (``load_v4_b32``: one load per
    word) until program 1 of the same launch sets the last one: the poll must lend program 0's turn."""
    pid = tl.program_id(0)
    if pid == 0:
        a, b, c, d = load_v4_b32(words_ptr, scope="gpu", semantic="relaxed")
        while d != 1:
            a, b, c, d = load_v4_b32(words_ptr, scope="gpu", semantic="relaxed")
        tl.store(out_ptr, a + b + c + d)
    else:
        dl.st(words_ptr + 3, 1, "gpu", "release")


def vector_poll(world):
    words = ditron.symm_zeros((4,), torch.int32, name="words")
    words[:3] = torch.tensor([5, 6, 7], dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    vector_poll_kernel[(2,)](words, out)
    return int(out[0])


@ditron.jit
def stranded_writer_kernel(buf_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    """Ranks > 0 write the next rank's ``buf``, tell rank 0 (a relaxed flag), then wait for a signal that never
    comes (the run is stopped under them); rank 0 waits until all of them wrote."""
    me = dl.rank()
    offs = tl.arange(0, BLOCK)
    if me == 0:
        dl.wait(flag_ptr + 1, n - 1, "sys", "relaxed", waitValue=1)
    else:
        for i in range(3):      # releases advance the program's clock past what the host's next launch starts at
            dl.notify(flag_ptr + n, me, signal=i, sig_op="set", comm_scope="intra_node")
        tl.store(dl.symm_at(buf_ptr + offs, (me + 1) % n), offs + me)            # STRANDED_WRITE
        # a relaxed flag: rank 0 learns that the write happened, but nothing orders the write before anything
        # of rank 0 (only the end of the run does)
        dl.st(dl.symm_at(flag_ptr + me, 0), 1, scope="sys", semantic="relaxed")
        dl.wait(flag_ptr, 1, "sys", "acquire", waitValue=7)


@ditron.jit
def read_own_kernel(buf_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(buf_ptr + offs))


@ditron.jit
def self_put_kernel(buf_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Triton-distributed's tutorial 02 launched with one program too many: program 1 ``putmem``s this rank's
    segment onto itself (the same bytes, the same values) while program 0 reads it (as a putmem source would);
    the values any order gives are the same: not a race.  ``n < 0``: program 1 stores other values instead (a
    race)."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    if pid == 1:
        if n > 0:
            shmem.putmem_block(buf_ptr, buf_ptr, n * 4, dl.rank())                # SELF_PUT
        else:
            tl.store(buf_ptr + offs, offs + 100)                                   # SELF_OTHER
    else:
        tl.store(out_ptr + offs, tl.load(buf_ptr + offs))                         # SELF_READ


def self_put(world, racy):
    """Returns the sum of what program 0 read (the host wrote 0..15 + rank)."""
    buf = ditron.symm_empty((16,), torch.int32, name="seg")
    buf.copy_(torch.arange(16, dtype=torch.int32) + world.rank)
    out = torch.zeros(16, dtype=torch.int32)
    ditron.barrier_all()
    self_put_kernel[(2,)](buf, out, -16 if racy else 16, BLOCK=16)
    ditron.barrier_all()
    return int(out.sum())


def stranded_then_clean(world, stop):
    """``stop``: the run fails on rank 0 while the other ranks' launches, which wrote a peer's ``buf``, are
    blocked (and then stopped); else each rank reads its own ``buf``, at the same heap addresses, in a later
    run: ordered after everything of the failed run (no race)."""
    n = world.world_size
    buf = ditron.symm_zeros((16,), torch.int32, name="buf")
    flag = ditron.symm_zeros((n + 1,), torch.int32, name="flag")
    ditron.barrier_all()
    if stop:
        stranded_writer_kernel[(1,)](buf, flag, n, BLOCK=16)       # blocks on ranks > 0
        raise RuntimeError("rank 0 stops the run")                  # reached on rank 0 only
    out = torch.zeros(16, dtype=torch.int32)
    read_own_kernel[(1,)](buf, out, BLOCK=16)
    ditron.barrier_all()
    return int(out.sum())


# ---------------------------------------------------------------------------
# signal operations and the device barrier
# ---------------------------------------------------------------------------


@ditron.jit
def signal_ops_kernel(sig32_ptr, sig64_ptr, peer):
    dl.notify(sig32_ptr, peer, signal=5, sig_op="set", comm_scope="intra_node")
    dl.notify(sig32_ptr + 1, peer, signal=5, sig_op="add", comm_scope="intra_node")
    if dl.tid(0) == 0:          # thread-level signal ops act in every calling thread: thread 0 alone here
        shmem.signal_op(sig64_ptr, 5, "set", peer)
        shmem.signal_op(sig64_ptr + 1, 5, "add", peer)


def signal_ops(world):
    """set replaces the word, add adds to it (words holding 3 before): notify and shmem.signal_op."""
    sig32 = ditron.symm_zeros((2,), torch.int32, name="sig32")
    sig64 = ditron.symm_zeros((2,), torch.int64, name="sig64")
    sig32.fill_(3)
    sig64.fill_(3)
    ditron.barrier_all()
    if world.rank == 0:
        signal_ops_kernel[(1,)](sig32, sig64, world.world_size - 1)
    ditron.barrier_all()
    out = sig32.tolist() + sig64.tolist()
    ditron.barrier_all()
    return out


@ditron.jit
def barrier_count_kernel(count_ptr, out_ptr):
    if dl.tid(0) == 0:          # a scalar dl.atomic_add runs in every thread (as on a GPU): count this program once
        dl.atomic_add(dl.symm_at(count_ptr, 0), 1, scope="sys", semantic="release")
    shmem.barrier_all()
    tl.store(out_ptr, dl.ld(dl.symm_at(count_ptr, 0), scope="sys", semantic="acquire"))


def barrier_counts(world):
    """Every rank counts itself on rank 0, then shmem.barrier_all, then reads the count: the world size
    everywhere.  The last rank's program starts only once the others are idle (ditron.sim.skew), so a
    barrier that lets ranks through early is seen whatever the machine's speed."""
    from ditron.sim import skew
    count = ditron.symm_zeros((1,), torch.int32, name="count")
    out = torch.zeros(1, dtype=torch.int32)
    ditron.barrier_all()
    with skew.delay(world.world_size - 1, at="program", kernel="barrier_count", seconds=10, until_idle=True):
        barrier_count_kernel[(1,)](count, out)
    ditron.barrier_all()
    return int(out[0])
