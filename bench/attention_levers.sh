#!/usr/bin/env bash
# Issue 28's performance levers on one GPU, in under 6 minutes: the attention zoo's test bodies on this GPU
# (correctness first), then side by side with torch SDPA (cuDNN and flash backends) in the same run:
#   * ring attention forward at sequence 8192 and 16384, causal and not: the default for the length
#     (kernels/attention.RING_TABLE: 128 x 64 tiles on one warpgroup; 64 x 64 causal up to 16384), the other GPU
#     default, and kernels/attention.LEVER_CONFIGS (128 x 64 at maxnreg 128; the persistent grid); every
#     config is first checked against fp32 SDPA at shapes that are not tile multiples;
#   * flash-decode at context 32768 / 65536, batch 1 and 16: the new parallel combine with the default split
#     count (one wave of split programs for few items) and with 1 / 33 / 66 splits (66: the old batch-1
#     default), each at the default 128-key tiles and at 64.
# Results (Markdown + JSON + logs) go to $OUT (default bench/results).
#
#   bash bench/attention_levers.sh
#
# Every step has a timeout; the last line says which steps failed.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results}
MACHINE=${DITRON_MACHINE:-nvidia-h100-x1}
mkdir -p "$OUT"
TR="torchrun --standalone --nproc-per-node 1"
failed=""
step() {
  local name=$1 t=$2; shift 2
  echo "== $name: $*"
  local t0=$SECONDS
  timeout -k 10 "$t" "$@" > "$OUT/levers-$name.log" 2>&1
  local rc=$?
  tail -n 60 "$OUT/levers-$name.log"
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  if [ $rc -ne 0 ]; then failed="$failed $name"; fi
}
step tests 80 env DITRON_TEST_BACKEND=p2p $TR -m pytest -q -p no:cacheprovider -x -k "not compiles" tests/test_zoo_attention.py
step ring_attn 190 $TR -m ditron.bench ring_attn --seq 8192,16384 --configs levers --machine "$MACHINE" --tag levers --out "$OUT"
step flash_decode 90 $TR -m ditron.bench flash_decode --ctx 32768,65536 --batch 1,16 --splits 0,1,33,66 --block-n 0,64 --machine "$MACHINE" --tag levers --out "$OUT"
if [ -z "$failed" ]; then echo "== attention_levers: all steps passed"; else echo "== attention_levers: FAILED steps:$failed"; exit 1; fi
