"""The launcher's ways to start a rank give the script the same process: forked from the job's fork server,
which imported torch, Triton and ditron once (the default), or from a server forked by a zygote that imported them
once for many jobs (``DITRON_SIM_ZYGOTE``; tests/conftest.py starts one per worker), or started afresh as
``python -m ditron.sim.rank`` (``DITRON_SIM_FORK=0``, and whenever the server declines).  The stop / kill / Ctrl-C
/ deadlock / failing-rank behaviour of the launcher is tested by tests/test_sim.py, tests/test_sim_launcher.py and
tests/test_mistakes.py (through the suite's zygote, and tests/test_sim_launcher.py without it too)."""
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
    _cache = sys.modules.get("triton.runtime.cache")       # Triton's compiler key: computed by the zygote
    started = {"torch": "torch" in sys.modules, "threads": threading.active_count(),
               "triton_key": bool(_cache and _cache.triton_key.cache_info().currsize)}
    import numpy as np
    out = os.path.dirname(os.path.abspath(__file__))
    rank = int(os.environ["RANK"])
    with open(f"/proc/{os.getppid()}/stat") as f:
        grandparent = int(f.read().rsplit(")", 1)[1].split()[1])      # the server's parent
    umask = os.umask(0o22)
    info = dict(started, name=__name__, argv=sys.argv, path0=sys.path[0], orig_argv=sys.orig_argv, cwd=os.getcwd(),
                grandparent=grandparent, umask=umask,
                sigint=signal.getsignal(signal.SIGINT) == signal.SIG_IGN, draws=[random.random(), int(np.random.randint(1 << 30))],
                env={k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                                    "NODE_RANK", "TRITON_INTERPRET", "DITRON_SIM_RACE", "DITRON_SIM_SEED",
                                                    "PROBE_MARK")})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)
    atexit.register(lambda: open(os.path.join(out, f"atexit{rank}"), "w").write("ran"))
    import probe_held, weakref
    probe_held.hold(out, rank)            # unclosed files and an object of a module the rank imported
    class Noisy:
        def __init__(self, rank):
            self.rank, self.me = rank, self      # a cycle: freed by the collector
        def __del__(self):
            print(f"del of rank {self.rank}")
    noisy = Noisy(rank)
    weakref.finalize(noisy, print, f"finalize of rank {rank}")     # alive at exit: run by weakref's atexit hook
    print(f"stdout of rank {rank}")
    print(f"stderr of rank {rank}", file=sys.stderr)
    if __name__ == "__main__":
        sys.exit(int(sys.argv[1]) if rank == 1 else 0)
''')

#: a module of the probe's directory, imported by the rank (not the server): what it holds at exit is freed as the
#: interpreter's shutdown frees it, in a forked rank too (ditron.sim.rank_exit)
HELD = textwrap.dedent('''
    import gzip, os
    import sys
    class Freed:
        def __init__(self, rank, out):
            # the module's globals may be gone when the teardown frees it: what __del__ needs, kept here
            self.rank, self.path, self.sys, self.open = rank, os.path.join(out, f"teardown{rank}"), sys, open
        def __del__(self):
            # the stream that the teardown prints into: whole lines (one write each) or not
            with self.open(self.path, "w") as f:
                f.write(str(getattr(self.sys.stdout, "line_buffering", None)))
            print(f"module object of rank {self.rank} freed")
    def hold(out, rank):
        global log, packed, obj
        log = open(os.path.join(out, f"log{rank}"), "w")
        log.write(f"unclosed, buffered {rank}")
        packed = gzip.open(os.path.join(out, f"packed{rank}.gz"), "wt")
        packed.write(f"unclosed, compressed {rank}")
        obj = Freed(rank, out)
