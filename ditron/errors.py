"""Exceptions raised by ditron.

Every error that concerns a distributed primitive names the primitive (the
distributed-IR op), the offending argument where there is one, and the target.
"""


class DitronError(Exception):
    """Base class of every ditron error."""


class DitronCompileError(DitronError):
    """A kernel cannot be compiled for the requested target.

    Raised while tracing a kernel, before any code is generated: bad attribute
    strings, wrong operand types, a primitive that the target cannot express,
    a device library that is missing or incompatible.
    """

    def __init__(self, message, *, op=None, arg=None, target=None, loc=None):
        self.op = op
        self.arg = arg
        self.target = target
        self.loc = loc
        parts = []
        if op is not None:
            parts.append(f"dl.{op}" if not op.startswith("shmem.") else op)
        if arg is not None:
            parts.append(f"argument '{arg}'")
        if target is not None:
            parts.append(f"target {target}")
        prefix = ", ".join(parts)
        full = f"{prefix}: {message}" if prefix else message
        if loc is not None:
            full = f"{full} (at {loc})"
        super().__init__(full)


class LoweringError(DitronCompileError):
    """No lowering rule exists for an (op, backend) pair."""


class LibraryError(DitronError):
    """A device library (NVSHMEM, rocSHMEM) is missing or cannot be used."""
