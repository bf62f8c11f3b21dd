"""The GPU transport base: what the NVSHMEM and P2P transports share.

:class:`GpuTransport` (heap, peers, sync area, world descriptor, debug buffer,
copies), the Triton kernel-load hook that writes ``__ditron_world`` into
every loaded module, hang reports and :func:`_all_gather`.
:mod:`ditron.runtime.gpu` (bring-up, backend choice), :mod:`.gpu_p2p` and
:mod:`.gpu_nvshmem` import it; it imports none of them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

from ..errors import DitronError, DitronHangError
from ..lowering import cuda_bounded, cuda_p2p
from ..lowering.devlib import HEAP_ALIGN, WORLD_FIELDS, WORLD_HEAP_DELTAS, WORLD_MAGIC, \
    WORLD_SYMBOL, WORLD_WORDS
from .heap import SymmetricHeap
from .transport import Transport

log = logging.getLogger("ditron")

#: NVLink multicast (NVLS) must stay off on shared machines: a program that
#: uses it can take the host's GPUs out of service.  Set before anything that
#: reads them initialises (NCCL communicators, torch symmetric memory, NVSHMEM).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

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


def _links_rocshmem(metadata_group) -> bool:
    from .. import _compat
    from ..libs import ROCSHMEM_LIB
    return any(name == ROCSHMEM_LIB for name, _ in _compat.metadata_extern_libs(metadata_group))


def _current_device_index():
    import torch
    return torch.cuda.current_device()


def _on_kernel_load(module, function, name, metadata_group, hash_=None):
    """Triton kernel-load hook: a module holding ``__ditron_world`` gets the
    current world's descriptor (zeros without a world) and, if it links
    NVSHMEM, NVSHMEM's module initialisation."""
    if not module:
        return
    if _links_rocshmem(metadata_group):
        from .rocm import rocshmem_module_unsupported
        raise rocshmem_module_unsupported(name)
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
_LAST_ENTRY = None          # the report's DitronHangError entry (device records only)


def hang_report():
    """The last bounded-wait report of this process (text), or None."""
    return _LAST_REPORT


def check_hang():
    """Raise :class:`DitronHangError` with the report if a bounded wait of this process has expired (a kernel
    that stopped on a bounded wait returns normally: the report is the only sign)."""
    t = _ACTIVE
    if t is not None:
        t._check_debug()
    if _LAST_REPORT is not None:
        raise DitronHangError(_LAST_REPORT, [_LAST_ENTRY] if _LAST_ENTRY else [])


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


def _hang_parts(record: dict, transport):
    kind = cuda_bounded.HANG_KINDS.get(record["kind"], f"wait kind {record['kind']}")
    cmp = "==" if record["kind"] == 1 else _CMP_TEXT.get(record["cmp"], "?")
    where = transport.describe_address(record["addr"]) if transport is not None else f"address {record['addr']:#x}"
    return kind, cmp, where


def format_hang(record: dict, transport) -> str:
    kind, cmp, where = _hang_parts(record, transport)
    timeout = record["timeout_ns"] / 1e9
    return (f"ditron: bounded wait expired on rank {record['rank']} (DITRON_WAIT_TIMEOUT_S={timeout:g}): "
            f"program ({record['ctaid_x']}, {record['ctaid_y']}, {record['ctaid_z']}), thread {record['tid']}, "
            f"{kind} on {where}: expected value {cmp} {record['expected']}, observed {record['observed']} after "
            f"{record['elapsed_ns'] / 1e9:.3f} s. Every program of the kernel left at its next wait (no trap: the "
            "CUDA context and the other processes on the GPU carry on); this world's signals are inconsistent now, "
            "so it launches no more kernels: end it.")


def hang_entry(record: dict, transport) -> dict:
    """The report entry of :class:`DitronHangError` for a device record."""
    kind, cmp, where = _hang_parts(record, transport)
    return {"rank": record["rank"], "program": (record["ctaid_x"], record["ctaid_y"], record["ctaid_z"]),
            "primitive": kind, "where": "device", "signal": where, "expected": f"{cmp} {record['expected']}",
            "observed": record["observed"]}


