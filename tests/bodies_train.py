"""Test bodies (run on every rank; see conftest.py) for training with ditron (issue 54): the backward of every
op of ``torch.ops.ditron.*`` and of the ``ditron.nn`` layers against plain torch autograd on the whole (gathered)
data in float32, which every rank regenerates from seeds; the layers' parameters train (optimizer steps move the
shards), and their state dicts save and load shards.

The gradient convention (ditron/torch_ops.py): each rank's output is its own tensor, the loss is the sum over
ranks of each rank's loss; here rank r's loss is ``<y_r, g_r>`` with a random cotangent ``g_r``."""
import copy

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
    W = world.world_size
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


#: the ditron ops each op's backward runs (its kernels, not a fallback to torch.distributed)
BACKWARD_OPS = {"all_reduce": {"all_reduce"}, "all_gather": {"reduce_scatter"}, "reduce_scatter": {"all_gather"},
                "all_to_all": {"all_to_all"}, "ag_gemm": {"gemm_rs", "all_gather"},
                "gemm_rs": {"ag_gemm", "all_gather"}, "gemm_ar": {"all_reduce"}}


class DitronOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the names of the ``torch.ops.ditron.*`` ops that run under it."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "ditron":
            self.ops.add(func._opname)
        return func(*args, **(kwargs or {}))


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
        with DitronOps() as seen:
            (y * _dev(world, cot[R])).sum().backward()
        assert seen.ops == BACKWARD_OPS[name], f"{name}'s backward ran {seen.ops}"
        for i, (t, leaf) in enumerate(zip(mine, leaves)):
            assert t.grad is not None, f"rank {R}: {name}: no gradient for input {i}"
            assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
            _close(t.grad, leaf[R].grad, f"rank {R}: {name} gradient of input {i}")
        done.append(name)
    return sorted(done)


# ---------------------------------------------------------------------------
# ditron.nn layers
# ---------------------------------------------------------------------------

def _full_mlp(d, hidden, d_out, dtype, bias, seed=11):
    torch.manual_seed(seed)
    fc1, fc2 = nn.Linear(d, hidden, bias=bias), nn.Linear(hidden, d_out, bias=bias)
    with torch.no_grad():
        for p in list(fc1.parameters()) + list(fc2.parameters()):
            p.mul_(2.0)
    return fc1.to(dtype), fc2.to(dtype)


def _shard_ref(t, dim, R, W):
    return dnn.shard(t, dim, R, W)[0]


def tp_mlp_backward(world, dtype, reduce="rs", bias=True, m=5, d=24, hidden=40, d_out=20):
    """TensorParallelMLP (fc1 column-parallel by AG-GEMM, fc2 row-parallel by GEMM-RS or GEMM-AR): the input
    gradient and every parameter's gradient (this rank's shards, the replicated bias summed over ranks) equal
    torch autograd of the unsharded float32 MLP with loss ``sum over ranks of <y_r, g_r>``."""
    dtype = DTYPES[dtype]
    W, R = world.world_size, world.rank
    fc1, fc2 = _full_mlp(d, hidden, d_out, dtype, bias)
    mlp = dnn.TensorParallelMLP.from_linears(fc1, fc2, reduce=reduce).to(world.device)
    assert all(p.requires_grad for p in mlp.parameters())
    x = _rand((W * m, d), dtype, 9)
    f1, f2 = copy.deepcopy(fc1).float(), copy.deepcopy(fc2).float()
    xf = x.float().requires_grad_(True)
    y_ref = f2(torch.nn.functional.gelu(f1(xf)))
    if reduce == "rs":      # rank r's output: its rows; its cotangent: those rows of one full cotangent
        cot = _rand(tuple(y_ref.shape), dtype, 60)
        mine = cot[R * m:(R + 1) * m]
        total = cot.float()
    else:                   # every rank's output is all rows; each rank its own cotangent
        cots = [_rand(tuple(y_ref.shape), dtype, 61, r) * 0.5 for r in range(W)]
        mine, total = cots[R], sum(c.float() for c in cots)
    (y_ref * total).sum().backward()
    xr = _dev(world, x[R * m:(R + 1) * m]).requires_grad_(True)
    y = mlp(xr)
    _close(y, y_ref.detach()[R * m:(R + 1) * m] if reduce == "rs" else y_ref.detach(), f"rank {R}: forward")
    (y * _dev(world, mine)).sum().backward()
    what = f"rank {R}: TensorParallelMLP({reduce}) gradient of"
    _close(xr.grad, xf.grad[R * m:(R + 1) * m], f"{what} the input")
    _close(mlp.fc1.weight.grad, _shard_ref(f1.weight.grad, 0, R, W), f"{what} fc1.weight")
    _close(mlp.fc2.weight.grad, _shard_ref(f2.weight.grad, 1, R, W), f"{what} fc2.weight")
    if bias:
        _close(mlp.fc1.bias.grad, _shard_ref(f1.bias.grad, 0, R, W), f"{what} fc1.bias")
        _close(mlp.fc2.bias.grad, f2.bias.grad, f"{what} fc2.bias")
    assert mlp.fc1.weight.grad.stride() == mlp.fc1.weight.stride(), "gradient layout differs from the weight's"
    return True


