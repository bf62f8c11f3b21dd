"""Issue 53: Hugging Face Qwen3 / Llama checkpoints through the decode megakernel, checked against
``transformers``.  The models are tiny random ones built from configs (nothing is downloaded) and saved to a
temporary directory as ``save_pretrained`` writes them (sharded safetensors); the megakernel runs on simulated
ranks (the whole step in one kernel: embedding gather, layers, final norm, vocab-parallel LM head, sampler).

Token equality: greedy decoding must give exactly the tokens of ``transformers``' ``generate`` for 32 steps.  The
random models are made confident (``initializer_range=0.1``: logits of magnitude ~3, the smallest top-1 / top-2 gap
over the test's steps printed in a failure) so that a near-tie does not decide the test; a wrong layout, a missing
norm, a wrong RoPE table or a wrong vocab shard changes the tokens at once.  Logits: the kernel's bf16 logits against
transformers' within ``0.05 * max|ref| + 0.05`` (the two round differently: bf16 residual stream and RoPE in
transformers, float32 in the kernel)."""
import json
import os

import pytest
import torch

import bodies_decoder_hf as BH
from ditron.errors import DitronError



def _import_transformers():
    """transformers (5.x) imports the ``kernels`` distribution (Hugging Face's kernel hub); under ``python -m pytest``
    the working directory is on ``sys.path`` and this repository's top-level ``kernels/`` directory would shadow it:
    import it with the repository root off the path (ditron reaches its kernels as ``ditron.kernels``)."""
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mod = sys.modules.get("kernels")
    if mod is not None and os.path.dirname(os.path.abspath(getattr(mod, "__file__", "") or "")).startswith(root):
        del sys.modules["kernels"]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != root]
    try:
        try:
            __import__("kernels")
        except ImportError:
            pass
        return pytest.importorskip("transformers")
    finally:
        sys.path[:] = saved


transformers = _import_transformers()

STEPS = 32


def make_model(arch, path, tied, vocab=256, heads=4, kv=2, inter=96, seed=0, shard="60KB", **extra):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config
    torch.manual_seed(seed)
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=inter, num_hidden_layers=2, num_attention_heads=heads,
              num_key_value_heads=kv, head_dim=16, max_position_embeddings=512, tie_word_embeddings=tied,
              initializer_range=0.1, **extra)
    if arch == "qwen3":
        cfg = Qwen3Config(rms_norm_eps=1e-6, rope_theta=1e6, **kw)
    else:       # Llama 3.1's RoPE scaling, with an original context short enough that it changes the frequencies
        cfg = LlamaConfig(rms_norm_eps=1e-5, rope_theta=5e5,
                          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=64), **kw)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    # LM-head rows of log-normal norms (tied: the embedding's): a random model whose greedy choice is rarely a
    # near-tie (with plain Gaussian rows the top-2 gap is under 2% of the logits' range somewhere in most 32-step runs,
    # below the bf16 rounding differences between transformers and the kernel)
    f = torch.exp(torch.randn(vocab, 1, generator=torch.Generator().manual_seed(seed + 1)) * (0.8 if tied else 1.5))
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(f.to(torch.bfloat16))
    if path is not None:
        m.save_pretrained(path, max_shard_size=shard)
    return m


