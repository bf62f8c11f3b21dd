"""Configuration of the Qwen3-like tensor-parallel decoder (issue 13 part B).

:class:`DecoderConfig` holds the model shape (Qwen3-8B by :func:`qwen3_8b`,
a 2-layer toy by :func:`tiny`) and the tile sizes of every task kind (all
``tl.constexpr`` parameters of the tiles (``kernels/decoder/tiles_gemv.py``, ``tiles_attention.py``), chosen here so
that they can be tuned on GPUs without touching the tiles).
:meth:`DecoderConfig.shard` gives the per-rank split of tensor parallelism:
q / kv heads and the MLP's intermediate dimension over the ranks
(column-parallel QKV and gate/up), o_proj and down_proj row-parallel (their
partial sums are all-reduced).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ditron.errors import DitronError


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _projs(text: str) -> list:
    """A list of projection names separated by ``,`` or ``+``."""
    return [p.strip() for p in text.replace("+", ",").split(",") if p.strip()]


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes (compile-time constants of the tile functions).

    * ``gemv_block_n`` / ``gemv_block_k``: output columns per GEMV tile and
      the K chunk streamed per loop iteration (bf16 elements);
      ``qkv_block_n``, ``o_block_n``, ``gate_up_block_n``, ``down_block_n``:
      per-projection overrides of ``gemv_block_n`` (0: use it), to fit the
      tile counts to the number of SMs;
      ``qkv_block_k``, ``o_block_k``, ``gate_up_block_k``, ``down_block_k``:
      per-projection overrides of ``gemv_block_k`` (0: use it; gate/up
      streams two chunks, gate and up, per step, so half the chunk fits the
      same registers);
      ``dot_gate_up_block_n``: the gate/up tile width of the ``tl.dot`` path (0: ``dot_block_n``, else
      ``gate_up_block_n``), so batch 1's FMA path and the batch path can have different gate/up tiles;
      ``dot_block_n`` / ``dot_block_k``: the tile width (0: the projection's) and K chunk of the ``tl.dot``
      path (256: 16 padded rows x 256 float32 activations fit the registers, 1024 spilled ~27 KB per thread,
      issue 26); ``dot_stream``: the ``tl.dot`` path streams the weights through Triton's software pipeliner
      (``cp.async`` into shared memory) instead of register double-buffering (a lever to measure);
      ``gemv_stream``: the same for the FMA path of small batches (the batch-1 lever of issue 26: ``tl.range``
      with an explicit ``num_stages`` makes Triton pipeline loads that feed no ``tl.dot``); ``stream_stages``: the
      pipeline depth of both (chunks in shared memory: ``stream_stages - 1`` in flight);
      ``gemv_dot``: accumulate with ``tl.dot`` (batch rows padded to 16)
      instead of a broadcast multiply + sum; ``None``: ``tl.dot`` from batch ``dot_from`` on (the FMA path
      holds the float32 weight chunk once per batch row: at batch 2 the whole step needed 255 registers,
      2 programs per SM; issue 26);
    * ``norm_block``: elements per loop iteration of RMSNorm;
    * ``attn_split``: KV positions per flash-decoding tile (a multiple of
      ``attn_block``), ``attn_block``: positions per inner iteration;
    * ``comm_block``: float32 elements per all-reduce tile (``ditron.task.comm``);
    * ``prefetch_k``: 0, or the number of leading K columns of each GEMV
      tile's weight rows that the megakernel prefetches into L2 *before* the
      tile's dependency wait (``register_task(prefetch=...)``,
      ``dl.prefetch_l2``), so weight reads overlap the wait for the
      activations (a power of two >= 64); ``prefetch_projs``: the projections that prefetch (a comma list of
      ``qkv``, ``o``, ``gate_up``, ``down``; default all);
    * ``max_regs``: 0, or the registers per thread the megakernel may use (ptxas ``maxnreg``; NVIDIA): the
      heaviest branch sets every branch's budget, so a cap lets more programs be resident per SM at the price of
      spills in that branch (a lever of issue 26; see ``bench/megakernel_regs.py``);
    * ``down_split_k``: 1, or the number of K slices of the down projection (``K`` = the intermediate size per
      rank, 12288 at TP=1): ``cdiv(H, BN) * down_split_k`` tiles writing float32 slices, added by ``dsum`` tiles
      (one per all-reduce chunk) before the all-reduce; a slice waits only for the gate/up tiles of its columns
      (a lever of issue 26);
    * ``fuse_norm``: the QKV and gate/up tiles compute the RMSNorm of the
      residual stream themselves (:func:`rms_linear_tile`); the residual add is
      committed off the critical path (:func:`add_resid_tile`).  Saves two
      single-tile stages per layer.  ``False``: separate RMSNorm tasks.  ``None`` (default): fused for batches up
      to ``fuse_upto`` only: every fused tile re-reads the float32 residual and delta of all rows (at batch 8 twice the
      weight bytes of a qkv tile), and on one H100 a batch-8 step took 9.1 ms with separate norms against 12.1
      fused (``bench/megakernel_levers.sh``, 2026-11-27);
    * ``programs_per_sm``: 0, or the megakernel's default grid per SM (shrunk to what fits; the runtime's default
      is 2); ``TILES_8B`` asks for 3, which fit when the weights stream through shared memory (``gemv_stream`` at
      batch 1: 162-168 registers; ``dot_stream`` with ``max_regs=168`` from batch 2 on, no spills) and shrink to 2
      otherwise (233-255 registers);
    * ``dot_from``: the smallest batch that takes the ``tl.dot`` path when ``gemv_dot`` is ``None``;
      ``fuse_upto``: the largest batch whose GEMV tiles fuse the RMSNorm when ``fuse_norm`` is ``None`` (the
      fused ``tl.dot`` tiles hold the residual rows too: 168 registers spilled ~0.5 KB per thread at batch 2);
    * ``dot_pad``: the ``tl.dot`` path pads the batch rows to at least this many (a power of two; 16: the MMA's
      rows; NVIDIA's Triton pads smaller operands itself in registers, so 1 keeps the activation chunks that stream
      through shared memory at ``next_pow2(B)`` rows: room for deeper weight chunks at small batches);
    * ``dot_ring``: 0, or the shared-memory bytes per program that the streamed ``tl.dot`` path's ring may take:
      its pipeline depth is then ``1 + dot_ring // stage`` (at least 2; a stage is one K chunk of the weight rows
      and the activation rows), per projection and batch, instead of ``stream_stages`` (more chunks in flight
      where the rows are few, the same ring where they are many);
    * ``dot_ring_small``: 0, or the ring's budget at batches of at most 8 (instead of ``dot_ring``): the 8B defaults
      take 48 KiB there and 72 KiB above (one H200, same calls: batches 2-8 2-3% faster with Triton 3.6, batch 16
      1-4% slower; with Triton 3.9, whose 72 KiB ring takes 108 KiB of shared memory at batches 2-8 so that 2
      programs fit per SM, 4-13% faster: ``bench/results/2026-11-28-megakernel-triton39/``);
    * ``direct_tp1``: on one rank (no tensor parallelism) o_proj and down_proj write the residual delta
      themselves: no all-reduce tasks (at one rank a copy), two stages fewer per layer; no effect at 2+ ranks.
    * ``fold_resid``: where ``direct_tp1`` applies and the RMSNorm is fused into the GEMV tiles (batch 1 of the
      8B defaults), o_proj and down_proj also commit the pending residual add for their own columns
      (``linear_resid_tile``: ``resid += delta``, then ``delta = x @ w^T``) instead of the ``res_a`` / ``res_m``
      tasks: two stages fewer per layer, and down_proj no longer waits for a residual commit after gate/up (a
      lever of issue 26); not with ``down_split_k > 1``; no effect elsewhere.
    * ``prenorm``: on one rank with ``direct_tp1`` (it implies ``fold_resid``; ``None``: at batches up to
      ``fuse_upto``, where the norms would be fused, without split-K; ``True``: every batch), o_proj and down_proj
      tiles add their output to the residual stream at once (``linear_resnorm_tile``: no delta) and write the next
      RMSNorm's input without its ``rstd`` (``hn = bf16(r * w_norm)``) and their columns' sums of squares; the next
      qkv and gate/up tiles are plain GEMVs over ``hn`` scaled by ``rstd`` (``linear_rstd_tile``,
      ``gate_up_rstd_tile``) instead of re-reading the float32 residual and delta with every chunk (fused norms) or
      waiting for a separate norm task (batches above ``fuse_upto``: no ``norm_a`` / ``norm_m`` tasks but layer 0's;
      layer 0's qkv normalises the step's input as before);
    * ``o_cols`` / ``down_cols``: 0, or the output columns per o_proj / down_proj tile where ``prenorm`` applies (at
      most the tile width; any count: a tile of ``block_n`` rows with the rest masked), so that a projection of
      fewer tiles than programs can use them all (e.g. 11: 373 tiles of the 4096 columns for 396 programs, against
      256 tiles of 16; a lever of issue 26).
    * ``gate_up_cols``: 0, or the same for the gate/up tiles that read o_proj's ``hn`` where ``prenorm`` applies
      (``gate_up_rstd_tile`` and its in-loop-wait and early forms): a tile of its width's gate and up rows
      (``gate_up_block_n``; ``dot_gate_up_block_n`` on the plain ``tl.dot`` path; at least ``gate_up_cols``) of
      which only the first ``gate_up_cols`` are read and written, so that the intermediate size in
      ``cdiv(I, gate_up_cols)`` tiles can match the programs (Llama-3.1-8B's 14336 in tiles of 32: 448 tiles, 1.13
      waves of 396 programs; 37 columns of 64-row tiles: 388, one wave).  Ignored where it cannot apply, as
      ``o_cols`` / ``down_cols`` are without ``prenorm``: the fused-norm and separate-norm gate/up tiles, the
      ``gu_wdot`` tiles of the batch path (one config serves every batch: ``gu_wdot_cols`` there), so also at more
      than one rank and with
      ``down_split_k > 1`` (no ``prenorm`` there); :meth:`cols` gives the columns per tile where ``prenorm``
      applies.  The row mask costs registers (Llama's gate/up branch at batch 1, 32 rows: 72 -> 134 with 19
      columns, within the cap; ``bench/megakernel_regs.py``).
    * ``gu_wdot``: 0, or the gate/up tile width of the ``tl.dot`` path (batches from ``dot_from``) with the weight
      rows on the MMA's M side (:func:`~.tiles_gemv.gate_up_wdot_tile`: ``gu_wdot`` gate and ``gu_wdot`` up rows
      stacked, the batch rows the N operand, ``x^T``): the plain ``tl.dot`` path puts the few batch rows on M, so
      each of the 4 warps reads and multiplies the whole weight chunk from shared memory (an MMA of 16 rows; the
      8-wide gate/up tiles of batch 8: 4 times the shared-memory reads, issue 26); ``gu_wdot_k``: its K chunk (0:
      ``dot_block_k``, halved while fewer than 2 chunks would be in flight in ``dot_ring``: 256 at batch 8 and 32
      columns, 128 at batch 16); its pipeline depth follows ``dot_ring`` as the plain path's does (a lever of issue
      26); ``gu_wdot_cols``: 0, or the columns of each ``gu_wdot`` tile where ``prenorm`` applies (at most
      ``gu_wdot``; as ``gate_up_cols``: its other gate and up rows masked, never read; ignored without ``prenorm``),
      e.g. Llama-3.1-8B's 14336 in 755 tiles of 19 instead of 448 of 32 (1.13 waves of 396 programs).
    * ``pn_early``: where ``prenorm`` applies on the ``tl.dot`` path, its tiles load their epilogue's inputs before
      the weight stream (qkv, gate/up: the rows' partial sums of squares; o_proj / down_proj: their residual columns
      and norm weights; :mod:`~.tiles_batch`): those are ready when the tile starts, and loaded after the stream
      their latency ends every tile (a lever of issue 26: prenorm lost 6% at batch 8).
    * ``dot_ksplit``: 0, or the K slices (a power of two, e.g. ``num_warps``) of the ``tl.dot`` path's qkv /
      o_proj / down_proj tiles (plain and prenorm; the prenorm ones load their epilogue's inputs first, as
      ``pn_early``; not the fused-norm ones): each K chunk is multiplied as a batched
      ``[S, BLOCK_N, BLOCK_K / S] x [S, BLOCK_K / S, B]`` ``tl.dot`` (:func:`~.tiles_batch.linear_kdot_tile`), so the
      warps split K instead of all multiplying the whole chunk (a lever of issue 26).
    * ``prenorm_dot``: ``prenorm=None`` also applies on the ``tl.dot`` path (batches from ``dot_from``): no norm
      tasks there but layer 0's (the 8B default since issue 26's batch-8 runs; ``False``: separate norm tasks).

    * ``stream_wait``: ``None`` (auto, the default: 1 on NVIDIA and the simulator, 0 on AMD; :meth:`for_target`),
      0, or K chunks per in-tile wait segment of the streamed prenorm GEMV tiles (the FMA path of
      batch 1: qkv over down_proj's ``hn``, gate/up over o_proj's, down_proj over gate/up's ``act``, o_proj over
      the combine's heads at batch 1): instead of waiting for every producer tile before the tile starts, the tile
      requests its first weight chunk, then waits only for the producers of the first segment's columns, and so
      on per segment (``Dep(inner=True)``, :func:`~.tiles_gemv._gemv_acc`): its weights stream while the
      producer phase's last tiles finish, and the scoreboard wait of the later segments overlaps the stream (a
      lever of issue 26: the critical path's tile of each GEMV phase ran 10-25% longer than the phase's mean
      tile); ``stream_wait_projs``: the projections it applies to (a list of ``qkv``, ``o``, ``gate_up``,
      ``down`` separated by ``,`` or ``+``; default ``gate_up``: the other three lost as much as they gained on one
      H200, ``bench/results/h200-2026-11-27-mk8.md``); ``stream_wait_exact``: each segment's wait at its own first chunk and
      the activations loaded by ``dl.ld`` outside the software pipeline (only weights in it: the first chunks are
      requested before any wait), instead of pipelined activations and waits ``stream_stages`` chunks ahead;
      ``stream_wait_load``: those waits poll with acquire loads and no fence (``dl.wait_deps(acquire="load")``: the
      fence, ``MEMBAR.ALL.GPU``, may wait for the weight copies in flight; the default: with ``False``, relaxed
      polls and the fence, the in-loop waits cost 4-11%).  NVIDIA-only: AMD's stream pipeliner cannot predicate
      a wait inside its pipelined loop, so the auto default is 0 there and an explicit ``stream_wait > 0`` is an
      error before compiling for ``gfx*`` (:func:`~.model.check_target`).
    * ``wait_acquire``: ``"fence"`` or ``"load"``: how the megakernel's waits before each tile acquire on NVIDIA
      (``Megakernel(wait_acquire=...)``, ``dl.wait_deps(acquire=...)``: relaxed polls and one fence, or acquire-load
      polls and no fence; a lever of issue 26: ``"load"`` by default since 2026-11-27, -2.5% at batch 1 and
      -2.3% to -3.3% at batch 8 on one H200, ``bench/results/h200-2026-11-27-mk8.md``; AMD and the simulator wait
      the same way either way).
    * ``noinline_branches``: each task kind's tile a called (``noinline``) function in the megakernel instead of
      inlined into its item loop (``TaskGraph.compile(noinline_branches=True)``).  Inlined, LLVM hoists what each
      kind computes before its loops out of the item loop and holds it across every other kind: the Qwen3-8B whole
      step (head and sampler included) spills 276 B per thread under Triton 3.6 at the 168-register cap, with
      reloads inside the GEMV K loops, the decoder alone 152-248 B at batches 2-16; called, 0-8 B
      (``python bench/megakernel_regs.py --levers inline,noinline --batch 1 --model qwen3-8b``).  ``None`` (the
      default) is auto: on for NVIDIA and the simulator, off for AMD (not measured there; :meth:`for_target`).
      Measured on one H100, 2026-12-07 (``bench/results/h100-2026-12-07g-noinline/``), same GPU call: whole step
      batch 1 1.304x -> 1.193x its HBM limit, batch 16 1.332x -> 1.246x; decoder alone batch 1 / 8 / 16
      1.19x / 1.23x / 1.33x -> 1.18x / 1.23x / 1.26x.

    Attention levers (issue 26, batch 8 at context 4096; :meth:`attn_split_for`):

    * ``attn_stages``: 0, or the software pipeline depth (``tl.range(num_stages=...)``, >= 2) of each attention
      tile's loop over ``attn_block`` positions (:func:`~.tiles.attn_split_pipe_tile`: K / V blocks copied into
      shared memory ahead, ``(attn_stages) x 2 x attn_block x head_dim`` bf16 of it);
    * ``attn_tiles``: 0 (splits of ``attn_split`` positions), or about how many attention tiles a layer should
      have: the split length is chosen per batch and context so that ``batch x kv heads x splits`` is at most
      about this (e.g. the megakernel's programs: one wave of long tiles instead of several waves of short ones,
      and fewer partials to combine);
    * ``attn_prefetch_v``: the attention tile loads the next block's V rows into registers while it reduces the
      current block (:func:`~.tiles.attn_split_pipe_tile`; Triton 3.6 pipelines only K into shared memory);
    * ``attn_prefetch_o``: each attention tile asks L2 for its share of the layer's o_proj weight rows before its
      dependency wait (``register_task(prefetch=...)``, ``dl.prefetch_l2``; the rows split evenly over the layer's
      attention tiles): at batch 1 the rope -> attention -> combine chain is latency-bound and leaves HBM idle,
      and o_proj's weights (32 MB a layer for Qwen3-8B) fit in L2 until its tiles read them;
    * ``attn_fuse_rope``: no rope stage: each attention tile norms and rotates its q heads in registers and the
      split holding the new position appends k and v (:func:`~.tiles.attn_rope_split_tile`; one stage fewer per
      layer, the attention tiles wait on the QKV tiles of their group);
    * ``rope_group``: one q/k-norm + RoPE tile per (sequence, kv head), doing its ``G + 2`` heads
      (:func:`~.tiles.qk_norm_rope_group_tile`) instead of one tile per head;
    * ``comb_group``: one combine tile per (sequence, kv head), combining its ``G`` q heads
      (:func:`~.tiles.attn_combine_group_tile`) instead of one tile per q head.
    """
    gemv_block_n: int = 32
    gemv_block_k: int = 512
    gemv_dot: Optional[bool] = None
    dot_block_n: int = 0
    dot_block_k: int = 256
    dot_stream: bool = False
    gemv_stream: bool = False
    stream_stages: int = 3
    qkv_block_n: int = 0
    o_block_n: int = 0
    gate_up_block_n: int = 0
    down_block_n: int = 0
    qkv_block_k: int = 0
    o_block_k: int = 0
    gate_up_block_k: int = 0
    down_block_k: int = 0
    norm_block: int = 1024
    attn_split: int = 128
    attn_block: int = 64
    comm_block: int = 1024
    fuse_norm: Optional[bool] = None
    num_warps: int = 4
    prefetch_k: int = 0
    prefetch_projs: str = "qkv,o,gate_up,down"
    max_regs: int = 0
    down_split_k: int = 1
    programs_per_sm: int = 0
    dot_from: int = 3
    fuse_upto: int = 2
    direct_tp1: bool = False
    dot_pad: int = 16
    dot_ring: int = 0
    dot_ring_small: int = 0
    attn_stages: int = 0
    attn_tiles: int = 0
    rope_group: bool = False
    comb_group: bool = False
    attn_prefetch_v: bool = False
    attn_prefetch_o: bool = False
    attn_fuse_rope: bool = False
    fold_resid: bool = False
    prenorm: Optional[bool] = False
    dot_gate_up_block_n: int = 0
    o_cols: int = 0
    down_cols: int = 0
    gate_up_cols: int = 0
    gu_wdot: int = 0
    gu_wdot_k: int = 0
    gu_wdot_cols: int = 0
    pn_early: bool = False
    dot_ksplit: int = 0
    prenorm_dot: bool = False
    stream_wait: Optional[int] = None
    stream_wait_projs: str = "gate_up"
    stream_wait_exact: bool = False
    stream_wait_load: bool = True
    wait_acquire: str = "load"
    noinline_branches: Optional[bool] = None

    def attn_split_for(self, max_ctx: int, rows: int = 1) -> int:
        """KV positions per flash-decoding tile for a block table of ``max_ctx`` positions and ``rows`` (sequences
        x kv heads per rank) attention rows: ``attn_split``, or with ``attn_tiles`` the multiple of ``attn_block``
        that splits ``max_ctx`` into at most ``max(1, attn_tiles // rows)`` parts."""
        if not self.attn_tiles:
            return self.attn_split
        parts = max(1, self.attn_tiles // max(1, rows))
        return max(1, cdiv(cdiv(max_ctx, parts), self.attn_block)) * self.attn_block

    def block_n(self, proj: str, dot: bool = False) -> int:
        """Output columns per tile of projection ``proj`` (``qkv``, ``o``, ``gate_up``, ``down``); ``dot``: of the
        ``tl.dot`` path (``dot_gate_up_block_n`` for gate/up, else ``dot_block_n``, when set)."""
        if dot and proj == "gate_up" and self.dot_gate_up_block_n:
            return self.dot_gate_up_block_n
        if dot and self.dot_block_n:
            return self.dot_block_n
        return getattr(self, f"{proj}_block_n") or self.gemv_block_n

    def block_k(self, proj: str, dot: bool = False) -> int:
        """K elements per chunk of projection ``proj``; ``dot``: of the ``tl.dot`` path (``dot_block_k``)."""
        if dot:
            return self.dot_block_k
        return getattr(self, f"{proj}_block_k") or self.gemv_block_k

    def dot_for(self, batch: int) -> bool:
        """Whether the GEMV tiles use ``tl.dot`` at this batch size."""
        return batch >= self.dot_from if self.gemv_dot is None else bool(self.gemv_dot)

    def fuse_for(self, batch: int) -> bool:
        """Whether the QKV and gate/up tiles compute the RMSNorm themselves at this batch size."""
        return batch <= self.fuse_upto if self.fuse_norm is None else bool(self.fuse_norm)

    def cols(self, proj: str, dot: bool = False) -> int:
        """Output columns per tile of o_proj / down_proj / gate/up under ``prenorm`` (``o_cols`` / ``down_cols`` /
        ``gate_up_cols``, else the tile width; ``dot``: of the ``tl.dot`` path, where gate/up's ``gu_wdot`` tiles
        hold ``gu_wdot_cols``, else ``gu_wdot``, and ``gate_up_cols`` is ignored)."""
        if dot and proj == "gate_up" and self.gu_wdot:
            c, bn, what = self.gu_wdot_cols, self.gu_wdot, "gu_wdot_cols"
        else:
            c, bn, what = getattr(self, f"{proj}_cols", 0) or 0, self.block_n(proj, dot), f"{proj}_cols"
        if c > bn:
            raise DitronError(f"TileConfig.{what}={c}: more than the {proj} tile width {bn}"
                              f"{' of the tl.dot path' if dot else ''} (a masked tile holds at most its rows)")
        return c or bn

    def prenorm_for(self, batch: int) -> bool:
        """Whether o_proj / down_proj write the next norm's input at this batch size (one rank, ``direct_tp1``)."""
        if self.prenorm is None:            # auto: where the norms would be fused (prenorm_dot: and on the tl.dot
            # path), and not with split-K
            return (batch <= self.fuse_upto or (self.prenorm_dot and self.dot_for(batch))) and self.down_split_k == 1
        return bool(self.prenorm)

    def wait_projs(self) -> list:
        """``stream_wait_projs`` as a list (separated by ``,`` or ``+``)."""
        return _projs(self.stream_wait_projs)

    def prefetch_for(self, proj: str) -> int:
        """``prefetch_k`` for projection ``proj`` (0 where ``prefetch_projs`` leaves it out)."""
        return self.prefetch_k if proj in _projs(self.prefetch_projs) else 0

    def wait_segment(self) -> int:
        """``stream_wait`` with the auto default (``None``) resolved as on NVIDIA and the simulator: 1 (:meth:`for_target`
        resolves it to 0 for AMD)."""
        return 1 if self.stream_wait is None else self.stream_wait

    def for_target(self, target: str) -> "TileConfig":
        """This config for compiling to ``target`` (``"sm_90a"``, ``"gfx942"``, ``"gfx"``: any AMD target; anything
        else is NVIDIA or the simulator): the auto ``stream_wait`` becomes 0 on AMD, where the in-loop waits cannot be
        pipelined (an explicit ``stream_wait > 0`` there is an error); the auto ``noinline_branches`` becomes True on
        NVIDIA / the simulator and False on AMD."""
        amd = str(target).startswith("gfx")
        if amd and self.stream_wait:
            raise DitronError(f"TileConfig.stream_wait={self.stream_wait}: the in-loop scoreboard waits are "
                              f"NVIDIA-only (on {target} Triton's stream pipeliner cannot predicate them); use "
                              "stream_wait=0 or None (auto: off on AMD)")
        over = {}
        if amd and self.stream_wait is None:
            over["stream_wait"] = 0
        if self.noinline_branches is None:
            over["noinline_branches"] = not amd
        return dataclasses.replace(self, **over) if over else self

    def ring_for(self, batch: int) -> int:
        """The streamed ``tl.dot`` path's ring budget at this batch size (``dot_ring_small`` up to 8, else
        ``dot_ring``; 0: depth ``stream_stages``)."""
        return self.dot_ring_small if self.dot_ring_small and batch <= 8 else self.dot_ring

    def stream_for(self, batch: int) -> int:
        """The GEMV tiles' ``STREAM`` constexpr at this batch size: 0 (weights double-buffered in registers) or the
        software pipeline's ``num_stages`` (weights streamed by ``cp.async`` into shared memory)."""
        on = self.dot_stream if self.dot_for(batch) else self.gemv_stream
        return self.stream_stages if on else 0

    def __post_init__(self):
        for name in ("gemv_block_n", "gemv_block_k", "dot_block_k", "norm_block", "attn_block", "comm_block",
                     "dot_pad"):
            v = getattr(self, name)
            if v <= 0 or v & (v - 1):
                raise DitronError(f"TileConfig.{name}={v}: must be a power of two")
        for name in ("dot_block_n", "qkv_block_n", "o_block_n", "gate_up_block_n", "down_block_n", "qkv_block_k",
                     "o_block_k", "gate_up_block_k", "down_block_k", "dot_gate_up_block_n"):
            v = getattr(self, name)
            if v < 0 or v & (v - 1):
                raise DitronError(f"TileConfig.{name}={v}: must be 0 (gemv_block_{name[-1]}) or a power of two")
        if self.prefetch_k and (self.prefetch_k < 64 or self.prefetch_k & (self.prefetch_k - 1)):
            raise DitronError(f"TileConfig.prefetch_k={self.prefetch_k}: must be 0 (off) or a power of two >= 64 "
                              "(one prefetch per 128-byte line of bf16)")
        if not 0 <= self.programs_per_sm <= 32:
            raise DitronError(f"TileConfig.programs_per_sm={self.programs_per_sm}: must be 0 (the megakernel's "
                              "default) or 1..32")
        if self.dot_from < 1 or self.fuse_upto < 0:
            raise DitronError(f"TileConfig: dot_from={self.dot_from} must be >= 1 and fuse_upto={self.fuse_upto} "
                              ">= 0 (batch sizes)")
        for name in ("o_cols", "down_cols", "gate_up_cols", "gu_wdot_cols"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise DitronError(f"TileConfig.{name}={v!r}: must be an int >= 0 (0: the tile width)")
        if self.dot_ksplit < 0 or self.dot_ksplit & (self.dot_ksplit - 1):
            raise DitronError(f"TileConfig.dot_ksplit={self.dot_ksplit}: must be 0 (off) or a power of two")
        for name in ("gu_wdot", "gu_wdot_k"):
            v = getattr(self, name)
            if v < 0 or v & (v - 1) or v == 1 or (name == "gu_wdot" and 0 < v < 8):
                raise DitronError(f"TileConfig.{name}={v}: must be 0 (off / dot_block_k) or a power of two"
                                  + (" >= 8 (2 x gu_wdot rows: 16 per MMA)" if name == "gu_wdot" else " >= 2"))
        if self.stream_wait is not None and (not isinstance(self.stream_wait, int) or self.stream_wait < 0):
            raise DitronError(f"TileConfig.stream_wait={self.stream_wait!r}: must be None (auto: 1 on NVIDIA, 0 on "
                              "AMD), 0 (off) or K chunks per segment")
        for name in ("stream_wait_projs", "prefetch_projs"):
            bad = [p for p in _projs(getattr(self, name)) if p not in ("qkv", "o", "gate_up", "down")]
            if bad:
                raise DitronError(f"TileConfig.{name}={getattr(self, name)!r}: unknown projection(s) {bad} "
                                  "(a comma list of qkv, o, gate_up, down)")
        if self.wait_acquire not in ("fence", "load"):
            raise DitronError(f"TileConfig.wait_acquire={self.wait_acquire!r}: must be 'fence' or 'load'")
        for name in ("dot_ring", "dot_ring_small"):
            if getattr(self, name) < 0:
                raise DitronError(f"TileConfig.{name}={getattr(self, name)}: must be 0 (stream_stages"
                                  f"{'' if name == 'dot_ring' else ' / dot_ring'}) or a byte count")
        if (self.fold_resid or self.prenorm) and self.down_split_k > 1:
            raise DitronError("TileConfig: fold_resid / prenorm fold the residual add into the down projection's "
                              f"tiles; with down_split_k={self.down_split_k} those are K slices (use one or the other)")
        if self.down_split_k < 1:
            raise DitronError(f"TileConfig.down_split_k={self.down_split_k}: must be >= 1 (1: no split)")
        if self.max_regs and not 24 <= self.max_regs <= 255:
            raise DitronError(f"TileConfig.max_regs={self.max_regs}: must be 0 (ptxas chooses) or 24..255")
        if self.stream_stages < 2:
            raise DitronError(f"TileConfig.stream_stages={self.stream_stages}: must be >= 2 (one chunk in use, at "
                              "least one in flight)")
        if self.attn_stages and not 2 <= self.attn_stages <= 8:
            raise DitronError(f"TileConfig.attn_stages={self.attn_stages}: must be 0 (a plain loop) or 2..8 "
                              "(software pipeline depth)")
        if self.attn_tiles < 0:
            raise DitronError(f"TileConfig.attn_tiles={self.attn_tiles}: must be 0 (attn_split) or a tile count")
        if self.attn_split <= 0 or self.attn_split % self.attn_block:
            raise DitronError(f"TileConfig.attn_split={self.attn_split}: must be a positive multiple of "
                              f"attn_block={self.attn_block}")


@dataclass(frozen=True)
class DecoderConfig:
    hidden: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    n_layers: int
    rms_eps: float = 1e-6
    rope_theta: float = 1e6
    tiles: TileConfig = TileConfig()
    #: per-head RMSNorm of q and k before RoPE (Qwen3); ``False``: none (Llama)
    qk_norm: bool = True
    #: RoPE scaling as a hashable tuple: ``()`` (none), ``("linear", factor)`` or ``("llama3", factor,
    #: low_freq_factor, high_freq_factor, original_max_position_embeddings)`` (:meth:`inv_freq`)
    rope_scaling: tuple = ()
    #: vocabulary size (0: no embedding / LM head, the decoder stack only; ``kernels/decoder/hf.py`` sets it)
    vocab: int = 0

    def inv_freq(self):
        """The RoPE inverse frequencies ``[head_dim / 2]`` float32 (the table the rope tiles read), computed as
        Hugging Face's ``rope_init_fn`` does for the rope types ``default``, ``linear`` and ``llama3``."""
        import math

        import torch
        D = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        rs = tuple(self.rope_scaling)
        if not rs:
            return inv
        if rs[0] == "linear":
            return inv / float(rs[1])
        if rs[0] == "llama3":
            factor, low, high, old = (float(v) for v in rs[1:5])
            low_wl, high_wl = old / low, old / high
            wavelen = 2 * math.pi / inv
            out = torch.where(wavelen > low_wl, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * out / factor + smooth * out
            medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
            return torch.where(medium, smoothed, out)
        raise DitronError(f"DecoderConfig.rope_scaling={rs!r}: unknown RoPE scaling (supported: (), ('linear', "
                          "factor), ('llama3', factor, low_freq_factor, high_freq_factor, original_max_positions))")

    def __post_init__(self):
        if self.rope_scaling and self.rope_scaling[0] not in ("linear", "llama3"):
            raise DitronError(f"DecoderConfig.rope_scaling={self.rope_scaling!r}: supported RoPE scalings are "
                              "'linear' and 'llama3'")
        for name in ("hidden", "n_q_heads", "n_kv_heads", "head_dim", "intermediate", "n_layers"):
            if getattr(self, name) <= 0:
                raise DitronError(f"DecoderConfig.{name}={getattr(self, name)}: must be positive")
        if self.n_q_heads % self.n_kv_heads:
            raise DitronError(f"DecoderConfig: n_q_heads={self.n_q_heads} is not a multiple of "
                              f"n_kv_heads={self.n_kv_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise DitronError(f"DecoderConfig: head_dim={self.head_dim} must be even (RoPE rotates halves)")

    @property
    def group(self) -> int:
        """q heads per kv head."""
        return self.n_q_heads // self.n_kv_heads

    def with_tiles(self, **kw) -> "DecoderConfig":
        return dataclasses.replace(self, tiles=dataclasses.replace(self.tiles, **kw))

    def for_target(self, target: str) -> "DecoderConfig":
        """This config for compiling to ``target`` (:meth:`TileConfig.for_target`)."""
        tiles = self.tiles.for_target(target)
        return self if tiles is self.tiles else dataclasses.replace(self, tiles=tiles)

    def with_(self, **kw) -> "DecoderConfig":
        return dataclasses.replace(self, **kw)

    def shard(self, world_size: int) -> "Shard":
        W = int(world_size)
        bad = [f"{name}={getattr(self, name)}" for name in ("n_q_heads", "n_kv_heads", "intermediate")
               if W <= 0 or getattr(self, name) % W]
        if bad:
            raise DitronError(f"DecoderConfig: tensor parallelism over {W} ranks needs n_q_heads, n_kv_heads and "
                              f"intermediate divisible by {W}; not: {', '.join(bad)}")
        return Shard(self, W, self.n_q_heads // W, self.n_kv_heads // W, self.intermediate // W)


@dataclass(frozen=True)
class Shard:
    """This rank's part of the model under tensor parallelism over ``world_size`` ranks."""
    cfg: DecoderConfig
    world_size: int
    q_heads: int            # q heads per rank
    kv_heads: int           # kv heads per rank
    inter: int              # intermediate columns per rank

    @property
    def qkv_cols(self) -> int:
        """Output columns of this rank's QKV projection: its q heads, then k heads, then v heads."""
        return (self.q_heads + 2 * self.kv_heads) * self.cfg.head_dim

    @property
    def attn_cols(self) -> int:
        return self.q_heads * self.cfg.head_dim

    def attn_split(self, max_ctx: int, batch: int = 1) -> int:
        """KV positions per flash-decoding tile (:meth:`TileConfig.attn_split_for` of this rank's kv heads)."""
        return self.cfg.tiles.attn_split_for(max_ctx, batch * self.kv_heads)

    def splits(self, max_ctx: int, batch: int = 1) -> int:
        """Flash-decoding splits of a KV cache of ``max_ctx`` positions (per sequence and kv head)."""
        return cdiv(max_ctx, self.attn_split(max_ctx, batch))

    def weight_bytes(self) -> int:
        """bf16 weight bytes one decoder step reads on this rank (norm weights included)."""
        c = self.cfg
        per_layer = (self.qkv_cols * c.hidden + c.hidden * self.attn_cols + 3 * self.inter * c.hidden
                     + 2 * c.head_dim + 2 * c.hidden)
        return 2 * (c.n_layers * per_layer + c.hidden)

    def kv_bytes(self, ctx: int, batch: int) -> int:
        """bf16 KV-cache bytes one step reads on this rank at context ``ctx`` (all layers, K and V)."""
        return 2 * 2 * self.cfg.n_layers * batch * self.kv_heads * ctx * self.cfg.head_dim


#: tile sizes measured best for Qwen3-8B at batch 1 on one H200 (bench/results/h200x2.md section 7): 16 x 1024
#: weight chunks, gate/up 8 rows x 1024 (it streams gate and up: the same registers); issue 26 (one H100,
#: bench/megakernel_levers.sh, 2026-11-27): at batch 1 the weights stream through shared memory
#: (gemv_stream: 168 registers instead of 255) and 3 programs per SM fit: a step at batch 1 took 6234 / 6411 us at
#: context 512 / 4096 against 6696 / 6959 with the previous defaults.  From batch 2 on (issue 26, H200 of
#: 2026-11-27: batch 2 1.32x batch 1 on the FMA path at 239 registers, batch 8 1.77x on the register-buffered
#: tl.dot path at 233): the tl.dot path streams 16 x 512 chunks through shared memory under a 168-register cap
#: (no spills, 3 programs per SM; bench/megakernel_regs.py) with separate RMSNorm tasks; on one rank no all-reduce
#: tasks (direct_tp1).  Batch 1 (H200, 2026-11-27, bench/megakernel_levers.sh levers base1 / prenorm / pngu32):
#: o_proj / down_proj write the next norm's input (prenorm: 4959 -> 4694 us at context 512, 5132 -> 4793 at 4096)
#: and gate/up tiles of 32 x 256 (384 tiles, one per program: 4556 us with prenorm); the batch path keeps its 8-wide
#: gate/up tiles (dot_gate_up_block_n).  Attention (issue 26 at context 4096, H200 of 2026-11-27,
#: bench/results/h200-2026-11-27-attn5.md): the flash-decoding split follows batch and context so that a layer has
#: at most ~396 attention tiles (3 programs on 132 SMs, H100 SXM and H200: one wave; attn_tiles): batch 8 at context
#: 4096 took 6715 us against 7413 with splits of 128 positions (2112 tiles, 33 partials per head to combine), batch 1
#: unchanged (5115 / 5098).  The batch path (issue 26, H200 of 2026-11-27, bench/results/h200-2026-11-27-b8.md): the
#: tl.dot GEMVs with the weight rows on the MMA's M side -- gate/up 32 x 256 with gate and up rows stacked (gu_wdot),
#: qkv / o / down with each K chunk split over the 4 warps (dot_ksplit) -- and prenorm on the tl.dot path too
#: (prenorm_dot: no norm tasks): batch 8 took 4863 / 5806 us at context 512 / 4096 against 5716 / 6681 (1.09x / 1.25x
#: batch 1 instead of 1.28x / 1.44x).  o_proj's first 1024 weight columns asked of L2 before its wait, during the
#: latency-bound attention chain (prefetch_k / prefetch_projs="o"; issue 26, one H200 of 2026-11-28,
#: bench/results/2026-11-28-megakernel-o-prefetch/): batch 1 -0.9% to -1.2% at context 4096, within 0.4% at 512 and at
#: batch 8 (the whole o_proj row set, 33.5 MB a layer, had been +4.8%: it queued in front of the chain)
TILES_8B = TileConfig(gemv_block_n=16, gemv_block_k=1024, gate_up_block_n=32, gate_up_block_k=256, gemv_stream=True,
                      programs_per_sm=3, dot_from=2, fuse_upto=1, dot_stream=True, dot_block_k=512, max_regs=168,
                      direct_tp1=True, dot_pad=8, dot_ring=73728, dot_ring_small=49152, prenorm=None,
                      dot_gate_up_block_n=8, attn_tiles=396, gu_wdot=32, dot_ksplit=4, prenorm_dot=True,
                      prefetch_k=1024, prefetch_projs="o")


def qwen3_8b(**kw) -> DecoderConfig:
    """Qwen3-8B's decoder shapes (random weights; no embedding / LM head)."""
    base = dict(hidden=4096, n_q_heads=32, n_kv_heads=8, head_dim=128, intermediate=12288, n_layers=36,
                rms_eps=1e-6, rope_theta=1e6, tiles=TILES_8B)
    base.update(kw)
    return DecoderConfig(**base)


def tiny(**kw) -> DecoderConfig:
    """2 layers, small and odd-ish dims (the intermediate per rank is not a multiple of the GEMV's K chunk) for
    the simulator."""
    base = dict(hidden=64, n_q_heads=4, n_kv_heads=2, head_dim=16, intermediate=96, n_layers=2, rms_eps=1e-6,
                rope_theta=1e6, tiles=TileConfig(gemv_block_n=16, gemv_block_k=32, norm_block=32, attn_split=32,
                                                 attn_block=16, comm_block=32, num_warps=4))
    base.update(kw)
    return DecoderConfig(**base)
