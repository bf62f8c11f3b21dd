"""Issue 53: Hugging Face Qwen3 / Llama checkpoints through the decode megakernel, checked against
``transformers``.  The models are tiny random ones built from configs (nothing is downloaded) and saved to a
temporary directory as ``save_pretrained`` writes them (sharded safetensors); the megakernel runs on simulated
ranks (the whole step in one kernel: embedding gather, layers, final norm, vocab-parallel LM head, sampler).

Token equality: greedy decoding must give exactly the tokens of ``transformers``' ``generate`` -- over 16 steps
after prompts of 23 and 20 tokens for each architecture once (Qwen3 at one rank, Llama at two: the steps' attention
spans two of the tiles' 32-position KV blocks, as 32 steps after 7- and 2-token prompts did, at half the steps), over
8 after short prompts where that is already shown (tied embeddings, 3 ranks).  The random models are made confident (``make_model``) and the prompts chosen so that transformers' top-1 /
top-2 gap is at least 4% of the largest logit at every step (``confident_prompts``; the smallest gap is printed in a
failure): a near-tie between two bf16 roundings does not decide the test, a wrong layout, a missing norm, a wrong
RoPE table or a wrong vocab shard changes the tokens at once.  Logits: the kernel's bf16 logits against
transformers' within ``0.05 * max|ref| + 0.05`` (the two round differently: bf16 residual stream and RoPE in
transformers, float32 in the kernel).

CI time (2 cores, the suite run twice): one cluster call per world size with every case of that size in it, each
generator compiled for its own batch; about 10 s of one rank's CPU for the one-rank test, 5 s per rank at 2 ranks, 2 s
per rank at 3, 1.5 s for the sampler's frequencies, and ~6 s of transformers in the test process (one thread: two
threads on a busy 2-core runner made its tiny generate calls ~5x slower)."""
import dataclasses
import json
import os

import pytest
import torch

import bodies_decoder_hf as BH
from ditron.errors import DitronError



def _import_transformers():
    """transformers through ``ditron.models.import_transformers`` (this repository's top-level ``kernels/`` would
    shadow Hugging Face's ``kernels`` package, which transformers 5 imports); the test skips without it."""
    from ditron.models import import_transformers
    try:
        return import_transformers()
    except ImportError:
        pytest.skip("transformers is not installed (the test extra has it)")


transformers = _import_transformers()

STEPS = 16
#: the prompt lengths of the STEPS-step greedy runs: ragged, and long enough that the decode steps cross the
#: 32-position attention block of TILES_SMALL (kernels/decoder/hf.py) for both rows
LONG = (23, 20)


def make_model(arch, path, tied, vocab=256, heads=4, kv=2, inter=96, seed=0, shard="60KB", **extra):
    """A tiny random Qwen3 / Llama model (2 layers, hidden 64, GQA), saved as sharded safetensors at ``path``
    (unless None).  Its weights are made confident so that greedy decoding is rarely a near-tie: LM-head rows of
    log-normal norms (with plain Gaussian rows the top-2 gap is under 2% of the logits' range somewhere in most 32-step
    runs, below the bf16 rounding differences between transformers and the kernel).  Tied embeddings: the same
    matrix is the input embedding, so the log-normal norms are milder (sigma 0.5 instead of 1.5) and o_proj / down_proj are scaled by 4 -- the
    layers' outputs dominate the residual stream, and the last token's own embedding no longer decides the next
    token (without it, greedy runs of a tied random model repeat one token)."""
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
    f = torch.exp(torch.randn(vocab, 1, generator=torch.Generator().manual_seed(seed + 1)) * (TIED_SIGMA if tied else 1.5))
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(f.to(torch.bfloat16))
        if tied:
            for layer in m.model.layers:
                layer.self_attn.o_proj.weight.mul_(TIED_OUT)
                layer.mlp.down_proj.weight.mul_(TIED_OUT)
    if tied:
        assert m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
    if path is not None:
        m.save_pretrained(path, max_shard_size=shard)
    return m


TIED_SIGMA, TIED_OUT = 0.5, 4.0


