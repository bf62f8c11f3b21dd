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
that, past the timeout, writes a report record and traps; a watchdog thread
prints the report (rank, program, signal tensor and offset, expected and
observed values) as soon as the record appears.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import importlib.metadata
import importlib.util
import logging
import os
import socket
import sys
import threading
import time

from ..errors import DitronError, DitronHangError
from ..lowering import cuda_p2p
from ..lowering.devlib import HEAP_ALIGN, MAX_LOCAL_RANKS, WORLD_FIELDS, WORLD_HEAP_DELTAS, WORLD_MAGIC, \
    WORLD_SYMBOL, WORLD_WORDS
from .heap import SymmetricHeap, heap_size_from_env, parse_size, round_up
from .world import Transport, World

log = logging.getLogger("ditron")

#: NVLink multicast (NVLS) must stay off on shared machines: a program that
#: uses it can take the host's GPUs out of service.  Set before anything that
#: reads them initialises (NCCL communicators, torch symmetric memory, NVSHMEM).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

DEFAULT_HEAP = 1 << 30
FLAG_P2P, FLAG_NVSHMEM, FLAG_BOUNDED = 1, 2, 4


def multicast_off():
    """Set the multicast switches off where the environment leaves them unset."""
    for k, v in MULTICAST_OFF.items():
        os.environ.setdefault(k, v)


multicast_off()


def wait_timeout_ns() -> int:
    """``DITRON_WAIT_TIMEOUT_S`` (seconds, float) in ns; 0 when unset or 0."""
    raw = os.environ.get("DITRON_WAIT_TIMEOUT_S", "").strip()
    if not raw:
        return 0
    try:
        secs = float(raw)
    except ValueError:
        raise DitronError(f"DITRON_WAIT_TIMEOUT_S={raw!r} is not a number of seconds") from None
    if secs < 0:
        raise DitronError(f"DITRON_WAIT_TIMEOUT_S={raw!r} must be >= 0")
    return int(secs * 1e9)


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
# Loaded modules and their world descriptors
# ---------------------------------------------------------------------------

class _Module:
    __slots__ = ("handle", "name", "device", "dptr", "size", "nvshmem", "nvshmem_ready")

    def __init__(self, handle, name, device, dptr, size, nvshmem):
        self.handle, self.name, self.device, self.dptr, self.size = handle, name, device, dptr, size
        self.nvshmem = nvshmem
        self.nvshmem_ready = False


_MODULES: dict[int, _Module] = {}
_ACTIVE = None                   # the GpuTransport of the current world
_LOCK = threading.RLock()
_HOOKS_INSTALLED = False


def _links_nvshmem(metadata_group) -> bool:
    from .. import _compat
    from ..libs import NVSHMEM_LIB
    return any(name == NVSHMEM_LIB for name, _ in _compat.metadata_extern_libs(metadata_group))


def _current_device_index():
    import torch
    return torch.cuda.current_device()


def _on_kernel_load(module, function, name, metadata_group, hash_=None):
    """Triton kernel-load hook: a module holding ``__ditron_world`` gets the
    current world's descriptor (zeros without a world) and, if it links
    NVSHMEM, NVSHMEM's module initialisation."""
    if not module:
        return
    from . import gpu_driver
    found = gpu_driver.module_global(module, WORLD_SYMBOL)
    nv = _links_nvshmem(metadata_group)
    if found is None and not nv:
        return
    dptr, size = found if found is not None else (0, 0)
    with _LOCK:
        info = _Module(int(module), name, _current_device_index(), dptr, size, nv)
        _MODULES[info.handle] = info
        transport = _ACTIVE
        if nv and (transport is None or transport.name != "nvshmem"):
            where = "no ditron world exists" if transport is None else f"the world uses the {transport.name} transport"
            raise DitronError(f"kernel {name} calls shmem.* through NVSHMEM, but {where}: call "
                              "ditron.init(backend='nvshmem' or 'auto') before compiling and launching it")
        _sync_module(info, transport)


def _on_kernel_unload(module, function, name, metadata_group, hash_=None):
    with _LOCK:
        _MODULES.pop(int(module or 0), None)


def _install_hooks():
    global _HOOKS_INSTALLED
    from .. import _compat
    if not _HOOKS_INSTALLED:
        _compat.add_kernel_load_hook(_on_kernel_load)
        _compat.add_kernel_unload_hook(_on_kernel_unload)
        _HOOKS_INSTALLED = True


