"""Test bodies (run on every rank; see conftest.py) for training with ditron (issue 54): the backward of every
op of ``torch.ops.ditron.*`` and of the ``ditron.nn`` layers against plain torch autograd on the whole (gathered)
data in float32, which every rank regenerates from seeds; the layers' parameters train (optimizer steps move the
shards), and their state dicts save and load shards.

The gradient convention (ditron/torch_ops.py): each rank's output is its own tensor, the loss is the sum over
ranks of each rank's loss; here rank r's loss is ``<y_r, g_r>`` with a random cotangent ``g_r``."""
import copy
import io

import torch
from torch import nn

import ditron
import ditron.nn as dnn
import ditron.torch_ops  # noqa: F401

from bodies_torch import DTYPES, _close, _dev, _rand


def _leaves(ts):
    return [t.detach().float().requires_grad_(True) for t in ts]


def grad_cases(world, dtype, m=5, K=20, N=13, hidden=7):
    """{op: (this rank's inputs, index of the differentiable ones, reference(all ranks' float32 leaves) ->
    every rank's outputs)}; shapes not multiples of any tile."""
    W, R = world.world_size, world.rank
    xs = [_rand((m, hidden), dtype, 1, r) for r in range(W)]
    big = [_rand((W * m, hidden), dtype, 2, r) for r in range(W)]
    a = [_rand((m, K), dtype, 3, r) * 0.5 for r in range(W)]
    ga = [_rand((W * m, K), dtype, 5, r) * 0.5 for r in range(W)]
    b = [_rand((K, N), dtype, 4, r) * 0.5 for r in range(W)]
    rows = lambda t, r, n=m: t[r * n:(r + 1) * n]      # noqa: E731
    cases = {
        "all_reduce": ([xs], lambda x: [sum(x)] * W, ()),
        "all_gather": ([xs], lambda x: [torch.cat(x)] * W, (W,)),
        "reduce_scatter": ([big], lambda x: [rows(sum(x), r) for r in range(W)], (W,)),
        "all_to_all": ([big], lambda x: [torch.cat([rows(x[s], r) for s in range(W)]) for r in range(W)], ()),
    }
    if dtype != torch.float32:
        cases["ag_gemm"] = ([a, b], lambda a, b: [torch.cat(a) @ b[r] for r in range(W)], (W,))
        cases["gemm_rs"] = ([ga, b], lambda a, b: [rows(sum(x @ y for x, y in zip(a, b)), r) for r in range(W)], (W,))
        cases["gemm_ar"] = ([ga, b], lambda a, b: [sum(x @ y for x, y in zip(a, b))] * W, ())
    return cases


def ops_backward_match_torch(world, dtype, ops=None):
    """``(y_r * g_r).sum().backward()`` through each op on every rank equals torch autograd of
    ``sum over ranks of <y_r, g_r>`` on the whole data (float32), for each differentiable input; twice for
    the first op (the second backward reuses the contexts)."""
    dtype = DTYPES[dtype]
    W, R = world.world_size, world.rank
    done = []
    for name, (per_rank, ref_fn, extra) in grad_cases(world, dtype).items():
        if ops is not None and name not in ops:
            continue
        # reference: every rank's inputs as float32 leaves
        leaves = [_leaves(ts) for ts in per_rank]
        ref_out = ref_fn(*leaves)
        cot = [_rand(tuple(ref_out[r].shape), dtype, 50, r) for r in range(W)]
        sum((y * g.float()).sum() for y, g in zip(ref_out, cot)).backward()
        mine = [_dev(world, ts[R]).detach().requires_grad_(True) for ts in per_rank]
        y = getattr(torch.ops.ditron, name)(*mine, *extra)
        _close(y, ref_out[R].detach(), f"rank {R}: {name} forward")
        (y * _dev(world, cot[R])).sum().backward()
        for i, (t, leaf) in enumerate(zip(mine, leaves)):
            assert t.grad is not None, f"rank {R}: {name}: no gradient for input {i}"
            assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
            _close(t.grad, leaf[R].grad, f"rank {R}: {name} gradient of input {i}")
        done.append(name)
    return sorted(done)
