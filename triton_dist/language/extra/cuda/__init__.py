"""``triton_dist.language.extra.cuda``: the same modules as
``triton_dist.language.extra`` (ditron's are target-neutral)."""
from . import language_extra, libnvshmem_device  # noqa: F401
