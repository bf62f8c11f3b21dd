"""Compile-time lint of a kernel's synchronisation: the races the memory
model allows but tests rarely show.

Run by :func:`ditron.compile` (``ditron compile``) and by ``@ditron.jit`` at
its first compilation of a kernel; each finding is a
:class:`~ditron.errors.DitronLintWarning` (a Python warning), and with
``DITRON_STRICT=1`` the first finding is a :class:`~ditron.errors.DitronCompileError`.

Findings
--------
``relaxed-signal``
    A *signal* without release semantics -- ``dl.st`` relaxed / volatile,
    ``dl.atomic_add`` / ``atomic_cas`` / ``tl.atomic_*`` relaxed or acquire,
    ``shmem.signal_op`` -- after stores (``tl.store``, ``dl.st``,
    ``shmem.putmem*``, ``dl.multimem_st``) with no release in between
    (``dl.notify``, ``shmem.putmem_signal*``, a release / acq_rel / sc
    ``dl.fence``, a release or acq_rel ``dl.st`` / atomic, ``shmem.quiet`` /
    ``fence`` / ``barrier_all`` / ``sync_all``).  A reader that acquires the
    signal may not see the data.  Only signals another agent can observe
    count: through ``dl.symm_at`` / ``shmem.remote_ptr``, ``shmem.signal_op``,
    or a word this kernel also waits on.
``gpu-scope-wait``
    ``dl.wait(..., scope="gpu")`` or a ``dl.ld`` with scope ``cta`` / ``gpu`` on
    a buffer that a peer writes: the target of a ``dl.notify`` to another
    GPU, of a store through ``dl.symm_at``, or of a ``shmem`` signal.  GPU
    scope does not order the peer's writes: use ``scope="sys"``.
``load-without-token``
    After a ``dl.wait``, a load from a buffer that peers write (stores or
    puts through ``symm_at`` / ``shmem``) or read through ``dl.symm_at``,
    whose pointer does not go through ``dl.consume_token``: the compiler may
    move the load above the wait.

How it works.  The kernel's Python source is walked in program order (both
branches of an ``if``, loop bodies once), ``@triton.jit`` helpers inlined at
their call sites, with the taint machinery of :mod:`ditron.analysis` saying
which kernel parameters a pointer derives from and whether it went through
``symm_at`` or ``consume_token``.  Attribute values (scope, semantic,
comm_scope) come from the distributed IR of the compilation, which records
every op with its resolved attributes and source line; without IR (or for an
op it lacks) literal arguments and the primitives' defaults are used.  Like
the analysis it builds on, the lint is syntactic and errs towards silence:
calls it cannot resolve are ignored.
"""
from __future__ import annotations

import ast
import os
import warnings
import weakref
from dataclasses import dataclass, field

from . import analysis as A
from .errors import DitronCompileError, DitronLintWarning

REMOTE = "@remote"      # taint label: the pointer went through symm_at / remote_ptr
TOKEN = "@token"        # taint label: the pointer went through consume_token


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str
    file: str
    line: int

    @property
    def loc(self):
        return f"{os.path.basename(self.file)}:{self.line}"

    def __str__(self):
        return f"{self.loc}: [{self.rule}] {self.message}"


@dataclass
class _Event:
    kind: str           # store | load | signal | release | wait | poll | peer_write
    bases: frozenset    # kernel parameters the pointer derives from
    remote: bool
    token: bool
    file: str
    line: int
    what: str           # the primitive, for messages
    extra: dict = field(default_factory=dict)


