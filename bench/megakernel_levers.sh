#!/usr/bin/env bash
# Issue 26, one cost curve over batch and batch 1 near the HBM limit: the decoder megakernel's levers side by side on
# one GPU, in one run.
#
#   bench/megakernel_levers.sh [MACHINE]                 # e.g. bench/megakernel_levers.sh nvidia-h100
#   LEVERS="base|old" bench/megakernel_levers.sh         # a subset (names of the table below)
#
# 1. correctness once: tests/gpu/decoder_8b.py (default tiles, batch 1, 4 and 16, ragged paged contexts);
# 2. each lever: `ditron bench megakernel --skip-eager` at its cases, which checks
#    the lever's step against torch first (the "check" column) and times torch + CUDA graph, the megakernel and the
#    HBM limit in the same process (so every lever has its own baseline next to it);
# 3. (PROBE=1) the GEMV probe: the decoder's GEMV tiles alone, registers double-buffered vs cp.async stream.
#
# Levers of this run (issue 26, the cost curve over batch; on top of today's defaults: qwen3_8b() streams the batch-1
# weights through shared memory on the FMA path, and from batch 2 on takes the tl.dot path with 16 x 512 chunks
# streamed through shared memory (--dot-stream), a 168-register cap and separate RMSNorm tasks, 3 programs per SM;
# the runs before, on the defaults before that, are in bench/results/h100-megakernel-levers.md and
# bench/results/h200-2026-11-27/; registers / spills / shared memory of each on the CPU:
# python bench/megakernel_regs.py --levers ...):
#   curve        today's defaults, batch 1, 2, 4, 8, 16 at context 512 and 4096 (the issue's table)
#   old          the defaults before (FMA path with fused norms at batch 2 at 239 registers, tl.dot register-buffered
#                with 256-deep chunks from batch 3 at 233 registers; both 2 programs per SM; all-reduce tasks at
#                one rank), batch 1, 2 and 8
#   ar           batch 1, 8: today's defaults but the all-reduce tasks kept at one rank (--tp1-all-reduce; the
#                default now has o_proj / down_proj write the delta directly: two stages fewer per layer)
#   ring         batch 2, 8, 16 at both contexts: the activation rows padded to 8 instead of 16 (Triton pads the
#                MMA operand in registers) and the pipeline depth from a 72 KiB ring per program: 4 stages of
#                16 x 512 weight chunks at batch 2-8 (48 KiB of weights in flight per program instead of 32; 3 per
#                SM, 168 registers, no spills on the CPU's ptxas), 3 at batch 16 as before
#   nocap        batch 2, 8: no register cap (the streamed tl.dot path at ~255 registers, 2 programs per SM)
#   k256         batch 8: 256-deep tl.dot chunks (half the bytes in flight per program)
#   split3       batch 1: + the down projection split in 3 K slices (not yet measured with 3 programs per SM)
#   pf2k         batch 1: + each GEMV tile prefetches the first 2048 columns of its rows into L2 before its
#                dependency wait (the weight stream keeps going through the small stages; 168 registers, 3 per SM)
#   (branch b8: the batch path's gate/up tiles, TileConfig.gu_wdot; batch 8 at 4096 was 1.44x batch 1 on the H200)
#   b8base       today's defaults, batch 1 and 8 at context 512 and 4096 (the baseline of the b8 levers, same run;
#                since the b8 defaults: gu_wdot 32, dot_ksplit 4, prenorm_dot); b8old: the batch path before them
#                (--no-prenorm-dot --gu-wdot 0 --dot-ksplit 0: 8-wide tl.dot gate/up tiles, separate norm tasks)
#   b8w32        batch 8 at 512: gate/up tiles of 32 columns with the weight rows as the MMA's M operand (gate and up
#                rows stacked: 64 x 256 weight chunks, x^T the 8-column N operand; 384 tiles, 3-stage 72 KiB ring)
#                instead of 8-column tiles with the batch rows as M (each of the 4 warps read and multiplied the whole
#                chunk); b8wtr: the same at 4096, traced; b8w16: 16-column tiles (768); b8wk128: 128-deep chunks
#                (a 5-stage ring: 4 chunks of 16 KiB in flight instead of 2 of 32)
#   b8pntr       batch 8 at 4096, --prenorm, traced (why prenorm loses at batch 8)
#   b8pne        batch 8 at 4096, --prenorm --pn-early: the prenorm tiles load rstd's partial sums / the residual
#                columns before the weight stream (after it, their latency ends every tile); b8pnwe: + b8w32
#   b8ks         batch 8 at 4096: --dot-ksplit 4: the plain qkv / o / down tiles multiply each K chunk as a batched
#                tl.dot over 4 K slices (one per warp; the plain path's 4 warps each multiply the whole chunk)
#   b8kswtr      batch 8 at 512 and 4096: b8ks + b8w32, traced; b8ksw: the same at 4096, untraced
#   b8pnw        batch 8 at 512 and 4096: --prenorm + b8w32 (round 2 on the H200: 6034 us at 4096, 1.29x batch 1);
#                b8pnwe: + --pn-early; b8pnwk: + --dot-ksplit 4 (its prenorm tiles load their epilogue's inputs
#                first); b8pnwke: both; b8pnwktr: b8pnwk at 4096, traced
#   b8tr         batch 8 at 4096, today's defaults, traced
#   b128         batch 1, 2 and 8 at context 512 and 4096, today's defaults (the Triton 3.6 / 3.9 comparison:
#                bench/megakernel_triton39.sh); b128r72: the 72 KiB ring at every batch (--dot-ring-small 73728:
#                the default before 2026-11-28, which Triton 3.9 lays out in 110592 B at batches 2-8: 2 programs
#                per SM); b28r49: batch 2 and 8 with the 48 KiB ring at every batch; b416, b416r49: batch 4 and 16
#                with the defaults and with the 48 KiB ring
#   base1        batch 1 at context 512 and 4096 with today's defaults (the baseline of the batch-1 levers below)
#   fold         batch 1: o_proj / down_proj commit the pending residual add of their own columns (--fold-resid): no
#                res_a / res_m tasks, down no longer waits for a residual commit after gate/up
#   prenorm      batch 1: as fold, and o_proj / down_proj write the next norm's input bf16(r * w) and their columns'
#                sums of squares (--prenorm): qkv / gate-up tiles are plain GEMVs over it, scaled by rstd, instead
#                of re-reading the float32 residual and delta with every chunk
#   dyn1         batch 1: the dynamic scheduler (an atomic ticket per item: a program that finishes early takes the
#                next item instead of its static queue's)
#   k512s5       batch 1: 512-deep weight chunks, 5 pipeline stages (4 chunks of 16 KiB in flight instead of 2 of 32:
#                the same shared memory, a smoother stream)
#   gu32         batch 1: gate/up tiles of 32 x 256 (384 tiles: one per program, one pipeline fill per phase instead
#                of four)
#   nofuse1      batch 1: separate RMSNorm tasks (plain GEMV tiles; what the fused norm costs per tile)
#   pntrace      batch 1, ctx 512: --prenorm with a traced build (time per kind of task); trace1: today's defaults
#   pngu32       batch 1: --prenorm and gu32 together
#   pnk512       batch 1: --prenorm and k512s5 together
#   base8        batch 2 and 8 at ctx 512: today's defaults
#   pn8          batch 8 at ctx 512 and 4096 with --prenorm (at batches above fuse_upto it replaces the separate norm
#                tasks of layers 1-35: o_proj / down_proj write the norm's input, no norm stage)
#   main, new    batch 1 and 8 at ctx 512 and 4096: main's defaults of 2026-11-27 (before prenorm and the 32 x 256
#                gate/up tiles of batch 1) and today's defaults
#   cols11       batch 1: o_proj / down_proj tiles of 11 columns (masked 16-row tiles): 373 tiles each for 396
#                programs instead of 256 (--cols o=11,down=11)
#   as64         batch 1: 64-position flash-decoding splits (twice the attention tiles, each half as long: the
#                attention stage is latency-bound at batch 1)
#   as256        batch 8, 16 at context 4096: 256-position splits (each attention tile's pipelined K/V loop runs 4
#                iterations of 64 positions instead of 2; half the tiles and combine partials)
#   trace        batch 1 and 8, ctx 512, with a traced build: time per kind of task
#   (branch mk8: batch 1 at 1.32-1.36x the HBM limit on the H200; the critical path's tile of each GEMV phase ran
#   10-25% longer than the phase's mean tile, bench/results/h200-2026-11-27-critical-path.md)
#   base1b       base1 again (last in a run: the machine's drift)
#   sw1          batch 1: the prenorm GEMV tiles (qkv, o, gate/up, down) wait on their producers inside their K loop,
#                per chunk, 3 chunks ahead of the chunk (TileConfig.stream_wait; the first 3 chunks' producers before
#                the loop), instead of on all producers before the tile: the weights stream while the producer
#                phase's last tiles finish; sw2 / sw4: per 2 / 4 chunks; sw1gd: only gate/up and down (16 and 12
#                chunks a tile; qkv / o have 4); sw1tr: sw1 at 512, traced (the critical path table); sw1pf: sw1 +
#                each GEMV tile's first 512 columns prefetched into L2 at its start (before its first in-loop wait:
#                a program idle in the producer phase starts its weights); sw1b8: batch 8 with the flag (no effect
#                by construction: the tl.dot path; tests/test_decoder_regs.py checks the kernel is the same)
#   swx1         sw1 with --stream-wait-exact: each chunk waits on its own producers, the activations are loaded by
#                dl.ld outside the software pipeline, so the pipeline's first weight chunks are requested before any
#                wait (weights into shared memory before the wait; no registers held); swx4 / swx1gd / swx1pf /
#                swx1tr: as sw4 / sw1gd / sw1pf / sw1tr
#   swl1, swxl*  sw1 / swx* with --stream-wait-load: the in-loop waits poll with ld.acquire and no fence
#                (fence.acq_rel.gpu is MEMBAR.ALL.GPU, which may wait for the thread's weight copies in flight: a
#                drain of the pipeline per wait)
#   (round 1 on one H200, 2026-11-27: sw1 +6.3% / +10.5% at 512 / 4096, sw4 0% / +3.7%, sw1gd +4.4% / +6.9%, swx*
#   +33-58% (activations outside the pipeline: their latency per chunk), swl1 -0.9% / +1.7%: the fence drains)
#   swl1gd       swl1 on gate/up and down only (16 / 12 chunks; qkv / o have 4, 3 of them waited before the loop);
#                swl4gd: a wait per 4 chunks; swl1g: gate/up only; swl1pf: swl1 + --prefetch-k 512
#   wl           batch 1: every scoreboard wait before a tile polls with ld.acquire and has no fence
#                (--wait-acquire load; the fence is MEMBAR.ALL.GPU + an L1 invalidate; an acquire load invalidates L1
#                at each poll); wltr: traced at 512 (the signal part of the critical path); wlgd: wl + swl1gd;
#                b8w / wl8: the defaults / wl at batch 8, both contexts
#   (round 2, one H200: swl1g -1.9% / -1.8%, swl4gd -2.2% / -0.5%, swl1gd -1.3% / 0.0%, swl1 -1.3% / +1.1%)
#   swl4g / swl2g: swl1g with a wait per 4 / 2 chunks; wlg: wl + swl1g; swl1gtr: swl1g at 512, traced
#   (round 3, one H200: wl -2.8% / -2.5%, wl8 -3.3% / -2.3%, wlg -3.5% / -3.6%: wait_acquire='load' became the default)
#   fence1 / fence8: the old waits (--wait-acquire fence) at batch 1 / 8, the baseline of the default since then
#   sw0          batch 1 without the gate/up in-loop acquire-load waits (--stream-wait 0): the default until
#                2026-11-27 (swl1g since then: TileConfig.stream_wait=None, auto: 1 on NVIDIA, 0 on AMD)
#   swgo / swgq  batch 1 with the in-loop acquire-load waits on o_proj / qkv too (the default has them on gate/up;
#                round 2 measured all four and gate/up + down, not these pairs)
#   trace1k      batch 1 at context 4096, traced (trace1: at 512)
#   ok512 / qk512  batch 1 with o_proj's / qkv's K chunks of 512 (8 per o tile instead of 4; the traced step streams
#                o_proj at 63% and qkv at 79% of the copy bandwidth on its critical path)
#   fr1          batch 1 with the rope stage fused into the attention tiles (--attn-fuse-rope: one stage fewer per
#                layer on the latency-bound chain rope -> attention -> combine; +6-15% at batch 8, unmeasured at 1)
#   apo          batch 1 with the attention tiles' L2 prefetch of o_proj's weights (--attn-prefetch-o: each of a layer's
#                attention tiles asks L2 for its share of the 4096 o_proj rows before its wait, so the 32 MB stream
#                while the latency-bound rope -> attention -> combine chain runs; the traced step streams o_proj at
#                63% of the copy bandwidth on its critical path); apotr: apo at 512, traced; apo8: apo at batch 8
#   at1s         batch 1 at context 4096 with --attn-tiles = SMs: 16 splits of 256 positions per kv head instead of 32
#                of 128 (half the attention tiles, half the partials per combine tile)
#   pfd1 / pfd2  batch 1: the down_proj tiles ask L2 for the first 1024 / 2048 columns of their weight rows before
#                their wait (--prefetch-k N --prefetch-projs down): the weights start while gate/up's last tiles
#                stream (down's first 3 of 12 chunks are waited for before its loop, so its in-loop waits do not);
#                pfq1: the qkv tiles (after down); pfdq1: both (pf2k prefetched for every projection); pfdsq: pfd1
#                with the in-loop waits on qkv too (swgq); pfd1b: pfd1 again; pfd8: pfd1 at batch 8 (b8w: its
#                baseline); base1c: base1 again, last in a run
#   ap31 / ap3b321 / at2w1  batch 1: ap3 / ap3b32 / at2w (measured at batch 8 only): the attention tile's K loop
#                pipelined (3 stages; 32-position blocks), twice the attention tiles (at 4096: 64-position splits)
#   pfo1         batch 1: the o_proj tiles ask L2 for the first 1024 columns of their weight rows before their wait
#                (during the attention chain; 8 MiB a layer against o_prefetch's 33.5)
#   pfo2 / pfod1 / pfo1b / pfo8  pfo1 with 2048 columns; pfo1 on o_proj and down_proj; pfo1 again; pfo1 at
#                batch 8 (b8w: its baseline)
#   pfoq1 / pfoq8  batch 1 / 8: pfo1 on o_proj and qkv (o is the 8B default since this run: pfo1 = base1 there)
#   ab321        batch 1: --attn-block 32 without the pipelined loop (at 4096: 43 splits of 96 positions per kv
#                head instead of 32 of 128; at 512: 16 of 32 instead of 8 of 64)
#   (the sw*/swx*/swl* lines above pass --stream-wait-fence / --stream-wait-projs qkv,o,gate_up,down where they
#   measured the old defaults of those flags)
#   (attention at context 4096, branch attn5; batch 8 there was 1.44x batch 1 on the H200)
#   base4k       today's defaults at context 4096, batch 1 and 8 (the baseline of the levers below, same run)
#   trace4k      batch 8 at context 4096, traced: time per kind of task
#   at1w         --attn-tiles 3 x SMs: the split length per batch and context so that an attention stage is about one
#                wave of tiles over the 3-per-SM programs (batch 8: 6 splits of 704 positions, 384 tiles, instead of
#                32 splits of 128: 2048 tiles; 6 partials per head to combine instead of 32)
#   at2w         the same aiming at two waves (batch 8: 12 splits of 384)
#   ap3          the attention loop as tl.range(num_stages=3) with each block's V load issued with its K load
#   ap3b32       the same with 32-position blocks
#   apv          the next block's V loaded into registers while the current block is reduced (Triton pipelines only K)
#   apvb32       apv + ap3 with 32-position blocks
#   grp          one rope tile per (sequence, kv head) (6 heads) and one combine tile per (sequence, kv head) (4 heads)
#   fr           the rope stage fused into the attention tiles (q norm + RoPE in registers; the split of the new
#                position appends k and v): one stage fewer per layer
#   fr2          fr + comb-group + at1w + ap3, batch 1 and 8 at both contexts;  fr2tr: the same at 4096 batch 8, traced
#   (round 2: the default attn_tiles=396 since the H200 run of 2026-11-27, bench/results/h200-2026-11-27-attn5.md)
#   a5old        batch 1, 8, 16 at both contexts with --attn-tiles 0 (splits of 128 positions: the default before)
#   a5new        the same cases at today's defaults (attn_tiles 396)
#   a5w2         batch 8 at 4096: --attn-tiles 2 x 3 x SMs (two waves)
#   a5tr         batch 8 at 4096, today's defaults, traced
#   attn         at1w + ap3 + grp, batch 1 and 8 at both contexts;  attntr: the same at 4096 batch 8, traced
# Each step has its own timeout; the default levers are sized for about 4.5 minutes on one H200 (8 at most;
# SKIP_CHECK=1 LEVERS="split3|pf2k|as64|trace": about 3.5 minutes more).
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
  "curve|170|--ctx 512,4096 --batch 1,2,4,8,16|"
  "old|75|--ctx 512 --batch 1,2,8|--dot-from 3 --fuse-upto 2 --no-dot-stream --dot-block-k 256 --max-regs 255 --tp1-all-reduce"
  "ar|50|--ctx 512 --batch 1,8|--tp1-all-reduce"
  "ring|75|--ctx 512,4096 --batch 2,8,16|--dot-pad 8 --dot-ring 73728"
  "nocap|50|--ctx 512 --batch 2,8|--max-regs 255"
  "k256|40|--ctx 512 --batch 8|--dot-block-k 256"
  "split3|40|--ctx 512 --batch 1|--down-split-k 3"
  "pf2k|40|--ctx 512 --batch 1|--prefetch-k 2048"
  "b8base|100|--ctx 512,4096 --batch 1,8|"
  "b8old|100|--ctx 512,4096 --batch 1,8|--no-prenorm-dot --gu-wdot 0 --dot-ksplit 0"
  "b8w32|45|--ctx 512 --batch 8|--gu-wdot 32 --gu-wdot-k 256"
  "b8wtr|80|--ctx 4096 --batch 8|--gu-wdot 32 --gu-wdot-k 256 --trace"
  "b8pntr|80|--ctx 4096 --batch 8|--prenorm --trace"
  "b8pnw|60|--ctx 512,4096 --batch 8|--prenorm --gu-wdot 32 --gu-wdot-k 256"
  "b8pnwe|60|--ctx 512,4096 --batch 8|--prenorm --gu-wdot 32 --gu-wdot-k 256 --pn-early"
  "b8pnwk|60|--ctx 512,4096 --batch 8|--prenorm --gu-wdot 32 --gu-wdot-k 256 --dot-ksplit 4"
  "b8pnwke|60|--ctx 512,4096 --batch 8|--prenorm --gu-wdot 32 --gu-wdot-k 256 --dot-ksplit 4 --pn-early"
  "b8pnwktr|80|--ctx 4096 --batch 8|--prenorm --gu-wdot 32 --gu-wdot-k 256 --dot-ksplit 4 --trace"
  "b8ksw|45|--ctx 4096 --batch 8|--dot-ksplit 4 --gu-wdot 32 --gu-wdot-k 256"
  "b8pne|45|--ctx 4096 --batch 8|--prenorm --pn-early"
  "b8w16|45|--ctx 4096 --batch 8|--gu-wdot 16 --gu-wdot-k 256"
  "b8wk128|45|--ctx 4096 --batch 8|--gu-wdot 32 --gu-wdot-k 128"
  "b8ks|45|--ctx 4096 --batch 8|--dot-ksplit 4"
  "b8kswtr|120|--ctx 512,4096 --batch 8|--dot-ksplit 4 --gu-wdot 32 --gu-wdot-k 256 --trace"
  "b8tr|80|--ctx 4096 --batch 8|--trace"
  "base1|70|--ctx 512,4096 --batch 1|"
  "fold|45|--ctx 512 --batch 1|--fold-resid"
  "prenorm|70|--ctx 512,4096 --batch 1|--prenorm"
  "dyn1|45|--ctx 512 --batch 1|--scheduler dynamic"
  "k512s5|45|--ctx 512 --batch 1|--gemv-block-k 512 --block-k gate_up=512 --stream-stages 5"
  "gu32|45|--ctx 512 --batch 1|--block-n gate_up=32 --block-k gate_up=256"
  "nofuse1|45|--ctx 512 --batch 1|--fuse-upto 0"
  "pntrace|80|--ctx 512 --batch 1|--prenorm --trace"
  "trace1|80|--ctx 512 --batch 1|--trace"
  "pngu32|45|--ctx 512 --batch 1|--prenorm --block-n gate_up=32 --block-k gate_up=256"
  "pnk512|45|--ctx 512 --batch 1|--prenorm --gemv-block-k 512 --block-k gate_up=512 --stream-stages 5"
  "base8|60|--ctx 512 --batch 2,8|"
  "pn8|60|--ctx 512,4096 --batch 8|--prenorm"
  "main|90|--ctx 512,4096 --batch 1,8|--no-prenorm --block-n gate_up=8 --block-k gate_up=1024"
  "new|90|--ctx 512,4096 --batch 1,8|"
  "cols11|60|--ctx 512,4096 --batch 1|--cols o=11,down=11"
  "as64|60|--ctx 512,4096 --batch 1|--attn-split 64"
  "as256|60|--ctx 4096 --batch 8,16|--attn-split 256"
  "base4k|60|--ctx 4096 --batch 1,8|"
  "trace4k|80|--ctx 4096 --batch 8|--trace"
  "at1w|60|--ctx 4096 --batch 1,8|--attn-tiles $P3"
  "at2w|50|--ctx 4096 --batch 8|--attn-tiles $((2 * P3))"
  "ap3|50|--ctx 4096 --batch 8|--attn-stages 3"
  "ap3b32|50|--ctx 4096 --batch 8|--attn-stages 3 --attn-block 32"
  "apv|50|--ctx 4096 --batch 8|--attn-prefetch-v"
  "apvb32|50|--ctx 4096 --batch 8|--attn-prefetch-v --attn-stages 3 --attn-block 32"
  "grp|60|--ctx 512,4096 --batch 8|--rope-group --comb-group"
  "fr|60|--ctx 512,4096 --batch 8|--attn-fuse-rope"
  "fr2|80|--ctx 512,4096 --batch 1,8|--attn-fuse-rope --comb-group --attn-tiles $P3 --attn-stages 3"
  "fr2tr|80|--ctx 4096 --batch 8|--trace --attn-fuse-rope --comb-group --attn-tiles $P3 --attn-stages 3"
  "a5old|100|--ctx 512,4096 --batch 1,8,16|--attn-tiles 0"
  "a5new|100|--ctx 512,4096 --batch 1,8,16|"
  "a5w2|45|--ctx 4096 --batch 8|--attn-tiles $((2 * P3))"
  "a5tr|60|--ctx 4096 --batch 8|--trace"
  "attn|80|--ctx 512,4096 --batch 1,8|--attn-tiles $P3 --attn-stages 3 --rope-group --comb-group"
  "attntr|80|--ctx 4096 --batch 8|--trace --attn-tiles $P3 --attn-stages 3 --rope-group --comb-group"
  "trace|80|--ctx 512 --batch 1,8|--trace"
  "base1b|70|--ctx 512,4096 --batch 1|"
  "sw1|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "sw2|70|--ctx 512,4096 --batch 1|--stream-wait 2 --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "sw4|70|--ctx 512,4096 --batch 1|--stream-wait 4 --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "sw1gd|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-projs gate_up,down --stream-wait-fence"
  "sw1tr|80|--ctx 512 --batch 1|--stream-wait 1 --trace --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "sw1pf|70|--ctx 512,4096 --batch 1|--stream-wait 1 --prefetch-k 512 --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "sw1b8|60|--ctx 512,4096 --batch 8|--stream-wait 1 --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "swx1|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-exact --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "swx4|70|--ctx 512,4096 --batch 1|--stream-wait 4 --stream-wait-exact --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "swx1gd|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-exact --stream-wait-projs gate_up,down --stream-wait-fence"
  "swx1tr|80|--ctx 512 --batch 1|--stream-wait 1 --stream-wait-exact --trace --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "swx1pf|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-exact --prefetch-k 512 --stream-wait-fence --stream-wait-projs qkv,o,gate_up,down"
  "swl1|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-load --stream-wait-projs qkv,o,gate_up,down"
  "swxl1|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-exact --stream-wait-load --stream-wait-projs qkv,o,gate_up,down"
  "swxl4|70|--ctx 512,4096 --batch 1|--stream-wait 4 --stream-wait-exact --stream-wait-load --stream-wait-projs qkv,o,gate_up,down"
  "swxl1gd|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-exact --stream-wait-load --stream-wait-projs gate_up,down"
  "swxl1tr|80|--ctx 512 --batch 1|--stream-wait 1 --stream-wait-exact --stream-wait-load --trace --stream-wait-projs qkv,o,gate_up,down"
  "swxl1pf|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-exact --stream-wait-load --prefetch-k 512 --stream-wait-projs qkv,o,gate_up,down"
  "swl1gd|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-load --stream-wait-projs gate_up,down"
  "swl4gd|70|--ctx 512,4096 --batch 1|--stream-wait 4 --stream-wait-load --stream-wait-projs gate_up,down"
  "swl1g|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-load --stream-wait-projs gate_up"
  "swl1pf|70|--ctx 512,4096 --batch 1|--stream-wait 1 --stream-wait-load --prefetch-k 512 --stream-wait-projs qkv,o,gate_up,down"
  "wl|70|--ctx 512,4096 --batch 1|--wait-acquire load"
  "swl4g|70|--ctx 512,4096 --batch 1|--stream-wait 4 --stream-wait-load --stream-wait-projs gate_up"
  "swl2g|70|--ctx 512,4096 --batch 1|--stream-wait 2 --stream-wait-load --stream-wait-projs gate_up"
  "wlg|70|--ctx 512,4096 --batch 1|--wait-acquire load --stream-wait 1 --stream-wait-load --stream-wait-projs gate_up"
  "swl1gtr|80|--ctx 512 --batch 1|--stream-wait 1 --stream-wait-load --stream-wait-projs gate_up --trace"
  "wlgd|70|--ctx 512,4096 --batch 1|--wait-acquire load --stream-wait 1 --stream-wait-load --stream-wait-projs gate_up,down"
  "wltr|80|--ctx 512 --batch 1|--wait-acquire load --trace"
  "b8w|70|--ctx 512,4096 --batch 8|"
  "wl8|70|--ctx 512,4096 --batch 8|--wait-acquire load"
  "fence1|70|--ctx 512,4096 --batch 1|--wait-acquire fence"
  "sw0|70|--ctx 512,4096 --batch 1|--stream-wait 0"
  "swgo|70|--ctx 512,4096 --batch 1|--stream-wait-projs gate_up,o"
  "swgq|70|--ctx 512,4096 --batch 1|--stream-wait-projs gate_up,qkv"
  "trace1k|80|--ctx 4096 --batch 1|--trace"
  "ok512|70|--ctx 512,4096 --batch 1|--block-k o=512"
  "qk512|70|--ctx 512,4096 --batch 1|--block-k qkv=512"
  "fr1|70|--ctx 512,4096 --batch 1|--attn-fuse-rope"
  "apo|70|--ctx 512,4096 --batch 1|--attn-prefetch-o"
  "apotr|80|--ctx 512 --batch 1|--attn-prefetch-o --trace"
  "apo8|70|--ctx 512,4096 --batch 8|--attn-prefetch-o"
  "at1s|45|--ctx 4096 --batch 1|--attn-tiles $SMS"
  "pfd1|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs down"
  "pfd2|70|--ctx 512,4096 --batch 1|--prefetch-k 2048 --prefetch-projs down"
  "pfq1|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs qkv"
  "pfdq1|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs down,qkv"
  "pfdsq|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs down --stream-wait-projs gate_up,qkv"
  "pfd1b|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs down"
  "pfd8|70|--ctx 512,4096 --batch 8|--prefetch-k 1024 --prefetch-projs down"
  "ap31|70|--ctx 512,4096 --batch 1|--attn-stages 3"
  "ap3b321|70|--ctx 512,4096 --batch 1|--attn-stages 3 --attn-block 32"
  "at2w1|70|--ctx 512,4096 --batch 1|--attn-tiles $((2 * P3))"
  "pfo1|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs o"
  "ab321|70|--ctx 512,4096 --batch 1|--attn-block 32"
  "pfo2|70|--ctx 512,4096 --batch 1|--prefetch-k 2048 --prefetch-projs o"
  "pfod1|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs o,down"
  "pfo1b|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs o"
  "pfo8|70|--ctx 512,4096 --batch 8|--prefetch-k 1024 --prefetch-projs o"
  "pfoq1|70|--ctx 512,4096 --batch 1|--prefetch-k 1024 --prefetch-projs o,qkv"
  "pfoq8|70|--ctx 512,4096 --batch 8|--prefetch-k 1024 --prefetch-projs o,qkv"
  "base1c|70|--ctx 512,4096 --batch 1|"
  "fence8|70|--ctx 512,4096 --batch 8|--wait-acquire fence"
  "b128|150|--ctx 512,4096 --batch 1,2,8|"
  "b128r72|150|--ctx 512,4096 --batch 1,2,8|--dot-ring-small 73728"
  "b28r49|120|--ctx 512,4096 --batch 2,8|--dot-ring 49152 --dot-ring-small 49152"
  "b416|120|--ctx 512,4096 --batch 4,16|"
  "b416r49|120|--ctx 512,4096 --batch 4,16|--dot-ring 49152 --dot-ring-small 49152"
)
LEVERS=${LEVERS:-curve|old|ar|nocap|k256}
status=0
log() { echo "$*" | tee -a "$OUTD/levers.log"; }
log "== megakernel levers on $MACHINE ($SMS SMs), tree $(git rev-parse --short HEAD 2>/dev/null), $(date -u)"
if [ -z "$SKIP_CHECK" ]; then
  log "== correctness: tests/gpu/decoder_8b.py --batch 1,4,16 --ragged"
  timeout -k 10 120 $TR tests/gpu/decoder_8b.py --backend p2p --batch 1,4,16 --ragged --steps 2 --out "$OUTD/decoder_8b.txt" \
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
if [ -n "$PROBE" ]; then
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
  # the cost curve: every case against batch 1 of the same lever and context (issue 26: batch 8 <= 1.3x batch 1)
  python - "$FINAL/levers.json" <<'PY' | tee -a "$FINAL/levers.log"
