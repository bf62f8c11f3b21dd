#!/usr/bin/env bash
# One GPU call (~30 s per variant, any kind) A/B-ing the decode megakernel's tiles of one model at one batch size,
# one process per variant (each with its own HBM limit and torch + graph), the shipped default first and last (drift).
# Default: Qwen3-8B batch 1, the gate/up wave (issue 53: Llama-3.1-8B's 19 masked columns of 32 -- two waves of 396
# programs -- beat its one-and-a-bit waves by 3% on an H100, 2026-12-07i; Qwen3-8B's 384 tiles are one wave, and
# its excess over the HBM limit is ~25 us a layer on an H100 and on an H200 alike: smaller tiles may shorten the
# stage's tail there too; o / down in 373 masked tiles of 11 columns instead of 256 of 16 were slower on an H200 on
# 2026-11-27, before the in-loop waits and the noinline branches: od11 again).
#     OUT=dir bash bench/calls/mk_ab.sh
#     MODEL=llama3-8b BATCH=16 VARIANTS="wdot16=--gu-wdot 16;wcols19=--gu-wdot-cols 19" OUT=dir bash bench/calls/mk_ab.sh
source "$(dirname "$0")/prelude.sh"
MODEL=${MODEL:-qwen3-8b}
BATCH=${BATCH:-1}
if [ -z "${VARIANTS:-}" ]; then
    VARIANTS="cols16=--cols gate_up=16;bn16=--block-n gate_up=16;cols24=--cols gate_up=24;cols20=--cols gate_up=20"
    VARIANTS="$VARIANTS;od11=--cols o=11,down=11"
fi
mk() { local tag=$1; shift
  timeout 110 torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel --model $MODEL --ctx 512,4096 \
    --hf-batch= --batch $BATCH --warmup 3 --iters 15 "$@" --machine "$KIND" --tag "$KIND-$MODEL-b$BATCH-$tag" \
    --out $OUT > $OUT/$MODEL-b$BATCH-$tag.log 2>&1
  echo "== $MODEL batch $BATCH $tag ($*) rc=$? at $(el) s"
  grep -E "^\| *(512|4096)|spilled" $OUT/$MODEL-b$BATCH-$tag.log | head -4 | cut -c1-200; }
mk default
IFS=';' read -ra VS <<< "$VARIANTS"
for v in "${VS[@]}"; do
    # shellcheck disable=SC2086 -- the variant's flags are words
    mk "${v%%=*}" ${v#*=}
done
mk default_again
echo "== total $(el) s"
