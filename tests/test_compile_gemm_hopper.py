"""The Gluon Hopper GEMM core (kernels/gemm_hopper.py) compiles for sm_90a on a CPU into what it claims to be:
a producer warp and two consumer warpgroups (warp-specialised partitions, ``setmaxnreg``), TMA loads on
mbarriers, asynchronous ``wgmma``, a TMA-store epilogue.  And what ``tl.range(warp_specialize=True)`` does to the
``tl`` core on sm_90 (issue 52, item 1): a producer / two-consumer split at ``num_warps=4``, nothing at 8.

The GPU side (correctness, bit equality with the tl twin, timings against cuBLAS) is bench/gemm_core_levers.sh.
"""
import dataclasses
import re

import pytest
import torch

import ditron
from ditron.kernels import gemm as G
from ditron.kernels import gemm_hopper as H

HC = H.HopperGemmConfig

#: the configs bench/gemm_core_levers.py times (and the wgmma each consumer warpgroup issues)
CONFIGS = [
    (HC(128, 256, 64, stages=3, mode="coop"), "m64n256k16"),
    (HC(128, 256, 64, stages=4, mode="coop", epilogue_split=2), "m64n256k16"),
    (HC(256, 128, 64, stages=3, mode="coop"), "m64n128k16"),
    (HC(128, 128, 64, stages=4, mode="pingpong"), "m64n128k16"),
    (HC(128, 128, 64, stages=6, mode="pingpong", epilogue_split=2), "m64n128k16"),
    (HC(64, 256, 64, stages=4, mode="pingpong"), "m64n256k16"),
]

SMEM_LIMIT = 232448          # sm_90: 227 KiB per block
#: each sweep below compiles every case under Triton 3.6 (the GPU machines' Triton, which CI runs too) and its first
#: case, the default config, under a newer one (CI's time: a compile with ptxas -v is 2-10 s on its 2 cores; the
#: structure checked does not depend on the Triton version beyond what one config shows), as
#: tests/test_compile_attention_hopper.py does
GPU_TRITON = ditron._compat.TRITON_VERSION[:2] == (3, 6)


def _sweep(cases):
    return list(cases) if GPU_TRITON else list(cases)[:1]


def _count(pattern, text):
    return len(re.findall(pattern, text))


@pytest.mark.parametrize("cfg,wgmma", _sweep(CONFIGS), ids=[c.label().replace(" ", "-") for c, _ in _sweep(CONFIGS)])
def test_gluon_core_compiles_warp_specialised(cfg, wgmma):
    ck = H.compile_sm90(cfg, torch.bfloat16)
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    # one warp_specialize region: the default partition (consumer 0) and two workers (consumer 1, the producer)
    assert _count(r"ttg\.warp_specialize\(", ttgir) == 1
    assert re.search(r"partition0\(.*\) num_warps\(4\)", ttgir) and re.search(r"partition1\(.*\) num_warps\(1\)", ttgir)
    assert f"requestedRegisters = array<i32: {cfg.consumer_regs}, {cfg.producer_regs}>" in ttgir
    # 4 + 4 + 1 warps, padded to three warpgroups; registers moved from the producer to the consumers
    assert ".reqntid 384" in ptx
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{cfg.consumer_regs};", ptx)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{cfg.producer_regs};", ptx)
    # asynchronous wgmma of the expected shape in both consumers, TMA loads completing on mbarriers, TMA stores
    assert _count(rf"wgmma\.mma_async\.sync\.aligned\.{wgmma}\.f32\.bf16\.bf16", ptx) >= 2
    assert "wgmma.wait_group.sync.aligned 1" in ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::(cluster|cta)\.global\.mbarrier::complete_tx::bytes", ptx)
    # one TMA store per consumer and epilogue slice
    assert _count(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.bulk_group", ptx) == 2 * cfg.epilogue_split
    assert "fence.proxy.async.shared::cta" in ptx
    assert _count(r"mbarrier\.try_wait\.parity", ptx) >= 2
    # shared memory: the ring, two staging buffers and the barriers, within the limit
    assert cfg.smem_bytes() <= ck.metadata.shared <= SMEM_LIMIT


@pytest.mark.parametrize("cfg", _sweep([H.DEFAULT_CONFIG, HC(128, 256, 64, stages=4, mode="coop", epilogue_split=2)]),
                         ids=["default", "epi2"][:2 if GPU_TRITON else 1])
def test_gluon_core_compiles_fp16(cfg):
    ptx = H.compile_sm90(cfg, torch.float16).asm["ptx"]
    assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.f16\.f16", ptx) >= 2
    assert ".reqntid 384" in ptx


_TL_SIG = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32", "stride_cm": "i32",
           "stride_cn": "i32", "sa_ptr": "*fp32", "sb_ptr": "*fp32", "stride_sam": "i32", "stride_sak": "i32",
           "stride_sbk": "i32", "stride_sbn": "i32"}      # the fp8 scale arguments (unused at SCALE=0, the default)


