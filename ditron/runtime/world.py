"""The host API: one world per process.

    world = ditron.init()                 # "auto" | "sim" | "nvshmem" | "p2p"
    x = ditron.symm_zeros((n,), torch.float32)
    kernel[grid](x, ...)
    ditron.barrier_all()
    ditron.finalize()

The same script runs under ``ditron sim -n 4 script.py`` (simulated ranks on
the CPU) and under ``torchrun --nproc-per-node 4 script.py`` (GPUs).  The
transport (how ranks reach each other's memory) is chosen by ``backend``;
everything above it -- topology, the symmetric heap, argument checks -- is
shared and lives here.
"""
from __future__ import annotations

import contextlib
import os
from typing import Optional

from ..errors import DitronError
from .heap import RELEASES as _RELEASES
from .transport import Transport, World, _env_int, topology_from_env  # noqa: F401  (the contract, re-exported)

BACKENDS = ("auto", "sim", "nvshmem", "p2p")


_WORLD: Optional[World] = None
#: bumped whenever the current world changes (init / finalize): caches keyed by it (ditron.jit's launch state)
#: never hold a world object, so a finalized world's heap is not kept alive by them
_GEN = 0


def _sim_requested() -> bool:
    from .. import _compat
    return bool(os.environ.get("DITRON_SIM_DIR")) or _compat.interpreter_enabled()


def init(backend: str = "auto", *, heap_size=None, device=None, group=None, device_mesh=None, mesh_dim=None,
         ranks_per_gpu=None) -> World:
    """Join the distributed job and return the :class:`World`.

    ``backend``: ``"auto"`` (the simulator inside ``ditron sim`` or under
    ``TRITON_INTERPRET=1``; on GPUs NVSHMEM when usable, else P2P),
    ``"sim"``, ``"nvshmem"``, ``"p2p"``.  ``heap_size``: bytes (or
    ``"2G"``) of symmetric heap per rank (default ``DITRON_HEAP_SIZE``, else
    64 MiB on the simulator and 1 GiB on GPUs).  Calling ``init`` again
    returns the same world; after :func:`finalize` it starts a new one.

    ``group`` (a ``torch.distributed`` process group) or ``device_mesh`` and
    ``mesh_dim`` (a ``DeviceMesh`` and the name or index of one of its
    dimensions): build the world on that group, whose rank ``i`` is the
    world's rank ``i`` (see :mod:`ditron.runtime.groups`).

    ``ranks_per_gpu``: let that many consecutive local ranks share one GPU (default ``DITRON_RANKS_PER_GPU``,
    else 1: one GPU per rank).  For correctness work and debugging on fewer GPUs than ranks, not for timing;
    P2P transport only (see :mod:`ditron.runtime.sharing` and docs/runtime.md).
    """
    global _WORLD, _GEN
    if backend not in BACKENDS:
        raise DitronError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    from .groups import resolve_group, topology_from_group
    from .sharing import ranks_per_gpu as _ranks_per_gpu
    _ranks_per_gpu(ranks_per_gpu)           # a bad opt-in is an error on every backend, before anything starts
    group = resolve_group(group, device_mesh, mesh_dim)
    topo = topology_from_env()
    if group is not None:
        topo = topology_from_group(group, topo)
    if _WORLD is not None:
        if group is not None and (_WORLD.rank, _WORLD.world_size) != topo[:2]:
            raise DitronError(f"ditron is already initialised (rank {_WORLD.rank} of {_WORLD.world_size}); the "
                              f"group given is rank {topo[0]} of {topo[1]}: call ditron.finalize() first")
        if backend not in ("auto", _WORLD.backend):
            raise DitronError(f"ditron is already initialised with backend {_WORLD.backend!r}; call "
                              f"ditron.finalize() before ditron.init(backend={backend!r})")
        _check_same_settings(_WORLD, heap_size, device)
        return _WORLD
    if backend == "sim" or (backend == "auto" and _sim_requested()):
        from .sim import make_sim_transport
        if group is not None and topo != topology_from_env():
            from .groups import group_ranks
            raise DitronError(f"ditron.init(group=...): on the simulator a world spans every simulated rank in "
                              f"order; this group has global ranks {group_ranks(group)} of {topology_from_env()[1]}. "
                              "Worlds on sub-groups run on GPUs")
        world = make_sim_transport(topo, heap_size)
    else:
        from .gpu import make_gpu_transport
        world = make_gpu_transport(backend, topo, heap_size, device, group=group, ranks_per_gpu=ranks_per_gpu)
    world.group = group
    world.settings = {"heap_size": heap_size, "device": device}
    _WORLD = world
    _GEN += 1
    return world


