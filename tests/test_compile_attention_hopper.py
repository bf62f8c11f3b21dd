"""The Gluon Hopper attention core (kernels/attention_hopper.py, issue 52 item 3) compiles for sm_90a on a CPU
into what it claims to be: a producer warp and two consumer warpgroups (warp-specialised partitions,
``setmaxnreg``), TMA loads completing on mbarriers, asynchronous ``wgmma`` for Q K^T (from shared memory) and
P V (P from registers) with one group left in flight (Q K^T of the next tile before P V of this one), and the
wrapper's checks before launch (shapes, dtypes, head dims, configs, targets, the refusal on CPU that names
the tl twin).

The GPU side (against fp32 SDPA at odd shapes, the LSE, against SDPA cuDNN and its timings) is
bench/attention_core_levers.sh (``CANDIDATES=gluon``) and tests/test_zoo_attention.py's
``test_world_size_one_gluon_core`` on a Hopper GPU.
"""
import re

import pytest
import torch

import ditron
from ditron.kernels import attention as A
from ditron.kernels import attention_hopper as H

HC = H.HopperAttnConfig
SMEM_LIMIT = 232448          # sm_90: 227 KiB per block
#: every config under Triton 3.6 (the GPU machines' Triton); under a newer one the default config (CI's time: each
#: compile is 1.5-2.7 s, and the structure does not depend on the Triton version beyond what one config shows)
GPU_TRITON = ditron._compat.TRITON_VERSION[:2] == (3, 6)
SWEEP = H.CONFIGS if GPU_TRITON else [H.DEFAULT_CONFIG]


def _count(pattern, text):
    return len(re.findall(pattern, text))


def _check_structure(ck, cfg, dtype="bf16", head_d=128):
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    # one warp_specialize region: the default partition (consumer 0) and two workers (consumer 1, the producer)
    assert _count(r"ttg\.warp_specialize\(", ttgir) == 1
    assert re.search(r"partition0\(.*\) num_warps\(4\)", ttgir) and re.search(r"partition1\(.*\) num_warps\(1\)",
                                                                              ttgir)
    assert f"requestedRegisters = array<i32: {cfg.consumer_regs}, {cfg.producer_regs}>" in ttgir
    # 4 + 4 + 1 warps, padded to three warpgroups; registers moved from the producer to the consumers
    assert ".reqntid 384" in ptx
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{cfg.consumer_regs};", ptx)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{cfg.producer_regs};", ptx)
    # S = Q K^T: m64 x block_n from two shared-memory descriptors; O += P V: m64 x head_d with P in registers
    # ({...} register list as the A operand); both in each consumer
    s_mma = rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.block_n}k16\.f32\.{dtype}\.{dtype}\s+\{{[^}}]*\}},\s*%rd"
    pv_mma = rf"wgmma\.mma_async\.sync\.aligned\.m64n{head_d}k16\.f32\.{dtype}\.{dtype}\s+\{{[^}}]*\}},\s*\{{"
    assert _count(s_mma, ptx) >= 2
    assert _count(pv_mma, ptx) >= 2
    # intra-warpgroup overlap: a wait that leaves one group (P V) in flight
    assert "wgmma.wait_group.sync.aligned 1" in ptx
    # TMA loads (Q, K, V) completing on mbarriers; consumers / producer wait on mbarrier phases
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::(cluster|cta)\.global\.mbarrier::complete_tx::bytes", ptx)
    assert _count(r"mbarrier\.try_wait\.parity", ptx) >= 4
    # shared memory: Q, the K / V rings and the barriers, within the limit
    assert cfg.smem_bytes(head_d) <= ck.metadata.shared <= SMEM_LIMIT


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("cfg", SWEEP, ids=[c.label().replace(" ", "-") for c in SWEEP])
def test_gluon_attention_compiles_warp_specialised(cfg, causal):
    ck = H.compile_sm90(cfg, causal=causal)
    _check_structure(ck, cfg)
    # the uniform mask branch per tile survives as a branch, not a select over every tile
    assert _count(r"scf\.if", ck.asm["ttgir"]) >= 2           # one per consumer (the mask branch)


