#!/usr/bin/env bash
# Issue 54's GPU training check, one command: 2 ranks sharing one GPU (DITRON_RANKS_PER_GPU=2), or one rank per
# GPU with NPROC=N on N GPUs.
#
#   tests/gpu/train.sh                       # 2 ranks on GPU 0 (MPS started when available, as tests/gpu/run.sh)
#   NPROC=2 RANKS_PER_GPU=1 tests/gpu/train.sh   # 2 GPUs
#   BENCH=0 tests/gpu/train.sh               # the checks only
#
# 1. correctness (pytest tests/test_train.py on the GPU world, DITRON_TEST_BACKEND=p2p): every torch.ops.ditron op's
#    gradients, the TP MLP's, the planted frozen-weights case, state dicts, torch.compile of forward + backward, the
#    TP + sequence-parallel transformer block's 20 AdamW steps against single-device fp32 torch, ExpertParallelMoE's
#    gradients (EP dispatch / combine, grouped GEMM) and its training curve -- the tests of the job's world size;
# 2. (BENCH=1, default) ditron bench train_tp: the TP MLP and block training step of ditron's layers against torch's
#    TP (functional collectives; compiled with ditron.async_tp and with torch's micro-pipeline TP) and single-GPU
#    torch, each with its loss curve checked against single-device fp32 first (results in bench/results/, or $OUT).
#    With ranks sharing a GPU torch.distributed runs gloo, on which torch's TP rows are reported as not run.
# Exit status: non-zero when a check fails.
set -o pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
NPROC=${NPROC:-2}
export DITRON_RANKS_PER_GPU=${RANKS_PER_GPU:-2}
source bench/ensure_ditron.sh
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
[ "$GPUS" -ge 1 ] || { echo "tests/gpu/train.sh: no CUDA GPU visible"; exit 2; }
MPS_STARTED=0
if [ "$DITRON_RANKS_PER_GPU" -gt 1 ] && [ "${MPS:-1}" != 0 ] && command -v nvidia-cuda-mps-control >/dev/null \
        && [ ! -e "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ]; then
    nvidia-cuda-mps-control -d && MPS_STARTED=1 && sleep 1 && echo "== MPS started"
fi
trap '[ "$MPS_STARTED" = 1 ] && echo quit | timeout 20 nvidia-cuda-mps-control' EXIT
status=0
echo "== training checks: $NPROC ranks, $DITRON_RANKS_PER_GPU per GPU"
DITRON_TEST_BACKEND=p2p DITRON_TEST_GPU_ONLY=1 timeout "${PYTEST_TIMEOUT:-600}" \
    torchrun --standalone --nproc-per-node "$NPROC" -m pytest -q --tb=short -p no:cacheprovider tests/test_train.py \
    || status=1
[ $status = 0 ] && echo "== PASSED: training checks" || echo "== FAILED: training checks"
if [ "${BENCH:-1}" = 1 ]; then
    echo "== ditron bench train_tp"
    timeout "${BENCH_TIMEOUT:-900}" torchrun --standalone --nproc-per-node "$NPROC" -m ditron.bench train_tp \
        --machine "${DITRON_MACHINE:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')}" \
        ${BENCH_ARGS:---tokens 4096 --hidden 4096 --ffn 14336 --heads 32} ${OUT:+--out "$OUT"} || status=1
fi
exit $status
