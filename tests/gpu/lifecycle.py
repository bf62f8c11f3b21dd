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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="p2p")
    ap.add_argument("--also", default=None)
    args = ap.parse_args()
    rank = int(__import__("os").environ.get("RANK", "0"))
    try:
        try:
            ditron.init(args.backend, device=0)
            check("wrong device rejected", False, "init with every rank on cuda:0 succeeded")
            ditron.finalize()
        except ditron.DitronError as e:
            check("wrong device rejected", "wrong device" in str(e) or rank == 0 and "wrong device" in str(e), str(e))
        torch.cuda.set_device(int(__import__("os").environ.get("LOCAL_RANK", "0")))
        seq = [args.backend, args.backend] + ([args.also, args.backend] if args.also else [args.backend])
        for i, b in enumerate(seq):
            one_world(b, i)
        mods = gpu.loaded_modules()
        check("descriptor modules registered", len(mods) >= 1, mods)
    except Exception as e:  # noqa: BLE001
        check("no exception", False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    print(f"lifecycle rank {rank}: {len(PASSED)} passed, {len(FAILED)} failed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
