"""The zoo as registered torch ops: ``torch.ops.ditron.<name>``.

    import ditron.torch_ops                      # registers the ops (import it once, anywhere)
    world = ditron.init()
    c = torch.ops.ditron.ag_gemm(a, b, world.world_size)     # all_gather(a) @ b
    model = torch.compile(model, fullgraph=True)  # traces through the ops, no graph break

Every op is a :func:`torch.library.custom_op` with a fake (meta) implementation giving the output's shape,
dtype and strides, so ``torch.compile`` traces a model that calls them and CUDA graphs capture them.  No
context goes through the graph: an op finds its context in a cache of the current world, keyed by the op and
a *shape class* -- dtype, the fixed dimensions (``K``, ``N``, ``hidden``) and the varying row count rounded
up to a power of two -- and creates it at the first call of that class.  Creating a context is collective
(symmetric allocation and a barrier): every rank must call the ops with the same shapes in the same order,
as with the zoo functions.  Before capturing a CUDA graph, run the step once eagerly (warm-up) so that its
contexts exist; an op whose context is missing during capture raises ``DitronError``.

Ops (``W`` = world size).  An op whose output shape depends on the world size takes it as the argument
``world_size`` (checked against the world's): the fake implementation needs it, and so it is part of the
traced graph and of torch.compile's caches (a graph compiled for 2 ranks is never reused for 4).

===========================================  ==========================  ===================================
op                                           inputs                      output
===========================================  ==========================  ===================================
``all_reduce(x, method="auto")``             ``x`` any shape             sum over ranks, like ``x``
``all_gather(x, world_size, method="auto")`` ``x [m, ...]``              ``[W * m, ...]`` (0-dim: ``[W]``)
``reduce_scatter(x, world_size, method)``    ``x [W * m, ...]``          ``[m, ...]``: this rank's shard
``all_to_all(x)``                            ``x [W * t, hidden]``       ``[W * t, hidden]``
``ag_gemm(a, b, world_size)``                ``a [m, K]``, ``b [K, N]``  ``all_gather(a) @ b``: ``[W * m, N]``
``gemm_rs(a, b, world_size)``                ``a [M, K]``, ``b [K, N]``  this rank's ``M / W`` rows of the sum
``gemm_ar(a, b, method="auto")``             ``a [M, K]``, ``b [K, N]``  ``sum over ranks of a @ b``
===========================================  ==========================  ===================================

Outputs are new contiguous tensors.  Every op has an autograd formula (``register_autograd``) whose backward
runs ditron's ops, so its kernels, also in graphs that ``torch.compile`` traces: AG-GEMM's ``dA`` by GEMM-RS and
``dB = all_gather(A)^T @ dC``, GEMM-RS's ``dA`` by AG-GEMM and ``dB = A^T @ all_gather(dC)``, GEMM-AR's by an
all_reduce of ``dC``, all_gather <-> reduce_scatter, all_reduce by all_reduce, all_to_all by all_to_all.  The
convention: each rank's output is its own tensor and the loss is the sum of every rank's loss (the exact
adjoints, as torch.distributed's autograd collectives).
"""
from __future__ import annotations

import torch

from .errors import DitronError
from .runtime.world import current_world

_CACHE = {"world": None, "contexts": {}}
#: options for context creation per op (e.g. ``{"ag_gemm": {"producer": "sm"}}``); see :func:`configure`
_OPTIONS: dict = {}


def _bucket(n: int) -> int:
    """The row count a context is made for: ``n`` rounded up to a power of two (at least 16)."""
    return max(16, 1 << max(0, int(n) - 1).bit_length())


def configure(op: str, **options):
    """Options for the contexts of ``op`` made from now on (e.g. ``configure("gemm_rs", method="scatter")``);
    the same on every rank, in the same order as the ops.  The contexts of ``op`` made so far are dropped
    from the cache (their symmetric memory stays allocated until the enclosing ``ditron.heap_scope`` ends
    or ``ditron.finalize``)."""
    if op not in OPS:
        raise DitronError(f"ditron.torch_ops.configure: unknown op {op!r}; use one of {', '.join(OPS)}")
    _OPTIONS[op] = dict(options)
    for key in [k for k in _CACHE["contexts"] if k[0] == op]:
        del _CACHE["contexts"][key]


