"""The NVSHMEM transport, through nvshmem4py (``nvshmem.core``).

Bootstrap: rank 0 makes an NVSHMEM unique id, torch.distributed broadcasts it,
every rank calls ``nvshmem.core.init(..., initializer_method="uid")``.  NVSHMEM
stays initialised for the life of the process (``ditron.finalize`` frees the
heap; ``nvshmem.core.finalize`` runs at exit), so init/finalize can repeat.
The heap is one NVSHMEM symmetric allocation (``nvshmem.core.tensor``); peers'
heaps on this node come from ``nvshmem.core.get_peer_tensor`` (``nvshmem_ptr``).
Kernels that call ``shmem.*`` get ``nvshmemx_cumodule_init`` on their module
after Triton loads it (see :mod:`ditron.runtime.gpu`).  The host barrier is
``nvshmemx_barrier_all_on_stream``.
"""
from __future__ import annotations

import atexit
import os

from ..errors import DitronError
from .gpu_base import GpuTransport, _all_gather

_NV = {"initialized": False, "pe": None, "npes": None, "symmetric_size": None}
#: NVSHMEM's own heap holds ditron's heap plus this much for NVSHMEM's internals
_NVSHMEM_SLACK = 256 << 20


def _import():
    try:
        import nvshmem.bindings as nvb
        import nvshmem.core as nvc
    except Exception as e:  # noqa: BLE001
        raise DitronError(f"backend 'nvshmem' needs nvshmem4py: importing nvshmem.core failed ({type(e).__name__}: "
                          f"{e}); pip install nvshmem4py-cu13 nvidia-nvshmem-cu13") from None
    return nvc, nvb


def _cuda_device(index):
    try:
        from cuda.core import Device
    except ImportError:
        from cuda.core.experimental import Device
    dev = Device(index)
    dev.set_current()
    return dev


def _bootstrap(rank, world_size, device, heap_size):
    import numpy as np
    nvc, nvb = _import()
    if _NV["initialized"]:
        return nvc, nvb
    want = heap_size + _NVSHMEM_SLACK
    if "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:
        os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(want)
    _NV["symmetric_size"] = os.environ["NVSHMEM_SYMMETRIC_SIZE"]
    uid = nvc.get_unique_id(empty=rank != 0)
    raw = uid._data.view(np.uint8)
    # broadcast rank 0's id through torch.distributed's store (CPU, no NCCL needed)
    first = _all_gather(bytes(raw.tobytes()) if rank == 0 else None)[0]
    raw[:] = np.frombuffer(first, dtype=np.uint8)
    try:
        nvc.init(device=_cuda_device(device.index), uid=uid, rank=rank, nranks=world_size, initializer_method="uid")
    except Exception as e:  # noqa: BLE001
        raise DitronError(f"rank {rank}: NVSHMEM bootstrap (unique id over torch.distributed) failed: {e}. "
                          "See docs/runtime.md, troubleshooting (NVSHMEM_DEBUG=INFO shows NVSHMEM's log)") from e
    _NV.update(initialized=True, pe=nvb.my_pe(), npes=nvb.n_pes())
    if _NV["pe"] != rank or _NV["npes"] != world_size:
        raise DitronError(f"NVSHMEM says PE {_NV['pe']} of {_NV['npes']} but this is rank {rank} of {world_size}")
    atexit.register(_finalize_nvshmem)
    return nvc, nvb


def _finalize_nvshmem():
    if not _NV["initialized"]:
        return
    _NV["initialized"] = False
    try:
        import nvshmem.core as nvc
        nvc.finalize()
    except Exception:  # noqa: BLE001 -- interpreter shutdown
        pass


class NvshmemTransport(GpuTransport):
    name = "nvshmem"
    compile_transport = "nvshmem"

    def setup(self):
        import torch
        nvc, nvb = _bootstrap(self.rank, self.world_size, self.device, self.heap_size)
        self._nvc, self._nvb = nvc, nvb
        torch.cuda.set_device(self.device)
        try:
            heap = nvc.tensor((self.heap_size,), dtype=torch.uint8)
        except Exception as e:  # noqa: BLE001
            raise DitronError(f"rank {self.rank}: allocating a {self.heap_size}-byte heap from NVSHMEM's symmetric "
                              f"heap failed ({e}); NVSHMEM_SYMMETRIC_SIZE={_NV['symmetric_size']} is fixed when NVSHMEM "
                              "starts: set DITRON_HEAP_SIZE (or NVSHMEM_SYMMETRIC_SIZE) before the first "
                              "ditron.init") from e
        self._heap_alloc = heap
        self.heap_tensor = heap
        first = self.node * self.local_world_size
        for lr in range(self.local_world_size):
            r = first + lr
            if r == self.rank:
                self.peer_heaps[lr] = heap
                continue
            peer = nvc.get_peer_tensor(heap, r)
            if peer is None or peer.data_ptr() == 0:
                raise DitronError(f"rank {self.rank}: NVSHMEM gives no load/store mapping of rank {r}'s heap "
                                  "(nvshmem_ptr returned NULL): the GPUs of a node need peer access")
            self.peer_heaps[lr] = peer
        layouts = _all_gather(heap.data_ptr() % 4096)
        if len(set(layouts)) != 1:
            raise DitronError(f"NVSHMEM heap offsets differ between ranks: {layouts}")
        self._finish_setup()

    def barrier(self, stream=None):
        import torch
        s = stream if stream is not None else torch.cuda.current_stream(self.device)
        self._bounded_barrier(lambda: self._nvb.barrier_all_on_stream(int(s.cuda_stream)), s)

    def module_init(self, handle: int):
        status = self._nvb.cumodule_init(int(handle))
        if status is not None and status != 0:
            raise DitronError(f"nvshmemx_cumodule_init failed (status {status}) on a kernel module")

    def _release(self, ok):
        heap, self._heap_alloc = self._heap_alloc, None
        self.heap_tensor = None
        if ok and heap is not None:
            try:
                self._nvc.free_tensor(heap)
            except Exception:  # noqa: BLE001
                pass
