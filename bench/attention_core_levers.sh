#!/usr/bin/env bash
# Issue 52 item 3's attention-core levers on ONE GPU, in about 4 minutes (bench/attention_core_levers.py says
# what runs): ring attention's forward core at world size 1 (32/8 heads, d 128, bf16, 8192 / 16384 / 32768
# keys, causal and not) as shipped and the lever kernel's variants (Q / O through TMA, lazy rescaling, 128x128
# and 256x64 tiles on two warpgroups, stages, heads-first causal order), each checked against fp32 SDPA at an
# odd shape and against SDPA cuDNN at every timed shape, then timed beside SDPA cuDNN and flash in the same
# process (CUDA-graph replays).  Output: stdout (the summary last), $OUT/attention_core_levers.{log,json}.
#
#   bash bench/attention_core_levers.sh
#   CANDIDATES="ditron default,lv 128x64 w4 s2 io=tma lazy" SEQ=8192 bash bench/attention_core_levers.sh
#   CANDIDATES="ditron default,lv 128x64 w4 s2 io=tma,gluon" bash bench/attention_core_levers.sh   # + the Gluon core
#   (group "gluon": kernels/attention_hopper.py's configs; DTYPE=fp16, HEAD_DIM=64 for the other cases it takes)
#   TWIN=1: then tests/gpu/attention_hopper_twin.py (the Gluon core vs its tl twin, bit for bit)
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
source bench/ensure_ditron.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true
T0=$SECONDS
timeout -k 5 "${ATTN_TIMEOUT:-270}" python3 bench/attention_core_levers.py --candidates "${CANDIDATES:-default}" \
  --seq "${SEQ:-8192,16384,32768}" --dtype "${DTYPE:-bf16}" --head-dim "${HEAD_DIM:-128}" --json "$OUT/attention_core_levers.json" 2>&1 \
  | tee "$OUT/attention_core_levers.log"
rc=${PIPESTATUS[0]}
if [ "${TWIN:-0}" = 1 ]; then
  # issue 52 item 4: the Gluon core against its tl twin (attention_hopper.twin_config) on the same inputs, bit for
  # bit (tests/gpu/attention_hopper_twin.py: each differing pair's count of entries and largest difference)
  timeout -k 5 "${TWIN_TIMEOUT:-240}" python3 tests/gpu/attention_hopper_twin.py > "$OUT/attention_hopper_twin.log" 2>&1
  echo "== twin test: exit $? ($(tail -n 1 "$OUT/attention_hopper_twin.log"))"; grep -E "^(FAIL|DIFF)" "$OUT/attention_hopper_twin.log" | head -8
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true
echo "== attention_core_levers: exit $rc in $((SECONDS - T0)) s"
exit $rc
