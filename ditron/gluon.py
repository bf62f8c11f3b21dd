"""``@ditron.gluon.jit``: distributed Gluon kernels.

Gluon (``triton.experimental.gluon``, stock Triton) writes what ``tl`` cannot reach on Hopper -- explicit TMA,
mbarriers, ``warpgroup_mma``, warp-specialised partitions (kernels/gemm_hopper.py is ditron's GEMM core in it).
A kernel decorated with ``ditron.gluon.jit`` instead of ``gluon.jit`` also calls ditron's primitives
(``dl.rank``, ``dl.num_ranks``, ``dl.symm_at``, ``dl.wait``, ``dl.consume_token``, ``dl.notify``, the thread-level
helpers ``dl.ld`` / ``dl.st`` / ``dl.atomic_*``, ``dl.shmem.*``) and is launched like a ``@ditron.jit`` kernel:
ditron's device library attached, the world's launch checks, ``kernel.dist_ir``::

    from triton.experimental.gluon import language as gl
    import ditron, ditron.gluon, ditron.language as dl

    @ditron.gluon.jit(twin=ring_push_tl)           # twin: what the simulator runs instead (below)
    def ring_push(x_ptr, buf_ptr, sig_ptr, n, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
        peer = (dl.rank() + 1) % dl.num_ranks()
        offs = gl.arange(0, BLOCK, layout=layout)
        gl.store(dl.symm_at(buf_ptr, peer) + offs, gl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
        dl.notify(sig_ptr, peer, signal=1, comm_scope="intra_node")
        ...

    ring_push[(1,)](x, buf, sig, n, BLOCK=1024)    # GPUs (sm_90a), like any Triton kernel
    ditron.compile(ring_push, target="sm_90a", ...)  # anywhere, no GPU needed

Where the primitives may be called: the program-wide ones (``dl.wait``, ``dl.notify``, ``dl.shmem``'s block
calls) end in a barrier of the whole program (``bar.sync 0``), so they belong in a kernel's straight-line code,
not inside a ``gl.warp_specialize`` partition (a partition is a subset of the program's warps: the barrier would
wait for warps that never come).  Inside a partition, poll and publish per thread with ``dl.ld`` / ``dl.st``
(``scope="sys"``, ``semantic="acquire"`` / ``"release"``), which have no barrier; the lint
(:mod:`ditron.lint`) does not see into Gluon partitions.

Targets: NVIDIA (sm_90a and newer; Gluon's Hopper and Blackwell modules).  AMD: Gluon's own AMD support is
partial in Triton 3.6 and 3.9; ``ditron.compile`` passes a ``gfx942`` compile through, and Triton says what
it does not support.

The simulator (``ditron sim``) runs Triton's interpreter, which has no Gluon: a ``ditron.gluon.jit`` kernel
runs its **twin** there, a ``@ditron.jit`` kernel with the same parameters and the same protocol in ``tl``
(kernels/gemm_hopper.py's ``TWIN`` is the pattern: a GPU test shows the two agree bit for bit).  A kernel
without a twin is refused at its launch under the simulator, with a message saying so.
"""
from __future__ import annotations

from . import _compat
from .errors import DitronError
from .jit import DitronJITFunction, check_jit_options


class DitronGluonJITFunction(DitronJITFunction):
    """A Gluon kernel with ditron's launch path (:class:`ditron.jit.DitronJITFunction`): Triton's binder
    builds a ``GluonASTSource`` (as ``gluon.jit``'s ``GluonJITFunction``), so the body is traced with Gluon's
    semantics; ditron's primitives emit through the same rules as in ``tl`` kernels."""

    def __init__(self, fn, twin=None, **kwargs):
        super().__init__(fn, **kwargs)
        self.twin = twin

    def create_binder(self):
        from triton.experimental.gluon._runtime import GluonASTSource
        result = super().create_binder()
        self.ASTSource = GluonASTSource
        return result

    def is_gluon(self):
        return True


class _NoTwin:
    """A ``ditron.gluon.jit`` kernel under the simulator without a twin: every use says what to do."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def _refuse(self, *args, **kwargs):
        raise DitronError(f"Gluon kernel {self.__name__} cannot run on the simulator (Triton's interpreter has no "
                          "Gluon): give it a twin, a @ditron.jit kernel with the same parameters written in tl, "
                          f"with @ditron.gluon.jit(twin=...), and the simulator runs that (see ditron/gluon.py)")

    def __getitem__(self, grid):
        return self._refuse

    run = warmup = __call__ = _refuse


def jit(fn=None, *, twin=None, **kwargs):
    """Decorate a Gluon kernel: ``@ditron.gluon.jit`` or ``@ditron.gluon.jit(twin=tl_kernel, ...)``.

    Takes ``gluon.jit``'s (= ``triton.jit``'s) options.  ``twin``: a ``@ditron.jit`` kernel with the same
    parameters that the simulator runs in this kernel's place (under ``TRITON_INTERPRET=1`` this decorator
    returns the twin itself); without one the kernel is refused at launch under the simulator."""
    check_jit_options("ditron.gluon.jit", kwargs)
    if twin is not None and not (hasattr(twin, "fn") and hasattr(twin, "__getitem__")):
        raise TypeError(f"ditron.gluon.jit: twin= must be a @ditron.jit kernel, got {type(twin).__name__}")

    def decorator(f):
        if _compat.interpreter_enabled():
            return twin if twin is not None else _NoTwin(f)
        return DitronGluonJITFunction(f, twin=twin, **kwargs)

    return decorator(fn) if fn is not None else decorator


__all__ = ["jit", "DitronGluonJITFunction"]
