"""Test bodies (run on every rank) for issue 53: Hugging Face checkpoints through the decode megakernel
(kernels/decoder/hf.py, generate.py); the transformers side is in tests/test_decoder_hf.py."""
import torch


def generate(world, path, prompts, steps, sampling=None, max_top_k=64):
    """This rank's :class:`Generator` over the checkpoint at ``path``: the generated tokens of every prompt (greedy
    unless ``sampling``) and this rank's logits of every step with their first token id."""
    from ditron.kernels.decoder.generate import Generator
    gen = Generator(path, world=world, max_batch=len(prompts), max_ctx=max(len(p) for p in prompts) + steps + 1,
                    num_programs=4, max_top_k=max_top_k)
    out, logits = gen.generate(prompts, max_new_tokens=steps, stop_tokens=(), return_logits=True, **(sampling or {}))
    return out, logits.to(torch.float32), gen.head.v_off, gen.head.n_valid
