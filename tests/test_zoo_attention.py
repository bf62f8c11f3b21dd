"""The attention zoo (kernels/attention.py, flash_decode.py, ulysses.py): ring attention against
``scaled_dot_product_attention`` on the gathered tensors at 1, 2, 3 and 4
simulated ranks (bodies in bodies_attention.py; the same bodies run on GPUs
under torchrun), causal and not, zig-zag and contiguous sharding, GQA, fp16
and bf16, sequence shards that are not multiples of the tile, context reuse,
errors; distributed flash-decoding (ragged lengths, LL combine) and Ulysses
(GEMM + all-to-all, heads not divisible by the world size); removed waits
(ring staging signals, the LL poll, o_proj's all-to-all wait) are caught by
the race finder or by wrong results; the kernels compile for sm_90a (the bench's configs, TMA included)
and gfx942.

Shapes are tiny (head_dim 16, a few tiles): the simulator interprets every
program."""
import importlib
import re

import pytest

import bodies_attention as B
from conftest import GPU_BACKEND

A = importlib.import_module("ditron.kernels.attention")
AH = importlib.import_module("ditron.kernels.attention_hopper")
ON_GPU = GPU_BACKEND != "sim"
#: the simulator's tiles with a persistent grid
PERSISTENT = A.AttnConfig(16, 16, 1, 1, tma=False, persistent=True)
HEADS_FIRST = A.AttnConfig(16, 16, 1, 1, tma=False, heads_first=True)

# (B, Hq, Hkv, S per rank, D, causal, layout, dtype)
ONE_RANK = [(1, 2, 1, 37, 16, False, "contiguous", "bf16"),      # 3 tiles, a tail of 5
            (1, 2, 1, 37, 32, True, "contiguous", "fp16"),       # diagonal and tail tiles
            (2, 4, 2, 21, 16, True, "zigzag", "bf16")]           # batch 2, GQA


def test_world_size_one(dist_world):
    cases = ONE_RANK + ([(1, 32, 8, 1000, 128, True, "zigzag", "bf16")] if ON_GPU else [])
    d = dist_world(1)
    assert d.run(B.ring_cases, cases) == [len(cases)]
    # the persistent grid (programs loop over the tiles, longest first across heads when causal)
    assert d.run(B.ring_cases, ONE_RANK[1:], config=PERSISTENT) == [2]
    # causal with the grid (heads, tiles): the longest tiles of every head first
    assert d.run(B.ring_cases, ONE_RANK[1:], config=HEADS_FIRST) == [2]
    # flash-decode: ragged lengths (some 0), GQA, several splits with tails; two calls
    assert d.run(B.flash_decode_cases, [(3, 4, 2, 37, 16, "bf16")], calls=2) == [2]
    # the fused combine (the last split program of an item combines; its counter reset for the second call)
    assert d.run(B.flash_decode_cases, [(3, 4, 2, 37, 16, "bf16")], calls=2, fuse_combine=True) == [2]
    # Ulysses: 20 rows (a tile and a tail), hidden 24 (a K tail), causal
    assert d.run(B.ulysses_check, 20, 24, 2, 1, 16, True, "bf16") == [1]


def test_world_size_one_gluon_twin(dist_world):
    # what the simulator runs for the Gluon core: its tl twin (128 x 128 tiles), no core named (resolve_core:
    # the tl core here); causal at 130 rows: an unmasked tile, diagonal tiles, a second query tile of 2 rows and a
    # key tail; GQA
    cases = [(1, 2, 1, 130, 64, True, "contiguous", "bf16")]
    assert dist_world(1).run(B.ring_cases, cases, config=AH.twin_config()) == [1]


def test_three_ranks_odd_world(dist_world):
    d = dist_world(3)
    assert d.run(B.ring_cases, [(1, 2, 1, 14, 16, True, "zigzag", "bf16")]) == [1] * 3
    assert d.run(B.ring_cases, [(1, 4, 2, 10, 16, True, "zigzag", "bf16")], config=PERSISTENT) == [1] * 3
    # flash-decode across 3 ranks: LL partials, ragged lengths (a rank may hold none of a sequence), reuse
    assert d.run(B.flash_decode_cases, [(2, 8, 2, 20, 16, "fp16")], calls=2) == [2] * 3
    # Ulysses over 3 ranks (6 / 3 heads); heads that do not split over 3 ranks are an error
    assert d.run(B.ulysses_check, 5, 24, 6, 3, 16, False, "bf16") == [1] * 3
    assert all("4 query / 2 KV heads cannot be split over 3 ranks" in m for m in d.run(B.ulysses_error, 4, 2))


def test_four_ranks_zigzag(dist):
    # (context reuse -- the other parity of the buffers and signals -- runs on 2 ranks under the race finder)
    cases = [(1, 2, 1, 6, 16, True, "zigzag", "bf16")]
    assert dist.run(B.ring_cases, cases) == [1] * dist.world_size
    # two chunks per rank with the (heads, tiles) grid: the longest tiles (of the later chunk) first
    assert dist.run(B.ring_cases, cases, config=HEADS_FIRST) == [1] * dist.world_size


