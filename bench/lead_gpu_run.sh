#!/usr/bin/env bash
# The lead's one-GPU measurement call (device tool): each step bounded, logs under $OUT, a summary last.
#
#   STEPS="mk attn ep gemm_rs_shared" bash bench/lead_gpu_run.sh
#
# Steps (in the order given):
#   mk              `ditron bench megakernel` default sweep (batch 1,2,4,8,16 x ctx 512,4096; torch + CUDA graph,
#                   HBM limit in the same run)
#   attn            ring_attn (all configs, causal and not) vs SDPA cuDNN/flash, flash_decode vs copy bandwidth,
#                   ulysses (world size 1)
#   ep              `ditron bench ep` (128 and 4096 tokens, graph replay, --trace) and `grouped_gemm` at TP=2
#   gemm_rs_shared  tests/test_gemm_rs.py with 2 ranks sharing the GPU under MPS, waits bounded (hang reports)
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-bench/results/lead}
MACHINE=${DITRON_MACHINE:-device}
# the device tool brings back at most 8 files: results and logs are written to $RES and packed into
# $OUT/results.tgz at the end; the Markdown tables are also copied to $OUT
RES=${RES:-/tmp/lead-results}
rm -rf "$RES"; mkdir -p "$RES" "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install -e . failed"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
TR="torchrun --standalone --nproc-per-node 1"
SUMMARY=()
step() {
  local name=$1 t=$2; shift 2
  echo "== $name ($t s): $*"
  local t0=$SECONDS
  timeout -k 10 "$t" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$RES/$name.log"
  SUMMARY+=("$name: exit $rc in $((SECONDS - t0)) s")
}
for s in ${STEPS:-mk attn ep}; do
  case $s in
    mk) step mk "${MK_T:-240}" $TR -m ditron.bench megakernel --skip-eager --machine "$MACHINE" --tag "$MACHINE" --out "$RES" ${MK_FLAGS:-} ;;
    attn)
      step ring_attn "${RING_T:-150}" $TR -m ditron.bench ring_attn --seq 8192,16384,32768 --configs all --machine "$MACHINE" --out "$RES"
      step flash_decode 60 $TR -m ditron.bench flash_decode --ctx 32768,65536 --batch 1,16,64 --block-n 0,128 --machine "$MACHINE" --out "$RES"
      step ulysses 45 $TR -m ditron.bench ulysses --seq 8192 --hidden 4096 --machine "$MACHINE" --out "$RES" ;;
    ep)
      # dispatch + combine at 4096 tokens need more than the 1 GiB default heap
      DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-4G} step ep 90 $TR -m ditron.bench ep --tokens 128,4096 --graph --machine "$MACHINE" --out "$RES" ${EP_FLAGS:-}
      step grouped_gemm 90 $TR -m ditron.bench grouped_gemm --tp 2 --graph --machine "$MACHINE" --out "$RES" ;;
    gemm_rs_shared)
      nvidia-cuda-mps-control -d && sleep 1
      DITRON_RANKS_PER_GPU=2 DITRON_TEST_BACKEND=p2p DITRON_TEST_GPU_ONLY=1 DITRON_WAIT_TIMEOUT_S=${WAIT_T:-20} \
        step gemm_rs_shared "${RS_T:-120}" torchrun --standalone --nproc-per-node 2 -m pytest -q -x -p no:cacheprovider tests/test_gemm_rs.py -v
      echo quit | nvidia-cuda-mps-control ;;
    *) echo "unknown step $s" ;;
  esac
done
tar czf "$OUT/results.tgz" -C "$RES" . && cat "$RES"/*.md > "$OUT/tables.md" 2>/dev/null
echo "== summary"; for l in "${SUMMARY[@]}"; do echo "   $l"; done
