"""shmem.* on NVIDIA: calls NVSHMEM's device functions with their exact
prototypes (so they inline), and the library is attached only when used."""
import os
import re

import pytest

import ditron
import kernels_for_tests as K
from conftest import compile_for
from ditron.lowering import cuda, shmem_table


_LL = {"ptr": "ptr", "size_t": "i64", "int": "i32", "uint64": "i64", "team": "i32"}
_PROTO = {sym: [_LL[p] for p in params] for sym, _ret, params in shmem_table.NVSHMEM.values()}


def _inlined(ptx, symbol):
    """The NVSHMEM entry point left no function behind in the PTX (a call whose
    argument types differ from the definition is not inlined and crashes at run
    time)."""
    return not re.search(rf"\.func\s+(\([^)]*\)\s*)?{re.escape(symbol)}\b", ptx)


def _params(text):
    return [a.strip().split()[0] for a in text.split(",") if a.strip()]


def _calls_match_prototype(llir, symbol):
    """No call of ``symbol`` in the optimised LLVM IR disagrees with the C
    prototype.

    A call whose argument types differ from the callee's definition is
    undefined behaviour that LLVM neither inlines nor rewrites, so it stays
    visible as a call whose types differ from the ``define`` in the module.
    A matching call may legitimately survive the first O3 pass with *fewer*
    arguments: once NVSHMEM's bitcode is linked its functions are internal,
    and LLVM's inter-procedural passes (constant propagation, dead-argument
    elimination; Triton 3.9's LLVM runs them before inlining these) drop
    parameters that are constant at every call site (``team``, ``sig_op``)
    from the definition and its calls together.  So: every call agrees with
    the definition, and the definition is the prototype or the prototype
    less some parameters, in order."""
    proto = _PROTO[symbol]
    d = re.search(rf"define [^@]*@{re.escape(symbol)}\(([^)]*)\)", llir)
    calls = [_params(m.group(1)) for m in re.finditer(rf"call [^@]*@{re.escape(symbol)}\(([^)]*)\)", llir)]
    if d is None:
        return not calls                      # fully inlined: nothing left to disagree
    defined = _params(d.group(1))
    it = iter(proto)
    if not all(any(t == p for p in it) for t in defined):   # a subsequence of the prototype
        return False
    return all(c == defined for c in calls)


CASES = [
    (K.k_shmem_ids, {"out": "*i32"}, ["nvshmem_my_pe", "nvshmem_n_pes"]),
    (K.k_shmem_ptrs, {"x": "*fp32", "out": "*fp32", "pe": "i32"}, ["nvshmem_ptr"]),
    (K.k_shmem_mc, {"x": "*fp32", "out": "*fp32"}, ["nvshmemx_mc_ptr"]),
    (K.k_shmem_put_get, {"dst": "*i8", "src": "*i8", "nbytes": "i64", "pe": "i32"},
     ["nvshmem_putmem", "nvshmem_putmem_nbi", "nvshmemx_putmem_block", "nvshmemx_putmem_nbi_block",
      "nvshmemx_putmem_warp", "nvshmemx_putmem_nbi_warp", "nvshmem_getmem", "nvshmem_getmem_nbi",
      "nvshmemx_getmem_block", "nvshmemx_getmem_nbi_block", "nvshmemx_getmem_warp", "nvshmemx_getmem_nbi_warp"]),
    (K.k_shmem_signal, {"dst": "*i8", "src": "*i8", "nbytes": "i64", "sig": "*u64", "pe": "i32", "out": "*u64"},
     ["nvshmem_putmem_signal", "nvshmem_putmem_signal_nbi", "nvshmemx_putmem_signal_block",
      "nvshmemx_putmem_signal_nbi_block", "nvshmemx_putmem_signal_warp", "nvshmemx_putmem_signal_nbi_warp",
      "nvshmemx_signal_op", "nvshmem_signal_wait_until"]),
    (K.k_shmem_sync, {}, ["nvshmem_quiet", "nvshmem_fence", "nvshmem_barrier_all", "nvshmemx_barrier_all_block",
                          "nvshmemx_barrier_all_warp", "nvshmem_sync_all", "nvshmemx_sync_all_block",
                          "nvshmemx_sync_all_warp"]),
]


_COMPILED = {}


def _compiled(kernel, sig):
    """``kernel`` compiled for sm_90a with ``sig`` (NVSHMEM linked: ~5 CPU-s), once per test process: two tests
    read the same k_shmem_signal compilation (the checks only read the result)."""
    key = (kernel.fn.__name__, tuple(sig.items()))
    if key not in _COMPILED:
        _COMPILED[key] = compile_for(kernel, "sm_90a", sig)
    return _COMPILED[key]


@pytest.mark.parametrize("kernel,sig,symbols", CASES, ids=[c[0].__name__ for c in CASES])
def test_shmem_calls_nvshmem(nvshmem_bc, kernel, sig, symbols):
    ck = _compiled(kernel, sig)
    ttir, ptx = ck.asm["ttir"], ck.asm["ptx"]
    for sym in symbols:
        assert f'symbol = "ditron_{sym}"' in ttir, sym      # the op called the right NVSHMEM entry point
        assert _inlined(ptx, sym), f"{sym} was not inlined: prototype mismatch?"
        assert _calls_match_prototype(ck.asm["llir"], sym), sym
    assert "nvshmemi_device_state_d" in ptx or "nvshmemi_" in ptx  # NVSHMEM's device code is linked in
    assert ck.libraries == ["libnvshmem_device"]
    libs = dict(ck.triton_kernel.metadata.extern_libs)
    assert libs["libnvshmem_device"] == _needed_library(nvshmem_bc)