_GATHER_SEQ = [0]
_GROUP = [None]          # the torch process group of the world being built (None: the whole job)


def set_group(group):
    """The process group the GPU world is built on (None: every rank of the job)."""
    _GROUP[0] = group


def process_group():
    """The process group of the GPU world (``torch.distributed.group.WORLD`` for the whole job)."""
    import torch.distributed as dist
    return _GROUP[0] if _GROUP[0] is not None else dist.group.WORLD


def _all_gather(obj):
    """All ranks' ``obj`` (ranks of the world's group) through torch.distributed's store (CPU only: it
    works before NCCL communicators exist, e.g. when ranks share a GPU)."""
    import pickle

    import torch.distributed as dist
    group = _GROUP[0]
    store = dist.distributed_c10d._get_default_store()
    _GATHER_SEQ[0] += 1
    name = "job" if group is None else group.group_name      # concurrent groups (TP inside DP) do not mix
    prefix = f"ditron/gather/{name}/{_GATHER_SEQ[0]}/"
    store.set(prefix + str(dist.get_rank(group)), pickle.dumps(obj))
    keys = [prefix + str(r) for r in range(dist.get_world_size(group))]
    store.wait(keys)
    return [pickle.loads(store.get(k)) for k in keys]


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
        import torch
        self._device_index = torch.device(device).index   # before_launch compares it on every launch
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
        from .alloccheck import gpu_ledger
        self.heap.on_alloc = gpu_ledger(self.rank, self.world_size)      # DITRON_DEBUG=1: ranks allocate alike
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
        self.debug = torch.zeros(cuda_bounded.HANG_RECORD_WORDS, dtype=torch.int64, pin_memory=True)
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

    def before_launch(self, kernel, args, device=None):
        if self.wait_timeout_ns and self._check_debug() is not None:
            raise DitronHangError(f"rank {self.rank}: kernel {getattr(kernel, '__name__', '?')} not launched: a "
                                  f"bounded wait expired in an earlier kernel of this world: {_LAST_REPORT}",
                                  [_LAST_ENTRY] if _LAST_ENTRY else [])
        if device is None:
            import torch
            device = torch.cuda.current_device()
        if device != self._device_index:
            raise DitronError(f"wrong device: the current CUDA device is cuda:{device} but "
                              f"this rank's ditron world is on {self.device}; launch on torch.cuda.set_device("
                              f"{self.device.index})")

    def describe_address(self, addr: int) -> str:
        from .heap import name_address
        named = name_address(addr)
        plain = self._describe_heap_address(addr)
        return f"{named}; {plain}" if named else plain

    def _describe_heap_address(self, addr: int) -> str:
        if self.heap is not None and self.heap.contains_ptr(addr):
            return self.heap.describe_offset(addr - self.heap.base) + " (this rank's copy)"
        first = self.node * self.local_world_size
        for lr, base in enumerate(self.peer_bases):
            if base <= addr < base + self.heap_size:
                return f"rank {first + lr}'s copy of " + self.heap.describe_offset(addr - base)
        return f"address {addr:#x} (not in a symmetric heap)"

    # -- bounded waits ----------------------------------------------------------------
    def _check_debug(self):
        global _LAST_REPORT, _LAST_ENTRY
        d = self._debug_np
        if d is None or int(d[cuda_bounded.HANG_WORDS["valid"]]) != cuda_bounded.HANG_VALID:
            return None
        if _LAST_REPORT is None:
            rec = {k: int(d[i]) for k, i in cuda_bounded.HANG_WORDS.items()}
            _LAST_ENTRY = hang_entry(rec, self)
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
            if self.wait_timeout_ns and self._check_debug() is not None:
                raise DitronHangError("a bounded wait expired: no closing barrier (the peers may never arrive)")
            self.barrier()
            torch.cuda.synchronize(self.device)
        except Exception:  # noqa: BLE001 -- a dead context or a hang report must not block the exit
            ok = False
        _deactivate(self)
        from . import sharing
        sharing.set_current(None)
        self._release(ok)
        self.heap = None
        self.sync = None
        self.peer_heaps = {}

    def _release(self, ok):
        pass
