"""Distributed IR (spec, verifier, text form), the porting example, the CLI,
and import hygiene."""
import inspect
import os
import re
import subprocess
import sys

import pytest

import ditron
import ditron.language as dl
from ditron.ir import OPS, Op, spec_table, verify
from ditron.lowering import rules_for
from ditron.target import parse_target

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIG = "x_ptr=*fp16,out_ptr=*fp16,sig_ptr=*i32,n=i32"


def test_every_op_has_a_rule_on_each_backend_that_supports_it():
    for backend in ("cuda", "hip"):
        have = rules_for(backend)
        for kind, spec in OPS.items():
            if backend in spec.backends:
                assert kind in have, (kind, backend)


def test_every_language_function_is_documented():
    names = [n for n in dl.__all__ if n not in ("shmem", "libshmem_device")]
    names += [f"shmem.{n}" for n in dir(dl.shmem) if callable(getattr(dl.shmem, n)) and not n.startswith("_")
              and n not in ("builtin", "emit")]
    for name in names:
        obj = dl
        for part in name.split("."):
            obj = getattr(obj, part)
        doc = inspect.getdoc(obj) or ""
        assert len(doc) > 25, f"{name} needs a docstring"


def test_triton_distributed_names():
    import ditron.language.libshmem_device as lsd
    assert lsd is dl.shmem
    for n in ("my_pe", "n_pes", "remote_ptr", "remote_mc_ptr", "putmem", "getmem", "putmem_nbi", "getmem_nbi",
              "putmem_block", "putmem_warp", "putmem_nbi_block", "putmem_signal", "putmem_signal_nbi",
              "putmem_signal_nbi_block", "signal_op", "signal_wait_until", "quiet", "fence", "barrier_all",
              "barrier_all_block", "sync_all"):
        assert hasattr(lsd, n), n
    sig = inspect.signature(dl.wait)
    assert list(sig.parameters)[:5] == ["barrier_ptrs", "num_barriers", "scope", "semantic", "waitValue"]
    assert sig.parameters["waitValue"].default == 1


def test_verifier_rejects_bad_attributes_without_tracing():
    op = Op("fence", {}, {"semantic": "acquire", "scope": "planet"}, line=3, file="k.py")
    with pytest.raises(ditron.DitronCompileError) as info:
        verify(op, parse_target("gfx942"))
    msg = str(info.value)
    assert "dl.fence" in msg and "argument 'scope'" in msg and "gfx942" in msg and "k.py:3" in msg
    verify(Op("fence", {}, {"semantic": "acquire", "scope": "sys"}), parse_target("gfx942"))


def test_spec_table_lists_all_ops():
    table = spec_table()
    for kind in OPS:
        assert f"| {kind} |" in table


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ditron", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_porting_example_compiles_for_both_targets():
    from ditron.kernels import ring_pull_kernel
    for target, key in (("sm_90a", "ptx"), ("gfx942", "amdgcn")):
        ck = ditron.compile(ring_pull_kernel, target=target,
                            signature={"x_ptr": "*fp16", "out_ptr": "*fp16", "sig_ptr": "*i32", "n": "i32"},
                            constexprs={"BLOCK": 1024})
        assert ck.asm[key]
        assert ck.dist_ir.kinds == ["rank", "num_ranks", "wait", "symm_at", "consume_token"]


def test_cli_emit_dist_ir_lists_ops_with_source_lines():
    r = _cli("compile", "kernels/porting_example.py::ring_pull_kernel", "--target", "sm_90a", "--signature", SIG,
             "--constexpr", "BLOCK=1024", "--emit", "dist-ir")
    assert r.returncode == 0, r.stderr
    src = open(os.path.join(ROOT, "kernels", "porting_example.py")).read().splitlines()
    wait_line = next(i + 1 for i, l in enumerate(src) if "dl.wait(" in l)
    assert f"dist.wait(" in r.stdout and f"loc(porting_example.py:{wait_line})" in r.stdout
    assert 'scope = "sys", semantic = "acquire"' in r.stdout
    for kind in ("dist.rank(", "dist.num_ranks(", "dist.symm_at(", "dist.consume_token("):
        assert kind in r.stdout


def test_cli_emit_amdgcn_and_ptx():
    r = _cli("compile", "kernels/porting_example.py::ring_pull_kernel", "--target", "gfx942", "--signature", SIG,
             "-D", "BLOCK=1024", "--emit", "amdgcn")
    assert r.returncode == 0, r.stderr
    assert "buffer_inv sc0 sc1" in r.stdout and "s_barrier" in r.stdout
    r = _cli("compile", "kernels/porting_example.py::ring_pull_kernel", "--target", "sm_90a", "--signature", SIG,
             "-D", "BLOCK=1024", "--emit", "ptx")
    assert r.returncode == 0, r.stderr
    assert "ld.acquire.sys.global.b32" in r.stdout


def test_cli_reports_compile_errors():
    r = _cli("compile", "kernels/porting_example.py::ring_pull_kernel", "--target", "gfx942", "--signature",
             "x_ptr=i32,out_ptr=*fp16,sig_ptr=*i32,n=i32", "-D", "BLOCK=1024")
    assert r.returncode == 1
    assert "dl.symm_at" in r.stderr and "argument 'ptr'" in r.stderr


def test_doctor_runs_without_gpu():
    r = _cli("doctor")
    assert r.returncode == 0, r.stderr
    assert "triton" in r.stdout and "lowering      cuda" in r.stdout and "NVSHMEM" in r.stdout


def test_import_does_not_touch_the_gpu_driver():
    code = ("import triton, ditron, ditron.language, ditron.kernels; "
            "from triton.runtime import driver; "
            "print('ACTIVE' if driver._active is not None else 'LAZY')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "LAZY"


def test_jit_takes_triton_options():
    from kernels_for_tests import k_plain
    assert isinstance(k_plain, ditron.DitronJITFunction)
    assert [p.do_not_specialize for p in k_plain.params] == [False, False, True]
    with pytest.raises(TypeError, match="unknown option"):
        ditron.jit(bogus=True)


def test_cli_value_specialises_as_a_launch():
    # --value n=4096: n known divisible by 16, as a launch passing 4096 makes it -- the masked loads vectorise
    # (docs/porting.md); without it, scalar loads; a value that is not an integer is refused
    sig = "x_ptr=*fp16,out_ptr=*fp16,sig_ptr=*i32"
    r = _cli("compile", "kernels/porting_example.py::ring_pull_kernel", "--target", "sm_90a", "--signature", sig,
             "-D", "BLOCK=1024", "--value", "n=4096", "--emit", "ptx")
    assert r.returncode == 0, r.stderr
    assert re.search(r"ld\.global(\.nc)?\.v4", r.stdout)
    r = _cli("compile", "kernels/porting_example.py::ring_pull_kernel", "--target", "sm_90a", "--signature", SIG,
             "-D", "BLOCK=1024", "--emit", "ptx")
    assert r.returncode == 0 and not re.search(r"ld\.global(\.nc)?\.v4", r.stdout)
    r = _cli("compile", "kernels/porting_example.py::ring_pull_kernel", "--value", "n=many")
    assert r.returncode != 0 and "--value expects NAME=INTEGER" in r.stderr
