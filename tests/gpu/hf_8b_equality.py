"""Token equality with ``transformers`` at 8B shapes on GPUs (issue 53): Qwen3-8B- or Llama-3.1-8B-shaped models with
random weights (``from_config``; nothing is downloaded), greedy decoding by the decode megakernel (the whole step in
one launch, CUDA-graph replay) against ``transformers``' ``generate``: tokens equal for ``--steps`` steps, and logits
no further from ``transformers``' float32 logits (the same weights in float32, teacher-forced on the same tokens)
than twice ``transformers``' own bfloat16 logits are, plus 1% of the largest logit.  A fixed fraction of the largest
logit is no bound at 8B depth: 36 bfloat16 layers of random weights move the logits by several percent in any
bfloat16 implementation (transformers' included), and by more at TP=2 (partial sums rounded per rank).

    torchrun --standalone --nproc-per-node 1 tests/gpu/hf_8b_equality.py --model qwen3-8b --dir /tmp/q8   # TP=1
    DITRON_RANKS_PER_GPU=2 torchrun --standalone --nproc-per-node 2 tests/gpu/hf_8b_equality.py --model qwen3-8b \\
        --dir /tmp/q8                                                                # TP=2, both ranks on one GPU

The first run (one rank) builds the model, makes it confident, picks prompts whose ``transformers`` greedy run has
an unambiguous token at every step, saves the model (``save_pretrained``, sharded safetensors) and the references to
``--dir``; every run then loads ``--dir`` through ``ditron.models``.  Random 8B weights put the top two logits within
bf16 rounding of each other at most steps, so ``--method`` makes the model confident one of two ways:

* ``plant`` (tried first by default, the search after it): random prompts and distinct random target tokens; the
  LM-head rows of the targets are fitted (least-norm, to float32 teacher-forced final hidden states) so that each
  step's target scores ``--alpha`` times the random head's largest logit there and the other targets about 0.
  Searching finds nothing at Llama-8B: a random 8B model's final hidden state in bf16 is ~2.5% (8 layers) to ~5%
  (32 layers) from float32's (measured on CPU; Qwen3's alike), so random top-2 gaps are within that noise at most
  steps, and a 32-step run where float32 agrees is rare (Qwen3-8B found one, 2026-12-07d; Llama-8B none, 07g);
* ``search``: as the simulator's tests do, LM-head rows of log-normal norms (``--sigma``), then prompts whose greedy
  run has a top-1 / top-2 gap of at least ``--min-rel`` of the largest logit at every step (batched candidates,
  then each confirmed alone).

Either way the references are ``transformers``' own bf16 ``generate`` output (tokens and logits; a plant that
``generate`` does not reproduce is rejected, not used), and ``transformers`` in float32 (teacher-forced) must pick the
same tokens with a gap of at least ``--min-rel / 2`` (a step where bfloat16 and float32 part has no single right
token); the check of ditron is the same for both.  Prints ``hf_8b_equality: PASS`` (or ``FAIL: ...``) per rank.
"""
import argparse
import os
import sys
import time

import torch


def say(world, *a):
    if world is None or world.rank == 0:
        print(*a, flush=True)


