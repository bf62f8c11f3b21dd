"""shmem.* on AMD: the rocSHMEM functions and constants ditron emits are the ones rocSHMEM has.

The facts (prototypes, enum values, bitcode layout) are in tests/rocshmem_facts.py with the file and commit
each was read from; here ditron's table, its device library and compiled kernels are held to them.  Kernels
are linked against a stand-in library built from those facts (rocSHMEM's own bitcode needs ROCm's
compiler; see docs/language.md), so a prototype or constant that differs from rocSHMEM's fails here."""
import inspect
import os
import re

import pytest

import ditron
import kernels_for_tests as K
import rocshmem_facts as F
from conftest import compile_for
from ditron import libs
from ditron.errors import LibraryError
from ditron.lowering import hip, shmem_table as T

_KIND_LL = {"ptr": "ptr", "size_t": "i64", "int": "i32", "uint64": "i64", "team": "i32", "void": "void"}


# ---------------------------------------------------------------------------
# the table against rocSHMEM's headers
# ---------------------------------------------------------------------------

def test_every_declared_prototype_is_a_rocshmem_export():
    symbols = T.rocshmem_symbols()
    assert symbols, "empty rocSHMEM table"
    for sym, (ret, params) in symbols.items():
        assert sym in F.EXPORTS, f"{sym} is not exported by rocSHMEM {F.ROCSHMEM_VERSION}"
        assert (_KIND_LL[ret], [_KIND_LL[p] for p in params]) == F.llvm_prototype(sym), sym
    # what the device library declares (the IR actually emitted) is exactly rocSHMEM's prototype
    text = hip.LIB.text()
    declared = {sym: ret for ret, sym in re.findall(r"^declare (\w+) @(rocshmem_\w+)\(", text, re.M)}
    assert set(declared) == set(symbols), set(declared) ^ set(symbols)
    for sym in declared:
        ret, params = F.llvm_prototype(sym)
        assert f"declare {ret} @{sym}({', '.join(params)})" in text, sym
    for absent in F.NOT_EXPORTED:
        assert f"@{absent}(" not in text, f"ditron calls {absent}, which rocSHMEM does not export"


def test_constants_are_rocshmems():
    assert T.ROCSHMEM_CMP == {name[len("ROCSHMEM_CMP_"):].lower(): i for i, name in enumerate(F.CMPS)}
    assert T.ROCSHMEM_SIGNAL == {name[len("ROCSHMEM_SIGNAL_"):].lower(): i for i, name in enumerate(F.SIGNAL_OPS)}
    assert (T.ROCSHMEM_CMP["ge"], T.ROCSHMEM_CMP["le"]) == (3, 5)      # not NVSHMEM's order (le = 3, ge = 5)
    assert T.ROCSHMEM_VERSION == F.ROCSHMEM_VERSION == libs.ROCSHMEM_SUPPORTED


def test_every_shmem_op_has_a_rocshmem_path_or_a_refusal():
    """Each shmem.* variant ditron has (the NVSHMEM table's keys) calls a rocSHMEM export, is built from
    exports, or is refused with a message saying what to use."""
    composed = {"shmem.signal_op", "shmem.signal_wait_until"}
    for kind, nbi, coop in T.NVSHMEM:
        if kind in T.ROCSHMEM_REFUSED:
            assert "use" in T.ROCSHMEM_REFUSED[kind]
        elif kind in composed:
            assert kind not in {k for k, _, _ in T.ROCSHMEM}
        else:
            assert T.lookup(T.ROCSHMEM, kind, nbi, coop) is not None, (kind, nbi, coop)
    assert set(T.ROCSHMEM_SIGNAL_ATOMIC) == {"set", "add"}


# ---------------------------------------------------------------------------
# kernels compiled and linked for gfx942 against rocSHMEM's prototypes
# ---------------------------------------------------------------------------

@pytest.fixture
def fake_rocshmem(tmp_path, monkeypatch):
    path = tmp_path / "rocshmem_standin_gfx942.ll"
    path.write_text(F.fake_library_ir())
    monkeypatch.setenv("DITRON_ROCSHMEM_BC", str(path))
    return str(path)


