"""Copy-engine bandwidth between peers on one node: 64 MiB copies through
torch ``copy_`` and ``cuMemcpyAsync`` (ditron's ``rank_copy``), one peer, three
peers in parallel (a stream each) and three in sequence; slowest rank, mean of
10 back-to-back copies after one warm-up.

    DITRON_HEAP_SIZE=1G torchrun --standalone --nproc-per-node 4 bench/copy_engine.py
"""
import torch
import torch.distributed as dist

import ditron
from ditron.runtime import gpu_driver


def main():
    world = ditron.init("p2p")
    R, W, dev = world.rank, world.world_size, world.device
    n = 64 << 20
    buf = ditron.symm_empty((n,), torch.uint8)
    buf.fill_(R)
    loc = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(W)]
    peers = [(R + k) % W for k in range(1, W)]
    pv = {p: ditron.peer_tensor(buf, p) for p in peers}
    streams = [torch.cuda.Stream() for _ in peers]
    cs = torch.cuda.current_stream()

    def timed(fn, it=10):
        fn()
        torch.cuda.synchronize()
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(it):
            fn()
        b.record()
        torch.cuda.synchronize()
        t = torch.tensor([a.elapsed_time(b) * 1e3 / it], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def par(copy, push=False):
        def f():
            for s in streams:
                s.wait_stream(cs)
            for s, p, lo in zip(streams, peers, loc):
                with torch.cuda.stream(s):
                    copy(pv[p], lo, s) if push else copy(lo, pv[p], s)
            for s in streams:
                cs.wait_stream(s)
        return f

    def tc(d, s_, st):
        d.copy_(s_)

    def dc(d, s_, st):
        gpu_driver.memcpy_async(d.data_ptr(), s_.data_ptr(), n, st.cuda_stream)

    p0 = peers[0]
    res = {
        "pull1 torch": timed(lambda: loc[0].copy_(pv[p0])),
        "pull1 driver": timed(lambda: gpu_driver.memcpy_async(loc[0].data_ptr(), pv[p0].data_ptr(), n,
                                                              cs.cuda_stream)),
        "push1 torch": timed(lambda: pv[peers[-1]].copy_(loc[0])),
        "push1 driver": timed(lambda: gpu_driver.memcpy_async(pv[peers[-1]].data_ptr(), loc[0].data_ptr(), n,
                                                              cs.cuda_stream)),
        "pull3 par torch": timed(par(tc)),
        "pull3 par driver": timed(par(dc)),
        "push3 par torch": timed(par(tc, True)),
        "pull3 seq torch": timed(lambda: [lo.copy_(pv[p]) for p, lo in zip(peers, loc)]),
    }
    if R == 0:
        for k, v in res.items():
            nb = n * (3 if "3" in k else 1)
            print(f"{k}: {v:.0f} us, {nb / v / 1e3:.0f} GB/s")
    ditron.finalize()


if __name__ == "__main__":
    main()
