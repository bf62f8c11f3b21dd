"""The zoo's all_gather, reduce_scatter and all_to_all (kernels/): every
method and dtype against torch on 4 simulated ranks in CI (on GPUs under
torchrun with DITRON_TEST_BACKEND=p2p|nvshmem; see conftest.py), a subset on 1,
3 and 8 ranks and on 2 nodes, context reuse, and errors before launch."""
import pytest

import bodies_zoo_ag_rs_a2a as B
from conftest import GPU_BACKEND

ON_GPU = GPU_BACKEND != "sim"
#: sizes that are not multiples of the tile or of the world size; GPUs add a
#: size that spans many programs and full 32 KiB tiles
AG_SIZES = (1, 37, 1000) + (((1 << 20) + 3,) if ON_GPU else ())
RS_SHARDS = (1, 37, 250, 0) + (((1 << 18) + 5,) if ON_GPU else ())
#: calls per reuse test.  Simulator: 48, which crosses every periodic pattern of the reuse bodies several times
#: (methods x buffer parity: 4 for all_gather, 2 for reduce_scatter; all_to_all's equal-split sizes x parity: 6)
#: and holds the edge cases of their seeded draws (test_reuse_calls_hold_the_edge_cases); GPUs: 1000
REUSE_ITERS = 1000 if ON_GPU else 48


@pytest.mark.parametrize("method,dtype", [(m, d) for m in ("push", "pull", "ring", "ce") for d in ("fp32", "fp16", "bf16")]
                         + [("auto", "bf16")])
def test_all_gather(dist, method, dtype):
    assert dist.run(B.all_gather_sizes, dtype, method, AG_SIZES) == [len(AG_SIZES)] * dist.world_size


@pytest.mark.parametrize("method", ["push", "pull", "ring", "ce"])
def test_all_gather_shapes_out_and_symmetric_input(dist, method):
    assert dist.run(B.all_gather_shapes, method) == [3] * dist.world_size


@pytest.mark.parametrize("method,dtype", [(m, d) for m in ("mesh", "ring") for d in ("fp32", "fp16", "bf16")]
                         + [("auto", "bf16")])
def test_reduce_scatter(dist, method, dtype):
    assert dist.run(B.reduce_scatter_sizes, dtype, method, RS_SHARDS) == [len(RS_SHARDS)] * dist.world_size


@pytest.mark.parametrize("method", ["mesh", "ring"])
def test_reduce_scatter_shapes_out_and_symmetric_input(dist, method):
    assert dist.run(B.reduce_scatter_shapes, method) == [2] * dist.world_size


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_all_to_all_equal_splits(dist, dtype):
    tokens = (1, 3, 0) + ((257,) if ON_GPU else ())
    hidden = 4096 + 8 if ON_GPU else 37
    assert dist.run(B.all_to_all_sizes, dtype, tokens, hidden) == [len(tokens)] * dist.world_size


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_all_to_all_variable_splits(dist, dtype):
    max_tokens, hidden = (1000, 4096 + 8) if ON_GPU else (13, 37)
    assert dist.run(B.all_to_all_v_calls, dtype, max_tokens, hidden, 3) == [3] * dist.world_size


@pytest.mark.skipif(ON_GPU, reason="the race finder is the simulator's")
def test_all_to_all_variable_splits_is_race_free():
    """Under the race finder: each program of a sender writes its count to its own word on the receiver (before,
    every program wrote the same word: a write-write race on ``all_to_all.cnt`` between programs)."""
    from ditron.sim.pool import SimCluster
    with SimCluster(4, race=True, hang_timeout=20) as c:
        for dtype in ("fp32", "fp16", "fp32", "fp16"):      # (later runs: the programs no longer start in step)
            assert c.run(B.all_to_all_v_calls, dtype, 13, 37, 3) == [3] * 4


def test_all_gather_reuse(dist):
    assert dist.run(B.all_gather_reuse, REUSE_ITERS) == [REUSE_ITERS] * dist.world_size


