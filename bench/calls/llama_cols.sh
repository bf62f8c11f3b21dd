#!/usr/bin/env bash
# One GPU call (~420 s, any kind) for issue 53 after Llama-3.1-8B's default gate/up tiles became 755 masked tiles of
# 19 columns (kernels/decoder/hf.py tiles_for; bench/calls/llama_mk_ab.sh on an H100, 2026-12-07: batch 1 1.174x its
# HBM limit against 1.212x): the Llama table with the shipped defaults (batch 1 / 8 / 16, context 512 / 4096, HBM limit
# and torch + graph of the same process), then token equality with transformers at TP=1 (the new tiles) and TP=2.
#     OUT=dir bash bench/calls/llama_cols.sh          (the device tool sets OUT)
source "$(dirname "$0")/prelude.sh"
BUDGET=${BUDGET:-570}
timeout 150 torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel --model llama3-8b --ctx 512,4096 \
    --batch 1,8,16 --hf-batch= --warmup 3 --iters 15 --machine "$KIND" --tag "$KIND-mk" --out $OUT > $OUT/llama-mk.log 2>&1
echo "== llama3-8b (megakernel, HBM limit, torch + graph) rc=$? at $(el) s"
grep -E "^\| *(512|4096)|spilled|gate/up" $OUT/llama-mk.log | head -8 | cut -c1-200
EQ_TIMEOUT=$(( BUDGET - 10 - $(el) )) BENCH=0 MODELS=llama3-8b OUT=$OUT timeout $(( BUDGET - $(el) )) bash tests/gpu/hf_megakernel.sh \
    > $OUT/llama-eq.log 2>&1
echo "== llama3-8b token equality TP=1, TP=2 rc=$? at $(el) s"
grep -E "^==|PASS|FAIL|tokens|max" $OUT/llama-eq.log | head -30 | cut -c1-250
