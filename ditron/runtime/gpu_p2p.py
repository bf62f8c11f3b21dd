"""The P2P transport: one node, no NVSHMEM.

The symmetric heap is one allocation of torch symmetric memory's CUDA backend
(``torch.distributed._symmetric_memory``: cuMem allocations exchanged over
CUDA IPC, mapped into every local rank; multicast off), rendezvoused over the
world process group.  Peers' heaps come from ``get_buffer``; ``symm_at`` and the
P2P ``shmem.*`` lowering reach them through the heap deltas in the world
descriptor.  The host barrier is torch symmetric memory's stream-ordered
barrier (a tiny kernel on the caller's stream over the allocation's signal
pads); ``rank_copy`` is ``copy_`` between peer views (the copy engine).
"""
from __future__ import annotations

from ..errors import DitronError
from .gpu_base import HEAP_ALIGN, GpuTransport, process_group


class P2PTransport(GpuTransport):
    name = "p2p"
    compile_transport = "p2p"

    def setup(self):
        import torch
        import torch.distributed as dist
        try:
            import torch.distributed._symmetric_memory as symm_mem
        except ImportError as e:
            raise DitronError(f"the P2P transport needs torch.distributed._symmetric_memory (PyTorch >= 2.5): {e}") \
                from None
        self._symm = symm_mem
        try:
            backend = symm_mem.get_backend(self.device) if hasattr(symm_mem, "get_backend") else None
            if backend not in (None, "CUDA") and hasattr(symm_mem, "set_backend"):
                symm_mem.set_backend("CUDA")
        except Exception:  # noqa: BLE001 -- older torch: CUDA is the only backend
            pass
        group = process_group()
        try:
            buf = symm_mem.empty(self.heap_size + HEAP_ALIGN, dtype=torch.uint8, device=self.device)
            try:
                hdl = symm_mem.rendezvous(buf, group)
            except Exception:  # noqa: BLE001 -- torch < 2.7 wants the group enabled first
                symm_mem.enable_symm_mem_for_group(group.group_name)
                hdl = symm_mem.rendezvous(buf, group.group_name)
        except torch.cuda.OutOfMemoryError:
            raise DitronError(f"rank {self.rank}: cannot allocate a {self.heap_size}-byte symmetric heap on "
                              f"{self.device}; lower DITRON_HEAP_SIZE") from None
        except Exception as e:  # noqa: BLE001
            raise DitronError(f"rank {self.rank}: torch symmetric memory (CUDA IPC) rendezvous failed: {e}. See "
                              "docs/runtime.md, troubleshooting") from e
        if getattr(hdl, "multicast_ptr", 0):
            raise DitronError("torch symmetric memory created a multicast object although "
                              "TORCH_SYMM_MEM_DISABLE_MULTICAST=1; refusing to continue")
        self._buf, self._hdl = buf, hdl
        # where our allocation starts inside the rendezvoused buffer (0 unless
        # torch sub-allocates from a pool); the same on every rank
        me = hdl.get_buffer(hdl.rank, (1,), torch.uint8, 0).data_ptr()
        extra = buf.data_ptr() - me
        pad = (-buf.data_ptr()) % HEAP_ALIGN
        from .gpu_base import _all_gather
        layouts = _all_gather((extra, pad))
        if any(lay != (extra, pad) for lay in layouts):
            raise DitronError(f"torch symmetric memory placed the heap differently on different ranks {layouts}")
        self.heap_tensor = buf[pad:pad + self.heap_size]
        first = self.node * self.local_world_size
        for lr in range(self.local_world_size):
            r = first + lr
            if r == self.rank:
                self.peer_heaps[lr] = self.heap_tensor
            else:
                self.peer_heaps[lr] = hdl.get_buffer(r, (self.heap_size,), torch.uint8, extra + pad)
        self._finish_setup()

    def barrier(self, stream=None):
        import torch

        def enqueue():
            with torch.cuda.stream(stream) if stream is not None else _null():
                self._hdl.barrier(channel=0)
        self._bounded_barrier(enqueue, stream)

    def _release(self, ok):
        self._hdl = None
        self._buf = None
        self.heap_tensor = None


def _null():
    import contextlib
    return contextlib.nullcontext()
