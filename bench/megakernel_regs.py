"""Registers, spills and shared memory of the decoder megakernel per lever, on the CPU (no GPU; issue 26).

    python bench/megakernel_regs.py                                   # every lever, batch 1 and 8, whole kernel
    python bench/megakernel_regs.py --levers curve,old --branches   # and each task kind alone
    python bench/megakernel_regs.py --levers "mine:gemv_stream=1,stream_stages=4" --batch 1
    python bench/megakernel_regs.py --levers stream --batch 8 --kinds "o,attn;gu,o,attn"      # kinds together

The whole step (Qwen3-8B shapes, one layer: the same branches as 36) compiled for sm_90a and run through
``ptxas -v`` (kernels/decoder/resources.py): registers per thread, spilled bytes per thread (stores / loads),
shared memory per program, programs per SM on an H100 / H200 (2 at most 255 registers and 4 warps), and whether
the weights stream through shared memory (cp.async).  ``--branches`` adds each kind of task compiled alone
(what that branch needs; the kernel's budget is the largest).  A lever is ``name:field=value,...`` over
:class:`TileConfig` (``LEVERS`` below names the ones ``bench/megakernel_levers.sh`` times on a GPU).
"""
import argparse
import sys

#: the levers of bench/megakernel_levers.sh as TileConfig overrides of qwen3_8b() (the GPU script passes the same as
#: bench flags)
LEVERS = {
    "curve": {},
    "noinline": {"noinline_branches": True},
    "inline": {"noinline_branches": False},
    "old": {"dot_from": 3, "fuse_upto": 2, "dot_stream": False, "dot_block_k": 256, "max_regs": 0},
    "nocap": {"max_regs": 0},
    "k256": {"dot_block_k": 256},
    "split3": {"down_split_k": 3},
    "fold": {"fold_resid": True},
    "prenorm": {"prenorm": True},
    "k512s5": {"gemv_block_k": 512, "gate_up_block_k": 512, "stream_stages": 5},
    "gu32": {"gate_up_block_n": 32, "gate_up_block_k": 256},
    "pngu32": {"prenorm": True, "gate_up_block_n": 32, "gate_up_block_k": 256},
    "pnk512": {"prenorm": True, "gemv_block_k": 512, "gate_up_block_k": 512, "stream_stages": 5},
    "cols11": {"o_cols": 11, "down_cols": 11},
    "pn8": {"prenorm": True},
    "b8old": {"gu_wdot": 0, "dot_ksplit": 0, "prenorm_dot": False},
    "b8w32": {"gu_wdot": 32, "gu_wdot_k": 256},
    "b8pnw": {"prenorm": True, "gu_wdot": 32, "gu_wdot_k": 256},
    "b8pne": {"prenorm": True, "pn_early": True},
    "b8pnwe": {"prenorm": True, "gu_wdot": 32, "gu_wdot_k": 256, "pn_early": True},
    "b8ks": {"dot_ksplit": 4},
    "b8ksw": {"dot_ksplit": 4, "gu_wdot": 32, "gu_wdot_k": 256},
    "b8pnwk": {"prenorm": True, "gu_wdot": 32, "gu_wdot_k": 256, "dot_ksplit": 4},
}


def parse_lever(text):
    name, _, rest = text.partition(":")
    if not rest:
        if name not in LEVERS:
            raise SystemExit(f"unknown lever {name!r}; known: {', '.join(LEVERS)} (or name:field=value,...)")
        return name, LEVERS[name]
    over = {}
    for item in rest.split(","):
        k, _, v = item.partition("=")
        over[k.strip()] = int(v) if v.strip().lstrip("-").isdigit() else {"true": True, "false": False}.get(v, v)
    return name, over


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levers", default=",".join(LEVERS),
                   help="comma list of lever names, or space-separated name:field=value,... items")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--branches", action="store_true", help="also each task kind compiled alone")
    p.add_argument("--kinds", default="", help="also these sets of task kinds together, e.g. 'o,attn;gu,o,attn'")
    p.add_argument("--model", choices=["qwen3-8b", "llama3-8b", "tiny-qwen3"], default=None,
                   help="the whole model step (embedding, LM head, sampler: kernels/decoder/hf.py HF_CONFIGS) instead "
                        "of Qwen3-8B's decoder stack")
    args = p.parse_args(argv)
    import ditron
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    ditron.init("sim")
    levers = [parse_lever(t) for t in args.levers.split(",") if t] if ":" not in args.levers else \
        [parse_lever(t) for t in args.levers.split(" ") if t]
    print("| lever | batch | what | registers | spill st/ld (B/thread) | shared (B) | programs/SM | cp.async |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, over in levers:
        if args.model:
            from ditron.kernels.decoder import hf
            cfg = hf.config_from_hf(hf.HF_CONFIGS[args.model]).with_(n_layers=1)
        else:
            cfg = qwen3_8b(n_layers=1)
        cfg = cfg.with_tiles(**over) if over else cfg
        for b in (int(v) for v in args.batch.split(",")):
            kinds = [None]
            if args.branches:
                kinds += ["advance", "qkv", "res_a", "rope", "attn", "comb", "o", "ar_attn", "gu", "down", "final",
                          "embed", "lm_head", "topk", "sample"]
                if cfg.tiles.down_split_k > 1:
                    kinds.append("dsum")
            kinds += [tuple(k.split(",")) for k in args.kinds.split(";") if k]
            present = set(RZ.kinds_of(RZ.step_specs(cfg, b)))
            kinds = [k for k in kinds if k is None or set((k,) if isinstance(k, str) else k) <= present]
            for k in kinds:
                u = RZ.usage(cfg, b, None if k is None else k if isinstance(k, tuple) else (k,))
                what = "whole step" if k is None else " + ".join(k) if isinstance(k, tuple) else k
                print(f"| {name} | {b} | {what} | {u['registers']} | "
                      f"{u['spill_stores']}/{u['spill_loads']} | {u['shared']} | {u['resident_per_sm']} | "
                      f"{'yes' if u['cp_async'] else 'no'} |", flush=True)
    ditron.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
