"""The decoder megakernel's batch path (issue 26: batch 8 within 1.3x batch 1): the gate/up tiles with the weight
rows on the MMA's M side (``TileConfig.gu_wdot``) on simulated ranks against the torch reference (ragged paged
contexts, two steps), with and without ``prenorm``; and the whole batch-8 step at Qwen3-8B's shapes compiled for
sm_90a (registers, spills, programs per SM, the gate/up MMA's shape) and gfx942."""
import re

import pytest

import bodies_decoder as B


def _cfg(ranks, **tiles):
    from ditron.kernels.decoder import tiny
    cfg = tiny(**(dict(n_q_heads=6, n_kv_heads=3) if ranks == 3 else {}))
    return cfg.with_tiles(dot_from=2, dot_stream=True, dot_pad=8, dot_ring=4096, direct_tp1=True, **tiles)


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
    cfg = qwen3_8b(n_layers=1).with_tiles(gu_wdot=32, gu_wdot_k=256)
    for batch, prenorm, fn in ((8, False, T.gate_up_wdot_tile), (8, True, T.gate_up_rstd_wdot_tile),
                               (1, None, T.gate_up_rstd_tile)):
        gu = next(s for s in RZ.step_specs(cfg.with_tiles(prenorm=prenorm), batch) if s.name == "gu.0")
        assert gu.fn is fn, (batch, prenorm, gu.fn)
        if batch == 8:
            # 12288 / 32 = 384 tiles (one per program of 3 x 132); 2 x 32 x 256 weights + 8 x 256 activations
            # = 36 KiB a stage: 3 stages in the 72 KiB ring
            assert gu.num_tiles == 384 and gu.args["BLOCK_B"] == 8 and gu.args["STREAM"] == 3, gu.args
    # gu_wdot_k=0: the K chunk follows the ring (2 chunks in flight at least)
    auto = qwen3_8b(n_layers=1).with_tiles(gu_wdot=32)
    got = {b: next(s for s in RZ.step_specs(auto, b) if s.name == "gu.0").args for b in (2, 8, 16)}
    assert [(got[b]["BLOCK_K"], got[b]["STREAM"]) for b in (2, 8, 16)] == [(256, 3), (256, 3), (128, 3)], got
    # pn_early: the batch path's prenorm tiles (batch 1's FMA path keeps its own)
    for batch, wd, want in ((8, 32, {"qkv.0": T.linear_tile, "o.0": T.linear_resnorm_early_tile,
                                     "gu.0": T.gate_up_rstd_wdot_early_tile, "down.0": T.linear_resnorm_early_tile}),
                            (8, 0, {"gu.0": T.gate_up_rstd_early_tile}),
                            (1, 0, {"o.0": T.linear_resnorm_tile, "gu.0": T.gate_up_rstd_tile})):
        specs = {s.name: s for s in RZ.step_specs(cfg.with_tiles(prenorm=True, pn_early=True, gu_wdot=wd), batch)}
        assert {n: specs[n].fn for n in want} == want, (batch, wd)
    # dot_ksplit: the plain qkv / o / down tiles of the batch path (not batch 1's, not the prenorm ones)
    for batch, over, want in ((8, {}, T.linear_kdot_tile), (1, {}, T.linear_resnorm_tile),
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
    (1, 3, dict(gu_wdot=8, gu_wdot_k=16, prenorm=True, dot_ksplit=4, o_cols=11)),   # prenorm kdot tiles, 11 cols
    (2, 4, dict(gu_wdot=16, gu_wdot_k=16, dot_ksplit=2)),        # 48 per rank: 3 tiles; qkv / o / down K in 2
    (3, 2, dict(gu_wdot=8, gu_wdot_k=32, prenorm=True, dot_ksplit=4, prefetch_k=64)),   # 32 per rank; prenorm is
                                                                 # one rank only (off here); the prefetch hooks
])
def test_gu_wdot_steps(dist_world, ranks, batch, tiles):
    cfg = _cfg(ranks, **tiles)
    assert cfg.tiles.dot_for(batch)
    ctx = [33, 5, 17, 1, 29][:batch]
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


