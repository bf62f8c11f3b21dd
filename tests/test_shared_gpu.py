"""Ranks that share a GPU (DITRON_RANKS_PER_GPU / ditron.init(ranks_per_gpu=...)): the opt-in's argument checks,
the rank -> GPU map, the job checks and each rank's share of the SMs.  No GPU needed: the GPU side runs in
tests/gpu/run.sh (NPROCS="1 2 3" on one GPU)."""
import types

import pytest
import torch

import ditron
from ditron.errors import DitronError
from ditron.runtime import gpu, sharing


@pytest.fixture(autouse=True)
def _no_share(monkeypatch):
    monkeypatch.delenv(sharing.ENV, raising=False)
    monkeypatch.delenv(sharing.MPS_THREADS_ENV, raising=False)
    sharing.set_current(None)
    yield
    sharing.set_current(None)


# -- the opt-in --------------------------------------------------------------------------------------------------

def test_default_is_one_rank_per_gpu():
    assert sharing.ranks_per_gpu() == 1


@pytest.mark.parametrize("raw,n", [("2", 2), (" 3 ", 3), ("1", 1)])
def test_env_opt_in(monkeypatch, raw, n):
    monkeypatch.setenv(sharing.ENV, raw)
    assert sharing.ranks_per_gpu() == n


@pytest.mark.parametrize("raw,msg", [("two", "not a whole number"), ("0", "at least 1"), ("-2", "at least 1"),
                                     ("1.5", "not a whole number")])
def test_env_opt_in_errors(monkeypatch, raw, msg):
    monkeypatch.setenv(sharing.ENV, raw)
    with pytest.raises(DitronError, match=f"DITRON_RANKS_PER_GPU='{raw}'.*{msg}"):
        sharing.ranks_per_gpu()


@pytest.mark.parametrize("arg,msg", [(0, "at least 1"), (2.5, "not a whole number"), (True, "not a bool"),
                                     ("x", "not a whole number")])
def test_argument_errors(arg, msg):
    with pytest.raises(DitronError, match=msg):
        sharing.ranks_per_gpu(arg)


def test_argument_wins_over_env(monkeypatch):
    monkeypatch.setenv(sharing.ENV, "4")
    assert sharing.ranks_per_gpu(2) == 2


def test_init_checks_the_opt_in_before_starting_anything():
    # on every backend, the simulator included: nothing is built when the opt-in is wrong
    with pytest.raises(DitronError, match=r"ranks_per_gpu=0\).*at least 1"):
        ditron.init("sim", ranks_per_gpu=0)
    assert ditron.current_world(required=False) is None


# -- rank -> GPU -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lws,per,count,want", [
    (3, 3, 1, [0, 0, 0]),          # three ranks on the one GPU
    (4, 2, 2, [0, 0, 1, 1]),       # pairs
    (3, 2, 2, [0, 0, 1]),          # an odd world: the last GPU holds one rank
    (2, 1, 2, [0, 1]),             # the default map
])
def test_gpu_of_local_rank(lws, per, count, want):
    assert [sharing.gpu_of_local_rank(r, lws, per, count) for r in range(lws)] == want


def test_too_few_gpus_names_the_fix():
    with pytest.raises(DitronError, match=r"3 local ranks at 1 rank\(s\) per GPU need 3 GPUs, but only 1 .*"
                                          r"DITRON_RANKS_PER_GPU=3"):
        sharing.gpu_of_local_rank(0, 3, 1, 1)
    with pytest.raises(DitronError, match=r"need 3 GPUs, but only 2 .*raise DITRON_RANKS_PER_GPU to at least 3"):
        sharing.gpu_of_local_rank(0, 5, 2, 2)


def test_select_device_with_sharing():
    fake = types.SimpleNamespace(device=torch.device, cuda=types.SimpleNamespace(device_count=lambda: 1))
    assert gpu._select_device(fake, None, 2, 3, per_gpu=3) == torch.device("cuda", 0)
    with pytest.raises(DitronError, match="LOCAL_RANK=1 needs GPU 1.*DITRON_RANKS_PER_GPU=N"):
        gpu._select_device(fake, None, 1, 2)          # without the opt-in: today's error, naming the opt-in


