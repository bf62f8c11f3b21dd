"""Tile- and thread-level primitives of ``ditron.language`` (``dl``).

Names and signatures follow Triton-distributed (``dl.wait``,
``dl.consume_token``, ``dl.symm_at``, ...) so that its kernels port by
changing imports.  Each function is a Triton builtin: call it inside a
``@ditron.jit`` (or ``@triton.jit``) function.  Each creates one op of the
distributed IR (:mod:`ditron.ir`); the docstrings say what the op means, its
memory semantics, and what it becomes on each backend.

Memory-model vocabulary: ``scope`` is how far an ordering reaches -- ``"cta"``
(the program), ``"gpu"`` (the device), ``"sys"`` (the system: peer GPUs over
NVLink/xGMI and the host).  ``semantic`` is the ordering -- ``"acquire"``
(later accesses cannot move above), ``"release"`` (earlier accesses cannot
move below), ``"acq_rel"``, ``"relaxed"`` (atomic, unordered),
``"volatile"`` (not cached, unordered).
"""
from __future__ import annotations

from .. import _compat
from .semantic import emit

builtin = _compat.builtin


# ---------------------------------------------------------------------------
# tile level
# ---------------------------------------------------------------------------

@builtin
def rank(axis=-1, _semantic=None, _generator=None):
    """This process's rank, an ``int32`` scalar.

    ``axis=-1``: global rank; ``axis=0``: rank within the node (local rank);
    ``axis=1``: node index.  Reads the world descriptor that the runtime
    stores in the kernel's module (no kernel argument needed).

    NVIDIA / AMD: one constant-memory load from the ditron device library.
    Simulator: the simulated rank.
    """
    return emit("rank", {}, {"axis": axis}, _semantic, _generator)


@builtin
def num_ranks(axis=-1, _semantic=None, _generator=None):
    """Number of ranks, an ``int32`` scalar: ``axis=-1`` world size,
    ``axis=0`` ranks per node, ``axis=1`` number of nodes.  Lowered like
    :func:`rank`."""
    return emit("num_ranks", {}, {"axis": axis}, _semantic, _generator)


@builtin
def symm_at(ptr, rank, _semantic=None, _generator=None):
    """The same offset in ``rank``'s copy of a symmetric tensor.

    ``ptr`` points into a symmetric allocation (``ditron.symm_empty`` /
    ``symm_zeros``); it may be one pointer or a tensor of pointers.  The result
    can be loaded from and stored to directly (NVLink / xGMI peer access), so
    ``rank`` must be on this node: a rank on another node traps.  No memory
    access and no ordering by itself.

    NVIDIA / AMD: ``ptr + delta[rank] * (4096 / elem_size)`` with ``delta``
    from the world descriptor (heaps are 4 KiB aligned, so vectorised
    accesses stay vectorised).  Simulator: address translation between the
    shared-memory heaps of the simulated ranks.
    """
    return emit("symm_at", {"ptr": ptr, "rank": rank}, {}, _semantic, _generator, params=("ptr", "rank"))


@builtin
def wait(barrier_ptrs, num_barriers, scope="gpu", semantic="acquire", waitValue=1, wait_value=None,
         _semantic=None, _generator=None):
    """Spin until each of ``num_barriers`` consecutive signal words starting
    at ``barrier_ptrs`` equals ``waitValue``; return a token.

    ``barrier_ptrs``: one pointer to int32/uint32 or int64/uint64 words;
    ``num_barriers`` may be a runtime value.  ``scope``: ``"gpu"`` (the signal
    is written on this GPU) or ``"sys"`` (written by a peer or the host);
    ``semantic``: ``"acquire"`` (reads after the wait see what the writer
    released) or ``"relaxed"``.  All threads of the program leave the wait
    together.  Pass the token to :func:`consume_token` so that loads of the
    guarded data carry a dependency on the wait.

    NVIDIA: threads poll words ``tid, tid+ntid, ...`` with
    ``ld.<semantic>.<scope>.global``, then ``bar.sync 0``.  AMD: the same loop
    with LLVM atomic loads (``syncscope("agent")`` / system) and
    ``s_barrier``.  Simulator: polls the shared heap.
    """
    value = waitValue if wait_value is None else wait_value
    return emit("wait", {"barrier_ptrs": barrier_ptrs, "num_barriers": num_barriers, "wait_value": value},
                {"scope": scope, "semantic": semantic}, _semantic, _generator,
                params=("barrier_ptrs", "num_barriers", "scope", "semantic", "waitValue"),
                aliases={"waitValue": "wait_value"})


