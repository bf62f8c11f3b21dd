#!/usr/bin/env python3
"""Where the test suite's Python CPU goes, by phase, as CI runs it: the README's test command with cold caches
(Triton's, ditron's and inductor's in a fresh temporary directory, as .ci/run sets them) under
``py-spy record --subprocesses --gil``, which follows every process the suite starts (pytest workers, fork
servers, zygotes, simulated ranks, ``ditron sim`` jobs) and counts only the thread that holds the GIL: the
simulated programs of a rank are threads of one process, and a thread waiting for the GIL would otherwise show up
as work at whatever line it waits on.  Native work without the GIL (Triton's MLIR / LLVM passes, ptxas, the C++
compiler of torch.compile) is not in it: ``tools/ci_cpu.sh`` (perf) shows that side.

    python tools/suite_profile.py                                   # the whole suite
    python tools/suite_profile.py tests/test_decoder.py -k levers   # test paths and options: a subset
    python tools/suite_profile.py --raw /tmp/prof.txt               # also keep py-spy's raw samples

Needs py-spy (``pip install py-spy``) and the test dependencies of the active environment.  Prints the share of
samples per phase (simulated programs, first launches, ditron.compile's Python side, torch.compile, preloads,
imports, ...) and the functions with the most samples of their own.  Sampling at 50 Hz adds a few percent.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (phase, a text that one of the sample's frames contains), first match wins: the order matters (a simulated
#: program's thread is inside a rank inside a fork server)
PHASES = (
    ("simulated programs (rank threads)", "Launch.program_main ("),
    ("fork server preload (SimCluster)", "multiprocessing/forkserver.py:178"),
    ("zygote preload", "_quiet_preload ("),
    ("first launch in a rank: lint", "lint (ditron/lint.py"),
    ("first launch in a rank: argument checks / analysis", "check_kernel_args ("),
    ("first launch in a rank: interpreter rewrite", "InterpretedFunction.rewrite ("),
    ("a launch's set-up (SimKernel.run)", "SimKernel.run ("),
    ("ditron.compile (Python side: front end, lint)", "compile (ditron/compiler.py"),
    ("torch.compile (dynamo, AOT autograd, inductor)", "torch/_dynamo/"),
    ("torch.compile (dynamo, AOT autograd, inductor)", "torch/_inductor/"),
    ("collecting test modules", "importtestmodule ("),
    ("imports elsewhere", "_find_and_load ("),
)


def readme_test_command() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    m = re.search(r"^## Tests.*?^(python -m pytest[^\n]*)$", text, re.S | re.M)
    if m is None:
        sys.exit("suite_profile.py: cannot find the README's test command")
    return m.group(1)


def samples(path):
    """(frames, count) per line of py-spy's raw output (a process's command line may hold newlines)."""
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if stack and n.isdigit():
                yield stack.split(";"), int(n)


def phase_of(frames) -> str:
    for name, needle in PHASES:
        if any(needle in fr for fr in frames):
            return name
    return "other"


def report(path, top=25, out=sys.stdout):
    phases, own = collections.Counter(), collections.Counter()
    total = 0
    for frames, n in samples(path):
        total += n
        phases[phase_of(frames)] += n
        own[frames[-1][:120]] += n           # (a process's frame holds its whole command line)
    if not total:
        print("no samples", file=out)
        return phases
    print(f"{total} samples holding the GIL (50 Hz: ~{total / 50:.0f} CPU-s of Python)", file=out)
    print("\nby phase:", file=out)
    for name, n in phases.most_common():
        print(f"  {100 * n / total:5.1f}%  {name}", file=out)
    print(f"\nfunctions with the most samples of their own (top {top}):", file=out)
    for name, n in own.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {name}", file=out)
    return phases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--raw", help="keep py-spy's raw samples in this file")
    ap.add_argument("--rate", type=int, default=50, help="samples per second (default 50)")
    ap.add_argument("tests", nargs=argparse.REMAINDER, help="test paths and pytest options (default: the suite)")
    args = ap.parse_args(argv)
    if shutil.which("py-spy") is None:
        sys.exit("suite_profile.py: py-spy is not installed (pip install py-spy)")
    cmd = shlex.split(readme_test_command())
    if args.tests:
        cmd = cmd[:-1] + args.tests          # the README's options, these tests
    work = tempfile.mkdtemp(prefix="ditron-suite-profile.")
    try:
        env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(work, "triton-cache"),
                   DITRON_CACHE_DIR=os.path.join(work, "ditron-cache"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(work, "inductor-cache"))
        raw = args.raw or os.path.join(work, "samples.txt")
        print("suite_profile.py:", " ".join(cmd), flush=True)
        with open(os.path.join(work, "pytest.log"), "w") as log:
            rc = subprocess.call(["py-spy", "record", "--subprocesses", "--gil", "-r", str(args.rate), "-f", "raw",
                                  "-o", raw, "--", *cmd], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        report(raw)
        with open(os.path.join(work, "pytest.log")) as f:
            summary = [ln for ln in f if re.match(r"^(=+ )?\d+ (passed|failed)", ln)]
        print("\n" + (summary[-1].strip() if summary else f"pytest exit {rc} (log: no summary line)"))
        return rc
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