# -- the job check -----------------------------------------------------------------------------------------------

def _job(monkeypatch, uuids, per_gpu):
    """Rank 0's _check_job in a job whose ranks use the GPUs ``uuids``: the other ranks' facts are rank 0's own
    record (as _check_job builds it) with their rank, GPU and opt-in changed."""
    fake_cuda = types.SimpleNamespace(get_device_properties=lambda d: types.SimpleNamespace(uuid=uuids[0]),
                                      can_device_access_peer=lambda a, b: True)
    n = len(uuids)
    per = per_gpu if isinstance(per_gpu, list) else [per_gpu] * n

    def gather(obj):
        assert obj["rank"] == 0 and obj["per_gpu"] == per[0], obj
        return [dict(obj, rank=r, local_rank=r, device=int(u[-1]), uuid=u, per_gpu=per[r]) for r, u in enumerate(uuids)]
    monkeypatch.setattr(gpu, "_all_gather", gather)
    return gpu._check_job(types.SimpleNamespace(cuda=fake_cuda), (0, n, 0, n, 1, 0), torch.device("cuda", 0), per[0])


def test_job_with_shared_gpu(monkeypatch):
    _, mine, any_shared = _job(monkeypatch, ["GPU-0", "GPU-0", "GPU-0"], 3)
    assert (mine, any_shared) == (3, True)


def test_job_verdict_is_the_same_on_every_rank(monkeypatch):
    # rank 0 alone on GPU 1, ranks 1 and 2 share GPU 0: rank 0 does not share, but the world does
    _, mine, any_shared = _job(monkeypatch, ["GPU-1", "GPU-0", "GPU-0"], 2)
    assert (mine, any_shared) == (1, True)


def test_job_more_ranks_than_the_opt_in(monkeypatch):
    with pytest.raises(DitronError, match=r"ranks \[0, 1, 2\] use GPU 0 on \S+, more than DITRON_RANKS_PER_GPU=2"):
        _job(monkeypatch, ["GPU-0", "GPU-0", "GPU-0"], 2)


def test_job_ranks_disagree_on_the_opt_in(monkeypatch):
    with pytest.raises(DitronError, match=r"ranks per GPU differ between ranks \(2 on rank 0, 1 on rank 1\)"):
        _job(monkeypatch, ["GPU-0", "GPU-0"], [2, 1])


def test_nvshmem_refused_when_ranks_share_a_gpu():
    with pytest.raises(DitronError, match="backend='nvshmem' with ranks that share a GPU.*use backend='p2p'"):
        gpu._choose_backend("nvshmem", 1, shared=True)
    with pytest.raises(DitronError, match="work on one node; this job spans 2"):
        gpu._choose_backend("p2p", 2, shared=True)


# -- each rank's share of the SMs --------------------------------------------------------------------------------

@pytest.mark.parametrize("sms,k,pct,want", [
    (132, 1, None, 132), (132, 2, None, 66), (132, 3, None, 44), (78, 3, None, 26),
    (132, 2, 30.0, 39),            # MPS caps the client below its even share
    (132, 2, 80.0, 66),            # ... or the even share is the tighter bound
    (2, 3, None, 1),               # never less than one SM
])
def test_sm_share(sms, k, pct, want):
    assert sharing.sm_share(sms, k, pct) == want
    assert sharing.sm_share(sms, k, pct) * k <= max(sms, k)   # the ranks' grids fit the GPU together


def test_usable_sms_follows_the_current_world():
    assert sharing.usable_sms(0, 132) == 132                   # no world
    sharing.set_current(sharing.GpuShare(0, 3, mps=True))
    assert sharing.usable_sms(0, 132) == 44
    assert sharing.usable_sms(1, 132) == 132                   # another GPU of the process is not shared
    assert sharing.shared()


def test_zoo_and_megakernel_grids_use_the_share(monkeypatch):
    from ditron.kernels import _common
    from ditron.task import runtime as task_runtime
    props = types.SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    _common._SM_COUNTS.clear()
    assert _common.sm_count("cuda:0") == 132
    sharing.set_current(sharing.GpuShare(0, 2, mps=True))
    assert _common.sm_count("cuda:0") == 66
    assert task_runtime._sm_count("cuda:0") == 66
    _common._SM_COUNTS.clear()


