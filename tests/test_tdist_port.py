"""Triton-distributed's names on ditron (issue 24, names/ports half): the alias
modules, the host helpers of ``triton_dist.utils``, conformance kernels in
Triton-distributed's style on 2, 3 and 4 simulated ranks
(tests/bodies_tdist.py), and compile tests of the new names for sm_90a and
gfx942."""
import importlib

import pytest

import ditron
from conftest import TARGETS, compile_for, device_asm

import bodies_tdist as B


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_conformance_kernels(dist_world, n):
    d = dist_world(n)
    assert d.run(B.run_all) == [[b.__name__ for b in B.ALL]] * n


def test_conformance_kernels_on_two_nodes(dist_world):
    d = dist_world(4, 2)
    assert d.run(B.run_inter_node) == [["allgather_putmem_signal", "node_team_allreduce", "host_helpers"]] * 4


def test_alias_modules_are_ditrons():
    import triton_dist
    import triton_dist.language as dl
    import triton_dist.language.extra.cuda.language_extra as cuda_extra
    from ditron.language import extra, shmem
    from triton_dist.language.extra import language_extra, libshmem_device
    from triton_dist.language.extra.cuda import libnvshmem_device
    assert triton_dist.jit is ditron.jit
    assert cuda_extra is language_extra and language_extra.ld_acquire is extra.ld_acquire
    assert libnvshmem_device is libshmem_device and libshmem_device.putmem_signal_block is shmem.putmem_signal_block
    assert dl.symm_at is ditron.language.symm_at and dl.simt_exec_region is ditron.language.simt_exec_region
    assert dl.notify is extra.notify                  # Triton-distributed's default comm_scope
    # triton.* names (never written into Triton's package: a meta-path finder, ditron/aliases.py)
    assert importlib.import_module("triton.language.extra.cuda.language_extra") is language_extra
    assert importlib.import_module("triton.language.extra.libshmem_device") is libshmem_device
    assert importlib.import_module("triton.distributed.language") is dl
    assert dl.__spec__.name == "triton_dist.language"
    import triton.language.extra.cuda.libdevice       # Triton's own modules still win
    assert libshmem_device.NVSHMEMX_TEAM_NODE == 2 and libshmem_device.NVSHMEM_TEAM_WORLD == 0


def test_missing_names_say_what_to_use():
    import triton_dist.language as dl
    import triton_dist.utils as U
    from triton_dist.language.extra import language_extra
    with pytest.raises(AttributeError, match="Triton allocates shared memory"):
        dl.allocate_smem
    with pytest.raises(AttributeError, match="dl.ld on a tile"):
        language_extra.ld_vector
    with pytest.raises(AttributeError, match="does not provide"):
        language_extra.no_such_name
    with pytest.raises(AttributeError, match="not provided by ditron"):
        U.generate_data


def test_simt_region_runs_per_thread(dist_world):
    # issue 56: the simulator runs the region in every thread (it refused it before); the barrier completes and
    # every flag is consumed, on GPUs as well
    assert dist_world(2).run(B.simt_region_on_sim) == [[0, 0]] * 2


def test_packed_multicast_helpers_compile():
    # issue 56: refused before (naming dl.multimem_ld_reduce); now ops of their own (tests/test_multimem_packed.py)
    ck = compile_for(B.packed_multimem_kernel, "sm_90a", {"p": "*fp16", "out": "*i32"})
    assert "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2" in ck.asm["ptx"]


# ---------------------------------------------------------------------------
# compile tests for sm_90a and gfx942
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_simt_region_compiles(target):
    ck = compile_for(B.simt_barrier_kernel, target, {"flags": "*i32", "rank": "i32", "n": "i32"})
    assert "dist.simt_region()" in ck.asm["dist_ir"]
    asm = device_asm(ck)
    if target == "sm_90a":
        assert "%tid.x" in asm              # (block_size is unused here, so %ntid.x is dead code)
        assert "atom.release.sys.global.cas.b32" in asm and "ld.acquire.sys.global.b32" in asm
    else:
        assert "global_atomic_cmpswap" in asm or "flat_atomic_cmpswap" in asm


@pytest.mark.parametrize("target", TARGETS)
def test_language_extra_defaults_and_vectors_compile(target):
    sig = {"src": "*i32", "dst": "*i32", "flag": "*i32"}
    ck = compile_for(B.extra_names_kernel, target, sig)
    ir = ck.asm["dist_ir"]
    # Triton-distributed's defaults: ld / st / atomic_add relaxed at GPU scope, fence sc
    assert 'dist.ld(' in ir and '{scope = "gpu", semantic = "relaxed"}' in ir
    assert 'dist.fence() {semantic = "sc", scope = "gpu"}' in ir
    assert 'dist.ld(ptr=flag' in ir and 'semantic = "acquire"' in ir          # ld_acquire
    if target == "sm_90a":
        asm = device_asm(ck)
        assert "ld.relaxed.gpu.global.b32" in asm and "fence.sc.gpu" in asm
        assert "atom.relaxed.gpu.global.add" in asm and "ld.acquire.sys.global.b32" in asm


def test_notify_keeps_triton_distributeds_default():
    import inspect
    import triton_dist.language as dl
    assert inspect.signature(dl.notify).parameters["comm_scope"].default == "inter_node"
    assert inspect.signature(ditron.language.notify).parameters["comm_scope"].default == "intra_node"


def test_node_team_multicast_refused_on_gfx942():
    # (sm_90a: the same kernel runs in the conformance set; multimem PTX is pinned by test_zoo_all_reduce)
    with pytest.raises(Exception, match="multicast memory exists only on NVIDIA"):
        compile_for(B.node_team_allreduce_kernel, "gfx942", {"symm_in": "*fp16", "out": "*fp16", "n": "i32"},
                    {"BLOCK": 64})


def test_triton_cuda_utils_imported_by_name(dist_world):
    # issue 56: stock Triton's num_warps() / num_threads() / globaltimer() failed on the interpreter ("Did you
    # forget to add @triton.jit ?"); smid() is refused with a message; language_extra's num_warps /
    # threads_per_warp / num_threads (Triton-distributed's EP all-to-alls) were missing
    assert dist_world(1).run(B.cuda_utils) == [([64, 64, 1, 64], True)]
