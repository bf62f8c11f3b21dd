"""``ditron bench train_tp``: a tensor-parallel training step (forward + backward + AdamW) of a TP MLP and of a TP
transformer block (sequence parallel, Megatron-style) with ditron's layers, against torch's own TP on the same
model in the same run, and the loss curve of every implementation against single-device torch in float32.

    torchrun --standalone --nproc-per-node 1 -m ditron.bench train_tp --tokens 4096 --hidden 4096 --ffn 14336
    DITRON_RANKS_PER_GPU=2 torchrun --standalone --nproc-per-node 2 -m ditron.bench train_tp    # 2 ranks, 1 GPU
    ditron sim -n 2 -m ditron.bench train_tp --tokens 16 --hidden 32 --ffn 48 --heads 4 --steps 4 --iters 1 --warmup 1

Models (no biases, layer norms without affine parameters: every parameter is sharded): ``mlp`` = ``fc2(gelu(
fc1(x)))``; ``block`` = ``x + o(attn(q, k, v of ln(x)))``, then ``+ mlp(ln(.))`` (causal SDPA, this rank's heads).
Input and output: this rank's rows ``[tokens / W, d]``.  Implementations (those that cannot run here are reported
as such, e.g. torch's functional collectives without a torch.distributed group on the simulator):

* ``ditron`` -- ``ditron.nn.ColumnParallelLinear`` (AllGather-GEMM) / ``RowParallelLinear`` (GEMM-ReduceScatter),
  eager; their backward runs GEMM-RS / AG-GEMM (docs/torch.md);
* ``ditron+compile`` -- the same model under ``torch.compile`` (forward and backward graphs hold the ditron ops);
* ``torch_funcol`` -- torch's TP: ``all_gather_tensor_autograd -> mm`` and ``mm -> reduce_scatter_tensor_autograd``
  (NCCL), eager (what DTensor's ``parallelize_module`` runs);
* ``torch_funcol+ditron_async_tp`` -- that model compiled with ``ditron.async_tp``'s pass (the collectives become
  ditron.ag_gemm / gemm_rs);
* ``torch_async_tp`` -- that model compiled with torch's micro-pipeline TP (``_micro_pipeline_tp``, its symmetric
  memory fused ops; CUDA only);
* ``torch_1gpu`` -- the unsharded model on the whole sequence (plain torch; at world size 1 the same work).

Checked first: ``--steps`` training steps of every implementation from the same weights on the same data; the
loss curve (the sum over ranks of each rank's loss = the mean squared error) must match the single-device float32
model's within ``0.04 * loss + 0.002`` per step.  Then timed: one step (zero_grad, forward, loss, backward,
``optimizer.step()``), the harness's rounds in alternating order, the best round's median of the slowest rank.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys

from .harness import Impl, add_run_args, agree_fn, measure, result_meta


def _nn():
    import torch
    from torch import nn

    class Full(nn.Module):
        """The unsharded model."""

        def __init__(self, kind, d, ffn, heads):
            super().__init__()
            self.kind, self.heads = kind, heads
            self.fc1, self.fc2 = nn.Linear(d, ffn, bias=False), nn.Linear(ffn, d, bias=False)
            if kind == "block":
                self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))

        def forward(self, x):
            return tp_forward(self, x, lambda lin, t: lin(t), lambda lin, t: lin(t), self.heads)

    def tp_forward(m, x, col, row, heads):
        """The model on rows ``x`` with ``col(layer, t)`` / ``row(layer, t)`` for the column- / row-parallel
        linears (full layers: plain calls)."""
        F = torch.nn.functional
        if m.kind == "mlp":
            return row(m.fc2, F.gelu(col(m.fc1, x)))
        d = x.shape[1]
        h = F.layer_norm(x, (d,))
        q, k, v = (col(lin, h) for lin in (m.q, m.k, m.v))              # [S, heads_local * hd]
        S = q.shape[0]
        q, k, v = (t.reshape(S, heads, -1).transpose(0, 1) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + row(m.o, a.transpose(0, 1).reshape(S, -1))
        return x + row(m.fc2, F.gelu(col(m.fc1, F.layer_norm(x, (d,)))))

    return Full, tp_forward


def build(kind, impl, full, world, group, heads):
    """``(module, forward(x_rows) -> y_rows)`` of implementation ``impl`` from the full model ``full``."""
    import torch
    from torch import nn

    import ditron.nn as dnn
    _, tp_forward = _nn()
    W, R = world.world_size, world.rank
    names = ["fc1", "fc2"] + (["q", "k", "v", "o"] if kind == "block" else [])
    rows_of = {"fc2", "o"}
    if impl == "torch_1gpu":
        m = copy.deepcopy(full)
        return m, m
    m = nn.Module()
    m.kind = kind
    for n in names:
        w = getattr(full, n).weight
        shard = dnn.shard(w, 1 if n in rows_of else 0, R, W)[0]
        if impl.startswith("ditron"):
            layer = (dnn.RowParallelLinear if n in rows_of else dnn.ColumnParallelLinear)(shard)
        else:
            layer = nn.Module()
            layer.weight = nn.Parameter(shard.t().contiguous().t())
        setattr(m, n, layer)
    hl = heads // W
    if impl.startswith("ditron"):
        fwd = lambda x: tp_forward(m, x, lambda lin, t: lin(t), lambda lin, t: lin(t), hl)   # noqa: E731
    else:
        import torch.distributed._functional_collectives as funcol

        def col(lin, t):
            return torch.mm(funcol.all_gather_tensor_autograd(t, 0, group), lin.weight.t())

        def row(lin, t):
            return funcol.reduce_scatter_tensor_autograd(torch.mm(t, lin.weight.t()), "sum", 0, group)
        fwd = lambda x: tp_forward(m, x, col, row, hl)   # noqa: E731
    return m, fwd


def compiled(fwd, impl, group):
    """``fwd`` under torch.compile with the implementation's Inductor options (compiled at the first call)."""
    import torch
    import ditron.async_tp as atp
    options = {}
    if impl == "torch_funcol+ditron_async_tp":
        options["post_grad_custom_post_pass"] = atp.AsyncTPPass()
    c = torch.compile(fwd, options=options or None)
    if impl != "torch_async_tp":
        return c

    def run(x):
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
        enable_symm_mem_for_group(group.group_name)
        with torch._inductor.config.patch(_micro_pipeline_tp=True):
            return c(x)
    return run


