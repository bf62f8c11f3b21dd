"""The fork server of a ``ditron sim`` job: one process that imports torch,
Triton (interpreted) and ditron once, then forks every rank of the job from
that warm state, so that a rank starts in a few milliseconds instead of
importing everything again (about 2 to 4 CPU-seconds a rank).

The launcher (:func:`ditron.sim.launcher.run_job`) starts it as
``python -m ditron.sim.forkserver FD`` with the job's environment: the
launcher's, plus every variable that is the same on all ranks
(``TRITON_INTERPRET=1``, ``WORLD_SIZE``, ``DITRON_SIM_DIR``, ...), so that an
import that reads one of them sees the value the rank would have seen; the
per-rank variables (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``, ``NODE_RANK``)
are set after the fork, and nothing in :data:`PRELOAD` reads them at import
time (tests/test_sim_launcher.py checks it).  A forked rank then runs exactly
what ``python -m ditron.sim.rank SCRIPT ARGS`` runs (:func:`ditron.sim.rank.main`),
and ends with :func:`ditron.sim.rank_exit.finish`: the interpreter's shutdown for
what is the rank's own (non-daemon threads joined, atexit handlers, its garbage
collected, the modules it imported torn down, streams flushed), then
``os._exit`` with its code, leaving the preloaded modules as they are.

What a forked rank shares with the server, unlike a started one: the modules
of :data:`PRELOAD` (imported before the script's directory was put first on
``sys.path``: the server declines a script whose directory holds a module of
that name, and the launcher then starts every rank afresh) and Python's string
hash seed (the ranks of one job iterate a set of strings in the same order;
``DITRON_SIM_FORK=0`` gives every rank its own).  Random generators that are
seeded from the OS at import (``random``, NumPy's global one) are seeded again
in each rank.

Protocol (pickled messages over the socket ``FD``; launcher -> server):
``("fork", rank, env, argv)`` -> ``("pid", pid)``; ``("signal", pid, signum)``
(sent only while the rank is not reaped, so it never hits a reused pid);
``("close",)``.  Server -> launcher: ``("ready", None)`` or
``("unavailable", reason)`` once, then ``("exit", pid, returncode)`` for
every rank (``returncode`` as :attr:`subprocess.Popen.returncode`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

#: imported once by the server for every rank it forks: torch and ditron (with Triton and NumPy), what
#: ``ditron.init()`` and a kernel's first launch import on the simulator, and the zoo; ``DITRON_SIM_PRELOAD``
#: (comma-separated module names) adds a job's own
PRELOAD = ("torch", "ditron", "ditron.runtime.sim", "ditron.lowering.sim", "ditron.sim.executor", "ditron.lint",
           "triton.compiler.code_generator", "ditron.kernels")

#: the variables that differ between the ranks of a job (set in each rank after the fork): a preloaded module
#: that reads one at import time (it would see the server's nothing) makes the server decline
PER_RANK = ("RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK")

ENV = "DITRON_SIM_FORK"
PRELOAD_ENV = "DITRON_SIM_PRELOAD"


def preload_list(environ=None) -> list:
    environ = os.environ if environ is None else environ
    extra = [m.strip() for m in environ.get(PRELOAD_ENV, "").split(",") if m.strip()]
    return list(PRELOAD) + [m for m in extra if m not in PRELOAD]


def enabled() -> bool:
    """Fork the ranks from a warm server (default), unless ``DITRON_SIM_FORK=0`` (``debug``: see :func:`debug`)."""
    return os.environ.get(ENV, "1").strip() not in ("0", "")


def debug() -> bool:
    """``DITRON_SIM_FORK=debug``: the launcher prints how it started the ranks (and why not otherwise)."""
    return os.environ.get(ENV, "").strip() == "debug"


def _threads() -> int:
    """Threads of this process, native ones (a torch or OpenMP pool) included."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading
        return threading.active_count()


def _shadowed(argv) -> str | None:
    """A preloaded top-level module that the script's directory (first on a rank's ``sys.path``) would have
    shadowed in a started rank, or None."""
    if not argv or argv[0] == "-m":
        return None            # -m: sys.path is the same in the server and in a started rank
    script_dir = os.path.dirname(os.path.abspath(argv[0]))
    if script_dir in (os.getcwd(), sys.path[0] if sys.path else None):
        return None
    try:
        names = os.listdir(script_dir)
    except OSError:
        return None
    loaded = {m.partition(".")[0] for m in sys.modules}
    for n in names:
        base = n.split(".", 1)[0]
        if base in loaded and base not in sys.builtin_module_names and (
                n.endswith((".py", ".pyc", ".so", ".pth")) or os.path.isdir(os.path.join(script_dir, n))):
            return base
    return None


#: modules that list the environment only to pick their own prefixed variables out of it (a listing by them
#: reads no per-rank variable): tqdm (imported by torch where it is installed, e.g. beside transformers) takes
#: its ``TQDM_*`` defaults from a listing at import
FILTERING_LISTERS = frozenset({"tqdm.utils"})


