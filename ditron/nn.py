"""Tensor-parallel layers on the zoo's GEMM-overlap ops (Megatron-style TP with sequence parallelism).

    mlp = ditron.nn.TensorParallelMLP.from_linears(fc1, fc2)      # full nn.Linear layers, same on every rank
    y_rows = mlp(x_rows)          # x_rows: this rank's rows [m, d] of the sequence; y_rows: the same rows of mlp(x)

* :class:`ColumnParallelLinear` -- input sharded on the sequence (rows), weight on the output features:
  ``y = all_gather(x) @ W_r^T + b_r`` (AllGather-GEMM, ``torch.ops.ditron.ag_gemm``); output ``[W * m, n_r]``,
  every row, this rank's columns.
* :class:`RowParallelLinear` -- input sharded on the features (what a column-parallel layer gives), weight on
  the input features: ``y = sum over ranks of x_r @ W_r^T`` then ``+ b``, by GEMM-ReduceScatter (``"rs"``:
  this rank's rows ``[M / W, n]``, sequence parallel) or GEMM-AllReduce (``"ar"``: all rows ``[M, n]``).

Built from a full ``nn.Linear`` (``from_linear``: every rank passes the same layer and keeps its shard; a
fingerprint of its weight and bias is compared across ranks at construction, one small collective, so layers that
differ across ranks -- no common seed -- are an error naming the layer and each rank's value) or from this rank's
shards (the constructors).  A feature dimension that is not a multiple of the world size is
split in shards of ``ceil(features / W)`` with zero padding on the last ranks (zero weights and bias, so the
padded columns are 0 and contribute nothing to a following row-parallel layer, provided the activation
between them maps 0 to 0, as GELU, ReLU and SiLU do); ``local_features`` is the number of real ones on this
rank.  float16 / bfloat16 (the GEMM kernels' dtypes).

Training: the parameters (this rank's shards) require grad; the backward runs ditron's ops (the column-parallel
layer's input gradient by GEMM-ReduceScatter, the row-parallel one's by AllGather-GEMM; see
``ditron/torch_ops.py``), an optimizer step updates the shards, and ``state_dict`` / ``load_state_dict`` save
and load this rank's shards (checked against the rank and world size at loading).  Gradients follow the ops'
convention: the loss is the sum of every rank's loss (each rank's loss on its own rows).  Replicated parameters
(the row-parallel bias, :class:`SequenceParallelLayerNorm`'s) get the gradient summed over ranks
(:func:`replicated`), so they stay equal on every rank.  ``inference=True`` builds frozen layers for inference
only: calling one with gradients enabled is an error (use ``torch.no_grad()`` / ``torch.inference_mode()``).
"""
from __future__ import annotations

import torch
from torch import nn

from . import torch_ops  # noqa: F401  (registers torch.ops.ditron.*)
from .errors import DitronError
from .runtime.world import current_world


def _topology(world):
    world = world or current_world(required=False)
    if world is None:
        raise DitronError("ditron.nn: building a tensor-parallel layer needs a ditron world: call ditron.init() first")
    return world.rank, world.world_size


