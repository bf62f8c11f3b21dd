"""``ditron bench ep --dtype fp8``: the low-latency fp8 payload (kernels/ep.py, ``use_fp8=True``).

    torchrun --standalone --nproc-per-node 1 -m ditron.bench ep --dtype fp8 --tokens 128 --mode low_latency --graph
    ditron sim -n 2 -m ditron.bench ep --dtype fp8 --tokens 4 --hidden 256 --topk 2 --iters 2 --warmup 1  # CPU

Per token count (hidden 7168, top-8 by default), in one run:

* ``ditron low_latency fp8``: dispatch with ``use_fp8=True`` (each row quantised to e4m3 with one fp32 scale
  per 128 channels in the dispatch kernel) + combine in bf16 of fixed expert outputs (identity experts: the
  dequantised rows, made once before the timing, as DeepEP's test times dispatch + combine);
* ``ditron low_latency fp8 prequant`` / ``fp8 once``: the same with ``EpContext.ll_fp8_prequant`` (each token
  quantised once by its own kernel, the dispatch moving words) / ``ll_fp8_once`` (each token of a dispatch block
  quantised once, in the dispatch);
* ``ditron low_latency bf16``: the same with the bf16 payload (the baseline of the speedup column);
* ``device_copy_fp8``: a device copy of the fp8 call's bytes (``T * k * (H + 4 * H / 128)`` dispatched and
  ``T * k * H * 2`` combined), the memory floor at one GPU; ``device_copy_bf16`` the same for bf16.

The goals (issue 55): fp8 faster than bf16, and within 1.2x its device copy; the table's notes give both
ratios.  Checks (before the timing, every element; :func:`combine_check`): the op against its exact semantics
-- ``out[t] = sum_j w[t, j] * y[row(t, j)]`` in fp32, rounded once to bf16, where ``y`` (identity experts) is
``bf16(dequant(quant(x)))`` with torch's quantiser (kernels/ep.py ``fp8_quantize_reference``) for fp8 and
``x`` for bf16 -- within half a bf16 ulp; and for fp8 the round trip against the exact ``x * sum_j w[t, j]``
within the documented bound (kernels/ep.py ``fp8_round_trip_bound``: ``2^-4 |x| + 2^-9 scale`` per element,
plus the bf16 roundings of the expert rows and of the output).
"""
from __future__ import annotations

from .harness import Impl


