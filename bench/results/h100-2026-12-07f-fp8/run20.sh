#!/usr/bin/env bash
# call C (<= 560 s): EP fp8 packing fix (diag + bench ep --dtype fp8), fp8 GPU tests with the new promotion defaults,
# Llama-8B equality TP=1/TP=2 with float32-unambiguous prompts
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
fits() { [ $(( 560 - $(el) )) -gt "$1" ] || { echo "== skipped (needs $1 s, at $(el) s): $2"; return 1; }; }
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
timeout 40 torchrun --standalone --nproc-per-node 1 bench/diag/ep_fp8_codes.py 7168 8 > $OUT/ep_fp8_codes.log 2>&1
echo "ep fp8 codes rc=$?"; grep -E "codes differ|^==" $OUT/ep_fp8_codes.log | head -8
timeout 90 torchrun --standalone --nproc-per-node 1 -m ditron.bench ep --dtype fp8 --tokens 128 --hidden 7168 --topk 8 \
  --graph --machine "$KIND" --out $OUT/ep > $OUT/ep_fp8.log 2>&1; echo "ep fp8 rc=$?"; grep -vE "^(W1207|\*\*\*)" $OUT/ep_fp8.log | tail -14
echo "== at $(el) s"
fits 200 llama && { MODELS=llama3-8b BENCH=0 EQ_TIMEOUT=200 timeout 240 bash tests/gpu/hf_megakernel.sh > $OUT/llama_eq.log 2>&1
  echo "llama eq rc=$?"; grep -E "TP=|PASS|FAIL|float32 agrees" $OUT/llama_eq.log | cut -c1-400 | tail -12; }
echo "== at $(el) s"
fits 100 fp8t1 && { DITRON_TEST_BACKEND=p2p timeout $(( 550 - $(el) )) torchrun --standalone --nproc-per-node 1 tests/gpu/pytest_files.py \
  tests/test_fp8.py > $OUT/fp8t1.log 2>&1; echo "fp8 tests 1 rank rc=$?"; grep -E "^== |passed|failed|^FAILED|Error" $OUT/fp8t1.log | cut -c1-400 | head -12; }
echo "== total $(el) s"
