#!/usr/bin/env bash
# Issue 26: the decoder megakernel with a change of its source against the same tree without it, side by side on one
# GPU in one call (A, B, A again: the machine's drift shows as the difference of the two A runs).
#
#   BASE=DIR LEVERS="base1" OUT=$OUT bash bench/megakernel_ab.sh nvidia-h200
#
# A is the tree as it is; B the tree with the files under DIR copied over it (DIR holds them at their paths in the
# repository, e.g. DIR/kernels/decoder/tiles_gemv.py: the version before the change, `git show REF:PATH`).  Each run
# is `bench/megakernel_levers.sh` with LEVERS (default `base1`: batch 1 at context 512 and 4096), which checks every
# case against torch first and times torch + CUDA graph and the HBM limit in the same process, with fresh compile
# caches.  The tree is put back as it was at the end (also on failure).  CHECK=1: the levers script's correctness
# check (tests/gpu/decoder_8b.py --batch 1,4,16 --ragged) on A before its first run; skipped otherwise.
#
# CPU smoke run (simulator, tiny model): BASE=DIR SMS=2 TR="python -m ditron sim -n 1" \
#   EXTRA="--config tiny --ctx 33 --batch 1 --iters 1" LEVERS=base1 bash bench/megakernel_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
MACHINE=${1:-nvidia-h200}
: "${BASE:?BASE=a directory holding the baseline versions of the changed files}"
OUTBASE=${OUT:-bench/results/ab}
LV=${LEVERS:-base1}
mapfile -t FILES < <(cd "$BASE" && find . -type f | sed 's|^\./||' | sort)
[ ${#FILES[@]} -gt 0 ] || { echo "ab: $BASE holds no files"; exit 2; }
SAVE=$(mktemp -d)
for f in "${FILES[@]}"; do
  [ -e "$f" ] || { echo "ab: $f (in $BASE) is not in the tree"; exit 2; }
  mkdir -p "$SAVE/$(dirname "$f")" && cp "$f" "$SAVE/$f"
done
restore() { for f in "${FILES[@]}"; do cp "$SAVE/$f" "$f"; done; }
trap restore EXIT
echo "ab: B replaces ${FILES[*]}"
run() {  # name [check]: one levers run; keeps its levers.json and logs.txt (the device returns few files)
  echo "== $1 ($([ "$1" = b ] && echo "baseline: $BASE" || echo "the tree"))"
  SKIP_CHECK=${2-1} LEVERS="$LV" OUT="$OUTBASE/$1" bash bench/megakernel_levers.sh "$MACHINE" \
    | grep -E "^ +[a-z]|exit|summary|PASS|FAIL"
  rm -f "$OUTBASE/$1/levers.md" "$OUTBASE/$1/levers.log"
}
run a1 "$([ "${CHECK:-0}" = 1 ] || echo 1)"
for f in "${FILES[@]}"; do cp "$BASE/$f" "$f"; done
run b
restore
run a2
