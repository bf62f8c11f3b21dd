"""A Qwen3-like tensor-parallel decoder step as one persistent megakernel
(issue 13 part B; see docs/megakernel.md, "The Qwen3-like decoder").

* :mod:`.config` -- shapes (``qwen3_8b()``, ``tiny()``), tile sizes, the TP split;
* :mod:`.tiles` -- the tile functions (one per task kind);
* :mod:`.weights` -- seeded random weights and KV cache, per rank shard of one global set;
* :mod:`.reference` -- the same step in plain torch (eager and CUDA graph), TP with ``torch.distributed``;
* :mod:`.model` -- the step as a task list, the megakernel built from it, and a one-launch-per-task runner.
"""
from .config import DecoderConfig, Shard, TileConfig, qwen3_8b, tiny  # noqa: F401