def _lister():
    """The module that is reading or listing ``os.environ`` (the first frame outside the mapping machinery)."""
    f = sys._getframe(1)
    while f is not None and f.f_globals.get("__name__") in ("_collections_abc", "os", "collections.abc", __name__):
        f = f.f_back
    return None if f is None else f.f_globals.get("__name__")


class _EnvReads:
    """Records, while active, which variables Python code reads from ``os.environ`` (``[]``, ``get``, ``in``,
    ``os.getenv``: all go through ``__getitem__``; ``keys`` holds them) and whether it listed the whole
    environment (``listed``: iterating it, ``copy()``, ``dict(os.environ)``, ``items()``)."""

    def __enter__(self):
        self.keys = set()
        self.listed = False
        keys = self.keys
        base = type(os.environ)
        outer = self

        class Recording(base):
            def __getitem__(self, key):
                if _lister() not in FILTERING_LISTERS:     # (items() reads each key it lists)
                    keys.add(key)
                return base.__getitem__(self, key)

            def __iter__(self):
                if _lister() not in FILTERING_LISTERS:
                    outer.listed = True
                return base.__iter__(self)

        self.base = base
        os.environ.__class__ = Recording
        return self

    def __exit__(self, *exc):
        os.environ.__class__ = self.base

    @property
    def per_rank(self):
        return set(PER_RANK) if self.listed else self.keys & set(PER_RANK)


def preload():
    """Import :func:`preload_list` recording the environment reads: an :class:`_EnvReads`, or the failure's
    text; then make this process fork-ready (one thread)."""
    try:
        with _EnvReads() as reads:
            import importlib
            for name in preload_list():
                importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001 -- a started rank will show the same failure in full
        return f"preloading failed: {type(e).__name__}: {e}"
    if _threads() != 1:
        # NumPy's OpenBLAS starts a thread pool at import and stops it before a fork (pthread_atfork), to
        # start it again at its next use; a first fork (of a child that exits at once) shows whether every
        # other thread is of that kind (Python >= 3.12 warns about forking with threads: this child runs nothing)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return reads


def _serve(conn, argv, reads=None):
    """The server's loop on ``conn`` (a connection or its fd); returns ``(rank, env, argv)`` in a forked rank,
    None in the server when done.  ``reads``: the preload was done already (in a zygote,
    :mod:`ditron.sim.zygote`), with these reads."""
    from multiprocessing.connection import Connection, wait
    if isinstance(conn, int):
        conn = Connection(conn)
    if reads is None:
        reads = preload()
        if isinstance(reads, str):
            conn.send(("unavailable", reads))
            return None
    reason, shadow = None, _shadowed(argv)
    if reads.per_rank:
        reason = f"preloading read {', '.join(sorted(reads.per_rank))} (set only in each rank)"
    elif _threads() != 1:
        reason = f"{_threads()} threads after preloading (a fork copies only one)"
    elif shadow:
        reason = f"the script's directory holds a module {shadow!r} that the server imported"
    if reason:
        conn.send(("unavailable", reason))
        return None
    # the preloaded objects move out of the collector's sight while a rank runs: its collections leave their
    # pages shared instead of writing to every one of them; its shutdown sees them again (_become_rank)
    import gc
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children = {}
    server = os.getpid()
    conn.send(("ready", None))

    def reap():
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.pop(pid, None)
            conn.send(("exit", pid, os.waitstatus_to_exitcode(status)))

    try:
        while True:
            ready = wait([conn, wake_r])
            if wake_r in ready:
                os.read(wake_r, 512)
            reap()
            if conn not in ready:
                continue
            try:
                msg = conn.recv()
            except EOFError:
                break
            if msg[0] == "fork":
                if _threads() != 1:        # never: nothing in this loop starts a thread
                    raise RuntimeError(f"ditron sim: the fork server has {_threads()} threads")
                sys.stdout.flush()           # nothing buffered is written twice
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for f in (wake_r, wake_w):
                        os.close(f)
                    conn.close()
                    return msg[1:] + (server,)
                children[pid] = msg[1]
                conn.send(("pid", pid))
            elif msg[0] == "signal":
                if msg[1] in children:
                    os.kill(msg[1], msg[2])
            elif msg[0] == "close":
                break
    finally:
        if os.getpid() == server:        # not in a forked rank, which leaves its siblings alone
            for pid in list(children):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            for pid in list(children):
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
    return None


