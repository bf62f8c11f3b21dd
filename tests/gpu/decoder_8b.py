"""The Qwen3-8B-shaped TP decoder megakernel (36 layers, random weights) on
GPUs against the torch reference (NCCL all-reduce), at one or more batch sizes
(``--batch 1,4,16``), ragged contexts (``--ragged``: sequence ``b`` has
``ctx - (37 b) mod (ctx/2 + 1)`` positions) in a paged KV cache
(``--page-size``, default 16; pages handed out in a shuffled order): eager
launches of ``mk.step()`` for ``--steps`` steps, then CUDA-graph replays of
the megakernel against CUDA-graph replays of the reference, every step on a
fresh input, the KV cache compared at every sequence's appended positions
(read through the block table).  The weights are built once for all batches.

    torchrun --standalone --nproc-per-node 1 tests/gpu/decoder_8b.py --batch 1,4,16 --ragged
    torchrun --standalone --nproc-per-node 2 tests/gpu/decoder_8b.py --backend p2p
    ditron sim -n 2 tests/gpu/decoder_8b.py --config tiny --ctx 33 --batch 1,3 --ragged   # CPU smoke run

Prints one ``decoder_8b: PASS`` line per rank at the end (``FAIL: ...`` naming the batch and check otherwise);
``--out FILE`` (default ``$OUT/decoder_8b.txt`` when ``OUT`` is set) also writes rank 0's lines there.
"""
import argparse
import os
import sys

import torch

import ditron
from ditron.kernels.decoder import qwen3_8b, tiny
from ditron.kernels.decoder import run as R
from ditron.kernels.decoder.reference import graph_replay
from ditron.kernels.decoder.weights import make_input


def check_batch(cfg, world, weights, batch, args, say):
    """Eager and graph steps at one batch size; returns the failed checks."""
    ctx = R.ragged(args.ctx, batch) if args.ragged else args.ctx
    s = R.setup(cfg, world, batch, ctx, max_ctx=args.ctx + 4 * args.steps + 8, page_size=args.page_size,
                weights=weights)
    dm = R.megakernel(s, scheduler=args.scheduler)
    ref = R.reference(s)
    fails = []
    res = dm.mk.resources
    say(f"batch {batch}: contexts {s.ctx}, page size {s.page_size}, {s.cache.num_pages} pages, {dm.mk.num_programs} "
        f"programs" + (f", {res['n_regs']} registers ({res['n_spills']} spilled)" if res else ""))
    for step in range(args.steps):
        ok, err, scale = R.check_step(dm, ref, cfg, batch, step, world.device)
        say(f"batch {batch} eager step {step}: {'ok' if ok else 'MISMATCH'} (max abs err {err:.3g}, scale {scale:.3g})")
        if not ok:
            fails.append(f"batch {batch} eager step {step}")
    # CUDA graphs: both sides replay their captured step on a static input buffer
    cuda = str(world.device).startswith("cuda")
    if cuda:
        x_ref = torch.zeros_like(dm.buf.x)
        mk_replay = graph_replay(dm.step)
        import torch.distributed as tdist
        if world.world_size > 1 and tdist.is_initialized() and tdist.get_backend() == "gloo":
            # ranks that share a GPU: the reference all-reduces through gloo, which a CUDA graph cannot capture;
            # the megakernel's graph replays are checked against eager reference steps instead
            say("ranks share a GPU (gloo control plane): graph replays checked against eager reference steps")
            ref_replay = lambda: ref.step(x_ref)          # noqa: E731
        else:
            ref_replay = ref.graphed(x_ref)
        dm.buf.seq.copy_(ref.seq)       # the megakernel's capture warm-up ran one step; the reference restored its own
    else:
        say("no CUDA: graph replays skipped")
    for step in range(args.steps if cuda else 0):
        x = make_input(cfg, batch, 100 + step).to(world.device)
        dm.buf.x.copy_(x)
        x_ref.copy_(x)
        y, r = mk_replay().float(), ref_replay().float()
        err, scale = (y - r).abs().max().item(), r.abs().max().item()
        ok = err <= R.REL * scale + R.ABS and dm.seq.cpu().tolist() == ref.seq.cpu().tolist()
        say(f"batch {batch} graph step {step}: {'ok' if ok else 'MISMATCH'} (max abs err {err:.3g}, "
            f"seq {dm.seq.cpu().tolist()[:4]}...)")
        if not ok:
            fails.append(f"batch {batch} graph step {step}")
    seq = dm.seq.cpu().tolist()
    kd = vd = 0.0
    for b in range(batch):
        for which in ("k", "v"):
            for layer in (0, cfg.n_layers - 1):
                a = s.cache.positions(which, layer, b, s.ctx[b], seq[b]).float().cpu()
                c = ref.cache.positions(which, layer, b, s.ctx[b], seq[b]).float().cpu()
                d = (a - c).abs().max().item() if a.numel() else 0.0
                kd, vd = (max(kd, d), vd) if which == "k" else (kd, max(vd, d))
    say(f"batch {batch} appended KV positions (first and last layer, every sequence): max abs diff k {kd:.3g}, "
        f"v {vd:.3g}")
    if not (kd <= 0.125 and vd <= 0.125):     # a few bf16 ulps at |k|, |v| <= 8
        fails.append(f"batch {batch} kv cache")
    del dm, ref, s
    if cuda:
        torch.cuda.empty_cache()
    return fails


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="auto")
    p.add_argument("--config", choices=["8b", "tiny"], default="8b")
    p.add_argument("--layers", type=int, default=0, help="override the number of layers (8b: 36)")
    p.add_argument("--heads", default="", help="override the heads as Q,KV (e.g. 6,3 for 3 ranks with tiny)")
    p.add_argument("--ctx", type=int, default=512, help="context of the first sequence (all with --ragged off)")
    p.add_argument("--batch", default="1", help="batch sizes, comma list (e.g. 1,4,16)")
    p.add_argument("--ragged", action="store_true", help="per-sequence contexts (see the module doc)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--scheduler", default="round_robin")
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "decoder_8b.txt") if os.environ.get("OUT")
                   else None, help="also write rank 0's lines to this file")
    args = p.parse_args()
    batches = [int(b) for b in args.batch.split(",") if b]
    world = ditron.init(args.backend)
    cfg = {"8b": qwen3_8b, "tiny": tiny}[args.config]()
    if args.layers:
        cfg = cfg.with_(n_layers=args.layers)
    if args.heads:
        q, kv = (int(v) for v in args.heads.split(","))
        cfg = cfg.with_(n_q_heads=q, n_kv_heads=kv)
    tag = f"[rank {world.rank}/{world.world_size} {world.backend}]"
    lines = []

    def say(text):
        print(f"{tag} {text}", flush=True)
        lines.append(f"{tag} {text}")
    from ditron.kernels.decoder.weights import make_weights
    weights = make_weights(cfg, world.rank, world.world_size, device=world.device)
    fails = []
    for batch in batches:
        with ditron.heap_scope():          # each batch's symmetric buffers (the all-reduce pools) freed after it
            fails += check_batch(cfg, world, weights, batch, args, say)
    ditron.finalize()
    say(f"decoder_8b (batch {args.batch}{', ragged' if args.ragged else ''}, page size {args.page_size}): "
        f"{'PASS' if not fails else 'FAIL: ' + ', '.join(fails)}")
    if args.out and world.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
