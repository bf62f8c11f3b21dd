"""Distributed Gluon kernels (``@ditron.gluon.jit``, ditron/gluon.py; issue 52 item 2): ditron's primitives
compile inside Gluon kernels for sm_90a and gfx942 under every supported Triton, a Gluon kernel launches
through ditron's launch path (device library, world checks, distributed IR; tests/stub_driver.py), the
simulator runs its ``tl`` twin (and refuses a kernel without one, saying so), and -- under torchrun on GPUs --
the Gluon kernel itself runs the ring protocol (tests/bodies_gluon.py)."""
import pytest
import torch
from triton.experimental.gluon import language as gl

import ditron
import ditron.language as dl

import bodies_gluon as B
from conftest import GPU_BACKEND
from stub_driver import stub_driver, stub_world

SIG = {"x_ptr": "*fp16", "buf_ptr": "*fp16", "sig_ptr": "*i32", "out_ptr": "*fp16", "n": "i32"}


@pytest.mark.parametrize("target,warp", [("sm_90a", 32), ("gfx942", 64)])
def test_primitives_compile_inside_a_gluon_kernel(target, warp):
    ck = ditron.compile(B.ring_push, target=target, signature=SIG, constexprs={"BLOCK": 1024, "WARP": warp},
                        num_warps=4)
    ir = ck.asm["dist_ir"]
    for op in ("dist.rank(", "dist.num_ranks(", "dist.symm_at(", "dist.notify(", "dist.wait(",
               "dist.consume_token("):
        assert op in ir, (op, ir)
    assert "glir" in ck.asm or "ttgir" in ck.asm              # Gluon's front end (3.9 keeps its IR as 'glir')
    if target == "sm_90a":
        ptx = ck.asm["ptx"]
        assert "ld.acquire.sys" in ptx or "ld.sys.acquire" in ptx, "the wait's acquire poll"
        assert "bar.sync" in ptx
    else:
        assert "s_barrier" in ck.asm["amdgcn"]


def test_the_same_kernel_without_ditron_is_refused_with_the_fix():
    from triton.experimental import gluon

    @gluon.jit
    def plain(x_ptr, n, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = gl.arange(0, BLOCK, layout=layout)
        peer = dl.symm_at(x_ptr, (dl.rank() + 1) % dl.num_ranks())
        gl.store(x_ptr + offs, gl.load(peer + offs, mask=offs < n), mask=offs < n)

    from ditron import _compat
    src = _compat.ast_source(plain, {"x_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr"}, {(2,): 128}, {})
    with pytest.raises(Exception) as info:
        _compat.compile_source(src, ditron.parse_target("sm_90a").to_triton(), {})
    assert "decorate the kernel with @ditron.jit" in str(info.value), info.value


def test_partition_polls_per_thread_with_ld():
    """Inside a gl.warp_specialize partition the program-wide barrier of dl.wait cannot be used (ditron/gluon.py):
    the documented pattern, a per-thread dl.ld acquire poll in a one-warp partition, compiles to a sys-scope
    acquire load in a loop and the data store after it."""
    ck = ditron.compile(B.partition_waiter, target="sm_90a",
                        signature={"sig_ptr": "*i32", "x_ptr": "*fp32", "out_ptr": "*fp32"},
                        constexprs={"BLOCK": 32}, num_warps=4)
    assert "dist.ld(" in ck.asm["dist_ir"] and "dist.wait(" not in ck.asm["dist_ir"]
    ptx = ck.asm["ptx"]
    assert "ld.acquire.sys" in ptx or "ld.sys.acquire" in ptx, ptx[-3000:]


def test_gluon_launch_path_is_ditrons(monkeypatch):
    """``kernel[grid](...)`` of a Gluon kernel: compiled with ditron's device library, its distributed IR kept,
    the symmetric-argument check run on every launch, and warm launches compute nothing again (the stub
    driver stands in for a GPU: sm_90)."""
    from test_launch_path import Counts
    with stub_driver() as drv, stub_world() as world:
        x = torch.zeros(4096, dtype=torch.float16)
        buf = ditron.symm_zeros((4096,), torch.float16, name="buf")
        sig = ditron.symm_zeros((4,), torch.int32, name="sig")
        out = torch.empty(4096, dtype=torch.float16)
        from ditron import _compat
        with _compat.always_compile():      # traced here whatever Triton's on-disk cache holds (dist_ir)
            B.ring_push[(4,)](x, buf, sig, out, 4096, BLOCK=1024, WARP=32)
        assert B.ring_push.dist_ir is not None and "dist.wait(" in B.ring_push.dist_ir.text()
        counts = Counts(monkeypatch, drv)
        checks, before = world.transport.launch_checks, drv.launches
        for _ in range(50):
            B.ring_push[(4,)](x, buf, sig, out, 4096, BLOCK=1024, WARP=32)
        assert drv.launches - before == 50 and world.transport.launch_checks - checks == 50
        assert counts.n == {k: 0 for k in counts.n}, counts.n
        with pytest.raises(ditron.DitronError, match="symmetric"):
            B.ring_push[(4,)](x, torch.zeros(4096, dtype=torch.float16), sig, out, 4096, BLOCK=1024, WARP=32)


@pytest.mark.parametrize("n", [1, 3])
def test_ring_runs_on_every_world(dist_world, n):
    # simulator: the tl twin; GPUs (torchrun): the Gluon kernel itself
    assert dist_world(n).run(B.gluon_ring, 3000) == [(r, True) for r in range(n)]


def test_ring_runs_on_the_job_world(dist):
    # the suite's world (4 simulated ranks; on GPUs whatever torchrun started: 2, 4, 8 ...)
    assert dist.run(B.gluon_ring, 3000) == [(r, True) for r in range(dist.world_size)]


@pytest.mark.skipif(GPU_BACKEND != "sim", reason="the simulator's refusal")
def test_a_gluon_kernel_without_twin_is_refused_on_the_simulator(dist_world):
    msg = dist_world(1).run(B.no_twin_refused)[0]
    assert msg is not None and "cannot run on the simulator" in msg and "twin" in msg, msg


def test_twin_must_be_a_kernel():
    with pytest.raises(TypeError, match="twin= must be a @ditron.jit kernel"):
        ditron.gluon.jit(twin=lambda: None)(lambda x: None)
    with pytest.raises(TypeError, match="unknown option"):
        ditron.gluon.jit(fn=None, bogus=1)
