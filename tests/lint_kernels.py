"""Kernels for tests/test_lint.py: the racy producer / consumer patterns of
issue 15 that the compile-time lint must flag, and the correct versions it
must pass."""
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem


@ditron.jit
def relaxed_flag_producer(data_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    """Stores the data into the peer, then sets its flag with a relaxed store: racy."""
    peer = (dl.rank() + 1) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    tl.store(dl.symm_at(data_ptr + offs, peer), offs.to(tl.float32), mask=offs < n)
    dl.st(dl.symm_at(flag_ptr, peer), 1, scope="sys", semantic="relaxed")


@ditron.jit
def relaxed_atomic_producer(data_ptr, flag_ptr, n, BLOCK: tl.constexpr, SEM: tl.constexpr):
    """The same with a relaxed atomic add (semantic from a constexpr: resolved through the IR)."""
    peer = (dl.rank() + 1) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    tl.store(dl.symm_at(data_ptr + offs, peer), offs.to(tl.float32), mask=offs < n)
    dl.atomic_add(dl.symm_at(flag_ptr, peer), 1, scope="sys", semantic=SEM)


@triton.jit
def _wait_flag(flag_ptr, SCOPE: tl.constexpr):
    return dl.wait(flag_ptr, 1, SCOPE, "acquire", waitValue=1)


@ditron.jit
def gpu_scope_consumer(data_ptr, flag_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Producer and consumer in one kernel; the consumer waits with scope 'gpu' (in a helper)
    on the flag a peer sets through dl.notify: racy."""
    peer = (dl.rank() + 1) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    tl.store(dl.symm_at(data_ptr + offs, peer), offs.to(tl.float32), mask=offs < n)
    dl.notify(flag_ptr, peer, signal=1, comm_scope="intra_node")
    tok = _wait_flag(flag_ptr, "gpu")
    tl.store(out_ptr + offs, tl.load(dl.consume_token(data_ptr + offs, tok), mask=offs < n), mask=offs < n)


@ditron.jit
def no_token_consumer(data_ptr, flag_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Waits correctly but loads the peer-written data without dl.consume_token: racy."""
    peer = (dl.rank() + 1) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    tl.store(dl.symm_at(data_ptr + offs, peer), offs.to(tl.float32), mask=offs < n)
    dl.notify(flag_ptr, peer, signal=1, comm_scope="intra_node")
    dl.wait(flag_ptr, 1, "sys", "acquire", waitValue=1)
    tl.store(out_ptr + offs, tl.load(data_ptr + offs, mask=offs < n), mask=offs < n)


@ditron.jit
def correct_exchange(data_ptr, flag_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """The correct protocol: stores, release (dl.notify), sys-scope acquire, consume_token."""
    peer = (dl.rank() + 1) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    tl.store(dl.symm_at(data_ptr + offs, peer), offs.to(tl.float32), mask=offs < n)
    dl.notify(flag_ptr, peer, signal=1, comm_scope="intra_node")
    tok = _wait_flag(flag_ptr, "sys")
    tl.store(out_ptr + offs, tl.load(dl.consume_token(data_ptr + offs, tok), mask=offs < n), mask=offs < n)


@ditron.jit
def fenced_relaxed_producer(data_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    """Relaxed flag, but after a release fence: correct."""
    peer = (dl.rank() + 1) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    tl.store(dl.symm_at(data_ptr + offs, peer), offs.to(tl.float32), mask=offs < n)
    dl.fence("release", "sys")
    dl.st(dl.symm_at(flag_ptr, peer), 1, scope="sys", semantic="relaxed")
