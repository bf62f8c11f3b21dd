"""The interface between the simulator's executor and its observers.

:mod:`ditron.sim.executor` runs a launch's programs; its observers -- the
memory-access hooks (:mod:`ditron.sim.access`) and the race finder
(:mod:`ditron.sim.race`) -- watch them.  The dependency runs one way:

    executor -> events <- access -> race -> events

* the observers read the launch and program running on the calling thread
  from here (:func:`current_launch`, :func:`current_program`; the executor
  sets them);
* the executor reaches its observers through :func:`ditron.lowering.provided`
  (``"access"``, ``"race"``), where each one provides itself when imported,
  as the sim lowering rules and the transport do; :mod:`ditron.jit` imports
  them with the executor;
* per launch, the race finder gives the executor a :class:`LaunchObserver`.
"""
from __future__ import annotations

import threading

_CURRENT = threading.local()


def current_launch():
    """The :class:`~ditron.sim.executor.Launch` of the calling program thread (None on the host)."""
    return getattr(_CURRENT, "launch", None)


def current_program():
    return getattr(_CURRENT, "program", None)


class LaunchObserver:
    """What the executor calls on an observer of one launch (``Launch.race``)."""

    def order(self, programs):
        """The order in which to start ``programs`` (a list of (linear index, pid))."""
        return programs

    def program_begin(self, pid, linear):
        """On the program's thread, before its body runs."""

    def program_end(self):
        """On the program's thread, after its body (also when it failed)."""

    def end(self, name, failed=False):
        """On the launching thread, after every program finished (``failed``: one of them raised; the launch
        raises that error next)."""
