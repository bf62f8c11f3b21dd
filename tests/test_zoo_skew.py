"""Zoo protocols under skew and reductions at full precision.

Each overlap kernel (AG-GEMM, GEMM-RS, GEMM-AR) and reduction (all_reduce,
reduce_scatter) runs in every producer / method configuration with the last
rank stopped inside the call (ditron.sim.skew, until every other rank is idle):
after its first signal, and at the start of its producer programs.  A consumer that waits for too few
signals reads rows the late rank has not written yet.  The inputs make the
exact result depend on fp32 accumulation (bodies_zoo_skew.py): every output
must equal ``sum(float64).to(dtype)`` bit for bit, in fp16 and bf16.
Skew plans run in fp16 (the protocol does not depend on the dtype); GEMM-RS's
methods share one reduction kernel, so bf16 runs for one of them."""
import pytest

import bodies_zoo_skew as B

CASES = ([("ag_gemm", p, "fp16") for p in ("ce", "sm")]
         + [("gemm_rs", m, "fp16") for m in ("ce", "scatter", "pull")] + [("gemm_rs", "ce", "bf16")]
         + [("gemm_ar", m, d) for m in ("one_shot", "two_shot") for d in ("fp16", "bf16")]
         + [("all_reduce", m, d) for m in ("one_shot", "two_shot", "ll") for d in ("fp16", "bf16")]
         + [("reduce_scatter", m, d) for m in ("mesh", "ring") for d in ("fp16", "bf16")])


@pytest.mark.parametrize("op,method,dtype", CASES)
def test_exact_under_skew(dist, op, method, dtype):
    body = getattr(B, f"{op}_skew")
    res = dist.run(body, method, dtype)
    for rank, plans in enumerate(res):
        assert plans and all(p[1] == 0 for p in plans), f"rank {rank}: mismatching elements per plan {plans}"
    if dist.backend == "sim" and dist.world_size > 1 and dtype == "fp16":
        # (the ll all_reduce signals with packets, not signal ops: its programs are delayed instead)
        assert res[0][0][0] == "signals" and sum(p[2] for p in res[-1]) > 0, f"the late rank was not delayed: {res[-1]}"
