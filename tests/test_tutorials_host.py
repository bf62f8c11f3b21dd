"""Triton-distributed's tutorials' host code under ditron (issue 56, item 4):
scripts written in the tutorials' style (their imports and ``triton_dist.utils``
calls, nothing of that project's code) run under ``ditron sim``; what ditron
does not provide fails with one line that says what to write instead."""
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sim(tmp_path, body, n=2):
    script = tmp_path / "tutorial.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "ditron.sim", "-n", str(n), str(script)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path))


def _have(mod):
    import importlib.util
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(_have("nvshmem"), reason="nvshmem4py is installed here: the real module imports")
def test_import_nvshmem_core_fails_with_one_line_naming_the_port(tmp_path):
    r = _sim(tmp_path, """
        import torch
        import nvshmem.core
        from triton_dist.utils import initialize_distributed
        initialize_distributed()
    """)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert "tutorial.py:3" in line and "not installed in this environment" in line
    assert "import nvshmem.core" in line and "finalize_distributed()" in line, line
    assert "Traceback" not in r.stderr


def test_user_try_except_import_nvshmem_still_works(tmp_path):
    r = _sim(tmp_path, """
        try:
            import nvshmem.core
            HAVE = True
        except ImportError:
            HAVE = False
        print("fallback-ok", HAVE)
    """, n=1)
    assert r.returncode == 0, r.stderr
    assert "fallback-ok" in r.stdout


def test_tutorial_host_helpers_run_under_sim(tmp_path):
    # the two-line port of tutorial 01's host code: no nvshmem.core, finalize_distributed()
    r = _sim(tmp_path, """
        import torch
        import triton_dist
        from triton_dist.utils import (NVSHMEM_SIGNAL_DTYPE, dist_print, initialize_distributed,
                                       nvshmem_barrier_all_on_stream, nvshmem_free_tensor_sync,
                                       nvshmem_create_tensor, nvshmem_create_tensors, finalize_distributed)
        TP_GROUP = initialize_distributed()
        rank, num_ranks = TP_GROUP.rank(), TP_GROUP.size()
        queue = nvshmem_create_tensor((4 * 8,), torch.float32)
        signal = nvshmem_create_tensor((4,), NVSHMEM_SIGNAL_DTYPE)
        bufs = nvshmem_create_tensors((2, 3), torch.float32, rank, num_ranks)
        queue.fill_(rank)
        signal.fill_(0)
        nvshmem_barrier_all_on_stream(None)
        assert float(bufs[(rank + 1) % num_ranks].sum()) == float(bufs[rank].sum())
        nvshmem_free_tensor_sync(bufs[rank])
        nvshmem_free_tensor_sync(signal)
        nvshmem_free_tensor_sync(queue)
        dist_print(f"rank{rank} Passed", need_sync=True, allowed_ranks=list(range(num_ranks)))
        finalize_distributed()
    """)
    assert r.returncode == 0, r.stderr
    assert "rank0 Passed" in r.stdout and "rank1 Passed" in r.stdout


@pytest.mark.parametrize("stmt, zoo", [
    ("from triton_dist.kernels.nvidia.allgather_gemm import create_ag_gemm_context", "ditron.kernels.create_ag_gemm_context"),
    ("from triton_dist.kernels.nvidia import create_ag_gemm_context", "ditron.kernels.create_ag_gemm_context"),
    ("from triton_dist.kernels.nvidia.reduce_scatter import ring_reduce", "ditron.kernels.create_reduce_scatter_context"),
    ("from triton_dist.kernels.nvidia.gemm_reduce_scatter import x", "ditron.kernels.create_gemm_rs_context"),
    ("from triton_dist.kernels.amd import create_gemm_rs_intra_node_context", "ditron.kernels.create_gemm_rs_context"),
    ("from triton_dist.kernels.nvidia.allgather import x", "ditron.kernels.create_all_gather_context"),
    ("from triton_dist.kernels.nvidia.allreduce import x", "ditron.kernels.create_all_reduce_context"),
    ("import triton_dist.kernels.nvidia.ep_a2a", "ditron.kernels.create_ep_context"),
    ("from triton_dist.kernels.common_ops import set_signal, wait_eq", "ditron.stream_wait_value"),
    ("from triton_dist.kernels.nvidia.common_ops import barrier_all_intra_node_atomic_cas_block", "ditron.barrier_all"),
    ("import triton_dist; triton_dist.kernels.nvidia.create_ag_gemm_context", "ditron.kernels.create_ag_gemm_context"),
])
def test_triton_dist_kernels_names_the_zoo_equivalent(stmt, zoo):
    code = f"import sys\ntry:\n    {stmt}\nexcept ImportError as e:\n    print(e)\n    sys.exit(0)\nsys.exit(5)\n"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert zoo in r.stdout and "does not ship" in r.stdout, r.stdout
