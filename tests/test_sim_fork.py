"""The launcher's two ways to start a rank give the script the same process: forked from the job's fork server,
which imported torch, Triton and ditron once (the default), or started afresh as ``python -m ditron.sim.rank``
(``DITRON_SIM_FORK=0``, and whenever the server declines).  The stop / kill / Ctrl-C / deadlock / failing-rank
behaviour of the launcher is tested on the default path by tests/test_sim.py, tests/test_sim_launcher.py and
tests/test_mistakes.py."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator tests")

PROBE = textwrap.dedent('''
    import atexit, json, os, random, signal, sys, threading
    started = {"torch": "torch" in sys.modules, "threads": threading.active_count()}
    import numpy as np
    out = os.environ["PROBE_OUT"]
    rank = int(os.environ["RANK"])
    info = dict(started, name=__name__, argv=sys.argv, path0=sys.path[0], orig_argv=sys.orig_argv,
                sigint=signal.getsignal(signal.SIGINT) == signal.SIG_IGN, draws=[random.random(), int(np.random.randint(1 << 30))],
                env={k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                                    "NODE_RANK", "TRITON_INTERPRET", "DITRON_SIM_RACE", "DITRON_SIM_SEED",
                                                    "PROBE_MARK")})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)
    atexit.register(lambda: open(os.path.join(out, f"atexit{rank}"), "w").write("ran"))
    print(f"stdout of rank {rank}")
    print(f"stderr of rank {rank}", file=sys.stderr)
    if __name__ == "__main__":
        sys.exit(int(sys.argv[1]) if rank == 1 else 0)
''')


def _launch(args, env=None, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "ditron", "sim", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "started"])
def test_a_rank_is_the_same_process_either_way(tmp_path, fork):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ, DITRON_SIM_FORK=fork, PROBE_OUT=str(tmp_path), PROBE_MARK="kept")
    n = 3
    p = _launch(["-n", str(n), "--race", "--seed", "4", str(script), "0", "x"], env=env)
    assert p.returncode == 0, p.stderr
    # one line per rank and stream: nothing written twice, nothing lost
    assert sorted(p.stdout.splitlines()) == [f"stdout of rank {r}" for r in range(n)], p.stdout
    assert sorted(ln for ln in p.stderr.splitlines() if ln.startswith("stderr of")) == \
        [f"stderr of rank {r}" for r in range(n)], p.stderr
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    for r, info in enumerate(infos):
        assert info["name"] == "__main__"
        assert info["argv"] == [str(script), "0", "x"]
        assert info["path0"] == str(tmp_path)
        assert info["orig_argv"][1:] == ["-m", "ditron.sim.rank", str(script), "0", "x"]
        assert info["env"] == {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
                               "GROUP_RANK": "0", "NODE_RANK": "0", "TRITON_INTERPRET": "1", "DITRON_SIM_RACE": "1",
                               "DITRON_SIM_SEED": "4", "PROBE_MARK": "kept"}
        assert info["sigint"], "a rank leaves Ctrl-C to the launcher"
        # forked ranks start with torch imported (the server's) and, like started ones, with one Python thread
        # (the server forks only while it has one thread of any kind)
        assert info["torch"] is (fork == "1")
        assert info["threads"] == 1, info
        assert (tmp_path / f"atexit{r}").read_text() == "ran"
    # generators seeded from the OS at import are seeded again in each forked rank
    for k in range(2):
        assert len({info["draws"][k] for info in infos}) == n, [info["draws"] for info in infos]


def test_module_run_exit_code_and_atexit_of_a_failing_rank(tmp_path):
    """``-m module`` (found on sys.path[0], the working directory), and a rank's ``sys.exit(5)``: the job's
    exit code and report; the rank's atexit handlers still run."""
    (tmp_path / "probe_mod.py").write_text(PROBE)
    env = dict(os.environ, PROBE_OUT=str(tmp_path), PROBE_MARK="m")
    p = _launch(["-n", "2", "-m", "probe_mod", "5"], env=env, cwd=tmp_path)
    assert p.returncode == 5, p.stderr
    assert "ditron sim: rank 1 failed (exit code 5)" in p.stderr, p.stderr
    info = json.loads((tmp_path / "rank1.json").read_text())
    assert info["name"] == "__main__" and info["argv"] == [str(tmp_path / "probe_mod.py"), "5"]
    assert info["torch"], "the default path forks the ranks"
    assert (tmp_path / "atexit1").read_text() == "ran"


SCRIPT = textwrap.dedent('''
    import os, sys
    import {mod}
    sys.__stdout__.flush()      # the stream the rank was started with (a forked rank's is the server's)
    print(f"rank {{os.environ['RANK']}}: torch preloaded {{'torch' in sys.modules}}, {mod} saw {{{mod}.SEEN}}")
''')


def test_preloaded_module_output_is_written_once(tmp_path):
    """``DITRON_SIM_PRELOAD`` adds modules to the server's; what the server printed while importing them (into
    a pipe, so block-buffered) is flushed before it forks: written once, not again by each rank."""
    lib = tmp_path / "lib"          # not the script's directory (see the next tests)
    lib.mkdir()
    (lib / "noisy.py").write_text("import sys\nSEEN = 'the server'\nprint('noisy imported', end=' ')\n")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(mod="noisy"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(lib), os.environ.get("PYTHONPATH", "")]),
               DITRON_SIM_PRELOAD="noisy")
    env.pop("PYTHONUNBUFFERED", None)
    p = _launch(["-n", "3", str(script)], env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("noisy imported") == 1, p.stdout
    assert sorted(re.findall(r"rank (\d): torch preloaded True, noisy saw the server", p.stdout)) == ["0", "1", "2"]


def test_server_declines_a_preload_that_reads_a_rank_variable(tmp_path):
    """A module that reads RANK at import time would see no rank in the server: the server declines, and
    the launcher starts every rank afresh, where the module sees its rank."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "peek.py").write_text("import os\nSEEN = os.environ.get('RANK')\n")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(mod="peek"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(lib), os.environ.get("PYTHONPATH", "")]),
               DITRON_SIM_PRELOAD="peek")
    p = _launch(["-n", "2", str(script)], env=env)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == [f"rank {r}: torch preloaded False, peek saw {r}" for r in range(2)]


def test_server_declines_a_script_directory_that_shadows_a_preloaded_module(tmp_path):
    """In a started rank the script's directory comes first on sys.path, before torch and its imports."""
    from ditron.sim.forkserver import _shadowed
    script = tmp_path / "s.py"
    script.write_text("")
    assert _shadowed([str(script)]) is None
    (tmp_path / "json.py").write_text("")       # json: imported in this process, as in the server
    assert _shadowed([str(script)]) == "json"
    assert _shadowed(["-m", "s"]) is None
