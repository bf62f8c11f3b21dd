"""A new user's mistakes on the simulator: each must be an error that names
the mistake (issue 25), not a silent wrong result or a misleading report."""
import pytest

import bodies_mistakes as B
from ditron.errors import DitronError

sim_only = pytest.mark.skipif(__import__("os").environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                              reason="simulator checks")


from conftest import fails_with as _fails  # noqa: E402


@sim_only
def test_megakernel_access_check(dist_world):
    """Ordinary tensors of a megakernel: a too-narrow Dep range, an undeclared write or read, and a
    write-after-read without a Dep are errors naming task, tile, tensor, element and the missing declaration;
    the correct graph runs clean (under every scheduler)."""
    w = dist_world(2)
    assert w.run(B.megakernel_mistake, None, "dynamic") == [True, True]
    text = _fails(w, B.megakernel_mistake, "narrow")
    assert "task 'b' tile" in text and "loads tensor 'x' element" in text and "task 'a' tile" in text
    assert "read-after-write" in text and "the Dep of 'b' on 'a' covers tiles [" in text and "widen the Dep range" in text
    text = _fails(w, B.megakernel_mistake, "undeclared_write")
    assert "task 'a' tile" in text and "stores to tensor 'spill' element" in text
    assert "not in its writes=" in text
    text = _fails(w, B.megakernel_mistake, "undeclared_read")
    assert "task 'b' tile" in text and "loads tensor 'x'" in text and "not in its reads=" in text
    text = _fails(w, B.megakernel_mistake, "war")
    assert "write-after-read" in text or "read-after-write" in text
    assert "the Dep of 'c' on 'b' covers no tiles of 'b'" in text


@sim_only
def test_remote_access_outside_its_tensor(dist_world):
    """symm_at stores, gets and signals are checked against the symmetric tensor they point into (not only
    the heap): the error names the tensor, the element and the rank; correct accesses run."""
    w = dist_world(2)
    assert w.run(B.symm_store_past_end, 0) == [True] * 2
    text = _fails(w, B.symm_store_past_end, 36)
    assert "out of bounds" in text and "symmetric tensor 'dst' (float32[128]" in text
    assert "element 128, past its end (128 elements)" in text and "on rank " in text
    assert "the address is in symmetric tensor 'after'" in text and "bodies_mistakes.py" in text
    assert w.run(B.get_too_much, 0) == [True] * 2
    text = _fails(w, B.get_too_much, 16)
    assert "not symmetric" not in text
    assert "272 bytes from element 0 of symmetric tensor 'src' (float32[64]" in text
    assert "run 16 bytes past its end (64 elements, 256 bytes)" in text
    assert w.run(B.signal_past_end, 3) == [True] * 2
    text = _fails(w, B.signal_past_end, 4)
    assert "symmetric tensor 'flags' (int32[4]" in text and "past its end" in text


@sim_only
def test_ranks_allocate_alike(dist_world):
    """One rank's extra symmetric allocation shifts every later offset: the next allocation of the other
    ranks is an error naming both ranks' allocations (sites and values), before anything hangs."""
    w = dist_world(2)
    assert w.run(B.extra_allocation, -1) == [96, 96]
    text = _fails(w, B.extra_allocation, 1)
    assert "ranks allocate symmetric memory differently: symmetric allocation #1 is" in text
    assert "rank 0: 'b' bfloat16[32] (64 bytes at heap offset" in text
    assert "rank 1: 'extra' float32[16] (64 bytes at heap offset" in text
    assert text.count("allocated at bodies_mistakes.py:") == 2
    assert w.run(B.extra_allocation, -1) == [96, 96]        # the next run is checked alike again


@sim_only
def test_megakernel_graphs_differ_across_ranks(dist_world):
    """Ranks that build graphs with different communication tasks get an error naming what differs and each
    rank's value (not a hang); compute tasks may differ per rank."""
    w = dist_world(2)
    assert w.run(B.graphs_of_different_sizes, False) == [True, True]
    text = _fails(w, B.graphs_of_different_sizes, True)
    assert "TaskGraph.compile: ranks disagree on argument 'communication tasks'" in text
    assert "rank 0: 2 (at bodies_mistakes.py:" in text and "rank 1: 1 (at bodies_mistakes.py:" in text


@sim_only
def test_reports_point_at_the_user():
    """A wait in a @triton.jit helper that never returns: the one-entry report (user's line, rank, program,
    named tensor, element, expected, observed), no chain of interpreter tracebacks.  A torch.ops.ditron call
    whose size differs across ranks is reported at the caller's line (not torch's custom_ops.py)."""
    from ditron.errors import DitronHangError
    from ditron.sim.pool import SimCluster
    with SimCluster(2, hang_timeout=1.5) as w:
        _helper_hang_and_torch_op(w)


