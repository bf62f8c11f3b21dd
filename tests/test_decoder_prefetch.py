"""Issue 26, batch 1 of the decoder megakernel towards the HBM limit: the step's structural levers on the
simulator (against the torch reference of all ranks, two consecutive steps, ragged contexts) and compiled for
sm_90a / gfx942 (registers and spills on the CPU's ptxas).

* ``TileConfig.fold_resid``: at one rank with the norms fused into the GEMV tiles (batch 1 of the 8B defaults) the
  o_proj / down_proj tiles commit the pending residual add of their own columns (``linear_resid_tile``): no
  ``res_a`` / ``res_m`` tasks; at 2 and 3 ranks (all-reduce tasks) nothing changes.
* ``TileConfig.prenorm``: on top of that, o_proj / down_proj add their output to the residual at once and write the
  next norm's bf16 input ``r * w`` and their columns' sums of squares (``linear_resnorm_tile``); qkv (from layer 1)
  and gate/up are plain GEMVs over it scaled by ``rstd`` (``linear_rstd_tile``, ``gate_up_rstd_tile``).
* ``TileConfig.o_cols`` / ``down_cols`` / ``gate_up_cols``: the prenorm tiles of those projections hold fewer columns
  than their rows (masked tiles), so that their counts can match the programs.
"""
import pytest

import bodies_decoder as B


def _names(cfg, world_size, batch):
    """Task kinds of the step at ``world_size`` ranks (specs only: nothing compiled)."""
    from ditron.kernels.decoder import resources as RZ
    return RZ.kinds_of(_specs(cfg, world_size, batch))


def _specs(cfg, world_size, batch):
    """The step's task specs at ``world_size`` ranks (rank 0's; placeholder weights and cache)."""
    from ditron.kernels.decoder import resources as RZ
    if world_size == 1:
        return RZ.step_specs(cfg, batch)
    import torch

    from ditron.kernels.decoder.model import decoder_tasks, make_buffers
    from ditron.kernels.decoder.weights import PagedKV, Weights
    sh = cfg.shard(world_size)
    w = Weights(*[torch.empty(1, dtype=torch.bfloat16) for _ in range(7)], torch.empty(1, dtype=torch.float32))
    k = torch.empty((cfg.n_layers, 1, 16, sh.kv_heads, cfg.head_dim), dtype=torch.bfloat16)
    cache = PagedKV(k, k, torch.zeros((batch, 3), dtype=torch.int32))
    buf = make_buffers(cfg, world_size, batch, cache.max_ctx, 1, "cpu")
    return decoder_tasks(cfg, world_size, w, cache, buf)


@pytest.mark.parametrize("lever", ["fold_resid", "prenorm"])
def test_fold_resid_removes_the_commit_stages(lever):
    from ditron.errors import DitronError
    from ditron.kernels.decoder import qwen3_8b, tiny
    from ditron.kernels.decoder import resources as RZ
    old = qwen3_8b(n_layers=1).with_tiles(prenorm=False, prenorm_dot=False, gu_wdot=0,   # the 8B tiles before
                                          dot_ksplit=0, stream_wait=0)                  # these levers
    cfg = old.with_tiles(**{lever: True})
    kinds = _names(cfg, 1, 1)
    assert "res_a" not in kinds and "res_m" not in kinds and {"o", "down", "gu", "qkv"} <= set(kinds), kinds
    fns = {s.name: s.fn.fn.__name__ for s in RZ.step_specs(cfg, 1)}
    if lever == "prenorm":
        assert fns["o.0"] == fns["down.0"] == "linear_resnorm_tile" and fns["gu.0"] == "gate_up_rstd_tile", fns
        assert fns["qkv.0"] == "rms_linear_tile", fns          # layer 0 normalises the step's input itself
    else:
        assert fns["o.0"] == fns["down.0"] == "linear_resid_tile" and fns["gu.0"] == "rms_gate_up_tile", fns
    assert "res_m" in _names(old, 1, 1)
    b8 = _names(cfg, 1, 8)
    if lever == "prenorm":      # the batch path: no separate norm tasks but layer 0's (it normalises the input)
        fns = {s.name: s.fn.fn.__name__ for s in RZ.step_specs(cfg, 8)}
        assert "norm_a.0" in fns and "norm_m" not in b8 and fns["gu.0"] == "gate_up_rstd_tile", fns
    else:                       # the batch path (separate norm tasks) is unchanged
        assert b8 == _names(old, 1, 8)
    # at 2 ranks the all-reduce writes the delta: the commits stay
    t = tiny().with_tiles(fold_resid=True, direct_tp1=True)
    assert "res_m" in _names(t, 2, 1) and "ar_mlp" in _names(t, 2, 1)
    with pytest.raises(DitronError, match="fold_resid"):
        tiny().with_tiles(down_split_k=2, **{lever: True})


