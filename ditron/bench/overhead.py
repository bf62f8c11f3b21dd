"""``ditron bench overhead``: the host cost of an eager call, ditron against the plain stack, side by side.

    torchrun --standalone --nproc-per-node 1 -m ditron.bench overhead
    DITRON_RANKS_PER_GPU=2 torchrun --standalone --nproc-per-node 2 -m ditron.bench overhead --ops collectives
    ditron sim -n 2 -m ditron.bench overhead          # smoke run on the CPU: every call once, checked, no timing

Rows (each: ditron's call and the code a user would otherwise write, in one process, the same arguments):

* ``launch add`` / ``launch softmax``: one launch of the same body under ``@ditron.jit`` and ``@triton.jit``
  (a 4096-element add; Triton's fused-softmax tutorial kernel on 4096 x 4096 fp16);
* ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all`` (8 KiB and 128 KiB of bf16 per rank):
  the zoo op against the ``torch.distributed`` collective;
* ``ag_gemm``, ``gemm_rs``, ``gemm_ar`` (128 rows per rank x 4096 x 4096, bf16): the overlap op against
  ``torch.matmul`` plus the collective;
* ``ep`` (128 tokens, hidden 7168, 8 experts per rank, top-8, low-latency mode): ``ep_dispatch`` +
  ``ep_combine`` against ``all_to_all_single`` + ``torch._grouped_mm``.

**Host time**: ``--calls`` calls queued without a synchronisation, wall time / calls, best of ``--rounds``
rounds, ditron's and the baseline's rounds alternating (which goes first alternates too); beside the ratio of the
bests, the median of the rounds' paired ratios (ditron's round over the baseline's next to it), which drift of the
machine between rounds moves less (the GPU work of these calls is a few microseconds and
fewer launches are queued than the launch queue holds, so the host sets the pace).  **Device time** beside it:
one call captured in a CUDA graph, replays timed with CUDA events (``-`` where a call cannot be captured, such
as NCCL calls in a world whose ranks share a GPU, which uses gloo).  The slowest rank is reported.  Goals
(issue 51): a launch at most 1.15x Triton's, an eager op at most 1.5x its baseline.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import triton
import triton.language as tl

import ditron

from .harness import queued_us

GOALS = {"launch": 1.15, "op": 1.5}
GROUPS = {"launch": ("launch_add", "launch_softmax"),
          "collectives": ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"),
          "gemm": ("ag_gemm", "gemm_rs", "gemm_ar"),
          "ep": ("ep",)}
ALL_ROWS = tuple(r for rows in GROUPS.values() for r in rows)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="ditron bench overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="all", help=f"rows or groups, comma-separated: all, {', '.join(GROUPS)}, "
                                                f"{', '.join(ALL_ROWS)}")
    p.add_argument("--sizes", default="8K,128K", help="bytes per rank of the collectives (bf16)")
    p.add_argument("--calls", type=int, default=1000, help="calls queued per timed round")
    p.add_argument("--rounds", type=int, default=9, help="timed rounds per implementation (best is kept; the median of the rounds' paired ratios is reported beside)")
    p.add_argument("--out", default=None, help="write overhead.md and overhead.json here (rank 0)")
    p.add_argument("--machine", default="", help="the machine kind, for the report")
    return p.parse_args(argv)


def select(spec):
    rows = []
    for s in (x.strip() for x in spec.split(",") if x.strip()):
        if s == "all":
            rows += ALL_ROWS
        elif s in GROUPS:
            rows += GROUPS[s]
        elif s in ALL_ROWS:
            rows.append(s)
        else:
            raise SystemExit(f"ditron bench overhead: unknown row or group {s!r}; use all, "
                             f"{', '.join(GROUPS)} or {', '.join(ALL_ROWS)}")
    return list(dict.fromkeys(rows))


# ---------------------------------------------------------------------------------------------------------
# the measurements
# ---------------------------------------------------------------------------------------------------------

def host_us(fn, calls, sync):
    """Wall time per call of ``calls`` calls queued back to back (the queue drained before and after)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync()
    return (t1 - t0) / calls * 1e6


