"""The Qwen3-8B-shaped TP decoder megakernel (36 layers, random weights) on
GPUs against the torch reference (NCCL all-reduce): eager launches of
``mk.step()`` for ``--steps`` steps, then CUDA-graph replays of the
megakernel against CUDA-graph replays of the reference, every step on a
fresh input, the KV cache compared at the appended positions.

    torchrun --standalone --nproc-per-node 2 tests/gpu/decoder_8b.py --backend p2p
    torchrun --standalone --nproc-per-node 1 tests/gpu/decoder_8b.py --ctx 4096 --batch 4
    ditron sim -n 2 tests/gpu/decoder_8b.py --config tiny --ctx 33     # CPU smoke run (no CUDA graphs)
"""
import argparse
import sys

import torch

import ditron
from ditron.kernels.decoder import qwen3_8b, tiny
from ditron.kernels.decoder import run as R
from ditron.kernels.decoder.reference import graph_replay
from ditron.kernels.decoder.weights import make_input


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="auto")
    p.add_argument("--config", choices=["8b", "tiny"], default="8b")
    p.add_argument("--layers", type=int, default=0, help="override the number of layers (8b: 36)")
    p.add_argument("--heads", default="", help="override the heads as Q,KV (e.g. 6,3 for 3 ranks with tiny)")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--scheduler", default="round_robin")
    args = p.parse_args()
    world = ditron.init(args.backend)
    cfg = {"8b": qwen3_8b, "tiny": tiny}[args.config]()
    if args.layers:
        cfg = cfg.with_(n_layers=args.layers)
    if args.heads:
        q, kv = (int(v) for v in args.heads.split(","))
        cfg = cfg.with_(n_q_heads=q, n_kv_heads=kv)
    s = R.setup(cfg, world, args.batch, args.ctx, max_ctx=args.ctx + 4 * args.steps + 8)
    dm = R.megakernel(s, scheduler=args.scheduler)
    ref = R.reference(s)
    fails = []
    tag = f"[rank {world.rank}/{world.world_size} {world.backend}]"
    for step in range(args.steps):
        ok, err, scale = R.check_step(dm, ref, cfg, args.batch, step, world.device)
        print(f"{tag} eager step {step}: {'ok' if ok else 'MISMATCH'} (max abs err {err:.3g}, scale {scale:.3g})",
              flush=True)
        if not ok:
            fails.append(f"eager step {step}")
    # CUDA graphs: both sides replay their captured step on a static input buffer
    cuda = str(world.device).startswith("cuda")
    if cuda:
        x_ref = torch.zeros_like(dm.buf.x)
        mk_replay = graph_replay(dm.step)
        import torch.distributed as tdist
        if world.world_size > 1 and tdist.is_initialized() and tdist.get_backend() == "gloo":
            # ranks that share a GPU: the reference all-reduces through gloo, which a CUDA graph cannot capture;
            # the megakernel's graph replays are checked against eager reference steps instead
            print(f"{tag} ranks share a GPU (gloo control plane): graph replays checked against eager reference "
                  "steps", flush=True)
            ref_replay = lambda: ref.step(x_ref)          # noqa: E731
        else:
            ref_replay = ref.graphed(x_ref)
        dm.buf.seq.copy_(ref.seq)       # the megakernel's capture warm-up ran one step; the reference restored its own
    else:
        print(f"{tag} no CUDA: graph replays skipped", flush=True)
    for step in range(args.steps if cuda else 0):
        x = make_input(cfg, args.batch, 100 + step).to(world.device)
        dm.buf.x.copy_(x)
        x_ref.copy_(x)
        y, r = mk_replay().float(), ref_replay().float()
        err, scale = (y - r).abs().max().item(), r.abs().max().item()
        ok = err <= R.REL * scale + R.ABS and int(dm.seq[0]) == int(ref.seq[0])
        print(f"{tag} graph step {step}: {'ok' if ok else 'MISMATCH'} (max abs err {err:.3g}, seq {int(dm.seq[0])})",
              flush=True)
        if not ok:
            fails.append(f"graph step {step}")
    n = int(dm.seq[0])
    kd, vd = ((a[:, :, :, args.ctx:n].float().cpu() - b[:, :, :, args.ctx:n].float().cpu()).abs().max().item()
              for a, b in ((s.k_cache, ref.k_cache), (s.v_cache, ref.v_cache)))
    print(f"{tag} appended KV positions {args.ctx}..{n - 1}: max abs diff k {kd:.3g}, v {vd:.3g}", flush=True)
    if not (kd <= 0.125 and vd <= 0.125):     # a few bf16 ulps at |k|, |v| <= 8
        fails.append("kv cache")
    ditron.finalize()
    print(f"{tag} decoder_8b: {'PASS' if not fails else 'FAIL: ' + ', '.join(fails)}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
