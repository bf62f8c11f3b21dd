"""``ditron bench train_tp`` (ditron/bench/train_tp.py) on 2 simulated ranks: the ditron paths train with the loss
curve of single-device fp32 torch and the results are written; torch's TP rows say why they did not run (no
torch.distributed group on the simulator).  The numbers themselves are meaningless on the simulator."""
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_train_tp_bench_on_the_simulator(tmp_path):
    cmd = [sys.executable, "-m", "ditron", "sim", "-n", "2", "-m", "ditron.bench", "train_tp", "--tokens", "8",
           "--hidden", "16", "--ffn", "24", "--heads", "2", "--steps", "3", "--models", "mlp", "--iters", "1",
           "--warmup", "1", "--repeat", "1", "--impls", "ditron,torch_funcol,torch_1gpu", "--out", str(tmp_path),
           "--tag", "smoke"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["impl"]: r for r in json.loads((tmp_path / "smoke-train_tp-w2.json").read_text())["rows"]}
    assert rows["ditron"]["ok"] and rows["ditron"]["curve_ok"] and len(rows["ditron"]["curve"]) == 3, rows
    assert rows["torch_1gpu"]["ok"], rows
    assert "no torch.distributed group" in rows["torch_funcol"]["error"], rows
    assert "| mlp | ditron |" in (tmp_path / "smoke-train_tp-w2.md").read_text()
