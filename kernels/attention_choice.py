"""Which attention core a call runs (issue 52 items 3 and 5): :func:`choose_core` -- the rule, from a
:class:`DeviceKind` and the shapes, with no device query -- and :func:`resolve_core` -- what
``flash_attention`` / ``ring_attention`` (kernels/attention.py) run for their arguments, cached per device,
shapes, dtype and causality.  The Gluon core (kernels/attention_hopper.py) where it runs and the GPU's table
(kernels/attention_table.py, kernels/attention_tables/) says so, else the tl core, each with its reason."""
from __future__ import annotations

import dataclasses
import os

import torch

import ditron


@dataclasses.dataclass(frozen=True)
class DeviceKind:
    """What the choice of core needs to know of a device, and no more: ``backend`` ``"sim"`` (a CPU tensor:
    the simulator), ``"cuda"`` (NVIDIA) or ``"hip"`` (AMD); ``capability`` ``major * 10 + minor`` (90 on
    Hopper; None off CUDA); the device's ``name`` (which per-GPU table applies)."""
    backend: str
    capability: int | None = None
    name: str = ""


@dataclasses.dataclass(frozen=True)
class CoreChoice:
    """The outcome of :func:`choose_core`: ``core`` ``"tl"`` or ``"gluon"``; ``config`` the
    ``HopperAttnConfig`` of a Gluon choice (None for tl: ``attention.default_config`` by length); ``why``, one line
    (what ``ditron bench ring_attn`` prints)."""
    core: str
    config: object = None
    why: str = ""

    def label(self) -> str:
        return self.config.label() if self.core == "gluon" else "tl"


_DEVICE_KINDS: dict = {}
_CORE_CHOICES: dict = {}
_CORE_CHOICES_MAX = 4096
#: sentinel of :func:`choose_core`'s ``table``: look the device's table up
_DEVICE_TABLE = object()


def device_kind(device) -> DeviceKind:
    """The :class:`DeviceKind` of ``device`` (a tensor's ``.device``), asked of the driver once per device and
    only when a call needs it (never at import)."""
    key = str(device)
    kind = _DEVICE_KINDS.get(key)
    if kind is None:
        device = torch.device(device)
        if device.type != "cuda":
            kind = DeviceKind("sim" if device.type == "cpu" else device.type)
        elif getattr(torch.version, "hip", None):
            kind = DeviceKind("hip", None, torch.cuda.get_device_name(device))
        else:
            major, minor = torch.cuda.get_device_capability(device)
            kind = DeviceKind("cuda", 10 * major + minor, torch.cuda.get_device_name(device))
        _DEVICE_KINDS[key] = kind
    return kind


def _gluon_from_entry(entry, where, head_d):
    from . import attention_hopper as H
    try:
        return H.HopperAttnConfig(**dict(entry["config"])).validate(where, head_d)
    except TypeError as e:
        raise ditron.DitronError(f"{where}: config {entry['config']}: {e}") from None


