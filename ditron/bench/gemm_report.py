"""What writes the GEMM benchmarks' results: figures derived from the rows (speedup, communication hidden,
geomeans; pure functions, tested without GPUs), Markdown tables, the JSON and the plots.
"""
from __future__ import annotations

import json

from .gemm_shapes import PARTS
from .harness import geomean

# ---------------------------------------------------------------------------
# derived figures (pure functions of the rows: tested without GPUs)
# ---------------------------------------------------------------------------

def derive(rows):
    """Adds ``speedup`` (cublas_nccl's time / this time), ``hidden_raw`` /
    ``hidden`` ((gemm_only + comm_only - t) / comm_only, clamped to [0, 1]),
    ``hidden_own_raw`` (the same with ditron_gemm_only for ditron's methods)
    and per shape ``ideal`` ((gemm_only + comm_only) / max of them) to the
    rows; returns the summary: geomeans over shapes per implementation."""
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["impl"]): r for r in rows}

    def t(model, impl):
        r = by.get((model, impl))
        return r["us"] if r and r["status"] == "ok" and r["us"] else None

    ideal = {}
    for s in shapes:
        base, tg, tc, tdg = t(s, "cublas_nccl"), t(s, "gemm_only"), t(s, "comm_only"), t(s, "ditron_gemm_only")
        ideal[s] = (tg + tc) / max(tg, tc) if tg and tc else None
        for r in rows:
            if r["model"] != s:
                continue
            us = t(s, r["impl"])
            part = r["impl"] in PARTS
            r["speedup"] = base / us if base and us and not part else None
            r["hidden_raw"] = (tg + tc - us) / tc if tg and tc and us and not part else None
            r["hidden"] = min(1.0, max(0.0, r["hidden_raw"])) if r["hidden_raw"] is not None else None
            own = tdg if r["impl"].startswith("ditron ") else None
            r["hidden_own_raw"] = (own + tc - us) / tc if own and tc and us else None
            r["ideal"] = ideal[s]
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["impl"] not in PARTS))
    summary = {"geomean_speedup": {}, "geomean_shapes": {}, "mean_hidden": {}, "shapes": len(shapes)}
    for name in impls:
        sp = [by[(s, name)].get("speedup") for s in shapes if (s, name) in by]
        sp = [x for x in sp if x]
        summary["geomean_speedup"][name] = geomean(sp)
        summary["geomean_shapes"][name] = len(sp)
        hid = [by[(s, name)].get("hidden") for s in shapes if (s, name) in by]
        hid = [x for x in hid if x is not None]
        summary["mean_hidden"][name] = sum(hid) / len(hid) if hid else None
    summary["ideal_geomean"] = geomean([v for v in ideal.values() if v])
    return summary


def _cell(r, key, fmt):
    if r is None:
        return "-"
    if r["status"] != "ok":
        return r["status"]
    v = r.get(key)
    return "-" if v is None else fmt(v)


def overlap_tables(rows, summary):
    """Markdown tables: latency, speedup (with geomean and ideal), hidden."""
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    main = [i for i in impls if i not in PARTS]
    by = {(r["model"], r["impl"]): r for r in rows}
    dims = {r["model"]: f"{r['M']}, {r['N']}, {r['K']}" for r in rows}

    def table(cols, key, fmt, extra=None, foot=None):
        head = "| shape | M, N, K | " + " | ".join(cols) + (" | " + extra[0] if extra else "") + " |"
        lines = [head, "| --- | --- |" + " --- |" * (len(cols) + (1 if extra else 0))]
        for s in shapes:
            cells = [_cell(by.get((s, c)), key, fmt) for c in cols]
            if extra:
                cells.append(extra[1](s))
            lines.append(f"| {s} | {dims[s]} | " + " | ".join(cells) + " |")
        if foot:
            lines.append(foot)
        return "\n".join(lines)

    def ideal_of(s):
        r = next((r for r in rows if r["model"] == s), None)
        return f"{r['ideal']:.2f}x" if r and r.get("ideal") else "-"

    gm = summary["geomean_speedup"]
    foot = ("| **geomean** | | " + " | ".join(
        (f"**{gm[c]:.2f}x**" if gm.get(c) else "-") for c in main)
        + f" | {summary['ideal_geomean']:.2f}x |" if summary.get("ideal_geomean") else
        "| **geomean** | | " + " | ".join((f"**{gm[c]:.2f}x**" if gm.get(c) else "-") for c in main) + " | - |")
    lat = table(impls, "us", lambda v: f"{v:.1f}")
    spd = table(main, "speedup", lambda v: f"{v:.2f}x", ("ideal", ideal_of), foot)
    hid = table(main, "hidden", lambda v: f"{100 * v:.0f}%")
    return lat, spd, hid