def test_8b_defaults_take_prenorm():
    # measured on one H200 (bench/megakernel_levers.sh, 2026-11-27): prenorm and 32 x 256 gate/up tiles at batch 1
    # are qwen3_8b()'s defaults; the batch path (tl.dot) takes prenorm too since its gate/up tiles are 32 x 256 with
    # the weight rows on the MMA's M side (prenorm_dot, gu_wdot; bench/results/h200-2026-11-27-b8.md; with the
    # 8-wide tiles before it lost 5%); split-K turns the automatic prenorm off
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    cfg = qwen3_8b(n_layers=1)
    t = cfg.tiles
    assert t.prenorm is None and t.prenorm_for(1) and t.prenorm_for(2) and t.prenorm_for(16)
    assert not cfg.with_tiles(prenorm_dot=False).tiles.prenorm_for(2)
    assert not cfg.with_tiles(down_split_k=3).tiles.prenorm_for(1)
    assert not cfg.with_tiles(down_split_k=3).tiles.prenorm_for(8)
    b1 = {s.name: s for s in RZ.step_specs(cfg, 1)}
    # (the tile with in-loop waits: TileConfig.stream_wait's auto default on NVIDIA, tests/test_decoder_regs.py)
    assert b1["gu.0"].fn.fn.__name__ == "gate_up_rstd_sw_tile" and b1["gu.0"].num_tiles == 12288 // 32
    assert b1["gu.0"].args["BLOCK_N"] == 32 and b1["gu.0"].args["BLOCK_K"] == 256
    b8 = {s.name: s for s in RZ.step_specs(cfg, 8)}
    assert "norm_m.0" not in b8 and b8["gu.0"].fn.fn.__name__ == "gate_up_rstd_wdot_tile", b8["gu.0"]
    assert b8["gu.0"].args["BLOCK_N"] == 32 and b8["gu.0"].num_tiles == 12288 // 32
    old = {s.name: s for s in RZ.step_specs(cfg.with_tiles(prenorm_dot=False, gu_wdot=0, dot_ksplit=0), 8)}
    assert "norm_m.0" in old and old["gu.0"].fn.fn.__name__ == "gate_up_tile" and old["gu.0"].args["BLOCK_N"] == 8


def test_prefetch_projs_selects_the_hooked_projections():
    # TileConfig.prefetch_projs: the L2 prefetch before the wait (prefetch_k) on some projections only (one H200:
    # down_proj's first 1024 columns at batch 1, -0.6% / -0.4% at context 512 / 4096;
    # bench/results/2026-11-28-megakernel-fma-partials/); the others get no hook and no PREFETCH_K argument
    from ditron.errors import DitronError
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    from ditron.kernels.decoder import tiles as T
    cfg = qwen3_8b(n_layers=1).with_tiles(prefetch_k=1024, prefetch_projs="down")
    for batch in (1, 8):                # the FMA path and the tl.dot path
        got = {s.name: s for s in RZ.step_specs(cfg, batch)}
        # (down_proj writes the next norm's input at both batches: prenorm tiles of COLS rows, their own hook)
        assert got["down.0"].prefetch is T.linear_cols_prefetch and got["down.0"].args["PREFETCH_K"] == 1024
        for name in ("qkv.0", "o.0", "gu.0"):
            assert got[name].prefetch is None and "PREFETCH_K" not in got[name].args, name
    every = {s.name: s for s in RZ.step_specs(cfg.with_tiles(prefetch_projs="qkv+o,gate_up,down"), 1)}
    assert every["gu.0"].prefetch is T.gate_up_prefetch and every["qkv.0"].prefetch is T.linear_prefetch
    # o_proj / down_proj at batch 1 (prenorm): tiles of COLS rows (o_cols / down_cols), their own hook
    assert every["o.0"].prefetch is T.linear_cols_prefetch and every["down.0"].prefetch is T.linear_cols_prefetch
    assert every["o.0"].args["COLS"] == every["o.0"].args["BLOCK_N"] == 16
    assert all(s.prefetch is None for s in RZ.step_specs(cfg.with_tiles(prefetch_k=0), 1))
    with pytest.raises(DitronError, match=r"prefetch_projs='down,up'.*unknown projection\(s\) \['up'\]"):
        cfg.with_tiles(prefetch_projs="down,up")


