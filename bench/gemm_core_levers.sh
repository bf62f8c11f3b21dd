#!/usr/bin/env bash
# Issue 52's GEMM-core levers on ONE GPU, in about 5 minutes (bench/gemm_core_levers.py says what runs):
#   1. correctness of every candidate (the tl core as shipped, the tl core warp-specialised at num_warps=4, the
#      Gluon core in several configs) at odd and paper shapes, bf16 and fp16, against an fp32 reference, and the
#      Gluon core bit for bit against its tl twin (same tiles, same BLOCK_K). Each candidate is reported as it
#      finishes; a candidate that hangs (a warp-specialised kernel waiting on a barrier that never completes) is
#      named by the script's watchdog (75 s without progress, GEMM_LEVERS_STALL_S) which ends the step, and the
#      step runs again without it (at most 3 times);
#      Then tests/gpu/gemm_hopper_twin.py (the same bit-equality test over more shapes: issue 52 item 4's GPU test);
#   2. timing, side by side with cuBLAS (torch.matmul, same process, CUDA-graph replays): the paper's per-rank
#      GEMM shapes at TP=2 and TP=8, bf16 and fp16, only the candidates that passed step 1. The last table is
#      the summary: per candidate and (TP, dtype) the geomean of cuBLAS time / candidate time and the worst shape
#      (a step that hangs here ends the run with the partial summary).
# Output: stdout (the summary last) and $OUT/gemm_core_levers.{log,json} ($OUT default bench/results).
#
#   bash bench/gemm_core_levers.sh                        # everything
#   TP=2 DTYPES=bf16 bash bench/gemm_core_levers.sh       # a subset
#   CANDIDATES="tl default,gluon coop 128x256x64 s3" bash bench/gemm_core_levers.sh
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
# ditron is not installed on the GPU machines: an editable install maps ditron.kernels to kernels/
source bench/ensure_ditron.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true
CANDIDATES=${CANDIDATES:-all}
EXCLUDE=""
PROG="$OUT/gemm_core_levers.progress"
T0=$SECONDS
for attempt in 1 2 3; do
  : > "$PROG"
  echo "== check (attempt $attempt)${EXCLUDE:+, without: $EXCLUDE}"
  timeout -k 5 "${CHECK_TIMEOUT:-200}" python3 bench/gemm_core_levers.py --check --progress "$PROG" \
    --candidates "$CANDIDATES" --exclude "$EXCLUDE" 2>&1 | tee "$OUT/gemm_core_levers.check.log" | grep -v "^START"
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
# issue 52 item 4's standing GPU test (the Gluon core vs its tl twin, bit for bit; kernels compiled above)
timeout -k 5 "${TWIN_TIMEOUT:-100}" python3 tests/gpu/gemm_hopper_twin.py --exclude "$EXCLUDE" > "$OUT/gemm_hopper_twin.log" 2>&1
echo "== twin test: exit $? ($(tail -n 1 "$OUT/gemm_hopper_twin.log"))"; grep "^FAIL" "$OUT/gemm_hopper_twin.log" | head -5
timeout -k 5 "${TIME_TIMEOUT:-330}" python3 bench/gemm_core_levers.py --tp "${TP:-2,8}" --dtypes "${DTYPES:-bf16,fp16}" \
  --candidates "$CANDIDATES" --exclude "$EXCLUDE" --json "$OUT/gemm_core_levers.json" 2>&1 | tee "$OUT/gemm_core_levers.log"
rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true
echo "== gemm_core_levers: timing exit $rc, total $((SECONDS - T0)) s; left out: ${EXCLUDE:-none}"
exit $rc