def contexts():
    """The contexts made for the current world so far: ``{(op, shape class...): context}``."""
    world = current_world(required=False)
    if world is None or _CACHE["world"] is not world:
        return {}
    return {k: e[0] for k, e in _CACHE["contexts"].items() if _alive(world, e)}


def _context(op: str, key: tuple, *shape_args):
    """The context of ``op`` for the shape class ``key``, made (collectively) on first use."""
    world = current_world(required=False)
    if world is None:
        raise DitronError(f"torch.ops.ditron.{op} needs a ditron world: call ditron.init() first")
    if _CACHE["world"] is not world:          # a new world (after finalize/init): the old contexts are gone
        _CACHE["world"], _CACHE["contexts"] = world, {}
    full = (op,) + key
    entry = _CACHE["contexts"].get(full)
    if entry is None or not _alive(world, entry):
        if world.device is not None and torch.device(world.device).type == "cuda" and \
                torch.cuda.is_current_stream_capturing():
            raise DitronError(f"torch.ops.ditron.{op}: no context for shape class {key} while a CUDA graph is "
                              "being captured (creating one is collective and allocates); run the step once "
                              "before capturing it")
        allocs = world.heap.allocations
        before = len(allocs)
        ctx = _make(op, *shape_args, **_OPTIONS.get(op, {}))
        last = allocs[-1] if len(allocs) > before else None
        entry = _CACHE["contexts"][full] = (ctx, len(allocs) - 1, last)
    return entry[0]


def _alive(world, entry):
    """Whether the context's symmetric buffers are still allocated (a ``ditron.heap_scope`` that ended frees
    them; then the context is made again)."""
    _, idx, last = entry
    allocs = world.heap.allocations
    return last is None or (idx < len(allocs) and allocs[idx] is last)


def _zoo(name):
    import importlib
    return importlib.import_module("ditron.kernels." + name)


def _make(op, *shape_args, **options):
    """A new zoo context for ``op``: ``ditron.kernels.<op>.create_<op>_context(*shape_args, **options)``."""
    return getattr(_zoo(op), f"create_{op}_context")(*shape_args, **options)


OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ag_gemm", "gemm_rs", "gemm_ar")


def _world_size(op, world_size):
    """The op's ``world_size`` argument, checked against the current world's."""
    world = current_world(required=False)
    if world is None:
        raise DitronError(f"torch.ops.ditron.{op} needs a ditron world: call ditron.init() first")
    if world_size != world.world_size:
        raise DitronError(f"torch.ops.ditron.{op}: world_size={world_size} but the ditron world has "
                          f"{world.world_size} ranks")
    return world_size


def _fresh(out, *inputs):
    """A registered op's output may not alias an input (world size 1 can return the input itself)."""
    if any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
           for t in inputs):
        return out.clone()
    return out


def _gemm_shapes(op, a, b):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise DitronError(f"torch.ops.ditron.{op}: a {list(a.shape)} and b {list(b.shape)} must be [m, K] and [K, N]")
    return a.shape[0], a.shape[1], b.shape[1]


def _class_numel(x, *_):
    n = _bucket(x.numel())
    return (x.dtype, n), (n, x.dtype)


def _class_tokens(x, *_):
    if x.dim() != 2:
        raise DitronError(f"torch.ops.ditron.all_to_all: x must be [tokens, hidden], got {list(x.shape)}")
    t = _bucket(x.shape[0])
    return (x.dtype, x.shape[1], t), (t, x.shape[1], x.dtype)


def _class_ag_gemm(a, b, *_):
    m, K, _ = _gemm_shapes("ag_gemm", a, b)
    return (a.dtype, K, _bucket(m)), (_bucket(m), K, a.dtype)


def _class_rows_n(op):
    def shape_class(a, b, *_):
        M, _, N = _gemm_shapes(op, a, b)
        return (a.dtype, N, _bucket(M)), (_bucket(M), N, a.dtype)
    return shape_class


_SHAPE_CLASS = {"all_reduce": _class_numel, "all_gather": _class_numel, "reduce_scatter": _class_numel,
                "all_to_all": _class_tokens, "ag_gemm": _class_ag_gemm, "gemm_rs": _class_rows_n("gemm_rs"),
                "gemm_ar": _class_rows_n("gemm_ar")}


def context_for(op: str, *args):
    """The zoo context that ``torch.ops.ditron.<op>(*args)`` uses (made, collectively, on first use), e.g. to
    call the zoo function with it directly."""
    key, shape_args = _SHAPE_CLASS[op](*args)
    return _context(op, key, *shape_args)


