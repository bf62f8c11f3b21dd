"""The decoder megakernel's batch path (issue 26: batch 8 within 1.3x batch 1): the gate/up tiles with the weight
rows on the MMA's M side (``TileConfig.gu_wdot``), the qkv / o / down tiles with K split over the warps
(``dot_ksplit``), prenorm on the tl.dot path and its early epilogue loads (``prenorm_dot``, ``pn_early``) on
simulated ranks against the torch reference (ragged paged contexts, two steps, 1 / 2 / 3 ranks); and the default
batch-8 step at Qwen3-8B's shapes compiled for sm_90a (registers, spills, programs per SM, the MMAs' shapes and warp
layouts) and gfx942."""
import re

import pytest

import bodies_decoder as B


def _cfg(ranks, **tiles):
    from ditron.kernels.decoder import tiny
    cfg = tiny(**(dict(n_q_heads=6, n_kv_heads=3) if ranks == 3 else {}))
    # both ring budgets: batches up to 8 take dot_ring_small's, batch 9 dot_ring's
    return cfg.with_tiles(dot_from=2, dot_stream=True, dot_pad=8, dot_ring=4096, dot_ring_small=2048,
                          direct_tp1=True, **tiles)


def test_gu_wdot_config_and_tasks():
    # the field's values; the gate/up task of the batch path takes the wdot tile (gate_up_rstd_wdot_tile under
    # prenorm) with gu_wdot columns per tile, batch 1 keeps its FMA tile; the ring sets the depth
    from ditron.errors import DitronError
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    from ditron.kernels.decoder import tiles as T
    for bad in (dict(gu_wdot=4), dict(gu_wdot=24), dict(gu_wdot_k=1), dict(gu_wdot_k=-2)):
        with pytest.raises(DitronError, match=next(iter(bad))):
            _cfg(1, **bad)
    cfg = qwen3_8b(n_layers=1).with_tiles(gu_wdot=32, gu_wdot_k=256, dot_ksplit=0, stream_wait=0)
    for batch, prenorm, fn in ((8, False, T.gate_up_wdot_tile), (8, True, T.gate_up_rstd_wdot_tile),
                               (1, None, T.gate_up_rstd_tile)):
        gu = next(s for s in RZ.step_specs(cfg.with_tiles(prenorm=prenorm), batch) if s.name == "gu.0")
        assert gu.fn is fn, (batch, prenorm, gu.fn)
        if batch == 8:
            # 12288 / 32 = 384 tiles (one per program of 3 x 132); 2 x 32 x 256 weights + 8 x 256 activations
            # = 36 KiB a stage: 2 stages in the 48 KiB ring of batches up to 8 (dot_ring_small)
            assert gu.num_tiles == 384 and gu.args["BLOCK_B"] == 8 and gu.args["STREAM"] == 2, gu.args
    # gu_wdot_k=0: the K chunk follows the ring (2 chunks in flight at least)
    auto = qwen3_8b(n_layers=1)                              # the 8B default: gu_wdot 32, gu_wdot_k 0
    got = {b: next(s for s in RZ.step_specs(auto, b) if s.name == "gu.0").args for b in (2, 8, 16)}
    assert [(got[b]["BLOCK_K"], got[b]["STREAM"]) for b in (2, 8, 16)] == [(128, 3), (128, 3), (128, 3)], got
    # pn_early: the batch path's prenorm tiles (batch 1's FMA path keeps its own)
    for batch, wd, want in ((8, 32, {"qkv.0": T.linear_tile, "o.0": T.linear_resnorm_early_tile,
                                     "gu.0": T.gate_up_rstd_wdot_early_tile, "down.0": T.linear_resnorm_early_tile}),
                            (8, 0, {"gu.0": T.gate_up_rstd_early_tile}),
                            (1, 0, {"o.0": T.linear_resnorm_tile, "gu.0": T.gate_up_rstd_tile})):
        specs = {s.name: s for s in RZ.step_specs(cfg.with_tiles(prenorm=True, pn_early=True, gu_wdot=wd), batch)}
        assert {n: specs[n].fn for n in want} == want, (batch, wd)
    # dot_ksplit: the plain qkv / o / down tiles of the batch path (not batch 1's, not the prenorm ones)
    for batch, over, want in ((8, {"prenorm": False}, T.linear_kdot_tile), (1, {}, T.linear_resnorm_tile),
                              (8, {"prenorm": True}, T.linear_resnorm_kdot_tile)):
        specs = {s.name: s for s in RZ.step_specs(cfg.with_tiles(dot_ksplit=4, **over), batch)}
        assert specs["o.0"].fn is want and specs["down.0"].fn is want, (batch, over)
        if want is T.linear_kdot_tile:
            assert specs["qkv.0"].fn is want and specs["down.0"].args["S"] == 4, specs["down.0"].args
    with pytest.raises(DitronError, match="dot_ksplit=3"):
        _cfg(1, dot_ksplit=3)