def _params(text):
    """The types of an IR parameter / argument list (attributes such as ``range(i32 0, 8)`` dropped)."""
    text = re.sub(r"\w+\([^()]*\)", "", text)
    return [a.strip().split()[0] for a in text.split(",") if a.strip()]


def _arglists(llir, prefix, sym):
    """The parenthesised lists after each ``<prefix> ... @sym(`` (nested parentheses kept together)."""
    out = []
    for m in re.finditer(rf"{prefix} [^@\n]*@{sym}\(", llir):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(llir[i], 0)
            i += 1
        out.append(_params(llir[m.end():i - 1]))
    return out


def _linked_calls(llir):
    """{rocSHMEM symbol: (definition's parameter types, [each call's argument types])} in optimised IR.
    LLVM may drop parameters that are constant at every call site from an internal function (and its
    calls) after linking; so a definition is the prototype or a subsequence of it."""
    return {sym: (_arglists(llir, "define", sym)[0], _arglists(llir, "call", sym))
            for sym in re.findall(r"^define [^@\n]*@(rocshmem_\w+)\(", llir, re.M)}


def _check_linked(llir, expected):
    linked = _linked_calls(llir)
    assert set(expected) <= set(linked), set(expected) - set(linked)
    for sym, (defined, calls) in linked.items():
        proto = iter(F.llvm_prototype(sym)[1])
        assert all(any(t == p for p in proto) for t in defined), (sym, defined)   # a subsequence, in order
        assert calls and all(c == defined for c in calls), (sym, defined, calls)
    return linked


def _body(llir, sym):
    m = re.search(rf"define [^@]*@{sym}\([^)]*\)[^{{]*\{{(.*?)\n\}}", llir, re.S)
    return m.group(1)


_SIG = {"dst": "*i8", "src": "*i8", "nbytes": "i64", "sig": "*u64", "pe": "i32", "out": "*u64"}
CASES = [
    (K.k_shmem_ids, {"out": "*i32"}, ["rocshmem_my_pe", "rocshmem_n_pes"]),
    (K.k_shmem_ptrs, {"x": "*fp32", "out": "*fp32", "pe": "i32"}, ["rocshmem_ptr"]),
    (K.k_shmem_put_get, {"dst": "*i8", "src": "*i8", "nbytes": "i64", "pe": "i32"},
     [f"rocshmem_{op}{s}" for op in ("putmem", "getmem") for s in ("", "_nbi", "_wg", "_nbi_wg", "_wave",
                                                                   "_nbi_wave")]),
    (K.k_shmem_signal, _SIG, [f"rocshmem_putmem_signal{s}" for s in ("", "_nbi", "_wg", "_nbi_wg", "_wave",
                                                                       "_nbi_wave")]
     + ["rocshmem_uint64_atomic_add", "rocshmem_uint64_wait_until", "rocshmem_signal_fetch"]),
    (K.k_shmem_sync, {}, ["rocshmem_quiet", "rocshmem_fence"] + [f"rocshmem_{b}_all{s}" for b in ("barrier", "sync")
                                                                  for s in ("", "_wg", "_wave")]),
]


@pytest.mark.parametrize("kernel,sig,symbols", CASES, ids=[c[0].__name__ for c in CASES])
def test_shmem_kernels_link_against_rocshmem_prototypes(fake_rocshmem, kernel, sig, symbols):
    ck = compile_for(kernel, "gfx942", sig)
    assert ck.libraries == ["rocshmem"]
    assert dict(ck.triton_kernel.metadata.extern_libs)["rocshmem"] == fake_rocshmem
    _check_linked(ck.asm["llir"], symbols)
    assert ck.asm["amdgcn"]                        # through the AMDGPU backend to an hsaco


