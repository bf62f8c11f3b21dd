#!/usr/bin/env bash
# One GPU call (~560 s) for issue 53's item-5 table on whatever GPU it runs on (H100 or H200), the shipped defaults
# (noinline branches on NVIDIA): first the whole step (embedding to sampled token) of Qwen3-8B and Llama-3.1-8B at
# batch 1, 8, 16 and context 512, 4096 against the full step's HBM limit and torch + CUDA graph (one process per
# model, ~70 s each), then the transformers baseline (static cache, torch.compile reduce-overhead; ~115 s per case,
# in a child process per case: ditron/bench/megakernel_hf.py) at batch 1 and 16 while the budget lasts, Qwen3 first
# (tests/gpu/hf_megakernel.sh EQ=0; each with its own megakernel and baselines again).  Tables in $OUT/*.md.
# 2026-12-07h on an H100 (the older order: transformers with each batch): bench/results/h100-2026-12-07h-hf-megakernel/.
#     OUT=dir bash bench/calls/megakernel_table.sh          (the device tool sets OUT)
source "$(dirname "$0")/prelude.sh"
BUDGET=${BUDGET:-560}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for M in qwen3-8b llama3-8b; do
    timeout 150 torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel --model $M --ctx 512,4096 \
        --batch 1,8,16 --hf-batch= --warmup 3 --iters 15 --machine "$KIND" --tag "$KIND-mk" --out $OUT \
        > $OUT/$M-mk.log 2>&1
    echo "== $M (megakernel, HBM limit, torch + graph) rc=$? at $(el) s"
    grep -E "^\| *(512|4096)|spilled" $OUT/$M-mk.log | head -8 | cut -c1-200
done
for mb in "qwen3-8b 1" "qwen3-8b 16" "llama3-8b 1" "llama3-8b 16"; do
    set -- $mb
    left=$(( BUDGET - $(el) ))
    [ $left -ge 240 ] || { echo "== skipped transformers $1 batch $2: $left s left"; continue; }
    EQ=0 MODELS=$1 BATCHES=$2 BENCH_TIMEOUT=$(( left - 10 )) OUT=$OUT timeout $left bash tests/gpu/hf_megakernel.sh \
        > $OUT/$1-b$2.log 2>&1
    echo "== $1 batch $2 with transformers rc=$? at $(el) s"
    grep -E "^\| *(512|4096)" $OUT/$1-b$2.log | head -4 | cut -c1-260
done
echo "== total $(el) s"