def fp8_vs_bf16(rows):
    """``ditron bench ag_gemm|gemm_rs|gemm_ar --dtype fp8``: per ditron method and shape, the time of ditron's
    bf16 op on the same shape over the fp8 op's (``bf16 ditron X`` / ``ditron X``), and the geomean."""
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["impl"]): r for r in rows}

    def t(s, name):
        r = by.get((s, name))
        return r["us"] if r and r["status"] == "ok" and r["us"] else None
    out = {}
    for name in dict.fromkeys(r["impl"] for r in rows):
        if not name.startswith("ditron ") or name in PARTS:
            continue
        per = {}
        for s in shapes:
            f, h = t(s, name), t(s, "bf16 " + name)
            per[s] = h / f if f and h else None
        out[name] = {"per_shape": per, "geomean": geomean([v for v in per.values() if v])}
    return out


def fp8_overlap_table(rows, summary):
    """Per shape: each ditron method's fp8 op against the vendor baseline (torch._scaled_mm + the NCCL
    collective: its time / ditron's) and against ditron's own bf16 op (its time / the fp8 op's)."""
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["impl"]): r for r in rows}
    methods = list(summary["fp8_vs_bf16"])
    head = ("| shape | M, N, K | " + " | ".join(f"{m[7:]}: vs _scaled_mm + NCCL | {m[7:]}: vs ditron bf16"
                                              for m in methods) + " |")
    lines = [head, "| --- | --- |" + " --- | --- |" * len(methods)]

    def x(v):
        return f"{v:.2f}x" if v else "-"
    for s in shapes:
        r0 = next(r for r in rows if r["model"] == s)
        cells = []
        for m in methods:
            r = by.get((s, m))
            base = by.get((s, "cublas_nccl"))
            vs_v = (x(r.get("speedup")) if r and r["status"] == "ok" else (r["status"] if r else "-"))
            if r and r["status"] == "ok" and not r.get("speedup") and base is not None and base["status"] != "ok":
                vs_v = f"baseline {base['status']}"
            cells += [vs_v, x(summary["fp8_vs_bf16"][m]["per_shape"].get(s))]
        lines.append(f"| {s} | {r0['M']}, {r0['N']}, {r0['K']} | " + " | ".join(cells) + " |")
    gm = summary["geomean_speedup"]
    lines.append("| **geomean** | | " + " | ".join(f"**{x(gm.get(m))}** | **{x(summary['fp8_vs_bf16'][m]['geomean'])}**"
                                               for m in methods) + " |")
    return "\n".join(lines)


def gemm_tables(rows, summary):
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["impl"]): r for r in rows}
    dims = {r["model"]: f"{r['M']} x {r['N']} x {r['K']}" for r in rows}
    lines = ["| shape | M x N x K | cuBLAS | ditron default | best ditron config | best |",
             "| --- | --- | --- | --- | --- | --- |"]

    def tf(r):
        if r is None:
            return "-"
        if r["status"] != "ok":
            return r["status"]
        return f"{r['us']:.1f} us, {r['tflops']:.0f} TFLOP/s" + (f", {r['vs_cublas']:.2f}x" if r["vs_cublas"] and
                                                                  r["impl"] != "cublas" else "")
    for s in shapes:
        b = summary["best_per_shape"].get(s)
        lines.append(f"| {s} | {dims[s]} | {tf(by.get((s, 'cublas')))} | {tf(by.get((s, 'ditron default')))} | "
                     f"{b['impl'][7:] if b else '-'} | {tf(by.get((s, b['impl']))) if b else '-'} |")
    main = "\n".join(lines)
    if "fp8" in summary:
        main = "fp8: `cuBLAS` is torch._scaled_mm (cuBLASLt), `ditron default` the fp8 core\n\n" + main + \
            "\n\n" + fp8_table(rows, summary)
    sweep = ""
    cfgs = [n for n in dict.fromkeys(r["impl"] for r in rows) if n.startswith("ditron ") and n != "ditron default"]
    if cfgs:
        head = "| config | " + " | ".join(shapes) + " | geomean vs cuBLAS |"
        sl = [head, "| --- |" + " --- |" * (len(shapes) + 1)]
        for n in ["ditron default"] + cfgs:
            cells = []
            for s in shapes:
                r = by.get((s, n))
                cells.append("-" if r is None else (f"{r['tflops']:.0f}" if r["status"] == "ok" else r["status"]))
            g = summary["configs"].get(n, {}).get("geomean_vs_cublas")
            sl.append(f"| {n[7:]} | " + " | ".join(cells) + f" | {f'{g:.3f}x' if g else '-'} |")
        sweep = "\n".join(sl)
    return main, sweep