def choose_core(kind: DeviceKind, world_size, q_shape, k_shape, dtype, causal, contiguous=True,
                table=_DEVICE_TABLE) -> CoreChoice:
    """The core a call runs when it names none (no device query: ``kind`` describes the device).  The Gluon
    core where it runs and its table says so -- a CUDA GPU of capability 9.x, world size 1, ``q`` / ``k``
    4-D ``[B, H, S, D]`` float16 / bfloat16 of D 64 or 128, Hq a multiple of Hkv, contiguous, within the int32
    rows of its TMA descriptors, and a per-GPU table (kernels/attention_table.py; ``table``: an ``AttnTable``
    or None instead of the device's) whose entry for the length is a Gluon one and whose ``verified`` domain
    holds the inputs; else the tl core, with the reason.  ``q_shape[2] * world_size`` is the number of keys."""
    from . import attention_hopper as H
    if kind.backend != "cuda":
        why = {"sim": "the simulator runs the tl core (the Gluon core's twin: attention_hopper.twin_config)",
               "hip": "AMD GPU: the tl core (the Gluon core is NVIDIA sm_90 only)"}.get(
                   kind.backend, f"{kind.backend} device: the tl core")
        return CoreChoice("tl", None, why)
    if kind.capability is None or kind.capability // 10 != 9:
        return CoreChoice("tl", None, f"sm_{kind.capability} is not Hopper (sm_90): the tl core")
    if world_size != 1:
        return CoreChoice("tl", None, f"world size {world_size}: the tl core (the Gluon core has no ring loop over "
                                      "peers' K / V)")
    if len(q_shape) != 4 or len(k_shape) != 4:
        return CoreChoice("tl", None, "not 4-D [B, H, S, D] inputs: the tl core (its checks)")
    B, HQ, S, D = (int(x) for x in q_shape)
    HKV = int(k_shape[1])
    if dtype is None:
        return CoreChoice("tl", None, "k's dtype differs from q's: the tl core (its checks)")
    if dtype not in (torch.float16, torch.bfloat16):
        return CoreChoice("tl", None, f"{dtype}: the tl core (the Gluon core takes float16 / bfloat16)")
    if D not in H.HEAD_DIMS:
        return CoreChoice("tl", None, f"head_dim {D}: the tl core (the Gluon core takes "
                                      f"{' or '.join(map(str, H.HEAD_DIMS))})")
    if min(B, HQ, S, HKV) < 1 or HQ % HKV:
        return CoreChoice("tl", None, "empty input or Hq not a multiple of Hkv: the tl core (its checks)")
    if not contiguous:
        return CoreChoice("tl", None, "non-contiguous inputs: the tl core (the Gluon core reads TMA rows)")
    if max(B * HQ, B * HKV) * S >= 2 ** 31:
        return CoreChoice("tl", None, "more rows than the Gluon core's int32 TMA coordinates: the tl core")
    from . import attention_table
    if table is _DEVICE_TABLE:
        table = attention_table.table_for(kind.name, kind.capability)
    if table is None:
        return CoreChoice("tl", None, f"no attention table for {kind.name or 'this GPU'} "
                                      f"({attention_table.ENV}={os.environ.get(attention_table.ENV, '') or 'unset'}): "
                                      "the tl core")
    entry, dist = table.lookup(S * world_size, causal)
    why = table.describe(entry, dist)
    if entry["core"] != "gluon":
        return CoreChoice("tl", None, why)
    gap = table.unverified({torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype], D, S, int(k_shape[2]))
    if gap:
        return CoreChoice("tl", None, f"{why}; {gap} (tests/gpu/attention_hopper_twin.py): the tl core")
    return CoreChoice("gluon", _gluon_from_entry(entry, f"attention table {table.path}", D), why)


def resolve_core(q, k, causal=False, world_size=1, core=None, config=None) -> CoreChoice:
    """What ``flash_attention`` / ``ring_attention`` run for these arguments: an explicit ``core``
    (with ``config`` or its default), else the core ``config`` implies (:class:`AttnConfig`: tl; a
    ``HopperAttnConfig``: gluon), else :func:`choose_core` for ``q.device`` -- cached per (device, world
    size, shapes, dtype, causal, contiguity), so a call costs a dictionary lookup."""
    if core is not None:
        from .attention import CORES
        if core not in CORES:
            raise ditron.DitronError(f"attention: core={core!r}; use one of {', '.join(CORES)}")
        return CoreChoice(core, config, "explicit core=" + repr(core))
    if config is not None:
        from .attention import AttnConfig
        if isinstance(config, AttnConfig):
            return CoreChoice("tl", config, "an AttnConfig: the tl core")
        from . import attention_hopper as H
        if isinstance(config, H.HopperAttnConfig):
            return CoreChoice("gluon", config, "a HopperAttnConfig: the Gluon core")
        raise ditron.DitronError(f"attention: config must be an AttnConfig (tl core) or a HopperAttnConfig "
                                 f"(Gluon core), not {type(config).__name__}")
    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
        return CoreChoice("tl", None, "not tensors: the tl core (its checks)")
    from . import attention_table
    contiguous = q.is_contiguous() and k.is_contiguous()
    key = (str(q.device), int(world_size), tuple(q.shape), tuple(k.shape), q.dtype, k.dtype, bool(causal),
           contiguous, os.environ.get(attention_table.ENV, ""))
    choice = _CORE_CHOICES.get(key)
    if choice is None:
        dtype = q.dtype if k.dtype == q.dtype else None
        choice = choose_core(device_kind(q.device), world_size, tuple(q.shape), tuple(k.shape), dtype, causal,
                             contiguous)
        if len(_CORE_CHOICES) >= _CORE_CHOICES_MAX:
            _CORE_CHOICES.clear()
        _CORE_CHOICES[key] = choice
    return choice


def clear_core_cache():
    """Forget the cached device kinds and choices (after changing ``DITRON_ATTN_TABLE`` or the tables)."""
    _DEVICE_KINDS.clear()
    _CORE_CHOICES.clear()
    from . import attention_table
    attention_table.clear_cache()
