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
# Needs torch with CUDA, nvidia-nvshmem-cu13 and (for nvshmem) nvshmem4py-cu13.
# STEP_FILTER=REGEX runs only the steps whose label matches (e.g. STEP_FILTER='planted_hang|decoder').
# Every step has a timeout; each step prints "== PASSED" or "== FAILED"; the summary lists every step's result.
set -o pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DITRON_TEST_GPU_ONLY=1      # pytest steps keep the tests that run on the GPU world (tests/conftest.py)
python3 -c "import ditron.kernels" 2>/dev/null || { echo "tests/gpu/run.sh: ditron is not installed here (pip install -e . first)"; exit 2; }
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
[ "$GPUS" -ge 1 ] || { echo "tests/gpu/run.sh: no CUDA GPU visible"; exit 2; }
NPROCS=${NPROCS:-${NPROC:-$GPUS}}
STEP_TIMEOUT=${STEP_TIMEOUT:-420}
BACKENDS=${BACKENDS:-"p2p nvshmem"}
status=0
SUMMARY=()
MPS_STARTED=0

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
  if [ "$MPS_STARTED" = 1 ]; then echo quit | nvidia-cuda-mps-control; MPS_STARTED=0; echo "== MPS stopped"; fi
}
trap stop_mps EXIT

step() {
  local label="[NPROC=$N${SHARE_TAG}] $*"
  if [ -n "${STEP_FILTER:-}" ] && ! grep -qE -- "$STEP_FILTER" <<<"$label"; then return; fi   # a subset of steps
  echo "== $label"
  timeout -k 10 "$STEP_TIMEOUT" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $label"; status=1; SUMMARY+=("FAILED  $label")
  else echo "== PASSED: $label"; SUMMARY+=("passed  $label"); fi
}
na() {   # a step that cannot exist at this world size, said out loud
  echo "== n/a [NPROC=$N${SHARE_TAG}] $1: $2"; SUMMARY+=("n/a     [NPROC=$N${SHARE_TAG}] $1: $2")
}

for N in $NPROCS; do
  PER=$(( (N + GPUS - 1) / GPUS ))
  if [ "$PER" -gt 1 ]; then
    export DITRON_RANKS_PER_GPU=$PER; SHARE_TAG=", $PER ranks per GPU"; start_mps
  else
    unset DITRON_RANKS_PER_GPU; SHARE_TAG=""
  fi
  TR="torchrun --standalone --nproc-per-node $N"
  for b in $BACKENDS; do
    if [ "$b" = nvshmem ] && [ "$PER" -gt 1 ]; then
      na "backend nvshmem" "ranks share a GPU; ditron's NVSHMEM transport needs one GPU per rank (p2p covers it)"
      continue
    fi
    DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider tests/test_dist_runtime.py
    DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider tests/test_dist_primitives.py
    DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider tests/test_torch.py
    DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider tests/test_task_sim.py
    for f in tests/test_zoo_ag_rs_a2a.py tests/test_zoo_all_reduce.py tests/test_ag_gemm.py tests/test_gemm_rs.py \
             tests/test_gemm_ar.py tests/test_moe.py tests/test_ep.py tests/test_tdist_port.py; do
      DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider "$f"
    done
    step $TR tests/gpu/lifecycle.py --backend "$b"
    step $TR tests/gpu/mesh_world.py --backend "$b" --mesh "1,$N"
    step $TR tests/gpu/mesh_world.py --backend "$b" --mesh "$N,1"
    if [ $((N % 2)) -eq 0 ] && [ "$N" -gt 2 ]; then
      step $TR tests/gpu/mesh_world.py --backend "$b" --mesh "2,$((N / 2))"
    fi
    # planted hangs: under MPS a trap in one client ends every client of the GPU, so the ranks that hang after the
    # first would report a lost context instead of their own hang; these steps bypass MPS (time-slicing)
    HANG_ENV=(); [ "$PER" -gt 1 ] && HANG_ENV=(env CUDA_MPS_PIPE_DIRECTORY=/tmp/ditron-no-mps)
    DITRON_WAIT_TIMEOUT_S=2 step "${HANG_ENV[@]}" $TR tests/gpu/planted_hang.py --backend "$b" --kind wait
    DITRON_WAIT_TIMEOUT_S=2 step "${HANG_ENV[@]}" $TR tests/gpu/planted_hang.py --backend "$b" --kind signal
    DITRON_WAIT_TIMEOUT_S=2 step "${HANG_ENV[@]}" $TR tests/gpu/planted_hang.py --backend "$b" --kind barrier
    # the decoder megakernel against torch: batch 1, 4 and 16 with ragged contexts in a paged KV cache
    if [ $((8 % N)) -eq 0 ]; then
      step $TR tests/gpu/decoder_8b.py --backend "$b" --batch 1,4,16 --ragged     # Qwen3-8B shapes, TP=N
    else                                                          # 8 KV heads do not split N ways
      step $TR tests/gpu/decoder_8b.py --backend "$b" --config tiny --heads "$((2 * N)),$N" --batch 1,4,16 --ragged
    fi
    DITRON_WAIT_TIMEOUT_S=2 step "${HANG_ENV[@]}" $TR tests/gpu/planted_hang.py --backend "$b" --kind deps
    if [ "$N" -ge 2 ]; then
      DITRON_WAIT_TIMEOUT_S=2 step "${HANG_ENV[@]}" $TR tests/gpu/planted_hang.py --backend "$b" --kind ll
    else
      na "planted_hang --kind ll" "the plant is a rank that skips the all-reduce; one rank has no peer to skip it"
    fi
  done
  if [ "$N" -ge 2 ]; then
    DITRON_DEBUG=1 DITRON_WAIT_TIMEOUT_S=5 step $TR tests/gpu/consistency.py
  else
    na "consistency.py" "cross-rank divergence and skipped calls need a second rank"
  fi
done
stop_mps
echo
echo "== tests/gpu/run.sh summary (GPUs: $GPUS; NPROCS: $NPROCS; BACKENDS: $BACKENDS)"
for line in "${SUMMARY[@]}"; do echo "   $line"; done
echo "== tests/gpu/run.sh: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
