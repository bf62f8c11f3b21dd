"""Test bodies for ditron.async_tp (issue 54): ``torch.compile`` of functions with torch's functional collectives
over a gloo process group on the simulated ranks, with and without the pass."""
import torch

import ditron
import ditron.async_tp as atp
import ditron.torch_ops  # noqa: F401


def _rand(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 0.5).to(dtype)


def _compile(fn, on):
    """``fn`` compiled (inductor) with the pass on (per compile, as an Inductor option) or off."""
    torch._dynamo.reset()
    atp.LOG.clear()
    options = {"post_grad_custom_post_pass": atp.AsyncTPPass()} if on else {}
    # no FX-graph cache: a cached graph (another test run's) is not passed through the pass, so atp.LOG would
    # stay empty (its code has the ditron ops all the same: see _code)
    options["fx_graph_cache"] = False
    return torch.compile(fn, fullgraph=True, backend="inductor", options=options)


def _code(fn, *args):
    """The ditron ops named in the code Inductor generated for ``fn(*args)`` (compiled now)."""
    from torch._inductor.utils import run_and_get_code
    _, codes = run_and_get_code(fn, *args)
    return sorted(op for op in ("ag_gemm", "gemm_rs") if any(f"torch.ops.ditron.{op}" in code for code in codes))


def funcol_forward_backward(world, store_path, m=8, K=16, N=24):
    """``mm(all_gather(x), w1)`` and ``reduce_scatter(mm(h, w2))`` compiled with and without the pass: the
    pass's graphs have ditron.ag_gemm / gemm_rs (forward and backward), outputs and gradients agree."""
    import torch.distributed as tdist
    import torch.distributed._functional_collectives as funcol
    W, R = world.world_size, world.rank
    tdist.init_process_group("gloo", init_method=f"file://{store_path}", rank=R, world_size=W)
    try:
        group = tdist.group.WORLD
        x = _rand((m, K), 100 + R)
        w1 = _rand((K, N), 200 + R)
        w2 = _rand((N, K), 300 + R)

        def fwd(x, w1, w2):
            g = funcol.all_gather_tensor(x, 0, group)
            h = torch.relu(torch.mm(g, w1))
            return funcol.reduce_scatter_tensor(torch.mm(h, w2), "sum", 0, group)

        def train(x, w1, w2):
            g = funcol.all_gather_tensor_autograd(x, 0, group)
            h = torch.relu(torch.mm(g, w1))
            y = funcol.reduce_scatter_tensor_autograd(torch.mm(h, w2), "sum", 0, group)
            return y

        out = {}
        for on in (False, True):
            c = _compile(fwd, on)
            y = c(x, w1, w2)
            out[on, "fwd"] = (y, list(atp.LOG))
            c = _compile(train, on)
            xs, a, b = (t.clone().requires_grad_(True) for t in (x, w1, w2))
            y = c(xs, a, b)
            (y.float() * torch.arange(y.numel()).reshape(y.shape).float().sin()).sum().backward()
            out[on, "train"] = ((y, xs.grad, a.grad, b.grad), list(atp.LOG))
        # the global opt-in (ditron.async_tp.enable, here by its context manager) gives the same graphs
        torch._dynamo.reset()
        atp.LOG.clear()
        with atp.enabled(), torch._inductor.config.patch(fx_graph_cache=False):
            assert atp.is_enabled()
            y = torch.compile(fwd, fullgraph=True, backend="inductor")(x, w1, w2)
            glob = sorted(d for _, d in atp.LOG)
            torch._dynamo.reset()
            code_on = _code(torch.compile(fwd, fullgraph=True, backend="inductor"), x, w1, w2)
        assert not atp.is_enabled()
        torch._dynamo.reset()
        code_off = _code(torch.compile(fwd, fullgraph=True, backend="inductor"), x, w1, w2)
        assert (y.float() - out[True, "fwd"][0].float()).abs().max() == 0

        # not the patterns: the gathered tensor as the right operand, a mean reduce-scatter: left alone
        def other(x, w1, w2):
            g = funcol.all_gather_tensor(x, 0, group)                            # [W m, K]
            left = torch.mm(torch.ones(4, W * m, dtype=x.dtype), g)              # the gathered tensor on the right
            mean = funcol.reduce_scatter_tensor(torch.mm(torch.cat([x] * W), w1), "avg", 0, group)   # not a sum
            return left, mean
        outs_other = {}
        for on in (False, True):
            outs_other[on] = _compile(other, on)(x, w1, w2)
            outs_other[on, "log"] = list(atp.LOG)
        for a, b in zip(outs_other[False], outs_other[True]):
            assert (a.float() - b.float()).abs().max() == 0
        # reference in float32
        xf = torch.cat([_rand((m, K), 100 + r).float() for r in range(W)])
        hs = [torch.relu(xf @ _rand((K, N), 200 + r).float()) for r in range(W)]
        ref = sum(hs[r] @ _rand((N, K), 300 + r).float() for r in range(W))[R * m:(R + 1) * m]
        for key in (False, True):
            y = out[key, "fwd"][0]
            assert y.shape == ref.shape
            assert (y.float() - ref).abs().max() <= 2e-2 * ref.abs().max() + 2e-2, (key, (y.float() - ref).abs().max())
        for t_off, t_on in zip(out[False, "train"][0], out[True, "train"][0]):
            assert t_off.shape == t_on.shape
            err = (t_off.float() - t_on.float()).abs().max()
            assert err <= 2e-2 * t_off.float().abs().max() + 2e-2, err
        return {"off_fwd": sorted(d for _, d in out[False, "fwd"][1]),
                "on_fwd": sorted(d for _, d in out[True, "fwd"][1]),
                "off_train": sorted(d for _, d in out[False, "train"][1]),
                "on_train": sorted(d for _, d in out[True, "train"][1]),
                "global": glob, "code_on": code_on, "code_off": code_off, "not_matched": outs_other[True, "log"]}
    finally:
        tdist.destroy_process_group()


