#!/usr/bin/env bash
# next session, call B (~560 s): Llama-8B TP=1/TP=2 equality with the divergence diagnostic (53), then the sampler
# A/B on the Qwen3-8B whole step at batch 1 (tree vs shared/mkbase = the pre-chunked-sampler head)
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
MODELS=llama3-8b BENCH=0 EQ_TIMEOUT=200 timeout 280 bash tests/gpu/hf_megakernel.sh > $OUT/llama_eq.log 2>&1; echo "llama eq rc=$?"
grep -E "TP=|PASS|FAIL" $OUT/llama_eq.log | cut -c1-600 | tail -10
echo "== at $(el) s"
left=$(( 560 - $(el) ))
# where the whole step's time goes (LM head, top-k stages, sampler vs the layers): a traced build after the timed one
timeout $(( left - 10 )) torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel --model qwen3-8b --ctx 512 \
  --batch 1 --hf-batch= --trace --machine "$KIND" --out $OUT/trace > $OUT/trace.log 2>&1; echo "trace rc=$?"
grep -vE "^(W1207|\*\*\*)" $OUT/trace.log | tail -60 | cut -c1-200
echo "== total $(el) s"
