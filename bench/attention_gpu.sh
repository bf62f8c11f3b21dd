#!/usr/bin/env bash
# The attention zoo on GPUs (one command for the lead's run): the test bodies of
# tests/test_zoo_attention.py on this GPU world, then `ditron bench ring_attn`
# (every config of kernels/attention.TUNE_CONFIGS, causal and not), `flash_decode`
# and `ulysses`, each with the torch baselines in the same run.  Results (Markdown +
# JSON + logs) go to $OUT (default bench/results).
#
#   bash bench/attention_gpu.sh                  # 1 GPU
#   NPROC=2 bash bench/attention_gpu.sh          # 2 ranks (sequence / KV cache split over them)
#
# Every step has a timeout; the last line says which steps failed.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
NPROC=${NPROC:-1}
OUT=${OUT:-bench/results}
MACHINE=${DITRON_MACHINE:-nvidia-h100-x$NPROC}
mkdir -p "$OUT"
TR="torchrun --standalone --nproc-per-node $NPROC"
failed=""
step() {
  local name=$1 t=$2; shift 2
  echo "== $name: $*"
  timeout -k 10 "$t" "$@" 2>&1 | tee "$OUT/attention-$name.log"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $name"; failed="$failed $name"; fi
}
step tests 120 env DITRON_TEST_BACKEND=p2p $TR -m pytest -q -p no:cacheprovider -x -k "not compiles" tests/test_zoo_attention.py
step ring_attn 150 $TR -m ditron.bench ring_attn --seq 8192,16384,32768 --configs all --machine "$MACHINE" --out "$OUT"
step flash_decode 60 $TR -m ditron.bench flash_decode --ctx 32768,65536 --batch 1,16,64 --block-n 0,64 --machine "$MACHINE" --out "$OUT"
step ulysses 45 $TR -m ditron.bench ulysses --seq 8192 --hidden 4096 --machine "$MACHINE" --out "$OUT"
if [ -z "$failed" ]; then echo "== attention_gpu: all steps passed"; else echo "== attention_gpu: FAILED steps:$failed"; exit 1; fi