@pytest.mark.parametrize("num_warps", [4, 8])
def test_tl_warp_specialize_on_sm90(num_warps):
    """Triton's Hopper warp-specialisation pass (3.6 and 3.9) splits the tl core's persistent loop into a
    producer and two consumer warpgroups only at num_warps=4; at 8 it leaves the kernel as it is (the
    2026-12-06 H100 probe timed 8 warps: "changes nothing measurable")."""
    c = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, EVEN_K=True, TMA=True, FLATTEN=False, SUBTILE=1,
             WARP_SPEC=True)
    ck = ditron.compile(G.gemm_kernel, target="sm_90a", signature=_TL_SIG, constexprs=c, num_warps=num_warps,
                        num_stages=3)
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    assert "tt.warp_specialize" in ck.asm["ttir"]          # the request reaches Triton either way
    if num_warps == 4:
        assert "ttg.warp_specialize(" in ttgir
        assert ".reqntid 384" in ptx and "setmaxnreg" in ptx
        assert _count(r"wgmma\.mma_async", ptx) >= 2
    else:
        assert "ttg.warp_specialize(" not in ttgir
        assert ".reqntid 256" in ptx and "setmaxnreg" not in ptx


def test_config_errors():
    E = ditron.DitronError
    with pytest.raises(E, match="mode='split'"):
        HC(mode="split").validate()
    with pytest.raises(E, match="shared memory"):
        HC(128, 256, 64, stages=4, mode="coop").validate()          # 4 x 48 KiB ring + 2 x 32 KiB staging
    with pytest.raises(E, match="32 rows"):
        HC(64, 128, 64, mode="coop").validate()
    with pytest.raises(E, match="registers"):
        HC(128, 256, 64, stages=2, mode="pingpong").validate()     # 128 x 256 fp32 in one warpgroup
    with pytest.raises(E, match="stages=1"):
        HC(stages=1).validate()
    with pytest.raises(E, match="block_n=96"):
        HC(128, 96, 64).validate()
    with pytest.raises(E, match="epilogue_split=4"):
        HC(epilogue_split=4).validate()
    assert HC(128, 256, 64, stages=4, mode="coop", epilogue_split=2).validate()
    with pytest.raises(E, match="consumer_regs=230"):
        HC(consumer_regs=230).validate()
    for cfg, _ in CONFIGS:
        assert cfg.validate() is cfg


@pytest.mark.parametrize("target", ["gfx942", "sm_80", "sim"])
def test_other_targets_are_refused(target):
    with pytest.raises(ditron.DitronError, match="sm_90a only.*ditron.kernels.gemm.gemm_kernel"):
        H.compile_sm90(target=target)


def test_refuses_cpu_and_names_the_twin():
    a = torch.randn(64, 32, dtype=torch.bfloat16)
    b = torch.randn(32, 48, dtype=torch.bfloat16)
    with pytest.raises(ditron.DitronError, match="tl twin.*ditron.kernels.gemm.matmul"):
        H.matmul_hopper(a, b)
    with pytest.raises(ditron.DitronError, match="argument 'b' is torch.float16"):
        H.matmul_hopper(a, b.half())
    assert not H.supported("cpu")


@pytest.mark.parametrize("cfg", [c for c, _ in CONFIGS], ids=[c.label().replace(" ", "-") for c, _ in CONFIGS])
def test_twin_config_has_the_same_tiles_and_k_order(cfg):
    tw = H.twin_config(cfg).validate()
    assert (tw.block_m, tw.block_n, tw.block_k, tw.group_m) == (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m)
    assert tw.tma and not tw.flatten


