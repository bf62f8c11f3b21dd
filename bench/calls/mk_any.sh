#!/usr/bin/env bash
# One short GPU call (~400 s) for issue 53 on whatever comes: on an H200 the row it lacks (both models' whole step at
# batch 1 / 8 / 16, context 512 / 4096, against the HBM limit and torch + graph: megakernel_table.sh without the
# transformers cases), on an H100 bench/calls/llama_cols.sh (Llama's table with its new gate/up tiles, then token
# equality TP=1 / TP=2).
#     OUT=dir bash bench/calls/mk_any.sh          (the device tool sets OUT)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    echo "== H200: megakernel_table.sh, the megakernel half"; BUDGET=${BUDGET:-230} bash "$(dirname "$0")/megakernel_table.sh"
else
    echo "== H100: llama_cols.sh"; bash "$(dirname "$0")/llama_cols.sh"
fi
