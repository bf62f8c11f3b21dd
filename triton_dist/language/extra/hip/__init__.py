"""``triton_dist.language.extra.hip``: the same modules as
``triton_dist.language.extra`` (ditron's are target-neutral)."""
from . import language_extra, librocshmem_device  # noqa: F401