def main(argv):
    p = argparse.ArgumentParser(prog="ditron bench train_tp", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,block", help="comma list of mlp, block")
    p.add_argument("--tokens", type=int, default=4096, help="whole sequence (a multiple of the world size)")
    p.add_argument("--hidden", type=int, default=4096, help="model width d")
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="training steps of the loss-curve check")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--impls", default="ditron,ditron+compile,torch_funcol,torch_funcol+ditron_async_tp,"
                                      "torch_async_tp,torch_1gpu")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    add_run_args(p)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    import ditron
    import ditron.torch_ops  # noqa: F401
    from .harness import _release
    world = ditron.init()
    W, R, dev = world.world_size, world.rank, world.device
    for name, v in (("tokens", args.tokens), ("hidden", args.hidden), ("ffn", args.ffn), ("heads", args.heads)):
        if v % W:
            raise SystemExit(f"ditron bench train_tp: --{name}={v} is not a multiple of the world size {W}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    group = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
    cuda = str(dev).startswith("cuda")
    Full, _ = _nn()
    agree = agree_fn(world)
    m = args.tokens // W
    rows = []

    def total(loss):
        return torch.ops.ditron.all_reduce(loss.detach().float().reshape(1).to(dev)).item()

    for kind in (k for k in args.models.split(",") if k):
        torch.manual_seed(1234)
        full = Full(kind, args.hidden, args.ffn, args.heads).to(dtype)       # the same on every rank (seeded)
        g = torch.Generator().manual_seed(99)
        x = (torch.randn(args.tokens, args.hidden, generator=g) * 0.5).to(dtype)
        target = (torch.randn(args.tokens, args.hidden, generator=g) * 0.5).to(dtype)
        xr, tr = x[R * m:(R + 1) * m].to(dev), target[R * m:(R + 1) * m].to(dev)
        # the single-device float32 reference curve
        ref = copy.deepcopy(full).float().to(dev)
        opt = torch.optim.AdamW(ref.parameters(), lr=args.lr)
        xf, tf = x.float().to(dev), target.float().to(dev)
        ref_curve = []
        for _ in range(args.steps):
            opt.zero_grad()
            loss = (ref(xf) - tf).pow(2).mean()
            loss.backward()
            opt.step()
            ref_curve.append(loss.item())
        del ref, opt, xf, tf
        impls = []
        for impl in (i for i in args.impls.split(",") if i):
            why = None
            if impl.startswith("torch_funcol") or impl == "torch_async_tp":
                if group is None:
                    why = "no torch.distributed group (the simulator): torch's TP cannot run here"
                elif cuda and dist.get_backend() != "nccl":
                    why = (f"torch.distributed runs {dist.get_backend()} here (ranks sharing a GPU): torch's TP on CUDA "
                           "tensors needs NCCL, one GPU per rank")
                elif impl == "torch_async_tp" and not cuda:
                    why = "torch's micro-pipeline TP needs CUDA"
            if why:
                rows.append({"model": kind, "impl": impl, "ok": False, "error": why, "us": float("nan"),
                             "curve": []})
                continue
            try:
                mod, fwd = build(kind, impl, full, world, group, args.heads)
                mod = mod.to(dev)
                if impl.endswith("compile") or impl in ("torch_funcol+ditron_async_tp", "torch_async_tp"):
                    fwd = compiled(fwd, impl, group)
            except Exception as e:  # noqa: BLE001 -- reported in the table
                rows.append({"model": kind, "impl": impl, "ok": False, "error": f"{type(e).__name__}: {e}",
                             "us": float("nan"), "curve": []})
                continue
            opt = torch.optim.AdamW(mod.parameters(), lr=args.lr)
            whole = impl == "torch_1gpu"
            xi, ti = (x.to(dev), target.to(dev)) if whole else (xr, tr)
            scale = 1.0 / (args.tokens * args.hidden)

            def step(mod=mod, fwd=fwd, opt=opt, xi=xi, ti=ti, whole=whole):
                opt.zero_grad(set_to_none=True)
                loss = (fwd(xi).float() - ti.float()).pow(2).sum() * scale
                loss.backward()
                opt.step()
                return loss.detach()
            curve, err = [], ""
            try:
                for _ in range(args.steps):
                    loss = step()
                    curve.append(loss.item() if whole else total(loss))
                bad = [(i, a, b) for i, (a, b) in enumerate(zip(curve, ref_curve)) if not abs(a - b) <= 0.04 * b + 0.002]
                if bad:
                    err = f"loss curve differs from single-device fp32 at step {bad[0][0]}: {bad[0][1]:.4g} vs {bad[0][2]:.4g}"
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"
            impls.append((Impl(impl, step, None), curve, err))
        flags = agree([not e for _, _, e in impls])
        ok_impls = [i for (i, _, _), f in zip(impls, flags) if f]
        res = measure(ok_impls, dev, warmup=args.warmup, iters=args.iters, barrier=ditron.barrier_all,
                      repeat=args.repeat, agree=agree)
        for (impl, curve, err), f in zip(impls, flags):
            rr = res.get(impl.name, {"ok": False, "error": err or "failed on another rank", "us": float("nan")})
            rows.append({"model": kind, "impl": impl.name, "ok": rr["ok"], "error": rr["error"],
                         "us": rr["us"] if rr["ok"] else float("nan"), "curve": curve, "ref_curve": ref_curve,
                         "curve_ok": bool(f and not err)})
        del impls, ok_impls, res
        _release(dev)
    if R == 0:
        command = "ditron bench train_tp " + " ".join(argv)
        meta = result_meta("train_tp", args.dtype, W, dev, args.machine, command)
        lines = ["| model | impl | step us | x torch_funcol | loss curve (first, last) | check |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            base = next((b for b in rows if b["model"] == row["model"] and b["impl"] == "torch_funcol" and b["ok"]),
                        None)
            ratio = base["us"] / row["us"] if base and row["ok"] else float("nan")
            c = row["curve"]
            cur = f"{c[0]:.4f} -> {c[-1]:.4f}" if c else "-"
            ok = "ok" if row["ok"] else f"not run / FAILED: {row['error'][:140]}"
            us = f"{row['us']:.0f}" if not math.isnan(row["us"]) else "-"
            lines.append(f"| {row['model']} | {row['impl']} | {us} | {ratio:.2f} | {cur} | {ok} |")
        refs = {r["model"]: r.get("ref_curve") for r in rows if r.get("ref_curve")}
        md = [f"### TP training step, tokens {args.tokens}, d {args.hidden}, ffn {args.ffn}, heads {args.heads}, "
              f"{args.dtype}, {W} rank(s) ({args.machine}, {meta['date']})", "", f"Command: `{command}`", "",
              "\n".join(lines), "",
              "Single-device float32 loss curves: " + "; ".join(f"{k}: {', '.join(f'{v:.4f}' for v in c)}"
                                                               for k, c in refs.items()), ""]
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{args.tag or args.machine.replace(' ', '_')}-train_tp-w{W}")
        with open(stem + ".md", "w") as f:
            f.write("\n".join(md))
        with open(stem + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
        print("\n".join(md))
        print(f"wrote {stem}.md, {stem}.json")
    # failure: a ditron implementation's loss curve (timings may be refused, e.g. with ranks sharing a GPU)
    bad = [row for row in rows if row["impl"].startswith("ditron") and not row.get("curve_ok")]
    ditron.finalize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
