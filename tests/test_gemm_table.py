"""Per-GPU GEMM config tables (issue 52 item 5; kernels/gemm_table.py, kernels/gemm_tables/*.json): loading and
validation, the nearest rule, which table applies to which GPU, what ``matmul`` resolves without a config, and
bench/gemm_core_levers.py's ``--per-shape-best`` / ``--write-table`` on stored rows (no GPU)."""
import functools
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import ditron
from ditron.kernels import gemm as G
from ditron.kernels import gemm_hopper as H
from ditron.kernels import gemm_table as T

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TL = {"block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 5, "tma": True,
      "flatten": True}
GL = {"block_m": 128, "block_n": 256, "block_k": 64, "stages": 3, "mode": "coop"}


def _entry(M, N, K, core="tl", config=TL, dtype="bf16", name=None):
    return {"M": M, "N": N, "K": K, "dtype": dtype, "core": core, "config": dict(config),
            "candidate": name or f"{core} {M}x{N}x{K}", "ratio_vs_cublas": 1.0}


def _table(entries, **kw):
    return T.GemmTable(dict({"gpu": "NVIDIA H100 80GB HBM3", "match": ["H100"], "sms": 132, "entries": entries}, **kw))


def test_nearest_rule():
    t = _table([_entry(8192, 5504, 4096, name="a"), _entry(8192, 26624, 16384, "gluon", GL, name="b"),
                _entry(8192, 5504, 4096, dtype="fp16", name="a16")])
    e, d = t.lookup(8192, 5504, 4096, "bf16")
    assert e["candidate"] == "a" and d == 0
    assert t.lookup(8192, 5504, 4096, "fp16")[0]["candidate"] == "a16"
    # nearest within the distance: N 4096 is log2(5504/4096) = 0.43 away from "a"
    e, d = t.lookup(8192, 4096, 4096, "bf16")
    assert e["candidate"] == "a" and abs(d - 0.4263) < 1e-3
    e, _ = t.lookup(8192, 20000, 16384, "bf16")
    assert e["candidate"] == "b"
    # too far from every entry (N a factor 4 away): no entry, the caller falls back
    e, d = t.lookup(8192, 1376, 4096, "bf16")
    assert e is None and d == pytest.approx(2.0)
    # a wider max_distance takes it
    assert _table(t.entries, max_distance=2.0).lookup(8192, 1376, 4096)[0]["candidate"] == "a"


def test_dtype_falls_back_to_the_other_16_bit_dtype():
    t = _table([_entry(8192, 4096, 4096, name="only-bf16")])
    assert t.lookup(8192, 4096, 4096, "fp16")[0]["candidate"] == "only-bf16"


def test_ties_take_the_first_entry():
    t = _table([_entry(8192, 2048, 4096, name="first"), _entry(8192, 8192, 4096, name="second")])
    assert t.lookup(8192, 4096, 4096)[0]["candidate"] == "first"


@pytest.mark.parametrize("bad,msg", [
    ({"entries": "x"}, "'entries' list"),
    ({"entries": [_entry(0, 1, 1)]}, "M=0 must be a positive integer"),
    ({"entries": [_entry(8, 8, 8, dtype="fp8")]}, "dtype='fp8'"),
    ({"entries": [_entry(8, 8, 8, core="cutlass")]}, "core='cutlass'"),
    ({"entries": [dict(_entry(8, 8, 8), config=None)]}, "'config' must be an object"),
])
def test_bad_tables_are_refused(bad, msg):
    with pytest.raises(ditron.DitronError, match=msg):
        T.GemmTable(bad, "bad.json")


def test_bad_entry_config_names_the_table():
    t = _table([_entry(64, 64, 64, config=dict(TL, block_n=96)), _entry(128, 64, 64, config={"blockm": 1})])
    with pytest.raises(ditron.DitronError, match="block_n=96 must be a power of two"):
        G.table_choice(64, 64, 64, torch.bfloat16, "cuda", table=t)
    with pytest.raises(ditron.DitronError, match="GEMM table <dict>: config .*blockm"):
        G.config_from_entry(t.entries[1], "GEMM table <dict>")


