"""``ditron sim -n N [--nnodes M] script.py [args...]``: run a script on N
simulated ranks, like ``torchrun --nproc-per-node N``.

Each rank is a process with torchrun's variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``) plus
``TRITON_INTERPRET=1`` and the simulated job's shared files, forked from the
job's fork server (:mod:`ditron.sim.forkserver`: torch, Triton and ditron
imported once; with ``DITRON_SIM_ZYGOTE``, the server is forked from a zygote
that imported them once for many jobs, :mod:`ditron.sim.zygote`) or, with
``DITRON_SIM_FORK=0`` or when the server declines, started as
``python -m ditron.sim.rank``.  The launcher watches the job:

* a rank that fails stops the others promptly (their waits abort) and its
  traceback is printed; the exit code is the failing rank's;
* when no rank makes progress for ``--hang-timeout`` seconds
  (``DITRON_HANG_TIMEOUT_S``, default 30) while some wait is blocked, every
  rank stops and the launcher prints, per blocked wait, the rank, program id,
  primitive and source line, the signal (tensor and offset), the expected
  and the observed value; the exit code is 3.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from ..errors import format_report_lines
from ..runtime.heap import HEAP_ALIGN, parse_size, round_up
from . import forkserver as F
from .. import sim_memory as M
from . import threads
from . import zygote as Z

EXIT_DEADLOCK = 3
GRACE_S = 5.0


def make_job(nprocs, heap_size, race=None):
    """The shared files of a job (``race``: also the race finder's, default: on unless
    ``DITRON_SIM_RACE=0``, :func:`ditron.sim.race.job_default`)."""
    from . import race as R
    sim_dir = M.make_job_dir()          # also removes the directories of killed jobs
    control, heap = M.sim_dir_paths(sim_dir)
    M.create_control(control, nprocs)
    M.create_heap_file(heap, heap_size * nprocs)
    if R.job_default() if race is None else race:
        R.create_race_file(sim_dir, nprocs, heap_size)
    return sim_dir


def rank_env(base, rank, nprocs, nnodes, sim_dir, heap_size, hang_timeout):
    lws = nprocs // nnodes
    env = dict(base)
    env.update(threads.default_env(base))         # OMP_NUM_THREADS=1 (as torchrun does), inductor's 1, unless set
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank % lws),
        "LOCAL_WORLD_SIZE": str(lws), "GROUP_RANK": str(rank // lws), "NODE_RANK": str(rank // lws),
        "TRITON_INTERPRET": "1", "DITRON_SIM_DIR": sim_dir, "DITRON_SIM_HEAP_SIZE": str(heap_size),
        "DITRON_HANG_TIMEOUT_S": str(hang_timeout),
    })
    return env


def read_reports(sim_dir, nprocs):
    out = {}
    for r in range(nprocs):
        path = os.path.join(sim_dir, f"rank{r}.json")
        if os.path.exists(path):
            try:
                with open(path) as f:
                    out[r] = json.load(f)
            except (OSError, ValueError):
                pass
    return out


def check_topology(nprocs, nnodes):
    if nprocs < 1:
        raise SystemExit("ditron sim: -n must be at least 1")
    if nnodes < 1 or nprocs % nnodes:
        raise SystemExit(f"ditron sim: {nprocs} ranks cannot be split evenly over {nnodes} nodes")


def run_job(nprocs, argv, *, nnodes=1, heap_size=64 << 20, hang_timeout=30.0, out=sys.stderr, race=None,
            seed=None):
    """Run ``argv`` (script and its arguments, or ``-m module ...``) on
    ``nprocs`` ranks; returns the exit code.  ``race``: run under the race
    finder (default: on unless ``DITRON_SIM_RACE=0``); ``seed``: its ``DITRON_SIM_SEED``."""
    from ..runtime.sim import Watchdog
    from . import race as R
    check_topology(nprocs, nnodes)
    heap_size = round_up(int(heap_size), HEAP_ALIGN)
    race = R.job_default() if race is None else race
    sim_dir = make_job(nprocs, heap_size, race)
    control = M.Control(M.sim_dir_paths(sim_dir)[0], nprocs)
    procs = []
    server = None
    try:
        envs = []
        for r in range(nprocs):
            env = rank_env(os.environ, r, nprocs, nnodes, sim_dir, heap_size, hang_timeout)
            env[R.ENV] = "1" if race else "0"
            if seed is not None:
                env[R.SEED_ENV] = str(int(seed))
            envs.append(env)
        zygote_reason = None
        if F.enabled():
            # one process imports torch, Triton and ditron with the job's settings (or is forked from a zygote
            # that did); every rank is forked from it
            server, zygote_reason = start_server({k: v for k, v in envs[0].items() if k not in F.PER_RANK}, argv)
        if F.debug():
            print_fork_path(server, zygote_reason, out)
        for r in range(nprocs):
            if server is not None:
                procs.append(server.fork(r, envs[r], argv))
            else:
                procs.append(subprocess.Popen([sys.executable, "-m", "ditron.sim.rank", *argv], env=envs[r],
                                              preexec_fn=_rank_preexec))
        dog = Watchdog(control, hang_timeout, alive=lambda r: procs[r].poll() is None)
        first_failure = None
        deadline = None
        deadlock = False
        while any(p.poll() is None for p in procs):
            if first_failure is None:
                for r, p in enumerate(procs):
                    code = p.poll()
                    if code not in (None, 0):
                        first_failure = (r, code)
                        control.request_abort(M.ABORT_RANK_FAILED, r)
                        deadline = time.monotonic() + GRACE_S
                        break
            if not deadlock and first_failure is None and dog.poll():
                deadlock = True
                deadline = time.monotonic() + GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.05)
        codes = [p.wait() for p in procs]
        if first_failure is None:
            for r, code in enumerate(codes):
                if code not in (0, None) and code != EXIT_DEADLOCK:
                    first_failure = (r, code)
                    break
        reports = read_reports(sim_dir, nprocs)
        if deadlock or (first_failure is None and any(c == EXIT_DEADLOCK for c in codes)):
            print_deadlock(reports, codes, hang_timeout, out)
            return EXIT_DEADLOCK
        if first_failure is not None:
            r, code = first_failure
            print_failure(r, code, reports, codes, out)
            return code if code > 0 else 1
        return 0
    except KeyboardInterrupt:
        # Ctrl-C: one line, not a traceback (the ranks ignore SIGINT: the launcher stops them)
        print("ditron sim: interrupted (Ctrl-C); every rank was stopped and the job's files removed", file=out)
        return 130
    finally:
        stop_ranks(procs)
        if server is not None:
            server.close()
        control.close()
        if not os.environ.get("DITRON_SIM_KEEP"):
            shutil.rmtree(sim_dir, ignore_errors=True)


def start_server(env, argv):
    """The job's fork server (:class:`ForkServer`, or None: see ``ForkServer.last_reason``) and why the
    zygote of ``DITRON_SIM_ZYGOTE`` did not fork it (None when it did, or when there is none)."""
    path = Z.path_from_env(env)
    reason = None
    if path is not None:
        conn, pid, reason = Z.request(path, env, argv)
        if conn is not None:
            return F.ForkServer(None, conn, pid), None
    return F.ForkServer.start(env, argv, preexec_fn=_rank_preexec), reason


def print_fork_path(server, zygote_reason, out):
    """``DITRON_SIM_FORK=debug``: how the job's ranks start, and why not otherwise."""
    if zygote_reason:
        print(f"ditron sim: no zygote server: {zygote_reason}", file=out)
    if server is None:
        why = F.ForkServer.last_reason if F.enabled() else f"{F.ENV}=0"
        print(f"ditron sim: every rank started as python -m ditron.sim.rank: {why}", file=out)
    elif server.proc is None:
        print(f"ditron sim: ranks forked from a server forked by the zygote (server pid {server.pid})", file=out)
    else:
        print(f"ditron sim: ranks forked from the job's own fork server (pid {server.pid})", file=out)


