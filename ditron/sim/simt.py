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
region.

Threads of a region run one after another, in thread order -- unless the
region makes a warp-collective call (a shuffle, ``ballot_sync``, a ``*_warp``
SHMEM call; directly or through the ``@jit`` helpers it calls by name, seen in
their source).  Such a region becomes a function of the thread, which
:class:`Lanes` runs in one cooperative Python thread per simulated thread (one
runs at a time, inheriting the program's launch, program id, race-finder and
task-check state): the lanes of a warp named in the mask meet at each n-th
call, as PTX's ``shfl.sync`` / ``vote.sync`` make them, so a lane reads a
higher lane's value (``shfl_down``, ``shfl_xor``, a broadcast from lane 31) and
a vote sees every lane.  A source lane the mask leaves out is refused (the GPU's
value is undefined); a lane of the mask that leaves the region or waits at
another collective is reported (a GPU hangs or computes garbage), never waited
for.  A lane that spins in a polling loop lends its turn to the other lanes of
its program (independent thread scheduling, Volta and later).  A collective the
rewrite does not see (called through an aggregate's method or a variable) runs
in the one-after-another order: a lane reads only lower lanes' values there.
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
#: warp-collective SHMEM calls: legal in a region when every lane of a warp reaches them (ditron.lowering.sim_shmem)
WARP_CALLS = {f"{op}{nbi}_warp" for op in ("putmem", "getmem", "putmem_signal") for nbi in ("", "_nbi")}
#: warp collectives: every lane of the warp (of the mask) meets the others at the call.  A region that calls one
#: (directly or through the @jit helpers it calls) runs its threads as cooperative lanes (:class:`Lanes`)
COLLECTIVES = WARP_CALLS | {"shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "ballot_sync",
                            "__shfl_sync_i32", "__shfl_up_sync_i32", "__shfl_down_sync_i32", "__shfl_xor_sync_i32",
                            "__ballot_sync"}
_LANES = "__ditron_simt_lanes__"


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

    def __init__(self, fn_node, tid_calls=frozenset(_TID)):
        self.live_in = {}
        self.tid_calls = tid_calls
        self._flow(fn_node.body, set())

    def depends(self, node, live):
        return any(_callee(c.func) in self.tid_calls for c in _calls(node)) or bool(_names(node) & live)

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
    def __init__(self, analysis, filename, first_line, pure=frozenset(), kept=frozenset(), env=None):
        self.a = analysis
        self.env = env            # the function's globals: the @jit helpers a region calls
        self.lane_regions = 0
        self.replay = []          # thread-dependent pure assignments seen so far, in order
        self.regions = 0
        self.filename = filename
        self.first_line = first_line
        self.pure = _PURE | set(pure)
        self.kept = set(kept)     # names some region assigns: each thread's value is kept for later regions
        self.saved = set()        # names a region rewritten so far assigns (and nothing rebound since)
        self.ever = set()         # names any region rewritten so far assigns

    def _refuse(self, stmt, why):
        raise DitronError(f"{self.filename}:{stmt.lineno}: the simulator cannot model this thread-dependent "
                          f"code: {why}")

    def block(self, stmts):
        out = []
        for s in stmts:
            r = self.stmt(s)
            out.extend(r if isinstance(r, list) else [r])
        return out

    def _region(self, s, live=None):
        """``s`` once per simulated thread: the replayed assignments, then the thread's own values of the names
        earlier regions assigned (still per-thread here), ``s``, then the thread's values of what ``s`` assigns
        are kept (a GPU thread keeps its registers between two branches on its id: ``old = atomic_add(..)`` in
        one, ``while ld(..) ^ old`` in the next, as in Triton-distributed's grid barrier).  A region that makes a
        warp-collective call runs its threads as cooperative lanes (:meth:`_lane_region`), any other in a loop
        over the threads, one after another."""
        self.regions += 1
        live = self.a.at(s) if live is None else live
        replayed = {n for r in self.replay for n in _targets(r)}
        restore = sorted((self.saved & set(live)) - replayed)
        assigned = sorted(_assigned(s) | (_targets(s) if isinstance(s, ast.For) else set()))
        body = [copy.deepcopy(r) for r in self.replay] + [_restore(n) for n in restore] + [s] + \
            [_save(n) for n in assigned]
        self.saved |= set(assigned)
        self.ever |= set(assigned)
        if _collective_calls(s, self.env):
            return self._lane_region(s, body)
        loop = ast.For(target=ast.Name(id="__ditron_t", ctx=ast.Store()),
                       iter=ast.Call(func=ast.Name(id=_VAR, ctx=ast.Load()), args=[], keywords=[]),
                       body=body, orelse=[])
        return ast.copy_location(loop, s)

    def _lane_region(self, s, body):
        """The region as a function of the thread (``def __ditron_lane_k(__ditron_t, __ditron_in)``) that
        :func:`lanes` runs in one cooperative Python thread per simulated thread, so that the lanes of a warp
        meet at each warp-collective call as on a GPU.  Each lane starts from the values the names it binds have
        before the region (``__ditron_in``) and keeps its own; afterwards the names hold the last thread's
        values, as after the loop of the other regions."""
        bad = _escapes(s)
        if bad is not None:
            self._refuse(bad, f"`{ast.unparse(bad).strip()}` leaves a branch or loop on dl.tid()/dl.laneid() "
                              "that makes a warp-collective call (the simulator runs such a branch as a function "
                              "of the thread, one per lane); restructure it so that every lane reaches the "
                              "branch's end")
        self.lane_regions += 1
        bound = sorted(n for n in _stored(body) if not n.startswith("__ditron"))
        name = f"__ditron_lane_{self.regions}"
        init = [_from_dict("__ditron_in", n) for n in bound]
        out = [_assign("__ditron_out", ast.Dict(keys=[], values=[]))] + [_to_dict("__ditron_out", n) for n in bound] + \
            [ast.Return(value=ast.Name(id="__ditron_out", ctx=ast.Load()))]
        args = ast.arguments(posonlyargs=[], args=[ast.arg(arg="__ditron_t"), ast.arg(arg="__ditron_in")],
                             kwonlyargs=[], kw_defaults=[], defaults=[])
        fdef = ast.FunctionDef(name=name, args=args, body=init + body + out, decorator_list=[], returns=None)
        if "type_params" in ast.FunctionDef._fields:
            fdef.type_params = []
        call = ast.Call(func=ast.Name(id=_LANES, ctx=ast.Load()),
                        args=[ast.Name(id=name, ctx=ast.Load()), ast.Name(id="__ditron_in", ctx=ast.Load())],
                        keywords=[])
        stmts = [fdef, _assign("__ditron_in", ast.Dict(keys=[], values=[]))] + \
            [_to_dict("__ditron_in", n) for n in bound] + [_assign("__ditron_out", call)] + \
            [_from_dict("__ditron_out", n) for n in bound]
        return [ast.copy_location(x, s) for x in stmts]

    def _forget(self, s):
        """After a statement outside regions that rebinds names regions keep: the kept values are stale."""
        names = sorted(_targets(s) & self.kept) if not isinstance(s, ast.For) else sorted(_assigned(s) & self.kept)
        if not names:
            return s
        call = ast.Expr(ast.Call(func=ast.Name(id=_FORGET, ctx=ast.Load()),
                                 args=[ast.Name(id=_KEPT, ctx=ast.Load()),
                                       ast.Tuple(elts=[ast.Constant(n) for n in names], ctx=ast.Load())],
                                 keywords=[]))
        return [s, ast.copy_location(call, s)]

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
                r = self._region(ast.copy_location(w, s), live=self.a.at(p[0]))
                out.extend(r if isinstance(r, list) else [r])
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
            impure = [_callee(c.func) for c in _calls(s.value) if _callee(c.func) not in self.pure]
            if impure or (_names(s.value) & self.saved):
                # a call that may touch memory (a helper building an aggregate from a per-thread value:
                # Triton-distributed's `Profiler.create(..., is_leader=(tid(0) == 0))`), or a value of names
                # regions keep per thread: every GPU thread runs the statement with its own values, so it is a
                # region (run once per thread, each thread's result kept), not replayed before later regions
                return self._region(s)
            if isinstance(s, ast.AugAssign):
                self._refuse(s, f"`{ast.unparse(s).strip()}` updates a variable with a per-thread value outside a "
                                "branch on dl.tid()/dl.laneid(); the simulator replays thread-dependent assignments "
                                "per thread, which an update cannot be: assign it (`x = x0 + tid`) or move it into "
                                "the branch")
            self.replay.append(s)
            self.saved -= _targets(s)        # replayed from now on
            return self._forget(s)
        if isinstance(s, ast.Expr) and depends(s.value):
            return self._region(s)
        if isinstance(s, (ast.If, ast.While, ast.For, ast.With)):
            s.body = self.block(s.body)
            if getattr(s, "orelse", None):
                s.orelse = self.block(s.orelse)
        if isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For)):
            self.saved -= _targets(s)        # rebound to a uniform value
            return self._forget(s)
        return s


