#!/usr/bin/env bash
# Collectives on one node of GPUs (default 4): the zoo's shared test bodies first (correctness on GPUs),
# then the sweeps of ditron vs NCCL vs torch symmetric-memory ops (ditron.bench), results under
# bench/results/ (Markdown, JSON, PNG).  Every step has a timeout.
#
#   bench/collectives.sh                   # tests + all sweeps
#   STEPS=bench bench/collectives.sh       # sweeps only
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-3G}
NPROC=${NPROC:-4}
MACHINE=${MACHINE:-nvidia-h200-x4}
STEPS=${STEPS:-"tests bench"}
TR="torchrun --standalone --nproc-per-node $NPROC"
status=0
step() {
  local t=$1; shift
  echo "== $*"
  timeout -k 10 "$t" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $*"; status=1; fi
}
if [[ " $STEPS " == *" tests "* ]]; then
  DITRON_TEST_BACKEND=p2p step ${TEST_TIMEOUT:-240} $TR -m pytest -q -x -p no:cacheprovider tests/test_zoo_all_reduce.py \
      tests/test_zoo_ag_rs_a2a.py
fi
if [[ " $STEPS " == *" bench "* ]]; then
  step ${BENCH_TIMEOUT:-200} $TR -m ditron.bench all_reduce --sizes ${AR_SIZES:-8K,32K,64K,256K,1M,4M,16M,64M,256M} --dtype bf16 \
      --methods auto,ll,one_shot,two_shot --graph --machine "$MACHINE" --tag h200x4
  step ${BENCH_TIMEOUT:-120} $TR -m ditron.bench all_gather --sizes ${AG_SIZES:-64K,1M,16M,64M,256M} --dtype bf16 --methods auto,push,pull \
      --peers nccl --graph --machine "$MACHINE" --tag h200x4
  step ${BENCH_TIMEOUT:-120} $TR -m ditron.bench reduce_scatter --sizes ${RS_SIZES:-64K,1M,16M,64M,256M} --dtype bf16 \
      --methods auto,mesh,ring --peers nccl --graph --machine "$MACHINE" --tag h200x4
fi
echo "== bench/collectives.sh: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
