"""Peer-to-peer bandwidth and signal latency on one node, side by side:

* SM-driven put / get: a ditron kernel that stores to / loads from a peer's
  symmetric buffer through ``dl.symm_at`` (a persistent grid; block size,
  warps and grid tuned in the run);
* the copy engine: ``ditron.rank_copy`` (``copy_`` between peer views);
* NCCL send/recv (``batch_isend_irecv``);
* the in-kernel signal round trip: ping-pong between two ranks inside one
  kernel (``dl.notify`` / ``dl.wait`` and ``shmem.signal_op`` /
  ``signal_wait_until``), timed with ``%globaltimer`` (no launch included).

Every rank moves data to the next rank (ring) at the same time, so all links
are busy; a figure is per rank, the slowest rank's median.  Each method is
checked against torch on fresh random data before it is timed.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
        torchrun --nproc-per-node 4 bench/p2p.py [--backend p2p] [--sizes 4M,64M,256M] [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch
import torch.distributed as tdist
import triton
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@ditron.jit
def sm_put(src, dst, n, peer, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    rdst = dl.symm_at(dst, peer)
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        tl.store(rdst + offs, tl.load(src + offs))


@ditron.jit
def sm_get(src, dst, n, peer, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    rsrc = dl.symm_at(src, peer)
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(rsrc + offs))


@ditron.jit
def sm_put_flat(src, dst, n, peer, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dl.symm_at(dst, peer) + offs, tl.load(src + offs))


@ditron.jit
def sm_get_flat(src, dst, n, peer, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(dl.symm_at(src, peer) + offs))


@ditron.jit
def sm_put_x2(src, dst, n, peer, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * 2 * BLOCK
    rdst = dl.symm_at(dst, peer)
    for start in range(pid * 2 * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        a = tl.load(src + offs)
        b = tl.load(src + offs + BLOCK)
        tl.store(rdst + offs, a)
        tl.store(rdst + offs + BLOCK, b)


@ditron.jit
def sm_get_x2(src, dst, n, peer, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * 2 * BLOCK
    rsrc = dl.symm_at(src, peer)
    for start in range(pid * 2 * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        a = tl.load(rsrc + offs)
        b = tl.load(rsrc + offs + BLOCK)
        tl.store(dst + offs, a)
        tl.store(dst + offs + BLOCK, b)


@ditron.jit
def pingpong_dl(flag, peer, iters, out, PING: tl.constexpr):
    t0 = _now()
    for i in range(iters):
        if PING:
            dl.notify(flag, peer, signal=i + 1, sig_op="set", comm_scope="intra_node")
            dl.wait(flag, 1, "sys", "acquire", waitValue=i + 1)
        else:
            dl.wait(flag, 1, "sys", "acquire", waitValue=i + 1)
            dl.notify(flag, peer, signal=i + 1, sig_op="set", comm_scope="intra_node")
    tl.store(out, _now() - t0)


@ditron.jit
def pingpong_shmem(sig, peer, iters, out, PING: tl.constexpr):
    t0 = _now()
    for i in range(iters):
        if PING:
            shmem.signal_op(sig, i + 1, shmem.NVSHMEM_SIGNAL_SET, peer)
            shmem.signal_wait_until(sig, shmem.NVSHMEM_CMP_EQ, i + 1)
        else:
            shmem.signal_wait_until(sig, shmem.NVSHMEM_CMP_EQ, i + 1)
            shmem.signal_op(sig, i + 1, shmem.NVSHMEM_SIGNAL_SET, peer)
    tl.store(out, _now() - t0)


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(s[:-1] if s[-1] in "KMG" else s) * mult


def time_op(fn, iters, warmup=3):
    """Median ms of ``fn`` on this rank (events around it, ranks aligned by a
    barrier before each iteration)."""
    times = []
    for i in range(warmup + iters):
        ditron.barrier_all()
        torch.cuda.synchronize()
        tdist.barrier(device_ids=[torch.cuda.current_device()])
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # keep the GPU busy while the host issues the work, so that host-side
        # launch overhead (Python, argument checks) stays out of the interval
        torch.cuda._sleep(200_000)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def slowest(x):
    out = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, x)
    return max(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="p2p")
    ap.add_argument("--sizes", default="4M,64M,256M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--pingpong-iters", type=int, default=10000)
    ap.add_argument("--tune-size", default="64M")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    biggest = max(sizes + [parse_size(args.tune_size)])
    os.environ.setdefault("DITRON_HEAP_SIZE", str(2 * biggest + (64 << 20)))
    world = ditron.init(args.backend)
    rank, n = world.rank, world.world_size
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    dev = world.device
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    say(f"# bench/p2p.py on {torch.cuda.get_device_name(dev)} x{n}, backend {world.backend}, torch {torch.__version__}, "
        f"triton {triton.__version__}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")

    src = ditron.symm_empty((biggest // 4,), torch.int32, name="bench_src")
    dst = ditron.symm_empty((biggest // 4,), torch.int32, name="bench_dst")
    local = torch.empty(biggest // 4, dtype=torch.int32, device=dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    results = {"device": torch.cuda.get_device_name(dev), "ranks": n, "backend": world.backend, "sizes": {}}

    def fill(seed, count):
        g = torch.Generator(device=dev)
        g.manual_seed(seed)
        src[:count].random_(-2**31, 2**31 - 1, generator=g)

    def expected(seed, count):
        g = torch.Generator(device=dev)
        g.manual_seed(seed)
        return torch.empty(count, dtype=torch.int32, device=dev).random_(-2**31, 2**31 - 1, generator=g)

    PUT = {"persistent": sm_put, "flat": sm_put_flat, "x2": sm_put_x2}
    GET = {"persistent": sm_get, "flat": sm_get_flat, "x2": sm_get_x2}

    def sm_run(direction, count, cfg, out=None):
        """cfg = (variant, BLOCK, num_warps, grid multiplier of the SM count; 0 = one program per block)."""
        variant, block, warps, mult = cfg
        kernel = (PUT if direction == "put" else GET)[variant]
        grid = triton.cdiv(count, block) if mult == 0 else mult * sms
        kernel[(grid,)](src, dst if out is None else out, count, nxt if direction == "put" else prv, BLOCK=block,
                        num_warps=warps)

    # -- correctness of each method, fresh random data --------------------------------
    count = parse_size(args.tune_size) // 4
    checks = {}
    for idx, name in enumerate(("sm_put", "sm_get", "ce_push", "ce_pull", "nccl")):
        seed = 1000 * idx + rank
        fill(seed, count)
        dst.fill_(-1)
        local.fill_(-1)
        ditron.barrier_all()
        torch.cuda.synchronize()
        tdist.barrier(device_ids=[torch.cuda.current_device()])
        if name == "sm_put":
            sm_run("put", count, ("x2", 4096, 8, 1))
            torch.cuda.synchronize()
            sm_run("put", count, ("flat", 8192, 8, 0))
        elif name == "sm_get":
            sm_run("get", count, ("x2", 4096, 8, 1), out=local)
            torch.cuda.synchronize()
            sm_run("get", count, ("flat", 8192, 8, 0), out=local)
        elif name == "ce_push":
            ditron.rank_copy(dst[:count], src[:count], dst_rank=nxt)
        elif name == "ce_pull":
            ditron.rank_copy(local[:count], src[:count], src_rank=prv)
        else:
            ops = [tdist.P2POp(tdist.isend, src[:count], nxt), tdist.P2POp(tdist.irecv, local[:count], prv)]
            for w in tdist.batch_isend_irecv(ops):
                w.wait()
        torch.cuda.synchronize()
        ditron.barrier_all()
        torch.cuda.synchronize()
        prv_seed = 1000 * idx + prv
        got = dst[:count] if name in ("sm_put", "ce_push") else local[:count]
        checks[name] = bool(torch.equal(got, expected(prv_seed, count)))
    bad = slowest(int(not all(checks.values())))
    say(f"correctness (fresh random int32, {count * 4 >> 20} MiB, ring): " +
        ", ".join(f"{k} {'ok' if v else 'WRONG'}" for k, v in checks.items()))
    if bad:
        say("a method returned wrong data; not timing")
        ditron.finalize()
        return 1

    # -- tune the SM kernels at the tuning size ------------------------------------------
    tune = {}
    configs = ([("flat", b, w, 0) for b in (8192, 16384) for w in (8, 16)] +
               [("persistent", 8192, w, m) for w in (8, 16) for m in (2, 4)] +
               [("x2", b, 16, m) for b in (4096, 8192) for m in (1, 2)])
    for direction in ("put", "get"):
        best = None
        for cfg in configs:
            out = None if direction == "put" else local
            ms = slowest(time_op(lambda: sm_run(direction, count, cfg, out), 5, warmup=2))
            if best is None or ms < best[0]:
                best = (ms, cfg)
        tune[direction] = best[1]
        say(f"tuned SM {direction}: variant={best[1][0]} BLOCK={best[1][1]} num_warps={best[1][2]} "
            f"grid={'n/BLOCK' if best[1][3] == 0 else f'{best[1][3]}x{sms} SMs'} "
            f"({count * 4 / best[0] / 1e6:.0f} GB/s at {count * 4 >> 20} MiB)")
    results["tuned"] = tune

    # -- bandwidth table -------------------------------------------------------------------
    say("\n| bytes per rank | SM put | SM get | copy engine push | copy engine pull | NCCL send/recv | SM put / CE push | SM get / CE pull |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        c = size // 4
        row = {}
        row["sm_put"] = slowest(time_op(lambda: sm_run("put", c, tune["put"]), args.iters))
        row["sm_get"] = slowest(time_op(lambda: sm_run("get", c, tune["get"], local), args.iters))
        row["ce_push"] = slowest(time_op(lambda: ditron.rank_copy(dst[:c], src[:c], dst_rank=nxt), args.iters))
        row["ce_pull"] = slowest(time_op(lambda: ditron.rank_copy(local[:c], src[:c], src_rank=prv), args.iters))

        def nccl():
            ops = [tdist.P2POp(tdist.isend, src[:c], nxt), tdist.P2POp(tdist.irecv, local[:c], prv)]
            for wk in tdist.batch_isend_irecv(ops):
                wk.wait()
        row["nccl"] = slowest(time_op(nccl, args.iters))
        gbs = {k: size / v / 1e6 for k, v in row.items()}
        results["sizes"][size] = {"ms": row, "GB/s": gbs}
        say(f"| {size >> 20} MiB | {gbs['sm_put']:.0f} GB/s | {gbs['sm_get']:.0f} GB/s | {gbs['ce_push']:.0f} GB/s | "
            f"{gbs['ce_pull']:.0f} GB/s | {gbs['nccl']:.0f} GB/s | {gbs['sm_put'] / gbs['ce_push']:.2f}x | "
            f"{gbs['sm_get'] / gbs['ce_pull']:.2f}x |")

    # -- in-kernel signal round trip -------------------------------------------------------
    peer = rank ^ 1
    it = args.pingpong_iters
    flag = ditron.symm_zeros((1,), torch.int32, name="pp_flag")
    sig = ditron.symm_zeros((1,), torch.uint64, name="pp_sig")
    out = torch.zeros(1, dtype=torch.int64, device=dev)
    rtt = {}
    for name, kernel, word in (("dl.notify/dl.wait", pingpong_dl, flag), ("shmem.signal_op/signal_wait_until",
                                                                         pingpong_shmem, sig)):
        samples = []
        for rep in range(3):
            word.zero_()
            ditron.barrier_all()
            torch.cuda.synchronize()
            tdist.barrier(device_ids=[torch.cuda.current_device()])
            kernel[(1,)](word, peer, it, out, PING=rank % 2 == 0)
            torch.cuda.synchronize()
            samples.append(out.item() / it)
        rtt[name] = slowest(min(samples) if rank % 2 == 0 else 0)
    results["round_trip_ns"] = rtt
    say(f"\nin-kernel signal round trip (ping-pong between rank pairs (0,1) and (2,3), {it} round trips inside one "
        "kernel, %globaltimer, best of 3, slowest pair):")
    for k, v in rtt.items():
        say(f"  {k}: {v / 1000:.2f} us per round trip")
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    ditron.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
