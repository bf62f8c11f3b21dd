#!/usr/bin/env bash
# The GPU call (~130 s, any kind) of issue 53's Llama-3.1-8B batch-1 A/B (2026-12-07i, one H100:
# bench/results/h100-2026-12-07i/README.md): the shipped 8B tiles were fitted to Qwen3's MLP (12288 = 384 gate/up
# tiles of 32 columns for 396 programs, one wave); Llama's 14336 is 448 tiles, 1.13 waves.  mk_ab.sh's variants, one
# process each with its own baselines, the default first and last: 64x128 tiles of 37 columns (388: one wave), 19 of
# 32 columns (755: two waves; the winner, now hf.tiles_for's default), 16-row tiles (896).
#     OUT=dir bash bench/calls/llama_mk_ab.sh          (the device tool sets OUT)
MODEL=llama3-8b BATCH=1 VARIANTS="b1_cols37=--block-n gate_up=64 --block-k gate_up=128 --cols gate_up=37;\
b1_cols19=--cols gate_up=19;b1_gu16=--block-n gate_up=16" exec bash "$(dirname "$0")/mk_ab.sh"
