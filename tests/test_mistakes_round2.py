"""A new user's mistakes, round 2 (issue 57): each must be an error that names the mistake -- at once where
it can be -- not a silent wrong result, a foreign message or a report longer than a screen."""
import os
import textwrap

import pytest


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


from conftest import fails_with as _fails  # noqa: E402


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


@sim_only
def test_tp_layers_from_different_modules_fail(dist_world):
    """TensorParallelMLP.from_linears from nn.Linear layers that differ across ranks (seeded per rank) is an error
    at construction naming the layer, each rank's weight fingerprint and the fixes; alike layers build and run."""
    import bodies_mistakes2 as B
    w = dist_world(2)
    assert w.run(B.tp_mlp_weights, False) == [[3, 20], [3, 20]]
    text = _fails(w, B.tp_mlp_weights, True)
    assert "TensorParallelMLP.from_linears (fc1): ranks disagree on argument 'weight'" in text, text
    assert "rank 0: bfloat16[40, 24]:" in text and "rank 1: bfloat16[40, 24]:" in text
    assert "torch.manual_seed" in text and "broadcast" in text and "this rank's own shards" in text


@sim_only
def test_tp_layer_wrong_width_names_the_layer(dist_world):
    """An input of the wrong width is reported against the layer and its in_features, not the internal op's
    operand."""
    import bodies_mistakes2 as B
    text = _fails(dist_world(2), B.tp_mlp_wrong_width)
    assert "ditron.nn.ColumnParallelLinear: input must be [rows, 24] (in_features = 24" in text, text
    assert "got torch.bfloat16[3, 40]" in text


def test_fingerprint_sees_every_element():
    """The weight fingerprint changes with any one element, with a swap of two elements, and with the dtype."""
    import torch
    from ditron.nn import fingerprint
    t = torch.randn(64, 33).to(torch.bfloat16)
    base = fingerprint(t)
    assert fingerprint(t.clone()) == base
    for i in (0, 17, 64 * 33 - 1):
        u = t.clone().view(-1)
        u[i] = u[i] + 1
        assert fingerprint(u.view(64, 33)) != base
    u = t.clone().view(-1)
    u[[3, 4]] = u[[4, 3]]
    assert u[3] == u[4] or fingerprint(u.view(64, 33)) != base
    assert fingerprint(t.to(torch.float16)) != base and fingerprint(None) == "none"


def test_grouped_gemm_on_low_latency_recv_x_names_the_workaround():
    """grouped_gemm on a low-latency ep_dispatch's 3-D recv_x (the layout docs/zoo.md shows) says what the layout
    is and what to use (torch.bmm, or a normal-mode context), not only '2-D tensor'."""
    import torch
    from ditron.errors import DitronError
    from ditron.kernels.moe import grouped_gemm
    recv_x = torch.zeros(2, 8, 16, dtype=torch.bfloat16)
    w = torch.zeros(2, 16, 16, dtype=torch.bfloat16)
    with pytest.raises(DitronError) as info:
        grouped_gemm(recv_x, w, torch.tensor([3, 1], dtype=torch.int32))
    text = str(info.value)
    assert "low-latency ep_dispatch's recv_x" in text and "torch.bmm(recv_x, w)" in text and "normal-mode" in text


