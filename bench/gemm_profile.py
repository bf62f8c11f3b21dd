"""Run the GEMM core (kernels/gemm.py matmul, default config) and cuBLAS (torch.matmul) a few times at one
shape, for a profiler: ``ncu --clock-control none --section SpeedOfLight python bench/gemm_profile.py M N K``.
Checks the result against torch first (fresh random bf16 inputs)."""
import sys

import torch

import ditron.kernels.gemm as G

M, N, K = (int(v) for v in sys.argv[1:4])
g = torch.Generator(device="cuda").manual_seed(1)
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
c = G.matmul(a, b)
ref = a.float() @ b.float()
err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
assert err < 1e-2, err
for _ in range(3):
    G.matmul(a, b, out=c)
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
print(f"{M}x{N}x{K}: checked (rel err {err:.2e}); config {G.default_config(M, N, K)}")
