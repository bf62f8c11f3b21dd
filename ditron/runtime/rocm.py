"""What ditron's GPU runtime lacks on ROCm, said once, where it matters.

ditron compiles for gfx942 without a GPU, and the simulator runs those kernels on the CPU; but the GPU
runtime (:mod:`ditron.runtime.gpu`) drives CUDA only: it writes the world descriptor with CUDA driver
calls (``libcuda``) and its transports are NVSHMEM and CUDA IPC.  Kernels that call ``shmem.*`` on AMD
would also need rocSHMEM's host side: ``rocshmem_init`` and, for every loaded module that links
rocSHMEM's device bitcode, its own ``ROCSHMEM_CTX_DEFAULT`` set by ``rocshmem_hipmodule_init(module,
stream)`` (rocSHMEM's counterpart of ``nvshmemx_cumodule_init``); ditron does neither yet, and a kernel
launched without it would dereference a null context.  Nothing here touches a GPU or imports torch.
"""
from __future__ import annotations

from ..errors import DitronError


def hip_version(torch) -> str | None:
    """torch's HIP version on a ROCm build of PyTorch, else None."""
    return getattr(getattr(torch, "version", None), "hip", None) or None


def runtime_unavailable(hip: str) -> DitronError:
    return DitronError(
        f"ditron's GPU runtime does not run on ROCm yet (this PyTorch is built for HIP {hip}): it writes the world "
        "descriptor through the CUDA driver (libcuda) and its transports are NVSHMEM and CUDA IPC. On AMD, compile "
        "with ditron.compile(..., target='gfx942') and run kernels on the simulator (ditron.init(backend='sim') or "
        "`ditron sim`). Kernels calling shmem.* would further need rocSHMEM's host runtime (rocshmem_init, and "
        "rocshmem_hipmodule_init on each loaded module to set its ROCSHMEM_CTX_DEFAULT), which ditron does not "
        "provide")


def rocshmem_module_unsupported(kernel: str) -> DitronError:
    return DitronError(
        f"kernel {kernel} links rocSHMEM's device bitcode (it calls shmem.*), but ditron does not initialise "
        "rocSHMEM modules: each loaded module needs its ROCSHMEM_CTX_DEFAULT set by rocSHMEM's host "
        "rocshmem_hipmodule_init(module, stream) after rocshmem_init, and launching without it would use a null "
        "context. Use dl.symm_at / dl.notify / dl.wait (pointer-based, no library) or run on the simulator")
