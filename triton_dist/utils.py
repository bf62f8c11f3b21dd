"""``triton_dist.utils`` on ditron's runtime: what Triton-distributed's
tutorials and kernels use on the host, built on ``ditron.init``, symmetric
tensors and ``ditron.barrier_all``.  It works the same on the simulator
(``ditron sim -n N script.py``) and on GPUs (``torchrun``); see
docs/porting.md section 3 for what differs from Triton-distributed's module.

* :func:`initialize_distributed` / :func:`finalize_distributed`: ``ditron.init``
  / ``ditron.finalize``; returns a group with ``rank()`` and ``size()`` (the
  torch process group of the job on GPUs).
* :func:`nvshmem_create_tensor` / :func:`nvshmem_create_tensors` /
  :func:`nvshmem_free_tensor_sync`: symmetric tensors from ditron's heap
  (``ditron.symm_empty``, ``ditron.peer_tensor``).  The heap is a stack:
  freeing the newest tensors returns their memory at once, freeing an older
  one returns it when everything allocated after it is freed too.
* :func:`nvshmem_barrier_all_on_stream` (and the rocSHMEM spelling):
  ``ditron.barrier_all`` (stream-ordered on GPUs).
* rank / world queries, ``dist_print``, ``init_seed``, ``CUDA_CHECK``,
  ``sleep_async``, capability queries (``has_tma``, ``supports_p2p_native_atomic``,
  ``is_nvshmem_multimem_supported``), ``requires``.

``cuda`` / ``cudart`` are cuda-python's ``cuda.bindings.driver`` /
``cuda.bindings.runtime`` when cuda-python is installed (GPU only); other
Triton-distributed names raise an ``AttributeError`` that says what to use.
"""
from __future__ import annotations

import functools
import os
import random

import torch

import ditron
from ditron.errors import DitronError

#: Triton-distributed's signal word type (ditron's inter-node signals are 64-bit; intra-node ones may be 32-bit)
NVSHMEM_SIGNAL_DTYPE = torch.int64


class WorldGroup:
    """The group :func:`initialize_distributed` returns on the simulator (on
    GPUs it returns the torch process group): ``rank()`` and ``size()`` of the
    ditron world."""

    def __init__(self, world):
        self.world = world

    def rank(self):
        return self.world.rank

    def size(self):
        return self.world.world_size

    def __repr__(self):
        return f"WorldGroup({self.world})"


_GROUP = None


def _world(what):
    w = ditron.current_world(required=False)
    if w is None:
        raise DitronError(f"triton_dist.utils.{what}: call initialize_distributed() (ditron.init()) first")
    return w


def is_cuda():
    return torch.version.hip is None


def is_hip():
    return torch.version.hip is not None


