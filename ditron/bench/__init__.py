"""``ditron bench``: benchmarks of the zoo against NCCL, cuBLAS and torch.

* :mod:`ditron.bench.harness` -- measure (CUDA events / graph replays, rounds
  in alternating order), check against a reference, report (Markdown, JSON,
  plots);
* one module per op family: :mod:`ditron.bench.collectives`
  (all_reduce, all_gather, reduce_scatter) and :mod:`ditron.bench.gemm`
  (ag_gemm, gemm_rs, gemm_ar, the GEMM core; split by idea into ``gemm_shapes``,
  ``gemm_run``, ``gemm_sweep``, ``gemm_report``) and :mod:`ditron.bench.moe`
  (grouped_gemm, ag_moe, moe_rs, moe_ar, ep) and :mod:`ditron.bench.megakernel`
  (the Qwen3-like TP decoder step as one persistent kernel) and
  :mod:`ditron.bench.attention` (ring_attn, flash_decode, ulysses: the attention zoo against torch SDPA) and
  :mod:`ditron.bench.train_tp` (a TP MLP / transformer-block training step against torch's TP) and
  :mod:`ditron.bench.overhead` (the host cost of an eager launch and of every zoo op against Triton and torch).

    torchrun --nproc-per-node 4 -m ditron.bench all_reduce --sizes 8K..256M
    ditron sim -n 2 -m ditron.bench ag_gemm --shapes 64,32,32
"""
from __future__ import annotations

import sys

from .registry import ATTN_OPS, COLLECTIVE_OPS, FAMILIES, GEMM_OPS, HOST_OPS, MEGAKERNEL_OPS, MOE_OPS, TRAIN_OPS  # noqa: F401,E501


def usage() -> str:
    lines = ["usage: ditron bench BENCHMARK [options]   (ditron bench BENCHMARK --help for its options)", "",
             "benchmarks:"]
    for family, ops in FAMILIES.items():
        lines.append(f"  {', '.join(ops):<45} (ditron.bench.{family})")
    lines += ["", "run under torchrun on GPUs, or on simulated ranks: ditron sim -n 2 -m ditron.bench ag_gemm"]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    known = {op for ops in FAMILIES.values() for op in ops}
    if argv[0] not in known and not argv[0].startswith("-"):
        print(f"ditron bench: unknown benchmark {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if argv and argv[0] in GEMM_OPS:
        from .gemm import main as family_main
    elif argv and argv[0] in MOE_OPS:
        from .moe import main as family_main
    elif argv and argv[0] == "flash_decode":
        from .flash_decode import main
        return main(argv[1:])
    elif argv and argv[0] == "ulysses":
        from .ulysses import main
        return main(argv[1:])
    elif argv and argv[0] in ATTN_OPS:
        from .attention import main as family_main
    elif argv and argv[0] == "train_tp":
        from .train_tp import main
        return main(argv[1:])
    elif argv and argv[0] == "overhead":
        from .overhead import main
        return main(argv[1:])
    elif argv and argv[0] == "megakernel":
        from .megakernel import main as family_main
    else:
        from .collectives import main as family_main
    return family_main(argv)
