"""``ditron.compile`` and Triton's on-disk cache: the front end always runs (it records the distributed IR and
finds the device libraries a kernel needs); the backend stages (TTIR passes, LLVM, ptxas / lld) are reused when
the same Triton IR was compiled before, and only then."""
import pytest
import triton

import ditron
import ditron.compiler as C
import kernels_for_tests as K
from conftest import compile_for


@pytest.fixture
def backend_runs(tmp_path, monkeypatch):
    """A fresh Triton cache; the list of (kernel name, cache hit) of every ``triton.compile`` that follows."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.delenv("DITRON_COMPILE_CACHE", raising=False)     # whatever the environment of the run says
    # (Triton's knobs write their variable into os.environ when set, and again when monkeypatch restores them:
    # setting the variable first makes monkeypatch's undo of it, which runs last, leave it as it was)
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "0")
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", False)
    seen = []

    def listener(src, metadata, metadata_group, times, cache_hit):
        seen.append((src.name, cache_hit))

    monkeypatch.setattr(triton.knobs.compilation, "listener", listener)
    return seen


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_second_compile_reuses_the_backend_and_is_identical(backend_runs, target):
    sig = {"sig": "*i32", "x": "*fp16", "out": "*fp16", "n": "i32"}
    const = {"BLOCK": 256, "SCOPE": "gpu", "SEM": "acquire"}
    first = compile_for(K.k_wait, target, sig, const)
    second = compile_for(K.k_wait, target, sig, const)
    assert backend_runs == [("k_wait", False), ("k_wait", True)]
    binary = "cubin" if target == "sm_90a" else "hsaco"
    for stage in ("ttir", "ttgir", "llir", binary, "dist_ir"):
        assert first.asm[stage] == second.asm[stage], stage
    # the distributed IR is recorded on a cache hit too (the front end ran)
    assert [o.kind for o in second.dist_ir.ops] == ["wait", "consume_token"]
    assert second.dist_ir.ops[0].attrs == first.dist_ir.ops[0].attrs


def test_other_triton_ir_is_a_miss(backend_runs):
    sig = {"sig": "*i32", "x": "*fp16", "out": "*fp16", "n": "i32"}
    a = compile_for(K.k_wait, "sm_90a", sig, {"BLOCK": 256, "SCOPE": "gpu", "SEM": "acquire"})
    b = compile_for(K.k_wait, "sm_90a", sig, {"BLOCK": 256, "SCOPE": "sys", "SEM": "acquire"})
    assert backend_runs == [("k_wait", False), ("k_wait", False)]
    assert "ld.acquire.gpu.global" in a.asm["ptx"] and "ld.acquire.sys.global" in b.asm["ptx"]


def test_key_covers_the_triton_ir_and_ditron_sources(monkeypatch):
    ttir = "module { tt.func @k() { tt.return } }"
    key = C._cache_key(ttir)
    assert C._cache_key(ttir) == key
    assert C._cache_key(ttir.replace("@k", "@j")) != key          # what ditron's lowering emitted
    monkeypatch.setattr(C, "_SOURCE_DIGEST", ["another ditron"])
    assert C._cache_key(ttir) != key                                # the ditron that emitted it


def test_a_lowering_change_is_a_miss(backend_runs, monkeypatch):
    """A change in what ditron's lowering emits changes the Triton IR, hence the key, although the kernel's
    source, the options and Triton's own key are the same: here the rule of ``dl.rank`` is swapped for the rule
    of ``dl.num_ranks`` (a stale cache hit would keep the rank's descriptor words)."""
    import ditron.lowering as L
    L.lookup("rank", ditron.target.parse_target("sm_90a"))           # rules of the backend loaded
    a = compile_for(K.k_rank, "sm_90a", {"out": "*i32"})
    monkeypatch.setitem(L._RULES, ("rank", "cuda"), L._RULES[("num_ranks", "cuda")])
    b = compile_for(K.k_rank, "sm_90a", {"out": "*i32"})
    assert backend_runs == [("k_rank", False), ("k_rank", False)]
    assert "[__ditron_world+8]" in a.asm["ptx"] and "[__ditron_world+8]" not in b.asm["ptx"]


def test_shmem_kernel_finds_its_library_on_a_hit(backend_runs, nvshmem_bc):
    sig = {"dst": "*i8", "src": "*i8", "nbytes": "i64", "pe": "i32"}
    first = compile_for(K.k_shmem_put_get, "sm_90a", sig)
    second = compile_for(K.k_shmem_put_get, "sm_90a", sig)
    assert first.libraries == second.libraries == ["libnvshmem_device"]
    assert backend_runs[-1] == ("k_shmem_put_get", True)
    assert first.asm["ptx"] == second.asm["ptx"]


def test_opt_out_always_runs_the_backend(backend_runs, monkeypatch):
    monkeypatch.setenv("DITRON_COMPILE_CACHE", "0")
    for _ in range(2):
        ck = compile_for(K.k_rank, "sm_90a", {"out": "*i32"})
        assert [o.kind for o in ck.dist_ir.ops] == ["rank", "num_ranks", "rank", "num_ranks"]
    assert backend_runs == [("k_rank", False), ("k_rank", False)]


def test_lint_findings_on_a_hit(backend_runs):
    """The compile-time lint reads the distributed IR, which a cache hit records too: the same finding, the
    same warning."""
    import lint_kernels as LK
    from ditron.errors import DitronLintWarning
    sig = {"data_ptr": "*fp32", "flag_ptr": "*i32", "n": "i32"}
    found = []
    for _ in range(2):
        with pytest.warns(DitronLintWarning, match="relaxed-signal"):
            ck = ditron.compile(LK.relaxed_flag_producer, "sm_90a", sig, {"BLOCK": 64})
        found.append([(f.rule, f.line) for f in ck.lint])
    assert backend_runs == [("relaxed_flag_producer", False), ("relaxed_flag_producer", True)]
    assert found[0] == found[1] and found[0][0][0] == "relaxed-signal"


def test_ptxas_log_on_two_threads(capsys):
    """Two threads collect ptxas logs at once (ditron.compile on two threads): each gets its own logs, the rest of
    what they print reaches stdout, and sys.stdout and the knob are as before once both left, whichever leaves
    first."""
    import sys
    import threading
    from ditron import _compat
    knobs = getattr(triton.knobs, "nvidia", None)
    if knobs is None or not hasattr(knobs, "dump_ptxas_log"):
        pytest.skip("this Triton has no dump_ptxas_log knob: ptxas_log() collects nothing")
    stdout, knob = sys.stdout, knobs.dump_ptxas_log
    got, step = {}, threading.Barrier(2)

    def run(name, first_out):
        with _compat.ptxas_log() as logs:
            step.wait()                                  # both inside
            print(f"ptxas info    : Used 1{name} registers")
            print(f"not a log {name}")
            step.wait()                                  # both printed
            assert knobs.dump_ptxas_log is True
            if not first_out:
                step.wait()                              # the other left first
        if first_out:
            step.wait()
        got[name] = logs
    threads = [threading.Thread(target=run, args=("A", True)), threading.Thread(target=run, args=("B", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {"A": ["ptxas info    : Used 1A registers"], "B": ["ptxas info    : Used 1B registers"]}
    assert sys.stdout is stdout and knobs.dump_ptxas_log == knob
    assert sorted(capsys.readouterr().out.splitlines()) == ["not a log A", "not a log B"]


def test_triton_knobs_leave_the_environment_as_it_was(monkeypatch):
    """ditron sets Triton knobs around a compile (always_compile, the ptxas log); Triton 3.9's knobs write their
    TRITON_* variable into os.environ when set, and a ditron sim job started later inherits the environment
    (its zygote declines a job whose environment differs). Set or unset before, each variable is as it was after."""
    import os
    from ditron import _compat
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE", raising=False)
    monkeypatch.setenv("TRITON_DUMP_PTXAS_LOG", "0")
    before = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
    with _compat.always_compile():
        assert triton.knobs.compilation.always_compile is True
    with _compat.ptxas_log():
        pass
    assert {k: v for k, v in os.environ.items() if k.startswith("TRITON_")} == before
    assert triton.knobs.compilation.always_compile is False
