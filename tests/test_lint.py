"""The compile-time lint (ditron/lint.py, issue 15 item 2): the three racy
patterns are flagged by ditron.compile / ditron compile (warning, or an error
with DITRON_STRICT=1), their correct versions are not, and no zoo or test
kernel gives a finding (pyproject's filterwarnings also makes every sm_90a
compilation in the other tests fail on a finding)."""
import importlib
import pkgutil
import warnings

import pytest

import ditron
import lint_kernels as L
from ditron import lint
from ditron.jit import DitronJITFunction

SIG = {"data_ptr": "*fp32", "flag_ptr": "*i32", "n": "i32"}
OUT = {"out_ptr": "*fp32"}


def _compile(kernel, extra=None, **constexprs):
    return ditron.compile(kernel, "sm_90a", dict(SIG, **(extra or {})), dict(BLOCK=64, **constexprs))


@pytest.mark.parametrize("kernel,extra,cx,rule,line_of", [
    (L.relaxed_flag_producer, None, {}, "relaxed-signal", "dl.st(dl.symm_at(flag_ptr, peer), 1"),
    (L.relaxed_atomic_producer, None, {"SEM": "relaxed"}, "relaxed-signal", "dl.atomic_add("),
    (L.gpu_scope_consumer, OUT, {}, "gpu-scope-wait", "return dl.wait(flag_ptr"),
    (L.no_token_consumer, OUT, {}, "load-without-token", "tl.load(data_ptr + offs"),
])
def test_racy_pattern_is_flagged(kernel, extra, cx, rule, line_of):
    with pytest.warns(ditron.DitronLintWarning, match=rf"\[{rule}\]") as rec:
        ck = _compile(kernel, extra, **cx)
    assert [f.rule for f in ck.lint] == [rule]
    src = open(L.__file__).read().splitlines()
    assert line_of in src[ck.lint[0].line - 1], (ck.lint[0], src[ck.lint[0].line - 1])
    assert f"kernel {kernel.__name__}: lint_kernels.py:{ck.lint[0].line}" in str(rec[0].message)


@pytest.mark.parametrize("kernel,extra,cx", [(L.correct_exchange, OUT, {}), (L.fenced_relaxed_producer, None, {}),
                                             (L.relaxed_atomic_producer, None, {"SEM": "release"})])
def test_correct_protocol_is_clean(kernel, extra, cx):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ditron.DitronLintWarning)
        ck = _compile(kernel, extra, **cx)
    assert ck.lint == []


def test_strict_mode_fails(monkeypatch):
    monkeypatch.setenv("DITRON_STRICT", "1")
    with pytest.raises(ditron.DitronCompileError, match=r"relaxed_flag_producer: \[relaxed-signal\].*DITRON_STRICT"):
        _compile(L.relaxed_flag_producer)


