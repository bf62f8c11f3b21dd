"""ditron inside PyTorch programs (issue 16): the registered ops ``torch.ops.ditron.*`` (against torch, and
``torch.library.opcheck``), ``torch.compile(fullgraph=True)`` of a model calling ag_gemm and gemm_rs (matches
eager), and the tensor-parallel layers of ``ditron.nn`` (equal the unsharded modules), on simulated ranks in
CI and on GPUs under torchrun with DITRON_TEST_BACKEND=p2p|nvshmem (see conftest.py)."""
import pytest

import bodies_torch as B
from conftest import GPU_BACKEND

ON_GPU = GPU_BACKEND != "sim"
COMPILE_BACKEND = "inductor"     # on the simulator inductor compiles the non-ditron parts to C++ (needs a C++ compiler)
ALL_OPS = sorted(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ag_gemm", "gemm_rs", "gemm_ar"])


@pytest.mark.parametrize("n", [2, 3])
def test_ops_match_torch(dist_world, n):
    assert dist_world(n).run(B.ops_match_torch, "bf16") == [ALL_OPS] * n


def test_ops_match_torch_one_rank_fp32_collectives(dist_world):
    # fp32: the collectives only (the GEMM kernels take float16 / bfloat16); one rank
    got = dist_world(1).run(B.ops_match_torch, "fp32")
    assert got == [["all_gather", "all_reduce", "all_to_all", "reduce_scatter"]]


def test_opcheck_every_op(dist_world):
    assert dist_world(2).run(B.opcheck_ops, "bf16") == [ALL_OPS] * 2


@pytest.mark.inductor
@pytest.mark.parametrize("n", [3])       # an odd world (2 and 4 ranks: the op tests above and below)
def test_compiled_model_matches_eager(dist_world, n):
    assert dist_world(n).run(B.compiled_matches_eager, COMPILE_BACKEND) == [(5, 24)] * n


def test_wrong_world_size_is_an_error(dist_world):
    assert dist_world(2).run(B.wrong_world_size) == ["torch.ops.ditron.ag_gemm: world_size=3 but the ditron world "
                                                      "has 2 ranks"] * 2


# n = 3: hidden 40 splits 14, 14, 12 (the last shard zero-padded); M = 3 * 5 rows for gemm_rs
@pytest.mark.parametrize("n,dtype,bias", [(1, "bf16", True), (2, "fp16", False), (3, "bf16", True),
                                          (4, "fp16", True)])
def test_tp_layers_equal_unsharded(dist_world, n, dtype, bias):
    assert dist_world(n).run(B.tp_layers_match, dtype, bias=bias) == [True] * n


def test_tp_mlp_from_shards(dist_world):
    assert dist_world(3).run(B.tp_from_shards) == [True] * 3


# ---------------------------------------------------------------------------
# worlds from torch process groups and device meshes
# ---------------------------------------------------------------------------

@pytest.mark.skipif(ON_GPU, reason="builds its own gloo process group inside the simulated ranks")
def test_world_from_group_and_mesh_on_the_simulator(dist_world, tmp_path):
    msgs = dist_world(4).run(B.world_from_torch_group, str(tmp_path / "store"))
    # the (dp, tp) = (2, 2) mesh: rank r is rank r % 2 of its TP group; this process's world is the whole job
    assert msgs == [f"ditron is already initialised (rank {r} of 4); the group given is rank {r % 2} of 2: call "
                    "ditron.finalize() first" for r in range(4)], msgs


@pytest.mark.parametrize("members,lws,expect", [
    ([0, 1, 2, 3], 4, [(0, 4, 0, 4, 1, 0), (1, 4, 1, 4, 1, 0), (2, 4, 2, 4, 1, 0), (3, 4, 3, 4, 1, 0)]),
    ([2, 3], 4, [(0, 2, 0, 2, 1, 0), (1, 2, 1, 2, 1, 0)]),                      # TP group inside a node
    ([2, 3, 4, 5], 4, [(0, 4, 0, 2, 2, 0), (1, 4, 1, 2, 2, 0), (2, 4, 0, 2, 2, 1), (3, 4, 1, 2, 2, 1)]),
    ([1, 5, 9], 4, [(0, 3, 0, 1, 3, 0), (1, 3, 0, 1, 3, 1), (2, 3, 0, 1, 3, 2)]),  # a DP group: one per node
    ([0], 4, [(0, 1, 0, 1, 1, 0)]),
])
def test_group_rank_mapping(members, lws, expect):
    from ditron.runtime.groups import topology_of_members
    assert [topology_of_members(members, i, lws) for i in range(len(members))] == expect


@pytest.mark.parametrize("members,lws,match", [
    ([0, 4, 1, 5], 4, "not consecutive group ranks"),
    ([2, 3, 4], 4, "different numbers of members per node"),
])
def test_group_rank_mapping_errors(members, lws, match):
    import ditron
    from ditron.runtime.groups import topology_of_members
    with pytest.raises(ditron.DitronError, match=match):
        topology_of_members(members, 0, lws)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: GPUs only (torchrun with DITRON_TEST_BACKEND=p2p|nvshmem)")
def test_tp_mlp_compiled_and_cuda_graphs(dist):
    assert dist.run(B.tp_mlp_compiled_graphs) == [True] * dist.world_size


@pytest.mark.skipif(ON_GPU, reason="the smoke run of the GPU benchmark script on 2 simulated ranks")
@pytest.mark.e2e
def test_bench_script_smoke():
    """bench/torch_tp_mlp.py's checks (eager vs unsharded, compiled vs eager, direct calls vs eager) and its
    table on the simulator; the timings are meaningless there and not judged."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "2", os.path.join(root, "bench", "torch_tp_mlp.py"),
                        "--tokens", "32", "--d", "16", "--ffn", "24", "--iters", "1", "--warmup", "1", "--repeat", "1"],
                       capture_output=True, text=True, timeout=600, cwd=root)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "| 32, 16, 24 | 2 | bf16 |" in p.stdout, p.stdout[-2000:]


@pytest.mark.inductor
@pytest.mark.skipif(ON_GPU, reason="runs the docs' example on 2 simulated ranks")
def test_docs_example_runs(tmp_path):
    """The eager + torch.compile example of docs/torch.md, as written there, on 2 simulated ranks."""
    import os
    import re
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "docs", "torch.md")).read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith("# example.py")]
    assert len(blocks) == 1, "docs/torch.md lost its example.py block"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "2", str(script)], capture_output=True, text=True,
                       timeout=600, cwd=root)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "rank 0: compiled == eager, (8, 32)" in p.stdout and "rank 1: compiled == eager" in p.stdout, p.stdout


def test_configure_contexts(dist_world):
    assert dist_world(2).run(B.configure_contexts) == [
        ["sm", "ce", "ditron.torch_ops.configure: unknown op 'all_gatherr'"]] * 2
