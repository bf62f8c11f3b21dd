#!/usr/bin/env bash
# Issue 52's GEMM-core levers on ONE GPU, in about 5 minutes (bench/gemm_core_levers.py says what runs):
#   1. correctness of every candidate (--candidates round2 by default: the round-1 leaders and the levers aimed
#      at the losing shapes -- tiles for wave quantisation, L2 grouping, BLOCK_K 128, stages, Gluon variants)
#      at odd shapes against an fp32 reference (CHECK=full: also the paper shape and both dtypes), and each
#      Gluon config bit for bit against its tl twin.  Each candidate is reported as it finishes; a candidate
#      that hangs (a warp-specialised kernel waiting on a barrier that never completes) is named by the
#      script's watchdog (75 s without progress, GEMM_LEVERS_STALL_S) which ends the step, and the step runs
#      again without it (at most 3 times);
#      TWIN=1: then tests/gpu/gemm_hopper_twin.py (the same bit-equality test over more shapes);
#   2. timing, side by side with cuBLAS (torch.matmul, same process, CUDA-graph replays): the paper's per-rank
#      GEMM shapes at TP=2 and TP=8 (bf16; DTYPES=bf16,fp16 for both), only the candidates that passed step 1;
#      each shape is checked again before it is timed.  Then the summary (per candidate and (TP, dtype) the
#      geomean of cuBLAS time / candidate time and the worst shape), the per-shape best (the best candidate
#      per shape and the geomean of that table: what a per-shape dispatch reaches) and the per-GPU table
#      written from it, checked through the kernels' lookup (kernels/gemm_table.py): copy it to
#      kernels/gemm_tables/<gpu>.json to make it matmul's default on that GPU kind.
# Output: stdout (the summaries last) and $OUT/gemm_core_levers.{log,json}, $OUT/gemm_table.json
# ($OUT default bench/results).
#
#   bash bench/gemm_core_levers.sh                        # round 2: TP=2,8 bf16
#   TP=2 DTYPES=bf16,fp16 bash bench/gemm_core_levers.sh  # a subset / fp16 too
#   CANDIDATES="tl default,gluon coop 128x256x64 s3" bash bench/gemm_core_levers.sh
#   CANDIDATES=round1 CHECK=full TWIN=1 bash bench/gemm_core_levers.sh   # round 1 as it ran
#   CANDIDATES=streamk CHECK=full bash bench/gemm_core_levers.sh         # Stream-K beside its data-parallel twins
#   CANDIDATES="tl default,matmul table" ROUNDS=6 bash bench/gemm_core_levers.sh   # the shipped table vs the rule
#   ROUNDS (timing rounds, best kept; default 2), MARGIN (--margin of the table: default 0.03)
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
# ditron is not installed on the GPU machines: an editable install maps ditron.kernels to kernels/
source bench/ensure_ditron.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true
CANDIDATES=${CANDIDATES:-round2}
DTYPES=${DTYPES:-bf16}
CHECKFLAG=--quick-check; [ "${CHECK:-quick}" = full ] && CHECKFLAG=--check
EXCLUDE=""
PROG="$OUT/gemm_core_levers.progress"
T0=$SECONDS
for attempt in 1 2 3; do
  : > "$PROG"
  echo "== check (attempt $attempt)${EXCLUDE:+, without: $EXCLUDE}"
  timeout -k 5 "${CHECK_TIMEOUT:-150}" python3 bench/gemm_core_levers.py $CHECKFLAG --progress "$PROG" \
    --candidates "$CANDIDATES" --exclude "$EXCLUDE" --dtypes "$DTYPES" 2>&1 | tee "$OUT/gemm_core_levers.check.log" | grep -v "^START"
  rc=${PIPESTATUS[0]}
  # candidates that failed: left out of the timing; one that started and never ended: hung (or the step timed out)
  failed=$(grep "^FAIL " "$PROG" | sed 's/^FAIL \([^:]*\):.*/\1/' | paste -sd, -)
  hung=$(comm -23 <(grep "^START " "$PROG" | sed 's/^START //' | sort) \
                  <(grep -E "^(PASS|FAIL) " "$PROG" | sed -E 's/^(PASS|FAIL) ([^:(]*[^:( ]).*/\2/' | sort) | paste -sd, -)
  EXCLUDE=$(echo "$EXCLUDE,$failed,$hung" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)
  if [ -n "$hung" ]; then echo "== HUNG (named by the watchdog) or the step timed out: $hung"; continue; fi
  [ $rc -eq 0 ] || [ -n "$failed" ] || echo "== check step exited $rc"
  break
done
echo "== check done in $((SECONDS - T0)) s; left out of the timing: ${EXCLUDE:-none}"
if [ "${TWIN:-0}" = 1 ]; then
  # issue 52 item 4's standing GPU test (the Gluon core vs its tl twin, bit for bit; kernels compiled above)
  timeout -k 5 "${TWIN_TIMEOUT:-100}" python3 tests/gpu/gemm_hopper_twin.py --exclude "$EXCLUDE" > "$OUT/gemm_hopper_twin.log" 2>&1
  echo "== twin test: exit $? ($(tail -n 1 "$OUT/gemm_hopper_twin.log"))"; grep "^FAIL" "$OUT/gemm_hopper_twin.log" | head -5
fi
timeout -k 5 "${TIME_TIMEOUT:-270}" python3 bench/gemm_core_levers.py --tp "${TP:-2,8}" --dtypes "$DTYPES" \
  --rounds "${ROUNDS:-2}" --margin "${MARGIN:-0.03}" \
  --candidates "$CANDIDATES" --exclude "$EXCLUDE" --json "$OUT/gemm_core_levers.json" --per-shape-best \
  --write-table "$OUT/gemm_table.json" 2>&1 | tee "$OUT/gemm_core_levers.log"
rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true
echo "== gemm_core_levers: timing exit $rc, total $((SECONDS - T0)) s; left out: ${EXCLUDE:-none}"
exit $rc
