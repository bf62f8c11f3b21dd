#!/usr/bin/env bash
# noinline_branches A/B (53): whole step Qwen3-8B (batch 1, 16) and decoder alone (1, 8, 16), inlined vs noinline,
# same process per pair; then a traced whole step with the better one at batch 1.
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
fits() { [ $(( ${BUDGET:-560} - $(el) )) -gt "$1" ] || { echo "== skipped (needs $1 s, at $(el) s): $2"; return 1; }; }
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
mk() { # tag, timeout, args...
  local tag=$1 t=$2; shift 2
  timeout $t torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel "$@" --machine "$KIND" --out $OUT/$tag \
    > $OUT/$tag.log 2>&1; echo "== $tag rc=$? at $(el) s"
  grep -E "^\| *(512|ctx|batch)|HBM|limit" $OUT/$tag.log | head -12 | cut -c1-220
}
fits 100 dec_inl && mk dec_inl 100 --config 8b --ctx 512 --batch 1,8,16 --skip-eager
fits 100 dec_noi && mk dec_noi 100 --config 8b --ctx 512 --batch 1,8,16 --skip-eager --noinline-branches
fits 110 model_inl && mk model_inl 110 --model qwen3-8b --ctx 512 --batch 1,16 --hf-batch=
fits 110 model_noi && mk model_noi 110 --model qwen3-8b --ctx 512 --batch 1,16 --hf-batch= --noinline-branches
fits 80 model_noi_trace && { mk model_noi_trace 80 --model qwen3-8b --ctx 512 --batch 1 --hf-batch= --noinline-branches --trace
  grep -E "^step|^\| (gu|down|qkv|o|attn|lm_head|topk|sample)|^critical|outside" $OUT/model_noi_trace.log | head -14; }
echo "== total $(el) s"
