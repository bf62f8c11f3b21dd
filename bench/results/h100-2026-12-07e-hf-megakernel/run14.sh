#!/usr/bin/env bash
# next session, call C (issue 53): Llama-3.1-8B equality TP=1/TP=2 (time-sliced), the Qwen3-8B batch-1/16 step with
# the chunked sampler, then the TP=2 MPS hang with bounded waits (a hang report naming the wait)
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
MODELS=llama3-8b BENCH=0 EQ_TIMEOUT=200 timeout 300 bash tests/gpu/hf_megakernel.sh > $OUT/llama_eq.log 2>&1; echo "llama eq rc=$?"
grep -E "TP=|PASS|FAIL|prompt|sigma" $OUT/llama_eq.log | tail -14
echo "== llama eq took $(( $(date +%s) - start )) s"
EQ=0 BATCHES="${BATCHES:-1 16}" BENCH_TIMEOUT=120 OUT=$OUT timeout $(( 560 - ($(date +%s) - start) )) \
  bash tests/gpu/hf_megakernel.sh > $OUT/qwen_bench.log 2>&1; echo "qwen bench rc=$?"
grep -E "qwen3-8b context" $OUT/qwen_bench.log | tail -6
echo "== total $(( $(date +%s) - start )) s"
