"""Test bodies for the zoo's GEMM core (kernels/gemm.py), run on one rank of
the simulator (or a GPU rank): seeded random operands, never zeros, against
torch in fp32."""
import importlib

import torch

from bodies_ag_gemm import error_messages

G = importlib.import_module("ditron.kernels.gemm")


def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) + 0.1).to(dtype)


def _close(got, ref, what):
    err = (got.float().cpu() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= 2e-2 * scale + 1e-2, f"{what}: max abs error {err} (scale {scale})"


def matmul_shapes(world, dtype, shapes):
    """Non-multiples of the tile in M, N and K; a transposed b; a given out."""
    dtype = getattr(torch, dtype)
    done = 0
    for i, (M, N, K) in enumerate(shapes):
        a = _rand((M, K), dtype, i).to(world.device)
        b = _rand((K, N), dtype, 100 + i).to(world.device)
        _close(G.matmul(a, b), a.float().cpu() @ b.float().cpu(), f"{M}x{N}x{K}")
        bt = _rand((N, K), dtype, 200 + i).to(world.device)
        out = torch.full((M, N), -7.0, dtype=dtype, device=world.device)
        assert G.matmul(a, bt.t(), out=out) is out
        _close(out, a.float().cpu() @ bt.float().cpu().t(), f"{M}x{N}x{K}, b transposed")
        done += 1
    return done


def tune_and_errors(world):
    """``config="tune"`` picks one of the candidates and caches it; bad inputs
    raise DitronError before launch."""
    a = _rand((37, 70), torch.bfloat16, 1).to(world.device)
    b = _rand((70, 45), torch.bfloat16, 2).to(world.device)
    cfg = G.tune(37, 45, 70, torch.bfloat16, world.device, warmup=1, iters=1)
    assert cfg in G.SIM_TUNE_CONFIGS or cfg in G.TUNE_CONFIGS
    assert G.tune(37, 45, 70, torch.bfloat16, world.device, warmup=1, iters=1) is cfg      # cached
    _close(G.matmul(a, b, config="tune"), a.float().cpu() @ b.float().cpu(), "tuned")
    cases = {
        "dtype": lambda: G.matmul(a.float(), b.float()),
        "k": lambda: G.matmul(a, b[:60]),
        "out": lambda: G.matmul(a, b, out=torch.empty(37, 44, dtype=torch.bfloat16, device=world.device)),
        "config": lambda: G.matmul(a, b, config="fast"),
        "block": lambda: G.matmul(a, b, config=G.GemmConfig(24, 16, 32)),
    }
    return error_messages(cases)
