"""Tensor-parallel layers on the zoo's GEMM-overlap ops (Megatron-style TP with sequence parallelism).

    mlp = ditron.nn.TensorParallelMLP.from_linears(fc1, fc2)      # full nn.Linear layers, same on every rank
    y_rows = mlp(x_rows)          # x_rows: this rank's rows [m, d] of the sequence; y_rows: the same rows of mlp(x)

* :class:`ColumnParallelLinear` -- input sharded on the sequence (rows), weight on the output features:
  ``y = all_gather(x) @ W_r^T + b_r`` (AllGather-GEMM, ``torch.ops.ditron.ag_gemm``); output ``[W * m, n_r]``,
  every row, this rank's columns.
* :class:`RowParallelLinear` -- input sharded on the features (what a column-parallel layer gives), weight on
  the input features: ``y = sum over ranks of x_r @ W_r^T`` then ``+ b``, by GEMM-ReduceScatter (``"rs"``:
  this rank's rows ``[M / W, n]``, sequence parallel) or GEMM-AllReduce (``"ar"``: all rows ``[M, n]``).

Built from a full ``nn.Linear`` (``from_linear``: every rank passes the same layer and keeps its shard) or
from this rank's shards (the constructors).  A feature dimension that is not a multiple of the world size is
split in shards of ``ceil(features / W)`` with zero padding on the last ranks (zero weights and bias, so the
padded columns are 0 and contribute nothing to a following row-parallel layer, provided the activation
between them maps 0 to 0, as GELU, ReLU and SiLU do); ``local_features`` is the number of real ones on this
rank.  float16 / bfloat16 (the GEMM kernels' dtypes).  The ops have no autograd
formula: use the layers for inference (``torch.no_grad()`` / ``torch.inference_mode()``).
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


def _param(t):
    return nn.Parameter(t.detach().clone(), requires_grad=False) if t is not None else None


def _weight_param(w):
    """``w [out, in]`` stored column-major: ``weight.t()`` -- the ``b [K, N]`` operand the GEMM kernels take --
    is then row-major and contiguous (the layout their TMA path needs), and ``weight`` keeps ``nn.Linear``'s
    shape.  ``Module.to`` keeps the strides."""
    return nn.Parameter(w.detach().t().contiguous().t(), requires_grad=False)


def _check_weight(what, weight, bias, bias_len):
    if weight.dim() != 2 or weight.dtype not in (torch.float16, torch.bfloat16):
        raise DitronError(f"ditron.nn.{what}: weight must be a 2-D float16/bfloat16 tensor, got "
                          f"{weight.dtype}{list(weight.shape)}")
    if bias is not None and (bias.shape != (bias_len,) or bias.dtype != weight.dtype):
        raise DitronError(f"ditron.nn.{what}: bias must be {weight.dtype}[{bias_len}], got {bias.dtype}{list(bias.shape)}")


class ColumnParallelLinear(nn.Module):
    """``y = all_gather(x) @ weight.T + bias`` with this rank's shard ``weight [n_r, in]`` (rows of the full
    weight) and ``bias [n_r]``.  Input: this rank's rows ``x [m, in]`` (the same ``m`` on every rank); output
    ``[W * m, n_r]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, local_features: int | None = None):
        super().__init__()
        _check_weight("ColumnParallelLinear", weight, bias, weight.shape[0])
        self.weight = _weight_param(weight)
        self.bias = _param(bias)
        self.local_features = weight.shape[0] if local_features is None else int(local_features)
        self.world_size = _topology(None)[1]

    @classmethod
    def from_linear(cls, linear: nn.Linear, world=None):
        """This rank's shard of the full layer ``linear`` (the same on every rank)."""
        rank, W = _topology(world)
        w, real = shard(linear.weight, 0, rank, W)
        b = shard(linear.bias, 0, rank, W)[0] if linear.bias is not None else None
        return cls(w, b, real)

    def forward(self, x):
        y = torch.ops.ditron.ag_gemm(x, self.weight.t(), self.world_size)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return f"in_features={self.weight.shape[1]}, local_out_features={self.local_features}, bias={self.bias is not None}"


class RowParallelLinear(nn.Module):
    """``y = sum over ranks of x_r @ weight_r.T`` plus ``bias`` (the full ``[out]``, added once, after the
    reduction), with this rank's shard ``weight [out, k_r]`` (columns of the full weight).  Input ``x [M, k_r]``
    (the same ``M`` on every rank).  ``reduce="rs"``: GEMM-ReduceScatter, output this rank's rows ``[M / W, out]``
    (``M`` a multiple of the world size); ``"ar"``: GEMM-AllReduce, output ``[M, out]`` on every rank."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, reduce: str = "rs",
                 local_features: int | None = None):
        super().__init__()
        if reduce not in ("rs", "ar"):
            raise DitronError(f"ditron.nn.RowParallelLinear: reduce must be 'rs' or 'ar', got {reduce!r}")
        _check_weight("RowParallelLinear", weight, bias, weight.shape[0])
        self.weight = _weight_param(weight)
        self.bias = _param(bias)
        self.reduce = reduce
        self.local_features = weight.shape[1] if local_features is None else int(local_features)
        self.world_size = _topology(None)[1]

    @classmethod
    def from_linear(cls, linear: nn.Linear, reduce: str = "rs", world=None):
        rank, W = _topology(world)
        w, real = shard(linear.weight, 1, rank, W)
        return cls(w, linear.bias, reduce, real)

    def forward(self, x):
        if self.reduce == "rs":
            y = torch.ops.ditron.gemm_rs(x, self.weight.t(), self.world_size)
        else:
            y = torch.ops.ditron.gemm_ar(x, self.weight.t())
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return (f"local_in_features={self.local_features}, out_features={self.weight.shape[0]}, "
                f"bias={self.bias is not None}, reduce={self.reduce!r}")


class TensorParallelMLP(nn.Module):
    """``fc2(act(fc1(x)))`` with ``fc1`` column-parallel (AllGather-GEMM) and ``fc2`` row-parallel
    (GEMM-ReduceScatter): this rank's rows ``x [m, d]`` in, the same rows of the output ``[m, d_out]`` out
    (sequence parallel; ``reduce="ar"`` gives all rows ``[W * m, d_out]`` instead)."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear, activation=None):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2
        self.act = activation if activation is not None else nn.GELU()

    @classmethod
    def from_linears(cls, fc1: nn.Linear, fc2: nn.Linear, activation=None, reduce: str = "rs", world=None):
        return cls(ColumnParallelLinear.from_linear(fc1, world), RowParallelLinear.from_linear(fc2, reduce, world),
                   activation)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))
