"""Alias of ``triton_dist.language.extra.libshmem_device`` (one module object)."""
import sys

from .. import libshmem_device

sys.modules[__name__] = libshmem_device
