"""Per-thread semantics on the simulator: thread-dependent regions.

A simulated program executes whole tiles, as Triton's code does; but a GPU
program is ``num_warps * 32`` threads, and code that branches on
``dl.tid()``/``dl.laneid()`` -- Triton-distributed's "thread ``i`` signals /
waits for peer ``i``" -- does something different in each thread.  Before a
kernel (or a ``@triton.jit`` helper) runs on the interpreter, its AST is
rewritten: every ``if``/``while`` whose condition and every ``for`` whose
range depends on ``tid``/``laneid`` (directly or through variables computed
from them), and every statement that calls something with such a value,
becomes a *thread-dependent region*, executed once per simulated thread
(thread ``t`` sees ``dl.tid() == t``) after replaying the thread-dependent
assignments before it (``thread_idx = dl.tid(0)``).

Inside a region, as on a GPU: ``dl.ld``/``dl.st``/``dl.atomic_*`` act in
every thread that reaches them; a scalar ``tl.store`` is performed by
thread 0 only (Triton predicates scalar stores to thread 0).  Refused with a
message: primitives with a CTA barrier (``dl.wait``, ``dl.notify``,
``dl.syncthreads``, ...: divergent barriers hang GPUs), ``tl.atomic_*``
(Triton broadcasts a scalar atomic's result through shared memory behind a
barrier), tile stores (which elements a thread stores depends on the
layout), and thread-dependent values computed by memory operations outside a
region.  Threads of a region run one after another, in thread order.
"""
from __future__ import annotations

import ast
import copy
import threading

from .. import _compat
from ..errors import DitronError
from ..lowering import provided

_TID = {"tid", "laneid"}
# calls a replayed (thread-dependent, outside any region) assignment may contain: no memory access, no side effect
_PURE = {"tid", "laneid", "num_threads", "num_warps", "program_id", "num_programs", "rank", "num_ranks", "symm_at",
         "cdiv", "minimum", "maximum", "min", "max", "where", "to", "cast", "full", "arange", "multiple_of",
         "max_contiguous", "abs", "int", "float", "remote_ptr", "my_pe", "n_pes", "to_tensor"}
_VAR = "__ditron_simt_threads__"
_REGION = "simt_exec_region"
_BARRIERS = {"syncthreads", "__syncthreads"}
WARP = 32


def _callee(func):
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _calls(node):
    return [c for c in ast.walk(node) if isinstance(c, ast.Call)]


def _targets(stmt):
    if isinstance(stmt, ast.Assign):
        tg = stmt.targets
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        tg = [stmt.target]
    elif isinstance(stmt, ast.For):
        tg = [stmt.target]
    else:
        return set()
    return {n.id for t in tg for n in ast.walk(t) if isinstance(n, ast.Name)}


def _simt_with(stmt):
    """``with dl.simt_exec_region() as (thread_idx, block_size):`` (Triton-distributed's SIMT region)."""
    return isinstance(stmt, ast.With) and len(stmt.items) == 1 and \
        isinstance(stmt.items[0].context_expr, ast.Call) and _callee(stmt.items[0].context_expr.func) == _REGION


def _is_barrier(stmt):
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _callee(stmt.value.func) in _BARRIERS


