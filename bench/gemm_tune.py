"""ditron's GEMM core, default config and ``config="tune"`` (kernels.gemm.tune),
against cuBLAS on one GPU: mean of 20 back-to-back launches after 3 warm-ups.

    python bench/gemm_tune.py
"""
import importlib

import torch

G = importlib.import_module("ditron.kernels.gemm")


def timed(fn, it=20):
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(it):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / it * 1e3


def main():
    for (M, N, K) in [(8192, 2752, 4096), (8192, 7392, 8192)]:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        cfg = G.tune(M, N, K, torch.bfloat16, "cuda")
        tc, td, tt = timed(lambda: a @ b), timed(lambda: G.matmul(a, b)), timed(lambda: G.matmul(a, b, config="tune"))
        print(f"{M}x{N}x{K}: cuBLAS {tc:.0f}us default {td:.0f}us ({tc/td:.2f}x) tuned {tt:.0f}us ({tc/tt:.2f}x) "
              f"-> {cfg}")


if __name__ == "__main__":
    main()
