"""Persistent simulated ranks that run Python functions: the test fixture's
engine (and handy in notebooks).

    with SimCluster(4) as cluster:
        results = cluster.run(body, n=1000)     # body(world, n=1000) on every rank

Ranks are started once and reused; they are forked from a server process that
imported torch, Triton (interpreted) and ditron once (a ``forkserver``), so a
rank starts in a fraction of a second instead of importing everything again;
``run`` frees every symmetric allocation the function made.  A failing rank
stops the others and raises :class:`~ditron.errors.DitronRankError` with its
traceback; a deadlock raises :class:`~ditron.errors.DitronHangError` with the
report of every blocked wait.  Functions must be importable (module-level) so
that the rank processes can find them.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import time
import traceback
from multiprocessing.connection import wait as conn_wait

from ..errors import DitronError, DitronHangError, DitronRankError
from ..runtime.heap import HEAP_ALIGN, round_up
from .. import sim_memory as M
from . import threads
from .launcher import GRACE_S, check_topology, make_job, rank_env


#: what the fork server imports once for every rank it forks: torch, and ditron (with Triton and numpy), and
#: torch.distributed.tensor, which torch.testing.assert_close imports at its first call (about 0.8 CPU-s in
#: every rank that compares tensors), and last ditron.sim.warm_at_import: the kernel zoo and the decoder, with
#: every interpreted @jit function's source-only first-launch work done (ditron.sim.prewarm), which each rank
#: did again for each kernel; nothing that reads a setting of the job at import time (ditron.sim.skew reads
#: DITRON_SIM_SKEW: not here)
PRELOAD = ("torch", "ditron", "torch.distributed.tensor", "ditron.sim.warm_at_import")


def _rank_context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _worker(conn, env):
    # a forked rank has the fork server's environment: it takes the one its cluster gave it (the parent's at
    # start, plus the rank's variables), exactly what a spawned process would have had
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    os.environ.clear()
    os.environ.update(env)
    threads.apply(env)              # torch was imported by the fork server: its intra-op threads as env says
    rank = int(env["RANK"])
    skew = sys.modules.get("ditron.sim.skew")
    if skew is not None:
        skew.plan_from_env()        # preloaded (the zoo imports the executor): the plan its import reads, from this env
    if "triton" in sys.modules and not interpreted:
        # a fork server started by someone else, without TRITON_INTERPRET=1, imported Triton: its @jit helpers
        # (tl.sum, tl.cdiv, ...) are compiled ones, not interpreted; the cluster starts its ranks afresh instead
        conn.send(("not-interpreted", None, None))
        return
    try:
        import ditron
        from ditron.runtime.world import heap_scope
        from ditron.sim import race
        world = ditron.init()
        from ditron.sim import numerics
        numerics.install()          # plain @triton.jit kernels of a body compute as ditron's do
        ctl = world.transport.control
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc(), None))
        return
    ctl.rank_set(rank, M.R_ACTIVE, 0)
    ctl.rank_set(rank, M.R_DONE, 1)
    conn.send(("ready", None, None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            break
        if job is None:
            break
        fn, args, kwargs = job
        ctl.rank_set(rank, M.R_DONE, 0)
        ctl.rank_set(rank, M.R_ACTIVE, 1)
        try:
            race.run_boundary("begin")       # every rank's previous run happened before this one
            with heap_scope():
                value = fn(world, *args, **kwargs)
            race.take_reports(getattr(fn, "__name__", "the run"))
            msg = ("ok", value, None)
        except DitronHangError as e:
            msg = ("hang", traceback.format_exc(), e.report)
        except BaseException:  # noqa: BLE001 -- sent to the parent
            msg = ("error", traceback.format_exc(), M.ABORT_REASONS.get(ctl.abort))
        race.run_boundary("end")
        ctl.rank_set(rank, M.R_ACTIVE, 0)
        ctl.rank_set(rank, M.R_DONE, 1)
        try:
            conn.send(msg)
        except Exception:  # noqa: BLE001 -- unpicklable result
            conn.send(("error", traceback.format_exc(), None))
    try:
        ditron.finalize()
    except BaseException:  # noqa: BLE001
        pass


class SimCluster:
    """``n`` simulated ranks (``nnodes`` nodes) kept alive between runs."""

    def __init__(self, n=4, nnodes=1, heap_size=64 << 20, hang_timeout=None, race=None, seed=None):
        """``race``: run under the race finder (default: on, as ``ditron sim``, unless ``DITRON_SIM_RACE=0``: a
        missing ``dl.wait`` or a signal before its data usually passes a plain simulation bitwise);
        ``seed``: its ``DITRON_SIM_SEED``."""
        from . import race as R
        check_topology(n, nnodes)
        self.n, self.nnodes = n, nnodes
        self.race = R.job_default() if race is None else bool(race)
        self.seed = seed
        self.heap_size = round_up(int(heap_size), HEAP_ALIGN)
        self.hang_timeout = float(hang_timeout or os.environ.get("DITRON_HANG_TIMEOUT_S", 30))
        self.procs = []
        self.conns = []
        self.sim_dir = None
        self.control = None
        self._start()

    def _start(self, method="forkserver"):
        ctx = _rank_context() if method == "forkserver" else mp.get_context(method)
        from . import race as R
        self.sim_dir = make_job(self.n, self.heap_size, self.race)
        self.control = M.Control(M.sim_dir_paths(self.sim_dir)[0], self.n)
        for r in range(self.n):
            env = rank_env({}, r, self.n, self.nnodes, self.sim_dir, self.heap_size, self.hang_timeout)
            env[R.ENV] = "1" if self.race else "0"
            if self.seed is not None:
                env[R.SEED_ENV] = str(int(self.seed))
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, {**os.environ, **env}), name=f"ditron-sim-rank{r}",
                            daemon=True)
            # Triton decides at import time whether its own @jit helpers (tl.sum, tl.cdiv, ...) are interpreted:
            # the fork server (started by the first start) and a spawned child must see TRITON_INTERPRET=1
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                p.start()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        for r, c in enumerate(self.conns):
            if not c.poll(300):
                self.close()
                raise DitronError(f"simulated rank {r} did not start within 300 s")
            kind, text, _ = c.recv()
            if kind == "not-interpreted" and method != "spawn":
                self.close()
                return self._start("spawn")
            if kind != "ready":
                self.close()
                raise DitronRankError("a simulated rank failed to start", rank=r, traceback_text=text)

    def run(self, fn, *args, timeout=None, **kwargs):
        """``fn(world, *args, **kwargs)`` on every rank; the list of results.

        ``timeout`` (seconds, default ``DITRON_SIM_RUN_TIMEOUT_S`` or 900)
        bounds the whole run even when the watchdog cannot see a hang (a
        kernel spinning on plain loads instead of ``dl.wait``): the ranks are
        killed and restarted and :class:`DitronHangError` is raised."""
        if not self.procs:
            self._start()
        limit = time.monotonic() + float(timeout or os.environ.get("DITRON_SIM_RUN_TIMEOUT_S", 900))
        from ..runtime.sim import Watchdog
        self.control.reset()
        for c in self.conns:
            c.send((fn, args, kwargs))
        results = [None] * self.n
        pending = set(range(self.n))
        first_error = None
        deadlock = False
        deadline = None
        dog = Watchdog(self.control, self.hang_timeout, alive=lambda r: self.procs[r].is_alive())
        while pending:
            ready = conn_wait([self.conns[r] for r in pending], timeout=0.05)
            for c in ready:
                r = self.conns.index(c)
                try:
                    results[r] = c.recv()
                except EOFError:
                    results[r] = ("error", f"simulated rank {r} died (exit code {self.procs[r].exitcode})", None)
                pending.discard(r)
                if results[r][0] == "error" and first_error is None and not results[r][2]:
                    first_error = r
                    self.control.request_abort(M.ABORT_RANK_FAILED, r)
                    deadline = time.monotonic() + GRACE_S
            for r in list(pending):
                if not self.procs[r].is_alive() and not self.conns[r].poll():
                    results[r] = ("error", f"simulated rank {r} died (exit code {self.procs[r].exitcode})", None)
                    pending.discard(r)
                    if first_error is None:
                        first_error = r
                        self.control.request_abort(M.ABORT_RANK_FAILED, r)
                        deadline = time.monotonic() + GRACE_S
            if not deadlock and first_error is None and dog.poll():
                deadlock = True
                deadline = time.monotonic() + GRACE_S
            if pending and time.monotonic() > limit:
                stuck = sorted(pending)
                self.close()
                raise DitronHangError(f"{getattr(fn, '__name__', fn)}: ranks {stuck} did not finish within the "
                                      "run's time limit (DITRON_SIM_RUN_TIMEOUT_S); no wait was blocked, so the "
                                      "watchdog saw no deadlock (a kernel polling with plain loads?); the simulated "
                                      "ranks were restarted")
            if pending and deadline is not None and time.monotonic() > deadline:
                stuck = sorted(pending)
                self.close()
                if first_error is not None:
                    break
                raise DitronHangError(f"deadlock: ranks {stuck} did not stop within {GRACE_S:g} s of the abort "
                                      "(busy outside a ditron wait); the simulated ranks were restarted")
        if first_error is not None:
            raise DitronRankError(f"simulated rank {first_error} of {self.n} failed; the other ranks were stopped",
                                  rank=first_error, traceback_text=results[first_error][1])
        hangs = [res for res in results if res is not None and res[0] == "hang"]
        if deadlock or hangs:
            report = [entry for res in hangs for entry in (res[2] or [])]
            raise DitronHangError(f"deadlock: no simulated rank made progress for {self.hang_timeout:g} s; "
                                  "blocked waits:", report)
        errors = [r for r, res in enumerate(results) if res[0] == "error"]
        if errors:
            r = errors[0]
            raise DitronRankError(f"simulated rank {r} failed", rank=r, traceback_text=results[r][1])
        return [res[1] for res in results]

    def close(self):
        for c in self.conns:
            try:
                c.send(None)
            except Exception:  # noqa: BLE001
                pass
        for p in self.procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.sim_dir:
            shutil.rmtree(self.sim_dir, ignore_errors=True)
            self.sim_dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
