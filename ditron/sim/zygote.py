"""A zygote: one process, kept across jobs, that imported what a job's fork server imports
(:data:`ditron.sim.forkserver.PRELOAD`) once, and forks each job's fork server from that state, so that a job
no longer pays for importing torch and the rest (1.5 to 2.5 CPU-seconds of a trivial job's 4).  Opt-in, for
suites that run many ``ditron sim`` jobs: ``DITRON_SIM_ZYGOTE=PATH`` names its socket (tests/conftest.py starts
one per xdist worker); :func:`start` starts one (``python -m ditron.sim.zygote FD``, on a socket that listens
already).

The server it forks for a job is the one the launcher would have started, and the job's ranks are forked from
it as before (:mod:`ditron.sim.forkserver`).  Before it forks one, the zygote makes sure the job's server would
have imported the same modules with the same results; otherwise it declines and the launcher starts the
job's own server (today's path), with the reason (``DITRON_SIM_FORK=debug`` prints it).  It declines when

* the job's server environment differs from the zygote's in a variable that is not one of :data:`PER_JOB`
  (set per job by the launcher or per test by pytest), or in one of those that the preload read at import
  time (its reads are recorded; a test checks that the zoo reads none of them);
* the job runs another Python (``sys.executable``), other resource limits or priority;
* the job's working directory (first on the server's ``sys.path``) would make a loaded module resolve to
  another file, or ``sys.path`` has a relative entry;
* the zygote's preload failed, printed anything (a job's own server prints that into the job's output),
  left more than one thread, or the zygote does not answer in time (dead, busy, or not yet started).

A forked server takes the job's standard streams (passed over the socket), working directory, umask, signal
mask and ignored signals, and environment; it is not the launcher's child, so it watches the launcher's end
of the socket instead: when the launcher goes away (even SIGKILL), the server kills its ranks and exits.

One difference from a job's own server, by design: the jobs of one zygote share its string hash seed (a
server's ranks already share their server's), unless ``PYTHONHASHSEED`` sets one for every process.
"""
from __future__ import annotations

import os
import pickle
import resource
import signal
import socket
import struct
import sys

from . import forkserver as F
from . import threads

ENV = "DITRON_SIM_ZYGOTE"

#: the variables that may differ between the zygote's environment and a job server's, each only while the
#: zygote's preload did not read it at import time (:data:`PER_JOB` and ditron's own, ``DITRON_*``: only
#: ditron's Python code reads those, and the zygote records every read of it): the launcher's per-job ones,
#: the temporary directory of the job's files, the terminal's size, and pytest's name of the running test
PER_JOB = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "DITRON_SIM_DIR", "DITRON_SIM_HEAP_SIZE", "DITRON_HANG_TIMEOUT_S",
           "DITRON_SIM_RACE", "DITRON_SIM_SEED", "DITRON_SIM_FORK", "TMPDIR", "COLUMNS", "LINES",
           "PYTEST_CURRENT_TEST")

#: seconds a launcher waits for the zygote's answer (a zygote still preloading answers when done)
TIMEOUT_S = 60.0

_LIMITS = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_NOFILE",
           "RLIMIT_NPROC", "RLIMIT_STACK")
_MAGIC = b"ditron-zygote-1"


def process_state() -> dict:
    """What a job's server inherits from the launcher besides its environment and streams."""
    ignored = [int(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP) and _ignored(s)]
    umask = os.umask(0)
    os.umask(umask)
    return {"executable": sys.executable, "cwd": os.getcwd(), "umask": umask,
            "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            "ignored": ignored, "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "limits": {n: resource.getrlimit(getattr(resource, n)) for n in _LIMITS if hasattr(resource, n)}}


def _ignored(sig) -> bool:
    try:
        return signal.getsignal(sig) == signal.SIG_IGN
    except (ValueError, OSError):
        return False


# ------------------------------------------------------------------------------------------------------------
# the launcher's end
# ------------------------------------------------------------------------------------------------------------

def path_from_env(environ=None):
    """The zygote socket named by ``DITRON_SIM_ZYGOTE``, or None (unset, empty or ``0``)."""
    p = (os.environ if environ is None else environ).get(ENV, "").strip()
    return None if p in ("", "0") else p


