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


def test_grouped_gemm_compiles_for_sm90a():
    import ditron
    from ditron.kernels.moe import grouped_gemm_kernel
    names = ["a_ptr", "w_ptr", "c_ptr", "counts_ptr", "idx_ptr", "M", "N", "K", "E", "num_vm", "stride_am",
             "stride_ak", "stride_we", "stride_wk", "stride_wn", "stride_cm"]
    sig = {n: ("*i32" if n in ("counts_ptr", "idx_ptr") else "*bf16") if n.endswith("_ptr") else "i32"
           for n in names}
    ck = ditron.compile(grouped_gemm_kernel, target="sm_90a", signature=sig,
                        constexprs=dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, EVEN_K=True, EP=64,
                                        GATHER=True), num_warps=8, num_stages=3)
    assert "wgmma.mma_async" in ck.asm["ptx"]
