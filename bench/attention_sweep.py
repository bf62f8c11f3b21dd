"""Issue 28's config sweep on one GPU (world size 1), bounded to ~4 minutes on an H200, to set the per-shape
config tables of kernels/attention.py (``RING_TABLE``) and kernels/flash_decode.py (``DECODE_TABLE``) from
data:

    torchrun --standalone --nproc-per-node 1 bench/attention_sweep.py            # results under $OUT

1. Ring attention forward, 32 q / 8 kv heads, head dim 128, bf16, batch 1, sequence 8192 / 16384 / 32768,
   causal and not: every candidate config (``RING_CANDIDATES`` below) first checked against fp32 SDPA at a
   shape that is not a tile multiple (and shares the compiled variant with the timed runs), then per shape
   checked against SDPA (flash backend) on fresh random inputs, then timed beside SDPA's cuDNN and flash
   backends.  Three timings per row: ``sync`` (events around one call, synchronised after each: the
   harness's method, ``ditron bench``), ``stream`` (events around N calls queued back to back: device time
   when the host keeps up) and ``host`` (the host time of one call while the device is busy), plus the
   kernel time from the torch profiler (``kern``) for the ditron default, the best config and cuDNN.  The
   gap between ``sync`` and ``stream`` / ``kern`` is launch overhead, not kernel speed.
2. Flash-decode, batch 1 (and 16), context 32768 / 65536: split count x keys per tile x warps x stages of
   the split kernel (``DECODE_CANDIDATES``), each checked against SDPA first, timed as CUDA-graph replays
   (``sync``: one replay between events, as ``ditron bench flash_decode``; ``stream``: N replays back to
   back), against a 1 GiB device copy measured in the same run and SDPA's flash / cuDNN backends.

The last lines print the best config per shape (by ``sync``, the bench's method; ``stream`` beside it) and
the table entries to paste.  Full rows: $OUT/attention_sweep.json, log: stdout.  ``--budget`` seconds
(default 190) bounds the ring part: configs not reached are listed as skipped.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ditron
from ditron.bench.harness import capture_graph
from ditron.kernels import attention as A
import importlib

FD = importlib.import_module("ditron.kernels.flash_decode")
C = A.AttnConfig
#: what the ring sweep times (the current defaults first)
RING_CANDIDATES = tuple(dict.fromkeys((
    A.GPU_CONFIG, A.GPU_SHORT_CONFIG, A.HOPPER_CONFIG,
    C(128, 64, 4, 2, tma=True, heads_first=True),     # causal: the longest tiles of every head first
    C(64, 64, 4, 3, tma=True, heads_first=True),
    C(128, 64, 4, 2, tma=True),                     # one warpgroup, 128 rows, 96 KiB: two programs per SM
    C(128, 64, 8, 2, tma=True, maxnreg=128),        # two 8-warp programs per SM
    C(64, 64, 4, 3, tma=False),
    C(128, 128, 8, 2, tma=True),
    C(128, 64, 8, 3, tma=True),
    C(64, 128, 4, 2, tma=True),
    C(64, 64, 4, 4, tma=True),
    C(128, 128, 8, 3, tma=True, persistent=True),
)))
#: flash-decode: (splits, block_n, warps, stages, fused combine); splits 0: the default rule
DECODE_CANDIDATES = tuple((ns, bn, w, st, fu) for bn, w, st in ((128, 4, 3), (64, 4, 4), (64, 4, 3), (64, 4, 2),
                                                                 (128, 8, 3), (128, 4, 2))
                          for ns in (0, 8, 16, 24, 32, 48, 64) for fu in (False, True))


def _sdpa(q, k, v, causal, be):
    with sdpa_kernel(be):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def timings(fn, n_sync=5, n_stream=5, warmup=2):
    """(sync us, stream us, host us) of ``fn`` (module docstring)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n_sync):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    hs = []
    a.record()
    for _ in range(n_stream):
        t = time.perf_counter()
        fn()
        hs.append((time.perf_counter() - t) * 1e6)
    b.record()
    b.synchronize()
    return statistics.median(ts), a.elapsed_time(b) * 1e3 / n_stream, statistics.median(hs)