def device_us(fn):
    """Device time of one call (:func:`ditron.bench.harness.queued_us`: the call in a CUDA graph, replays timed
    with CUDA events); None where it cannot be captured (gloo's collectives, host synchronisations)."""
    import torch
    try:
        return queued_us(fn)
    except Exception:  # noqa: BLE001 -- not capturable: reported as '-'
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        return None


def measure(pair, args, sync, world, baseline_graphs=True):
    """(ditron host us, baseline host us, ditron device us, baseline device us), each the slowest rank's
    (``baseline_graphs=False``: the baseline is not captured, as gloo's collectives cannot be)."""
    d_fn, b_fn = pair
    for _ in range(20):
        d_fn()
        b_fn()
    best_d = best_b = float("inf")
    paired = []
    for i in range(args.rounds):
        # the order alternates too (a round that warms the CPU's caches for the second call favours neither)
        if i % 2:
            hb = host_us(b_fn, args.calls, sync)
            hd = host_us(d_fn, args.calls, sync)
        else:
            hd = host_us(d_fn, args.calls, sync)
            hb = host_us(b_fn, args.calls, sync)
        best_d, best_b = min(best_d, hd), min(best_b, hb)
        paired.append(hd / hb)
    dev_d = device_us(d_fn)
    dev_b = device_us(b_fn) if baseline_graphs else None
    return slowest(world, [best_d, best_b, dev_d, dev_b, statistics.median(paired)])


def slowest(world, values):
    """Per value, the largest over ranks (None stays None)."""
    if world.world_size == 1:
        return values
    import torch.distributed as dist
    got = [None] * world.world_size
    dist.all_gather_object(got, values)
    out = []
    for i in range(len(values)):
        vs = [g[i] for g in got]
        out.append(None if any(v is None for v in vs) else max(vs))
    return out


# ---------------------------------------------------------------------------------------------------------
# the rows: (ditron call, baseline call, reference check) per row
# ---------------------------------------------------------------------------------------------------------

def _add(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def _softmax(out_ptr, in_ptr, in_stride, out_stride, n_rows, n_cols, BLOCK: tl.constexpr):
    """Triton's fused-softmax tutorial kernel: persistent programs, one row per step."""
    start = tl.program_id(0)
    step = tl.num_programs(0)
    for row in tl.range(start, n_rows, step):
        offs = tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * in_stride + offs, mask=offs < n_cols, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * out_stride + offs, num / tl.sum(num, axis=0), mask=offs < n_cols)


_KERNELS: dict = {}


def _kernels():
    """The launch rows' kernels: one body, two decorators (made at first use: under ``ditron sim`` the
    environment that selects the simulator is set by then)."""
    if not _KERNELS:
        _KERNELS["add"] = (ditron.jit(_add), triton.jit(_add))
        _KERNELS["softmax"] = (ditron.jit(_softmax), triton.jit(_softmax))
    return _KERNELS


