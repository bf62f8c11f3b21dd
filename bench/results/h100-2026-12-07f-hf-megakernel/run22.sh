#!/usr/bin/env bash
# short call (<= 185 s): decoder-only step traced beside the whole-step figure (53), EP fp8 traced (55), fp8 tests 2 ranks
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
fits() { [ $(( 180 - $(el) )) -gt "$1" ] || { echo "== skipped (needs $1 s, at $(el) s): $2"; return 1; }; }
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
timeout 80 torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel --config 8b --ctx 512 --batch 1 \
  --skip-eager --trace --machine "$KIND" --out $OUT/dec > $OUT/dec.log 2>&1; echo "decoder-only rc=$?"
grep -E "^\| 512|^step|^\| (gu|down|qkv|o|attn) |^critical" $OUT/dec.log | head -12
echo "== at $(el) s"
fits 70 model && { timeout 70 torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel --model qwen3-8b --ctx 512 \
  --batch 1 --hf-batch= --trace --machine "$KIND" --out $OUT/model > $OUT/model.log 2>&1; echo "whole step rc=$?"
  grep -E "^\| 512|^step|^\| (gu|down|qkv|o|attn|lm_head) |^critical" $OUT/model.log | head -12; }
echo "== at $(el) s"
fits 45 ep && { timeout 45 torchrun --standalone --nproc-per-node 1 -m ditron.bench ep --dtype fp8 --tokens 128 \
  --hidden 7168 --topk 8 --graph --trace --machine "$KIND" --out $OUT/ep > $OUT/ep_fp8.log 2>&1; echo "ep fp8 rc=$?"
  grep -vE "^(W1207|\*\*\*)" $OUT/ep_fp8.log | tail -24; }
fits 50 fp8t2 && { DITRON_RANKS_PER_GPU=2 DITRON_TEST_BACKEND=p2p timeout $(( 175 - $(el) )) torchrun --standalone --nproc-per-node 2 \
  tests/gpu/pytest_files.py tests/test_fp8.py > $OUT/fp8t2.log 2>&1; echo "fp8 tests 2 ranks rc=$?"
  grep -E "^== |passed|failed" $OUT/fp8t2.log | cut -c1-300 | head -6; }
echo "== total $(el) s"