''')


def _write_probe(path):
    """The probe at ``path`` and the module it imports, next to it."""
    path.write_text(PROBE)
    (path.parent / "probe_held.py").write_text(HELD)


def _exited_cleanly(out, stdout, ranks):
    """What each rank's exit had to do: its atexit handler, finalizers and ``__del__`` run (their output flushed),
    the files a module of it kept open flushed and closed (the gzip trailer written), and what a module's object
    prints as the teardown frees it goes through a whole-line stream as the rank's other output does (a started
    rank's teardown is the interpreter's own, which prints into sys.__stdout__: with PYTHONUNBUFFERED, the text
    and its newline in two writes, another rank's line glued between them, unless that is the whole-line stream
    too)."""
    import gzip
    for r in ranks:
        assert (out / f"atexit{r}").read_text() == "ran"
        assert (out / f"log{r}").read_text() == f"unclosed, buffered {r}"
        with gzip.open(out / f"packed{r}.gz", "rt") as f:
            assert f.read() == f"unclosed, compressed {r}"
        assert (out / f"teardown{r}").read_text() == "True", r
        for line in (f"del of rank {r}", f"finalize of rank {r}", f"module object of rank {r} freed"):
            assert stdout.count(line + "\n") == 1, (line, stdout)


def _launch(args, env=None, cwd=None, timeout=300, zygote=False):
    """A job; without the suite's zygote unless ``zygote``."""
    env = dict(os.environ if env is None else env)
    if not zygote:
        env.pop("DITRON_SIM_ZYGOTE", None)
    return subprocess.run([sys.executable, "-m", "ditron", "sim", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def _umask():
    u = os.umask(0)
    os.umask(u)
    return u


@pytest.mark.parametrize("fork", ["debug", "0", "zygote"], ids=["forked", "started", "zygote"])
def test_a_rank_is_the_same_process_either_way(tmp_path, fork, _sim_zygote):
    if fork == "zygote" and _sim_zygote is None:
        pytest.skip("no zygote in this run (DITRON_SIM_ZYGOTE set outside)")
    script = tmp_path / "probe.py"
    _write_probe(script)
    # a variable of the test's own makes the zygote decline: the zygote job has none
    env = dict(os.environ, DITRON_SIM_FORK="debug" if fork == "zygote" else fork,
               **({} if fork == "zygote" else {"PROBE_MARK": "kept"}))
    n = 3
    old = os.umask(0o077)               # the launcher's umask, which a zygote's server takes from it
    try:
        p = _launch(["-n", str(n), "--race", "--seed", "4", str(script), "0", "x"], env=env, zygote=fork == "zygote")
    finally:
        os.umask(old)
    assert p.returncode == 0, p.stderr
    how = {"debug": "ranks forked from the job's own fork server", "0": None,
           "zygote": "ranks forked from a server forked by the zygote"}[fork]
    assert how is None or f"ditron sim: {how}" in p.stderr, p.stderr
    # one line per rank and stream: nothing written twice, nothing lost
    assert sorted(ln for ln in p.stdout.splitlines() if ln.startswith("stdout of")) == \
        [f"stdout of rank {r}" for r in range(n)], p.stdout
    _exited_cleanly(tmp_path, p.stdout, range(n))
    # a forked rank leaves the preloaded modules to os._exit: Triton >= 3.7's nanobind leak check, which runs in
    # their teardown, has nothing to report (a shutdown that skipped freeing them would print "leaked ...")
    assert fork == "0" or "nanobind" not in p.stderr, p.stderr
    assert sorted(ln for ln in p.stderr.splitlines() if ln.startswith("stderr of")) == \
        [f"stderr of rank {r}" for r in range(n)], p.stderr
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    for r, info in enumerate(infos):
        assert info["name"] == "__main__"
        assert info["argv"] == [str(script), "0", "x"]
        assert info["path0"] == str(tmp_path)
        assert info["cwd"] == os.getcwd() and info["umask"] == 0o077
        assert info["orig_argv"][1:] == ["-m", "ditron.sim.rank", str(script), "0", "x"]
        assert info["env"] == {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
                               "GROUP_RANK": "0", "NODE_RANK": "0", "TRITON_INTERPRET": "1", "DITRON_SIM_RACE": "1",
                               "DITRON_SIM_SEED": "4", "PROBE_MARK": None if fork == "zygote" else "kept"}
        assert info["sigint"], "a rank leaves Ctrl-C to the launcher"
        # forked ranks start with torch imported (the server's) and, like started ones, with one Python thread
        # (the server forks only while it has one thread of any kind)
        assert info["torch"] is (fork != "0")
        assert (info["grandparent"] == _sim_zygote.pid) is (fork == "zygote")
        assert info["threads"] == 1, info
        assert info["triton_key"] is (fork == "zygote"), info
    # generators seeded from the OS at import are seeded again in each forked rank
    for k in range(2):
        assert len({info["draws"][k] for info in infos}) == n, [info["draws"] for info in infos]


def test_module_run_exit_code_and_atexit_of_a_failing_rank(tmp_path, _sim_zygote):
    """``-m module`` (found on sys.path[0], the working directory), and a rank's ``sys.exit(5)``: the job's
    exit code and report; the rank's atexit handlers, finalizers and files still run and close.  Through the
    zygote, after the job above: in another directory, with other per-job variables (none of the last job's left
    over), and another umask."""
    if _sim_zygote is None:
        pytest.skip("no zygote in this run (DITRON_SIM_ZYGOTE set outside)")
    _write_probe(tmp_path / "probe_mod.py")
    p = _launch(["-n", "2", "-m", "probe_mod", "5"], cwd=tmp_path, zygote=True)
    assert p.returncode == 5, p.stderr
    assert "ditron sim: rank 1 failed (exit code 5)" in p.stderr, p.stderr
    info = json.loads((tmp_path / "rank1.json").read_text())
    assert info["name"] == "__main__" and info["argv"] == [str(tmp_path / "probe_mod.py"), "5"]
    assert info["path0"] == str(tmp_path) and info["cwd"] == str(tmp_path) and info["umask"] == _umask()
    assert info["env"] == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                           "GROUP_RANK": "0", "NODE_RANK": "0", "TRITON_INTERPRET": "1",
                           "DITRON_SIM_RACE": "1" if _race_default() else "0",       # on unless DITRON_SIM_RACE=0
                           "DITRON_SIM_SEED": None, "PROBE_MARK": None}
    assert info["torch"] and info["grandparent"] == _sim_zygote.pid, "forked from a server forked by the zygote"
    _exited_cleanly(tmp_path, p.stdout, range(2))


def _race_default():
    from ditron.sim import race
    return race.job_default()


SCRIPT = textwrap.dedent('''
    import os, sys
    import {mod}
    sys.__stdout__.flush()      # the rank's whole-line stream; the one it started with (a forked rank's is the
                                # server's) is flushed at its exit
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


