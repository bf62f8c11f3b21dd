"""The simulator tells the truth (issue 24): per-thread code on dl.tid(), bf16 arithmetic, fp8 conversions and
libdevice as a GPU computes them (checked against torch), tensor descriptors (padding, clipping, race finder),
and ditron.compile taking every option of Triton's backend."""
import os

import pytest

import bodies_sim_fidelity as B
import ditron
from ditron.errors import DitronCompileError, DitronRankError

# Every body also runs on GPUs (DITRON_TEST_BACKEND=p2p torchrun --nproc-per-node N -m pytest ...), which checks
# that the simulator's answers are the GPU's; the refusal tests are simulator-only.
sim_only = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim", reason="simulator behaviour")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_thread_i_signals_and_waits_for_peer_i(dist_world, n):
    # num_warps=2: 64 threads; threads 0..n-1 each signal and wait for one peer; one scalar store by thread 0;
    # a scalar dl.atomic_add and a thread-level shmem.signal_op outside the branch run in all 64 threads
    assert dist_world(n).run(B.thread_barrier) == [([1] * n, [64, n, 64], 64 + 100)] * n


@pytest.mark.parametrize("which,message", [
    ("wait", "dl.wait inside a branch or loop on dl.tid()"),
    ("ballot", "dl.ballot_sync is warp-collective, but in warp 0 only lanes 0-15 reached it, lanes 16-31 did not"),
    ("tl_atomic", "tl.atomic_* inside a branch or loop on dl.tid()"),
    ("putmem_block", "shmem.putmem_block inside a branch or loop on dl.tid()"),
    ("tile_store", "tl.store of a 2-element tile inside a branch or loop on dl.tid()"),
])
@sim_only
def test_thread_code_the_simulator_cannot_model_is_refused(dist_world, which, message):
    with pytest.raises(DitronRankError) as info:
        dist_world(1).run(B.refused, which)
    assert message in str(info.value) + info.value.traceback_text


def test_bf16_elementwise_arithmetic_matches_torch_bitwise(dist_world):
    assert dist_world(1).run(B.bf16_arith) == [1000]


def test_fp8_conversions_round_and_saturate_like_sm90(dist_world):
    assert dist_world(1).run(B.fp8_convert) == [B.fp8_values().numel()]


def test_libdevice_functions_compute_real_values(dist_world):
    assert dist_world(1).run(B.libdevice_math) == [100]


def test_libdevice_without_counterpart_is_refused():
    from ditron.sim.numerics import libdevice_function
    assert libdevice_function("__nv_expf")[1] is not None and libdevice_function("__nv_fast_expf")[1] is not None
    assert libdevice_function("__nv_j0f")[1] is not None         # mpmath's Bessel function (issue 56)
    assert libdevice_function("__nv_rcp64h")[1] is None           # the hardware's approximation: refused


def test_tensor_descriptor_load_store_pads_and_clips(dist_world):
    assert dist_world(1).run(B.descriptors) == [37 * 52]


def test_compile_accepts_every_backend_option():
    from kernels_for_tests import k_thread_ids
    sig = {"out": "*i32"}
    ck = ditron.compile(k_thread_ids, target="gfx942", signature=sig, waves_per_eu=2, matrix_instr_nonkdim=16)
    assert "hsaco" in ck.asm
    with pytest.raises(DitronCompileError) as info:
        ditron.compile(k_thread_ids, target="sm_90a", signature=sig, waves_per_eu=2)
    assert "waves_per_eu" in str(info.value) and "maxnreg" in str(info.value)


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_consume_token_on_a_descriptor_compiles(target):
    ck = ditron.compile(B.desc_kernel, target=target,
                        signature={"x_ptr": "*fp32", "o_ptr": "*fp32", "sig_ptr": "*i32", "M": "i32", "N": "i32"},
                        constexprs={"BM": 16, "BN": 32})
    assert "dist.consume_token(value=xd : !tt.tensordesc" in ck.asm["dist_ir"]