def test_errors_before_launch(dist_world):
    msgs = dist_world(1).run(B.errors)[0]
    assert "not a multiple of k's 3 heads" in msgs["gqa"]
    assert "not supported" in msgs["dtype"] or "context was created for" in msgs["dtype"]
    assert "create a larger context" in msgs["too_long"]
    assert "unknown layout 'striped'" in msgs["layout"]
    assert "head_dim=24 must be a power of two" in msgs["head_dim"]
    assert "must be [batch=1, kv_heads, seq=8" in msgs["shape"]
    assert "fuse_combine needs world size 1 and at most 64 splits" in msgs["fuse_splits"]
    assert "core='cudnn'; use one of tl, gluon" in msgs["core"]
    assert "core='gluon' takes a HopperAttnConfig" in msgs["gluon_config"]
    if not ON_GPU:
        assert "runs on Hopper GPUs only, not on the simulator; use core='tl'" in msgs["gluon_sim"]
        assert "head_dim=16; the Gluon core takes 64 or 128" in msgs["gluon_head_dim"]


#: the Gluon Hopper core through ring_attention(core="gluon") at world size 1: odd lengths (a partial last
#: query tile and key tail), GQA, batch 2, D 64 and 128, fp16 and bf16
GLUON_CASES = [(1, 32, 8, 1000, 128, True, "zigzag", "bf16"), (1, 32, 8, 1000, 128, False, "contiguous", "bf16"),
               (2, 4, 2, 300, 64, True, "contiguous", "fp16"), (2, 4, 2, 129, 64, False, "contiguous", "fp16")]


def test_world_size_one_gluon_core(dist_world):
    if not ON_GPU:
        pytest.skip("the Gluon core runs on Hopper GPUs only (the simulator refuses it: test_errors_before_launch)")
    got = dist_world(1).run(B.ring_cases, GLUON_CASES, core="gluon")
    if got == [None]:
        pytest.skip("not a Hopper GPU")
    assert got == [len(GLUON_CASES)]


@pytest.fixture(scope="module")
def race_pair():
    if ON_GPU:
        pytest.skip("the race finder is part of the simulator")
    from ditron.sim.pool import SimCluster
    with SimCluster(2, race=True, hang_timeout=60) as c:
        yield c


def _caught(info, tensor):
    """The planted bug was caught: the race finder names the tensor, or (when a rank whose stale read
    gave wrong values reports first) the comparison with torch failed."""
    text = getattr(info.value, "traceback_text", "") or str(info.value)
    assert f"data race on symmetric tensor '{tensor}" in text or "Tensor-likes are not close" in text, text


def test_two_ranks_clean_under_the_race_finder_and_a_removed_wait_is_caught(race_pair):
    # 2 ranks under the race finder (values checked too): zig-zag causal with GQA, contiguous causal (the
    # later rank's chunk skipped; the second call on the context: the other parity) and non-causal fp16;
    # then the same without the wait on the peers' signals
    cases = [(1, 4, 2, 10, 16, True, "zigzag", "bf16"), (1, 2, 1, 9, 16, True, "contiguous", "bf16"),
             (1, 2, 1, 9, 16, False, "contiguous", "fp16")]
    assert race_pair.run(B.ring_cases, cases, timeout=300) == [3, 3]
    with pytest.raises(Exception) as info:
        race_pair.run(B.ring_cases, cases[:1], plant_no_wait=True, timeout=300)
    _caught(info, "ring_attention.kbuf")
    # flash-decode: the LL poll removed (plain loads of the packets): a race or wrong values
    fd = [(2, 4, 1, 12, 16, "bf16")]
    assert race_pair.run(B.flash_decode_cases, fd, timeout=300) == [1, 1]
    with pytest.raises(Exception) as info:
        race_pair.run(B.flash_decode_cases, fd, plant_no_wait=True, timeout=300)
    _caught(info, "flash_decode.ll")
    # Ulysses: two calls (the arrival counters grow), then o_proj without its waits on the all-to-all
    assert race_pair.run(B.ulysses_check, 9, 40, 4, 2, 16, True, "fp16", calls=2, timeout=300) == [2, 2]
    with pytest.raises(Exception) as info:
        race_pair.run(B.ulysses_check, 9, 40, 4, 2, 16, True, "fp16", plant_no_wait=True, timeout=300)
    _caught(info, "ulysses.abuf")


# ---------------------------------------------------------------------------
# compiled for sm_90a / gfx942 (no GPU needed)
# ---------------------------------------------------------------------------

