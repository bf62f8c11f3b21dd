"""EP's torch references (kernels/ep.py): the combine of all ranks' tokens, and the fp8 payload's quantiser,
dequantiser and round-trip bound (DeepEP's ``use_fp8=True``)."""
import torch


def ep_reference(x_all, idx_all, w_all, expert_fn, num_experts):
    """torch: ``out[t] = sum_j w[t, j] * expert_fn(e, x[t])`` over the valid
    pairs, for all ranks' tokens at once (the tests' reference, fp32)."""
    out = torch.zeros(x_all.shape, dtype=torch.float32)
    xf = x_all.float()
    for j in range(idx_all.shape[1]):
        for e in range(num_experts):
            m = idx_all[:, j] == e
            if m.any():
                out[m] += w_all[m, j].float()[:, None] * expert_fn(e, xf[m])
    return out


#: DeepEP's fp8 payload: e4m3 codes, one fp32 scale per FP8_GROUP channels, the margin under amax
FP8_GROUP, FP8_MAX, FP8_MARGIN = 128, 448.0, 1e-4


def fp8_quantize_reference(x, round_scale=False):
    """torch (fp32): the e4m3 codes and scales that ``ep_dispatch(...,
    use_fp8=True)`` sends for the rows ``x [n, H]`` (``H % 128 == 0``): per
    group of 128 channels ``amax = max(|x|, 1e-4)``, codes ``x * (448 /
    amax)`` rounded to nearest even (saturating), scale ``amax * (1 / 448)``
    in fp32; ``round_scale``: scale ``2 ** ceil(log2(amax / 448))`` and codes
    ``x / scale``.  Returns ``(codes float8_e4m3fn [n, H], scales fp32 [n, H
    / 128])``."""
    n, H = x.shape
    xf = x.float().reshape(n, H // FP8_GROUP, FP8_GROUP)
    amax = xf.abs().amax(-1).clamp_min(FP8_MARGIN)
    inv = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)
    if round_scale:
        bits = (amax * inv).view(torch.int32)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
        sinv = (e << 23).view(torch.float32)
        scale = ((254 - e) << 23).view(torch.float32)
    else:
        sinv = amax * inv
        scale = torch.tensor(FP8_MAX, dtype=torch.float32) / amax
    codes = (xf * scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(n, H)
    return codes, sinv


def fp8_round_trip_bound(x, scales, round_scale=False):
    """The documented bound of ``|fp8_dequantize(fp8_quantize_reference(x)) - x|`` per element (``x [n, H]``,
    ``scales [n, H / 128]`` its stored scales): e4m3 keeps 3 mantissa bits, so a normal code is within
    ``2^-4 |x|`` (``2^-3`` with ``round_scale``: the power-of-two scale leaves up to twice the headroom) and a
    subnormal one within ``2^-9`` of its group's scale."""
    rel = 2.0 ** -4 * (2 if round_scale else 1)
    return x.float().abs() * rel + scales.float().repeat_interleave(FP8_GROUP, -1) * 2.0 ** -9


def fp8_dequantize(codes, scales):
    """``codes [..., H]`` (e4m3) times their scales ``[..., H / 128]``, fp32."""
    shape = codes.shape
    g = shape[-1] // FP8_GROUP
    return (codes.float().reshape(*shape[:-1], g, FP8_GROUP) * scales.float()[..., None]).reshape(shape)
