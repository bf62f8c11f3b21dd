#!/usr/bin/env bash
# Decoder megakernel on one GPU: correctness, then the step time of several tile / prefetch configurations
# side by side with torch (eager and CUDA graph) and the HBM limit, each with a traced build's time per task kind.
#
#   bench/megakernel_sweep.sh [MACHINE] [CTX]          # e.g. bench/megakernel_sweep.sh nvidia-h200 512
#   CONFIGS="base:--gemv-block-n 16|pf:--gemv-block-n 16 --prefetch-k 2048" bench/megakernel_sweep.sh
#
# Writes bench/results/<tag>-megakernel.{md,json} per configuration (tag = MACHINE-sweep-NAME) and, when $OUT is
# set (the device tool), copies the Markdown there.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-4G}
MACHINE=${1:-nvidia-h200}
CTX=${2:-512}
NPROC=${NPROC:-1}
TR="torchrun --standalone --nproc-per-node $NPROC"
CONFIGS=${CONFIGS:-"tuned:--gemv-block-n 16 --gemv-block-k 2048|pf2k:--gemv-block-n 16 --gemv-block-k 2048 --prefetch-k 2048|pf4k:--gemv-block-n 16 --gemv-block-k 2048 --prefetch-k 4096|k1k-pf2k:--gemv-block-n 16 --gemv-block-k 1024 --prefetch-k 2048"}
status=0
if [ -z "$SKIP_CHECK" ]; then
  echo "== correctness: tests/gpu/decoder_8b.py"
  timeout -k 10 300 $TR tests/gpu/decoder_8b.py --backend p2p $CHECK_FLAGS || status=1
fi
IFS='|' read -ra cfgs <<< "$CONFIGS"
for c in "${cfgs[@]}"; do
  name=${c%%:*}; flags=${c#*:}
  echo "== $name: $flags"
  timeout -k 10 300 $TR -m ditron.bench megakernel --ctx "$CTX" --batch 1 --warmup 3 --iters 20 --repeat 1 --trace $flags \
      --machine "$MACHINE" --tag "$MACHINE-sweep-$name" --out bench/results || status=1
  [ -n "$OUT" ] && cp "bench/results/$MACHINE-sweep-$name-megakernel.md" "$OUT/" 2>/dev/null
done
exit $status