def _builtin_table():
    import triton.language as tl

    from .language import core, shmem
    table = {id(core.symm_at): ("symm_at", core.symm_at), id(core.consume_token): ("consume_token", core.consume_token),
             id(shmem.remote_ptr): ("remote_ptr", shmem.remote_ptr)}
    for name in ("wait", "notify", "ld", "st", "atomic_add", "atomic_cas", "fence", "multimem_st", "wait_deps",
                 "release_tile", "fetch_task"):
        fn = getattr(core, name)
        table[id(fn)] = (f"dl.{name}", fn)
    from .language import extra
    for name in ("multimem_st_b32", "multimem_st_b64", "multimem_st_v2", "multimem_st_v4", "multimem_st_p_b32"):
        fn = getattr(extra, name)
        table[id(fn)] = ("dl.multimem_st", fn)          # (Triton-distributed's packed multicast stores)
    for name, fn in vars(shmem).items():
        if callable(fn) and not name.startswith("_") and A._param_names(fn) is not None:
            table.setdefault(id(fn), (f"shmem.{name}", fn))
    for name in ("load", "store", "atomic_add", "atomic_xchg", "atomic_cas", "atomic_max", "atomic_min",
                 "atomic_and", "atomic_or", "atomic_xor"):
        fn = getattr(tl, name, None)
        if fn is not None:
            table[id(fn)] = (f"tl.{name}", fn)
    return table


_TABLE = None


def _table():
    global _TABLE
    if _TABLE is None:
        _TABLE = _builtin_table()
    return _TABLE


_DEFAULTS = {"dl.wait": {"scope": "gpu", "semantic": "acquire"}, "dl.notify": {"comm_scope": "intra_node"},
             "dl.ld": {"scope": "gpu", "semantic": "acquire"}, "dl.st": {"scope": "gpu", "semantic": "release"},
             "dl.atomic_add": {"scope": "gpu", "semantic": "relaxed"},
             "dl.atomic_cas": {"scope": "gpu", "semantic": "acq_rel"},
             "dl.fence": {"semantic": "acq_rel", "scope": "gpu"}}


class _Func(A._Analysis):
    """One function's taint, with the REMOTE / TOKEN labels."""

    def call_taint(self, call):
        callee = self.resolve(call.func)
        entry = _table().get(id(callee)) if callee is not None else None
        if entry is not None and entry[1] is callee and entry[0] in ("symm_at", "consume_token", "remote_ptr"):
            bound = A._bind(call, A._param_names(callee))
            arg = bound.get("value" if entry[0] == "consume_token" else "ptr")
            return self.taint(arg) | {TOKEN if entry[0] == "consume_token" else REMOTE}
        return super().call_taint(call)


_PARSED = weakref.WeakKeyDictionary()    # function -> (its code object, (fdef, file, taint) or None)


def _parsed(fn):
    """``(fdef, file, analysis)`` of ``fn``: its source parsed and its taint propagated (which depend on the
    function alone: a call site's arguments are substituted afterwards, in :meth:`_Walker.taint`), once per
    function and code object (as :func:`ditron.analysis._analyse` caches); None when it has no source.  A helper
    is inlined at every call site, so without this it was parsed again at each one."""
    code = getattr(fn, "__code__", None)
    try:
        hit = _PARSED.get(fn)
    except TypeError:
        hit = None
    if hit is not None and hit[0] is code:
        return hit[1]
    try:
        fdef, file = A.function_source(fn)
    except Exception:  # noqa: BLE001 -- no source: nothing to say
        out = None
    else:
        fa = _Func(fn, fdef, file, (fn,))      # (an error here reaches lint()'s guard, as before)
        fa.propagate()
        out = (fdef, file, fa)
    try:
        _PARSED[fn] = (code, out)
    except TypeError:  # pragma: no cover -- not weak-referenceable
        pass
    return out


def _calls_in(node):
    """The ``ast.Call`` nodes under ``node`` (itself included) in post-order: a call after its sub-expressions,
    left to right.  Computed once per node and kept on it: the parsed functions are cached (:func:`_parsed`) and a
    helper's body is walked at every call site."""
    calls = getattr(node, "_ditron_calls", None)
    if calls is None:
        calls = []

        def visit(n):
            for child in ast.iter_child_nodes(n):
                visit(child)
            if isinstance(n, ast.Call):
                calls.append(n)
        visit(node)
        node._ditron_calls = calls
    return calls


