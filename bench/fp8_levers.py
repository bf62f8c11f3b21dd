"""Issue 55's fp8 GEMM-core levers on ONE GPU, timed against torch's fp8 GEMMs in the same process
(bench/fp8_levers.sh runs it).

Why the shipped core is slow (bench/results/h100-2026-12-07-fp8: rowwise 0.59-0.95x torch._scaled_mm, blockwise
0.53-0.60x of ditron's bf16 core).  Compiled for sm_90a on a CPU (Triton 3.6, ``CompiledKernel.usage()`` and the
PTX; ``python bench/fp8_levers.py --compile`` prints it):

* the default fp8 config, 128 x 256 x 128 tiles on 8 warps, SPILLS: 255 registers, 172 spill stores (rowwise), 272
  (blockwise).  ``max_num_imprecise_acc=BLOCK_K`` makes Triton keep a second [128, 256] fp32 accumulator (the
  promotion: each K step's product is summed in a zeroed tensor-core accumulator, then added in fp32), i.e. 2 x
  128 fp32 registers per thread on 256 threads: over the 255 limit;
* 128 x 128 x 128 (4 stages) does not spill rowwise (180 registers): the first lever;
* blockwise, the scale step ``acc + part * scale_a[rows, g][:, None] * scale_b[g, cols // 128][None, :]`` loads
  a [BLOCK_N] gather of scale_b (2 distinct values for BLOCK_N = 256) and a [BLOCK_M] column of scale_a every K
  step through pointers, and multiplies twice per element: 128 x 128 spills 1276 stores, and the wgmma chain is
  drained every step (``wgmma.wait_group 0`` only).  DeepGEMM's way (the ``lever block`` kernel below): BLOCK_N =
  128 = the weight block, so scale_b is ONE scalar per K step; the row scales times it once per step
  (``[BLOCK_M]``), one FMA per accumulator element; the next step's scales loaded before this step's MMA.

Candidates (``--candidates`` / ``CANDIDATES``; default all):

* ``core default``                        the fp8 core as shipped (``kernels.gemm.fp8_config``);
* ``core BMxBNxBK sS [wW] [ws]``          the same core with another ``GemmConfig``;
* ``lever row BMxBN sS [fast]``            the lever kernel, rowwise scales in the epilogue; ``fast``: NO promotion
                                          (the whole K in the tensor core's accumulator, as
                                          ``torch._scaled_mm(use_fast_accum=True)``; its own baseline row);
* ``lever block BMx128 sS``               the lever kernel, DeepGEMM-style blockwise scales.

Per recipe and shape: every candidate is checked first (max abs error against the float64 product of the
dequantised operands <= 1% of the largest output; fast accumulation 3%), then timed with the baselines in the
same process: CUDA-graph replays of 5 calls, median of 20, best of ``--rounds`` rounds in alternating order.
Baselines: ``torch._scaled_mm`` (rowwise; and ``use_fast_accum=True`` for the fast rows) and torch's blockwise
scaled mm (``ditron.bench.gemm_sweep.vendor_blockwise``: the scale layouts torch's CUDA checks name, or the reason
it is not available in this torch).  Prints per shape the ratio baseline time / candidate time (> 1: faster), per
candidate the geomean, worst shape and the ratio to ditron's bf16 core (goal 1.6x); ``--json`` writes every number.

    python bench/fp8_levers.py [--recipes row,block] [--tp 8] [--candidates "core default,lever block 128x128 s4"]
    python bench/fp8_levers.py --compile        # CPU: registers / spills / wgmma of every candidate (sm_90a)
"""
import argparse
import json
import math
import os
import re
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ditron  # noqa: E402
import ditron.language as dl  # noqa: E402
import ditron.kernels.gemm as G  # noqa: E402

C = G.GemmConfig
E4 = torch.float8_e4m3fn


# ---------------------------------------------------------------------------
# the lever kernel
# ---------------------------------------------------------------------------