_KEPT = "__ditron_simt_kept"
_FORGET = "__ditron_simt_forget__"


def _assign(name, value):
    return ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value)


def _from_dict(d, name):
    """``if 'name' in d: name = d['name']``"""
    test = ast.Compare(left=ast.Constant(name), ops=[ast.In()], comparators=[ast.Name(id=d, ctx=ast.Load())])
    get = ast.Subscript(value=ast.Name(id=d, ctx=ast.Load()), slice=ast.Constant(name), ctx=ast.Load())
    return ast.If(test=test, body=[_assign(name, get)], orelse=[])


def _to_dict(d, name):
    """``try: d['name'] = name`` / ``except NameError: pass`` (not bound here)."""
    store = ast.Assign(targets=[ast.Subscript(value=ast.Name(id=d, ctx=ast.Load()), slice=ast.Constant(name),
                                              ctx=ast.Store())], value=ast.Name(id=name, ctx=ast.Load()))
    return ast.Try(body=[store], handlers=[ast.ExceptHandler(type=ast.Name(id="NameError", ctx=ast.Load()),
                                                             name=None, body=[ast.Pass()])],
                   orelse=[], finalbody=[])


def _stored(stmts):
    return {n.id for st in stmts for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _escapes(s):
    """A ``return`` in ``s``, or a ``break`` / ``continue`` of a loop around ``s``: what a function of the thread
    cannot do (None if there is none)."""
    def esc(node, in_loop):
        if isinstance(node, ast.Return):
            return node
        if isinstance(node, (ast.Break, ast.Continue)):
            return None if in_loop else node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
        if isinstance(node, (ast.For, ast.While)):
            parts = [(st, True) for st in node.body] + [(st, in_loop) for st in node.orelse]
        else:
            parts = [(child, in_loop) for child in ast.iter_child_nodes(node)]
        for child, inside in parts:
            found = esc(child, inside)
            if found is not None:
                return found
        return None
    return esc(s, False)


# ---------------------------------------------------------------------------
# which regions make warp-collective calls (statically: the region's calls and the @jit helpers they reach)
# ---------------------------------------------------------------------------

_COLLECTIVE_HELPERS: dict = {}     # code object -> whether the helper (or one it calls) makes a warp collective


def _collective_calls(node, env):
    """Whether ``node`` calls a warp collective, directly or through the ``@jit`` helpers it calls (found in
    ``env``, the calling function's globals)."""
    for c in _calls(node):
        if _callee(c.func) in COLLECTIVES:
            return True
    if not env:
        return False
    for c in _calls(node):
        py = _jit_python_fn(_resolve(c.func, env))
        if py is not None and _helper_collective(py):
            return True
    return False


def _helper_collective(py):
    import inspect
    import textwrap
    code = py.__code__
    hit = _COLLECTIVE_HELPERS.get(code)
    if hit is not None:
        return hit
    _COLLECTIVE_HELPERS[code] = False            # recursion: not known to make one (yet)
    found = False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(py)))
        node = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
        found = node is not None and _collective_calls(node, py.__globals__)
    except (OSError, TypeError, SyntaxError):
        pass
    _COLLECTIVE_HELPERS[code] = found
    return found


