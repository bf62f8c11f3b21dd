"""Which kernel arguments must be symmetric tensors: a static analysis.

:func:`symmetric_params` reads the Python source of a ``@ditron.jit`` /
``@triton.jit`` kernel and finds the parameters whose value flows into an
operand that must point into the symmetric heap, so that the runtime can
reject a plain tensor *before* launch, naming the argument
(:func:`check_symmetric_args`) -- instead of a peer access that faults or
silently reads another allocation.

Operands that must be symmetric ("sinks")::

    dl.symm_at(ptr, rank)                       ptr
    dl.notify(ptr, rank, ...)                   ptr
    shmem.remote_ptr(ptr, pe)                   ptr
    shmem.remote_mc_ptr(team, ptr)              ptr   (the source of dl.multimem_* addresses)
    shmem.putmem[_nbi][_warp|_block]            dst
    shmem.getmem[_nbi][_warp|_block]            src
    shmem.putmem_signal[_nbi][_warp|_block]     dst, sig_addr
    shmem.signal_op / signal_wait_until         sig_addr

``dl.wait`` polls local signal words and is not a sink.

How it works.  Callees are resolved by evaluating the callee expression
(``dl.symm_at``, ``ditron.language.shmem.putmem``, a bare imported
``symm_at``, ``libshmem_device.putmem_nbi_block``) against the function's
globals and closure with *static* attribute lookups only
(:func:`inspect.getattr_static`; no user code runs) and comparing the result
with the builtins by identity.  Arguments are bound to the builtin's real
parameter names (``inspect.signature``), positionally or by keyword.  A
flow-insensitive taint analysis runs to a fixpoint: every parameter taints
itself, and taint flows through assignments (plain, augmented, annotated,
tuple unpacking, walrus, ``for`` targets) and through the expressions that
keep pointer-ness: names, ``+``/``-``, unary ops, ``a if c else b``,
subscripts, tuples, ``tl.multiple_of`` / ``max_contiguous`` /
``max_constancy`` / ``expand_dims`` / ``broadcast_to`` / ``reshape`` /
``view`` / ``trans`` / ``permute`` / ``cast`` (first argument),
``tl.make_block_ptr`` / ``tl.advance`` (``base``), ``tl.where`` (both values),
``dl.symm_at`` / ``dl.consume_token`` / ``shmem.remote_ptr`` (the pointer),
and methods ``x.to(...)``, ``x.reshape(...)``, ... (the receiver).  Every
other call -- ``tl.load`` first of all -- yields data, not a pointer, so a
tensor that is only loaded from (even if the loaded values index a symmetric
tensor) is never reported.  Calls to other JIT functions are analysed
recursively: the parameters they report are mapped back to the caller's
argument expressions (their ``Use`` says ``via helper: ...``), and a helper
that *returns* a pointer derived from its parameters propagates taint too.

Limits.  The analysis is syntactic and errs towards *not* reporting: a call
that cannot be resolved, a helper whose source is unavailable, ``*args`` /
``**kwargs`` at a call site, recursion, and pointers hidden in containers
other than tuples are silently ignored (the kernel still compiles and runs;
only the early check is lost).  Being flow-insensitive, a variable that holds
a parameter's pointer anywhere in the function keeps that taint everywhere,
so an integer parameter may be reported after index arithmetic; the runtime
check only looks at tensor arguments, so this is harmless.  Parameters
annotated ``tl.constexpr`` are never reported.  Results are cached per
Python function (weakly), keyed on its code object; Triton does not allow
recursion, so recursive helpers are simply cut off.
"""
from __future__ import annotations

import ast
import inspect
import os
import textwrap
import weakref
from dataclasses import dataclass

from .errors import DitronError

__all__ = ["Use", "symmetric_params", "check_symmetric_args"]