def test_rocshmem_receives_its_own_constants(fake_rocshmem):
    """cmp='ge' reaches rocshmem_uint64_wait_until as ROCSHMEM_CMP_GE (3, not NVSHMEM's 5); sig_op 'set' /
    'add' reach rocshmem_putmem_signal as ROCSHMEM_SIGNAL_SET / _ADD; signal_op 'add' is the uint64 atomic
    add.  The stand-in stores each argument to a sink, so constants propagated into it stay visible."""
    llir = compile_for(K.k_shmem_signal, "gfx942", _SIG).asm["llir"]
    ge, sig_set, sig_add = F.CMPS.index("ROCSHMEM_CMP_GE"), 0, 1
    assert sig_set == F.SIGNAL_OPS.index("ROCSHMEM_SIGNAL_SET") and sig_add == F.SIGNAL_OPS.index("ROCSHMEM_SIGNAL_ADD")

    def stored(sym, slot):
        """The constant the stand-in stores from parameter ``slot``: propagated into the body, or passed."""
        body = _body(llir, sym)
        m = re.search(rf"store volatile i32 (\d+), ptr addrspace\(1\) getelementptr inbounds nuw \(i8, ptr "
                      rf"addrspace\(1\) @rocshmem_fake_sink, i64 {slot * 8}\)", body) or \
            re.search(rf"store volatile i32 (\d+), ptr addrspace\(1\) getelementptr [^\n]*@rocshmem_fake_sink, "
                      rf"i64 0, i64 {slot}\)", body) or \
            (re.search(r"store volatile i32 (\d+), ptr addrspace\(1\) @rocshmem_fake_sink,", body) if slot == 0
             else None)
        assert m, (sym, slot, body)
        return int(m.group(1))

    assert stored("rocshmem_uint64_wait_until", 1) == ge
    assert stored("rocshmem_putmem_signal", 5) == sig_set
    assert stored("rocshmem_putmem_signal_nbi", 5) == sig_add
    assert "rocshmem_uint64_atomic_set" not in llir      # the kernel's signal_op adds


def test_notify_inter_node_uses_the_uint64_atomic_once(fake_rocshmem):
    ck = compile_for(K.k_notify_inter, "gfx942", {"sig": "*u64", "peer": "i32"})
    assert 'symbol = "ditron_rocshmem_uint64_atomic_add_once"' in ck.asm["ttir"]
    _check_linked(ck.asm["llir"], ["rocshmem_uint64_atomic_add"])
    assert "define i32 @ditron_rocshmem_uint64_atomic_set_once" in hip.LIB.text()


def test_remote_mc_ptr_is_refused_on_amd(fake_rocshmem):
    """No rocSHMEM has a multicast address: refused while tracing, naming the op, the target and what to use."""
    with pytest.raises(Exception) as e:
        compile_for(K.k_shmem_mc, "gfx942", {"x": "*fp32", "out": "*fp32"})
    msg = str(e.value)
    assert "shmem.remote_mc_ptr" in msg and "target gfx942" in msg and "symm_at" in msg


#: the zoo's shmem.* call sites (multi-node paths): module, kernel, constexprs, rocSHMEM functions linked.
#: ag_gemm and gemm_rs reach rocSHMEM through all_gather's _put_chunk (compiled here in all_gather_kernel).
ZOO = [
    ("all_gather", "all_gather_kernel", dict(METHOD=0, ELEM_BYTES=2, BLOCK=1024), ["rocshmem_putmem_signal_wg"]),
    ("all_to_all", "all_to_all_kernel", dict(EQUAL=False, ELEM_BYTES=2, WP=2, BLOCK=1024),
     ["rocshmem_putmem_wg", "rocshmem_fence", "rocshmem_putmem_signal_wg"]),
    ("ep_kernels", "ep_dispatch_kernel", dict(ELEM_BYTES=2, WP=2, ELP=16, BR=8, BH=1024, TRACE=False),
     ["rocshmem_putmem_wg", "rocshmem_fence"]),
    ("ep_ll_kernels", "ep_ll_dispatch_kernel", dict(PEERS=True, EPW=2, WP=2, ELP=16, EP=16, BLK=32, BR=4, BW=512,
                                                     CB=2048, STRIDED=False, TRACE=False),
     ["rocshmem_putmem_wg"]),
    # small tiles and top-2 (the owner side's put does not depend on them; the top-8 tiles took ~15 CPU-s here,
    # test_ep.py compiles them for sm_90a)
    ("ep_ll_kernels", "ep_ll_combine_kernel", dict(PEERS=True, EPW=2, WP=2, ELP=16, BR=2, BW=32, KT=2, RB=2, RW=32,
                                                     TRACE=False),
     ["rocshmem_putmem_wg"]),
]
#: 64-bit index / count / signal tensors of those kernels (the rest are bf16 data, w_ptr fp32)
_ZOO_I64 = {"tok_ptr", "send_ptr", "rc_ptr", "rcnt_ptr", "cnt_ptr", "cstage_ptr", "sig_ptr", "calls_ptr", "pos_ptr",
            "eid_ptr", "slot_ptr", "lrc_ptr", "lrecv_ptr", "lcnt_ptr", "lstage_ptr", "peid_ptr", "pslot_ptr",
            "lcomb_ptr", "splits_ptr", "recv_counts_ptr", "start_ptr", "trace_ptr", "idx_ptr", "key_ptr",
            "dropped_ptr"}