def _kept_key(name):
    return ast.Tuple(elts=[ast.Name(id="__ditron_t", ctx=ast.Load()), ast.Constant(name)], ctx=ast.Load())


def _restore(name):
    """``if (t, name) in kept: name = kept[(t, name)]``"""
    test = ast.Compare(left=_kept_key(name), ops=[ast.In()], comparators=[ast.Name(id=_KEPT, ctx=ast.Load())])
    get = ast.Subscript(value=ast.Name(id=_KEPT, ctx=ast.Load()), slice=_kept_key(name), ctx=ast.Load())
    return ast.If(test=test, body=[ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=get)], orelse=[])


def _save(name):
    """``try: kept[(t, name)] = name`` / ``except NameError: pass`` (not bound in this thread's path)."""
    store = ast.Assign(targets=[ast.Subscript(value=ast.Name(id=_KEPT, ctx=ast.Load()), slice=_kept_key(name),
                                              ctx=ast.Store())], value=ast.Name(id=name, ctx=ast.Load()))
    return ast.Try(body=[store], handlers=[ast.ExceptHandler(type=ast.Name(id="NameError", ctx=ast.Load()),
                                                             name=None, body=[ast.Pass()])],
                   orelse=[], finalbody=[])


def forget(kept, names):
    for k in [k for k in kept if k[1] in names]:
        del kept[k]