def _helper_hang_and_torch_op(w):
    from ditron.errors import DitronHangError
    with pytest.raises(DitronHangError) as info:
        w.run(B.hang_in_helper)
    entries = info.value.report
    assert {e["rank"] for e in entries} == {0, 1}
    for e in entries:
        assert e["primitive"] == "dl.wait" and e["where"].startswith("bodies_mistakes.py:")
        assert "symmetric tensor 'ready_flags'" in e["signal"] and "element offset 1" in e["signal"]
        assert e["expected"] == "== 1" and e["observed"] == 0
    assert "InterpreterError" not in str(info.value)
    text = _fails(w, B.torch_op_mismatch, 1)
    assert "all_reduce: ranks disagree on argument 'method'" in text
    assert "bodies_mistakes.py:" in text and "custom_ops.py" not in text.split("ranks disagree")[1]


@sim_only
def test_ep_has_the_cross_rank_check(dist_world):
    """EP calls are checked across ranks like the other zoo ops: a rank that calls ep_dispatch where the others
    call ep_combine is an error naming both calls and their lines, before anything is launched."""
    w = dist_world(2)
    text = _fails(w, B.ep_call_mismatch, 1)
    assert "ranks disagree on the operation of call #1" in text
    assert "rank 0: ep_combine (at bodies_mistakes.py:" in text and "rank 1: ep_dispatch (at bodies_mistakes.py:" in text


@sim_only
def test_plain_triton_kernel_with_primitives_is_rejected(dist_world):
    """A plain @triton.jit kernel that calls dl.rank() fails to link on GPUs; the simulator refuses it too."""
    w = dist_world(2)
    assert w.run(B.rank_in_kernel, False) == [0, 1]
    text = _fails(w, B.rank_in_kernel, True)
    assert "distributed primitives need a @ditron.jit kernel" in text and "bodies_mistakes.py" in text


@sim_only
def test_gpu_scope_wait_on_a_flag_of_another_kernel(dist_world):
    """The gpu-scope-wait lint sees a flag that another kernel's peers write (not only the same kernel's); the
    warning is printed once (by one rank, not by each) and shown at the kernel's line."""
    w = dist_world(2)
    assert w.run(B.flag_from_another_kernel, "sys") == [[], []]
    msgs = [m for rank in w.run(B.flag_from_another_kernel, "gpu") for m in rank]
    assert len(msgs) == 1, msgs
    text, file, line = msgs[0]
    assert "[gpu-scope-wait]" in text and "kernel produce_kernel" in text and "use scope='sys'" in text
    with open(B.__file__) as f:
        want = next(i for i, t in enumerate(f, 1) if "LINT_LINE" in t)
    assert (file, line) == ("bodies_mistakes.py", want)


def test_cli_help_lists_what_the_commands_accept(capsys):
    """`ditron bench --help` lists every benchmark, `ditron demo --help` every demo, `--target` the accepted
    targets (all derived from the registries the commands dispatch on)."""
    from ditron import cli
    from ditron.bench import FAMILIES
    from ditron.demo import DEMOS
    assert cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    for op in ("all_reduce", "ag_gemm", "gemm", "grouped_gemm", "ag_moe", "moe_rs", "moe_ar", "ep", "megakernel"):
        assert op in out
    assert all(op in out for ops in FAMILIES.values() for op in ops)
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in DEMOS) and set(DEMOS) == {"megakernel", "moe", "attention", "generate"}
    with pytest.raises(SystemExit):
        cli.main(["compile", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "sm_80" in out and "gfx90a" in out and "NN >= 70" in out
    for t in ("sm_80", "sm_90a", "gfx90a", "gfx942"):          # what the help promises is accepted
        from ditron.target import parse_target
        parse_target(t)


def test_zoo_docs_import_the_installed_package():
    """docs/zoo.md's examples import ditron.kernels (which works outside the checkout), not kernels."""
    import os
    import re
    text = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "zoo.md")).read()
    assert not re.search(r"^from kernels\.|^import kernels", text, re.M)
    for mod in re.findall(r"^from (ditron\.kernels[\w.]*) import", text, re.M):
        __import__(mod)