def _check_same_settings(world, heap_size, device):
    """A second ``init`` while a world exists returns it, unless it asks for
    settings the world does not have (that would be silently ignored)."""
    if heap_size is not None:
        from .heap import HEAP_ALIGN, parse_size, round_up
        want = round_up(parse_size(heap_size), HEAP_ALIGN)
        if want != world.heap_size:
            raise DitronError(f"ditron.init(heap_size={heap_size!r}): ditron is already initialised with a "
                              f"{world.heap_size}-byte heap per rank ({world}); a second init cannot change it: "
                              "call ditron.finalize() first")
    if device is not None:
        import torch
        if torch.device(device) != torch.device(world.device):
            raise DitronError(f"ditron.init(device={device!r}): ditron is already initialised on {world.device} "
                              f"({world}); call ditron.finalize() first")


def finalize():
    """Leave the job: synchronise, free the symmetric heap, tear the transport
    down.  Safe to call twice; :func:`init` may be called again afterwards.
    Symmetric tensors and zoo contexts of this world cannot be used afterwards
    (using one raises an error that says so)."""
    global _WORLD, _GEN
    world, _WORLD = _WORLD, None
    _GEN += 1
    if world is not None:
        world.finalized = True
        heap = world.transport.heap
        if heap is not None and hasattr(heap, "release_all"):
            heap.release_all("ditron.finalize() was called")
        world.transport.finalize()


def current_world(required: bool = True) -> Optional[World]:
    if _WORLD is None and required:
        raise DitronError("no ditron world: call ditron.init() first")
    return _WORLD


def _world_for(what):
    if _WORLD is None:
        raise DitronError(f"{what} needs a ditron world: call ditron.init() first")
    return _WORLD


_DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "f64": "float64", "double": "float64",
    "int8": "int8", "i8": "int8", "uint8": "uint8", "u8": "uint8", "int16": "int16", "i16": "int16",
    "int32": "int32", "i32": "int32", "int": "int32", "int64": "int64", "i64": "int64", "long": "int64",
    "uint16": "uint16", "u16": "uint16", "uint32": "uint32", "u32": "uint32", "uint64": "uint64", "u64": "uint64",
    "bool": "bool",
}


def as_torch_dtype(dtype, what="dtype"):
    """A torch dtype from a torch dtype or a name (``"float16"``, ``"bf16"``,
    ``"torch.int32"``, ``"i64"``, ...); anything else is a clear error."""
    import torch
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        name = _DTYPE_NAMES.get(key)
        t = getattr(torch, name, None) if name else None
        if isinstance(t, torch.dtype):
            return t
        raise DitronError(f"{what}: unknown dtype name {dtype!r}; use a torch dtype (torch.float16) or one of "
                          f"{', '.join(sorted(_DTYPE_NAMES))}")
    raise DitronError(f"{what}: dtype must be a torch.dtype or a name such as 'float16', got "
                      f"{type(dtype).__name__} {dtype!r}")


def symm_empty(shape, dtype=None, *, name=None):
    """An uninitialised symmetric tensor on ``world.device``.  Collective: all
    ranks call it with the same shape and dtype, in the same order.  ``dtype``:
    a torch dtype or its name (``"float16"``, ``"bf16"``, ``"int64"``, ...)."""
    world = _world_for("ditron.symm_empty")
    return world.heap.alloc(shape, as_torch_dtype(dtype, "ditron.symm_empty"), name=name)


def symm_zeros(shape, dtype=None, *, name=None):
    """A zero-filled symmetric tensor (collective, like :func:`symm_empty`)."""
    dtype = as_torch_dtype(dtype, "ditron.symm_zeros")
    t = symm_empty(shape, dtype, name=name)
    t.zero_()
    return t


def is_symmetric(t) -> bool:
    """Whether ``t`` lies in this rank's symmetric heap (and was not freed)."""
    alloc = getattr(t, "_ditron_alloc", None)
    if alloc is not None and alloc.freed:
        return False
    return _WORLD is not None and _WORLD.heap.contains(t)