# ---------------------------------------------------------------------------
# helpers whose result depends on the thread (``_is_cta_master()``: ``tid(0) + tid(1) + tid(2) == 0``)
# ---------------------------------------------------------------------------

_HELPERS: dict = {}           # code object -> (returns a per-thread value, pure)
_IN_PROGRESS = object()


def _resolve(func, env):
    """The object a call's callee names in ``env`` (a function's globals): ``f`` or ``mod.f``."""
    if isinstance(func, ast.Name):
        return env.get(func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        base = env.get(func.value.id)
        return getattr(base, func.attr, None) if base is not None else None
    return None


def _jit_python_fn(obj):
    import types
    from triton.runtime.jit import KernelInterface
    fn = getattr(obj, "fn", None)
    if isinstance(obj, KernelInterface) and isinstance(fn, types.FunctionType):
        return fn
    return None


def _thread_helpers(fn_node, env):
    """Names of the functions ``fn_node`` calls that are ``@jit`` helpers returning a per-thread value, and the
    pure ones among them (no memory access: they may be replayed)."""
    tid_names, pure = set(), set()
    if not env:
        return tid_names, pure
    for c in _calls(fn_node):
        name = _callee(c.func)
        if name in _TID or name in tid_names:
            continue
        py = _jit_python_fn(_resolve(c.func, env))
        if py is None:
            continue
        dep, is_pure = _helper_info(py)
        if dep:
            tid_names.add(name)
            if is_pure:
                pure.add(name)
    return tid_names, pure


def _helper_info(py):
    import inspect
    import textwrap
    code = py.__code__
    hit = _HELPERS.get(code)
    if hit is _IN_PROGRESS:
        return False, False                  # recursion: not known to depend on the thread
    if hit is not None:
        return hit
    _HELPERS[code] = _IN_PROGRESS
    info = (False, False)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(py)))
        node = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
        if node is not None:
            more, more_pure = _thread_helpers(node, py.__globals__)
            a = _Analysis(node, frozenset(_TID | more))
            callees = {_callee(c.func) for c in _calls(node)}
            info = (_returns_per_thread(a, node.body, False), callees <= (_PURE | more_pure))
    except (OSError, TypeError, SyntaxError):
        pass
    _HELPERS[code] = info
    return info


def _returns_per_thread(a, stmts, under):
    for s in stmts:
        if isinstance(s, ast.Return):
            if s.value is not None and (under or a.depends(s.value, a.at(s))):
                return True
        elif isinstance(s, (ast.If, ast.While)):
            d = under or a.depends(s.test, a.at(s))
            if _returns_per_thread(a, s.body, d) or _returns_per_thread(a, s.orelse, d):
                return True
        elif isinstance(s, ast.For):
            d = under or a.depends(s.iter, a.at(s))
            if _returns_per_thread(a, s.body, d) or _returns_per_thread(a, s.orelse, d):
                return True
        elif isinstance(s, ast.With):
            if _returns_per_thread(a, s.body, under or _simt_with(s)):
                return True
    return False