@builtin
def consume_token(value, token, _semantic=None, _generator=None):
    """``value`` (a pointer, tensor of pointers, or tensor) made data-dependent
    on ``token`` (from :func:`wait`), so that loads through it cannot be
    scheduled above the wait by Triton's or LLVM's passes.

    Lowered to ``value + token * k`` (``token`` is zero at run time but opaque
    to the compiler; for pointers ``k = 128`` elements, which keeps their
    alignment and vectorisation).  Costs one integer add.
    """
    return emit("consume_token", {"value": value, "token": token}, {}, _semantic, _generator,
                params=("value", "token"))


@builtin
def notify(ptr, rank, signal=1, sig_op="set", comm_scope="intra_node", _semantic=None, _generator=None):
    """Signal ``rank``: write ``signal`` to (``sig_op="set"``) or add it to
    (``"add"``) the word at ``ptr`` in ``rank``'s copy, after everything this
    program wrote before the call.

    ``comm_scope``: ``"gpu"`` (rank is this GPU: release at device scope),
    ``"intra_node"`` (a peer on this node: release at system scope through a
    peer pointer), ``"inter_node"`` (any rank: an OpenSHMEM signal
    operation, needs NVSHMEM / rocSHMEM and 64-bit signal words).  The program's
    threads synchronise first; one thread performs the release.
    (Triton-distributed defaults ``comm_scope`` to ``"inter_node"``; ditron
    defaults to ``"intra_node"``, which needs no SHMEM library.)

    NVIDIA: ``bar.sync 0`` then ``st.release.<scope>.global`` /
    ``red.release.<scope>.global.add`` by thread 0, or ``nvshmemx_signal_op``.
    AMD: ``s_barrier`` then an LLVM release store / ``atomicrmw add release``,
    or ``rocshmem_uint64_atomic_set`` / ``_add`` by work-item 0.  Simulator: an atomic store/add on the peer
    heap.
    """
    return emit("notify", {"ptr": ptr, "rank": rank, "signal": signal}, {"sig_op": sig_op, "comm_scope": comm_scope},
                _semantic, _generator, params=("ptr", "rank", "signal", "sig_op", "comm_scope"))


@builtin
def multimem_ld_reduce(ptrs, op="sum", acc_dtype=None, _semantic=None, _generator=None):
    """Load through multicast addresses and reduce across all ranks (NVLink
    SHARP): returns a tile with, per element, the ``op`` (``"sum"``, ``"min"``,
    ``"max"``) of every rank's value.  ``ptrs`` are multicast pointers
    (``shmem.remote_mc_ptr``).  fp16/bf16 sums accumulate in fp32 by default
    (``acc_dtype``).  Relaxed, system scope.

    NVIDIA sm_90+: ``multimem.ld_reduce.relaxed.sys.global.add[.acc::f32].<type>``.
    AMD and older NVIDIA GPUs: a compile-time error (no multicast memory).
    """
    return emit("multimem_ld_reduce", {"ptrs": ptrs}, {"op": op, "acc_dtype": acc_dtype}, _semantic, _generator,
                params=("ptrs", "op", "acc_dtype"))


@builtin
def multimem_st(ptrs, value, _semantic=None, _generator=None):
    """Store ``value`` through multicast addresses: every rank's copy receives
    it (NVLink SHARP broadcast).  Relaxed, system scope.

    NVIDIA sm_90+: ``multimem.st.relaxed.sys.global.<type>``.  AMD: compile-time
    error.
    """
    return emit("multimem_st", {"ptrs": ptrs, "value": value}, {}, _semantic, _generator, params=("ptrs", "value"))


