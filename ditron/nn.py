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


# ---------------------------------------------------------------------------
# mixture of experts, expert parallel (EP dispatch -> grouped GEMM experts -> EP combine), trainable
# ---------------------------------------------------------------------------
# The EP kernels (kernels/ep.py) keep their outputs and the dispatch's handle in two slots of their context, reused
# by the second next call; autograd needs them later (the backward runs after the other layers' forwards), so the
# functions below copy what they keep: the outputs are new tensors and the handle's tensors are cloned.

def _kernel_module(name):
    import importlib
    return importlib.import_module("ditron.kernels." + name)


class EpRoute:
    """What an autograd-aware :func:`ep_dispatch` keeps for its combine and for the backward: the EP context, the
    routing (``topk_idx``, the ``topk_weights`` as given), the kernels' handle with its tensors copied (valid after
    later dispatches on the same context), the received counts, and the float32 helper context of the weight
    gradient (``aux``, see :class:`ExpertParallelMoE`)."""

    def __init__(self, ctx, aux, topk_idx, topk_weights, handle=None, recv_counts=None, validate=False):
        self.ctx, self.aux, self.topk_idx, self.topk_weights = ctx, aux, topk_idx, topk_weights
        self.handle, self.recv_counts, self.validate = handle, recv_counts, validate

    def rows(self):
        return self.ctx.world_size * self.ctx.slot_rows


def _copy_handle(handle):
    """A copy of an EP handle whose tensors are the caller's (the kernels' are reused by the second next dispatch)."""
    ep = _kernel_module("ep")
    tensors = {k: v.clone() for k, v in vars(handle).items()
               if isinstance(v, torch.Tensor) and k not in ("weights", "dropped")}
    return ep.EpHandle(handle.mode, handle.T, handle.k, handle.weights, handle.dropped.clone(), **tensors)


def _with_weights(handle, weights):
    """The same handle (its tensors shared) with other pair weights (e.g. ones: a plain sum over the pairs)."""
    ep = _kernel_module("ep")
    tensors = {k: v for k, v in vars(handle).items()
               if isinstance(v, torch.Tensor) and k not in ("weights", "dropped")}
    return ep.EpHandle(handle.mode, handle.T, handle.k, weights, handle.dropped, **tensors)


def _ones(handle, device):
    return torch.ones((handle.T, handle.k), dtype=torch.float32, device=device)


def _valid_rows(recv_counts, rows):
    """``[rows]`` bool: the received rows (the first ``sum(recv_counts)``), on the device (no host read)."""
    return torch.arange(rows, device=recv_counts.device) < recv_counts.sum()


def _raw_dispatch(x, route, validate=False):
    """The kernels' dispatch of ``x`` along ``route``'s routing: a new ``[W * max_tokens * k, H]`` tensor, rows past
    the received ones zero."""
    ep = _kernel_module("ep")
    recv, counts, handle = ep.ep_dispatch(x.contiguous(), route.topk_idx, route.topk_weights.detach(), route.ctx,
                                          validate=validate)
    return torch.where(_valid_rows(counts, recv.shape[0])[:, None], recv, 0), counts, handle


def _raw_combine(y, handle, ctx, T):
    ep = _kernel_module("ep")
    out = torch.empty((T, ctx.hidden), dtype=y.dtype, device=y.device)
    return ep.ep_combine(y.contiguous(), handle, ctx, out=out)


class _EpDispatchFn(torch.autograd.Function):
    """``recv_x = dispatch(x)``; backward: ``dx[t] = sum_j d recv_x[row of (t, j)]``, the combine of the gradient
    with unit weights (EP combine's kernel)."""

    @staticmethod
    def forward(ctx, x, route):
        ctx.route = route
        recv, _, _ = _raw_dispatch_first(x, route)
        return recv

    @staticmethod
    def backward(ctx, g):
        route = ctx.route
        h = route.handle
        return _raw_combine(g, _with_weights(h, _ones(h, g.device)), route.ctx, h.T), None


def _raw_dispatch_first(x, route):
    recv, counts, handle = _raw_dispatch(x, route, validate=route.validate)
    route.handle, route.recv_counts = _copy_handle(handle), counts.clone()
    return recv, counts, handle


