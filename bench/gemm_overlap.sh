#!/usr/bin/env bash
# GEMM + communication overlap on one node of GPUs (default 4 x H200): the zoo's GEMM-overlap test bodies
# first (correctness on GPUs), then ditron's AG-GEMM / GEMM-RS / GEMM-AR against cuBLAS+NCCL (sequential),
# torch's fused symmetric-memory ops, the GEMM alone and the collective alone, at the paper's shapes for TP=4
# (ditron/bench/gemm.py), then the GEMM core against cuBLAS (and, with STEPS=sweep, a sweep of GemmConfig).
# Results under bench/results/ (Markdown, JSON, PNG): <tag>-ag_gemm-bf16.*, <tag>-gemm_rs-bf16.*,
# <tag>-gemm_ar-bf16.*, <tag>-gemm-bf16.*, <tag>-gemm-sweep-bf16.*.  Every step has a timeout.
#
#   bench/gemm_overlap.sh                          # tests, ag, rs, ar, gemm
#   STEPS="ag rs" bench/gemm_overlap.sh            # some steps only (tests ag rs ar gemm sweep)
#   SHAPES=paper:LLaMA3-7B STEPS=ag bench/gemm_overlap.sh
#   GRAPH= bench/gemm_overlap.sh                   # eager timing instead of CUDA-graph replays
set -o pipefail
cd "$(dirname "$0")/.."
# ditron is not installed on the GPU machines: an editable install maps ditron.kernels to kernels/
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "== cannot install ditron"; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the largest paper shape's contexts, per rank (TP=4, bf16, both methods of a run alive at once):
# ag_gemm LLaMA3.1-405B ce + sm 0.75 GiB, gemm_rs scatter + pull 1 GiB, gemm_ar ~1.5 GiB
export DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-4G}
NPROC=${NPROC:-4}
MACHINE=${MACHINE:-nvidia-h200-x4}
TAG=${TAG:-h200x4}
SHAPES=${SHAPES:-paper}
GRAPH=${GRAPH---graph}
STEPS=${STEPS:-"tests ag rs ar gemm"}
TR="torchrun --standalone --nproc-per-node $NPROC"
TR1="torchrun --standalone --nproc-per-node 1"
# three timing rounds: at the largest shapes single rounds varied by up to 10% in a trial run
COMMON=(--dtype bf16 --repeat ${REPEAT:-3} --machine "$MACHINE" --tag "$TAG" $GRAPH)
status=0
step() {
  local t=$1; shift
  echo "== $*"
  timeout -k 10 "$t" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $*"; status=1; fi
}
has() { [[ " $STEPS " == *" $1 "* ]]; }
if has tests; then
  tests=$(ls tests/test_ag_gemm.py tests/test_gemm_rs.py tests/test_gemm_ar.py tests/test_gemm_paper_shapes.py 2>/dev/null)
  DITRON_TEST_BACKEND=p2p step ${TEST_TIMEOUT:-300} $TR -m pytest -q -x -p no:cacheprovider $tests
fi
if has ag; then
  step ${BENCH_TIMEOUT:-480} $TR -m ditron.bench ag_gemm --shapes "$SHAPES" --methods ${AG_METHODS:-ce,sm,sm_overlap} \
      "${COMMON[@]}"
fi
if has rs; then
  step ${BENCH_TIMEOUT:-480} $TR -m ditron.bench gemm_rs --shapes "$SHAPES" --methods ${RS_METHODS:-ce,scatter,pull} \
      "${COMMON[@]}"
fi
if has ar; then
  step ${BENCH_TIMEOUT:-480} $TR -m ditron.bench gemm_ar --shapes "$SHAPES" \
      --methods ${AR_METHODS:-auto,one_shot,two_shot,rs_ag} "${COMMON[@]}"
fi
# the GEMM core alone on one GPU, at the per-rank GEMM shapes of the three workloads for TP=$NPROC
if has gemm; then
  DITRON_HEAP_SIZE=64M step ${GEMM_TIMEOUT:-300} $TR1 -m ditron.bench gemm --shapes "$SHAPES" --tp "$NPROC" \
      --configs default --dtype bf16 --machine "$MACHINE" --tag "$TAG" $GRAPH
fi
if has sweep; then   # 32 configs x 10 shapes: fewer iterations, one round
  DITRON_HEAP_SIZE=64M step ${SWEEP_TIMEOUT:-570} $TR1 -m ditron.bench gemm --shapes "$SHAPES" --tp "$NPROC" \
      --configs sweep --warmup 3 --iters 10 --repeat 1 --dtype bf16 --machine "$MACHINE" --tag "$TAG"
fi
echo "== bench/gemm_overlap.sh: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
