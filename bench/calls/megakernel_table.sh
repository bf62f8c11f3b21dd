#!/usr/bin/env bash
# One GPU call (~560 s) for issue 53's item-5 table on whatever GPU it runs on (H100 or H200): the whole step
# (embedding to sampled token, the shipped defaults: noinline branches on NVIDIA) of Qwen3-8B at batch 1, 8, 16 and
# context 512, 4096, each batch in its own process with its baselines measured there (the full step's HBM limit,
# torch + CUDA graph, transformers with a static cache under torch.compile reduce-overhead), then Llama-3.1-8B at
# batch 1 and 16 while the budget lasts (tests/gpu/hf_megakernel.sh EQ=0; tables in $OUT/*.md).
#     OUT=dir bash bench/calls/megakernel_table.sh          (the device tool sets OUT)
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for mb in "qwen3-8b 1" "qwen3-8b 16" "qwen3-8b 8" "llama3-8b 1" "llama3-8b 16"; do
    set -- $mb
    left=$(( BUDGET - $(el) ))
    [ $left -ge 100 ] || { echo "== skipped $1 batch $2: $left s left"; continue; }
    EQ=0 MODELS=$1 BATCHES=$2 BENCH_TIMEOUT=$(( left - 10 )) OUT=$OUT timeout $left bash tests/gpu/hf_megakernel.sh \
        > $OUT/$1-b$2.log 2>&1
    echo "== $1 batch $2 rc=$? at $(el) s"
    grep -E "^\| *(512|4096)|spilled" $OUT/$1-b$2.log | head -4 | cut -c1-260
done
echo "== total $(el) s"
