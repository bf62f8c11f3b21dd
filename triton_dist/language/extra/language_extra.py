"""``triton_dist.language.extra.language_extra``: :mod:`ditron.language.extra`
(Triton-distributed's thread-level helpers with its defaults)."""
from ditron.language.extra import *  # noqa: F401,F403
from ditron.language.extra import __all__  # noqa: F401
from ditron.language.extra import (__ballot_sync, __fence, __shfl_down_sync_i32, __shfl_sync_i32,  # noqa: F401
                                   __shfl_up_sync_i32, __shfl_xor_sync_i32, __syncthreads)
from ditron.language.extra import missing as _missing


def __getattr__(name):
    raise _missing(__name__, name)
