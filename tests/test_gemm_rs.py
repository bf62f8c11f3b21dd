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
# core="gluon" (kernels/gemm_rs_hopper.py): on GPUs the warp-specialised Gluon GEMM of the copy-engine method
# (m not a multiple of its 128-row tiles: blocks straddling segments; N a multiple of 8 with a tail of the
# 256-column tile; K with a tail), on the simulator its tl twin (the tl GEMM, small tiles)
# ---------------------------------------------------------------------------

GLUON_SHAPES = ([(24, 48), (200, 96), (1, 64), (1000, 4096), (24, 48)] if ON_GPU else [(24, 48), (5, 48)])


def _gluon_calls(d):
    res = d.run(B.gemm_rs_calls, "bf16", "ce", GLUON_SHAPES, N, seed=11, delay=0.01 if ON_GPU else 0.25,
                core="gluon")
    return res == [(len(GLUON_SHAPES),) * 2] * d.world_size


@pytest.mark.parametrize("n", [1, 3])
def test_gemm_rs_gluon_core(dist_world, n):
    assert _gluon_calls(dist_world(n))


def test_gemm_rs_gluon_core_on_the_job_world(dist):
    # the suite's world (4 simulated ranks; on GPUs whatever torchrun started)
    assert _gluon_calls(dist)


def test_gemm_rs_gluon_matches_its_twin(_gpu_dist):
    # GPUs only (the simulator runs the twin for both): the Gluon GEMM and the tl GEMM of the twin config agree
    # bit for bit through the whole op
    assert _gpu_dist.run(B.gluon_matches_twin, GLUON_SHAPES, N) == [len(GLUON_SHAPES)] * _gpu_dist.world_size


def test_gemm_rs_gluon_errors_before_launch(dist):
    msgs = dist.run(B.gluon_errors)[0]
    assert "core='cublas'; use one of tl, gluon" in msgs["core"]
    assert ("core='gluon' runs the copy-engine protocol (one node, method='ce'); this context's method is "
            "'scatter': use core='tl'") in msgs["gluon_scatter"]
    assert msgs["gluon_fp32"] is None           # fp8 operands writing float32 (tests/test_fp8.py)
    assert "gluon_config applies to core='gluon'" in msgs["gluon_config_tl"]
    assert "gluon_config must be a ditron.kernels.gemm_hopper.HopperGemmConfig" in msgs["gluon_config_type"]
    # fp8 operands run the Gluon core's fp8 path (tests/test_fp8.py), which takes b = w.t() (column-major)
    assert "'b' must be column-major" in msgs["gluon_fp8_call"] and "core='tl'" in msgs["gluon_fp8_call"]