def hf_greedy(m, prompts, steps=STEPS):
    out = []
    for p in prompts:
        r = m.generate(torch.tensor([p]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                       output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        out.append((r.sequences[0, len(p):].tolist(), torch.stack([lg[0].float() for lg in r.logits])))
    return out


def confident_prompts(m, lengths, vocab, min_rel=0.04, min_distinct=4, tries=60, steps=STEPS):
    """Prompts (of these lengths) whose transformers greedy run has, at every step, a top-1 / top-2 logit gap of at
    least ``min_rel`` of the largest logit and at least ``min_distinct`` different tokens: an unambiguous reference.
    Drawn from a seeded generator; fails if none is found (never skips).  Returns (prompts, references)."""
    g = torch.Generator().manual_seed(1234)
    out, refs, seen = [], [], []
    for n in lengths:
        for _ in range(tries):
            p = torch.randint(0, vocab, (n,), generator=g).tolist()
            (tok, lg), = hf_greedy(m, [p], steps)
            top2 = lg.topk(2, -1).values
            rel = ((top2[:, 0] - top2[:, 1]) / lg.abs().amax(-1)).min().item()
            seen.append((round(rel, 3), len(set(tok))))
            if rel >= min_rel and len(set(tok)) >= min_distinct:
                out.append(p)
                refs.append((tok, lg))
                break
        else:
            raise AssertionError(f"no prompt of length {n} with an unambiguous greedy run in {tries} tries "
                                 f"(gap, distinct tokens): {sorted(seen)[-5:]}")
    return out, refs


def check_against_hf(results, refs):
    """``results``: every rank's (tokens, logits [steps, B, V_r], v_off, n_valid)."""
    for b, (ref_tok, ref_lg) in enumerate(refs):
        top2 = ref_lg.topk(2, -1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        for rank, (tok, lg, v0, n) in enumerate(results):
            assert tok[b] == ref_tok, (f"sequence {b} rank {rank}: megakernel {tok[b]} != transformers {ref_tok} "
                                       f"(smallest top-2 logit gap of transformers: {margin:.3g})")
        got = torch.cat([lg[:, b, :n] for tok, lg, v0, n in results], -1)
        assert got.shape == ref_lg.shape, (got.shape, ref_lg.shape)
        err = (got - ref_lg).abs().max().item()
        scale = ref_lg.abs().max().item()
        assert err <= 0.05 * scale + 0.05, f"sequence {b}: logits differ by {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("arch,tied,ranks", [("qwen3", False, 1), ("llama", False, 1), ("llama", False, 2)])
def test_greedy_tokens_equal_transformers(dist_world, tmp_path, arch, tied, ranks):
    m = make_model(arch, tmp_path, tied)
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1, "a sharded checkpoint"
    prompts, refs = confident_prompts(m, (7, 2), 256)        # a ragged batch
    results = dist_world(ranks).run(BH.generate, str(tmp_path), prompts, STEPS)
    check_against_hf(results, refs)


def test_loader_tied_untied_and_rope(tmp_path):
    """The loader on saved sharded checkpoints: tied embeddings give the embedding as LM head, untied the lm_head
    rows; vocab-parallel shards cover the vocabulary (uneven at 3 ranks); Llama 3's RoPE table equals
    transformers'."""
    from ditron.kernels.decoder import hf
    for tied in (True, False):
        d = tmp_path / f"q{tied}"
        m = make_model("qwen3", d, tied, vocab=250, heads=6, kv=3)
        ck = hf.load(str(d))
        assert ck.tied == tied and ck.cfg.qk_norm and ck.cfg.vocab == 250
        lm = m.get_output_embeddings().weight
        rows = []
        for r in range(3):
            w, head = ck.shard(r, 3)
            assert head.lm.shape == (1, 84, 64) and torch.equal(head.embed, m.get_input_embeddings().weight)
            rows.append(head.lm[0, :head.n_valid])
        assert torch.equal(torch.cat(rows), lm)
        assert hf.load(m).cfg == ck.cfg                     # a transformers model object
    m = make_model("llama", tmp_path / "l", False)
    ck = hf.load(str(tmp_path / "l"))
    assert not ck.cfg.qk_norm and ck.cfg.rope_scaling[0] == "llama3"
    torch.testing.assert_close(ck.cfg.inv_freq(), m.model.rotary_emb.inv_freq.float().cpu(), rtol=0, atol=0)


def test_unsupported_configs_fail_before_any_weight(tmp_path):
    from ditron.kernels.decoder import hf
    base = dict(model_type="qwen3", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=96, num_hidden_layers=2, vocab_size=256)
    for bad, what in ((dict(model_type="mistral"), "model_type 'mistral'"), (dict(attention_bias=True), "attention_bias"),
                      (dict(hidden_act="gelu"), "hidden_act"), (dict(use_sliding_window=True), "sliding"),
                      (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "RoPE type 'yarn'")):
        d = tmp_path / what.split()[0].strip("'")
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps({**base, **bad}))      # no weights: the config fails first
        with pytest.raises(DitronError, match=what):
            hf.load(str(d))
    d = tmp_path / "ok"
    make_model("qwen3", d, False)
    ck = hf.load(str(d))
    with pytest.raises(DitronError, match="divisible by 3"):
        ck.shard(0, 3)                                   # 4 q heads, 2 kv heads over 3 ranks
    with pytest.raises(DitronError, match="no config.json"):
        hf.load(str(tmp_path))