import json, sys
data = json.load(open(sys.argv[1]))
print("== summary: lever | ctx | batch | megakernel us | mk / HBM limit | mk / graph | mk / batch 1 (same ctx; of the "
      "same lever, else of 'new', 'curve' or 'base1')")
base = {r["ctx"]: r["megakernel_us"] for k in ("base1", "curve", "new", "b8base") for r in data.get(k, {}).get("rows", [])
        if r.get("batch") == 1 and r.get("megakernel_us")}
for lever, d in data.items():
    rows = d.get("rows", [])
    b1 = {**base, **{r["ctx"]: r["megakernel_us"] for r in rows if r.get("batch") == 1 and r.get("megakernel_us")}}
    for r in rows:
        mk, g = r.get("megakernel_us"), r.get("graph_us") or r.get("torch_graph_us")
        rel = f"{mk / b1[r['ctx']]:.2f}x" if mk and r["ctx"] in b1 else "-"
        lim = f"{r['mk_over_hbm_limit']:.2f}x" if r.get("mk_over_hbm_limit") else "-"
        print(f"   {lever} | {r['ctx']} | {r['batch']} | {mk and round(mk, 1)} | {lim} | "
              f"{f'{mk / g:.2f}x' if mk and g else '-'} | {rel}")
PY
  for f in "$OUTD"/decoder_8b.log "$OUTD"/decoder_8b.txt "$OUTD"/levers-*.log; do
    [ -f "$f" ] && { echo "===== $(basename "$f")"; cat "$f"; }
  done > "$FINAL/logs.txt"
}
collect
exit $status
# CPU smoke run of this script's plumbing (simulator, tiny model):
#   SKIP_CHECK=1 SMS=2 TR="python -m ditron sim -n 1" EXTRA="--config tiny --ctx 33 --batch 1 --iters 1" \
#     LEVERS="base|split3" bench/megakernel_levers.sh
