"""GPU test of issue 52 item 4 for the attention core, on one Hopper GPU: the Gluon core
(kernels/attention_hopper.py, ``core="gluon"``) and its ``tl`` twin (the tl core, kernels/attention_core.py,
with ``attention_hopper.twin_config(cfg)``: the same 128 x block_n tiles and operation order) give the same
output ``o`` and log-sum-exp on the same inputs, and both are right against fp32 attention.  The simulator runs
the twin where a GPU runs the Gluon core; this is what lets it stand in.

    python tests/gpu/attention_hopper_twin.py               # every config of attention_hopper.CONFIGS
    python tests/gpu/attention_hopper_twin.py --configs default
    python tests/gpu/attention_hopper_twin.py --bound       # also pass pairs that differ within the stated bound

Fresh random inputs per run (the seed is printed); odd lengths (a partial last query tile and key tail), GQA,
batch 2, head dim 64 and 128, causal and not, bf16 and fp16, one 8192-key case.  One line per (config, dtype,
shape, causal):

* ``ok   ... bit-identical`` -- ``o`` and ``lse`` equal entry for entry (``torch.equal``);
* ``DIFF ... o: N of M entries differ, max abs diff X (Y ulp at |o| max); lse: ...`` -- not identical; with
  ``--bound`` a pair within ``BOUND`` (2 ulp of the output dtype relative to the row's largest |o|, lse within
  4 fp32 ulp of |lse|) counts as passed, without it as failed -- the log says which;
* ``FAIL ...`` -- a core is wrong against fp32 attention (or not finite).

Ends with ``attention_hopper_twin: P bit-identical, C close (within the bound), F failed``; exits non-zero on
a failure, on a difference without ``--bound``, or where no sm_90 GPU is visible (the test cannot pass without
one).
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from ditron.kernels import attention as A  # noqa: E402
from ditron.kernels import attention_hopper as H  # noqa: E402

# (B, Hq, Hkv, S, D)
SHAPES = [(1, 32, 8, 1000, 128), (2, 4, 2, 300, 64), (2, 4, 2, 129, 64), (1, 4, 4, 1024, 128), (1, 8, 2, 8192, 128)]
#: --bound: ulp of the output dtype (relative to the largest |o| of the tensor) / of fp32 for the LSE
BOUND_O_ULP = 2
BOUND_LSE_ULP = 4


def reference(q, k, v, causal, scale):
    G = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1)
    s = q.float() @ kf.transpose(-1, -2) * scale
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vf, torch.logsumexp(s, -1)


def compare(fast, slow, dtype):
    """``(identical, line)`` for one output pair."""
    if torch.equal(fast, slow):
        return True, "identical", True
    diff = (fast.float() - slow.float()).abs()
    n = int((fast != slow).sum())
    mx = diff.max().item()
    big = max(fast.float().abs().max().item(), 1e-30)
    ulp = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(big))
    return False, f"{n} of {fast.numel()} entries differ, max abs diff {mx:.3g} ({mx / ulp:.2f} ulp at |max| {big:.3g})", \
        mx <= (BOUND_O_ULP if dtype != torch.float32 else BOUND_LSE_ULP) * ulp


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", choices=["all", "default"], default="all")
    ap.add_argument("--bound", action="store_true", help="pass pairs that differ within the stated bound")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not H.supported("cuda"):
        print("attention_hopper_twin: needs an sm_90 GPU (H100 / H200); none visible -- FAILED")
        return 2
    configs = [H.DEFAULT_CONFIG] if args.configs == "default" else list(H.CONFIGS)
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"{torch.cuda.get_device_name()} seed {seed} | triton {__import__('triton').__version__} | "
          f"default core here: {A.resolve_core(torch.empty(1, 8, 8192, 128, device='cuda', dtype=torch.bfloat16), torch.empty(1, 8, 8192, 128, device='cuda', dtype=torch.bfloat16)).label()}",
          flush=True)
    same = close = failed = 0
    for cfg in configs:
        twin = H.twin_config(cfg)
        for dtype in (torch.bfloat16, torch.float16):
            for i, (B, HQ, HKV, S, D) in enumerate(SHAPES):
                if S > 4096 and dtype == torch.float16:
                    continue                        # the long case once per config
                for causal in (False, True):
                    g = torch.Generator(device="cuda").manual_seed(seed + 1000 * i + int(causal))
                    q = torch.randn(B, HQ, S, D, device="cuda", generator=g).to(dtype)
                    k = torch.randn(B, HKV, S, D, device="cuda", generator=g).to(dtype)
                    v = torch.randn(B, HKV, S, D, device="cuda", generator=g).to(dtype)
                    o_g, lse_g = A.flash_attention(q, k, v, causal=causal, config=cfg, return_lse=True, core="gluon")
                    o_t, lse_t = A.flash_attention(q, k, v, causal=causal, config=twin, return_lse=True, core="tl")
                    torch.cuda.synchronize()
                    tag = (f"{cfg.label()} vs tl {twin.short()} {str(dtype)[6:]} {(B, HQ, HKV, S, D)} "
                           f"{'causal' if causal else 'full'}")
                    errs = []
                    o_ref, lse_ref = reference(q, k, v, causal, 1.0 / math.sqrt(D))
                    tol = 2.5e-2 if dtype == torch.bfloat16 else 4e-3
                    for name, o, lse in (("gluon", o_g, lse_g), ("tl twin", o_t, lse_t)):
                        if not (bool(torch.isfinite(o).all()) and bool(torch.isfinite(lse).all())):
                            errs.append(f"{name}: not finite")
                            continue
                        eo = (o.float() - o_ref).abs().max().item()
                        el = (lse - lse_ref).abs().max().item()
                        if eo > tol or el > 1e-3:
                            errs.append(f"{name}: max abs error o {eo:.3g} (> {tol}?) lse {el:.3g} (> 1e-3?)")
                    del o_ref, lse_ref
                    if errs:
                        failed += 1
                        print(f"FAIL {tag}: " + "; ".join(errs), flush=True)
                        continue
                    so, lo, bo = compare(o_g, o_t, dtype)
                    sl, ll, bl = compare(lse_g, lse_t, torch.float32)
                    if so and sl:
                        same += 1
                        print(f"ok   {tag}: bit-identical", flush=True)
                    else:
                        within = bo and bl
                        verdict = "within the bound" if within else "OUTSIDE the bound"
                        print(f"DIFF {tag}: o: {lo}; lse: {ll} -- {verdict} ({BOUND_O_ULP} ulp o, {BOUND_LSE_ULP} "
                              f"ulp lse)", flush=True)
                        if within and args.bound:
                            close += 1
                        else:
                            failed += 1
    print(f"attention_hopper_twin: {same} bit-identical, {close} close (within the bound), {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