def _ask(path, env=None, argv=("x.py",), **kw):
    """A request to the zygote at ``path`` from this process (as a launcher makes it: the ranks' thread defaults
    and TRITON_INTERPRET=1 added, zygote.server_env): None when a server was forked for it (which is then closed at
    once), else the reason it was declined."""
    from ditron.sim import zygote
    env = zygote.server_env(os.environ if env is None else env)
    env.pop("PYTEST_CURRENT_TEST", None)        # one of the per-job variables
    conn, pid, reason = zygote.request(path, env, list(argv), **kw)
    if conn is not None:
        conn.send(("close",))
        with pytest.raises(EOFError):           # the server exits: its end closes
            while conn.poll(30):
                conn.recv()
        conn.close()
    return reason


def test_zygote_declines_what_would_change_the_preload(tmp_path, monkeypatch, _sim_zygote):
    """The zygote forks a job's server only when the server would have imported the same: the environment equal
    but for the per-job variables (none of which the preload reads), the same Python, limits and priority, a
    working directory that resolves every loaded module to the same file, and a script directory that shadows
    none; anything else is declined with its reason, and the launcher starts the job's own server."""
    from ditron.sim import zygote
    if _sim_zygote is None:
        pytest.skip("no zygote in this run (DITRON_SIM_ZYGOTE set outside)")
    path = _sim_zygote.zygote_path
    assert _ask(path) is None
    # every per-job variable changed, or added, or removed at once, and one of ditron's that the preload does
    # not read: still the zygote's (its preload read none of them)
    per_job = {k: "7" for k in zygote.PER_JOB}
    assert _ask(path, dict(os.environ, DITRON_STRICT="1", **per_job)) is None
    base = {k: v for k, v in os.environ.items() if k not in zygote.PER_JOB}
    assert _ask(path, base) is None
    # one of ditron's that the preload reads (ditron.sim.skew's plan, at import): declined
    assert _ask(path, dict(os.environ, DITRON_SIM_SKEW="rank=1,at=signal,nth=3,seconds=0.01")) == \
        "the zygote declined: preloading read DITRON_SIM_SKEW, which differs in the job"
    # any other difference is declined, every time (the zygote learns nothing from a job's environment)
    for _ in range(2):
        assert "differs in PROBE_MARK (not one of the per-job variables): 'x' in the job, unset" in \
            _ask(path, dict(os.environ, PROBE_MARK="x"))
    assert "differs in PATH" in _ask(path, {k: v for k, v in os.environ.items() if k != "PATH"})
    assert _ask(path) is None
    # another Python, other limits: declined (the job's own process state)
    real = zygote.process_state
    monkeypatch.setattr(zygote, "process_state", lambda: dict(real(), executable="/usr/bin/python9"))
    assert "the job runs /usr/bin/python9" in _ask(path)
    monkeypatch.setattr(zygote, "process_state", lambda: dict(real(), nice=real()["nice"] + 1))
    assert "priority differ" in _ask(path)
    monkeypatch.setattr(zygote, "process_state", real)
    # a working directory that holds a module the zygote imported: its server declines
    (tmp_path / "json.py").write_text("")       # json: imported by the preload, from the standard library
    monkeypatch.chdir(tmp_path)
    assert "resolves 'json' to another file" in _ask(path)
    (tmp_path / "json.py").unlink()
    assert _ask(path) is None                   # a directory that shadows nothing is fine (the -m test above)
    # a script directory that shadows a preloaded module: the server's own check, as without a zygote
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "numpy").mkdir()
    assert "the script's directory holds a module 'numpy'" in _ask(path, argv=[str(lib / "s.py")])
    # no zygote there, or one that does not answer
    assert "no zygote at" in _ask(str(tmp_path / "none"))
    import socket
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(tmp_path / "mute"))
    mute.listen(1)
    try:
        assert "did not answer in 0.5 s" in _ask(str(tmp_path / "mute"), timeout=0.5)
    finally:
        mute.close()