def frozen_weights_now_train(world, inference, steps=3, m=4, d=16, hidden=24):
    """The issue's planted mistake: a TP MLP from ``from_linears`` with a trainable head after it, trained with
    AdamW.  Now every parameter, the TP shards included, changes (and stays equal across ranks where
    replicated), and the loss drops; with ``inference=True`` the training step is an error naming the fix."""
    W, R = world.world_size, world.rank
    dtype = torch.bfloat16
    torch.manual_seed(3)
    fc1, fc2 = nn.Linear(d, hidden).to(dtype), nn.Linear(hidden, d).to(dtype)
    head = nn.Linear(d, 1).to(dtype).to(world.device)
    try:
        mlp = dnn.TensorParallelMLP.from_linears(fc1, fc2, inference=inference).to(world.device)
    except ditron.DitronError as e:
        return str(e)
    params = list(mlp.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2)
    before = [p.detach().clone() for p in mlp.parameters()]
    x = _dev(world, _rand((W * m, d), dtype, 70)[R * m:(R + 1) * m])
    target = _dev(world, _rand((W * m, 1), dtype, 71)[R * m:(R + 1) * m])
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        try:
            loss = ((head(mlp(x)) - target).float() ** 2).mean()
        except ditron.DitronError as e:
            return str(e)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    changed = [bool((p.detach() != b).any()) for p, b in zip(mlp.parameters(), before)]
    assert all(changed), f"rank {R}: parameters that did not change: {changed}"
    # the replicated bias of fc2: the same on every rank after the steps
    everyone = torch.ops.ditron.all_gather(mlp.fc2.bias.detach().float(), W).reshape(W, -1)
    assert (everyone == everyone[0]).all(), f"rank {R}: fc2.bias differs across ranks after training"
    return losses[-1] < losses[0]


