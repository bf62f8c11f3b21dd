#!/usr/bin/env bash
# next session, call B (issue 55 + 51): fp8 blockwise Gluon (overlapped promotion) vs _scaled_mm / tl twin; fp8 GPU
# tests at 1 and 2 ranks incl. the Gluon fp8 overlap ops; EP fp8 bench; the EP overhead row after the plan cache
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s)
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
OUT=$OUT RECIPES=block ROUNDS=1 FP8_GLUON_TIMEOUT=120 bash bench/fp8_gluon.sh > $OUT/fp8g_block.log 2>&1; echo "fp8 block rc=$?"
grep -E "differ|FAIL|wrong|geo|vs tl|bf16/best" $OUT/fp8g_block.log | tail -30
DITRON_TEST_BACKEND=p2p timeout 150 torchrun --standalone --nproc-per-node 1 tests/gpu/pytest_files.py tests/test_fp8.py \
  > $OUT/fp8t1.log 2>&1; echo "fp8 tests 1 rank rc=$?"; grep -E "^== " $OUT/fp8t1.log | head -12
DITRON_RANKS_PER_GPU=2 DITRON_TEST_BACKEND=p2p timeout 170 torchrun --standalone --nproc-per-node 2 tests/gpu/pytest_files.py \
  tests/test_fp8.py tests/test_gemm_rs.py tests/test_ag_gemm.py tests/test_gemm_ar.py -- -k "fp8 or gluon" \
  > $OUT/fp8t2.log 2>&1; echo "fp8/gluon tests 2 ranks rc=$?"; grep -E "^== " $OUT/fp8t2.log | head -20
echo "== tests done at $(( $(date +%s) - start )) s"
timeout 90 torchrun --standalone --nproc-per-node 1 -m ditron.bench ep --dtype fp8 --tokens 128 --hidden 7168 --topk 8 \
  --graph --machine "$KIND" --out $OUT > $OUT/ep_fp8.log 2>&1; echo "ep fp8 rc=$?"; tail -15 $OUT/ep_fp8.log
left=$(( 580 - ($(date +%s) - start) ))
[ $left -gt 60 ] && MACHINE="$KIND" WORLDS=1 OPS=launch,ep BENCH_TIMEOUT=$left OUT=$OUT/overhead bash bench/overhead_gpu.sh \
  > $OUT/overhead.log 2>&1; grep -E "^\|" $OUT/overhead.log | tail -6
echo "== total $(( $(date +%s) - start )) s"
