"""The end of a forked rank (:mod:`ditron.sim.forkserver`): what the interpreter's shutdown does for the rank's
own code and objects, without tearing down the modules it shares with the fork server (torch, Triton, ditron,
imported once by the server), then ``os._exit`` with the rank's code, as :mod:`multiprocessing`'s forked
children end.

Tearing those down cost a rank about 0.9 CPU-seconds (half of it making the server's frozen objects visible to
the collector again, so that Triton >= 3.7's nanobind leak check saw them freed).  In the order of
``Py_FinalizeEx``, a forked rank's exit

1. joins the non-daemon threads (``threading._shutdown``);
2. runs the atexit handlers: the script's, ``weakref.finalize``'s (``atexit=True``), logging's, multiprocessing's;
3. collects the rank's garbage (the objects created since the fork: the server's are frozen): ``__del__`` and
   finalizers run, files that nothing refers to any more are flushed and closed;
4. tears down the modules imported since the fork (the script's own, and a library's that the server did not
   preload), as the interpreter does every module: their ``sys.modules`` entries set to None (an import in a
   finalizer fails), each module's dict cleared in the reverse order of import (names with one leading
   underscore first), collecting after each step; so the objects they held are freed (a file a module keeps open
   is flushed and closed, a ``NamedTemporaryFile`` removed);
5. flushes ``sys.stdout`` and ``sys.stderr`` (a failure makes the exit status 120, as the interpreter's), and
   ``sys.__stdout__`` / ``sys.__stderr__`` and the streams the rank started with (:mod:`ditron.sim.rank` made the
   first two its whole-line streams);
6. ``os._exit(code)``.

What it leaves out: the teardown of the preloaded modules, and of objects that only they refer to (an object of
the rank's stored in a preloaded module's global runs no ``__del__``: the interpreter does not promise one at
exit either); and nanobind's leak check, which runs only in that teardown.  A code outside C's ``int`` leaves
through ``sys.exit`` and the whole shutdown.
"""
from __future__ import annotations

import gc
import os
import sys


def finish(code, preloaded):
    """End this forked rank with ``code`` (the script's exit code, an int or None); ``preloaded``: the names in
    ``sys.modules`` when the rank started.  Does not return."""
    if code is None:
        code = 0
    if not isinstance(code, int) or not -(1 << 31) <= code < (1 << 31):
        sys.exit(code)
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    import atexit
    atexit._run_exitfuncs()
    gc.collect()
    _tear_down(preloaded)
    if not _flush_std():
        code = 120
    os._exit(code)


def _tear_down(preloaded):
    """The modules imported since the fork, torn down as ``finalize_modules`` does (CPython 3.11)."""
    import types
    import weakref
    new = [(name, mod) for name, mod in list(sys.modules.items()) if name not in preloaded]
    if not new:
        return
    refs = []
    for name, mod in new:
        if isinstance(mod, types.ModuleType):
            try:
                refs.append(weakref.ref(mod))
            except TypeError:
                pass
        sys.modules[name] = None
    del new, mod
    gc.collect()
    for ref in reversed(refs):
        mod = ref()
        if mod is None:
            continue
        d = getattr(mod, "__dict__", None)
        if isinstance(d, dict):
            _clear_dict(d)
        del mod
    gc.collect()


def _clear_dict(d):
    """As ``_PyModule_ClearDict``: names with one leading underscore set to None first, then all but
    ``__builtins__``."""
    for key in [k for k in d if isinstance(k, str) and k[:1] == "_" and k[1:2] != "_"]:
        d[key] = None
    for key in [k for k in d if k != "__builtins__"]:
        d[key] = None


def _flush_std() -> bool:
    ok = True
    for name in ("stdout", "stderr"):
        f = getattr(sys, name, None)
        if f is None or getattr(f, "closed", True):
            continue
        try:
            f.flush()
        except Exception as e:  # noqa: BLE001 -- as the interpreter: reported (stdout), status 120
            ok = False
            if name == "stdout":
                try:
                    sys.stderr.write(f"Exception ignored in: {f!r}\n{type(e).__name__}: {e}\n")
                    sys.stderr.flush()
                except Exception:  # noqa: BLE001
                    pass
    from .rank import _STARTED_WITH
    # sys.__stdout__ / __stderr__ (the rank's whole-line streams) and the streams the rank started with (the
    # server's), as their teardown would
    for f in (sys.__stdout__, sys.__stderr__, *_STARTED_WITH):
        try:
            if f is not None and not f.closed:
                f.flush()
        except Exception:  # noqa: BLE001
            pass
    return ok
