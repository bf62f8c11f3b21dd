"""The P2P transport: one node, no NVSHMEM.

The symmetric heap is one allocation of torch symmetric memory's CUDA backend
(``torch.distributed._symmetric_memory``: cuMem allocations exchanged over
CUDA IPC, mapped into every local rank; multicast off), rendezvoused over the
world process group.  Peers' heaps come from ``get_buffer``; ``symm_at`` and the
P2P ``shmem.*`` lowering reach them through the heap deltas in the world
descriptor.  The host barrier is torch symmetric memory's stream-ordered
barrier (a tiny kernel on the caller's stream over the allocation's signal
pads); ``rank_copy`` is ``copy_`` between peer views (the copy engine).

Ranks that share a GPU (``DITRON_RANKS_PER_GPU``, :mod:`.sharing`): torch
symmetric memory refuses allocations of different ranks on one device, so the
heap is a plain ``cuMemAlloc`` exported with ``cuIpcGetMemHandle`` and mapped
into every local rank with ``cuIpcOpenMemHandle`` (handles exchanged through
the process group's store), and the host barrier is stream-ordered memory
operations: each rank writes its barrier generation into every local rank's
arrival word (``cuStreamWriteValue64``, fenced) and its stream then waits until
every rank's word in its own copy reached that generation
(``cuStreamWaitValue64`` GEQ).  No kernel and no SM is involved, so a barrier
never competes with the ranks' kernels for the GPU.
"""
from __future__ import annotations

from ..errors import DitronError
from ..lowering.devlib import MAX_LOCAL_RANKS
from .gpu_base import HEAP_ALIGN, GpuTransport, _all_gather, process_group

#: bytes after the heap (inside the same IPC allocation) holding the host barrier's arrival words
_HOST_BARRIER_BYTES = 8 * MAX_LOCAL_RANKS


class P2PTransport(GpuTransport):
    name = "p2p"
    compile_transport = "p2p"

    #: set by the runtime when ranks of this world share this GPU (ranks_per_gpu > 1)
    shared_gpu = False

    def setup(self):
        if self.shared_gpu:
            return self._setup_ipc()
        import torch
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

    def _setup_ipc(self):
        """The heap of ranks that share a GPU: one cuMemAlloc per rank, mapped into the others over CUDA IPC."""
        import torch
        from . import gpu_driver
        torch.cuda.synchronize(self.device)            # the primary context exists and is current
        nbytes = self.heap_size + 2 * HEAP_ALIGN
        try:
            base = gpu_driver.mem_alloc(nbytes)
        except DitronError as e:
            raise DitronError(f"rank {self.rank}: cannot allocate a {self.heap_size}-byte symmetric heap on "
                              f"{self.device} ({e}); ranks sharing a GPU each need one: lower DITRON_HEAP_SIZE") \
                from None
        self._ipc_base, self._ipc_opened = base, []
        pad = (-base) % HEAP_ALIGN
        whole = _device_bytes(base, nbytes, self.device)
        whole.zero_()                                   # barrier words start at generation 0
        torch.cuda.synchronize(self.device)
        handle = gpu_driver.ipc_get_handle(base)
        first = self.node * self.local_world_size
        everyone = _all_gather((self.rank, handle, pad))    # after every rank zeroed its words
        self._barrier_words = {}
        for lr in range(self.local_world_size):
            r, h, p = everyone[first + lr] if len(everyone) > first + lr else (None, None, None)
            if r != first + lr:
                raise DitronError(f"rank {self.rank}: the IPC heap exchange is out of order (got rank {r} at local "
                                  f"rank {lr}); the ranks of a node must be consecutive")
            if r == self.rank:
                mapped, view = base, whole
            else:
                try:
                    mapped = gpu_driver.ipc_open_handle(h)
                except DitronError as e:
                    raise DitronError(f"rank {self.rank}: mapping rank {r}'s heap (CUDA IPC, same GPU) failed: {e}. "
                                      "Ranks that share a GPU must run on the same host, in processes that may "
                                      "open each other's CUDA IPC handles") from None
                self._ipc_opened.append(mapped)
                view = _device_bytes(mapped, nbytes, self.device)
            self.peer_heaps[lr] = view[p:p + self.heap_size]
            self._barrier_words[lr] = view[p + self.heap_size:p + self.heap_size + _HOST_BARRIER_BYTES].view(
                torch.int64)
        self.heap_tensor = self.peer_heaps[self.local_rank]
        self._generation = 0
        self._finish_setup()

    def barrier(self, stream=None):
        import torch
        if self.shared_gpu:
            return self._bounded_barrier(lambda: self._memop_barrier(stream), stream)

        def enqueue():
            with torch.cuda.stream(stream) if stream is not None else _null():
                self._hdl.barrier(channel=0)
        self._bounded_barrier(enqueue, stream)

    def _memop_barrier(self, stream):
        """Stream-ordered barrier of ranks that share a GPU (see the module docstring)."""
        import torch
        from . import gpu_driver
        s = (stream if stream is not None else torch.cuda.current_stream(self.device)).cuda_stream
        self._generation += 1
        g = self._generation
        me = self.local_rank
        for lr in range(self.local_world_size):        # arrive: my word in every rank's copy
            gpu_driver.stream_write_value64(s, self._barrier_words[lr][me].data_ptr(), g)
        mine = self._barrier_words[me]
        for lr in range(self.local_world_size):        # wait: every rank's word in my copy
            gpu_driver.stream_wait_value64_geq(s, mine[lr].data_ptr(), g)

    def _release(self, ok):
        self._hdl = None
        self._buf = None
        self.heap_tensor = None
        if getattr(self, "_ipc_base", None):
            from . import gpu_driver
            self.peer_heaps = {}
            self._barrier_words = {}
            if ok:          # a trapped context cannot unmap or free; the process is going away anyway
                for p in self._ipc_opened:
                    try:
                        gpu_driver.ipc_close_handle(p)
                    except DitronError:
                        pass
                try:
                    gpu_driver.mem_free(self._ipc_base)
                except DitronError:
                    pass
            self._ipc_base, self._ipc_opened = 0, []


class _CudaBytes:
    """A device allocation made outside torch, seen by torch through ``__cuda_array_interface__``."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (int(nbytes),), "typestr": "|u1", "data": (int(ptr), False),
                                         "version": 3, "strides": None, "stream": None}


def _device_bytes(ptr, nbytes, device):
    """A uint8 tensor over ``nbytes`` of device memory at ``ptr`` (no copy; not owned by torch)."""
    import torch
    t = torch.as_tensor(_CudaBytes(ptr, nbytes), device=device)
    if t.data_ptr() != ptr:
        raise DitronError(f"torch copied the device buffer at {ptr:#x} instead of viewing it")
    return t


def _null():
    import contextlib
    return contextlib.nullcontext()
