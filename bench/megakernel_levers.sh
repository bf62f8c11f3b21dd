#!/usr/bin/env bash
# Issue 26, batch 1 near the HBM limit: the decoder megakernel's levers side by side on one GPU, in one run.
#
#   bench/megakernel_levers.sh [MACHINE]                 # e.g. bench/megakernel_levers.sh nvidia-h100
#   LEVERS="base|stream" bench/megakernel_levers.sh      # a subset (names of the table below)
#
# 1. correctness once: tests/gpu/decoder_8b.py (default tiles, batch 1 and 8, ragged contexts);
# 2. each lever: `ditron bench megakernel --skip-eager` at batch 1 (ctx 512 and 4096) and batch 8, which checks
#    the lever's step against torch first (the "check" column) and times torch + CUDA graph, the megakernel and the
#    HBM limit in the same process (so every lever has its own baseline next to it);
# 3. the GEMV probe: the decoder's GEMV tiles alone (persistent grid), registers double-buffered vs cp.async stream.
#
# Levers (TileConfig options, all off by default; registers / spills / shared memory of each on the CPU:
# python bench/megakernel_regs.py):
#   base       today's defaults
#   stream     --gemv-stream --dot-stream: weights by cp.async into shared memory, 3 stages (batch 1: 162 registers,
#              no spills, 68 KiB shared, 3 programs per SM fit; default grid stays 2 per SM)
#   stream-p3  the same with 3 programs per SM (--programs 3 x SMs; batch 1 only)
#   stream4    4 stages (102 KiB shared: 2 per SM)
#   dot-mr168  batch 8: --dot-stream with ptxas capped at 168 registers (3 per SM; --programs 3 x SMs)
#   stream-split3  stream + the down projection split in 3 K slices (each slice waits only for the gate/up
#              tiles of its columns; a dsum task per all-reduce chunk adds them; batch 1)
#   stream-q8  stream with 8-column qkv tiles: 768 tiles on 2 x 132 programs (2.9 rounds) instead of 384 (1.45:
#              the second round of the qkv phase a third busy)
#   b8-nofuse  batch 8 with separate norm tasks: each fused-norm GEMV tile re-reads the float32 residual and delta
#              ([8, 4096] x 2 = 256 KiB per qkv tile against 128 KiB of weights); unfused it reads bf16 h (64 KiB)
# Each step has its own timeout; the whole script is sized for about 7 minutes on one H100.
# Writes at most 5 files to $OUT (the device tool brings back few): levers.log (summary, one line per case),
# levers.md (every lever's table, in order), levers.json (their rows), logs.txt (every step's full output),
# gemv_probe.txt.  Per-step files stay in bench/results/levers/.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" DITRON_HEAP_SIZE=${DITRON_HEAP_SIZE:-4G}
MACHINE=${1:-nvidia-h100}
OUTD=bench/results/levers
FINAL=${OUT:-$OUTD}
rm -rf "$OUTD"; mkdir -p "$OUTD" "$FINAL"
TR=${TR:-torchrun --standalone --nproc-per-node 1}
SMS=${SMS:-$(python -c "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)")}
EXTRA=${EXTRA:-}          # appended to every bench command (a CPU smoke run: see the end of this file)
P3=$((3 * SMS))
T1="--ctx 512,4096 --batch 1"
ALL=(                      # name|timeout s|cases|flags
  "base|90|--ctx 512,4096 --batch 1,8|"
  "stream|90|--ctx 512,4096 --batch 1,8|--gemv-stream --dot-stream"
  "stream-p3|60|$T1|--gemv-stream --programs $P3"
  "stream4|60|--ctx 512 --batch 1,8|--gemv-stream --dot-stream --stream-stages 4"
  "dot-mr168|50|--ctx 512 --batch 8|--dot-stream --max-regs 168 --programs $P3"
  "stream-split3|60|$T1|--gemv-stream --down-split-k 3"
  "b8-nofuse|50|--ctx 512 --batch 8|--no-fuse-norm"
  "stream-q8|50|--ctx 512 --batch 1|--gemv-stream --block-n qkv=8"
)
LEVERS=${LEVERS:-base|stream|stream-p3|stream4|dot-mr168|stream-split3|b8-nofuse|stream-q8}
status=0
log() { echo "$*" | tee -a "$OUTD/levers.log"; }
log "== megakernel levers on $MACHINE ($SMS SMs), tree $(git rev-parse --short HEAD 2>/dev/null), $(date -u)"
if [ -z "$SKIP_CHECK" ]; then
  log "== correctness: tests/gpu/decoder_8b.py --batch 1,8 --ragged"
  timeout -k 10 120 $TR tests/gpu/decoder_8b.py --backend p2p --batch 1,8 --ragged --steps 2 --out "$OUTD/decoder_8b.txt" \
    > "$OUTD/decoder_8b.log" 2>&1
  rc=$?; log "   decoder_8b exit $rc"; tail -5 "$OUTD/decoder_8b.log"; [ $rc = 0 ] || status=1
