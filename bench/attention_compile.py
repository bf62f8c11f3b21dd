"""Compile (no GPU needed) every ring-attention config that ``ditron bench ring_attn --configs all``
times, for sm_90a at world size 1 (bf16, head dim 128, causal and not), and print the shared memory,
the registers and the spills where the compiled kernel reports them, and whether K / V are loaded
by TMA.

    python bench/attention_compile.py
"""
import re
import sys
import time

import ditron
from ditron.kernels import attention as A


def compile_fwd(cfg, causal, world=1, dt="bf16", head_dim=128, target="sm_90a"):
    kern = A.ring_attn_fwd_kernel
    const = {"WORLD": world, "NCH": 2 if (causal and world > 1) else 1, "CAUSAL": causal, "HEAD_D": head_dim,
             "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "NSPLIT": A.GPU_NSPLIT, "TMA": cfg.tma, "WAIT": True}
    ptrs = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "o_ptr": f"*{dt}", "lse_ptr": "*fp32",
            "kbuf_ptr": f"*{dt}", "vbuf_ptr": f"*{dt}", "sig_ptr": "*i32", "calls_ptr": "*i64"}
    sig = {p: ptrs.get(p, "fp32" if p == "qk_scale" else "i32") for p in kern.arg_names if p not in const}
    return ditron.compile(kern, target=target, signature=sig, constexprs=const, num_warps=cfg.num_warps,
                          num_stages=cfg.num_stages)


def main():
    bad = 0
    for cfg in A.TUNE_CONFIGS:
        for causal in (False, True):
            t = time.time()
            try:
                ck = compile_fwd(cfg, causal)
            except Exception as e:  # noqa: BLE001 -- reported
                print(f"{cfg.short():>16} causal={causal!s:5}: FAILED {type(e).__name__}: {str(e)[:400]}")
                bad += 1
                continue
            ptx = ck.asm["ptx"]
            md = getattr(ck, "metadata", None)
            shared = getattr(md, "shared", None) if md is not None else None
            tma = bool(re.search(r"cp\.async\.bulk\.tensor", ptx))
            print(f"{cfg.short():>16} causal={causal!s:5}: ok in {time.time() - t:.1f} s, shared={shared}, "
                  f"mma={'wgmma' if 'wgmma' in ptx else ('mma' if 'mma' in ptx else 'none')}, tma_loads={tma}",
                  flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