@dataclass(frozen=True)
class Use:
    """One place where a parameter reaches an operand that must be symmetric.

    ``op``: the primitive (``"dl.symm_at"``, ``"shmem.putmem_signal_nbi_block"``);
    ``operand``: its parameter name (``"ptr"``, ``"dst"``, ``"sig_addr"``);
    ``file`` / ``line``: where that primitive is called (absolute line number);
    ``via``: the JIT helpers the value went through, outermost first.
    """
    op: str
    operand: str
    file: str
    line: int
    via: tuple = ()

    @property
    def loc(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def describe(self) -> str:
        """``"dl.symm_at at k.py:22"``, or ``"via helper: dl.symm_at at k.py:22"``."""
        what = f"{self.op} at {self.loc}"
        return f"via {' -> '.join(self.via)}: {what}" if self.via else what


# ---------------------------------------------------------------------------
# the builtins the analysis knows about (built lazily: importing this module
# must not import Triton's language module before ditron does)
# ---------------------------------------------------------------------------

_tables = None


_PARAMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # fn -> (its code object, names)


def _param_names(fn):
    """The names of ``fn``'s parameters that a call binds (none starting with ``_``), None without a signature;
    kept per function while its code object is the same (the analysis and the lint ask at every call site)."""
    code = getattr(fn, "__code__", None)
    try:
        hit = _PARAMS.get(fn)
    except TypeError:                # not weak-referenceable or not hashable: computed each time
        hit = None
    if hit is not None and hit[0] is code:
        return hit[1]
    try:
        sig = inspect.signature(fn)  # follows __wrapped__ of Triton builtins
    except (TypeError, ValueError):
        names = None
    else:
        names = tuple(p.name for p in sig.parameters.values()
                      if not p.name.startswith("_") and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                                  p.KEYWORD_ONLY))
    try:
        _PARAMS[fn] = (code, names)
    except TypeError:
        pass
    return names


def _known():
    """``(sinks, propagators)``: ``{id(fn): (fn, op_name, params, operands)}``."""
    global _tables
    if _tables is not None:
        return _tables
    import triton.language as tl

    from .language import core, shmem

    sinks, props = {}, {}

    def add(table, fn, op, operands):
        params = _param_names(fn)
        if params is not None:
            table[id(fn)] = (fn, op, params, tuple(o for o in operands if o in params))

    add(sinks, core.symm_at, "dl.symm_at", ("ptr",))
    add(sinks, core.notify, "dl.notify", ("ptr",))
    for name, fn in vars(shmem).items():
        if not callable(fn) or name.startswith("_"):
            continue
        if name.startswith("putmem_signal"):
            operands = ("dst", "sig_addr")
        elif name.startswith("putmem"):
            operands = ("dst",)
        elif name.startswith("getmem"):
            operands = ("src",)
        elif name in ("signal_op", "signal_wait_until"):
            operands = ("sig_addr",)
        elif name in ("remote_ptr", "remote_mc_ptr"):
            operands = ("ptr",)
        else:
            continue
        add(sinks, fn, f"shmem.{name}", operands)

    add(props, core.symm_at, "dl.symm_at", ("ptr",))
    add(props, core.consume_token, "dl.consume_token", ("value",))
    add(props, shmem.remote_ptr, "shmem.remote_ptr", ("ptr",))
    for name in ("multiple_of", "max_contiguous", "max_constancy", "expand_dims", "broadcast_to", "reshape", "view",
                 "trans", "permute", "cast"):
        fn = getattr(tl, name, None)
        if fn is not None and _param_names(fn):
            add(props, fn, f"tl.{name}", _param_names(fn)[:1])
    for name, operands in (("make_block_ptr", ("base",)), ("advance", ("base",)), ("where", ("x", "y")),
                           ("make_tensor_descriptor", ("base",))):
        fn = getattr(tl, name, None)
        if fn is not None:
            add(props, fn, f"tl.{name}", operands)
    _tables = (sinks, props)
    return _tables


#: tensor methods whose result is the receiver re-shaped / re-typed
_POINTER_METHODS = frozenset({"to", "expand_dims", "broadcast_to", "reshape", "view", "trans", "permute", "cast"})


def _jit_types():
    from triton.runtime.jit import JITFunction
    types = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        types.append(InterpretedFunction)
    except ImportError:  # pragma: no cover -- depends on the Triton version
        pass
    return tuple(types)


def _python_function(obj):
    """The plain Python function under a JITFunction / Autotuner / Heuristics."""
    for _ in range(8):
        if inspect.isfunction(obj):
            return obj
        obj = getattr(obj, "__dict__", {}).get("fn")  # instance attribute, read statically
    return None


def _bind(call: ast.Call, params):
    """``{param: argument expression}`` of ``call`` for a callee with ``params``
    (positional up to the first ``*args``; ``**kwargs`` ignored)."""
    bound = {}
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred) or i >= len(params):
            break
        bound[params[i]] = arg
    for kw in call.keywords:
        if kw.arg is not None:
            bound[kw.arg] = kw.value
    return bound


# ---------------------------------------------------------------------------
# per-function analysis
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Result:
    params: tuple      # parameter names, in order (constexprs included, for binding)
    uses: dict         # {param: tuple[Use, ...]}
    returns: frozenset  # parameters whose pointers the function may return


_EMPTY = _Result((), {}, frozenset())
_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _is_constexpr(annotation) -> bool:
    if annotation is None:
        return False
    try:
        return ast.unparse(annotation).split(".")[-1].strip("'\"") == "constexpr"
    except Exception:  # noqa: BLE001
        return False