def _rank_preexec():
    """In a rank process before it starts: die with the launcher, and leave Ctrl-C (SIGINT, sent to the whole
    foreground process group) to the launcher, which stops every rank and prints one line."""
    M.die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Stopped(BaseException):
    """The launcher got SIGTERM or SIGHUP."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def stop_ranks(procs, grace=2.0):
    """Terminate every rank still running (SIGTERM), then kill what is left."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM / SIGHUP raise :class:`Stopped` in the launcher, so that its
    clean-up (stop every rank, remove the job's files) runs as for Ctrl-C."""
    def handler(signum, frame):
        raise Stopped(signum)
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def print_deadlock(reports, codes, timeout, out):
    print(f"ditron sim: deadlock: no rank made progress for {timeout:g} s; every rank was stopped.", file=out)
    for r in range(len(codes)):
        rep = reports.get(r)
        if rep and rep.get("kind") == "hang":
            for line in format_report_lines(rep.get("report", [])):
                print("  " + line, file=out)
        elif codes[r] == 0:
            print(f"  rank {r}: finished", file=out)
        elif rep and rep.get("kind") == "error":
            print(f"  rank {r}: failed:\n" + _indent(rep.get("traceback", "")), file=out)
        else:
            print(f"  rank {r}: exited with code {codes[r]} (killed: not in a ditron wait)", file=out)


def print_failure(rank, code, reports, codes, out):
    rep = reports.get(rank) or {}
    if rep.get("line"):         # an error that one line says all of (ditron/sim/host_modules.py)
        print(f"ditron sim: {rep['line']}", file=out)
        return
    print(f"ditron sim: rank {rank} failed (exit code {code}); the other ranks were stopped.", file=out)
    tb = rep.get("traceback")
    if tb:
        print(f"--- traceback of rank {rank} ---\n{tb.rstrip()}", file=out)
    for r, c in enumerate(codes):
        if r != rank and c not in (0,):
            print(f"  rank {r}: stopped (exit code {c})", file=out)


def _indent(text):
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def build_parser(prog="ditron sim"):
    p = argparse.ArgumentParser(prog=prog, description="Run a script on N simulated ranks (like torchrun).")
    p.add_argument("-n", "--nproc-per-job", "--nproc", dest="n", type=int, default=4,
                   help="number of ranks (default 4)")
    p.add_argument("--nnodes", type=int, default=1, help="simulated nodes; ranks are split evenly (default 1)")
    p.add_argument("--heap-size", default=os.environ.get("DITRON_HEAP_SIZE", "64M"),
                   help="symmetric heap per rank (default 64M or DITRON_HEAP_SIZE)")
    p.add_argument("--hang-timeout", type=float, default=float(os.environ.get("DITRON_HANG_TIMEOUT_S", 30)),
                   help="seconds without progress before a deadlock is reported (default 30)")
    p.add_argument("--race", action="store_true", default=None,
                   help="run under the race finder (the default): weak memory model, seeded random interleavings, "
                        "every data race reported -- a missing dl.wait, a signal before its data")
    p.add_argument("--no-race", dest="race", action="store_false",
                   help="run without the race finder (DITRON_SIM_RACE=0): faster, but a missing wait may pass")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the race finder's interleavings and stale values (DITRON_SIM_SEED, default 0)")
    p.add_argument("script", help="script to run (or -m module)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    return p


_VALUE_OPTS = ("-n", "--nproc-per-job", "--nproc", "--nnodes", "--heap-size", "--hang-timeout", "--seed")


def _split_argv(argv):
    """(launcher options, script argv): the script starts at the first
    argument that is not a launcher option (``-m`` starts a module)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-m" or not a.startswith("-"):
            return argv[:i], argv[i:]
        if a in _VALUE_OPTS:
            i += 2
        else:
            i += 1     # --opt=value, -h
    return argv, []


def main(argv=None, prog="ditron sim"):
    argv = list(sys.argv[1:] if argv is None else argv)
    opts, script_argv = _split_argv(argv)
    parser = build_parser(prog)
    if not script_argv:
        parser.parse_args(opts)          # prints usage / help and exits
        raise SystemExit(f"{prog}: a script (or -m module) is needed")
    args = parser.parse_args(opts + ["_"])
    if script_argv[0] == "-m" and len(script_argv) < 2:
        raise SystemExit(f"{prog}: -m needs a module name")
    if script_argv[0] != "-m" and not os.path.exists(script_argv[0]):
        raise SystemExit(f"{prog}: no such script: {script_argv[0]}")
    try:
        with stop_on_signals():
            return run_job(args.n, script_argv, nnodes=args.nnodes, heap_size=parse_size(args.heap_size),
                           hang_timeout=args.hang_timeout, race=args.race, seed=args.seed)
    except Stopped as e:
        name = signal.Signals(e.signum).name
        print(f"{prog}: stopped by {name}; every rank was stopped and the job's files removed", file=sys.stderr)
        return 128 + e.signum
