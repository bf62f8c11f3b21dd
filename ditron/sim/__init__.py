"""The CPU simulator: run ``@ditron.jit`` kernels on N simulated ranks.

* :mod:`ditron.sim.launcher` -- ``ditron sim -n N script.py`` (torchrun-like)
* :mod:`ditron.sim.pool` -- :class:`SimCluster`, persistent simulated ranks
  that run Python functions (the test fixture uses it)
* :mod:`ditron.sim.executor` -- one kernel launch on Triton's interpreter,
  programs running concurrently
* :mod:`ditron.sim.race` -- the race finder (``ditron sim --race``)
* :mod:`ditron.sim.access` -- hooks on the interpreter's loads and stores;
  polling loops
* :mod:`ditron.sim.events` -- the interface between the executor and its
  observers (access, race), below all three
* :mod:`ditron.sim.simt` -- code on ``dl.tid()``/``dl.laneid()`` runs once per
  simulated thread (an AST rewrite), or is refused
* :mod:`ditron.sim.numerics` -- bf16 / fp8 / libdevice arithmetic as GPUs
  compute it (patches of the interpreter's builder)
* :mod:`ditron.runtime.sim` -- the transport (shared-memory heaps, control
  block, watchdog); :mod:`ditron.lowering.sim` (with ``sim_thread``,
  ``sim_shmem``, ``sim_base``) -- the op semantics
"""