def more_patterns(world, store_path, S=3, B=2, H=16, N=24):
    """Real models' shapes: 3-D activations ``[S, B, H]`` (sequence-parallel on dim 0) through ``F.linear`` with a
    bias (post-grad: reshape -> ``addmm``) and ``matmul`` (reshape -> ``mm`` -> reshape) into a reduce-scatter,
    forward and backward (the autograd collectives): rewritten, outputs and gradients equal those without the
    pass.  A bias row added before the reduce-scatter is rewritten (summed by an all_reduce).  Left alone, each
    with its logged reason: a sub-group (a TP group that is a subset of the ranks), a full ``[M, N]`` addend before
    the reduce-scatter, a gather along dim 1; a group with the world's ranks in order is rewritten."""
    import torch.distributed as tdist
    import torch.distributed._functional_collectives as funcol
    W, R = world.world_size, world.rank
    tdist.init_process_group("gloo", init_method=f"file://{store_path}", rank=R, world_size=W)
    try:
        group = tdist.group.WORLD
        same = tdist.new_group(list(range(W)))                       # the world's ranks, another group object
        sub = tdist.new_group([0])                                    # a TP group of rank 0 only (every rank calls)
        x = _rand((S, B, H), 400 + R)
        w1, b1 = _rand((N, H), 401 + R), _rand((N,), 402 + R)
        w2 = _rand((N, H), 403 + R)

        def block(x, w1, b1, w2, grp=group, autograd=False):
            ag = funcol.all_gather_tensor_autograd if autograd else funcol.all_gather_tensor
            rs = funcol.reduce_scatter_tensor_autograd if autograd else funcol.reduce_scatter_tensor
            g = ag(x, 0, grp)                                                  # [W S, B, H]
            h = torch.relu(torch.nn.functional.linear(g, w1, b1))              # addmm on [W S B, H]
            return rs(torch.matmul(h, w2), "sum", 0, grp)                      # [S, B, H]

        res = {}
        for on in (False, True):
            y = _compile(block, on)(x, w1, b1, w2)
            res[on, "fwd"] = (y, sorted(d for _, d in atp.LOG))
            atp.SKIPPED.clear()
            leaves = [t.clone().requires_grad_(True) for t in (x, w1, b1, w2)]
            y = _compile(lambda *a: block(*a, autograd=True), on)(*leaves)
            (y.float() * torch.arange(y.numel()).reshape(y.shape).float().cos()).sum().backward()
            res[on, "train"] = ([y] + [t.grad for t in leaves], sorted(d for _, d in atp.LOG), list(atp.SKIPPED))
        for key in ("fwd", "train"):
            a, b = res[False, key][0], res[True, key][0]
            for t_off, t_on in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
                assert t_off.shape == t_on.shape, (key, t_off.shape, t_on.shape)
                err = (t_off.float() - t_on.float()).abs().max()
                assert err <= 2e-2 * t_off.float().abs().max() + 2e-2, (key, err)
        # float32 reference of the forward
        xs = torch.cat([_rand((S, B, H), 400 + r).float() for r in range(W)])
        ref = sum(torch.relu(xs @ _rand((N, H), 401 + r).float().t() + _rand((N,), 402 + r).float())
                  @ _rand((N, H), 403 + r).float() for r in range(W))[R * S:(R + 1) * S]
        assert (res[True, "fwd"][0].float() - ref).abs().max() <= 2e-2 * ref.abs().max() + 2e-2

        out = {"fwd": res[True, "fwd"][1], "train": res[True, "train"][1], "off": res[False, "fwd"][1]}
        # a group with the world's ranks in order (another object): rewritten
        _compile(lambda *a: block(*a, grp=same), True)(x, w1, b1, w2)
        out["same_group"] = sorted(d for _, d in atp.LOG)

        # a sub-group (a TP group of rank 0 only; rank 1 is not a member): left alone, with the reason
        def on_sub(x, w1):
            return torch.mm(funcol.all_gather_tensor(x.reshape(-1, H), 0, sub), w1.t())
        atp.SKIPPED.clear()
        atp.LOG.clear()
        if R == 0:
            y_on = _compile(on_sub, True)(x, w1)
            y_off = _compile(on_sub, False)(x, w1)
            assert torch.equal(y_on, y_off)
        out["sub"] = (sorted(d for _, d in atp.LOG), [r for _, _, r in atp.SKIPPED])

        # a bias row before the reduce-scatter (every rank's, here different ones, summed): rewritten, the bias
        # summed by an all_reduce; equal to torch's result within bf16 rounding
        def bias_first(x, w1, b1):
            return funcol.reduce_scatter_tensor(torch.nn.functional.linear(torch.cat([x] * W).reshape(-1, H), w1, b1),
                                                "sum", 0, group)
        a = _compile(bias_first, True)(x, w1, b1)
        out["bias_first"] = sorted(d for _, d in atp.LOG)
        b = _compile(bias_first, False)(x, w1, b1)
        assert (a.float() - b.float()).abs().max() <= 2e-2 * b.float().abs().max() + 2e-2
        ref = sum(torch.cat([_rand((S, B, H), 400 + r).float()] * W).reshape(-1, H) @ _rand((N, H), 401 + r).float().t()
                  + _rand((N,), 402 + r).float() for r in range(W))[R * S * B:(R + 1) * S * B]
        assert (a.float() - ref).abs().max() <= 2e-2 * ref.abs().max() + 2e-2

        # a full [M, N] addend before the reduce-scatter; a gather along dim 1: left alone with their reasons
        def full_addend(x, w1):
            a = torch.cat([x] * W).reshape(-1, H)
            return funcol.reduce_scatter_tensor(torch.addmm(a[:, :1].expand(-1, N).contiguous(), a, w1.t()),
                                                "sum", 0, group)

        def dim1(x, w1):
            return torch.matmul(funcol.all_gather_tensor(x, 1, group), w1.t())
        for name, fn, args in (("full_addend", full_addend, (x, w1)), ("dim1", dim1, (x, w1))):
            atp.SKIPPED.clear()
            a = _compile(fn, True)(*args)
            b = _compile(fn, False)(*args)
            assert torch.equal(a, b), name
            out[name] = [r for _, _, r in atp.SKIPPED]
        return out
    finally:
        tdist.destroy_process_group()


