#!/usr/bin/env bash
# fp8 GEMMs on one GPU (issue 55): correctness first, then the fp8 core against torch._scaled_mm (cuBLASLt) and
# ditron's bf16 core in the same run.
#
#   bench/fp8_gpu.sh                                 # H100 by default
#   MACHINE=nvidia-h200 TAG=h200 bench/fp8_gpu.sh
#
# Steps (each with a timeout; "== PASSED/FAILED" per step):
#   1. tests/test_fp8.py on 1 rank (the core, grouped GEMM, gemm_rs at world size 1), then on 2 ranks sharing the
#      GPU (gemm_rs ce, gemm_ar one_shot / rs_ag, ag_gemm ce): numerics against torch._scaled_mm / the blockwise
#      float32 reference on the GPU's results;
#   2. ditron bench gemm --dtype fp8 at the paper's per-rank GEMM shapes (TP=$TP): every implementation checked
#      against the float32 product of the dequantised operands, then timed (CUDA-graph replays, 3 rounds):
#      torch._scaled_mm (column cuBLAS), the fp8 core, ditron's bf16 core, cuBLAS bf16; the last table gives
#      fp8 vs _scaled_mm (goal >= 0.95x) and fp8 vs ditron bf16 (goal >= 1.6x) per shape and as geomeans.
# Results: bench/results/$TAG-gemm-fp8.{md,json}.
set -o pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "== cannot install ditron"; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MACHINE=${MACHINE:-nvidia-h100-x1}
TAG=${TAG:-h100-$(date +%F)}
TP=${TP:-8}
RECIPES=${RECIPES:-row,tensor,block}
status=0
step() {
  local t=$1; shift
  echo "== $*"
  timeout -k 10 "$t" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $*"; status=1; else echo "== PASSED: $*"; fi
}
export DITRON_TEST_GPU_ONLY=1 DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-1G}
step 300 torchrun --standalone --nproc-per-node 1 tests/gpu/pytest_files.py tests/test_fp8.py
DITRON_RANKS_PER_GPU=2 step 300 torchrun --standalone --nproc-per-node 2 tests/gpu/pytest_files.py tests/test_fp8.py
unset DITRON_TEST_GPU_ONLY
DITRON_HEAP_SIZE=64M step 540 torchrun --standalone --nproc-per-node 1 -m ditron.bench gemm --dtype fp8 \
  --recipe "$RECIPES" --shapes paper --tp "$TP" --graph --repeat 3 --machine "$MACHINE" --tag "$TAG"
echo "== bench/fp8_gpu.sh: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