def test_zygote_decisions_on_what_its_preload_did():
    """A zygote whose preload read a per-job variable, failed, printed or left threads declines every job that
    it could serve otherwise (the decision, without starting such a zygote)."""
    from ditron.sim import zygote
    from ditron.sim.forkserver import _EnvReads
    state = zygote._State()
    state.environ = dict(os.environ, TRITON_INTERPRET="1")
    with _EnvReads() as reads:
        os.environ.get("WORLD_SIZE")
    state.reads = reads
    req = {"env": dict(state.environ), "argv": ["x.py"], "state": zygote.process_state()}
    assert zygote.decline_reason(state, req) is None
    req["env"]["WORLD_SIZE"] = "3"
    assert zygote.decline_reason(state, req) == "preloading read WORLD_SIZE, which differs in the job"
    req["env"] = dict(state.environ, DITRON_SIM_SEED="3")
    assert zygote.decline_reason(state, req) is None
    with _EnvReads() as listed:
        dict(os.environ)
    state.reads = listed
    assert zygote.decline_reason(state, req) == "preloading read DITRON_SIM_SEED, which differs in the job"
    state.error = "the zygote's preload printed 5 bytes (a job's own server prints them into the job's output)"
    req["env"] = dict(state.environ)
    assert zygote.decline_reason(state, req) == state.error


@pytest.mark.parametrize("omp", [None, "3"], ids=["unset", "set"])
def test_zygote_serves_the_jobs_of_its_own_environment(monkeypatch, omp):
    """A zygote started from the launchers' environment serves their jobs whether or not that environment sets
    OMP_NUM_THREADS: each rank gets OMP_NUM_THREADS=1 when it is unset (ditron.sim.threads), so the zygote's
    server has it too (zygote.server_env), or it would decline every job (the decision, on a zygote state
    whose preload read no variable)."""
    from ditron.sim import forkserver as F
    from ditron.sim import zygote
    from ditron.sim.forkserver import _EnvReads
    from ditron.sim.launcher import rank_env
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    state = zygote._State()
    state.environ = zygote.server_env(os.environ)          # what start() gives the zygote
    with _EnvReads() as reads:
        pass
    state.reads = reads
    # a job's server environment, as the launcher makes it: rank 0's without the per-rank variables
    job = {k: v for k, v in rank_env(os.environ, 0, 2, 1, "/x", 1 << 20, 5).items() if k not in F.PER_RANK}
    assert job["OMP_NUM_THREADS"] == state.environ["OMP_NUM_THREADS"] == (omp or "1")
    req = {"env": job, "argv": ["x.py"], "state": zygote.process_state()}
    assert zygote.decline_reason(state, req) is None
    # without the default the zygote declines them (what it did before): the test sees the difference
    state.environ.pop("OMP_NUM_THREADS")
    if omp is None:
        assert "differs in OMP_NUM_THREADS" in zygote.decline_reason(state, req)