def search(m, V, steps, lengths, min_rel, device, batches=16, keep=4):
    """Per prompt length, up to ``keep`` prompts whose greedy run has a top-2 gap of at least ``min_rel`` of the
    largest logit at every step and at least 4 distinct tokens, each with its reference ``(tokens, logits)``:
    ``[[(prompt, tokens, logits), ...] per length]`` (:func:`choose` keeps, per length, the first that float32 agrees
    with); else a string saying what was seen."""
    g = torch.Generator().manual_seed(1234)
    found = []
    for n in lengths:
        seen, alone, hits = [], [], []
        for _ in range(batches):          # 32 candidates each; stop at the first confirmed one
            cand = torch.randint(0, V, (32, n), generator=g)
            with torch.no_grad():
                r = m.generate(cand.to(device), attention_mask=torch.ones_like(cand, device=device),
                               max_new_tokens=steps, min_new_tokens=steps, do_sample=False, output_logits=True,
                               return_dict_in_generate=True, pad_token_id=0)
            lg = torch.stack([x.float() for x in r.logits], 1).cpu()
            top2 = lg.topk(2, -1).values
            rel = ((top2[..., 0] - top2[..., 1]) / lg.abs().amax(-1)).amin(-1)
            for i in rel.argsort(descending=True).tolist():
                toks = r.sequences[i, n:].tolist()
                seen.append((round(rel[i].item(), 4), len(set(toks))))
                if rel[i] < min_rel:
                    break
                if len(set(toks)) < 4:
                    continue
                p = cand[i].tolist()
                with torch.no_grad():
                    r1 = m.generate(torch.tensor([p], device=device), max_new_tokens=steps, min_new_tokens=steps,
                                    do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
                lg1 = torch.stack([x[0].float() for x in r1.logits]).cpu()
                t2 = lg1.topk(2, -1).values
                gap = ((t2[:, 0] - t2[:, 1]) / lg1.abs().amax(-1)).min().item()
                alone.append(round(gap, 4))       # the batched run's gap, confirmed (or not) by the prompt alone
                if gap >= min_rel:
                    hits.append((p, r1.sequences[0, n:].tolist(), lg1))
                    print(f"prompt of length {n}: smallest top-2 gap {gap:.3g} of the largest logit (bf16); tokens "
                          f"{hits[-1][1]}", flush=True)
                    if len(hits) == keep:
                        break
            if len(hits) == keep:
                break
        if not hits:
            return (f"no prompt of length {n} (best (gap, distinct tokens) of {len(seen)} batched runs: "
                    f"{sorted(seen)[-4:]}; gaps of those rerun alone: {sorted(alone)[-4:]})")
        found.append(hits)
    return found


def plant(m, V, steps, lengths, device, alpha=2.0, seed=1234):
    """One random prompt per length and ``steps`` target tokens each, all distinct and none of the config's special
    ids (``min_new_tokens`` masks eos: an eos target could never come), planted: the targets' LM-head rows are
    fitted to the float32 teacher-forced final hidden states ``h_t`` so that row ``t`` gives ``h_t`` the logit
    ``a_t = alpha * max_j |W0_j . h_t|`` (``W0``: the random head) and the other states 0.  Then each prompt is
    generated alone in bf16, as :func:`search` confirms candidates: ``[[(prompt, tokens, logits)] per length]``
    with ``transformers``' own tokens and logits (never the targets), or a string naming the first step where
    ``generate`` parts from the targets (a larger ``alpha`` may do)."""
    cfg = m.config
    if getattr(cfg, "tie_word_embeddings", False):
        raise ValueError("plant: the model ties its LM head to its input embeddings (tie_word_embeddings): fitted "
                         "LM-head rows would change the targets' embeddings too; use --method search")
    n_t = steps * len(lengths)
    if n_t > cfg.hidden_size:
        raise ValueError(f"plant: {n_t} targets need at most hidden_size ({cfg.hidden_size}) independent states")
    special = set()
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(cfg, k, None)
        special.update(v if isinstance(v, (list, tuple)) else [] if v is None else [v])
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]
    perm = torch.randperm(V, generator=g).tolist()
    targets = [t for t in perm if t not in special][:n_t]
    targets = [targets[i * steps:(i + 1) * steps] for i in range(len(lengths))]
    m.float()                     # the hidden states and a_t in float32 (the head's bf16 values, exactly)
    with torch.no_grad():
        hs = []
        for p, tg in zip(prompts, targets):
            ids = torch.tensor([p + tg[:-1]], device=device)
            hs.append(m.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0, len(p) - 1:].float())
        hs = torch.cat(hs)                                         # [n_t, hidden]: state t predicts target t
        a = alpha * (hs @ m.get_output_embeddings().weight.T).abs().amax(-1)
        r = a[:, None] * torch.linalg.pinv(hs).T                   # r[t] . hs[s] = a[t] if s == t else 0
        to_bf16(m)
        head = m.get_output_embeddings().weight
        head.index_copy_(0, torch.tensor(sum(targets, []), device=head.device), r.to(head.dtype))
    found = []
    for p, tg in zip(prompts, targets):
        with torch.no_grad():
            r1 = m.generate(torch.tensor([p], device=device), max_new_tokens=steps, min_new_tokens=steps,
                            do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        toks = r1.sequences[0, len(p):].tolist()
        lg = torch.stack([x[0].float() for x in r1.logits]).cpu()
        if toks != tg:
            k = next(i for i, (x, y) in enumerate(zip(toks, tg)) if x != y)
            return (f"plant (alpha {alpha}): the prompt of length {len(p)} parts from its targets at step {k}: "
                    f"generate picks {toks[k]}, the target is {tg[k]}; logit({toks[k]}) - logit({tg[k]}) "
                    f"{(lg[k, toks[k]] - lg[k, tg[k]]).item():.4g}, largest logit {lg[k].abs().max().item():.4g}")
        t2 = lg.topk(2, -1).values
        gap = ((t2[:, 0] - t2[:, 1]) / lg.abs().amax(-1)).min().item()
        print(f"prompt of length {len(p)} (planted, alpha {alpha}): smallest top-2 gap {gap:.3g} of the largest "
              f"logit (bf16); tokens {toks}", flush=True)
        found.append([(p, toks, lg)])
    return found


def to_bf16(m):
    """``m`` back to bfloat16 after ``m.float()``: the parameters only (exact: they are bfloat16 values).
    ``m.to(torch.bfloat16)`` would round the float32 buffers too -- RoPE's ``inv_freq``, which moves the angles of
    every later ``generate`` off those of a freshly loaded model (and of ditron's)."""
    for q in m.parameters():
        q.data = q.data.to(torch.bfloat16)


def choose(found, exact, min_rel):
    """Per length the first candidate whose greedy tokens are float32's too, with float32's top-2 gap at least
    ``min_rel / 2`` of its largest logit at every step (``exact``: :func:`exact_logits` of every candidate, in the
    order of ``found``): a step where transformers' bfloat16 run and float32 part (the 2026-12-07 Llama TP=2 run:
    bf16's gap 320 for one token, float32's 33 for the other) has no single right token, so no implementation can be
    held to it.  Returns ``(prompts, refs, refs32)`` or a string saying what was seen."""
    prompts, refs, refs32, it, seen = [], [], [], iter(exact), []
    for hits in found:
        pick = None
        for p, toks, lg in hits:
            e32 = next(it)
            t2 = e32.topk(2, -1)
            gap = ((t2.values[:, 0] - t2.values[:, 1]) / e32.abs().amax(-1)).min().item()
            agree = t2.indices[:, 0].tolist() == toks
            seen.append((len(p), round(gap, 4), agree))
            if pick is None and agree and gap >= min_rel / 2:
                pick = (p, (toks, lg), e32, gap)
        if pick is None:
            return f"no candidate that float32 agrees with (length, float32 gap, same tokens): {seen}"
        prompts.append(pick[0])
        refs.append(pick[1])
        refs32.append(pick[2])
        print(f"prompt of length {len(pick[0])}: float32 agrees, its smallest top-2 gap {pick[3]:.3g}", flush=True)
    return prompts, refs, refs32


def build_reference(name, path, steps, lengths, min_rel, sigma, device, methods=("plant", "search"),
                    alpha=(2.0, 4.0)):
    from ditron.kernels.decoder import hf
    from ditron.models import import_transformers
    tf = import_transformers()
    t = time.monotonic()
    torch.manual_seed(0)
    cfg = tf.AutoConfig.for_model(**hf.HF_CONFIGS[name])
    with torch.device(device):
        m = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    print(f"built {name} ({sum(p.numel() for p in m.parameters()) / 1e9:.2f} B parameters) in "
          f"{time.monotonic() - t:.0f} s", flush=True)
    V = cfg.vocab_size
    lm0 = m.get_output_embeddings().weight.detach().clone()
    tries = [(meth, x) for meth in methods for x in (sigma if meth == "search" else alpha)]
    for method, x in tries:
        if method == "search":
            what = f"LM-head row norms log-normal with sigma {x}"
            f = torch.exp(torch.randn(V, 1, generator=torch.Generator().manual_seed(1)) * x)
            with torch.no_grad():
                m.get_output_embeddings().weight.copy_(lm0 * f.to(device=device, dtype=torch.bfloat16))
            found = search(m, V, steps, lengths, min_rel, device)
        else:
            what = f"LM-head rows planted with alpha {x}"
            with torch.no_grad():                 # a_t from the random head, not an earlier try's planted rows
                m.get_output_embeddings().weight.copy_(lm0)
            try:
                found = plant(m, V, steps, lengths, device, alpha=x)
            except ValueError as e:               # a tied LM head: no plant at any alpha
                found = str(e)
        if isinstance(found, list):
            cands = [h for hits in found for h in hits]
            exact = exact_logits(m, [h[0] for h in cands], [(h[1], h[2]) for h in cands])
            to_bf16(m)
            found = choose(found, exact, min_rel)
        if isinstance(found, tuple):
            prompts, refs, refs32 = found
            print(f"{what} (--method {method}): prompts found", flush=True)
            break
        print(f"{what}: {found}", flush=True)
    else:
        raise SystemExit(f"hf_8b_equality: FAIL: no prompts with an unambiguous {steps}-step greedy run (bfloat16 and "
                         f"float32) by any of {tries} (method, alpha or sigma); try --alpha / --sigma / --min-rel")
    del lm0
    t = time.monotonic()
    m.save_pretrained(path, max_shard_size="4GB")
    torch.save({"prompts": prompts, "refs": refs, "refs32": refs32, "steps": steps}, os.path.join(path, "refs.pt"))
    print(f"saved the model and the references to {path} in {time.monotonic() - t:.0f} s", flush=True)
    del m
    torch.cuda.empty_cache()


def exact_logits(m, prompts, refs):
    """``transformers``' logits in float32 (the model converted in place) at each reference step, teacher-forced
    on the prompt and the bfloat16 run's tokens: one forward per sequence over its whole length."""
    m.float()
    dev = next(m.parameters()).device
    out = []
    with torch.no_grad():
        for p, (toks, lg) in zip(prompts, refs):
            ids = torch.tensor([p + toks[:-1]], device=dev)
            full = m(input_ids=ids).logits[0].float()
            out.append(full[len(p) - 1:].cpu())
            assert out[-1].shape == lg.shape, (out[-1].shape, lg.shape)
    return out


def _methods(text):
    """``--method``'s comma list, checked."""
    methods = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in methods if x not in ("plant", "search")]
    if bad or not methods:
        raise SystemExit(f"hf_8b_equality: --method takes plant and / or search (comma list), not {text!r}")
    return methods


