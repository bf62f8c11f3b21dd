"""The GEMM-overlap benchmark harness (ditron/bench/gemm.py, ``ditron bench
ag_gemm|gemm_rs|gemm_ar|gemm``) on the CPU: 2 simulated ranks run every code
path (checks against torch, tables, JSON, Markdown; PNG when matplotlib is
installed); the peers that need CUDA / NCCL are reported n/a there.  A broken
kernel must be reported FAILED (and the run exit non-zero).  The derived
figures (speedup, hidden fraction, geomeans) are checked on synthetic rows.
The numbers themselves are meaningless on the simulator."""
import importlib.util
import json
import math
import pathlib
import subprocess
import sys
import textwrap

import pytest

from ditron.bench import gemm as bg

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAST = ["--iters", "5", "--warmup", "1"]           # on the CPU: one warm-up, one timed call per round


def _sim(tmp_path, *args, script=None, n=2, timeout=240):
    target = [str(script)] if script else ["-m", "ditron.bench"]
    cmd = [sys.executable, "-m", "ditron", "sim", "-n", str(n), *target, *args, *FAST, "--out", str(tmp_path),
           "--tag", "smoke"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _rows(path):
    data = json.loads(path.read_text())
    return data, {r["impl"]: r for r in data["rows"]}


def _have(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs", "gemm_ar"])
@pytest.mark.e2e
def test_overlap_harness_on_the_simulator(tmp_path, op):
    if not _have(f"ditron.kernels.{op}"):
        pytest.skip(f"ditron.kernels.{op} not written yet")
    methods = {"ag_gemm": "default", "gemm_rs": "scatter,pull", "gemm_ar": "one_shot,two_shot"}[op]
    # two rounds (alternating order) for ag_gemm; one, and a smaller M, for the others (to keep the test short)
    M = 64 if op == "ag_gemm" else 32
    p = _sim(tmp_path, op, "--shapes", f"{M},32,32", "--methods", methods, "--repeat", "2" if op == "ag_gemm" else "1")
    assert p.returncode == 0, p.stdout + p.stderr
    data, rows = _rows(tmp_path / f"smoke-{op}-bf16.json")
    for m in methods.split(","):
        assert rows[f"ditron {m}"]["status"] == "ok", rows[f"ditron {m}"]
        assert rows[f"ditron {m}"]["us"] > 0
    for name in ("gemm_only", "ditron_gemm_only"):
        assert rows[name]["status"] == "ok", rows[name]
    for name in ("cublas_nccl", "torch_fused", "comm_only"):      # need CUDA / NCCL
        assert rows[name]["status"] == "n/a" and rows[name]["error"], rows[name]
    r = rows[f"ditron {methods.split(',')[0]}"]
    W = 2
    assert (r["M"], r["N"], r["K"], r["tp"]) == (M, 32, 32, W)
    assert r["a_shape"] == {"ag_gemm": [32, 32], "gemm_rs": [32, 16], "gemm_ar": [32, 16]}[op]
    assert r["out_shape"] == {"ag_gemm": [64, 16], "gemm_rs": [16, 32], "gemm_ar": [32, 32]}[op]
    assert data["meta"]["backend"] == "sim" and data["meta"]["tp"] == W
    assert set(data["summary"]["geomean_speedup"]) >= {"cublas_nccl", "torch_fused"}
    md = (tmp_path / f"smoke-{op}-bf16.md").read_text()
    assert f"| {M},32,32 | {M}, 32, 32 |" in md and "**geomean**" in md and "Not available:" in md
    if _have("matplotlib"):
        assert (tmp_path / f"smoke-{op}-bf16.png").exists()


def test_a_wrong_kernel_is_reported_failed(tmp_path):
    """ag_gemm patched to get one entry of its output wrong by one standard deviation."""
    script = tmp_path / "wrong_ag_gemm.py"
    script.write_text(textwrap.dedent("""
        import importlib
        import sys
        from ditron.bench.gemm import main

        K = importlib.import_module("ditron.kernels.ag_gemm")   # the package exports a function of that name

        right = K.ag_gemm

        def wrong(a, b, ctx, out=None):
            c = right(a, b, ctx, out=out)
            c[-1, -1] += a.shape[1] ** 0.5
            return c

        K.ag_gemm = wrong
        sys.exit(main(sys.argv[1:]))
    """))
    p = _sim(tmp_path, "ag_gemm", "--shapes", "64,32,32", "--peers", "gemm_only", "--repeat", "1", script=script)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "FAILED" in p.stderr and "max abs error" in p.stderr, p.stderr
    _, rows = _rows(tmp_path / "smoke-ag_gemm-bf16.json")
    assert rows["ditron default"]["status"] == "FAILED" and "max abs error" in rows["ditron default"]["error"]
    assert rows["ditron default"]["rounds_us"] == []                 # not timed
    assert rows["gemm_only"]["status"] == "ok"                       # the others still are
    assert "Failures:" in (tmp_path / "smoke-ag_gemm-bf16.md").read_text()


def test_gemm_core_sweep_on_the_simulator(tmp_path):
    p = _sim(tmp_path, "gemm", "--shapes", "64,32,32;48,40,96", "--configs", "sweep", "--repeat", "1", n=1)
    assert p.returncode == 0, p.stdout + p.stderr
    data, _ = _rows(tmp_path / "smoke-gemm-sweep-bf16.json")
    impls = {r["impl"] for r in data["rows"]}
    assert {"cublas", "ditron default"} <= impls and len(impls) == 2 + len(bg.SIM_SWEEP)
    assert all(r["status"] == "ok" and r["tflops"] > 0 for r in data["rows"]), data["rows"]
    best = data["summary"]["best_per_shape"]
    assert set(best) == {"64,32,32", "48,40,96"} and data["summary"]["best_overall"].startswith("ditron ")
    md = (tmp_path / "smoke-gemm-sweep-bf16.md").read_text()
    assert "Sweep (TFLOP/s" in md and "| 48,40,96 | 48 x 40 x 96 |" in md


def test_gemm_fp8_against_scaled_mm_and_bf16_on_the_simulator(tmp_path):
    """``ditron bench gemm --dtype fp8``: every implementation checked, the fp8 core, torch._scaled_mm and the
    two bf16 GEMMs timed in the same run, and the goal ratios reported (blockwise: torch has no CPU kernel,
    so its baseline is skipped, not failed)."""
    p = _sim(tmp_path, "gemm", "--dtype", "fp8", "--recipe", "row,block", "--shapes", "40,48,160", "--repeat", "1",
             n=1)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((tmp_path / "smoke-gemm-fp8.json").read_text())
    rows = {(r["model"], r["impl"]): r for r in data["rows"]}
    for impl in ("cublas", "ditron default", "bf16 ditron", "bf16 cublas"):
        assert rows[("40,48,160 row", impl)]["status"] == "ok", rows[("40,48,160 row", impl)]
    assert rows[("40,48,160 block", "ditron default")]["status"] == "ok"
    assert rows[("40,48,160 block", "cublas")]["status"] in ("ok", "skipped")
    fp8 = data["summary"]["fp8"]["40,48,160 row"]
    assert fp8["vs_scaled_mm"] > 0 and fp8["vs_ditron_bf16"] > 0
    md = (tmp_path / "smoke-gemm-fp8.md").read_text()
    assert "fp8 vs _scaled_mm (goal 0.95x)" in md and "fp8 vs ditron bf16 (goal 1.6x)" in md


#: (op, recipe, shape, methods) of the fp8 overlap smoke runs: one recipe each, shapes that run in seconds
FP8_OVERLAP = {"ag_gemm": ("row", "64,32,32", "default"), "gemm_rs": ("block", "32,32,160", "ce"),
               "gemm_ar": ("tensor", "32,32,64", "one_shot")}


@pytest.mark.parametrize("op", sorted(FP8_OVERLAP))
@pytest.mark.e2e
def test_overlap_fp8_on_the_simulator(tmp_path, op):
    """``ditron bench ag_gemm|gemm_rs|gemm_ar --dtype fp8``: ditron's fp8 op and its bf16 op checked against the
    float32 reference of the dequantised operands, and timed; the vendor baseline (torch._scaled_mm + NCCL) is
    n/a on the simulator (no NCCL), its local GEMM runs (torch's CPU _scaled_mm: per-tensor / rowwise) or is n/a
    with the reason (blockwise: no CPU kernel)."""
    recipe, shape, method = FP8_OVERLAP[op]
    p = _sim(tmp_path, op, "--dtype", "fp8", "--recipe", recipe, "--shapes", shape, "--methods", method,
             "--repeat", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    data, rows = _rows(tmp_path / f"smoke-{op}-fp8.json")
    model = f"{shape} {recipe}"
    for name in (f"ditron {method}", f"bf16 ditron {method}"):
        r = rows[name]
        assert r["status"] == "ok" and r["ok"] and r["us"] > 0 and r["model"] == model, r
    assert rows[f"ditron {method}"]["note"].startswith(f"fp8 {recipe}")
    assert rows["cublas_nccl"]["status"] == "n/a" and "NCCL" in rows["cublas_nccl"]["error"]
    assert rows["ditron_gemm_only"]["status"] == "ok", rows["ditron_gemm_only"]
    if recipe == "block":
        assert rows["gemm_only"]["status"] == "n/a", rows["gemm_only"]
        assert rows["gemm_only"]["error"].startswith("baseline unavailable"), rows["gemm_only"]
    else:
        assert rows["gemm_only"]["status"] == "ok", rows["gemm_only"]
    ratio = data["summary"]["fp8_vs_bf16"][f"ditron {method}"]
    assert ratio["per_shape"][model] > 0 and ratio["geomean"] > 0
    meta = data["meta"]
    assert meta["dtype"] == "fp8" and meta["recipes"] == [recipe] and "--dtype fp8" in meta["command"]
    md = (tmp_path / f"smoke-{op}-fp8.md").read_text()
    assert f"### {op}, fp8 ({recipe}), TP=2" in md and "vs _scaled_mm + NCCL" in md and "**geomean**" in md
    assert "baseline n/a" in md                                # the vendor cell says why there is no ratio


def test_check_only_checks_and_times_nothing(tmp_path):
    """``--check-only`` (ranks sharing a GPU, which the harness refuses to time): every implementation checked,
    none timed, and the report says so."""
    p = _sim(tmp_path, "gemm_ar", "--dtype", "fp8", "--recipe", "row", "--shapes", "32,32,64", "--methods",
             "one_shot", "--peers", "gemm_only", "--check-only")
    assert p.returncode == 0, p.stdout + p.stderr
    data, rows = _rows(tmp_path / "smoke-gemm_ar-fp8.json")
    for name in ("ditron one_shot", "bf16 ditron one_shot", "gemm_only"):
        assert rows[name]["status"] == "ok" and rows[name]["us"] is None and rows[name]["rounds_us"] == []
    assert data["meta"]["check_only"] is True
    assert "Checked only (--check-only)" in (tmp_path / "smoke-gemm_ar-fp8.md").read_text()


def test_a_wrong_fp8_scale_is_reported_failed(tmp_path):
    """gemm_ar patched to decode A with a scale 1/8 too large: the fp8 check fails, the bf16 op still passes."""
    script = tmp_path / "wrong_scale.py"
    script.write_text(textwrap.dedent("""
        import importlib
        import sys
        from ditron.bench.gemm import main

        K = importlib.import_module("ditron.kernels.gemm_ar")

        right = K.gemm_ar

        def wrong(a, b, ctx, out=None, method="auto", *, scale_a=None, scale_b=None, **kw):
            if scale_a is not None:
                scale_a = scale_a * 1.125
            return right(a, b, ctx, out, method, scale_a=scale_a, scale_b=scale_b, **kw)

        K.gemm_ar = wrong
        sys.exit(main(sys.argv[1:]))
    """))
    p = _sim(tmp_path, "gemm_ar", "--dtype", "fp8", "--recipe", "row", "--shapes", "32,32,64", "--methods",
             "one_shot", "--peers", "gemm_only", "--repeat", "1", script=script)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "FAILED" in p.stderr and "max abs error" in p.stderr, p.stderr
    _, rows = _rows(tmp_path / "smoke-gemm_ar-fp8.json")
    assert rows["ditron one_shot"]["status"] == "FAILED" and "max abs error" in rows["ditron one_shot"]["error"]
    assert rows["ditron one_shot"]["rounds_us"] == []                 # not timed
    assert rows["bf16 ditron one_shot"]["status"] == "ok" and rows["gemm_only"]["status"] == "ok"


# ---------------------------------------------------------------------------
# pure functions
# ---------------------------------------------------------------------------

def test_paper_shapes_match_the_shared_file():
    path = ROOT.parent / "shared" / "bench" / "paper-shapes.json"
    if not path.exists():
        pytest.skip("shared/bench/paper-shapes.json not in this checkout")
    d = json.loads(path.read_text())
    for key, op in (("ag_gemm_h800", "ag_gemm"), ("gemm_rs_and_gemm_ar_h800", "gemm_rs")):
        assert bg.PAPER_SHAPES[op] == [(r["model"], r["M"], r["N"], r["K"]) for r in d[key]]
    for key, op in (("ag_gemm_strong_scaling", "ag_gemm"), ("gemm_rs_strong_scaling", "gemm_rs")):
        assert bg.STRONG_SHAPES[op] == [(r["model"], r["M"], r["N"], r["K"]) for r in d[key]]


def test_shapes_split_for_tensor_parallelism():
    s = bg.parse_shapes("paper:LLaMA3-7B", "ag_gemm")
    assert s == [bg.Shape("LLaMA3-7B", 8192, 11008, 4096)]
    assert bg.local_dims("ag_gemm", s[0], 4) == ((2048, 4096), (4096, 2752), (8192, 2752))
    rs = bg.parse_shapes("paper", "gemm_rs")[0]
    assert bg.local_dims("gemm_rs", rs, 4) == ((8192, 2752), (2752, 4096), (2048, 4096))
    assert bg.local_dims("gemm_ar", rs, 4) == ((8192, 2752), (2752, 4096), (8192, 4096))
    assert bg.gemm_flops("ag_gemm", s[0], 4) == 2.0 * 8192 * 2752 * 4096
    assert [x.label for x in bg.parse_shapes("64,32,32;128,64,32", "gemm_rs")] == ["64,32,32", "128,64,32"]
    assert [(x.M, x.N, x.K) for x in bg.parse_shapes("64x32x32,8x8x8", "ag_gemm")] == [(64, 32, 32), (8, 8, 8)]
    with pytest.raises(SystemExit, match="not a multiple of --tp 3"):
        bg.local_dims("ag_gemm", bg.Shape("x", 64, 32, 32), 3)
    with pytest.raises(SystemExit, match="no model"):
        bg.parse_shapes("paper:GPT-5", "ag_gemm")
    with pytest.raises(SystemExit, match="cannot read the shape"):
        bg.parse_shapes("64,32", "ag_gemm")
    core = bg.gemm_core_shapes("paper", 4)
    assert len(core) == 10       # LLaMA3.1-8B and Mistral-7B have the same shapes: merged
    assert bg.Shape("AG LLaMA3.1-8B / Mistral-7B", 8192, 3584, 4096) in core
    assert bg.Shape("RS/AR LLaMA3-7B", 8192, 4096, 2752) in core


def test_methods_and_configs():
    assert bg.method_spec("ag_gemm", "sm_overlap") == ("sm_overlap", {"producer": "sm", "overlap": True}, {})
    assert bg.method_spec("ag_gemm", "ce:block_n=256") == ("ce:block_n=256", {"producer": "ce", "block_n": 256}, {})
    assert bg.method_spec("gemm_rs", "pull") == ("pull", {"method": "pull"}, {})
    # the Gluon Hopper core (issue 52): a context option
    assert bg.method_spec("gemm_rs", "ce:core=gluon") == ("ce:core=gluon", {"method": "ce", "core": "gluon"}, {})
    assert bg.method_spec("gemm_ar", "rs_ag:core=gluon") == ("rs_ag:core=gluon", {"core": "gluon"},
                                                             {"method": "rs_ag"})
    assert bg.method_spec("gemm_ar", "two_shot:call.x=1") == ("two_shot:call.x=1", {}, {"method": "two_shot",
                                                                                          "x": 1})
    with pytest.raises(SystemExit, match="unknown method"):
        bg.method_spec("ag_gemm", "bogus")
    assert len(bg.parse_configs("sweep", sim=False)) == 32 and bg.parse_configs("default", sim=False) == []
    (c,) = bg.parse_configs("128x256x64:s4:w4:tma", sim=False)
    assert c == dict(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=4, num_stages=4, tma=True)
    assert bg.config_label(c) == "128x256x64 s4 w4 tma"
    assert bg._compile_skip({"exc": "OutOfResources", "error": "OutOfResources: out of resource: shared memory"})
    assert not bg._compile_skip({"exc": "AssertionError", "error": "max abs error 3"})


def _row(model, impl, us, status="ok"):
    return {"model": model, "M": 1, "N": 2, "K": 3, "impl": impl, "status": status, "us": us}


def test_speedup_hidden_fraction_and_geomeans():
    rows = []
    for model, (base, g, c, d, fused) in {"A": (300.0, 200.0, 100.0, 200.0, 250.0),
                                          "B": (600.0, 400.0, 200.0, 500.0, 800.0)}.items():
        rows += [_row(model, "ditron x", d), _row(model, "torch_fused", fused), _row(model, "cublas_nccl", base),
                 _row(model, "gemm_only", g), _row(model, "comm_only", c), _row(model, "ditron_gemm_only", 180.0),
                 _row(model, "ditron broken", None, "FAILED")]
    s = bg.derive(rows)
    by = {(r["model"], r["impl"]): r for r in rows}
    assert by[("A", "ditron x")]["speedup"] == pytest.approx(1.5)
    assert by[("A", "ditron x")]["hidden_raw"] == pytest.approx(1.0) and by[("A", "ditron x")]["hidden"] == 1.0
    assert by[("A", "ditron x")]["hidden_own_raw"] == pytest.approx((180 + 100 - 200) / 100)
    assert by[("B", "ditron x")]["hidden_raw"] == pytest.approx(0.5)
    assert by[("B", "torch_fused")]["hidden_raw"] == pytest.approx(-1.0) and by[("B", "torch_fused")]["hidden"] == 0
    assert by[("A", "cublas_nccl")]["speedup"] == pytest.approx(1.0)
    assert by[("A", "cublas_nccl")]["ideal"] == pytest.approx(1.5)
    assert by[("A", "gemm_only")]["speedup"] is None                  # parts of the op: no speedup
    assert s["geomean_speedup"]["ditron x"] == pytest.approx(math.sqrt(1.5 * 1.2))
    assert s["geomean_speedup"]["torch_fused"] == pytest.approx(math.sqrt(1.2 * 0.75))
    assert s["geomean_speedup"]["ditron broken"] is None and s["geomean_shapes"]["ditron broken"] == 0
    assert s["ideal_geomean"] == pytest.approx(1.5)
    lat, spd, hid = bg.overlap_tables(rows, s)
    assert "| A | 1, 2, 3 | 200.0 | 250.0 | 300.0 | 200.0 | 100.0 | 180.0 | FAILED |" in lat
    assert "**1.34x**" in spd and "| 1.50x |" in spd
    assert "| B | 1, 2, 3 | 50% | 0% | 0% | FAILED |" in hid


def test_fp8_ratios_leave_out_a_refused_baseline():
    """fp8 overlap tables: vendor / ditron per shape and the geomean over the shapes where the vendor baseline
    ran (a shape whose torch._scaled_mm is n/a leaves it); ditron's bf16 op / its fp8 op per shape."""
    rows = [_row("A", "ditron ce", 100.0), _row("A", "bf16 ditron ce", 180.0), _row("A", "cublas_nccl", 150.0),
            _row("B", "ditron ce", 200.0), _row("B", "bf16 ditron ce", 300.0), _row("B", "cublas_nccl", None, "n/a"),
            _row("C", "ditron ce", 100.0), _row("C", "bf16 ditron ce", 160.0), _row("C", "cublas_nccl", 120.0)]
    s = bg.derive(rows)
    s["fp8_vs_bf16"] = bg.fp8_vs_bf16(rows)
    assert s["geomean_speedup"]["ditron ce"] == pytest.approx(math.sqrt(1.5 * 1.2))
    assert s["geomean_shapes"]["ditron ce"] == 2
    r = s["fp8_vs_bf16"]["ditron ce"]
    assert r["per_shape"] == pytest.approx({"A": 1.8, "B": 1.5, "C": 1.6})
    assert r["geomean"] == pytest.approx((1.8 * 1.5 * 1.6) ** (1 / 3))
    assert set(s["fp8_vs_bf16"]) == {"ditron ce"}                     # the bf16 op is not a method of its own
    t = bg.fp8_overlap_table(rows, s)
    assert "| A | 1, 2, 3 | 1.50x | 1.80x |" in t and "| B | 1, 2, 3 | baseline n/a | 1.50x |" in t
    assert "| **geomean** | | **1.34x** | **1.63x** |" in t


def test_fp8_quantisation_recipes():
    """The operands of ``--dtype fp8``: e4m3 values and decode scales whose product is within fp8 rounding of
    the float32 input, in kernels/scaling.py's shapes."""
    import torch
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 200, generator=g), torch.randn(130, 200, generator=g)
    for recipe, sa_shape, sb_shape in (("tensor", (), ()), ("row", (5, 1), (1, 130)), ("block", (5, 2), (2, 2))):
        a, b, sa, sb, a_deq, b_deq = bg.quantise_fp8(x, w, recipe)
        assert a.dtype == b.dtype == torch.float8_e4m3fn and b.shape == (200, 130) and b.stride(0) == 1
        assert tuple(sa.shape) == sa_shape and tuple(sb.shape) == sb_shape, recipe
        assert (a_deq - x).abs().max() <= x.abs().max() * 2 ** -4 and (b_deq - w.t()).abs().max() <= w.abs().max() * 2 ** -4
        assert torch.equal(a_deq, a.float() * (sa if recipe != "block" else sa.repeat_interleave(128, 1)[:, :200]))


def test_tolerance_separates_rounding_from_errors():
    import torch
    K = 4096
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, K, generator=g).bfloat16()
    b = torch.randn(K, 48, generator=g).bfloat16()
    ref = a.float() @ b.float()
    check = bg.make_check(lambda: ref, bg.tolerance(torch.bfloat16, K))
    check(ref.bfloat16())                                  # the output's rounding passes
    bad = ref.clone()
    bad[3, 5] += 0.5 * math.sqrt(K)                        # half a standard deviation off: fails
    with pytest.raises(AssertionError, match="max abs error"):
        check(bad.bfloat16())
    with pytest.raises(AssertionError, match="inf or nan"):
        check(torch.full_like(ref, float("nan")))
    with pytest.raises(AssertionError, match="shape"):
        check(ref[:, :8])


def test_blockwise_baseline_scale_layouts_are_torchs():
    # torch's blockwise fp8 GEMM (1 x 128 for a, 128 x 128 for b): scale_a [M, K/128] with strides (1, M); scale_b
    # [round_up(K/128, 4), N/128] with strides (1, round_up(K/128, 4)) (and the unpadded form of older torch), the
    # same values as kernels/scaling.py's [K/128, N/128] scale_b
    import torch
    from ditron.bench.gemm_sweep import blockwise_scale_layouts
    M, kg, ng = 40, 11, 3
    sa, sb = torch.rand(M, kg), torch.rand(kg, ng)
    (n0, a0, b0), (n1, a1, b1) = blockwise_scale_layouts(sa, sb)
    assert a0.shape == (M, kg) and a0.stride() == (1, M) and torch.equal(a0, sa)
    assert b0.shape == (12, ng) and b0.stride() == (1, 12) and torch.equal(b0[:kg], sb)
    assert b1.shape == (kg, ng) and b1.stride() == (1, kg) and torch.equal(b1, sb)
    (_, _, b2), (_, _, b3) = blockwise_scale_layouts(sa[:, :8], sb[:8])        # K/128 already a multiple of 4
    assert b2.shape == (8, ng) and b2.stride() == (1, 8) and b3.stride() == (ng, 1)
