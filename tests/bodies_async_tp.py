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
