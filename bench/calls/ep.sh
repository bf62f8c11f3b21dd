#!/usr/bin/env bash
# One GPU call (~300 s, any kind) for issue 55's EP fp8 goals (faster than bf16, within 1.2x a device copy):
#   1. ditron bench ep --dtype fp8 --trace: the default fp8 dispatch (each pair's row quantised), ll_fp8_prequant,
#      ll_fp8_once (each token of a dispatch block quantised once: new in 2026-12-07i, untimed), bf16, device copies,
#      and the per-phase account of each (one process)
#   2. the fp8 tile sweep, ll_fp8_once's groups per step / rows / warps among it (bench/diag/ep_fp8_sweep.py)
#   3. tests/test_ep.py at 2 ranks on the GPU (ll_fp8_once's packets to a peer)
# 2026-12-07i (H100): default fp8 0.87x bf16, prequant 0.81x (bench/results/h100-2026-12-07i/ep/).
#     OUT=dir bash bench/calls/ep.sh          (the device tool sets OUT)
source "$(dirname "$0")/prelude.sh"
timeout 120 torchrun --standalone --nproc-per-node 1 -m ditron.bench ep --dtype fp8 --tokens 128 --hidden 7168 --topk 8 \
  --graph --trace --machine "$KIND" --out $OUT/ep > $OUT/ep_fp8.log 2>&1; echo "ep fp8 rc=$? at $(el) s"
grep -vE "^(W12|\*\*\*)" $OUT/ep_fp8.log | grep -E "^\||Goal|^- " | head -40
DITRON_HEAP_SIZE=12G timeout 160 torchrun --standalone --nproc-per-node 1 bench/diag/ep_fp8_sweep.py > $OUT/ep_sweep.log 2>&1
echo "sweep rc=$? at $(el) s"; grep -E "^\|" $OUT/ep_sweep.log
NPROCS=2 BACKENDS=p2p RUN_BUDGET_S=150 PYTEST_WAIT_TIMEOUT_S=60 STEP_FILTER=pytest PYTEST_FILES="tests/test_ep.py" \
  timeout 160 bash tests/gpu/run.sh > $OUT/test_ep_w2.log 2>&1; echo "test_ep at 2 ranks rc=$? at $(el) s"
grep -E "^== (file|PASSED|FAILED)|passed|failed" $OUT/test_ep_w2.log | tail -4
echo "== total $(el) s"