def request(path, env, argv, timeout=TIMEOUT_S):
    """Ask the zygote at ``path`` for a fork server of the job (``env``: the server's environment, as the
    launcher would start it; ``argv``: the script and its arguments).  Returns ``(conn, pid, None)`` with the
    server's connection (it sent "ready") and pid, or ``(None, None, reason)``."""
    from multiprocessing.connection import Connection
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        socket.send_fds(sock, [_MAGIC], [0, 1, 2])
        body = pickle.dumps({"env": dict(env), "argv": list(argv), "state": process_state()})
        sock.sendall(struct.pack("!i", len(body)) + body)
        sock.settimeout(None)                # blocking again: the connection reads it (poll bounds the waits)
        conn = Connection(sock.detach())
    except socket.timeout:
        sock.close()
        return None, None, f"the zygote at {path} did not answer in {timeout:g} s (busy or stopped)"
    except OSError as e:
        sock.close()
        return None, None, f"no zygote at {path} ({e.strerror or e})"
    try:
        if not conn.poll(timeout):
            conn.close()
            return None, None, f"the zygote at {path} did not answer in {timeout:g} s (busy or still preloading)"
        msg = conn.recv()
        if msg[0] == "declined":
            conn.close()
            return None, None, f"the zygote declined: {msg[1]}"
        pid = msg[1]                         # ("server", pid); then the server's own "ready" / "unavailable"
        if not conn.poll(timeout):
            conn.close()
            return None, None, "the zygote's server did not answer in time"
        kind, detail = conn.recv()
    except (EOFError, OSError) as e:
        conn.close()
        return None, None, f"the zygote at {path} went away ({e or 'closed'})"
    if kind != "ready":
        conn.close()
        return None, None, f"the zygote's server declined: {detail}"
    return conn, pid, None


# ------------------------------------------------------------------------------------------------------------
# the zygote
# ------------------------------------------------------------------------------------------------------------

class _State:
    def __init__(self):
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.path0 = sys.path[0] if sys.path else None
        self.reads = None
        self.error = None


def decline_reason(state, req) -> str | None:
    """Why the job of ``req`` cannot have a server forked from this zygote (``state``), or None."""
    if state.error:
        return state.error
    job = req["state"]
    mine = process_state()
    if job["executable"] != mine["executable"]:
        return f"the job runs {job['executable']}, the zygote {mine['executable']}"
    for key in ("limits", "nice"):
        if job[key] != mine[key]:
            return f"the job's {'resource limits' if key == 'limits' else 'priority'} differ from the zygote's"
    env = req["env"]
    for k in sorted(set(env) | set(state.environ)):
        if env.get(k) != state.environ.get(k):
            if k not in PER_JOB and not k.startswith("DITRON_"):
                return (f"the job's environment differs in {k} (not one of the per-job variables): "
                        f"{_shown(env.get(k))} in the job, {_shown(state.environ.get(k))} in the zygote")
            if state.reads.listed or k in state.reads.keys:
                return f"preloading read {k}, which differs in the job"
    if job["cwd"] != state.cwd:
        rel = [p for p in sys.path[1:] if not os.path.isabs(p)]
        if rel:
            return f"sys.path has a relative entry ({rel[0]!r}) and the job runs in another directory"
    return None


def _shown(value):
    return "unset" if value is None else repr(value if len(value) <= 40 else value[:37] + "...")