def transform(tree, filename="?", first_line=0, env=None):
    """Rewrite the function in ``tree`` (a Module) in place; True if it has thread-dependent regions.  ``env``:
    the function's globals, where the ``@jit`` helpers it calls are found (a helper whose result depends on the
    thread makes a condition on it thread-dependent)."""
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
    if fn is None:
        return False
    src_calls = {_callee(c.func) for c in _calls(fn)}
    helpers, pure = _thread_helpers(fn, env)
    tid_calls = frozenset(_TID | helpers)
    if not (src_calls & (tid_calls | {_REGION})):
        return False
    shadow = copy.deepcopy(fn)        # a dry run: which names regions assign (in loops: also before them)
    dry = _Rewriter(_Analysis(shadow, tid_calls), filename, first_line, pure, env=env)
    dry.block(shadow.body)
    rw = _Rewriter(_Analysis(fn, tid_calls), filename, first_line, pure, kept=dry.ever, env=env)
    fn.body = rw.block(fn.body)
    if rw.ever or rw.kept:
        init = ast.Assign(targets=[ast.Name(id=_KEPT, ctx=ast.Store())], value=ast.Dict(keys=[], values=[]))
        fn.body.insert(0, ast.copy_location(init, fn.body[0]))
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
    calls = {}
    _compat.set_simt_warp_calls(calls)
    try:
        for t in range(num_threads()):
            _compat.set_simt_thread(t)
            yield t
        _compat.set_simt_thread(None)
        _check_warps(calls)
    finally:
        _compat.set_simt_thread(None)
        _compat.set_simt_warp_calls(None)


# ---------------------------------------------------------------------------
# regions with warp collectives: the threads run as cooperative lanes
# ---------------------------------------------------------------------------

_READY, _WAIT, _DONE = "ready", "waiting", "done"


class _Abort(BaseException):
    """Ends a parked lane when its region failed (a BaseException: Triton's interpreter wraps Exceptions)."""


class _LaneLaunch:
    """The launch as the lanes of one region see it: a lane's polling loop that spins counts as blocked for the
    watchdog (``SimTransport.poll`` calls :meth:`blocked`) only when every lane that can run spins, so the
    program counts as blocked once, not once per lane, and not while one of its lanes still runs."""

    def __init__(self, launch, lanes):
        self._launch = launch
        self._lanes = lanes

    def __getattr__(self, name):
        return getattr(self._launch, name)

    def blocked(self, delta):
        self._lanes.spinning += delta
        self._lanes.recount()


