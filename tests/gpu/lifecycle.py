"""init / finalize repeated in one process, the world descriptor rewritten on
each init (a kernel loaded in an earlier world must see the new heaps), clear
errors for a wrong device, and a clean exit.

    torchrun --nproc-per-node 4 tests/gpu/lifecycle.py --backend p2p [--also nvshmem]
"""
import argparse
import sys
import traceback

import torch
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.runtime import gpu

PASSED, FAILED = [], []


def check(name, cond, detail=""):
    (PASSED if cond else FAILED).append(name)
    if not cond:
        print(f"lifecycle FAILED {name}: {detail}", flush=True)


@ditron.jit
def k_read_next(x, out, BLOCK: tl.constexpr):
    nxt = (dl.rank() + 1) % dl.num_ranks()
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(dl.symm_at(x + offs, nxt)))


def one_world(backend, i):
    w = ditron.init(backend)
    check(f"backend {backend} #{i}", w.backend == backend, str(w))
    rank, n = w.rank, w.world_size
    # allocations move between worlds: a different heap offset each time
    pad = ditron.symm_empty((4096 * (i + 1),), torch.uint8, name="pad")
    x = ditron.symm_empty((256,), torch.int32, name="x")
    x.copy_(torch.arange(256, dtype=torch.int32, device=w.device) + 1000 * rank + 100000 * i)
    out = torch.full((256,), -1, dtype=torch.int32, device=w.device)
    ditron.barrier_all()
    k_read_next[(1,)](x, out, BLOCK=256)
    torch.cuda.synchronize()
    nxt = (rank + 1) % n
    expect = torch.arange(256, dtype=torch.int32, device=w.device) + 1000 * nxt + 100000 * i
    check(f"symm_at after init #{i} ({backend})", torch.equal(out, expect), out[:4].tolist())
    ditron.barrier_all()
    del pad
    ditron.finalize()


def expect_error(name, fn, *needles):
    try:
        fn()
        check(name, False, "no error")
        ditron.finalize()
    except ditron.DitronError as e:
        missing = [n for n in needles if n not in str(e)]
        check(name, not missing, f"missing {missing} in: {e}")
    torch.cuda.set_device(own_device())


def own_device():
    import os
    per = int(os.environ.get("DITRON_RANKS_PER_GPU", "1") or 1)
    return int(os.environ.get("LOCAL_RANK", "0")) // per


def wrong_device_rejected(backend):
    """Bad devices are errors before anything starts, at every world size (after the worlds above, so that the
    process group is the one this job's sharing mode chose)."""
    import os
    n = int(os.environ.get("WORLD_SIZE", "1"))
    shared = n > 1 and int(os.environ.get("DITRON_RANKS_PER_GPU", "1") or 1) > 1
    expect_error("device that does not exist rejected", lambda: ditron.init(backend, device=torch.cuda.device_count()),
                 "does not exist")
    expect_error("ranks_per_gpu=0 rejected", lambda: ditron.init(backend, ranks_per_gpu=0), "at least 1")
    if n > 1:
        # every rank on cuda:0 without the opt-in (explicitly 1 rank per GPU): the wrong-device error, which names
        # the opt-in as the way to share a GPU on purpose
        expect_error("wrong device rejected", lambda: ditron.init(backend, device=0, ranks_per_gpu=1),
                     "wrong device", "DITRON_RANKS_PER_GPU")
    if shared:
        expect_error("nvshmem refused on a shared GPU", lambda: ditron.init("nvshmem"), "backend='p2p'")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="p2p")
    ap.add_argument("--also", default=None)
    args = ap.parse_args()
    rank = int(__import__("os").environ.get("RANK", "0"))
    try:
        seq = [args.backend, args.backend] + ([args.also, args.backend] if args.also else [args.backend])
        for i, b in enumerate(seq):
            one_world(b, i)
        mods = gpu.loaded_modules()
        check("descriptor modules registered", len(mods) >= 1, mods)
        wrong_device_rejected(args.backend)
    except Exception as e:  # noqa: BLE001
        check("no exception", False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    print(f"lifecycle rank {rank}: {len(PASSED)} passed, {len(FAILED)} failed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