def _expert_of_rows(route):
    """Global expert id of every received row (``-1`` past the received ones)."""
    c = route.ctx
    rows = route.rows()
    ends = torch.cumsum(route.recv_counts, 0)
    local = torch.searchsorted(ends, torch.arange(rows, device=ends.device), right=True)
    return torch.where(local < c.local_experts, local + c.rank * c.local_experts, -1)


class _EpCombineFn(torch.autograd.Function):
    """``out[t] = sum_j w[t, j] * y[row of (t, j)]`` (EP combine's kernel, fp32 accumulation).  Backward:
    ``dy[row of (t, j)] = w[t, j] * dout[t]`` -- a dispatch of ``dout`` (EP dispatch's kernel) scaled per row by
    its pair's weight -- and ``dw[t, j] = <dout[t], y[row of (t, j)]>``: each row's value goes back to its pair by
    EP combine on the float32 helper context.  The row weights and slots come from a dispatch of ``[w, topk_idx]``
    on that context (so a token routed twice to one expert is exact: its rows share the sum of its weights)."""

    @staticmethod
    def forward(ctx, y, weights, route):
        ctx.route = route
        ctx.save_for_backward(y if weights.requires_grad else None, weights)
        return _raw_combine(y, _with_weights(route.handle, weights.detach()), route.ctx, route.handle.T)

    @staticmethod
    def backward(ctx, dout):
        route = ctx.route
        y, weights = ctx.saved_tensors
        T, k = route.handle.T, route.handle.k
        r, _, _ = _raw_dispatch(dout, route)                                   # r[row of (t, j)] = dout[t]
        # the helper dispatch: every row learns its pair's weights and expert ids ([w, ids] of its token)
        aux_in = torch.cat([weights.detach().float(), route.topk_idx.float()], 1)
        aux_route = EpRoute(route.aux, None, route.topk_idx, route.topk_weights)
        a, _, ahandle = _raw_dispatch(aux_in, aux_route)
        e_row = _expert_of_rows(route)
        match = (a[:, k:] == e_row[:, None].float()) & (e_row[:, None] >= 0)      # [rows, k]: the row's slots
        n = match.sum(1, keepdim=True).clamp_min(1)
        w_row = (a[:, :k] * match).sum(1) / n[:, 0]
        dy = (r.float() * w_row[:, None]).to(dout.dtype)
        dw = None
        if ctx.needs_input_grad[1]:
            s = (r.float() * y.float()).sum(1)                                 # <dout[t], y[row]> per row
            back = torch.zeros_like(a)
            back[:, :k] = s[:, None] * match / n
            dw = _raw_combine(back, _with_weights(ahandle, _ones(ahandle, back.device)), route.aux, T)[:, :k]
            dw = dw.to(weights.dtype)
        return dy, dw, None


def ep_dispatch(x, topk_idx, topk_weights, ctx, aux=None, validate=True):
    """Autograd-aware EP dispatch (normal mode): ``(recv_x, recv_counts, route)``, ``recv_x`` the kernels' layout
    (``[W * max_tokens * k, H]``, rows grouped by local expert; a new tensor, the rows past ``recv_counts.sum()``
    zero).  ``recv_x``'s gradient flows back to ``x`` by EP combine.  ``aux``: the float32 helper context of
    ``ep_combine``'s weight gradient (:func:`create_ep_aux_context`); without it the weights get no gradient."""
    if ctx.mode != "normal":
        raise DitronError("ditron.nn.ep_dispatch: training goes through a normal-mode EP context (low-latency mode is "
                          "for decode: its [experts, capacity, H] layout has no backward here); create the context "
                          "with mode='normal'")
    route = EpRoute(ctx, aux, topk_idx.contiguous(), topk_weights, validate=validate)
    recv = _EpDispatchFn.apply(x, route)
    return recv, route.recv_counts, route


def ep_combine(y, route):
    """Autograd-aware EP combine: ``out[t] = sum_j topk_weights[t, j] * y[row of (t, j)]``; gradients flow to
    ``y`` (by EP dispatch) and, with an ``aux`` context in the dispatch, to ``topk_weights``."""
    w = route.topk_weights
    if route.aux is None and isinstance(w, torch.Tensor) and w.requires_grad and torch.is_grad_enabled():
        raise DitronError("ditron.nn.ep_combine: topk_weights requires grad but the dispatch has no aux context: "
                          "pass aux=ditron.nn.create_ep_aux_context(...) to ep_dispatch (or detach the weights)")
    return _EpCombineFn.apply(y, w, route)


