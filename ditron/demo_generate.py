"""``ditron demo generate``: text generation with the decode megakernel -- a Hugging Face model directory in
(Qwen3 / Llama), token ids out, one launch per decode step (token embedding, the layers, final norm, vocab-parallel
LM head and the sampler), checked against the same model in torch.

Without a GPU job it writes a tiny random Qwen3 (or ``--arch llama``) checkpoint as ``save_pretrained`` would
(``config.json`` + sharded safetensors, no download, no ``transformers`` needed) and generates on 2 simulated
ranks; under ``torchrun --nproc-per-node N -m ditron.demo_generate --model DIR --prompt 9707,11,1879`` it runs the
model directory on the GPUs (TP = N).  Greedy tokens are checked step by step against the model in torch
(``ditron.models.reference_logits``: the whole sequence recomputed, as ``transformers`` computes it): the tokens
must agree wherever the reference's top-1 / top-2 logit gap exceeds the bf16 tolerance; a difference at a
near-tie is reported as such.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

#: the tiny demo model: 2 layers, hidden 64, 4 q / 2 kv heads of 16, vocabulary 256
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-6)


def write_tiny(path: str, arch: str = "qwen3", seed: int = 0) -> str:
    """A random tiny model directory in Hugging Face's layout (two safetensors shards + index, ``config.json``,
    ``generation_config.json``); LM-head rows of log-normal norms so that greedy choices are rarely near-ties."""
    import torch

    from .kernels.decoder.hf import _safetensors
    save_file = _safetensors().save_file
    g = torch.Generator().manual_seed(seed)
    H, I, L = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_hidden_layers"]
    QH, KH, D, V = TINY["num_attention_heads"], TINY["num_key_value_heads"], TINY["head_dim"], TINY["vocab_size"]

    def rnd(*shape, std=0.1):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)
    sd = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
          "lm_head.weight": (torch.randn(V, H, generator=g) * 0.1
                             * torch.exp(torch.randn(V, 1, generator=g) * 1.5)).to(torch.bfloat16)}
    for l in range(L):
        p = f"model.layers.{l}."
        sd.update({p + "input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
                   p + "post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
                   p + "self_attn.q_proj.weight": rnd(QH * D, H), p + "self_attn.k_proj.weight": rnd(KH * D, H),
                   p + "self_attn.v_proj.weight": rnd(KH * D, H), p + "self_attn.o_proj.weight": rnd(H, QH * D),
                   p + "mlp.gate_proj.weight": rnd(I, H), p + "mlp.up_proj.weight": rnd(I, H),
                   p + "mlp.down_proj.weight": rnd(H, I)})
        if arch == "qwen3":
            sd[p + "self_attn.q_norm.weight"] = torch.ones(D, dtype=torch.bfloat16)
            sd[p + "self_attn.k_norm.weight"] = torch.ones(D, dtype=torch.bfloat16)
    cfg = dict(TINY, model_type=arch, architectures=["Qwen3ForCausalLM" if arch == "qwen3" else "LlamaForCausalLM"],
               hidden_act="silu", tie_word_embeddings=False, torch_dtype="bfloat16", eos_token_id=V - 1,
               attention_bias=False)
    if arch == "qwen3":
        cfg["rope_theta"] = 1e6
    else:
        cfg.update(rope_theta=5e5, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                     high_freq_factor=4.0, original_max_position_embeddings=64))
    os.makedirs(path, exist_ok=True)
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for f, keys in shards.items():
        save_file({k: sd[k].contiguous() for k in keys}, os.path.join(path, f), metadata={"format": "pt"})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}, fh)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    with open(os.path.join(path, "generation_config.json"), "w") as fh:
        json.dump({"eos_token_id": V - 1}, fh)
    return path


def run_on_this_rank(model, prompts, steps, batch_ctx, temperature, top_k, top_p, seed, check):
    import ditron
    import ditron.models as M

    world = ditron.init()
    t = time.monotonic()
    gen = M.from_pretrained(model, world=world, max_batch=len(prompts),
                            max_ctx=batch_ctx or max(len(p) for p in prompts) + steps + 1,
                            num_programs=None if str(world.device).startswith("cuda") else 2)
    build = time.monotonic() - t
    t = time.monotonic()
    out = gen.generate(prompts, max_new_tokens=steps, stop_tokens=(), temperature=temperature, top_k=top_k,
                       top_p=top_p, seed=seed, return_logits=check)
    tokens, logits = out if check else (out, None)
    secs = time.monotonic() - t
    ok = True
    if world.rank == 0:
        print(f"[{gen.ck.arch}, TP={world.world_size} on {world.backend}] built in {build:.1f} s; {steps} steps of "
              f"batch {len(prompts)} in {secs:.1f} s", flush=True)
    notes = []
    if check:
        # every rank's vocab columns side by side (rank r holds tokens r * V_r ..; padding only after the last)
        from .bench.harness import gather_ranks
        full = gather_ranks(logits.to(_gather_device(world)), world, dim=-1).cpu()[..., :gen.cfg.vocab]
        w = gen._pw()
        for b, p in enumerate(prompts):
            seq = list(p)
            for s, tok in enumerate(tokens[b]):
                ref = M.reference_logits(gen.ck, seq, gen.device, w).cpu()
                got = full[s, b]
                err = (got - ref).abs().max().item()
                scale = ref.abs().max().item()
                tol = 0.05 * scale + 0.05
                top2 = ref.topk(2).values
                if err > tol:
                    ok = False
                    notes.append(f"sequence {b} step {s}: logits differ by {err:.3g} (tolerance {tol:.3g})")
                    break
                if temperature <= 0 and tok != int(ref.argmax()):
                    gap = (top2[0] - top2[1]).item()
                    if gap > 2 * err:
                        ok = False
                        notes.append(f"sequence {b} step {s}: token {tok} != reference {int(ref.argmax())} "
                                     f"(top-2 gap {gap:.3g})")
                    else:
                        notes.append(f"sequence {b} step {s}: a near-tie (top-2 gap {gap:.3g} within the logits' "
                                     f"difference {err:.3g}); later steps continue from the megakernel's token")
                    break
                seq.append(tok)
    if world.rank == 0:
        for b, p in enumerate(prompts):
            print(f"  prompt {p} -> {tokens[b]}", flush=True)
        for n in notes:
            print("  " + n, flush=True)
        if check:
            print(f"  {'matches torch' if ok else 'MISMATCH'} (logits within 0.05 * scale + 0.05 at every step)",
                  flush=True)
    ditron.finalize()
    if not ok:
        raise SystemExit(1)


def _prompts(text):
    return [[int(t) for t in p.split(",") if t.strip()] for p in text.split(";") if p.strip()]


def _gather_device(world):
    """Where ``gather_ranks`` wants its tensor: the GPU under NCCL, the CPU under gloo (ranks sharing a GPU) and on
    the simulator."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return world.device
    return "cpu"