class _Walker:
    def __init__(self, module=None, constexprs=None):
        self.events: list[_Event] = []
        self.ir = {}
        for op in getattr(module, "ops", None) or ():
            self.ir.setdefault((os.path.basename(op.file or ""), op.line, op.kind), []).append(op.attrs)
        self.constexprs = dict(constexprs or {})
        self.consulted = {}       # constexpr name -> (present, value): what the findings depend on

    # -- attributes -------------------------------------------------------------------
    def attrs(self, what, call, bound, file):
        """Attribute values of a dl.* call: every value the IR recorded for
        this line (a helper may be called with several), else the literal
        argument, else the default."""
        kind = what[3:] if what.startswith("dl.") else what
        recorded = self.ir.get((os.path.basename(file), call.lineno, kind))
        if recorded:
            merged = {}
            for attrs in recorded:
                for k, v in attrs.items():
                    merged.setdefault(k, set()).add(v)
            return merged
        out = {}
        for k, default in _DEFAULTS.get(what, {}).items():
            node = bound.get(k)
            if isinstance(node, ast.Constant):
                out[k] = {node.value}
            elif isinstance(node, ast.Name) and self._constexpr(node.id):
                out[k] = {self.constexprs[node.id]}
            elif node is None:
                out[k] = {default}
            else:
                out[k] = set()            # unknown: no finding depends on it
        return out

    def _constexpr(self, name):
        present = name in self.constexprs
        self.consulted[name] = (present, self.constexprs.get(name))
        return present

    # -- walking ----------------------------------------------------------------------
    def walk_function(self, fn, subst, stack=()):
        if fn in stack or len(stack) > 8:
            return
        parsed = _parsed(fn)
        if parsed is None:             # no source: nothing to say
            return
        fdef, file, fa = parsed
        ctx = (fa, subst, file, stack + (fn,))
        for stmt in fdef.body:
            self.walk_stmt(stmt, ctx)

    def walk_stmt(self, node, ctx):
        # calls in program order: evaluate sub-expressions left to right, statements in order
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(node, (ast.If, ast.While)):
            self.walk_expr(node.test, ctx)
            for s in node.body + node.orelse:
                self.walk_stmt(s, ctx)
            return
        if isinstance(node, ast.For):
            self.walk_expr(node.iter, ctx)
            for s in node.body + node.orelse:
                self.walk_stmt(s, ctx)
            return
        if isinstance(node, ast.With):
            for item in node.items:
                self.walk_expr(item.context_expr, ctx)
            for s in node.body:
                self.walk_stmt(s, ctx)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.walk_stmt(child, ctx)
            else:
                self.walk_expr(child, ctx)

    def walk_expr(self, node, ctx):
        # the calls under ``node``, each after its own sub-expressions (arguments before the call), left to right
        if node is None:
            return
        for call in _calls_in(node):
            self.call(call, ctx)

    def taint(self, expr, ctx):
        fa, subst, _, _ = ctx
        raw = fa.taint(expr)
        out = set()
        for t in raw:
            if t in (REMOTE, TOKEN):
                out.add(t)
            else:
                out |= subst.get(t, set())
        return out

    def event(self, kind, expr, ctx, call, what, **extra):
        t = self.taint(expr, ctx) if expr is not None else set()
        bases = frozenset(x for x in t if x not in (REMOTE, TOKEN))
        self.events.append(_Event(kind, bases, REMOTE in t, TOKEN in t, ctx[2], call.lineno, what, extra))

    def call(self, call, ctx):
        fa, subst, file, stack = ctx
        callee = fa.resolve(call.func)
        if callee is None:
            return
        entry = _table().get(id(callee))
        if entry is None or entry[1] is not callee:
            if isinstance(callee, A._jit_types()):
                inner = A._python_function(callee)
                if inner is None:
                    return
                params = A._param_names(inner) or ()
                bound = A._bind(call, params)
                self.walk_function(inner, {p: self.taint(bound.get(p), ctx) for p in params}, stack)
            return
        what = entry[0]
        bound = A._bind(call, A._param_names(callee) or ())
        at = self.attrs(what, call, bound, file)

        def weak(key, strong):
            vals = at.get(key, set())
            return bool(vals) and not vals <= set(strong)

        if what == "tl.store":
            self.event("store", bound.get("pointer"), ctx, call, what)
        elif what == "tl.load":
            self.event("load", bound.get("pointer"), ctx, call, what)
        elif what.startswith("tl.atomic"):
            sem = bound.get("sem")
            sem = sem.value if isinstance(sem, ast.Constant) else ("acq_rel" if sem is None else None)
            kind = "signal" if sem in ("relaxed", "acquire") else ("release" if sem is not None else "other")
            self.event(kind, bound.get("pointer"), ctx, call, what)
        elif what == "dl.st":
            if weak("semantic", ("release",)):       # a relaxed store: a signal for the stores before it
                self.event("signal", bound.get("ptr"), ctx, call, what + f"(semantic={_one(at['semantic'])})")
                self.event("store", bound.get("ptr"), ctx, call, what)
            else:
                self.event("store", bound.get("ptr"), ctx, call, what)
                self.event("release", None, ctx, call, what)
        elif what in ("dl.atomic_add", "dl.atomic_cas"):
            if weak("semantic", ("release", "acq_rel")):
                self.event("signal", bound.get("ptr"), ctx, call, what + f"(semantic={_one(at['semantic'])})")
            else:
                self.event("release", None, ctx, call, what)
        elif what == "dl.fence":
            if not weak("semantic", ("release", "acq_rel", "sc")):
                self.event("release", None, ctx, call, what)
        elif what == "dl.notify":
            self.event("release", None, ctx, call, what)
            if weak("comm_scope", ("gpu",)):
                self.event("peer_write", bound.get("ptr"), ctx, call, what)
        elif what == "dl.wait":
            self.event("wait", bound.get("barrier_ptrs"), ctx, call, what, gpu="gpu" in at.get("scope", set()))
        elif what == "dl.wait_deps":             # scoreboard slots: written on this GPU only (release_tile)
            self.event("wait", bound.get("slot_ptr"), ctx, call, what, gpu=True)
        elif what in ("dl.release_tile", "dl.fetch_task"):
            self.event("release", None, ctx, call, what)
        elif what == "dl.ld":
            self.event("poll", bound.get("ptr"), ctx, call, what,
                       gpu=bool(at.get("scope", set()) & {"gpu", "cta"}))
            self.event("load", bound.get("ptr"), ctx, call, what)
        elif what == "dl.multimem_st":
            self.event("store", bound.get("ptrs") if "ptrs" in bound else bound.get("ptr"), ctx, call, what)
        elif what.startswith("shmem."):
            name = what[6:]
            if name.startswith("putmem_signal"):
                self.event("peer_write", bound.get("dst"), ctx, call, what)
                self.event("peer_write", bound.get("sig_addr"), ctx, call, what)
                self.event("release", None, ctx, call, what)
            elif name.startswith("putmem"):
                self.event("peer_write", bound.get("dst"), ctx, call, what)
                self.event("store", bound.get("dst"), ctx, call, what, remote=True)
            elif name.startswith("getmem"):
                self.event("store", bound.get("dst"), ctx, call, what)
                self.event("peer_read", bound.get("src"), ctx, call, what)
            elif name == "signal_op":
                self.event("peer_write", bound.get("sig_addr"), ctx, call, what)
                self.event("signal", bound.get("sig_addr"), ctx, call, what, remote=True)
            elif name == "signal_wait_until":
                self.event("wait", bound.get("sig_addr"), ctx, call, what, gpu=False)
            elif name in ("quiet", "fence") or name.startswith(("barrier_all", "sync_all")):
                self.event("release", None, ctx, call, what)