def test_reduce_scatter_reuse(dist):
    assert dist.run(B.reduce_scatter_reuse, REUSE_ITERS) == [REUSE_ITERS] * dist.world_size


def test_all_to_all_reuse(dist):
    assert dist.run(B.all_to_all_reuse, REUSE_ITERS) == [REUSE_ITERS] * dist.world_size


def test_reuse_calls_hold_the_edge_cases():
    """What the reuse tests' REUSE_ITERS calls must contain, checked on the bodies' own draws: all_gather a call
    of the context's full size (and one of at most 2 elements); reduce_scatter an empty call and a full one;
    all_to_all_v (every other call, 4 ranks) a rank sending nothing, a rank sending a full context, and a rank
    sending everything to one peer; the equal-split calls every size 0..max_tokens / W."""
    ag = B.reuse_sizes(REUSE_ITERS, B.AG_REUSE["max_n"], B.AG_REUSE["seed"])
    assert max(ag) == B.AG_REUSE["max_n"] and min(ag) <= 2, ag
    rs = B.reuse_sizes(REUSE_ITERS, B.RS_REUSE["max_m"], B.RS_REUSE["seed"])
    assert 0 in rs and B.RS_REUSE["max_m"] in rs, rs
    W, max_tokens = 4, 8                                       # all_to_all_reuse's defaults on 4 ranks
    splits = [B._splits_of(r, W, max_tokens, 300 + i) for i in range(1, REUSE_ITERS, 2) for r in range(W)]
    totals = [int(sp.sum()) for sp in splits]
    assert 0 in totals and max_tokens in totals, totals
    assert any(t > 0 and (sp == t).any() for sp, t in zip(splits, totals))
    assert {(i // 2) % (max_tokens // W + 1) for i in range(0, REUSE_ITERS, 2)} == set(range(max_tokens // W + 1))


@pytest.mark.parametrize("n,nnodes", [(1, 1), (3, 1), (8, 1), (4, 2)])
def test_every_op_on_other_worlds(dist_world, n, nnodes):
    # 3 and 8 ranks: odd and large worlds; (4, 2): ranks on the other node go
    # through shmem.putmem_signal_block.
    d = dist_world(n, nnodes)
    ag = 4 if nnodes == 1 else 3        # all_gather's "ce" is for one node
    if n > 1 and not ON_GPU:     # one size per op (still 2 programs each): simulated ranks share 2 CPU cores
        assert d.run(B.every_op, ag_sizes=(300,), rs_shards=(150,), a2a_v_calls=1) == [[1] * (ag + 4)] * n
    else:
        assert d.run(B.every_op) == [[2] * ag + [2, 2, 1, 2]] * n


def test_errors_before_launch(dist):
    msgs = dist.run(B.errors)[0]
    one = dist.world_size == 1                  # every count is a multiple of one rank: those cases give None
    assert "11 elements, more than the context's max_numel=10" in msgs["ag_too_big"]
    assert "torch.float32, the context was created for torch.float16" in msgs["ag_dtype"]
    assert "is on meta" in msgs["ag_device"]
    assert "unknown method 'tree'" in msgs["ag_method"]
    assert "argument 'out' has" in msgs["ag_out"]
    assert "must be contiguous" in msgs["ag_strided"]
    assert "is not supported" in msgs["ag_dtype_ctx"]
    assert msgs["rs_not_multiple"] is None if one else "not a multiple of the world size" in msgs["rs_not_multiple"]
    assert "more than the context's max_numel" in msgs["rs_too_big"]
    assert "unknown method 'tree'" in msgs["rs_method"]
    assert "must be [tokens, hidden=8]" in msgs["a2a_hidden"]
    assert "more than the context's max_tokens" in msgs["a2a_tokens"]
    assert msgs["a2a_not_multiple"] is None if one else "not a multiple of the world size" in msgs["a2a_not_multiple"]
    assert "splits must be a contiguous int32/int64 tensor" in msgs["a2a_splits"]
    assert "splits must be" in msgs["a2a_splits_len"]


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need GPUs")
def test_cuda_graph_capture_and_replay(dist):
    dist.run(B.graph_replay)
