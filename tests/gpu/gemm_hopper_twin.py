"""GPU test of issue 52 item 4 on one Hopper GPU: the Gluon GEMM core (kernels/gemm_hopper.py) and its ``tl``
twin (the ``tl`` core, kernels/gemm.py, with the same tiles and BLOCK_K: ``gemm_hopper.twin_config``) give
bit-identical outputs on the same inputs, and both are right against an fp32 reference.  The simulator runs the
twin; this is what lets it stand in for the Gluon core.

    python tests/gpu/gemm_hopper_twin.py            # every config of tests/test_compile_gemm_hopper.CONFIGS
    python tests/gpu/gemm_hopper_twin.py --exclude "gluon pingpong 64x256x64 s4,..."    # by HopperGemmConfig.label()

Fresh random inputs per run (the seed is printed); shapes with tails in M, N and K, fewer tiles than SMs, an odd
tile count (ping-pong's consumers get different numbers of tiles) and paper shapes; bf16 and fp16.  Prints one
line per (config, dtype, shape) and ``gemm_hopper_twin: P passed, F failed``; exits non-zero on a failure or
where no sm_90 GPU is visible (the test cannot pass without one).
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ditron.kernels import gemm as G  # noqa: E402
from ditron.kernels import gemm_hopper as H  # noqa: E402
from test_compile_gemm_hopper import CONFIGS  # noqa: E402

SHAPES = [(1000, 1000, 1000), (130, 328, 72), (256, 512, 128), (3000, 2056, 4104), (8192, 5504, 4096),
          (8192, 4096, 5504)]


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--exclude", default="", help="comma list of config labels to leave out (others' names ignored)")
    excl = {x.strip() for x in ap.parse_args().exclude.split(",") if x.strip()}
    configs = [c for c, _ in CONFIGS if c.label() not in excl]
    if not torch.cuda.is_available() or not H.supported("cuda"):
        print("gemm_hopper_twin: needs an sm_90 GPU (H100 / H200); none visible -- FAILED")
        return 2
    seed = int.from_bytes(os.urandom(4), "little")
    left = [c.label() for c, _ in CONFIGS if c.label() in excl]
    print(f"{torch.cuda.get_device_name()} seed {seed}" + (f"; left out: {', '.join(left)}" if left else ""), flush=True)
    passed = failed = 0
    for cfg in configs:
        twin = H.twin_config(cfg)
        for dtype in (torch.bfloat16, torch.float16):
            for i, (M, N, K) in enumerate(SHAPES):
                g = torch.Generator(device="cuda").manual_seed(seed + 1000 * i)
                a = torch.randn(M, K, device="cuda", generator=g).to(dtype)
                b = torch.randn(K, N, device="cuda", generator=g).to(dtype)
                fast = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
                slow = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
                H.matmul_hopper(a, b, out=fast, config=cfg)
                G.matmul(a, b, out=slow, config=twin)
                torch.cuda.synchronize()
                ref = a.float() @ b.float()
                tol = torch.finfo(dtype).eps * math.sqrt(K) * 12
                errs = []
                for name, out in (("gluon", fast), ("tl twin", slow)):
                    if not bool(torch.isfinite(out).all()):
                        errs.append(f"{name}: {int((~torch.isfinite(out)).sum())} entries not finite")
                    elif (out.float() - ref).abs().max().item() > tol:
                        errs.append(f"{name}: max abs error {(out.float() - ref).abs().max().item():.4g} > {tol:.4g}")
                if not errs and not torch.equal(fast, slow):
                    errs.append(f"not bit-identical: {int((fast != slow).sum())} of {fast.numel()} entries differ")
                tag = f"{cfg.label()} vs tl {twin.block_m}x{twin.block_n}x{twin.block_k} {str(dtype)[6:]} {M}x{N}x{K}"
                if errs:
                    failed += 1
                    print(f"FAIL {tag}: " + "; ".join(errs), flush=True)
                else:
                    passed += 1
                    print(f"ok   {tag}", flush=True)
    print(f"gemm_hopper_twin: {passed} passed, {failed} failed" + (f", {len(left)} config(s) left out" if left else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