def test_8b_default_prefetches_o_proj_only():
    # Qwen3-8B's defaults (one H200, bench/results/2026-11-28-megakernel-o-prefetch/): o_proj's tiles ask L2 for
    # the first 1024 columns of their weight rows before their wait, during the attention chain (batch 1 -1% at
    # context 4096); no other projection prefetches, on the FMA path and the tl.dot path alike
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    from ditron.kernels.decoder import tiles as T
    cfg = qwen3_8b(n_layers=1)
    assert (cfg.tiles.prefetch_k, cfg.tiles.prefetch_projs) == (1024, "o")
    for batch in (1, 8):
        got = {s.name: s for s in RZ.step_specs(cfg, batch)}
        assert got["o.0"].prefetch is T.linear_cols_prefetch and got["o.0"].args["PREFETCH_K"] == 1024, batch
        for name in ("qkv.0", "gu.0", "down.0"):
            assert got[name].prefetch is None and "PREFETCH_K" not in got[name].args, (batch, name)


@pytest.mark.parametrize("ranks,batch,lever", [(1, 1, "fold_resid"), (1, 2, "fold_resid"), (2, 1, "fold_resid"),
                                               (3, 1, "fold_resid"), (1, 1, "prenorm"), (1, 2, "prenorm"),
                                               (1, 3, "prenorm"), (2, 1, "prenorm"), (3, 1, "prenorm")])
def test_decoder_megakernel_fold_resid(dist_world, ranks, batch, lever):
    # one rank: o_proj and down_proj overwrite the delta that they also fold into resid (tile-local columns); the
    # simulator's access check verifies every read of resid / delta is ordered by the declared Dep ranges; 2 and 3
    # ranks: the all-reduce path (the lever has no effect there), checked the same way.  Batch 3: the tl.dot path
    # with separate norms, which prenorm replaces from layer 1 on
    from ditron.kernels.decoder import tiny
    cfg = tiny(**(dict(n_q_heads=6, n_kv_heads=3) if ranks == 3 else {}))
    cfg = cfg.with_tiles(direct_tp1=True, gemv_stream=True, o_block_n=32, **{lever: True})
    if lever == "prenorm" and ranks == 1:       # masked tiles of 11 (o: 6 tiles of 64) and 13 (down) columns,
        cfg = cfg.with_tiles(o_cols=11, down_cols=13, prefetch_k=64)    # their weight rows prefetched (the
        # simulator checks that each prefetched address lies in the weight tensor)
    errs = dist_world(ranks).run(B.decoder_steps, steps=2, B=batch, ctx=[33, 5, 17][:batch], cfg=cfg)
    assert len(errs) == ranks and all(len(e) == 2 for e in errs)


@pytest.mark.skipif(__import__("os").environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                    reason="simulator race finder")
@pytest.mark.parametrize("lever", ["fold_resid", "prenorm"])
def test_decoder_fold_resid_is_race_free(lever):
    # every buffer on the symmetric heap: the race finder sees the o / down tiles' read-modify-write of resid (and
    # delta, or hn and the sums of squares) ordered after every GEMV tile's read of them, under random program
    # interleavings
    from conftest import race_world
    from ditron.kernels.decoder import tiny
    cfg = tiny().with_tiles(fuse_norm=True, direct_tp1=True, qkv_block_n=8, o_block_n=32, **{lever: True})
    errs = race_world(1).run(B.decoder_steps_symmetric, steps=2, cfg=cfg)
    assert len(errs) == 1 and len(errs[0]) == 2