def _one(vals):
    return "/".join(sorted(map(str, vals)))


def _check(events):
    findings = []
    waited = set().union(*(e.bases for e in events if e.kind in ("wait", "poll"))) if events else set()
    peer_written = set()
    peer_data = set()
    for e in events:
        if e.kind == "peer_write" or (e.kind == "store" and (e.remote or e.extra.get("remote"))):
            peer_written |= e.bases
        if e.kind == "peer_write" and not e.what.startswith(("dl.notify", "shmem.signal_op")):
            peer_data |= e.bases
        if e.kind == "store" and (e.remote or e.extra.get("remote")):
            peer_data |= e.bases
        if e.kind == "load" and e.remote:
            peer_data |= e.bases
        if e.kind == "peer_read":
            peer_data |= e.bases
    peer_data -= waited
    pending = []            # stores since the last release
    after_wait = False
    for e in events:
        if e.kind == "store":
            pending.append(e)
        elif e.kind == "release":
            pending = []
        elif e.kind == "signal":
            visible = e.remote or e.extra.get("remote") or bool(e.bases & waited)
            if visible and pending:
                s = pending[-1]
                findings.append(Finding("relaxed-signal", f"{e.what} signals without release after the store "
                                        f"({s.what}) at {os.path.basename(s.file)}:{s.line}: a reader that acquires "
                                        "the signal may not see the data. Use dl.notify, a release store / atomic, "
                                        "or dl.fence('release', 'sys') before it", e.file, e.line))
                pending = []
        elif e.kind in ("wait", "poll"):
            if e.extra.get("gpu") and e.bases & peer_written:
                buf = ", ".join(sorted(e.bases & peer_written))
                findings.append(Finding("gpu-scope-wait", f"{e.what} with scope 'gpu' on '{buf}', which a peer "
                                        "writes (dl.notify / symm_at store / shmem signal): GPU scope does not "
                                        "order another GPU's writes; use scope='sys'", e.file, e.line))
            if e.kind == "wait" and e.what == "dl.wait":    # shmem waits are calls: loads stay below them
                after_wait = True
        elif e.kind == "load" and after_wait and not e.token and e.bases & peer_data:
            buf = ", ".join(sorted(e.bases & peer_data))
            findings.append(Finding("load-without-token", f"{e.what} of '{buf}' (written by peers) after a wait, "
                                    "not through dl.consume_token: the load may be scheduled above the wait. "
                                    "Load through dl.consume_token(ptr, token)", e.file, e.line))
    seen, out = set(), []
    for f in findings:
        key = (f.rule, f.file, f.line)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def lint(kernel, module=None, constexprs=None) -> list:
    """Findings for ``kernel`` (a ``@ditron.jit`` / ``@triton.jit`` kernel or
    a plain function); ``module``: the distributed IR of a compilation of it
    (for attribute values), ``constexprs``: values of constexpr parameters.
    Never raises."""
    fn = A._python_function(kernel)
    if fn is None:
        return []
    try:
        if module is None:
            return _check(_walk(fn, constexprs or {})[0])
        w = _Walker(module, constexprs)
        params = A._param_names(fn) or ()
        w.walk_function(fn, {p: {p} for p in params})
        return _check(w.events)
    except Exception:  # noqa: BLE001 -- a lint must never break a compilation
        return []


