"""``ditron bench ulysses``: Ulysses sequence-parallel attention
(kernels/ulysses.py: QKV GEMM + all-to-all, attention, all-to-all + o_proj)
against the same layer in torch in the same run.

    torchrun --standalone --nproc-per-node 1 -m ditron.bench ulysses --seq 8192 --hidden 4096
    ditron sim -n 2 -m ditron.bench ulysses --seq 32 --hidden 32 --heads 4/2 --head-dim 16 --iters 1 --warmup 1

``torch``: ``x @ w_qkv``, NCCL ``all_to_all_single`` (sequence shards -> head
shards; skipped at world size 1), SDPA (``--backend``: cudnn / flash; both are
timed), ``all_to_all_single`` back, ``@ w_o``.  Checked first (fresh random
inputs, against the torch layer), then timed with the harness.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .harness import Impl, add_run_args, measure, result_meta


def _a2a(send, world):
    """``all_to_all_single`` of ``send`` ``[W, ...]`` (NCCL; the simulator: through symmetric memory)."""
    import torch
    import torch.distributed as dist

    import ditron
    if world.world_size == 1:
        return send
    if dist.is_available() and dist.is_initialized():
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return recv
    with ditron.heap_scope():
        buf = ditron.symm_empty(tuple(send.shape), send.dtype, name="bench.a2a")
        buf.copy_(send)
        ditron.barrier_all()
        recv = torch.stack([ditron.peer_tensor(buf, s)[world.rank].clone() for s in range(world.world_size)])
        ditron.barrier_all()
    return recv


def torch_layer(x, wqkv, wo, HQ, HKV, D, causal, world, backend):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    S = x.shape[0]
    W = world.world_size
    HL, KL = HQ // W, HKV // W
    qkv = x @ wqkv
    q, k, v = qkv[:, :HQ * D], qkv[:, HQ * D:(HQ + HKV) * D], qkv[:, (HQ + HKV) * D:]
    # per destination rank: its q, k and v heads -> [W, S, (HL + 2 KL) * D]
    send = torch.cat([q.view(S, W, HL * D), k.view(S, W, KL * D), v.view(S, W, KL * D)], 2).transpose(0, 1)
    recv = _a2a(send.contiguous(), world)
    whole = recv.reshape(W * S, (HL + 2 * KL) * D)
    qh = whole[:, :HL * D].view(W * S, HL, D).transpose(0, 1)[None]
    kh = whole[:, HL * D:(HL + KL) * D].view(W * S, KL, D).transpose(0, 1)[None]
    vh = whole[:, (HL + KL) * D:].view(W * S, KL, D).transpose(0, 1)[None]
    with sdpa_kernel(getattr(SDPBackend, backend)):
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, enable_gqa=HL != KL)
    back = o[0].transpose(0, 1).reshape(W, S, HL * D).contiguous()      # [dst, S, HL*D]
    got = _a2a(back, world)
    return got.transpose(0, 1).reshape(S, HQ * D) @ wo


def main(argv):
    p = argparse.ArgumentParser(prog="ditron bench ulysses", description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", default="8192", help="whole sequence lengths (comma list; a multiple of the world size)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", default="32/8")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", choices=["both", "on", "off"], default="both")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    add_run_args(p)
    args = p.parse_args(argv)

    import torch

    import ditron
    from ..kernels import ulysses as U
    from .harness import _release, agree_fn
    world = ditron.init()
    W, r, dev = world.world_size, world.rank, world.device
    HQ, HKV = (int(h) for h in args.heads.split("/"))
    D, Hd = args.head_dim, args.hidden
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    cuda = str(dev).startswith("cuda")
    agree = agree_fn(world)
    rows = []
    for seq in (int(s) for s in args.seq.split(",") if s):
        S = seq // W
        for causal in {"both": (False, True), "on": (True,), "off": (False,)}[args.causal]:
            with ditron.heap_scope():
                g = torch.Generator().manual_seed(seq + int(causal))
                x_all = (torch.randn(W * S, Hd, generator=g) * 0.5).to(dtype)
                wqkv = (torch.randn(Hd, (HQ + 2 * HKV) * D, generator=g) / Hd ** 0.5).to(dtype).to(dev)
                wo = (torch.randn(HQ * D, Hd, generator=g) / (HQ * D) ** 0.5).to(dtype).to(dev)
                x = x_all[r * S:(r + 1) * S].contiguous().to(dev)
                del x_all
                ctx = U.create_ulysses_context(S, Hd, HQ, HKV, D, dtype)
                backends = ("CUDNN_ATTENTION", "FLASH_ATTENTION") if cuda else ("MATH",)
                ref = torch_layer(x.float() if not cuda else x, wqkv if cuda else wqkv.float(),
                                  wo if cuda else wo.float(), HQ, HKV, D, causal, world,
                                  "FLASH_ATTENTION" if cuda else "MATH")
                scale = ref.float().abs().max().item()

                def check(out, ref=ref, scale=scale):
                    err = (out.float() - ref.float()).abs().max().item()
                    if not err <= 3e-2 * scale + 1e-2:
                        raise AssertionError(f"max abs error {err:.3g} (scale {scale:.3g})")

                impls = [Impl("ditron", lambda: U.ulysses_attention(x, wqkv, wo, ctx, causal=causal), check)]
                for be in backends:
                    name = ("torch_" + ("nccl_a2a+" if W > 1 else "") + "sdpa_" + be.split("_")[0].lower())
                    impls.append(Impl(name, lambda be=be: torch_layer(x, wqkv, wo, HQ, HKV, D, causal, world, be),
                                      check))
                res = measure(impls, dev, warmup=args.warmup, iters=args.iters, barrier=ditron.barrier_all,
                              repeat=args.repeat, agree=agree)
                for impl in impls:
                    rr = res[impl.name]
                    rows.append({"seq": seq, "causal": causal, "impl": impl.name, "ok": rr["ok"],
                                 "error": rr["error"], "us": rr["us"] if rr["ok"] else float("nan")})
                del ctx
            _release(dev)
    if r == 0:
        command = "ditron bench ulysses " + " ".join(argv)
        meta = result_meta("ulysses", args.dtype, W, dev, args.machine, command)
        lines = ["| seq | causal | impl | us | x torch (cuDNN) | check |", "| --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            base = next((b for b in rows if b["seq"] == row["seq"] and b["causal"] == row["causal"]
                         and b["impl"].endswith("cudnn") and b["ok"]), None)
            ratio = base["us"] / row["us"] if base and row["ok"] else float("nan")
            ok = "ok" if row["ok"] else f"FAILED: {row['error'][:120]}"
            lines.append(f"| {row['seq']} | {row['causal']} | {row['impl']} | {row['us']:.0f} | {ratio:.2f} | {ok} |")
        md = [f"### Ulysses attention layer, hidden {Hd}, {args.heads} heads, head dim {D}, {args.dtype}, {W} rank(s) "
              f"({args.machine}, {meta['date']})", "", f"Command: `{command}`", "", "\n".join(lines), ""]
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{args.tag or args.machine.replace(' ', '_')}-ulysses-w{W}")
        with open(stem + ".md", "w") as f:
            f.write("\n".join(md))
        with open(stem + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
        print("\n".join(md))
        print(f"wrote {stem}.md, {stem}.json")
    bad = [row for row in rows if not row["ok"] and row["impl"] == "ditron"]
    ditron.finalize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