def _sync_module(info, transport):
    from . import gpu_driver
    if info.dptr:
        words = transport.descriptor() if transport is not None else [0] * WORLD_WORDS
        gpu_driver.write_words(info.dptr, words, info.size)
    if info.nvshmem and transport is not None and transport.name == "nvshmem" and not info.nvshmem_ready:
        transport.module_init(info.handle)
        info.nvshmem_ready = True


def _activate(transport):
    """Make ``transport`` current: new modules get its descriptor, and every
    module loaded so far is rewritten (a new init moves the heaps)."""
    global _ACTIVE
    import torch
    _install_hooks()
    with _LOCK:
        _ACTIVE = transport
        for info in list(_MODULES.values()):
            with torch.cuda.device(info.device):
                if transport is not None and transport.name != "nvshmem":
                    info.nvshmem_ready = False
                _sync_module(info, transport)


def _deactivate(transport):
    """Zero the descriptors (magic 0: symm_at then traps instead of touching
    freed heaps)."""
    global _ACTIVE
    import torch
    with _LOCK:
        if _ACTIVE is transport:
            _ACTIVE = None
        for info in list(_MODULES.values()):
            try:
                with torch.cuda.device(info.device):
                    _sync_module(info, None)
            except Exception:  # noqa: BLE001 -- best effort while tearing down
                pass
            info.nvshmem_ready = False


def loaded_modules():
    """(name, device, links NVSHMEM) of each module holding a world descriptor."""
    with _LOCK:
        return [(m.name, m.device, m.nvshmem) for m in _MODULES.values()]


# ---------------------------------------------------------------------------
# Hang reports (bounded waits)
# ---------------------------------------------------------------------------
_LAST_REPORT = None


def hang_report():
    """The last bounded-wait report of this process (text), or None."""
    return _LAST_REPORT


