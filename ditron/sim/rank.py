"""One simulated rank: ``python -m ditron.sim.rank SCRIPT [ARGS...]`` (started
by the launcher, never by hand).  Runs the script as ``__main__`` and, when it
fails, leaves a report for the launcher in ``$DITRON_SIM_DIR/rank<R>.json``."""
from __future__ import annotations

import json
import os
import runpy
import sys
import traceback

EXIT_HANG = 3
_STARTED_WITH: list = []     # the interpreter's own stdout / stderr objects, kept alive (see main)


def _report(rank, payload):
    sim_dir = os.environ.get("DITRON_SIM_DIR")
    if not sim_dir:
        return
    with open(os.path.join(sim_dir, f"rank{rank}.json"), "w") as f:
        json.dump(payload, f, default=str)


def _stop_reason():
    try:
        from ..runtime.world import current_world
        world = current_world(required=False)
        if world is not None and world.transport.control is not None:
            from .. import sim_memory as M
            return M.ABORT_REASONS.get(world.transport.control.abort)
    except Exception:  # noqa: BLE001
        return None
    return None


def _line_writer(stream):
    import io
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return stream
    raw = io.BufferedWriter(io.FileIO(fd, "w", closefd=False), buffer_size=1 << 16)
    return io.TextIOWrapper(raw, encoding=getattr(stream, "encoding", None) or "utf-8",
                            errors=getattr(stream, "errors", None) or "backslashreplace", line_buffering=True,
                            write_through=False)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m ditron.sim.rank SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    # the ranks share the launcher's stdout / stderr: each writes whole lines (one write per line), so that
    # two ranks' output is never glued onto one line (a block-buffered pipe flushes mid-line; an unbuffered
    # one, PYTHONUNBUFFERED, writes a print's text and its newline separately)
    sys.stdout = _line_writer(sys.stdout)
    sys.stderr = _line_writer(sys.stderr)
    # the interpreter's shutdown puts sys.__stdout__ / __stderr__ back as sys.stdout / stderr before it frees the
    # modules, so what their objects print as they are freed went to the streams it started with (with
    # PYTHONUNBUFFERED, "text" and "\n" in two writes, and another rank's line between them): the same whole-line
    # writers there too (the streams they replace write to the same descriptors and never close them: closefd=False)
    _STARTED_WITH.extend((sys.__stdout__, sys.__stderr__))
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
    script = argv[0]
    sys.argv = argv
    if argv[0] == "-m":
        sys.argv = argv[1:]
        target, run = argv[1], runpy.run_module
    else:
        target, run = script, runpy.run_path
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    from . import numerics
    numerics.install()      # plain @triton.jit kernels of the script compute as ditron's do (libdevice, bf16)
    from . import host_modules
    host_modules.install()  # `import nvshmem.core` without nvshmem4py: one line with the two-line port
    from . import host_torch
    host_torch.install()    # the script's .cuda() / device="cuda" / torch.cuda streams: the simulated GPU
    try:
        run(target, run_name="__main__", **({"alter_sys": True} if run is runpy.run_module else {}))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            _report(rank, {"rank": rank, "kind": "exit", "code": code, "traceback": ""})
        return code
    except BaseException as e:  # noqa: BLE001 -- reported to the launcher
        from ..errors import DitronHangError
        from .host_modules import HostModuleNotInstalled
        tb = traceback.format_exc()
        if isinstance(e, HostModuleNotInstalled):
            where = traceback.extract_tb(e.__traceback__)
            where = [f for f in where if f.filename == os.path.abspath(script) or f.filename == script] or where
            site = f"{where[-1].filename}:{where[-1].lineno}: " if where else ""
            _report(rank, {"rank": rank, "kind": "error", "line": f"{site}{e}", "traceback": tb})
            return 1
        if isinstance(e, DitronHangError):
            _report(rank, {"rank": rank, "kind": "hang", "report": e.report, "traceback": tb,
                           "reason": _stop_reason()})
            return EXIT_HANG
        _report(rank, {"rank": rank, "kind": "error", "traceback": tb, "stopped": _stop_reason()})
        return 1
    finally:
        try:
            from ..runtime.world import current_world
            world = current_world(required=False)
            if world is not None and world.transport.control is not None:
                from .. import sim_memory as M
                world.transport.control.rank_set(rank, M.R_DONE, 1)
        except Exception:  # noqa: BLE001
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
