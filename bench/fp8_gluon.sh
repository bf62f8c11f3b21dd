#!/usr/bin/env bash
# Issue 55: the fp8 Gluon core on ONE H100 (bench/fp8_gluon.py says what and how), < 5 minutes:
#   correctness first (per-tensor, rowwise and DeepSeek-V3 blockwise, TP=8 paper shapes, fresh random e4m3
#   operands, against the fp32 reference and torch._scaled_mm where it runs: max abs / rel errors; blockwise also
#   the bitwise difference from the tl twin), then timings in the same process: torch._scaled_mm, the Gluon fp8
#   core (coop / pingpong, 4 / 6 stages), the tl fp8 core and ditron's bf16 core; a table per scaling family.
# Output: stdout and $OUT/fp8_gluon.{log,json} ($OUT default bench/results).
#
#   bash bench/fp8_gluon.sh
#   CONFIGS="coop 128x128x128 s6" ROUNDS=1 bash bench/fp8_gluon.sh
#   RECIPES=block bash bench/fp8_gluon.sh                  # blockwise: overlapped vs serial consumer, vendor, tl, bf16
#   RECIPES=block BLOCK_CONFIGS="coop 128x128x128 s6,coop 128x128x128 s6 serial" bash bench/fp8_gluon.sh
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
source bench/ensure_ditron.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true
T0=$SECONDS
ARGS=(--tp "${TP:-8}" --rounds "${ROUNDS:-2}" --json "$OUT/fp8_gluon.json")
[ -n "${CONFIGS:-}" ] && ARGS+=(--configs "$CONFIGS")
[ -n "${RECIPES:-}" ] && ARGS+=(--recipes "$RECIPES")
[ -n "${BLOCK_CONFIGS:-}" ] && ARGS+=(--block-configs "$BLOCK_CONFIGS")
timeout -k 5 "${FP8_GLUON_TIMEOUT:-290}" python3 bench/fp8_gluon.py "${ARGS[@]}" 2>&1 | tee "$OUT/fp8_gluon.log"
rc=${PIPESTATUS[0]}
echo "== fp8_gluon: exit $rc in $((SECONDS - T0)) s"
exit $rc