def fp8_payload_bytes(tokens, H, k):
    """Bytes of one fp8 dispatch + bf16 combine: codes and scales out, bf16 rows back."""
    return tokens * k * (H + 4 * (H // 128)) + tokens * k * H * 2


def bf16_payload_bytes(tokens, H, k):
    return 2 * tokens * k * H * 2


def combine_check(x, w, fp8, what):
    """``check(out)`` of a dispatch + combine through identity experts of ``x [T, H]`` with weights ``w [T, k]``
    (see the module docstring): an ``AssertionError`` that says how many elements are beyond the bound, the
    worst of them and its bound."""
    import torch

    from ..kernels import ep
    xc = x.detach().float().cpu()
    wsum = w.detach().float().cpu().sum(1, keepdim=True)
    if fp8:
        codes, scales = ep.fp8_quantize_reference(x.detach().cpu())
        deq = ep.fp8_dequantize(codes, scales)
        rows = deq.to(torch.bfloat16).float()
        # |rows - x| <= the round trip + the bf16 rounding of the expert rows (half an ulp: 2^-8 relative)
        trip = wsum * (ep.fp8_round_trip_bound(xc, scales) + deq.abs() * 2.0 ** -8)
    else:
        rows, trip = xc, None
    ref = rows * wsum
    # the output's bf16 rounding (half an ulp) and the fp32 sums of k products in another order
    bound = ref.abs() * (2.0 ** -8 + 2.0 ** -20 * w.shape[1]) + 1e-30

    def verdict(err, bnd, against):
        bad = err > bnd
        if bool(bad.any()):
            i = int(torch.argmax((err / bnd).flatten()))
            t, c = divmod(i, err.shape[1])
            raise AssertionError(f"{what}: {int(bad.sum())} of {err.numel()} elements beyond the bound against "
                                 f"{against}; worst [token {t}, channel {c}]: error {err[t, c].item():.4g} > "
                                 f"{bnd[t, c].item():.4g} (max abs error {err.max().item():.3g}, output scale "
                                 f"{ref.abs().max().item():.3g})")

    def check(out):
        got = out.detach().float().cpu()
        assert tuple(got.shape) == tuple(ref.shape), (what, tuple(got.shape))
        assert torch.isfinite(got).all(), f"{what}: non-finite output"
        verdict((got - ref).abs(), bound, "sum_j w * y[row] (half a bf16 ulp)")
        if trip is not None:
            verdict((got - xc * wsum).abs(), bound + trip, "x * sum_j w (the fp8 round-trip bound)")
    return check


def dispatch_check(x, idx, E, codes, scales):
    """World size 1: what the first fp8 dispatch received against torch's quantiser (expert ``e``'s rows are
    the tokens routed to it, in token order): None if every code and scale is exact, else what differs."""
    import torch

    from ..kernels import ep
    qc, qs = ep.fp8_quantize_reference(x.detach().cpu())
    codes, scales, idx = codes.cpu(), scales.cpu(), idx.cpu()
    for e in range(E):
        toks = (idx == e).any(1).nonzero().flatten()
        n = toks.numel()
        got, want = codes[e, :n].view(torch.uint8), qc[toks].view(torch.uint8)
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            rows = (got != want).any(1).nonzero().flatten()
            # decisive for the next log: rounding (codes one step apart, the rows' scales equal) or placement (a
            # row that is another token's, or stale)
            steps = (got.int() - want.int()).abs()[got != want]
            r0 = rows[0].item()
            other = [t for t in range(qc.shape[0]) if torch.equal(got[r0], qc[t].view(torch.uint8))]
            same = "equal" if torch.equal(scales[e, rows], qs[toks[rows]]) else "differ"
            return (f"fp8 dispatch: expert {e} received {bad.shape[0]} e4m3 codes that differ from torch's quantiser "
                    f"(first at [row {bad[0, 0].item()}, channel {bad[0, 1].item()}]; {rows.numel()} of {n} rows, "
                    f"e.g. {rows[:12].tolist()}; {int((steps == 1).sum())} one code step apart, at most "
                    f"{steps.max().item()}; the scales of those rows {same}; "
                    f"row {r0} (token {toks[r0].item()}) is the quantised row of tokens {other[:4]})")
        if not torch.equal(scales[e, :n], qs[toks]):
            return f"fp8 dispatch: expert {e} received scales that differ from torch's quantiser"
    return None


def ep_fp8_impls(x, idx, w, world, E, traced=None):
    """The impls at one token count: ``x [T, H]`` bf16, ``idx`` / ``w [T, k]`` (ditron/bench/moe.py's seeded
    inputs), ``E`` experts; ``traced`` (``--trace``): a list that receives ``(mode, ctx, run)`` of the fp8 and the
    bf16 low-latency round trips."""
    import torch

    from ..kernels import ep
    dev = world.device
    tokens, H = x.shape
    k = idx.shape[1]
    if H % 128:
        raise SystemExit(f"ditron bench ep --dtype fp8: --hidden must be a multiple of 128 (got {H})")
    impls = []

    def fp8_impl(name, prequant, once=False):
        ctx8 = ep.create_ep_context(tokens, H, E, k, torch.bfloat16, mode="low_latency", capacity=tokens)
        ctx8.ll_fp8_prequant = prequant
        ctx8.ll_fp8_once = once
        # identity experts for the fp8 run: the dequantised rows, once (the layout is the same every call)
        (c8, s8), _, handle = ep.ep_dispatch(x, idx, w, ctx8, use_fp8=True)
        y8 = ep.fp8_dequantize(c8, s8).to(torch.bfloat16)        # rows past the counts: never read
        ep.ep_combine(y8, handle, ctx8)
        first = dispatch_check(x, idx, E, c8, s8) if world.world_size == 1 else None

        def run8():
            _, _, handle = ep.ep_dispatch(x, idx, w, ctx8, validate=False, use_fp8=True)
            return ep.ep_combine(y8, handle, ctx8)
        check8 = combine_check(x, w, True, f"{name} dispatch + combine")

        def check_fp8(out):
            if first:
                raise AssertionError(first)
            check8(out)
        impls.append(Impl(name, run8, check_fp8))
        return ctx8, run8
    # the default (each pair's row quantised by the dispatch) and ll_fp8_prequant (each token once, then words)
    ctx8, run8 = fp8_impl("ditron low_latency fp8", False)
    ctxp, runp = fp8_impl("ditron low_latency fp8 prequant", True)
    ctxo, runo = fp8_impl("ditron low_latency fp8 once", False, True)      # ll_fp8_once: each token of a block once
    ctx16 = ep.create_ep_context(tokens, H, E, k, torch.bfloat16, mode="low_latency", capacity=tokens)

    def run16():
        recv_x, _, handle = ep.ep_dispatch(x, idx, w, ctx16, validate=False)
        return ep.ep_combine(recv_x, handle, ctx16)
    impls.append(Impl("ditron low_latency bf16", run16, combine_check(x, w, False, "bf16 dispatch + combine")))
    if traced is not None:
        traced += [("low_latency fp8", ctx8, run8), ("low_latency fp8 prequant", ctxp, runp),
                   ("low_latency fp8 once", ctxo, runo),
                   ("low_latency bf16", ctx16, run16)]
    if world.backend != "sim":
        for name, n in (("device_copy_fp8", fp8_payload_bytes(tokens, H, k)),
                        ("device_copy_bf16", bf16_payload_bytes(tokens, H, k))):
            src = torch.empty(n, dtype=torch.uint8, device=dev)
            dst = torch.empty(n, dtype=torch.uint8, device=dev)
            impls.append(Impl(name, lambda dst=dst, src=src: dst.copy_(src), None, f"copy of {n} bytes"))
    return impls


def goal_notes(res, label):
    """The issue's two ratios for one token count (``res``: measure's results by impl name), for the default fp8
    dispatch and the pre-quantised one."""
    b, c = res.get("ditron low_latency bf16"), res.get("device_copy_fp8")
    out = []
    for name, tag in (("ditron low_latency fp8", "fp8"), ("ditron low_latency fp8 prequant", "fp8 prequant"),
                      ("ditron low_latency fp8 once", "fp8 once")):
        f = res.get(name)
        if f and b and f["ok"] and b["ok"]:
            out.append(f"{label}: {tag} {f['us']:.1f} us vs bf16 {b['us']:.1f} us: {b['us'] / f['us']:.2f}x "
                       f"(goal > 1.00x: {'met' if f['us'] < b['us'] else 'NOT met'})")
        if f and c and f["ok"] and c["ok"]:
            r = f["us"] / c["us"]
            out.append(f"{label}: {tag} = {r:.2f}x the device copy of its bytes ({c['us']:.1f} us) "
                       f"(goal <= 1.20x: {'met' if r <= 1.2 else 'NOT met'})")
    return out