# ---------------------------------------------------------------------------
# thread level: these run in every thread, exactly like their CUDA namesakes;
# guard with ``if dl.tid(0) == 0:`` for once-per-program effects
# ---------------------------------------------------------------------------

@builtin
def tid(axis=0, _semantic=None, _generator=None):
    """This thread's index in the program (``threadIdx``; Triton launches
    1-D programs, so ``axis`` is 0 in practice).  NVIDIA: ``%tid.x``; AMD:
    ``llvm.amdgcn.workitem.id.x``."""
    return emit("tid", {}, {"axis": axis}, _semantic, _generator)


@builtin
def laneid(_semantic=None, _generator=None):
    """Lane of this thread in its warp (NVIDIA ``%laneid``, 0..31) or
    wavefront (AMD ``mbcnt``, 0..63)."""
    return emit("laneid", {}, {}, _semantic, _generator)


@builtin
def num_threads(_semantic=None, _generator=None):
    """Threads in the program (``num_warps * warp_size``; NVIDIA ``%ntid.x``)."""
    return emit("num_threads", {}, {}, _semantic, _generator)


@builtin
def num_warps(_semantic=None, _generator=None):
    """Warps (wavefronts) in the program.  NVIDIA: ``%ntid.x >> 5``; AMD: the
    compile-time ``num_warps``."""
    return emit("num_warps", {}, {}, _semantic, _generator)


class _SimtRegion:
    """The context manager :func:`simt_exec_region` returns: ``__enter__``
    gives ``(thread_idx, block_size)``; entering and leaving emit nothing."""

    def __init__(self, values):
        self.values = values

    def __enter__(self):
        return self.values

    def __exit__(self, *exc):
        return False


@builtin
def simt_exec_region(_semantic=None, _generator=None):
    """Triton-distributed's per-thread region::

        with dl.simt_exec_region() as (thread_idx, block_size):
            if thread_idx < n:              # thread i works on item i
                ...

    ``thread_idx`` is this thread's index in the program (``dl.tid(0)``) and
    ``block_size`` the number of threads (``dl.num_threads()``), both
    ``int32`` scalars.  Scalar code in the body runs in every thread with its
    own values, exactly as scalar code with :func:`tid` does anywhere in a
    Triton program; the region itself adds no instruction and no barrier
    (end it with :func:`syncthreads` where threads must meet).  ``@ditron.jit``
    accepts the tuple target ``as (thread_idx, block_size)``, which stock
    Triton's code generator does not.

    NVIDIA: ``%tid.x`` and ``%ntid.x``.  AMD: the work-item id and the
    compile-time thread count.  Simulator: the body runs once per simulated
    thread, split at its top-level ``syncthreads`` (docs/simulator.md).
    """
    values = emit("simt_region", {}, {}, _semantic, _generator)
    import triton.language as tl
    return _SimtRegion(tl.tuple(list(values)))


@builtin
def ld(ptr, scope="gpu", semantic="acquire", _semantic=None, _generator=None):
    """Load with explicit memory semantics (per element for a tensor of
    pointers).  ``semantic``: ``"acquire"``, ``"relaxed"``, ``"volatile"``;
    ``scope``: ``"cta"``, ``"gpu"``, ``"sys"``.  NVIDIA:
    ``ld.<semantic>.<scope>.global.b<bits>``; AMD: LLVM ``load atomic`` with
    the matching ``syncscope``."""
    return emit("ld", {"ptr": ptr}, {"scope": scope, "semantic": semantic}, _semantic, _generator, params=("ptr",))


