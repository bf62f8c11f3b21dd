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


def _programs_text(programs) -> str:
    """``program (0, 0, 0)`` for one; a box of the grid as ranges (``27 programs: (0..8, 0..2, 0)``), else the
    first two and the last (``5 programs: (0, 0, 0), (2, 0, 0), ..., (7, 1, 0)``)."""
    progs = sorted({tuple(p) for p in programs})
    if len(progs) == 1:
        return f"program {progs[0]}"
    axes = [sorted({p[i] for p in progs}) for i in range(len(progs[0]))]
    box = 1
    for a in axes:
        box *= len(a)
    if box == len(progs) and all(a[-1] - a[0] + 1 == len(a) for a in axes):
        return f"{len(progs)} programs: (" + ", ".join(f"{a[0]}..{a[-1]}" if len(a) > 1 else str(a[0])
                                                      for a in axes) + ")"
    shown = progs if len(progs) <= 4 else progs[:2] + ["..."] + progs[-1:]
    return f"{len(progs)} programs: " + ", ".join(str(p) for p in shown)


def format_report_entry(e, programs=None) -> str:
    """One line for a blocked wait; ``programs``: the programs of identical waits it stands for."""
    prog = e.get("program")
    if programs is not None and len(programs) > 1:
        who = f"rank {e.get('rank')}, {_programs_text(programs)}"
    else:
        who = f"rank {e.get('rank')}" + (f", program {tuple(prog)}" if prog is not None else ", host")
    parts = [f"{who}: blocked in {e.get('primitive', '?')} at {e.get('where', '?')}"]
    if e.get("signal"):
        parts.append(f"signal: {e['signal']}")
    if e.get("expected") is not None:
        parts.append(f"expected: {e['expected']}")
    if e.get("observed") is not None:
        parts.append(f"observed: {e['observed']}")
    return "; ".join(parts)


def collapse_report(entries):
    """[(entry, programs)]: blocked waits that differ only in their program (same rank, primitive, line, signal,
    expected and observed value) as one entry with the programs it covers, in order of first appearance."""
    groups: dict = {}
    for e in entries:
        prog = e.get("program")
        if prog is None:
            groups[("host", id(e))] = (e, None)
            continue
        key = tuple(str(e.get(k)) for k in ("rank", "primitive", "where", "signal", "expected", "observed"))
        if key in groups:
            groups[key][1].append(prog)
        else:
            groups[key] = (e, [prog])
    return list(groups.values())


def format_report_lines(entries):
    """The report's lines: identical blocked waits of several programs collapsed into one line."""
    return [format_report_entry(e, progs) for e, progs in collapse_report(entries)]


def format_report(entries) -> str:
    return "\n".join("  " + line for line in format_report_lines(entries))