def _needed_library(nvshmem_bc):
    from ditron.libs import nvshmem_linkable
    path = nvshmem_linkable(nvshmem_bc, {entry[0] for entry in shmem_table.NVSHMEM.values()})
    assert path != nvshmem_bc and os.path.basename(path).startswith("libnvshmem_device_needed_"), path
    return path


def test_needed_part_of_nvshmem_links_to_the_same_ptx_as_the_whole_bitcode(nvshmem_bc, monkeypatch):
    """Kernels link the part of NVSHMEM's bitcode that the table reaches (cut once, cached), not the 31 MB
    file: the PTX must not change (put + signal + wait in every cooperation level: the largest closure)."""
    sig = {"dst": "*i8", "src": "*i8", "nbytes": "i64", "sig": "*u64", "pe": "i32", "out": "*u64"}
    needed = _compiled(K.k_shmem_signal, sig)
    path = _needed_library(nvshmem_bc)
    assert dict(needed.triton_kernel.metadata.extern_libs)["libnvshmem_device"] == path
    monkeypatch.setenv("DITRON_NVSHMEM_FULL", "1")
    full = compile_for(K.k_shmem_signal, "sm_90a", sig)
    assert dict(full.triton_kernel.metadata.extern_libs)["libnvshmem_device"] == nvshmem_bc
    assert full.asm["ptx"] == needed.asm["ptx"]
    text = open(path).read()
    assert "define internal" not in text and "@nvshmemi_device_state_d = " in text   # links like the original


def test_signal_constants_reach_nvshmem(nvshmem_bc):
    ck = _compiled(K.k_shmem_signal, {"dst": "*i8", "src": "*i8", "nbytes": "i64", "sig": "*u64", "pe": "i32",
                                      "out": "*u64"})
    ops = [o for o in ck.dist_ir.ops if o.kind == "shmem.putmem_signal"]
    assert [o.attrs["sig_op"] for o in ops] == ["set", "add", "set", "add", "set", "set"]
    assert [(o.attrs["nbi"], o.attrs["coop"]) for o in ops] == [
        (False, "thread"), (True, "thread"), (False, "block"), (True, "block"), (False, "warp"), (True, "warp")]
    wait = next(o for o in ck.dist_ir.ops if o.kind == "shmem.signal_wait_until")
    assert wait.attrs["cmp"] == "ge"


def test_wrappers_have_exact_c_prototypes():
    text = cuda.LIB.text()
    assert "declare void @nvshmemx_putmem_signal_nbi_block(ptr, ptr, i64, ptr, i64, i32, i32)" in text
    assert "declare i64 @nvshmem_signal_wait_until(ptr, i32, i64)" in text
    assert "declare ptr @nvshmemx_mc_ptr(i32, ptr)" in text
    assert "declare void @nvshmem_quiet()" in text
    for symbol, ret, params in shmem_table.NVSHMEM.values():
        assert f"@ditron_{symbol}(" in text


def test_library_only_attached_to_kernels_that_call_it(nvshmem_bc):
    plain = compile_for(K.k_plain, "sm_90a", {"x": "*i32", "out": "*i32", "peer": "i32"})
    assert plain.libraries == []
    assert "libnvshmem_device" not in dict(plain.triton_kernel.metadata.extern_libs)
    assert "nvshmemi_" not in plain.asm["ptx"]
    tile = compile_for(K.k_symm_at, "sm_90a", {"x": "*fp16", "out": "*fp16", "peer": "i32"}, {"BLOCK": 256})
    assert "libnvshmem_device" not in dict(tile.triton_kernel.metadata.extern_libs)


def test_notify_inter_node_uses_signal_op_once(nvshmem_bc):
    ck = compile_for(K.k_notify_inter, "sm_90a", {"sig": "*u64", "peer": "i32"})
    assert 'symbol = "ditron_nvshmemx_signal_op_once"' in ck.asm["ttir"]
    assert ck.libraries == ["libnvshmem_device"]
    ptx = ck.asm["ptx"]
    assert re.search(r"bar\.sync\s+0", ptx)
    assert re.search(r"mov\.u32\s+%r\d+, %tid\.x", ptx)  # the signal is guarded to one thread
    assert "define i32 @ditron_nvshmemx_signal_op_once" in cuda.LIB.text()
    with pytest.raises(Exception, match="int64"):
        compile_for(K.k_notify_inter, "sm_90a", {"sig": "*i32", "peer": "i32"})


def test_plain_triton_kernel_gets_a_clear_error():
    import triton
    import triton.language as tl
    import ditron.language as dl
    from ditron import _compat

    @triton.jit
    def plain(out):
        tl.store(out, dl.rank())

    src = _compat.ast_source(plain, {"out": "*i32"}, {}, {})
    with pytest.raises(Exception, match="decorate the kernel with @ditron.jit"):
        _compat.compile_source(src, ditron.parse_target("sm_90a").to_triton(), {})
