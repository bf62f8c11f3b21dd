"""Every benchmark of ``ditron bench``, by module: the dispatcher and the help text read this table (so they
cannot drift), and a benchmark module may read it without importing the dispatcher."""

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
GEMM_OPS = ("ag_gemm", "gemm_rs", "gemm_ar", "gemm")
MOE_OPS = ("grouped_gemm", "ag_moe", "moe_rs", "moe_ar", "ep")
ATTN_OPS = ("ring_attn", "flash_decode", "ulysses")
MEGAKERNEL_OPS = ("megakernel",)
HOST_OPS = ("overhead",)
TRAIN_OPS = ("train_tp",)
#: every benchmark, by module (the help text is derived from this, so it cannot drift)
FAMILIES = {"collectives": COLLECTIVE_OPS, "gemm": GEMM_OPS, "moe": MOE_OPS,
            "attention": ATTN_OPS, "megakernel": MEGAKERNEL_OPS, "overhead": HOST_OPS,
            "train_tp": TRAIN_OPS}