def create_ep_aux_context(max_tokens, num_experts, topk, world=None):
    """The float32 EP context (``hidden = 2 * topk``) that carries each pair's weight and expert id to its row in
    the backward of :func:`ep_combine` (collective, as every EP context)."""
    return _kernel_module("ep").create_ep_context(max_tokens, 2 * topk, num_experts, topk, torch.float32, world)


class _GroupedMMFn(torch.autograd.Function):
    """``out[rows of e] = a[rows of e] @ w[e]`` (the grouped GEMM kernel).  Backward: ``da`` by the grouped GEMM
    kernel with ``w[e]^T`` (a strided view); ``dw[e] = a[rows of e]^T @ dout[rows of e]`` by torch matmuls per expert
    (the counts are read back once: the kernel has no per-expert reduction over rows)."""

    @staticmethod
    def forward(ctx, a, w, counts):
        ctx.save_for_backward(a, w, counts)
        out = torch.zeros((a.shape[0], w.shape[2]), dtype=a.dtype, device=a.device)
        return _kernel_module("moe").grouped_gemm(a.contiguous(), w, counts, out=out)

    @staticmethod
    def backward(ctx, g):
        a, w, counts = ctx.saved_tensors
        g = g.contiguous()
        da = dw = None
        if ctx.needs_input_grad[0]:
            da = torch.zeros_like(a)
            _kernel_module("moe").grouped_gemm(g, w.transpose(1, 2), counts, out=da)
        if ctx.needs_input_grad[1]:
            dw = torch.zeros((w.shape[0], w.shape[1], w.shape[2]), dtype=torch.float32, device=w.device)
            off = 0
            for e, c in enumerate(counts.tolist()):
                c = max(0, min(int(c), a.shape[0] - off))
                if c:
                    dw[e] = a[off:off + c].float().t() @ g[off:off + c].float()
                off += c
            dw = dw.to(w.dtype)
        return da, dw, None


def grouped_mm(a, w, counts):
    """Autograd-aware grouped GEMM (``ditron.kernels.moe.grouped_gemm``): rows past ``sum(counts)`` are zero."""
    return _GroupedMMFn.apply(a, w, counts)


