"""The torch host code of a script under ``ditron sim``: a simulated GPU and a
real ``torch.distributed`` process group.

Triton-distributed's tutorials build their reference results with GPU and
NCCL calls (``x.cuda()``, ``torch.randn(..., device="cuda")``,
``torch.cuda.current_stream()``, ``torch.distributed.all_gather(...,
group=TP_GROUP)``).  Under ``ditron sim`` each rank is a CPU process, so:

* :func:`install` (run by every ``ditron sim`` rank before the script, never
  on GPUs, never in a plain ``import ditron``) makes the simulated GPU's
  memory *host memory*: every tensor is already on it.  ``device="cuda"``
  (``"cuda:i"``, ``torch.device("cuda")``, an integer device) in any torch
  call becomes ``"cpu"``; ``Tensor.cuda()`` / ``.to("cuda")`` return the
  tensor itself, as torch does for a tensor already on the target device (on a
  GPU ``x.cuda()`` of a CPU tensor is a copy; here it aliases ``x``);
  ``torch.cuda.current_stream()`` / ``default_stream()`` / ``Stream()`` /
  ``stream(s)`` / ``Event()`` / ``synchronize()`` / ``set_device`` /
  ``current_device`` are the simulator's streams, which are synchronous: a
  launch has finished when it returns.  ``torch.cuda.is_available()`` stays
  ``False``, tensors report ``device.type == "cpu"``, and
  ``torch.cuda.get_device_properties`` and the like still fail.
* :data:`driver` is the part of cuda-python's driver API that the simulator
  can model (``cuStreamWriteValue32/64``, ``cuStreamWaitValue32/64``), on
  symmetric-heap addresses only; ``triton_dist.utils.cuda`` is it under
  ``ditron sim`` when cuda-python is not installed.
* :func:`process_group` starts a gloo process group of the job's ranks (each
  rank is a process), so ``torch.distributed`` collectives compute on CPU
  tensors as NCCL does on GPUs; ``triton_dist.utils.initialize_distributed``
  returns it.

docs/simulator.md ("Host code: the simulated GPU") describes the same.
"""
from __future__ import annotations

import contextlib
import datetime
import enum
import os
import sys
import time
import types

_STATE = {"installed": False, "mode": None, "pg_gen": 0, "device": None}


def active() -> bool:
    """Whether this process is a ``ditron sim`` rank with the simulated GPU installed."""
    return _STATE["installed"]


# ---------------------------------------------------------------------------
# streams and events
# ---------------------------------------------------------------------------

class Stream:
    """A simulated CUDA stream.  The simulator's launches, copies and stream
    memory operations complete before they return, so every stream is
    always idle: ``synchronize`` / ``wait_stream`` / ``wait_event`` do
    nothing, ``query`` is True.  ``cuda_stream`` is an integer handle (0 for
    the default stream), accepted by :data:`driver`'s calls."""

    _next = [1]

    def __init__(self, device=None, priority=0, *, _handle=None, **kwargs):
        if _handle is None:
            _handle = Stream._next[0]
            Stream._next[0] += 1
        self.cuda_stream = _handle
        self.priority = priority
        self.device = _sim_device()

    def synchronize(self):
        pass

    def query(self):
        return True

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, Stream) and other.cuda_stream == self.cuda_stream

    def __hash__(self):
        return hash(("ditron-sim-stream", self.cuda_stream))

    def __repr__(self):
        return f"<ditron sim stream {self.cuda_stream} (synchronous)>"