class _MLP(torch.nn.Module):
    """torch's ``MLPModule`` shape: ``net1`` -> relu -> ``net2`` (what torch's micro-pipeline TP test parallelises)."""

    def __init__(self, H, F, bias, act=torch.nn.ReLU):
        super().__init__()
        self.net1 = torch.nn.Linear(H, F, bias=bias)
        self.relu = act()
        self.net2 = torch.nn.Linear(F, H, bias=bias)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class _Block(torch.nn.Module):
    """An attention-free transformer-ish block: ``x + mlp(norm(x))`` (GELU), activations ``[S, B, H]``."""

    def __init__(self, H, F, bias):
        super().__init__()
        self.norm = torch.nn.LayerNorm(H, bias=bias)
        # GELU, not ReLU: a ReLU's mask flips where a pre-activation is within a bf16 rounding of 0 (the fused
        # ag_gemm + bias rounds twice, addmm once), which moves a single gradient element by ~10% of the max
        self.mlp = _MLP(H, F, bias, act=torch.nn.GELU)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def _plan(kind):
    """The sequence-parallel plan (torch's micro-pipeline TP test's, plus ``SequenceParallel`` for the norm)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    if kind == "mlp":
        return {"net1": ColwiseParallel(input_layouts=Shard(0)), "net2": RowwiseParallel(output_layouts=Shard(0))}
    return {"norm": SequenceParallel(sequence_dim=0),
            "mlp.net1": ColwiseParallel(input_layouts=Shard(0)),
            "mlp.net2": RowwiseParallel(output_layouts=Shard(0))}


def _ops_in(code):
    return sorted(op for op in ("torch.ops.ditron.ag_gemm", "torch.ops.ditron.gemm_rs",
                                "_c10d_functional.all_gather_into_tensor", "_c10d_functional.reduce_scatter_tensor",
                                "_c10d_functional.all_reduce") if op in code)


def dtensor_tp(world, store_path, kind="mlp", bias=False, rows=4, B=2, H=16, F=24, with_off=True):
    """A plain torch model parallelised with ``parallelize_module`` (sequence-parallel: ``ColwiseParallel(
    input_layouts=Shard(0))`` + ``RowwiseParallel(output_layouts=Shard(0))``, and ``SequenceParallel`` for the
    block's norm) on a ``DeviceMesh`` over a gloo group, compiled with ``torch.compile(fullgraph=True)`` with
    ``ditron.async_tp.enable()`` on (and off: ``with_off``), one forward + backward each: returns, per run, the
    collectives / ditron ops named in Inductor's generated code (``codes``: forward graph's, backward graph's), the
    pass's log and what it left alone; the loss, the input's and every parameter's gradient agree with single-device
    torch and (``with_off``) with the run without the pass."""
    import torch.distributed as tdist
    from torch.distributed.tensor import DeviceMesh, DTensor
    from torch.distributed.tensor.parallel import parallelize_module
    from torch._inductor.utils import run_and_get_code
    W, R = world.world_size, world.rank
    tdist.init_process_group("gloo", init_method=f"file://{store_path}", rank=R, world_size=W)
    try:
        mesh = DeviceMesh("cpu", torch.arange(W))

        def model():
            torch.manual_seed(7)                                    # the same full weights on every rank
            return (_MLP(H, F, bias) if kind == "mlp" else _Block(H, F, bias))

        shape = (rows, H) if kind == "mlp" else (rows, B, H)        # this rank's rows (the sequence's shard)
        xs = [_rand(shape, 500 + r) for r in range(W)]
        probe = [_rand(shape, 600 + r).float() for r in range(W)]   # a loss that weighs every output element

        def step(m, x):
            y = m(x)
            loss = (y.float() * probe[R]).sum()
            loss.backward()
            return y.detach(), loss.detach()

        res = {}
        for on in ((False, True) if with_off else (True,)):
            m = parallelize_module(model().to(torch.bfloat16), mesh, _plan(kind))
            x = xs[R].clone().requires_grad_(True)
            torch._dynamo.reset()
            atp.LOG.clear()
            atp.SKIPPED.clear()
            with torch._inductor.config.patch(fx_graph_cache=False):
                if on:
                    atp.enable()
                try:
                    c = torch.compile(m, fullgraph=True, backend="inductor")
                    (y, loss), codes = run_and_get_code(step, c, x)
                finally:
                    if on:
                        atp.disable()
            grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).float()
                     for n, p in m.named_parameters()}
            total = loss.clone()
            tdist.all_reduce(total)
            res[on] = dict(y=y.float(), loss=total, xgrad=x.grad.float(), grads=grads, codes=[_ops_in(c) for c in codes],
                           log=sorted(d for _, d in atp.LOG), skipped=[r for _, _, r in atp.SKIPPED])

        # single-device torch (eager, the same bf16 weights and inputs) on the whole sequence; not float32: the
        # block's bf16 LayerNorm and ReLU masks put every bf16 run ~15% (of the max) off a float32 one in the
        # norm's / net1's gradients, with or without the pass
        ref = model().to(torch.bfloat16)
        xf = torch.cat(xs).requires_grad_(True)
        y_ref = ref(xf).float()
        loss_ref = (y_ref * torch.cat(probe)).sum()
        loss_ref.backward()
        loss_scale = (y_ref.abs() * torch.cat(probe).abs()).sum().item()  # the loss sums terms that cancel
        y_ref = y_ref.detach()[R * rows:(R + 1) * rows]
        ref_grads = {n: p.grad.float() for n, p in ref.named_parameters()}
        xgrad_ref = xf.grad[R * rows:(R + 1) * rows].float()

        def close(a, b, what, tol=3e-2, scale=None):
            # bf16 both sides: a few bf16 roundings apart (the fused ops round the GEMM once, torch's reduce-scatter
            # sums rounded partials; the loss is a sum with cancellation)
            assert a.shape == b.shape, (what, a.shape, b.shape)
            err = (a - b).abs().max().item()
            scale = b.abs().max().item() if scale is None else scale
            assert err <= tol * scale + 1e-3, (what, err, scale)

        for on, r in res.items():
            close(r["y"], y_ref, f"y on={on}")
            close(r["loss"], loss_ref.detach(), f"loss on={on}", scale=loss_scale)
            close(r["xgrad"], xgrad_ref, f"x.grad on={on}")
            assert sorted(r["grads"]) == sorted(ref_grads), (sorted(r["grads"]), sorted(ref_grads))
            for n in ref_grads:
                close(r["grads"][n], ref_grads[n], f"{n}.grad on={on}")
        if with_off:
            close(res[True]["y"], res[False]["y"], "y on vs off")
            close(res[True]["loss"], res[False]["loss"], "loss on vs off", scale=loss_scale)
            close(res[True]["xgrad"], res[False]["xgrad"], "x.grad on vs off")
            for n in ref_grads:
                close(res[True]["grads"][n], res[False]["grads"][n], f"{n}.grad on vs off")
        out = {on: {k: r[k] for k in ("codes", "log", "skipped")} for on, r in res.items()}
        return out
    finally:
        tdist.destroy_process_group()
