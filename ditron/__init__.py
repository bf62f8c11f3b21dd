"""ditron: a distributed tile-language compiler on stock Triton.

    import ditron
    import ditron.language as dl

    @ditron.jit
    def kernel(...):
        ...dl.wait / dl.notify / dl.symm_at / dl.shmem.putmem_signal_nbi_block...

    kernel[grid](...)                                   # on GPUs, like Triton
    ditron.compile(kernel, target="gfx942", ...)        # anywhere, no GPU needed

Importing ditron never touches a GPU.
"""
import os as _os

# NVLink multicast stays off unless the caller decided otherwise (see
# ditron/runtime/gpu.py): set before NCCL / torch symmetric memory / NVSHMEM start.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    _os.environ.setdefault(_k, _v)
from . import language
from . import aliases as _aliases

_aliases.install()          # Triton-distributed's triton.* module names (ditron/aliases.py)
from . import _compat as _compat_mod

_compat_mod.install_interpreted_aggregates()   # @tl.core._aggregate keeps @triton.jit methods when interpreted
from .compiler import CompiledKernel, compile
from .errors import DitronCompileError, DitronError, LibraryError, LoweringError
from .errors import DitronHangError, DitronLintWarning, DitronRankError
from .jit import DitronJITFunction, jit
from . import gluon       # ditron.gluon.jit: distributed Gluon kernels (imports no Gluon until used)
from .runtime.world import (World, barrier_all, current_world, finalize, heap_scope, init, is_symmetric, peer_tensor,
                            rank_copy, stream_wait_value, stream_write_value, symm_empty, symm_zeros)
from .target import Target, parse_target

__version__ = "0.1.0"

__all__ = ["init", "finalize", "current_world", "World", "symm_empty", "symm_zeros", "is_symmetric", "heap_scope",
           "barrier_all", "rank_copy", "stream_write_value", "stream_wait_value", "peer_tensor", "DitronHangError", "DitronRankError", "DitronLintWarning", "jit", "compile", "language", "CompiledKernel", "DitronJITFunction", "DitronError", "DitronCompileError",
           "LoweringError", "LibraryError", "Target", "parse_target", "__version__"]
