"""Alias of ``triton_dist.language.extra.language_extra`` (one module object)."""
import sys

from .. import language_extra

sys.modules[__name__] = language_extra