def state_dict_round_trip(world, tmp_dir, m=3, d=16, hidden=20):
    """A trained layer's state dict (this rank's shards) saved with torch.save and loaded into a layer built
    from other weights gives the same outputs; loading another rank's state dict is an error."""
    W, R = world.world_size, world.rank
    dtype = torch.bfloat16
    fc1, fc2 = _full_mlp(d, hidden, d, dtype, True, seed=1)
    mlp = dnn.TensorParallelMLP.from_linears(fc1, fc2).to(world.device)
    x = _dev(world, _rand((W * m, d), dtype, 80)[R * m:(R + 1) * m])
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-2)
    mlp(x).float().pow(2).mean().backward()
    opt.step()
    path = f"{tmp_dir}/tp_mlp_rank{R}.pt"
    torch.save(mlp.state_dict(), path)
    other = dnn.TensorParallelMLP.from_linears(*_full_mlp(d, hidden, d, dtype, True, seed=2)).to(world.device)
    with torch.no_grad():
        assert not torch.equal(other(x), mlp(x))
        other.load_state_dict(torch.load(path))
        assert torch.equal(other(x), mlp(x)), f"rank {R}: outputs differ after loading the state dict"
    assert other.fc1.weight.t().is_contiguous(), "loading changed the weight's layout"
    ditron.barrier_all()
    if W == 1:
        return "one rank"
    try:
        other.load_state_dict(torch.load(f"{tmp_dir}/tp_mlp_rank{(R + 1) % W}.pt"))
    except ditron.DitronError as e:
        return str(e).split(":", 1)[1].split(";")[0].strip()
    return None


def compiled_backward_matches_eager(world, backend, m=5, d=24, hidden=40):
    """``torch.compile(fullgraph=True)`` of a TP MLP's forward and backward (AOTAutograd traces the backward's
    ditron ops through their fake implementations): the gradients equal eager's, and the backward graph holds
    the ditron ops."""
    W, R = world.world_size, world.rank
    dtype = torch.bfloat16
    fc1, fc2 = _full_mlp(d, hidden, d, dtype, True)
    eager = dnn.TensorParallelMLP.from_linears(fc1, fc2).to(world.device)
    comp = copy.deepcopy(eager)
    x = _dev(world, _rand((W * m, d), dtype, 90)[R * m:(R + 1) * m])
    cot = _dev(world, _rand((m, d), dtype, 91, R))

    graphs = []

    def record(gm, example_inputs):            # the backend sees AOTAutograd's forward and backward graphs
        from functorch.compile import make_boxed_func
        graphs.append(str(gm.graph))
        return make_boxed_func(gm.forward)

    if backend == "record":
        from torch._dynamo.backends.common import aot_autograd
        backend = aot_autograd(fw_compiler=record, bw_compiler=record)
    torch._dynamo.reset()
    step = torch.compile(lambda mod, x: (mod(x) * cot).sum(), fullgraph=True, backend=backend)
    for mod, fn in ((eager, lambda mod, x: (mod(x) * cot).sum()), (comp, step)):
        xi = x.clone().requires_grad_(True)
        fn(mod, xi).backward()
        mod.x_grad = xi.grad
    for (name, p), q in zip(eager.named_parameters(), comp.parameters()):
        _close(q.grad, p.grad, f"rank {R}: compiled gradient of {name}", rel=1e-2)
    _close(comp.x_grad, eager.x_grad, f"rank {R}: compiled gradient of the input", rel=1e-2)
    if graphs:
        assert len(graphs) == 2, len(graphs)
        fw, bw = graphs
        assert "ditron.ag_gemm" in fw and "ditron.gemm_rs" in fw, fw
        assert "ditron.gemm_rs" in bw and "ditron.ag_gemm" in bw and "ditron.all_gather" in bw, bw
    return True


# ---------------------------------------------------------------------------
# a tiny tensor-parallel transformer block (attention + MLP, sequence parallel) trained with AdamW
# ---------------------------------------------------------------------------

