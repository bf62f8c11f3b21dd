"""Thread-level primitives: intended instructions on sm_90a and gfx942."""
import re

import pytest

import kernels_for_tests as K
from conftest import compile_for


def test_thread_ids():
    ptx = compile_for(K.k_thread_ids, "sm_90a", {"out": "*i32"}).asm["ptx"]
    for reg in ("%tid.x", "%laneid", "%ntid.x"):
        assert reg in ptx
    amd = compile_for(K.k_thread_ids, "gfx942", {"out": "*i32"}).asm["amdgcn"]
    assert "v_mbcnt_lo_u32_b32" in amd and "v_mbcnt_hi_u32_b32" in amd


@pytest.mark.parametrize("scope", ["cta", "gpu", "sys"])
def test_ld_st_cuda(scope):
    ptx = compile_for(K.k_ld_st, "sm_90a", {"p": "*i32", "q": "*i32"},
                      {"SCOPE": scope, "LD_SEM": "acquire", "ST_SEM": "release"}).asm["ptx"]
    assert f"ld.acquire.{scope}.global.b32" in ptx
    assert f"st.release.{scope}.global.b32" in ptx
    ptx = compile_for(K.k_ld_st, "sm_90a", {"p": "*fp64", "q": "*fp64"},
                      {"SCOPE": scope, "LD_SEM": "relaxed", "ST_SEM": "volatile"}).asm["ptx"]
    assert f"ld.relaxed.{scope}.global.b64" in ptx
    assert "st.volatile.global.b64" in ptx


@pytest.mark.parametrize("scope,bits", [("gpu", "sc1"), ("sys", "sc0 sc1")])
def test_ld_st_hip(scope, bits):
    amd = compile_for(K.k_ld_st, "gfx942", {"p": "*i32", "q": "*i32"},
                      {"SCOPE": scope, "LD_SEM": "acquire", "ST_SEM": "release"}).asm["amdgcn"]
    assert re.search(rf"global_load_dword v\d+, v\d+, s\[\d+:\d+\] {bits}\b", amd)
    assert f"buffer_inv {bits}" in amd
    assert f"buffer_wbl2 {bits}" in amd
    assert re.search(rf"global_store_dword v\d+, v\d+, s\[\d+:\d+\] {bits}\b", amd)


def test_atomics_cuda():
    ptx = compile_for(K.k_atomics, "sm_90a", {"p": "*i32", "out": "*i32"},
                      {"SCOPE": "sys", "SEM": "acq_rel"}).asm["ptx"]
    assert "atom.acq_rel.sys.global.add.s32" in ptx
    assert "atom.acq_rel.sys.global.cas.b32" in ptx
    ptx = compile_for(K.k_atomics, "sm_90a", {"p": "*u64", "out": "*u64"},
                      {"SCOPE": "gpu", "SEM": "relaxed"}).asm["ptx"]
    assert "atom.relaxed.gpu.global.add.u64" in ptx
    assert "atom.relaxed.gpu.global.cas.b64" in ptx
    ptx = compile_for(K.k_fadd, "sm_90a", {"p": "*fp32", "out": "*fp32"}).asm["ptx"]
    assert "atom.relaxed.gpu.global.add.f32" in ptx


def test_atomics_hip():
    amd = compile_for(K.k_atomics, "gfx942", {"p": "*i32", "out": "*i32"},
                      {"SCOPE": "gpu", "SEM": "acq_rel"}).asm["amdgcn"]
    assert "global_atomic_add" in amd
    assert "global_atomic_cmpswap" in amd
    assert "buffer_inv sc1" in amd and "buffer_wbl2 sc1" in amd
    amd = compile_for(K.k_fadd, "gfx942", {"p": "*fp32", "out": "*fp32"}).asm["amdgcn"]
    assert "global_atomic_add_f32" in amd


@pytest.mark.parametrize("sem,want", [("acq_rel", "fence.acq_rel.sys"), ("sc", "fence.sc.sys")])
def test_sync_fence_cuda(sem, want):
    ptx = compile_for(K.k_sync_fence, "sm_90a", {"p": "*i32"}, {"SEM": sem, "SCOPE": "sys"}).asm["ptx"]
    assert re.search(r"bar\.sync\s+0", ptx)
    assert want in ptx


def test_sync_fence_hip():
    amd = compile_for(K.k_sync_fence, "gfx942", {"p": "*i32"}, {"SEM": "acq_rel", "SCOPE": "sys"}).asm["amdgcn"]
    assert "s_barrier" in amd
    assert "buffer_wbl2 sc0 sc1" in amd and "buffer_inv sc0 sc1" in amd


def test_warp_helpers_cuda():
    ptx = compile_for(K.k_warp, "sm_90a", {"x": "*i32", "out": "*i32"}).asm["ptx"]
    for instr in ("vote.sync.ballot.b32", "shfl.sync.idx.b32", "shfl.sync.up.b32", "shfl.sync.down.b32",
                  "shfl.sync.bfly.b32", "brev.b32", "clz.b32"):
        assert instr in ptx, instr


def test_warp_helpers_hip():
    amd = compile_for(K.k_warp, "gfx942", {"x": "*i32", "out": "*i32"}).asm["amdgcn"]
    assert "ds_bpermute_b32" in amd
    assert re.search(r"v_ffbl_b32|s_ff1_i32_b32", amd)
    assert re.search(r"v_cmp_\w+_e64 s\[\d+:\d+\]", amd)  # the ballot mask lands in an SGPR pair


def test_clock_ns_on_both_targets():
    sig = {"flags": "*i64", "out": "*i64", "flag": "i64"}
    nv = compile_for(K.k_poll_bounded, "sm_90a", sig, {"BLOCK": 64}).asm["ptx"]
    assert "%globaltimer" in nv
    amd = compile_for(K.k_poll_bounded, "gfx942", sig, {"BLOCK": 64}).asm["amdgcn"]
    assert "s_memrealtime" in amd


def test_prefetch_l2_on_both_targets():
    sig = {"w": "*bf16", "out": "*fp32", "n": "i32"}
    nv = compile_for(K.k_prefetch_l2, "sm_90a", sig, {"LINES": 8})
    ptx = nv.asm["ptx"]
    assert "dist.prefetch_l2" in nv.asm["dist_ir"]
    assert re.search(r"@%p\w* prefetch\.global\.L2::evict_last \[", ptx), ptx     # predicated on the mask
    amd = compile_for(K.k_prefetch_l2, "gfx942", sig, {"LINES": 8})
    assert "dist.prefetch_l2" in amd.asm["dist_ir"]                        # a dropped hint on CDNA3
