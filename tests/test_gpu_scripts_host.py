"""Host logic of the GPU scripts under tests/gpu/ that decides what a GPU run checks (no GPU; at most a tiny random
transformers model on the CPU): the prompt choice and the LM-head plant of tests/gpu/hf_8b_equality.py (issue 53)."""
import importlib.util
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tests", "gpu", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _logits(tokens, gap, V=16, top=10.0):
    """[steps, V] logits whose argmax per step is ``tokens[i]``, the runner-up ``gap`` (absolute) below it."""
    lg = torch.zeros(len(tokens), V)
    for i, t in enumerate(tokens):
        lg[i, t] = top
        lg[i, (t + 1) % V] = top - gap
    return lg


def test_hf_8b_equality_choose_takes_the_first_prompt_float32_agrees_with():
    m = _script("hf_8b_equality")
    toks_a, toks_b = [1, 2, 3, 4], [5, 6, 7, 8]
    bf_a, bf_b = _logits(toks_a, 1.0), _logits(toks_b, 1.0)
    # length 24: candidate a's float32 run picks another token at step 2; b agrees with a clear gap
    e32_a = _logits([1, 2, 9, 4], 1.0)
    e32_b = _logits(toks_b, 0.5)
    found = [[([0] * 24, toks_a, bf_a), ([1] * 24, toks_b, bf_b)]]
    prompts, refs, refs32 = m.choose(found, [e32_a, e32_b], min_rel=0.03)
    assert prompts == [[1] * 24] and refs == [(toks_b, bf_b)] and refs32[0] is e32_b
    # float32 agrees but with a gap under min_rel / 2 of the largest logit (0.1 / 10 = 0.01 < 0.015): no single
    # right token there -- nothing to hold an implementation to
    out = m.choose([[([1] * 24, toks_b, bf_b)]], [_logits(toks_b, 0.1)], min_rel=0.03)
    assert isinstance(out, str) and "no candidate that float32 agrees with" in out and "(24, 0.01, True)" in out
    # every length needs one: the second length's only candidate disagrees
    found2 = [[([1] * 24, toks_b, bf_b)], [([2] * 9, toks_a, bf_a)]]
    out = m.choose(found2, [e32_b, e32_a], min_rel=0.03)
    assert isinstance(out, str) and "(9, " in out


def _tiny_llama(tied=False):
    from ditron.models import import_transformers
    try:
        tf = import_transformers()
    except ImportError:
        pytest.skip("transformers is not installed")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=256, tie_word_embeddings=tied, bos_token_id=1,
                         eos_token_id=2)
    return tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def test_hf_8b_equality_plant_gives_transformers_own_distinct_tokens():
    mod = _script("hf_8b_equality")
    m = _tiny_llama()
    head0 = m.get_output_embeddings().weight.detach().clone()
    found = mod.plant(m, 256, steps=8, lengths=[6, 3], device="cpu")
    assert isinstance(found, list) and [len(hits) for hits in found] == [1, 1], found
    planted = set()
    for n, [(p, toks, lg)] in zip([6, 3], found):
        assert len(p) == n and lg.shape == (8, 256)
        with torch.no_grad():
            r = m.generate(torch.tensor([p]), max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0)
        # the references are transformers' own greedy run, not the targets it was fitted to
        assert toks == r.sequences[0, n:].tolist()
        assert torch.equal(lg, torch.stack([x[0].float() for x in r.logits]))
        assert len(set(toks)) == 8 and 2 not in toks and 1 not in toks
        planted |= set(toks)
    assert len(planted) == 16
    head = m.get_output_embeddings().weight
    others = torch.tensor(sorted(set(range(256)) - planted))
    assert head.dtype == torch.bfloat16 and torch.equal(head[others], head0[others])
    assert not torch.equal(head[sorted(planted)], head0[sorted(planted)])
    # back in bfloat16 after the float32 forward, but RoPE's float32 inv_freq not rounded with it
    assert all(q.dtype == torch.bfloat16 for q in m.parameters())
    assert m.model.rotary_emb.inv_freq.dtype == torch.float32


def test_hf_8b_equality_plant_refuses_tied_embeddings():
    mod = _script("hf_8b_equality")
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        mod.plant(_tiny_llama(tied=True), 256, steps=8, lengths=[6, 3], device="cpu")
