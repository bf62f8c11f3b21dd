#!/usr/bin/env bash
# The host path on one GPU (issue 51): ditron bench overhead at world size 1 (NCCL baselines), then at 2 and 3
# ranks sharing the GPU (DITRON_RANKS_PER_GPU, MPS where it starts; torch.distributed is gloo there), then the
# shared probe (../shared/bench/probes/host_overhead.py) when it is beside the tree.  Outputs under OUT (default
# bench/results/overhead).
#
#   MACHINE=nvidia-h100-x1 bench/overhead_gpu.sh
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-2G}
MACHINE=${MACHINE:-one GPU}
OUT=${OUT:-bench/results/overhead}
WORLDS=${WORLDS:-"1 2 3"}
mkdir -p "$OUT"
source bench/ensure_ditron.sh
status=0
step() {
  local t=$1; shift
  echo "== $*"
  timeout -k 10 "$t" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $*"; status=1; fi
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
for w in $WORLDS; do
  if [ "$w" = 1 ]; then
    step ${BENCH_TIMEOUT:-300} torchrun --standalone --nproc-per-node 1 -m ditron.bench overhead --machine "$MACHINE" \
        --out "$OUT" ${OPS:+--ops $OPS}
  else
    mps=0
    if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d 2>/dev/null; then mps=1; fi
    echo "== $w ranks on one GPU (MPS: $mps)"
    DITRON_RANKS_PER_GPU=$w step ${BENCH_TIMEOUT:-300} torchrun --standalone --nproc-per-node $w -m ditron.bench \
        overhead --machine "$MACHINE (MPS $mps)" --out "$OUT" --ops ${SHARED_OPS:-collectives,gemm}
    if [ $mps = 1 ]; then echo quit | nvidia-cuda-mps-control; sleep 1; fi
  fi
done
if [ -f shared/bench/probes/host_overhead.py ]; then
  step 120 torchrun --standalone --nproc-per-node 1 shared/bench/probes/host_overhead.py
fi
echo "== bench/overhead_gpu.sh: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