def wait_for_hang_report(timeout_s: float):
    """Wait up to ``timeout_s`` for a bounded-wait report; return it or None."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if _LAST_REPORT is not None:
            return _LAST_REPORT
        t = _ACTIVE
        if t is not None:
            t._check_debug()
        time.sleep(0.02)
    return _LAST_REPORT


_CMP_TEXT = {0: "==", 1: "!=", 2: ">", 3: "<=", 4: "<", 5: ">="}


def format_hang(record: dict, transport) -> str:
    kind = cuda_p2p.HANG_KINDS.get(record["kind"], f"wait kind {record['kind']}")
    cmp = "==" if record["kind"] == 1 else _CMP_TEXT.get(record["cmp"], "?")
    where = transport.describe_address(record["addr"]) if transport is not None else f"address {record['addr']:#x}"
    timeout = record["timeout_ns"] / 1e9
    return (f"ditron: bounded wait expired on rank {record['rank']} (DITRON_WAIT_TIMEOUT_S={timeout:g}): "
            f"program ({record['ctaid_x']}, {record['ctaid_y']}, {record['ctaid_z']}), thread {record['tid']}, "
            f"{kind} on {where}: expected value {cmp} {record['expected']}, observed {record['observed']} after "
            f"{record['elapsed_ns'] / 1e9:.3f} s. The kernel was stopped with a trap; this process's CUDA context "
            "is no longer usable (the next CUDA call reports an error).")


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
    return torch


def _select_device(torch, device, local_rank, local_world_size):
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    vis = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    if device is None:
        if local_rank >= count:
            raise DitronError(f"LOCAL_RANK={local_rank} needs GPU {local_rank}, but only {count} GPU(s) are "
                              f"visible{vis}: launch at most {count} processes per node "
                              f"(torchrun --nproc-per-node {count}) or pass device= to ditron.init")
        return torch.device("cuda", local_rank)
    try:
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    except (RuntimeError, TypeError):
        raise DitronError(f"ditron.init: device={device!r} is not a device") from None
    if dev.type != "cuda":
        raise DitronError(f"ditron.init: device={device!r} is not a CUDA device; the GPU transports need one GPU "
                          "per rank (use backend='sim' on the CPU)")
    if dev.index is None:
        dev = torch.device("cuda", local_rank)
    if not 0 <= dev.index < count:
        raise DitronError(f"ditron.init: device {dev} does not exist: {count} GPU(s) are visible{vis}")
    return dev


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_process_group(torch, rank, world_size, dev):
    """Join torch.distributed (NCCL, env://) unless the caller already did;
    check that an existing group matches the job."""
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
        dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
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


_GATHER_SEQ = [0]


def _all_gather(obj):
    """All ranks' ``obj`` through torch.distributed's store (CPU only: it
    works before NCCL communicators exist, e.g. when ranks share a GPU)."""
    import pickle

    import torch.distributed as dist
    store = dist.distributed_c10d._get_default_store()
    _GATHER_SEQ[0] += 1
    prefix = f"ditron/gather/{_GATHER_SEQ[0]}/"
    store.set(prefix + str(dist.get_rank()), pickle.dumps(obj))
    keys = [prefix + str(r) for r in range(dist.get_world_size())]
    store.wait(keys)
    return [pickle.loads(store.get(k)) for k in keys]


def _check_job(torch, topo, dev):
    """One GPU per local rank, one host per node, peer access inside the node."""
    rank, world_size, local_rank, lws, nnodes, node = topo
    props = torch.cuda.get_device_properties(dev)
    uuid = str(getattr(props, "uuid", "")) or f"{socket.gethostname()}:{dev.index}"
    me = {"rank": rank, "host": socket.gethostname(), "node": node, "local_rank": local_rank, "device": dev.index,
          "uuid": uuid, "lws": lws}
    everyone = _all_gather(me)
    for r, info in enumerate(everyone):
        if info["rank"] != r:
            raise DitronError(f"rank {r} reports RANK={info['rank']}: ranks disagree with torch.distributed")
        if info["lws"] != lws:
            raise DitronError(f"LOCAL_WORLD_SIZE differs between ranks ({lws} on rank {rank}, {info['lws']} on "
                              f"rank {r})")
    same_node = [i for i in everyone if i["node"] == node]
    hosts = {i["host"] for i in same_node}
    if len(hosts) > 1:
        raise DitronError(f"node {node} spans several hosts ({sorted(hosts)}): ranks node*LOCAL_WORLD_SIZE .. must "
                          "run on one host (launch with torchrun --nproc-per-node)")
    seen = {}
    for i in same_node:
        if i["uuid"] in seen:
            raise DitronError(f"wrong device: ranks {seen[i['uuid']]} and {i['rank']} both use GPU {i['device']} "
                              f"on {i['host']}; give each local rank its own GPU (device=LOCAL_RANK, the default)")
        seen[i["uuid"]] = i["rank"]
    for i in same_node:
        peer = i["device"]
        if peer != dev.index and not torch.cuda.can_device_access_peer(dev.index, peer):
            raise DitronError(f"GPU {dev.index} cannot access GPU {peer} directly (no peer access): ditron needs "
                              "NVLink/PCIe peer access between the GPUs of a node")
    return everyone


def _choose_backend(backend, nnodes):
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


# ---------------------------------------------------------------------------
# Transports
# ---------------------------------------------------------------------------

class GpuTransport(Transport):
    """What both GPU transports share: the heap and its peers' mappings, the
    sync area, the world descriptor, the pinned debug buffer, copies."""
    name = "?"
    compile_transport = "nvshmem"

    def __init__(self, topo, device, heap_size, timeout_ns):
        self.rank, self.world_size, self.local_rank, self.local_world_size, self.nnodes, self.node = topo
        self.device = device
        self.heap_size = heap_size
        self.wait_timeout_ns = timeout_ns
        self.heap = None
        self.peer_heaps = {}          # local rank -> uint8 tensor on this device aliasing its heap
        self.peer_bases = []          # address of each local rank's heap as mapped here
        self.sync = None
        self.debug = None
        self._debug_np = None
        self._watchdog = None
        self._stop = threading.Event()
        self._finalized = False

    # -- set-up, after the subclass made self.heap_tensor and self.peer_heaps ----------
    def _finish_setup(self):
        import torch
        base = self.heap_tensor.data_ptr()
        self.heap = SymmetricHeap(self.heap_tensor, self.rank, f"{self.name} transport")
        self.peer_bases = []
        for lr in range(self.local_world_size):
            p = self.peer_heaps[lr].data_ptr()
            if (p - base) % HEAP_ALIGN:
                raise DitronError(f"rank {self.rank}: the heap of local rank {lr} is mapped at {p:#x}, not a multiple "
                                  f"of {HEAP_ALIGN} bytes from this rank's heap at {base:#x}; symm_at cannot reach it")
            self.peer_bases.append(p)
        # runtime sync area: barrier generations/arrivals, hang-report claim
        self.sync = self.heap.alloc((cuda_p2p.SYNC_AREA_BYTES // 8,), torch.int64, name="ditron.sync")
        self.sync.zero_()
        self.debug = torch.zeros(cuda_p2p.HANG_RECORD_WORDS, dtype=torch.int64, pin_memory=True)
        self._debug_np = self.debug.numpy()
        torch.cuda.synchronize(self.device)
        self.barrier()
        self._self_test()
        if self.wait_timeout_ns:
            self._watchdog = threading.Thread(target=self._watch, name="ditron-hang-watchdog", daemon=True)
            self._watchdog.start()

    def _self_test(self):
        """Each rank writes a stamp into its sync area; every rank reads its
        peers' stamps through the peer mappings (checks the deltas)."""
        import torch
        stamp = 0x5EED_0000 + self.rank
        self.sync[2] = stamp
        torch.cuda.synchronize(self.device)
        self.barrier()
        torch.cuda.synchronize(self.device)
        first = self.node * self.local_world_size
        for lr in range(self.local_world_size):
            got = int(self.peer_tensor(self.sync, first + lr)[2].item())
            if got != 0x5EED_0000 + first + lr:
                raise DitronError(f"rank {self.rank}: reading local rank {lr}'s heap through its mapping returned "
                                  f"{got:#x}, not its stamp: the symmetric heaps are not mapped consistently")
        self.barrier()
        self.sync[2] = 0
        torch.cuda.synchronize(self.device)

    # -- world descriptor ---------------------------------------------------------
    def descriptor(self):
        w = [0] * WORLD_WORDS
        f = WORLD_FIELDS
        w[f["magic"]] = WORLD_MAGIC
        w[f["rank"]] = self.rank
        w[f["world_size"]] = self.world_size
        w[f["local_rank"]] = self.local_rank
        w[f["local_world_size"]] = self.local_world_size
        w[f["node"]] = self.node
        w[f["nnodes"]] = self.nnodes
        w[f["flags"]] = (FLAG_P2P if self.name == "p2p" else FLAG_NVSHMEM) | (FLAG_BOUNDED if self.wait_timeout_ns else 0)
        w[f["wait_timeout_ns"]] = self.wait_timeout_ns
        w[f["debug_buffer"]] = self.debug.data_ptr() if self.debug is not None else 0
        w[f["heap_size"]] = self.heap_size
        w[cuda_p2p.SYNC_AREA_WORD] = self.sync.data_ptr() if self.sync is not None else 0
        base = self.heap.base
        for lr, p in enumerate(self.peer_bases):
            w[WORLD_HEAP_DELTAS + lr] = (p - base) // HEAP_ALIGN
        return w

    # -- host API ---------------------------------------------------------------------
    def _local(self, rank):
        return rank - self.node * self.local_world_size

    def peer_tensor(self, t, rank: int):
        peer = self.peer_heaps[self._local(rank)]
        off = t.data_ptr() - self.heap.base
        elem = t.element_size()
        if off % elem:
            raise DitronError(f"tensor at heap offset {off} is not aligned to its element size {elem}")
        flat = peer[off:off + (self.heap.size - off) // elem * elem].view(t.dtype)
        return flat.as_strided(tuple(t.shape), tuple(t.stride()), flat.storage_offset())

    def rank_copy(self, dst, src, stream=None):
        import torch
        if dst.is_contiguous() and src.is_contiguous() and src.is_cuda:
            from . import gpu_driver
            s = stream if stream is not None else torch.cuda.current_stream(self.device)
            gpu_driver.memcpy_async(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size(), s.cuda_stream)
            return
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            dst.copy_(src)

    def write_value(self, word, value, stream=None):
        import torch
        from . import gpu_driver
        s = stream if stream is not None else torch.cuda.current_stream(self.device)
        gpu_driver.stream_write_value64(s.cuda_stream, word.data_ptr(), value)

    def wait_value(self, word, value, stream=None):
        import torch
        from . import gpu_driver
        s = stream if stream is not None else torch.cuda.current_stream(self.device)
        gpu_driver.stream_wait_value64(s.cuda_stream, word.data_ptr(), value)

    def before_launch(self, kernel, args):
        import torch
        if torch.cuda.current_device() != self.device.index:
            raise DitronError(f"wrong device: the current CUDA device is cuda:{torch.cuda.current_device()} but "
                              f"this rank's ditron world is on {self.device}; launch on torch.cuda.set_device("
                              f"{self.device.index})")

    def describe_address(self, addr: int) -> str:
        if self.heap is not None and self.heap.contains_ptr(addr):
            return self.heap.describe_offset(addr - self.heap.base) + " (this rank's copy)"
        first = self.node * self.local_world_size
        for lr, base in enumerate(self.peer_bases):
            if base <= addr < base + self.heap_size:
                return f"rank {first + lr}'s copy of " + self.heap.describe_offset(addr - base)
        return f"address {addr:#x} (not in a symmetric heap)"

    # -- bounded waits ----------------------------------------------------------------
    def _check_debug(self):
        global _LAST_REPORT
        d = self._debug_np
        if d is None or int(d[cuda_p2p.HANG_WORDS["valid"]]) != cuda_p2p.HANG_VALID:
            return None
        if _LAST_REPORT is None:
            rec = {k: int(d[i]) for k, i in cuda_p2p.HANG_WORDS.items()}
            _LAST_REPORT = format_hang(rec, self)
            print(_LAST_REPORT, file=sys.stderr, flush=True)
        return _LAST_REPORT

    def _watch(self):
        while not self._stop.wait(0.05):
            if self._check_debug() is not None:
                return

    # -- the host barrier, bounded by DITRON_WAIT_TIMEOUT_S ---------------------------
    def _bounded_barrier(self, enqueue, stream, primitive="ditron.barrier_all"):
        """``enqueue()`` queues the transport's stream-ordered barrier.  With
        ``DITRON_WAIT_TIMEOUT_S`` the host then waits for it (and for the work
        queued before it on the stream) up to the timeout; past it, it reports
        the rank and the call site and raises :class:`DitronHangError`."""
        import torch
        enqueue()
        if not self.wait_timeout_ns:
            return
        global _LAST_REPORT
        from .heap import _call_site
        s = stream if stream is not None else torch.cuda.current_stream(self.device)
        ev = torch.cuda.Event()
        ev.record(s)
        t0 = time.monotonic()
        timeout = self.wait_timeout_ns / 1e9
        delay = 1e-4
        while not ev.query():
            if self._check_debug() is not None:      # a kernel before the barrier trapped: its report stands
                raise DitronHangError(f"rank {self.rank}: {primitive} after a bounded wait expired: {_LAST_REPORT}")
            if time.monotonic() - t0 > timeout:
                site = _call_site()
                text = (f"ditron: bounded wait expired on rank {self.rank} (DITRON_WAIT_TIMEOUT_S={timeout:g}): "
                        f"host, {primitive} at {site} did not complete within {timeout:g} s: a rank did not reach "
                        "its barrier (or a kernel queued before it on this stream is still running). The stream "
                        "stays blocked; this process cannot continue.")
                if _LAST_REPORT is None:
                    _LAST_REPORT = text
                print(text, file=sys.stderr, flush=True)
                raise DitronHangError(text, [{"rank": self.rank, "program": None, "primitive": primitive,
                                              "where": site, "signal": "host barrier",
                                              "expected": f"{self.world_size} ranks arrived",
                                              "observed": f"not complete after {timeout:g} s"}])
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    # -- teardown --------------------------------------------------------------------
    def finalize(self):
        if self._finalized:
            return
        self._finalized = True
        import torch
        self._stop.set()
        ok = True
        try:
            torch.cuda.synchronize(self.device)
            self.barrier()
            torch.cuda.synchronize(self.device)
        except Exception:  # noqa: BLE001 -- a dead context (trap) must not block the exit
            ok = False
        _deactivate(self)
        self._release(ok)
        self.heap = None
        self.sync = None
        self.peer_heaps = {}

    def _release(self, ok):
        pass


def make_gpu_transport(backend, topo, heap_size, device) -> World:
    """Build this rank's world on its GPU (see the module docstring)."""
    multicast_off()
    rank, world_size, local_rank, lws, nnodes, node = topo
    if lws > MAX_LOCAL_RANKS:
        raise DitronError(f"LOCAL_WORLD_SIZE={lws} exceeds the {MAX_LOCAL_RANKS} ranks per node the world "
                          "descriptor holds")
    torch = _torch()
    dev = _select_device(torch, device, local_rank, lws)
    torch.cuda.set_device(dev)
    _ensure_process_group(torch, rank, world_size, dev)
    _check_job(torch, topo, dev)
    choice = _choose_backend(backend, nnodes)
    size = heap_size_from_env(DEFAULT_HEAP) if heap_size is None else round_up(parse_size(heap_size), HEAP_ALIGN)
    if size <= 0:
        raise DitronError(f"heap_size must be positive (got {heap_size!r})")
    timeout = wait_timeout_ns()
    _install_hooks()
    if choice == "p2p":
        from .gpu_p2p import P2PTransport
        transport = P2PTransport(topo, dev, size, timeout)
    else:
        from .gpu_nvshmem import NvshmemTransport
        transport = NvshmemTransport(topo, dev, size, timeout)
    transport.setup()
    _activate(transport)
    return World(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=lws, nnodes=nnodes,
                 node=node, device=dev, backend=choice, heap_size=size, transport=transport)