_ZOO_I32 = {"hist_ptr", "rslot_ptr"}


@pytest.mark.parametrize("module,name,const,symbols", ZOO, ids=[z[1] for z in ZOO])
def test_zoo_shmem_kernels_compile_for_gfx942(fake_rocshmem, module, name, const, symbols):
    """Each zoo kernel that calls shmem.* compiles for gfx942 (multi-node path) and links rocSHMEM's
    functions with their exact prototypes."""
    import importlib
    kernel = getattr(importlib.import_module(f"ditron.kernels.{module}"), name)
    const = dict(const, MULTI_NODE=True)
    sig = {p: ("*i64" if p in _ZOO_I64 else "*i32" if p in _ZOO_I32 else "*fp32" if p == "w_ptr" else "*bf16")
           if p.endswith("_ptr") else "i32"
           for p in inspect.signature(kernel.fn).parameters if p not in const
           and p not in {q.name for q in kernel.params if q.is_constexpr and q.has_default}}   # they take theirs
    ck = ditron.compile(kernel, target="gfx942", signature=sig, constexprs=const, num_warps=4)
    assert ck.libraries == ["rocshmem"]
    _check_linked(ck.asm["llir"], symbols)


# ---------------------------------------------------------------------------
# finding the bitcode: by architecture
# ---------------------------------------------------------------------------

@pytest.fixture
def no_rocshmem_env(monkeypatch, tmp_path):
    for k in ("DITRON_ROCSHMEM_BC", "ROCSHMEM_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    return monkeypatch


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"BC\xc0\xde")
    return str(path)


def test_bitcode_is_chosen_by_arch(no_rocshmem_env, tmp_path):
    home = tmp_path / "rocshmem"
    no_rocshmem_env.setenv("ROCSHMEM_HOME", str(home))
    assert libs.rocshmem_bitcode("gfx942") is None
    other = _touch(home / "lib" / "librocshmem_device_gfx90a.bc")
    with pytest.raises(LibraryError) as e:
        libs.rocshmem_bitcode("gfx942")
    assert "gfx942" in str(e.value) and other in str(e.value) and "GPU_TARGETS=gfx942" in str(e.value)
    mine = _touch(home / "lib" / "librocshmem_device_gfx942.bc")
    assert libs.rocshmem_bitcode("gfx942") == mine
    assert libs.rocshmem_bitcode("gfx90a") == other
    # an older layout: one bitcode without an architecture in its name, under $ROCM_PATH/lib
    no_rocshmem_env.delenv("ROCSHMEM_HOME")
    rocm = tmp_path / "rocm"
    no_rocshmem_env.setenv("ROCM_PATH", str(rocm))
    old = _touch(rocm / "lib" / "librocshmem_device.bc")
    assert libs.rocshmem_bitcode("gfx942") == old
    # an explicit file naming another architecture is refused
    no_rocshmem_env.setenv("DITRON_ROCSHMEM_BC", other)
    with pytest.raises(LibraryError, match=r"gfx90a.*compiled for gfx942.*librocshmem_device_gfx942\.bc"):
        libs.rocshmem_bitcode("gfx942")


def test_missing_bitcode_error_names_the_file_for_the_arch(no_rocshmem_env):
    with pytest.raises(LibraryError) as e:
        libs.shmem_library(ditron.parse_target("gfx942"))
    msg = str(e.value)
    assert "librocshmem_device_gfx942.bc" in msg and "DITRON_ROCSHMEM_BC" in msg and libs.ROCSHMEM_SUPPORTED in msg


