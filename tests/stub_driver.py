"""A Triton driver for CPU machines: kernels compile for a real target (sm_90 by default) and launch through
Triton's own ``JITFunction.run`` -- argument binding, specialisation, cache keys, compilation, the load hooks
-- while loading and launching do nothing.  It lets CPU tests drive the GPU launch path of ``@ditron.jit``
and ``@triton.jit`` kernels (tensors on the CPU stand in for device tensors: only their addresses are read).

    with stub_driver() as drv:
        kernel[grid](...)          # compiles once, then each launch runs the host path only
        drv.launches               # how many launches reached the (empty) launcher
        drv.log                    # each launch's (grid, function, arguments), tensors as their addresses
"""
from __future__ import annotations

import contextlib

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.driver import GPUDriver
from triton.runtime.driver import driver as _driver


#: the module handle of every kernel "loaded" by the stub (no real driver may unload it)
STUB_MODULE = 0x57AB


class _Utils:
    loaded = 0

    def load_binary(self, name, kernel, shared, device):
        _Utils.loaded += 1                      # a function handle per loaded binary: launches tell them apart
        return STUB_MODULE, _Utils.loaded, 32, 0, 1024      # module, function, registers, spills, max threads

    def unload_module(self, module):
        pass

    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32,
                "sm_clock_rate": 1_980_000, "mem_clock_rate": 2_619_000, "mem_bus_width": 5120}


class StubDriver(GPUDriver):
    """Compiles for ``GPUTarget("cuda", arch, 32)``; launches count themselves and do nothing."""

    def __init__(self, arch=90):
        self.utils = _Utils()
        self.arch = arch
        self.launches = 0
        self.log = []
        drv = self

        class _Launcher:
            def __init__(self, src, metadata):
                pass

            def __call__(self, *args):
                # (grid x, y, z, stream, function, packed metadata, launch metadata, enter hook, exit hook, args):
                # the hooks are called as Triton's launcher calls them
                drv.launches += 1
                drv.log.append((args[:3], args[4], tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a
                                                         for a in args[9:])))
                for hook in args[7:9]:
                    if hook is not None:
                        hook(args[6])

        self.launcher_cls = _Launcher
        self.get_current_device = lambda: 0
        self.get_current_stream = lambda device=None: 0
        self.set_current_device = lambda device: None
        self.get_device_capability = lambda device=None: (arch // 10, arch % 10)

    @classmethod
    def is_active(cls):
        return True

    def map_python_to_cpp_type(self, ty):
        return ty

    def get_current_target(self):
        return GPUTarget("cuda", self.arch, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda

    def get_benchmarker(self):
        raise NotImplementedError("the stub driver times nothing")

    def get_empty_cache_for_benchmark(self):
        raise NotImplementedError("the stub driver times nothing")

    def clear_cache(self, cache):
        pass


@contextlib.contextmanager
def stub_driver(arch=90):
    drv = StubDriver(arch)
    before = _driver._active            # None on a CPU machine (Triton creates its driver at first use)
    _driver.set_active(drv)
    try:
        yield drv
    finally:
        _forget_stub_modules()
        _driver._active = before


def _forget_stub_modules():
    """Kernels loaded by the stub outlive it in their JITFunctions' caches: when they are collected later,
    Triton would ask the real driver (none on a CPU machine) to unload them.  Their handles are dropped here."""
    import gc

    from triton.compiler.compiler import CompiledKernel
    for obj in gc.get_objects():
        if type(obj) is CompiledKernel and getattr(obj, "module", None) == STUB_MODULE:
            obj.module = None


def _gpu_before_launch(transport, kernel, args, device):
    from ditron.runtime.gpu_base import GpuTransport
    global _gpu_before_launch
    _gpu_before_launch = GpuTransport.before_launch
    return _gpu_before_launch(transport, kernel, args, device)


class StubTransport:
    """A one-rank GPU-like transport over a CPU symmetric heap, for the stub driver: kernels compile for the P2P
    variant and launch through ``GpuTransport.before_launch``'s checks; barriers and copies are immediate."""

    name = "stub"
    compile_transport = "p2p"
    multicast = False

    def __init__(self, heap_bytes=1 << 24):
        from ditron.runtime.heap import SymmetricHeap
        self.heap = SymmetricHeap(torch.zeros(heap_bytes, dtype=torch.uint8), 0, "stub")
        self.wait_timeout_ns = 0
        self._device_index = 0
        self.device = torch.device("cpu")
        self.launch_checks = 0

    def before_launch(self, kernel, args, device=None):
        self.launch_checks += 1
        _gpu_before_launch(self, kernel, args, device if device is not None else 0)

    def barrier(self, stream=None):
        pass

    def peer_tensor(self, t, rank):
        return t

    def rank_copy(self, dst, src, stream=None):
        dst.copy_(src)

    def finalize(self):
        pass


@contextlib.contextmanager
def stub_world(heap_bytes=1 << 24):
    """``ditron.current_world()`` is a one-rank world on a :class:`StubTransport` for the block (use it inside
    :func:`stub_driver`)."""
    from ditron.runtime import world as W
    from ditron.runtime.transport import World
    t = StubTransport(heap_bytes)
    w = World(rank=0, world_size=1, local_rank=0, local_world_size=1, nnodes=1, node=0, device=t.device,
              backend="p2p", heap_size=heap_bytes, transport=t)
    before, W._WORLD = W._WORLD, w
    W._GEN += 1
    try:
        yield w
    finally:
        W._WORLD = before
        W._GEN += 1