def _gather_device(world):
    """Where ``gather_ranks`` wants its tensor: the GPU under NCCL, the CPU under gloo (ranks sharing a GPU) and on
    the simulator."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return world.device
    return "cpu"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["qwen3-8b", "llama3-8b", "tiny-qwen3"], default="qwen3-8b")
    p.add_argument("--dir", required=True, help="where the model and the references are (built by a 1-rank run)")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--lengths", default="24,9", help="prompt lengths (a ragged batch)")
    p.add_argument("--min-rel", type=float, default=0.03,
                   help="smallest top-1 / top-2 logit gap, relative to the largest logit, at every reference step")
    # 2026-12-07g (H100, Llama-8B): with float32 required to agree, sigmas 2.0 .. 0.5 found no prompt (the one
    # bf16-confident candidate at 2.0 parted from float32 somewhere in 32 steps): larger sigmas first
    p.add_argument("--sigma", default="3.0,2.5,2.0,1.5",
                   help="log-normal sigmas of the LM-head row norms to try in turn (comma list)")
    p.add_argument("--method", default="plant,search",
                   help="how the model is made confident, tried in this order (comma list): plant (fitted LM-head "
                        "rows for random target tokens) and / or search (log-normal LM-head rows, random prompts)")
    p.add_argument("--alpha", default="2.0,4.0",
                   help="--method plant: each target's logit over the random head's largest, tried in turn "
                        "(comma list)")
    args = p.parse_args()

    import ditron
    import ditron.models as M
    from ditron.bench.harness import gather_ranks
    world = ditron.init()
    ref_file = os.path.join(args.dir, "refs.pt")
    if not os.path.exists(ref_file):
        if world.world_size != 1:
            raise SystemExit(f"hf_8b_equality: FAIL: no references in {args.dir}: run once with one rank first")
        build_reference(args.model, args.dir, args.steps, [int(x) for x in args.lengths.split(",")], args.min_rel,
                        [float(x) for x in args.sigma.split(",")], world.device, _methods(args.method),
                        [float(x) for x in args.alpha.split(",")])
    ditron.barrier_all()
    data = torch.load(ref_file)
    prompts, refs, refs32, steps = data["prompts"], data["refs"], data["refs32"], data["steps"]
    t = time.monotonic()
    gen = M.from_pretrained(args.dir, world=world, max_batch=len(prompts),
                            max_ctx=max(len(q) for q in prompts) + steps + 1)
    say(world, f"[TP={world.world_size}] generator built in {time.monotonic() - t:.0f} s ({gen.cfg.n_layers} layers, "
               f"vocabulary {gen.cfg.vocab}, {gen.dm.mk.num_programs} programs, CUDA graph "
               f"{'on' if gen._replay else 'off'})")
    t = time.monotonic()
    tokens, logits = gen.generate(prompts, max_new_tokens=steps, stop_tokens=(), return_logits=True)
    say(world, f"[TP={world.world_size}] {steps} steps of batch {len(prompts)} in {time.monotonic() - t:.1f} s "
               "(with the logits copied out every step)")
    full = gather_ranks(logits.to(_gather_device(world)), world, dim=-1).cpu()[..., :gen.cfg.vocab]
    fails = []
    for b, (rt, rl) in enumerate(refs):
        exact = refs32[b]
        same = tokens[b] == rt
        # the logits are comparable up to and including the first step whose token differs: after it ditron's
        # history is not the references' (they are teacher-forced on transformers' tokens)
        k = steps if same else next(i for i, (x, y) in enumerate(zip(tokens[b], rt)) if x != y)
        n = min(k + 1, steps)
        mine = full[:n, b]
        err = (mine - exact[:n]).abs().max().item()          # ditron against transformers in float32
        err_hf = (rl - exact).abs().max().item()             # transformers in bfloat16 against the same (all steps)
        diff = (mine - rl[:n]).abs().max().item()            # ditron against transformers in bfloat16
        scale = exact.abs().max().item()
        tol = 2 * err_hf + 0.01 * scale
        top2 = rl.topk(2, -1).values
        gap = (top2[:, 0] - top2[:, 1]).min().item()
        say(world, f"[TP={world.world_size}] sequence {b} (prompt length {len(prompts[b])}): tokens "
                   f"{'equal' if same else 'DIFFER'} over {steps} steps; logits against transformers in float32"
                   f"{'' if same else f' (steps 0-{k}, before the histories part)'}: "
                   f"ditron {err:.3g}, transformers bf16 {err_hf:.3g} (ratio {err / max(err_hf, 1e-30):.2f}; "
                   f"tolerance {tol:.3g} = 2 x transformers' + 1% of the largest {scale:.3g}); ditron against "
                   f"transformers bf16 {diff:.3g}; smallest reference top-2 gap {gap:.3g}")
        if not same:
            mt, rt_k = tokens[b][k], rt[k]
            e32, eb, md = exact[k], rl[k], full[k, b]
            say(world, f"[TP={world.world_size}] sequence {b} step {k}: ditron picks {mt}, transformers {rt_k}; "
                       f"logit({rt_k}) - logit({mt}): float32 {(e32[rt_k] - e32[mt]).item():.4g}, transformers bf16 "
                       f"{(eb[rt_k] - eb[mt]).item():.4g}, ditron {(md[rt_k] - md[mt]).item():.4g}; this step's "
                       f"max |ditron - float32| {(md - e32).abs().max().item():.4g} (transformers bf16: "
                       f"{(eb - e32).abs().max().item():.4g}); float32 top-2 gap {(e32.topk(2).values[0] - e32.topk(2).values[1]).item():.4g}")
            fails.append(f"sequence {b}: first difference at step {k}: {mt} vs {rt_k}")
        if err > tol:
            fails.append(f"sequence {b}: logits {err:.3g} from float32 (transformers bf16: {err_hf:.3g})")
    print(f"hf_8b_equality [{args.model}, rank {world.rank}/{world.world_size}]: "
          + ("PASS" if not fails else "FAIL: " + "; ".join(fails)), flush=True)
    ditron.finalize()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
