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
    pass.  Left alone, each with its logged reason: a sub-group (a TP group that is a subset of the ranks), a bias
    added before the reduce-scatter, a gather along dim 1; a group with the world's ranks in order is rewritten."""
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

        # a bias before the reduce-scatter; a gather along dim 1: left alone with their reasons
        def bias_first(x, w1, b1):
            return funcol.reduce_scatter_tensor(torch.nn.functional.linear(torch.cat([x] * W).reshape(-1, H), w1, b1),
                                                "sum", 0, group)

        def dim1(x, w1):
            return torch.matmul(funcol.all_gather_tensor(x, 1, group), w1.t())
        for name, fn, args in (("bias_first", bias_first, (x, w1, b1)), ("dim1", dim1, (x, w1))):
            atp.SKIPPED.clear()
            a = _compile(fn, True)(*args)
            b = _compile(fn, False)(*args)
            assert torch.equal(a, b), name
            out[name] = [r for _, _, r in atp.SKIPPED]
        return out
    finally:
        tdist.destroy_process_group()