@ditron.jit(do_not_specialize=["M"])
def fp8_lever_kernel(a_ptr, bt_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                     stride_sam, stride_sak, stride_sbk, stride_sbn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     RECIPE: tl.constexpr, PROMOTE: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr,
                     LAG: tl.constexpr = False):
    """Persistent fp8 ``c = a @ b`` through TMA: ``a [M, K]`` row-major, ``bt = b^T [N, K]`` row-major (K-major
    tiles for wgmma), ``c [M, N]``.  ``RECIPE`` 1: rowwise (``sa [M]``, ``sb [N]`` in the epilogue; ``PROMOTE``:
    promote to fp32 every ``BLOCK_K``, else the whole K in the tensor core's accumulator); 2: blockwise
    (``sa[m, g]``, ``sb[g, n // 128]``, ``BLOCK_N == BLOCK_K == 128``): each K step's product scaled by one row
    vector ``sa[:, g] * sb[g, pid_n]`` and added in fp32, the next step's scales loaded before the MMA;
    ``LAG``: step ``g``'s product is scaled and added after step ``g + 1``'s MMA is issued (the MMA overlaps
    the promotion, at the cost of a third register tile)."""
    P = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    nk = tl.cdiv(K, BLOCK_K)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(bt_ptr, shape=[N, K], strides=[stride_bn, 1], block_shape=[BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, P, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = dl.swizzle_2d(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = tl.minimum(off_m + tl.arange(0, BLOCK_M), M - 1)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if RECIPE == 1:
            for ki in range(nk):
                a = a_desc.load([off_m, ki * BLOCK_K])
                b = b_desc.load([off_n, ki * BLOCK_K]).T
                if PROMOTE:
                    acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
                else:
                    acc = tl.dot(a, b, acc)
            cols = off_n + tl.arange(0, BLOCK_N)
            sa = tl.load(sa_ptr + rows.to(tl.int64) * stride_sam)
            sb = tl.load(sb_ptr + cols.to(tl.int64) * stride_sbn, mask=cols < N, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        else:
            sa_row = sa_ptr + rows.to(tl.int64) * stride_sam
            sb_blk = sb_ptr + pid_n.to(tl.int64) * stride_sbn
            sa_next = tl.load(sa_row)
            sb_next = tl.load(sb_blk)
            prev = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            s_prev = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for ki in range(nk):
                a = a_desc.load([off_m, ki * BLOCK_K])
                b = b_desc.load([off_n, ki * BLOCK_K]).T
                s = sa_next * sb_next
                more = ki + 1 < nk
                sa_next = tl.load(sa_row + (ki + 1) * stride_sak, mask=more, other=0.0)
                sb_next = tl.load(sb_blk + (ki + 1) * stride_sbk, mask=more, other=0.0)
                part = tl.dot(a, b)
                if LAG:
                    acc += prev * s_prev[:, None]
                    prev = part
                    s_prev = s
                else:
                    acc += part * s[:, None]
            if LAG:
                acc += prev * s_prev[:, None]
        c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))


def lever_matmul(a, b, sa, sb, recipe, bm, bn, stages, warps, promote=True, ws=False, out=None, lag=False):
    """``a [M, K]`` e4m3, ``b [K, N]`` e4m3 column-major (``w.t()``), scales as kernels/scaling.py takes them
    (rowwise ``[M, 1]`` / ``[1, N]``; blockwise ``[M, K/128]`` / ``[K/128, N/128]``)."""
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=torch.bfloat16, device=a.device)
    bt = b.t()                                    # [N, K] row-major view of the column-major b
    G.ensure_tma_allocator()
    P = min(G.sm_count(a.device), triton.cdiv(M, bm) * triton.cdiv(N, bn))
    if recipe == "row":
        args = (sa.reshape(-1), sb.reshape(-1), 1, 0, 0, 1)
    else:
        args = (sa, sb, sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1))
    fp8_lever_kernel[(P,)](a, bt, out, args[0], args[1], M, N, K, a.stride(0), bt.stride(0), out.stride(0),
                           *args[2:], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=8,
                           RECIPE=1 if recipe == "row" else 2, PROMOTE=promote, FLATTEN=not ws, WS=ws, LAG=lag,
                           num_warps=warps, num_stages=stages)
    return out


# ---------------------------------------------------------------------------
# candidates
# ---------------------------------------------------------------------------

