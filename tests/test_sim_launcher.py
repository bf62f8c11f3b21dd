"""``ditron sim`` stopped by a signal stops every rank and removes the job's
files; the files of a job whose launcher was killed are removed by the next
job.  With the job's own fork server (the variable of the suite's zygote
unset) and with a server forked by the zygote (tests/conftest.py), which is
not the launcher's child."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator tests")

SPIN = textwrap.dedent('''
    import json, os, sys, time
    import ditron
    world = ditron.init()
    with open(f"/proc/{os.getppid()}/stat") as f:
        grandparent = int(f.read().rsplit(")", 1)[1].split()[1])      # the server's parent
    path = os.path.join(sys.argv[1], f"rank{world.rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "sim_dir": os.environ["DITRON_SIM_DIR"], "grandparent": grandparent}, f)
    os.replace(path + ".tmp", path)       # whole: the test reads it as soon as it is there
    while True:            # busy outside any ditron wait: only the launcher can stop it
        time.sleep(0.05)
''')

QUICK = textwrap.dedent('''
    import ditron
    world = ditron.init()
    ditron.barrier_all()
    ditron.finalize()
''')


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _env(tmp_path, zygote):
    """The job's environment, and whether it has a zygote (``zygote`` and the run has one)."""
    from ditron.sim.zygote import path_from_env
    env = dict(os.environ, TMPDIR=str(tmp_path))      # job files go here: nothing else is touched
    if not zygote or path_from_env(env) is None:
        env.pop("DITRON_SIM_ZYGOTE", None)
        return env, False
    return env, True


def _start(tmp_path, n=2, zygote=False):
    script = tmp_path / "spin.py"
    script.write_text(SPIN)
    env, zygote = _env(tmp_path, zygote)
    p = subprocess.Popen([sys.executable, "-m", "ditron.sim", "-n", str(n), str(script), str(tmp_path)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    infos = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and len(infos) < n:
            infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)
                     if (tmp_path / f"rank{r}.json").exists()]
            assert p.poll() is None, p.communicate()
            time.sleep(0.2)
        assert len(infos) == n
        # the ranks' server is the launcher's child, or the zygote's
        assert all((i["grandparent"] == p.pid) is not zygote for i in infos), (infos, p.pid)
    except BaseException:
        p.kill()
        raise
    return p, [i["pid"] for i in infos], infos[0]["sim_dir"]


def _reap(pids):
    """Kill what a failing launcher left behind (the test must not leak spinning ranks)."""
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _gone(pids, sim_dir=None, within=15):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids) and (sim_dir is None or not os.path.exists(sim_dir)):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig,zygote", [(signal.SIGTERM, True), (signal.SIGHUP, False)],
                         ids=["SIGTERM-zygote", "SIGHUP"])
def test_signal_stops_every_rank_and_removes_the_heap(tmp_path, sig, zygote):
    p, pids, sim_dir = _start(tmp_path, zygote=zygote)
    assert os.path.exists(os.path.join(sim_dir, "heap"))
    p.send_signal(sig)
    try:
        out, err = p.communicate(timeout=20)
        assert p.returncode != 0
        assert _gone(pids, sim_dir), (pids, sim_dir, err)
        assert f"stopped by {signal.Signals(sig).name}" in err
    finally:
        if p.poll() is None:
            p.kill()
        _reap(pids)


def test_killed_launcher_leaves_no_ranks_and_the_next_job_removes_its_files(tmp_path):
    """A killed launcher's ranks die with it: through their server's death (the launcher's child), or, when a
    zygote forked the server, through the server, which sees the launcher's end of its socket close."""
    p, pids, sim_dir = _start(tmp_path, zygote=True)
    p.kill()
    p.wait()
    try:
        assert _gone(pids), pids                      # the ranks die with their launcher
    finally:
        _reap(pids)
    assert os.path.exists(os.path.join(sim_dir, "heap"))
    script = tmp_path / "quick.py"
    script.write_text(QUICK)
    env, _ = _env(tmp_path, zygote=False)
    q = subprocess.run([sys.executable, "-m", "ditron.sim", "-n", "2", str(script)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert q.returncode == 0, q.stderr
    assert not os.path.exists(sim_dir)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("ditron-sim-")]
