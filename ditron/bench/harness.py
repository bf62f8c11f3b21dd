"""Benchmark harness (measure, check, report, plot) shared by the op
families of ``ditron bench`` (:mod:`ditron.bench.collectives`,
:mod:`ditron.bench.gemm` and its ``gemm_*`` modules, :mod:`ditron.bench.moe`,
:mod:`ditron.bench.megakernel`).

For each size of the sweep, every implementation (ditron's methods, NCCL
through ``torch.distributed``, torch's symmetric-memory ops) is first checked
against a reference on fresh random inputs, then timed side by side in the
same process: CUDA events around each call (or CUDA-graph replays with
``--graph``), warm-up first, the median over iterations, and the slowest rank
reported.  Rank 0 prints a progress bar and writes a Markdown table, the raw
JSON and a PNG plot per sweep under ``--out`` (default ``bench/results``).
On the simulator the numbers are meaningless (the interpreter), but every
code path -- checks, table, JSON -- runs; CI uses it as a smoke test.
"""
from __future__ import annotations

import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    t = text.strip().upper().rstrip("B").replace("I", "")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    return int(float(t[:-1] if unit else t) * _UNITS[unit])


def parse_sizes(spec: str, step: int = 2):
    """``"8K..256M"`` (powers of ``step``) or ``"8K,64K,1M"`` -> list of bytes."""
    if ".." in spec:
        lo, hi = (parse_bytes(s) for s in spec.split(".."))
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= step
        return out
    return [parse_bytes(s) for s in spec.split(",") if s]


def fmt_bytes(n: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}iB"
    return f"{n} B"


@dataclass
class Impl:
    """One implementation at one size: ``run()`` performs the op (returns the
    output), ``check(out)`` raises if it is wrong."""
    name: str
    run: Callable
    check: Optional[Callable] = None
    note: str = ""


@dataclass
class Sweep:
    op: str
    dtype: str
    world_size: int
    device: str
    rows: list = field(default_factory=list)      # dicts: size, impl, us, algbw, busbw, ok


def _sync(device):
    import torch
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def capture_graph(fn):
    """``fn`` (run once first, on a side stream) captured in a CUDA graph; returns the graph."""
    import torch
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    return g


def queued_us(fn, n=50):
    """Microseconds per call of ``fn`` captured in a CUDA graph and replayed ``n`` times back to back
    between two events (device time per call: no host launch latency between the replays)."""
    import torch
    g = capture_graph(fn)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / n


