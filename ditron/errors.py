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


class DitronLintWarning(UserWarning):
    """A finding of the compile-time lint (:mod:`ditron.lint`): a signal
    without release after stores, a GPU-scope wait on a buffer a peer writes,
    a load after a wait that does not go through ``dl.consume_token``.
    ``DITRON_STRICT=1`` turns findings into :class:`DitronCompileError`."""


class DitronHangError(DitronError):
    """A wait did not complete: a deadlock found by the simulator, or a bounded
    wait (``DITRON_WAIT_TIMEOUT_S``) that expired on a GPU.

    ``report`` is a list of dicts, one per blocked wait: ``rank``,
    ``program``, ``primitive``, ``where`` (source line), ``signal`` (tensor and
    offset where known), ``expected``, ``observed``.
    """

    def __init__(self, message, report=()):
        self.report = list(report)
        super().__init__(message + ("\n" + format_report(self.report) if self.report else ""))


class DitronRankError(DitronError):
    """A simulated rank failed; carries that rank's traceback text."""

    def __init__(self, message, rank=None, traceback_text=""):
        self.rank = rank
        self.traceback_text = traceback_text
        super().__init__(message + (f"\n--- traceback of rank {rank} ---\n{traceback_text}" if traceback_text else ""))


def format_report_entry(e) -> str:
    prog = e.get("program")
    who = f"rank {e.get('rank')}" + (f", program {tuple(prog)}" if prog is not None else ", host")
    parts = [f"{who}: blocked in {e.get('primitive', '?')} at {e.get('where', '?')}"]
    if e.get("signal"):
        parts.append(f"signal: {e['signal']}")
    if e.get("expected") is not None:
        parts.append(f"expected: {e['expected']}")
    if e.get("observed") is not None:
        parts.append(f"observed: {e['observed']}")
    return "; ".join(parts)


def format_report(entries) -> str:
    return "\n".join("  " + format_report_entry(e) for e in entries)
