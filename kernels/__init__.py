"""ditron's kernel zoo, written in ``ditron.language`` (importable as
``ditron.kernels``).  The collectives and GEMM-overlap kernels land here; for
now it holds the porting example of docs/porting.md."""
from .porting_example import copy_kernel, ring_pull_kernel

__all__ = ["copy_kernel", "ring_pull_kernel"]
