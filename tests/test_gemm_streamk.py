"""Stream-K on the GEMM core (kernels/gemm_streamk.py, ``GemmConfig(stream_k=True)``, issue 52 item 1): ``matmul``
against torch at odd shapes on the simulator with a small persistent grid, so that the Stream-K phase splits
tiles over K; run-to-run bit equality; the documented fp32 summation order of the fixup, bit for bit; errors
before launch; and the sm_90a compile of a Stream-K config (wgmma, TMA, shared memory within the limit) and
the gfx942 one.

The GPU side (correctness at the paper shapes and timings against cuBLAS) is
``CANDIDATES=streamk bash bench/gemm_core_levers.sh``."""
import importlib

import pytest

import ditron

import bodies_gemm_streamk as B
from conftest import GPU_BACKEND, tma_loads, tma_stores

G = importlib.import_module("ditron.kernels.gemm")
S = importlib.import_module("ditron.kernels.gemm_streamk")

#: (M, N, K, programs) with SIM tiles 16 x 16 x 32.  Comments: tiles T, K steps KI, programs P launched.
CASES = [
    (37, 45, 70, 4),      # T 9, KI 3, P 4: T % P = 1 -> 4 tiles data-parallel, 5 split (tails in M, N and K)
    (48, 40, 200, 5),     # T 9, KI 7, P 5: T < 2P -> no data-parallel tile, all 9 split
    (40, 40, 20, 4),      # T 9, KI 1 < P: ranges of whole tiles (Stream-K schedule, no partial tile)
    (10, 12, 200, 4),     # one tile, KI 7: split-K over 4 programs (the owner sums 3 partials)
    (32, 32, 96, 4),      # T 4 = P: data-parallel only (Stream-K does nothing)
    (64, 48, 130, 5),     # T 12, KI 5, P 5: 5 data-parallel, 7 split
]
#: the exact-order cases: tiles with 2+ contributors (the order of the partials matters)
ORDER_CASES = [(16, 16, 32 * 9, 4), (37, 45, 32 * 7 + 5, 4), (48, 40, 32 * 7, 5)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_streamk_matmul(dist_world, dtype):
    info = dist_world(1).run(B.streamk_calls, dtype, CASES)[0]
    launched, dp, split, most = zip(*info)
    assert launched == (4, 5, 4, 4, 4, 5)
    assert dp == (4, 0, 4, 0, 4, 5)
    # the Stream-K phase split tiles where it should, and none where T % P == 0 or KI == 1
    assert split[0] > 0 and split[1] > 0 and split[5] > 0
    assert split[2] == 0 and split[4] == 0
    assert most[3] == 4                         # the single tile: owner + 3 contributors


def test_streamk_exact_order(dist_world):
    """The fixup order is the documented one, bit for bit (a reversed order or a dropped partial fails), and the
    cases make it observable (the plain K order rounds differently somewhere)."""
    if GPU_BACKEND != "sim":
        pytest.skip("the exact fp32 order is the simulator's (a tensor core's accumulation rounds otherwise)")
    observable = dist_world(1).run(B.exact_order, "bfloat16", ORDER_CASES)[0]
    assert sum(observable) > 0, observable


def test_streamk_schedule_replica():
    """The schedule (host replica of the kernel's): every K step of every split tile is covered exactly once,
    the owner holds k = 0, and a contributor's segment is the first of its range."""
    for tiles in (1, 3, 7, 8, 9, 17, 960):
        for ks in (1, 2, 3, 7, 64):
            for P in (1, 2, 4, 5, 8, 132):
                n = S.streamk_programs(tiles, ks, P)
                dp, segs = B.schedule(tiles, ks, n)
                assert dp == tiles if tiles % n == 0 else dp == max(tiles // n - 1, 0) * n
                first_of = {}
                for s, parts in enumerate(segs):
                    steps = [k for _p, kb, ke in parts for k in range(kb, ke)]
                    assert steps == list(range(ks)), (tiles, ks, n, s)
                    assert parts[0][1] == 0
                    for p, _kb, _ke in parts:
                        first_of.setdefault(p, s)
                    for p, kb, _ke in parts[1:]:
                        assert first_of[p] == s and kb > 0       # a contribution is the program's first segment


def test_streamk_errors(dist_world):
    msgs = dist_world(1).run(B.streamk_errors)[0]
    assert "stream_k does not combine with warp_specialize" in msgs["ws"]
    assert "stream_k applies to ditron.kernels.gemm.matmul only" in msgs["overlap_op"]


def test_streamk_config_validation():
    with pytest.raises(ditron.DitronError, match="stream_k applies to ditron.kernels.gemm.matmul only"):
        G.GemmConfig(stream_k=True).validate("gemm_rs")
    assert G.GemmConfig(stream_k=True).validate("matmul").stream_k
    assert G.GemmConfig(stream_k=True).validate("GEMM table h100.json").stream_k
    assert not G.GemmConfig().stream_k                       # opt-in


_NAMES = ["a_ptr", "b_ptr", "c_ptr", "ws_ptr", "flag_ptr", "calls_ptr", "M", "N", "K", "stride_am", "stride_ak",
          "stride_bk", "stride_bn", "stride_cm", "stride_cn"]
SMEM_LIMIT = 232448          # sm_90: 227 KiB per block


def compile_streamk(cfg, tma, even_k=True, ab="*bf16", target="sm_90a"):
    """gemm_streamk_kernel for sm_90a as a GPU launch specialises it (16-byte aligned tensors and sizes, unit
    last strides): ``(ptx, shared bytes)``."""
    unit = ("stride_ak", "stride_bn", "stride_cn")
    names = [n for n in _NAMES if n not in unit]
    types = {"ws_ptr": "*fp32", "flag_ptr": "*i32", "calls_ptr": "*i64"}
    sig = {n: types.get(n, ab if n.endswith("_ptr") else "i32") for n in names}
    div = {"a_ptr", "b_ptr", "c_ptr", "ws_ptr", "flag_ptr", "calls_ptr", "N", "K", "stride_am", "stride_bk",
           "stride_cm"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in div}
    ck = ditron.compile(S.gemm_streamk_kernel, target=target, signature=sig, attrs=attrs,
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                        constexprs=dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                        GROUP_M=cfg.group_m, EVEN_K=even_k, TMA=tma, FLATTEN=cfg.flatten,
                                        SUBTILE=cfg.epilogue_subtile if tma else 1, **{u: 1 for u in unit}))
    return ck.asm["ptx" if target.startswith("sm_") else "amdgcn"], ck.metadata.shared


def test_streamk_compiles_for_sm90a():
    """The bench's Stream-K candidate (128x256x64, 4 stages, epilogue in two slices) compiles for sm_90a: wgmma,
    TMA loads and stores, the scoreboard's release / acquire, within sm_90's shared memory."""
    cfg = G.GemmConfig(128, 256, 64, 8, 8, 4, tma=True, flatten=True, epilogue_subtile=2, stream_k=True)
    ptx, smem = compile_streamk(cfg, tma=True)
    assert "wgmma.mma_async" in ptx and tma_loads(ptx) and tma_stores(ptx)
    assert "st.release.gpu" in ptx and "fence.acq_rel.gpu" in ptx      # dl.release_tile / dl.wait_deps
    assert smem <= SMEM_LIMIT, smem


def test_streamk_compiles_for_gfx942():
    """The pointer-tile Stream-K kernel (the scoreboard's waits and releases included) compiles for AMD MI300
    (gfx942), with MFMA."""
    asm, _lds = compile_streamk(G.GemmConfig(128, 128, 64, 8, 8, 2, stream_k=True), tma=False, even_k=False,
                                target="gfx942")
    assert "v_mfma" in asm


def _levers():
    from test_gemm_table import _levers as levers
    return levers()


def test_levers_streamk_group():
    L = _levers()
    names, _ = L.select("streamk", "")
    assert names == L.STREAMK and "tl default sk" in names and "matmul table" in names
    assert [n for n in names if L.is_stream_k(n)] == ["tl default sk", "tl 128x256x64 s4 sub2 sk",
                                                       "tl 256x128x64 s3 sk"]
    # "tl default sk" is the shipped rule's config at the shape, with stream_k
    kind, fields = L.config_fields("tl default sk", 8192, 3696, 8192, 132)
    assert kind == "tl" and fields == dict(G.dataclasses.asdict(G.gpu_default_config(8192, 3696, 8192, 132)),
                                           stream_k=True)


#: the bench's Stream-K candidates under Triton 3.6 (the GPU machines'); the first under a newer Triton (CI's time)
_SK = ["tl 128x256x64 s4 sub2 sk", "tl default sk", "tl 256x128x64 s3 sk"][
    :None if ditron._compat.TRITON_VERSION[:2] == (3, 6) else 1]


@pytest.mark.parametrize("name", _SK)
def test_levers_streamk_candidates_compile_for_sm90a(name):
    """bench/gemm_core_levers.py --compile-only on the Stream-K candidates: wgmma, within sm_90's shared memory,
    K a multiple of BLOCK_K or not."""
    assert _levers().compile_only([name], ["bf16"]) == []


def test_streamk_state_cached_and_epochs(dist_world):
    n, counter, flags, contributors = dist_world(1).run(B.workspace_state, 3)[0]
    assert (n, counter) == (3, 0)                # 3 launches counted, the program counter back at 0
    assert contributors and flags == [3 if p in contributors else 0 for p in range(6)]


@pytest.mark.skipif(GPU_BACKEND != "sim", reason="the planted bugs are the simulator's to catch (race finder, hang "
                                                 "report); a GPU would run them silently wrong or hang")
@pytest.mark.parametrize("plant,caught", [(1, "data race"), (2, "blocked in dl.wait_deps")])
def test_the_simulator_catches_a_missing_wait_or_release(plant, caught):
    """The fixup's protocol: without the owner's ``dl.wait_deps`` its reads of the partials race with their
    writes (the race finder, on by default in the simulator, names them); without a contributor's
    ``dl.release_tile`` the owner waits forever (the hang report names the wait)."""
    from ditron.sim.pool import SimCluster
    with SimCluster(1, hang_timeout=5) as c:
        with pytest.raises(Exception) as info:
            c.run(B.streamk_planted, plant)
    text = getattr(info.value, "traceback_text", "") or str(info.value)
    assert caught in text, text[-3000:]