def test_docs_match_behaviour():
    """docs/porting.md no longer says the simulator runs one thread per program; docs/zoo.md states zig-zag's even
    rows and shows the low-latency recv_x with torch.bmm, not grouped_gemm."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    porting = open(os.path.join(root, "docs", "porting.md")).read()
    assert "runs one thread per program" not in porting
    zoo = open(os.path.join(root, "docs", "zoo.md")).read()
    assert "any\nsequence length" not in zoo and "this rank's `S` must be even" in zoo
    ll = zoo[zoo.index('mode="low_latency", capacity=128)'):]
    assert "torch.bmm(recv_x, w_local)" in ll.split("```")[0]


EXCHANGE = '''
import os
import torch, triton, triton.language as tl
import ditron, ditron.language as dl


@ditron.jit
def exchange(x_ptr, out_ptr, sig_ptr, n, BLOCK: tl.constexpr, BUG: tl.constexpr):
    """Each rank writes its block of x, signals its left neighbour, and copies its right neighbour's block."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    rank = dl.rank()
    left = (rank + dl.num_ranks() - 1) % dl.num_ranks()
    peer = (rank + 1) % dl.num_ranks()
    word = tl.program_id(0) * dl.num_ranks()
    if BUG == "early_signal":
        dl.notify(sig_ptr + word + rank, left, signal=1, sig_op="set", comm_scope="intra_node")
    tl.store(x_ptr + offs, (rank * 1000 + offs).to(tl.float32), mask=mask)
    if BUG != "early_signal":
        dl.notify(sig_ptr + word + rank, left, signal=1, sig_op="set", comm_scope="intra_node")
    if BUG == "no_wait":
        src = dl.symm_at(x_ptr + offs, peer)
    else:
        token = dl.wait(sig_ptr + word + peer, 1, "sys", "acquire", waitValue=1)
        src = dl.consume_token(dl.symm_at(x_ptr + offs, peer), token)
    tl.store(out_ptr + offs, tl.load(src, mask=mask), mask=mask)


world = ditron.init()
n, B = 300, 128
x = ditron.symm_zeros((n,), torch.float32, name="x")
sig = ditron.symm_zeros((triton.cdiv(n, B) * world.world_size,), torch.int32, name="ready")
out = torch.zeros(n)
ditron.barrier_all()
exchange[(triton.cdiv(n, B),)](x, out, sig, n, BLOCK=B, BUG=os.environ["BUG"])
ditron.barrier_all()
want = (world.rank + 1) % world.world_size * 1000 + torch.arange(n, dtype=torch.float32)
assert torch.equal(out, want), f"rank {world.rank}: wrong result"
print(f"rank {world.rank}: ok")
ditron.finalize()
'''


@sim_only
def test_ditron_sim_catches_a_missing_wait_by_default(tmp_path):
    """`ditron sim` without flags runs the race finder: a consumer without its dl.wait and a dl.notify before the
    stores it publishes are reported as data races naming both lines (the early signal passed bitwise before,
    the missing wait whenever the producer happened to be first); the correct kernel passes; --no-race opts
    out."""
    import subprocess
    import sys
    script = tmp_path / "exchange.py"
    script.write_text(EXCHANGE)
    env = {k: v for k, v in os.environ.items() if k not in ("DITRON_SIM_RACE", "DITRON_SIM_SEED")}

    def job(bug, *flags):
        return subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "2", *flags, str(script)],
                              capture_output=True, text=True, timeout=300, env=dict(env, BUG=bug))
    p = job("none")
    assert p.returncode == 0 and p.stdout.count(": ok") == 2, p.stderr
    for bug in ("no_wait", "early_signal"):
        p = job(bug)
        assert p.returncode != 0, (bug, p.stdout)
        assert "data race on symmetric tensor 'x'" in p.stderr, (bug, p.stderr[-3000:])
        assert "write by rank" in p.stderr and "exchange.py:" in p.stderr
    from ditron.sim.launcher import build_parser
    assert build_parser().parse_args(["--no-race", "x.py"]).race is False
    assert build_parser().parse_args(["x.py"]).race is None          # None: the default, on (race.job_default)


def test_simcluster_runs_the_race_finder_by_default(monkeypatch):
    """The harness users copy (ditron.sim.pool.SimCluster, as in docs/simulator.md) has the race finder on
    without flags, like `ditron sim`; DITRON_SIM_RACE=0 or race=False opts out (before: off unless asked)."""
    from ditron.sim.pool import SimCluster
    monkeypatch.delenv("DITRON_SIM_RACE", raising=False)
    with SimCluster(1, hang_timeout=10) as c:
        assert c.race is True
    monkeypatch.setenv("DITRON_SIM_RACE", "0")
    with SimCluster(1, hang_timeout=10) as c:
        assert c.race is False
