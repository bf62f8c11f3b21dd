"""bench/attention_core_levers.py's lever kernel (issue 52 item 3) compiles for sm_90a on a CPU into what each
candidate claims: wgmma, shared memory within sm_90's limit, 4 or 8 warps; the GPU side (checks against SDPA,
timings against SDPA cuDNN) is bench/attention_core_levers.sh."""
import importlib.util
import os
import sys

import pytest

import ditron

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _levers():
    spec = importlib.util.spec_from_file_location("attention_core_levers",
                                                  os.path.join(ROOT, "bench", "attention_core_levers.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


L = _levers()
CANDS = L.candidates()
LEVERS = [n for n in L.default_names(CANDS) if CANDS[n][0] == "lever"]
# the whole lever sweep compiles under Triton 3.6 (the GPU machines' version: what the levers bench runs); newer
# Tritons compile the first lever (the tl core's shipped path is compiled by tests/test_zoo_attention.py)
GPU_TRITON = ditron._compat.TRITON_VERSION[:2] == (3, 6)
SWEEP = LEVERS if GPU_TRITON else LEVERS[:1]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", SWEEP)
def test_lever_kernels_compile_for_sm90a(name, causal):
    lv = CANDS[name][1]
    ck = L.compile_lever(lv, causal)
    ptx = ck.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    assert f".reqntid {32 * lv.num_warps}" in ptx
    assert ck.metadata.shared <= L.SMEM_LIMIT
    # Q / O through TMA descriptors exactly when io=tma (K and V always)
    assert ("cp.async.bulk.tensor.3d.global.shared" in ptx) == lv.io_tma
    if lv.lazy:
        assert "scf.if" in ck.asm["ttir"]            # the uniform rescaling branch survives as a branch


def test_default_set_and_groups():
    names = L.default_names(CANDS)
    assert "ditron default" in names and not any(CANDS[n][0] == "lever" and CANDS[n][1].ws for n in names)
    assert len(LEVERS) >= 8
