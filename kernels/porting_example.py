"""The porting example of docs/porting.md: a plain Triton copy kernel, and
the same kernel made distributed -- each rank pulls its right neighbour's block
once the neighbour has signalled that the block is ready."""
import triton
import triton.language as tl

import ditron
import ditron.language as dl


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@ditron.jit
def ring_pull_kernel(x_ptr, out_ptr, sig_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    rank = dl.rank()
    peer = (rank + 1) % dl.num_ranks()
    token = dl.wait(sig_ptr + peer, 1, "sys", "acquire", waitValue=1)
    src = dl.consume_token(dl.symm_at(x_ptr + offs, peer), token)
    tl.store(out_ptr + offs, tl.load(src, mask=mask), mask=mask)


@ditron.jit
def ready_kernel(sig_ptr):
    """Tell the left neighbour (who pulls from this rank) that ``x`` is ready:
    set word ``rank`` of its signal array."""
    rank = dl.rank()
    left = (rank + dl.num_ranks() - 1) % dl.num_ranks()
    dl.notify(sig_ptr + rank, left, signal=1, sig_op="set", comm_scope="intra_node")