def test_unreadable_table(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("{not json")
    with pytest.raises(ditron.DitronError, match="cannot read it"):
        T.GemmTable.load(str(p))


def test_table_choice_builds_the_core_configs():
    t = _table([_entry(8192, 5504, 4096), _entry(8192, 26624, 16384, "gluon", GL)])
    core, cfg, note = G.table_choice(8192, 5504, 4096, torch.bfloat16, "cuda", table=t)
    assert core == "tl" and cfg == G.GemmConfig(**TL) and "distance 0.00" in note
    core, cfg, _ = G.table_choice(8192, 26624, 16384, torch.float16, "cuda", table=t)
    assert core == "gluon" and cfg == H.HopperGemmConfig(**GL)
    assert G.table_choice(64, 64, 64, torch.bfloat16, "cuda", table=t) is None
    # the simulator never reads a table: its small tiles
    assert G.table_choice(8192, 5504, 4096, torch.bfloat16, "cpu") is None
    assert G.resolve_config(8192, 5504, 4096, torch.bfloat16, "cpu") == ("tl", G.SIM_CONFIG, "default rule")


def test_which_table_applies(tmp_path, monkeypatch):
    T.clear_cache()
    try:
        # the shipped tables: H100 (132 SMs) has one; H200 falls back until one is measured; a PCIe H100
        # (114 SMs) is another machine
        h100 = T.table_for("NVIDIA H100 80GB HBM3", 132)
        assert h100 is not None and os.path.basename(h100.path) == "h100.json"
        assert T.table_for("NVIDIA H100 PCIe", 114) is None
        assert T.table_for("NVIDIA A100-SXM4-80GB", 108) is None
        # the environment names a table, or none
        p = tmp_path / "mine.json"
        p.write_text(json.dumps({"match": ["nothing"], "entries": [_entry(64, 64, 64)]}))
        monkeypatch.setenv(T.ENV, str(p))
        assert T.table_for("NVIDIA H100 80GB HBM3", 132).path == str(p)
        monkeypatch.setenv(T.ENV, "off")
        assert T.table_for("NVIDIA H100 80GB HBM3", 132) is None
    finally:
        T.clear_cache()


def test_shipped_tables_are_valid():
    """Every entry of every shipped table builds a valid config of its core, and its own shape dispatches
    to it."""
    paths = sorted(p for p in os.listdir(T.TABLE_DIR) if p.endswith(".json"))
    assert paths, "no table shipped"
    for name in paths:
        t = T.GemmTable.load(os.path.join(T.TABLE_DIR, name))
        assert t.match and t.source and t.entries
        for e in t.entries:
            core, cfg = G.config_from_entry(e, name)
            assert core == e["core"]
            got, d = t.lookup(e["M"], e["N"], e["K"], e["dtype"])
            assert d == 0 and got["config"] == e["config"]


def test_shipped_table_configs_compile_for_sm90a():
    """What the shipped tables can dispatch to compiles for sm_90a (Gluon entries: the warp-specialised core)."""
    seen = set()
    for name in sorted(p for p in os.listdir(T.TABLE_DIR) if p.endswith(".json")):
        for e in T.GemmTable.load(os.path.join(T.TABLE_DIR, name)).entries:
            core, cfg = G.config_from_entry(e, name)
            if (core, cfg) in seen:
                continue
            seen.add((core, cfg))
            if core == "gluon":
                ck = H.compile_sm90(cfg, torch.bfloat16)
            else:
                sig = {n: ("*fp32" if n in ("sa_ptr", "sb_ptr") else "*bf16" if n.endswith("_ptr") else "i32")
                       for n in ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_ak", "stride_bk",
                                 "stride_bn", "stride_cm", "stride_cn", "sa_ptr", "sb_ptr", "stride_sam",
                                 "stride_sak", "stride_sbk", "stride_sbn"]}      # the fp8 scales: unused here
                ck = ditron.compile(G.gemm_kernel, target="sm_90a", signature=sig, num_warps=cfg.num_warps,
                                    num_stages=cfg.num_stages,
                                    constexprs=dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                                    GROUP_M=cfg.group_m, EVEN_K=True, TMA=cfg.tma,
                                                    FLATTEN=cfg.flatten, SUBTILE=cfg.epilogue_subtile,
                                                    WARP_SPEC=cfg.warp_specialize))
            assert "wgmma.mma_async" in ck.asm["ptx"] and ck.metadata.shared <= 232448, (core, cfg)