@pytest.mark.parametrize("target,lever", [("sm_90a", "fold_resid"), ("sm_90a", "prenorm"), ("gfx942", "prenorm")])
def test_fold_resid_compiles(target, lever):
    # the whole batch-1 step at Qwen3-8B's shapes (one layer) with the lever: on sm_90a within the 168-register cap
    # without spills and 3 programs per SM, like the default (the old residual is read after the weight stream: held
    # across it, ptxas spilled 60 bytes per thread)
    import ditron
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    ditron.init("sim")
    try:
        # fold_resid as measured: with the fused-norm gate/up tiles of 8 x 1024 (32 x 256 fused ones spill 64 bytes)
        old = dict(gate_up_block_n=8, gate_up_block_k=1024) if lever == "fold_resid" else {}
        # (without the gate/up in-loop waits of the default: test_decoder_regs.py)
        cfg = qwen3_8b(n_layers=1).with_tiles(**{"prenorm": False, "stream_wait": 0, **old, lever: True})
        if target == "gfx942":                  # (max_regs is a ptxas option)
            from conftest import device_asm
            asm = device_asm(RZ.compile_step(cfg.with_tiles(max_regs=0), 1, target=target))
            assert "global_load_dwordx4" in asm and "s_barrier" in asm
            return
        use = RZ.usage(cfg, 1)
    finally:
        ditron.finalize()
    assert use["cp_async"] and use["registers"] <= 168, use
    # (Triton 3.6: prenorm 24 B, fold_resid 0; 3.9: 4 / 12-16)
    assert use["spill_stores"] <= 32 and use["spill_loads"] <= 32, use
    from ditron._compat import TRITON_VERSION
    if TRITON_VERSION[:2] == (3, 6):
        assert use["resident_per_sm"] >= 3, use


def _gu_cols_cfg(cols, **tiles):
    """tiny (intermediate 96, gate/up tiles of 16 rows) at one rank with prenorm and gate/up tiles of ``cols``."""
    from ditron.kernels.decoder import tiny
    return tiny().with_tiles(**{"direct_tp1": True, "gemv_stream": True, "prenorm": True, "gate_up_cols": cols,
                                **tiles})


