"""Hugging Face checkpoints into the decode megakernel (issue 53): Qwen3 and Llama (3.x) models from a model
directory (``config.json`` + ``model.safetensors`` or the sharded ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``, as ``save_pretrained`` writes them) or from a ``transformers`` model object.

* :func:`config_from_hf`: the megakernel's :class:`~.config.DecoderConfig` of a Hugging Face config (a dict or a
  ``PretrainedConfig``), with a clear :class:`~ditron.errors.DitronError` for what the megakernel cannot run
  (another architecture, biases, sliding-window attention, a RoPE scaling other than ``linear`` / ``llama3``, an
  activation other than SiLU) -- before any weight is read or any GPU work;
* :func:`load` -> :class:`Checkpoint`: the config and the state dict (bf16, on the CPU);
* :meth:`Checkpoint.shard`: this rank's :class:`~.weights.Weights` and :class:`~.weights.Head` under tensor
  parallelism over ``world_size`` ranks (q / kv heads and the MLP's columns as ``make_weights`` splits them; the LM
  head vocab-parallel; tied embeddings: the LM head is the embedding table).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Optional

import torch

from ditron.errors import DitronError

from .config import TILES_8B, DecoderConfig, TileConfig, cdiv
from .weights import Head, Weights

SUPPORTED = ("qwen3", "llama")

#: the tile sizes for small models (hidden < 1024: the simulator's tiny test models): GEMV tiles of 64 columns x 64
#: (a tiny model's projections and LM head in a few tiles each: the interpreter runs per tile)
TILES_SMALL = TileConfig(gemv_block_n=64, gemv_block_k=64, norm_block=64, attn_split=64, attn_block=32, comm_block=64,
                         num_warps=4)


#: the configs (``config.json`` fields) of the models ``ditron bench megakernel --model`` and the GPU checks build
#: with random weights: Qwen3-8B and Llama-3.1-8B (Hugging Face's published configs, abridged)
HF_CONFIGS = {
    "qwen3-8b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
                     tie_word_embeddings=False, hidden_act="silu", attention_bias=False, bos_token_id=151643,
                     eos_token_id=151645, torch_dtype="bfloat16"),
    "llama3-8b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                      vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
                      rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=8192),
                      tie_word_embeddings=False, hidden_act="silu", attention_bias=False, mlp_bias=False,
                      bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16"),
    # the same scripts' CPU smoke runs on the simulator (ditron sim): 2 layers, hidden 64
    "tiny-qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=64, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=512, tie_word_embeddings=False,
                       hidden_act="silu", attention_bias=False, eos_token_id=255, initializer_range=0.1,
                       torch_dtype="bfloat16"),
}


def _get(cfg, name, default=None):
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def _rope(cfg) -> tuple:
    """(rope_theta, rope_scaling tuple) of an HF config: ``rope_parameters`` (transformers 5) or ``rope_theta`` +
    ``rope_scaling`` (earlier config.json files)."""
    params = _get(cfg, "rope_parameters") or {}
    scaling = _get(cfg, "rope_scaling") or {}
    theta = params.get("rope_theta", _get(cfg, "rope_theta", 10000.0))
    sc = dict(scaling)
    sc.update({k: v for k, v in params.items() if k != "rope_theta"})
    kind = sc.get("rope_type", sc.get("type", "default")) or "default"
    if sc.get("partial_rotary_factor", 1.0) != 1.0:
        raise DitronError(f"hf: partial_rotary_factor={sc['partial_rotary_factor']} is not supported (RoPE over the "
                          "whole head only)")
    if kind == "default":
        return float(theta), ()
    if kind == "linear":
        return float(theta), ("linear", float(sc["factor"]))
    if kind == "llama3":
        return float(theta), ("llama3", float(sc["factor"]), float(sc["low_freq_factor"]),
                              float(sc["high_freq_factor"]), float(sc["original_max_position_embeddings"]))
    raise DitronError(f"hf: RoPE type {kind!r} is not supported by the megakernel (default, linear, llama3)")


#: programs of one wave of the 8B tiles on the GPUs they were fitted on: 3 per SM on 132 SMs (H100 SXM, H200)
WAVE_8B = 396


def tiles_for(hidden: int, intermediate: int) -> TileConfig:
    """The default tiles of a model: :data:`TILES_SMALL` below hidden 1024; else :data:`~.config.TILES_8B`, with
    ``gate_up_cols`` set where the gate/up tiles of batch 1 (32 columns each) would be more than one wave of
    :data:`WAVE_8B` programs: then masked tiles of ``ceil(intermediate / (2 * WAVE_8B))`` columns, two full waves.
    Llama-3.1-8B (14336): 448 tiles of 32 (1.13 waves: 52 programs take a second tile while the rest wait for down)
    become 755 of 19; one H100, 2026-12-07 (``bench/calls/llama_mk_ab.sh``): batch 1 at 1.174x / 1.176x its HBM
    limit at context 512 / 4096 against 1.212x / 1.215x, while 388 tiles of 37 (64-row tiles, one wave) took 2.9x
    and 896 tiles of 16 1.196x / 1.200x.  Qwen3-8B (12288: 384 tiles) keeps the plain tiles."""
    if hidden < 1024:
        return TILES_SMALL
    bn = TILES_8B.block_n("gate_up")
    if cdiv(intermediate, bn) <= WAVE_8B:
        return TILES_8B
    cols = cdiv(intermediate, 2 * WAVE_8B)
    return dataclasses.replace(TILES_8B, gate_up_cols=cols) if cols < bn else TILES_8B


def config_from_hf(cfg, tiles: Optional[TileConfig] = None) -> DecoderConfig:
    """The :class:`DecoderConfig` (``vocab`` set) of a Hugging Face config (dict or ``PretrainedConfig``);
    ``tiles``: default :func:`tiles_for` (:data:`~.config.TILES_8B` from hidden 1024, else :data:`TILES_SMALL`)."""
    mt = _get(cfg, "model_type")
    if mt not in SUPPORTED:
        archs = _get(cfg, "architectures")
        raise DitronError(f"hf: model_type {mt!r} ({archs}) is not supported by the decode megakernel "
                          f"(supported: {', '.join(SUPPORTED)})")
    for flag in ("attention_bias", "mlp_bias"):
        if _get(cfg, flag, False):
            raise DitronError(f"hf: {mt} with {flag}=True is not supported (the megakernel's projections have no bias)")
    if mt == "qwen3" and _get(cfg, "use_sliding_window", False):
        raise DitronError("hf: qwen3 with use_sliding_window=True is not supported (full attention only)")
    act = _get(cfg, "hidden_act", "silu")
    if act != "silu":
        raise DitronError(f"hf: hidden_act={act!r} is not supported (SiLU-gated MLP only)")
    H, QH = int(_get(cfg, "hidden_size")), int(_get(cfg, "num_attention_heads"))
    KH = int(_get(cfg, "num_key_value_heads") or QH)
    D = int(_get(cfg, "head_dim") or H // QH)
    theta, scaling = _rope(cfg)
    if tiles is None:
        tiles = tiles_for(H, int(_get(cfg, "intermediate_size")))
    return DecoderConfig(hidden=H, n_q_heads=QH, n_kv_heads=KH, head_dim=D,
                         intermediate=int(_get(cfg, "intermediate_size")), n_layers=int(_get(cfg, "num_hidden_layers")),
                         rms_eps=float(_get(cfg, "rms_norm_eps", 1e-6)), rope_theta=theta, tiles=tiles,
                         qk_norm=(mt == "qwen3"), rope_scaling=scaling, vocab=int(_get(cfg, "vocab_size")))


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError as e:
        raise DitronError("hf: model directories are read with the safetensors package: pip install safetensors "
                          "(or ditron[models])") from e
    return st


def _read_safetensors(path: str) -> dict:
    load_file = _safetensors().load_file
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise DitronError(f"hf: no model.safetensors or model.safetensors.index.json in {path} (save the model with "
                          "save_pretrained(..., safe_serialization=True))")
    sd = {}
    for name in files:
        sd.update(load_file(os.path.join(path, name)))
    return sd


@dataclass
class Checkpoint:
    """A Hugging Face model's config (``hf``: the config dict), the megakernel's :class:`DecoderConfig` of it, its
    state dict (bf16, CPU) and its generation facts (``eos``: the stop token ids of the config)."""
    hf: dict
    cfg: DecoderConfig
    state: dict
    tied: bool
    eos: tuple

    @property
    def arch(self) -> str:
        return self.hf.get("model_type")

    def tensor(self, name: str) -> torch.Tensor:
        t = self.state.get(name)
        if t is None:
            raise DitronError(f"hf: the checkpoint has no tensor {name!r}")
        return t

    def lm_head(self) -> torch.Tensor:
        if "lm_head.weight" in self.state:
            return self.state["lm_head.weight"]
        if self.tied:
            return self.tensor("model.embed_tokens.weight")
        raise DitronError("hf: no lm_head.weight and tie_word_embeddings is false")

    def shard(self, rank: int, world_size: int, device="cpu", max_top_k: int = 64):
        """This rank's ``(Weights, Head)`` (bf16 on ``device``); errors before any copy to the device if the head
        counts or the intermediate size do not divide by ``world_size``."""
        cfg = self.cfg
        sh = cfg.shard(world_size)
        if not 0 <= rank < world_size:
            raise DitronError(f"hf: rank {rank} is not in 0..{world_size - 1}")
        H, D, L, V = cfg.hidden, cfg.head_dim, cfg.n_layers, cfg.vocab
        qs = slice(rank * sh.q_heads * D, (rank + 1) * sh.q_heads * D)
        ks = slice(rank * sh.kv_heads * D, (rank + 1) * sh.kv_heads * D)
        iss = slice(rank * sh.inter, (rank + 1) * sh.inter)
        bf = torch.bfloat16

        def t(name):
            return self.tensor(name).to(bf)
        norm, qkv, qn, kn, o, gu, dn = [], [], [], [], [], [], []
        for l in range(L):
            p = f"model.layers.{l}."
            norm += [t(p + "input_layernorm.weight"), t(p + "post_attention_layernorm.weight")]
            qkv.append(torch.cat([t(p + "self_attn.q_proj.weight")[qs], t(p + "self_attn.k_proj.weight")[ks],
                                  t(p + "self_attn.v_proj.weight")[ks]]))
            if cfg.qk_norm:
                qn.append(t(p + "self_attn.q_norm.weight"))
                kn.append(t(p + "self_attn.k_norm.weight"))
            else:
                qn.append(torch.ones(D, dtype=bf))
                kn.append(torch.ones(D, dtype=bf))
            o.append(t(p + "self_attn.o_proj.weight")[:, qs].contiguous())
            gu.append(torch.cat([t(p + "mlp.gate_proj.weight")[iss], t(p + "mlp.up_proj.weight")[iss]]))
            dn.append(t(p + "mlp.down_proj.weight")[:, iss].contiguous())
        norm.append(t("model.norm.weight"))

        def dev(x):
            return x.contiguous().to(device)
        w = Weights(dev(torch.stack(norm)), dev(torch.stack(qkv)), dev(torch.stack(qn)), dev(torch.stack(kn)),
                    dev(torch.stack(o)), dev(torch.stack(gu)), dev(torch.stack(dn)), cfg.inv_freq().to(device))
        VR = cdiv(V, world_size)
        v_off = rank * VR
        n_valid = max(0, min(VR, V - v_off))
        lm = torch.zeros(1, VR, H, dtype=bf)
        lm[0, :n_valid] = self.lm_head()[v_off:v_off + n_valid].to(bf)
        head = Head(dev(t("model.embed_tokens.weight")), dev(lm), V, v_off, n_valid, max_top_k)
        return w, head


def _eos(gen) -> tuple:
    e = gen.get("eos_token_id")
    if e is None:
        return ()
    return tuple(e) if isinstance(e, (list, tuple)) else (int(e),)


def load(source, tiles: Optional[TileConfig] = None, world_size: Optional[int] = None) -> Checkpoint:
    """A :class:`Checkpoint` from a model directory (``config.json`` + safetensors) or a ``transformers`` model
    object.  The config is checked (:func:`config_from_hf`; with ``world_size``, also that the head counts and the
    intermediate size divide by it) before any weight is read."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        cf = os.path.join(path, "config.json")
        if not os.path.exists(cf):
            raise DitronError(f"hf: {path} has no config.json (a Hugging Face model directory)")
        with open(cf) as f:
            hf = json.load(f)
        cfg = config_from_hf(hf, tiles)
        if world_size:
            cfg.shard(world_size)
        state = _read_safetensors(path)
        gen = dict(hf)
        gp = os.path.join(path, "generation_config.json")
        if os.path.exists(gp):
            with open(gp) as f:
                gen.update({k: v for k, v in json.load(f).items() if v is not None})
    elif hasattr(source, "config") and hasattr(source, "state_dict"):
        hf = source.config.to_dict()
        cfg = config_from_hf(hf, tiles)
        if world_size:
            cfg.shard(world_size)
        state = {k: v.detach().to("cpu") for k, v in source.state_dict().items()}
        gen = dict(hf)
        gc = getattr(source, "generation_config", None)
        if gc is not None and getattr(gc, "eos_token_id", None) is not None:
            gen["eos_token_id"] = gc.eos_token_id
    else:
        raise DitronError(f"hf: load() takes a model directory or a transformers model, got {type(source).__name__}")
    tied = bool(hf.get("tie_word_embeddings", False))
    return Checkpoint(hf, cfg, state, tied, _eos(gen))
