"""``triton_dist.language.extra``: ``libshmem_device`` (OpenSHMEM device
calls, :mod:`ditron.language.shmem`) and ``language_extra`` (thread-level
helpers, :mod:`ditron.language.extra`)."""
from . import language_extra, libshmem_device  # noqa: F401