def _assigned(node):
    """Names bound anywhere inside a compound statement."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For)):
            out |= _targets(n)
    return out


class _Analysis:
    """Which names hold per-thread values before each statement (flow-sensitive: a name rebound to a uniform
    value is uniform again, e.g. a loop variable reused after a thread-strided loop; loops iterate to a fixpoint,
    so a value that becomes per-thread later in a loop body is per-thread at the body's start too)."""

    def __init__(self, fn_node):
        self.live_in = {}
        self._flow(fn_node.body, set())

    def depends(self, node, live):
        return any(_callee(c.func) in _TID for c in _calls(node)) or bool(_names(node) & live)

    def at(self, stmt):
        return self.live_in.get(id(stmt), frozenset())

    def _loop(self, body, live, entry):
        """Fixpoint of a loop body: ``entry(live)`` gives the names live at the body's start."""
        cur = set(live)
        while True:
            out = self._flow(body, entry(cur))
            new = cur | out
            if new == cur:
                return cur
            cur = new

    def _flow(self, stmts, live):
        for s in stmts:
            self.live_in[id(s)] = frozenset(self.live_in.get(id(s), frozenset()) | live)
            if isinstance(s, ast.If):
                dep = self.depends(s.test, live)
                live = self._flow(s.body, set(live)) | self._flow(s.orelse, set(live))
                if dep:
                    live |= _assigned(s)           # set under a per-thread branch: per-thread afterwards
            elif isinstance(s, ast.While):
                dep = self.depends(s.test, live)
                live = self._loop(s.body, live, lambda c: set(c))
                if dep:
                    live |= _assigned(s)
            elif isinstance(s, ast.For):
                dep = self.depends(s.iter, live)
                tg = _targets(s)
                live = self._loop(s.body, live, lambda c: (c | tg) if dep else (c - tg))
                live = (live | _assigned(s)) if dep else live
            elif _simt_with(s):
                # every thread runs the body: its targets and what it assigns are per-thread
                inner = set(live) | {n.id for n in ast.walk(s.items[0].optional_vars or ast.Tuple(elts=[]))
                                     if isinstance(n, ast.Name)}
                live = self._flow(s.body, inner) | inner | _assigned(s)
            elif isinstance(s, ast.With):
                live = self._flow(s.body, live)
            elif isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and s.value is not None:
                tg = _targets(s)
                if self.depends(s.value, live):
                    live = live | tg
                elif not isinstance(s, ast.AugAssign):
                    live = live - tg               # rebound to a uniform value
        return live


class _Rewriter:
    def __init__(self, analysis, filename, first_line):
        self.a = analysis
        self.replay = []          # thread-dependent pure assignments seen so far, in order
        self.regions = 0
        self.filename = filename
        self.first_line = first_line

    def _refuse(self, stmt, why):
        raise DitronError(f"{self.filename}:{stmt.lineno}: the simulator cannot model this thread-dependent "
                          f"code: {why}")

    def block(self, stmts):
        out = []
        for s in stmts:
            r = self.stmt(s)
            out.extend(r if isinstance(r, list) else [r])
        return out

    def _region(self, s):
        self.regions += 1
        body = [copy.deepcopy(r) for r in self.replay] + [s]
        loop = ast.For(target=ast.Name(id="__ditron_t", ctx=ast.Store()),
                       iter=ast.Call(func=ast.Name(id=_VAR, ctx=ast.Load()), args=[], keywords=[]),
                       body=body, orelse=[])
        return ast.copy_location(loop, s)

    def _simt_region(self, s):
        """A SIMT region: the body runs in every thread; a top-level ``syncthreads`` (reached by all threads)
        splits it, so every thread finishes the code before the barrier before any thread runs the code after
        it.  Each part is a thread-dependent region that enters the ``with`` again (the thread's own
        ``thread_idx``); the barriers stay between them, outside any region."""
        parts, cur = [], []
        for st in s.body:
            if _is_barrier(st):
                parts.append(cur)
                parts.append(st)
                cur = []
            else:
                cur.append(st)
        parts.append(cur)
        out = []
        for p in parts:
            if isinstance(p, ast.stmt):
                out.append(p)
            elif p:
                w = ast.With(items=[copy.deepcopy(s.items[0])], body=p)
                out.append(self._region(ast.copy_location(w, s)))
        return out

    def stmt(self, s):
        live = self.a.at(s)
        if _simt_with(s):
            return self._simt_region(s)

        def depends(node):
            return self.a.depends(node, live)
        if isinstance(s, (ast.If, ast.While)) and depends(s.test):
            return self._region(s)
        if isinstance(s, ast.For) and depends(s.iter):
            return self._region(s)
        if isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and s.value is not None and depends(s.value):
            impure = [_callee(c.func) for c in _calls(s.value) if _callee(c.func) not in _PURE]
            if impure:
                self._refuse(s, f"`{ast.unparse(s).strip()}` gives each GPU thread its own value from "
                                f"{impure[0]}() outside a branch on dl.tid()/dl.laneid(); compute it inside the "
                                "branch (`if thread_idx < n: ...`) where the simulator runs each thread")
            if isinstance(s, ast.AugAssign):
                self._refuse(s, f"`{ast.unparse(s).strip()}` updates a variable with a per-thread value outside a "
                                "branch on dl.tid()/dl.laneid(); the simulator replays thread-dependent assignments "
                                "per thread, which an update cannot be: assign it (`x = x0 + tid`) or move it into "
                                "the branch")
            self.replay.append(s)
            return s
        if isinstance(s, ast.Expr) and depends(s.value):
            return self._region(s)
        if isinstance(s, (ast.If, ast.While, ast.For, ast.With)):
            s.body = self.block(s.body)
            if getattr(s, "orelse", None):
                s.orelse = self.block(s.orelse)
        return s


def transform(tree, filename="?", first_line=0):
    """Rewrite the function in ``tree`` (a Module) in place; True if it has thread-dependent regions."""
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
    if fn is None:
        return False
    src_calls = {_callee(c.func) for c in _calls(fn)}
    if not (src_calls & (_TID | {_REGION})):
        return False
    rw = _Rewriter(_Analysis(fn), filename, first_line)
    fn.body = rw.block(fn.body)
    ast.fix_missing_locations(tree)
    return rw.regions > 0


# ---------------------------------------------------------------------------
# run time
# ---------------------------------------------------------------------------

def num_threads():
    launch = provided("launch")
    return int(getattr(launch, "num_warps", 4) or 4) * WARP


def threads():
    """The loop of a thread-dependent region: yields each simulated thread
    id, with ``dl.tid()`` answering it (a nested region runs in its thread)."""
    cur = _compat.simt_thread()
    if cur is not None:
        yield cur
        return
    try:
        for t in range(num_threads()):
            _compat.set_simt_thread(t)
            yield t
    finally:
        _compat.set_simt_thread(None)


_INSTALLED = False
_REWRITE_LOCK = threading.RLock()


def install():
    """Apply :func:`transform` to every function Triton's interpreter rewrites (kernels and helpers)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from triton.runtime import interpreter as interp
    FR = interp.FunctionRewriter
    orig = FR._transform_ast

    def _transform_ast(self, src, _orig=orig):
        tree = _orig(self, src)
        if transform(tree, getattr(self, "filename", "?"), getattr(self, "def_file_lineno", 0)):
            self.fn.__globals__[_VAR] = threads
        return tree

    FR._transform_ast = _transform_ast

    # The programs of a launch are threads, and each first call of a kernel or helper rewrites its source
    # (ast.parse, the transforms, compile of the tree).  CPython 3.11 keeps the AST converters' recursion depth
    # per interpreter, not per thread: two threads converting at once fail with "SystemError: AST constructor
    # recursion depth mismatch" (seen on 3.11.7).  One rewrite at a time (once per function: Triton caches it).
    orig_rewrite = FR.rewrite_ast

    def rewrite_ast(self, _orig=orig_rewrite):
        with _REWRITE_LOCK:
            return _orig(self)

    FR.rewrite_ast = rewrite_ast
    _INSTALLED = True