@builtin
def st(ptr, value, scope="gpu", semantic="release", _semantic=None, _generator=None):
    """Store with explicit memory semantics (``"release"``, ``"relaxed"``,
    ``"volatile"``).  NVIDIA: ``st.<semantic>.<scope>.global.b<bits>``; AMD:
    LLVM ``store atomic``."""
    return emit("st", {"ptr": ptr, "value": value}, {"scope": scope, "semantic": semantic}, _semantic, _generator,
                params=("ptr", "value"))


@builtin
def atomic_add(ptr, value, scope="gpu", semantic="relaxed", _semantic=None, _generator=None):
    """Atomic add in every calling thread; returns the old value.  NVIDIA:
    ``atom.<semantic>.<scope>.global.add``; AMD: ``atomicrmw add``/``fadd``."""
    return emit("atomic_add", {"ptr": ptr, "value": value}, {"scope": scope, "semantic": semantic}, _semantic,
                _generator, params=("ptr", "value"))


@builtin
def atomic_cas(ptr, cmp, value, scope="gpu", semantic="acq_rel", _semantic=None, _generator=None):
    """Atomic compare-and-swap in every calling thread; returns the old value.
    NVIDIA: ``atom.<semantic>.<scope>.global.cas.b<bits>``; AMD: ``cmpxchg``."""
    return emit("atomic_cas", {"ptr": ptr, "cmp": cmp, "value": value}, {"scope": scope, "semantic": semantic},
                _semantic, _generator, params=("ptr", "cmp", "value"))


@builtin
def syncthreads(_semantic=None, _generator=None):
    """Barrier of all threads of the program with CTA-scope ordering
    (``__syncthreads``).  NVIDIA: ``bar.sync 0``; AMD: ``s_barrier``."""
    return emit("syncthreads", {}, {}, _semantic, _generator)


@builtin
def fence(semantic="acq_rel", scope="gpu", _semantic=None, _generator=None):
    """Memory fence.  ``semantic``: ``"acquire"``/``"release"``/``"acq_rel"``
    (all ``fence.acq_rel`` on NVIDIA) or ``"sc"``; ``scope``: ``"cta"``,
    ``"gpu"``, ``"sys"``.  AMD: LLVM ``fence`` with the matching syncscope."""
    return emit("fence", {}, {"semantic": semantic, "scope": scope}, _semantic, _generator)


@builtin
def ballot_sync(mask, pred, _semantic=None, _generator=None):
    """Bit ``i`` set when lane ``i`` (among ``mask``) has a non-zero ``pred``.
    NVIDIA: ``vote.sync.ballot.b32`` (int32).  AMD: ``llvm.amdgcn.ballot``
    over the 64-lane wavefront (int64; ``mask`` is ignored)."""
    return emit("ballot_sync", {"mask": mask, "pred": pred}, {}, _semantic, _generator, params=("mask", "pred"))


@builtin
def shfl_sync(mask, value, lane, _semantic=None, _generator=None):
    """``value`` of lane ``lane`` (32- or 64-bit).  NVIDIA ``shfl.sync.idx``;
    AMD ``ds_bpermute``."""
    return emit("shfl_sync", {"mask": mask, "value": value, "lane": lane}, {}, _semantic, _generator,
                params=("mask", "value", "lane"))


@builtin
def shfl_up_sync(mask, value, delta, _semantic=None, _generator=None):
    """``value`` of lane ``laneid - delta`` (own value for lower lanes).
    NVIDIA ``shfl.sync.up``."""
    return emit("shfl_up_sync", {"mask": mask, "value": value, "lane": delta}, {}, _semantic, _generator,
                params=("mask", "value", "lane"))


@builtin
def shfl_down_sync(mask, value, delta, _semantic=None, _generator=None):
    """``value`` of lane ``laneid + delta`` (own value past the last lane).
    NVIDIA ``shfl.sync.down``."""
    return emit("shfl_down_sync", {"mask": mask, "value": value, "lane": delta}, {}, _semantic, _generator,
                params=("mask", "value", "lane"))