def shard(t: torch.Tensor, dim: int, rank: int, world_size: int):
    """``(shard, real)``: rank's part of ``t`` along ``dim`` in equal shards of ``ceil(size / world_size)``
    (the last ones zero-padded) and the number of real (unpadded) entries in it."""
    size = t.shape[dim]
    per = -(-size // world_size)
    lo, hi = min(rank * per, size), min((rank + 1) * per, size)
    part = t.narrow(dim, lo, hi - lo)
    if hi - lo < per:
        pad = list(t.shape)
        pad[dim] = per - (hi - lo)
        part = torch.cat([part, t.new_zeros(pad)], dim)
    return part.contiguous(), hi - lo


def fingerprint(t: torch.Tensor | None) -> str:
    """A digest of a tensor's exact values (bits, position, dtype, shape), computed where the tensor is (chunked
    integer arithmetic: exact and independent of the summation order), as a short text; ``"none"`` for None."""
    if t is None:
        return "none"
    shape = list(t.shape)
    t = t.detach().contiguous().reshape(-1)
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = t.view(ints)
    h1 = h2 = 0
    step = 1 << 20
    for lo in range(0, bits.numel(), step):
        b = bits[lo:lo + step].to(torch.int64)
        idx = torch.arange(lo, lo + b.numel(), dtype=torch.int64, device=b.device)
        h1 += int(((b + 40503) * (idx * 2654435761 + 97)).sum())
        h2 += int(((b ^ 0x5BD1) * (idx * 40503 + 2246822519)).sum())
    mask = (1 << 64) - 1
    return f"{str(t.dtype).replace('torch.', '')}{shape}:{h1 & mask:016x}{h2 & mask:016x}"


_AGREE: dict = {}      # id(world) -> [world, CallBoard (simulator) or the store prefix (GPUs), calls]


def check_same_on_every_rank(what: str, fields, world=None) -> None:
    """One small collective: every rank's ``fields`` (``[(name, text)]``, e.g. weight fingerprints) must be equal.
    A layer built from "the same" full module on every rank (``from_linear``) reads its shard from it: modules that
    differ across ranks (no common seed) would give a silently wrong model.  Simulator: through a small symmetric
    board (as the zoo's argument checks); GPUs: through torch.distributed's store (host only), when it is up."""
    world = world or current_world(required=False)
    if world is None or world.world_size == 1:
        return
    from .runtime import consistency as C
    state = _AGREE.get(id(world))
    if state is not None and state[0] is not world:           # (another world at a reused id)
        state = None
    if world.backend == "sim":
        words = getattr(state[1], "words", None) if state else None
        alloc = getattr(words, "_ditron_alloc", None)
        if state is None or alloc is not None and alloc.freed:        # (a heap_scope freed the board: a new one)
            state = _AGREE[id(world)] = [world, C.CallBoard(world, "ditron.nn"), 0]
        try:
            state[1].check(what, fields)
        except DitronError as e:
            raise _differ(what, e) from None
        return
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world.world_size:
        return          # (a world on a sub-group: its ranks' keys in the default store would collide; not checked)
    if state is None:
        state = _AGREE[id(world)] = [world, f"ditron/nn/{len(_AGREE)}", 0]
    call = state[2]
    state[2] += 1
    fp = {"op": what, "call": call, "fields": [(k, str(v)) for k, v in fields], "site": C.call_site()}
    fps = C.exchange_via_store(dist.distributed_c10d._get_default_store(), state[1], world.rank, world.world_size,
                               fp, call, "ditron.nn layers", C.gpu_timeout_s())
    try:
        C.compare(fps, call, "ditron.nn layers")
    except DitronError as e:
        raise _differ(what, e) from None


def _differ(what, e):
    return DitronError(f"{e}\nditron.nn.{what} shards a full layer that must be the same on every rank, and it "
                       "is not: seed every rank alike before building it (torch.manual_seed(S) on every rank), "
                       "broadcast it from rank 0 (torch.distributed.broadcast of each parameter) or load the same "
                       "checkpoint everywhere; or build the layer from this rank's own shards "
                       "(ColumnParallelLinear(weight_shard, bias_shard), RowParallelLinear(weight_shard, bias))")


def _linear_fields(linear):
    return [("weight", fingerprint(linear.weight)), ("bias", fingerprint(linear.bias))]


def _check_input(what, x, features, name):
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != features:
        got = f"{x.dtype}{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise DitronError(f"ditron.nn.{what}: input must be [rows, {features}] ({name} = {features} on this rank), "
                          f"got {got}")


def _param(t, inference=False):
    return nn.Parameter(t.detach().clone(), requires_grad=not inference) if t is not None else None


def _weight_param(w, inference=False):
    """``w [out, in]`` stored column-major: ``weight.t()`` -- the ``b [K, N]`` operand the GEMM kernels take --
    is then row-major and contiguous (the layout their TMA path needs), and ``weight`` keeps ``nn.Linear``'s
    shape.  ``Module.to`` keeps the strides (and so do optimizers' in-place updates and the gradients)."""
    return nn.Parameter(w.detach().t().contiguous().t(), requires_grad=not inference)


class _Replicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return torch.ops.ditron.all_reduce(g.contiguous())


