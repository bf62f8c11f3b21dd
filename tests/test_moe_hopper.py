"""grouped_gemm(core="gluon"): the MoE grouped GEMM on the Gluon Hopper core (kernels/moe_hopper.py).

On the simulator ``core="gluon"`` runs the tl twin after the Gluon path's checks: odd counts with zeros, an expert
with more rows than a 128-row tile, one expert, N and K tails, rows past ``sum(counts)`` untouched, against the fp32
reference.  For sm_90a (a CPU compile): the warp-specialised structure -- one producer warp, two consumer
warpgroups with ``setmaxnreg``, asynchronous ``wgmma``, 3-D TMA loads of the experts' weights on mbarriers, TMA
stores and the masked store of an expert's partial block -- and no ``wgmma`` serialisation by ptxas.  On GPUs
(torchrun, DITRON_TEST_BACKEND=p2p|nvshmem): the Gluon kernel against the reference and bit for bit against the
tl twin (``test_grouped_gemm_gluon_matches_twin_on_gpu``).
"""
import re

import pytest
import torch

import bodies_moe as B
import ditron
from ditron.kernels import gemm_hopper as H

#: the sm_90a compile tests below compile every case under Triton 3.6 (the GPU machines' Triton, which CI runs too)
#: and the default one under a newer Triton (CI's time: 4-9 s a compile with ptxas -v on its 2 cores), as
#: tests/test_compile_attention_hopper.py does
GPU_TRITON = ditron._compat.TRITON_VERSION[:2] == (3, 6)

#: counts: zeros first / middle / last and tile tails; an expert with more rows than a tile (128); one expert
CASES = [[3, 0, 17, 5, 0], [130, 0, 1], [200], [0, 0, 0]]
GPU_CASES = CASES + [[1, 2, 0, 0, 31, 1, 0, 9], [513, 7, 0, 128, 256, 1], [0] * 63 + [1000]]


def test_grouped_gemm_gluon_twin_on_the_simulator(dist_world):
    # K = 72: a tail of the 64-wide K step; N = 40: a tail of the 256-wide N tile
    assert dist_world(1).run(B.grouped_gemm_gluon_cases, "bf16", CASES, 72, 40) == [2 * len(CASES)]


def test_grouped_gemm_gluon_twin_pingpong_fp16(dist_world):
    cfg = H.HopperGemmConfig(128, 128, 64, stages=4, mode="pingpong")
    assert dist_world(1).run(B.grouped_gemm_gluon_cases, "fp16", CASES[:2], 48, 24, gluon_config=cfg,
                             twin_equal=False) == [2]


def test_grouped_gemm_gluon_matches_twin_on_gpu(_gpu_dist):
    # GPUs only (the simulator runs the twin for both): the Gluon kernel against the reference and bit for bit
    # against the tl twin, both configs, both dtypes, N / K tails and aligned shapes
    pp = H.HopperGemmConfig(128, 128, 64, stages=4, mode="pingpong")
    split = H.HopperGemmConfig(128, 256, 64, stages=4, mode="coop", epilogue_split=2)
    n = len(GPU_CASES)
    for dtype, K, N, cfg in [("bf16", 72, 40, None), ("fp16", 1024, 512, None), ("bf16", 4096, 1408, pp),
                             ("bf16", 200, 264, split)]:
        assert _gpu_dist.run(B.grouped_gemm_gluon_cases, dtype, GPU_CASES, K, N, gluon_config=cfg) == \
            [2 * n] * _gpu_dist.world_size


def test_grouped_gemm_gluon_errors(dist_world):
    msgs = dist_world(1).run(B.grouped_gemm_gluon_errors)[0]
    assert "core='cublas'; use one of tl, gluon" in msgs["core"]
    assert "does not take gather_idx" in msgs["gather"] and "core='tl'" in msgs["gather"]
    assert "fp8 grouped GEMMs run on core='tl'" in msgs["fp8"]
    assert "HopperGemmConfig" in msgs["config"] and "GemmConfig is for core='tl'" in msgs["config"]
    assert "reads 'w' through TMA" in msgs["w_layout"] and "core='tl'" in msgs["w_layout"]
    assert "reads 'a' through TMA" in msgs["a_rows"]


def _ptxas_log(ptx):
    import subprocess
    import tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.ptx", "w") as f:
            f.write(ptx)
        return subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                              capture_output=True, text=True, check=True).stderr


@pytest.mark.parametrize("cfg,wgmma", [(None, "m64n256k16"),
                                       (H.HopperGemmConfig(128, 128, 64, stages=4, mode="pingpong"), "m64n128k16")]
                         [:2 if GPU_TRITON else 1], ids=["coop", "pingpong"][:2 if GPU_TRITON else 1])