@builtin
def shfl_xor_sync(mask, value, lane_mask, _semantic=None, _generator=None):
    """``value`` of lane ``laneid ^ lane_mask`` (butterfly).  NVIDIA
    ``shfl.sync.bfly``."""
    return emit("shfl_xor_sync", {"mask": mask, "value": value, "lane": lane_mask}, {}, _semantic, _generator,
                params=("mask", "value", "lane"))


@builtin
def ffs(x, _semantic=None, _generator=None):
    """1-based position of the least significant set bit of ``x`` (0 when
    ``x == 0``), as int32.  NVIDIA: ``brev`` + ``clz``; AMD: ``llvm.cttz``."""
    return emit("ffs", {"x": x}, {}, _semantic, _generator, params=("x",))


# ---------------------------------------------------------------------------
# bounding user polling loops (DITRON_WAIT_TIMEOUT_S)
# ---------------------------------------------------------------------------

@builtin
def clock_ns(_semantic=None, _generator=None):
    """A device-wide clock in nanoseconds (``int64``; only differences are
    meaningful).  NVIDIA: ``%globaltimer``; AMD: ``s_memrealtime`` (100 MHz)
    x 10; simulator: the host's monotonic clock."""
    return emit("clock_ns", {}, {}, _semantic, _generator)


@builtin
def poll_timeout(start, ptr, expected, observed, pending=True, _semantic=None, _generator=None):
    """Bound a polling loop written with loads (``tl.load(volatile=True)``,
    :func:`ld`) the way ``DITRON_WAIT_TIMEOUT_S`` bounds :func:`wait`: call it
    in the loop body with ``start`` (a :func:`clock_ns` value taken before the
    loop), the polled address(es) ``ptr`` (a pointer or a tile of pointers),
    the ``expected`` and last ``observed`` values (integers, scalars or tiles
    like ``ptr``) and ``pending`` (a bool tile like ``ptr``: which elements are
    still waited for; default all).  When the kernel was compiled with a wait
    timeout and more than that has passed since ``start``, a thread holding a
    pending element writes the same hang report as a bounded wait (rank,
    program, thread, the symmetric tensor and offset of that element's
    address, expected and observed values) and leaves the kernel (no trap;
    every thread of the loop leaves once a report exists: docs/runtime.md).

    NVIDIA: without a timeout nothing at all is emitted; with one, a
    ``%globaltimer`` read and a compare per pending element and call.  AMD:
    nothing (waits are not bounded on AMD yet).  Simulator: nothing -- its
    watchdog already treats a program that only polls as blocked and reports
    the polled address.
    """
    return emit("poll_timeout", {"start": start, "ptr": ptr, "expected": expected, "observed": observed,
                                 "pending": pending}, {},
                _semantic, _generator, params=("start", "ptr", "expected", "observed", "pending"))


# ---------------------------------------------------------------------------
# memory hints
# ---------------------------------------------------------------------------

@builtin
def prefetch_l2(ptr, mask=True, _semantic=None, _generator=None):
    """Ask the memory system to bring the cache line of each address of
    ``ptr`` (a pointer or a tile of pointers, global memory) into L2, without
    waiting for it and without a result.  ``mask`` (a bool tile like ``ptr``,
    default all) skips elements.  A hint: it never faults, never orders
    anything and may be dropped.  One element per line is enough (128 bytes:
    64 bf16 values), e.g. ``dl.prefetch_l2(w + rows[:, None] * K + (k0 +
    tl.arange(0, BLOCK_K // 64) * 64)[None, :], mask=...)``.

    Use it to start reading data that does not depend on a producer (weights)
    before waiting for one: the megakernel's ``register_task(prefetch=...)``
    hook runs before the tile's dependency wait (docs/megakernel.md).

    NVIDIA: ``prefetch.global.L2::evict_last`` per element, predicated on the
    mask.  AMD gfx942: nothing (CDNA3 has no L2 prefetch instruction).
    Simulator: checks that every unmasked address is inside a tensor of the
    launch (an out-of-bounds prefetch is a bug even if the GPU ignores it) and
    does nothing else.
    """
    return emit("prefetch_l2", {"ptr": ptr, "mask": mask}, {}, _semantic, _generator, params=("ptr", "mask"))