# ---------------------------------------------------------------------------
# bench/gemm_core_levers.py on stored rows
# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _levers():
    spec = importlib.util.spec_from_file_location("gemm_core_levers", os.path.join(ROOT, "bench",
                                                                                    "gemm_core_levers.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _rows():
    def row(tp, shape, M, N, K, ratios):
        return {"tp": tp, "dtype": "bf16", "shape": shape, "M": M, "N": N, "K": K, "cublas_us": 100.0,
                "cands": {n: ({"us": 100.0 / r, "tflops": 1.0, "ratio": r} if r else {"status": "WRONG: x"})
                          for n, r in ratios.items()}}
    return [row(2, "AG x", 8192, 5504, 4096, {"tl default": 0.90, "tl 128x128x64 s5": 0.97,
                                              "gluon coop 128x256x64 s3": 0.89}),
            row(2, "AG y", 8192, 26624, 16384, {"tl default": 1.02, "tl 128x128x64 s5": None,
                                                "gluon coop 128x256x64 s3": 1.04}),
            row(8, "RS z", 8192, 4096, 1376, {"tl default": 0.96, "tl 128x128x64 s5": 0.95,
                                              "gluon coop 128x256x64 s3": 0.93})]


def test_per_shape_best_and_table(tmp_path):
    L = _levers()
    names = ["tl default", "tl 128x128x64 s5", "gluon coop 128x256x64 s3"]
    text, best = L.per_shape_best(_rows(), names)
    assert [b["best"] for b in best] == ["tl 128x128x64 s5", "gluon coop 128x256x64 s3", "tl default"]
    assert "per-shape best: geomean 1.004, worst 0.970" in text          # TP=2: sqrt(0.97 * 1.04)
    assert "per-shape best over everything: geomean 0.989, worst 0.960" in text
    # with a margin, tl default stays where the best is not clearly faster (AG y: 1.04 vs 1.02 is within 3%)
    text_m, best_m = L.per_shape_best(_rows(), names, margin=0.03)
    assert [b["best"] for b in best_m] == ["tl 128x128x64 s5", "tl default", "tl default"]
    assert "gluon coop 128x256x64 s3 1.040 within the margin" in text_m and "unless beaten by more than 3%" in text_m
    table = L.build_table(best, "NVIDIA H100 80GB HBM3", 132, "test")
    assert table["match"] == ["H100"] and len(table["entries"]) == 3
    by = {(e["M"], e["N"], e["K"]): e for e in table["entries"]}
    assert by[(8192, 5504, 4096)]["config"]["block_n"] == 128 and by[(8192, 5504, 4096)]["core"] == "tl"
    assert by[(8192, 26624, 16384)]["core"] == "gluon"
    # "tl default" is stored as the config the shipped rule picks at that shape
    assert by[(8192, 4096, 1376)]["config"] == G.dataclasses.asdict(G.gpu_default_config(8192, 4096, 1376, 132))
    p = tmp_path / "h100.json"
    p.write_text(json.dumps(table))
    assert L.check_table(str(p), best, 132) == 0
    # a table whose entry for a shape is another candidate's config fails the check
    table["entries"][0]["config"] = dict(table["entries"][0]["config"], group_m=4)
    p.write_text(json.dumps(table))
    assert L.check_table(str(p), best, 132) == 1


def test_levers_script_from_json(tmp_path):
    src = tmp_path / "rows.json"
    src.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "sms": 132, "triton": "3.6.0", "torch": "x",
                               "date": "2026-12-08", "rows": _rows()}))
    out = tmp_path / "tables" / "h100.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gemm_core_levers.py"), "--from-json", str(src),
                        "--candidates", "all", "--per-shape-best", "--write-table", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "table check: 3 of 3 shapes dispatch to their best candidate" in p.stdout
    assert "| TP2 bf16 geo / worst | TP8 bf16 geo / worst" in p.stdout
    t = T.GemmTable.load(str(out))
    assert "2026-12-08" in t.source and len(t.entries) == 3


def test_levers_candidate_names():
    L = _levers()
    names, _ = L.select("round2", "tl 128x128x128 s3")
    assert "tl default" in names and "tl 128x128x128 s3" not in names and len(names) == len(L.ROUND2) - 1
    with pytest.raises(SystemExit, match="unknown candidates"):
        L.select("tl nonsense", "")


#: every round-2 candidate under Triton 3.6 (the GPU machines' Triton, which CI runs too); under a newer Triton the two
#: defaults, tl and Gluon (CI's time: 1.3-3 s a compile on its 2 cores)
_CANDIDATES = [n for n in _levers().ROUND2 if n not in _levers().META][
    :None if ditron._compat.TRITON_VERSION[:2] == (3, 6) else 2]


@pytest.mark.parametrize("name", _CANDIDATES)
def test_levers_candidates_compile_for_sm90a(name):
    """Every round-2 candidate compiles for sm_90a (wgmma) within sm_90's shared memory: a candidate that does
    not fit is refused here, on a CPU, not at the GPU launch (the GPU machines' Triton, 3.6)."""
    assert _levers().compile_only([name], ["bf16"]) == []