class Event:
    """A simulated CUDA event: ``record`` notes the host clock (streams are
    synchronous, so that is when the work before it finished);
    ``elapsed_time`` is milliseconds of simulator time, not of a GPU."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **kwargs):
        self.enable_timing = enable_timing
        self._t = None

    def record(self, stream=None):
        self._t = time.perf_counter()

    def synchronize(self):
        pass

    def query(self):
        return True

    def wait(self, stream=None):
        pass

    def elapsed_time(self, end):
        if self._t is None or end._t is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end._t - self._t) * 1e3


_DEFAULT = None
_CURRENT: list = []


def _default_stream(device=None):
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Stream(_handle=0)
    return _DEFAULT


def _current_stream(device=None):
    return _CURRENT[-1] if _CURRENT else _default_stream()


@contextlib.contextmanager
def _stream(stream):
    if stream is None:
        yield
        return
    if not isinstance(stream, Stream):
        raise TypeError(f"torch.cuda.stream: under ditron sim the stream must be a torch.cuda.Stream() / "
                        f"current_stream() of the simulated GPU, not {type(stream).__name__}")
    _CURRENT.append(stream)
    try:
        yield stream
    finally:
        _CURRENT.pop()


def _sim_device():
    d = _STATE["device"]
    return d if d is not None else int(os.environ.get("LOCAL_RANK", "0"))


def _set_device(device):
    import torch
    if isinstance(device, torch.device):
        device = device.index or 0
    elif isinstance(device, str):
        device = torch.device(device).index or 0
    _STATE["device"] = int(device)


# ---------------------------------------------------------------------------
# device="cuda" -> host memory
# ---------------------------------------------------------------------------

def _is_gpu_device(d):
    import torch
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    return type(d) is int


def _mode_class():
    import torch
    from torch.overrides import TorchFunctionMode

    to_device = {torch.Tensor.cuda}
    moves = {torch.Tensor.to}

    class SimulatedGPU(TorchFunctionMode):
        """``device="cuda"`` -> ``"cpu"``; ``Tensor.cuda()`` is the tensor itself."""

        def __torch_function__(self, func, types_, args=(), kwargs=None):
            if func in to_device:
                return args[0]
            if kwargs:
                d = kwargs.get("device")
                if d is not None and _is_gpu_device(d):
                    kwargs = dict(kwargs, device="cpu")
            else:
                kwargs = {}
            if func in moves and len(args) > 1 and _is_gpu_device(args[1]):
                args = (args[0], "cpu") + tuple(args[2:])
            return func(*args, **kwargs)

    return SimulatedGPU


class _AfterTorchImport:
    """A meta-path entry that installs the simulated GPU right after the script's own ``import torch`` (a rank
    does not import torch for a script that never does: started ranks begin without it, as plain Python)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            install()
        spec.loader.exec_module = exec_module
        return spec


def install():
    """Make this ``ditron sim`` rank's torch see a simulated GPU (module
    docstring): now if torch is imported, else right after the script
    imports it.  Idempotent."""
    if _STATE["installed"]:
        return
    if "torch" not in sys.modules:
        if not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterTorchImport())
        return
    import torch
    mode = _mode_class()()
    mode.__enter__()                   # for the whole rank: the script's torch calls run inside it
    _STATE["mode"] = mode
    cuda = torch.cuda
    cuda.Stream = Stream
    cuda.Event = Event
    cuda.current_stream = _current_stream
    cuda.default_stream = _default_stream
    cuda.stream = _stream
    cuda.synchronize = lambda device=None: None
    cuda.set_device = _set_device
    cuda.current_device = _sim_device
    _STATE["installed"] = True


# ---------------------------------------------------------------------------
# cuda-python's stream memory operations, on symmetric-heap addresses
# ---------------------------------------------------------------------------

class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0


class CUstreamWriteValue_flags(enum.IntEnum):
    CU_STREAM_WRITE_VALUE_DEFAULT = 0
    CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER = 1


class CUstreamWaitValue_flags(enum.IntEnum):
    CU_STREAM_WAIT_VALUE_GEQ = 0
    CU_STREAM_WAIT_VALUE_EQ = 1
    CU_STREAM_WAIT_VALUE_AND = 2
    CU_STREAM_WAIT_VALUE_NOR = 3
    CU_STREAM_WAIT_VALUE_FLUSH = 1 << 30


def _word(what, addr, nbytes):
    import numpy as np
    import ditron
    world = ditron.current_world(required=False)
    if world is None or world.backend != "sim":
        raise RuntimeError(f"{what}: call triton_dist.utils.initialize_distributed() (ditron.init()) first")
    addr = int(getattr(addr, "value", addr))
    if world.transport.owner_of(addr) is None:
        raise RuntimeError(f"{what}: address {addr:#x} is not in the symmetric heap; under ditron sim stream "
                           "memory operations write and wait on symmetric tensors only (nvshmem_create_tensor / "
                           "ditron.symm_empty)")
    if addr % nbytes:
        raise RuntimeError(f"{what}: address {addr:#x} is not {nbytes}-byte aligned (CUDA_ERROR_INVALID_VALUE on a GPU)")
    return world, addr, (np.int32 if nbytes == 4 else np.int64)


def _write_value(nbytes):
    name = f"cuStreamWriteValue{nbytes * 8}"

    def write(stream, addr, value, flags=0):
        from .. import sim_memory as M
        from ..lowering.sim import race
        world, addr, dtype = _word(name, addr, nbytes)
        value = int(value) & ((1 << (nbytes * 8)) - 1)
        if value >= 1 << (nbytes * 8 - 1):
            value -= 1 << (nbytes * 8)
        if int(flags) != CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER:
            race().signal_release(addr, True)        # the default: a system-scope fence before the store
        M.atomic_xchg(addr, value, dtype)
        world.transport.control.progress()
        return (CUresult.CUDA_SUCCESS,)
    write.__name__ = name
    write.__doc__ = (f"``{name}(stream, addr, value, flags)``: store ``value`` at ``addr`` (a symmetric-heap "
                     "address, this rank's or a peer's) once the work before it on ``stream`` is done (on the "
                     "simulator: now); with the default flags after a memory fence.  Returns ``(CUDA_SUCCESS,)``.")
    return write


