"""Several ranks on one GPU: the opt-in, the rank -> GPU map and each rank's share of the SMs.

By default every local rank needs its own GPU (``LOCAL_RANK`` -> ``cuda:LOCAL_RANK``), and ranks that land on one
GPU are an error.  ``DITRON_RANKS_PER_GPU=N`` (or ``ditron.init(ranks_per_gpu=N)``) lets ``N`` consecutive local
ranks share a GPU: local rank ``r`` uses GPU ``r // N``.  This is for correctness work -- running a multi-rank
kernel, its hang reports and the simulator's claims on the one GPU of a workstation -- not for timing: ranks on
one GPU compete for its SMs and memory bandwidth (``ditron bench`` refuses to time such a world).

A persistent kernel whose programs wait for another rank must never hold every SM while that rank's programs
cannot start: on a shared GPU each rank sizes its grids to its share of the SMs (:func:`sm_share`).  Under the
CUDA Multi-Process Service (MPS) the ranks' kernels run side by side; without it, the GPU time-slices between
processes and every cross-rank wait costs a time slice (correct, but slow: start MPS, see docs/runtime.md).

Pure arithmetic and environment reading: nothing here touches a GPU, so it is tested on the CPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..errors import DitronError

ENV = "DITRON_RANKS_PER_GPU"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def ranks_per_gpu(arg=None) -> int:
    """The opt-in: ``arg`` (``ditron.init(ranks_per_gpu=...)``) if given, else ``DITRON_RANKS_PER_GPU``, else 1."""
    if arg is not None:
        src = f"ditron.init(ranks_per_gpu={arg!r})"
        raw = arg
    else:
        raw = os.environ.get(ENV, "").strip()
        if not raw:
            return 1
        src = f"{ENV}={raw!r}"
    if isinstance(raw, bool):
        raise DitronError(f"{src}: give a whole number of ranks per GPU (1, 2, 3, ...), not a bool")
    try:
        n = int(raw)
        if isinstance(raw, float) and raw != n:
            raise ValueError
    except (TypeError, ValueError):
        raise DitronError(f"{src} is not a whole number of ranks per GPU (1, 2, 3, ...)") from None
    if n < 1:
        raise DitronError(f"{src} must be at least 1 (1 = one GPU per rank, the default)")
    return n


def gpu_of_local_rank(local_rank: int, local_world_size: int, per_gpu: int, device_count: int) -> int:
    """The GPU index local rank ``local_rank`` uses when ``per_gpu`` consecutive local ranks share a GPU."""
    if device_count < 1:
        raise DitronError("no CUDA GPU is visible to this process")
    need = -(-local_world_size // per_gpu)
    if need > device_count:
        hint = (f"set {ENV}={-(-local_world_size // device_count)} to let ranks share GPUs"
                if per_gpu == 1 else f"raise {ENV} to at least {-(-local_world_size // device_count)}")
        raise DitronError(f"{local_world_size} local ranks at {per_gpu} rank(s) per GPU need {need} GPUs, but "
                          f"only {device_count} are visible: launch fewer processes per node or {hint}")
    return local_rank // per_gpu


def mps_active_thread_percentage() -> Optional[float]:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` as a number in (0, 100], None when unset."""
    raw = os.environ.get(MPS_THREADS_ENV, "").strip()
    if not raw:
        return None
    try:
        p = float(raw)
    except ValueError:
        raise DitronError(f"{MPS_THREADS_ENV}={raw!r} is not a percentage") from None
    if not 0 < p <= 100:
        raise DitronError(f"{MPS_THREADS_ENV}={raw!r} must be in (0, 100]")
    return p


def mps_running() -> bool:
    """Whether an MPS control daemon is reachable (its pipe directory holds a ``control`` pipe)."""
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return os.path.exists(os.path.join(pipe_dir, "control"))


def sm_share(total_sms: int, sharing: int, mps_percentage: Optional[float] = None) -> int:
    """SMs one rank may fill with resident programs when ``sharing`` ranks share a GPU of ``total_sms`` SMs.

    The ranks' shares together never exceed the GPU, so every rank's persistent grid can be resident at once
    (a rank that waits for another never holds the SMs that rank needs).  Under MPS with an active-thread
    percentage ``p`` a client cannot use more than ``p``% of the SMs either.  At least one SM."""
    if total_sms < 1:
        raise DitronError(f"a GPU with {total_sms} SMs")
    if sharing < 1:
        raise DitronError(f"{sharing} ranks sharing a GPU")
    share = total_sms // sharing
    if mps_percentage is not None:
        share = min(share, int(total_sms * mps_percentage / 100))
    return max(1, share)


@dataclass(frozen=True)
class GpuShare:
    """How this process's GPU is shared: ``sharing`` ranks of the world use it (1: not shared)."""
    device_index: int
    sharing: int
    mps: bool
    mps_percentage: Optional[float] = None

    def usable_sms(self, total_sms: int) -> int:
        return sm_share(total_sms, self.sharing, self.mps_percentage) if self.sharing > 1 else total_sms


_SHARE: Optional[GpuShare] = None


def set_current(share: Optional[GpuShare]):
    """Set by the GPU runtime when a world is built (None when it ends)."""
    global _SHARE
    _SHARE = share


def current() -> Optional[GpuShare]:
    """The sharing of the current GPU world (None without one, or on the simulator)."""
    return _SHARE


def shared() -> bool:
    """Whether ranks of the current world share this process's GPU."""
    return _SHARE is not None and _SHARE.sharing > 1


def usable_sms(device_index, total_sms: int) -> int:
    """SMs of GPU ``device_index`` this rank may fill: all of them unless ranks of the current world share it."""
    s = _SHARE
    if s is None or s.sharing <= 1 or (device_index is not None and int(device_index) != s.device_index):
        return total_sms
    return s.usable_sms(total_sms)


def refuse_timing(what: str):
    """Benchmarks call this before timing: figures measured while ranks share a GPU are not performance numbers."""
    if shared():
        s = _SHARE
        raise DitronError(f"{what}: {s.sharing} ranks share GPU {s.device_index} ({ENV}); their kernels compete for "
                          "its SMs and memory, so the times would not be performance numbers. Ranks sharing a GPU "
                          "are for correctness and debugging; time on one GPU per rank")