def rows_for(name, world, sizes, sim):
    """[(label, ditron call, baseline call or None, check)] for row ``name``: ``check()`` runs ditron's call
    once on fresh random inputs and compares it with a torch reference (raises on a mismatch)."""
    import torch

    from ditron import kernels as zoo

    W, R, dev = world.world_size, world.rank, world.device
    bf = torch.bfloat16

    def rand(*shape, dtype=bf, rank=R):
        g = torch.Generator(device="cpu").manual_seed(1000 * rank + sum(shape) + len(shape))
        return torch.randn(*shape, generator=g).to(dtype).to(dev)

    def dist():
        import torch.distributed as d
        return d if (not sim and d.is_initialized()) else None

    def close(got, want, what, tol=2e-2):
        err = ((got.float() - want.float()).norm() / max(want.float().norm().item(), 1e-6)).item()
        if not err <= tol:
            raise AssertionError(f"ditron bench overhead: {what} differs from the torch reference "
                                 f"(relative error {err:.3g})")

    out = []
    if name in ("launch_add", "launch_softmax"):
        kd, kt = _kernels()["add" if name == "launch_add" else "softmax"]
        if name == "launch_add":
            x, y = rand(4096, dtype=torch.float32), rand(4096, dtype=torch.float32, rank=R + 7)
            o = torch.empty_like(x)
            grid = (4,)

            def run_d():
                kd[grid](x, y, o, 4096, BLOCK=1024)

            def run_t():
                kt[grid](x, y, o, 4096, BLOCK=1024)

            def check():
                o.fill_(float("nan"))
                run_d()
                close(o, x + y, "launch_add", 1e-6)
        else:
            rows_, cols = (256, 256) if sim else (4096, 4096)
            x = rand(rows_, cols, dtype=torch.float16)
            o = torch.empty_like(x)
            grid = (min(rows_, 4 if sim else 132 * 4),)
            block = 1 << (cols - 1).bit_length()

            def run_d():
                kd[grid](o, x, x.stride(0), o.stride(0), rows_, cols, BLOCK=block)

            def run_t():
                kt[grid](o, x, x.stride(0), o.stride(0), rows_, cols, BLOCK=block)

            def check():
                o.fill_(float("nan"))
                run_d()
                close(o, torch.softmax(x.float(), dim=1), "launch_softmax", 1e-3)
        out.append((name.replace("_", " "), run_d, None if sim else run_t, check, "@triton.jit, same body", "launch"))
        return out

    if name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for nbytes in sizes:
            numel = max(W, nbytes // 2 // W * W)
            x = rand(numel)
            d = dist()
            label = f"{name} {nbytes // 1024} KiB"
            if name == "all_reduce":
                ctx = zoo.create_all_reduce_context(numel, bf)
                o = torch.empty_like(x)
                y = x.clone()
                run_d = lambda x=x, ctx=ctx, o=o: zoo.all_reduce(x, ctx, out=o)           # noqa: E731
                run_b = (lambda y=y, d=d: d.all_reduce(y)) if d else None                 # noqa: E731
                ref = lambda numel=numel: sum(rand(numel, rank=r).float() for r in range(W))   # noqa: E731
                base = "torch.distributed.all_reduce"
            elif name == "all_gather":
                ctx = zoo.create_all_gather_context(numel, bf)
                o = torch.empty(W * numel, dtype=bf, device=dev)
                ob = torch.empty_like(o)
                run_d = lambda x=x, ctx=ctx, o=o: zoo.all_gather(x, ctx, out=o)           # noqa: E731
                run_b = (lambda x=x, ob=ob, d=d: d.all_gather_into_tensor(ob, x)) if d else None  # noqa: E731
                ref = lambda numel=numel: torch.cat([rand(numel, rank=r).float() for r in range(W)])   # noqa: E731
                base = "torch.distributed.all_gather_into_tensor"
            elif name == "reduce_scatter":
                ctx = zoo.create_reduce_scatter_context(numel, bf)
                o = torch.empty(numel // W, dtype=bf, device=dev)
                ob = torch.empty_like(o)
                run_d = lambda x=x, ctx=ctx, o=o: zoo.reduce_scatter(x, ctx, out=o)       # noqa: E731
                run_b = (lambda x=x, ob=ob, d=d: d.reduce_scatter_tensor(ob, x)) if d else None   # noqa: E731
                ref = lambda numel=numel: sum(rand(numel, rank=r).float() for r in range(W))[R * (numel // W):(R + 1) * (numel // W)]  # noqa: E731,E501
                base = "torch.distributed.reduce_scatter_tensor"
            else:
                hidden = 256 if sim else 1024
                rows_ = max(W, numel // hidden // W * W)
                x = rand(rows_, hidden)
                ctx = zoo.create_all_to_all_context(rows_, hidden, bf)
                o = torch.empty_like(x)
                ob = torch.empty_like(x)
                run_d = lambda x=x, ctx=ctx, o=o: zoo.all_to_all(x, ctx, out=o)           # noqa: E731
                run_b = (lambda x=x, ob=ob, d=d: d.all_to_all_single(ob, x)) if d else None   # noqa: E731
                per = rows_ // W
                ref = lambda rows_=rows_, hidden=hidden, per=per: torch.cat(    # noqa: E731
                    [rand(rows_, hidden, rank=r).float()[R * per:(R + 1) * per] for r in range(W)])
                label = f"all_to_all {rows_ * hidden * 2 // 1024} KiB"
                base = "torch.distributed.all_to_all_single"

            def check(run_d=run_d, o=o, ref=ref, label=label):
                o.fill_(float("nan"))
                run_d()
                close(o, ref().to(dev), label, 2e-2 * W)
            out.append((label, run_d, run_b, check, base, "op"))
        return out

    if name in ("ag_gemm", "gemm_rs", "gemm_ar"):
        m, k, n = (16, 64, 64) if sim else (128, 4096, 4096)
        d = dist()
        b = rand(k, n, rank=99) / k ** 0.5
        if name == "ag_gemm":
            a = rand(m, k)
            ctx = zoo.create_ag_gemm_context(m, k, bf)
            o = torch.empty(W * m, n, dtype=bf, device=dev)
            ag = torch.empty(W * m, k, dtype=bf, device=dev)
            ob = torch.empty(W * m, n, dtype=bf, device=dev)

            def run_d():
                zoo.ag_gemm(a, b, ctx, out=o)

            def run_b():
                d.all_gather_into_tensor(ag, a)
                torch.matmul(ag, b, out=ob)

            ref = lambda: torch.cat([rand(m, k, rank=r).float() for r in range(W)]) @ b.float()   # noqa: E731
            base = "all_gather_into_tensor + torch.matmul"
        else:
            M = W * m
            a = rand(M, k)
            if name == "gemm_rs":
                ctx = zoo.create_gemm_rs_context(M, n, bf)
                o = torch.empty(m, n, dtype=bf, device=dev)
                ob = torch.empty(m, n, dtype=bf, device=dev)
                c = torch.empty(M, n, dtype=bf, device=dev)

                def run_d():
                    zoo.gemm_rs(a, b, ctx, out=o)

                def run_b():
                    torch.matmul(a, b, out=c)
                    d.reduce_scatter_tensor(ob, c)

                ref = lambda: sum(rand(M, k, rank=r).float() for r in range(W))[R * m:(R + 1) * m] @ b.float()  # noqa: E731,E501
                base = "torch.matmul + reduce_scatter_tensor"
            else:
                ctx = zoo.create_gemm_ar_context(M, n, bf)
                o = torch.empty(M, n, dtype=bf, device=dev)
                c = torch.empty(M, n, dtype=bf, device=dev)

                def run_d():
                    zoo.gemm_ar(a, b, ctx, out=o)

                def run_b():
                    torch.matmul(a, b, out=c)
                    d.all_reduce(c)

                ref = lambda: sum(rand(M, k, rank=r).float() for r in range(W)) @ b.float()   # noqa: E731
                base = "torch.matmul + all_reduce"

        def check():
            o.fill_(float("nan"))
            run_d()
            close(o, ref().to(dev), name, 3e-2)
        shape = f"{m} x {k} x {n}" + (" per rank" if name == "ag_gemm" else "")
        out.append((f"{name} {shape}", run_d, run_b if d else None, check, base, "op"))
        return out

    if name == "ep":
        T, H, El, k = (8, 64, 2, 2) if sim else (128, 7168, 8, 8)
        E = El * W
        d = dist()
        x = rand(T, H)
        g = torch.Generator(device="cpu").manual_seed(77 + R)
        idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32).to(dev)
        wts = torch.rand(T, k, generator=g).to(dev)
        ctx = zoo.create_ep_context(T, H, E, k, bf, mode="low_latency")
        res = {}

        def run_d():
            recv, _, handle = zoo.ep_dispatch(x, idx, wts, ctx, validate=False)
            res["out"] = zoo.ep_combine(recv, handle, ctx)

        # the torch code a user writes instead: pairs sorted by expert, one all_to_all_single, a grouped GEMM
        send = x.repeat_interleave(k, dim=0)
        recv_b = torch.empty_like(send)
        w = rand(El, H, 128, rank=55) if not sim else None
        offs = torch.arange(1, El + 1, device=dev, dtype=torch.int32) * (T * k // El) if not sim else None

        def run_b():
            d.all_to_all_single(recv_b, send)
            torch._grouped_mm(recv_b, w, offs=offs)

        def check():
            run_d()
            # with the identity expert, combine returns the weighted sum of each token's own row
            want = x.float() * wts.float().sum(1, keepdim=True)
            close(res["out"], want, "ep dispatch + combine", 3e-2)
        out.append((f"ep low-latency {T} tokens, hidden {H}, top-{k}", run_d, run_b if d else None, check,
                    "all_to_all_single + torch._grouped_mm", "op"))
        return out
    raise ValueError(name)


# ---------------------------------------------------------------------------------------------------------

def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    from ditron.runtime import sharing
    world = ditron.init()
    sim = world.backend == "sim"
    rows = select(args.ops)
    sizes = [int(float(s[:-1]) * 1024) if s.upper().endswith("K") else int(s) for s in args.sizes.split(",")]
    say = (lambda s: print(s, flush=True)) if world.rank == 0 else (lambda s: None)
    shared = (not sim) and sharing.shared()
    sync = (lambda: None) if sim else torch.cuda.synchronize
    say(f"# ditron bench overhead: world {world.world_size} ({world.backend}"
        f"{', ranks share a GPU: torch.distributed is gloo' if shared else ''}), {datetime.date.today()}")
    results = []
    for name in rows:
        for label, run_d, run_b, check, base, kind in rows_for(name, world, sizes, sim):
            check()                                  # correct before timed: the first call (Triton's launch path)
            check()                                  # and a warm one (a zoo op's direct launch of its binary)
            if sim:
                results.append(dict(row=label, kind=kind, baseline=base, checked=True))
                say(f"{label:52s} checked against torch (simulator: not timed)")
                continue
            if run_b is None:
                vals = [None] * 5
            else:
                vals = measure((run_d, run_b), args, sync, world, baseline_graphs=not shared or kind == "launch")
            hd, hb, dd, db, pr = vals
            ratio = None if (hd is None or hb is None) else hd / hb
            goal = GOALS[kind]
            results.append(dict(row=label, kind=kind, baseline=base, ditron_host_us=hd, baseline_host_us=hb,
                                ratio=ratio, paired_ratio=pr, goal=goal, ditron_device_us=dd, baseline_device_us=db))
            say(f"{label:52s} ditron {fmt(hd):>7} us  {base} {fmt(hb):>7} us  ratio {fmt(ratio, 2):>5} "
                f"(goal <= {goal}; median of paired rounds {fmt(pr, 2)})  device {fmt(dd)} / {fmt(db)} us")
    if world.rank == 0:
        md = report(results, world, args, shared)
        print(md)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"overhead-w{world.world_size}.md"), "w") as f:
                f.write(md)
            with open(os.path.join(args.out, f"overhead-w{world.world_size}.json"), "w") as f:
                json.dump(dict(results=results, world_size=world.world_size, backend=world.backend,
                               shared_gpu=shared, command=" ".join(sys.argv), machine=args.machine,
                               date=str(datetime.date.today()), host=platform.node()), f, indent=1)
    ditron.finalize()
    return 0


def report(results, world, args, shared):
    import torch
    import triton
    lines = [f"## Host cost per eager call, world size {world.world_size}"
             f"{' (ranks share one GPU; torch.distributed on gloo)' if shared else ''}", "",
             f"{args.machine or platform.node()}, {datetime.date.today()}, torch {torch.__version__}, triton "
             f"{triton.__version__}; {args.calls} calls queued per round, best of {args.rounds}; device time: "
             "one call in a CUDA graph", "",
             "| call | ditron host us | baseline | baseline host us | ratio (best / best) | median paired ratio | goal "
             "| ditron device us | baseline device us |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if "ratio" not in r:
            lines.append(f"| {r['row']} | checked (simulator) | {r['baseline']} | | | | | | |")
            continue
        ok = "" if r["ratio"] is None else (" ok" if r["ratio"] <= r["goal"] else " **over**")
        lines.append(f"| {r['row']} | {fmt(r['ditron_host_us'])} | {r['baseline']} | {fmt(r['baseline_host_us'])} | "
                     f"{fmt(r['ratio'], 2)}{ok} | {fmt(r['paired_ratio'], 2)} | <= {r['goal']} | {fmt(r['ditron_device_us'])} | "
                     f"{fmt(r['baseline_device_us'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
