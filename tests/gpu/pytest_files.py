"""Run several pytest files in ONE process per rank (one torchrun, one world start) and say per file whether it
passed, so that tests/gpu/run.sh keeps a verdict per file without starting a world per file.

    torchrun --nproc-per-node N tests/gpu/pytest_files.py tests/test_dist_runtime.py tests/test_gemm_rs.py ...

Every rank runs the files in the order given (the GPU world is session-scoped: tests/conftest.py) and prints,
as soon as a file's last test has finished (so a later hang or kill keeps the verdicts of the files before it),

    == file tests/test_gemm_rs.py rank 0: passed (15 passed, 0 failed, 2 skipped; 31.2 s)

``FAILED`` when a test of the file failed or errored on this rank, followed by one line per failure
(``== failed NODEID rank R (call): AssertionError: ...``), so that a run killed later still says what failed; a file none of whose tests finished prints no
line (tests/gpu/run.sh calls it unfinished).  ``faulthandler_timeout`` (PYTEST_FILE_STACKS_S, default 150 s)
dumps every thread's stack when one test runs longer: the test a hang is in.  Extra pytest options after ``--``.
The exit status is pytest's.
"""
import os
import sys
import time

import pytest


def _short(report, limit=400):
    """A failed report's message in one line: the exception line of its crash (e.g. ``AssertionError: ...``), with
    the last lines of the rank's traceback when it is a DitronRankError."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    msg = crash.message if crash is not None else str(getattr(report, "longrepr", "") or "")
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    if len(lines) > 3:                    # a rank's traceback: its first line and the last two (the error)
        lines = [lines[0], "...", *lines[-2:]]
    one = " | ".join(lines)
    return one if len(one) <= limit else one[:limit] + " ..."


class PerFile:
    """Counts outcomes per file and prints a file's verdict when the next file starts (or the session ends)."""

    def __init__(self, rank):
        self.rank = rank
        self.current = None
        self.stats = {}

    def _file(self, nodeid):
        return nodeid.split("::", 1)[0]

    def _close(self, f):
        st = self.stats.get(f)
        if st is None or st.get("printed"):
            return
        st["printed"] = True
        verdict = "FAILED" if st["failed"] else "passed"
        # one write, starting and ending a line: the ranks' outputs interleave line by line at worst
        text = (f"\n== file {f} rank {self.rank}: {verdict} ({st['passed']} passed, {st['failed']} failed, "
                f"{st['skipped']} skipped; {time.monotonic() - st['t0']:.1f} s)\n")
        for nodeid, when, msg in st.get("failures", ()):       # what failed, even if the run is killed later
            text += f"== failed {nodeid} rank {self.rank} ({when}): {msg}\n"
        sys.stdout.write(text)
        sys.stdout.flush()

    def pytest_runtest_logstart(self, nodeid, location):
        f = self._file(nodeid)
        if f != self.current:
            if self.current is not None:
                self._close(self.current)
            self.current = f
            self.stats.setdefault(f, {"passed": 0, "failed": 0, "skipped": 0, "t0": time.monotonic()})

    def pytest_runtest_logreport(self, report):
        st = self.stats.setdefault(self._file(report.nodeid),
                                   {"passed": 0, "failed": 0, "skipped": 0, "t0": time.monotonic()})
        if report.failed:
            st["failed"] += 1
            st.setdefault("failures", []).append((report.nodeid, report.when, _short(report)))
        elif report.skipped:
            st["skipped"] += 1
        elif report.when == "call":
            st["passed"] += 1

    def pytest_sessionfinish(self, session, exitstatus):
        if self.current is not None:
            self._close(self.current)


def main(argv):
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    if not argv:
        print("usage: pytest_files.py FILE... [-- PYTEST_OPTIONS]", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    stacks = os.environ.get("PYTEST_FILE_STACKS_S", "150")
    # --durations: a slow test shows by name (at NPROC=3 on one H200 the first file once took 103 s against 6 s at 2)
    args = ["-q", "-p", "no:cacheprovider", "-o", f"faulthandler_timeout={stacks}", "--durations=10", *argv, *extra]
    return int(pytest.main(args, plugins=[PerFile(rank)]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
