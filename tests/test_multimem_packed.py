"""Triton-distributed's packed multicast helpers (issue 56): on the simulator per
thread with a GPU's rounding (tests/bodies_multimem_packed.py), and compiled
for sm_90a (NVLink multicast is off on the lent GPUs: compile-only there)."""
import pytest

from conftest import compile_for

import bodies_multimem_packed as B


@pytest.mark.parametrize("n", [2, 3])
def test_one_shot_bf16_rounds_once_like_the_gpu(dist_world, n):
    got = dist_world(n).run(B.one_shot, "bf16")
    # element 0: rank 0's 1.0 plus 2**-8 from each other rank, summed in fp32 and rounded once: 1 + 2**-8 is a tie
    # (rounds to even: 1.0), 1 + 2 * 2**-8 is exact (rounding after each addition would give 1.0 again)
    assert got[0][0] == (1.0 + (n - 1) * 2.0 ** -8 if n > 2 else 1.0)


def test_one_shot_fp16_and_fp32(dist_world):
    d = dist_world(2)
    d.run(B.one_shot, "fp16")
    d.run(B.one_shot, "fp32")


@pytest.mark.parametrize("n", [2, 4])
def test_two_shot_in_place(dist_world, n):
    dist_world(n).run(B.two_shot, "bf16")


def test_every_store_form_and_the_masked_variants(dist_world):
    assert dist_world(2).run(B.stores_and_masks) == ["ok"] * 2


def test_misaligned_vector_is_refused(dist_world):
    msg = dist_world(2).run(B.misaligned)[0]
    assert "16-byte aligned" in msg and "multimem_ld_reduce_v4" in msg


SIG = {"symm_in": "*bf16", "out": "*bf16", "elems": "i32"}


def test_packed_helpers_compile_for_sm90a(nvshmem_bc):      # (remote_mc_ptr links NVSHMEM)
    ck = compile_for(B.one_shot_kernel, "sm_90a", SIG)
    ptx = ck.asm["ptx"]
    assert "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2" in ptx
    assert "dist.multimem_ld_reduce_v4(" in ck.asm["dist_ir"]
    two = compile_for(B.two_shot_kernel, "sm_90a", {"symm": "*fp16", "elems": "i32", "rank": "i32",
                                                    "world_size": "i32"})
    assert "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2" in two.asm["ptx"]
    assert "multimem.st.relaxed.sys.global.b64" in two.asm["ptx"]
    st = compile_for(B.stores_kernel, "sm_90a", {"dst": "*fp32", "src": "*fp32", "mask_src": "*i32"})
    ptx = st.asm["ptx"]
    for form in ("b32", "v2.f32", "v4.f32", "b64"):
        assert f"multimem.st.relaxed.sys.global.{form}" in ptx, form
    assert "L_mm_skip_" in ptx                    # the masked store branches around the instruction
    ld = compile_for(B.masked_reduce_kernel, "sm_90a", {"symm_in": "*fp32", "out": "*fp32", "mask_src": "*i32"})
    assert "multimem.ld_reduce.acquire.sys.global.add.v4.f32" in ld.asm["ptx"]
    assert "cubin" in ld.asm


def test_packed_helpers_refused_on_gfx942():
    with pytest.raises(Exception, match="multicast memory exists only on NVIDIA"):
        compile_for(B.one_shot_kernel, "gfx942", SIG)