class _Analysis:
    def __init__(self, fn, tree: ast.FunctionDef, file: str, stack):
        self.fn, self.tree, self.file, self.stack = fn, tree, file, stack
        scope = dict(fn.__globals__)
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    scope[name] = cell.cell_contents
                except ValueError:  # empty cell
                    pass
        self.scope = scope
        a = tree.args
        self.all_params = tuple(p.arg for p in a.posonlyargs + a.args + a.kwonlyargs)
        self.params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if not _is_constexpr(p.annotation)]
        self.env = {p: frozenset({p}) for p in self.params}
        self.locals = set(self.all_params)
        for node in self._walk():
            for t in self._targets(node):
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        self.locals.add(n.id)

    def _walk(self):
        for stmt in self.tree.body:
            yield from ast.walk(stmt)

    @staticmethod
    def _targets(node):
        if isinstance(node, ast.Assign):
            return node.targets
        if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr, ast.For, ast.comprehension)):
            return [node.target]
        if isinstance(node, ast.withitem) and node.optional_vars is not None:
            return [node.optional_vars]
        return []

    # -- callee resolution ------------------------------------------------
    def resolve(self, expr):
        """The object ``expr`` names, by static lookups only; None if unknown."""
        if isinstance(expr, ast.Name):
            if expr.id in self.locals:
                return None
            return self.scope.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.resolve(expr.value)
            if base is None:
                return None
            try:
                return inspect.getattr_static(base, expr.attr, None)
            except Exception:  # noqa: BLE001
                return None
        return None

    # -- taint ------------------------------------------------------------
    def taint(self, e) -> frozenset:
        if e is None:
            return frozenset()
        if isinstance(e, ast.Name):
            return self.env.get(e.id, frozenset())
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, (ast.Add, ast.Sub)):
                return self.taint(e.left) | self.taint(e.right)
            return frozenset()
        if isinstance(e, ast.UnaryOp):
            return self.taint(e.operand)
        if isinstance(e, ast.IfExp):
            return self.taint(e.body) | self.taint(e.orelse)
        if isinstance(e, (ast.Subscript, ast.Starred, ast.NamedExpr)):
            return self.taint(e.value)
        if isinstance(e, (ast.Tuple, ast.List)):
            return frozenset().union(*(self.taint(x) for x in e.elts))
        if isinstance(e, ast.Attribute) and e.attr == "T":
            return self.taint(e.value)
        if isinstance(e, ast.Call):
            return self.call_taint(e)
        return frozenset()

    def call_taint(self, call: ast.Call) -> frozenset:
        callee = self.resolve(call.func)
        if callee is None:
            if isinstance(call.func, ast.Attribute) and call.func.attr in _POINTER_METHODS:
                return self.taint(call.func.value)
            return frozenset()
        entry = _known()[1].get(id(callee))
        if entry is not None and entry[0] is callee:
            _, _, params, operands = entry
            bound = _bind(call, params)
            return frozenset().union(*(self.taint(bound.get(o)) for o in operands))
        if isinstance(callee, _jit_types()):
            res = self.callee_result(callee)
            bound = _bind(call, res.params)
            return frozenset().union(*(self.taint(bound.get(p)) for p in res.returns))
        return frozenset()

    def callee_result(self, callee) -> _Result:
        fn = _python_function(callee)
        if fn is None or fn in self.stack:
            return _EMPTY
        return _analyse(fn, self.stack)

    def assign(self, target, value_taint, value=None):
        if isinstance(target, ast.Name):
            old = self.env.get(target.id, frozenset())
            new = old | value_taint
            if new != old:
                self.env[target.id] = new
                self.changed = True
        elif isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            if (isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(elts)
                    and not any(isinstance(x, ast.Starred) for x in elts + value.elts)):
                for t, v in zip(elts, value.elts):
                    self.assign(t, self.taint(v), v)
            else:
                for t in elts:
                    self.assign(t, value_taint)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, value_taint)

    def propagate(self):
        for _ in range(100):
            self.changed = False
            for node in self._walk():
                if isinstance(node, ast.Assign):
                    t = self.taint(node.value)
                    for target in node.targets:
                        self.assign(target, t, node.value)
                elif isinstance(node, ast.AugAssign):
                    if isinstance(node.op, (ast.Add, ast.Sub)):
                        self.assign(node.target, self.taint(node.value))
                elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                    self.assign(node.target, self.taint(node.value), node.value)
                elif isinstance(node, (ast.For, ast.comprehension)):
                    self.assign(node.target, self.taint(node.iter))
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    self.assign(node.optional_vars, self.taint(node.context_expr))
            if not self.changed:
                return

    def run(self) -> _Result:
        self.propagate()
        sinks = _known()[0]
        uses = {}

        def report(params, use):
            for p in params:
                if p in self.params:
                    uses.setdefault(p, {})[use] = None

        returns = frozenset()
        for node in self._walk():
            if isinstance(node, ast.Return):
                returns |= self.taint(node.value)
            if not isinstance(node, ast.Call):
                continue
            callee = self.resolve(node.func)
            if callee is None:
                continue
            entry = sinks.get(id(callee))
            if entry is not None and entry[0] is callee:
                _, op, params, operands = entry
                bound = _bind(node, params)
                for o in operands:
                    report(self.taint(bound.get(o)), Use(op, o, self.file, node.lineno))
            elif isinstance(callee, _jit_types()):
                res = self.callee_result(callee)
                bound = _bind(node, res.params)
                name = getattr(_python_function(callee), "__name__", "?")
                for p, inner in res.uses.items():
                    arg_taint = self.taint(bound.get(p))
                    for u in inner:
                        report(arg_taint, Use(u.op, u.operand, u.file, u.line, (name,) + u.via))
        ordered = {p: tuple(sorted(uses[p], key=lambda u: (len(u.via), u.via, u.line, u.op, u.operand)))
                   for p in self.params if p in uses}
        return _Result(self.all_params, ordered, frozenset(p for p in returns if p in self.params))