def fp8_table(rows, summary):
    """``ditron bench gemm --dtype fp8``: per shape the fp8 core against torch._scaled_mm (goal >= 0.95x)
    and against ditron's bf16 core on the same shapes (goal >= 1.6x), from the same run."""
    by = {(r["model"], r["impl"]): r for r in rows}
    lines = ["| shape | torch._scaled_mm | ditron fp8 | ditron bf16 | cuBLAS bf16 | fp8 vs _scaled_mm (goal 0.95x) "
             "| fp8 vs ditron bf16 (goal 1.6x) |", "| --- | --- | --- | --- | --- | --- | --- |"]

    def us(r):
        return "-" if r is None else (f"{r['us']:.1f} us" if r["status"] == "ok" else r["status"])

    def x(v):
        return f"{v:.2f}x" if v else "-"
    for s, v in summary["fp8"].items():
        lines.append(f"| {s} | {us(by.get((s, 'cublas')))} | {us(by.get((s, 'ditron default')))} | "
                     f"{us(by.get((s, 'bf16 ditron')))} | {us(by.get((s, 'bf16 cublas')))} | {x(v['vs_scaled_mm'])} | "
                     f"{x(v['vs_ditron_bf16'])} |")
    g = summary["fp8_geomean"]
    lines.append(f"| geomean | | | | | {x(g['vs_scaled_mm'])} | {x(g['vs_ditron_bf16'])} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------

_DESCRIBE = {
    "ag_gemm": "A [M, K] sharded [M/W, K] per rank, B [K, N/W] per rank; out [M, N/W] = all_gather(A) @ B",
    "gemm_rs": "A [M, K/W], B [K/W, N] per rank; out [M/W, N] = this rank's rows of the sum over ranks of A @ B",
    "gemm_ar": "A [M, K/W], B [K/W, N] per rank; out [M, N] = the sum over ranks of A @ B",
}


def _method_text(op, peers, graph, warmup, iters, repeat, sim=False, fp8=False):
    how = ("a host timer around each call (the simulator: meaningless numbers)" if sim else
           f"{'CUDA-graph replays' if graph else 'eager calls'} between CUDA events")
    timing = (f"{how}, {warmup} warm-ups, median of {iters}, slowest rank, best of {repeat} round(s) in "
              "alternating order")
    if op == "gemm":
        return ("Each GEMM is checked against torch in float32 on fresh random inputs, then timed: " + timing + ".")
    if fp8:
        return (f"Global shapes split for TP=W: {_DESCRIBE[op]}. fp8: every rank's A and B are quantised to e4m3 "
                "from fresh random float32 operands per recipe (tensor: one scale per tensor and rank; row: per "
                "row of A / column of B; block: 1x128 for A, 128x128 for B); every implementation is checked "
                "against the float32 product of the dequantised operands with the op's collective semantics "
                "(tolerance scaled by sqrt(K)), then timed: " + timing + ". `ditron X`: ditron's fp8 op; "
                "`bf16 ditron X`: ditron's bf16 op on the dequantised operands rounded to bf16. `cublas_nccl` "
                "(the vendor baseline): " + {
                    "ag_gemm": "all_gather_into_tensor of the fp8 A rows and of their scales, then "
                               "torch._scaled_mm (per-tensor: the gathered per-rank scales as a rowwise [M, 1] "
                               "scale and B's as [1, N])",
                    "gemm_rs": "torch._scaled_mm to bf16, then reduce_scatter_tensor",
                    "gemm_ar": "torch._scaled_mm to bf16, then all_reduce"}[op]
                + "; where torch._scaled_mm refuses the recipe or gives a wrong result (held to the reference "
                "first) its cells are n/a with the reason and the shape leaves the geomean. `gemm_only` / "
                "`comm_only`: torch._scaled_mm / the collective alone at the local shape; `ditron_gemm_only`: "
                "ditron's fp8 matmul alone. Communication hidden = (gemm_only + comm_only - t) / comm_only.")
    return (f"Global shapes split for TP=W: {_DESCRIBE[op]}. Every implementation is checked against a float32 "
            "torch reference on fresh random inputs (tolerance scaled by sqrt(K)), then timed: " + timing + ". "
            "`cublas_nccl`: torch.matmul and the NCCL collective one after the other; `torch_fused`: torch's "
            "symmetric-memory fused op; `gemm_only` / `comm_only`: the cuBLAS GEMM / the NCCL collective alone "
            "at the local shape; `ditron_gemm_only`: ditron.kernels.gemm.matmul alone. Communication hidden = "
            "(gemm_only + comm_only - t) / comm_only; ideal = (gemm_only + comm_only) / max(gemm_only, comm_only).")


def write_overlap(rows, summary, meta, stem):
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1, default=str)
    lat, spd, hid = overlap_tables(rows, summary)
    op = meta["op"]
    dt = meta["dtype"] + (f" ({', '.join(meta['recipes'])})" if meta.get("recipes") else "")
    md = [f"### {op}, {dt}, TP={meta['world_size']} ({meta['machine']}, {meta['date']})", "",
          f"Command: `{meta['command']}`", "", meta["method"], "",
          *(["**Checked only (--check-only): nothing was timed; `ok` means the check passed.**", ""]
            if meta.get("check_only") else []),
          "Latency (us):", "", lat, "",
          "Speedup over cublas_nccl (its time / the implementation's; geomean over the shapes):", "", spd, "",
          "Communication hidden ((gemm_only + comm_only - t) / comm_only, clamped to [0, 1]; raw in the JSON):",
          "", hid, ""]
    if "fp8_vs_bf16" in summary:
        md += ["fp8: ditron's fp8 op against the vendor baseline (torch._scaled_mm + the NCCL collective; its "
               "time / ditron's) and against ditron's bf16 op on the same shape (its time / the fp8 op's):", "",
               fp8_overlap_table(rows, summary), ""]
    na, shapes = {}, list(dict.fromkeys(r["model"] for r in rows))
    for r in rows:
        if r["status"] == "n/a":
            na.setdefault((r["impl"], r["error"]), []).append(r["model"])
    if na:         # the shapes where a reason applies, unless it is all of them (fp8: per recipe, e.g. blockwise)
        md += ["Not available:", ""] + [f"- {k}{'' if len(v) == len(shapes) else ' (' + ', '.join(v) + ')'}: {e}"
                                        for (k, e), v in na.items()] + [""]
    failed = [r for r in rows if r["status"] == "FAILED"]
    if failed:
        md += ["Failures:", ""] + [f"- {r['model']} {r['impl']}: {r['error']}" for r in failed] + [""]
    notes = {(r["impl"], r["note"]) for r in rows if r["note"] and r["status"] == "ok"}
    if notes:
        md += ["Notes:", ""] + [f"- {i}: {n}" for i, n in sorted(notes)] + [""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md))
    png = _plot(rows, stem, op, "speedup", "speedup over cublas_nccl", exclude=PARTS)
    return stem + ".md", stem + ".json", png


