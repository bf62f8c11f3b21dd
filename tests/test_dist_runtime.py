"""Runtime tests across ranks: the bodies in tests/bodies_runtime.py run on 4
simulated ranks on the CPU (the shared ``dist`` fixture) or, under

    DITRON_TEST_BACKEND=p2p|nvshmem torchrun --nproc-per-node 4 -m pytest tests/test_dist_runtime.py

on this rank's GPU (tests/gpu/run.sh runs both transports).  ``dist.run(body,
**params)`` returns the per-rank results.
"""
import os
import traceback

import pytest

import bodies_runtime as B

GPU_BACKENDS = ("p2p", "nvshmem")


class _TorchrunDist:
    """Stand-in for the shared fixture under torchrun (used only when
    tests/conftest.py provides no ``dist``): the world is made once per
    process; a body's exception on any rank fails the test on every rank."""
    _world = None

    def __init__(self, backend):
        from ditron.runtime import world as rt
        self.backend = backend
        if _TorchrunDist._world is None or rt.current_world(required=False) is None:
            _TorchrunDist._world = rt.init(backend=backend)
        self.world = _TorchrunDist._world
        if self.world.backend != backend:
            raise RuntimeError(f"asked for {backend} but the world uses {self.world.backend}")

    def run(self, body, **params):
        import torch
        import torch.distributed as tdist
        try:
            res, err = body(self.world, **params), None
        except Exception as e:  # noqa: BLE001
            res, err = None, f"rank {self.world.rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"
        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            err = err or f"rank {self.world.rank}: {e}"
        out = [None] * self.world.world_size
        tdist.all_gather_object(out, (res, err))
        errors = [e for _, e in out if e]
        if errors:
            raise AssertionError("\n".join(errors))
        return [r for r, _ in out]


@pytest.fixture
def dist_(request):
    try:
        return request.getfixturevalue("dist")
    except pytest.FixtureLookupError:
        pass
    backend = os.environ.get("DITRON_TEST_BACKEND")
    if backend in GPU_BACKENDS and "LOCAL_RANK" in os.environ:
        return _TorchrunDist(backend)
    pytest.skip("no 'dist' fixture in tests/conftest.py and not under torchrun with DITRON_TEST_BACKEND=p2p|nvshmem")


def _on_gpu(d):
    return d.backend in GPU_BACKENDS


def test_world_descriptor_and_ids(dist_):
    res = dist_.run(B.body_ids)
    n = len(res)
    for r, out in enumerate(res):
        nxt = (r + 1) % n
        assert out[:6] == [r, n, r, n, r % n, n], out
        assert out[6] == 100 + nxt and out[7] == 100 + nxt, out


@pytest.mark.parametrize("via", ["dl", "shmem"])
def test_pingpong(dist_, via):
    iters = 1000 if _on_gpu(dist_) else 20
    res = dist_.run(B.body_pingpong, iters=iters, via=via)
    for r, v in enumerate(res):
        assert v in (iters, "alone"), (r, v)


def _sizes(d):
    if _on_gpu(d):
        return [1, 3, 4095, 4096 + 7, (1 << 20) + 1, 64 << 20, 256 << 20]
    return [1, 3, 1000 + 7, 4096 + 5]


@pytest.mark.parametrize("mode", [0, 1], ids=["put_nbi_block", "get_nbi_block"])
def test_put_get_sizes(dist_, mode):
    for nbytes in _sizes(dist_):
        res = dist_.run(B.body_put_get, nbytes=nbytes, mode=mode)
        assert all(r["ok"] and r["untouched"] for r in res), (nbytes, res)


@pytest.mark.parametrize("mode", [2, 3, 4], ids=["put_thread", "get_warp", "put_block"])
@pytest.mark.parametrize("offs", [(0, 0), (1, 1), (1, 3), (8, 4)])
def test_put_get_variants_unaligned(dist_, mode, offs):
    sizes = [5, 4096 + 13] if _on_gpu(dist_) else [5, 300]
    chunk = 4096 if _on_gpu(dist_) else 256
    for nbytes in sizes:
        res = dist_.run(B.body_put_get, nbytes=nbytes, mode=mode, dst_off=offs[0], src_off=offs[1], chunk=chunk)
        assert all(r["ok"] and r["untouched"] for r in res), (nbytes, offs, res)


@pytest.mark.parametrize("nbi", [False, True])
def test_putmem_signal_wait_until(dist_, nbi):
    nbytes = (64 << 10) + 5 if _on_gpu(dist_) else 1000 + 5
    res = dist_.run(B.body_put_signal, nbytes=nbytes, nbi=nbi)
    for r in res:
        assert r[0] == {"signal": 1, "data_ok": True}, r
        assert r[1] == {"signal": 2, "data_ok": True}, r
        assert r[2] == {"add": 3}, r


def test_rank_copy(dist_):
    nbytes = (16 << 20) + 3 if _on_gpu(dist_) else 4096 + 3
    res = dist_.run(B.body_rank_copy, nbytes=nbytes)
    for r in res:
        assert all(r.values()), r


def test_barrier_reuse(dist_):
    if _on_gpu(dist_):
        params = dict(device_iters=10_000, host_iters=10_000, checked_iters=1000)
    else:
        params = dict(device_iters=20, host_iters=20, checked_iters=10)
    res = dist_.run(B.body_barrier_loop, **params)
    for r in res:
        assert r == {"device_errors": 0, "counter": params["checked_iters"]}, r


def test_non_symmetric_and_bad_arguments(dist_):
    res = dist_.run(B.body_errors)
    for r in res:
        assert "argument 't' is not a symmetric tensor" in r["peer_tensor"], r
        assert "argument 'src' is not a symmetric tensor" in r["rank_copy_src"], r
        assert "argument 'dst' is not a symmetric tensor" in r["rank_copy_dst"], r
        assert r["bad_rank"] and "is not in [0," in r["bad_rank"], r
        assert r["shape"] and "must match" in r["shape"], r
        assert r["is_symmetric"] == (True, False), r