def time_impl(fn, device, warmup=5, iters=25, graph=False):
    """Median time of ``fn()`` in microseconds on this rank."""
    import torch
    if not str(device).startswith("cuda"):
        for _ in range(max(1, warmup // 5)):
            fn()
        ts = []
        for _ in range(max(1, iters // 5)):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e6)
        return statistics.median(ts)
    from ..runtime import sharing
    sharing.refuse_timing("ditron bench")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = capture_graph(fn)
        g.replay()
        torch.cuda.synchronize()
        run = g.replay
    else:
        run = fn
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def max_over_ranks(value: float) -> float:
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return value
    dev = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


class Progress:
    """Rank 0's progress: a tqdm bar when tqdm is installed, else one line per step on stderr."""

    def __init__(self, total, desc, enabled=True):
        self.total, self.desc, self.enabled, self.done = total, desc, enabled, 0
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=desc, file=sys.stderr)
            except ImportError:
                self.bar = None

    def step(self, label):
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {self.desc} {label} done", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def measure(impls, device, *, warmup, iters, graph=False, barrier=None, repeat=2, agree=None, after_checks=None,
            check_only=False):
    """Correctness of every implementation first (``run()`` then ``check(out)``),
    then timing rounds in alternating order (the first implementation timed at
    a new size can pay first-touch costs).  Returns ``{name: dict(ok, error,
    exc, us, rounds_us)}``: ``us`` is the best round's median of the slowest
    rank.  ``agree(flags) -> flags`` (optional) makes the ranks agree on which
    implementations passed, so they all time the same ones; ``after_checks()``
    (optional) runs between the checks and the timing (e.g. to free references).  ``check_only``: no timing
    (``us`` is NaN, ``rounds_us`` empty): correctness runs, e.g. of ranks that share a GPU."""
    status = {}
    for impl in impls:
        ok, err, exc = True, "", ""
        try:
            out = impl.run()
            _sync(device)
            if impl.check is not None:
                impl.check(out)
        except Exception as e:  # noqa: BLE001 -- recorded in the table
            ok, err, exc = False, f"{type(e).__name__}: {e}", type(e).__name__
        status[impl.name] = [ok, err, exc]
        out = None
    if agree is not None and impls:
        flags = agree([status[i.name][0] for i in impls])
        for impl, ok in zip(impls, flags):
            if status[impl.name][0] and not ok:
                status[impl.name][:2] = [False, "failed on another rank"]
    if after_checks is not None:
        after_checks()
    if barrier:
        barrier()
    rounds = {impl.name: [] for impl in impls}
    notes = {impl.name: "" for impl in impls}
    eager = set()
    for rnd in range(0 if check_only else max(1, repeat)):
        for impl in (impls if rnd % 2 == 0 else impls[::-1]):
            if not status[impl.name][0]:
                continue
            try:
                t = time_impl(impl.run, device, warmup, iters, graph and impl.name not in eager)
            except Exception as e:  # noqa: BLE001 -- a capture failure is local: time eagerly instead
                if graph and impl.name not in eager:
                    eager.add(impl.name)
                    notes[impl.name] = f"timed eagerly: CUDA-graph capture failed ({type(e).__name__}: {e})"
                    _sync(device)
                    try:
                        t = time_impl(impl.run, device, warmup, iters, False)
                    except Exception as e2:  # noqa: BLE001
                        t, notes[impl.name] = math.inf, f"timing failed: {type(e2).__name__}: {e2}"
                else:
                    t, notes[impl.name] = math.inf, f"timing failed: {type(e).__name__}: {e}"
            rounds[impl.name].append(max_over_ranks(t))   # every rank takes part, whatever happened
            if barrier:
                barrier()
    res = {}
    for impl in impls:
        ok, err, exc = status[impl.name]
        ts = rounds[impl.name]
        if ok and ts and any(math.isinf(t) for t in ts):
            ok, err = False, notes[impl.name] if notes[impl.name].startswith("timing") else "timing failed on a rank"
        us = min(ts) if ok and ts else float("nan")
        res[impl.name] = {"ok": ok, "error": err, "exc": exc, "us": us, "rounds_us": ts,
                          "note": notes[impl.name] if ok else ""}
    return res


def run_sweep(op, dtype_name, sizes, make_impls, bus_factor, *, device, world_size, rank, warmup, iters,
              graph=False, barrier=None, progress=True, repeat=2):
    """``make_impls(nbytes) -> list[Impl]``; returns a :class:`Sweep`."""
    sweep = Sweep(op, dtype_name, world_size, str(device))
    bar = Progress(len(sizes), f"{op} {dtype_name}", progress and rank == 0)
    for nbytes in sizes:
        impls = make_impls(nbytes)
        res = measure(impls, device, warmup=warmup, iters=iters, graph=graph, barrier=barrier, repeat=repeat)
        for impl in impls:
            r = res[impl.name]
            ok, us = r["ok"], r["us"]
            algbw = nbytes / (us * 1e-6) / 1e9 if ok and us > 0 else float("nan")
            sweep.rows.append({"bytes": nbytes, "impl": impl.name, "us": us, "rounds_us": r["rounds_us"],
                               "algbw_GBs": algbw, "busbw_GBs": algbw * bus_factor(world_size), "ok": ok,
                               "error": r["error"], "note": "; ".join(n for n in (impl.note, r["note"]) if n)})
        bar.step(fmt_bytes(nbytes))
    bar.close()
    return sweep


def table(sweep: Sweep, metric="us") -> str:
    impls = list(dict.fromkeys(r["impl"] for r in sweep.rows))
    sizes = list(dict.fromkeys(r["bytes"] for r in sweep.rows))
    by = {(r["bytes"], r["impl"]): r for r in sweep.rows}
    head = "| size | " + " | ".join(impls) + " |"
    lines = [head, "| --- |" + " --- |" * len(impls)]
    for s in sizes:
        cells = []
        for name in impls:
            r = by.get((s, name))
            if r is None:
                cells.append("-")          # not applicable at this size (e.g. the LL protocol above 256 KiB)
            elif not r["ok"]:
                cells.append("FAILED")
            else:
                cells.append(f"{r[metric]:.1f}")
        lines.append(f"| {fmt_bytes(s)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def result_meta(op, dtype, world_size, device, machine, command) -> dict:
    """What every result file records: op, machine, date, command, versions."""
    meta = {"op": op, "dtype": dtype, "world_size": world_size, "device": str(device),
            "machine": machine, "date": datetime.date.today().isoformat(), "command": command,
            "python": platform.python_version()}
    try:
        import torch
        import triton
        meta.update(torch=torch.__version__, triton=triton.__version__)
        if torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001
        pass
    return meta


def write_results(sweep: Sweep, out_dir: str, tag: str, command: str, machine: str):
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{tag}-{sweep.op}-{sweep.dtype}")
    meta = result_meta(sweep.op, sweep.dtype, sweep.world_size, sweep.device, machine, command)
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "rows": sweep.rows}, f, indent=1, default=str)
    md = [f"### {sweep.op}, {sweep.dtype}, {sweep.world_size} ranks ({machine}, {meta['date']})", "",
          f"Command: `{command}`", "",
          "Latency (us; per round the median over iterations of the slowest rank; the best of the rounds, "
          "which alternate the order of the implementations):", "", table(sweep, "us"), "",
          "Bus bandwidth (GB/s):", "", table(sweep, "busbw_GBs"), ""]
    failed = [r for r in sweep.rows if not r["ok"]]
    if failed:
        md += ["Failures:", ""] + [f"- {fmt_bytes(r['bytes'])} {r['impl']}: {r['error']}" for r in failed] + [""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md))
    png = None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for name in dict.fromkeys(r["impl"] for r in sweep.rows):
            rows = [r for r in sweep.rows if r["impl"] == name and r["ok"]]
            if not rows:
                continue
            xs = [r["bytes"] for r in rows]
            ax[0].plot(xs, [r["us"] for r in rows], marker="o", label=name)
            ax[1].plot(xs, [r["busbw_GBs"] for r in rows], marker="o", label=name)
        for a, title in zip(ax, ("latency (us)", "bus bandwidth (GB/s)")):
            a.set_xscale("log", base=2)
            a.set_title(f"{sweep.op} {sweep.dtype}: {title}")
            a.set_xlabel("bytes")
            a.grid(True, alpha=0.3)
        ax[0].set_yscale("log")
        ax[1].legend(fontsize=7)
        fig.tight_layout()
        png = stem + ".png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
    except ImportError:
        pass
    return stem + ".md", stem + ".json", png


