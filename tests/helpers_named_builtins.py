"""A helper module that imports ``triton.language`` builtins by name, as Triton-distributed's profiler
(``triton_dist/tools/profiler/language.py``) does with ``to_tensor``: tests/test_sim_glue.py."""
import triton
import triton.language as tl  # noqa: F401 -- Triton's interpreter needs triton.language visible from the helper
from triton.language.core import to_tensor


@triton.jit
def plus_one_by_name(x):
    return to_tensor(x) + 1


@triton.jit
def store_by_name_kernel(out_ptr, X: tl.constexpr):
    """A kernel (launched with ``ditron.jit``) whose own module holds the builtin by name."""
    tl.store(out_ptr, to_tensor(X) + 2)
