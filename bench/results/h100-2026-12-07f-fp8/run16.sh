#!/usr/bin/env bash
# call A (<= 580 s): attention default twin check (52); fp8 Gluon blockwise (scales' product first) and rowwise /
# per-tensor overlapped-promotion benches (55); ring_attn bench (52); fp8 GPU tests; EP fp8 codes diagnosis.
# Each step runs only if its timeout fits in what is left.
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
fits() { [ $(( 580 - $(el) )) -gt "$1" ] || { echo "== skipped (needs $1 s, at $(el) s): $2"; return 1; }; }
source bench/ensure_ditron.sh > $OUT/ensure.log 2>&1
timeout 120 python3 tests/gpu/attention_hopper_twin.py --configs default --bound > $OUT/twin.log 2>&1; echo "twin rc=$?"
grep -E "^(DIFF|FAIL|PASS|OK)|attention_hopper_twin|differ" $OUT/twin.log | cut -c1-260 | tail -20
echo "== at $(el) s"
fits 100 fp8block && { OUT=$OUT/fp8b RECIPES=block ROUNDS=1 FP8_GLUON_TIMEOUT=100 bash bench/fp8_gluon.sh > $OUT/fp8g_block.log 2>&1
  echo "fp8 block rc=$?"; grep -E "^\||geomean|FAIL|exit|correctness" $OUT/fp8g_block.log | cut -c1-240 | tail -24; }
echo "== at $(el) s"
fits 130 fp8row && { OUT=$OUT/fp8r RECIPES=row,tensor ROUNDS=1 FP8_GLUON_TIMEOUT=130 \
  CONFIGS="coop 128x128x128 s6,coop 128x128x128 s6 ovl,coop 128x128x128 s4,coop 128x128x128 s4 ovl" \
  bash bench/fp8_gluon.sh > $OUT/fp8g_row.log 2>&1
  echo "fp8 row/tensor rc=$?"; grep -E "^\||geomean|FAIL|exit|correctness|ovl vs" $OUT/fp8g_row.log | cut -c1-240 | tail -50; }
echo "== at $(el) s"
fits 110 ring && { timeout 110 torchrun --standalone --nproc-per-node 1 -m ditron.bench ring_attn --seq 8192,16384,32768 --causal both \
  --machine "$KIND" --out $OUT/ring > $OUT/ring.log 2>&1; echo "ring_attn rc=$?"; tail -14 $OUT/ring.log; }
echo "== at $(el) s"
fits 40 epdiag && { timeout 40 torchrun --standalone --nproc-per-node 1 bench/diag/ep_fp8_codes.py 7168 8 > $OUT/ep_fp8_codes.log 2>&1
  echo "ep fp8 codes rc=$?"; grep -vE "^(W1207|\*\*\*)" $OUT/ep_fp8_codes.log | tail -20; }
fits 90 fp8t1 && { DITRON_TEST_BACKEND=p2p timeout 90 torchrun --standalone --nproc-per-node 1 tests/gpu/pytest_files.py tests/test_fp8.py \
  > $OUT/fp8t1.log 2>&1; echo "fp8 tests 1 rank rc=$?"; grep -E "^== |passed|failed" $OUT/fp8t1.log | cut -c1-600 | head -12; }
fits 90 fp8t2 && { DITRON_RANKS_PER_GPU=2 DITRON_TEST_BACKEND=p2p timeout 90 torchrun --standalone --nproc-per-node 2 tests/gpu/pytest_files.py \
  tests/test_fp8.py > $OUT/fp8t2.log 2>&1; echo "fp8 tests 2 ranks rc=$?"; grep -E "^== |passed|failed" $OUT/fp8t2.log | cut -c1-600 | head -12; }
echo "== total $(el) s"