# ---------------------------------------------------------------------------
# collectives


# ---------------------------------------------------------------------------
# shared by the benchmarks that run on a world (gemm, moe, megakernel)
# ---------------------------------------------------------------------------

def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def agree_fn(world):
    """``agree(flags) -> flags``: an implementation counts as passed only if it
    passed on every rank (so that every rank times the same ones)."""
    import torch
    import torch.distributed as dist

    import ditron

    def agree(flags):
        if dist.is_available() and dist.is_initialized():
            dev = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
            t = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            return [bool(v) for v in t.tolist()]
        if world.world_size == 1 or world.nnodes > 1:
            return list(flags)
        with ditron.heap_scope():                 # the simulator: through symmetric memory
            buf = ditron.symm_zeros((len(flags),), torch.int32, name="bench.agree")
            buf.copy_(torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32))
            ditron.barrier_all()
            res = torch.ones(len(flags), dtype=torch.int32)
            for r in range(world.world_size):
                res = torch.minimum(res, ditron.peer_tensor(buf, r).cpu())
            ditron.barrier_all()
        return [bool(v) for v in res.tolist()]
    return agree


def _release(device):
    gc.collect()
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def gather_ranks(x, world, dim=2):
    """Every rank's ``x`` concatenated along ``dim`` (NCCL all_gather; the
    simulator: through symmetric memory)."""
    import torch
    import torch.distributed as dist

    import ditron
    if world.world_size == 1:
        return x
    if dist.is_available() and dist.is_initialized():
        parts = [torch.empty_like(x) for _ in range(world.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim)
    with ditron.heap_scope():
        buf = ditron.symm_empty(tuple(x.shape), x.dtype, name="bench.gather")
        buf.copy_(x)
        ditron.barrier_all()
        parts = [ditron.peer_tensor(buf, r).clone() for r in range(world.world_size)]
        ditron.barrier_all()
    return torch.cat(parts, dim)


def add_run_args(p, warmup=3, iters=10, repeat=2):
    """The options every benchmark takes: timing loop, where results go, and which machine they name."""
    import os
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--iters", type=int, default=iters)
    p.add_argument("--repeat", type=int, default=repeat)
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    p.add_argument("--tag", default=None)
    p.add_argument("--machine", default=os.environ.get("DITRON_MACHINE", "unknown machine"))


def traced_fields(mk, step, steps=3) -> dict:
    """``ditron bench megakernel --trace``: run ``step()`` of a traced megakernel ``mk`` ``steps`` times; the row
    fields of the last step's profile: ``profile`` and ``critical_path`` (JSON) and ``profile_table`` (Markdown)."""
    for _ in range(steps):
        step()
    prof = mk.profile()
    cp = mk.critical_path()
    return {"profile": {"step_us": prof.step_us, "busy": prof.busy, "rows": [vars(r) for r in prof.rows]},
            "critical_path": {"step_us": cp.step_us, "rows": [vars(r) for r in cp.rows]},
            "profile_table": prof.table() + "\n\n" + cp.table()}
