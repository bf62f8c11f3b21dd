"""Compile (no GPU needed) every ring-attention config that ``ditron bench ring_attn --configs all`` and
``--configs levers`` time, for sm_90a at world size 1 (bf16, head dim 128, causal and not), and print the
shared memory, the registers and spills (``ptxas -v`` on the PTX, with Triton's ptxas), whether K / V are
loaded by TMA, and the ``wgmma.wait_group`` counts (all 0: no wgmma in flight across the softmax).

    python bench/attention_compile.py
"""
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

import triton

import ditron
from ditron.kernels import attention as A


def compile_fwd(cfg, causal, world=1, dt="bf16", head_dim=128, target="sm_90a"):
    kern = A.ring_attn_fwd_kernel
    const = {"WORLD": world, "NCH": 2 if (causal and world > 1) else 1, "CAUSAL": causal, "HEAD_D": head_dim,
             "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "NSPLIT": A.GPU_NSPLIT, "TMA": cfg.tma, "WAIT": True,
             "PERSISTENT": cfg.persistent,
             "HEADS_FIRST": bool(cfg.heads_first and causal and not cfg.persistent)}
    ptrs = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "o_ptr": f"*{dt}", "lse_ptr": "*fp32",
            "kbuf_ptr": f"*{dt}", "vbuf_ptr": f"*{dt}", "sig_ptr": "*i32", "calls_ptr": "*i64"}
    sig = {p: ptrs.get(p, "fp32" if p == "qk_scale" else "i32") for p in kern.arg_names if p not in const}
    extra = {"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}
    return ditron.compile(kern, target=target, signature=sig, constexprs=const, num_warps=cfg.num_warps,
                          num_stages=cfg.num_stages, **extra)


def ptxas_info(ptx):
    """``registers / spill`` lines of ``ptxas -v`` for sm_90a, or '' without Triton's ptxas."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return ""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        r = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull], capture_output=True,
                           text=True, timeout=300)
    finally:
        os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    return f"regs={regs.group(1) if regs else '?'}, spill_stores={spill.group(1) if spill else '?'}"


def compile_others():
    """The flash-decode and Ulysses kernels at their GPU tiles (bf16, 32 / 8 heads, head dim 128)."""
    import importlib
    FD = importlib.import_module("ditron.kernels.flash_decode")
    from ditron.kernels import ulysses as U
    jobs = [
        (FD.flash_decode_split_kernel, {"G": 4, "HKV": 8, "HEAD_D": 128, "BLOCK_H": 16, "BLOCK_N": FD.GPU_BLOCK_N,
                                        "FUSE": False, "SPLIT_CHUNK": 16},
         {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "lens_ptr": "*i32", "po_ptr": "*fp32",
          "pl_ptr": "*fp32", "cap": "i32", "nsplit": "i32", "qk_scale": "fp32", "out_ptr": "*bf16",
          "lse_ptr": "*fp32", "cnt_ptr": "*i32"}, FD.GPU_WARPS,
         FD.split_stages(FD.GPU_BLOCK_N, 128)),
        (FD.flash_decode_combine_kernel, {"G": 4, "WORLD": 1, "HEAD_D": 128, "BLOCK_H": 16, "DSPLIT": 4,
                                          "SPLIT_CHUNK": 16, "WAIT": True},
         {"po_ptr": "*fp32", "pl_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "llo_ptr": "*i64",
          "lll_ptr": "*i64", "calls_ptr": "*i64", "nitems": "i32", "nsplit": "i32", "maxitems": "i32"}, 4, 1),
        (U.ulysses_qkv_a2a_kernel, {"WORLD": 1, "HEAD_D": 128, "BLOCK_M": U.GPU_BLOCK_M, "BLOCK_K": U.GPU_BLOCK_K,
                                    "EVEN_K": True},
         {"x_ptr": "*bf16", "w_ptr": "*bf16", "recv_ptr": "*bf16", "cnt_ptr": "*i64", "S": "i32", "HID": "i32",
          "NCOL": "i32", "qreg": "i32", "kreg": "i32", "HQ": "i32", "HKV": "i32"}, 8, 3),
        (U.ulysses_a2a_oproj_kernel, {"WORLD": 1, "BLOCK_M": U.GPU_BLOCK_M, "BLOCK_N": U.GPU_BLOCK_N,
                                      "BLOCK_K": U.GPU_BLOCK_K, "EVEN_K": True, "WAIT": True},
         {"abuf_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "cnt_ptr": "*i64", "calls_ptr": "*i64",
          "S": "i32", "HID": "i32", "KC": "i32", "per_src": "i32"}, 8, 3),
    ]
    bad = 0
    for kern, const, sig, warps, stages in jobs:
        name = kern.fn.__name__ if hasattr(kern, "fn") else getattr(kern, "__name__", str(kern))
        try:
            ck = ditron.compile(kern, target="sm_90a", signature=sig, constexprs=const, num_warps=warps,
                                num_stages=stages)
            print(f"{name}: ok, shared={getattr(getattr(ck, 'metadata', None), 'shared', None)}", flush=True)
        except Exception as e:  # noqa: BLE001 -- reported
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:400]}")
            bad += 1
    return bad


def main():
    bad = compile_others()
    jobs = [(cfg, causal, 1) for cfg in (A.GPU_CONFIG, A.GPU_SHORT_CONFIG) + A.TUNE_CONFIGS + A.LEVER_CONFIGS
            for causal in (False, True)]
    jobs += [(A.GPU_CONFIG, causal, 2) for causal in (False, True)]       # world size > 1: the ring loop
    for cfg, causal, world in jobs:
        if True:
            t = time.time()
            try:
                ck = compile_fwd(cfg, causal, world=world)
            except Exception as e:  # noqa: BLE001 -- reported
                print(f"{cfg.short():>16} causal={causal!s:5} world={world}: FAILED {type(e).__name__}: {str(e)[:400]}")
                bad += 1
                continue
            ptx = ck.asm["ptx"]
            md = getattr(ck, "metadata", None)
            shared = getattr(md, "shared", None) if md is not None else None
            tma = bool(re.search(r"cp\.async\.bulk\.tensor", ptx))
            if shared is not None and shared > 232448:
                bad += 1
            waits = dict(collections.Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)))
            print(f"{cfg.short():>16} causal={causal!s:5} world={world}: ok in {time.time() - t:.1f} s, shared={shared}, "
                  f"{ptxas_info(ptx)}, mma={'wgmma' if 'wgmma' in ptx else ('mma' if 'mma' in ptx else 'none')}, "
                  f"tma_loads={tma}, wgmma_wait_groups={waits}"
                  + (" -- MORE SHARED MEMORY THAN AN H100 HAS" if shared and shared > 232448 else ""),
                  flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