def test_grouped_gemm_gluon_compiles_warp_specialised(cfg, wgmma):
    from ditron.kernels import moe_hopper as MH
    ck = MH.compile_sm90(cfg, torch.bfloat16, E=64)
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    cfg = cfg or H.DEFAULT_CONFIG
    assert len(re.findall(r"ttg\.warp_specialize\(", ttgir)) == 1
    assert re.search(r"partition0\(.*\) num_warps\(4\)", ttgir) and re.search(r"partition1\(.*\) num_warps\(1\)", ttgir)
    assert ".reqntid 384" in ptx
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{cfg.consumer_regs};", ptx)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{cfg.producer_regs};", ptx)
    assert len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.{wgmma}\.f32\.bf16\.bf16", ptx)) >= 2
    assert "wgmma.wait_group.sync.aligned 1" in ptx
    # A through 2-D boxes, the experts' weights through 3-D [1, BK, BN] boxes, both completing on mbarriers
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::(cluster|cta)\.global\.mbarrier::complete_tx::bytes", ptx)
    assert re.search(r"cp\.async\.bulk\.tensor\.3d\.shared::(cluster|cta)\.global\.mbarrier::complete_tx::bytes", ptx)
    # TMA stores of whole blocks; masked st.global of an expert's partial block
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.bulk_group", ptx)
    assert re.search(r"st\.global(\.v4)?\.b32", ptx) or "st.global" in ptx
    assert cfg.smem_bytes() <= ck.metadata.shared <= 232448
    log = _ptxas_log(ptx)
    assert "C7514" not in log and "serialized" not in log, log


def test_grouped_gemm_gluon_compile_refuses_other_targets():
    from ditron.kernels import moe_hopper as MH
    with pytest.raises(ditron.DitronError, match="sm_90a only"):
        MH.compile_sm90(target="gfx942")


# ---------------------------------------------------------------------------
# moe_rs / moe_ar with core="gluon" (kernels/moe_tp_hopper.py)
# ---------------------------------------------------------------------------

def test_moe_rs_gluon_twin_on_the_simulator(dist_world):
    # 2 ranks, m = 5 then 2 (the context reused); I = 72: a K tail; H = 40: an N tail; experts without pairs
    assert dist_world(2).run(B.tp_moe_rs_gluon, "bf16", [5, 2], E=5, used=3) == [4, 4]


def test_moe_ar_gluon_twin_on_the_simulator(dist_world):
    assert dist_world(3).run(B.tp_moe_rs_gluon, "fp16", [2], ar=True, twin_equal=False) == [1] * 3


def test_moe_rs_gluon_matches_twin_on_gpu(_gpu_dist):
    # GPUs only: the Gluon GEMM's partials through the protocol, against the reference and bit for bit against a
    # tl context with the twin config; tiles with more rows than 128, K / N tails, experts without pairs
    n = _gpu_dist.run(B.tp_moe_rs_gluon, "bf16", [5, 300, 64], H=40, I_local=72, E=8, used=6)
    assert n == [6] * _gpu_dist.world_size
    n = _gpu_dist.run(B.tp_moe_rs_gluon, "fp16", [1000], H=1024, I_local=512, E=16, k=4, seed=3)
    assert n == [2] * _gpu_dist.world_size
    n = _gpu_dist.run(B.tp_moe_rs_gluon, "bf16", [200], H=256, I_local=128, E=4, ar=True)
    assert n == [2] * _gpu_dist.world_size


def test_moe_rs_gluon_errors(dist):
    msgs = dist.run(B.tp_moe_gluon_errors)[0]
    assert "core='cublas'; use one of tl, gluon" in msgs["core"]
    assert "mode='coop'" in msgs["pingpong"] and "core='tl'" in msgs["pingpong"]
    assert "config (a GemmConfig) is for core='tl'" in msgs["config"]
    assert "gluon_config applies to core='gluon'" in msgs["gluon_config_tl"]
    assert "hidden a multiple of 8" in msgs["hidden"]
    assert "reads 'h' through TMA" in msgs["h_rows"] and "core='tl'" in msgs["h_rows"]


@pytest.mark.parametrize("E", [1, 64] if GPU_TRITON else [64])
def test_moe_rs_gluon_compiles_warp_specialised(E):
    from ditron.kernels import moe_tp_hopper as MT
    ck = MT.compile_sm90(E=E)
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    assert len(re.findall(r"ttg\.warp_specialize\(", ttgir)) == 1
    assert ".reqntid 384" in ptx and "setmaxnreg.inc.sync.aligned.u32" in ptx
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16", ptx)) >= 2
    assert re.search(r"cp\.async\.bulk\.tensor\.3d\.shared::(cluster|cta)\.global\.mbarrier::complete_tx::bytes", ptx)
    # the partials: 16-byte st.global into the owners' slots; the count (acq_rel) and the owner's signal (release)
    assert "st.global.v4.b32" in ptx
    assert "atom.global.sys.acq_rel.add.u32" in ptx and "atom.global.sys.release.exch.b64" in ptx
    log = _ptxas_log(ptx)
    assert "C7512" not in log and "C7514" not in log and "serialized" not in log, log
