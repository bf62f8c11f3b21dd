#!/usr/bin/env bash
# fp8 GEMM-overlap ops (issue 55 item 4): ditron bench ag_gemm|gemm_rs|gemm_ar --dtype fp8 at the paper's shapes,
# one GPU per rank (timings), after a correctness-only run of 2 ranks sharing GPU 0 (DITRON_RANKS_PER_GPU=2,
# --check-only: the harness refuses to time ranks that share a GPU; the NCCL baseline is n/a there, as
# torch.distributed runs on gloo).  CHECK_1GPU=0 skips it; CHECK_ONLY=1 stops after it (a machine of one GPU).
#
#   bench/fp8_overlap_gpu.sh                       # on nvidia-h100-x2 (NPROC=2); NPROC=4/8 on larger machines
#   SHAPES=paper:LLaMA3-7B RECIPES=row bench/fp8_overlap_gpu.sh   # a quick one
#
# Per op, shape and recipe: every implementation checked against the float32 product of the dequantised
# operands (the op's collective semantics), then timed (CUDA-graph replays, 2 rounds): ditron's fp8 op (each
# method, incl. core=gluon), ditron's bf16 op of the same method, and the vendor baseline (all_gather of the fp8
# A rows and scales + torch._scaled_mm; torch._scaled_mm + reduce_scatter / all_reduce of the bf16 output).
# Results: bench/results/$TAG-{ag_gemm,gemm_rs,gemm_ar}-fp8.{md,json,png}.
set -o pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "== cannot install ditron"; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-4G}
NPROC=${NPROC:-2}
MACHINE=${MACHINE:-nvidia-h100-x$NPROC}
TAG=${TAG:-h100x$NPROC-$(date +%F)}
SHAPES=${SHAPES:-paper}
RECIPES=${RECIPES:-row,tensor,block}
status=0
step() {
  local t=$1; shift
  echo "== $*"
  timeout -k 10 "$t" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $*"; status=1; else echo "== PASSED: $*"; fi
}
declare -A METHODS=([ag_gemm]="ce,ce:core=gluon" [gemm_rs]="ce,ce:core=gluon" [gemm_ar]="auto,rs_ag,rs_ag:core=gluon")
if [ "${CHECK_1GPU:-1}" = 1 ]; then       # correctness only: 2 ranks on GPU 0, one small paper shape
  for op in ag_gemm gemm_rs gemm_ar; do
    CUDA_VISIBLE_DEVICES=0 DITRON_RANKS_PER_GPU=2 step 300 torchrun --standalone --nproc-per-node 2 \
      -m ditron.bench $op --dtype fp8 --recipe "$RECIPES" --shapes paper:LLaMA3-7B --methods "${METHODS[$op]}" \
      --check-only --machine "$MACHINE (2 ranks on 1 GPU)" --tag "$TAG-shared"
  done
fi
[ "${CHECK_ONLY:-0}" = 1 ] && { echo "== bench/fp8_overlap_gpu.sh: checks $([ $status -eq 0 ] && echo passed || echo FAILED)"; exit $status; }
for op in ag_gemm gemm_rs gemm_ar; do
  step 580 torchrun --standalone --nproc-per-node "$NPROC" -m ditron.bench $op --dtype fp8 --recipe "$RECIPES" \
    --shapes "$SHAPES" --methods "${METHODS[$op]}" --graph --repeat 2 --machine "$MACHINE" --tag "$TAG"
done
echo "== bench/fp8_overlap_gpu.sh: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
