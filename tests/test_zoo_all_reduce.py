"""The all_reduce zoo kernel (kernels/all_reduce.py): every method and dtype
against torch on 4 simulated ranks (bodies in bodies_zoo_all_reduce.py; the
same bodies run on GPUs under torchrun with DITRON_TEST_BACKEND=p2p|nvshmem),
odd sizes, world sizes 1, 3 and 8, reuse of a context, errors, and the
multimem PTX (multicast is off on the lent GPUs: those variants are
compile-verified here and run on the simulator)."""
import math
import re

import pytest

import bodies_zoo_all_reduce as B
import importlib

AR = importlib.import_module("ditron.kernels.all_reduce")   # the module (ditron.kernels.all_reduce is the function)

PLAIN = ["ll", "one_shot", "two_shot"]
MULTIMEM = ["multimem_one_shot", "multimem_two_shot"]
DTYPES = ["float32", "float16", "bfloat16"]


def _methods(dist, methods):
    """Multimem methods only where multicast exists: the simulator."""
    if dist.backend == "sim":
        return methods
    return [m for m in methods if m not in MULTIMEM]


def _skip_multimem(dist, method):
    if method in MULTIMEM and dist.backend != "sim":
        pytest.skip("NVLink multicast (NVLS) is off on the lent GPUs and must never be created; the multimem "
                    "variants are compile-verified (test_multimem_ptx) and run on the simulator")


def _same_everywhere(results):
    assert all(r == results[0] for r in results), "ranks got different bits"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", PLAIN + MULTIMEM)
def test_methods_dtypes_odd_sizes(dist, method, dtype):
    _skip_multimem(dist, method)
    _same_everywhere(dist.run(B.check_methods, [method], [1, 37, 1000], dtype))


@pytest.mark.parametrize("method", PLAIN + MULTIMEM)
def test_many_chunks_and_programs_in_place(dist, method):
    # small tiles and chunks: several chunks per program, several programs,
    # shards and tails that end inside a tile; out is x
    _skip_multimem(dist, method)
    tuning = {"block": 16, "programs": 3} if method == "ll" else {"block": 16, "chunk": 32, "programs": 3}
    _same_everywhere(dist.run(B.check_methods, [method], [999, 130], "bfloat16", inplace=True, **tuning))


def test_auto_shapes(dist):
    chosen = dist.run(B.shapes_and_auto, "float16")
    assert chosen[0] == ["ll"] * 4


def test_auto_choice_by_size(dist):
    got = dist.run(B.auto_choices, None)[0]
    assert got["torch.bfloat16"] == ["ll", "ll", "one_shot", "one_shot", "two_shot"]
    assert got["torch.float32"] == ["ll", "ll", "one_shot", "one_shot", "two_shot"]


def test_auto_choice_with_multicast_on_the_simulator(dist):
    if dist.backend != "sim":
        pytest.skip("multicast is off on the lent GPUs: auto never picks multimem there")
    got = dist.run(B.auto_choices, True)[0]
    assert got["torch.bfloat16"] == ["ll", "ll", "multimem_one_shot", "multimem_one_shot", "multimem_two_shot"]
    _same_everywhere(dist.run(B.check_methods, ["auto"], [1, 300], "bfloat16", multicast=True))


def test_reuse_iterations(dist):
    # every method on one context, cycled (the buffers and signals are shared between methods; B.reuse cycles
    # 3 sizes); GPUs: 1000 iterations.  Simulator: twice the period of (method, size, buffer parity), 60 for 5
    # methods: every combination, and every method after the one before it, runs twice, the second time over
    # the buffers and flags that earlier calls left (the epoch only grows; nothing wraps)
    methods = _methods(dist, PLAIN + MULTIMEM)
    iters = 2 * math.lcm(len(methods), 3, 2) if dist.backend == "sim" else 1000
    res = dist.run(B.reuse, iters, methods, 120, "bfloat16")
    assert res == [(iters, 0)] * dist.world_size


def test_errors_before_launch(dist):
    counts = dist.run(B.errors)
    assert counts[0] >= 11 and len(set(counts)) == 1