class Lanes:
    """The simulated threads of one execution of a thread-dependent region that makes warp-collective calls, run
    as cooperative Python threads: exactly one lane runs at a time (the program's thread schedules them, lowest
    thread first, round robin); a lane runs until it reaches a warp collective, spins in a polling loop
    (:meth:`spin`: a lane waiting for a flag that another lane of its program sets lends it its turn, as
    independent thread scheduling lets it on Volta and later GPUs) or leaves the region.  At a collective
    (:meth:`meet`) a lane waits until every lane of its warp named in the mask made its n-th call of that call
    site; the last one to arrive computes every lane's result, and the lanes go on.  When no lane can run but some
    wait at a collective, lanes of the mask left the region or wait at another collective: a GPU hangs or
    computes an undefined value, and the region fails with a report naming the lanes."""

    def __init__(self, n, launch):
        self.n = n
        self.state = [_READY] * n
        self.go = [threading.Lock() for _ in range(n)]
        for g in self.go:
            g.acquire()
        self.back = threading.Lock()
        self.back.acquire()
        self.counts = {}          # (site, thread) -> how many times the thread made the call
        self.groups = {}          # (site, warp, nth) -> the lanes' arrivals at the warp's nth call
        self.error = None
        self.abort = False
        self.out = {}
        self.launch = launch
        self.view = _LaneLaunch(launch, self) if launch is not None else None
        self.spinning = 0         # lanes counted as blocked in a polling loop (SimTransport.poll)
        self.blocked = False      # the program counts as blocked (every runnable lane spins)

    # -- lanes' side ------------------------------------------------------------------------------------------
    def _park(self, t):
        self.back.release()
        self.go[t].acquire()
        if self.abort:
            raise _Abort()

    def spin(self, t):
        """Lane ``t`` read the same value again in a polling loop: the other lanes run first."""
        self._park(t)

    def meet(self, t, site, primitive, mask, payload, resolve):
        """Lane ``t``'s arrival at a warp collective ``primitive`` (at ``site``, for messages): ``payload`` is its
        part; returns its result once every lane of its warp named in ``mask`` made its n-th call of
        ``primitive`` with that mask.  As PTX's ``shfl.sync`` / ``vote.sync`` (sm_70 and later), the lanes meet
        at the same kind of call with the same mask, not necessarily at the same call site, and lanes with other
        masks (two half-warps) meet apart.  The last lane to arrive calls ``resolve(parts, me)`` (``parts``:
        lane -> payload), which gives every lane's result (a dict lane -> result)."""
        warp, me = divmod(t, 32)
        nth = self.counts.get((t, primitive, mask), 0)
        self.counts[(t, primitive, mask)] = nth + 1
        key = (warp, primitive, mask, nth)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = {"primitive": primitive, "site": site, "need": [i for i in range(32) if mask >> i & 1],
                                    "parts": {}, "out": None}
        g["parts"][me] = payload
        if len(g["parts"]) == len(g["need"]):
            del self.groups[key]
            g["out"] = resolve(g["parts"], me)
            for i in g["parts"]:
                if i != me:
                    self.state[warp * 32 + i] = _READY
            self.recount()
            return g["out"][me]
        self.state[t] = _WAIT
        self._end_poll()
        self.recount()
        self._park(t)
        return g["out"][me]

    def _end_poll(self):
        from .access import end_poll
        end_poll()

    def recount(self):
        """The program counts as blocked while every lane that can run spins in a polling loop."""
        if self.launch is None:
            return
        runnable = self.state.count(_READY)
        want = runnable > 0 and self.spinning >= runnable
        if want != self.blocked:
            self.blocked = want
            self.launch.blocked(+1 if want else -1)

    def _lane(self, t, body, env, inherit):
        for local, values in inherit:
            local.__dict__.update(values)
        from .events import _CURRENT
        _CURRENT.launch = self.view
        _compat.set_simt_thread(t)
        _compat.set_simt_lanes(self)
        _compat.set_simt_warp_calls(None)
        self.go[t].acquire()
        try:
            if not self.abort:
                out = body(t, env)
                if t == self.n - 1:
                    self.out = out
        except _Abort:
            pass
        except BaseException as e:  # noqa: BLE001 -- the region's error, raised by the program's thread
            if self.error is None:
                self.error = e
        finally:
            try:
                self._end_poll()
            finally:
                self.state[t] = _DONE
                self.recount()
                self.back.release()

    # -- the program's side --------------------------------------------------------------------------------------
    def run(self, body, env):
        inherit = _inherited()
        workers = [threading.Thread(target=self._lane, args=(t, body, env, inherit), daemon=True,
                                    name=f"{threading.current_thread().name}.lane{t}") for t in range(self.n)]
        for w in workers:
            w.start()
        t = 0
        try:
            while self.error is None:
                nxt = next((i % self.n for i in range(t, t + self.n) if self.state[i % self.n] == _READY), None)
                if nxt is None:
                    if _WAIT in self.state:
                        self.error = self._stuck()
                    break
                self.go[nxt].release()
                self.back.acquire()
                t = nxt + 1
        finally:
            self.abort = True
            for i in range(self.n):
                if self.state[i] != _DONE:
                    self.go[i].release()
                    self.back.acquire()
            for w in workers:
                w.join()
            if self.blocked and self.launch is not None:
                self.blocked = False
                self.launch.blocked(-1)
        if self.error is not None:
            raise self.error
        return self.out

    def _stuck(self):
        (warp, _, mask, nth), g = min(self.groups.items(), key=lambda kv: (kv[0][0], kv[0][3], kv[1]["site"]))
        arrived = sorted(g["parts"])
        missing = [i for i in g["need"] if i not in g["parts"]]
        left = [i for i in missing if self.state[warp * 32 + i] == _DONE]
        elsewhere = {}
        for (w2, _, m2, n2), g2 in self.groups.items():
            if w2 == warp and g2 is not g:
                for i in g2["parts"]:
                    if i in missing:
                        call = f" (call {n2 + 1})" if n2 else ""
                        elsewhere.setdefault(f"{g2['primitive']} at {g2['site']}{call} with mask {m2:#010x}",
                                             []).append(i)
        why = []
        if left:
            why.append(f"lanes {_spans(left)} left the region without making it")
        for where_, ls in elsewhere.items():
            why.append(f"lanes {_spans(sorted(ls))} wait at {where_}")
        mask_note = "" if mask == 0xFFFFFFFF else f" (mask {mask:#010x})"
        return DitronError(
            f"{g['site']}: {g['primitive']} is warp-collective, but in warp {warp} only lanes {_spans(arrived)} "
            f"reached it{' (call ' + str(nth + 1) + ')' if nth else ''}{mask_note}, lanes {_spans(missing)} did not"
            f"{' (' + '; '.join(why) + ')' if why else ''}: every lane of the warp named in the mask must make the "
            "call (with the same arguments, for a SHMEM call); on a GPU the warp hangs or the result is undefined. "
            "Make the branch the same for all lanes of a warp (a condition on `dl.tid() // 32`), or pass a mask that "
            "names only the lanes that make the call")


