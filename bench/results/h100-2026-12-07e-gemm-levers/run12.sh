#!/usr/bin/env bash
# next session, call A (issue 52): GEMM levers round 2 (TP=2,8 bf16; writes the per-GPU table) + attention incl. the
# Gluon FA3-style core (unverified on GPU before this call)
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
OUT=$OUT/attn CANDIDATES="ditron default,lv 128x64 w4 s2 io=tma,gluon" ATTN_TIMEOUT=${ATTN_T:-230} \
  bash bench/attention_core_levers.sh > $OUT/attn_run.log 2>&1; echo "attn rc=$?"
grep -E "PASS|FAIL|checking|HUNG|geo|best per|seq .* causal" $OUT/attn_run.log | tail -30
echo "== attn took $(( $(date +%s) - start )) s"
left=$(( 575 - ($(date +%s) - start) ))
OUT=$OUT/gemm TP=2,8 CHECK_TIMEOUT=120 timeout -k 5 $left bash bench/gemm_core_levers.sh > $OUT/gemm_run.log 2>&1
echo "gemm rc=$?"
grep -E "^(==|PASS|FAIL)|geo|worst|per-shape" $OUT/gemm_run.log | tail -40
echo "== total $(( $(date +%s) - start )) s"