@pytest.mark.parametrize("n", [3, 8])
def test_other_world_sizes(dist_world, n):
    d = dist_world(n)
    # 301 elements: shards with a tail (and, on 8 ranks, an empty last shard)
    sizes = [1, 301] if n == 3 else [301]
    _same_everywhere(d.run(B.check_methods, _methods(d, PLAIN + MULTIMEM), sizes, "bfloat16"))
    if n == 3:
        _same_everywhere(d.run(B.check_methods, PLAIN, [37], "float32"))
    else:
        assert d.run(B.reuse, 6, PLAIN, 40, "float16") == [(6, 0)] * n


def test_world_size_one(dist_world):
    d = dist_world(1)
    d.run(B.check_methods, _methods(d, PLAIN + MULTIMEM), [1, 37, 1000], "float16")
    assert d.run(B.reuse, 20, PLAIN, 50, "float32") == [(20, 0)]


def test_cuda_graph_capture(dist):
    if dist.backend == "sim":
        pytest.skip("CUDA graphs need GPUs (the simulator has no streams)")
    for method in PLAIN:
        assert dist.run(B.cuda_graph, 4096, "bfloat16", method, 5) == [5] * dist.world_size


# ---------------------------------------------------------------------------
# compiled for sm_90a (no GPU needed)
# ---------------------------------------------------------------------------

_PTRS = {"x_ptr": "*{dt}", "out_ptr": "*{dt}", "buf_ptr": "*{dt}", "sig_ptr": "*i32", "sig2_ptr": "*i32",
         "calls_ptr": "*i64", "ll_ptr": "*i64"}
_SIZES = ("n", "nwords", "chunk", "region", "shard", "sstride", "slot")


def _compile(kernel, dt, constexprs, transport, num_warps):
    import ditron
    from ditron.lowering import cuda
    names = [p for p in kernel.arg_names if p not in constexprs]
    sig = {p: _PTRS[p].format(dt=dt) if p in _PTRS else "i32" for p in names}
    # what the GPU launch specialises for tensors and for sizes that are multiples of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(sig) if p in _PTRS or p in _SIZES}
    with cuda.compile_variant(transport):
        return ditron.compile(kernel, target="sm_90a", signature=sig, constexprs=constexprs, attrs=attrs,
                              num_warps=num_warps).asm["ptx"]


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_multimem_ptx(nvshmem_bc, dt):
    acc = ".acc::f32.bf16x2" if dt == "bf16" else ".f32"
    if dt == "bf16":
        ptx1 = _compile(AR.all_reduce_multimem_one_shot_kernel, dt,
                        {"WORLD": 4, "BLOCK": 1024, "MAXCH": AR.MAX_CHUNKS}, "nvshmem", 4)
        assert f"multimem.ld_reduce.relaxed.sys.global.add{acc}" in ptx1
        assert "nvshmemx_mc_ptr" in ptx1
    ptx2 = _compile(AR.all_reduce_multimem_two_shot_kernel, dt, {"WORLD": 4, "BLOCK": 1024, "MAXCH": AR.MAX_CHUNKS},
                    "nvshmem", 4)
    assert f"multimem.ld_reduce.relaxed.sys.global.add{acc}" in ptx2
    assert f"multimem.st.relaxed.sys.global.{'bf16x2' if dt == 'bf16' else 'f32'}" in ptx2


def test_plain_kernels_vectorise_on_sm90a():
    """16-byte peer loads/stores in one-/two-shot; 16-byte LL packet stores and polls."""
    for kernel in (AR.all_reduce_one_shot_kernel, AR.all_reduce_two_shot_kernel):
        ptx = _compile(kernel, "bf16", {"WORLD": 4, "BLOCK": 8192, "MAXCH": AR.MAX_CHUNKS}, "p2p", 16)
        assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx, kernel.__name__
        assert "ld.acquire.sys.global.b32" in ptx and "st.release.sys.global.b32" in ptx
    ptx = _compile(AR.all_reduce_ll_kernel, "bf16", {"WORLD": 4, "EPW": 2, "BW": 1024}, "p2p", 8)
    assert "st.global.v2.b64" in ptx and "ld.volatile.global.v2.b64" in ptx
    assert not re.search(r"ld\.acquire|st\.release", ptx), "LL needs no separate signal"
