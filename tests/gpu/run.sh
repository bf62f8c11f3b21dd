#!/usr/bin/env bash
# GPU tests of the ditron runtime on one node, both transports, under torchrun.
#
#   tests/gpu/run.sh                       # 4 GPUs, p2p then nvshmem
#   NPROC=2 BACKENDS=p2p tests/gpu/run.sh
#
# Needs torch with CUDA, nvidia-nvshmem-cu13 and (for nvshmem) nvshmem4py-cu13.
# Every step has a timeout; the summary lines are "N passed, M failed".
set -o pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
NPROC=${NPROC:-4}
STEP_TIMEOUT=${STEP_TIMEOUT:-420}
BACKENDS=${BACKENDS:-"p2p nvshmem"}
TR="torchrun --standalone --nproc-per-node $NPROC"
status=0
step() {
  echo "== $*"
  timeout -k 10 "$STEP_TIMEOUT" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $*"; status=1; fi
}
for b in $BACKENDS; do
  DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider tests/test_dist_runtime.py
  DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider tests/test_dist_primitives.py
  DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider tests/test_torch.py
  DITRON_TEST_BACKEND=$b step $TR -m pytest -q -p no:cacheprovider tests/test_task_sim.py
  step $TR tests/gpu/lifecycle.py --backend "$b"
  step $TR tests/gpu/mesh_world.py --backend "$b" --mesh "1,$NPROC"
  step $TR tests/gpu/mesh_world.py --backend "$b" --mesh "$NPROC,1"
  if [ $((NPROC % 2)) -eq 0 ] && [ "$NPROC" -gt 2 ]; then
    step $TR tests/gpu/mesh_world.py --backend "$b" --mesh "2,$((NPROC / 2))"
  fi
  DITRON_WAIT_TIMEOUT_S=2 step $TR tests/gpu/planted_hang.py --backend "$b" --kind wait
  DITRON_WAIT_TIMEOUT_S=2 step $TR tests/gpu/planted_hang.py --backend "$b" --kind signal
  DITRON_WAIT_TIMEOUT_S=2 step $TR tests/gpu/planted_hang.py --backend "$b" --kind barrier
  step $TR tests/gpu/decoder_8b.py --backend "$b"
  DITRON_WAIT_TIMEOUT_S=2 step $TR tests/gpu/planted_hang.py --backend "$b" --kind deps
  DITRON_WAIT_TIMEOUT_S=2 step $TR tests/gpu/planted_hang.py --backend "$b" --kind ll
done
DITRON_DEBUG=1 DITRON_WAIT_TIMEOUT_S=5 step $TR tests/gpu/consistency.py
echo "== tests/gpu/run.sh: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
