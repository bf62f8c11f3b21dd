"""``ditron bench megakernel --model qwen3-8b|llama3-8b``: the whole decode step of a model (token embedding, the
layers, final norm, the vocab-parallel LM head and the greedy sampler: token ids in, the next token ids out) as one
megakernel launch, against

* ``hbm_limit``: the step's bytes per rank (the layers' weights, this rank's LM-head rows, ``B`` embedding rows and
  the KV cache read) over the device's copy bandwidth measured in the same run;
* ``torch_graph``: the same step in torch (embedding gather, the decoder of ``reference.TorchDecoder``, the LM head,
  at TP > 1 an all-gather of the logits, ``argmax``) captured in a CUDA graph;
* ``hf_compile`` (one rank): ``transformers``' model of the same config (random weights) with a static KV cache of
  ``ctx + margin`` positions under ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (CUDA graphs), one
  decode step + ``argmax`` per call, at the batches of ``--hf-batch`` (the static cache attends over its whole
  length, as ``transformers`` does); each case in a child process of its own, timed right after the case's other
  columns (:mod:`.megakernel_hf`: one compiled forward per process).

Weights are seeded random at the model's shapes (``weights.make_weights`` / ``make_head``; the speed does not
depend on the values).  Each case is checked first: one megakernel step against the torch step on the same tokens
(logits within the decoder's tolerance; the greedy token equal wherever the torch step's top-2 gap exceeds the
logits' difference).  Tokens per second: ``batch / step time``.
"""
from __future__ import annotations

import math

from .harness import Impl, agree_fn, gather_ranks, measure, traced_fields
from .megakernel_hf import run_child


def model_config(name):
    """The :class:`DecoderConfig` of ``--model`` (``hf.HF_CONFIGS``; the 8B tiles)."""
    from ..kernels.decoder import hf
    return hf.config_from_hf(hf.HF_CONFIGS[name])