def _compile_fwd(target, cfg, world, causal, dt="bf16", head_dim=128):
    import ditron
    kern = A.ring_attn_fwd_kernel
    const = {"WORLD": world, "NCH": 2 if (causal and world > 1) else 1, "CAUSAL": causal, "HEAD_D": head_dim,
             "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "NSPLIT": A.GPU_NSPLIT, "TMA": cfg.tma, "WAIT": True,
             "PERSISTENT": cfg.persistent,
             "HEADS_FIRST": bool(cfg.heads_first and causal and not cfg.persistent)}
    ptrs = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "o_ptr": f"*{dt}", "lse_ptr": "*fp32",
            "kbuf_ptr": f"*{dt}", "vbuf_ptr": f"*{dt}", "sig_ptr": "*i32", "calls_ptr": "*i64"}
    sig = {p: ptrs.get(p, "fp32" if p == "qk_scale" else "i32") for p in kern.arg_names if p not in const}
    return ditron.compile(kern, target=target, signature=sig, constexprs=const, num_warps=cfg.num_warps,
                          num_stages=cfg.num_stages)


#: shared memory per thread block on H100 / H200 (227 KiB); per SM 228 KiB, of which each resident
#: block also takes 1 KiB
H100_SHARED = 232448
H100_SM_SHARED = 233472


def test_compiles_for_sm90a():
    """The GPU defaults at world size 1 (TMA tensor-descriptor loads of K / V, causal; the short-sequence
    tiles within half an SM's shared memory: under Triton 3.6, the GPU machines' Triton, which CI runs too -- CI's
    time under newer ones) and at world size 2,
    causal with zig-zag chunks (symm_at loads after acquire waits), both within the shared memory of an
    H100 (the loops are never inside branches, which would give each its own pipeline buffers).
    bench/attention_compile.py compiles every config the bench sweeps."""
    from conftest import tma_loads
    from ditron._compat import TRITON_VERSION
    ck = _compile_fwd("sm_90a", A.GPU_CONFIG, 1, True)
    assert "mma" in ck.asm["ptx"] and tma_loads(ck.asm["ptx"])
    # both GPU defaults (kernels/attention.RING_TABLE) are small enough for two programs per SM
    assert 2 * (ck.metadata.shared + 1024) <= H100_SM_SHARED, ck.metadata.shared
    if TRITON_VERSION[:2] == (3, 6):
        ck = _compile_fwd("sm_90a", A.GPU_SHORT_CONFIG, 1, False)
        assert "mma" in ck.asm["ptx"] and tma_loads(ck.asm["ptx"])
        assert 2 * (ck.metadata.shared + 1024) <= H100_SM_SHARED, ck.metadata.shared
    ck = _compile_fwd("sm_90a", A.GPU_CONFIG, 2, True)
    assert "ld.acquire.sys.global.b32" in ck.asm["ptx"] and "mma" in ck.asm["ptx"]
    assert ck.metadata.shared <= H100_SHARED, ck.metadata.shared
    assert ck.lint == [], ck.lint


def test_flash_decode_compiles_for_sm90a():
    import ditron
    FD = importlib.import_module("ditron.kernels.flash_decode")
    const = {"G": 4, "HKV": 8, "HEAD_D": 128, "BLOCK_H": 16, "BLOCK_N": FD.GPU_BLOCK_N, "FUSE": False,
             "SPLIT_CHUNK": 16}
    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "lens_ptr": "*i32", "po_ptr": "*fp32",
           "pl_ptr": "*fp32", "cap": "i32", "nsplit": "i32", "qk_scale": "fp32", "out_ptr": "*bf16",
           "lse_ptr": "*fp32", "cnt_ptr": "*i32"}
    ptx = ditron.compile(FD.flash_decode_split_kernel, target="sm_90a", signature=sig, constexprs=const,
                         num_warps=FD.GPU_WARPS, num_stages=FD.split_stages(FD.GPU_BLOCK_N, 128)).asm["ptx"]
    assert "ld.global.v4" in ptx or "cp.async" in ptx
    ptx = ditron.compile(FD.flash_decode_split_kernel, target="sm_90a", signature=sig,
                         constexprs=dict(const, FUSE=True, SPLIT_CHUNK=32), num_warps=FD.GPU_WARPS,
                         num_stages=FD.split_stages(FD.GPU_BLOCK_N, 128)).asm["ptx"]
    assert re.search(r"atom\.[\w.]*acq_rel[\w.]*\.add", ptx), "fused: the arrival counter (acq_rel)"
    const = {"G": 4, "WORLD": 2, "HEAD_D": 128, "BLOCK_H": 16, "DSPLIT": 4, "SPLIT_CHUNK": 64, "WAIT": True}
    sig = {"po_ptr": "*fp32", "pl_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "llo_ptr": "*i64",
           "lll_ptr": "*i64", "calls_ptr": "*i64", "nitems": "i32", "nsplit": "i32", "maxitems": "i32"}
    ptx = ditron.compile(FD.flash_decode_combine_kernel, target="sm_90a", signature=sig, constexprs=const,
                         num_warps=4).asm["ptx"]
    assert "ld.volatile.global" in ptx and not re.search(r"ld\.acquire", ptx), "LL: no separate signal"


def test_compiles_for_gfx942():
    cfg = A.AttnConfig(32, 32, 4, 1, tma=False)
    ck = _compile_fwd("gfx942", cfg, 2, True, dt="fp16", head_dim=32)
    assert ck.asm["amdgcn"]
