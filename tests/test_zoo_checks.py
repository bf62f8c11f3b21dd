"""Cross-rank argument checks field by field: for every fingerprint field of
every zoo op, a call where only the last rank's value of that field differs
fails on every rank, naming the field and each rank's value; kernel launches
with mixed symmetric / plain operands are refused naming the plain one."""
import os

import pytest

import bodies_zoo_checks as B

pytestmark = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                                reason="the cross-rank checks run on GPUs with DITRON_DEBUG=1 only")

FIELDS = [("all_reduce", f) for f in ("x.shape", "x.dtype", "method", "block", "chunk", "programs")] + \
         [(op, f) for op in ("all_gather", "reduce_scatter") for f in ("x.shape", "x.dtype", "method")] + \
         [("all_to_all", f) for f in ("x.shape", "x.dtype")] + \
         [("all_to_all_v", f) for f in ("x.shape[1:]", "x.dtype")] + \
         [("ag_gemm", f) for f in ("a.shape", "a.dtype")] + \
         [("gemm_rs", f) for f in ("a.shape", "a.dtype", "b.shape")] + \
         [("gemm_ar", f) for f in ("M", "a.dtype", "method")]

_RESULTS = {}


@pytest.fixture
def divergent(dist):
    """Every case in one run of the shared cluster (errors come before any launch)."""
    key = dist.world_size
    if key not in _RESULTS:
        res = dist.run(B.divergent_fields, FIELDS)
        _RESULTS[key] = {case: [r[i] for r in res] for i, case in enumerate(FIELDS)}
    return _RESULTS[key]


@pytest.mark.parametrize("op,field", FIELDS)
def test_each_fingerprint_field_is_checked(dist, divergent, op, field):
    if dist.world_size == 1:
        pytest.skip("one rank has no one to disagree with")
    msgs = divergent[(op, field)]
    assert all(m is not None for m in msgs), f"a rank did not raise: {msgs}"
    assert len(set(msgs)) == 1, msgs
    assert f"{op}: ranks disagree on argument '{field}'" in msgs[0], msgs[0]
    for r in range(dist.world_size):
        assert f"rank {r}: " in msgs[0]


def test_mixed_symmetric_and_plain_operands(dist):
    for msgs in dist.run(B.mixed_operands):
        for m, plain in zip(msgs[:4], ("y_ptr", "y_ptr", "x_ptr", "x_ptr")):
            assert m is not None and f"argument '{plain}' reaches" in m and "symmetric" in m, m
        assert msgs[4] is None, msgs[4]
