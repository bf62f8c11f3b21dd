import os
import shutil

# one OpenMP / BLAS thread per process, set before torch and numpy are imported: CI runs two workers on two cores
# (README: -n 2), each with its simulated ranks (which get OMP_NUM_THREADS=1 anyway, ditron.sim.threads), so
# per-process thread pools only oversubscribe the cores; their workers spinning between small operations cost
# 10-12% of the CPU of the simulator's test files. A value set by the caller is kept
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402

import ditron  # noqa: E402
from ditron import libs  # noqa: E402

TARGETS = ("sm_90a", "gfx942")

# the simulated ranks' fork server (ditron.sim.pool) imports torch.compile's modules once per worker instead of
# every rank that compiles importing them (ditron/sim/warm_at_import.py): the suite's clusters all start with
# the environment of this point, which those imports read; an empty value turns it off
os.environ.setdefault("DITRON_SIM_POOL_PRELOAD", "torch._dynamo,torch._inductor.compile_fx")


def compile_for(kernel, target, signature, constexprs=None, **options):
    return ditron.compile(kernel, target=target, signature=signature, constexprs=constexprs or {}, **options)


def device_asm(ck):
    return ck.asm["ptx"] if ck.target.backend == "cuda" else ck.asm["amdgcn"]


def code_lines(text):
    """Instruction lines (comments and debug directives dropped)."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ";", ".loc", ".file")):
            continue
        out.append(s)
    return out


@pytest.fixture(scope="session")
def nvshmem_bc():
    """NVSHMEM's device bitcode.  CI installs nvidia-nvshmem-cu13 and sets
    DITRON_REQUIRE_NVSHMEM=1, so there a missing bitcode fails these tests."""
    path = libs.nvshmem_bitcode()
    if path is None or not os.path.exists(path):
        if os.environ.get("DITRON_REQUIRE_NVSHMEM") == "1":
            pytest.fail("DITRON_REQUIRE_NVSHMEM=1 but no libnvshmem_device.bc was found")
        pytest.skip("nvidia-nvshmem-cu13 not installed (pip install nvidia-nvshmem-cu13==3.4.5)")
    return path


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # device libraries are written under DITRON_CACHE_DIR; keep tests off ~/.cache.  The xdist workers of one
    # run share it (the files are content-named and written atomically): the part of NVSHMEM's bitcode that
    # kernels link is cut once per run (~5 CPU-s), not once per worker, and kernels that link it have the same
    # compile options in every worker, so Triton's cache serves them all
    base = tmp_path_factory.getbasetemp()
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "ditron-cache"
    monkeypatch.setenv("DITRON_CACHE_DIR", str(d))
    yield


@pytest.fixture(scope="session", autouse=True)
def _sim_zygote(tmp_path_factory):
    """One zygote per worker for the session (docs/simulator.md, Zygote): every ``ditron sim`` / ``ditron demo``
    job that a test starts forks its fork server from it instead of importing torch, Triton and ditron again;
    a job whose environment is another (a test's own variables) starts its own, as without one.
    tests/test_sim_fork.py and tests/test_sim_launcher.py unset it for the path without one."""
    if GPU_BACKEND != "sim" or os.environ.get("DITRON_SIM_ZYGOTE") is not None:
        yield None
        return
    from ditron.sim import zygote
    base = tmp_path_factory.getbasetemp()           # the jobs' DITRON_CACHE_DIR (_isolated_cache)
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "ditron-cache"
    proc = zygote.start(env=dict(os.environ, DITRON_CACHE_DIR=str(cache)))
    os.environ[zygote.ENV] = proc.zygote_path
    yield proc
    os.environ.pop(zygote.ENV, None)
    zygote.stop(proc)


def fails_with(world, body, *args):
    """The text of the DitronError that ``world.run(body, *args)`` raises (the test fails if none is)."""
    import pytest as _pytest
    with _pytest.raises(ditron.DitronError) as info:
        world.run(body, *args)
    return str(info.value)


def has_tool(name):
    return shutil.which(name) is not None


# ---------------------------------------------------------------------------
# Distributed test bodies: one body, two places to run it
# ---------------------------------------------------------------------------
# A body is a module-level function ``body(world, *args, **kwargs)`` in an
# importable module (tests/bodies_*.py); it runs on every rank and asserts.
# ``dist.run(body, ...)`` returns the per-rank results.
#   * CPU (CI): the ranks are simulated (ditron.sim.SimCluster, kept for the
#     session), 4 by default; ``dist_world(n, nnodes)`` gives other sizes.
#   * GPUs: under ``torchrun --nproc-per-node N -m pytest ...`` with
#     DITRON_TEST_BACKEND=p2p|nvshmem, the body runs on this rank's GPU world.

GPU_BACKEND = os.environ.get("DITRON_TEST_BACKEND", "sim")
_CLUSTERS = {}


class SimDist:
    backend = "sim"

    def __init__(self, n, nnodes=1):
        from ditron.sim.pool import SimCluster
        key = (n, nnodes)
        if key not in _CLUSTERS:
            # the suite's clusters run without the race finder unless DITRON_SIM_RACE=1 (CI's time budget: ~1.4x
            # on the zoo's files); the race tests use race_world(), and a user's SimCluster has it on by default
            from ditron.sim import race
            _CLUSTERS[key] = SimCluster(n, nnodes, hang_timeout=float(os.environ.get("DITRON_TEST_HANG_S", 20)),
                                        race=race.enabled())
        self.cluster = _CLUSTERS[key]
        self.world_size = n
        self.nnodes = nnodes

    def run(self, body, *args, **kwargs):
        return self.cluster.run(body, *args, **kwargs)


class GpuDist:
    def __init__(self):
        import torch.distributed as tdist
        self.world = ditron.init(GPU_BACKEND)
        self.backend = self.world.backend
        self.world_size = self.world.world_size
        self.nnodes = self.world.nnodes
        self._tdist = tdist

    def run(self, body, *args, **kwargs):
        """The body on this rank; every rank learns whether every rank's body passed before the barrier and the
        results' all-gather, so that one rank's failure fails the test on every rank (a rank that raised and went
        on to the next test while the others sat in this test's barrier / all-gather would pair the next test's
        collectives with this one's: every later test of the file then fails or hangs)."""
        import traceback
        from ditron.errors import DitronRankError
        rank = self.world.rank
        with ditron.heap_scope():
            try:
                value, err = body(self.world, *args, **kwargs), None
            except Exception as e:  # same exception type as on the simulator
                value, err = None, e
                tb = traceback.format_exc()
            status = [None] * self.world_size
            self._tdist.all_gather_object(status, None if err is None else f"{type(err).__name__}: {err}")
            if err is None and all(s is None for s in status):
                ditron.barrier_all()    # the peers' kernels done before heap_scope frees this test's memory
        if err is not None:
            raise DitronRankError(f"rank {rank} failed: {err}", rank=rank, traceback_text=tb) from err
        bad = [r for r, s in enumerate(status) if s is not None]
        if bad:
            raise DitronRankError(f"rank {bad[0]} failed: {status[bad[0]]}", rank=bad[0])
        out = [None] * self.world_size
        self._tdist.all_gather_object(out, value)
        return out


@pytest.fixture(scope="session")
def _gpu_dist():
    if GPU_BACKEND == "sim":
        pytest.skip("GPU-only test body (run under torchrun with DITRON_TEST_BACKEND=p2p|nvshmem)")
    d = GpuDist()
    yield d
    ditron.finalize()


def race_world(n, hang_timeout=30):
    """``n`` simulated ranks under the race finder (the simulator's own; not on GPUs), kept for the session like
    the worlds above, so that the race tests of a worker share their rank processes and each kernel's per-process
    first launch: every run starts at a race boundary (the ranks' previous run happened before it)."""
    from ditron.sim.pool import SimCluster
    key = (n, 1, "race", hang_timeout)
    if key not in _CLUSTERS:
        _CLUSTERS[key] = SimCluster(n, race=True, hang_timeout=hang_timeout)
    return _CLUSTERS[key]


@pytest.fixture
def dist(request):
    """4 simulated ranks on CPU; this rank's GPU world under torchrun."""
    if GPU_BACKEND != "sim":
        return request.getfixturevalue("_gpu_dist")
    return SimDist(4)


@pytest.fixture
def dist_world(request):
    """``dist_world(n, nnodes=1)``: a simulated world of another size (on
    GPUs: the torchrun world, when its size matches, else the test skips)."""
    def make(n, nnodes=1):
        if GPU_BACKEND != "sim":
            d = request.getfixturevalue("_gpu_dist")
            if (d.world_size, d.nnodes) != (n, nnodes):
                pytest.skip(f"needs {n} ranks on {nnodes} node(s); this GPU job has {d.world_size}")
            return d
        return SimDist(n, nnodes)
    return make


#: fixtures through which a test body runs on this rank's GPU world under torchrun
_GPU_FIXTURES = {"dist", "dist_world", "dist_", "_gpu_dist"}


def _amd_compile(item) -> bool:
    """A test that compiles for an AMD target: its id names a gfx9 target, or it is the rocSHMEM table's."""
    return "gfx9" in item.nodeid or item.nodeid.startswith("tests/test_rocshmem_table.py")


@pytest.hookimpl(tryfirst=True)        # before -m deselects by the markers added here
def pytest_collection_modifyitems(config, items):
    """Marks the AMD compile tests ``amd_compile`` (pyproject.toml's markers).  Under torchrun with
    DITRON_TEST_GPU_ONLY=1 (tests/gpu/run.sh), keeps only the tests that run a body on the GPU world: the rest
    (compile, simulator and argument tests) are the CPU suite's, which CI runs; every rank repeating them would
    only slow the GPU script down."""
    for it in items:
        if _amd_compile(it):
            it.add_marker(pytest.mark.amd_compile)
    if GPU_BACKEND == "sim" or os.environ.get("DITRON_TEST_GPU_ONLY") != "1":
        return
    keep = [it for it in items if _GPU_FIXTURES & set(getattr(it, "fixturenames", ()))]
    drop = [it for it in items if it not in keep]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session, exitstatus):
    for c in _CLUSTERS.values():
        c.close()
    _CLUSTERS.clear()


def tma_loads(ptx):
    """The PTX has TMA (bulk tensor) loads into shared memory (``shared::cluster`` on Triton 3.6,
    ``shared::cta`` on 3.9)."""
    import re
    return re.search(r"cp\.async\.bulk\.tensor\.\dd\.shared::(cluster|cta)\.global", ptx) is not None


def tma_stores(ptx):
    """The PTX has TMA (bulk tensor) stores from shared memory to global memory."""
    return "cp.async.bulk.tensor.2d.global.shared::cta" in ptx