def test_pingpong_adds_the_turn_waits():
    on = H.compile_sm90(HC(128, 2, True)).asm["ptx"]
    off = H.compile_sm90(HC(128, 2, False)).asm["ptx"]
    # prologue, loop and epilogue of both consumers wait for their turn: 6 more phase waits
    assert _count(r"mbarrier\.try_wait\.parity", on) >= _count(r"mbarrier\.try_wait\.parity", off) + 6


@pytest.mark.parametrize("dtype,head_d", [(torch.float16, 128), (torch.bfloat16, 64), (torch.float16, 64)]
                         if GPU_TRITON else [(torch.float16, 64)])
def test_gluon_attention_compiles_fp16_and_head_dim_64(dtype, head_d):
    cfg = H.DEFAULT_CONFIG
    ck = H.compile_sm90(cfg, causal=True, dtype=dtype, head_d=head_d)
    _check_structure(ck, cfg, {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype], head_d)


def test_config_errors():
    E = ditron.DitronError
    with pytest.raises(E, match="block_n=32 must be 64 or 128"):
        HC(32).validate()
    with pytest.raises(E, match="stages=1 must be >= 2"):
        HC(128, 1).validate()
    with pytest.raises(E, match="exceed sm_90's 227 KiB"):
        HC(128, 4).validate()
    with pytest.raises(E, match="head_dim=256; the Gluon core takes 64 or 128"):
        HC().validate(head_d=256)
    with pytest.raises(E, match="consumer_regs=244 must be a multiple of 8"):
        HC(consumer_regs=244).validate()
    with pytest.raises(E, match="exceed the SM's 64K registers"):
        HC(consumer_regs=248, producer_regs=40).validate()
    assert HC(128, 3).validate() and HC(64, 4).validate(head_d=128)


@pytest.mark.parametrize("target", ["gfx942", "sm_80"])
def test_other_targets_are_refused(target):
    with pytest.raises(ditron.DitronError, match="for sm_90a only"):
        H.compile_sm90(target=target)


def _qkv(B=1, HQ=4, HKV=2, S=100, D=128, dtype=torch.bfloat16):
    return (torch.zeros(B, HQ, S, D, dtype=dtype), torch.zeros(B, HKV, S, D, dtype=dtype),
            torch.zeros(B, HKV, S, D, dtype=dtype))


def test_refuses_cpu_and_names_the_twin():
    q, k, v = _qkv()
    with pytest.raises(ditron.DitronError, match=r"Hopper GPUs only.*flash_attention \(the tl core"):
        H.attention_hopper(q, k, v)
    with pytest.raises(ditron.DitronError, match="flash_attention: core='gluon'.*not on the simulator; use core='tl'"):
        A.flash_attention(q, k, v, core="gluon")
    # the tl core takes the same call on the simulator's device (not run here: tests/test_zoo_attention.py)


def test_bad_inputs_are_refused_before_launch():
    E = ditron.DitronError
    q, k, v = _qkv()
    fa = A.flash_attention
    with pytest.raises(E, match="core='cudnn'; use one of tl, gluon"):
        fa(q, k, v, core="cudnn")
    with pytest.raises(E, match="takes a HopperAttnConfig"):
        fa(q, k, v, core="gluon", config=A.GPU_CONFIG)
    with pytest.raises(E, match="float16 / bfloat16"):
        fa(q.float(), k.float(), v.float(), core="gluon")
    with pytest.raises(E, match="must be contiguous"):
        fa(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, core="gluon")
    with pytest.raises(E, match="not a multiple of k's 3 heads"):
        fa(q, *_qkv(HKV=3)[1:], core="gluon")
    with pytest.raises(E, match="need k / v"):
        fa(q, k, v[:, :, :50].contiguous(), core="gluon")
    with pytest.raises(E, match="need k / v"):
        fa(q, k.half(), v, core="gluon")
    with pytest.raises(E, match="head_dim=32; the Gluon core takes 64 or 128"):
        fa(*_qkv(D=32), core="gluon")
    with pytest.raises(E, match="empty input"):
        fa(*_qkv(S=0), core="gluon")
    with pytest.raises(E, match="'out' must be a contiguous"):
        fa(q, k, v, core="gluon", out=torch.empty(1, 4, 100, 64, dtype=torch.bfloat16))
    with pytest.raises(E, match="must be a 4-D tensor"):
        H.attention_hopper(q[0], k, v)
