"""Issue 52's GEMM-core levers on one GPU, side by side with cuBLAS (``torch.matmul``) in the same process.

Candidates (``--candidates``, comma list of names; default: all of CANDIDATES):

* ``tl default``   -- the ``tl.dot`` core as shipped (``ditron.kernels.gemm.default_config``);
* ``tl ws ...``    -- the same core with ``tl.range(warp_specialize=True)`` at ``num_warps=4``: on sm_90 Triton's
                      Hopper warp-specialisation pass splits it into a producer and two consumer warpgroups (384
                      threads, ``setmaxnreg``); at ``num_warps=8`` (what the 2026-12-06 probe timed) it leaves the
                      kernel unchanged (tests/test_compile_gemm_hopper.py);
* ``gluon ...``    -- the Gluon core (``ditron.kernels.gemm_hopper``): producer warp + two consumer warpgroups,
                      cooperative (``coop``) or ping-pong, several tiles / stage counts.

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

C = G.GemmConfig
HC = H.HopperGemmConfig

#: name -> ("tl", GemmConfig or None for the default) | ("gluon", HopperGemmConfig)
CANDIDATES = {
    "tl default": ("tl", None),
    "tl ws 128x256x64 s3 w4": ("tl", C(128, 256, 64, 8, 4, 3, tma=True, warp_specialize=True)),
    "tl ws 128x128x64 s4 w4": ("tl", C(128, 128, 64, 8, 4, 4, tma=True, warp_specialize=True)),
    "gluon coop 128x256x64 s3": ("gluon", HC(128, 256, 64, stages=3, mode="coop")),
    "gluon coop 128x256x64 s4 epi/2": ("gluon", HC(128, 256, 64, stages=4, mode="coop", epilogue_split=2)),
    "gluon coop 256x128x64 s3": ("gluon", HC(256, 128, 64, stages=3, mode="coop")),
    "gluon pingpong 128x128x64 s4": ("gluon", HC(128, 128, 64, stages=4, mode="pingpong")),
    "gluon pingpong 128x128x64 s6 epi/2": ("gluon", HC(128, 128, 64, stages=6, mode="pingpong", epilogue_split=2)),
    "gluon pingpong 64x256x64 s4": ("gluon", HC(64, 256, 64, stages=4, mode="pingpong")),
}

#: the check shapes: tails in M, N and K, fewer tiles than SMs (and an odd tile count: ping-pong's consumers get
#: different numbers of tiles), one paper shape
CHECK_SHAPES = [(1000, 1000, 1000), (130, 328, 72), (256, 512, 128), (8192, 5504, 4096), (3000, 2056, 4104)]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: seconds without progress after which a step counts as hung (a candidate's check compiles 4 kernels; a timing
#: round at the largest shape takes a few seconds)
STALL_S = float(os.environ.get("GEMM_LEVERS_STALL_S", "75"))


def run_fn(name, a, b, out):
    kind, cfg = CANDIDATES[name]
    if kind == "tl":
        return lambda: G.matmul(a, b, out=out, config=cfg)
    return lambda: H.matmul_hopper(a, b, out=out, config=cfg)


def twin_of(name):
    """The ``tl`` core config with the Gluon candidate's tiles and BLOCK_K (same K order)."""
    kind, cfg = CANDIDATES[name]
    return H.twin_config(cfg) if kind == "gluon" else None


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


def do_check(names, progress, seed):
    """Correctness and twin bit-equality of each candidate at CHECK_SHAPES, both dtypes."""
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
        for dname, dtype in DTYPES.items():
            for (M, N, K) in CHECK_SHAPES:
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="correctness and twin bit-equality only")
    ap.add_argument("--progress", help="--check: append START/PASS/FAIL lines here")
    ap.add_argument("--candidates", default="all")
    ap.add_argument("--exclude", default="", help="comma list of candidate names to leave out")
    ap.add_argument("--tp", default="2,8")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--shapes", default="paper")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None, help="default: fresh (printed)")
    ap.add_argument("--json")
    args = ap.parse_args()
    names = list(CANDIDATES) if args.candidates == "all" else [n.strip() for n in args.candidates.split(",")]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SystemExit(f"unknown candidates {unknown}; known: {list(CANDIDATES)}")
    excl = {n.strip() for n in args.exclude.split(",") if n.strip()}
    names = [n for n in names if n not in excl]
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    dev = torch.cuda.get_device_properties(0)
    import triton
    print(f"{dev.name} sm_{dev.major}{dev.minor} {dev.multi_processor_count} SMs | torch {torch.__version__} | triton "
          f"{triton.__version__} | seed {seed} | candidates: {', '.join(names)}"
          + (f" | excluded: {', '.join(sorted(excl))}" if excl else ""), flush=True)
    if (dev.major, dev.minor) != (9, 0):
        print("note: not sm_90: the Gluon candidates refuse to run here (they are Hopper-only)", flush=True)
    t0 = time.time()
    if args.check:
        bad = do_check(names, args.progress, seed)
        print(f"check: {len(names) - bad} of {len(names)} candidates pass in {time.time() - t0:.0f} s", flush=True)
        sys.exit(1 if bad else 0)
    tps = [int(x) for x in args.tp.split(",")]
    dtypes = [d.strip() for d in args.dtypes.split(",")]

    def report(results, partial=False):
        print(summary(results, names) + ("\n(partial: the run stopped at a hung step)" if partial else ""))
        print(f"timed in {time.time() - t0:.0f} s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": dev.name, "triton": triton.__version__, "torch": torch.__version__,
                           "seed": seed, "partial": partial,
                           "candidates": {n: repr(CANDIDATES[n][1]) for n in names}, "rows": results}, f, indent=1)
    results = do_time(names, tps, dtypes, args.rounds, seed, args.shapes,
                      on_stall=lambda rows: report(rows, partial=True))
    report(results)


if __name__ == "__main__":
    main()
