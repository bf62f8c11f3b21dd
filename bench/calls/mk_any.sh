#!/usr/bin/env bash
# The first GPU call of a session (~550 s) on whatever comes:
#   an H200: issue 53's missing row (megakernel_table.sh without the transformers cases: both models' whole step at
#            batch 1 / 8 / 16, context 512 / 4096, against the HBM limit and torch + graph), then mk_ab.sh (Qwen3-8B
#            batch 1's gate/up wave);
#   an H100: ep.sh (issue 55: the untimed ll_fp8_once), then mk_ab.sh.
#     OUT=dir bash bench/calls/mk_any.sh          (the device tool sets OUT)
here="$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    echo "== H200: megakernel_table.sh, the megakernel half"; BUDGET=${BUDGET:-230} bash "$here/megakernel_table.sh"
else
    echo "== H100: ep.sh"; mkdir -p "$OUT/ep_call"; OUT=$OUT/ep_call bash "$here/ep.sh"
fi
mkdir -p "$OUT/ab"; echo "== mk_ab.sh"; OUT=$OUT/ab bash "$here/mk_ab.sh"
