#!/usr/bin/env bash
# next session, call D (issue 52 item 2): the Gluon MoE kernels (grouped GEMM, MoE-RS/AR) vs their tl twins bit for
# bit at 1 and 2 ranks, then the grouped GEMM bench (ditron_gluon vs tl vs torch)
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s)
NPROCS="1 2" BACKENDS=p2p STEP_FILTER=moe RUN_BUDGET_S=300 bash tests/gpu/run.sh > $OUT/moe_gpu.log 2>&1; echo "moe gpu rc=$?"
grep -E "^== (PASSED|FAILED)|unfinished|summary" $OUT/moe_gpu.log | tail -20
timeout $(( 570 - ($(date +%s) - start) )) torchrun --standalone --nproc-per-node 1 -m ditron.bench grouped_gemm \
  --shapes paper --tp 2 --machine "$KIND" --out $OUT > $OUT/grouped.log 2>&1; echo "grouped bench rc=$?"
tail -25 $OUT/grouped.log
echo "== total $(( $(date +%s) - start )) s"
