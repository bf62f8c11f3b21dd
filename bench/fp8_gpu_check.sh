#!/usr/bin/env bash
# fp8 on one Hopper GPU (issue 55; the 2026-12-07e failures): tests/test_fp8.py at 1 and 2 ranks with the GPU bound
# of the tensor core's fp8 accumulation (tests/bodies_fp8.py GPU_FP8_ACCUMULATION: a failure prints the bound and
# the worst element's error / bound ratio), the EP fp8 dispatch's codes against torch's quantiser element by
# element (bench/diag/ep_fp8_codes.py), then the EP fp8 bench.  Usage: OUT=/some/dir bash bench/fp8_gpu_check.sh
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fp8_gpu_check}; mkdir -p "$OUT"
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
source bench/ensure_ditron.sh > "$OUT/ensure.log" 2>&1
DITRON_TEST_BACKEND=p2p timeout 150 torchrun --standalone --nproc-per-node 1 tests/gpu/pytest_files.py tests/test_fp8.py \
  > "$OUT/fp8t1.log" 2>&1; echo "fp8 tests 1 rank rc=$?"; grep -E "^== " "$OUT/fp8t1.log" | cut -c1-700 | head -12
DITRON_RANKS_PER_GPU=2 DITRON_TEST_BACKEND=p2p timeout 200 torchrun --standalone --nproc-per-node 2 \
  tests/gpu/pytest_files.py tests/test_fp8.py > "$OUT/fp8t2.log" 2>&1; echo "fp8 tests 2 ranks rc=$?"
grep -E "^== " "$OUT/fp8t2.log" | cut -c1-700 | head -16
timeout 90 torchrun --standalone --nproc-per-node 1 bench/diag/ep_fp8_codes.py 7168 8 > "$OUT/ep_fp8_codes.log" 2>&1
echo "ep fp8 codes rc=$?"; grep -vE "^(W1207|\*\*\*)" "$OUT/ep_fp8_codes.log" | tail -25
timeout 120 torchrun --standalone --nproc-per-node 1 -m ditron.bench ep --dtype fp8 --tokens 128 --hidden 7168 --topk 8 \
  --graph --machine "$KIND" --out "$OUT" > "$OUT/ep_fp8.log" 2>&1; echo "ep fp8 bench rc=$?"; grep -E "^\||FAIL|goal|differ" "$OUT/ep_fp8.log" | tail -12