def kernel_us(fn, n=3):
    """Device time of the kernels ``fn`` launches, from the torch profiler (us per call, by kernel name)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        dt = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if dt and not ev.key.startswith(("aten::", "cuda", "Activity", "Runtime", "ProfilerStep")):
            out[ev.key[:60]] = dt / n
    return out


def host_profile(dev, log, out_dir, seq=8192, calls=30):
    """Where the host time of one ``ring_attention`` call goes (cProfile over ``calls`` eager calls of the
    default config; the device is kept busy, so the host is not waiting on it): top functions by cumulative
    time into the log and $OUT/attention_sweep_host.txt."""
    import cProfile
    import io
    import pstats
    B, HQ, HKV, D, dt = 1, 32, 8, 128, torch.bfloat16
    q = torch.randn(B, HQ, seq, D, device=dev).to(dt)
    k = torch.randn(B, HKV, seq, D, device=dev).to(dt)
    v = torch.randn(B, HKV, seq, D, device=dev).to(dt)
    ctx = A.create_ring_attention_context(B, seq, HKV, D, dt)
    for _ in range(3):
        A.ring_attention(q, k, v, ctx)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for _ in range(calls):
        A.ring_attention(q, k, v, ctx)
    prof.disable()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    with open(os.path.join(out_dir, "attention_sweep_host.txt"), "w") as f:
        f.write(f"ring_attention seq {seq}: {host:.0f} us of host time per call under cProfile\n" + buf.getvalue())
    log(f"host profile: {host:.0f} us per ring_attention call under cProfile (top entries in "
        f"attention_sweep_host.txt):\n" + "\n".join(buf.getvalue().splitlines()[:40]))
    del ctx, q, k, v


def ring_sweep(dev, log, budget, seqs, candidates, tag):
    t0 = time.time()
    B, HQ, HKV, D, dt = 1, 32, 8, 128, torch.bfloat16
    ok_cfgs, rows, skipped = [], [], []
    # 1. correctness at a shape that is not a tile multiple (rows a multiple of 16: the timed variant)
    S0 = 1008
    ctx0 = A.create_ring_attention_context(B, S0, HKV, D, dt)
    for cfg in candidates:
        if time.time() - t0 > budget * 0.6:
            skipped.append(cfg.short())
            continue
        good = True
        for causal in (False, True):
            q, k, v = (torch.randn(B, h, S0, D, device=dev).to(dt) for h in (HQ, HKV, HKV))
            G = HQ // HKV
            ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(G, 1),
                                                 v.float().repeat_interleave(G, 1), is_causal=causal)
            try:
                out = torch.full_like(q, float("nan"))
                A.ring_attention(q, k, v, ctx0, causal=causal, config=cfg, out=out)
                torch.cuda.synchronize()
                rel = ((out.float() - ref).norm() / ref.norm()).item()
                if not rel < 1e-2:
                    raise AssertionError(f"relative error {rel:.3g}")
            except Exception as e:  # noqa: BLE001 -- reported
                log(f"ring {cfg.short()} causal={causal}: FAILED check at S={S0}: {type(e).__name__}: {str(e)[:300]}")
                good = False
                break
        if good:
            ok_cfgs.append(cfg)
            log(f"ring {cfg.short()}: correct at S={S0}, causal and not ({time.time() - t0:.0f} s)")
    del ctx0
    # 2. per shape: check on the timed inputs, then time
    for seq in seqs:
        for causal in (False, True):
            q = torch.randn(B, HQ, seq, D, device=dev).to(dt)
            k = torch.randn(B, HKV, seq, D, device=dev).to(dt)
            v = torch.randn(B, HKV, seq, D, device=dev).to(dt)
            ctx = A.create_ring_attention_context(B, seq, HKV, D, dt)
            ref = _sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION)
            flops = 4.0 * B * HQ * seq * seq * D * (0.5 if causal else 1.0)
            impls = [("sdpa_cudnn", lambda: _sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION)),
                     ("sdpa_flash", lambda: _sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION))]
            for cfg in ok_cfgs:
                impls.append((cfg.short(), lambda cfg=cfg: A.ring_attention(q, k, v, ctx, causal=causal, config=cfg)))
            shape_rows = []
            for name, fn in impls:
                if time.time() - t0 > budget and not name.startswith("sdpa"):
                    skipped.append(f"{name}@{seq}/{causal}")
                    continue
                try:
                    out = fn()
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs().max().item()
                    if not err <= 3e-2:
                        raise AssertionError(f"max abs error {err:.3g} against SDPA flash")
                    s, st, h = timings(fn, n_sync=5, n_stream=5 if seq <= 16384 else 3)
                    r = {"pass": tag, "seq": seq, "causal": causal, "impl": name, "sync_us": s, "stream_us": st,
                         "host_us": h,
                         "tflops_sync": flops / s / 1e6, "tflops_stream": flops / st / 1e6, "ok": True}
                except Exception as e:  # noqa: BLE001 -- reported
                    r = {"pass": tag, "seq": seq, "causal": causal, "impl": name, "ok": False,
                         "error": f"{type(e).__name__}: {str(e)[:300]}"}
                shape_rows.append(r)
            base = next((r for r in shape_rows if r["impl"] == "sdpa_cudnn" and r["ok"]), None)
            for r in shape_rows:
                if r["ok"] and base:
                    r["x_cudnn_sync"] = base["sync_us"] / r["sync_us"]
                    r["x_cudnn_stream"] = base["stream_us"] / r["stream_us"]
            good = [r for r in shape_rows if r["ok"] and not r["impl"].startswith("sdpa")]
            best = min(good, key=lambda r: r["sync_us"]) if good else None
            # kernel times (profiler) of cuDNN, the current default and the best
            default = A.default_config(dev, seq, causal).short()
            for name in dict.fromkeys(["sdpa_cudnn", default] + ([best["impl"]] if best else [])):
                fn = dict(impls).get(name)
                r = next((x for x in shape_rows if x["impl"] == name and x["ok"]), None)
                if fn is None or r is None:
                    continue
                try:
                    ks = kernel_us(fn)
                    r["kernel_us"] = sum(ks.values())
                    r["kernels"] = ks
                    r["tflops_kernel"] = flops / r["kernel_us"] / 1e6
                except Exception as e:  # noqa: BLE001 -- reported
                    r["kernel_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            if base and base.get("kernel_us"):
                for r in shape_rows:
                    if r.get("kernel_us"):
                        r["x_cudnn_kernel"] = base["kernel_us"] / r["kernel_us"]
            for r in shape_rows:
                if r["ok"]:
                    log(f"ring{tag} seq={seq} causal={causal!s:5} {r['impl']:>18}: sync {r['sync_us']:8.0f} us "
                        f"(x cuDNN {r.get('x_cudnn_sync', float('nan')):.2f}), stream {r['stream_us']:8.0f} us "
                        f"(x {r.get('x_cudnn_stream', float('nan')):.2f}), host {r['host_us']:6.0f} us"
                        + (f", kernel {r['kernel_us']:8.0f} us (x {r.get('x_cudnn_kernel', float('nan')):.2f})"
                           if r.get("kernel_us") else ""))
                else:
                    log(f"ring seq={seq} causal={causal!s:5} {r['impl']:>18}: FAILED {r['error']}")
            rows += shape_rows
            del ctx, q, k, v, ref
            torch.cuda.empty_cache()
    return rows, skipped


def decode_sweep(dev, log, bw):
    HQ, HKV, D, dt = 32, 8, 128, torch.bfloat16
    rows = []
    for ctx_len, batch in ((32768, 1), (65536, 1), (32768, 16)):
        q = torch.randn(batch, HQ, D, device=dev).to(dt)
        k = torch.randn(batch, HKV, ctx_len, D, device=dev).to(dt)
        v = torch.randn(batch, HKV, ctx_len, D, device=dev).to(dt)
        lens = torch.full((batch,), ctx_len, dtype=torch.int32, device=dev)
        ctx = FD.create_flash_decode_context(batch, HQ, HKV, D, dt)

        def sdpa(be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]

        ref = sdpa(SDPBackend.FLASH_ATTENTION)
        kv_bytes = 2 * batch * HKV * ctx_len * D * 2
        impls = [("sdpa_cudnn", lambda: sdpa(SDPBackend.CUDNN_ATTENTION)),
                 ("sdpa_flash", lambda: sdpa(SDPBackend.FLASH_ATTENTION))]
        cands = DECODE_CANDIDATES if batch == 1 else tuple(c for c in DECODE_CANDIDATES if c[0] in (0, 32, 64)
                                                            and c[1:4] in ((128, 4, 3), (64, 4, 4)))
        for ns, bn, w, st, fu in cands:
            impls.append((f"ns{ns or 'D'}_bn{bn}_w{w}_s{st}{'_fused' if fu else ''}",
                          lambda ns=ns, bn=bn, w=w, st=st, fu=fu: FD.flash_decode(
                              q, k, v, lens, ctx, splits=ns or None, block_n=bn, num_warps=w, num_stages=st,
                              fuse_combine=fu)))
        for name, fn in impls:
            try:
                out = fn()
                torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                if not err <= 2e-2:
                    raise AssertionError(f"max abs error {err:.3g} against SDPA flash")
                g = capture_graph(fn)
                g.replay()
                torch.cuda.synchronize()
                sy, stv, _ = timings(g.replay, n_sync=30, n_stream=30, warmup=5)
                r = {"ctx": ctx_len, "batch": batch, "impl": name, "sync_us": sy, "stream_us": stv, "ok": True,
                     "of_copy_sync": kv_bytes / (sy * 1e-6) / bw, "of_copy_stream": kv_bytes / (stv * 1e-6) / bw}
                del g
            except Exception as e:  # noqa: BLE001 -- reported
                r = {"ctx": ctx_len, "batch": batch, "impl": name, "ok": False,
                     "error": f"{type(e).__name__}: {str(e)[:300]}"}
            rows.append(r)
            if r["ok"]:
                log(f"decode ctx={ctx_len} batch={batch} {name:>20}: sync {r['sync_us']:7.1f} us "
                    f"({r['of_copy_sync']:.3f} of copy bw), stream {r['stream_us']:7.1f} us "
                    f"({r['of_copy_stream']:.3f})")
            else:
                log(f"decode ctx={ctx_len} batch={batch} {name:>20}: FAILED {r['error']}")
        del ctx, q, k, v
        torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    p.add_argument("--budget", type=float, default=190.0, help="seconds for the ring part")
    p.add_argument("--seq", default="8192,16384,32768")
    p.add_argument("--skip", default="", help="ring or decode: skip that part")
    args = p.parse_args()
    world = ditron.init()
    dev = world.device
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)

    def log(msg):
        print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)

    from ditron.bench.megakernel import copy_bandwidth
    torch.manual_seed(int(time.time()))
    props = torch.cuda.get_device_properties(dev)
    bw = copy_bandwidth(dev)
    log(f"device {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, copy bandwidth "
        f"{bw / 1e9:.0f} GB/s (read + write)")
    res = {"device": props.name, "sms": props.multi_processor_count, "copy_GBs": bw / 1e9}
    if "decode" not in args.skip:
        res["decode"] = decode_sweep(dev, log, bw)
    if "ring" not in args.skip:
        seqs = [int(s) for s in args.seq.split(",")]
        res["ring"], res["ring_skipped"] = ring_sweep(dev, log, args.budget, seqs, RING_CANDIDATES, 1)
        try:
            host_profile(dev, log, args.out)
        except Exception as e:  # noqa: BLE001 -- reported
            log(f"host profile FAILED: {type(e).__name__}: {e}")
    with open(os.path.join(args.out, "attention_sweep.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    # summary: the best per shape
    print("\n==== best per shape (sync = the bench's method; stream = back to back; kernel = profiler)")
    for seq in sorted({r["seq"] for r in res.get("ring", [])}):
        for causal in (False, True):
            rs = [r for r in res["ring"] if r["seq"] == seq and r["causal"] == causal and r["ok"]]
            ours = [r for r in rs if not r["impl"].startswith("sdpa")]
            if not ours:
                continue
            bs = min(ours, key=lambda r: r["sync_us"])
            bt = min(ours, key=lambda r: r["stream_us"])
            print(f"ring {seq:6d} causal={causal!s:5}: best sync {bs['impl']} x cuDNN "
                  f"{bs.get('x_cudnn_sync', math.nan):.2f}"
                  f" | best stream {bt['impl']} x cuDNN {bt.get('x_cudnn_stream', math.nan):.2f}"
                  + "".join(f" | kernel {r['impl']} x {r['x_cudnn_kernel']:.2f}" for r in rs
                            if r.get("x_cudnn_kernel") and not r["impl"].startswith("sdpa")))
    for key in sorted({(r["ctx"], r["batch"]) for r in res.get("decode", [])}):
        rs = [r for r in res["decode"] if (r["ctx"], r["batch"]) == key and r["ok"]]
        ours = [r for r in rs if not r["impl"].startswith("sdpa")]
        if ours:
            bs = min(ours, key=lambda r: r["sync_us"])
            dflt = next((r for r in ours if r["impl"] == "nsD_bn128_w4_s3"), None)
            cud = next((r for r in rs if r["impl"] == "sdpa_cudnn"), None)
            print(f"decode ctx={key[0]} batch={key[1]}: best {bs['impl']} {bs['of_copy_sync']:.3f} of copy bw "
                  f"(stream {bs['of_copy_stream']:.3f}); default {dflt['of_copy_sync'] if dflt else math.nan:.3f}; "
                  f"cuDNN {cud['of_copy_sync'] if cud else math.nan:.3f}")
    if res.get("ring_skipped"):
        print("skipped (budget):", ", ".join(res["ring_skipped"]))
    print(f"total {time.time() - t0:.0f} s; wrote {os.path.join(args.out, 'attention_sweep.json')}")
    ditron.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
