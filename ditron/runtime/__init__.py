"""Host runtime: the world (ranks, symmetric heap, transports).

:mod:`ditron.runtime.world` holds the API (re-exported as ``ditron.init``,
``ditron.symm_empty``, ...); :mod:`ditron.runtime.sim` is the simulator
transport, :mod:`ditron.runtime.gpu` the GPU transports (NVSHMEM, P2P).
"""