_WALKS: dict = {}    # id(fn) -> (fn, [(consulted constexprs, events)]): walks without IR, shared by lint/_summary


def _same(a, b):
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 -- not comparable: not the same
        return False


def _matches(consulted, consts):
    return all((name in consts) == present and (not present or _same(consts[name], value))
               for name, (present, value) in consulted.items())


def _walk(fn, consts):
    """(events, consulted constexprs) of walking ``fn`` without IR; cached per function and per value of the
    constexprs the walk looked at (the only input besides the source).  Raises what the walk raises."""
    hit = _WALKS.get(id(fn))
    if hit is not None and hit[0] is fn:
        for consulted, events in hit[1]:
            if _matches(consulted, consts):
                return events, consulted
    else:
        hit = _WALKS[id(fn)] = (fn, [])
    w = _Walker(None, consts)
    params = A._param_names(fn) or ()
    w.walk_function(fn, {p: {p} for p in params})
    if len(hit[1]) < 64:
        hit[1].append((w.consulted, w.events))
    return w.events, w.consulted


# ---------------------------------------------------------------------------
# across kernels: a flag that one kernel's peers write and another kernel waits on at GPU scope
# ---------------------------------------------------------------------------

_SUMMARIES: dict = {}
_PEER_WRITTEN: dict = {}     # buffer key (a tensor's address) -> (kernel name, event) that peers write through
_GPU_WAITS: dict = {}        # buffer key -> (kernel name, event): a GPU-scope wait / poll on it
_REPORTED: set = set()


