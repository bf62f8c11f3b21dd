"""Test bodies (run on every rank; see conftest.py) for the zoo's MoE
kernels: the grouped GEMM core (kernels/moe.py) and TP MoE (ag_moe, moe_rs,
moe_ar; kernels/moe_tp.py), against plain torch in float32.  Simulated ranks
in CI, GPUs under torchrun."""
import torch

import ditron
from ditron.kernels.moe import grouped_gemm, grouped_gemm_reference

from bodies_ag_gemm import _check, _rand_of, error_messages

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def grouped_gemm_cases(world, dtype, cases, K=40, N=24, seed=0, **cfg):
    """``cases``: lists of per-expert counts (zeros included).  Every case
    once with contiguous rows and once with a gather index (a permutation of
    the token rows, as EP / TP MoE use it).  Returns the number of checks."""
    from ditron.kernels.gemm import GemmConfig
    dtype = DTYPES[dtype]
    config = GemmConfig(**cfg) if cfg else None
    done = 0
    for i, counts in enumerate(cases):
        E, M = len(counts), sum(counts)
        a = _rand_of(world.rank, (M + 3, K), dtype, seed + i).to(world.device)
        w = _rand_of(world.rank, (E, K, N), dtype, seed + i, salt=1).to(world.device)
        c = torch.tensor(counts, dtype=torch.int32 if i % 2 else torch.int64, device=world.device)
        out = grouped_gemm(a[:M], w, c, config=config)
        assert out.shape == (M, N) and out.dtype == dtype
        _check(out, grouped_gemm_reference(a[:M].cpu(), w.cpu(), c.cpu()), f"case {i} counts={counts}")
        g = torch.Generator().manual_seed(seed + i)
        idx = torch.randperm(M + 3, generator=g)[:M].to(world.device)
        out = torch.full((M, N), -7.0, dtype=dtype, device=world.device)
        grouped_gemm(a, w, c, out=out, gather_idx=idx, config=config)
        _check(out, grouped_gemm_reference(a.cpu(), w.cpu(), c.cpu(), idx.cpu()), f"gather case {i}")
        done += 2
    return done


def grouped_gemm_errors(world):
    a = torch.ones(5, 16, dtype=torch.float16, device=world.device)
    w = torch.ones(3, 16, 8, dtype=torch.float16, device=world.device)
    c = torch.tensor([2, 0, 3], device=world.device)
    cases = {
        "counts_len": lambda: grouped_gemm(a, w, c[:2]),
        "counts_dtype": lambda: grouped_gemm(a, w, c.float()),
        "w_dtype": lambda: grouped_gemm(a, w.bfloat16(), c),
        "w_k": lambda: grouped_gemm(a, w[:, :8], c),
        "w_2d": lambda: grouped_gemm(a, w[0], c),
        "a_dtype": lambda: grouped_gemm(a.float(), w, c),
        "out": lambda: grouped_gemm(a, w, c, out=torch.empty(5, 9, dtype=torch.float16, device=world.device)),
    }
    return error_messages(cases)
