"""The zoo's grouped GEMM (kernels/moe.py) on one simulated rank in CI (on
GPUs under torchrun): experts with zero rows, counts that are not multiples
of the tile, one expert, a gather index, both dtypes, errors before launch,
and what the GPU kernel compiles to."""
import pytest

import bodies_moe as B

#: per-expert row counts: zeros (first, middle, last), tile tails, one expert, everything in one expert
CASES = [[3, 0, 17, 5], [0, 0, 33, 0], [16], [1, 2, 0, 0, 31, 1, 0, 9]]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_grouped_gemm(dist_world, dtype):
    assert dist_world(1).run(B.grouped_gemm_cases, dtype, CASES) == [2 * len(CASES)]


def test_grouped_gemm_k_tail_and_tile_config(dist_world):
    # K not a multiple of block_k, a wider N tile
    got = dist_world(1).run(B.grouped_gemm_cases, "bf16", [[7, 0, 20]], K=50, N=40, block_m=16, block_n=32,
                            block_k=32, group_m=2, num_warps=1, num_stages=1)
    assert got == [2]


def test_grouped_gemm_errors(dist_world):
    msgs = dist_world(1).run(B.grouped_gemm_errors)[0]
    assert "3 counts (one per expert)" in msgs["counts_len"]
    assert "3 counts (one per expert)" in msgs["counts_dtype"]
    assert "'w' is torch.bfloat16" in msgs["w_dtype"]
    assert "'w' has K=8" in msgs["w_k"]
    assert "3-D tensor" in msgs["w_2d"]
    assert "float16 or bfloat16" in msgs["a_dtype"]
    assert "row-major (5, 8)" in msgs["out"]


def grouped_gemm_signature(ab="*bf16", c="*bf16"):
    names = ["a_ptr", "w_ptr", "c_ptr", "counts_ptr", "idx_ptr", "M", "N", "K", "E", "num_vm", "stride_am",
             "stride_ak", "stride_we", "stride_wk", "stride_wn", "stride_cm", "sa_ptr", "sw_ptr", "stride_sam",
             "stride_sak", "stride_swe", "stride_swk", "stride_swn"]
    ptrs = {"counts_ptr": "*i32", "idx_ptr": "*i32", "sa_ptr": "*fp32", "sw_ptr": "*fp32", "c_ptr": c}
    return {n: ptrs.get(n, ab) if n.endswith("_ptr") else "i32" for n in names}


@pytest.mark.parametrize("gather,tma", [(True, False), (False, True), (True, True)])
def test_grouped_gemm_compiles_for_sm90a(gather, tma):
    import ditron
    from conftest import tma_loads
    from ditron.kernels.moe import grouped_gemm_kernel
    sig = grouped_gemm_signature()
    ck = ditron.compile(grouped_gemm_kernel, target="sm_90a", signature=sig,
                        constexprs=dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, EVEN_K=True, EP=64,
                                        GATHER=gather, TMA=tma, FP8=False, GK=128, GN=128), num_warps=8,
                        num_stages=3)
    assert "wgmma.mma_async" in ck.asm["ptx"]
    assert tma_loads(ck.asm["ptx"]) == tma


# ---------------------------------------------------------------------------
# TP MoE (kernels/moe_tp.py)
# ---------------------------------------------------------------------------

def test_ag_moe_moe_rs_layer(dist):
    # m = 5 then 1 (reusing the contexts): tiles that are not full, k = 2 pairs per token; H = 24: a column tail
    assert dist.run(B.tp_moe_layer, "bf16", [5, 1], H=24) == [4] * dist.world_size


def test_ag_moe_moe_rs_experts_without_tokens(dist):
    # 6 experts, only the first 2 chosen: 4 experts get no pair from any rank
    assert dist.run(B.tp_moe_layer, "fp16", [3], E=6, used=2, seed=4) == [2] * dist.world_size


def test_moe_ar(dist):
    assert dist.run(B.tp_moe_ar, "fp16", [3, 2]) == [2] * dist.world_size


@pytest.mark.parametrize("n,nnodes", [(1, 1), (2, 1), (3, 1), (4, 2)])
def test_tp_moe_other_worlds(dist_world, n, nnodes):
    # (4, 2): the other node's segments travel by shmem.putmem_signal_block
    d = dist_world(n, nnodes)
    assert d.run(B.tp_moe_layer, "bf16", [2], seed=2, E=2) == [2] * n
    if n in (1, 3):
        assert d.run(B.tp_moe_ar, "bf16", [1], seed=3, E=2) == [1] * n


def test_tp_moe_errors_before_launch(dist):
    msgs = dist.run(B.tp_moe_errors)[0]
    assert "x has 5 tokens; the context takes 1 .. max_m=4" in msgs["too_many"]
    assert "k=3, the context was created for topk=2" in msgs["k"]
    assert "w1 has 3 experts" in msgs["experts"]
    assert "'w1' is torch.float16" in msgs["w1_dtype"]
    assert "is not an expert id in [0, 4)" in msgs["bad_id"]
    assert "h must be" in msgs["h_rows"]
    assert "w2 must be [4, I, hidden=16]" in msgs["w2_shape"]
    assert "topk_weights must be" in msgs["weights"]
    assert "float16 or bfloat16" in msgs["ctx_dtype"]


@pytest.mark.parametrize("kernel,tma", [("ag_moe_kernel", False), ("ag_moe_kernel", True),
                                        ("moe_rs_gemm_kernel", None)])
def test_tp_moe_kernels_compile_for_sm90a(kernel, tma):
    import inspect

    import ditron
    from conftest import tma_loads
    from ditron.kernels import moe_tp
    k = getattr(moe_tp, kernel)
    params = [p for p in inspect.signature(k.fn).parameters]
    const = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, EVEN_K=True, EP=64)
    if kernel == "moe_rs_gemm_kernel":
        const.update(MULTI_NODE=False, ELEM_BYTES=2)
    else:
        const.update(TMA=tma)
    sig = {}
    for p in params:
        if p in const:
            continue
        if p.endswith("_ptr"):
            sig[p] = "*i64" if p in ("sig_ptr", "calls_ptr", "counts_ptr", "perm_ptr") else \
                ("*i32" if p == "count_ptr" else "*bf16")
        else:
            sig[p] = "i32"
    ck = ditron.compile(k, target="sm_90a", signature=sig, constexprs=const, num_warps=8, num_stages=3)
    assert "wgmma.mma_async" in ck.asm["ptx"]
    if tma is not None:
        assert tma_loads(ck.asm["ptx"]) == tma
