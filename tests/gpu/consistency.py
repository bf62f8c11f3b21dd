"""GPU check of issue 15's API half under torchrun (any number of ranks >= 2):

* DITRON_DEBUG=1: an all_reduce (every method, ``ll`` included) with rank-divergent sizes fails every
  rank with the same message, before any launch; a rank that skips a call leaves the others with a
  DitronHangError within DITRON_WAIT_TIMEOUT_S; afterwards the job goes on (the next agreeing call works);
* the cost of the check per call (printed, not asserted);
* the lint of @ditron.jit: the first compilation of a racy kernel warns (DitronLintWarning).

    DITRON_DEBUG=1 DITRON_WAIT_TIMEOUT_S=5 torchrun --standalone --nproc-per-node 2 tests/gpu/consistency.py

Prints ``consistency rank N: P passed, F failed`` and exits non-zero on a failure.
"""
import os
import sys
import time
import warnings

import torch

import ditron
from ditron import kernels as K

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    assert os.environ.get("DITRON_DEBUG") == "1", "run with DITRON_DEBUG=1"
    timeout = float(os.environ.get("DITRON_WAIT_TIMEOUT_S", "60"))
    world = ditron.init()
    me, W = world.rank, world.world_size
    passed, failed = 0, 0

    def check(name, ok, detail=""):
        nonlocal passed, failed
        passed, failed = passed + bool(ok), failed + (not ok)
        print(f"rank {me}: {'ok' if ok else 'FAILED'} {name} {detail}", flush=True)

    dt = torch.float16
    ctx = K.create_all_reduce_context(4096, dt)
    x = torch.ones(4096, dtype=dt, device=world.device)
    for method in ("ll", "one_shot", "two_shot"):
        K.all_reduce(x[:120], ctx, method=method)
        try:
            K.all_reduce(x[:100 if me == 0 else 120], ctx, method=method)
            check(f"divergent {method}", False, "no error")
        except ditron.DitronError as e:
            check(f"divergent {method}", "ranks disagree on argument 'x.shape'" in str(e) and
                  "rank 0: (100,)" in str(e), str(e)[:200])
        out = K.all_reduce(x[:120], ctx, method=method)        # the job goes on
        torch.cuda.synchronize()
        check(f"after divergent {method}", bool((out == W).all()))
    # a skipped call
    t0 = time.monotonic()
    if me != 0:
        try:
            K.all_reduce(x[:64], ctx, method="ll")
            check("skipped call", False, "no error")
        except ditron.DitronHangError as e:
            took = time.monotonic() - t0
            check("skipped call", "ranks [0] did not make this call" in str(e) and took < timeout + 10,
                  f"after {took:.1f} s")
    torch.distributed.barrier()
    out = K.all_reduce(x[:64], ctx, method="ll")
    torch.cuda.synchronize()
    check("after skipped call", bool((out == W).all()))
    # cost of the check
    for debug in ("1", "0"):
        os.environ["DITRON_DEBUG"] = debug
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            K.all_reduce(x[:1024], ctx, method="ll")
        torch.cuda.synchronize()
        print(f"rank {me}: all_reduce ll 1024 x fp16, DITRON_DEBUG={debug}: "
              f"{(time.perf_counter() - t0) / 50 * 1e6:.0f} us/call", flush=True)
    os.environ["DITRON_DEBUG"] = "1"
    # lint at the first JIT compilation.  The lint reads the ops recorded while Triton compiles the kernel; a
    # kernel found in Triton's on-disk cache (an earlier run on this machine, e.g. at another world size) is not
    # compiled again and not linted: compile into a fresh cache directory so that this is a first compilation
    import tempfile
    import lint_kernels as L
    data = ditron.symm_zeros((64,), torch.float32)
    flag = ditron.symm_zeros((1,), torch.int32)
    cache_dir = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"ditron-lint-rank{me}-")
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            L.relaxed_flag_producer.warmup(data, flag, 64, BLOCK=64, grid=(1,))
    finally:
        if cache_dir is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = cache_dir
    check("jit lint", any(issubclass(w.category, ditron.DitronLintWarning) and "[relaxed-signal]" in str(w.message)
                          for w in rec), str([str(w.message)[:80] for w in rec]))
    ditron.barrier_all()
    ditron.finalize()
    print(f"consistency rank {me}: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
