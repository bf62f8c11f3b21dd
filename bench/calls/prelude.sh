# Sourced first by every bench/calls/*.sh (`source "$(dirname "$0")/prelude.sh"`): the repository root as the working
# directory, NVLink multicast off, KIND (the GPU's name, dashes for spaces), el (seconds since the call started),
# and this tree's ditron installed (bench/ensure_ditron.sh; its output in $OUT/ensure.log).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
source bench/ensure_ditron.sh > "$OUT/ensure.log" 2>&1
