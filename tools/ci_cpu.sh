#!/usr/bin/env bash
# Where the test suite's CPU goes, as CI runs it: the README's test command with cold caches (Triton's, ditron's
# and inductor's in a fresh temporary directory, as .ci/run sets them), under `perf record` over every process the
# suite starts (pytest workers, simulated ranks, fork servers, ptxas, the C++ compiler of torch.compile, ...).
# Prints the CPU time per program and per shared object (libpython: Python code; libtriton: MLIR / LLVM passes of
# compiles; ptxas; numpy; the kernel: page faults, forks, context switches), then the suite's summary line.
#
#   tools/ci_cpu.sh                 # the whole suite, as the README runs it
#   tools/ci_cpu.sh tests/test_decoder.py -k levers
#
# Needs `perf` (linux-tools) allowed to sample (kernel.perf_event_paranoid <= 2 for your own processes) and the
# test dependencies of the active environment.  On CI's 2-core machine the whole suite is about 850-920 CPU-s
# per environment; perf's sampling (49 Hz) adds about 1%.  Runs differ by up to ~8% in CPU on a shared machine:
# compare changes side by side, more than once.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "ci_cpu.sh: perf is not installed (apt install linux-tools-generic)"; exit 2; }
WORK=$(mktemp -d /tmp/ditron-ci-cpu.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export TRITON_CACHE_DIR="$WORK/triton-cache" DITRON_CACHE_DIR="$WORK/ditron-cache" \
       TORCHINDUCTOR_CACHE_DIR="$WORK/inductor-cache"
TESTCMD=$(awk '/^## Tests/{f=1} f&&/^python -m pytest/{print; exit}' README.md)
[ -n "$TESTCMD" ] || { echo "ci_cpu.sh: cannot find the README's test command"; exit 2; }
if [ $# -gt 0 ]; then
  TESTCMD="${TESTCMD% tests} $(printf '%q ' "$@")"     # the README's options, these tests
fi
echo "ci_cpu.sh: $TESTCMD"
start=$(date +%s)
set +e
perf record -q -F 49 -o "$WORK/perf.data" -- bash -c "$TESTCMD" > "$WORK/pytest.log" 2>&1
rc=$?
set -e
wall=$(( $(date +%s) - start ))
total=$(perf report -i "$WORK/perf.data" --stdio -g none -n --sort comm 2>/dev/null | awk '!/^#/ && NF >= 3 {s += $2} END {print s + 0}')
echo
echo "CPU by program ($total samples at 49 Hz: ~$(( total / 49 )) CPU-s; wall $wall s):"
perf report -i "$WORK/perf.data" --stdio -g none --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' | head -8
echo
echo "CPU by shared object:"
perf report -i "$WORK/perf.data" --stdio -g none --no-children --sort dso 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
echo
grep -E '^(=+ )?[0-9]+ (passed|failed)' "$WORK/pytest.log" | tail -1 || tail -20 "$WORK/pytest.log"
exit $rc
