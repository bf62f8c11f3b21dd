#!/usr/bin/env bash
# One GPU call (~400 s, any kind; H100 first) for issue 53's Llama-3.1-8B batch-1 excess (1.214x its HBM limit on an
# H100 on 2026-12-07h against Qwen3-8B's 1.175x): the shipped 8B tiles were fitted to Qwen3's MLP (12288 = 384
# gate/up tiles of 32 columns for 396 programs, one wave); Llama's 14336 is 448 tiles, 1.13 waves, so 52 programs
# take a second tile while the others wait for down.  A/B in one process per variant, each with its own baselines:
#   default (traced: where the step's time goes) | --block-n gate_up=16 (896 tiles, 2.26 waves: 48 columns per
#   program on the critical path instead of 64) | batch 16 default | batch 16 --gu-wdot 16 (the dot path's tiles).
#     OUT=dir bash bench/calls/llama_mk_ab.sh          (the device tool sets OUT)
source "$(dirname "$0")/prelude.sh"
mk() { local tag=$1; shift
  timeout 110 torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel --model llama3-8b --ctx 512,4096 \
    --hf-batch= --warmup 3 --iters 15 "$@" --machine "$KIND" --tag "$KIND-$tag" --out $OUT > $OUT/$tag.log 2>&1
  echo "== $tag rc=$? at $(el) s"; grep -E "^\| *(512|4096)|spilled|gate/up" $OUT/$tag.log | head -6 | cut -c1-200; }
mk b1_default --batch 1
mk b1_cols37 --batch 1 --block-n gate_up=64 --block-k gate_up=128 --cols gate_up=37     # 388 tiles: one wave
mk b1_cols19 --batch 1 --cols gate_up=19                                                # 755 tiles: 1.9 waves
mk b1_gu16 --batch 1 --block-n gate_up=16                                               # 896 tiles: 2.26 waves
mk b1_default2 --batch 1                                                                # drift check
echo "== total $(el) s"