def _held(directory) -> set:
    """The names of the modules and packages that an import could find in ``directory``."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return set()
    return {n.split(".", 1)[0] for n in entries
            if n.endswith((".py", ".pyc", ".so", ".pth")) or os.path.isdir(os.path.join(directory, n))}


def _resolved_elsewhere(old_dir, new_dir) -> str | None:
    """With ``new_dir`` instead of ``old_dir`` first on ``sys.path``: a loaded top-level module that either
    directory holds and that would now be another file (or none), or None."""
    loaded = {m.partition(".")[0] for m in sys.modules if m and not m.startswith("__")}
    suspects = sorted((loaded - set(sys.builtin_module_names)) & (_held(old_dir) | _held(new_dir)))
    if not suspects:
        return None
    import importlib.machinery
    saved = sys.path[0]
    sys.path[0] = new_dir
    try:
        for n in suspects:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(n, None) if find else None
                if spec is not None:
                    break
            mod = sys.modules.get(n)
            was = getattr(mod, "__spec__", None)
            if spec is None or was is None or spec.origin != was.origin or \
                    list(spec.submodule_search_locations or []) != list(was.submodule_search_locations or []):
                return n
    finally:
        sys.path[0] = saved
        importlib.machinery.PathFinder.invalidate_caches()
    return None


def _quiet_preload(state):
    """The preload, with this process's stdout / stderr pointed at a file meanwhile: what it printed would be
    printed once into each job's own output by a job's server, so a zygote that printed anything declines."""
    import tempfile
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            reads = F.preload()
            if not isinstance(reads, str):
                # every job's ranks inherit it: a rank that compiles (torch.compile's cache key, a Triton
                # compile) would hash Triton's sources and library again (~0.4 CPU-s)
                from .. import _compat   # (imported by the preload: its environment reads are recorded)
                _compat.warm_triton_key()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        written = os.fstat(out.fileno()).st_size
    if isinstance(reads, str):
        state.error = f"the zygote's {reads}"
    else:
        state.reads = reads
        if written:
            state.error = (f"the zygote's preload printed {written} bytes (a job's own server prints them into "
                           f"the job's output)")
        elif F._threads() != 1:
            state.error = f"{F._threads()} threads in the zygote after preloading (a fork copies only one)"


def serve(fd):
    """The zygote, on the listening socket ``fd``: preload, then fork a server for each job that it does not
    decline.  Returns ``(rank, env, argv, server)`` in a forked rank (as :func:`ditron.sim.forkserver._serve`),
    None when done."""
    from .. import sim_memory as M
    M.die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    state = _State()
    listener = socket.socket(fileno=fd)
    _quiet_preload(state)
    import gc
    gc.freeze()
    servers = set()                           # reaped between jobs
    while True:
        sock, _ = listener.accept()
        _reap(servers)
        job = _take(sock, listener, state, servers)
        if job is not None:
            return job


def _reap(servers):
    while servers:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            servers.clear()
            return
        if pid == 0:
            return
        servers.discard(pid)


def _recv_request(sock):
    sock.settimeout(10.0)
    msg, fds, _, _ = socket.recv_fds(sock, len(_MAGIC), 3)
    if msg != _MAGIC or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise OSError("not a ditron launcher")
    try:
        head = b""
        while len(head) < 4:
            chunk = sock.recv(4 - len(head))
            if not chunk:
                raise OSError("closed")
            head += chunk
        size, = struct.unpack("!i", head)
        body = bytearray()
        while len(body) < size:
            chunk = sock.recv(min(1 << 20, size - len(body)))
            if not chunk:
                raise OSError("closed")
            body += chunk
        sock.settimeout(None)
        return pickle.loads(bytes(body)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _take(sock, listener, state, servers):
    """One job's request: decline it, or fork its server (which returns the job of a forked rank, later)."""
    from multiprocessing.connection import Connection
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            sock.close()
            return None
        req, fds = _recv_request(sock)
    except (OSError, EOFError, pickle.UnpicklingError, ValueError):
        sock.close()
        return None
    conn = Connection(sock.detach())
    reason = decline_reason(state, req)
    if reason is not None:
        for fd in fds:
            os.close(fd)
        _send(conn, ("declined", reason))
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        servers.add(pid)
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    # the job's server
    try:
        listener.close()
        conn.send(("server", os.getpid()))
        job = req["state"]
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(job["cwd"])
        if sys.path and sys.path[0] == state.path0:
            sys.path[0] = job["cwd"]
        os.umask(job["umask"])
        for s in signal.valid_signals():
            if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD) and _ignored(s) != (s in job["ignored"]):
                signal.signal(s, signal.SIG_IGN if s in job["ignored"] else signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)       # as the launcher's _rank_preexec
        signal.pthread_sigmask(signal.SIG_SETMASK, job["mask"])
        os.environ.clear()
        os.environ.update(req["env"])
        moved = _resolved_elsewhere(state.cwd, job["cwd"]) if job["cwd"] != state.cwd else None
        if moved:
            conn.send(("unavailable", f"the job's directory resolves {moved!r} to another file than the zygote's"))
            os._exit(0)
        job = F._serve(conn, req["argv"], reads=state.reads)
    except BaseException:  # noqa: BLE001 -- the launcher sees the connection close and starts its own server
        os._exit(1)
    if job is None:                          # the server is done (as forkserver.main's own)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return job


def _send(conn, msg):
    try:
        conn.send(msg)
    except OSError:
        pass


def server_env(env) -> dict:
    """The environment of a job's fork server when its launcher runs with ``env``: ``TRITON_INTERPRET=1``, and
    the ranks' thread defaults (:func:`ditron.sim.threads.default_env`: ``OMP_NUM_THREADS=1`` and
    ``TORCHINDUCTOR_COMPILE_THREADS=1`` where ``env`` does not set them), which the launcher adds to every rank's
    environment; a zygote started from ``env`` without them would decline every job of that environment (its
    variables differ)."""
    env = dict(env)
    env.update(threads.default_env(env, launcher=env))
    env["TRITON_INTERPRET"] = "1"
    return env


def start(path=None, env=None):
    """Start a zygote (returns its :class:`subprocess.Popen`; its socket is ``proc.zygote_path``) with
    ``env`` (default: this process's) as a job's server has it (:func:`server_env`) and ``DITRON_SIM_ZYGOTE``
    set.  Its socket listens from the start: a job that comes while it still preloads waits for it.  It dies
    with this process; :func:`stop` ends it."""
    import subprocess
    import tempfile
    if path is None:
        path = os.path.join(tempfile.mkdtemp(prefix="ditron-zygote-"), "socket")
    env = server_env(os.environ if env is None else env)
    env[ENV] = path                   # as in the jobs that use it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        proc = subprocess.Popen([sys.executable, "-m", "ditron.sim.zygote", str(listener.fileno())],
                                env=env, stdin=subprocess.DEVNULL, pass_fds=(listener.fileno(),))
    finally:
        listener.close()
    proc.zygote_path = path
    return proc


def stop(proc):
    """End a zygote started by :func:`start` and remove its socket (jobs it served go on)."""
    import shutil
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001
            proc.kill()
            proc.wait()
    d = os.path.dirname(proc.zygote_path)
    if os.path.basename(d).startswith("ditron-zygote-"):
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    job = serve(int(argv[0]))
    if job is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return F._become_rank(*job)          # in a rank of a server that this zygote forked


if __name__ == "__main__":
    # a forked rank ends in F._become_rank (ditron.sim.rank_exit), as in ditron.sim.forkserver
    sys.exit(main())