def _inherited():
    """The program thread's per-thread state that its lanes run with: its launch and program (events), its
    program id (Triton's interpreter), its race-finder clock (shared: the lanes of a program are one program for
    the race finder, as when they run one after another) and its task-check state."""
    from .. import _compat_interp
    from . import events, race, taskcheck
    return [(local, dict(local.__dict__)) for local in (events._CURRENT, _compat_interp._GRID_TLS, race._T,
                                                         taskcheck._T)]


def lanes(body, env):
    """A region with warp collectives (``__ditron_simt_lanes__(lane_fn, values)``): ``body(t, env)`` in every
    simulated thread ``t``, as cooperative lanes (:class:`Lanes`); returns the last thread's values.  A nested
    region runs in its thread."""
    cur = _compat.simt_thread()
    if cur is not None:
        return body(cur, env)
    from ..lowering.sim_base import access
    access().end_poll()
    from .events import current_launch
    return Lanes(num_threads(), current_launch()).run(body, env)


def _check_warps(calls):
    """After every thread ran the region: a warp-collective call that some lanes of a warp reached and others
    did not (a divergent warp; see ``ditron.lowering.sim_shmem``) is refused."""
    for (site, warp, nth), entry in calls.items():
        need = entry.get("need", range(WARP)) if isinstance(entry, dict) else ()
        if not isinstance(warp, int) or len(entry["lanes"]) == len(need):
            continue
        lanes = sorted(t - warp * WARP for t in entry["lanes"])
        missing = sorted(set(need) - set(lanes))
        raise DitronError(
            f"{site}: {entry['primitive']} is warp-collective, but in warp {warp} only lanes {_spans(lanes)} "
            f"reached it{' (call ' + str(nth + 1) + ')' if nth else ''}, lanes {_spans(missing)} did not: "
            "every lane of the warp (of the mask, for a shuffle) must make the call with the same arguments (on a "
            "GPU the warp hangs or the result is undefined); make the branch the same for all lanes of a warp (a "
            "condition on `dl.tid() // 32`), or use the thread variant")


def _spans(lanes):
    out, i = [], 0
    while i < len(lanes):
        j = i
        while j + 1 < len(lanes) and lanes[j + 1] == lanes[j] + 1:
            j += 1
        out.append(str(lanes[i]) if i == j else f"{lanes[i]}-{lanes[j]}")
        i = j + 1
    return ", ".join(out)


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
        if transform(tree, getattr(self, "filename", "?"), getattr(self, "def_file_lineno", 0),
                     getattr(self.fn, "__globals__", None)):
            self.fn.__globals__[_VAR] = threads
            self.fn.__globals__[_LANES] = lanes
            self.fn.__globals__[_FORGET] = forget
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
