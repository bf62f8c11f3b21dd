#!/usr/bin/env bash
# EP at 2 ranks on one GPU (test_ep failed on rank 1 on an H100, 2026-12-07g): the small-case diagnosis, then test_ep.py
# alone with the harness that fails every rank on one rank's failure.  OUT=dir bash bench/diag/ep_w2.sh
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
DITRON_RANKS_PER_GPU=2 DITRON_WAIT_TIMEOUT_S=20 timeout 90 torchrun --standalone --nproc-per-node 2 bench/diag/ep_small_w2.py > $OUT/diag.log 2>&1
echo "diag rc=$? at $(el) s"; grep -E "^rank" $OUT/diag.log | cut -c1-400
DITRON_RANKS_PER_GPU=2 DITRON_TEST_BACKEND=p2p DITRON_TEST_GPU_ONLY=1 DITRON_WAIT_TIMEOUT_S=30 timeout 200 torchrun --standalone --nproc-per-node 2 \
  tests/gpu/pytest_files.py tests/test_ep.py > $OUT/test_ep.log 2>&1; echo "test_ep rc=$? at $(el) s"
grep -E "^== " $OUT/test_ep.log | cut -c1-500 | head -30