def _gluon_signal_model(M, N, W, me, BM, BN, P, pingpong, rng):
    """A host model of the Gluon GEMM's copy-engine signals (kernels/gemm_hopper.py ``_consumer`` /
    ``_signal_segments``, the same arithmetic line by line): the blocks each consumer of each program stores, in its
    tile order (``dl.swizzle_scatter``'s host twin), interleaved at random; checks that every peer segment's
    ``done`` is raised exactly once, only after every block of its rows is stored, and never the own segment's."""
    from ditron.language.swizzle import swizzle_scatter_py
    SUB = BM if pingpong else BM // 2
    m = M // W
    npm, npn = -(-M // BM), -(-N // BN)
    seqs = []
    for p in range(P):
        for cid in range(2):
            tiles = range(p + cid * P, npm * npn, 2 * P) if pingpong else range(p, npm * npn, P)
            row0 = 0 if pingpong else cid * SUB
            seq = []
            for t in tiles:
                pid_m, pid_n = swizzle_scatter_py(t, M, N, BM, BN, me, W, 1, 8)
                seq.append((pid_m * BM + row0, pid_n))
            seqs.append(seq)
    stored, count, done = set(), [0] * W, [0] * W
    while any(seqs):
        seq = rng.choice([q for q in seqs if q])
        r0, pid_n = seq.pop(0)
        assert (r0, pid_n) not in stored
        stored.add((r0, pid_n))
        if 0 <= r0 < M:                                   # _signal_segments
            for seg in range(r0 // m, (min(r0 + SUB, M) - 1) // m + 1):
                if seg != me:
                    c = count[seg]
                    count[seg] += 1
                    blocks = (seg * m + m - 1) // SUB - (seg * m) // SUB + 1
                    if c == blocks * npn - 1:
                        count[seg] = 0
                        assert not done[seg], f"segment {seg} signalled twice"
                        need = {(j * SUB, n) for j in range(seg * m // SUB, (seg * m + m - 1) // SUB + 1)
                                for n in range(npn)}
                        assert need <= stored, f"segment {seg} signalled before {sorted(need - stored)[:3]}"
                        done[seg] = 1
    assert done == [int(seg != me) for seg in range(W)] and count == [0] * W
    assert {(j * SUB, n) for j in range(-(-M // SUB)) for n in range(npn)} <= stored     # every row block


def test_gemm_rs_gluon_signal_model():
    """The block counts' thresholds: m not a multiple of the block (blocks straddling segments, several segments
    in one block), coop (64-row blocks of 128-row tiles) and ping-pong, fewer and more programs than tiles."""
    import random
    rng = random.Random(52)
    for W in (1, 2, 3, 4):
        for m in (1, 5, 64, 130):
            for BM, pingpong in ((128, False), (128, True), (64, True)):
                for P in (1, 3):
                    for me in range(W):
                        _gluon_signal_model(W * m, 200, W, me, BM, 64, P, pingpong, rng)


def test_gemm_rs_gluon_check_applies():
    """What the Gluon GEMM refuses per call on a GPU, each named (here on CPU tensors: the device comes last)."""
    import torch
    import ditron
    from ditron.kernels import gemm_rs_hopper as RH

    def why(a, b, N):
        with pytest.raises(ditron.DitronError) as info:
            RH.check_applies(None, a, b, N)
        assert "gemm_rs: core='gluon' cannot take this call" in str(info.value)
        assert "create the context with core='tl'" in str(info.value)
        return str(info.value)

    t = lambda *s: torch.empty(*s, dtype=torch.bfloat16)            # noqa: E731
    assert "a and b must be row-major" in why(t(64, 32), t(16, 32).t(), 16)
    assert "TMA needs 16-byte aligned bases and rows" in why(t(64, 12), t(12, 16), 16)
    assert "N=20: the partial product's rows must be 16-byte aligned" in why(t(64, 32), t(32, 20), 20)
    assert "it runs on Hopper (sm_90) GPUs only" in why(t(64, 32), t(32, 16), 16)


@pytest.mark.parametrize("mode,split", [("coop", 1), ("pingpong", 2)])
def test_gemm_rs_gluon_compiles_for_sm90a(mode, split):
    """The Gluon GEMM of the copy-engine method: warp-specialised partitions, wgmma, TMA stores into cbuf; per
    block, after the staging buffer's store wait, the full completion wait of the bulk stores (not ``.read``),
    the async-proxy fence and the partition's barrier, then the one thread's acq_rel count and release of
    ``done[s]``; no program-wide barrier or dl.wait / dl.notify inside the partitions."""
    import re
    from conftest import code_lines
    from ditron.kernels import gemm_hopper as H, gemm_rs_hopper as RH
    cfg = H.HopperGemmConfig(block_m=128, block_n=256 if mode == "coop" else 128, mode=mode, epilogue_split=split)
    ck = RH.compile_sm90(cfg)
    ptx, ttgir, ir = ck.asm["ptx"], ck.asm["ttgir"], ck.asm["dist_ir"]
    assert "ttg.warp_specialize" in ttgir and "setmaxnreg" in ptx and "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx              # TMA stores of C
    lines = code_lines(ptx)
    seq = [i for i, ln in enumerate(lines) if re.match(r"(cp\.async\.bulk\.wait_group 0;|fence\.proxy\.async\.global;"
                                                      r"|bar\.sync\s+\d+, 128;|@%p\d+ atom\.global\.sys\.(acq_rel\.add|"
                                                      r"release\.exch))", ln)]
    kinds = [lines[i].split()[0] if not lines[i].startswith("@") else lines[i].split()[1] for i in seq]
    # each of the three places that signal (in each consumer: at the next tile's epilogue and after the loop)
    # has wait_group 0, then the fence, then a partition barrier, then the count, then the release
    pubs = [k for k, x in enumerate(kinds) if x == "cp.async.bulk.wait_group"]
    assert len(pubs) >= 3, kinds
    for k in pubs:
        rest = kinds[k:]
        assert rest[1] == "fence.proxy.async.global;" and rest[2] == "bar.sync", rest[:6]
        add = rest.index("atom.global.sys.acq_rel.add.u32")
        assert "atom.global.sys.release.exch.b64" in rest[add:], rest
    assert "bar.sync \t0;" not in ptx and not re.search(r"bar\.sync\s+0;", ptx)   # no program-wide barrier
    assert "dist.wait(" not in ir and "dist.notify(" not in ir


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