class Block(nn.Module):
    """Pre-norm block on ``x [S, d]``: ``x + attn(ln1(x))``, then ``+ mlp(ln2(.))`` (causal attention, ``heads``
    heads).  ``tp=True``: the same block tensor- and sequence-parallel from a full one -- rows ``[S / W, d]`` in
    and out, q / k / v column-parallel (AllGather-GEMM; this rank's heads), the output projection and fc2
    row-parallel (GEMM-ReduceScatter), layer norms on this rank's rows with their gradients summed over ranks."""

    def __init__(self, d=32, heads=4, hidden=48, full=None, dtype=torch.float32):
        super().__init__()
        self.heads = heads
        if full is None:
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
            self.to(dtype)
            return
        W = ditron.torch_ops.current_world().world_size
        self.heads = heads // W
        self.ln1, self.ln2 = (dnn.SequenceParallelLayerNorm(d).to(dtype) for _ in range(2))
        self.ln1.load_state_dict(full.ln1.state_dict())
        self.ln2.load_state_dict(full.ln2.state_dict())
        col, row = dnn.ColumnParallelLinear.from_linear, dnn.RowParallelLinear.from_linear
        self.q, self.k, self.v = col(full.q), col(full.k), col(full.v)
        self.o, self.fc1, self.fc2 = row(full.o), col(full.fc1), row(full.fc2)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = (f(h) for f in (self.q, self.k, self.v))      # [S, heads * hd] (tp: every row, this rank's heads)
        S = q.shape[0]
        q, k, v = (t.reshape(S, self.heads, -1).transpose(0, 1) for t in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(0, 1).reshape(S, -1))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def train_block(world, steps=20, m=6, d=32, lr=1e-2):
    """20 AdamW steps of the TP block (bf16, rows ``[m, d]`` per rank; rank r's loss the squared error of its
    rows over all ``W * m * d`` elements, so that the sum over ranks is the mean) and of the same single-device
    block in float32 on the whole sequence: the loss curves agree within bf16 tolerance, the loss falls, and
    the replicated parameters stay equal on every rank."""
    W, R = world.world_size, world.rank
    torch.manual_seed(5)
    full = Block(d=d, dtype=torch.bfloat16)            # the same on every rank; its bf16 values start both models
    ref = copy.deepcopy(full).float()
    tp = Block(d=d, full=full, dtype=torch.bfloat16).to(world.device)
    x = _rand((W * m, d), torch.bfloat16, 100)
    target = _rand((W * m, d), torch.bfloat16, 101)
    xr, tr = _dev(world, x[R * m:(R + 1) * m]), _dev(world, target[R * m:(R + 1) * m])
    opt_tp = torch.optim.AdamW(tp.parameters(), lr=lr)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=lr)
    curve, ref_curve = [], []
    for _ in range(steps):
        opt_tp.zero_grad()
        loss = ((tp(xr).float() - tr.float()) ** 2).sum() / (W * m * d)
        loss.backward()
        opt_tp.step()
        curve.append(torch.ops.ditron.all_reduce(loss.detach().reshape(1)).item())
        opt_ref.zero_grad()
        ref_loss = ((ref(x.float()) - target.float()) ** 2).mean()
        ref_loss.backward()
        opt_ref.step()
        ref_curve.append(ref_loss.item())
    for i, (a, b) in enumerate(zip(curve, ref_curve)):
        assert abs(a - b) <= 0.04 * b + 0.002, f"rank {R}: step {i}: loss {a}, single-device {b}\n{curve}\n{ref_curve}"
    assert ref_curve[-1] < 0.6 * ref_curve[0], ref_curve
    for name, p in tp.named_parameters():
        if name.startswith(("ln", "o.bias", "fc2.bias")):       # replicated: equal on every rank
            every = torch.ops.ditron.all_gather(p.detach().float().reshape(1, -1), W)
            assert (every == every[0]).all(), f"rank {R}: {name} differs across ranks"
    return [round(c, 3) for c in curve[::5]]


def opcheck_with_grad(world, dtype="bf16"):
    """torch.library.opcheck of every op with inputs that require grad: the autograd registration and
    AOTAutograd's dynamic-shape trace of forward and backward (fake tensors of the backward's ops)."""
    from torch.library import opcheck
    dtype = DTYPES[dtype]
    done = []
    for name, (per_rank, _, extra) in grad_cases(world, dtype).items():
        args = [_dev(world, ts[world.rank]).detach().requires_grad_(True) for ts in per_rank]
        opcheck(getattr(torch.ops.ditron, name).default, (*args, *extra),
                test_utils=("test_autograd_registration", "test_aot_dispatch_dynamic"))
        done.append(name)
    return sorted(done)


