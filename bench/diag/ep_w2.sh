#!/usr/bin/env bash
# EP at 2 ranks on one GPU (test_ep failed on rank 1 on an H100 under tests/gpu/run.sh -- which runs MPS -- on
# 2026-12-07g): the small-case diagnosis and test_ep.py alone (the harness fails every rank on one rank's failure),
# time-sliced first, then under MPS (as tests/gpu/run.sh runs them): a difference points at the two ranks'
# persistent grids sharing the SMs.  OUT=dir bash bench/diag/ep_w2.sh
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
both() {  # tag
  DITRON_RANKS_PER_GPU=2 DITRON_WAIT_TIMEOUT_S=20 timeout 90 torchrun --standalone --nproc-per-node 2 \
    bench/diag/ep_small_w2.py > $OUT/diag_$1.log 2>&1
  echo "== diag ($1) rc=$? at $(el) s"; grep -E "^rank" $OUT/diag_$1.log | cut -c1-400
  DITRON_RANKS_PER_GPU=2 DITRON_TEST_BACKEND=p2p DITRON_TEST_GPU_ONLY=1 DITRON_WAIT_TIMEOUT_S=30 timeout 150 \
    torchrun --standalone --nproc-per-node 2 tests/gpu/pytest_files.py tests/test_ep.py > $OUT/test_ep_$1.log 2>&1
  echo "== test_ep ($1) rc=$? at $(el) s"; grep -E "^== " $OUT/test_ep_$1.log | cut -c1-500 | head -20
}
both timesliced
if command -v nvidia-cuda-mps-control >/dev/null && [ ! -e "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ]; then
  nvidia-cuda-mps-control -d && sleep 1 && echo "== MPS started"
  both mps
  echo quit | timeout 20 nvidia-cuda-mps-control
else
  echo "== MPS: not available or already running (not run)"
fi
echo "== ep_w2 total $(el) s"