_SOURCES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # code object -> (lines, start, file)


def _source_lines(fn):
    """``inspect.getsourcelines`` and the file of ``fn``, once per code object: the analysis and the lint both
    read every kernel and helper (``getsourcelines`` tokenizes the file: the costly part of a first launch)."""
    code = getattr(fn, "__code__", None)
    hit = _SOURCES.get(code) if code is not None else None
    if hit is None:
        lines, start = inspect.getsourcelines(fn)
        hit = (tuple(lines), start, inspect.getsourcefile(fn) or fn.__code__.co_filename)
        if code is not None:
            _SOURCES[code] = hit
    return hit


def function_source(fn):
    """``(fdef, file)``: ``fn``'s source parsed, line numbers as in its file.  Raises when it has no source."""
    lines, start, file = _source_lines(fn)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, max(start, 1) - 1)
    return next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), file


def _analyse(fn, stack=()) -> _Result:
    src_key = getattr(fn, "__code__", None)
    hit = _cache.get(fn)
    if hit is not None and hit[0] is src_key:
        return hit[1]
    try:
        fdef, file = function_source(fn)
        result = _Analysis(fn, fdef, file, stack + (fn,)).run()
    except Exception:  # noqa: BLE001 -- no source, odd source: report nothing, never fail a launch
        result = _EMPTY
    if not stack or fn not in stack:
        try:
            _cache[fn] = (src_key, result)
        except TypeError:  # pragma: no cover -- not weak-referenceable
            pass
    return result


def symmetric_params(jit_fn) -> dict:
    """``{parameter name: [Use, ...]}`` for every parameter of ``jit_fn`` (a
    ``@ditron.jit`` / ``@triton.jit`` kernel, an autotuned one, or a plain
    function) that flows into an operand that must be symmetric memory.
    Parameters appear in signature order; a kernel without such operands
    gives ``{}``.  Never raises."""
    fn = _python_function(jit_fn)
    if fn is None:
        return {}
    return {p: list(us) for p, us in _analyse(fn).uses.items()}


def check_symmetric_args(jit_fn, bound_args: dict, is_symmetric) -> None:
    """Raise :class:`~ditron.errors.DitronError` for the first tensor argument
    (anything with ``data_ptr``, also inside a tuple argument) that
    :func:`symmetric_params` requires to be symmetric and for which
    ``is_symmetric(tensor)`` is false.  Other arguments (ints, None, ...) are
    not checked."""
    fn = _python_function(jit_fn)
    if fn is None:
        return
    for name, uses in _analyse(fn).uses.items():
        value = bound_args.get(name)
        items = [(name, value)]
        if isinstance(value, (tuple, list)):
            items = [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        for label, v in items:
            if v is None or not hasattr(v, "data_ptr") or is_symmetric(v):
                continue
            use = uses[0]
            via = f" (via {' -> '.join(use.via)})" if use.via else ""
            err = DitronError(
                f"kernel '{fn.__name__}': argument '{label}' reaches {use.op} at {use.loc}{via} and must be "
                f"a symmetric tensor (allocate it with ditron.symm_empty / ditron.symm_zeros), but the tensor passed "
                f"is not in the symmetric heap")
            err.arg, err.use = label, use
            raise err
