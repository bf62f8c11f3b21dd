"""A kernel's first launch, done once before the ranks fork.

The first launch of a kernel in a rank process does work that depends on the kernel's source alone: Triton's
interpreter rewrites the kernel and every ``@triton.jit`` helper it calls (``inspect.getsourcelines``, ``ast.parse``,
the rewrite, ditron's thread-dependent-region transform (:mod:`ditron.sim.simt`), ``compile``), and ditron reads the
source again for the symmetric-argument analysis (:mod:`ditron.analysis`) and the lint's parse, taint and walk
(:mod:`ditron.lint`); the first kernel argument makes Triton import what its argument conversion needs.  Every rank did it for every kernel it ran: a 4-rank job four times over.

A process that forks ranks (the fork server of :class:`ditron.sim.pool.SimCluster`, whose preload list ends with
:mod:`ditron.sim.warm_at_import`) calls :func:`warm` first: it imports the kernel zoo and the decoder and does that work for every
interpreted ``@jit`` function of ``ditron``, ``triton.language`` and ``triton_dist``; the forked ranks inherit the
results in the caches where a first launch leaves them (``InterpretedFunction.rewritten_fn``, the analysis and lint
caches), so their first launch finds them there.  The results are the ones a rank computes: the same functions of
the same source, by the same code, with the same patches installed (:func:`ditron.sim.simt.install` before any
rewrite; the lint's walk is cached per value of the constexprs it consulted, so a launch that gives one of those
walks again).  What depends on a launch (the cross-kernel lint's buffers, argument checks) is still done at it.

Only under ``TRITON_INTERPRET=1`` (otherwise ``@jit`` functions are not interpreted and nothing is done), and never
raising: a module that fails to import or a function without source is left to the rank, which reports it as
before.
"""
from __future__ import annotations

import importlib
import sys

#: imported by :func:`warm`: the kernel zoo and the decoder (what the simulator's users and tests launch)
MODULES = ("ditron.kernels", "ditron.kernels.decoder.model", "ditron.kernels.decoder.reference")

#: the packages whose interpreted ``@jit`` functions are warmed (``tl.sum``, ``tl.cdiv``, ... are
#: ``triton.language`` helpers: interpreted, and rewritten at their first call, too)
PACKAGES = ("ditron", "triton.language", "triton_dist")


def jit_functions(packages=PACKAGES):
    """The interpreted ``@jit`` functions defined in the loaded modules of ``packages`` (each once)."""
    from .. import _compat
    cls = _compat.interpreted_function_class()
    out = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not any(name == p or name.startswith(p + ".") for p in packages):
            continue
        for value in list(getattr(mod, "__dict__", {}).values()):
            if isinstance(value, cls) and getattr(getattr(value, "fn", None), "__module__", None) == name:
                out.setdefault(id(value), value)
    return list(out.values())


def warm_function(jf) -> None:
    """The source-only first-launch work for one interpreted ``@jit`` function (never raises)."""
    from .. import analysis, lint
    from .executor import SimKernel
    try:
        jf.rewrite()                     # Triton's cache: InterpretedFunction.rewritten_fn
    except Exception:  # noqa: BLE001 -- the rank's own first call reports it
        pass
    fn = analysis._python_function(jf)
    if fn is None:
        return
    try:
        lint._parsed(fn)                 # parse + taint, per function (the walk per launch stays at the launch)
    except Exception:  # noqa: BLE001
        pass
    if isinstance(jf, SimKernel):
        from ..runtime import world
        world._symmetric_positions(jf)   # never raises; caches the kernel's and its helpers' analyses
        # the lint's walk without constexprs, cached per value of the constexprs it consulted: a launch whose
        # constexprs agree on those uses it (as a rank's second launch does), any other walks again
        lint._walk(fn, {})
        lint._summary(jf, {})


def warm(modules=MODULES, packages=PACKAGES) -> int:
    """Import ``modules`` and warm every interpreted ``@jit`` function of ``packages``; the number warmed."""
    from .. import _compat
    if not _compat.interpreter_enabled():
        return 0
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- a rank that imports it shows the error
            pass
    try:
        from . import scalar_twins, simt
        simt.install()                   # the rewrite includes the thread-dependent-region transform
        scalar_twins.install()           # also for plain @triton.jit kernels, which do not reach the executor
        functions = jit_functions(packages)
    except Exception:  # noqa: BLE001
        return 0
    for jf in functions:
        warm_function(jf)
    _compat.warm_triton_key()            # for ranks that compile (torch.compile's cache key, a Triton compile)
    try:
        # a first kernel argument makes Triton import what its argument conversion needs (its native
        # specialization imports triton.experimental.gluon, about 40 modules), in every rank otherwise
        import torch
        _compat.interpreter_convert_arg(torch.zeros(1))
    except Exception:  # noqa: BLE001
        pass
    return len(functions)



def preload_more(names: str) -> list:
    """Import the comma-separated module ``names`` (for :mod:`ditron.sim.warm_at_import`); the ones imported.
    ``tempfile.tempdir``, if these imports set it, is reset (a forked rank computes it from its environment)."""
    import tempfile
    tempdir = tempfile.tempdir
    done = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- a rank that imports it shows the error
            continue
        done.append(name)
    tempfile.tempdir = tempdir
    return done
