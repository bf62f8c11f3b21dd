"""Compile-time errors name the op, the argument and the target."""
import pytest
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem
from conftest import compile_for
import kernels_for_tests as K


def _error(kernel, target, sig, constexprs=None):
    with pytest.raises(Exception) as info:
        compile_for(kernel, target, sig, constexprs)
    return str(info.value)


@ditron.jit
def k_bad_scope(sig):
    dl.wait(sig, 1, "device", "acquire")


@ditron.jit
def k_bad_semantic(p):
    dl.ld(p, scope="gpu", semantic="seq_cst")


@ditron.jit
def k_bad_sig_op(sig, peer):
    dl.notify(sig, peer, sig_op="xor")


@ditron.jit
def k_symm_at_int(n, peer):
    dl.symm_at(n, peer)


@ditron.jit
def k_runtime_scope(sig, s):
    dl.wait(sig, 1, s, "acquire")


@ditron.jit
def k_wait_float(sig):
    dl.wait(sig, 1, "gpu", "acquire")


@ditron.jit
def k_wait_tensor(sig, BLOCK: tl.constexpr):
    dl.wait(sig + tl.arange(0, BLOCK), 1, "gpu", "acquire")


def test_multimem_on_gfx942():
    msg = _error(K.k_multimem, "gfx942", {"mc": "*fp32", "out": "*fp32"}, {"BLOCK": 64})
    assert "dl.multimem_ld_reduce" in msg and "gfx942" in msg and "multicast" in msg


def test_multimem_needs_sm90():
    msg = _error(K.k_multimem, "sm_80", {"mc": "*fp32", "out": "*fp32"}, {"BLOCK": 64})
    assert "dl.multimem_ld_reduce" in msg and "sm_80" in msg and "sm_90" in msg


def test_shmem_on_hip_without_rocshmem(monkeypatch):
    monkeypatch.delenv("DITRON_ROCSHMEM_BC", raising=False)
    monkeypatch.delenv("ROCSHMEM_HOME", raising=False)
    msg = _error(K.k_shmem_ids, "gfx942", {"out": "*i32"})
    assert "shmem." in msg and "gfx942" in msg and "rocSHMEM" in msg and "DITRON_ROCSHMEM_BC" in msg


def test_shmem_on_cuda_without_nvshmem(monkeypatch, tmp_path):
    monkeypatch.setenv("DITRON_NVSHMEM_BC", str(tmp_path / "missing.bc"))
    msg = _error(K.k_shmem_ids, "sm_90a", {"out": "*i32"})
    assert "libnvshmem_device.bc" in msg and "sm_90a" in msg and "nvidia-nvshmem" in msg


def test_unknown_scope():
    msg = _error(k_bad_scope, "sm_90a", {"sig": "*i32"})
    assert "dl.wait" in msg and "argument 'scope'" in msg and "'device'" in msg and "target sm_90a" in msg
    assert "'gpu', 'sys'" in msg


def test_unknown_semantic():
    for target in ("sm_90a", "gfx942"):
        msg = _error(k_bad_semantic, target, {"p": "*i32"})
        assert "dl.ld" in msg and "argument 'semantic'" in msg and f"target {target}" in msg


def test_unknown_sig_op():
    msg = _error(k_bad_sig_op, "gfx942", {"sig": "*i32", "peer": "i32"})
    assert "dl.notify" in msg and "argument 'sig_op'" in msg and "'xor'" in msg and "gfx942" in msg


def test_symm_at_non_pointer():
    for target in ("sm_90a", "gfx942"):
        msg = _error(k_symm_at_int, target, {"n": "i32", "peer": "i32"})
        assert "dl.symm_at" in msg and "argument 'ptr'" in msg and "not a pointer" in msg and target in msg


def test_runtime_attribute_rejected():
    msg = _error(k_runtime_scope, "sm_90a", {"sig": "*i32", "s": "i32"})
    assert "dl.wait" in msg and "argument 'scope'" in msg and "compile-time constant" in msg


