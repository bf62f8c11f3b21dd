"""The transformers baseline of ``ditron bench megakernel --model`` runs each case in a child process of its own
(ditron/bench/megakernel_hf.py): a result, a failure's reason and a hung child each come back to the bench as its
row's column or error, never as the bench's own crash."""
import os
import subprocess
import sys

import pytest

from ditron.bench import megakernel_hf as H  # noqa: E402
from ditron.models import import_transformers  # noqa: E402

try:
    import_transformers()                 # not a plain import: this checkout's kernels/ would shadow HF's kernels
except ImportError:
    pytest.skip("transformers is not installed (the test extra has it)", allow_module_level=True)


def test_child_times_a_tiny_model_on_cpu(monkeypatch):
    # torchrun's variables of the parent do not reach the child (it is one plain process)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    us, err = H.run_child("tiny-qwen3", 2, 8, 20, "cpu", 1, 2, 1, timeout=300, compile=False)
    assert err is None and us is not None and 0 < us < 60e6


def test_child_failure_comes_back_as_the_reason():
    us, err = H.run_child("no-such-model", 1, 8, 20, "cpu", 1, 1, 1, timeout=300, compile=False)
    assert us is None and "KeyError" in err and "no-such-model" in err


def test_child_that_dies_without_a_result(monkeypatch):
    # a child killed before it prints (as an illegal memory access kills a CUDA process): its status and output
    monkeypatch.setattr(H, "MARKER", "NEVER_PRINTED ")
    us, err = H.run_child("no-such-model", 1, 8, 20, "cpu", 1, 1, 1, timeout=300, compile=False)
    assert us is None and "exited with status 1 and no result" in err


def test_child_that_outlives_its_timeout(monkeypatch):
    real = subprocess.run

    def slow(cmd, **kw):
        return real([sys.executable, "-c", "import time; time.sleep(30)"], **kw)
    monkeypatch.setattr(H.subprocess, "run", slow)
    us, err = H.run_child("tiny-qwen3", 1, 8, 20, "cpu", 1, 1, 1, timeout=1, compile=False)
    assert us is None and "outlived 1 s" in err


@pytest.mark.e2e
def test_bench_table_says_why_the_column_is_empty_on_the_simulator(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "1", "-m", "ditron.bench", "megakernel",
                        "--model", "tiny-qwen3", "--ctx", "16", "--batch", "1", "--warmup", "1", "--iters", "1",
                        "--repeat", "1", "--hf-batch", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    md = next(tmp_path.glob("*megakernel-tiny-qwen3.md")).read_text()
    assert "transformers baseline: CUDA only" in md