def main(argv=None):
    p = argparse.ArgumentParser(prog="ditron demo generate", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--ranks", type=int, default=2, help="simulated ranks (default 2)")
    p.add_argument("--model", default=None, help="a Hugging Face model directory (default: a tiny random one)")
    p.add_argument("--arch", choices=["qwen3", "llama"], default="qwen3", help="the tiny model's architecture")
    p.add_argument("--prompt", default="17,42,7;99,3",
                   help="token ids, comma-separated; several prompts separated by ';' (default '17,42,7;99,3')")
    p.add_argument("--steps", type=int, default=12, help="new tokens per prompt (default 12)")
    p.add_argument("--max-ctx", type=int, default=0, help="positions per sequence (default: prompt + steps)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true", help="skip the torch reference (large models)")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    prompts = _prompts(args.prompt)
    if not prompts:
        p.error("--prompt: no token ids")
    if args.inside or os.environ.get("WORLD_SIZE"):
        if not args.model:
            p.error("--model DIR is needed under torchrun (a Hugging Face model directory)")
        run_on_this_rank(args.model, prompts, args.steps, args.max_ctx, args.temperature, args.top_k, args.top_p,
                         args.seed, not args.no_check)
        return 0
    import tempfile

    from .sim.launcher import run_job
    with tempfile.TemporaryDirectory(prefix="ditron-demo-generate-") as tmp:
        model = args.model or write_tiny(os.path.join(tmp, f"tiny-{args.arch}"), args.arch)
        print(f"ditron demo generate: {'the model at ' + model if args.model else 'a tiny random ' + args.arch}"
              f" on {args.ranks} simulated ranks (CPU, Triton interpreter); {len(prompts)} prompt(s), "
              f"{args.steps} steps, {'greedy' if args.temperature <= 0 else 'sampled'}", flush=True)
        t = time.monotonic()
        cmd = ["-m", "ditron.demo_generate", "--inside", "--model", model, "--prompt", args.prompt, "--steps",
               str(args.steps), "--max-ctx", str(args.max_ctx), "--temperature", str(args.temperature), "--top-k",
               str(args.top_k), "--top-p", str(args.top_p), "--seed", str(args.seed)]
        if args.no_check:
            cmd.append("--no-check")
        code = run_job(args.ranks, cmd)
    if code == 0:
        print(f"ditron demo generate: done on all {args.ranks} ranks in {time.monotonic() - t:.1f} s")
    else:
        print(f"ditron demo generate: FAILED (exit code {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
