#!/usr/bin/env bash
# One H200 call (~575 s), issue 52: GEMM core levers TP=2,8 (round-2 candidates, per-shape best -> an H200 table), then ring_attn.
# OUT=dir bash bench/calls/h200_gemm.sh
source "$(dirname "$0")/prelude.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$OUT/gemm TP=2,8 CHECK_TIMEOUT=110 TIME_TIMEOUT=${TT:-300} timeout -k 5 440 bash bench/gemm_core_levers.sh > $OUT/gemm_run.log 2>&1
echo "gemm rc=$? at $(el) s"
grep -E "^(==|FAIL|HUNG)|geo|worst|per-shape" $OUT/gemm_run.log | tail -30
left=$(( 575 - $(el) ))
[ $left -gt 100 ] && { timeout $left torchrun --standalone --nproc-per-node 1 -m ditron.bench ring_attn --seq 8192,16384,32768 --causal both \
  --machine "$KIND" --out $OUT/ring > $OUT/ring.log 2>&1; echo "ring_attn rc=$?"; tail -14 $OUT/ring.log; }
echo "== total $(el) s"
