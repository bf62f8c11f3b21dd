"""The planted missing notify: a ring in which every rank notifies the next
one and then waits for its own flag -- except that rank 1 "forgets" to notify
rank 2.  With DITRON_WAIT_TIMEOUT_S set, rank 2's wait must stop with a report
naming the rank, the program, the signal tensor and offset, the expected and
the observed value, within timeout + 5 s; the other ranks finish normally.

    DITRON_WAIT_TIMEOUT_S=2 torchrun --nproc-per-node 4 tests/gpu/planted_hang.py --backend p2p --kind wait

``--kind barrier``: rank 1 skips a ``ditron.barrier_all``; every other rank's
host barrier must stop within timeout + 5 s with a report naming the rank and
the call site (the host barrier is bounded by DITRON_WAIT_TIMEOUT_S too).

``--kind ll``: rank 1 skips an ``all_reduce(method="ll")``; the other ranks' kernels poll the LL packets
(no ``dl.wait`` anywhere) and must stop within timeout + 5 s with a "polling loop" report naming the LL
buffer (``dl.poll_timeout`` in ``kernels/_common.py:ll_poll``).

``--kind deps``: a megakernel (tests/bodies_task.py's chain graph, one
program) whose task 'b' tile 2 never releases its scoreboard slot: every
rank's ``dl.wait_deps`` must stop with a report naming the slot, the task and
the tile (``scoreboard slot 7 = task 'b' tile 2``, expected ``>= 1``).

No trap: the kernel of a hung rank returns (every program leaves at its next wait), its CUDA context stays
usable (a CUDA call after it must work: no CUDA error anywhere), the report is printed by the watchdog and
raised by ``gpu.check_hang()`` (and by the next launch on the world).  So the planted hangs run under MPS too:
one rank's report does not end the other ranks' kernels.  Exits through os._exit (the world's signals are
inconsistent after a report).
"""
import argparse
import os
import sys
import time

import torch
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem
from ditron.runtime import gpu


@ditron.jit
def k_ring_wait(flag, nxt, skip):
    if dl.rank() != skip:
        dl.notify(flag, nxt, signal=1, sig_op="set", comm_scope="intra_node")
    dl.wait(flag, 1, "sys", "acquire", waitValue=1)


@ditron.jit
def k_ring_signal(sig, nxt, skip):
    if dl.rank() != skip:
        shmem.signal_op(sig, 1, shmem.NVSHMEM_SIGNAL_SET, nxt)
    shmem.signal_wait_until(sig, shmem.NVSHMEM_CMP_EQ, 1)