def test_readme_example_keeps_no_triton_ir_values(tmp_path):
    """The README's Python example runs, and the compiled kernel's distributed IR keeps no Triton IR values
    (under nanobind -- Triton >= 3.7 -- values alive at exit print a "nanobind: leaked ..." dump)."""
    import os
    import re
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    path = tmp_path / "readme_example.py"
    path.write_text(code.replace("print(", "_ = ("))
    scope = {"__name__": "readme_example"}
    exec(compile(code.replace("print(", "_ = ("), str(path), "exec"), scope)
    ck = scope["ck"]
    assert ck.dist_ir.ops
    for op in ck.dist_ir.ops:
        for name, v in op.operands.items():
            assert not hasattr(v, "handle"), (op.kind, name, v)
    assert "dist.symm_at" in ck.asm["dist_ir"]
    # nor anything else the compiled kernel refers to: no MLIR module or context of the front end is reachable
    # from it (ditron's front end once stayed reachable through the ASTSource that Triton's kernel keeps)
    assert _reaches_triton_ir(ck) is None, _reaches_triton_ir(ck)


def _reaches_triton_ir(root):
    """The first path (attribute types and dict keys) from ``root`` to a Triton ``ir.module`` or ``ir.context``,
    breadth first through what the objects refer to, or None.  Modules and their globals (a function's) are not
    entered: what they hold is the libraries' own state, not the kernel's."""
    import collections
    import gc
    import sys
    import types
    from triton._C.libtriton import ir
    queue, seen = collections.deque([(root, type(root).__name__)]), {id(root)}
    seen |= {id(vars(m)) for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)}
    while queue:
        obj, path = queue.popleft()
        if isinstance(obj, (ir.module, ir.context)):
            return path
        for ref in gc.get_referents(obj):
            if id(ref) in seen or isinstance(ref, types.ModuleType):
                continue
            seen.add(id(ref))
            key = next((repr(k) for k, v in obj.items() if v is ref), None) if isinstance(obj, dict) else None
            queue.append((ref, f"{path}.{type(ref).__name__}" + (f"[{key}]" if key else "")))
    return None


def _sim_script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@sim_only
def test_ranks_output_is_never_glued(tmp_path):
    """Ranks print into one pipe: every line of the output is one rank's whole line."""
    import re
    import subprocess
    import sys
    script = _sim_script(tmp_path, "chatty.py", "import os\nr = os.environ['RANK']\n"
                         "for i in range(400):\n    print(f'rank {r} line {i} ' + 'x' * 40)\n")
    import os
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "3", str(script)], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 1200
    bad = [ln for ln in lines if not re.fullmatch(r"rank \d line \d+ x{40}", ln)]
    assert not bad, bad[:3]


@sim_only
def test_ctrl_c_prints_one_line(tmp_path):
    """Ctrl-C (SIGINT to the foreground process group) stops the job with one line, no traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time
    script = _sim_script(tmp_path, "sleepy.py", "import os, time\n"
                         f"open(os.path.join({str(tmp_path)!r}, 'up' + os.environ['RANK']), 'w').close()\n"
                         "time.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-m", "ditron", "sim", "-n", "2", str(script)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(1200):                      # wait until both ranks run the script (bounded)
            if all((tmp_path / f"up{r}").exists() for r in range(2)) or p.poll() is not None:
                break
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines() == ["ditron sim: interrupted (Ctrl-C); every rank was stopped and the job's "
                                        "files removed"], err


def test_gpu_allocation_check_through_the_store():
    """The GPU path of the allocation check (DITRON_DEBUG=1): records in torch.distributed's store; the rank
    that allocates second finds the mismatch (a dict stands in for the store)."""
    from types import SimpleNamespace
    import torch
    from ditron.runtime.alloccheck import StoreLedger

    class Store(dict):
        def check(self, keys):
            return all(k in self for k in keys)

        def get(self, key):
            return self[key]

        def set(self, key, value):
            self[key] = value

    store = Store()
    r0, r1 = StoreLedger(store, 0, 2), StoreLedger(store, 1, 2)
    a = SimpleNamespace(index=0, offset=0, nbytes=256, dtype=torch.float32, shape=(64,), name="a", site="job.py:3")
    r0(a, 0)
    r1(a, 0)                                             # alike: no error
    b0 = SimpleNamespace(index=1, offset=256, nbytes=64, dtype=torch.bfloat16, shape=(32,), name="b",
                         site="job.py:7")
    b1 = SimpleNamespace(index=1, offset=256, nbytes=64, dtype=torch.float32, shape=(16,), name="extra",
                         site="job.py:5")
    r1(b1, 0)
    with pytest.raises(DitronError) as info:
        r0(b0, 0)
    text = str(info.value)
    assert "symmetric allocation #1" in text and "rank 0: 'b' bfloat16[32]" in text and "job.py:7" in text
    assert "rank 1: 'extra' float32[16]" in text and "job.py:5" in text
