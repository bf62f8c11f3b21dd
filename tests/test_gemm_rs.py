"""The zoo's gemm_rs (kernels/gemm_rs.py): ``(sum over ranks of a_s @ b_s)``
reduce-scattered along M, against torch on 4 simulated ranks in CI (on GPUs
under torchrun with DITRON_TEST_BACKEND=p2p|nvshmem; see conftest.py): the
three methods (ce, scatter, pull), fp16 and bf16, per-rank operands, shapes
that are not multiples of the tile (m = 1, 5, 24 rows per rank with BLOCK_M
16: tiles straddling two or all four segments; N = 40 with BLOCK_N 16;
K = 48 with BLOCK_K 32), context reuse with a delayed rank (ce: also held
between its copies and its reduction, so the free flags are needed), a
given strided ``out`` and strided operands, 1 rank and 2 nodes ("auto" is
"scatter" there, "ce" an error), errors before launch, and the kernels
compiled for sm_90a."""
import pytest

import bodies_gemm_rs as B
from conftest import GPU_BACKEND

ON_GPU = GPU_BACKEND != "sim"
METHODS = ["ce", "scatter", "pull"]
#: columns: two tiles and a tail on the simulator (BLOCK_N 16), several and a tail on GPUs (BLOCK_N 128 / 256)
N = 808 if ON_GPU else 40
#: (m, K) per call, M = world * m; every call of one body reuses one context.  The simulator
#: interprets dl.swizzle_scatter for every tile (the bulk of its time), so each dtype gets
#: part of the shapes: m = 24 (tiles inside a segment and tiles straddling two), m = 5 and
#: m = 1 (one tile touches every segment)
SHAPES = {"fp16": [(24, 48)], "bf16": [(5, 48), (1, 48)]}
if ON_GPU:
    SHAPES = {dt: [(24, 48), (5, 48), (1, 48), (1000, 4096), (1, 64)] for dt in SHAPES}
#: tile boundaries move between calls, K even and odd
REUSE = [(1, 48), (5, 32), (1, 48), (1, 32)] * (25 if ON_GPU else 1)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("method", METHODS)
def test_gemm_rs_shapes(dist, method, dtype):
    shapes = SHAPES[dtype]
    assert dist.run(B.gemm_rs_calls, dtype, method, shapes, N) == [(len(shapes),) * 2] * dist.world_size


@pytest.mark.parametrize("method", METHODS)
def test_gemm_rs_reuse_delayed_rank(dist, method):
    # call i: rank i % world starts late, so its peers' reductions really wait
    # for its partial products (reading without waiting sees the previous
    # call's or zero rows: the check fails); per-rank operands in every call.
    # ce: that rank also holds between its copies and its reduction, so its
    # peers' next copies into its slots wait for its free flags (copying
    # without waiting overwrites the partials it has yet to read)
    hold = (0.01 if ON_GPU else 1.0) if method == "ce" else 0.0
    res = dist.run(B.gemm_rs_calls, "bf16", method, REUSE, N, seed=7, delay=0.01 if ON_GPU else 0.25, hold=hold)
    assert res == [(len(REUSE),) * 2] * dist.world_size


@pytest.mark.parametrize("method", METHODS)
def test_gemm_rs_out_and_strides(dist, method):
    assert dist.run(B.gemm_rs_out_and_strides, method) == [1] * dist.world_size


@pytest.mark.parametrize("n,nnodes", [(1, 1), (4, 2)])
def test_gemm_rs_other_worlds(dist_world, n, nnodes):
    # (4, 2): owners on the other node get their rows by shmem.putmem_signal_block;
    # the copy engine reaches this node's ranks only: "auto" is "scatter" there, "ce" an error
    d = dist_world(n, nnodes)
    for method in METHODS if nnodes == 1 else [m for m in METHODS if m != "ce"]:
        assert d.run(B.gemm_rs_calls, "bf16", method, [(5, 48), (1, 48)], N, seed=3) == [(2, 2)] * n
    auto, err = d.run(B.method_choice)[0]
    if nnodes == 1:
        assert auto == "ce" and err is None
    else:
        assert auto == "scatter"
        assert "method='ce' (copy engine) reaches this node's ranks only" in err and "use method='scatter'" in err


def test_gemm_rs_errors_before_launch(dist):
    W = dist.world_size
    msgs = dist.run(B.errors)[0]
    if W > 1:
        assert f"M={4 * W + 1} rows, not a multiple of the world size {W}" in msgs["m_not_multiple"]
    else:
        assert "m_not_multiple" not in msgs
    assert f"M={9 * W} rows, more than the context's max_m={8 * W}" in msgs["too_many_rows"]
    assert "N=24 columns, the context was created for n=16" in msgs["wrong_n"]
    assert "'a' is torch.bfloat16, the context was created for torch.float16" in msgs["a_dtype"]
    assert "'a' is torch.float32; use float16 or bfloat16" in msgs["a_fp32"]
    assert "'b' is torch.float32" in msgs["b_dtype"]
    assert "'b' has 16 rows" in msgs["b_rows"]
    assert "'a' must be a 2-D tensor" in msgs["a_1d"]
    assert "expected (4, 16)" in msgs["out_shape"]
    assert "'out' is torch.bfloat16, expected torch.float16" in msgs["out_dtype"]
    assert "float16 or bfloat16" in msgs["ctx_dtype"]
    assert "unknown method 'ring'; use one of auto, ce, scatter, pull" in msgs["ctx_method"]
    assert f"max_m={W - 1} is less than the world size {W}" in msgs["ctx_max_m"]
    assert "block_m=24 must be a power of two" in msgs["ctx_config"]


