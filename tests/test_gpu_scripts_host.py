"""Host logic of the GPU scripts under tests/gpu/ that decides what a GPU run checks (no GPU, no model): the prompt
choice of tests/gpu/hf_8b_equality.py (issue 53)."""
import importlib.util
import os
import sys

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
