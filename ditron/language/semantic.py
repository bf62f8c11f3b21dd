"""The semantic layer under ``ditron.language``: every primitive builds one
distributed-IR op, verifies it against the op spec for the kernel's target,
records it, and hands it to the (op, backend) lowering rule.

Front-end functions in :mod:`ditron.language.core` and
:mod:`ditron.language.shmem` stay thin: they name their operands and
attributes and call :func:`emit`.
"""
from __future__ import annotations

import ast

from .. import _compat
from ..errors import DitronCompileError
from ..ir import Op, record, type_text, verify
from ..ir import active as recording_active   # (a module recording the ops: the compiler's, `ditron compile`)
from ..lowering import LoweringContext, lookup
from ..target import target_from_semantic


def _exprs(node, params):
    """Source text of each argument of the call ``node`` by parameter name."""
    out = {}
    if not isinstance(node, ast.Call):
        return out
    for name, arg in zip(params, node.args):
        out[name] = ast.unparse(arg)
    for kw in node.keywords:
        if kw.arg:
            out[kw.arg] = ast.unparse(kw.value)
    return out


def constant(value, name, kind, target):
    """The compile-time value of attribute ``name``; a runtime value is an error."""
    raw = _compat.unwrap(value)
    if hasattr(raw, "type") and hasattr(raw, "handle"):
        raise DitronCompileError("must be a compile-time constant (e.g. a string literal or tl.constexpr)",
                                 op=kind, arg=name, target=getattr(target, "name", None))
    return raw


def emit(kind, operands, attrs, _semantic, _generator, params=(), aliases=None):
    """Create, verify, lower and record one op; return its result."""
    target = target_from_semantic(_semantic)
    file, line, node = _compat.source_location(_generator)
    if _generator is None and target.backend == "sim":
        from ..lowering.sim import where           # interpreter: the kernel's line from the Python stack
        file, _, line = where().rpartition(":")
        line = int(line) if line.isdigit() else None
    exprs = _exprs(node, params)
    for src, dst in (aliases or {}).items():
        if src in exprs:
            exprs[dst] = exprs.pop(src)
    attrs = {k: constant(v, k, kind, target) for k, v in attrs.items()}
    operands = {k: _compat.unwrap(v) if not hasattr(v, "handle") else v for k, v in operands.items()}
    op = Op(kind, operands, attrs, fn=_compat.function_name(_generator), file=file, line=line, exprs=exprs)
    verify(op, target)
    if target.backend in ("cuda", "hip"):
        libs = getattr(_compat.builder_options(_semantic), "extern_libs", None) or ()
        if not any(name == "ditron" for name, _ in libs):
            raise DitronCompileError("the kernel was not compiled through ditron (its device library is not "
                                     "attached): decorate the kernel with @ditron.jit instead of @triton.jit "
                                     "(helpers it calls may stay @triton.jit)", op=kind, target=target.name,
                                     loc=op.loc)
    rule = lookup(kind, target)
    result = rule(LoweringContext(_semantic, _generator, target, op), **operands, **attrs)
    if recording_active() and not _compat.in_dry_run(_generator):
        # (a loop body's first visit, which Triton erases, is not recorded: its ops are recorded at the second)
        # (the result's type is only ever read in a recorded module's text: not computed for every op that the
        # simulator executes outside a recording)
        if result is not None:
            op.result_type = type_text(result)
        record(op)
    return result