def after_report(device):
    """(CUDA error text or None, whether gpu.check_hang() raised the report): after a report the context must still
    work (no trap) and the host must raise the report."""
    err = None
    try:
        torch.cuda.synchronize()
        assert float(torch.ones(4, device=device).sum().item()) == 4.0        # the context works
    except Exception as e:  # noqa: BLE001 -- a trap or a dead context: the failure this test guards against
        err = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    try:
        gpu.check_hang()
        raised = False
    except ditron.DitronHangError as e:
        raised = "bounded wait expired" in str(e)
    return err, raised


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="p2p")
    ap.add_argument("--kind", choices=("wait", "signal", "barrier", "ll", "deps"), default="wait")
    args = ap.parse_args()
    timeout = float(os.environ.get("DITRON_WAIT_TIMEOUT_S", "0"))
    if timeout <= 0:
        print("planted_hang: set DITRON_WAIT_TIMEOUT_S", flush=True)
        os._exit(2)
    world = ditron.init(args.backend)
    rank, n = world.rank, world.world_size
    nxt = (rank + 1) % n
    if args.kind == "barrier":
        planted_barrier(args, world, timeout)
    if args.kind == "ll":
        planted_ll(args, world, timeout)
    if args.kind == "deps":
        planted_deps(args, world, timeout)
    if args.kind == "wait":
        word = ditron.symm_zeros((2,), torch.int32, name="planted_flags")
        kernel, arg = k_ring_wait, word[1:]
        want = ["dl.wait", "'planted_flags'", "element offset 1", "expected value == 1", "observed 0"]
    else:
        word = ditron.symm_zeros((1,), torch.uint64, name="planted_sig")
        kernel, arg = k_ring_signal, word
        want = ["shmem.signal_wait_until", "'planted_sig'", "element offset 0", "expected value == 1", "observed 0"]
    # 1) the healthy ring (everyone notifies) completes under the bounded variant
    ditron.barrier_all()
    kernel[(2,)](arg, nxt, -1)
    torch.cuda.synchronize()
    ditron.barrier_all()
    word.zero_()
    torch.cuda.synchronize()
    ditron.barrier_all()
    torch.cuda.synchronize()
    torch.distributed.barrier()
    # 2) rank `skip` skips its notify: the next rank hangs (rank 1 -> rank 2 at 3+ ranks; at 2 ranks rank 1 ->
    # rank 0; at 1 rank, rank 0 notifies itself and skips it)
    skip = 1 % n
    hung = (skip + 1) % n
    t0 = time.monotonic()
    kernel[(2,)](arg, nxt, skip)
    err, raised = after_report(world.device)
    report = gpu.wait_for_hang_report(timeout + 5 - (time.monotonic() - t0)) if rank == hung else gpu.hang_report()
    elapsed = time.monotonic() - t0
    ok = True
    if rank == hung:
        want = [f"rank {rank}", "program (", "thread "] + want
        missing = [w for w in want if report is None or w not in report]
        ok = report is not None and not missing and elapsed <= timeout + 5 and err is None and raised
        print(f"planted_hang[{args.backend}/{args.kind}] rank {rank}: report after {elapsed:.2f} s "
              f"(timeout {timeout:g} s), CUDA error: {err}, raised by the host: {raised}; missing in report: "
              f"{missing}", flush=True)
    else:
        ok = report is None and err is None and not raised
        print(f"planted_hang[{args.backend}/{args.kind}] rank {rank}: finished normally={err is None}, "
              f"no report={report is None}", flush=True)
    print(f"planted_hang[{args.backend}/{args.kind}] rank {rank}: {'1 passed, 0 failed' if ok else '0 passed, 1 failed'}",
          flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


def planted_ll(args, world, timeout):
    from ditron import kernels as K
    rank, n = world.rank, world.world_size
    ctx = K.create_all_reduce_context(4096, torch.bfloat16)
    x = torch.ones(4096, dtype=torch.bfloat16, device=world.device)
    healthy = bool((K.all_reduce(x, ctx, method="ll").float() == n).all())     # 1) a healthy bounded ll call
    torch.cuda.synchronize()
    torch.distributed.barrier()
    t0 = time.monotonic()
    err = report = None
    raised = False
    if rank != 1:                           # 2) rank 1 skips this one
        K.all_reduce(x, ctx, method="ll")
        err, raised = after_report(world.device)
        report = gpu.wait_for_hang_report(max(0.1, timeout + 5 - (time.monotonic() - t0)))
    elapsed = time.monotonic() - t0
    if rank == 1:
        ok = healthy
    else:
        want = [f"rank {rank}", "program (", "polling loop (dl.poll_timeout)", "'all_reduce.ll'", "expected value =="]
        missing = [w for w in want if report is None or w not in report]
        ok = healthy and report is not None and not missing and elapsed <= timeout + 5 and err is None and raised
        print(f"planted_hang[{args.backend}/ll] rank {rank}: report after {elapsed:.2f} s, CUDA error: {err}, "
              f"raised by the host: {raised}; missing in report: {missing}\n{report}", flush=True)
    print(f"planted_hang[{args.backend}/ll] rank {rank}: {'1 passed, 0 failed' if ok else '0 passed, 1 failed'}",
          flush=True)
    sys.stdout.flush()
    os._exit(0 if ok else 1)


def planted_deps(args, world, timeout):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import bodies_task as B
    rank = world.rank
    B.run_chain(world, "round_robin", num_programs=2, steps=2)         # 1) healthy, bounded variant
    torch.cuda.synchronize()
    torch.distributed.barrier()
    t0 = time.monotonic()
    mk = None
    early = False
    try:                                                                # 2) b[2] never releases
        mk = B.planted_missing_release(world, "b", 2, num_programs=1)
    except ditron.DitronHangError:          # a launch of the step after the record appeared refuses: fine
        early = True
    err, raised = after_report(world.device)
    raised = raised or early
    report = gpu.wait_for_hang_report(timeout + 5 - (time.monotonic() - t0))
    elapsed = time.monotonic() - t0
    want = [f"rank {rank}", "dl.wait_deps on megakernel 'chain' scoreboard slot 7 = task 'b' tile 2",
            "expected value >= 1", "observed 0"]
    missing = [w for w in want if report is None or w not in report]
    ok = report is not None and not missing and elapsed <= timeout + 5 and err is None and raised
    print(f"planted_hang[{args.backend}/deps] rank {rank}: report after {elapsed:.2f} s, CUDA error: {err}, "
          f"raised by the host: {raised}; missing in report: {missing}", flush=True)
    print(f"planted_hang[{args.backend}/deps] rank {rank}: {'1 passed, 0 failed' if ok else '0 passed, 1 failed'}",
          flush=True)
    del mk
    os._exit(0 if ok else 1)


def planted_barrier(args, world, timeout):
    from ditron.errors import DitronHangError
    rank, n = world.rank, world.world_size
    ditron.barrier_all()                    # 1) a healthy bounded barrier
    torch.cuda.synchronize()
    torch.distributed.barrier()
    t0 = time.monotonic()
    err = None
    gate = None
    if n == 1:
        # one rank cannot skip a barrier of its own: plant the other cause the report names, work queued before
        # the barrier on its stream that never completes (a stream wait on a word nobody writes)
        gate = ditron.symm_zeros((1,), torch.int64, name="planted_gate")
        torch.cuda.synchronize()
        ditron.stream_wait_value(gate, 1)
    if rank != 1:                           # 2) rank 1 skips this one
        try:
            ditron.barrier_all()
        except DitronHangError as e:
            err = str(e)
    if gate is not None:                    # release the stream from another stream so the process can exit
        side = torch.cuda.Stream()
        ditron.stream_write_value(gate, 1, stream=side)
        side.synchronize()
    elapsed = time.monotonic() - t0
    if rank == 1:
        ok = err is None
    else:
        want = [f"rank {rank}", "ditron.barrier_all at planted_hang.py:", "DITRON_WAIT_TIMEOUT_S"]
        missing = [w for w in want if err is None or w not in err]
        ok = err is not None and not missing and elapsed <= timeout + 5
        print(f"planted_hang[{args.backend}/barrier] rank {rank}: report after {elapsed:.2f} s; missing: {missing}",
              flush=True)
    print(f"planted_hang[{args.backend}/barrier] rank {rank}: {'1 passed, 0 failed' if ok else '0 passed, 1 failed'}",
          flush=True)
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