def step_bytes(cfg, world_size, ctxs) -> int:
    """Bytes one rank reads per step: the layers' weights, its LM-head rows, the batch's embedding rows, the KV."""
    sh = cfg.shard(world_size)
    VR = -(-cfg.vocab // world_size)
    return sh.weight_bytes() + VR * cfg.hidden * 2 + len(ctxs) * cfg.hidden * 2 + sum(sh.kv_bytes(c, 1) for c in ctxs)


class TorchFullStep:
    """The whole step in torch on this rank: ``tok [B] int32 -> next tok [B] int32`` (greedy), the decoder step of
    :class:`~ditron.kernels.decoder.reference.TorchDecoder` between the embedding gather and the LM head."""

    def __init__(self, ref, head, world):
        self.ref, self.head, self.world = ref, head, world
        self.logits = None

    def step(self, tok):
        import torch
        import torch.nn.functional as F
        x = self.head.embed[tok.long()]
        h = self.ref.step(x)
        lg = F.linear(h, self.head.lm[0])
        if self.world.world_size > 1:
            lg = gather_ranks(lg, self.world, dim=1)
        self.logits = lg[:, :self.head.vocab]
        return torch.argmax(self.logits, -1).to(torch.int32)


#: the whole-step check's tolerance for the Hugging Face models (relative to the largest logit): at 36 layers of
#: random bfloat16 weights the megakernel and torch's step (both keep the residual stream in float32; their
#: bfloat16 roundings differ) are 4.2-4.3% of the largest logit apart (H100, 2026-12-07, batch 1 and 8), as
#: ditron and transformers are; the accuracy itself is held to transformers in float32 by
#: tests/gpu/hf_8b_equality.py.  The token check (every sequence whose top-2 gap is clear) stays exact.
CHECK_REL = 0.06


def model_case(world, cfg, ctx, batch, args, bw, weights, head, hf=False):
    """Check then time one (context, batch) of the whole step; returns the table row (``args.contexts(ctx, batch)``:
    the sequences' contexts)."""
    import torch

    import ditron
    from ..kernels.decoder import run as R
    from ..kernels.decoder.model import build_megakernel
    from ..kernels.decoder.reference import graph_replay
    margin = 2 * args.repeat * (args.warmup + args.iters) + 16
    ctxs = args.contexts(ctx, batch)
    s = R.setup(cfg, world, batch, ctxs, max_ctx=ctx + margin, page_size=args.page_size, weights=weights)
    dm = build_megakernel(cfg, weights, s.cache, world_size=world.world_size, batch=batch, ctx=ctxs, head=head,
                          scheduler=args.scheduler, num_programs=args.programs, name="model_step")
    ref = TorchFullStep(R.reference(s), head, world)
    tok0 = torch.randint(0, cfg.vocab, (batch,), generator=torch.Generator().manual_seed(7), dtype=torch.int32)
    tok0 = tok0.to(world.device)
    got = dm.step(tokens=tok0).clone()
    want = ref.step(tok0)
    mine = gather_ranks(dm.logits.float(), world, dim=1)[:, :cfg.vocab]
    theirs = ref.logits.float()
    err = (mine - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    top2 = theirs.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * err
    tok_ok = bool(((got.long() == want.long()) | ~clear).all())
    rel = args.check_rel if getattr(args, "check_rel", None) is not None else CHECK_REL
    ok = err <= rel * scale + R.ABS and tok_ok
    ok = agree_fn(world)([ok])[0]
    nbytes = step_bytes(cfg, world.world_size, ctxs)
    row = {"ctx": ctx, "batch": batch, "check": "ok" if ok else "FAILED", "max_abs_err": err, "scale": scale,
           "tokens_checked": int(clear.sum()), "bytes_per_rank": nbytes, "hbm_limit_us": nbytes / bw * 1e6,
           "tasks": len(dm.graph.tasks), "tiles": dm.graph.num_slots, "programs": dm.mk.num_programs}
    dm.buf.tok.copy_(tok0)
    tok_static = tok0.clone()
    cuda = str(world.device).startswith("cuda")
    impls = [Impl("torch_graph", graph_replay(lambda: ref.step(tok_static)) if cuda else lambda: ref.step(tok_static))]
    if ok:
        impls.append(Impl("megakernel", graph_replay(dm.step) if cuda else dm.step))
    res = measure(impls, world.device, warmup=args.warmup, iters=args.iters, graph=False,
                  barrier=ditron.barrier_all, repeat=args.repeat, agree=agree_fn(world))
    for name, r in res.items():
        row[f"{name}_us"] = r["us"] if r["ok"] and math.isfinite(r["us"]) else None
        if not r["ok"]:
            row.setdefault("errors", {})[name] = r["error"]
    if hf and world.world_size == 1 and batch in args.hf_batches:
        us, err = run_child(args.model, batch, max(ctxs), max(ctxs) + margin + 8, world.device, args.warmup,
                            args.iters, args.repeat, timeout=args.hf_timeout)
        row["hf_compile_us"] = us
        if err:
            row.setdefault("errors", {})["hf_compile"] = err
    mk = row.get("megakernel_us")
    if mk:
        row["mk_over_hbm_limit"] = mk / row["hbm_limit_us"]
        row["mk_tok_s"] = batch / mk * 1e6
        for base in ("torch_graph", "hf_compile"):
            if row.get(f"{base}_us"):
                row[f"mk_over_{base}"] = mk / row[f"{base}_us"]
                row[f"{base}_tok_s"] = batch / row[f"{base}_us"] * 1e6
    if dm.mk.resources:
        row["resources"] = dm.mk.resources
    if getattr(args, "trace", False) and ok:
        # a second build of the same step with per-item timestamps (the timed kernel has none): where the step's
        # time goes per kind of task, the embedding, the LM head and the sampler's stages included
        tm = build_megakernel(cfg, weights, s.cache, world_size=world.world_size, batch=batch, ctx=ctxs, head=head,
                              scheduler=args.scheduler, num_programs=dm.mk.num_programs, name="model_step_traced",
                              trace=True)
        row.update(traced_fields(tm.mk, lambda: tm.step(tokens=tok0)))
    return row


def table(rows) -> str:
    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)
    out = ["| ctx | batch | check | megakernel us | HBM limit us | mk / HBM | torch + graph us | mk / torch graph | "
           "HF compile us | mk / HF | mk tok/s | torch graph tok/s | HF tok/s |",
           "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(" | ".join(["", str(r["ctx"]), str(r["batch"]), r["check"], f(r.get("megakernel_us")),
                               f(r["hbm_limit_us"]), f(r.get("mk_over_hbm_limit"), "{:.3f}"),
                               f(r.get("torch_graph_us")), f(r.get("mk_over_torch_graph"), "{:.3f}"),
                               f(r.get("hf_compile_us")), f(r.get("mk_over_hf_compile"), "{:.3f}"),
                               f(r.get("mk_tok_s"), "{:.0f}"), f(r.get("torch_graph_tok_s"), "{:.0f}"),
                               f(r.get("hf_compile_tok_s"), "{:.0f}"), ""]).strip())
    return "\n".join(out)


