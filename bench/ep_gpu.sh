#!/usr/bin/env bash
# EP dispatch / combine and AG-MoE's grouped GEMM on one GPU (issue 27; one command for the lead's run):
#   1. the EP test bodies of tests/test_ep.py on a one-rank GPU world (p2p), CUDA-graph replay included;
#   2. `ditron bench ep --tokens 128,4096 --graph --trace`: ditron normal and low-latency vs a2a_single, with
#      `device_copy` (a device copy of the same dispatch + combine bytes) in the same run, and the per-phase
#      account (host work, kernel phases from %globaltimer stamps) in <tag>-ep-trace-bf16.md;
#   3. (STEPS=probe-ll, not in the default) bench/ep_ll_probe.py: LL dispatch + combine at 128 tokens under a few
#      tile configurations, each timed (graph replay, dispatch and combine alone, profiler kernel times) next to a
#      device copy of the same bytes, in ep-ll-probe.md;
#   4. `ditron bench grouped_gemm --tp 2 --graph`: the grouped GEMM with gathered A rows (ditron_gather) vs
#      torch._grouped_mm on the pre-gathered rows, at the 4 moe_h800 per-rank shapes.
# Logs, Markdown and JSON go to $OUT (default bench/results).  About 3-4 minutes on one H100; every step has a
# timeout and the last line says which steps failed.
#
#   OUT=/some/dir bash bench/ep_gpu.sh
#   STEPS=tests,bench-ep OUT=/some/dir bash bench/ep_gpu.sh      # EP only (about 4 minutes at most)
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-8G}
OUT=${OUT:-bench/results}
MACHINE=${DITRON_MACHINE:-nvidia-h100-x1}
TAG=${TAG:-h100-w1}
mkdir -p "$OUT"
TR="torchrun --standalone --nproc-per-node 1"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$OUT/ep-gpu-info.log"
git log -1 --format='commit %H %s' 2>/dev/null | tee -a "$OUT/ep-gpu-info.log"
failed=""
# STEPS: the steps to run, comma-separated (default all: tests,bench-ep,bench-grouped-gemm)
STEPS=${STEPS:-tests,bench-ep,bench-grouped-gemm}
step() {
  local name=$1 t=$2; shift 2
  case ",$STEPS," in *",$name,"*) ;; *) echo "== skipped: $name (STEPS=$STEPS)"; return 0 ;; esac
  echo "== $name: $*"
  timeout -k 10 "$t" "$@" 2>&1 | tee "$OUT/ep-$name.log"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "== FAILED (exit $rc): $name"; failed="$failed $name"; else echo "== PASSED: $name"; fi
}
step tests 170 env DITRON_TEST_BACKEND=p2p DITRON_TEST_GPU_ONLY=1 $TR -m pytest -q -p no:cacheprovider tests/test_ep.py
step bench-ep 150 $TR -m ditron.bench ep --tokens 128,4096 --graph --trace --repeat 2 --machine "$MACHINE" --tag "$TAG" --out "$OUT"
step probe-ll 300 $TR bench/ep_ll_probe.py --tokens 128 --out "$OUT/ep-ll-probe.md"
step bench-grouped-gemm 120 $TR -m ditron.bench grouped_gemm --tp 2 --graph --repeat 2 --machine "$MACHINE" --tag "$TAG" --out "$OUT"
if [ -z "$failed" ]; then echo "== ep_gpu: all steps passed"; else echo "== ep_gpu: FAILED steps:$failed"; exit 1; fi
