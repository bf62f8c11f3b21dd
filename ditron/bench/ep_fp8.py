"""``ditron bench ep --dtype fp8``: the low-latency fp8 payload (kernels/ep.py, ``use_fp8=True``).

    torchrun --standalone --nproc-per-node 1 -m ditron.bench ep --dtype fp8 --tokens 128 --mode low_latency --graph
    ditron sim -n 2 -m ditron.bench ep --dtype fp8 --tokens 4 --hidden 256 --topk 2 --iters 2 --warmup 1  # CPU

Per token count (hidden 7168, top-8 by default), in one run:

* ``ditron low_latency fp8``: dispatch with ``use_fp8=True`` (each row quantised to e4m3 with one fp32 scale
  per 128 channels in the dispatch kernel) + combine in bf16 of fixed expert outputs (identity experts: the
  dequantised rows, made once before the timing, as DeepEP's test times dispatch + combine);
* ``ditron low_latency bf16``: the same with the bf16 payload (the baseline of the speedup column);
* ``device_copy_fp8``: a device copy of the fp8 call's bytes (``T * k * (H + 4 * H / 128)`` dispatched and
  ``T * k * H * 2`` combined), the memory floor at one GPU; ``device_copy_bf16`` the same for bf16.

The goals (issue 55): fp8 faster than bf16, and within 1.2x its device copy; the table's notes give both
ratios.  Checks (before the timing): fp8 out = ``sum_j w[t, j] * dequant(quant(x[t]))`` (torch's quantiser,
kernels/ep.py ``fp8_quantize_reference``), bf16 out = ``x * sum(w)``.
"""
from __future__ import annotations

from .harness import Impl


def fp8_payload_bytes(tokens, H, k):
    """Bytes of one fp8 dispatch + bf16 combine: codes and scales out, bf16 rows back."""
    return tokens * k * (H + 4 * (H // 128)) + tokens * k * H * 2


def bf16_payload_bytes(tokens, H, k):
    return 2 * tokens * k * H * 2


def ep_fp8_impls(x, idx, w, world, E, check):
    """The impls at one token count: ``x [T, H]`` bf16, ``idx`` / ``w [T, k]`` (ditron/bench/moe.py's seeded
    inputs), ``E`` experts, ``check(ref)`` -> the check of an output against ``ref``."""
    import torch

    from ..kernels import ep
    dev = world.device
    tokens, H = x.shape
    k = idx.shape[1]
    if H % 128:
        raise SystemExit(f"ditron bench ep --dtype fp8: --hidden must be a multiple of 128 (got {H})")
    wsum = w.sum(1, keepdim=True)
    codes, scales = ep.fp8_quantize_reference(x.cpu())
    ref8 = (ep.fp8_dequantize(codes, scales).to(torch.bfloat16).float() * wsum.cpu()).to(dev)
    ref16 = x.float() * wsum
    impls = []
    ctx8 = ep.create_ep_context(tokens, H, E, k, torch.bfloat16, mode="low_latency", capacity=tokens)
    ctx16 = ep.create_ep_context(tokens, H, E, k, torch.bfloat16, mode="low_latency", capacity=tokens)
    # identity experts for the fp8 run: the dequantised rows, once (the layout is the same every call)
    (c8, s8), _, handle = ep.ep_dispatch(x, idx, w, ctx8, use_fp8=True)
    y8 = ep.fp8_dequantize(c8, s8).to(torch.bfloat16)        # rows past the counts: never read
    ep.ep_combine(y8, handle, ctx8)

    def run8():
        _, _, handle = ep.ep_dispatch(x, idx, w, ctx8, validate=False, use_fp8=True)
        return ep.ep_combine(y8, handle, ctx8)

    def run16():
        recv_x, _, handle = ep.ep_dispatch(x, idx, w, ctx16, validate=False)
        return ep.ep_combine(recv_x, handle, ctx16)
    impls.append(Impl("ditron low_latency fp8", run8, check(ref8)))
    impls.append(Impl("ditron low_latency bf16", run16, check(ref16)))
    if world.backend != "sim":
        for name, n in (("device_copy_fp8", fp8_payload_bytes(tokens, H, k)),
                        ("device_copy_bf16", bf16_payload_bytes(tokens, H, k))):
            src = torch.empty(n, dtype=torch.uint8, device=dev)
            dst = torch.empty(n, dtype=torch.uint8, device=dev)
            impls.append(Impl(name, lambda dst=dst, src=src: dst.copy_(src), None, f"copy of {n} bytes"))
    return impls


def goal_notes(res, label):
    """The issue's two ratios for one token count (``res``: measure's results by impl name)."""
    f, b, c = (res.get(n) for n in ("ditron low_latency fp8", "ditron low_latency bf16", "device_copy_fp8"))
    out = []
    if f and b and f["ok"] and b["ok"]:
        out.append(f"{label}: fp8 {f['us']:.1f} us vs bf16 {b['us']:.1f} us: {b['us'] / f['us']:.2f}x "
                   f"(goal > 1.00x: {'met' if f['us'] < b['us'] else 'NOT met'})")
    if f and c and f["ok"] and c["ok"]:
        r = f["us"] / c["us"]
        out.append(f"{label}: fp8 = {r:.2f}x the device copy of its bytes ({c['us']:.1f} us) "
                   f"(goal <= 1.20x: {'met' if r <= 1.2 else 'NOT met'})")
    return out
