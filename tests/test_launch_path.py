"""The per-launch host path stays cheap (issue 51): over 100 launches of a warmed kernel, nothing that depends
only on the kernel, the target, the world or the specialisation is computed again -- no target parsing, no
device-library lookup, no argument analysis, no lint, no distributed-IR recording -- on the GPU launch path
(Triton's own ``JITFunction.run`` over a stub driver, tests/stub_driver.py) and on the simulator's.  And the
checks that catch real mistakes still run on every launch."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton.language as tl

import ditron
import ditron.language as dl
from ditron import analysis, lint
from ditron.lowering import devlib

from stub_driver import stub_driver, stub_world

JIT = sys.modules["ditron.jit"]


def _add(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def _remote_add(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    peer = dl.symm_at(x_ptr, (dl.rank() + 1) % dl.num_ranks())
    tl.store(o_ptr + offs, tl.load(peer + offs, mask=m), mask=m)


class Counts:
    """Counts the calls into the expensive parts of a launch (patched where the launch path looks them up)."""

    PARTS = {
        "target parsing": [(JIT, "parse_target")],
        "library lookup": [(JIT, "library_options"), (JIT, "_library_options"), (devlib.DeviceLibrary, "path")],
        "argument analysis": [(analysis, "symmetric_params"), (analysis, "check_symmetric_args")],
        "lint": [(lint, "lint"), (lint, "report")],
        "IR recording": [(JIT, "recording")],
        "driver target query": [],
    }

    def __init__(self, monkeypatch, driver=None):
        self.n = {k: 0 for k in self.PARTS}
        for part, places in self.PARTS.items():
            for owner, name in places:
                monkeypatch.setattr(owner, name, self._counted(part, getattr(owner, name)))
        if driver is not None:
            monkeypatch.setattr(driver, "get_current_target", self._counted("driver target query",
                                                                           driver.get_current_target))

    def _counted(self, part, fn):
        def wrapper(*args, **kwargs):
            self.n[part] += 1
            return fn(*args, **kwargs)
        return wrapper

    def reset(self):
        for k in self.n:
            self.n[k] = 0


def _launch_100(kernel, x, y, o):
    for _ in range(100):
        kernel[(4,)](x, y, o, 4096, BLOCK=1024)


def test_warm_launches_compute_nothing_again_without_a_world(monkeypatch):
    kernel = ditron.jit(_add)
    x, y, o = torch.rand(4096), torch.rand(4096), torch.empty(4096)
    with stub_driver() as drv:
        counts = Counts(monkeypatch, drv)
        kernel[(4,)](x, y, o, 4096, BLOCK=1024)          # compiles (sm_90), records, lints
        assert counts.n["target parsing"] >= 1 and counts.n["library lookup"] >= 1
        assert counts.n["IR recording"] == 1
        counts.reset()
        before = drv.launches
        _launch_100(kernel, x, y, o)
        assert drv.launches - before == 100               # every launch reached the launcher
    assert counts.n == {k: 0 for k in counts.n}, counts.n


def test_warm_launches_compute_nothing_again_in_a_world(monkeypatch):
    """With a world: the symmetric-argument check and the transport's launch hook run on every launch, from
    what the first launch computed (the analysis of the kernel's source runs once)."""
    kernel = ditron.jit(_remote_add)
    with stub_driver() as drv, stub_world() as world:
        x = ditron.symm_zeros((4096,), torch.float32, name="x")
        o = torch.empty(4096)
        counts = Counts(monkeypatch, drv)
        kernel[(4,)](x, o, 4096, BLOCK=1024)
        assert counts.n["argument analysis"] >= 1           # the kernel's source analysed (once)
        counts.reset()
        checks = world.transport.launch_checks
        for _ in range(100):
            kernel[(4,)](x, o, 4096, BLOCK=1024)
        assert world.transport.launch_checks - checks == 100
        assert counts.n == {k: 0 for k in counts.n}, counts.n
        # the mistakes are still caught on a warm kernel, before launch
        with pytest.raises(ditron.DitronError, match="not a symmetric tensor|symmetric"):
            kernel[(4,)](torch.zeros(4096), o, 4096, BLOCK=1024)
        with ditron.heap_scope():
            y = ditron.symm_zeros((4096,), torch.float32, name="y")
            kernel[(4,)](y, o, 4096, BLOCK=1024)
        with pytest.raises(ditron.DitronError, match="was freed"):
            kernel[(4,)](y, o, 4096, BLOCK=1024)


def test_launch_state_follows_the_world_and_the_variant(monkeypatch):
    """A new world (or an explicit compile variant) gets its own libraries: the P2P world's kernels link the
    p2p variant of the device library, the world-less launch the nvshmem one -- and the cache keeps no world
    object alive."""
    from ditron.lowering import cuda
    import weakref
    kernel = ditron.jit(_add)
    x, y, o = torch.rand(4096), torch.rand(4096), torch.empty(4096)
    with stub_driver():
        kernel[(4,)](x, y, o, 4096, BLOCK=1024)
        plain = dict(kernel.libraries)
        with stub_world() as world:
            kernel[(4,)](x, y, o, 4096, BLOCK=1024)
            in_world = dict(kernel.libraries)
            ref = weakref.ref(world)
        with cuda.compile_variant("p2p", bounded=True):
            kernel[(4,)](x, y, o, 4096, BLOCK=1024)
            bounded = dict(kernel.libraries)
    name = cuda.LIB.name
    assert cuda.variant_of_path(plain[name]) == ("nvshmem", False)
    assert cuda.variant_of_path(in_world[name]) == ("p2p", False)
    assert cuda.variant_of_path(bounded[name]) == ("p2p", True)
    del world
    import gc
    gc.collect()
    assert ref() is None, "the launch cache keeps a finished world (and its heap) alive"


def test_shmem_kernel_still_gets_its_library_on_first_launch(monkeypatch, nvshmem_bc):
    """The NeedLibrary retry (tracing asks for NVSHMEM's bitcode) still works through the launch state, once."""
    from ditron.language import shmem

    def _pe(o_ptr):
        tl.store(o_ptr, shmem.my_pe())

    kernel = ditron.jit(_pe)
    o = torch.zeros(1, dtype=torch.int32)
    with stub_driver() as drv:
        kernel[(1,)](o)
        assert "libnvshmem_device" in kernel._needs["cuda"]
        assert any("nvshmem" in k for k in kernel.libraries)
        counts = Counts(monkeypatch, drv)
        for _ in range(20):
            kernel[(1,)](o)
    assert counts.n == {k: 0 for k in counts.n}, counts.n


SIM_SCRIPT = textwrap.dedent("""
    import torch, triton.language as tl, ditron
    from ditron import analysis, lint, target
    import ditron.jit
    J = __import__("sys").modules["ditron.jit"]
    counts = {}
    def counted(owner, name):
        fn = getattr(owner, name)
        def w(*a, **k):
            counts[name] = counts.get(name, 0) + 1
            return fn(*a, **k)
        setattr(owner, name, w)
    for owner, name in ((analysis, "symmetric_params"), (analysis, "check_symmetric_args"), (lint, "lint"),
                        (J, "parse_target"), (J, "library_options")):
        counted(owner, name)

    @ditron.jit
    def k(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.arange(16, dtype=torch.float32); o = torch.empty(16)
    k[(1,)](x, o, 16, BLOCK=16)
    first = dict(counts); counts.clear()
    for _ in range(100):
        k[(1,)](x, o, 16, BLOCK=16)
    assert torch.equal(o, x + 1)
    print("FIRST", sorted(first.items()), "WARM", sorted(counts.items()))
""")


def test_simulator_launch_path_computes_nothing_again(tmp_path):
    script = tmp_path / "sim_launch.py"
    script.write_text(SIM_SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("FIRST"))
    first, warm = line.split(" WARM ")
    assert "('lint', 1)" in first, line
    assert warm.strip() == "[]", line


def test_zoo_ops_direct_launch_is_the_launch_triton_makes(monkeypatch):
    """From the second call of a shape a zoo op launches its compiled kernel directly (kernels/_common.py:
    CollectiveContext.launch): the launcher must receive exactly what Triton's own path gives it -- the same
    binary, grid and arguments -- and a call whose tensors Triton specialises differently (a 16-byte
    misaligned view) must take Triton's path and get its own binary."""
    import ditron.kernels as K
    seen = []
    with stub_driver() as drv, stub_world(1 << 24):
        real = drv.launcher_cls

        def hook(h):
            # an empty hook chain (Triton >= 3.5 always passes one) calls nothing: the direct launch passes None
            return None if h is None or not getattr(h, "calls", True) else h

        class Recording(real):
            def __call__(self, *args):
                # (grid, stream, function, packed metadata, <launch metadata: a new object per launch, made only
                # for a hook>, enter hook, exit hook, args)
                enter_h, exit_h = hook(args[7]), hook(args[8])
                meta = type(args[6]).__name__ if enter_h is not None or exit_h is not None else "no hook"
                seen.append(args[:6] + (meta, enter_h, exit_h) + tuple(
                    (a.data_ptr(), a.dtype, tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a
                    for a in args[9:]))
                return super().__call__(*args)
        drv.launcher_cls = Recording
        bf = torch.bfloat16
        ctx = K.create_all_reduce_context(4096, bf)
        x, out = torch.randn(4096, dtype=bf), torch.empty(4096, dtype=bf)
        counts = Counts(monkeypatch, drv)
        K.all_reduce(x, ctx, out=out)          # Triton's path (compiles)
        K.all_reduce(x, ctx, out=out)          # direct
        assert len(seen) == 2 and seen[0] == seen[1], "the direct launch differs from Triton's"
        counts.reset()
        for _ in range(50):
            K.all_reduce(x, ctx, out=out)
        assert counts.n == {k: 0 for k in counts.n}, counts.n
        assert all(s == seen[0] for s in seen[2:])
        # a misaligned x (and out): another specialisation, through Triton's path, then direct again
        xs, outs = torch.randn(4097, dtype=bf)[1:], torch.empty(4097, dtype=bf)[1:]
        n0 = len(seen)
        K.all_reduce(xs, ctx, out=outs)
        K.all_reduce(xs, ctx, out=outs)
        assert seen[n0][4] != seen[0][4], "a misaligned argument reused the aligned binary"
        assert seen[n0] == seen[n0 + 1]
        # the gemm ops and EP take the same direct path
        a, b = torch.randn(32, 64, dtype=bf), torch.randn(64, 64, dtype=bf)
        gctx = K.create_gemm_ar_context(32, 64, bf)
        o = torch.empty(32, 64, dtype=bf)
        n0 = len(seen)
        K.gemm_ar(a, b, gctx, out=o)
        K.gemm_ar(a, b, gctx, out=o)
        assert seen[n0] == seen[n0 + 1]
        # EP (low latency): dispatch + combine alternate between two buffer sets, so calls 1 and 3 (Triton's
        # path, then direct) must hand the launcher the same launches
        T, H, E, k = 8, 64, 4, 2
        x = torch.randn(T, H, dtype=bf)
        idx = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).to(torch.int32)
        w = torch.rand(T, k)
        ectx = K.create_ep_context(T, H, E, k, bf, mode="low_latency")
        n0 = len(seen)
        for _ in range(3):
            recv, _, handle = K.ep_dispatch(x, idx, w, ectx, validate=False)
            K.ep_combine(recv, handle, ectx)
        assert len(seen) == n0 + 6
        assert seen[n0:n0 + 2] == seen[n0 + 4:n0 + 6], "EP's direct launches differ from Triton's"
        # EP's launch constants are planned once per call shape: warm calls compute none of them again, and a
        # tuning attribute set on the context (ll_strided) drops the plans, so the next call follows it
        import ditron.kernels.ep_tiles as ep_tiles       # _plan (kernels/ep_tiles.py) calls its _constexprs
        n_const = []
        monkeypatch.setattr(ep_tiles, "_constexprs", lambda *a, _f=ep_tiles._constexprs, **k: n_const.append(1) or
                            _f(*a, **k))
        for _ in range(20):
            recv, _, handle = K.ep_dispatch(x, idx, w, ectx, validate=False)
            K.ep_combine(recv, handle, ectx)
        assert not n_const, f"{len(n_const)} constexpr computations in 20 warm EP calls"
        ectx.ll_strided = True
        assert not ectx.plans and not ectx.calls_planned
        recv, _, handle = K.ep_dispatch(x, idx, w, ectx, validate=False)
        assert n_const and seen[-1] != seen[n0], "the strided dispatch launched the contiguous one's constants"


class TorchCalls(torch.overrides.TorchFunctionMode):
    """Counts the torch functions and tensor methods called from Python inside the block."""

    def __init__(self):
        super().__init__()
        self.n = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.n[name] = self.n.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


#: what a warm EP call may ask torch: metadata reads (``__get__``: shape, dtype, device), pointers, strides
EP_WARM_TORCH = {"__get__", "data_ptr", "stride"}


def test_ep_warm_calls_do_only_per_call_work(monkeypatch):
    """EP's eager path (issue 51; kernels/ep.py ``_Call``): a call whose argument signature was seen before runs
    none of the checks again (``_dispatch_checked`` / ``_combine_checked``, ``enter``, the keyed launch lookup),
    makes no launch metadata without a launch hook, and asks torch nothing but metadata (no view, no copy, no
    allocation, no host read) -- in low-latency mode with the DeepEP layer's arguments (counts, out,
    topk_weights) and in normal mode.  What depends on more than the signature still runs every call (the
    transport's launch check, the cross-rank call count, ``validate``'s read), and every mistake is still caught
    before launch: an argument in the symmetric heap (aliasing the context's buffers, or freed), another world, a
    wrong shape, a handle of the other mode."""
    import triton.compiler.compiler as tcc
    import ditron.kernels as K
    import ditron.kernels.ep as ep_mod
    from ditron.kernels import _common

    work = {}

    def counted(owner, name):
        fn = getattr(owner, name)

        def wrapper(*a, **k):
            work[name] = work.get(name, 0) + 1
            return fn(*a, **k)
        monkeypatch.setattr(owner, name, wrapper)

    for owner, name in ((ep_mod, "_dispatch_checked"), (ep_mod, "_combine_checked"), (ep_mod, "enter"),
                        (ep_mod, "_check_inputs"), (_common.CollectiveContext, "launch"),
                        (tcc.CompiledKernel, "launch_metadata")):
        counted(owner, name)
    bf = torch.bfloat16
    T, H, E, k = 8, 64, 4, 2
    x = torch.randn(T, H, dtype=bf)
    idx = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, k)
    with stub_driver() as drv, stub_world(1 << 24) as world:
        ll = K.create_ep_context(T, H, E, k, bf, mode="low_latency")
        nm = K.create_ep_context(T, H, E, k, bf)
        counts = [torch.empty(E, dtype=torch.int32) for _ in range(2)]
        out = torch.empty(T, H, dtype=bf)
        w2 = torch.rand(T, k)

        def ll_call(validate=False):
            recv, rc, h = K.ep_dispatch(x, idx, w, ll, validate=validate)
            return recv, rc, h, K.ep_combine(recv, h, ll)

        def deep_ep_call(i):          # ditron/deep_ep.py's low-latency arguments
            recv, rc, h = ep_mod._dispatch(x, idx, w, ll, validate=False, counts=counts[i % 2])
            assert rc is counts[i % 2]
            return ep_mod._combine(recv, h, ll, out=out, topk_weights=w2)

        def normal_call():
            recv, rc, h = K.ep_dispatch(x, idx, w, nm, validate=False)
            return K.ep_combine(recv, h, nm)

        for i in range(3):            # both call parities through the checks (compiles), then planned
            ll_call()
            deep_ep_call(i)
            normal_call()
        assert len(ll.calls_planned) == 4 and len(nm.calls_planned) == 2
        work.clear()
        launches, checks = drv.launches, world.transport.launch_checks
        board_ll, board_nm = ll.board.calls, nm.board.calls
        outs = set()
        with TorchCalls() as torch_calls:
            for i in range(20):
                p = ll.dcalls_host % 2
                recv, rc, h, o = ll_call()
                assert recv is ll.slots[p]["recv_x"] and rc is ll.slots[p]["recv_counts"]
                assert h.weights is w and h.T == T and h.k == k and h.pslot is ll.slots[p]["pslot"]
                outs.add(id(o))
                assert deep_ep_call(i) is out
                outs.add(id(normal_call()))
        assert work == {}, f"checks / lookups ran again on 20 warm calls of each kind: {work}"
        assert set(torch_calls.n) <= EP_WARM_TORCH, f"torch work on the warm EP path: {torch_calls.n}"
        assert drv.launches - launches == 20 * (2 + 2 + 3)
        assert world.transport.launch_checks - checks == 20 * (2 + 2 + 3), "the launch check must run every launch"
        assert ll.board.calls - board_ll == 20 * 4 and nm.board.calls - board_nm == 20 * 2
        assert len(outs) == 3               # the context's output: ll's parity 0 (deep_ep_call is 1), nm's two
        # a planned call launches exactly what the checked path launches for the same call parity: the same
        # kernels, grids and arguments (buffers, sizes, constants) -- two rounds planned, then two checked
        def round_log(i):
            n = len(drv.log)
            ll_call()
            deep_ep_call(i)
            normal_call()
            return drv.log[n:]
        planned = [round_log(i) for i in range(20, 22)]
        checked = []
        for i in range(22, 24):
            for ctx in (ll, nm):
                ctx.calls_planned.clear()
            checked.append(round_log(i))
        assert work.get("_dispatch_checked") == 6, work
        assert planned == checked, "a planned EP call launches other arguments than the checked path"
        # a launch hook (a profiler's) still sees every direct launch, with its metadata
        import triton
        chain, seen_hooks = triton.knobs.runtime.launch_enter_hook, []

        def on_launch(meta):
            seen_hooks.append(meta.get()["name"])
        chain.add(on_launch)
        try:
            ll_call()
            normal_call()
        finally:
            chain.remove(on_launch)
        assert seen_hooks == ["ep_ll_dispatch_kernel", "ep_ll_combine_kernel", "ep_route_kernel",
                              "ep_dispatch_kernel", "ep_combine_kernel"], seen_hooks
        # validate=True still reads the ids back every call (and finds a bad one), on a planned signature
        with TorchCalls() as torch_calls:
            ll_call(validate=True)
        assert torch_calls.n.get("any") == 1
        bad = idx.clone()
        bad[3, 1] = E
        with pytest.raises(ditron.DitronError, match=r"topk_idx\[3, 1\] = 4 is not an expert id"):
            K.ep_dispatch(x, bad, w, ll)
        # the mistakes of a planned signature are still caught before launch
        launches = drv.launches
        alias = ll.lrecv.view(torch.bfloat16).reshape(-1)[:T * H].view(T, H)   # x's signature, in ll's buffers
        with pytest.raises(ditron.DitronError, match="overlaps this context's own buffers"):
            K.ep_dispatch(alias, idx, w, ll, validate=False)
        with ditron.heap_scope():
            xs = ditron.symm_zeros((T, H), bf, name="xs")
            work.clear()
            for _ in range(3):
                recv, _, h = K.ep_dispatch(xs, idx, w, ll, validate=False)
                K.ep_combine(recv, h, ll)
            assert work.get("_dispatch_checked") == 3, "a symmetric argument must get the full checks"
        with pytest.raises(ditron.DitronError, match="was freed"):
            K.ep_dispatch(xs, idx, w, ll, validate=False)
        with pytest.raises(ditron.DitronError, match="x must be"):
            K.ep_dispatch(x[:, :32], idx, w, ll, validate=False)
        recv, _, h = K.ep_dispatch(x, idx, w, ll, validate=False)
        with pytest.raises(ditron.DitronError, match="y must have recv_x's shape"):
            K.ep_combine(recv[:, :4], h, ll)
        _, _, hn = K.ep_dispatch(x, idx, w, nm, validate=False)
        with pytest.raises(ditron.DitronError, match="handle must come from ep_dispatch"):
            K.ep_combine(recv, hn, ll)
        K.ep_combine(recv, h, ll)
        with stub_world():
            with pytest.raises(ditron.DitronError, match="another ditron world"):
                ll_call()
        launches = drv.launches - launches
        assert launches == 2 * 3 + 1 + 2 + 1, launches     # the calls that raised launched nothing


