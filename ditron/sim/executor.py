"""Running one kernel launch on the simulator.

Triton's interpreter executes a kernel's Python body with NumPy tiles, one
program after another, keeping the program id in global state.  That cannot
run a producer/consumer protocol between programs (a persistent kernel whose
program 0 waits for data that the last program writes would spin forever).

Here every program runs in its own thread with a thread-local program id,
under a scheduler that keeps exactly one program *running* at a time: the
next program starts when the running one finishes or blocks in a wait.  So
non-communicating kernels run at sequential speed, and a program that waits
lends its turn to the programs that will satisfy it.  A woken waiter simply
continues (the GIL serialises the Python work).

Nothing is copied: kernel arguments are CPU tensors, passed by address, so
remote loads and stores through ``symm_at`` reach the other ranks' heaps.
"""
from __future__ import annotations

import inspect
import threading
import traceback

from .. import _compat
from ..errors import DitronError, DitronHangError
from ..lowering import provide, provided
from . import skew  # noqa: F401  (skew: DITRON_SIM_SKEW plans of a simulated job)
from .events import _CURRENT, current_launch, current_program

provide("launch", current_launch)       # the sim lowering rules read these; lowering never imports the simulator
provide("program", current_program)


class Launch:
    def __init__(self, name, transport):
        self.name = name
        self.transport = transport
        self.cv = threading.Condition()
        self.running = 0          # programs running and not blocked
        self.failed = False
        self.errors = []          # (program, exception, traceback text)
        self.tensor_args = []     # (name, first byte address, nbytes) of tensor arguments
        self.tensor_elems = {}    # name -> element size of tensor arguments
        self.race = None          # race.LaunchRace in race mode

    def describe_arg(self, addr):
        """Which tensor argument the address ``addr`` falls in, if any."""
        for name, start, nbytes in self.tensor_args:
            if start <= addr < start + max(nbytes, 1):
                return f"it points into argument '{name}'"
        return None

    def _running(self, delta):
        with self.cv:
            self.running += delta
            if self.running == 0:
                self.cv.notify_all()
        if self.transport is not None:
            self.transport.active(delta)

    def blocked(self, delta):
        """A program enters (+1) or leaves (-1) a blocking wait."""
        self._running(-delta)

    def program_main(self, fn, args, pid, builder, linear=0):
        _CURRENT.launch = self
        _CURRENT.program = pid
        builder.set_grid_idx(*pid)
        try:
            if self.race is not None:
                self.race.program_begin(pid, linear)
            skew.point("program", getattr(fn, "__name__", ""), linear)     # free unless a skew plan is set
            fn(**args)
        except BaseException as e:  # noqa: BLE001 -- reported by the launching thread
            root = _root_cause(e)
            self.errors.append((pid, root, traceback.format_exc()))
            self.failed = True
        finally:
            if self.race is not None:
                self.race.program_end()
            if self.transport is not None:
                self.transport.poll_end(self)
            _CURRENT.launch = None
            if self.transport is not None:
                self.transport.control.progress()
            self._running(-1)


def _root_cause(e):
    """Triton's interpreter wraps what a ``@triton.jit`` helper raises in an ``InterpreterError`` (one per
    nesting level): the ditron error or blocked wait inside is what the user needs (the same one-entry report
    as a wait in the kernel itself), not the chain."""
    from ..runtime.sim import Blocked
    seen, c = set(), e
    while c is not None and id(c) not in seen:
        if isinstance(c, (DitronError, Blocked)):
            return c
        seen.add(id(c))
        c = c.__cause__ or c.__context__
    return e


_PARAMS: dict = {}


def _params(fn, arg_names):
    """(parameter names, constexpr parameter names) of a kernel body, once per function."""
    hit = _PARAMS.get(fn)
    if hit is None:
        ann = {name: _compat.interpreter_normalize_annotation(ty) for name, ty in fn.__annotations__.items()}
        hit = _PARAMS[fn] = (frozenset(inspect.getfullargspec(fn).args),
                             frozenset(name for name in arg_names if ann.get(name) == "constexpr"))
    return hit


def _install_hooks():
    """Route the interpreter's volatile loads (polling) -- and, for the race
    finder, every load, store and atomic -- to the simulator."""
    from . import interp_fast, numerics, scalar_twins, simt
    interp_fast.install()     # the interpreter's bookkeeping, cheaper (same results)
    scalar_twins.install()    # dl.swizzle_gather / _scatter's index arithmetic on Python ints (same results)
    numerics.install()        # bf16 / fp8 / libdevice arithmetic as GPUs compute it
    simt.install()            # branches on dl.tid() run once per simulated thread
    H = _compat.ACCESS_HOOKS
    if H.load is None:
        access = provided("access")     # the observers provide themselves (see ditron.sim.events)
        if access is None:
            raise DitronError("the simulator's access hooks (ditron.sim.access) are not loaded; "
                              "kernels reach the executor through ditron.jit, which loads them")
        H.load, H.store, H.atomic = access.interp_load, access.interp_store, access.interp_atomic
    H.plain = provided("access").plain_hooks()     # bounds, megakernel access checks, race finder