def hf_greedy(m, prompts, steps=STEPS):
    """transformers' greedy ``generate`` of each prompt alone (batch 1): (tokens, logits [steps, V] float32)."""
    out = []
    for p in prompts:
        r = m.generate(torch.tensor([p]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                       output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        out.append((r.sequences[0, len(p):].tolist(), torch.stack([lg[0].float() for lg in r.logits])))
    return out


def _unambiguous(lg, tok, min_rel, min_distinct):
    top2 = lg.topk(2, -1).values
    rel = ((top2[..., 0] - top2[..., 1]) / lg.abs().amax(-1)).amin(-1).item()
    return rel >= min_rel and len(set(tok)) >= min_distinct, (round(rel, 3), len(set(tok)))


def confident_prompts(m, lengths, vocab, min_rel=0.04, min_distinct=4, batches=16, steps=STEPS, seed=1234):
    """Prompts (of these lengths) whose transformers greedy run has, at every step, a top-1 / top-2 logit gap of at
    least ``min_rel`` of the largest logit and at least ``min_distinct`` different tokens: an unambiguous reference.
    Candidates are drawn from a seeded generator and screened 64 at a time (one batched ``generate``); a hit is
    confirmed by a run of its own (the reference).  Fails if none is found (never skips).  Returns (prompts,
    references)."""
    g = torch.Generator().manual_seed(seed)
    out, refs, seen = [], [], []
    for n in lengths:
        for _ in range(batches):
            cand = torch.randint(0, vocab, (64, n), generator=g)
            r = m.generate(cand, attention_mask=torch.ones_like(cand), max_new_tokens=steps, min_new_tokens=steps,
                           do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=-1)
            lg = torch.stack([x.float() for x in r.logits], 1)
            hit = None
            for i in range(len(cand)):
                ok, why = _unambiguous(lg[i], r.sequences[i, n:].tolist(), min_rel, min_distinct)
                seen.append(why)
                if ok and cand[i].tolist() not in out:
                    (tok, lg1), = hf_greedy(m, [cand[i].tolist()], steps)
                    if _unambiguous(lg1, tok, min_rel, min_distinct)[0]:
                        hit = (cand[i].tolist(), (tok, lg1))
                        break
            if hit:
                out.append(hit[0])
                refs.append(hit[1])
                break
        else:
            raise AssertionError(f"no prompt of length {n} with an unambiguous greedy run in {batches * 64} tries "
                                 f"(gap, distinct tokens): {sorted(seen)[-5:]}")
    return out, refs


def check_against_hf(results, refs, rows=None, steps=None):
    """``results``: every rank's (tokens, logits [steps, B, V_r], v_off, n_valid) of one run; ``refs``: transformers'
    (tokens, logits) per prompt; ``rows[i]``: the batch row of ``refs[i]`` (default: row i); ``steps``: compare the
    first ``steps`` (default: all of the reference)."""
    for i, (ref_tok, ref_lg) in enumerate(refs):
        b = i if rows is None else rows[i]
        n_steps = steps or len(ref_tok)
        ref_tok, ref_lg = ref_tok[:n_steps], ref_lg[:n_steps]
        top2 = ref_lg.topk(2, -1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        for rank, (tok, lg, v0, n) in enumerate(results):
            assert tok[b][:n_steps] == ref_tok, (f"row {b} rank {rank}: megakernel {tok[b]} != transformers {ref_tok} "
                                                 f"(smallest top-2 logit gap of transformers: {margin:.3g})")
        got = full_logits(results)[:n_steps, b]
        assert got.shape == ref_lg.shape, (got.shape, ref_lg.shape)
        err = (got - ref_lg).abs().max().item()
        scale = ref_lg.abs().max().item()
        assert err <= 0.05 * scale + 0.05, f"row {b}: logits differ by {err:.3g} (scale {scale:.3g})"


def full_logits(results):
    """The whole vocabulary's logits ``[steps, B, V]`` of a run: every rank's vocab-parallel columns side by side."""
    return torch.cat([lg[..., :n] for tok, lg, v0, n in results], -1)


class one_thread:
    """transformers on one intra-op thread (on a shared 2-core CI runner two threads made its tiny generate calls
    ~5x slower)."""
    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


def model_case(tmp_path, name, arch, tied, lengths=(7, 2), steps=STEPS, **kw):
    """A saved model, prompts of these lengths with an unambiguous greedy run and their transformers references."""
    d = tmp_path / name
    with one_thread():
        m = make_model(arch, d, tied, **kw)
        prompts, refs = confident_prompts(m, lengths, m.config.vocab_size, steps=steps)
    assert len([f for f in os.listdir(d) if f.endswith(".safetensors")]) > 1, "a sharded checkpoint"
    return str(d), prompts, refs


def sampled_ok(logits, tok, temperature, top_k, top_p, max_top_k=64, eps=1e-4):
    """Whether ``tok`` may be drawn from ``logits`` ([V] float32: the kernel's own bf16 logits) under the sampler's
    documented semantics (kernels/decoder/tiles_head.py): the ``top_k`` largest (ties: smaller id first;
    0: ``max_top_k``), softmax at ``temperature``, the smallest prefix whose probability reaches ``top_p`` (a candidate is kept while
    the probability before it is below ``top_p``; ``eps``: float32 rounding at that boundary)."""
    order = sorted(range(len(logits)), key=lambda j: (-logits[j].item(), j))
    k = top_k or max_top_k
    keep = torch.tensor(order[:k])
    p = torch.softmax(logits[keep] / temperature, 0)
    before = torch.cumsum(p, 0) - p
    allowed = keep[before < top_p + eps].tolist()
    return tok in allowed, allowed


@pytest.mark.e2e
def test_one_rank_greedy_sampling_and_stops(dist_world, tmp_path):
    """One rank, one cluster call, ragged batches.  Qwen3 (untied, q/k norm): 16 greedy steps equal transformers';
    row 1 has a stop token (its output ends at the token's first occurrence, included; the other row, which never
    produces that token, goes on).
    Llama (tied embeddings, Llama 3 RoPE): 8 greedy steps equal transformers', row 1 limited to 5 tokens
    (per-sequence lengths).  Sampling (Qwen3, a generator with ``max_top_k=16``, 8 steps): every drawn token lies
    in the top-k / top-p set that a torch reference computes from the kernel's own logits at that step; two rows with
    the same prompt, parameters and seed draw the same tokens (a draw depends on the sequence's seed and position
    only), another seed draws others, the sampler leaves the greedy token somewhere; ``top_k=1`` at temperature 1 and
    temperature 1e-3 (the limit T -> 0: the prompts' top-2 gaps are >= 4% of the logits, ~0.1, and the Gumbel noise
    is bounded by ~20 after the clamp of ``u``, so it cannot overturn 0.1 / 1e-3) equal greedy decoding."""
    q_path, (qa, qb), (ra, rb) = model_case(tmp_path, "qwen3", "qwen3", False, lengths=LONG)
    l_path, lp, lref = model_case(tmp_path, "llama_tied", "llama", True, steps=8)
    # a stop token for row 1: the first of its reference's tokens (from the 4th on) that it had not produced before
    # and that row 0 never produces
    stop_at = next(i for i in range(3, STEPS) if rb[0][i] not in rb[0][:i] and rb[0][i] not in ra[0])
    stop = rb[0][stop_at]
    greedy = dict(prompts=[qa, qb], max_new_tokens=STEPS, stop_tokens=[stop])
    S = 8
    temps, ks, ps, seeds = [1.5, 1.5, 1.5, 1.0, 1e-3], [8, 8, 8, 1, 0], [0.8, 0.8, 0.8, 1.0, 0.9], [11, 11, 12, 5, 4]
    sampled = dict(prompts=[qa] * 5, max_new_tokens=S, temperature=temps, top_k=ks, top_p=ps, seed=seeds)
    out = dist_world(1).run(BH.run_cases, [(q_path, [greedy]), (l_path, [dict(prompts=lp, max_new_tokens=[8, 5])]),
                                           (q_path, [sampled], 16)])
    res = run_of(out, 0, 0)
    tok = res[0][0]
    assert len(tok[0]) == STEPS and tok[1] == rb[0][:stop_at + 1], (tok, stop, rb[0])   # stopped, stop included
    check_against_hf(res, [ra])
    check_against_hf(res, [rb], rows=[1], steps=stop_at + 1)
    res = run_of(out, 1, 0)
    assert [len(t) for t in res[0][0]] == [8, 5], res[0][0]
    check_against_hf(res, lref[:1])
    check_against_hf(res, lref[1:], rows=[1], steps=5)
    # sampling: every draw within its top-k / top-p set of the kernel's own logits at that step
    res = run_of(out, 2, 0)
    stok, full = res[0][0], full_logits(res)
    for b in range(5):
        for s_, t in enumerate(stok[b]):
            ok, allowed = sampled_ok(full[s_, b], t, temps[b], ks[b], ps[b], max_top_k=16)
            assert ok, f"row {b} step {s_}: token {t} not in the sampler's set {allowed}"
    assert stok[0] == stok[1], "same prompt, parameters and seed: the same draws"
    assert stok[2] != stok[0], "another seed: other draws"
    greedy_pick = full.argmax(-1)
    assert any(stok[b][s_] != greedy_pick[s_, b].item() for b in range(3) for s_ in range(S)), \
        "the sampler never left the greedy token"
    check_against_hf(res, [ra, ra], rows=[3, 4], steps=S)     # top_k=1, temperature -> 0: greedy


def test_sampler_draw_frequencies(dist_world):
    """Stage 2 of the sampler alone over 96 positions of one seed: the draws' frequencies against the distribution
    of its documented semantics (top-k of 6 candidates, temperature 2; chi-square below the 0.1% point of 3 degrees
    of freedom; a sampler that ignored the temperature scores ~25 here), and candidates outside the top-k never
    drawn.  The seeds are fixed: the outcome is deterministic."""
    import math
    probs = [0.55, 0.25, 0.12, 0.05, 0.02, 0.01]
    values = [math.log(p) for p in probs]
    n, temp, k = 96, 2.0, 4
    tok, = dist_world(1).run(BH.sampler_draws, values, n, temp, k, 1.0, 7)
    counts = torch.bincount(tok.long(), minlength=6).tolist()
    assert counts[4] == counts[5] == 0 and sum(counts) == n, counts
    q = torch.softmax(torch.tensor(values[:k]) / temp, 0)
    chi2 = sum((c - n * e) ** 2 / (n * e) for c, e in zip(counts[:k], q.tolist()))
    assert chi2 < 16.27, (counts, (n * q).tolist(), chi2)


@pytest.mark.parametrize("N,n_valid,K,block", [(256, 250, 4, None), (5000, 4999, 3, None), (9000, 9000, 5, 256)])
def test_sampler_topk_chunks(dist_world, N, n_valid, K, block):
    """Stage 1 of the sampler in chunks (``topk_part`` + ``topk``) against torch's order over the whole row: the
    ``K`` best of a sampled row and the best of a greedy row, (value descending, id ascending), logits rounded to
    bf16 so that ties are common (across chunks too), columns past ``n_valid`` never chosen even where larger.
    N = 256: one chunk; 5000: three; 9000 with 256-wide blocks: five chunks of 1800, several blocks each."""
    g = torch.Generator().manual_seed(N + K)
    B, v_off = 3, 1000
    lg = (torch.randn(B, N, generator=g) * 2).to(torch.bfloat16).float()
    lg[:, n_valid:] = 100.0                    # padding columns (vocab-parallel padding) are never candidates
    lg[1, 7] = lg[1, N // 2] = lg[1, n_valid - 1] = lg[1, :n_valid].max().item() + 1   # a three-way tie at the top
    temps = [1.0, 1.0, 0.0]                    # rows 0, 1 sampled (K candidates), row 2 greedy (one)
    (cand, nsplit), = dist_world(1).run(BH.sampler_topk, lg, n_valid, temps, K, v_off, block)
    assert nsplit == {256: 1, 5000: 3, 9000: 5}[N]
    for b in range(B):
        v = lg[b, :n_valid]
        order = sorted(range(n_valid), key=lambda j: (-v[j].item(), j))
        k = K if temps[b] > 0 else 1
        want_v = [v[j].item() for j in order[:k]] + [float("-inf")] * (K - k)
        want_i = [float(j + v_off) for j in order[:k]] + [-1.0] * (K - k)
        assert cand[b, :K].tolist() == want_v, (b, cand[b], want_v)
        assert cand[b, K:].tolist() == want_i, (b, cand[b], want_i)


@pytest.mark.e2e
def test_two_and_three_ranks_greedy(dist_world, tmp_path):
    """The vocab-parallel LM head and sampler across ranks, ragged batches, every rank's tokens and logits equal to
    transformers': 2 ranks, Llama (untied, Llama 3 RoPE) over 16 greedy steps (long prompts) and Qwen3 with tied embeddings over 8;
    3 ranks (6 q / 3 kv heads, the vocabulary split 86 / 86 / 84), Qwen3 over 8."""
    S = 8
    l_path, lp, lref = model_case(tmp_path, "llama", "llama", False, lengths=LONG)
    q_path, qp, qref = model_case(tmp_path, "qwen3_tied", "qwen3", True, steps=S)
    q3_path, q3p, q3ref = model_case(tmp_path, "qwen3_6h", "qwen3", False, steps=S, heads=6, kv=3)
    out = dist_world(2).run(BH.run_cases, [(l_path, [dict(prompts=lp, max_new_tokens=STEPS)]),
                                           (q_path, [dict(prompts=qp, max_new_tokens=S)])])
    check_against_hf(run_of(out, 0, 0), lref)
    check_against_hf(run_of(out, 1, 0), qref)
    out = dist_world(3).run(BH.run_cases, [(q3_path, [dict(prompts=q3p, max_new_tokens=S)])])
    assert [(v0, n) for _, _, v0, n in run_of(out, 0, 0)] == [(0, 86), (86, 86), (172, 84)]
    check_against_hf(run_of(out, 0, 0), q3ref)


def run_of(out, case, run):
    """Every rank's result of one run of one case of :func:`bodies_decoder_hf.run_cases`."""
    return [rank[case][run] for rank in out]


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


def test_demo_checkpoint_and_reference(tmp_path):
    """``ditron demo generate``'s hand-written tiny checkpoint (no transformers needed to write it) is a model
    transformers loads, and the demo's torch reference (``ditron.models.reference_logits``, the whole sequence
    recomputed) gives transformers' next-token logits for it (both architectures)."""
    from ditron.demo_generate import write_tiny
    from ditron.models import load, reference_logits
    for arch in ("qwen3", "llama"):
        d = write_tiny(str(tmp_path / arch), arch)
        ck = load(d, world_size=2)
        assert ck.arch == arch and ck.eos == (255,) and ck.cfg.qk_norm == (arch == "qwen3")
        with one_thread():
            m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
            p = [17, 42, 7, 99, 3, 250]
            with torch.no_grad():
                want = m(torch.tensor([p])).logits[0, -1].float()
            got = reference_logits(ck, p)
        torch.testing.assert_close(got, want, rtol=0, atol=0.02 * want.abs().max().item())


def test_default_tiles_follow_the_mlp_width():
    """hf.tiles_for: the 8B tiles' batch-1 gate/up tiles (32 columns) fill one wave of 396 programs for Qwen3-8B
    (384 tiles: kept), not for Llama-3.1-8B (448: masked tiles of 19 columns, 755 tiles, two waves); small models get
    TILES_SMALL; an MLP so wide that two waves need tiles of 32 or more columns keeps the plain tiles."""
    from ditron.kernels.decoder import hf
    from ditron.kernels.decoder.config import TILES_8B, cdiv
    q, l = (hf.config_from_hf(hf.HF_CONFIGS[m]).tiles for m in ("qwen3-8b", "llama3-8b"))
    assert q == TILES_8B and cdiv(12288, q.cols("gate_up")) == 384
    assert l.gate_up_cols == 19 and cdiv(14336, l.cols("gate_up")) == 755 <= 2 * hf.WAVE_8B
    assert l == dataclasses.replace(TILES_8B, gate_up_cols=19)          # nothing else differs
    assert hf.tiles_for(64, 96) is hf.TILES_SMALL
    assert hf.tiles_for(4096, 64 * 2 * hf.WAVE_8B) is TILES_8B          # 25344 columns: 32 per tile for two waves
    assert hf.tiles_for(4096, 32 * hf.WAVE_8B + 1).gate_up_cols == 17