# ---------------------------------------------------------------------------
# collectives
# ---------------------------------------------------------------------------

@torch.library.custom_op("ditron::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, method: str = "auto") -> torch.Tensor:
    ctx = context_for("all_reduce", x)
    return _fresh(_zoo("all_reduce").all_reduce(x.contiguous(), ctx, method=method), x)


@all_reduce.register_fake
def _(x, method="auto"):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _gathered_shape(x, W):
    return (W,) if x.dim() == 0 else (W * x.shape[0], *x.shape[1:])


@torch.library.custom_op("ditron::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, world_size: int, method: str = "auto") -> torch.Tensor:
    _world_size("all_gather", world_size)
    ctx = context_for("all_gather", x)
    return _fresh(_zoo("all_gather").all_gather(x.contiguous(), ctx, method=method), x)


@all_gather.register_fake
def _(x, world_size, method="auto"):
    return x.new_empty(_gathered_shape(x, world_size))


def _scattered_shape(x, W):
    if x.dim() == 0 or x.shape[0] % W:
        raise DitronError(f"torch.ops.ditron.reduce_scatter: x {list(x.shape)} must have a first dimension that is "
                          f"a multiple of the world size {W}")
    return (x.shape[0] // W, *x.shape[1:])


@torch.library.custom_op("ditron::reduce_scatter", mutates_args=())
def reduce_scatter(x: torch.Tensor, world_size: int, method: str = "auto") -> torch.Tensor:
    shape = _scattered_shape(x, _world_size("reduce_scatter", world_size))
    ctx = context_for("reduce_scatter", x)
    out = _zoo("reduce_scatter").reduce_scatter(x.contiguous(), ctx, method=method)
    return _fresh(out.reshape(shape), x)


@reduce_scatter.register_fake
def _(x, world_size, method="auto"):
    return x.new_empty(_scattered_shape(x, world_size))


@torch.library.custom_op("ditron::all_to_all", mutates_args=())
def all_to_all(x: torch.Tensor) -> torch.Tensor:
    ctx = context_for("all_to_all", x)
    return _fresh(_zoo("all_to_all").all_to_all(x.contiguous(), ctx), x)


@all_to_all.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


# ---------------------------------------------------------------------------
# GEMM + communication
# ---------------------------------------------------------------------------

@torch.library.custom_op("ditron::ag_gemm", mutates_args=())
def ag_gemm(a: torch.Tensor, b: torch.Tensor, world_size: int) -> torch.Tensor:
    _world_size("ag_gemm", world_size)
    ctx = context_for("ag_gemm", a, b)
    return _fresh(_zoo("ag_gemm").ag_gemm(a.contiguous(), b, ctx), a, b)


@ag_gemm.register_fake
def _(a, b, world_size):
    m, _, N = _gemm_shapes("ag_gemm", a, b)
    return a.new_empty((world_size * m, N))


@torch.library.custom_op("ditron::gemm_rs", mutates_args=())
def gemm_rs(a: torch.Tensor, b: torch.Tensor, world_size: int) -> torch.Tensor:
    _world_size("gemm_rs", world_size)
    ctx = context_for("gemm_rs", a, b)
    return _fresh(_zoo("gemm_rs").gemm_rs(a.contiguous(), b, ctx), a, b)


@gemm_rs.register_fake
def _(a, b, world_size):
    M, _, N = _gemm_shapes("gemm_rs", a, b)
    W = world_size
    torch._check(M % W == 0, lambda: f"torch.ops.ditron.gemm_rs: M={M} is not a multiple of the world size {W}")
    return a.new_empty((M // W, N))


@torch.library.custom_op("ditron::gemm_ar", mutates_args=())
def gemm_ar(a: torch.Tensor, b: torch.Tensor, method: str = "auto") -> torch.Tensor:
    ctx = context_for("gemm_ar", a, b)
    return _fresh(_zoo("gemm_ar").gemm_ar(a.contiguous(), b, ctx, method=method), a, b)


@gemm_ar.register_fake
def _(a, b, method="auto"):
    M, _, N = _gemm_shapes("gemm_ar", a, b)
    return a.new_empty((M, N))



# ---------------------------------------------------------------------------
# autograd: every op's backward, by ditron's ops (so by its kernels, also under torch.compile)
# ---------------------------------------------------------------------------
# Convention: each rank's output is its own tensor and the loss is the sum of every rank's loss (the exact adjoint
# of each op, as torch.distributed's autograd collectives have it).  A replicated output (all_reduce, gemm_ar)
# used by an identical loss on every rank therefore counts that loss world-size times: see docs/torch.md.

def _setup_collective(ctx, inputs, output):
    """``inputs``: ``(x, method)`` or ``(x, world_size, method)`` (defaults filled in) or ``(x,)``."""
    ctx.shape = tuple(inputs[0].shape)
    ctx.world_size = inputs[1] if len(inputs) == 3 else None
    ctx.method = inputs[-1] if len(inputs) > 1 else "auto"


def _all_reduce_backward(ctx, g):
    # y = sum over ranks of x_s: every x_s gets the sum over ranks of the gradients of y
    return torch.ops.ditron.all_reduce(g, ctx.method), None


def _all_gather_backward(ctx, g):
    # block s of the gathered output came from rank s: rank s gets the sum over ranks of their block s
    g = g.reshape(ctx.world_size, -1) if len(ctx.shape) == 0 else g
    return torch.ops.ditron.reduce_scatter(g, ctx.world_size, ctx.method).reshape(ctx.shape), None, None


def _reduce_scatter_backward(ctx, g):
    return torch.ops.ditron.all_gather(g, ctx.world_size, ctx.method), None, None


def _all_to_all_backward(ctx, g):
    # out block s on rank r is in block r on rank s: the adjoint sends it back, another all_to_all
    return torch.ops.ditron.all_to_all(g)


def _setup_gemm(ctx, inputs, output):
    a, b = inputs[0], inputs[1]
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)
    ctx.world_size = inputs[2] if isinstance(inputs[2], int) else None      # (gemm_ar: its method instead)
    ctx.method = inputs[2] if isinstance(inputs[2], str) else "auto"


def _ag_gemm_backward(ctx, g):
    """``C = all_gather(A) @ B`` (rank r's ``B_r``): ``dA`` = this rank's rows of the sum over ranks of
    ``dC_r @ B_r^T``: GEMM-ReduceScatter; ``dB = all_gather(A)^T @ dC`` (ditron's all_gather, then a local GEMM)."""
    a, b = ctx.saved_tensors
    W = ctx.world_size
    da = torch.ops.ditron.gemm_rs(g, b.t(), W) if ctx.needs_input_grad[0] else None
    db = torch.ops.ditron.all_gather(a, W).t() @ g if ctx.needs_input_grad[1] else None
    return da, db, None


def _gemm_rs_backward(ctx, g):
    """``C_r`` = rows r of ``sum over ranks of A_s @ B_s``: ``dA = all_gather(dC) @ B^T``: AllGather-GEMM;
    ``dB = A^T @ all_gather(dC)``."""
    a, b = ctx.saved_tensors
    W = ctx.world_size
    da = torch.ops.ditron.ag_gemm(g, b.t(), W) if ctx.needs_input_grad[0] else None
    db = a.t() @ torch.ops.ditron.all_gather(g, W) if ctx.needs_input_grad[1] else None
    return da, db, None


def _gemm_ar_backward(ctx, g):
    """``C = sum over ranks of A_s @ B_s`` on every rank: ``dC_total = all_reduce(dC)``, then
    ``dA = dC_total @ B^T``, ``dB = A^T @ dC_total``."""
    a, b = ctx.saved_tensors
    g = torch.ops.ditron.all_reduce(g, ctx.method)
    da = g @ b.t() if ctx.needs_input_grad[0] else None
    db = a.t() @ g if ctx.needs_input_grad[1] else None
    return da, db, None


all_reduce.register_autograd(_all_reduce_backward, setup_context=_setup_collective)
all_gather.register_autograd(_all_gather_backward, setup_context=_setup_collective)
reduce_scatter.register_autograd(_reduce_scatter_backward, setup_context=_setup_collective)
all_to_all.register_autograd(_all_to_all_backward, setup_context=_setup_collective)
ag_gemm.register_autograd(_ag_gemm_backward, setup_context=_setup_gemm)
gemm_rs.register_autograd(_gemm_rs_backward, setup_context=_setup_gemm)
gemm_ar.register_autograd(_gemm_ar_backward, setup_context=_setup_gemm)