def test_gate_up_cols_config_and_tasks(capsys):
    # TileConfig.gate_up_cols: Llama-3.1-8B's MLP (14336 columns) in the 8B defaults' 32-row gate/up tiles is 448
    # tiles for 396 programs (1.13 waves); 64-row tiles of 37 columns are 388 (one wave).  Every reader of act by
    # gate/up tile follows the columns: down's in-loop waits (WAIT_PN), the prefetch hook (gate_up_cols_prefetch)
    from ditron.errors import DitronError
    from ditron.kernels.decoder import hf
    from ditron.kernels.decoder import tiles as T
    from ditron.kernels.decoder import tiles_gemv as TG
    for bad in (-1, True, 2.5):
        with pytest.raises(DitronError, match=f"gate_up_cols={bad!r}: must be an int >= 0"):
            _gu_cols_cfg(bad)
    llama = hf.config_from_hf(hf.HF_CONFIGS["llama3-8b"]).with_(n_layers=1)
    cfg = llama.with_tiles(gate_up_block_n=64, gate_up_cols=37, stream_wait_projs="gate_up,down",
                           prefetch_projs="o,gate_up")
    assert (cfg.tiles.cols("gate_up"), cfg.tiles.cols("gate_up", True)) == (37, 32)     # (gu_wdot: its width)
    b1 = {s.name: s for s in _specs(cfg, 1, 1)}
    gu, down = b1["gu.0"], b1["down.0"]
    assert gu.fn is TG.gate_up_rstd_sw_tile and gu.num_tiles == 388, gu
    assert (gu.args["BLOCK_N"], gu.args["COLS"]) == (64, 37) and gu.prefetch is T.gate_up_cols_prefetch
    assert down.fn is TG.linear_resnorm_sw_tile and down.args["WAIT_PN"] == 37, down.args
    # Llama's default (hf.tiles_for) is 19 columns; unset: COLS 0 (all BLOCK_N columns), the plain hook, down's
    # producer tiles of 32 columns
    assert llama.tiles.gate_up_cols == 19
    d = {s.name: s for s in _specs(llama.with_tiles(prefetch_projs="o,gate_up", stream_wait_projs="gate_up,down",
                                                    gate_up_cols=0), 1, 1)}
    assert (d["gu.0"].num_tiles, d["gu.0"].args["COLS"], d["down.0"].args["WAIT_PN"]) == (448, 0, 32)
    assert d["gu.0"].prefetch is T.gate_up_prefetch
    # the plain prenorm tile (no in-loop waits) takes the columns too
    plain = next(s for s in _specs(cfg.with_tiles(stream_wait=0), 1, 1) if s.name == "gu.0")
    assert plain.fn is T.gate_up_rstd_tile and plain.num_tiles == 388 and plain.args["COLS"] == 37
    # the batch path's gu_wdot tiles: gate_up_cols ignored there (one config serves every batch), gu_wdot_cols theirs
    b8 = {s.name: s for s in _specs(cfg, 1, 8)}["gu.0"]
    assert b8.fn is T.gate_up_rstd_wdot_tile and b8.num_tiles == 448 and b8.args["COLS"] == 0
    assert b8.prefetch is T.gate_up_prefetch
    w8 = {s.name: s for s in _specs(cfg.with_tiles(gu_wdot_cols=19), 1, 8)}
    assert w8["gu.0"].fn is T.gate_up_rstd_wdot_tile and w8["gu.0"].num_tiles == 755, w8["gu.0"]
    assert (w8["gu.0"].args["BLOCK_N"], w8["gu.0"].args["COLS"]) == (32, 19)
    assert w8["gu.0"].prefetch is T.gate_up_cols_prefetch
    with pytest.raises(DitronError, match="gu_wdot_cols=33: more than the gate_up tile width 32 of the tl.dot path"):
        _specs(cfg.with_tiles(gu_wdot_cols=33), 1, 8)
    for bad in (-1, True):
        with pytest.raises(DitronError, match=f"gu_wdot_cols={bad!r}: must be an int >= 0"):
            cfg.with_tiles(gu_wdot_cols=bad)
    # ... the plain tl.dot path's prenorm tile (pn_early, no gu_wdot) takes them, within its width
    with pytest.raises(DitronError, match="gate_up_cols=37: more than the gate_up tile width 8 of the tl.dot path"):
        _specs(cfg.with_tiles(gu_wdot=0, pn_early=True), 1, 8)
    e8 = {s.name: s for s in _specs(cfg.with_tiles(gu_wdot=0, pn_early=True, dot_gate_up_block_n=64), 1, 8)}
    assert e8["gu.0"].fn is T.gate_up_rstd_early_tile and e8["gu.0"].num_tiles == 388 and e8["gu.0"].args["COLS"] == 37
    with pytest.raises(DitronError, match=r"gate_up_cols=37: more than the gate_up tile width 32 \("):
        _specs(llama.with_tiles(gate_up_cols=37), 1, 1)
    # where prenorm does not apply it is ignored, as o_cols / down_cols are: the fused-norm tiles, 2 ranks (the
    # all-reduce path), split-K (no prenorm: its slices wait for the gate/up tiles of 16 columns)
    for c, ranks, want in ((_gu_cols_cfg(11, prenorm=False), 1, 6), (_gu_cols_cfg(11), 2, 3),
                           (_gu_cols_cfg(11, prenorm=None, down_split_k=2), 1, 6)):
        gu = next(s for s in _specs(c.with_(n_layers=1), ranks, 1) if s.name == "gu.0")
        assert gu.fn is T.rms_gate_up_tile and gu.num_tiles == want and "COLS" not in gu.args, (c.tiles, ranks)
    # the bench's --cols sets it (--dry-run: the gate/up tiles per batch)
    from ditron.bench.megakernel import main
    assert main(["--dry-run", "--model", "llama3-8b", "--ctx", "33", "--batch", "1,8", "--block-n", "gate_up=64",
                 "--cols", "gate_up=37"]) == 0
    out = capsys.readouterr().out
    assert "'gate_up_block_n': 64" in out and "'gate_up_cols': 37" in out, out
    assert "batch 1: " in out and "gate/up 388 tiles of 37 of 64 columns" in out, out
    assert "gate/up 448 tiles of 32 columns" in out, out              # batch 8: the gu_wdot tiles
    with pytest.raises(SystemExit, match="--cols 'qkv=3'"):
        main(["--dry-run", "--cols", "qkv=3"])