@pytest.mark.parametrize("ranks,batch,tiles", [
    (1, 3, dict(gu_wdot=8, gu_wdot_k=16, prenorm=True)),        # prenorm: no norm tasks but layer 0's
    (1, 4, dict(gu_wdot=8, gu_wdot_k=16, prenorm=True, pn_early=True)),     # the prenorm tiles' early loads
    (1, 2, dict(prenorm=True, pn_early=True)),                   # ... on the plain tl.dot path
    (1, 5, dict(gu_wdot=16, gu_wdot_k=32, dot_ksplit=4)),        # separate norms; 96 = 6 tiles of 16; K split
    (1, 9, dict(gu_wdot=8, gu_wdot_k=16, prenorm=True, dot_ksplit=4, o_cols=11)),   # prenorm kdot tiles, 11 cols;
                                                                 # 9 rows: the MMAs' N operand padded to 16
    (2, 4, dict(gu_wdot=16, gu_wdot_k=16, dot_ksplit=2)),        # 48 per rank: 3 tiles; qkv / o / down K in 2
    (3, 2, dict(gu_wdot=8, gu_wdot_k=32, prenorm=True, dot_ksplit=4, prefetch_k=64)),   # 32 per rank; prenorm is
                                                                 # one rank only (off here); the prefetch hooks
])
def test_gu_wdot_steps(dist_world, ranks, batch, tiles):
    cfg = _cfg(ranks, **tiles)
    assert cfg.tiles.dot_for(batch)
    ctx = [33, 5, 17, 1, 29, 12, 8, 30, 2][:batch]
    errs = dist_world(ranks).run(B.decoder_steps, steps=2, B=batch, ctx=ctx, page_size=8, cfg=cfg)
    assert len(errs) == ranks and all(len(e) == 2 for e in errs)


def _whole_step(target, kinds=None, **tiles):
    import ditron
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    ditron.init("sim")
    try:
        cfg = qwen3_8b(n_layers=1).with_tiles(**tiles)
        ck = RZ.compile_step(cfg, 8, kinds, target=target)
        return cfg, ck
    finally:
        ditron.finalize()