def test_tile_order_is_swizzle_2d():
    """The Gluon core's tile order (``_tile_mn``) is ``dl.swizzle_2d``'s: the same formula, checked here on the
    host against the ``tl`` version run by Triton's interpreter semantics (plain integers)."""
    import ditron.language.swizzle as S
    src = S.swizzle_2d.fn if hasattr(S.swizzle_2d, "fn") else S.swizzle_2d
    ref_fn = getattr(src, "fn", src)
    mine = H._tile_mn.fn

    class _Min:                       # gl.minimum / tl.minimum on Python ints
        @staticmethod
        def minimum(x, y):
            return min(x, y)
    g_m, t_m = mine.__globals__["gl"], ref_fn.__globals__["tl"]
    mine.__globals__["gl"], ref_fn.__globals__["tl"] = _Min, _Min
    try:
        for num_pid_m, num_pid_n, group in ((64, 22, 8), (7, 5, 3), (1, 9, 8), (13, 1, 4)):
            got = [mine(t, num_pid_m, num_pid_n, group) for t in range(num_pid_m * num_pid_n)]
            want = [ref_fn(t, num_pid_m, num_pid_n, group) for t in range(num_pid_m * num_pid_n)]
            assert got == want
            assert sorted(got) == [(m, n) for m in range(num_pid_m) for n in range(num_pid_n)]
    finally:
        mine.__globals__["gl"], ref_fn.__globals__["tl"] = g_m, t_m


def test_twins_compile_to_wgmma():
    """Every twin the GPU twin test and the bench launch compiles for sm_90a (TMA loads, wgmma); the default's
    twin under a newer Triton than 3.6."""
    sig = dict(_TL_SIG)
    for cfg in dict.fromkeys(H.twin_config(c) for c, _ in _sweep(CONFIGS)):
        ck = ditron.compile(G.gemm_kernel, target="sm_90a", signature=sig, num_warps=cfg.num_warps,
                            num_stages=cfg.num_stages,
                            constexprs=dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                            GROUP_M=cfg.group_m, EVEN_K=False, TMA=True, FLATTEN=False, SUBTILE=1,
                                            WARP_SPEC=False))
        ptx = ck.asm["ptx"]
        assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx, cfg
        assert ck.metadata.shared <= SMEM_LIMIT, cfg


# ---------------------------------------------------------------------------
# fp8 (issue 55): scaled_gemm_ws_kernel
# ---------------------------------------------------------------------------

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2

#: the fp8 configs bench/fp8_gluon.py times (and the wgmma each consumer warpgroup issues)
FP8_CONFIGS = [
    (H.fp8_default_config(8192, 4096, 4096, 132, torch.bfloat16), "m64n128k32"),
    (HC(128, 128, 128, stages=4, mode="coop"), "m64n128k32"),
    (HC(64, 128, 128, stages=6, mode="pingpong"), "m64n128k32"),
    (HC(64, 128, 128, stages=4, mode="pingpong"), "m64n128k32"),
]


def _ptxas_log(ptx):
    """``ptxas -v`` of the PTX (Triton's bundled ptxas): register, spill and wgmma-serialisation notes."""
    import subprocess
    import tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.ptx", "w") as f:
            f.write(ptx)
        return subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                              capture_output=True, text=True, check=True).stderr


#: (config index, output dtype, scales): every config, output dtype and scale recipe, both modes with fp32 output
#: (its stage limit) -- a cover of the 3 x 2 x 2 product
FP8_CASES = [(0, torch.bfloat16, "row"), (0, torch.float32, "tensor"), (1, torch.float32, "row"),
             (2, torch.bfloat16, "tensor"), (2, torch.float32, "row")]


@pytest.mark.parametrize("i,out,scales", _sweep(FP8_CASES), ids=[
    f"{FP8_CONFIGS[i][0].label().replace(' ', '-')}-{'bf16' if o == torch.bfloat16 else 'fp32'}-{sc}"
    for i, o, sc in _sweep(FP8_CASES)])
