"""GPU diagnosis of tests/test_ep.py's small cases failing on rank 1 at 2 ranks sharing one H100 (2026-12-07g):
the LL capacity overflow (capacity 1, every pair on expert 0) and ids out of range (normal mode), each a few times
on fresh contexts, with hidden 8 and 4104, printing per rank what combine returned against the reference and what
the handle says.
    DITRON_RANKS_PER_GPU=2 torchrun --standalone --nproc-per-node 2 bench/diag/ep_small_w2.py"""
import torch

import ditron
from ditron.kernels import ep

world = ditron.init()
me, W, dev = world.rank, world.world_size, world.device


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rand(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 0.5).to(dtype)


def show(label, out, ref, extra):
    out = out.float().cpu()
    err = (out - ref).abs().max().item()
    ok = err <= 2e-2 * (ref.abs().max().item() + 1e-6) + 1e-2
    rows = [] if ok else [(i, out[i, :4].tolist(), ref[i, :4].tolist()) for i in range(out.shape[0])
                          if (out[i] - ref[i]).abs().max() > 1e-2]
    print(f"rank {me} {label}: {'ok' if ok else 'WRONG'} err {err:.4f} {extra} {rows[:4]}", flush=True)
    return ok


bad = 0
for H in ((8, 4104) if torch.cuda.is_available() else (8, 24)):
    for rep in range(3):
        with ditron.heap_scope():
            # LL overflow: capacity 1, every pair of every rank on expert 0 (rank 0's)
            ctx = ep.create_ep_context(4, H, W, 2, torch.bfloat16, mode="low_latency", capacity=1)
            x = rand((4, H), 3 + 7 * me + rep, torch.bfloat16).to(dev)
            idx = torch.zeros(4, 2, dtype=torch.int64, device=dev)
            w = torch.ones(4, 2, device=dev)
            recv_x, counts, h = ep.ep_dispatch(x, idx, w, ctx)
            sync()
            out = ep.ep_combine(recv_x.clone(), h, ctx)
            sync()
            ref = torch.zeros(4, H)
            ref[0] = x[0].float().cpu()
            # rank 0 owns expert 0: recv_x[0] rows 0 / 1 are rank 0's / rank 1's token 0 (slot 0 each); the
            # handle's slots (pslot: rank among the earlier pairs of the expert) should be 0, 1, ..., 7
            bad += not show(f"H={H} rep {rep} LL overflow", out, ref,
                            f"counts {counts.cpu().tolist()} dropped {h.dropped.cpu().tolist()} "
                            f"lrc {h.lrc.cpu().tolist()} pslot {h.pslot.cpu().tolist()[:8]} "
                            f"recv {recv_x[0, :2, :4].float().cpu().tolist()} x0 {x[0, :4].float().cpu().tolist()}")
            ditron.barrier_all()
        with ditron.heap_scope():
            E = 2 * W
            ctx = ep.create_ep_context(3, H, E, 2, torch.float16)
            x = rand((3, H), 5 + 7 * me + rep, torch.float16).to(dev)
            idx = torch.tensor([[0, 1], [E, 1], [-1, E - 1]], device=dev)
            w = torch.ones(3, 2, device=dev)
            recv_x, counts, h = ep.ep_dispatch(x, idx, w, ctx, validate=False)
            sync()
            out = ep.ep_combine(recv_x, h, ctx)
            sync()
            ref = x.float().cpu().clone()
            ref[0] *= 2
            bad += not show(f"H={H} rep {rep} normal invalid ids", out, ref,
                            f"counts {counts.cpu().tolist()} dropped {h.dropped.cpu().tolist()} "
                            f"pos {h.pos.cpu().tolist()[:6]} rc {h.rc.cpu().tolist()}")
            ditron.barrier_all()
print(f"rank {me}: {bad} wrong", flush=True)
ditron.finalize()