def _wait_value(nbytes):
    name = f"cuStreamWaitValue{nbytes * 8}"

    def wait(stream, addr, value, flags=0):
        from .. import sim_memory as M
        from ..lowering.sim import race
        from ..runtime.heap import _call_site
        from ..runtime.sim import Blocked
        from ..errors import DitronHangError
        world, addr, dtype = _word(name, addr, nbytes)
        mask = (1 << (nbytes * 8)) - 1
        value = int(value) & mask
        kind = int(flags) & ~CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_FLUSH
        tests = {0: (lambda v: v >= value, f">= {value}"), 1: (lambda v: v == value, f"== {value}"),
                 2: (lambda v: (v & value) != 0, f"& {value:#x} != 0"),
                 3: (lambda v: (~(v | value) & mask) != 0, f"nor {value:#x} != 0")}
        if kind not in tests:
            raise RuntimeError(f"{name}: flags {int(flags)} are not a CUstreamWaitValue_flags value")
        ok, expected = tests[kind]
        site = _call_site()

        def check():
            v = int(M.atomic_load(addr, dtype).reshape(-1)[0]) & mask
            return ok(v), v

        def describe(observed):
            return {"rank": world.rank, "program": None, "primitive": name, "where": site,
                    "signal": world.transport.describe_addr(addr), "expected": expected, "observed": observed}
        try:
            world.transport.spin(check, describe)
        except Blocked as b:
            raise DitronHangError(f"rank {world.rank}: {name} did not complete ({b.reason})", [b.info]) from None
        race().signal_acquire(addr, True)
        return (CUresult.CUDA_SUCCESS,)
    wait.__name__ = name
    wait.__doc__ = (f"``{name}(stream, addr, value, flags)``: block until the word at ``addr`` (a symmetric-heap "
                    "address of this rank) satisfies ``flags`` (GEQ, EQ, AND, NOR as on a GPU; GEQ compares "
                    "unsigned, without wrap-around).  On the simulator streams are synchronous, so the host "
                    "waits; a wait that never ends is reported by the deadlock watchdog.")
    return wait


driver = types.ModuleType("cuda.bindings.driver (ditron sim)", doc=(
    "The part of cuda-python's driver API the simulator models (ditron/sim/host_torch.py): cuStreamWriteValue32/64, "
    "cuStreamWaitValue32/64 on symmetric-heap addresses, and their flag enums.  Any other name is an "
    "AttributeError."))
driver.CUresult = CUresult
driver.CUstreamWriteValue_flags = CUstreamWriteValue_flags
driver.CUstreamWaitValue_flags = CUstreamWaitValue_flags
driver.cuStreamWriteValue32 = _write_value(4)
driver.cuStreamWriteValue64 = _write_value(8)
driver.cuStreamWaitValue32 = _wait_value(4)
driver.cuStreamWaitValue64 = _wait_value(8)


def _driver_getattr(name):
    raise AttributeError(f"cuda.{name} is not modelled by ditron sim (its cuda-python stand-in has "
                         "cuStreamWriteValue32/64 and cuStreamWaitValue32/64 only); ditron.rank_copy, "
                         "ditron.stream_write_value and ditron.stream_wait_value are ditron's host calls")


driver.__getattr__ = _driver_getattr


# ---------------------------------------------------------------------------
# a torch.distributed process group of the simulated ranks
# ---------------------------------------------------------------------------

def process_group(world):
    """The default ``torch.distributed`` process group of this simulated job,
    started on first use: gloo (each simulated rank is a process; collectives
    run on CPU tensors), rendezvous through a file in the job's directory.
    A group the script started itself is used as it is."""
    import torch.distributed as dist
    if dist.is_initialized():
        return dist.group.WORLD
    sim_dir = world.transport.sim_dir
    # every rank initialises the same number of times (a collective), so the n-th group of the job has one file
    gen = _STATE["pg_gen"]
    _STATE["pg_gen"] += 1
    path = os.path.join(sim_dir, f"torch_process_group.{gen}")
    dist.init_process_group("gloo", init_method="file://" + path, rank=world.rank, world_size=world.world_size,
                            timeout=datetime.timedelta(seconds=1800))
    return dist.group.WORLD
