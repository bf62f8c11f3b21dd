"""Hugging Face models through the decode megakernel (issue 53): a Qwen3 or Llama (3.x) model directory in, token
ids out.

    import ditron, ditron.models
    world = ditron.init()                                  # under torchrun: this rank's GPU; TP = the world size
    gen = ditron.models.from_pretrained("/models/Qwen3-8B", world=world, max_batch=8, max_ctx=4096)
    out = gen.generate([[151644, 872, 198], [9707, 11]], max_new_tokens=64)            # greedy
    out = gen.generate(prompts, max_new_tokens=64, temperature=0.7, top_k=20, top_p=0.8, seed=1)

A model directory is what ``save_pretrained`` writes (``config.json``, ``model.safetensors`` or sharded
``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``, optionally ``generation_config.json`` for
the stop tokens); a ``transformers`` model object works too.  Token ids only: tokenize with the model's tokenizer.
What the megakernel does per step, the sampler's semantics and the limits: docs/megakernel.md, "Hugging Face
models".
"""
from __future__ import annotations

from .kernels.decoder.generate import Generator, prefill_kv, reference_logits
from .kernels.decoder.hf import SUPPORTED, Checkpoint, config_from_hf, load

__all__ = ["Checkpoint", "Generator", "SUPPORTED", "config_from_hf", "from_pretrained", "import_transformers", "load",
           "prefill_kv", "reference_logits"]


def from_pretrained(source, world=None, *, max_batch: int = 1, max_ctx: int = 2048, max_top_k: int = 64,
                    **kw) -> Generator:
    """This rank's :class:`Generator` of a Hugging Face model (``source``: a model directory, a ``transformers``
    model or a :class:`Checkpoint` from :func:`load`), tensor-parallel over ``world`` (default: one rank on the
    CPU / simulator; ``ditron.init()``'s world on GPUs).  ``max_batch`` sequences of up to ``max_ctx`` positions
    (prompt + new tokens) each; ``max_top_k``: the sampler's candidates (the top-k cap, a power of two).  Other
    keywords: :class:`Generator`'s (``tiles``, ``num_programs``, ``cuda_graph``, ``page_size``, ``scheduler``).
    The config is checked (architecture, biases, RoPE type, head counts divisible by the world size) before any
    weight is read or any GPU work."""
    return Generator(source, world=world, max_batch=max_batch, max_ctx=max_ctx, max_top_k=max_top_k, **kw)


def import_transformers():
    """``transformers``, imported so that this repository's top-level ``kernels/`` directory (the zoo, reached as
    ``ditron.kernels``) does not shadow Hugging Face's ``kernels`` package, which transformers 5 imports: with the
    working directory on ``sys.path`` (``python -m``, ``torchrun`` from a checkout) it would.  Raises ImportError
    if transformers is not installed."""
    import importlib
    import os
    import sys
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mod = sys.modules.get("kernels")
    if mod is not None and not os.path.abspath(getattr(mod, "__file__", "") or "").startswith(here + os.sep):
        return importlib.import_module("transformers")        # Hugging Face's kernels is the one imported
    if mod is not None:
        del sys.modules["kernels"]
    # also when transformers itself is imported already (``import transformers`` is lazy: its models import
    # ``kernels`` when first used)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        try:
            importlib.import_module("kernels")
        except ImportError:
            pass
        return importlib.import_module("transformers")
    finally:
        sys.path[:] = saved