def write_gemm(rows, summary, meta, stem):
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1, default=str)
    main, sweep = gemm_tables(rows, summary)
    md = [f"### GEMM core vs cuBLAS, {meta['dtype']} ({meta['machine']}, {meta['date']})", "",
          f"Command: `{meta['command']}`", "", meta["method"], "", main, ""]
    if sweep:
        md += ["Sweep (TFLOP/s per shape; the last column: geomean over the shapes of cuBLAS's time / the "
               "config's):", "", sweep, ""]
        if summary.get("best_overall"):
            md += [f"Best config over all shapes: `{summary['best_overall'][7:]}`", ""]
    skipped = sorted({(r["impl"], r["error"].splitlines()[0][:160]) for r in rows if r["status"] == "skipped"})
    if skipped:
        md += ["Skipped (do not compile for this GPU):", ""] + [f"- {i[7:]}: {e}" for i, e in skipped] + [""]
    failed = [r for r in rows if r["status"] == "FAILED"]
    if failed:
        md += ["Failures:", ""] + [f"- {r['model']} {r['impl']}: {r['error']}" for r in failed] + [""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md))
    best = {b["impl"] for b in summary["best_per_shape"].values()}
    png = _plot([r for r in rows if r["impl"] in {"cublas", "ditron default"} | best], stem, "gemm", "tflops",
                "TFLOP/s")
    return stem + ".md", stem + ".json", png


def _plot(rows, stem, op, key, ylabel, exclude=()):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    shapes = list(dict.fromkeys(r["model"] for r in rows))
    impls = [i for i in dict.fromkeys(r["impl"] for r in rows) if i not in exclude]
    by = {(r["model"], r["impl"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(shapes) + 2), 4))
    w = 0.8 / max(1, len(impls))
    for j, name in enumerate(impls):
        ys = [(by.get((s, name)) or {}).get(key) or 0 for s in shapes]
        ax.bar([i + j * w for i in range(len(shapes))], ys, w, label=name)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(shapes))])
    ax.set_xticklabels(shapes, rotation=20, fontsize=7, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{op}: {ylabel}")
    if key == "speedup":
        ax.axhline(1.0, color="gray", lw=0.8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))     # beside the bars, not over them
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return stem + ".png"
