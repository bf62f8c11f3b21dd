"""Issue 52's GEMM-core levers on one GPU, side by side with cuBLAS (``torch.matmul``) in the same process.

Candidates (``--candidates``, comma list of names; default: all of CANDIDATES):

* ``tl default``   -- the ``tl.dot`` core as shipped (``ditron.kernels.gemm.default_config``);
* ``tl ws ...``    -- the same core with ``tl.range(warp_specialize=True)`` at ``num_warps=4``: on sm_90 Triton's
                      Hopper warp-specialisation pass splits it into a producer and two consumer warpgroups (384
                      threads, ``setmaxnreg``); at ``num_warps=8`` (what the 2026-12-06 probe timed) it leaves the
                      kernel unchanged (tests/test_compile_gemm_hopper.py);
* ``gluon ...``    -- the Gluon core (``ditron.kernels.gemm_hopper``): producer warp + two consumer warpgroups,
                      cooperative (``coop``) or ping-pong, several tiles / stage counts;
* ``tl ... sk``    -- the ``tl`` core with the Stream-K hybrid schedule (``GemmConfig(stream_k=True)``;
                      ``--candidates streamk``: each beside its data-parallel twin and the shipped dispatch).
                      The check also runs each Stream-K candidate again, eagerly and as 3 CUDA-graph replays:
                      every output must be bit-identical to the first (a fixed fixup order; the launch epoch
                      advances inside the kernel).

Two modes:

* ``--check``: correctness only, at odd and paper shapes (fresh random inputs against an fp32 reference, output
  poisoned with NaN before each run), plus the twin check: the Gluon core and the ``tl`` core with the same
  tiles and BLOCK_K give bit-identical outputs.  Writes ``START`` / ``PASS`` / ``FAIL`` lines to ``--progress``
  as it goes, so a wrapper can tell which candidate hung (bench/gemm_core_levers.sh).
* default: per (TP degree, dtype) the paper's per-rank GEMM shapes (``ditron.bench.gemm_shapes``); per shape each
  candidate is checked (same check) and then timed: CUDA-graph replays of 5 calls, the median of 20 replays
(5-20: about 0.15 s per round), in
  ``--rounds`` rounds alternating the order, best round kept.  Prints per shape the ratio cuBLAS time /
  candidate time (> 1: faster than cuBLAS) and per candidate the geomean and the worst shape; the last table is
  the summary.  ``--json`` writes every number.

    python bench/gemm_core_levers.py --check --progress /tmp/p.txt
    python bench/gemm_core_levers.py --tp 2,8 --dtypes bf16,fp16 [--json out.json] [--exclude NAME,...]
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ditron.bench.gemm_shapes import gemm_core_shapes  # noqa: E402
import ditron.kernels.gemm as G  # noqa: E402
import ditron.kernels.gemm_hopper as H  # noqa: E402
import ditron.kernels.gemm_streamk as SK  # noqa: E402

C = G.GemmConfig
HC = H.HopperGemmConfig

#: name -> ("tl", GemmConfig or None for the default) | ("gluon", HopperGemmConfig)
CANDIDATES = {
    # round 1 (bench/results/h100-2026-12-07-gemm-levers/)
    "tl default": ("tl", None),
    "tl ws 128x256x64 s3 w4": ("tl", C(128, 256, 64, 8, 4, 3, tma=True, warp_specialize=True)),
    "tl ws 128x128x64 s4 w4": ("tl", C(128, 128, 64, 8, 4, 4, tma=True, warp_specialize=True)),
    "gluon coop 128x256x64 s3": ("gluon", HC(128, 256, 64, stages=3, mode="coop")),
    "gluon coop 128x256x64 s4 epi/2": ("gluon", HC(128, 256, 64, stages=4, mode="coop", epilogue_split=2)),
    "gluon coop 256x128x64 s3": ("gluon", HC(256, 128, 64, stages=3, mode="coop")),
    "gluon pingpong 128x128x64 s4": ("gluon", HC(128, 128, 64, stages=4, mode="pingpong")),
    "gluon pingpong 128x128x64 s6 epi/2": ("gluon", HC(128, 128, 64, stages=6, mode="pingpong", epilogue_split=2)),
    "gluon pingpong 64x256x64 s4": ("gluon", HC(64, 256, 64, stages=4, mode="pingpong")),
    # round 2: levers aimed at the losing shapes (N not a multiple of 256, K = 4096-7168)
    # L2 grouping of the tile order
    "tl 128x256x64 s3 g4": ("tl", C(128, 256, 64, 4, 8, 3, tma=True, flatten=True)),
    "tl 128x256x64 s3 g16": ("tl", C(128, 256, 64, 16, 8, 3, tma=True, flatten=True)),
    # a 4th stage (the epilogue in two 128-column slices frees the shared memory: 224 KiB)
    "tl 128x256x64 s4 sub2": ("tl", C(128, 256, 64, 8, 8, 4, tma=True, flatten=True, epilogue_subtile=2)),
    # BLOCK_K 128: half the k-steps (barriers, wgmma waits) per tile, 2 stages of 96 KiB
    "tl 128x256x128 s2 sub2": ("tl", C(128, 256, 128, 8, 8, 2, tma=True, flatten=True, epilogue_subtile=2)),
    # wave quantisation: 8192x5504 is 64 x 21.5 tiles of 128x256 (10.67 waves of 132, the last column half
    # empty); 256x128 tiles: 32 x 43 (no ragged column), 128x128: 64 x 43 (20.85 waves)
    "tl 256x128x64 s3": ("tl", C(256, 128, 64, 8, 8, 3, tma=True, flatten=True)),
    "tl 128x128x64 s5": ("tl", C(128, 128, 64, 8, 8, 5, tma=True, flatten=True)),
    "tl 128x128x128 s3": ("tl", C(128, 128, 128, 8, 8, 3, tma=True, flatten=True)),
    "gluon coop 128x256x64 s3 g4": ("gluon", HC(128, 256, 64, stages=3, mode="coop", group_m=4)),
    "gluon coop 128x256x64 s3 g16": ("gluon", HC(128, 256, 64, stages=3, mode="coop", group_m=16)),
    "gluon coop 128x256x128 s2 epi/2": ("gluon", HC(128, 256, 128, stages=2, mode="coop", epilogue_split=2)),
    "gluon coop 256x128x64 s4 epi/2": ("gluon", HC(256, 128, 64, stages=4, mode="coop", epilogue_split=2)),
    # what matmul runs without a config: the shipped table of this GPU kind (kernels/gemm_tables/; round 1's
    # per-shape best on H100), else the default rule -- timed, never picked as a shape's best
    "matmul table": ("table", None),
    # Stream-K hybrid (GemmConfig.stream_k): full waves data-parallel, the last P + T % P tiles' K steps split
    # evenly over the P programs, partial tiles summed by their owner in a fixed order (deterministic).  Aimed
    # at wave quantisation: 8192x3696x8192 is 960 tiles of 128x256 on 132 SMs (7.27 waves run as 8)
    "tl default sk": ("tl", None),
    "tl 128x256x64 s4 sub2 sk": ("tl", C(128, 256, 64, 8, 8, 4, tma=True, flatten=True, epilogue_subtile=2,
                                         stream_k=True)),
    "tl 256x128x64 s3 sk": ("tl", C(256, 128, 64, 8, 8, 3, tma=True, flatten=True, stream_k=True)),
}
#: ``tl`` candidates resolved at the shape (``default_config`` / ``gpu_default_config``) with these fields replaced
DEFAULT_OVERRIDES = {"tl default sk": {"stream_k": True}}

#: what round 2 times by default (``--candidates round2``): the two round-1 leaders, the round-1 winner at
#: 8192x5504x4096 (ping-pong s6), and the new levers; ``all``: every candidate; ``round1``: round 1's nine
ROUND1 = list(CANDIDATES)[:9]
ROUND2 = (["tl default", "gluon coop 128x256x64 s3", "gluon pingpong 128x128x64 s6 epi/2"]
          + list(CANDIDATES)[9:list(CANDIDATES).index("matmul table") + 1])
#: ``--candidates streamk``: Stream-K beside its data-parallel twins and the shipped dispatch
STREAMK = ["tl default", "tl default sk", "tl 128x256x64 s4 sub2", "tl 128x256x64 s4 sub2 sk", "tl 256x128x64 s3",
           "tl 256x128x64 s3 sk", "matmul table"]
#: candidates that stand for a dispatch, not a config: timed beside the others, never a shape's best
META = {"matmul table"}
GROUPS = {"all": list(CANDIDATES), "round1": ROUND1, "round2": ROUND2, "streamk": STREAMK}

#: the check shapes: tails in M, N and K, fewer tiles than SMs (and an odd tile count: ping-pong's consumers get
#: different numbers of tiles), one paper shape
CHECK_SHAPES = [(1000, 1000, 1000), (130, 328, 72), (256, 512, 128), (8192, 5504, 4096), (3000, 2056, 4104)]
#: ``--quick-check``: the tails only (the timing step checks every paper shape before timing it anyway)
QUICK_CHECK_SHAPES = [(1000, 1000, 1000), (130, 328, 72), (3000, 2056, 4104)]

#: sm_90's shared memory per block (227 KiB)
SMEM_LIMIT = 232448

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: seconds without progress after which a step counts as hung (a candidate's check compiles 4 kernels; a timing
#: round at the largest shape takes a few seconds)
STALL_S = float(os.environ.get("GEMM_LEVERS_STALL_S", "75"))


def run_fn(name, a, b, out):
    kind, cfg = CANDIDATES[name]
    if kind == "table":
        return lambda: G.matmul(a, b, out=out)          # no config: the GPU kind's table, else the default rule
    if kind == "tl":
        # "tl default": the shipped rule (default_config), not the table matmul reads without a config
        cfg = cfg or dataclasses.replace(G.default_config(a.shape[0], b.shape[1], a.shape[1], a.dtype, a.device),
                                         **DEFAULT_OVERRIDES.get(name, {}))
        return lambda: G.matmul(a, b, out=out, config=cfg)
    return lambda: H.matmul_hopper(a, b, out=out, config=cfg)


def twin_of(name):
    """The ``tl`` core config with the Gluon candidate's tiles and BLOCK_K (same K order)."""
    kind, cfg = CANDIDATES[name]
    return H.twin_config(cfg) if kind == "gluon" else None