def _become_rank(rank, env, argv, server):
    """In a forked rank: the rank's environment and process settings, then the script."""
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # Ctrl-C is the launcher's (as _rank_preexec)
    from . import threads
    threads.apply(env)                                 # torch is preloaded: its intra-op threads as env says
    from .. import sim_memory as M
    M.die_with_parent()
    if os.getppid() != server:                         # the server died before the line above
        os._exit(1)
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()                               # seeded from the OS, as at its import in a started rank
    sys.orig_argv = [sys.executable, "-m", "ditron.sim.rank", *argv]
    from . import rank as R
    from . import rank_exit
    preloaded = set(sys.modules)
    try:
        code = R.main(list(argv))
    except SystemExit as e:            # never from R.main (it returns the script's code); as the interpreter
        code = e.code
    rank_exit.finish(code, preloaded)  # does not return


class ForkedRank:
    """A rank forked by the server, with the part of :class:`subprocess.Popen`
    that the launcher uses (``pid``, ``returncode``, ``poll``, ``wait``,
    ``terminate``, ``kill``)."""

    def __init__(self, server, pid):
        self.server = server
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.server.pump(0)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout)
            self.server.pump(left if left is not None else 1.0)
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            self.server.send(("signal", self.pid, int(signum)))

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launcher's end of a job's fork server: started for the job (``proc``), or forked by a zygote
    (:mod:`ditron.sim.zygote`; ``proc`` None, ``pid`` the server's)."""

    def __init__(self, proc, conn, pid=None):
        self.proc, self.conn = proc, conn
        self.pid = proc.pid if proc is not None else pid
        self.ranks = {}
        self.reason = None

    @classmethod
    def start(cls, env, argv, preexec_fn=None, timeout=600.0):
        """A server for the job's ``argv`` with the job-wide ``env``, ready to fork; or None with the reason
        in ``ForkServer.last_reason`` (the launcher then starts its ranks afresh)."""
        ForkServer.last_reason = None
        from multiprocessing.connection import Pipe
        ours, theirs = Pipe(duplex=True)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "ditron.sim.forkserver", str(theirs.fileno()),
                                     *argv], env=env, pass_fds=(theirs.fileno(),), preexec_fn=preexec_fn)
        finally:
            theirs.close()
        self = cls(proc, ours)
        deadline = time.monotonic() + timeout
        try:
            while not ours.poll(0.05):
                if proc.poll() is not None or time.monotonic() > deadline:
                    self.reason = f"the fork server exited (code {proc.poll()})" if proc.poll() is not None \
                        else "the fork server did not start in time"
                    break
            else:
                kind, detail = ours.recv()
                if kind == "ready":
                    return self
                self.reason = detail
        except (EOFError, OSError) as e:
            self.reason = f"the fork server exited ({e})"
        except BaseException:
            self.close()
            raise
        ForkServer.last_reason = self.reason
        self.close()
        return None

    last_reason = None

    def send(self, msg):
        try:
            self.conn.send(msg)
        except OSError:
            pass                     # the server is gone: its ranks died with it (pump marks them)

    def pump(self, timeout):
        """Take the server's messages (rank exits) that arrive within ``timeout`` seconds (0: the waiting
        ones)."""
        try:
            if not self.conn.poll(timeout):
                return
            while True:
                msg = self.conn.recv()
                if msg[0] == "exit" and msg[1] in self.ranks:
                    self.ranks[msg[1]].returncode = msg[2]
                if not self.conn.poll(0):
                    return
        except (EOFError, OSError):
            # the server died: its ranks were killed with it (PR_SET_PDEATHSIG)
            for p in self.ranks.values():
                if p.returncode is None:
                    p.returncode = -signal.SIGKILL

    def fork(self, rank, env, argv):
        self.conn.send(("fork", rank, dict(env), list(argv)))
        while True:
            msg = self.conn.recv()
            if msg[0] == "pid":
                p = self.ranks[msg[1]] = ForkedRank(self, msg[1])
                return p
            if msg[0] == "exit" and msg[1] in self.ranks:
                self.ranks[msg[1]].returncode = msg[2]

    def close(self, grace=5.0):
        """Stop the server (it kills the ranks it still has) and wait for it."""
        self.send(("close",))
        if self.proc is not None:
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        else:
            # not our child: the server is gone when its end of the connection closes (its ranks closed theirs)
            if not self._closed_within(grace):
                try:
                    os.kill(self.pid, signal.SIGKILL)       # still open: the server is not reaped, the pid is its
                except OSError:
                    pass
                self._closed_within(grace)
        self.pump(0)
        self.conn.close()

    def _closed_within(self, timeout) -> bool:
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self.conn.poll(left):
                    return False
                msg = self.conn.recv()
                if msg[0] == "exit" and msg[1] in self.ranks:
                    self.ranks[msg[1]].returncode = msg[2]
        except (EOFError, OSError):
            return True


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    job = _serve(int(argv[0]), argv[1:])
    if job is None:
        # the server ran no code of the job: nothing of its interpreter's shutdown is needed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return _become_rank(*job)


if __name__ == "__main__":
    # a forked rank ends in main() (rank_exit.finish); the server returns from it only through os._exit
    sys.exit(main())