def test_wait_needs_integer_words():
    msg = _error(k_wait_float, "sm_90a", {"sig": "*fp32"})
    assert "dl.wait" in msg and "barrier_ptrs" in msg and "int32" in msg


def test_wait_needs_one_pointer():
    msg = _error(k_wait_tensor, "gfx942", {"sig": "*i32"}, {"BLOCK": 4})
    assert "dl.wait" in msg and "barrier_ptrs" in msg and "one pointer" in msg


def test_unknown_target():
    with pytest.raises(ditron.DitronCompileError, match="unknown target 'sm_9x'"):
        ditron.parse_target("sm_9x")


def test_signature_must_cover_parameters():
    with pytest.raises(ditron.DitronCompileError, match=r"missing parameter\(s\) \['out'\]"):
        ditron.compile(K.k_plain, "sm_90a", {"x": "*i32", "peer": "i32"})
    with pytest.raises(ditron.DitronCompileError, match="no parameter"):
        ditron.compile(K.k_plain, "sm_90a", {"x": "*i32", "out": "*i32", "peer": "i32", "zz": "i32"})


def test_defaulted_constexpr_takes_its_default():
    import triton.language as tl

    @ditron.jit
    def k_defaults(x, out, N: tl.constexpr = 4, DOUBLE: tl.constexpr = False):
        v = tl.load(x + tl.arange(0, N))
        if DOUBLE:
            v = v * 2
        tl.store(out + tl.arange(0, N), v)

    sig = {"x": "*i32", "out": "*i32"}
    plain = ditron.compile(k_defaults, "sm_90a", sig).asm["ttir"]
    doubled = ditron.compile(k_defaults, "sm_90a", sig, {"DOUBLE": True}).asm["ttir"]
    assert "arith.muli" not in plain and "arith.muli" in doubled
    assert ditron.compile(k_defaults, "sm_90a", sig, {"N": 4}).asm["ttir"] == plain
    with pytest.raises(ditron.DitronCompileError, match=r"missing parameter\(s\) \['out'\]"):
        ditron.compile(k_defaults, "sm_90a", {"x": "*i32"})


def test_sim_target_has_no_binary():
    with pytest.raises(ditron.DitronCompileError, match="sim"):
        ditron.compile(K.k_plain, "sim", {"x": "*i32", "out": "*i32", "peer": "i32"})


def test_missing_rule_names_op_and_target(monkeypatch):
    from ditron import lowering
    from ditron.errors import LoweringError
    lowering.lookup("wait", ditron.parse_target("sim"))          # loads the sim rules
    monkeypatch.delitem(lowering._RULES, ("wait", "sim"))
    with pytest.raises(LoweringError, match=r"dl\.wait, target sim: no lowering rule"):
        lowering.lookup("wait", ditron.parse_target("sim"))


def test_every_op_has_a_rule_on_every_backend_it_claims():
    from ditron import lowering
    from ditron.ir import OPS
    for backend in ("cuda", "hip", "sim"):
        rules = lowering.rules_for(backend)
        missing = [k for k, spec in OPS.items() if backend in spec.backends and k not in rules]
        assert not missing, (backend, missing)


def test_unreadable_nvshmem_bitcode_names_working_versions(monkeypatch, tmp_path):
    bad = tmp_path / "libnvshmem_device.bc"
    bad.write_bytes(b"BC\xc0\xde" + b"\x00" * 64 + b"LLVM21.0.0" + b"\x01" * 64)
    monkeypatch.setenv("DITRON_NVSHMEM_BC", str(bad))
    with pytest.raises(ditron.LibraryError) as info:
        compile_for(K.k_shmem_ids, "sm_90a", {"out": "*i32"})
    msg = str(info.value)
    assert "cannot read the NVSHMEM device bitcode" in msg
    assert "3.4.5" in msg and "Triton 3.6" in msg
