"""A helper module that imports ``triton.language`` builtins by name, as Triton-distributed's profiler
(``triton_dist/tools/profiler/language.py``) does with ``to_tensor``: tests/test_sim_glue.py."""
import triton
import triton.language as tl  # noqa: F401 -- Triton's interpreter needs triton.language visible from the helper
from triton.language.core import to_tensor


@triton.jit
def plus_one_by_name(x):
    return to_tensor(x) + 1
