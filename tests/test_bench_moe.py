"""The MoE benchmark harness (ditron/bench/moe.py, ``ditron bench
grouped_gemm|ag_moe|moe_rs|moe_ar|ep``) on the CPU: simulated ranks run every
ditron code path with its check against torch and write the Markdown and
JSON results; the NCCL baselines need GPUs and are absent there.  The
numbers themselves are meaningless on the simulator."""
import json
import pathlib
import subprocess
import sys

import pytest

from ditron.bench import moe as bm

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAST = ["--iters", "5", "--warmup", "1", "--repeat", "1"]


def _sim(tmp_path, n, *args, timeout=300):
    cmd = [sys.executable, "-m", "ditron", "sim", "-n", str(n), "-m", "ditron.bench", *args, *FAST, "--out",
           str(tmp_path), "--tag", "smoke"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _rows(path):
    data = json.loads(path.read_text())
    return data, {(r["shape"], r["impl"]): r for r in data["rows"]}


@pytest.mark.parametrize("op", ["ag_moe", "moe_rs"])
@pytest.mark.e2e
def test_tp_moe_bench_on_the_simulator(tmp_path, op):
    p = _sim(tmp_path, 2, op, "--shapes", "6,16,32,4,2")
    assert p.returncode == 0, p.stdout + p.stderr
    data, rows = _rows(tmp_path / f"smoke-{op}-bf16.json")
    r = rows[("T6_H16_I32_E4_k2", "ditron")]
    assert r["status"] == "ok" and r["us"] > 0, r
    assert data["meta"]["command"].startswith(f"ditron bench {op}")
    assert "| T6_H16_I32_E4_k2 |" in (tmp_path / f"smoke-{op}-bf16.md").read_text()


@pytest.mark.e2e
def test_grouped_gemm_and_ep_bench_on_the_simulator(tmp_path):
    p = _sim(tmp_path, 1, "grouped_gemm", "--shapes", "8,16,32,4,2", "--tp", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    _, rows = _rows(tmp_path / "smoke-grouped_gemm-bf16.json")
    for impl in ("ditron", "torch_loop"):
        assert rows[("T8_H16_I32_E4_k2", impl)]["status"] == "ok"
    assert rows[("T8_H16_I32_E4_k2", "ditron")]["speedup"] > 0
    p = _sim(tmp_path, 2, "ep", "--tokens", "3", "--hidden", "24", "--topk", "2", "--experts-per-rank", "2",
             "--trace")
    assert p.returncode == 0, p.stdout + p.stderr
    _, rows = _rows(tmp_path / "smoke-ep-bf16.json")
    for mode in ("normal", "low_latency"):
        assert rows[("3 tok/rank", f"ditron {mode}")]["status"] == "ok"
    # --trace: the per-phase account; the data path allocates nothing, sets no memory, reads nothing back and
    # launches routing + dispatch + combine (LL: dispatch + combine); the simulator's cross-rank argument check
    # adds its copy_ ops
    trace = (tmp_path / "smoke-ep-trace-bf16.md").read_text()
    for mode in ("normal", "low_latency"):
        assert f"#### 3 tok/rank, {mode}" in trace
    assert trace.count("allocations 0, memsets 0, host syncs 0") == 2, trace
    # normal: routing + dispatch + combine; low latency: the routing is the dispatch kernel's first phase
    assert trace.count("EP launches: route x1, dispatch x1, combine x1.") == 1, trace
    assert trace.count("EP launches: dispatch x1, combine x1.") == 1, trace
    assert trace.count("| route | ") == 1, trace
    for kernel in ("dispatch", "combine"):
        assert trace.count(f"| {kernel} | ") == 2, trace


def test_shapes():
    assert [s[0] for s in bm.parse_shapes("paper")] == ["Qwen1.5-MoE-A2.7B", "Mixtral-8x7B", "Mixtral-8x22B",
                                                        "DeepSeek-MoE"]
    assert bm.parse_shapes("8,16,32,4,2;16,8,8,2,1") == [("T8_H16_I32_E4_k2", 8, 16, 32, 4, 2),
                                                        ("T16_H8_I8_E2_k1", 16, 8, 8, 2, 1)]


def test_ep_fp8_bench_on_the_simulator(tmp_path):
    # ditron bench ep --dtype fp8: the fp8 and bf16 low-latency rows, each checked against torch first
    p = _sim(tmp_path, 2, "ep", "--dtype", "fp8", "--tokens", "3", "--hidden", "128", "--topk", "2",
             "--experts-per-rank", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    data, rows = _rows(tmp_path / "smoke-ep-fp8.json")
    for impl in ("ditron low_latency fp8", "ditron low_latency fp8 prequant", "ditron low_latency fp8 once",
                 "ditron low_latency bf16"):
        assert rows[("3 tok/rank", impl)]["status"] == "ok", rows
    assert rows[("3 tok/rank", "ditron low_latency fp8")]["speedup"] > 0
    assert "fp8 " in (tmp_path / "smoke-ep-fp8.md").read_text()


def test_ep_fp8_bench_check_is_the_documented_bound():
    # the bench's check (ditron/bench/ep_fp8.py): exact combine semantics within half a bf16 ulp, the fp8 round
    # trip within kernels/ep.py's bound; a wrong row, a wrong scale and a lost pair are caught
    import pytest
    import torch

    from ditron.bench.ep_fp8 import combine_check
    from ditron.kernels import ep
    g = torch.Generator().manual_seed(3)
    T, H, k = 6, 256, 3
    x = (torch.randn(T, H, generator=g) * 3).to(torch.bfloat16)
    w = torch.rand(T, k, generator=g) + 0.1
    codes, scales = ep.fp8_quantize_reference(x)
    y = ep.fp8_dequantize(codes, scales).to(torch.bfloat16).float()
    out = (y * w.sum(1, keepdim=True)).to(torch.bfloat16)           # what a correct dispatch + combine returns
    check = combine_check(x, w, True, "fp8")
    check(out)
    combine_check(x, w, False, "bf16")((x.float() * w.sum(1, keepdim=True)).to(torch.bfloat16))
    for name, bad in (("row", out.clone().index_copy_(0, torch.tensor([2]), out[3:4])),
                      ("scale", (y * torch.cat([scales[:, :1] * 1.07, scales[:, 1:]], 1).repeat_interleave(128, 1)
                                 / scales.repeat_interleave(128, 1) * w.sum(1, keepdim=True)).to(torch.bfloat16)),
                      ("pair", (y * (w.sum(1, keepdim=True) - w[:, :1])).to(torch.bfloat16))):
        with pytest.raises(AssertionError, match="beyond the bound"):
            check(bad)
    with pytest.raises(AssertionError, match="beyond the bound"):
        combine_check(x, w, False, "bf16")(out)                     # fp8 rows are not the bf16 payload
    # the documented round trip holds for torch's quantiser, and is not loose by orders of magnitude
    err = (ep.fp8_dequantize(codes, scales) - x.float()).abs()
    bound = ep.fp8_round_trip_bound(x, scales)
    assert (err <= bound).all() and (err / bound).max() > 0.3


def test_ep_fp8_dispatch_check_tells_rounding_from_placement():
    """The bench's dispatch check (ditron/bench/ep_fp8.py ``dispatch_check``): exact codes pass; a swap of two
    rows is reported as rows that are other tokens' rows, a code one step off as rounding."""
    import torch
    from ditron.bench.ep_fp8 import dispatch_check
    from ditron.kernels import ep
    T, H, E = 16, 256, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(T)])
    qc, qs = ep.fp8_quantize_reference(x)
    codes, scales = torch.zeros(E, T, H, dtype=torch.float8_e4m3fn), torch.zeros(E, T, H // 128)
    for e in range(E):
        toks = (idx == e).any(1).nonzero().flatten()
        codes[e, :len(toks)], scales[e, :len(toks)] = qc[toks], qs[toks]
    assert dispatch_check(x, idx, E, codes, scales) is None
    toks0 = (idx == 0).any(1).nonzero().flatten()
    swapped = codes.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    msg = dispatch_check(x, idx, E, swapped, scales)
    assert f"2 of {len(toks0)} rows" in msg and f"is the quantised row of tokens [{toks0[1].item()}]" in msg, msg
    step = codes.clone()
    step.view(torch.uint8)[0, 1, 5] += 1
    msg = dispatch_check(x, idx, E, step, scales)
    assert "1 e4m3 codes" in msg and "1 one code step apart, at most 1" in msg, msg
