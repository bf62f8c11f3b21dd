"""The GPU runtime: worlds on real GPUs under ``torchrun``.

``ditron.init(backend=...)`` calls :func:`make_gpu_transport`, which

1. sets NVLink multicast off in NCCL, torch symmetric memory and NVSHMEM
   (unless the caller already chose), selects this rank's GPU (``LOCAL_RANK``,
   or ``device=``) and joins torch.distributed (NCCL, ``env://``) when the
   caller has not;
2. validates the job (world size, one GPU per local rank, one host per node,
   peer access inside the node) and agrees on a transport:

   * ``"nvshmem"`` (:mod:`ditron.runtime.gpu_nvshmem`): NVSHMEM through
     nvshmem4py, bootstrapped by a unique id broadcast over torch.distributed;
     the heap is NVSHMEM symmetric memory; kernels that call ``shmem.*`` link
     NVSHMEM's device bitcode and get ``nvshmemx_cumodule_init`` after load;
   * ``"p2p"`` (:mod:`ditron.runtime.gpu_p2p`): one node, no NVSHMEM; the heap
     is torch symmetric memory over CUDA IPC; ``shmem.*`` compiles to loads,
     stores and atomics through the heap deltas;
   * ``"auto"``: NVSHMEM when usable on every rank, else P2P (``world.backend``
     says which; ``ditron doctor`` says what auto would pick);
3. allocates the symmetric heap, a runtime sync area in it, a pinned debug
   buffer, and writes the **world descriptor** ``__ditron_world`` into every
   loaded module of a ditron kernel (a Triton kernel-load hook does it for
   modules loaded later, before their first launch).

``DITRON_WAIT_TIMEOUT_S`` bounds every ``dl.wait`` / ``shmem.signal_wait_until``
(and the P2P device barrier): kernels are then compiled in a bounded variant
that, past the timeout, writes a report record and makes every program of the
kernel leave (no trap); a watchdog thread prints the report (rank, program,
signal tensor and offset, expected and observed values) as soon as the record
appears, and the next launch on the world (or ``barrier_all``, or
``check_hang()``) raises it as :class:`~ditron.errors.DitronHangError`.
"""
from __future__ import annotations

import atexit
import datetime
import importlib.metadata
import importlib.util
import os
import socket

from ..errors import DitronError
from ..lowering.devlib import HEAP_ALIGN, MAX_LOCAL_RANKS
from .gpu_base import _activate, _all_gather, _install_hooks, multicast_off, set_group, wait_timeout_ns
from .gpu_base import check_hang, hang_report, loaded_modules, wait_for_hang_report  # noqa: F401  (public API)
from .heap import heap_size_from_env, parse_size, round_up
from . import sharing
from .transport import World, topology_from_env

DEFAULT_HEAP = 1 << 30

# ---------------------------------------------------------------------------
# NVSHMEM availability (no GPU touched)
# ---------------------------------------------------------------------------

