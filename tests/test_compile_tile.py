"""Tile-level primitives: the generated code holds the intended instructions."""
import re

import pytest

import kernels_for_tests as K
from conftest import code_lines, compile_for, device_asm


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_rank_reads_world_descriptor(target):
    ck = compile_for(K.k_rank, target, {"out": "*i32"})
    asm = device_asm(ck)
    assert "__ditron_world" in asm
    if target == "sm_90a":
        # rank, world_size, local_rank, nnodes are words 1, 2, 3, 6 of the descriptor
        for off in (8, 16, 24, 48):
            assert f"[__ditron_world+{off}]" in asm, off
    assert [op.kind for op in ck.dist_ir.ops] == ["rank", "num_ranks", "rank", "num_ranks"]
    assert [op.attrs["axis"] for op in ck.dist_ir.ops] == [-1, -1, 0, 1]


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_symm_at_keeps_vectorized_access(target):
    ck = compile_for(K.k_symm_at, target, {"x": "*fp16", "out": "*fp16", "peer": "i32"}, {"BLOCK": 1024})
    asm = device_asm(ck)
    assert "__ditron_world" in asm
    if target == "sm_90a":
        assert re.search(r"ld\.global\.v4\.b32", asm), "remote loads lost their vectorization"
        assert "trap;" in asm  # a rank outside the node traps instead of touching a wrong address
    else:
        # 4 fp16 per thread: one 8-byte load, as wide as the local store
        assert re.search(r"global_load_dwordx2 v\[\d+:\d+\]", asm)
        assert "buffer_store_dwordx2" in asm
        assert "s_trap" in asm
    assert ck.dist_ir.ops[0].kind == "symm_at"


@pytest.mark.parametrize("scope,sem", [("gpu", "acquire"), ("sys", "acquire"), ("gpu", "relaxed"),
                                       ("sys", "relaxed")])
@pytest.mark.parametrize("width", ["i32", "i64"])
def test_wait_cuda(scope, sem, width):
    ck = compile_for(K.k_wait, "sm_90a", {"sig": f"*{width}", "x": "*fp16", "out": "*fp16", "n": "i32"},
                     {"BLOCK": 1024, "SCOPE": scope, "SEM": sem})
    ptx = ck.asm["ptx"]
    bits = width[1:]
    assert f"ld.{sem}.{scope}.global.b{bits}" in ptx
    assert "bar.sync 0" in ptx
    assert re.search(r"ld\.global\.v4\.b32", ptx), "consume_token broke vectorization of the guarded loads"
    # the guarded data load comes after the spin loop
    lines = code_lines(ptx)
    spin = next(i for i, l in enumerate(lines) if f"ld.{sem}.{scope}.global" in l)
    data = next(i for i, l in enumerate(lines) if re.search(r"ld\.global\.v4", l))
    assert spin < data
    ops = ck.dist_ir.ops
    assert [o.kind for o in ops] == ["wait", "consume_token"]
    assert ops[0].attrs == {"scope": scope, "semantic": sem}


@pytest.mark.parametrize("scope,syncscope_bits", [("gpu", "sc1"), ("sys", "sc0 sc1")])
def test_wait_hip(scope, syncscope_bits):
    ck = compile_for(K.k_wait, "gfx942", {"sig": "*i32", "x": "*fp16", "out": "*fp16", "n": "i32"},
                     {"BLOCK": 1024, "SCOPE": scope, "SEM": "acquire"})
    asm = ck.asm["amdgcn"]
    assert re.search(rf"global_load_dword v\d+, v\[\d+:\d+\], off {syncscope_bits}\b", asm), \
        "acquire poll with the scope's cache bits"
    assert re.search(rf"buffer_inv {syncscope_bits}\b", asm)
    assert "s_barrier" in asm
    assert re.search(r"global_load_dwordx[24]", asm)


def test_wait_relaxed_hip_has_no_invalidate():
    ck = compile_for(K.k_wait, "gfx942", {"sig": "*i64", "x": "*fp16", "out": "*fp16", "n": "i32"},
                     {"BLOCK": 1024, "SCOPE": "gpu", "SEM": "relaxed"})
    asm = ck.asm["amdgcn"]
    assert re.search(r"global_load_dwordx2 v\[\d+:\d+\], v\[\d+:\d+\], off sc1", asm)
    assert "buffer_inv" not in asm


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_consume_token_on_scalars_and_floats(target):
    ck = compile_for(K.k_wait_scalar_token, target, {"sig": "*i32", "x": "*i32", "out": "*i32"})
    assert [o.kind for o in ck.dist_ir.ops] == ["wait", "consume_token", "consume_token"]


@pytest.mark.parametrize("sig_op", ["set", "add"])
@pytest.mark.parametrize("scope", ["gpu", "intra_node"])
def test_notify_cuda(sig_op, scope):
    ck = compile_for(K.k_notify, "sm_90a", {"sig": "*i32", "peer": "i32"}, {"SIG_OP": sig_op, "SCOPE": scope})
    ptx = ck.asm["ptx"]
    s = "gpu" if scope == "gpu" else "sys"
    want = f"st.release.{s}.global.b32" if sig_op == "set" else f"red.release.{s}.global.add.u32"
    assert want in ptx
    lines = code_lines(ptx)
    bar = next(i for i, l in enumerate(lines) if l.startswith("bar.sync"))
    rel = next(i for i, l in enumerate(lines) if want in l)
    assert bar < rel, "the CTA barrier must precede the release"


@pytest.mark.parametrize("sig_op,instr", [("set", "global_store_dword"), ("add", "global_atomic_add")])
def test_notify_hip(sig_op, instr):
    ck = compile_for(K.k_notify, "gfx942", {"sig": "*i32", "peer": "i32"},
                     {"SIG_OP": sig_op, "SCOPE": "intra_node"})
    asm = ck.asm["amdgcn"]
    assert "buffer_wbl2 sc0 sc1" in asm, "system-scope release writes back L2 first"
    assert instr in asm
    assert "s_barrier" in asm


def test_multimem_sm90a():
    ck = compile_for(K.k_multimem, "sm_90a", {"mc": "*bf16", "out": "*bf16"}, {"BLOCK": 256})
    ptx = ck.asm["ptx"]
    assert "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.bf16x2" in ptx
    assert "multimem.st.relaxed.sys.global.bf16x2" in ptx
    assert ck.asm["cubin"]  # ptxas accepted it
    ck32 = compile_for(K.k_multimem, "sm_90a", {"mc": "*fp32", "out": "*fp32"}, {"BLOCK": 256})
    assert "multimem.ld_reduce.relaxed.sys.global.add.f32" in ck32.asm["ptx"]
    assert "multimem.st.relaxed.sys.global.f32" in ck32.asm["ptx"]


def test_helper_functions_can_use_primitives():
    ck = compile_for(K.k_uses_helper, "sm_90a", {"x": "*fp32", "out": "*fp32", "peer": "i32"})
    assert [o.kind for o in ck.dist_ir.ops] == ["symm_at"]
    assert ck.dist_ir.ops[0].fn == "helper_remote_load"
    assert "__ditron_world" in ck.asm["ptx"]