def main_model(args, argv, cfg, ctxs, batches, copy_bandwidth) -> int:
    """``ditron bench megakernel --model NAME``: every (context, batch) case, rank 0 writes the Markdown table and
    the JSON rows (``--out``).  ``copy_bandwidth(device)``: the HBM limit's bandwidth (bench/megakernel.py)."""
    import json
    import os

    import ditron
    from ..kernels.decoder.weights import make_head, make_weights
    from .harness import _release, result_meta
    world = ditron.init()
    bw = copy_bandwidth(world.device)
    weights = make_weights(cfg, world.rank, world.world_size, device=world.device)
    head = make_head(cfg, world.rank, world.world_size, device=world.device)
    hf, hf_note = False, ""
    if args.hf_batches:
        if world.world_size > 1:
            hf_note = "transformers baseline: one rank only (no tensor parallelism there)"
        elif not str(world.device).startswith("cuda"):
            hf_note = "transformers baseline: CUDA only (torch.compile reduce-overhead captures CUDA graphs)"
        else:
            try:
                from ..models import import_transformers
                import_transformers()
                hf = True
            except Exception as e:  # noqa: BLE001 -- the table says why the column is empty
                hf_note = f"transformers baseline unavailable: {type(e).__name__}: {e}"[:300]
    rows = []
    command = "ditron bench megakernel " + " ".join(argv)

    def report(final):
        if world.rank != 0:
            return
        meta = result_meta("megakernel_model", "bf16", world.world_size, world.device, args.machine, command)
        meta.update(model=args.model, layers=cfg.n_layers, vocab=cfg.vocab, tiles=vars(cfg.tiles),
                    copy_bandwidth_GBs=bw / 1e9, hf_note=hf_note)
        md = [f"### Whole decode step ({args.model}: embedding, {cfg.n_layers} layers, final norm, LM head "
              f"{cfg.vocab} x {cfg.hidden}, greedy sampler), TP={world.world_size} ({args.machine}, {meta['date']})",
              "", f"Command: `{command}`", "",
              f"Copy bandwidth {bw / 1e9:.0f} GB/s; HBM limit = (layer weights + this rank's LM-head rows + B embedding "
              f"rows + KV bytes per rank) / copy bandwidth. torch + graph: the same step in torch (embedding, "
              f"TorchDecoder, LM head{', logits all-gather' if world.world_size > 1 else ''}, argmax) in a CUDA "
              "graph. HF compile: transformers with a static cache under torch.compile(mode='reduce-overhead', "
              "fullgraph=True), one decode step + argmax per call. tok/s = batch / step time."
              + (f" {hf_note}." if hf_note else ""), "", table(rows), ""]
        errs = [f"- ctx {r['ctx']} batch {r['batch']}: {r['errors']}" for r in rows if r.get("errors")]
        if errs:
            md += ["Errors:", ""] + errs + [""]
        for r in rows:
            if r.get("profile_table"):
                md += [f"Traced build, context {r['ctx']} batch {r['batch']} (where the step's time goes):", "",
                       r["profile_table"], ""]
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{args.tag or args.machine.replace(' ', '_')}-megakernel-{args.model}")
        with open(stem + ".md", "w") as f:
            f.write("\n".join(md))
        with open(stem + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
        if final:
            print("\n".join(md))
            print(f"wrote {stem}.md, {stem}.json")

    for ctx in ctxs:
        for batch in batches:
            with ditron.heap_scope():
                rows.append(model_case(world, cfg, ctx, batch, args, bw, weights, head, hf))
            _release(world.device)
            if world.rank == 0:
                r = rows[-1]
                print(f"{args.model} context {ctx} batch {batch}: {r['check']} (max abs err {r['max_abs_err']:.3g}, "
                      f"scale {r['scale']:.3g}, {r['tokens_checked']} tokens compared), megakernel "
                      f"{r.get('megakernel_us')} us, HBM limit {r['hbm_limit_us']:.1f} us, torch + graph "
                      f"{r.get('torch_graph_us')} us, HF compile {r.get('hf_compile_us')} us"
                      + (f", errors {r['errors']}" if r.get("errors") else ""), flush=True)
            report(final=False)
    report(final=True)
    bad = [r for r in rows if r["check"] != "ok"]
    ditron.finalize()
    return 1 if bad else 0