def test_cli_prints_findings(capsys):
    from ditron.cli import main
    rc = main(["compile", f"{L.__file__}::no_token_consumer", "--target", "sm_90a", "--signature",
               "data_ptr=*fp32,flag_ptr=*i32,out_ptr=*fp32,n=i32", "-D", "BLOCK=64"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "ditron compile: warning: lint_kernels.py:" in err and "[load-without-token]" in err


def _all_kernels():
    """Every @ditron.jit kernel of the zoo and of the tests' kernel / body modules."""
    import os

    import ditron.kernels
    here = os.path.dirname(__file__)
    names = ["ditron.kernels." + m.name for m in pkgutil.iter_modules(ditron.kernels.__path__)]
    names += [m.name for m in pkgutil.iter_modules([here]) if m.name != "lint_kernels" and
              (m.name.startswith(("bodies_", "kernels_")))]
    out = []
    for name in names:
        mod = importlib.import_module(name)
        for k, v in vars(mod).items():
            if isinstance(v, DitronJITFunction) and v.fn.__module__ == mod.__name__:
                out.append((name, k, v))
    return out


#: kernels that hold racy protocols on purpose (under a constexpr MODE): the race finder's fixtures
DELIBERATELY_RACY = {("bodies_sim_rel", "push_kernel"),
                     ("bodies_sim_semantics", "stranded_writer_kernel")}    # its relaxed flag is the point


def test_no_finding_on_zoo_and_test_kernels():
    kernels = [k for k in _all_kernels() if k[:2] not in DELIBERATELY_RACY]
    assert len(kernels) >= 40, [k for _, k, _ in kernels]
    assert {"all_reduce_ll_kernel", "all_gather_kernel", "gemm_ar_kernel", "ag_gemm_consumer_kernel"} <= \
        {k for _, k, _ in kernels}
    found = {(m, k): lint.lint(v) for m, k, v in kernels}
    assert {key: [str(f) for f in fs] for key, fs in found.items() if fs} == {}


def test_lint_flags_the_race_finders_racy_fixture():
    """The race finder's deliberately racy push kernel is what the lint exists to flag."""
    import bodies_sim_rel
    rules = {f.rule for f in lint.lint(bodies_sim_rel.push_kernel)}
    assert {"relaxed-signal", "gpu-scope-wait"} <= rules


def test_zoo_collectives_compile_clean():
    """The zoo kernels no other test compiles for sm_90a, compiled here (their IR attributes included;
    the others are compiled by their own tests, where a finding is an error too)."""
    ag_gemm, all_gather, all_to_all, reduce_scatter = (
        importlib.import_module(f"ditron.kernels.{m}") for m in ("ag_gemm", "all_gather", "all_to_all",
                                                                 "reduce_scatter"))
    p16, i64, i32 = "*fp16", "*i64", "i32"
    jobs = [
        (all_gather.all_gather_kernel, [p16, p16, p16, i64, i64, i32, i32, i32],
         {"METHOD": 0, "MULTI_NODE": False, "ELEM_BYTES": 2, "BLOCK": 256}),
        (reduce_scatter.reduce_scatter_kernel, [p16, p16, p16, "*fp32", i64, i64, i32, i32, i32],
         {"METHOD": 0, "MULTI_NODE": False, "ELEM_BYTES": 2, "WORLD": 4, "BLOCK": 256}),
        (all_to_all.all_to_all_kernel, [p16, p16, i64, i64, p16, i64, i64, i64, i32, i32, i32, i32, i32],
         {"EQUAL": True, "MULTI_NODE": False, "ELEM_BYTES": 2, "WP": 4, "BLOCK": 256}),
        (ag_gemm.ag_gemm_producer_kernel, [p16, p16, i64, i64, i32, i32, p16, p16, i32, i32],
         {"MULTI_NODE": False, "ELEM_BYTES": 2, "BLOCK": 256, "SCALES": False}),
        # fp8: the rows' scales pushed with them
        (ag_gemm.ag_gemm_producer_kernel, ["*fp8e4nv", "*fp8e4nv", i64, i64, i32, i32, "*fp32", "*fp32", i32, i32],
         {"MULTI_NODE": False, "ELEM_BYTES": 1, "BLOCK": 256, "SCALES": True}),
    ]
    from ditron import _compat
    for kernel, types, cx in jobs:
        params = [p for p in _compat.jit_function_params(kernel) if p not in cx]
        with warnings.catch_warnings():
            warnings.simplefilter("error", ditron.DitronLintWarning)
            ck = ditron.compile(kernel, "sm_90a", dict(zip(params, types)), cx)
        assert ck.dist_ir.ops and ck.lint == [], (kernel.__name__, ck.lint)


_SIM_SCRIPT = """
import sys, torch, ditron
sys.path.insert(0, {tests!r})
import lint_kernels as L
ditron.init()
data = ditron.symm_zeros((64,), torch.float32)
flag = ditron.symm_zeros((1,), torch.int32)
for _ in range(2):                     # reported once per kernel, not per launch
    L.relaxed_flag_producer[(1,)](data, flag, 64, BLOCK=64)
ditron.barrier_all()
L.fenced_relaxed_producer[(1,)](data, flag, 64, BLOCK=64)
ditron.barrier_all()
ditron.finalize()
"""


@pytest.mark.parametrize("strict", [False, True])
def test_lint_runs_on_the_simulator(tmp_path, strict):
    """The simulator compiles nothing, but launching a kernel there lints it like a GPU compilation."""
    import os
    import subprocess
    import sys
    script = tmp_path / "racy.py"
    script.write_text(_SIM_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, DITRON_STRICT="1" if strict else "0")
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "2", str(script)], capture_output=True,
                       text=True, timeout=300, env=env)
    if strict:
        assert p.returncode != 0
        assert "relaxed_flag_producer: [relaxed-signal]" in p.stderr and "DITRON_STRICT=1" in p.stderr, p.stderr
    else:
        assert p.returncode == 0, p.stderr
        # one warning for the job (not one per rank process), for the racy kernel only, shown at its line
        assert p.stderr.count("kernel relaxed_flag_producer: lint_kernels.py:18: [relaxed-signal]") == 1, p.stderr
        assert "lint_kernels.py:18: DitronLintWarning" in p.stderr, p.stderr
        assert "fenced_relaxed_producer" not in p.stderr