def test_mps_thread_percentage_env(monkeypatch):
    monkeypatch.setenv(sharing.MPS_THREADS_ENV, "50")
    assert sharing.mps_active_thread_percentage() == 50.0
    monkeypatch.setenv(sharing.MPS_THREADS_ENV, "150")
    with pytest.raises(DitronError, match=r"must be in \(0, 100\]"):
        sharing.mps_active_thread_percentage()


def test_bench_refuses_to_time_ranks_that_share_a_gpu():
    sharing.refuse_timing("ditron bench")                        # not shared: fine
    sharing.set_current(sharing.GpuShare(0, 2, mps=True))
    with pytest.raises(DitronError, match="ditron bench: 2 ranks share GPU 0 .*not be performance numbers"):
        sharing.refuse_timing("ditron bench")
    from ditron.bench.harness import time_impl
    with pytest.raises(DitronError, match="share GPU 0"):
        time_impl(lambda: None, "cuda:0")


def test_ipc_handles_travel_whole(monkeypatch):
    """A CUDA IPC handle is 64 opaque bytes, NULs included: what cuIpcGetMemHandle writes is what
    cuIpcOpenMemHandle receives on the other rank (a fake driver records both sides)."""
    import ctypes

    from ditron.runtime import gpu_driver
    raw = bytes([0, 7, 0, 0, 255, 1] + list(range(58)))          # starts with a NUL, as real handles can
    seen = {}

    def get(ph, dptr):
        ctypes.memmove(ctypes.addressof(ph._obj), raw, 64)
        return 0

    def open_(pptr, handle, flags):
        seen["handle"], seen["flags"] = ctypes.string_at(ctypes.addressof(handle), 64), flags
        pptr._obj.value = 0x7000_0000
        return 0
    fake = types.SimpleNamespace(cuIpcGetMemHandle=get, cuIpcOpenMemHandle_v2=open_)
    monkeypatch.setattr(gpu_driver, "_lib", lambda: fake)
    h = gpu_driver.ipc_get_handle(0x1000)
    assert h == raw
    assert gpu_driver.ipc_open_handle(h) == 0x7000_0000
    assert seen == {"handle": raw, "flags": gpu_driver.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS}
    with pytest.raises(DitronError, match="64 bytes, got 3"):
        gpu_driver.ipc_open_handle(b"abc")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_gemm_rs_reduction_leaves_sms_for_the_peers_gemm(monkeypatch, k):
    """gemm_rs's reduction programs spin until every peer's GEMM has delivered its partials.  Ranks sharing a GPU:
    a reduction with one program per tile (224 at M = 2 * 1000, N = 808 on the GPU tests) could fill the GPU while
    a peer's GEMM, on the same GPU, waits for an SM -- the hang of 2026-11-25.  So at most the rank's share of the
    SMs; the ranks' waiting grids together leave the GPU room.  One GPU per rank: one program per tile."""
    import importlib
    from ditron.kernels import _common
    gemm_rs = importlib.import_module("ditron.kernels.gemm_rs")
    props = types.SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    _common._SM_COUNTS.clear()
    W = max(k, 2)
    ctx = types.SimpleNamespace(world_size=W, device="cuda:0", sim=False, reduce_tile=lambda: (32, 128, 4))
    tiles = 32 * 7                                             # m = 1000 rows by 32, N = 808 columns by 128
    if k > 1:
        sharing.set_current(sharing.GpuShare(0, k, mps=True))
    P = gemm_rs.reduce_programs(ctx, W * 1000, 808)
    if k == 1:
        assert P == tiles
    else:
        assert P == 132 // k and P * k <= 132
    assert gemm_rs.reduce_programs(ctx, W * 5, 808) == 7          # fewer tiles than the share: one per tile
    ctx.sim = True
    assert gemm_rs.reduce_programs(ctx, W * 1000, 808) == 1       # the simulator loops over tiles too
    _common._SM_COUNTS.clear()