def init_seed(seed=0):
    """Seed torch, numpy and random with ``3 + seed`` (Triton-distributed's
    choice, so that ported tests draw the same data)."""
    torch.manual_seed(3 + seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(3 + seed)
    try:
        import numpy as np
        np.random.seed(3 + seed)
    except ImportError:  # pragma: no cover
        pass
    random.seed(3 + seed)


def initialize_distributed(seed=None, initialize_shmem: bool = True):
    """Start (or join) the ditron world and return its group.

    ``ditron.init()``: the simulator under ``ditron sim``, GPUs under
    ``torchrun`` (NVSHMEM when usable, else peer-to-peer; ``initialize_shmem``
    is accepted for compatibility: ditron always sets up its symmetric heap).
    Seeds the random generators with the rank (or ``seed``).  Returns
    ``torch.distributed.group.WORLD`` on GPUs (or the group the world was built
    on).  On the simulator it starts a gloo process group of the simulated
    ranks (each is a process) for a script under ``ditron sim``, so the script's ``torch.distributed``
    collectives on that group compute on its CPU tensors
    (:func:`ditron.sim.host_torch.process_group`), and returns it."""
    global _GROUP
    world = ditron.init()
    init_seed(seed if seed is not None else world.rank)
    if world.backend == "sim":
        from ditron.sim import host_torch
        # a script under `ditron sim` gets a torch process group of its ranks; elsewhere on the simulator (the
        # test suite's shared clusters, where bodies start and end their own groups) the world's WorldGroup
        _GROUP = host_torch.process_group(world) if host_torch.active() else WorldGroup(world)
    else:
        import torch.distributed as tdist
        _GROUP = world.group if world.group is not None else tdist.group.WORLD
    return _GROUP


def finalize_distributed():
    """``ditron.finalize()`` (frees the symmetric heap; the world may be
    initialised again).  On the simulator it also ends the torch process group
    that :func:`initialize_distributed` started, as Triton-distributed's
    ``finalize_distributed`` does (``torch.distributed.destroy_process_group``)."""
    global _GROUP
    world = ditron.current_world(required=False)
    sim = world is not None and world.backend == "sim"
    ditron.finalize()
    from ditron.sim import host_torch
    if sim and host_torch.active():
        import torch.distributed as tdist
        if tdist.is_initialized():
            tdist.destroy_process_group()
    _GROUP = None


def get_triton_dist_world():
    """The group :func:`initialize_distributed` returned."""
    if _GROUP is None:
        _world("get_triton_dist_world")
        return WorldGroup(ditron.current_world())
    return _GROUP


def get_triton_dist_local_world_size():
    return _world("get_triton_dist_local_world_size").local_world_size


def get_group_numa_world_size(pg=None):
    """Ranks per NUMA domain: ditron does not model NUMA, so the ranks of the
    node."""
    return _world("get_group_numa_world_size").local_world_size


def is_shmem_initialized() -> bool:
    return ditron.current_world(required=False) is not None


# ---------------------------------------------------------------------------
# symmetric tensors
# ---------------------------------------------------------------------------

def nvshmem_create_tensor(shape, dtype) -> torch.Tensor:
    """An uninitialised symmetric tensor (``ditron.symm_empty``); collective:
    every rank calls it with the same shape and dtype, in the same order."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return ditron.symm_empty(shape, dtype)


def nvshmem_create_tensors(shape, dtype, rank, local_world_size):
    """A symmetric tensor and its views on every rank of this node, in local
    rank order (``ditron.peer_tensor``); element ``local_rank`` is the tensor
    itself."""
    world = _world("nvshmem_create_tensors")
    if (rank, local_world_size) != (world.rank, world.local_world_size):
        raise DitronError(f"nvshmem_create_tensors(rank={rank}, local_world_size={local_world_size}): this process "
                          f"is rank {world.rank} of a world with {world.local_world_size} ranks per node")
    t = nvshmem_create_tensor(shape, dtype)
    first = rank - rank % local_world_size
    return [ditron.peer_tensor(t, p) for p in range(first, first + local_world_size)]


def nvshmem_free_tensor_sync(tensor):
    """Free a symmetric tensor (collective, like the allocation).  Its memory
    returns to the heap once every tensor allocated after it is freed too
    (ditron's heap is a stack); using it afterwards is an error that names it."""
    world = _world("nvshmem_free_tensor_sync")
    alloc = getattr(tensor, "_ditron_alloc", None)
    if alloc is None or not ditron.is_symmetric(tensor):
        raise DitronError("nvshmem_free_tensor_sync: the tensor is not a live symmetric tensor (allocate it with "
                          "nvshmem_create_tensor / ditron.symm_empty)")
    if world.backend != "sim" and torch.cuda.is_available():
        torch.cuda.synchronize()
    heap = world.heap
    alloc.freed = "nvshmem_free_tensor_sync freed it"
    while heap.allocations and heap.allocations[-1].freed:
        last = heap.allocations[-1]
        heap.release((last.offset, len(heap.allocations) - 1), why=last.freed)


def nvshmem_barrier_all_on_stream(stream=None):
    """Barrier of all ranks, ordered on ``stream`` (``ditron.barrier_all``)."""
    ditron.barrier_all(stream)


rocshmem_barrier_all_on_stream = nvshmem_barrier_all_on_stream


def barrier_all_on_stream(stream=None):
    ditron.barrier_all(stream)


# ---------------------------------------------------------------------------
# printing, checks, capabilities
# ---------------------------------------------------------------------------

def dist_print(*args, allowed_ranks=(0,), prefix=False, need_sync=False, **kwargs):
    """``print`` on the ranks in ``allowed_ranks`` (``"all"``: every rank),
    with a ``[rank:N]`` prefix when ``prefix``; ``need_sync`` puts a barrier
    before each allowed rank's turn."""
    world = ditron.current_world(required=False)
    rank = world.rank if world is not None else int(os.getenv("RANK", 0))
    size = world.world_size if world is not None else int(os.getenv("WORLD_SIZE", 1))
    ranks = range(size) if allowed_ranks == "all" else allowed_ranks
    for r in ranks:
        if need_sync and world is not None:
            ditron.barrier_all()
            if world.backend != "sim" and torch.cuda.is_available():
                torch.cuda.synchronize()
        if rank == r:
            if prefix:
                print(f"[rank:{rank}]", end="")
            print(*args, **kwargs)


def CUDA_CHECK(err):
    """Raise if a cuda-python call's result (or its first element) is not
    success."""
    if isinstance(err, tuple):
        err = err[0]
    if int(getattr(err, "value", err)) != 0:
        raise RuntimeError(f"Cuda Error: {err}")


def sleep_async(duration_ms: float):
    """Make the current stream wait about ``duration_ms`` (GPU); no-op on the
    simulator, where launches complete before returning."""
    world = ditron.current_world(required=False)
    if (world is not None and world.backend == "sim") or not torch.cuda.is_available():
        return
    torch.cuda._sleep(int(1.5e6 * duration_ms))     # ~1.5 GHz SM clock


def requires(condition_func):
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            assert condition_func(), f"{condition_func.__name__} is needed for {func.__name__}"
            return func(*args, **kwargs)
        return wrapper
    return decorator


def _on_sim():
    world = ditron.current_world(required=False)
    return world is not None and world.backend == "sim"


def has_fullmesh_nvlink():
    """Every rank of the node reaches every other by load/store (ditron's
    intra-node transport requires it; always true on the simulator)."""
    return True


def supports_p2p_native_atomic():
    """Peer atomics work (NVLink / xGMI): assumed by ditron's intra-node
    transport, true on the simulator."""
    return True


requires_p2p_native_atomic = requires(supports_p2p_native_atomic)


def is_nvshmem_multimem_supported():
    """NVLink SHARP multicast: modelled on the simulator; ditron keeps it off
    on GPUs (docs/runtime.md), so False there."""
    return _on_sim()


def has_tma():
    """Hopper tensor-memory accelerator (GPU capability 9+); False on the
    simulator."""
    return (not _on_sim()) and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def get_device_property(device_id=0):
    if _on_sim() or not torch.cuda.is_available():
        raise DitronError("get_device_property: no GPU (the simulator has no device properties)")
    return torch.cuda.get_device_properties(device_id)


def launch_cooperative_grid_options():
    """Launch options for kernels whose programs wait for each other:
    ``launch_cooperative_grid`` on GPUs; nothing on the simulator, which runs
    all programs of a launch concurrently."""
    return {} if _on_sim() else {"launch_cooperative_grid": True}


def __getattr__(name):
    if name in ("cuda", "cudart"):
        mod = "cuda.bindings.driver" if name == "cuda" else "cuda.bindings.runtime"
        try:
            import importlib
            return importlib.import_module(mod)
        except ImportError:
            from ditron.sim import host_torch
            if name == "cuda" and host_torch.active():
                return host_torch.driver      # under ditron sim: the stream memory operations, modelled
            raise AttributeError(f"triton_dist.utils.{name} is cuda-python's {mod}, which is not installed; ditron's "
                                 "host runtime needs none of it: ditron.stream_write_value / stream_wait_value / "
                                 "rank_copy replace cuStreamWriteValue / cuStreamWaitValue / cudaMemcpyAsync "
                                 "between ranks") from None
    raise AttributeError(f"triton_dist.utils.{name} is not provided by ditron (docs/porting.md section 3 lists "
                         "what is)")