def test_gluon_fp8_compiles_warp_specialised(i, out, scales):
    """The fp8 Gluon core: e4m3 x e4m3 wgmma on K-major A and (permuted) B tiles, TMA loads of a and b^T, the
    producer / two-consumer split, the fp32 promotion (each step's wgmma waited for, then added in fp32),
    no spills and no wgmma serialisation by ptxas, shared memory within an H100's."""
    cfg, wgmma = FP8_CONFIGS[i]
    if out == torch.float32:
        cfg = dataclasses.replace(cfg, stages=min(cfg.stages, 5 if cfg.mode == "coop" else 6))
    ck = H.compile_sm90(cfg, E4, M=8192, N=4096, K=4096, out_dtype=out, scales=scales)
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    assert _count(r"ttg\.warp_specialize\(", ttgir) == 1
    assert re.search(r"partition0\(.*\) num_warps\(4\)", ttgir) and re.search(r"partition1\(.*\) num_warps\(1\)", ttgir)
    assert "memdesc_trans" in ttgir                                 # B's [BN, BK] slot read as [BK, BN]
    assert ".reqntid 384" in ptx and "setmaxnreg.inc.sync.aligned.u32" in ptx
    assert _count(rf"wgmma\.mma_async\.sync\.aligned\.{wgmma}\.f32\.e4m3\.e4m3", ptx) >= 2
    assert "wgmma.wait_group.sync.aligned 0" in ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::(cluster|cta)\.global\.mbarrier::complete_tx::bytes", ptx)
    assert _count(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.bulk_group", ptx) == 2 * cfg.epilogue_split
    assert _count(r"add\.f32", ptx) >= 2 * 64                         # the promotion: acc + part, 64 per thread
    log = _ptxas_log(ptx)
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "serialized" not in log and "C7514" not in log, log       # no wgmma serialisation
    elem = torch.empty((), dtype=out).element_size()
    assert cfg.smem_bytes(1, elem) <= ck.metadata.shared <= SMEM_LIMIT


#: blockwise (DeepSeek-V3) scales, the serial consumer (each step's wgmma waited for before its promotion): the
#: default config with ``block_overlap=False`` (128 x 128 groups: one scale_b per step), and pingpong with 128 x 64
#: groups (two column groups per tile: per-column scale_b loads; such configs always take the serial loop) and fp32
#: out
FP8_BLOCK_SERIAL = [(dataclasses.replace(FP8_CONFIGS[0][0], block_overlap=False), (128, 128), torch.bfloat16, 1, 2),
                    (FP8_CONFIGS[3][0], (128, 64), torch.float32, 32, 64)]


@pytest.mark.parametrize("cfg,block,out,sb_loads,muls", _sweep(FP8_BLOCK_SERIAL),
                         ids=["default-serial-128x128-bf16", "pingpong-128x64-fp32"][:len(_sweep(FP8_BLOCK_SERIAL))])
def test_gluon_fp8_blockwise_serial_compiles(cfg, block, out, sb_loads, muls):
    """Blockwise scales on the fp8 Gluon core, serial consumer: e4m3 wgmma; each K step's scales loaded between
    issuing its wgmma and waiting for it (2 rows of scale_a per thread; scale_b one scalar when the tile's columns
    lie in one group, else 32 columns); per step the scales' product (``muls`` fp32 multiplies per thread: one per
    row where scale_b is one scalar, one per element otherwise) and per accumulator element one multiply-add
    (``acc + part * (sa * sb)``: the tl core's ``scale_step``, contracted as there); no epilogue scale; no spills
    and no wgmma serialisation by ptxas."""
    assert not H.promotion_overlap(cfg, block)
    ck = H.compile_sm90(cfg, E4, M=8192, N=4096, K=4096, out_dtype=out, scales="block", scale_block=block)
    ptx = ck.asm["ptx"]
    assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3", ptx) >= 2
    assert "wgmma.wait_group.sync.aligned 1" not in ptx
    # per consumer (2) and thread: 64 accumulator elements, 2 rows of scale_a and sb_loads of scale_b
    assert _count(r"fma\.rn\.f32", ptx) == 2 * 64 and _count(r"mul\.f32", ptx) == 2 * muls
    assert _count(r"ld\.global\.b32", ptx) == 2 * (2 + sb_loads)
    body = ptx[ptx.index("wgmma.mma_async"):]
    issued, waited = body.index("wgmma.commit_group"), body.index("wgmma.wait_group.sync.aligned 0")
    assert _count(r"ld\.global\.b32", body[issued:waited]) == 2 + sb_loads    # the scales load under the MMA
    log = _ptxas_log(ptx)
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "serialized" not in log and "C7514" not in log and "C7515" not in log, log


#: the overlapped blockwise consumer (``block_overlap``, the default): coop 128 x 128 (bf16 and fp32 out), pingpong
FP8_BLOCK_OVERLAP = [(FP8_CONFIGS[0][0], torch.bfloat16), (dataclasses.replace(FP8_CONFIGS[0][0], stages=5),
                                                           torch.float32), (FP8_CONFIGS[3][0], torch.bfloat16)]


@pytest.mark.parametrize("cfg,out", _sweep(FP8_BLOCK_OVERLAP),
                         ids=["default-bf16", "coop-s5-fp32", "pingpong-s4-bf16"][:len(_sweep(FP8_BLOCK_OVERLAP))])
def test_gluon_fp8_blockwise_overlapped_compiles(cfg, out):
    """The overlapped blockwise consumer (kernels/gemm_hopper.py ``_overlap_mainloop``) compiles to what it
    claims: step k + 1's wgmma is issued before step k's promotion and runs under it.  In the PTX: every
    ``wgmma.wait_group 1`` (step k retired, k + 1 in flight) is followed by step k's whole promotion (64
    multiply-adds per thread) before the next ``wgmma.mma_async`` -- LLVM does not sink it below the next issue
    (which would copy the partial sum the next wgmma overwrites); the prologue, the two-step loop body and the
    even tail issue, the tails wait for all (``wait_group 0``); and ptxas neither serialises the wgmmas (C7514 /
    C7515) nor spills with three 64 x 128 fp32 accumulators per consumer.  The promotion is the serial loop's,
    element for element (the scales' product once per row where the step loads them, one multiply-add per
    element, one scalar scale_b load per step)."""
    assert H.promotion_overlap(cfg, (128, 128))
    ck = H.compile_sm90(cfg, E4, M=8192, N=4096, K=4096, out_dtype=out, scales="block")
    ptx = ck.asm["ptx"]
    # per consumer: prologue, loop body (2), even tail = 4 issues of 4 x k32
    assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3", ptx) == 2 * 4 * 4
    waits1 = [m.end() for m in re.finditer(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)]
    assert len(waits1) == 2 * 3                       # loop body (2) and the even tail, per consumer
    assert _count(r"wgmma\.wait_group\.sync\.aligned 0;", ptx) == 2 * 2      # the two tails
    for w in waits1:
        nxt = ptx.find("wgmma.mma_async", w)
        between = ptx[w:nxt if nxt >= 0 else len(ptx)]
        assert _count(r"fma\.rn\.f32", between) >= 64, between[:2000]
    # 5 promotions per consumer in the source (loop body 2, even tail 2, odd tail 1; LLVM may sink the two tails'
    # last ones into one), each 64 multiply-adds; the scales' product where they are loaded (prologue, loop 2,
    # even tail), 2 rows per thread
    assert _count(r"fma\.rn\.f32", ptx) in (2 * 4 * 64, 2 * 5 * 64) and _count(r"mul\.f32", ptx) == 2 * 4 * 2
    # scales: 2 rows of scale_a and one scale_b per step; 4 step loads per consumer (prologue, loop 2, even tail)
    assert _count(r"ld\.global\.b32", ptx) == 2 * 4 * 3
    log = _ptxas_log(ptx)
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "serialized" not in log and "C7514" not in log and "C7515" not in log, log
    elem = torch.empty((), dtype=out).element_size()
    assert cfg.smem_bytes(1, elem) <= ck.metadata.shared <= SMEM_LIMIT


def test_gluon_fp8_block_overlap_choice():
    """Blockwise: the overlapped consumer runs where the tile's columns lie in one scale_b group, with
    ``block_overlap``; per-tensor / rowwise: with ``promote_overlap``; both on by default."""
    cfg = FP8_CONFIGS[0][0]
    assert cfg.block_overlap and H.promotion_overlap(cfg, (128, 128)) and H.promotion_overlap(cfg, (128, 256))
    assert not H.promotion_overlap(cfg, (128, 64))
    assert not H.promotion_overlap(dataclasses.replace(cfg, block_overlap=False), (128, 128))
    assert H.scale_constexprs(True, True, cfg, (128, 128))["PROMOTE_OVERLAP"]
    assert cfg.promote_overlap and H.promotion_overlap(cfg, None)
    assert H.scale_constexprs(True, True, cfg, None)["PROMOTE_OVERLAP"]
    ser = dataclasses.replace(cfg, promote_overlap=False)
    assert not H.promotion_overlap(ser, None) and not H.scale_constexprs(True, True, ser, None)["PROMOTE_OVERLAP"]
    assert H.promotion_overlap(ser, (128, 128))            # blockwise follows block_overlap
    assert not H.promotion_overlap(FP8_CONFIGS[2][0], None)    # pingpong: the serial promotion (see promotion_overlap)
    assert ser.label().endswith(" pserial") and dataclasses.replace(cfg, block_overlap=False).label().endswith(" serial")
    assert cfg.label() == "gluon coop 128x128x128 s6"       # the bf16 tables' names do not change
    with pytest.raises(ditron.DitronError, match="three 64 x 256 fp32 accumulators"):
        HC(128, 256, 128, stages=2).validate(elem=1, out_elem=2, overlap=True)


@pytest.mark.parametrize("scales", ["row", "tensor"])
def test_gluon_fp8_rowwise_overlapped_promotion_compiles(scales):
    """``promote_overlap`` (the default): per-tensor / rowwise fp8 on the overlapped consumer (``_overlap_mainloop`` without
    scales): the same wgmma issue / wait pattern as blockwise (4 issues of 4 x k32 per consumer, ``wait_group 1``
    in the loop body and the even tail, ``wait_group 0`` in the two tails), each ``wait_group 1`` followed by its
    promotion (64 fp32 adds per thread) before the next issue (4 or 5 promotions per consumer in the PTX: see
    the blockwise test); no scale loads in the mainloop (the epilogue
    scales: 2 rows + 32 columns rowwise, one element each per-tensor); no spills, no wgmma serialisation."""
    cfg = FP8_CONFIGS[0][0]
    ptx = H.compile_sm90(cfg, E4, M=8192, N=4096, K=4096, scales=scales).asm["ptx"]
    assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3", ptx) == 2 * 4 * 4
    waits1 = [m.end() for m in re.finditer(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)]
    assert len(waits1) == 2 * 3 and _count(r"wgmma\.wait_group\.sync\.aligned 0;", ptx) == 2 * 2
    for w in waits1:
        nxt = ptx.find("wgmma.mma_async", w)
        assert _count(r"add\.f32", ptx[w:nxt if nxt >= 0 else len(ptx)]) >= 64
    assert _count(r"add\.f32", ptx) in (2 * 4 * 64, 2 * 5 * 64) and _count(r"fma\.rn\.f32", ptx) == 0
    assert _count(r"ld\.global\.b32", ptx) == 2 * ((2 + 32) if scales == "row" else 2)
    log = _ptxas_log(ptx)
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "serialized" not in log and "C7514" not in log and "C7515" not in log, log


def test_gluon_fp8_e5m2_and_pingpong_4_stages():
    ptx = H.compile_sm90(FP8_CONFIGS[3][0], E5, b_dtype=E4, scales="row").asm["ptx"]
    assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e5m2\.e4m3", ptx) >= 2
    ptx = H.compile_sm90(FP8_CONFIGS[1][0], E5, scales="tensor", out_dtype=torch.float16).asm["ptx"]
    assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e5m2\.e5m2", ptx) >= 2


def test_gluon_fp8_config_errors():
    E = ditron.DitronError
    with pytest.raises(E, match="two 64 x 256 fp32 accumulators"):
        HC(128, 256, 128, stages=2).validate(elem=1, out_elem=2)
    with pytest.raises(E, match="32 <= block_k <= 128"):
        HC(128, 128, 256, stages=2).validate(elem=1, out_elem=2)
    with pytest.raises(E, match="shared memory"):
        HC(128, 128, 128, stages=6).validate(elem=1, out_elem=4)       # 6 x 32 KiB ring + 2 x 32 KiB fp32 staging
    for out in (torch.bfloat16, torch.float16, torch.float32):
        cfg = H.fp8_default_config(8192, 4096, 4096, 132, out)
        assert cfg.validate(elem=1, out_elem=torch.empty((), dtype=out).element_size()) is cfg
    assert H.fp8_default_config(8192, 4096, 4096, 132, group_k=64).block_k == 64
    for cfg, _ in FP8_CONFIGS:
        tw = H.twin_config(cfg).validate()
        assert (tw.block_m, tw.block_n, tw.block_k) == (cfg.block_m, cfg.block_n, cfg.block_k)


def test_scaled_matmul_hopper_refuses_cpu_and_names_the_twin():
    a = torch.randn(64, 32).to(E4)
    b = torch.randn(48, 32).to(E4).t()
    s = torch.ones(())
    with pytest.raises(ditron.DitronError, match="tl twin.*core='gluon'"):
        H.scaled_matmul_hopper(a, b, s, s)
    with pytest.raises(ditron.DitronError, match="fp16 / bf16: matmul_hopper"):
        H.scaled_matmul_hopper(a.bfloat16(), b.bfloat16(), s, s)
    with pytest.raises(ditron.DitronError, match="'b' must be column-major"):
        H.scaled_matmul_hopper(a, b.contiguous(), s, s)
