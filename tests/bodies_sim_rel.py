"""Test bodies for the simulator's reliability features: rounding, polling
loops, the race finder (see tests/test_sim_*.py)."""
import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl


# ---------------------------------------------------------------------------
# fp32 -> bf16 / fp16 conversions round to nearest even, as on GPUs
# ---------------------------------------------------------------------------

@ditron.jit
def convert_kernel(x_ptr, bf_ptr, h_ptr, back_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    b = x.to(tl.bfloat16)
    tl.store(bf_ptr + offs, b, mask=mask)
    tl.store(h_ptr + offs, x.to(tl.float16), mask=mask)
    tl.store(back_ptr + offs, b.to(tl.float16), mask=mask)     # bf16 -> fp16 through fp32


def rounding_values():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3000, generator=g) * torch.logspace(-30, 30, 3000)
    # ties and near-ties of bf16 (8 significant bits) and fp16 (11), overflow, subnormals, signed zero
    ties = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -(1 + 2 ** -8), 1 + 2 ** -11,
                         1 + 3 * 2 ** -11, 65519.0, 65520.0, 3.4e38, 1e-40, -1e-45, -0.0, float("inf")])
    return torch.cat([x, ties]).to(torch.float32)


def rounding(world):
    x = rounding_values()
    n = x.numel()
    bf = torch.empty(n, dtype=torch.bfloat16)
    h = torch.empty(n, dtype=torch.float16)
    back = torch.empty(n, dtype=torch.float16)
    convert_kernel[(triton.cdiv(n, 1024),)](x, bf, h, back, n, BLOCK=1024)
    want_bf = x.to(torch.bfloat16)
    bad = (bf.view(torch.int16) != want_bf.view(torch.int16)).nonzero().flatten()
    assert bad.numel() == 0, f"fp32->bf16 differs from torch at {bad[:5].tolist()}: {x[bad[:5]].tolist()} -> " \
                             f"{bf[bad[:5]].tolist()}, torch {want_bf[bad[:5]].tolist()}"
    assert torch.equal(h.view(torch.int16), x.to(torch.float16).view(torch.int16)), "fp32->fp16 differs from torch"
    assert torch.equal(back.view(torch.int16), want_bf.to(torch.float16).view(torch.int16)), \
        "bf16->fp16 differs from torch"
    return n