def test_batch8_default_step_sm90a():
    # issue 26: the batch path's tl.dot GEMVs had the 8 batch rows as the MMA's M operand: Triton laid the 4 warps
    # over M (< 16 rows), so each warp multiplied (and read from shared memory) the whole chunk -- gate/up of batch 8
    # streamed 2.9 TB/s against batch 1's 3.9.  The 8B default (qwen3_8b()) at batch 8: gate/up with 2 x 32 stacked
    # weight rows as M (one warp per 16 rows), qkv / o / down with each K chunk split over the 4 warps (a batched
    # dot, warpsPerCTA [4, 1, 1]), prenorm (no norm tasks); the whole step (every branch, Qwen3-8B's shapes) fits
    # 168 registers and 3 programs per SM
    from ditron._compat import TRITON_VERSION
    from ditron.kernels.decoder import resources as RZ
    cfg, ck = _whole_step("sm_90a")
    assert (cfg.tiles.gu_wdot, cfg.tiles.dot_ksplit, cfg.tiles.prenorm_for(8)) == (32, 4, True), cfg.tiles
    use = ck.usage()
    assert use["registers"] <= 168, use
    ttgir = ck.asm["ttgir"]
    layouts = dict(re.findall(r"^(#mma\d*) = #ttg\.nvidia_mma<\{versionMajor = [23], versionMinor = 0, "
                              r"warpsPerCTA = \[([\d, ]+)\]", ttgir, re.M))
    assert layouts, "the batch path's GEMVs accumulate on the tensor cores (mma.sync / wgmma)"
    dots = re.findall(r"tt\.dot %\S+, %\S+, %\S+(?:, inputPrecision = \w+)? : tensor<([\dx]+)xbf16, #ttg\.dot_op<"
                      r"\{opIdx = 0, parent = (#mma\d*)[^>]*>> \* tensor<([\dx]+)xbf16", ttgir)
    # Triton >= 3.9 gives the [64, K] x [K, 8] gate/up dot to a warpgroup (wgmma: operands in shared memory)
    wgmma = re.findall(r"ttng\.warp_group_dot %\S+, %\S+, %\S+ \{[^}]*\} : !ttg\.memdesc<([\dx]+)xbf16[^>]*> \* "
                       r"!ttg\.memdesc<([\dx]+)xbf16[^>]*> -> tensor<[\dx]+xf32, (#mma\d*)>", ttgir)
    shapes = {(a, b): layouts[m] for a, m, b in dots} | {(a, b): layouts[m] for a, b, m in wgmma}
    # gate/up: [64, 128] stacked weight rows x [128, 8] activations (the K chunk from the 48 KiB ring of batches up
    # to 8), M over the 4 warps (mma.sync on Triton 3.6, one warpgroup's wgmma on 3.9)
    assert shapes.get(("64x128", "128x8")) == "4, 1", shapes
    # qkv / o / down: [4, 16, 128] weight slices x [4, 128, 8], one K slice per warp
    assert shapes.get(("4x16x128", "4x128x8")) == "4, 1, 1", shapes
    assert not [k for k in shapes if k[0].startswith("8x")], shapes      # no dot with the batch rows as M
    # 48 KiB of shared memory on Triton 3.6 (54 KiB on 3.9), 3 programs per SM; spills as
    # tests/test_decoder.py::test_decoder_batch_step_fits_three_programs_per_sm explains (per-item stores)
    assert RZ.resident_per_sm(use, cfg.tiles.num_warps) >= 3, use
    assert use["spill_stores"] <= 256 and use["spill_loads"] <= 256, use
    if TRITON_VERSION[:2] == (3, 6):
        assert use["shared"] <= 49152, use
        # batch 16's gate/up ring (16 activation rows: Triton allocates one buffer more) fits 72 KiB with the K chunk
        # chosen from the ring (gu_wdot_k=0; 256-deep chunks would take 80 KiB: 2 programs per SM)
        import ditron
        ditron.init("sim")
        try:
            gu16 = RZ.usage(cfg, 16, ("gu",))
        finally:
            ditron.finalize()
        assert gu16["shared"] <= 73728 and gu16["spill_stores"] == 0, gu16


def test_batch8_default_gemv_gfx942():
    # the GEMV branches of the default batch-8 step (max_regs is an NVIDIA (ptxas) option)
    _, ck = _whole_step("gfx942", ("o", "gu", "down"), max_regs=0)
    # the gate/up branch's dot: [64, 128] stacked weight rows x [128, 8]
    assert re.search(r"tt\.dot %\S+, %\S+, %\S+[^:]*: tensor<64x128xbf16, [^*]*\* tensor<128x8xbf16", ck.asm["ttgir"])
    assert "v_mfma" in ck.asm["amdgcn"], "the GEMVs accumulate on the matrix cores"