# ---------------------------------------------------------------------------
# mixture of experts, expert parallel: EP dispatch -> grouped GEMM experts -> EP combine, trained
# ---------------------------------------------------------------------------

def _full_moe(H, F, E, dtype, seed=21):
    torch.manual_seed(seed)
    gate = nn.Linear(H, E, bias=False)
    with torch.no_grad():
        gate.weight.mul_(3.0)
    w1 = (torch.randn(E, H, F) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E, F, H) / F ** 0.5).to(dtype)
    return gate.to(dtype), w1, w2


def moe_reference(x, gate_w, w1, w2, idx, act=torch.nn.functional.gelu, normalize=True):
    """Single-device MoE in whatever dtype the arguments have: ``out[t] = sum_j p[t, j] * act(x[t] @ w1[e]) @
    w2[e]`` with ``p`` the softmax probabilities of ``x @ gate^T`` at ``idx`` (renormalized)."""
    probs = torch.softmax(x @ gate_w.t(), -1)
    w = probs.gather(1, idx.long())
    if normalize:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for j in range(idx.shape[1]):
        for e in range(w1.shape[0]):
            m = idx[:, j] == e
            if m.any():
                out = out.index_add(0, m.nonzero()[:, 0], w[m, j, None] * (act(x[m] @ w1[e]) @ w2[e]))
    return out


def moe_backward(world, dtype="bf16", tokens=(5, 3, 4), H=24, F=20, E=6, k=2, dup=False):
    """ExpertParallelMoE (gate, EP dispatch, grouped-GEMM experts, EP combine) on every rank's own tokens (a different
    number per rank): the output, the input gradient, the gate's (summed over ranks) and this rank's experts' weight
    gradients equal torch autograd of the single-device float32 layer on all tokens, loss ``sum over ranks of
    <y_r, g_r>``.  The routing is the layer's top-k, which the reference takes (a discrete choice); ``dup``: a
    forced routing with tokens routed twice to one expert.  Returns the ditron ops / kernels' calls seen."""
    dtype = DTYPES[dtype]
    W, R = world.world_size, world.rank
    gate, w1, w2 = _full_moe(H, F, E, dtype)
    # dup: no renormalization (a token's two equal weights would be 1/2 whatever the gate: no gradient to check)
    moe = dnn.ExpertParallelMoE.from_experts(gate, w1, w2, topk=k, max_tokens=max(tokens),
                                             normalize=not dup).to(world.device)
    assert all(p.requires_grad for p in moe.parameters())
    T = [tokens[r % len(tokens)] for r in range(W)]
    xs = [_rand((T[r], H), dtype, 30, r) for r in range(W)]
    if dup:        # every third token routed twice to one expert, the others to two
        idxs = [torch.tensor([[(t + r) % E, (t + r) % E if t % 3 == 0 else (t + r + 1 + t % 2) % E]
                              for t in range(T[r])], dtype=torch.int64).reshape(T[r], k) for r in range(W)]
    else:          # the gate's choice, computed as the layer does on each rank's tokens
        idxs = [torch.softmax(torch.nn.functional.linear(x.float(), gate.weight.float()), -1).topk(k, -1)[1]
                for x in xs]
    # reference: float32 on all ranks' tokens
    xf = torch.cat(xs).float().requires_grad_(True)
    gf, w1f, w2f = (t.detach().float().requires_grad_(True) for t in (gate.weight, w1, w2))
    ref = moe_reference(xf, gf, w1f, w2f, torch.cat(idxs), normalize=not dup)
    cots = [_rand((T[r], H), dtype, 31, r) for r in range(W)]
    (ref * torch.cat(cots).float()).sum().backward()
    lo = sum(T[:R])
    xr = _dev(world, xs[R]).requires_grad_(True)
    before = dict(moe.ep_ctx.launches)
    y = moe(xr, topk_idx=_dev(world, idxs[R]) if dup else None)
    if not dup:
        got_idx = moe.route(xr.detach())[0].cpu()
        assert torch.equal(got_idx, idxs[R]), f"rank {R}: routing {got_idx.tolist()} vs {idxs[R].tolist()}"
    _close(y, ref.detach()[lo:lo + T[R]], f"rank {R}: MoE forward")
    fwd = {n: moe.ep_ctx.launches.get(n, 0) - before.get(n, 0) for n in ("dispatch", "combine")}
    (y * _dev(world, cots[R])).sum().backward()
    bwd = {n: moe.ep_ctx.launches.get(n, 0) - before.get(n, 0) - fwd[n] for n in ("dispatch", "combine")}
    what = f"rank {R}: ExpertParallelMoE gradient of"
    El = E // W
    _close(xr.grad, xf.grad[lo:lo + T[R]], f"{what} the input")
    _close(moe.gate.grad, gf.grad, f"{what} the gate")
    _close(moe.w1.grad, w1f.grad[R * El:(R + 1) * El], f"{what} w1 (this rank's experts)")
    _close(moe.w2.grad, w2f.grad[R * El:(R + 1) * El], f"{what} w2 (this rank's experts)")
    return {"forward": fwd, "backward": bwd, "aux": dict(moe.aux_ctx.launches)}