@pytest.mark.parametrize("batch,cols,tiles", [
    (1, 13, dict(stream_wait=0, prefetch_k=64, prefetch_projs="gate_up")),   # the plain tile, its rows prefetched
    # the in-loop-wait tile (stream_wait's default: gate/up), down waiting per chunk for gate/up tiles of 13
    (1, 13, dict(stream_wait_projs="gate_up,down", gemv_block_k=8)),
    (1, 11, dict(stream_wait_projs="gate_up,down", gemv_block_k=8, stream_wait_exact=True)),
    (2, 11, dict(prefetch_k=64)),                       # the FMA path of batch 2, every hook
    (3, 13, {}),                                        # the tl.dot path (tiny: batch 3 on, no gu_wdot)
    (3, 11, dict(pn_early=True, stream_wait=0)),        # ... its early tile
    (3, 11, dict(gu_wdot=16, gu_wdot_cols=11)),         # the gu_wdot tiles (TileConfig.gu_wdot_cols)
    (3, 13, dict(gu_wdot=16, gu_wdot_cols=13, pn_early=True, prefetch_k=64, prefetch_projs="gate_up")),  # early
])
def test_decoder_megakernel_gate_up_cols(dist_world, batch, cols, tiles):
    # TileConfig.gate_up_cols on the simulator against the torch reference (two steps, ragged contexts): gate/up
    # tiles of 16 rows holding 11 or 13 columns of the 96 (9 / 8 tiles, the last one partial), read by down_proj per
    # tile of 11 / 13 columns; a tile storing past its columns would overwrite its neighbour's
    cfg = _gu_cols_cfg(cols, **tiles)
    errs = dist_world(1).run(B.decoder_steps, steps=2, B=batch, ctx=[33, 5, 17][:batch], cfg=cfg)
    assert len(errs) == 1 and len(errs[0]) == 2


@pytest.mark.skipif(__import__("os").environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                    reason="simulator race finder")
def test_gate_up_cols_is_race_free():
    # every buffer on the symmetric heap: each masked gate/up tile writes only its own act columns (a store past them
    # races with the next tile's), and down_proj's in-loop waits cover the tiles of 13 columns its chunks read
    from conftest import race_world
    cfg = _gu_cols_cfg(13, stream_wait_projs="gate_up,down", gemv_block_k=8)
    errs = race_world(1).run(B.decoder_steps_symmetric, steps=2, cfg=cfg)
    assert len(errs) == 1 and len(errs[0]) == 2


def test_gate_up_cols_compiles():
    # Llama-3.1-8B's gate/up branch at batch 1 with tiles of 32 rows holding 19 columns (755 tiles) on sm_90a: the
    # weights still stream by cp.async and 3 programs fit per SM, within the 168-register cap without spills (the
    # row mask costs registers: 72 -> 134 on Triton 3.9, 138 on 3.6; the whole step: 149 / 168, as without it)
    import ditron
    from ditron.kernels.decoder import hf
    from ditron.kernels.decoder import resources as RZ
    cfg = hf.config_from_hf(hf.HF_CONFIGS["llama3-8b"]).with_(n_layers=1).with_tiles(gate_up_cols=19)
    ditron.init("sim")
    try:
        use = RZ.usage(cfg, 1, ("gu",))
    finally:
        ditron.finalize()
    assert use["cp_async"] and use["registers"] <= 168 and use["resident_per_sm"] >= 3, use
    assert use["spill_stores"] == 0 and use["spill_loads"] == 0, use