# ---------------------------------------------------------------------------
# compiled for sm_90a (no GPU needed)
# ---------------------------------------------------------------------------

_PTRS = {"a_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16", "buf_ptr": "*bf16", "cbuf_ptr": "*bf16",
         "sig_ptr": "*i64", "count_ptr": "*i32", "seg_count_ptr": "*i32", "done_ptr": "*i64", "ready_ptr": "*i64",
         "free_ptr": "*i64", "calls_ptr": "*i64", "sa_ptr": "*fp32", "sb_ptr": "*fp32"}
#: what a GPU launch specialises: sizes and strides that are multiples of 16, unit strides
_DIV16 = ("N", "K", "slot_stride", "cbuf_stride", "stride_am", "stride_bk", "stride_om")
_UNIT = ("stride_ak", "stride_bn", "stride_on")


def _ptx(kernel, constexprs, multi_node, num_warps, num_stages=1, ptrs=_PTRS, unit=_UNIT):
    import ditron
    from ditron.lowering import cuda
    names = [p for p in kernel.arg_names if p not in constexprs]
    sig = {p: "constexpr" if p in unit else ptrs.get(p, "i32") for p in names}     # indices as in the launch
    cexprs = dict(constexprs, **{p: 1 for p in unit if p in names})
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(sig) if p in _PTRS or p in _DIV16}
    with cuda.compile_variant("nvshmem" if multi_node else "p2p"):
        return ditron.compile(kernel, target="sm_90a", signature=sig, constexprs=cexprs, attrs=attrs,
                              num_warps=num_warps, num_stages=num_stages).asm["ptx"]


def _module():
    import importlib
    return importlib.import_module("ditron.kernels.gemm_rs")


def _gemm_ptx(method, multi_node, tma=False, fp8=False):
    scale = dict(SCALE=2, GK=128, GN=128, B_T=tma) if fp8 else dict(SCALE=0, GK=1, GN=1, B_T=False)
    ptrs = dict(_PTRS, a_ptr="*fp8e4nv", b_ptr="*fp8e4nv") if fp8 else _PTRS
    return _ptx(_module().gemm_rs_gemm_kernel,
                dict(PULL=method == "pull", CE=method == "ce", MULTI_NODE=multi_node, ELEM_BYTES=2, BLOCK_M=128,
                     BLOCK_N=256 if not fp8 else 128, BLOCK_K=64 if not fp8 else 128, GROUP_M=8, EVEN_K=True,
                     TMA=tma, **scale), multi_node, 8, 3, ptrs=ptrs,
                unit=("stride_ak", "stride_bk", "stride_on") if fp8 else _UNIT)     # fp8: b column-major


def test_gemm_rs_fp8_compiles_for_sm90a():
    """fp8 operands with blockwise scales: e4m3 wgmma, TMA loads of a and of b^T (K-major)."""
    ptx = _gemm_ptx("ce", False, tma=True, fp8=True)
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in ptx


def test_gemm_rs_tma_config_compiles_for_sm90a():
    """config.tma: the GEMM loads its operands through tensor descriptors."""
    ptx = _gemm_ptx("ce", False, tma=True)
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx


def _reduce_ptx(method, multi_node):
    return _ptx(_module().gemm_rs_reduce_kernel,
                dict(PULL=method == "pull", CE=method == "ce", MULTI_NODE=multi_node, WORLD=4, BLOCK_M=128,
                     RBLOCK_M=32, RBLOCK_N=128), multi_node, 4)


@pytest.mark.parametrize("method", METHODS)
def test_gemm_rs_compiles_for_sm90a(method):
    """Tensor-core GEMM, 16-byte epilogue stores, a system-scope release per
    signal, acquire polls and 16-byte loads in the reduction; no NVSHMEM on
    one node.  ce: the GEMM's per-segment count and its system-scope release
    of ``done``; the reduction's acquire polls of ``ready`` and the release of
    ``free`` on the peers."""
    gemm, red = _gemm_ptx(method, False), _reduce_ptx(method, False)
    assert "wgmma.mma_async" in gemm and "st.global.v4.b32" in gemm
    assert "atom.global.sys.acq_rel.add.u32" in gemm          # the per-row / per-segment tile count
    if method == "ce":
        assert "atom.global.sys.release.exch.b64" in gemm and "st.release.sys" not in gemm   # done[s], no peer
        assert "st.release.sys.global.b64" in red                 # free[rank] on the peers
    else:
        assert "st.release.sys.global.b64" in gemm
    assert "ld.acquire.sys.global.b64" in red and "ld.global.v4.b32" in red and "st.global.v4.b32" in red
    assert "nvshmem" not in gemm and "nvshmem" not in red


def test_gemm_rs_multi_node_compiles_for_sm90a(nvshmem_bc):
    """Owners on other nodes: NVSHMEM's block put with signal (the scatter
    GEMM: staging stores and puts; the pull reduction: peer and local loads)."""
    gemm, red = _gemm_ptx("scatter", True), _reduce_ptx("pull", True)
    assert "nvshmemi_transfer_put_signal" in gemm and "wgmma.mma_async" in gemm
    assert "ld.acquire.sys.global.b64" in red and "ld.global.v4.b32" in red
