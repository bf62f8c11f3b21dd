"""tools/suite_profile.py (where the suite's Python CPU goes, by phase): its attribution of py-spy's raw samples
and the command it profiles (the README's)."""
import importlib.util
import io
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location("suite_profile", os.path.join(ROOT, "tools", "suite_profile.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_phases_of_raw_samples(tmp_path):
    sp = _tool()
    server = 'process 7:"python -B -c from multiprocessing.forkserver import main'
    lines = [
        # a program thread of a rank forked from the server: the program, not the server's preload
        (f'{server};main (multiprocessing/forkserver.py:178);Thread.run (threading.py:982);'
         'Launch.program_main (ditron/sim/executor.py:73);binary_op (triton/runtime/interpreter.py:490)', 6),
        (f'{server};main (multiprocessing/forkserver.py:178);_find_and_load (<frozen importlib._bootstrap>:1176)', 2),
        ('process 9:"python -m ditron.sim.zygote 13";serve (ditron/sim/zygote.py:258);'
         '_quiet_preload (ditron/sim/zygote.py:224);_find_and_load (<frozen importlib._bootstrap>:1176)', 1),
        ('SimKernel.run (ditron/sim/executor.py:246);lint (ditron/lint.py:439);_walk (ditron/lint.py:475)', 3),
        ('SimKernel.run (ditron/sim/executor.py:240);check_kernel_args (ditron/runtime/world.py:304)', 2),
        ('SimKernel.run (ditron/sim/executor.py:247);execute (ditron/sim/executor.py:175)', 1),
        ('compile (ditron/compiler.py:374);make_ir (triton/compiler/compiler.py:80)', 4),
        ('compile_fx (torch/_inductor/compile_fx.py:10)', 2),
        ('pytest_collection (_pytest/main.py:1);importtestmodule (_pytest/python.py:528);'
         '_find_and_load (<frozen importlib._bootstrap>:1176)', 1),
        ('something (x.py:1)', 3),
        ('not a sample line', 0),
    ]
    raw = tmp_path / "raw.txt"
    raw.write_text("".join(f"{stack} {n}\n" if n else f"{stack}\n" for stack, n in lines))
    out = io.StringIO()
    phases = sp.report(str(raw), out=out)
    assert dict(phases) == {
        "simulated programs (rank threads)": 6, "fork server preload (SimCluster)": 2, "zygote preload": 1,
        "first launch in a rank: lint": 3, "first launch in a rank: argument checks / analysis": 2,
        "a launch's set-up (SimKernel.run)": 1, "ditron.compile (Python side: front end, lint)": 4,
        "torch.compile (dynamo, AOT autograd, inductor)": 2, "collecting test modules": 1, "other": 3}
    text = out.getvalue()
    assert "25 samples holding the GIL" in text and "24.0%  simulated programs" in text, text
    assert "24.0%  binary_op (triton/runtime/interpreter.py:490)" in text, text


def test_profiles_the_readme_s_test_command():
    sp = _tool()
    cmd = sp.readme_test_command()
    with open(os.path.join(ROOT, "README.md")) as f:
        assert f"\n{cmd}\n" in f.read()
    assert cmd.startswith("python -m pytest") and cmd.endswith(" tests")
