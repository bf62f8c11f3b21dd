#!/usr/bin/env bash
# One H200 call (~570 s), issues 52 / 55: attention twin (widens sm90.json's verified domain), ring_attn, fp8 GEMM row/block TP=2.
# OUT=dir bash bench/calls/h200_attention_fp8.sh
source "$(dirname "$0")/prelude.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
fits() { [ $(( 570 - $(el) )) -gt "$1" ] || { echo "== skipped (needs $1 s, at $(el) s): $2"; return 1; }; }
timeout 130 python3 tests/gpu/attention_hopper_twin.py --configs default --bound > $OUT/twin.log 2>&1; echo "twin rc=$? at $(el) s"
grep -E "^(DIFF|FAIL|PASS|OK)|differ|identical" $OUT/twin.log | cut -c1-260 | tail -20
fits 110 ring && { timeout 110 torchrun --standalone --nproc-per-node 1 -m ditron.bench ring_attn --seq 8192,16384,32768 --causal both \
  --machine "$KIND" --out $OUT/ring > $OUT/ring.log 2>&1; echo "ring_attn rc=$?"; tail -14 $OUT/ring.log; }
fits 150 fp8 && { timeout 200 torchrun --standalone --nproc-per-node 1 -m ditron.bench gemm --dtype fp8 --recipe row,block \
  --shapes paper --tp 2 --graph --repeat 1 --machine "$KIND" --out $OUT/fp8 > $OUT/fp8.log 2>&1; echo "fp8 rc=$?"; grep -E "^\||geomean" $OUT/fp8.log | tail -30 | cut -c1-220; }
echo "== total $(el) s"
