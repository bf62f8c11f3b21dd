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
from . import language
from .compiler import CompiledKernel, compile
from .errors import DitronCompileError, DitronError, LibraryError, LoweringError
from .jit import DitronJITFunction, jit
from .target import Target, parse_target

__version__ = "0.1.0"

__all__ = ["jit", "compile", "language", "CompiledKernel", "DitronJITFunction", "DitronError", "DitronCompileError",
           "LoweringError", "LibraryError", "Target", "parse_target", "__version__"]
