"""The GEMM core (kernels/gemm.py, ``matmul``) against cuBLAS on one GPU, at the per-rank GEMM shapes of the
paper's AG-GEMM and GEMM-RS/AR workloads for a TP degree, over a list of TMA configs: the data behind
``default_config``'s per-shape table.  Correctness first (fresh random inputs, against torch), then CUDA-graph
replays, cuBLAS and each config alternating in rounds; the median of each round, the best round kept.

    python bench/gemm_core_sweep.py --tp 2 [--configs all|default] [--json out.json]

Prints one line per (shape, config) and, per shape, the best config and the default's ratio."""
import argparse
import json
import math
import sys
import time

import torch

sys.path.insert(0, ".")
from ditron.bench.gemm import gemm_core_shapes  # noqa: E402
import ditron.kernels.gemm as G  # noqa: E402

C = G.GemmConfig
CONFIGS = {
    "t256 s3 fl": C(128, 256, 64, 8, 8, 3, tma=True, flatten=True),
    "t256 s3 fl sub2": C(128, 256, 64, 8, 8, 3, tma=True, flatten=True, epilogue_subtile=2),
    "t256 s4 fl sub2": C(128, 256, 64, 8, 8, 4, tma=True, flatten=True, epilogue_subtile=2),
    "t256 s3 nofl": C(128, 256, 64, 8, 8, 3, tma=True),
    "t256 s3 ws": C(128, 256, 64, 8, 8, 3, tma=True, warp_specialize=True),
    "t256 s4 ws sub2": C(128, 256, 64, 8, 8, 4, tma=True, warp_specialize=True, epilogue_subtile=2),
    "t256 s3 fl g16": C(128, 256, 64, 16, 8, 3, tma=True, flatten=True),
    "t256 s3 fl g4": C(128, 256, 64, 4, 8, 3, tma=True, flatten=True),
    "t256k128 s2 fl sub2": C(128, 256, 128, 8, 8, 2, tma=True, flatten=True, epilogue_subtile=2),
    "m256 s3 fl": C(256, 128, 64, 8, 8, 3, tma=True, flatten=True),
    "m256 s4 fl sub2": C(256, 128, 64, 8, 8, 4, tma=True, flatten=True, epilogue_subtile=2),
    "t128 s4 fl": C(128, 128, 64, 8, 8, 4, tma=True, flatten=True),
    "t128k128 s3 fl": C(128, 128, 128, 8, 8, 3, tma=True, flatten=True),
}


def graph_timer(fn, reps=5):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()

    def run(n=20):
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--shapes", default="paper")
    ap.add_argument("--configs", default="all", help="all | default | comma list of names")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--probe", help="also time the persistent TMA kernel of shared/bench/probes/gemm_tma_probe.py "
                                    "(a copy of that file) at 128x256x64, 3 stages, flattened, as a reference")
    args = ap.parse_args()
    names = (list(CONFIGS) if args.configs == "all" else [] if args.configs == "default"
             else args.configs.split(","))
    dev = "cuda"
    probe = None
    if args.probe:
        import importlib.util
        import tempfile
        text = open(args.probe).read()
        # the probe is a script: import only its kernel and run() (everything before its timing code)
        tmp = tempfile.NamedTemporaryFile("w", suffix="_probe_kernel.py", delete=False)
        tmp.write(text[:text.index("def bench(")])
        tmp.close()
        spec = importlib.util.spec_from_file_location("probe_kernel", tmp.name)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        probe = {"run": mod.run}
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", __import__("triton").__version__,
          flush=True)
    out = []
    for shape in gemm_core_shapes(args.shapes, args.tp):
        M, N, K = shape.M, shape.N, shape.K
        g = torch.Generator(device=dev).manual_seed(M + N + K)
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
        b = torch.randn(K, N, device=dev, dtype=torch.bfloat16, generator=g)
        ref = (a.float() @ b.float())
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        cands = {"default": G.default_config(M, N, K)}
        cands.update({n: CONFIGS[n] for n in names})
        timers = {"cublas": graph_timer(lambda: torch.matmul(a, b, out=c))}
        status = {}
        if probe is not None:
            nsm = torch.cuda.get_device_properties(0).multi_processor_count
            pcfg = (128, 256, 64, 8, 3, 8, False, False, True)
            cands["probe"] = pcfg
            c.fill_(float("nan"))
            probe["run"](a, b, c, pcfg, nsm)
            torch.cuda.synchronize()
            err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
            if err < 1e-2:
                timers["probe"] = graph_timer(lambda: probe["run"](a, b, c, pcfg, nsm))
            else:
                status["probe"] = f"WRONG (rel err {err:.3g})"
        for n, cfg in cands.items():
            if n == "probe":
                continue
            try:
                c.fill_(float("nan"))
                G.matmul(a, b, out=c, config=cfg)
                torch.cuda.synchronize()
                err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
                if not err < 1e-2:
                    status[n] = f"WRONG (rel err {err:.3g})"
                    continue
                timers[n] = graph_timer(lambda cfg=cfg: G.matmul(a, b, out=c, config=cfg))
            except Exception as e:  # noqa: BLE001 -- a config that does not fit is reported, not fatal
                status[n] = "FAIL " + (str(e).splitlines() or [type(e).__name__])[0][:90]
        best = {k: math.inf for k in timers}
        for _ in range(args.rounds):
            for k, t in timers.items():
                best[k] = min(best[k], t())
        tc = best["cublas"]
        print(f"\n{shape.label}: {M}x{N}x{K}: cuBLAS {tc:.1f} us ({2 * M * N * K / tc / 1e6:.0f} TFLOP/s); "
              f"default = {cands['default']}", flush=True)
        row = {"shape": shape.label, "M": M, "N": N, "K": K, "cublas_us": tc, "configs": {}}
        for n in cands:
            if n in status:
                print(f"   {n:22s} {status[n]}", flush=True)
                row["configs"][n] = {"status": status[n]}
            else:
                print(f"   {n:22s} {best[n]:8.1f} us  {tc / best[n]:.3f}x cuBLAS", flush=True)
                row["configs"][n] = {"us": best[n], "vs_cublas": tc / best[n]}
        ok = {n: best[n] for n in cands if n not in status and n != "default"}
        if ok:
            bn = min(ok, key=ok.get)
            print(f"   BEST {bn}: {tc / ok[bn]:.3f}x cuBLAS", flush=True)
        out.append(row)
        del a, b, c, ref
        torch.cuda.empty_cache()
    d = [r["configs"]["default"].get("vs_cublas") for r in out]
    if all(d):
        print(f"\nGEMM core geomean vs cuBLAS (default config): {math.exp(sum(map(math.log, d)) / len(d)):.3f}x; "
              f"lowest {min(d):.3f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0), "tp": args.tp,
                       "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