def is_stream_k(name):
    kind, cfg = CANDIDATES[name]
    return kind == "tl" and bool((cfg is not None and cfg.stream_k) or DEFAULT_OVERRIDES.get(name, {}).get("stream_k"))


def fresh_inputs(M, N, K, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    b = torch.randn(K, N, device="cuda", generator=g).to(dtype)
    return a, b


def check(fn, out, ref, K, dtype):
    """Run ``fn`` into ``out`` (poisoned first): finite everywhere and within the bench's GEMM tolerance."""
    out.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    got = out.float()
    if not bool(torch.isfinite(got).all()):
        return f"WRONG: {int((~torch.isfinite(got)).sum())} entries not finite (unwritten?)"
    err = (got - ref).abs().max().item()
    tol = torch.finfo(dtype).eps * math.sqrt(K) * 12
    if err > tol:
        return f"WRONG: max abs error {err:.4g} > {tol:.4g}"
    return ""


def graph_timer(fn, reps=5):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    g.replay()
    e1.record()
    e1.synchronize()
    # 20 replays, fewer where a replay is long (about 0.15 s per round at most; at least 5)
    default_n = max(5, min(20, int(0.15e3 / max(e0.elapsed_time(e1), 1e-3))))

    def run(n=None):
        n = n or default_n
        ts = []
        for _ in range(n):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1000 / reps)
        ts.sort()
        return ts[len(ts) // 2]
    return run


def graph_replays_differ(fn, out, want, replays=3):
    """Capture ``fn`` (writing ``out``) in a CUDA graph (after a warm-up on a side stream, as :func:`graph_timer`
    does) and replay it ``replays`` times, ``out`` poisoned before each: '' when every replay writes ``want`` bit
    for bit (Stream-K: the launch epoch advances inside the kernel, so replays need no host work), else what
    differs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for r in range(replays):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        if not torch.equal(out, want):
            return f"replay {r}: {int((out != want).sum())} of {out.numel()} entries differ from the eager run"
    return ""


class Watchdog:
    """A stalled step (a warp-specialised kernel waiting on a barrier that never completes blocks the main thread
    in a CUDA synchronisation) ends the process after ``limit`` seconds: ``on_stall()`` runs first (report what
    is known), then ``os._exit(3)``.  ``beat(what)`` marks progress."""

    def __init__(self, limit, on_stall):
        import threading
        self.limit, self.on_stall, self.what, self.t = limit, on_stall, "start", time.time()
        threading.Thread(target=self._watch, daemon=True).start()

    def beat(self, what):
        self.what, self.t = what, time.time()

    def _watch(self):
        while True:
            time.sleep(1.0)
            if time.time() - self.t > self.limit:
                print(f"\nWATCHDOG: no progress for {self.limit:.0f} s in {self.what!r}: hung; ending the process",
                      flush=True)
                try:
                    self.on_stall(self.what)
                finally:
                    os._exit(3)


def short(e):
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}"


def do_check(names, progress, seed, dtypes=tuple(DTYPES), shapes=None):
    """Correctness and twin bit-equality of each candidate at ``shapes`` (CHECK_SHAPES), in ``dtypes``."""
    log = open(progress, "a") if progress else None

    def note(line):
        print(line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()
    bad = 0
    dog = Watchdog(STALL_S, lambda what: note(f"HUNG {what}"))
    for name in names:
        dog.beat(name)
        note(f"START {name}")
        msgs = []
        for dname in dtypes:
            dtype = DTYPES[dname]
            for (M, N, K) in (shapes or CHECK_SHAPES):
                a, b = fresh_inputs(M, N, K, dtype, seed + M + N + K)
                ref = a.float() @ b.float()
                out = torch.empty(M, N, device="cuda", dtype=dtype)
                try:
                    err = check(run_fn(name, a, b, out), out, ref, K, dtype)
                except Exception as e:  # noqa: BLE001 -- reported
                    err = "ERROR " + short(e)
                if err:
                    msgs.append(f"{dname} {M}x{N}x{K}: {err}")
                    continue
                if is_stream_k(name):
                    # the Stream-K fixup sums partials in a fixed order: a second run is bit-identical
                    again = torch.empty_like(out)
                    run_fn(name, a, b, again)()
                    torch.cuda.synchronize()
                    if not torch.equal(out, again):
                        msgs.append(f"{dname} {M}x{N}x{K}: Stream-K NOT deterministic ({int((out != again).sum())} "
                                    f"of {out.numel()} entries differ between two runs)")
                    bad_replay = graph_replays_differ(run_fn(name, a, b, again), again, out)
                    if bad_replay:
                        msgs.append(f"{dname} {M}x{N}x{K}: Stream-K in a CUDA graph: {bad_replay}")
                tw = twin_of(name)
                if tw is not None:
                    twin = torch.empty_like(out)
                    G.matmul(a, b, out=twin, config=tw)
                    torch.cuda.synchronize()
                    if not torch.equal(out, twin):
                        diff = int((out != twin).sum())
                        msgs.append(f"{dname} {M}x{N}x{K}: NOT bit-identical to its tl twin {tw} "
                                    f"({diff} of {out.numel()} entries differ)")
        if msgs:
            bad += 1
            note(f"FAIL {name}: " + "; ".join(msgs))
        else:
            note(f"PASS {name}" + (" (bit-identical to its tl twin)" if twin_of(name) is not None else ""))
    return bad


def do_time(names, tps, dtypes, rounds, seed, shapes_spec, on_stall=None):
    results = []
    dog = Watchdog(STALL_S, lambda what: on_stall(results) if on_stall else None)
    for tp in tps:
        for dname in dtypes:
            dtype = DTYPES[dname]
            print(f"\n=== TP={tp} {dname}: ratio = cuBLAS time / candidate time (> 1: faster than cuBLAS)", flush=True)
            for shape in gemm_core_shapes(shapes_spec, tp):
                M, N, K = shape.M, shape.N, shape.K
                a, b = fresh_inputs(M, N, K, dtype, seed + M + 3 * N + 7 * K)
                ref = a.float() @ b.float()
                out = torch.empty(M, N, device="cuda", dtype=dtype)
                dog.beat(f"TP={tp} {dname} {shape.label}: cuBLAS")
                timers, status = {"cublas": graph_timer(lambda: torch.matmul(a, b, out=out))}, {}
                for name in names:
                    dog.beat(f"TP={tp} {dname} {shape.label}: {name}")
                    try:
                        fn = run_fn(name, a, b, out)
                        err = check(fn, out, ref, K, dtype)
                        if err:
                            status[name] = err
                            continue
                        timers[name] = graph_timer(fn)
                    except Exception as e:  # noqa: BLE001 -- a candidate that does not fit is reported
                        status[name] = "ERROR " + short(e)
                del ref
                dog.beat(f"TP={tp} {dname} {shape.label}: timing rounds")
                best = {k: math.inf for k in timers}
                keys = list(timers)
                for r in range(rounds):
                    for k in (keys if r % 2 == 0 else keys[::-1]):
                        best[k] = min(best[k], timers[k]())
                tc = best["cublas"]
                flops = 2.0 * M * N * K
                row = {"tp": tp, "dtype": dname, "shape": shape.label, "M": M, "N": N, "K": K, "cublas_us": tc,
                       "cublas_tflops": flops / tc / 1e6, "cands": {}}
                parts = []
                for name in names:
                    if name in status:
                        row["cands"][name] = {"status": status[name]}
                        parts.append(f"{name}: {status[name][:60]}")
                    else:
                        t = best[name]
                        row["cands"][name] = {"us": t, "tflops": flops / t / 1e6, "ratio": tc / t}
                        parts.append(f"{name} {tc / t:.3f}")
                print(f"{shape.label} {M}x{N}x{K}: cuBLAS {tc:.1f} us {flops / tc / 1e6:.0f} TFLOP/s | "
                      + " | ".join(parts), flush=True)
                results.append(row)
                a = b = out = timers = None  # free the operands before the next shape
                torch.cuda.empty_cache()
    return results


def summary(results, names):
    lines = ["", "=== summary: geomean of cuBLAS time / candidate time over the shapes, worst shape "
                 "(goal: geomean >= 1.00, none < 0.95)"]
    groups = sorted({(r["tp"], r["dtype"]) for r in results}, key=lambda x: (x[0], x[1]))
    head = f"{'candidate':34s}" + "".join(f" | TP{tp} {d:4s} geo / worst" for tp, d in groups) + " | all geo"
    lines.append(head)
    for name in names:
        cells, allr, missing = [], [], 0
        for tp, d in groups:
            rs = [r["cands"][name].get("ratio") for r in results if r["tp"] == tp and r["dtype"] == d]
            ok = [x for x in rs if x]
            allr += ok
            missing += len(rs) - len(ok)
            if len(ok) < len(rs) or not ok:
                cells.append(f" | {len(rs) - len(ok)} shape(s) failed    ")
            else:
                geo = math.exp(sum(math.log(x) for x in ok) / len(ok))
                cells.append(f" | {geo:6.3f} / {min(ok):5.3f}     ")
        geo_all = (f"{math.exp(sum(math.log(x) for x in allr) / len(allr)):.3f}" if allr and not missing
                   else "n/a")
        lines.append(f"{name:34s}" + "".join(cells) + f" | {geo_all}")
    return "\n".join(lines)


def geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def per_shape_best(results, names, margin=0.0):
    """Per (TP, dtype) and shape the best candidate (the achievable ratio of a per-shape dispatch) and the
    geomean of that table; also each candidate's own geomean for comparison.  ``margin``: a candidate replaces
    ``tl default`` (when it was timed at the shape) only if it is faster by more than this fraction -- the best
    of many noisy candidates is partly the luck of the draw (the H100 table of 2026-12-07e: 1.008x cuBLAS in the
    run that chose it, 0.956x when re-measured, bench/results/h100-2026-12-07g-levers/).  Returns (text, best
    rows)."""
    lines = ["", "=== per-shape best: the fastest candidate per shape (what a per-shape table dispatches) "
                 "(goal: geomean >= 1.00, none < 0.95)"
                 + (f"; tl default kept unless beaten by more than {margin:.0%}" if margin else "")]
    best_rows = []
    groups = sorted({(r["tp"], r["dtype"]) for r in results}, key=lambda x: (x[0], x[1]))
    all_best = []
    for tp, d in groups:
        rows = [r for r in results if r["tp"] == tp and r["dtype"] == d]
        lines.append(f"TP={tp} {d}:")
        ratios = []
        for r in rows:
            ok = {n: c["ratio"] for n, c in r["cands"].items() if n in names and n not in META and c.get("ratio")}
            if not ok:
                lines.append(f"  {r['shape']:40s} {r['M']}x{r['N']}x{r['K']}: no candidate passed")
                continue
            bn = max(ok, key=ok.get)
            second = sorted(ok.values())[-2] if len(ok) > 1 else float("nan")
            kept = ""
            if margin and "tl default" in ok and bn != "tl default" and ok[bn] <= ok["tl default"] * (1 + margin):
                kept = f"; {bn} {ok[bn]:.3f} within the margin"
                bn = "tl default"
            ratios.append(ok[bn])
            best_rows.append(dict(r, best=bn, best_ratio=ok[bn]))
            lines.append(f"  {r['shape']:40s} {r['M']}x{r['N']}x{r['K']}: {ok[bn]:.3f} {bn}"
                         f"  (runner-up {second:.3f}; tl default {ok.get('tl default', float('nan')):.3f}{kept})")
        all_best += ratios
        if ratios:
            lines.append(f"  per-shape best: geomean {geo(ratios):.3f}, worst {min(ratios):.3f}, "
                         f"{sum(x < 0.95 for x in ratios)} of {len(ratios)} below 0.95")
    if all_best:
        lines.append(f"per-shape best over everything: geomean {geo(all_best):.3f}, worst {min(all_best):.3f}")
    return "\n".join(lines), best_rows


def config_fields(name, M=None, N=None, K=None, sms=132):
    """(core, config fields) of a candidate; ``tl default`` resolved at the shape (the shipped rule)."""
    kind, cfg = CANDIDATES[name]
    if cfg is None:
        cfg = dataclasses.replace(G.gpu_default_config(M, N, K, sms), **DEFAULT_OVERRIDES.get(name, {}))
    return kind, dataclasses.asdict(cfg)


def build_table(best_rows, device, sms, source):
    """The per-GPU table (kernels/gemm_table.py) of the per-shape best rows: one entry per (M, N, K, dtype),
    the best over the TP degrees where a shape occurs twice."""
    entries = {}
    for r in best_rows:
        key = (r["M"], r["N"], r["K"], r["dtype"])
        if key in entries and entries[key]["ratio_vs_cublas"] >= r["best_ratio"]:
            continue
        core, fields = config_fields(r["best"], r["M"], r["N"], r["K"], sms)
        c = r["cands"][r["best"]]
        entries[key] = {"M": r["M"], "N": r["N"], "K": r["K"], "dtype": r["dtype"], "core": core, "config": fields,
                        "candidate": r["best"], "ratio_vs_cublas": round(r["best_ratio"], 4),
                        "us": round(c["us"], 2), "cublas_us": round(r["cublas_us"], 2), "shape": r["shape"],
                        "tp": r["tp"]}
    match = [w for w in ("H100", "H200", "H800", "H20") if w in device][:1] or [device]
    return {"gpu": device, "match": match, "sms": sms, "max_distance": 1.0, "source": source,
            "entries": sorted(entries.values(), key=lambda e: (e["dtype"], e["M"], e["N"], e["K"]))}


def check_table(path, best_rows, sms):
    """Load the written table through the kernels' loader and check the rule: every measured shape
    dispatches (nearest entry) to its own entry, whose config is its best candidate's and builds a valid
    config.  Returns the number of shapes that do not."""
    from ditron.kernels.gemm_table import GemmTable
    t = GemmTable.load(path)
    wrong, seen = 0, {}
    for r in best_rows:
        key = (r["M"], r["N"], r["K"], r["dtype"])
        if key not in seen or r["best_ratio"] > seen[key]["best_ratio"]:
            seen[key] = r
    for key, r in seen.items():
        e, d = t.lookup(*key)
        core, fields = config_fields(r["best"], r["M"], r["N"], r["K"], sms)
        ok = e is not None and d == 0 and e["core"] == core and e["config"] == fields
        try:
            G.config_from_entry(e) if e is not None else None
        except Exception as err:  # noqa: BLE001 -- reported
            ok = False
            print(f"table check: {key}: the entry does not build a config: {short(err)}")
        if not ok:
            wrong += 1
            print(f"table check: {key} dispatches to {e and e.get('candidate')} (distance {d:.2f}), not its best "
                  f"{r['best']}")
    print(f"table check: {len(seen) - wrong} of {len(seen)} shapes dispatch to their best candidate ({path})")
    return wrong


def compile_streamk(c, dname, even_k):
    """``gemm_streamk_kernel`` (a ``stream_k`` config) for sm_90a as a launch specialises it."""
    import ditron
    names = ["a_ptr", "b_ptr", "c_ptr", "ws_ptr", "flag_ptr", "calls_ptr", "M", "N", "K", "stride_am", "stride_bk",
             "stride_cm"]                                       # stride_ak, stride_bn, stride_cn: 1
    types = {"ws_ptr": "*fp32", "flag_ptr": "*i32", "calls_ptr": "*i64"}
    sig = {n: types.get(n, f"*{dname}" if n.endswith("_ptr") else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n != "M"}
    return ditron.compile(SK.gemm_streamk_kernel, target="sm_90a", signature=sig, attrs=attrs, num_warps=c.num_warps,
                          num_stages=c.num_stages,
                          constexprs=dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
                                          EVEN_K=even_k, TMA=c.tma, FLATTEN=c.flatten, SUBTILE=c.epilogue_subtile,
                                          stride_ak=1, stride_bn=1, stride_cn=1))


def compile_only(names, dtypes):
    """Compile every candidate for sm_90a (no GPU needed): the kernel variants the paper shapes launch (K a
    multiple of BLOCK_K or not).  Prints shared memory per candidate; returns the names that failed or that
    exceed sm_90's shared memory (a GPU launch would raise OutOfResources)."""
    import ditron
    names_sig = ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn",
                 "stride_cm", "stride_cn", "sa_ptr", "sb_ptr", "stride_sam", "stride_sak", "stride_sbk",
                 "stride_sbn"]                # the last six: the fp8 scale arguments (unused by bf16 / fp16)
    div = {"a_ptr", "b_ptr", "c_ptr", "N", "K", "stride_am", "stride_bk", "stride_cm"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names_sig) if n in div}
    bad = []
    for name in names:
        kind, cfg = CANDIDATES[name]
        if kind == "table":
            print(f"compile {name}: a dispatch (its tables' configs: tests/test_gemm_table.py)", flush=True)
            continue
        for dname in dtypes:
            t0 = time.time()
            try:
                if kind == "gluon":
                    ck = H.compile_sm90(cfg, DTYPES[dname])
                    variants = [ck]
                else:
                    cfgs = [cfg] if cfg is not None else list(dict.fromkeys(
                        dataclasses.replace(G.gpu_default_config(8192, n, 4096, 132), **DEFAULT_OVERRIDES.get(name, {}))
                        for n in (1376, 26624)))
                    variants = []
                    for c in cfgs:
                        for even_k in (True, False):
                            if c.stream_k:
                                variants.append(compile_streamk(c, dname, even_k))
                                continue
                            sig = {n: ("*fp32" if n in ("sa_ptr", "sb_ptr") else f"*{dname}" if n.endswith("_ptr")
                                   else "i32") for n in names_sig}
                            variants.append(ditron.compile(
                                G.gemm_kernel, target="sm_90a", signature=sig, attrs=attrs, num_warps=c.num_warps,
                                num_stages=c.num_stages,
                                constexprs=dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                                                GROUP_M=c.group_m, EVEN_K=even_k, TMA=c.tma, FLATTEN=c.flatten,
                                                SUBTILE=c.epilogue_subtile, WARP_SPEC=c.warp_specialize,
                                                stride_ak=1, stride_bn=1, stride_cn=1)))
                smem = max(v.metadata.shared for v in variants)
                ptx_ok = all("wgmma.mma_async" in v.asm["ptx"] for v in variants)
                verdict = "ok" if smem <= SMEM_LIMIT and ptx_ok else (
                    "NO wgmma" if not ptx_ok else f"EXCEEDS {SMEM_LIMIT} bytes of shared memory")
                print(f"compile {name} {dname}: {len(variants)} variant(s), shared {smem} bytes, {verdict} "
                      f"({time.time() - t0:.1f} s)", flush=True)
                if verdict != "ok":
                    bad.append(name)
            except Exception as e:  # noqa: BLE001 -- reported
                print(f"compile {name} {dname}: FAILED {short(e)}", flush=True)
                bad.append(name)
    return sorted(set(bad))