def test_ep_fp8_prequant_planned_calls_launch_what_the_checked_path_launches():
    """``ll_fp8_prequant``: a planned fp8 dispatch launches the quantisation kernel then the dispatch, with the same
    kernels, grids and arguments as the checked path (the staging as the dispatch's input)."""
    import ditron.kernels as K
    bf = torch.bfloat16
    T, H, E, k = 8, 256, 4, 2
    x = torch.randn(T, H, dtype=bf)
    idx = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, k)
    with stub_driver() as drv, stub_world(1 << 24):
        ll = K.create_ep_context(T, H, E, k, bf, mode="low_latency")
        ll.ll_fp8_prequant = True

        def call():
            n = len(drv.log)
            K.ep_dispatch(x, idx, w, ll, validate=False, use_fp8=True)
            return drv.log[n:]
        first = [call() for _ in range(2)]          # both parities through the checks
        assert len(ll.calls_planned) == 1
        planned = [call() for _ in range(2)]
        ll.calls_planned.clear()
        checked = [call() for _ in range(2)]
        assert [len(c) for c in planned] == [2, 2], planned
        assert planned == checked == first, "a planned fp8 dispatch launches other arguments than the checked path"
        assert ll.launches.get("fp8_quant") == 6 and ll.launches.get("dispatch") == 6, ll.launches
