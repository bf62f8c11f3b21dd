#!/usr/bin/env bash
# One GPU call (~500 s) for issue 53's H200 row (any kind works: the inlined baseline runs in the same call):
# the whole Qwen3-8B step at batch 1 and 16 with the default (noinline) and --inline-branches, then the decoder
# alone at batch 1, 8, 16 (default), then tokens/s against transformers at batch 1 and 16.  OUT=dir bash bench/calls/megakernel_h200.sh
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
mk() { local tag=$1 t=$2; shift 2
  timeout $t torchrun --standalone --nproc-per-node 1 -m ditron.bench megakernel "$@" --machine "$KIND" --out $OUT/$tag \
    > $OUT/$tag.log 2>&1; echo "== $tag rc=$? at $(el) s"; grep -E "^\| *512|spilled" $OUT/$tag.log | head -8 | cut -c1-220; }
mk model 110 --model qwen3-8b --ctx 512,4096 --batch 1,16 --hf-batch=
mk model_inl 110 --model qwen3-8b --ctx 512 --batch 1,16 --hf-batch= --inline-branches
mk dec 90 --config 8b --ctx 512 --batch 1,8,16 --skip-eager
# tokens/s against transformers (static cache, torch.compile reduce-overhead): one process per batch size
EQ=0 BATCHES="1 16" MODELS=qwen3-8b timeout 200 bash tests/gpu/hf_megakernel.sh > $OUT/hf_bench.log 2>&1
echo "== hf bench rc=$? at $(el) s"; grep -E "^\| *512|tok/s" $OUT/hf_bench.log | head -8 | cut -c1-240
echo "== total $(el) s"
