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
    assert "import nvshmem.core" in line and "nvshmem.core.finalize()" in line, line
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


_ZOO_IMPORTS = [
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
]

# each statement in a fresh namespace with triton_dist's modules dropped before it (a first import each time), all
# in one interpreter (CI time: a fresh interpreter per statement cost ~1.2 s each); the ImportError's message, or
# None where the statement went through
_ZOO_SCRIPT = """
import json, sys
out = []
for stmt in json.loads(sys.argv[1]):
    for m in [m for m in sys.modules if m == "triton_dist" or m.startswith("triton_dist.")]:
        del sys.modules[m]
    try:
        exec(stmt, {})
        out.append(None)
    except ImportError as e:
        out.append(str(e))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def zoo_import_errors():
    import json
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _ZOO_SCRIPT, json.dumps([s for s, _ in _ZOO_IMPORTS])],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return dict(zip([s for s, _ in _ZOO_IMPORTS], json.loads(r.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("stmt, zoo", _ZOO_IMPORTS)
def test_triton_dist_kernels_names_the_zoo_equivalent(zoo_import_errors, stmt, zoo):
    msg = zoo_import_errors[stmt]
    assert msg is not None, f"{stmt!r} raised no ImportError"
    assert zoo in msg and "does not ship" in msg, msg


# host code in the tutorials' style: GPU tensors, the current stream, cuda-python's stream write, and a reference
# built with torch.distributed collectives on the group initialize_distributed() returns
_TORCH_HOST = """
    import torch
    import torch.distributed
    import triton
    import triton.language as tl
    import triton_dist
    import triton_dist.language as dl
    from triton_dist.utils import (NVSHMEM_SIGNAL_DTYPE, CUDA_CHECK, cuda, initialize_distributed,
                                   nvshmem_barrier_all_on_stream, nvshmem_create_tensor, nvshmem_create_tensors)

    @triton_dist.jit
    def pull_next(buf_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        peer = (dl.rank() + 1) % dl.num_ranks()
        tl.store(out_ptr + offs, tl.load(dl.symm_at(buf_ptr, peer) + offs, mask=offs < n), mask=offs < n)

    TP_GROUP = initialize_distributed()
    assert isinstance(TP_GROUP, torch.distributed.ProcessGroup) and torch.distributed.is_initialized()
    rank, n = TP_GROUP.rank(), TP_GROUP.size()
    stream = torch.cuda.current_stream()
    x = torch.randn(6, dtype=torch.float32).cuda() + 100 * rank
    y = torch.full((6,), float(rank), device="cuda")
    z = torch.empty(6, device=torch.device("cuda", 0)).to("cuda:0").to(torch.cuda.current_device())
    assert x.device.type == y.device.type == z.device.type == "cpu"      # host memory, as documented
    assert x.cuda() is x and x.to("cuda") is x

    # references with torch.distributed (gloo across the simulated ranks)
    parts = [torch.empty_like(x) for _ in range(n)]
    torch.distributed.all_gather(parts, x, group=TP_GROUP)
    flat = torch.empty(6 * n, device="cuda")
    torch.distributed.all_gather_into_tensor(flat, x, group=TP_GROUP)
    assert torch.equal(flat, torch.cat(parts)) and torch.equal(parts[rank], x)
    rs = torch.empty(2, device="cuda")
    torch.distributed.reduce_scatter_tensor(rs, torch.arange(2.0 * n, device="cuda") * (rank + 1), group=TP_GROUP)
    tri = n * (n + 1) / 2
    assert rs.tolist() == [2 * rank * tri, (2 * rank + 1) * tri], rs
    torch.distributed.broadcast(y, src=n - 1, group=TP_GROUP)
    assert y.tolist() == [float(n - 1)] * 6
    torch.distributed.barrier(group=TP_GROUP)

    # the kernel against the reference, on a side stream like the tutorials' copy-engine paths
    buf = nvshmem_create_tensor((6,), torch.float32)
    buf.copy_(x)
    out = torch.empty(6, device="cuda")
    nvshmem_barrier_all_on_stream(stream)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() == side and side != stream
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        pull_next[(1,)](buf, out, 6, BLOCK=8)
        stop.record()
    stream.wait_stream(side)
    torch.cuda.synchronize()
    assert start.elapsed_time(stop) >= 0
    assert torch.equal(out, parts[(rank + 1) % n]), (out, parts)

    # cuda-python's stream write into a peer's symmetric signal (tutorial 02's copy-engine path)
    sigs = nvshmem_create_tensors((n,), NVSHMEM_SIGNAL_DTYPE, rank, n)
    sigs[rank].zero_()
    nvshmem_barrier_all_on_stream(stream)
    peer = (rank + 1) % n
    (err,) = cuda.cuStreamWriteValue32(stream.cuda_stream, sigs[peer][rank].data_ptr(), 7 + rank,
                                       cuda.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT)
    CUDA_CHECK(err)
    left = (rank - 1) % n
    (err,) = cuda.cuStreamWaitValue32(stream.cuda_stream, sigs[rank][left].data_ptr(), 7 + left,
                                      cuda.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ)
    CUDA_CHECK(err)
    nvshmem_barrier_all_on_stream(stream)
    assert sigs[rank].tolist() == [7 + left if i == left else 0 for i in range(n)], sigs[rank]
    try:
        cuda.cuStreamWriteValue32(stream.cuda_stream, x.data_ptr(), 1, 0)
        raise SystemExit("a write outside the symmetric heap was accepted")
    except RuntimeError as e:
        assert "not in the symmetric heap" in str(e), e
    print(f"rank{rank} torch-host-ok", flush=True)
    torch.distributed.destroy_process_group()
"""


@pytest.mark.parametrize("n", [3])
@pytest.mark.e2e
def test_tutorial_style_torch_host_code_runs_under_sim(tmp_path, n):
    r = _sim(tmp_path, _TORCH_HOST, n=n)
    assert r.returncode == 0, r.stderr
    for rank in range(n):
        assert f"rank{rank} torch-host-ok" in r.stdout, r.stdout


def test_finalize_distributed_ends_the_group_and_it_starts_again(tmp_path):
    r = _sim(tmp_path, """
        import torch, torch.distributed as dist
        from triton_dist.utils import initialize_distributed, finalize_distributed
        for i in range(2):
            g = initialize_distributed()
            t = torch.tensor([float(g.rank() + i)])
            dist.all_reduce(t, group=g)
            assert t.item() == 1 + 2 * i, t
            finalize_distributed()
            assert not dist.is_initialized()
        print("restart-ok", flush=True)
    """, n=2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("restart-ok") == 2


def test_simulated_gpu_is_only_inside_ditron_sim():
    # a plain process (and `import ditron`) keeps torch's own CUDA behaviour: no CUDA on this machine
    code = ("import torch, ditron, triton_dist.utils\n"
            "from ditron.sim import host_torch\n"
            "assert not host_torch.active()\n"
            "try:\n    torch.zeros(1, device='cuda')\nexcept (RuntimeError, AssertionError) as e:\n"
            "    print('no-cuda', type(e).__name__)\n"
            "try:\n    triton_dist.utils.cuda\nexcept AttributeError as e:\n    print('no-driver')\n")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    if not torch_has_cuda():
        assert "no-cuda" in r.stdout and "no-driver" in r.stdout, r.stdout


def torch_has_cuda():
    import torch
    return torch.cuda.is_available()