class ExpertParallelMoE(_TPModule):
    """A mixture-of-experts layer, expert parallel: a router (``gate``: ``[E, H]``, the same on every rank; softmax
    of ``x @ gate^T`` in float32, top ``k``, renormalized when ``normalize``), EP dispatch, this rank's experts
    ``act(x @ w1[e]) @ w2[e]`` by the grouped GEMM kernel (``w1 [E_local, H, F]``, ``w2 [E_local, F, H]``: experts
    ``[rank * E_local, (rank + 1) * E_local)``), EP combine.  Input: this rank's tokens ``x [T, H]`` (``T <=
    max_tokens``, any number per rank); output ``[T, H]``.

    Training: the experts' weights get their exact gradients on their owner (every token routed to an expert comes
    there), the gate -- replicated -- gets its gradient summed over ranks (:func:`replicated`); the backward runs EP
    combine for dispatch, EP dispatch for combine, the grouped GEMM for the input gradient of the experts (their
    weight gradient by torch matmuls per expert).  Builds two EP contexts (collective: every rank builds its layers
    in the same order): the data's and a float32 one for the routing weights' gradient."""

    def __init__(self, gate: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk: int, max_tokens: int,
                 activation=None, normalize: bool = True, inference: bool = False):
        super().__init__()
        self._tp_init(inference)
        W = self.world_size
        bad = DitronError
        if w1.dim() != 3 or w2.dim() != 3 or w1.shape[0] != w2.shape[0] or w1.shape[2] != w2.shape[1] or \
                w1.shape[1] != w2.shape[2]:
            raise bad(f"ditron.nn.ExpertParallelMoE: w1 must be [E_local, H, F] and w2 [E_local, F, H], got "
                      f"{list(w1.shape)} and {list(w2.shape)}")
        El, H = w1.shape[0], w1.shape[1]
        if gate.dim() != 2 or gate.shape != (El * W, H):
            raise bad(f"ditron.nn.ExpertParallelMoE: gate must be [num_experts = {El} x {W} ranks, hidden = {H}], "
                      f"got {list(gate.shape)}")
        if w1.dtype not in (torch.float16, torch.bfloat16) or w2.dtype != w1.dtype or gate.dtype != w1.dtype:
            raise bad(f"ditron.nn.ExpertParallelMoE: gate, w1 and w2 must be one float16/bfloat16 dtype, got "
                      f"{gate.dtype}, {w1.dtype}, {w2.dtype}")
        if not 1 <= int(topk) <= El * W:
            raise bad(f"ditron.nn.ExpertParallelMoE: topk={topk} must be in [1, num_experts={El * W}]")
        self.gate = _param(gate, inference)
        self.w1, self.w2 = _param(w1, inference), _param(w2, inference)
        self.topk, self.max_tokens, self.normalize = int(topk), int(max_tokens), bool(normalize)
        self.num_experts, self.local_features = El * W, El
        self.act = activation if activation is not None else nn.GELU()
        ep = _kernel_module("ep")
        self.ep_ctx = ep.create_ep_context(self.max_tokens, H, self.num_experts, self.topk, w1.dtype)
        self.aux_ctx = create_ep_aux_context(self.max_tokens, self.num_experts, self.topk)

    @classmethod
    def from_experts(cls, gate: nn.Linear, w1: torch.Tensor, w2: torch.Tensor, topk: int, max_tokens: int,
                     activation=None, normalize: bool = True, world=None, inference: bool = False):
        """This rank's experts of the full layer (``gate``: ``nn.Linear(H, E, bias=False)``, ``w1 [E, H, F]``,
        ``w2 [E, F, H]``: the same on every rank, checked across ranks, one small collective)."""
        rank, W = _topology(world)
        if gate.bias is not None:
            raise DitronError("ditron.nn.ExpertParallelMoE.from_experts: the gate must have no bias (nn.Linear(hidden, "
                              "num_experts, bias=False))")
        check_same_on_every_rank("ExpertParallelMoE.from_experts",
                                 [("gate", fingerprint(gate.weight)), ("w1", fingerprint(w1)), ("w2", fingerprint(w2))],
                                 world)
        E = w1.shape[0]
        if E % W:
            raise DitronError(f"ditron.nn.ExpertParallelMoE.from_experts: {E} experts are not a multiple of the world "
                              f"size {W} (each rank owns num_experts / world_size experts)")
        El = E // W
        return cls(gate.weight, w1[rank * El:(rank + 1) * El], w2[rank * El:(rank + 1) * El], topk, max_tokens,
                   activation, normalize, inference)

    def route(self, x, topk_idx=None):
        """``(topk_idx, topk_weights)`` for ``x``: the gate's top ``k`` experts (or the given ``topk_idx [T, k]``,
        e.g. a forced routing) and their softmax probabilities (renormalized when ``normalize``), float32 and
        differentiable in the gate and ``x``."""
        logits = nn.functional.linear(x.float(), replicated(self.gate).float())
        probs = torch.softmax(logits, -1)
        if topk_idx is None:
            w, topk_idx = probs.topk(self.topk, -1)
        else:
            if not isinstance(topk_idx, torch.Tensor) or tuple(topk_idx.shape) != (x.shape[0], self.topk) or \
                    topk_idx.dtype not in (torch.int32, torch.int64):
                raise DitronError(f"ditron.nn.ExpertParallelMoE: topk_idx must be an int32/int64 tensor "
                                  f"[tokens={x.shape[0]}, topk={self.topk}]")
            w = probs.gather(1, topk_idx.long())
        if self.normalize:
            w = w / w.sum(-1, keepdim=True)
        return topk_idx, w

    def forward(self, x, topk_idx=None):
        """``x [T, H]`` -> ``[T, H]``.  ``topk_idx`` given: that routing instead of the gate's top ``k`` (the weights
        are still the gate's probabilities of those experts)."""
        H = self.w1.shape[1]
        _check_input("ExpertParallelMoE", x, H, "hidden")
        self._check_mode("ExpertParallelMoE")
        topk_idx, topk_weights = self.route(x, topk_idx)
        recv, counts, route = ep_dispatch(x, topk_idx, topk_weights, self.ep_ctx, aux=self.aux_ctx)
        h = self.act(grouped_mm(recv, self.w1, counts))
        y = grouped_mm(h, self.w2, counts)
        return ep_combine(y, route)

    def extra_repr(self):
        return (f"hidden={self.w1.shape[1]}, ffn={self.w1.shape[2]}, num_experts={self.num_experts}, "
                f"local_experts={self.local_features}, topk={self.topk}, max_tokens={self.max_tokens}")
