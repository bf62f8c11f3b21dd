"""Text generation with the decode megakernel (issue 53): a Hugging Face Qwen3 / Llama model in
(:mod:`.hf`), token ids out.

:class:`Generator` builds this rank's megakernel once (the whole decode step: embedding gather, the layers, the final
norm, the vocab-parallel LM head and the sampler, :mod:`.tiles_head`), for up to ``max_batch`` sequences of up to
``max_ctx`` positions.  :meth:`Generator.generate`:

1. checks the request (batch, token ids, context room, sampling parameters) before any device work;
2. prefills each prompt but its last token with torch (:func:`prefill_kv`: the model's layers over the prompt,
   scaled-dot-product attention with a causal mask, computed the way ``transformers`` computes them: bf16 residual
   stream, bf16 RoPE) and writes every layer's keys and values into the paged KV cache in the megakernel's layout
   (this rank's kv heads; each rank prefills with the whole model, no communication);
3. runs decode steps: the first one consumes the last prompt token, each one samples every sequence's next token on
   the device; on a GPU the step is replayed from a CUDA graph (captured once when the generator is built);
   a sequence stops at one of its stop tokens (included in its output) or after its own ``max_new_tokens``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ditron.errors import DitronError

from . import hf
from .model import build_megakernel
from .weights import PAGE_SIZE, PagedKV


def _rms_hf(x, w, eps):
    """RMSNorm as transformers computes it (float32 statistics, the normalised value rounded to the input dtype,
    then multiplied by the weight in that dtype)."""
    dt = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dt)


def _rope_hf(x, pos, inv_freq):
    """``x [heads, n, D]`` bf16 at positions ``pos [n]``: cos / sin in float32 rounded to bf16, rotate-half."""
    freqs = pos.float()[:, None] * inv_freq.to(x.device)[None, :]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def prefill_kv(ck: "hf.Checkpoint", tokens: Sequence[int], device, weights: Optional[dict] = None):
    """Every layer's keys (after q/k norm and RoPE) and values of ``tokens`` at positions ``0..n-1``:
    ``[L, KH, n, D]`` bf16 each, all kv heads (the caller keeps its rank's)."""
    ks, vs, _ = _forward(ck, tokens, device, weights)
    return ks, vs


def reference_logits(ck: "hf.Checkpoint", tokens: Sequence[int], device="cpu", weights: Optional[dict] = None):
    """The model's next-token logits after ``tokens`` (``[V]`` float32), in torch as ``transformers`` computes
    them (the whole sequence at once, no cache): the demo's and the GPU check's reference where ``transformers``
    is not at hand."""
    _, _, x = _forward(ck, tokens, device, weights)
    w = (lambda n: weights[n]) if weights is not None else (lambda n: ck.tensor(n).to(device=device, dtype=torch.bfloat16))
    h = _rms_hf(x[-1:], w("model.norm.weight"), ck.cfg.rms_eps)
    lm = w("lm_head.weight") if "lm_head.weight" in ck.state else w("model.embed_tokens.weight")
    return F.linear(h, lm)[0].float()


def _forward(ck: "hf.Checkpoint", tokens: Sequence[int], device, weights: Optional[dict] = None):
    cfg = ck.cfg
    D, QH, KH, eps = cfg.head_dim, cfg.n_q_heads, cfg.n_kv_heads, cfg.rms_eps

    def t(name):
        if weights is not None:
            return weights[name]
        return ck.tensor(name).to(device=device, dtype=torch.bfloat16)
    n = len(tokens)
    ids = torch.tensor(list(tokens), dtype=torch.long, device=device)
    x = t("model.embed_tokens.weight")[ids]
    pos = torch.arange(n, device=device)
    inv = cfg.inv_freq().to(device)
    ks, vs = [], []
    for l in range(cfg.n_layers):
        p = f"model.layers.{l}."
        h = _rms_hf(x, t(p + "input_layernorm.weight"), eps)
        q = F.linear(h, t(p + "self_attn.q_proj.weight")).view(n, QH, D)
        k = F.linear(h, t(p + "self_attn.k_proj.weight")).view(n, KH, D)
        v = F.linear(h, t(p + "self_attn.v_proj.weight")).view(n, KH, D)
        if cfg.qk_norm:
            q = _rms_hf(q, t(p + "self_attn.q_norm.weight"), eps)
            k = _rms_hf(k, t(p + "self_attn.k_norm.weight"), eps)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        q, k = _rope_hf(q, pos, inv), _rope_hf(k, pos, inv)
        ks.append(k)
        vs.append(v)
        g = QH // KH
        a = F.scaled_dot_product_attention(q[None], k.repeat_interleave(g, 0)[None], v.repeat_interleave(g, 0)[None],
                                           is_causal=True, scale=D ** -0.5)[0]
        x = x + F.linear(a.transpose(0, 1).reshape(n, QH * D), t(p + "self_attn.o_proj.weight"))
        h = _rms_hf(x, t(p + "post_attention_layernorm.weight"), eps)
        act = F.silu(F.linear(h, t(p + "mlp.gate_proj.weight"))) * F.linear(h, t(p + "mlp.up_proj.weight"))
        x = x + F.linear(act, t(p + "mlp.down_proj.weight"))
    return torch.stack(ks), torch.stack(vs), x


class Generator:
    """This rank's decode megakernel for a Hugging Face model (``source``: a model directory or a ``transformers``
    model; :func:`.hf.load`).  ``world``: the ditron world (``rank``, ``world_size``, ``device``; default: one rank on
    ``device`` or the CPU); ``max_batch`` / ``max_ctx``: the compiled batch and the positions per sequence;
    ``max_top_k``: the sampler's candidates (the top-k cap; 1: greedy only); ``cuda_graph``: replay the step from a
    CUDA graph (default: on CUDA devices)."""

    def __init__(self, source, *, world=None, device=None, max_batch: int = 1, max_ctx: int = 256,
                 page_size: int = PAGE_SIZE, max_top_k: int = 64, tiles=None, num_programs=None,
                 cuda_graph: Optional[bool] = None, scheduler: str = "round_robin"):
        self.rank = world.rank if world is not None else 0
        self.world_size = world.world_size if world is not None else 1
        self.ck = ck = source if isinstance(source, hf.Checkpoint) else hf.load(source, tiles, self.world_size)
        cfg = self.cfg = ck.cfg
        self.device = torch.device(world.device if world is not None else (device or "cpu"))
        if max_batch < 1 or max_ctx < 2:
            raise DitronError(f"Generator: max_batch={max_batch} must be >= 1 and max_ctx={max_ctx} >= 2")
        sh = cfg.shard(self.world_size)           # head counts / intermediate not divisible: an error here
        self.weights, self.head = ck.shard(self.rank, self.world_size, self.device, max_top_k)
        P = page_size
        MP = -(-max_ctx // P)
        self.max_batch, self.max_ctx = max_batch, MP * P
        shape = (cfg.n_layers, max_batch * MP, P, sh.kv_heads, cfg.head_dim)
        bt = torch.arange(max_batch * MP, dtype=torch.int32).view(max_batch, MP)
        self.cache = PagedKV(torch.zeros(shape, dtype=torch.bfloat16, device=self.device),
                             torch.zeros(shape, dtype=torch.bfloat16, device=self.device), bt.to(self.device))
        self.dm = build_megakernel(cfg, self.weights, self.cache, world_size=self.world_size, batch=max_batch, ctx=0,
                                   head=self.head, num_programs=num_programs, scheduler=scheduler,
                                   name=f"{ck.arch}_decode")
        self._prefill_w = None
        self._replay = None
        if cuda_graph is None:
            cuda_graph = self.device.type == "cuda"
        if cuda_graph:
            from .reference import graph_replay
            self._replay = graph_replay(self.dm.step)         # one warm-up step (its writes are overwritten)

    def _pw(self):
        if self._prefill_w is None:
            if self.device.type == "cpu":
                self._prefill_w = {k: v.to(torch.bfloat16) for k, v in self.ck.state.items()}
            else:
                self._prefill_w = {k: v.to(device=self.device, dtype=torch.bfloat16) for k, v in self.ck.state.items()}
        return self._prefill_w

    def prefill(self, prompts: Sequence[Sequence[int]]):
        """Fill the KV cache with every prompt but its last token; sets ``seq`` and the step's input tokens."""
        sh = self.cfg.shard(self.world_size)
        kh0, KH, P = self.rank * sh.kv_heads, sh.kv_heads, self.cache.page_size
        seq, tok = [], []
        for b in range(self.max_batch):
            p = list(prompts[b]) if b < len(prompts) else [0]
            n = len(p) - 1
            if n:
                k, v = prefill_kv(self.ck, p[:-1], self.device, self._pw())
                pos = torch.arange(n)
                pages = self.cache.block_table[b].long().cpu()[pos // P].to(self.device)
                rows = (pos % P).to(self.device)
                for l in range(self.cfg.n_layers):
                    self.cache.k[l][pages, rows] = k[l, kh0:kh0 + KH].transpose(0, 1)
                    self.cache.v[l][pages, rows] = v[l, kh0:kh0 + KH].transpose(0, 1)
            seq.append(n)
            tok.append(p[-1])
        self.dm.seq.copy_(torch.tensor(seq, dtype=torch.int32))
        self.dm.tokens.copy_(torch.tensor(tok, dtype=torch.int32))

    def check(self, prompts, max_new):
        V = self.cfg.vocab
        if not prompts or len(prompts) > self.max_batch:
            raise DitronError(f"generate: {len(prompts)} prompts; this generator was compiled for 1..{self.max_batch} "
                              "sequences (Generator(max_batch=...))")
        for b, (p, m) in enumerate(zip(prompts, max_new)):
            if not len(p):
                raise DitronError(f"generate: prompt {b} is empty")
            bad = [t for t in p if not 0 <= int(t) < V]
            if bad:
                raise DitronError(f"generate: prompt {b} has token ids {bad[:4]} outside the vocabulary (0..{V - 1})")
            if m < 1:
                raise DitronError(f"generate: max_new_tokens={m} for sequence {b} must be >= 1")
            if len(p) + m > self.max_ctx:
                raise DitronError(f"generate: sequence {b} needs {len(p)} + {m} positions; the KV cache holds "
                                  f"{self.max_ctx} per sequence (Generator(max_ctx=...))")

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens=32, stop_tokens=None, temperature=0.0,
                 top_k=0, top_p=1.0, seed=0, return_logits=False):
        """Token ids generated for each prompt (lists; a stop token ends a sequence and is included).
        ``max_new_tokens``: an int or one per prompt; ``stop_tokens``: ids (default: the model's ``eos_token_id``;
        ``()``: none); sampling: :meth:`~.model.DecoderMegakernel.set_sampling` (per sequence or one value).
        ``return_logits``: also this rank's LM-head logits of every step (``[steps, B, V_r]`` float32, vocab columns
        ``head.v_off..``)."""
        B = len(prompts)
        max_new = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * B
        if len(max_new) != B:
            raise DitronError(f"generate: {len(max_new)} max_new_tokens for {B} prompts")
        self.check(prompts, max_new)
        stops = set(self.ck.eos if stop_tokens is None else stop_tokens)

        def pad(v, fill):
            vals = list(v) if isinstance(v, (list, tuple)) else [v] * B
            if len(vals) != B:
                raise DitronError(f"generate: {len(vals)} sampling values for {B} prompts")
            return vals + [fill] * (self.max_batch - B)
        self.dm.set_sampling(pad(temperature, 0.0), pad(top_k, 0), pad(top_p, 1.0), pad(seed, 0))
        self.prefill(prompts)
        self.dm.check_inputs()
        out = [[] for _ in range(B)]
        done = [False] * B
        logits = []
        for _ in range(max(max_new)):
            tok = (self._replay() if self._replay is not None else self.dm.step()).cpu().tolist()
            if return_logits:
                logits.append(self.dm.logits.float().cpu())
            for b in range(B):
                if not done[b]:
                    out[b].append(tok[b])
                    done[b] = tok[b] in stops or len(out[b]) >= max_new[b]
            if all(done):
                break
        return (out, torch.stack(logits)) if return_logits else out
