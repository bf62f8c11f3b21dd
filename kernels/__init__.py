"""ditron's kernel zoo, written in ``ditron.language`` (importable as
``ditron.kernels``): the collectives (all_gather, reduce_scatter,
all_reduce, all_to_all) with reusable contexts, the GEMM core (``matmul``) and the
GEMM-overlap kernels (AllGather-GEMM, GEMM-ReduceScatter, GEMM-AllReduce), the MoE kernels
(grouped GEMM, EP dispatch / combine, AG-MoE, MoE-RS, MoE-AR), the attention kernels (ring
attention, distributed flash-decoding), and the porting
examples of docs/porting.md and docs/zoo.md.  See docs/zoo.md."""
from .ag_gemm import ag_gemm, create_ag_gemm_context
from .attention import create_ring_attention_context, ring_attention
from .all_gather import all_gather, create_all_gather_context
from .all_reduce import all_reduce, choose_method, create_all_reduce_context, multicast_available
from .all_to_all import all_to_all, all_to_all_v, create_all_to_all_context
from .flash_decode import create_flash_decode_context, flash_decode
from .ep import check_dropped, create_ep_context, ep_combine, ep_dispatch
from .gemm import GemmConfig, matmul, scaled_mm
from .gemm_ar import create_gemm_ar_context, gemm_ar
from .gemm_rs import create_gemm_rs_context, gemm_rs
from .moe import grouped_gemm
from .moe_tp import (ag_moe, create_ag_moe_context, create_moe_ar_context, create_moe_rs_context, moe_ar, moe_plan,
                     moe_rs, plan_gemm)
from .porting_example import copy_kernel, ready_kernel, ring_pull_kernel
from .reduce_scatter import create_reduce_scatter_context, reduce_scatter

__all__ = ["create_all_gather_context", "all_gather", "create_reduce_scatter_context", "reduce_scatter",
           "create_all_reduce_context", "all_reduce", "choose_method", "multicast_available",
           "create_all_to_all_context", "create_ag_gemm_context", "ag_gemm", "create_gemm_rs_context", "gemm_rs",
           "create_gemm_ar_context", "gemm_ar", "grouped_gemm", "create_ep_context", "ep_dispatch", "ep_combine",
           "check_dropped", "create_ag_moe_context", "ag_moe", "create_moe_rs_context", "moe_rs",
           "create_moe_ar_context", "moe_ar", "moe_plan", "plan_gemm",
           "GemmConfig", "matmul", "scaled_mm", "all_to_all", "all_to_all_v", "copy_kernel", "ready_kernel",
           "ring_pull_kernel", "create_ring_attention_context", "ring_attention", "create_flash_decode_context",
           "flash_decode"]