def test_doctor_line_reports_version_and_exports(no_rocshmem_env, tmp_path):
    symbols = T.rocshmem_symbols()
    path, line = libs.rocshmem_report(symbols)
    assert path is None and "not found for gfx942" in line and libs.ROCSHMEM_SUPPORTED in line
    prefix = tmp_path / "install"
    bc = _touch(prefix / "lib" / "librocshmem_device_gfx942.bc")
    no_rocshmem_env.setenv("ROCSHMEM_HOME", str(prefix))
    (prefix / "include" / "rocshmem").mkdir(parents=True)
    (prefix / "include" / "rocshmem" / "rocshmem_config.h").write_text('#define ROCSHMEM_VERSION "3.2.0"\n')
    assert libs.rocshmem_version(bc) == "3.2.0"
    # a stand-in llvm-nm that lists all but one export
    nm = tmp_path / "llvm-nm"
    have = sorted(symbols)[1:]
    nm.write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(have) + "\n")
    nm.chmod(0o755)
    assert libs.rocshmem_missing_exports(bc, symbols, nm=str(nm)) == sorted(symbols)[:1]
    no_rocshmem_env.setattr(libs, "_llvm_nm", lambda _bc: str(nm))
    path, line = libs.rocshmem_report(symbols)
    assert path == bc and "3.2.0 is OLDER" in line and "MISSING 1 of the C functions" in line
    assert sorted(symbols)[0] in line


# ---------------------------------------------------------------------------
# ROCm at run time: a clear error, not a null context
# ---------------------------------------------------------------------------

def test_rocm_runtime_errors_say_what_is_missing(monkeypatch, tmp_path):
    import json
    import types

    from ditron.runtime import gpu, gpu_base
    fake_torch = types.SimpleNamespace(version=types.SimpleNamespace(hip="6.4.1"),
                                       cuda=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setitem(__import__("sys").modules, "torch", fake_torch)
    with pytest.raises(ditron.DitronError) as e:
        gpu._torch()
    msg = str(e.value)
    assert "ROCm" in msg and "HIP 6.4.1" in msg and "rocshmem_hipmodule_init" in msg and "backend='sim'" in msg
    # a loaded module that links rocSHMEM: refused before any driver call
    meta = tmp_path / "k.json"
    meta.write_text(json.dumps({"extern_libs": [["ditron", "/x/libditron.ll"], ["rocshmem", "/x/r.bc"]]}))
    monkeypatch.setattr(gpu_base, "_current_device_index", lambda: pytest.fail("touched the device"))
    with pytest.raises(ditron.DitronError) as e:
        gpu_base._on_kernel_load(1234, None, "k_shmem_ids", {"k.json": str(meta)})
    msg = str(e.value)
    assert "k_shmem_ids" in msg and "ROCSHMEM_CTX_DEFAULT" in msg and "rocshmem_hipmodule_init" in msg
    assert "dl.symm_at" in msg


def test_docs_amd_column_matches_the_table():
    """docs/language.md's shmem table names exactly the rocSHMEM functions ditron calls."""
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "language.md")).read()
    rows = doc[doc.index("| ditron | NVIDIA symbol | AMD symbol | result |"):].split("\n\n")[0].splitlines()[2:]
    named = set()
    for row in rows:
        amd = row.split(" | ")[2]
        for alt in amd.split(", then ") if ", then " in amd else [amd]:
            for group in re.split(r"\) / ", alt):
                tokens = re.findall(r"`([^`]+)`", group)
                tokens = [t for t in tokens if t.startswith(("rocshmem_", "_"))]
                if not tokens:
                    continue
                first = tokens[0]
                stem = re.sub(r"_(wave|wg)$", "", first)
                names = [first] + [stem + t for t in tokens[1:]]
                for n in names:
                    named.update({n.replace("[_nbi]", ""), n.replace("[_nbi]", "_nbi")})
    assert named == set(T.rocshmem_symbols()), named ^ set(T.rocshmem_symbols())