def moe_trains(world, steps=12, T=6, H=16, F=24, E=4, k=2, lr=2e-2):
    """A MoE layer with a residual, trained ``steps`` AdamW steps on every rank's tokens (rank r's loss its rows'
    squared error over all ranks' elements), against the same single-device float32 layer: the loss curves agree
    (bf16 tolerance), the loss falls, the gate stays equal on every rank."""
    W, R = world.world_size, world.rank
    gate, w1, w2 = _full_moe(H, F, E * W, torch.bfloat16, seed=22)
    moe = dnn.ExpertParallelMoE.from_experts(gate, w1, w2, topk=k, max_tokens=T).to(world.device)
    gf, w1f, w2f = (nn.Parameter(t.detach().float().clone()) for t in (gate.weight, w1, w2))
    x = _rand((W * T, H), torch.bfloat16, 40)
    target = _rand((W * T, H), torch.bfloat16, 41) * 0.5
    xr, tr = _dev(world, x[R * T:(R + 1) * T]), _dev(world, target[R * T:(R + 1) * T])
    opt = torch.optim.AdamW(moe.parameters(), lr=lr)
    opt_ref = torch.optim.AdamW([gf, w1f, w2f], lr=lr)
    curve, ref_curve = [], []
    for _ in range(steps):
        opt.zero_grad()
        idx = moe.route(xr)[0]
        loss = ((xr + moe(xr, topk_idx=idx)).float() - tr.float()).pow(2).sum() / (W * T * H)
        loss.backward()
        opt.step()
        curve.append(torch.ops.ditron.all_reduce(loss.detach().reshape(1)).item())
        # the reference takes the ranks' routing (discrete: the same choice, the same gradients)
        idx_all = torch.ops.ditron.all_gather(idx.float(), W).cpu().long()
        opt_ref.zero_grad()
        ref = ((x.float() + moe_reference(x.float(), gf, w1f, w2f, idx_all)) - target.float()).pow(2).mean()
        ref.backward()
        opt_ref.step()
        ref_curve.append(ref.item())
    for i, (a, b) in enumerate(zip(curve, ref_curve)):
        assert abs(a - b) <= 0.04 * b + 0.002, f"rank {R}: step {i}: loss {a}, single-device {b}\n{curve}\n{ref_curve}"
    assert curve[-1] < 0.9 * curve[0], curve
    every = torch.ops.ditron.all_gather(moe.gate.detach().float().reshape(1, -1), W)
    assert (every == every[0]).all(), f"rank {R}: the gate differs across ranks after training"
    return [round(c, 3) for c in curve[::4]]