def check_live_tensor(t, argname, what):
    """A symmetric tensor whose allocation is gone (its ``heap_scope`` ended,
    ``ditron.finalize()``, a failed context creation) must not be used: its
    memory may hold newer tensors.  Raise an error that says so."""
    alloc = getattr(t, "_ditron_alloc", None)
    if alloc is not None and alloc.freed:
        raise DitronError(f"{what}: argument '{argname}' is the {alloc.label()}, which was freed: {alloc.freed}. "
                          "Its memory may now belong to other tensors; allocate it again")


@contextlib.contextmanager
def heap_scope():
    """Symmetric allocations made inside the block are freed at its end
    (collective; tensors made inside must not be used afterwards)."""
    world = _world_for("ditron.heap_scope")
    mark = world.heap.mark()
    try:
        yield
    finally:
        world.heap.release(mark)


def barrier_all(stream=None):
    """Barrier of all ranks.  On GPUs it is stream-ordered: work queued on
    ``stream`` (default: the current stream) before it completes on every
    rank before work queued after it starts."""
    _world_for("ditron.barrier_all").transport.barrier(stream)


def peer_tensor(t, rank: int):
    """The host-side ``symm_at``: a tensor aliasing ``rank``'s copy of the
    symmetric tensor ``t`` (ranks on this node)."""
    world = _world_for("ditron.peer_tensor")
    _require_symmetric(world, t, "t", "ditron.peer_tensor")
    _require_rank(world, rank, "ditron.peer_tensor", local=True)
    if rank == world.rank:
        return t
    return world.transport.peer_tensor(t, rank)


def rank_copy(dst, src, *, dst_rank=None, src_rank=None, stream=None):
    """Copy ``src`` into ``dst`` through the copy engine (no SMs used).

    ``dst_rank`` / ``src_rank`` name the rank whose copy of the symmetric
    tensor is meant (default: this rank); at most one may be a peer.  Shapes
    and dtypes must match.  On GPUs the copy is queued on ``stream`` (default:
    the current stream) and is asynchronous like any stream work.
    """
    world = _world_for("ditron.rank_copy")
    if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
        raise DitronError(f"ditron.rank_copy: dst is {dst.dtype}{list(dst.shape)} but src is "
                          f"{src.dtype}{list(src.shape)}; they must match")
    if dst_rank not in (None, world.rank) and src_rank not in (None, world.rank):
        raise DitronError("ditron.rank_copy: copies between two peers are not supported; give at most one of "
                          "dst_rank / src_rank")
    # a named rank means "that rank's copy of the symmetric tensor", this rank included (the same check at
    # every world size: at world size 1 the only peer is this rank)
    if dst_rank is not None:
        _require_symmetric(world, dst, "dst", "ditron.rank_copy")
        _require_rank(world, dst_rank, "ditron.rank_copy", local=True)
        if dst_rank != world.rank:
            dst = world.transport.peer_tensor(dst, dst_rank)
    if src_rank is not None:
        _require_symmetric(world, src, "src", "ditron.rank_copy")
        _require_rank(world, src_rank, "ditron.rank_copy", local=True)
        if src_rank != world.rank:
            src = world.transport.peer_tensor(src, src_rank)
    world.transport.rank_copy(dst, src, stream)


def _signal_word(world, word, what):
    import torch
    if not isinstance(word, torch.Tensor) or word.dtype != torch.int64 or word.numel() != 1:
        raise DitronError(f"{what}: the signal must be a one-element int64 tensor (e.g. sig[i:i + 1])")
    _require_symmetric(world, word, "word", what)


def stream_write_value(word, value: int, *, rank=None, stream=None):
    """Set the signal ``word`` (one element of a symmetric int64 tensor) of
    ``rank`` (default: this rank; a peer on this node) to ``value``, ordered
    after the work queued before it on ``stream`` (default: the current
    stream), with a memory fence: a kernel that sees the value also sees that
    work's writes (e.g. a :func:`rank_copy`).  No SMs are used
    (``cuStreamWriteValue64`` on GPUs), so it can follow a copy-engine copy
    while every SM is busy.  The value is fixed when the call is queued (a
    CUDA graph replays it unchanged)."""
    world = _world_for("ditron.stream_write_value")
    _signal_word(world, word, "ditron.stream_write_value")
    if rank not in (None, world.rank):
        _require_rank(world, rank, "ditron.stream_write_value", local=True)
        word = world.transport.peer_tensor(word, rank)
    world.transport.write_value(word, int(value), stream)


