"""The ``hf_compile`` baseline of ``ditron bench megakernel --model`` (:mod:`.megakernel_model`), one case per process:
``transformers``' model of the same config (random weights, bf16) with a static KV cache under
``torch.compile(mode="reduce-overhead", fullgraph=True)``, one decode step + ``argmax`` per call.

Each (context, batch) case runs in a child process of its own (:func:`run_child`): a second compiled forward in one
process (another batch, another static cache, under the same CUDA-graph tree) ended in an illegal memory access on
an H100 (2026-12-07), even after ``torch._dynamo.reset()``, and an illegal access kills the CUDA context -- the whole
benchmark with it.  In a child it costs that case's column only, and the bench's process never holds the
``transformers`` model (its weights are a second copy of the model's).

    python -m ditron.bench.megakernel_hf --model qwen3-8b --batch 16 --ctx 512 --max-len 600 --device cuda:0

prints one line ``DITRON_HF_RESULT {"us": ..., "ok": ..., "error": ...}`` (``us``: the best round's median step
time, as every column of the bench; ``--no-compile``: the eager forward, for tests on CPU).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys

MARKER = "DITRON_HF_RESULT "
# torchrun's variables: the child is one plain process, whatever launched the bench
_LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING", "DITRON_RANKS_PER_GPU")


def hf_model(name, device):
    """``transformers``' model of ``--model``'s config, random weights, bf16 on ``device``."""
    import torch

    from ..kernels.decoder import hf
    from ..models import import_transformers
    tf = import_transformers()
    cfg = tf.AutoConfig.for_model(**hf.HF_CONFIGS[name])
    with torch.device(device):
        return tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def hf_stepper(model, batch, ctx, max_len, device, compile=True):
    """One ``transformers`` decode step of ``batch`` sequences at position ``ctx`` (static cache of ``max_len``
    positions, prefilled with ``ctx`` tokens), compiled (``compile``): ``step() -> next tokens``.  Works with the
    keyword names of transformers 4.5x and 5.x (``past_key_values`` / ``cache``, ``cache_position`` where the model
    takes it)."""
    import torch
    from transformers import StaticCache
    params = inspect.signature(model.forward).parameters
    ckw = "cache" if "cache" in params else "past_key_values"
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    with torch.no_grad():
        ids = torch.randint(0, model.config.vocab_size, (batch, ctx), device=device)
        kw = {ckw: cache, "use_cache": True, "logits_to_keep": 1}
        if "cache_position" in params:
            kw["cache_position"] = torch.arange(ctx, device=device)
        model(input_ids=ids, **kw)
    fwd = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True) if compile else model.forward
    tok = torch.zeros((batch, 1), dtype=torch.long, device=device)
    kw = {ckw: cache, "use_cache": True, "logits_to_keep": 1,
          "position_ids": torch.full((batch, 1), ctx, dtype=torch.long, device=device)}
    if "cache_position" in params:
        kw["cache_position"] = torch.tensor([ctx], device=device)

    def step():
        with torch.no_grad():
            out = fwd(input_ids=tok, **kw)
            return out.logits[:, -1].argmax(-1)
    return step


def hf_case(name, batch, ctx, max_len, device, warmup, iters, repeat, compile=True) -> dict:
    """Time one case in this process: ``{"us", "ok", "error"}``."""
    import math

    from .harness import Impl, measure
    step = hf_stepper(hf_model(name, device), batch, ctx, max_len, device, compile=compile)
    r = measure([Impl("hf_compile", step)], device, warmup=warmup, iters=iters, graph=False,
                repeat=repeat)["hf_compile"]
    us = r["us"] if r["ok"] and math.isfinite(r["us"]) else None
    return {"us": us, "ok": bool(r["ok"]) and us is not None, "error": r["error"] or None}


def run_child(name, batch, ctx, max_len, device, warmup, iters, repeat, timeout=900, compile=True):
    """:func:`hf_case` in a child process (module docstring): ``(us, error)``, one of them None.  A child that
    fails, dies or outlives ``timeout`` seconds gives the reason and the end of its output."""
    cmd = [sys.executable, "-m", "ditron.bench.megakernel_hf", "--model", name, "--batch", str(batch),
           "--ctx", str(ctx), "--max-len", str(max_len), "--device", str(device), "--warmup", str(warmup),
           "--iters", str(iters), "--repeat", str(repeat)] + ([] if compile else ["--no-compile"])
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"the transformers child process outlived {timeout} s (killed)"
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARKER):
            res = json.loads(line[len(MARKER):])
            return (res["us"], None) if res["ok"] else (None, res["error"] or "failed")
    tail = " | ".join(ln.strip() for ln in (p.stderr or p.stdout).strip().splitlines()[-3:])
    return None, f"the transformers child process exited with status {p.returncode} and no result: {tail}"[:400]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ditron.bench.megakernel_hf", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--max-len", type=int, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--no-compile", action="store_true", help="the eager forward (CPU tests)")
    a = p.parse_args(argv)
    try:
        res = hf_case(a.model, a.batch, a.ctx, a.max_len, a.device, a.warmup, a.iters, a.repeat,
                      compile=not a.no_compile)
    except Exception as e:  # noqa: BLE001 -- the parent's row says why its column is empty
        res = {"us": None, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    print(MARKER + json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
