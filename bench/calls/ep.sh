#!/usr/bin/env bash
# One GPU call (~500 s) for EP (issues 55 and the 2-rank test failure of 2026-12-07g):
#   1. ditron bench ep --dtype fp8 (the default fp8 dispatch, ll_fp8_prequant, bf16, device copies; one process)
#   2. the fp8 tile sweep with prequant variants (bench/diag/ep_fp8_sweep.py)
#   3. bench/diag/ep_w2.sh: the small-case diagnosis at 2 ranks and test_ep.py alone at 2 ranks
#     OUT=dir bash bench/calls/ep.sh          (the device tool sets OUT)
source "$(dirname "$0")/prelude.sh"
timeout 90 torchrun --standalone --nproc-per-node 1 -m ditron.bench ep --dtype fp8 --tokens 128 --hidden 7168 --topk 8 \
  --graph --machine "$KIND" --out $OUT/ep > $OUT/ep_fp8.log 2>&1; echo "ep fp8 rc=$? at $(el) s"
grep -vE "^(W12|\*\*\*)" $OUT/ep_fp8.log | tail -16
DITRON_HEAP_SIZE=12G timeout 90 torchrun --standalone --nproc-per-node 1 bench/diag/ep_fp8_sweep.py > $OUT/ep_sweep.log 2>&1
echo "sweep rc=$? at $(el) s"; grep -E "^\|" $OUT/ep_sweep.log
OUT=$OUT bash bench/diag/ep_w2.sh
echo "== total $(el) s"