def _core(cfg):
    def run(a, b, sa, sb, out):
        return G.matmul(a, b, out=out, config=cfg, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    return run


def _lever(recipe, bm, bn, stages, warps, promote=True, ws=False, lag=False):
    def run(a, b, sa, sb, out):
        return lever_matmul(a, b, sa, sb, recipe, bm, bn, stages, warps, promote, ws, out, lag)
    run.compile_args = dict(recipe=recipe, bm=bm, bn=bn, stages=stages, warps=warps, promote=promote, ws=ws,
                            lag=lag)
    return run


#: name -> (recipes it applies to, run(a, b, sa, sb, out), fast accumulation?)
CANDIDATES = {
    "core default": (("row", "block"), _core(None), False),
    "core 128x128x128 s4": (("row", "block"), _core(C(128, 128, 128, 8, 8, 4, tma=True, flatten=True)), False),
    "core 128x128x128 s5": (("row",), _core(C(128, 128, 128, 8, 8, 5, tma=True, flatten=True)), False),
    "core 128x128x128 s4 w4 ws": (("row",), _core(C(128, 128, 128, 8, 4, 4, tma=True, warp_specialize=True)), False),
    "core 256x128x128 s3": (("row",), _core(C(256, 128, 128, 8, 8, 3, tma=True, flatten=True)), False),
    "lever row 128x128 s4": (("row",), _lever("row", 128, 128, 4, 8), False),
    "lever row 128x128 s4 w4 ws": (("row",), _lever("row", 128, 128, 4, 4, ws=True), False),
    "lever row 128x256 s3 fast": (("row",), _lever("row", 128, 256, 3, 8, promote=False), True),
    "lever row 128x128 s4 fast": (("row",), _lever("row", 128, 128, 4, 8, promote=False), True),
    "lever block 128x128 s4": (("block",), _lever("block", 128, 128, 4, 8), False),
    "lever block 128x128 s5": (("block",), _lever("block", 128, 128, 5, 8), False),
    "lever block 64x128 s6 w4": (("block",), _lever("block", 64, 128, 6, 4), False),
    "lever block 128x128 s4 lag": (("block",), _lever("block", 128, 128, 4, 8, lag=True), False),
    "lever block 64x128 s6 w4 lag": (("block",), _lever("block", 64, 128, 6, 4, lag=True), False),
}


# ---------------------------------------------------------------------------
# operands, references, baselines
# ---------------------------------------------------------------------------

def operands(M, N, K, recipe, seed, dev):
    """(a, b column-major, sa, sb, a_deq, b_deq): seeded e4m3 operands with their decode scales."""
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn((M, K), generator=g, device=dev)
    w = torch.randn((N, K), generator=g, device=dev)
    top = torch.finfo(E4).max
    if recipe == "row":
        sa = (x.abs().amax(1, keepdim=True) / top).clamp(min=1e-12)
        sw = (w.abs().amax(1, keepdim=True) / top).clamp(min=1e-12)
        a, wq = (x / sa).to(E4), (w / sw).to(E4)
        return a, wq.t(), sa, sw.t(), a.float() * sa, (wq.float() * sw).t()
    kg, ng = -(-K // 128), -(-N // 128)
    xp = torch.nn.functional.pad(x, (0, kg * 128 - K)).reshape(M, kg, 128)
    sa = (xp.abs().amax(2) / top).clamp(min=1e-12)                                   # [M, K/128]
    a = (xp / sa[:, :, None]).reshape(M, kg * 128)[:, :K].to(E4)
    wp = torch.nn.functional.pad(w, (0, kg * 128 - K, 0, ng * 128 - N)).reshape(ng, 128, kg, 128)
    sw = (wp.abs().amax((1, 3)) / top).clamp(min=1e-12)                              # [N/128, K/128]
    wq = (wp / sw[:, None, :, None]).reshape(ng * 128, kg * 128)[:N, :K].to(E4)
    fa = sa.repeat_interleave(128, 1)[:, :K]
    fw = sw.repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
    return a, wq.t(), sa.contiguous(), sw.t().contiguous(), a.float() * fa, (wq.float() * fw).t()


def time_us(fn, calls=5, reps=20):
    """Median of ``reps`` CUDA-graph replays of ``calls`` calls, per call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000 / calls)
    return sorted(ts)[len(ts) // 2]


def check(out, ref, fast):
    err = (out.float() - ref).abs().max().item()
    tol = (0.03 if fast else 0.01) * ref.abs().max().item()
    if not (err <= tol) or not torch.isfinite(out).all():
        raise AssertionError(f"max abs error {err:.4g} > {tol:.4g}")
    return err


def compile_report(names):
    """CPU: every lever / core candidate compiled for sm_90a (Triton's sm_90a backend, no GPU): registers,
    spills, shared memory, the wgmma shape and the wait depths."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from test_gemm_core import _NAMES
    for name in names:
        recipes, run, fast = CANDIDATES[name]
        for recipe in recipes:
            if hasattr(run, "compile_args"):
                ca = run.compile_args
                sig = {"a_ptr": "*fp8e4nv", "bt_ptr": "*fp8e4nv", "c_ptr": "*bf16", "sa_ptr": "*fp32",
                       "sb_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_bn": "i32",
                       "stride_cm": "i32", "stride_sam": "i32", "stride_sak": "i32", "stride_sbk": "i32",
                       "stride_sbn": "i32"}
                div = {"a_ptr", "bt_ptr", "c_ptr", "sa_ptr", "sb_ptr", "N", "K", "stride_am", "stride_bn",
                       "stride_cm"}
                attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig) if n in div}
                ck = ditron.compile(fp8_lever_kernel, target="sm_90a", signature=sig, attrs=attrs,
                                    num_warps=ca["warps"], num_stages=ca["stages"],
                                    constexprs=dict(BLOCK_M=ca["bm"], BLOCK_N=ca["bn"], BLOCK_K=128, GROUP_M=8,
                                                    RECIPE=1 if recipe == "row" else 2, PROMOTE=ca["promote"],
                                                    FLATTEN=not ca["ws"], WS=ca["ws"], LAG=ca["lag"]))
            else:
                cfg = run.__closure__[0].cell_contents or G.fp8_config(8192, 8192, 8192, 132)
                unit = ("stride_ak", "stride_bk", "stride_cn")
                names_ = [n for n in _NAMES if n not in unit]
                sig = {n: ("*fp8e4nv" if n in ("a_ptr", "b_ptr") else "*bf16" if n == "c_ptr" else
                           "*fp32" if n in ("sa_ptr", "sb_ptr") else "i32") for n in names_}
                div = {"a_ptr", "b_ptr", "c_ptr", "sa_ptr", "sb_ptr", "N", "K", "stride_am", "stride_bn",
                       "stride_cm"}
                attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names_) if n in div}
                ck = ditron.compile(G.gemm_kernel, target="sm_90a", signature=sig, attrs=attrs,
                                    num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                                    constexprs=dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                                    GROUP_M=cfg.group_m, EVEN_K=True, TMA=True, FLATTEN=cfg.flatten,
                                                    SUBTILE=cfg.epilogue_subtile, WARP_SPEC=cfg.warp_specialize,
                                                    SCALE=1 if recipe == "row" else 2, GK=128, GN=128, B_T=True,
                                                    **{u: 1 for u in unit}))
            ptx = ck.asm["ptx"]
            u = ck.usage()
            print(f"{name:30s} {recipe:5s} regs {u['registers']:3d} spill stores {u['spill_stores']:5d} "
                  f"shared {ck.metadata.shared // 1024:3d} KiB wgmma "
                  f"{','.join(sorted(set(re.findall(r'wgmma.mma_async.sync.aligned.(m[0-9]+n[0-9]+k[0-9]+)', ptx))))} "
                  f"wait_group {sorted(set(re.findall(r'wgmma.wait_group.sync.aligned ([0-9]+)', ptx)))}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--recipes", default=os.environ.get("RECIPES", "row,block"))
    p.add_argument("--tp", type=int, default=int(os.environ.get("TP", "8")))
    p.add_argument("--candidates", default=os.environ.get("CANDIDATES", "all"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-shapes", type=int, default=int(os.environ.get("MAX_SHAPES", "0")))
    p.add_argument("--json", default=None)
    p.add_argument("--compile", action="store_true", help="CPU: registers / spills / wgmma per candidate")
    args = p.parse_args()
    names = list(CANDIDATES) if args.candidates == "all" else [c.strip() for c in args.candidates.split(",")]
    if args.compile:
        return compile_report(names)
    from ditron.bench.gemm_shapes import gemm_core_shapes
    from ditron.bench.gemm_sweep import vendor_blockwise
    dev = torch.device("cuda")
    shapes = gemm_core_shapes("paper", args.tp)
    if args.max_shapes:
        shapes = shapes[:args.max_shapes]
    t0 = time.time()
    results = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    for recipe in args.recipes.split(","):
        cands = [n for n in names if recipe in CANDIDATES[n][0]]
        for s in shapes:
            M, N, K = s.M, s.N, s.K
            a, b, sa, sb, a_deq, b_deq = operands(M, N, K, recipe, 7, dev)
            ref = (a_deq.double() @ b_deq.double()).float()
            out = torch.empty((M, N), dtype=torch.bfloat16, device=dev)
            abf, bbf = a_deq.to(torch.bfloat16), b_deq.to(torch.bfloat16).contiguous()      # as the bench's bf16 rows
            row = {"recipe": recipe, "shape": s.label, "M": M, "N": N, "K": K, "us": {}, "err": {}, "fail": {}}
            base = {}
            if recipe == "row":
                base["torch._scaled_mm"] = lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                                                    out_dtype=torch.bfloat16, out=out)
                base["torch._scaled_mm fast"] = lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                                                         out_dtype=torch.bfloat16, out=out,
                                                                         use_fast_accum=True)
            else:
                try:
                    base["torch blockwise"] = vendor_blockwise(a, b, sa, sb, out, lambda: ref)
                except RuntimeError as e:
                    row["fail"]["torch blockwise"] = str(e)[:400]
            base["ditron bf16 core"] = lambda: G.matmul(abf, bbf)
            runs = dict(base)
            for n in cands:
                fn = CANDIDATES[n][1]
                try:
                    out.fill_(float("nan"))
                    fn(a, b, sa, sb, out)
                    row["err"][n] = check(out, ref, CANDIDATES[n][2])
                    runs[n] = (lambda fn=fn: fn(a, b, sa, sb, out))
                except Exception as e:  # noqa: BLE001 -- reported, left out of the timing
                    row["fail"][n] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            order = list(runs)
            for rnd in range(args.rounds):
                for n in (order if rnd % 2 == 0 else order[::-1]):
                    try:
                        t = time_us(runs[n])
                        row["us"][n] = min(t, row["us"].get(n, t))
                    except Exception as e:  # noqa: BLE001
                        row["fail"][n] = f"timing: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            results.append(row)
            b0 = row["us"].get("torch._scaled_mm" if recipe == "row" else "torch blockwise")
            bf = row["us"].get("ditron bf16 core")
            line = [f"{recipe} {s.label} {M}x{N}x{K}: baseline {b0 or float('nan'):.1f} us, bf16 core "
                    f"{bf or float('nan'):.1f} us"]
            for n in cands:
                if n in row["us"]:
                    ref_t = row["us"].get("torch._scaled_mm fast") if CANDIDATES[n][2] else b0
                    line.append(f"  {n}: {row['us'][n]:.1f} us, {ref_t / row['us'][n] if ref_t else float('nan'):.2f}x "
                                f"vendor, {bf / row['us'][n] if bf else float('nan'):.2f}x bf16 core "
                                f"(err {row['err'][n]:.3g})")
                else:
                    line.append(f"  {n}: FAILED {row['fail'].get(n)}")
            for n, why in row["fail"].items():
                if n not in cands:
                    line.append(f"  {n}: {why}")
            print("\n".join(line), f"[{time.time() - t0:.0f} s]", flush=True)
    print("\n== summary: geomean (worst shape) of vendor time / candidate time; of bf16-core time / candidate time")
    for recipe in args.recipes.split(","):
        for n in [n for n in names if recipe in CANDIDATES[n][0]]:
            vs, vb = [], []
            for r in results:
                if r["recipe"] != recipe or n not in r["us"]:
                    continue
                ref_t = r["us"].get("torch._scaled_mm fast" if CANDIDATES[n][2] else
                                    ("torch._scaled_mm" if recipe == "row" else "torch blockwise"))
                if ref_t:
                    vs.append((ref_t / r["us"][n], r["shape"]))
                if r["us"].get("ditron bf16 core"):
                    vb.append(r["us"]["ditron bf16 core"] / r["us"][n])

            def gm(xs):
                return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")
            worst = min(vs)[1] if vs else "-"
            print(f"{recipe:5s} {n:30s} vs vendor {gm([v for v, _ in vs]):.2f}x (worst {min(vs)[0] if vs else 0:.2f}x "
                  f"{worst}), vs bf16 core {gm(vb):.2f}x, {len(vb)} shapes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"== done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