def replicated(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a parameter that every rank holds the same, e.g. a bias added after a reduction or a sequence-parallel
    norm's weight), whose gradient is summed over ranks in the backward (``torch.ops.ditron.all_reduce``): each
    rank's loss contributes, and the parameter stays the same on every rank after an optimizer step.  ``t``
    itself when no gradient is recorded or on one rank."""
    world = current_world(required=False)
    if world is None or world.world_size == 1 or not (torch.is_grad_enabled() and t.requires_grad):
        return t
    return _Replicated.apply(t)


class _TPModule(nn.Module):
    """State shared by the layers: the rank and world size the shards are for (saved in the state dict and
    checked at loading), ``inference``."""

    def _tp_init(self, inference):
        self.rank, self.world_size = _topology(None)
        self.inference = bool(inference)

    def _check_mode(self, what):
        if self.inference and torch.is_grad_enabled():
            raise DitronError(f"ditron.nn.{what} was built with inference=True (frozen parameters, for inference "
                              "only) and is called with gradients enabled: call it under torch.no_grad() / "
                              "torch.inference_mode(), or build it trainable (the default, inference=False)")

    def get_extra_state(self):
        return {"rank": self.rank, "world_size": self.world_size, "local_features": self.local_features}

    def set_extra_state(self, state):
        mine = (self.rank, self.world_size)
        if (state.get("rank"), state.get("world_size")) != mine:
            raise DitronError(f"ditron.nn.{type(self).__name__}: the state dict holds the shard of rank "
                              f"{state.get('rank')} of {state.get('world_size')}; this layer is rank {mine[0]} of "
                              f"{mine[1]}: load each rank's own state dict")
        self.local_features = int(state.get("local_features", self.local_features))


class SequenceParallelLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` on this rank's rows (sequence parallel) whose weight and bias, the same on every rank,
    get their gradients summed over ranks (:func:`replicated`)."""

    def forward(self, x):
        w = replicated(self.weight) if self.weight is not None else None
        b = replicated(self.bias) if self.bias is not None else None
        return nn.functional.layer_norm(x, self.normalized_shape, w, b, self.eps)


def _check_weight(what, weight, bias, bias_len):
    if weight.dim() != 2 or weight.dtype not in (torch.float16, torch.bfloat16):
        raise DitronError(f"ditron.nn.{what}: weight must be a 2-D float16/bfloat16 tensor, got "
                          f"{weight.dtype}{list(weight.shape)}")
    if bias is not None and (bias.shape != (bias_len,) or bias.dtype != weight.dtype):
        raise DitronError(f"ditron.nn.{what}: bias must be {weight.dtype}[{bias_len}], got {bias.dtype}{list(bias.shape)}")


class ColumnParallelLinear(_TPModule):
    """``y = all_gather(x) @ weight.T + bias`` with this rank's shard ``weight [n_r, in]`` (rows of the full
    weight) and ``bias [n_r]``.  Input: this rank's rows ``x [m, in]`` (the same ``m`` on every rank); output
    ``[W * m, n_r]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, local_features: int | None = None,
                 inference: bool = False):
        super().__init__()
        _check_weight("ColumnParallelLinear", weight, bias, weight.shape[0])
        self.weight = _weight_param(weight, inference)
        self.bias = _param(bias, inference)
        self.local_features = weight.shape[0] if local_features is None else int(local_features)
        self._tp_init(inference)

    @classmethod
    def from_linear(cls, linear: nn.Linear, world=None, _what="ColumnParallelLinear.from_linear", inference=False):
        """This rank's shard of the full layer ``linear`` (the same on every rank: checked across ranks, one
        small collective)."""
        rank, W = _topology(world)
        check_same_on_every_rank(_what, _linear_fields(linear), world)
        w, real = shard(linear.weight, 0, rank, W)
        b = shard(linear.bias, 0, rank, W)[0] if linear.bias is not None else None
        return cls(w, b, real, inference=inference)

    def forward(self, x):
        _check_input("ColumnParallelLinear", x, self.weight.shape[1], "in_features")
        self._check_mode("ColumnParallelLinear")
        y = torch.ops.ditron.ag_gemm(x, self.weight.t(), self.world_size)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return f"in_features={self.weight.shape[1]}, local_out_features={self.local_features}, bias={self.bias is not None}"


class RowParallelLinear(_TPModule):
    """``y = sum over ranks of x_r @ weight_r.T`` plus ``bias`` (the full ``[out]``, added once, after the
    reduction), with this rank's shard ``weight [out, k_r]`` (columns of the full weight).  Input ``x [M, k_r]``
    (the same ``M`` on every rank).  ``reduce="rs"``: GEMM-ReduceScatter, output this rank's rows ``[M / W, out]``
    (``M`` a multiple of the world size); ``"ar"``: GEMM-AllReduce, output ``[M, out]`` on every rank."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, reduce: str = "rs",
                 local_features: int | None = None, inference: bool = False):
        super().__init__()
        if reduce not in ("rs", "ar"):
            raise DitronError(f"ditron.nn.RowParallelLinear: reduce must be 'rs' or 'ar', got {reduce!r}")
        _check_weight("RowParallelLinear", weight, bias, weight.shape[0])
        self.weight = _weight_param(weight, inference)
        self.bias = _param(bias, inference)
        self.reduce = reduce
        self.local_features = weight.shape[1] if local_features is None else int(local_features)
        self._tp_init(inference)

    @classmethod
    def from_linear(cls, linear: nn.Linear, reduce: str = "rs", world=None, _what="RowParallelLinear.from_linear",
                    inference=False):
        """This rank's shard of the full layer ``linear`` (the same on every rank: checked across ranks)."""
        rank, W = _topology(world)
        check_same_on_every_rank(_what, _linear_fields(linear), world)
        w, real = shard(linear.weight, 1, rank, W)
        return cls(w, linear.bias, reduce, real, inference=inference)

    def forward(self, x):
        _check_input("RowParallelLinear", x, self.weight.shape[1],
                     "local in_features, the column-parallel layer's local out_features")
        self._check_mode("RowParallelLinear")
        if self.reduce == "rs":
            y = torch.ops.ditron.gemm_rs(x, self.weight.t(), self.world_size)
        else:
            y = torch.ops.ditron.gemm_ar(x, self.weight.t())
        return y + replicated(self.bias) if self.bias is not None else y

    def extra_repr(self):
        return (f"local_in_features={self.local_features}, out_features={self.weight.shape[0]}, "
                f"bias={self.bias is not None}, reduce={self.reduce!r}")