fi
for entry in "${ALL[@]}"; do
  IFS='|' read -r name tmo cases flags <<< "$entry"
  case "|$LEVERS|" in *"|$name|"*) ;; *) continue ;; esac
  log "== $name: $cases $flags"
  t0=$(date +%s)
  timeout -k 10 "$tmo" $TR -m ditron.bench megakernel $cases --skip-eager --warmup 3 --iters 20 --repeat 1 $flags $EXTRA \
      --machine "$MACHINE" --tag "levers-$name" --out "$OUTD" > "$OUTD/levers-$name.log" 2>&1
  rc=$?
  grep -E "^context [0-9]+ batch" "$OUTD/levers-$name.log" | sed 's/^/   /' | tee -a "$OUTD/levers.log"
  log "   exit $rc in $(( $(date +%s) - t0 )) s"
  [ $rc = 0 ] || { status=1; tail -15 "$OUTD/levers-$name.log"; }
done
if [ -z "$SKIP_PROBE" ]; then
  log "== GEMV probe: tiles alone, registers (stream=0) vs cp.async (stream=3)"
  { timeout -k 10 50 python bench/gemv_probe.py --configs 16x1024x4 --programs $((2 * SMS)),$P3 --stream 0,3 \
      --shapes qkv,down
    timeout -k 10 30 python bench/gemv_probe.py --fused-norm 8x1024x4 --programs $((2 * SMS)) --stream 0,3
  } > "$OUTD/gemv_probe.txt" 2>&1 || status=1
  tee -a "$OUTD/levers.log" < "$OUTD/gemv_probe.txt"
fi
log "== done, exit $status"
collect() {
  [ "$FINAL" = "$OUTD" ] || cp "$OUTD/levers.log" "$OUTD/gemv_probe.txt" "$FINAL/" 2>/dev/null
  for f in "$OUTD"/levers-*-megakernel.md; do [ -f "$f" ] && { echo "<!-- $(basename "$f") -->"; cat "$f"; echo; }; done \
    > "$FINAL/levers.md"
  python - "$OUTD" > "$FINAL/levers.json" <<'PY'
import glob, json, os, sys
out = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "levers-*-megakernel.json"))):
    out[os.path.basename(f)[len("levers-"):-len("-megakernel.json")]] = json.load(open(f))
print(json.dumps(out, indent=1))
PY
  for f in "$OUTD"/decoder_8b.log "$OUTD"/decoder_8b.txt "$OUTD"/levers-*.log; do
    [ -f "$f" ] && { echo "===== $(basename "$f")"; cat "$f"; }
  done > "$FINAL/logs.txt"
}
collect
exit $status
# CPU smoke run of this script's plumbing (simulator, tiny model):
#   SKIP_CHECK=1 SKIP_PROBE=1 SMS=2 TR="python -m ditron sim -n 1" EXTRA="--config tiny --ctx 33 --iters 1" \
#     LEVERS="base|stream" bench/megakernel_levers.sh