def execute(name, fn, arg_names, grid, args, kwargs, transport=None, lint_kernel=None):
    """Run ``fn`` (the interpreter-rewritten kernel body) over ``grid``."""
    _install_hooks()
    params, constexprs = _params(fn, arg_names)
    num_warps = kwargs.get("num_warps", 4) if "num_warps" not in params else 4
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    try:
        bound = inspect.getcallargs(fn, *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"kernel {name}: {e}") from None
    if callable(grid):
        grid = grid(dict(bound))
    grid = tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3:
        raise DitronError(f"kernel {name}: the grid must have 1 to 3 dimensions, got {grid}")
    grid = grid + (1,) * (3 - len(grid))
    if any(g < 0 for g in grid):
        raise DitronError(f"kernel {name}: negative grid {grid}")
    converted = {k: v if k in constexprs else _compat.interpreter_convert_arg(v) for k, v in bound.items()}
    launch = Launch(name, transport)
    launch.num_warps = int(num_warps)        # threads of a program: num_warps * 32 (ditron.sim.simt)
    for k, v in bound.items():
        if hasattr(v, "data_ptr") and hasattr(v, "untyped_storage"):
            launch.tensor_args.append((k, v.data_ptr(), v.numel() * v.element_size()))
            launch.tensor_elems[k] = v.element_size()
    if lint_kernel is not None:
        # the gpu-scope-wait lint across kernels: this launch's buffers against earlier launches' (once each)
        from .. import lint
        heap = getattr(transport, "heap", None)
        symm = {k: (heap.generation, v.data_ptr()) for k, v in bound.items()
                if heap is not None and hasattr(v, "data_ptr") and heap.contains(v)}     # peers write only these
        found = lint.across_kernels(name, lint_kernel, symm, kwargs)
        lint.report(name, found, stacklevel=5)
    programs = [(x, y, z) for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
    race = provided("race")          # the race finder, when on
    launch.race = race.launch_begin(launch) if race is not None else None
    order = list(enumerate(programs)) if launch.race is None else launch.race.order(list(enumerate(programs)))
    threads = []
    if transport is not None:
        transport.active(-1)      # the launching thread only supervises
    try:
        with _compat.interpreter_launch(grid, launch.num_warps) as builder:
            for linear, pid in order:
                with launch.cv:
                    while launch.running > 0 and not launch.failed:
                        launch.cv.wait(0.5)
                    if launch.failed:
                        break
                    launch.running += 1
                if transport is not None:
                    transport.active(+1)
                t = threading.Thread(target=launch.program_main, args=(fn, converted, pid, builder, linear),
                                     name=f"{name}{pid}", daemon=True)
                threads.append(t)
                t.start()
            for t in threads:
                t.join()
    finally:
        if transport is not None:
            transport.active(+1)
    if launch.race is not None:
        # also after a failure: the programs' clocks reach the host, so that the next run of a cluster is
        # ordered after whatever this launch wrote (else its accesses would race with the next run's)
        launch.race.end(name, failed=bool(launch.errors))
    if launch.errors:
        _raise(name, launch)


def _raise(name, launch):
    from ..runtime.sim import Blocked
    real = [(p, e, tb) for p, e, tb in launch.errors if not isinstance(e, Blocked)]
    if real:
        pid, e, tb = min(real, key=lambda r: r[0])
        if isinstance(e, DitronError):
            raise e
        raise DitronError(f"kernel {name}, program {pid}: {type(e).__name__}: {e}\n{tb}") from e
    blocked = sorted((e for _, e, _ in launch.errors), key=lambda b: tuple(b.info.get("program") or ()))
    reason = blocked[0].reason
    raise DitronHangError(f"kernel {name} stopped ({reason}); blocked waits:", [b.info for b in blocked])


class SimKernel(_compat.interpreted_function_class()):
    """A ``@ditron.jit`` kernel under the simulator (``TRITON_INTERPRET=1``):
    launched with ``kernel[grid](...)`` like on GPUs, run by :func:`execute`;
    called from another kernel, it is an inlined device function."""

    def __init__(self, fn, **kwargs):
        super().__init__(fn, **kwargs)
        self.dist_ir = None
        self._linted = False

    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return None
        from ..runtime.world import current_world
        world = current_world(required=False)
        _install_hooks()          # before the rewrite: thread-dependent regions are an AST rewrite
        fn = self.rewrite()
        name = self.fn.__name__
        if world is None:
            # a plain TRITON_INTERPRET=1 process: a private one-rank world
            from ..runtime.world import init
            world = init("sim")
        if world.backend != "sim":
            raise DitronError(f"kernel {name} was defined under TRITON_INTERPRET=1 but the world runs on "
                              f"{world.backend}; define kernels after setting the environment consistently")
        transport = world.transport
        from ..runtime.world import check_kernel_args
        check_kernel_args(self, args, kwargs, world)
        if not self._linted:
            # the compile-time lint, as on GPUs (once per kernel; it reads the source): the simulator compiles
            # nothing, so the attribute values come from the source and this launch's constexprs
            self._linted = True
            from .. import lint
            lint.report(name, lint.lint(self, None, kwargs), stacklevel=3)
        return execute(name, fn, self.arg_names, grid, args, kwargs, transport, lint_kernel=self)
