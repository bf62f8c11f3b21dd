"""Test bodies (run on every simulated rank) for a new user's mistakes, round 2 (issue 57)."""
import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl


# ---------------------------------------------------------------------------
# a wait on a word outside its symmetric tensor
# ---------------------------------------------------------------------------

@ditron.jit
def wait_kernel(sig_ptr, index, n):
    dl.wait(sig_ptr + index, n, "sys", "acquire", waitValue=1)


def wait_past_end(world, index, n):
    """Waits for ``n`` words from ``flags[index]`` (all already 1); past 'flags' (128 bytes) lies the heap's
    alignment gap (256 bytes) before 'next_flags': a wait there is on no tensor's word and, before issue 57,
    hung until the deadlock timeout."""
    sig = ditron.symm_zeros((32,), torch.int32, name="flags")
    nxt = ditron.symm_zeros((32,), torch.int32, name="next_flags")
    sig.fill_(1)
    nxt.fill_(1)
    ditron.barrier_all()
    wait_kernel[(1,)](sig, index, n)
    ditron.barrier_all()
    return True


# ---------------------------------------------------------------------------
# a block mask combined with a scalar condition
# ---------------------------------------------------------------------------

@ditron.jit
def rank_masked_copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    cm = offs < n
    v = tl.load(x_ptr + offs, mask=cm & (dl.rank() > 0), other=-1.0)
    tl.store(out_ptr + offs, v, mask=cm & (tl.program_id(0) >= 0))


def scalar_condition_in_mask(world):
    """Ranks > 0 copy the first 10 elements; rank 0 stores ``other`` (-1) there."""
    x = torch.arange(16, dtype=torch.float32) + 1
    out = torch.zeros(16)
    rank_masked_copy[(1,)](x, out, 10, BLOCK=16)
    want = torch.cat([x[:10] if world.rank > 0 else torch.full((10,), -1.0), torch.zeros(6)])
    torch.testing.assert_close(out, want)
    return True


# ---------------------------------------------------------------------------
# loops in the distributed IR
# ---------------------------------------------------------------------------

@ditron.jit
def loop_signals(sig_ptr, n):
    for i in range(n):
        dl.wait(sig_ptr + i, 1, "sys", "acquire", waitValue=1)
        j = 0
        while j < n:
            dl.notify(sig_ptr + j, 0, signal=1, sig_op="add", comm_scope="intra_node")
            j += 1


# ---------------------------------------------------------------------------
# a wrong signal value: every program of a grid blocks on the same word
# ---------------------------------------------------------------------------

@ditron.jit
def wrong_value_kernel(sig_ptr, want):
    dl.notify(sig_ptr, (dl.rank() + 1) % dl.num_ranks(), signal=1, sig_op="set", comm_scope="intra_node")
    dl.wait(sig_ptr, 1, "sys", "acquire", waitValue=want)


def wrong_signal_value(world, want):
    sig = ditron.symm_zeros((1,), torch.int32, name="ready")
    ditron.barrier_all()
    wrong_value_kernel[(9, 3)](sig, want)
    ditron.barrier_all()
    return True


# ---------------------------------------------------------------------------
# ditron.nn: layers that must be the same on every rank, and a wrong width
# ---------------------------------------------------------------------------

def tp_mlp_weights(world, seed_per_rank):
    """TensorParallelMLP.from_linears from nn.Linear layers made after torch.manual_seed(7 + rank)
    (``seed_per_rank``: the usual mistake) or after torch.manual_seed(7)."""
    import ditron.nn as dnn
    from torch import nn
    torch.manual_seed(7 + world.rank if seed_per_rank else 7)
    fc1, fc2 = nn.Linear(24, 40).to(torch.bfloat16), nn.Linear(40, 20).to(torch.bfloat16)
    mlp = dnn.TensorParallelMLP.from_linears(fc1, fc2)
    x = torch.randn(3, 24, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        return list(mlp(x).shape)


def tp_mlp_wrong_width(world):
    """The input has 40 features; the layer takes 24."""
    import ditron.nn as dnn
    from torch import nn
    torch.manual_seed(7)
    mlp = dnn.TensorParallelMLP.from_linears(nn.Linear(24, 40).to(torch.bfloat16), nn.Linear(40, 24).to(torch.bfloat16))
    with torch.no_grad():
        mlp(torch.zeros(3, 40, dtype=torch.bfloat16))
