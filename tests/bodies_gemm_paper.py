"""Test bodies: the GEMM-overlap kernels at one of the paper's shapes
(LLaMA3-7B, tensor parallel over the world), checked against torch in fp32.
Every rank regenerates every rank's inputs (seeded, never zeros)."""
import importlib

import torch

AG = importlib.import_module("ditron.kernels.ag_gemm")
RS = importlib.import_module("ditron.kernels.gemm_rs")
AR = importlib.import_module("ditron.kernels.gemm_ar")

#: global (M, N, K) of ../shared/bench/paper-shapes.json, LLaMA3-7B
AG_SHAPE = (8192, 11008, 4096)
RS_SHAPE = (8192, 4096, 11008)


def _rand(rank, shape, seed, device):
    g = torch.Generator(device=device).manual_seed(7919 * rank + seed)
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) / 8 + 0.01).to(torch.bfloat16)


def _close(got, ref, K, what):
    err = (got.float() - ref).abs().max().item()
    tol = 0.02 * ref.abs().max().item() + 1e-2 * (K ** 0.5) / 64
    assert err <= tol, f"{what}: max abs error {err} > {tol}"


def paper_shape(world, op, calls=3):
    W, R, dev = world.world_size, world.rank, world.device
    if op == "ag_gemm":
        M, N, K = AG_SHAPE
        m, n = M // W, N // W
        ctx = AG.create_ag_gemm_context(m, K, torch.bfloat16)
        b = _rand(R, (K, n), 2, dev)
        for i in range(calls):
            a = _rand(R, (m, K), 10 + i, dev)
            full = torch.cat([_rand(r, (m, K), 10 + i, dev) for r in range(W)]).float()
            _close(AG.ag_gemm(a, b, ctx), full @ b.float(), K, f"ag_gemm call {i}")
        return calls
    M, N, K = RS_SHAPE
    k = K // W
    if op == "gemm_rs":
        ctx = RS.create_gemm_rs_context(M, N, torch.bfloat16)
        run = lambda a, b: RS.gemm_rs(a, b, ctx)                                        # noqa: E731
        rows = slice(R * (M // W), (R + 1) * (M // W))
    else:
        ctx = AR.create_gemm_ar_context(M, N, torch.bfloat16)
        run = lambda a, b: AR.gemm_ar(a, b, ctx)                                        # noqa: E731
        rows = slice(0, M)
    for i in range(calls):
        a, b = _rand(R, (M, k), 20 + i, dev), _rand(R, (k, N), 30 + i, dev)
        ref = sum(_rand(r, (M, k), 20 + i, dev)[rows].float() @ _rand(r, (k, N), 30 + i, dev).float()
                  for r in range(W))
        _close(run(a, b), ref, K, f"{op} call {i}")
    return calls