def select(spec, exclude):
    names = []
    for item in [n.strip() for n in spec.split(",") if n.strip()]:
        names += GROUPS.get(item, [item])
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SystemExit(f"unknown candidates {unknown}; known: {list(CANDIDATES)} or groups {list(GROUPS)}")
    excl = {n.strip() for n in exclude.split(",") if n.strip()}
    return [n for n in names if n not in excl], excl


def finish(results, names, args, meta, partial=False):
    """The summary, ``--per-shape-best``, ``--json`` and ``--write-table`` of timed rows."""
    print(summary(results, names) + ("\n(partial: the run stopped at a hung step)" if partial else ""))
    best_rows = []
    if args.per_shape_best or args.write_table:
        text, best_rows = per_shape_best(results, names, args.margin)
        print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta, partial=partial, candidates={n: repr(CANDIDATES[n][1]) for n in names},
                           configs={n: (CANDIDATES[n][0], dataclasses.asdict(CANDIDATES[n][1])
                                        if CANDIDATES[n][1] is not None else None) for n in names},
                           rows=results), f, indent=1)
    if args.write_table and best_rows:
        sms = meta.get("sms") or 132
        src = (f"bench/gemm_core_levers.py on {meta.get('device')} ({meta.get('date') or 'date not recorded'}), triton "
               f"{meta.get('triton')}, torch {meta.get('torch')}, candidates: {', '.join(names)}"
               + (f"; rows from {args.from_json}" if args.from_json else "") + (" (PARTIAL run)" if partial else "")
               + (f"; {args.source_note}" if args.source_note else ""))
        table = build_table(best_rows, meta.get("device", "unknown"), sms, src)
        os.makedirs(os.path.dirname(os.path.abspath(args.write_table)), exist_ok=True)
        with open(args.write_table, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        print(f"wrote the table {args.write_table} ({len(table['entries'])} entries, match {table['match']})")
        return check_table(args.write_table, best_rows, sms)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="correctness and twin bit-equality only")
    ap.add_argument("--quick-check", action="store_true",
                    help="--check at the tail shapes only (the timing step checks each paper shape before timing)")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile every candidate for sm_90a (no GPU): shared memory within sm_90's limit, wgmma")
    ap.add_argument("--progress", help="--check: append START/PASS/FAIL lines here")
    ap.add_argument("--candidates", default="round2", help=f"names or groups ({', '.join(GROUPS)}), comma list")
    ap.add_argument("--exclude", default="", help="comma list of candidate names to leave out")
    ap.add_argument("--tp", default="2,8")
    ap.add_argument("--dtypes", default="bf16", help="bf16, fp16 or bf16,fp16")
    ap.add_argument("--shapes", default="paper")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None, help="default: fresh (printed)")
    ap.add_argument("--json")
    ap.add_argument("--per-shape-best", action="store_true",
                    help="print the best candidate per shape and the geomean of that table")
    ap.add_argument("--margin", type=float, default=0.03,
                    help="--per-shape-best / --write-table: keep tl default at a shape unless a candidate beats it "
                         "by more than this fraction (default 0.03; 0: the plain fastest)")
    ap.add_argument("--write-table", metavar="PATH",
                    help="write the per-shape best as a per-GPU table (kernels/gemm_tables/<gpu>.json) and check "
                         "that every measured shape dispatches to its best candidate through the kernels' lookup")
    ap.add_argument("--source-note", default="", help="--write-table: appended to the table's 'source'")
    ap.add_argument("--from-json", metavar="PATH",
                    help="no GPU: summarise the rows of an earlier --json (with --per-shape-best / --write-table)")
    args = ap.parse_args()
    names, excl = select(args.candidates, args.exclude)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad_dt = [d for d in dtypes if d not in DTYPES]
    if bad_dt:
        raise SystemExit(f"unknown dtypes {bad_dt}; use {', '.join(DTYPES)}")
    import triton
    if args.compile_only:
        t0 = time.time()
        bad = compile_only(names, dtypes)
        print(f"compile: {len(names) - len(bad)} of {len(names)} candidates compile for sm_90a within "
              f"{SMEM_LIMIT} bytes of shared memory (triton {triton.__version__}, {time.time() - t0:.0f} s)"
              + (f"; failed: {', '.join(bad)}" if bad else ""))
        sys.exit(1 if bad else 0)
    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)
        rows = data["rows"]
        names = [n for n in names if any(n in r["cands"] for r in rows)]
        meta = {k: data.get(k) for k in ("device", "triton", "torch", "seed", "sms", "date")}
        sys.exit(1 if finish(rows, names, args, meta, bool(data.get("partial"))) else 0)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    dev = torch.cuda.get_device_properties(0)
    print(f"{dev.name} sm_{dev.major}{dev.minor} {dev.multi_processor_count} SMs | torch {torch.__version__} | triton "
          f"{triton.__version__} | seed {seed} | candidates: {', '.join(names)}"
          + (f" | excluded: {', '.join(sorted(excl))}" if excl else ""), flush=True)
    if (dev.major, dev.minor) != (9, 0):
        print("note: not sm_90: the Gluon candidates refuse to run here (they are Hopper-only)", flush=True)
    t0 = time.time()
    if args.check or args.quick_check:
        bad = do_check(names, args.progress, seed, dtypes, QUICK_CHECK_SHAPES if args.quick_check else None)
        print(f"check: {len(names) - bad} of {len(names)} candidates pass in {time.time() - t0:.0f} s", flush=True)
        sys.exit(1 if bad else 0)
    tps = [int(x) for x in args.tp.split(",")]
    meta = {"device": dev.name, "sms": dev.multi_processor_count, "triton": triton.__version__,
            "torch": torch.__version__, "seed": seed, "date": time.strftime("%Y-%m-%d")}

    def report(results, partial=False):
        rc = finish(results, names, args, meta, partial)
        print(f"timed in {time.time() - t0:.0f} s", flush=True)
        return rc
    results = do_time(names, tps, dtypes, args.rounds, seed, args.shapes,
                      on_stall=lambda rows: report(rows, partial=True))
    sys.exit(1 if report(results) else 0)


if __name__ == "__main__":
    main()