def stream_wait_value(word, value: int, *, stream=None):
    """Make ``stream`` (default: the current stream) wait until this rank's
    signal ``word`` (one element of a symmetric int64 tensor) equals
    ``value``; later work on the stream starts after that.  The host does not
    block (on the simulator, where streams are synchronous, it does).  No
    time limit: DITRON_WAIT_TIMEOUT_S bounds device-side waits only."""
    world = _world_for("ditron.stream_wait_value")
    _signal_word(world, word, "ditron.stream_wait_value")
    world.transport.wait_value(word, int(value), stream)


def check_kernel_args(kernel, args, kwargs, world):
    """Before a launch: every tensor argument that reaches ``symm_at``,
    ``notify`` or ``shmem.*`` must be symmetric (static analysis of the
    kernel's source, :mod:`ditron.analysis`, once per kernel), and no argument
    may be a freed symmetric tensor.  Runs on every launch: the common case
    (symmetric operands passed positionally as the tensors the heap handed
    out, or views inside the heap) reads an attribute or an address per
    argument."""
    if _RELEASES[0]:       # some allocation of this process was freed: is one of them an argument?
        for i, a in enumerate(args):
            alloc = getattr(a, "_ditron_alloc", None)
            if alloc is not None and alloc.freed:
                check_live_tensor(a, _param_name(kernel, i), f"kernel {getattr(kernel, '__name__', '?')}")
    hit = _POSITIONS.get(id(kernel))
    positions = hit[1] if hit is not None and hit[0] is kernel else _symmetric_positions(kernel)
    if not positions:
        return      # the common case: nothing to check (cached per kernel)
    n = len(args)
    contains = world.heap.contains
    for i in positions:
        if i >= n:
            break
        a = args[i]
        if a is None or type(a) in (int, float, bool) or getattr(a, "_ditron_alloc", None) is not None:
            continue      # not a tensor (never checked), or a tensor the heap handed out, live (checked above)
        if not (hasattr(a, "data_ptr") and contains(a)):
            break
    else:
        return      # fast path of every launch: the symmetric operands are positional tensors in the heap
    from ..analysis import check_symmetric_args
    sig = _signature(getattr(kernel, "fn", kernel))
    try:
        bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    except TypeError:
        return      # Triton reports a wrong call with its own message
    check_symmetric_args(kernel, dict(bound.arguments), world.heap.contains)


_SIGNATURES: dict = {}
_POSITIONS: dict = {}


def _symmetric_positions(kernel):
    """Positions (in the kernel's signature) of the parameters that must be symmetric."""
    key = id(kernel)
    hit = _POSITIONS.get(key)
    if hit is None or hit[0] is not kernel:
        from ..analysis import symmetric_params
        names = list(_signature(getattr(kernel, "fn", kernel)).parameters)
        hit = _POSITIONS[key] = (kernel, tuple(names.index(p) for p in symmetric_params(kernel) if p in names))
    return hit[1]


def _param_name(kernel, i):
    names = list(_signature(getattr(kernel, "fn", kernel)).parameters)
    return names[i] if i < len(names) else f"#{i}"


def _signature(fn):
    import inspect
    sig = _SIGNATURES.get(fn)
    if sig is None:
        sig = _SIGNATURES[fn] = inspect.signature(fn)
    return sig


def _require_symmetric(world, t, argname, what):
    check_live_tensor(t, argname, what)
    if not world.heap.contains(t):
        raise DitronError(f"{what}: argument '{argname}' is not a symmetric tensor (allocate it with "
                          "ditron.symm_empty / ditron.symm_zeros)")


def _require_rank(world, rank, what, local=False):
    if not isinstance(rank, int) or not 0 <= rank < world.world_size:
        raise DitronError(f"{what}: rank {rank!r} is not in [0, {world.world_size})")
    if local and rank // world.local_world_size != world.node:
        raise DitronError(f"{what}: rank {rank} is on node {rank // world.local_world_size}, not on this "
                          f"node ({world.node}); peer memory is reachable only inside a node")


# lowering rules read the world through this provider: lowering sits below the runtime and never imports it
from ..lowering import provide as _provide  # noqa: E402

_provide("world", lambda: _WORLD)
