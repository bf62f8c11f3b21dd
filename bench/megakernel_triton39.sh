#!/usr/bin/env bash
# The decoder megakernel under the Triton the GPU machines run (3.6, the one ditron's defaults were tuned with)
# and under the Triton that `pip install` gives a README user (3.9), side by side in one call on one GPU.
#
#   T39=/path/to/site OUT=$OUT bash bench/megakernel_triton39.sh nvidia-h200
#
# T39: a directory holding Triton 3.9's `triton` package and its dist-info (put first on PYTHONPATH for the 3.9
# runs).  On a device machine without network, carry it in parts (a Triton wheel is larger than one call may
# carry): here, the wheel for the machine's Python unpacked without what an NVIDIA run never loads (the AMD
# codegen library, CUPTI, proton, test plugins), tarred and split with `xz | split -b 38M`; on the machine,
# `cat parts | xz -d | tar x -C $T39`.
#
# Each Triton runs bench/megakernel_levers.sh with LEVERS (LEVERS36 / LEVERS39): by default b128 (today's defaults at
# batch 1, 2 and 8, contexts 512 and 4096; each case checked against torch, torch + CUDA graph and the HBM limit
# measured in its process) and b128r72 (the 72 KiB ring at every batch, the default before 2026-11-28: Triton 3.9
# lays it out in 110592 B at batches 2-8, so 2 programs fit per SM).  SKIP_CHECK= (empty) runs
# tests/gpu/decoder_8b.py first under each Triton.  Output: $OUT/t36/ and $OUT/t39/ (levers.log, levers.md,
# levers.json, logs.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
MACHINE=${1:-nvidia-h200}
: "${T39:?T39=the directory holding Triton 3.9}"
OUTBASE=${OUT:-bench/results/triton39}
echo "== Triton $(python -c 'import triton; print(triton.__version__)') (the machine's)"
SKIP_CHECK=${SKIP_CHECK-1} LEVERS="${LEVERS36:-b128|b128r72}" OUT="$OUTBASE/t36" \
  bash bench/megakernel_levers.sh "$MACHINE" | grep -E "^ +[a-z]|exit|summary|PASS|FAIL"
echo "== Triton $(PYTHONPATH=$T39 python -c 'import triton; print(triton.__version__)') ($T39)"
PYTHONPATH=$T39 SKIP_CHECK=${SKIP_CHECK-1} LEVERS="${LEVERS39:-b128|b128r72}" OUT="$OUTBASE/t39" \
  bash bench/megakernel_levers.sh "$MACHINE" | grep -E "^ +[a-z]|exit|summary|PASS|FAIL"
