"""Worlds on torch process groups and device meshes: ``ditron.init(group=...)`` /
``ditron.init(device_mesh=..., mesh_dim=...)``.

Rank mapping: the world's rank ``i`` is the group's rank ``i`` (for a mesh dimension: the coordinate along
``mesh_dim``, ``mesh.get_local_rank(mesh_dim)``), i.e. the process whose global rank is
``torch.distributed.get_global_rank(group, i)``.  Nodes are those of the job (global rank //
``LOCAL_WORLD_SIZE``): the group's members on one node must be consecutive group ranks and every node of the
group must hold the same number of them; ``world.local_rank`` is then the position inside the node's block.
The world covers only the group: symmetric heaps, barriers and kernels' ``dl.rank()`` / ``dl.num_ranks()``
are the group's.  One world per process: with a (DP, TP) mesh, each process builds its world on its own TP
group (the processes of other TP groups build theirs).
"""
from __future__ import annotations

from ..errors import DitronError


def resolve_group(group=None, device_mesh=None, mesh_dim=None):
    """The process group named by ``group`` or by ``device_mesh`` (and ``mesh_dim``); ``None`` for neither."""
    if device_mesh is not None:
        if group is not None:
            raise DitronError("ditron.init: give group= or device_mesh=, not both")
        if mesh_dim is None and device_mesh.ndim != 1:
            raise DitronError(f"ditron.init: the device mesh has {device_mesh.ndim} dimensions "
                              f"{getattr(device_mesh, 'mesh_dim_names', None)}; name one with mesh_dim=")
        try:
            return device_mesh.get_group(mesh_dim if mesh_dim is not None else 0)
        except Exception as e:  # noqa: BLE001 -- torch names the problem (unknown dimension name, ...)
            raise DitronError(f"ditron.init: mesh_dim={mesh_dim!r}: {e}") from None
    if mesh_dim is not None:
        raise DitronError("ditron.init: mesh_dim= needs device_mesh=")
    return group


def group_ranks(group):
    """Global ranks of the group's members, in group-rank order."""
    import torch.distributed as dist
    return list(dist.get_process_group_ranks(group))


def topology_from_group(group, job_topo):
    """(rank, world_size, local_rank, local_world_size, nnodes, node) of this process in the world on
    ``group``; ``job_topo`` is the job's topology (:func:`~ditron.runtime.transport.topology_from_env`)."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise DitronError("ditron.init(group=...): torch.distributed is not initialised (call "
                          "torch.distributed.init_process_group first)")
    members = group_ranks(group)
    g_rank, _, _, job_lws, _, _ = job_topo
    if g_rank not in members:
        raise DitronError(f"ditron.init(group=...): this process (global rank {g_rank}) is not a member of the "
                          f"group (global ranks {members})")
    return topology_of_members(members, members.index(g_rank), job_lws)


def topology_of_members(members, rank, job_lws):
    """The topology of group rank ``rank`` in a group whose members have the global ranks ``members``, in a
    job with ``job_lws`` ranks per node."""
    nodes = [m // job_lws for m in members]
    order = []
    for n in nodes:
        if not order or order[-1] != n:
            if n in order:
                raise DitronError(f"the group's members on node {n} are not consecutive group ranks (global ranks "
                                  f"{members}, {job_lws} per node): ditron needs each node's members in one block")
            order.append(n)
    counts = {n: nodes.count(n) for n in order}
    if len(set(counts.values())) != 1:
        raise DitronError(f"the group has different numbers of members per node ({counts}; global ranks "
                          f"{members}): ditron needs the same number on every node")
    lws = counts[order[0]]
    node = order.index(nodes[rank])
    return rank, len(members), rank - node * lws, lws, len(order), node
