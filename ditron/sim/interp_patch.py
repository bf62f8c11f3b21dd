"""How :mod:`ditron.sim.interp_fast` and :mod:`ditron.sim.interp_plans` replace parts of Triton's interpreter:
each replacement is recorded (``ORIGINALS``: Triton's own; ``TARGETS``: where it was installed; tests put Triton's
back to compare the two), and installed only when Triton's function has exactly the source it replaces
(:func:`_source_is`: 3.6 and 3.9 as released)."""
from __future__ import annotations

ORIGINALS: dict = {}       # name -> Triton's own
TARGETS: dict = {}         # name -> (object, attribute) it replaced


#: what ``ORIGINALS`` holds for an attribute that Triton's class did not have
ABSENT = object()


def _replace(name, obj, attr, new):
    ORIGINALS[name] = getattr(obj, attr, ABSENT)
    TARGETS[name] = (obj, attr)
    setattr(obj, attr, new)


def _body(fn):
    """``fn``'s body as stripped lines (comments and a one-line docstring left out), None without source."""
    import inspect
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    body = [ln.strip() for ln in src.splitlines()[1:] if ln.strip() and not ln.strip().startswith("#")]
    return [ln for ln in body if not (ln.startswith('"""') and ln.endswith('"""'))]


def _source_is(fn, *expected):
    """Whether ``fn``'s body (stripped lines, comments and docstring left out) is one of ``expected``: line
    tuples, or the SHA-256 of the lines joined by newlines (for long functions)."""
    body = _body(fn)
    if body is None:
        return False
    digest = None
    for e in expected:
        if isinstance(e, str):
            if digest is None:
                import hashlib
                digest = hashlib.sha256("\n".join(body).encode()).hexdigest()
            if digest == e:
                return True
        elif body == list(e):
            return True
    return False