class TensorParallelMLP(nn.Module):
    """``fc2(act(fc1(x)))`` with ``fc1`` column-parallel (AllGather-GEMM) and ``fc2`` row-parallel
    (GEMM-ReduceScatter): this rank's rows ``x [m, d]`` in, the same rows of the output ``[m, d_out]`` out
    (sequence parallel; ``reduce="ar"`` gives all rows ``[W * m, d_out]`` instead)."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear, activation=None):
        super().__init__()
        if fc1.weight.shape[0] != fc2.weight.shape[1]:
            raise DitronError(f"ditron.nn.TensorParallelMLP: fc1 gives {fc1.weight.shape[0]} features per rank, fc2 "
                              f"takes {fc2.weight.shape[1]}: fc2's in_features must be fc1's out_features")
        self.fc1, self.fc2 = fc1, fc2
        self.act = activation if activation is not None else nn.GELU()

    @classmethod
    def from_linears(cls, fc1: nn.Linear, fc2: nn.Linear, activation=None, reduce: str = "rs", world=None,
                     inference: bool = False):
        if fc1.out_features != fc2.in_features:
            raise DitronError(f"ditron.nn.TensorParallelMLP.from_linears: fc1 has {fc1.out_features} out_features, "
                              f"fc2 {fc2.in_features} in_features: they must be equal")
        return cls(ColumnParallelLinear.from_linear(fc1, world, _what="TensorParallelMLP.from_linears (fc1)",
                                                    inference=inference),
                   RowParallelLinear.from_linear(fc2, reduce, world, _what="TensorParallelMLP.from_linears (fc2)",
                                                 inference=inference),
                   activation)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))