def test_batch8_gu_wdot_sm90a():
    # issue 26: the batch path's gate/up tiles were 8 x 512 tl.dot chunks with the 8 batch rows as the MMA's M
    # operand: Triton laid the 4 warps over M, so each warp multiplied (and read from shared memory) the whole
    # chunk -- the gate/up phase of batch 8 streamed 2.9 TB/s against batch 1's 3.9.  With gu_wdot the MMA's
    # M is the 2 x 32 stacked weight rows: one warp per 16 rows.  The whole step (every branch) at Qwen3-8B's
    # shapes still fits 168 registers and 3 programs per SM
    from ditron._compat import TRITON_VERSION
    from ditron.kernels.decoder import resources as RZ
    cfg, ck = _whole_step("sm_90a", gu_wdot=32, gu_wdot_k=256)
    use = ck.usage()
    assert use["registers"] <= 168, use
    ttgir = ck.asm["ttgir"]
    mmas = re.findall(r"#mma\d* = #ttg\.nvidia_mma<\{versionMajor = 2, versionMinor = 0, warpsPerCTA = \[(\d+), "
                      r"(\d+)\]", ttgir)
    assert mmas, "the batch path's GEMVs accumulate on the tensor cores (mma.sync)"
    # the gate/up dot: [64, 256] weight rows x [256, 8] activations -> [64, 8], M split over the 4 warps
    dots = re.findall(r"tt\.dot %\S+, %\S+, %\S+(?:, inputPrecision = \w+)? : tensor<(\d+)x(\d+)xbf16, #ttg\.dot_op<"
                      r"\{opIdx = 0, parent = (#mma\d*)[^>]*>> \* tensor<(\d+)x(\d+)xbf16", ttgir)
    gu = [d for d in dots if (d[0], d[1], d[4]) == ("64", "256", "8")]
    assert gu, dots
    layout = re.search(re.escape(gu[0][2]) + r" = #ttg\.nvidia_mma<\{[^}]*warpsPerCTA = \[(\d+), (\d+)\]", ttgir)
    assert layout and layout.groups() == ("4", "1"), layout
    if TRITON_VERSION[:2] == (3, 6):
        # batch 16's gate/up ring (16 activation rows: Triton allocates one buffer more) fits 72 KiB with the K chunk
        # chosen from the ring (gu_wdot_k=0; 256-deep chunks would take 80 KiB: 2 programs per SM)
        import ditron
        ditron.init("sim")
        try:
            gu16 = RZ.usage(cfg.with_tiles(gu_wdot_k=0), 16, ("gu",))     # K chunk from the ring: 128
        finally:
            ditron.finalize()
        assert gu16["shared"] <= 73728 and gu16["spill_stores"] == 0, gu16
        # the GPU machines' version: 4 bytes spilled (the default step: 24 with the CPU's ptxas, in the persistent
        # loop's header; with prenorm as well 48), 3 programs per SM
        assert use["spill_stores"] <= 24 and use["spill_loads"] <= 24, use
        assert RZ.resident_per_sm(use, cfg.tiles.num_warps) >= 3, use


def test_batch8_gu_wdot_gfx942():
    # the GEMV branches of the batch step, the prenorm variant (max_regs is an NVIDIA (ptxas) option)
    _, ck = _whole_step("gfx942", ("o", "gu", "down"), gu_wdot=32, gu_wdot_k=256, prenorm=True, max_regs=0)
    # the gate/up branch's dot: [64, 256] stacked weight rows x [256, 8]
    assert re.search(r"tt\.dot %\S+, %\S+, %\S+[^:]*: tensor<64x256xbf16, [^*]*\* tensor<256x8xbf16", ck.asm["ttgir"])
    assert "v_mfma" in ck.asm["amdgcn"], "the GEMVs accumulate on the matrix cores"