@pytest.mark.parametrize("omp", [None, "3"], ids=["unset", "set"])
def test_rank_threads_follow_omp_num_threads(monkeypatch, omp):
    """A simulated rank's torch runs OMP_NUM_THREADS intra-op threads: the job's value, else 1 (as torchrun sets
    for its ranks; ditron.sim.threads), also in ranks forked from a fork server that imported torch with another
    value (this worker's, whose clusters started first, or this test's)."""
    import bodies_sim as B
    from ditron.sim.launcher import rank_env
    from ditron.sim.pool import SimCluster
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    env = rank_env({}, 0, 2, 1, "/nonexistent", 1 << 20, 5)
    assert env.get("OMP_NUM_THREADS") == ("1" if omp is None else None)      # a value of the caller's is kept
    assert rank_env({"OMP_NUM_THREADS": "5"}, 0, 2, 1, "/x", 1 << 20, 5)["OMP_NUM_THREADS"] == "5"
    with SimCluster(2, hang_timeout=20) as cluster:
        got = cluster.run(B.torch_threads)
    want = int(omp or 1)
    assert got == [(want, str(want))] * 2, got


@pytest.mark.parametrize("value", [None, "3"], ids=["unset", "set"])
def test_rank_inductor_compile_threads(monkeypatch, value):
    """A simulated rank's inductor compiles with TORCHINDUCTOR_COMPILE_THREADS threads: the job's value, else 1
    (no pool of compile workers in every rank that runs torch.compile; ditron.sim.threads), also in ranks forked
    from a fork server that imported inductor's config with another value (this suite's servers preload it:
    DITRON_SIM_POOL_PRELOAD in conftest.py)."""
    import bodies_sim as B
    from ditron.sim.launcher import rank_env
    from ditron.sim.pool import SimCluster
    from ditron.sim.threads import INDUCTOR_VAR
    with SimCluster(1, hang_timeout=20) as cluster:      # this worker's fork server started (if it was not) before
        cluster.run(B.inductor_threads)                  # the change below: it preloads inductor's config with its
    if value is None:                                    # own value (the machine's cores where unset)
        monkeypatch.delenv(INDUCTOR_VAR, raising=False)
    else:
        monkeypatch.setenv(INDUCTOR_VAR, value)
    env = rank_env({}, 0, 2, 1, "/nonexistent", 1 << 20, 5)
    assert env.get(INDUCTOR_VAR) == ("1" if value is None else None)         # a value of the caller's is kept
    with SimCluster(2, hang_timeout=20) as cluster:
        got = cluster.run(B.inductor_threads)
    want = int(value or 1)
    assert got == [(want, str(want))] * 2, got


def test_a_listing_that_filters_its_own_prefix_is_not_a_rank_read():
    """tqdm (imported by torch where it is installed, e.g. beside transformers) lists the environment at import
    to pick its TQDM_* variables: the server still forks.  Any other module's listing counts as reading every
    per-rank variable (it could have kept RANK)."""
    from ditron.sim import forkserver as F

    def list_as(module_name):
        with F._EnvReads() as reads:
            exec("_ = {k: v for k, v in os.environ.items() if k.startswith('TQDM_')}",
                 {"__name__": module_name, "os": os})
        return reads.per_rank | (reads.keys & {"PATH"})

    assert list_as("tqdm.utils") == set()
    assert list_as("some_module") >= set(F.PER_RANK) | {"PATH"}
