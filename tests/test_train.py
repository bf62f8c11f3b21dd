"""Training with ditron (issue 54): the backward passes of ``torch.ops.ditron.*`` and of the ``ditron.nn``
layers against plain torch autograd on the whole data, on 1 to 4 simulated ranks (CI) or the torchrun world on
GPUs (DITRON_TEST_BACKEND=p2p|nvshmem, see conftest.py)."""
import pytest

import bodies_train as B

GEMM_OPS = ["ag_gemm", "gemm_ar", "gemm_rs"]
COLLECTIVES = ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ops_backward_match_torch(dist_world, n):
    assert dist_world(n).run(B.ops_backward_match_torch, "bf16") == [sorted(COLLECTIVES + GEMM_OPS)] * n


def test_collectives_backward_fp32(dist_world):
    assert dist_world(2).run(B.ops_backward_match_torch, "fp32") == [COLLECTIVES] * 2


# n = 3: hidden 40 splits 14, 14, 12 (+ padding); shapes not multiples of any tile
@pytest.mark.parametrize("n,dtype,reduce,bias", [(1, "bf16", "rs", True), (2, "fp16", "rs", False),
                                                 (3, "bf16", "rs", True), (4, "bf16", "rs", True),
                                                 (2, "bf16", "ar", True), (3, "fp16", "ar", True)])
def test_tp_mlp_backward_matches_torch(dist_world, n, dtype, reduce, bias):
    assert dist_world(n).run(B.tp_mlp_backward, dtype, reduce, bias) == [True] * n


def test_frozen_weights_now_train(dist_world):
    """Issue 54's report: the TP weights never changed in a training loop; now they train and the loss drops."""
    assert dist_world(2).run(B.frozen_weights_now_train, False) == [True] * 2


def test_inference_layer_in_a_training_loop_is_an_error(dist_world):
    msgs = dist_world(2).run(B.frozen_weights_now_train, True)
    assert all("ditron.nn.ColumnParallelLinear was built with inference=True" in m and "torch.no_grad()" in m
               for m in msgs), msgs


def test_state_dict_saves_and_loads_shards(dist_world, tmp_path):
    d = dist_world(2)
    if d.backend != "sim":      # torchrun: one pytest per rank, each its own tmp_path; the ranks share one directory
        import os
        tmp_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ditron-state-dict-{os.environ.get('MASTER_PORT')}")
        os.makedirs(tmp_path, exist_ok=True)
    msgs = d.run(B.state_dict_round_trip, str(tmp_path))
    assert msgs == [f"the state dict holds the shard of rank {(r + 1) % 2} of 2" for r in range(2)], msgs


@pytest.mark.parametrize("backend", ["record", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_compiled_backward(dist_world, backend):
    """torch.compile(fullgraph=True) traces forward and backward through the ops ("record": AOTAutograd's
    graphs, read; inductor: compiled, CPU C++ around the ops on the simulator)."""
    assert dist_world(2).run(B.compiled_backward_matches_eager, backend) == [True] * 2


@pytest.mark.e2e
def test_tp_transformer_block_trains_like_torch(dist_world, n=2):
    """Issue 54: a tiny TP + sequence-parallel transformer block (attention + MLP) trains 20 AdamW steps with
    the loss curve of the single-device float32 block."""
    curves = dist_world(n).run(B.train_block)
    assert all(c == curves[0] for c in curves), curves


def test_opcheck_with_grad(dist_world):
    assert dist_world(2).run(B.opcheck_with_grad) == [sorted(COLLECTIVES + GEMM_OPS)] * 2


@pytest.mark.parametrize("n,dup", [(1, False), (2, False), (3, False), (2, True)])
def test_moe_backward_matches_torch(dist_world, n, dup):
    """Issue 54 (MoE / EP): ExpertParallelMoE's input, gate and expert-weight gradients against the single-device
    float32 layer at 1-3 ranks (tokens 5, 3, 4 per rank); dup: tokens routed twice to one expert.  The backward
    runs EP dispatch once (for combine) and EP combine once (for dispatch) on the data's context, one dispatch and
    one combine on the float32 helper context (the routing weights' gradient)."""
    got = dist_world(n).run(B.moe_backward, "bf16", dup=dup)
    for g in got:
        assert g["forward"] == {"dispatch": 1, "combine": 1}, g
        assert g["backward"] == {"dispatch": 1, "combine": 1}, g
        assert g["aux"] == {"route": 1, "dispatch": 1, "combine": 1}, g


@pytest.mark.e2e
def test_moe_trains_like_torch(dist_world):
    curves = dist_world(2).run(B.moe_trains)
    assert all(c == curves[0] for c in curves), curves
