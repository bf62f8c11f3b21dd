#!/usr/bin/env bash
# GPU tests of the ditron runtime on one node, both transports, under torchrun.
#
#   tests/gpu/run.sh                               # NPROC ranks (default: one per visible GPU), p2p then nvshmem
#   NPROC=2 BACKENDS=p2p tests/gpu/run.sh
#   NPROCS="1 2 3" BACKENDS=p2p tests/gpu/run.sh   # every world size in turn, on however many GPUs there are
#
# More ranks than GPUs: the ranks share GPUs (DITRON_RANKS_PER_GPU = ceil(ranks / GPUs), set here; see
# docs/runtime.md, "several ranks on one GPU"). Then the script starts the CUDA Multi-Process Service itself when
# nvidia-cuda-mps-control is available and no daemon runs (MPS=0 keeps it off, to test time-slicing), and stops
# what it started at the end. The NVSHMEM transport needs one GPU per rank: at such sizes it is not run.
#
# Steps per world size and backend:
#   * planted hangs (wait, signal, barrier, deps, ll), side by side in the background (each is a small world that
#     waits out its DITRON_WAIT_TIMEOUT_S=2; PARALLEL_HANGS=0 runs them one after another). A bounded wait does
#     not trap (it reports and leaves the kernel), so they run under MPS like everything else;
#   * lifecycle, device meshes;
#   * pytest: every GPU test file in ONE torchrun / pytest process (one world start; tests/gpu/pytest_files.py),
#     with a verdict per file in the summary ("unfinished" for a file whose tests did not all end); the file
#     most likely to hang goes last;
#   * the cross-rank consistency checks, the decoder check.
#
# Needs torch with CUDA, nvidia-nvshmem-cu13 and (for nvshmem) nvshmem4py-cu13.
# STEP_FILTER=REGEX runs only the steps whose label matches (e.g. STEP_FILTER='planted_hang|decoder'); for the
# pytest step a file runs when "pytest <file>" matches (STEP_FILTER=pytest: every file, STEP_FILTER=gemm_rs: one).
# Timeouts (seconds): PYTEST_TIMEOUT (the one pytest step, default 480), STEP_TIMEOUT (a script, default 180),
# HANG_TIMEOUT (a planted hang, default 60). PYTEST_WAIT_TIMEOUT_S=S runs the pytest step with bounded waits
# (DITRON_WAIT_TIMEOUT_S=S): a hung test then fails with a hang report after S seconds instead of holding the step
# until PYTEST_TIMEOUT (the world is finished after a report: the tests after it fail too). Every step prints "== PASSED" or "== FAILED" and its time; the
# summary lists every step's (and every pytest file's) result. RUN_BUDGET_S=S: the whole run ends within S seconds
# (a step gets at most the time left, a step with less than 30 s left is "not run"), so the summary always prints;
# order per world size: planted hangs, lifecycle, meshes, the pytest files, consistency, the decoder.
set -o pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DITRON_TEST_GPU_ONLY=1      # pytest steps keep the tests that run on the GPU world (tests/conftest.py)
source bench/ensure_ditron.sh
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
[ "$GPUS" -ge 1 ] || { echo "tests/gpu/run.sh: no CUDA GPU visible"; exit 2; }
NPROCS=${NPROCS:-${NPROC:-$GPUS}}
STEP_TIMEOUT=${STEP_TIMEOUT:-180}
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-480}
HANG_TIMEOUT=${HANG_TIMEOUT:-60}
PARALLEL_HANGS=${PARALLEL_HANGS:-1}
BACKENDS=${BACKENDS:-"p2p nvshmem"}
# the GPU test files; gemm_rs last (the one that hung with ranks sharing a GPU before its reduction grid was capped)
# (2026-12-07g: + the GEMM core, Stream-K, Gluon's distributed primitives, ring attention / flash-decoding, fp8 and
# the DeepEP interface -- issues 52 and 55's kernels -- which had GPU bodies but were not in the list)
PYTEST_FILES=${PYTEST_FILES:-"tests/test_dist_runtime.py tests/test_dist_primitives.py tests/test_torch.py
  tests/test_task_sim.py tests/test_zoo_ag_rs_a2a.py tests/test_zoo_all_reduce.py tests/test_ag_gemm.py
  tests/test_gemm_ar.py tests/test_gemm_core.py tests/test_gemm_streamk.py tests/test_gluon.py
  tests/test_zoo_attention.py tests/test_moe.py tests/test_moe_hopper.py tests/test_fp8.py tests/test_deep_ep.py
  tests/test_ep.py tests/test_tdist_port.py tests/test_gemm_rs.py"}
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/ditron-gpu-run.XXXXXX")
status=0
SUMMARY=()
MPS_STARTED=0
T_START=$SECONDS

start_mps() {
  [ "${MPS:-1}" = "0" ] && { echo "== MPS off (MPS=0): ranks sharing a GPU time-slice"; return; }
  local pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
  if [ -e "$pipe/control" ]; then echo "== MPS already running ($pipe)"; return; fi
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "== MPS not available (no nvidia-cuda-mps-control): ranks sharing a GPU time-slice"; return
  fi
  if nvidia-cuda-mps-control -d; then
    MPS_STARTED=1; sleep 1; echo "== MPS started ($pipe)"
  else
    echo "== MPS failed to start: ranks sharing a GPU time-slice"
  fi
}
stop_mps() {
  if [ "$MPS_STARTED" = 1 ]; then echo quit | timeout 20 nvidia-cuda-mps-control; MPS_STARTED=0; echo "== MPS stopped"; fi
}
cleanup() { stop_mps; rm -rf "$LOGDIR"; }
trap cleanup EXIT

selected() { [ -z "${STEP_FILTER:-}" ] || grep -qE -- "$STEP_FILTER" <<<"$1"; }
record() {   # record LABEL RC SECONDS
  if [ "$2" -ne 0 ]; then echo "== FAILED (exit $2, $3 s): $1"; status=1; SUMMARY+=("FAILED  $1 ($3 s)")
  else echo "== PASSED ($3 s): $1"; SUMMARY+=("passed  $1 ($3 s)"); fi
}
budget() {   # budget TIMEOUT: the timeout a step may have within RUN_BUDGET_S (0: no time left for it)
  if [ -z "${RUN_BUDGET_S:-}" ]; then echo "$1"; return; fi
  local left=$((RUN_BUDGET_S - (SECONDS - T_START) - 15))       # 15 s for MPS and the summary
  if [ "$left" -lt 30 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
over_budget() {
  echo "== not run (RUN_BUDGET_S=$RUN_BUDGET_S spent): $1"; SUMMARY+=("NOT RUN $1 (RUN_BUDGET_S spent)"); status=1
}
step() {     # step TIMEOUT CMD...
  local to; to=$(budget "$1"); shift
  local label="[NPROC=$N${SHARE_TAG}] $*"
  selected "$label" || return 0
  [ "$to" -gt 0 ] || { over_budget "$label"; return 0; }
  echo "== $label"
  local t0=$SECONDS
  timeout -k 10 "$to" "$@"
  local rc=$?
  record "$label" $rc $((SECONDS - t0))
  killed $rc
}
killed() {   # a step killed by its timeout under MPS can leave the MPS server refusing clients: restart the daemon
  if { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; } && [ "$MPS_STARTED" = 1 ]; then
    echo "== a step was killed under MPS: restarting the MPS daemon"
    echo quit | timeout 20 nvidia-cuda-mps-control; sleep 2
    if nvidia-cuda-mps-control -d; then sleep 1; echo "== MPS restarted"; else MPS_STARTED=0; echo "== MPS did not restart"; fi
  fi
}
na() {   # a step that cannot exist at this world size, said out loud
  echo "== n/a [NPROC=$N${SHARE_TAG}] $1: $2"; SUMMARY+=("n/a     [NPROC=$N${SHARE_TAG}] $1: $2")
}

pytest_step() {   # every selected GPU test file in one torchrun / pytest process, a verdict per file
  local b=$1 files=() f
  for f in $PYTEST_FILES; do selected "[NPROC=$N${SHARE_TAG}] pytest $f" && files+=("$f"); done
  [ ${#files[@]} -gt 0 ] || return 0
  local label="[NPROC=$N${SHARE_TAG}] pytest (one process, $b): ${files[*]}"
  local log="$LOGDIR/pytest-$N-$b.log" t0=$SECONDS to
  to=$(budget "$PYTEST_TIMEOUT")
  [ "$to" -gt 0 ] || { over_budget "$label"; return 0; }
  echo "== $label"
  local wenv=()
  [ -n "${PYTEST_WAIT_TIMEOUT_S:-}" ] && wenv=(env DITRON_WAIT_TIMEOUT_S="$PYTEST_WAIT_TIMEOUT_S")
  DITRON_TEST_BACKEND=$b timeout -k 10 "$to" "${wenv[@]}" $TR tests/gpu/pytest_files.py "${files[@]}" 2>&1 \
    | tee "$log"
  local rc=${PIPESTATUS[0]}
  killed "$rc"
  for f in "${files[@]}"; do
    local lines nfail nline
    lines=$(grep -a "== file $f rank " "$log")
    nline=$(grep -c "rank " <<<"$lines")
    nfail=$(grep -c ": FAILED" <<<"$lines")
    if [ -z "$lines" ]; then nline=0; nfail=0; fi
    if [ "$nline" -eq 0 ] && [ "$rc" -eq 0 ]; then
      SUMMARY+=("n/a     [NPROC=$N${SHARE_TAG}] pytest ($b) $f: no test of it runs on the GPU world here")
    elif [ "$nfail" -gt 0 ]; then
      SUMMARY+=("FAILED  [NPROC=$N${SHARE_TAG}] pytest ($b) $f: $(grep -a -o 'rank [0-9]*: FAILED ([^)]*)' <<<"$lines" | head -3 | tr '\n' ' ')")
      while read -r t; do [ -n "$t" ] && SUMMARY+=("          failed: $t"); done \
        < <(grep -a -o "== failed $f::[^ ]*" "$log" | sed 's/^== failed //' | sort -u | head -8)
      status=1
    elif [ "$nline" -ge "$N" ]; then
      SUMMARY+=("passed  [NPROC=$N${SHARE_TAG}] pytest ($b) $f: $(grep -a -o 'rank 0: passed ([^)]*)' <<<"$lines" | head -1)")
    else
      SUMMARY+=("FAILED  [NPROC=$N${SHARE_TAG}] pytest ($b) $f: unfinished ($nline of $N ranks finished the file)")
      status=1
    fi
  done
  record "$label" "$rc" $((SECONDS - t0))
}

BG_PIDS=(); BG_LABELS=(); BG_LOGS=(); BG_T0=()
bg_step() {   # bg_step CMD...: a planted hang, in the background when PARALLEL_HANGS=1
  local label="[NPROC=$N${SHARE_TAG}] $*"
  selected "$label" || return 0
  if [ "$PARALLEL_HANGS" != 1 ]; then step "$HANG_TIMEOUT" "$@"; return; fi
  local log="$LOGDIR/bg-${#BG_PIDS[@]}.log" to
  to=$(budget "$HANG_TIMEOUT")
  [ "$to" -gt 0 ] || { over_budget "$label"; return 0; }
  echo "== started in the background: $label"
  timeout -k 10 "$to" "$@" >"$log" 2>&1 &
  BG_PIDS+=($!); BG_LABELS+=("$label"); BG_LOGS+=("$log"); BG_T0+=($SECONDS)
}
bg_join() {   # wait for the background steps, then print each one's output and verdict in order
  local i rc
  for i in "${!BG_PIDS[@]}"; do
    wait "${BG_PIDS[$i]}"; rc=$?
    echo "== ${BG_LABELS[$i]}"
    cat "${BG_LOGS[$i]}"
    record "${BG_LABELS[$i]}" "$rc" $((SECONDS - BG_T0[i]))
    killed "$rc"
  done
  BG_PIDS=(); BG_LABELS=(); BG_LOGS=(); BG_T0=()
}

skip_backend() {   # the NVSHMEM transport needs one GPU per rank
  [ "$1" = nvshmem ] && [ "$PER" -gt 1 ]
}
for N in $NPROCS; do
  PER=$(( (N + GPUS - 1) / GPUS ))
  if [ "$PER" -gt 1 ]; then
    export DITRON_RANKS_PER_GPU=$PER; SHARE_TAG=", $PER ranks per GPU"; start_mps
  else
    unset DITRON_RANKS_PER_GPU; SHARE_TAG=""
  fi
  TR="torchrun --standalone --nproc-per-node $N"
  # 1) planted hangs, side by side in the background (each mostly waits out its 2 s bound); lifecycle; meshes
  for b in $BACKENDS; do
    if skip_backend "$b"; then
      na "backend nvshmem" "ranks share a GPU; ditron's NVSHMEM transport needs one GPU per rank (p2p covers it)"
      continue
    fi
    H="env DITRON_WAIT_TIMEOUT_S=2 $TR tests/gpu/planted_hang.py --backend $b --kind"
    bg_step $H wait
    bg_step $H signal
    bg_step $H barrier
    bg_step $H deps
    if [ "$N" -ge 2 ]; then
      bg_step $H ll
    else
      na "planted_hang --kind ll" "the plant is a rank that skips the all-reduce; one rank has no peer to skip it"
    fi
    bg_join
    step "$STEP_TIMEOUT" $TR tests/gpu/lifecycle.py --backend "$b"
    step "$STEP_TIMEOUT" $TR tests/gpu/mesh_world.py --backend "$b" --mesh "1,$N"
    if [ "$N" -gt 1 ]; then
      step "$STEP_TIMEOUT" $TR tests/gpu/mesh_world.py --backend "$b" --mesh "$N,1"
    fi
    if [ $((N % 2)) -eq 0 ] && [ "$N" -gt 2 ]; then
      step "$STEP_TIMEOUT" $TR tests/gpu/mesh_world.py --backend "$b" --mesh "2,$((N / 2))"
    fi
  done
  # 2) the pytest files (one process per backend; per-file verdicts survive a cut by RUN_BUDGET_S)
  for b in $BACKENDS; do
    skip_backend "$b" || pytest_step "$b"
  done
  # 3) the cross-rank consistency checks
  if [ "$N" -ge 2 ]; then
    step "$STEP_TIMEOUT" env DITRON_DEBUG=1 DITRON_WAIT_TIMEOUT_S=5 $TR tests/gpu/consistency.py
  else
    na "consistency.py" "cross-rank divergence and skipped calls need a second rank"
  fi
  # 4) the decoder megakernel against torch: batch 1, 4 and 16 with ragged contexts in a paged KV cache
  for b in $BACKENDS; do
    skip_backend "$b" && continue
    if [ $((8 % N)) -eq 0 ]; then
      step "$STEP_TIMEOUT" $TR tests/gpu/decoder_8b.py --backend "$b" --batch 1,4,16 --ragged   # Qwen3-8B shapes, TP=N
    else                                                          # 8 KV heads do not split N ways
      step "$STEP_TIMEOUT" $TR tests/gpu/decoder_8b.py --backend "$b" --config tiny --heads "$((2 * N)),$N" --batch 1,4,16 --ragged
    fi
  done
done
stop_mps
echo
echo "== tests/gpu/run.sh summary (GPUs: $GPUS; NPROCS: $NPROCS; BACKENDS: $BACKENDS; $((SECONDS - T_START)) s)"
for line in "${SUMMARY[@]}"; do echo "   $line"; done
echo "== tests/gpu/run.sh: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