def _summary(kernel, constexprs=None):
    """(peer-written parameters, GPU-scope-waited parameters) of ``kernel``: {param: event}; cached per
    kernel and per value of the constexprs the walk looked at (a launch's other keyword arguments, such as
    a step counter, change nothing and cost no new walk)."""
    consts = constexprs or {}
    hit = _SUMMARIES.get(id(kernel))
    if hit is not None and hit[0] is kernel:
        for consulted, out in hit[1]:
            if _matches(consulted, consts):
                return out
    else:
        hit = _SUMMARIES[id(kernel)] = (kernel, [])
    out = ({}, {})
    consulted = {}
    fn = A._python_function(kernel)
    if fn is not None:
        try:
            events, consulted = _walk(fn, consts)
            for e in events:
                if e.kind == "peer_write" or (e.kind == "store" and (e.remote or e.extra.get("remote"))) or \
                        (e.kind == "signal" and (e.remote or e.extra.get("remote"))):
                    for b in e.bases:
                        out[0].setdefault(b, e)
                if e.kind in ("wait", "poll") and e.extra.get("gpu"):
                    for b in e.bases:
                        out[1].setdefault(b, e)
        except Exception:  # noqa: BLE001 -- a lint must never break a launch
            out, consulted = ({}, {}), None
    if consulted is not None and len(hit[1]) < 64:
        hit[1].append((consulted, out))
    return out


def across_kernels(kernel_name, kernel, buffers, constexprs=None) -> list:
    """``gpu-scope-wait`` across kernels: ``buffers`` maps this launch's tensor parameters to a key of the
    memory they point at (e.g. the address).  A GPU-scope wait of one kernel on memory that another kernel
    writes through ``dl.notify`` to a peer, a ``symm_at`` store or a ``shmem`` signal is reported once (in
    whichever order the two kernels launch).  Never raises."""
    try:
        written, waits = _summary(kernel, constexprs)
        findings = []
        for p, e in written.items():
            k = buffers.get(p)
            if k is not None:
                _PEER_WRITTEN.setdefault(k, (kernel_name, e))
        for p, e in waits.items():
            k = buffers.get(p)
            if k is not None:
                _GPU_WAITS.setdefault(k, (kernel_name, e))
        for k, (wname, we) in list(_GPU_WAITS.items()):
            hit = _PEER_WRITTEN.get(k)
            if hit is None or hit[0] == wname or (wname, hit[0], we.line) in _REPORTED:
                continue
            _REPORTED.add((wname, hit[0], we.line))
            pname, pe = hit
            findings.append(Finding("gpu-scope-wait", f"{we.what} with scope 'gpu' (kernel {wname}) on a buffer "
                                    f"that peers write in kernel {pname} ({pe.what} at "
                                    f"{os.path.basename(pe.file)}:{pe.line}): GPU scope does not order another "
                                    "GPU's writes; use scope='sys'", we.file, we.line))
        return findings
    except Exception:  # noqa: BLE001
        return []


def strict() -> bool:
    return os.environ.get("DITRON_STRICT", "") not in ("", "0")


def report(kernel_name, findings, stacklevel=3):
    """Warn for each finding (or raise for the first one under ``DITRON_STRICT=1``)."""
    if not findings:
        return
    if strict():
        f = findings[0]
        more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
        raise DitronCompileError(f"kernel {kernel_name}: [{f.rule}] {f.message}{more} (DITRON_STRICT=1)", loc=f.loc)
    for f in findings:
        if not _first_rank_to_report(kernel_name, f):
            continue
        # shown at the kernel's line (the source line under the warning is the finding's, not the launcher's)
        warnings.warn_explicit(DitronLintWarning(f"kernel {kernel_name}: {f}"), DitronLintWarning,
                               f.file or "?", int(f.line or 0), module="ditron.lint")


def _first_rank_to_report(kernel_name, f) -> bool:
    """Simulated ranks compile (lint) the same kernel each: one of them prints a finding, not every rank
    (a marker file per finding in the job's directory)."""
    try:
        from .runtime.world import current_world
        world = current_world(required=False)
        sim_dir = getattr(getattr(world, "transport", None), "sim_dir", None)
        if world is None or world.world_size == 1 or not sim_dir:
            return True
        import hashlib
        key = hashlib.sha1(f"{kernel_name}|{f.rule}|{f.file}|{f.line}".encode()).hexdigest()[:20]
        fd = os.open(os.path.join(sim_dir, f"lint-{key}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)
        return True
    except FileExistsError:
        return False
    except Exception:  # noqa: BLE001 -- never lose a warning to the bookkeeping
        return True
