"""A new user's mistakes, round 2 (issue 57): each must be an error that names the mistake -- at once where
it can be -- not a silent wrong result, a foreign message or a report longer than a screen."""
import os
import textwrap

import pytest

from ditron.errors import DitronError

sim_only = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator checks")

SCRIPT = '''
import argparse, os
import torch
import triton
import triton.language as tl
import ditron
import ditron.language as dl

BLOCK = tl.constexpr(64)
SCALE = tl.constexpr(float(os.environ.get("SCALE_FOR_TEST", "2.0")))
{extra}

@triton.jit
def _scaled(v):
    return v * SCALE


@ditron.jit
def pull_kernel(x_ptr, out_ptr, sig_ptr, n):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    peer = (dl.rank() + 1) % dl.num_ranks()
    token = dl.wait(sig_ptr + peer, 1, "sys", "acquire", waitValue=1)
    src = dl.consume_token(dl.symm_at(x_ptr + offs, peer), token)
    tl.store(out_ptr + offs, _scaled(tl.load(src, mask=mask)), mask=mask)


parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, required=True)
args = parser.parse_args()
world = ditron.init()
print("SCRIPT TOP LEVEL RAN")
'''


def _compile(tmp_path, capsys, extra="", kernel="pull_kernel"):
    from ditron import cli
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT.format(extra=textwrap.dedent(extra)))
    try:
        rc = cli.main(["compile", f"{path}::{kernel}", "--target", "sm_90a", "--signature",
                       "x_ptr=*fp16,out_ptr=*fp16,sig_ptr=*i32,n=i32", "--emit", "dist-ir"])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_compile_does_not_run_the_scripts_top_level(tmp_path, capsys):
    """`ditron compile FILE::KERNEL` on a script with argparse, ditron.init() and a print at its top level:
    the kernel (with module constants and a @triton.jit helper) compiles, and none of the
    script's code runs (no foreign `usage:` line, no 'no CUDA GPU')."""
    rc, out, err = _compile(tmp_path, capsys)
    assert rc == 0, (out, err)
    assert "usage:" not in err and "SCRIPT TOP LEVEL RAN" not in out + err and "CUDA" not in err
    assert "dist.wait(" in out and "dist.symm_at(" in out and "loc(user_script.py:" in out


def test_compile_names_the_failing_statement_and_the_guard(tmp_path, capsys):
    """A statement the kernel needs that fails is reported with its line and the `__main__` guard rule; a kernel
    only defined under the guard is named as such."""
    rc, out, err = _compile(tmp_path, capsys, extra="SCALE = tl.constexpr(float(os.environ['NO_SUCH_VARIABLE_57']))")
    text = str(rc) + err
    assert "user_script.py:11, a statement that kernel 'pull_kernel' needs, failed: KeyError" in text, text
    assert 'if __name__ == "__main__":' in text and "never '__main__'" in text
    rc, out, err = _compile(tmp_path, capsys, extra="if __name__ == '__main__':\n    def late_kernel(): pass\n",
                            kernel="late_kernel")
    text = str(rc) + err
    assert "has no kernel 'late_kernel' at its top level" in text and "defined under `if __name__" in text


def _fails(world, body, *args):
    with pytest.raises(DitronError) as info:
        world.run(body, *args)
    return str(info.value)


@sim_only
def test_wait_outside_its_tensor_fails_at_once(dist_world):
    """dl.wait on words past the end of its symmetric tensor, in no live tensor (it hung until the deadlock
    timeout), fails at once like dl.notify, naming the tensor, the element and the argument; so does a wait whose
    num_barriers words run past the tensor's end; waits inside the tensor run."""
    import bodies_mistakes2 as B
    w = dist_world(2)
    assert w.run(B.wait_past_end, 0, 32) == [True, True]
    assert w.run(B.wait_past_end, 31, 1) == [True, True]
    text = _fails(w, B.wait_past_end, 32, 1)
    assert "dl.wait" in text and "argument 'barrier_ptrs'" in text and "in no live symmetric tensor" in text, text
    assert "element 32 of symmetric tensor 'flags' (int32[32]" in text and "past its end (32 elements)" in text
    text = _fails(w, B.wait_past_end, 30, 3)
    assert "12 bytes from element 30 of symmetric tensor 'flags' (int32[32]" in text and "run 4 bytes past" in text
    assert "num_barriers=3 words from there are more than the tensor holds" in text


@sim_only
def test_block_mask_and_scalar_condition(dist_world):
    """`mask=cm & (dl.rank() > 0)` (a block mask with a scalar i1 condition) loads and stores as on GPUs; it
    died with Triton 3.9's interpreter's "mask has unsupported dtype"."""
    import bodies_mistakes2 as B
    assert dist_world(2).run(B.scalar_condition_in_mask) == [True, True]


def test_loop_body_ops_are_recorded_once():
    """The distributed IR lists each op of a `for` / `while` body once, as the PTX has it (Triton visits a loop
    body twice: once to find the loop-carried values, in a block it erases)."""
    import ditron
    import bodies_mistakes2 as B
    ck = ditron.compile(B.loop_signals, target="sm_90a", signature={"sig_ptr": "*i32", "n": "i32"})
    assert ck.dist_ir.kinds == ["wait", "notify"], ck.asm["dist_ir"]
    assert ck.asm["dist_ir"].count("dist.wait(") == 1 and ck.asm["dist_ir"].count("dist.notify(") == 1
    assert ck.asm["ptx"].count("ld.acquire.sys") == 1


@sim_only
def test_hang_report_collapses_identical_waits():
    """27 programs per rank blocked on the same word with the same wrong value: one line per rank naming the
    programs it covers (not 27 identical lines); the report's entries stay one per program."""
    import bodies_mistakes2 as B
    from ditron.errors import DitronHangError
    from ditron.sim.pool import SimCluster
    with SimCluster(2, hang_timeout=1.5) as w:
        assert w.run(B.wrong_signal_value, 1) == [True, True]
        with pytest.raises(DitronHangError) as info:
            w.run(B.wrong_signal_value, 2)
    assert len(info.value.report) == 54
    lines = str(info.value).splitlines()[1:]
    assert len(lines) == 2, lines
    for r, line in enumerate(sorted(lines)):
        assert line.startswith(f"  rank {r}, 27 programs: (0..8, 0..2, 0): blocked in dl.wait "
                               "at bodies_mistakes2.py:"), line
        assert "symmetric tensor 'ready'" in line and "expected: == 2; observed: 1" in line


def test_ditron_sim_deadlock_report_collapses_identical_waits():
    """`ditron sim`'s deadlock report (the launcher's printer) collapses them too; different waits stay apart."""
    import io
    from ditron.sim.launcher import print_deadlock
    same = dict(rank=0, primitive="dl.wait", where="k.py:7", signal="symmetric tensor 'ready'", expected="== 2",
                observed=1)
    entries = [dict(same, program=(p, 0, 0)) for p in range(200)] + [dict(same, program=(0, 1, 0), observed=0)]
    out = io.StringIO()
    print_deadlock({0: {"kind": "hang", "report": entries}}, [None, 0], 30, out)
    lines = out.getvalue().splitlines()
    assert lines[1:] == ["  rank 0, 200 programs: (0..199, 0, 0): blocked in dl.wait at k.py:7; signal: symmetric "
                         "tensor 'ready'; expected: == 2; observed: 1",
                         "  rank 0, program (0, 1, 0): blocked in dl.wait at k.py:7; signal: symmetric tensor "
                         "'ready'; expected: == 2; observed: 0",
                         "  rank 1: finished"], lines
