"""The contract between the world and its transports: :class:`World`, :class:`Transport` and the topology.

:mod:`ditron.runtime.world` (the host API) chooses a transport; the transports (:mod:`ditron.runtime.sim`,
:mod:`ditron.runtime.gpu` and its ``gpu_*`` modules) build a :class:`World` on a :class:`Transport`.  Both import
this module, which imports neither, so the dependency runs one way: world -> transports -> transport (this module).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import DitronError


@dataclass
class World:
    """The current process's place in the distributed job."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    nnodes: int
    node: int
    device: object
    backend: str
    heap_size: int
    transport: object = field(repr=False, default=None)
    #: the torch process group the world was built on (``ditron.init(group=...)``); None: every rank of the job
    group: object = field(repr=False, default=None)
    #: set by :func:`finalize`: the world's heap is gone
    finalized: bool = False
    #: the arguments ``init`` was called with (a second ``init`` must not ask for other settings)
    settings: dict = field(repr=False, default_factory=dict)

    @property
    def heap(self):
        return self.transport.heap

    def __str__(self):
        return (f"rank {self.rank}/{self.world_size} (node {self.node}/{self.nnodes}, local rank "
                f"{self.local_rank}/{self.local_world_size}) on {self.device} via {self.backend}")


class Transport:
    """What a backend provides.  ``heap`` is this rank's
    :class:`~ditron.runtime.heap.SymmetricHeap`."""
    name = "?"
    heap = None
    #: whether NVLink SHARP multicast objects exist for this world (never on
    #: the lent machines, where multicast must stay off)
    multicast = False

    def peer_tensor(self, t, rank: int):
        """A tensor aliasing ``rank``'s copy of the symmetric tensor ``t``."""
        raise NotImplementedError

    def barrier(self, stream=None):
        raise NotImplementedError

    def rank_copy(self, dst, src, stream=None):
        """Copy ``src`` to ``dst`` (either may alias a peer's heap) without SMs."""
        dst.copy_(src)

    def write_value(self, word, value: int, stream=None):
        """Stream-ordered 64-bit store of ``value`` into the one-element int64
        tensor ``word`` (may alias a peer's heap), after a memory fence."""
        raise NotImplementedError(f"{self.name}: stream memory operations")

    def wait_value(self, word, value: int, stream=None):
        """Stream-ordered wait until the local int64 ``word`` equals ``value``."""
        raise NotImplementedError(f"{self.name}: stream memory operations")

    def before_launch(self, kernel, args, device=None):
        """Hook run before a kernel launch on this transport (``device``: the current device's index, as the
        launcher already knows it; None: ask)."""

    def finalize(self):
        pass


def _env_int(name, default):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DitronError(f"environment variable {name}={raw!r} is not an integer") from None


def topology_from_env():
    """(rank, world_size, local_rank, local_world_size, nnodes, node) from
    torchrun's variables (a single process when they are absent)."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    local_rank = _env_int("LOCAL_RANK", rank % max(local_world_size, 1))
    if world_size < 1 or not 0 <= rank < world_size:
        raise DitronError(f"RANK={rank} is not in [0, WORLD_SIZE={world_size})")
    if local_world_size < 1 or world_size % local_world_size:
        raise DitronError(f"WORLD_SIZE={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}: "
                          "ditron needs the same number of ranks on every node")
    if not 0 <= local_rank < local_world_size:
        raise DitronError(f"LOCAL_RANK={local_rank} is not in [0, LOCAL_WORLD_SIZE={local_world_size})")
    node = rank // local_world_size
    if rank % local_world_size != local_rank:
        raise DitronError(f"RANK={rank} and LOCAL_RANK={local_rank} do not give contiguous ranks per node "
                          f"(LOCAL_WORLD_SIZE={local_world_size}); launch with torchrun or ditron sim")
    return rank, world_size, local_rank, local_world_size, world_size // local_world_size, node
