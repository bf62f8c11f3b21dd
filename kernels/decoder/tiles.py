"""Tile functions of the Qwen3-like decoder step (``@triton.jit``; the first
parameter is the tile index, see docs/megakernel.md), in three modules: :mod:`.tiles_gemv` (the weight-streaming
GEMV, RMSNorm and residual tiles), :mod:`.tiles_batch` (the batch path's GEMV variants) and :mod:`.tiles_attention`
(q/k-norm + RoPE, flash-decoding, combine); this module names them all.  Each one is a task
kind of the megakernel (``kernels/decoder/model.py``); the ``*_prefetch``
functions are the GEMV tasks' prefetch hooks (run before the dependency wait).

Conventions (all buffers contiguous, row-major):

* activations are ``[B, ...]`` (batch rows of the decode step); bf16 between
  ops, float32 for the residual stream, the row-parallel partial sums and the
  flash-decoding partials; every tile computes in float32;
* per-layer weights are stacked on a leading layer dimension and indexed by
  the ``layer`` scalar (an int carried in the work queue); layer offsets are
  computed in int64 (a stacked weight can exceed 2**31 elements);
* the KV cache is paged (``kernels/decoder/weights.py``, ``PagedKV``): ``[L, num_pages, PAGE, kv_heads,
  head_dim]`` and a block table ``[B, max_pages]`` int32; ``seq_ptr`` is a device int32 ``[B]`` holding each
  sequence's number of valid positions (its new token's position is ``seq[b] - 1``), so CUDA-graph replays
  advance it;
* every size may be a non-multiple of its block: loads and stores are masked;
* the GEMV / RMSNorm row sizes ``N`` and ``K`` are ``tl.constexpr`` (each projection is its own branch of the
  megakernel anyway): the compiler then knows the alignment of every row and emits 16-byte vector loads.
"""
from __future__ import annotations

from .tiles_gemv import (  # noqa: F401
    advance_tile, add_rmsnorm_tile, add_resid_tile, linear_tile, linear_resid_tile, linear_resnorm_tile,
    linear_rstd_tile, gate_up_rstd_tile, linear_split_tile, sum_splits_tile, rms_linear_tile, gate_up_tile,
    rms_gate_up_tile, linear_prefetch, linear_cols_prefetch, gate_up_prefetch, gate_up_cols_prefetch,
    o_weight_prefetch)
from .tiles_batch import (  # noqa: F401
    gate_up_wdot_tile, gate_up_rstd_wdot_tile, linear_rstd_early_tile, gate_up_rstd_early_tile,
    gate_up_rstd_wdot_early_tile, linear_resnorm_early_tile, linear_kdot_tile,
    linear_rstd_kdot_tile, linear_resnorm_kdot_tile)
from .tiles_attention import (  # noqa: F401
    qk_norm_rope_tile, qk_norm_rope_group_tile, attn_split_tile, attn_split_pipe_tile, attn_rope_split_tile,
    attn_combine_tile, attn_combine_group_tile)
