#!/usr/bin/env bash
# Issue 55's fp8 GEMM-core levers on ONE GPU (bench/fp8_levers.py says what and why), about 3-4 minutes:
#   per recipe (rowwise, blockwise) and TP=8 paper shape: every candidate checked against the float64 product of
#   the dequantised operands, then timed with torch._scaled_mm (rowwise; use_fast_accum=True for the "fast"
#   rows), torch's blockwise scaled mm (or why this torch has none) and ditron's bf16 core, same process,
#   CUDA-graph replays. The summary (last) gives per candidate the geomean ratio to the vendor and to bf16.
# Output: stdout and $OUT/fp8_levers.{log,json} ($OUT default bench/results).
#
#   bash bench/fp8_levers.sh
#   RECIPES=block CANDIDATES="core default,lever block 128x128 s4" bash bench/fp8_levers.sh
#   python bench/fp8_levers.py --compile       # CPU: registers / spills / wgmma of every candidate (sm_90a)
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
source bench/ensure_ditron.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true
T0=$SECONDS
timeout -k 5 "${LEVERS_TIMEOUT:-330}" python3 bench/fp8_levers.py --json "$OUT/fp8_levers.json" 2>&1 | tee "$OUT/fp8_levers.log"
rc=${PIPESTATUS[0]}
echo "== fp8_levers: exit $rc in $((SECONDS - T0)) s"
exit $rc