def nvshmem4py_version():
    for dist in ("nvshmem4py-cu13", "nvshmem4py-cu12", "nvshmem4py"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def nvshmem_status():
    """(usable, reason): whether the NVSHMEM transport can be used here, judged
    without importing nvshmem4py or touching a GPU."""
    from .. import libs
    if importlib.util.find_spec("nvshmem") is None:
        return False, "nvshmem4py is not installed (pip install nvshmem4py-cu13, or -cu12 for CUDA 12)"
    if libs.nvshmem_version() is None and not os.environ.get("NVSHMEM_HOME"):
        return False, "the NVSHMEM host library is not installed (pip install nvidia-nvshmem-cu13)"
    rep = libs.compatibility_report()
    if not rep["nvshmem_bitcode"]:
        return False, "NVSHMEM's device bitcode libnvshmem_device.bc was not found (pip install nvidia-nvshmem-cu13)"
    if rep["nvshmem_status"].startswith("KNOWN NOT"):
        return False, (f"nvidia-nvshmem {rep['nvshmem_version']}'s bitcode cannot be linked by this Triton "
                       "(see ditron doctor)")
    ver = nvshmem4py_version() or "?"
    return True, f"nvshmem4py {ver}, nvidia-nvshmem {rep['nvshmem_version'] or '?'}"


def auto_backend_report():
    """One line for ``ditron doctor``: what ``ditron.init()`` (auto) picks on GPUs."""
    ok, why = nvshmem_status()
    if ok:
        return f"auto -> nvshmem ({why}); p2p also available on one node"
    return f"auto -> p2p on one node ({why}); multi-node jobs need NVSHMEM"


# ---------------------------------------------------------------------------
# Bring-up helpers
# ---------------------------------------------------------------------------
_PG_CREATED = False


def _torch():
    try:
        import torch
    except ImportError:
        raise DitronError("ditron's GPU runtime needs PyTorch (pip install torch)") from None
    if not torch.cuda.is_available():
        raise DitronError("no CUDA GPU is visible to this process (torch.cuda.is_available() is False); on a "
                          "machine without GPUs use ditron.init(backend='sim') or run under `ditron sim`")
    from .rocm import hip_version, runtime_unavailable
    if hip_version(torch):
        raise runtime_unavailable(hip_version(torch))
    return torch


def _select_device(torch, device, local_rank, local_world_size, per_gpu=1):
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    vis = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    if device is None:
        if per_gpu > 1:
            return torch.device("cuda", sharing.gpu_of_local_rank(local_rank, local_world_size, per_gpu, count))
        if local_rank >= count:
            raise DitronError(f"LOCAL_RANK={local_rank} needs GPU {local_rank}, but only {count} GPU(s) are "
                              f"visible{vis}: launch at most {count} processes per node "
                              f"(torchrun --nproc-per-node {count}), pass device= to ditron.init, or let ranks "
                              f"share a GPU for correctness work ({sharing.ENV}=N, docs/runtime.md)")
        return torch.device("cuda", local_rank)
    try:
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    except (RuntimeError, TypeError):
        raise DitronError(f"ditron.init: device={device!r} is not a device") from None
    if dev.type != "cuda":
        raise DitronError(f"ditron.init: device={device!r} is not a CUDA device; the GPU transports need one GPU "
                          "per rank (use backend='sim' on the CPU)")
    if dev.index is None:
        dev = torch.device("cuda", local_rank // per_gpu)
    if not 0 <= dev.index < count:
        raise DitronError(f"ditron.init: device {dev} does not exist: {count} GPU(s) are visible{vis}")
    return dev


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_process_group(torch, rank, world_size, dev, per_gpu=1):
    """Join torch.distributed (NCCL, env://; gloo when ranks share GPUs, which NCCL refuses) unless the caller
    already did; check that an existing group matches the job."""
    global _PG_CREATED
    import torch.distributed as dist
    if not dist.is_available():
        raise DitronError("this PyTorch build has no torch.distributed")
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise DitronError(f"world-size mismatch: torch.distributed has rank {dist.get_rank()} of "
                              f"{dist.get_world_size()}, but RANK={rank} WORLD_SIZE={world_size}; launch every "
                              "rank with the same torchrun job, or initialise torch.distributed with RANK/WORLD_SIZE")
        return
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        if world_size > 1:
            raise DitronError(f"WORLD_SIZE={world_size} but MASTER_ADDR / MASTER_PORT are not set: launch with "
                              "torchrun (e.g. torchrun --nproc-per-node 4 script.py), which sets them")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    timeout = datetime.timedelta(seconds=float(os.environ.get("DITRON_INIT_TIMEOUT_S", "300")))
    try:
        # no device_id: NCCL communicators start lazily, after _check_job has
        # rejected ranks that share a GPU (an eager NCCL init would fail obscurely)
        dist.init_process_group("nccl" if per_gpu == 1 else "gloo", init_method="env://", rank=rank,
                                world_size=world_size, timeout=timeout)
    except Exception as e:  # noqa: BLE001
        raise DitronError(
            f"rank {rank}: joining torch.distributed (NCCL, env:// at {os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')}) failed: {e}. Check that every rank runs in the same torchrun job, "
            "that MASTER_ADDR is reachable and MASTER_PORT is free (see docs/runtime.md, troubleshooting)") from e
    _PG_CREATED = True
    atexit.register(_destroy_process_group)


def _destroy_process_group():
    global _PG_CREATED
    if not _PG_CREATED:
        return
    _PG_CREATED = False
    try:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 -- interpreter shutdown
        pass


def _check_job(torch, topo, dev, per_gpu=1):
    """One GPU per local rank (at most ``per_gpu`` when ranks share GPUs), one host per node, peer access inside
    the node.  Returns every rank's facts and how many ranks use this rank's GPU."""
    rank, world_size, local_rank, lws, nnodes, node = topo
    props = torch.cuda.get_device_properties(dev)
    uuid = str(getattr(props, "uuid", "")) or f"{socket.gethostname()}:{dev.index}"
    me = {"rank": rank, "host": socket.gethostname(), "node": node, "local_rank": local_rank, "device": dev.index,
          "uuid": uuid, "lws": lws, "per_gpu": per_gpu}
    everyone = _all_gather(me)
    for r, info in enumerate(everyone):
        if info["rank"] != r:
            raise DitronError(f"rank {r} reports RANK={info['rank']}: ranks disagree with torch.distributed")
        if info["lws"] != lws:
            raise DitronError(f"LOCAL_WORLD_SIZE differs between ranks ({lws} on rank {rank}, {info['lws']} on "
                              f"rank {r})")
        if info["per_gpu"] != per_gpu:
            raise DitronError(f"ranks per GPU differ between ranks ({per_gpu} on rank {rank}, {info['per_gpu']} on "
                              f"rank {r}): set {sharing.ENV} (or ditron.init(ranks_per_gpu=...)) alike on every rank")
    same_node = [i for i in everyone if i["node"] == node]
    hosts = {i["host"] for i in same_node}
    if len(hosts) > 1:
        raise DitronError(f"node {node} spans several hosts ({sorted(hosts)}): ranks node*LOCAL_WORLD_SIZE .. must "
                          "run on one host (launch with torchrun --nproc-per-node)")
    users = {}
    for i in same_node:
        users.setdefault(i["uuid"], []).append(i["rank"])
    for uuid_, ranks in users.items():
        if len(ranks) > per_gpu:
            dev_ = next(i["device"] for i in same_node if i["uuid"] == uuid_)
            host = same_node[0]["host"]
            if per_gpu == 1:
                raise DitronError(f"wrong device: ranks {ranks[0]} and {ranks[1]} both use GPU {dev_} on {host}; give "
                                  "each local rank its own GPU (device=LOCAL_RANK, the default), or, for correctness "
                                  f"work only, let ranks share it with {sharing.ENV}={len(ranks)} (docs/runtime.md)")
            raise DitronError(f"wrong device: ranks {ranks} use GPU {dev_} on {host}, more than "
                              f"{sharing.ENV}={per_gpu} allows")
    for i in same_node:
        peer = i["device"]
        if peer != dev.index and not torch.cuda.can_device_access_peer(dev.index, peer):
            raise DitronError(f"GPU {dev.index} cannot access GPU {peer} directly (no peer access): ditron needs "
                              "NVLink/PCIe peer access between the GPUs of a node")
    per_device = {}
    for i in everyone:               # every node's GPUs, so that every rank of the job reaches the same verdict
        per_device[(i["node"], i["uuid"])] = per_device.get((i["node"], i["uuid"]), 0) + 1
    return everyone, len(users[uuid]), max(per_device.values()) > 1


def _choose_backend(backend, nnodes, shared=False):
    if shared:
        if backend == "nvshmem":
            raise DitronError("backend='nvshmem' with ranks that share a GPU: ditron's NVSHMEM transport needs one GPU "
                              "per rank (NVSHMEM's several-PEs-per-GPU mode is not supported by ditron); use "
                              "backend='p2p' (or 'auto'), which maps the heaps of ranks sharing a GPU over CUDA IPC")
        if nnodes > 1:
            raise DitronError(f"ranks that share a GPU ({sharing.ENV}) work on one node; this job spans {nnodes}")
        _all_gather(("p2p", "shared GPU"))       # every rank takes part in the same number of exchanges
        return "p2p"
    if backend in ("nvshmem", "auto"):
        ok, why = nvshmem_status()
        if ok:
            try:
                import nvshmem.core  # noqa: F401
                import nvshmem.bindings  # noqa: F401
            except Exception as e:  # noqa: BLE001
                ok, why = False, f"importing nvshmem4py failed: {type(e).__name__}: {e}"
    else:
        ok, why = False, "not requested"
    votes = _all_gather((ok, why))
    all_ok = all(v[0] for v in votes)
    if backend == "nvshmem":
        if not all_ok:
            bad = [(r, v[1]) for r, v in enumerate(votes) if not v[0]]
            r, reason = bad[0]
            raise DitronError(f"backend='nvshmem' requested but NVSHMEM is not usable on rank {r}: {reason}. "
                              "Install nvshmem4py-cu13 and nvidia-nvshmem-cu13 (3.4.5 with Triton 3.6), or use "
                              "backend='p2p' on one node")
        return "nvshmem"
    if backend == "auto" and all_ok:
        return "nvshmem"
    if nnodes > 1:
        reason = "" if backend == "p2p" else f" and NVSHMEM is not usable ({[v[1] for v in votes if not v[0]][0]})"
        raise DitronError(f"the job spans {nnodes} nodes{reason}: the P2P transport reaches only GPUs of one node; "
                          "install nvshmem4py-cu13 and use backend='nvshmem'")
    return "p2p"


def make_gpu_transport(backend, topo, heap_size, device, group=None, ranks_per_gpu=None) -> World:
    """Build this rank's world on its GPU (see the module docstring); ``group``: the torch process group the
    world is built on (``topo`` is then the group's, see :mod:`ditron.runtime.groups`); ``ranks_per_gpu``: the
    opt-in of :mod:`ditron.runtime.sharing` (default ``DITRON_RANKS_PER_GPU``, else 1)."""
    multicast_off()
    per_gpu = sharing.ranks_per_gpu(ranks_per_gpu)
    rank, world_size, local_rank, lws, nnodes, node = topo
    if lws > MAX_LOCAL_RANKS:
        raise DitronError(f"LOCAL_WORLD_SIZE={lws} exceeds the {MAX_LOCAL_RANKS} ranks per node the world "
                          "descriptor holds")
    torch = _torch()
    job = topology_from_env()       # the GPU is the process's own: LOCAL_RANK of the job, not of the group
    dev = _select_device(torch, device, job[2], job[3], per_gpu)
    torch.cuda.set_device(dev)
    if group is None:
        _ensure_process_group(torch, rank, world_size, dev, per_gpu)
    set_group(group)
    _, on_my_gpu, any_shared = _check_job(torch, topo, dev, per_gpu)   # any_shared: the same on every rank
    choice = _choose_backend(backend, nnodes, shared=any_shared)
    size = heap_size_from_env(DEFAULT_HEAP) if heap_size is None else round_up(parse_size(heap_size), HEAP_ALIGN)
    if size <= 0:
        raise DitronError(f"heap_size must be positive (got {heap_size!r})")
    timeout = wait_timeout_ns()
    _install_hooks()
    if choice == "p2p":
        from .gpu_p2p import P2PTransport
        transport = P2PTransport(topo, dev, size, timeout)
        transport.shared_gpu = any_shared
    else:
        from .gpu_nvshmem import NvshmemTransport
        transport = NvshmemTransport(topo, dev, size, timeout)
    if on_my_gpu > 1:
        _announce_sharing(rank, local_rank, dev, on_my_gpu, per_gpu)
    share = sharing.GpuShare(dev.index, on_my_gpu, sharing.mps_running(), sharing.mps_active_thread_percentage())
    transport.setup()
    sharing.set_current(share)
    _activate(transport)
    return World(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=lws, nnodes=nnodes,
                 node=node, device=dev, backend=choice, heap_size=size, transport=transport)


def _announce_sharing(rank, local_rank, dev, on_gpu, per_gpu):
    """One line from the first rank of each shared GPU: what this mode is for, and MPS."""
    if local_rank % per_gpu:
        return
    import sys
    mps = sharing.mps_running()
    line = (f"ditron: {on_gpu} ranks share {dev} ({sharing.ENV}={per_gpu}); each sizes its grids to its share of "
            "the SMs. For correctness and debugging, not timing.")
    if not mps:
        line += (" MPS is not running: the GPU time-slices between the ranks' processes, so every cross-rank wait "
                 "costs a time slice (slow, still correct). Start MPS (nvidia-cuda-mps-control -d) for speed.")
    print(line, file=sys.stderr, flush=True)