# ---------------------------------------------------------------------------
# task level: the scoreboard of a megakernel (see docs/megakernel.md)
# ---------------------------------------------------------------------------

@builtin
def wait_deps(slot_ptr, num_slots, epoch, acquire="fence", _semantic=None, _generator=None):
    """Wait until each of ``num_slots`` consecutive int32 scoreboard slots
    starting at ``slot_ptr`` holds a value ``>= epoch``; return a token.

    A slot holds the epoch (step number) of the last step in which its tile
    was released by :func:`release_tile`, so the scoreboard never needs
    resetting.  Acquire at GPU scope: everything the releasing program wrote
    before its :func:`release_tile` is visible to loads after the wait (pass
    the token to :func:`consume_token`).  All threads of the program leave
    together.  ``num_slots`` may be a runtime value (0: no wait).

    NVIDIA: threads poll slots ``tid, tid+ntid, ...`` with
    ``ld.relaxed.gpu.global.b32`` (``nanosleep`` 64 ns between polls) until
    ``slot >= epoch`` (signed), then ``fence.acq_rel.gpu`` (acquire) and
    ``bar.sync 0``; under ``DITRON_WAIT_TIMEOUT_S`` the bounded loop reports
    (address, expected, observed) and the block leaves the kernel (no trap).  AMD: the same loop with LLVM
    ``load atomic ... syncscope("agent") acquire`` and ``s_barrier``.
    Simulator: polls the slots (the program lends its turn while it waits);
    a deadlock report names the task and tile of the slot.

    ``acquire``: how the polls acquire on NVIDIA (the same semantics either way; AMD and the simulator ignore it):
    ``"fence"`` (relaxed polls, then ``fence.acq_rel.gpu``, as above) or ``"load"`` (``ld.acquire.gpu`` polls and
    no fence: for a wait inside a tile's software-pipelined loop, where the fence -- ``MEMBAR.ALL.GPU`` -- would
    also wait for the thread's weight copies in flight; each acquire load invalidates the SM's L1, so a wait that
    spins long should keep ``"fence"``).
    """
    return emit("wait_deps", {"slot_ptr": slot_ptr, "num_slots": num_slots, "epoch": epoch}, {"acquire": acquire},
                _semantic, _generator, params=("slot_ptr", "num_slots", "epoch", "acquire"))


@builtin
def release_tile(slot_ptr, epoch, _semantic=None, _generator=None):
    """Mark a tile done: all threads of the program synchronise, then one
    thread stores ``epoch`` to the int32 slot at ``slot_ptr`` with release
    semantics at GPU scope (everything the program wrote before becomes
    visible to a program whose :func:`wait_deps` sees the slot).

    NVIDIA: ``bar.sync 0`` then ``st.release.gpu.global.b32`` by thread 0.
    AMD: ``s_barrier`` then an LLVM ``store atomic ... syncscope("agent")
    release``.  Simulator: an atomic store (a release edge for the race
    finder).
    """
    return emit("release_tile", {"slot_ptr": slot_ptr, "epoch": epoch}, {}, _semantic, _generator,
                params=("slot_ptr", "epoch"))


@builtin
def fetch_task(counter_ptr, _semantic=None, _generator=None):
    """Take a ticket from a device work queue: one atomic add of 1 (acq_rel,
    GPU scope) per program on the int32 word at ``counter_ptr``; the old value
    is returned to every thread of the program (an ``int32`` scalar).

    NVIDIA / AMD: Triton's scalar ``atomic_add`` (one thread performs
    ``atom.acq_rel.gpu.add`` / ``atomicrmw add ... syncscope("agent")
    acq_rel``; the result is broadcast through shared memory).  Simulator: an
    atomic add on the word.
    """
    return emit("fetch_task", {"counter_ptr": counter_ptr}, {}, _semantic, _generator, params=("counter_ptr",))
