"""The Qwen3-like TP decoder of kernels/decoder (issue 13 part B): its tile
functions against torch at small odd shapes, the torch reference's TP split,
and the whole step as one persistent megakernel on simulated ranks (on GPUs
under torchrun) against the reference."""
import os
import re

import pytest
import torch

import bodies_decoder as B
from ditron._compat import TRITON_VERSION as _TRITON_VERSION
from ditron.errors import DitronError, DitronHangError, DitronRankError


def test_rmsnorm_tile(dist_world):
    assert dist_world(1).run(B.rmsnorm_tile) == [2]


def test_linear_and_gate_up_tiles(dist_world):
    # plain and fused-norm GEMV tiles, both accumulation paths, each also with the pipelined weight stream,
    # bf16 and float32 outputs
    assert dist_world(1).run(B.linear_tiles) == [20]


def test_add_resid_tile(dist_world):
    assert dist_world(1).run(B.add_resid_tile) == [2]


def test_qk_norm_rope_append_tile(dist_world):
    assert dist_world(1).run(B.rope_tile) == [3]


def test_attention_split_and_combine_tiles(dist_world):
    assert dist_world(1).run(B.attention_tiles) == [1]


def test_config_split_and_errors():
    from ditron.kernels.decoder import qwen3_8b, tiny
    sh = qwen3_8b().shard(2)
    assert (sh.q_heads, sh.kv_heads, sh.inter, sh.qkv_cols) == (16, 4, 6144, 3072)
    with pytest.raises(DitronError, match=r"divisible by 3; not: n_q_heads=32, n_kv_heads=8"):
        qwen3_8b().shard(3)
    with pytest.raises(DitronError, match="n_kv_heads=2 .* divisible by 4|divisible by 4; not: n_kv_heads=2"):
        tiny().shard(4)
    with pytest.raises(DitronError, match="multiple of n_kv_heads"):
        tiny(n_q_heads=5)
    with pytest.raises(DitronError, match="power of two"):
        tiny().with_tiles(gemv_block_n=24)
    with pytest.raises(DitronError, match="o_block_n=12: must be 0"):
        tiny().with_tiles(o_block_n=12)
    assert tiny().with_tiles(gate_up_block_n=64).tiles.block_n("gate_up") == 64
    assert tiny().tiles.block_n("gate_up") == tiny().tiles.gemv_block_n
    # issue 26's levers: bad values are errors naming the field; the stream depth per path
    for bad, what in ((dict(stream_stages=1), "stream_stages=1"), (dict(max_regs=300), "max_regs=300"),
                      (dict(down_split_k=0), "down_split_k=0"), (dict(dot_ring_small=-1), "dot_ring_small=-1")):
        with pytest.raises(DitronError, match=what):
            tiny().with_tiles(**bad)
    tc = tiny().with_tiles(gemv_stream=True, stream_stages=4).tiles
    assert (tc.stream_for(1), tc.stream_for(3)) == (4, 0)
    tc = tiny().with_tiles(dot_stream=True).tiles
    assert (tc.stream_for(2), tc.stream_for(16)) == (0, 3)
    # the 8B defaults: batch 1 on the streamed FMA path with the norm fused in, from batch 2 the streamed tl.dot
    # path with separate norms; the thresholds are fields (tiny keeps tl.dot from 3, fused norms up to 2)
    tc = qwen3_8b().tiles
    assert [(tc.dot_for(b), tc.fuse_for(b), tc.stream_for(b)) for b in (1, 2, 16)] == [
        (False, True, 3), (True, False, 3), (True, False, 3)]
    assert [(tiny().tiles.dot_for(b), tiny().tiles.fuse_for(b)) for b in (2, 3)] == [(False, True), (True, False)]
    for bad in (dict(dot_from=0), dict(fuse_upto=-1)):
        with pytest.raises(DitronError, match=f"{next(iter(bad))}={next(iter(bad.values()))}"):
            tiny().with_tiles(**bad)


def test_decoder_split_k_must_divide():
    # the intermediate per rank (96 at TP=1) must split into slices of a multiple of 8 columns
    from ditron.kernels.decoder import tiny
    from ditron.kernels.decoder.model import decoder_tasks, make_buffers
    from ditron.kernels.decoder.weights import make_cache, make_weights
    for split, ok in ((4, True), (5, False), (8, False)):
        cfg = tiny().with_tiles(down_split_k=split)
        cache = make_cache(cfg, 0, 1, 1, 16, 4)
        buf = make_buffers(cfg, 1, 1, cache.max_ctx, 4, "cpu")
        if ok:
            names = [s.name for s in decoder_tasks(cfg, 1, make_weights(cfg, 0, 1), cache, buf)]
            assert "dsum.0" in names and names.index("down.0") < names.index("dsum.0") < names.index("ar_mlp.0")
        else:
            with pytest.raises(DitronError, match=f"down_split_k={split}"):
                decoder_tasks(cfg, 1, make_weights(cfg, 0, 1), cache, buf)


def _ref_states(cfg, W, B, max_ctx, ctx):
    from ditron.kernels.decoder.weights import make_cache, make_weights
    out = []
    for r in range(W):
        out.append((cfg, cfg.shard(W), make_weights(cfg, r, W), make_cache(cfg, r, W, B, max_ctx, ctx),
                    torch.tensor([ctx] * B, dtype=torch.int32)))
    return out


def test_reference_tp2_equals_tp1():
    # the same seeded global model split over 2 ranks: the partial sums are added in another order (bf16
    # all-reduce), so TP=2 equals TP=1 up to one bf16 rounding of the residual updates
    from ditron.kernels.decoder import tiny
    from ditron.kernels.decoder.reference import lockstep_step
    from ditron.kernels.decoder.weights import make_input
    cfg = tiny()
    s1, s2 = _ref_states(cfg, 1, 2, 24, 13), _ref_states(cfg, 2, 2, 24, 13)
    for step in range(2):
        x = make_input(cfg, 2, step)
        y1, y2 = lockstep_step(s1, x)[0], lockstep_step(s2, x)
        assert torch.equal(y2[0], y2[1])                          # every rank has the full output
        torch.testing.assert_close(y2[0].float(), y1.float(), atol=3e-2, rtol=2e-2)
    assert s1[0][4].tolist() == s2[1][4].tolist() == [15, 15]     # two positions appended
    # the TP=2 caches are the kv-head halves of the TP=1 cache (the same pages), with the same two new positions
    torch.testing.assert_close(torch.cat([s2[0][3].k, s2[1][3].k], 3).float(), s1[0][3].k.float(), atol=0.07, rtol=0)


def test_reference_over_gloo_equals_lockstep(tmp_path):
    # TorchDecoder's torch.distributed path (gloo on CPU, NCCL on GPUs) in a 2-process job against the
    # in-process lockstep of the same two shards: the bf16 partial sums of two ranks add exactly in both.
    # The two processes come from the simulated ranks' fork server (torch imported once there; a spawned
    # process would import it again: ~2.5 CPU-s each)
    from ditron.kernels.decoder import tiny
    from ditron.kernels.decoder.reference import lockstep_step
    from ditron.kernels.decoder.weights import make_input
    from ditron.sim.pool import _rank_context
    ctx = _rank_context()
    q = ctx.Queue()
    procs = [ctx.Process(target=B.gloo_reference_worker, args=(r, 2, str(tmp_path / "init"), q)) for r in range(2)]
    for p in procs:
        p.start()
    got = {r: steps for r, steps in (q.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    states = _ref_states(tiny(), 2, 2, 24, 13)
    for step in range(2):
        want = lockstep_step(states, make_input(tiny(), 2, step))
        for r in range(2):
            torch.testing.assert_close(torch.from_numpy(got[r][step]), want[r].float(), atol=0, rtol=0)


def test_tolerance_detects_a_wrong_position():
    # what the decoder checks tolerate (3e-2 * scale + 2e-2) is far below the effect of attending one position
    # too many / rotating at the wrong position
    from ditron.kernels.decoder import tiny
    from ditron.kernels.decoder.reference import lockstep_step
    from ditron.kernels.decoder.weights import make_input
    cfg = tiny()
    good, bad = _ref_states(cfg, 1, 1, 40, 30), _ref_states(cfg, 1, 1, 40, 30)
    bad[0][4].add_(1)
    x = make_input(cfg, 1, 0)
    y, z = lockstep_step(good, x)[0].float(), lockstep_step(bad, x)[0].float()
    assert (y - z).abs().max().item() > 10 * (3e-2 * y.abs().max().item() + 2e-2)


# ---------------------------------------------------------------------------
# the whole step as one megakernel
# ---------------------------------------------------------------------------

def test_decoder_megakernel_two_ranks(dist_world):
    # 2 layers, TP=2, two consecutive steps, a ragged batch in a paged cache of 8-position pages: sequence 0
    # 33 -> 35 (split 0 full, split 1 partial), sequence 1 12 -> 14 (one partial split; its second page)
    errs = dist_world(2).run(B.decoder_steps, steps=2, B=2, ctx=[33, 12], page_size=8)
    assert len(errs) == 2 and all(len(e) == 2 for e in errs)


def test_decoder_megakernel_three_ranks(dist_world):
    # an odd world size: 6 q heads, 3 kv heads, intermediate 96 split over 3 ranks (2 / 1 / 32 per rank)
    from ditron.kernels.decoder import tiny
    errs = dist_world(3).run(B.decoder_steps, steps=2, B=2, ctx=[20, 33], cfg=tiny(n_q_heads=6, n_kv_heads=3))
    assert len(errs) == 3 and all(len(e) == 2 for e in errs)


def test_decoder_megakernel_two_ranks_separate_norms(dist_world):
    from ditron.kernels.decoder import tiny
    errs = dist_world(2).run(B.decoder_steps, steps=2, B=1, cfg=tiny().with_tiles(fuse_norm=False))
    assert len(errs) == 2 and all(len(e) == 2 for e in errs)


def test_decoder_megakernel_with_weight_prefetch(dist_world):
    # the GEMV tasks' prefetch hooks run before their dependency waits; on the simulator every prefetched
    # address must lie in a tensor argument (the masks cover the ragged last tile: intermediate 96 / 16 ...)
    from ditron.kernels.decoder import tiny
    errs = dist_world(2).run(B.decoder_steps, steps=2, B=1, cfg=tiny().with_tiles(prefetch_k=64))
    assert len(errs) == 2 and all(len(e) == 2 for e in errs)
    # ... and on some projections only (TileConfig.prefetch_projs), at one rank
    errs = dist_world(1).run(B.decoder_steps, steps=1, B=1, cfg=tiny().with_tiles(prefetch_k=64,
                                                                                  prefetch_projs="down,qkv"))
    assert len(errs) == 1 and len(errs[0]) == 1


@pytest.mark.parametrize("ranks,batch,stages,split", [(1, 3, 4, 2), (2, 1, 3, 3), (3, 2, 2, 2)])
def test_decoder_megakernel_levers(dist_world, ranks, batch, stages, split):
    # issue 26's levers: the GEMV weights streamed by cp.async into shared memory (tl.range num_stages) on the
    # FMA path (batches 1 and 2: TileConfig.gemv_stream) and the tl.dot path (batch 3: dot_stream), the split-K
    # down projection (down_split_k: slices of the intermediate per rank 96 / 48 / 32, each after the gate/up
    # tiles of its columns, summed per all-reduce chunk; the simulator's access check verifies those tile
    # ranges), ragged contexts, 1 / 2 / 3 ranks (3: 6 q heads, 3 kv heads); max_regs is a ptxas option
    # (validated, no effect here); direct_tp1: at one rank the split-K sums write the delta (no all-reduce task);
    # dot_pad: batch 3 on tl.dot with 4 rows (not 16), its depth from a ring budget
    from ditron.kernels.decoder import tiny
    cfg = tiny(**(dict(n_q_heads=6, n_kv_heads=3) if ranks == 3 else {}))
    cfg = cfg.with_tiles(gemv_stream=True, dot_stream=True, stream_stages=stages, max_regs=128, down_split_k=split,
                         direct_tp1=True, dot_pad=4, dot_ring=4096)
    assert cfg.tiles.stream_for(batch) == stages
    errs = dist_world(ranks).run(B.decoder_steps, steps=2, B=batch, ctx=[33, 5, 17][:batch], cfg=cfg)
    assert len(errs) == ranks and all(len(e) == 2 for e in errs)


@pytest.mark.parametrize("scheduler,fuse", [("zigzag", True), ("dynamic", False)])
def test_decoder_megakernel_one_rank_batch3(dist_world, scheduler, fuse):
    # world size 1 (the all-reduces are copies), batch 3 (GEMV tiles on tl.dot), the other schedulers, ragged
    # contexts (one a single position) in pages of 4 and 16 positions
    from ditron.kernels.decoder import tiny
    cfg = tiny().with_tiles(fuse_norm=fuse)
    assert len(dist_world(1).run(B.decoder_steps, steps=2, B=3, ctx=[33, 1, 17], page_size=4 if fuse else 16,
                                 scheduler=scheduler, cfg=cfg)[0]) == 2


def test_decoder_bad_serving_inputs_fail_before_launch(dist_world):
    msgs = dist_world(1).run(B.bad_serving_inputs)[0]
    assert "input of shape (3, 64)" in msgs["batch"] and "compiled for a batch of 2" in msgs["batch"], msgs
    assert "sequence 0 appends position 16" in msgs["short_table"] and "4 pages x 4 positions" in msgs["short_table"]
    assert re.search(r"block_table\[1, 0\] = 9 is not a page of the cache \(0\.\.8", msgs["page_range"]), msgs
    assert "block_table[1, 0] = -1" in msgs["negative_page"], msgs
    assert re.search(r"sequences 0 and 1 both append to row 1 of page \d+", msgs["shared_page"]), msgs
    assert "expected [3, max_pages] int32" in msgs["build_batch"], msgs


def test_decoder_missing_dependency_is_rejected(dist_world):
    msg = dist_world(1).run(B.missing_dep_is_rejected)[0]
    assert "missing dependency" in msg and "'rope.1'" in msg and "'qkv.1'" in msg, msg


def test_decoder_planted_missing_release_is_reported(dist_world):
    # qkv.0 tile 1 never releases its slot: the rope tiles of the heads it computes and the residual commit
    # (res_a.0, which waits for every qkv tile) wait forever; the report names the task, the tile and the slot
    world = dist_world(2)
    cluster = getattr(world, "cluster", None)        # the simulator: a 1.5 s deadlock watchdog, not the suite's 20 s
    saved = cluster.hang_timeout if cluster is not None else None
    if cluster is not None:
        cluster.hang_timeout = 1.5
    try:
        with pytest.raises((DitronHangError, DitronRankError)) as e:
            world.run(B.planted_missing_release, "qkv.0", 1)
    finally:
        if cluster is not None:
            cluster.hang_timeout = saved
    text = str(e.value)
    assert "task 'qkv.0' tile 1" in text and "scoreboard slot" in text, text
    assert re.search(r"waited on by task '(rope|res_a)\.0'", text), text


# ---------------------------------------------------------------------------
# demo and benchmark on the CPU (the numbers are meaningless on the simulator; the code paths and checks run)
# ---------------------------------------------------------------------------

def _run(*args, timeout=300):
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "ditron", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=root)


@pytest.mark.e2e
def test_demo_megakernel_on_the_simulator():
    p = _run("demo", "megakernel")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("matches torch") == 4, p.stdout            # 2 ranks x 2 steps
    assert "verified on all 2 ranks against torch" in p.stdout


@pytest.mark.e2e
def test_bench_megakernel_on_the_simulator(tmp_path):
    import json
    p = _run("sim", "-n", "2", "-m", "ditron.bench", "megakernel", "--config", "tiny", "--ctx", "33", "--batch", "2",
             "--warmup", "1", "--iters", "1", "--repeat", "1", "--out", str(tmp_path), "--tag", "smoke")
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((tmp_path / "smoke-megakernel.json").read_text())
    (row,) = data["rows"]
    assert row["check"] == "ok" and row["batch"] == 2 and row["megakernel_us"] > 0 and row["hbm_limit_us"] > 0, row
    assert data["meta"]["command"].startswith("ditron bench megakernel")
    assert "| 33 | 2 | ok" in (tmp_path / "smoke-megakernel.md").read_text()


#: gfx942 under Triton 3.6 (the GPU machines' Triton, which CI runs too); under a newer Triton sm_90a alone (CI's time:
#: 5-12 s a compile; the megakernel's gfx942 lowering is compiled under every Triton by test_decoder_batch.py,
#: test_decoder_prefetch.py and test_decoder_attention.py)
GPU_TRITON = _TRITON_VERSION[:2] == (3, 6)


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"] if GPU_TRITON else ["sm_90a"])
@pytest.mark.parametrize("gemv_dot", [False, True])
def test_decoder_megakernel_compiles(target, gemv_dot):
    # generated in this process (a private one-rank simulator world: the comm tasks need a world; their code
    # does not depend on its size) and compiled ahead of time without a GPU
    import ditron
    world = ditron.init("sim")
    try:
        # the tl.dot variant also has the GEMV weight prefetch hooks (before the dependency wait)
        got = B.compile_generated(world, target, gemv_dot, prefetch_k=512 if gemv_dot else 0)
    finally:
        ditron.finalize()
    # advance, qkv (fused norm), residual commit, rope, attention, combine, o_proj, gate/up (fused norm), down,
    # all-reduce, final norm: one branch per kind, whatever the number of layers
    assert got["branches"] == 11, got
    assert got["wait_deps"] and got["symm_at"] and got["notify"], got
    # the GEMV tiles stream the weights with 16-byte vector loads (5 GEMV loops: qkv, o, gate, up, down); at
    # batch 1 (gemv_dot off) by default through shared memory: 16-byte cp.async on sm_90a
    assert got["v4_loads"] + got["cp_async16"] >= 5, got
    if target == "sm_90a" and not gemv_dot:
        assert got["cp_async16"] >= 5, got
    assert got["evict_first"] in (True, None), got
    assert got["mma"], got                  # attention scores and P @ V on the tensor cores
    assert got["prefetch_l2"] == gemv_dot, got
    if target == "sm_90a":                  # linear + gate_up hooks (gate and up rows): 3 predicated prefetches
        assert (got["prefetch_insns"] >= 3) if gemv_dot else got["prefetch_insns"] == 0, got


def test_decoder_batch_gemv_does_not_spill():
    # issue 26: from batch 3 the GEMV tiles switch to tl.dot with the batch padded to 16 rows; with the 1024-wide
    # K chunks of batch 1 they held 16 x 1024 float32 activations (twice: double-buffered) and a 16 x 1024 sum of
    # squares in registers: ptxas spilled ~27 KB per thread (stores) and a step took 35x longer on an H100.  The
    # GEMV branches exactly as decoder_tasks configures them at batch 16 (Qwen3-8B's N and K), by ptxas -v
    # (the default above batch 2: separate norms; and the fused-norm tiles of fuse_norm=True)
    import ditron
    world = ditron.init("sim")
    try:
        for fuse in (None, True):
            ck, c = B.gemv_branches_compiled(world, 16, "sm_90a", fuse_norm=fuse, direct_tp1=False)
            use = ck.usage()
            assert c["DOT"] and c["BLOCK_B"] == 16, c
            assert "mma.sync" in ck.asm["ptx"], "the batch path's GEMV accumulates on the tensor cores"
            assert use["spill_stores"] <= 128 and use["spill_loads"] <= 128, (fuse, c, use)
    finally:
        ditron.finalize()


def test_usage_without_a_second_ptxas_run(tmp_path, monkeypatch, capsys):
    # CompiledKernel.usage() (the register / spill checks of these files) equals ptxas -v on the PTX, for a kernel
    # that spills and one that does not.  Where Triton's own ptxas run is plain ptxas -v (Triton 3.6: it only adds
    # -lineinfo), the numbers come from that run's log (ditron.compile keeps them, named by the cubin) or, for a
    # cubin with no stack frame, from the cubin itself, not from a second ptxas run
    import ditron
    from ditron import _compat
    from ditron import compiler as C
    import triton.language as tl

    @ditron.jit
    def spills(x_ptr, o_ptr, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        a = tl.load(x_ptr + i)
        b = tl.exp(a) * tl.sum(a * a, 0)
        tl.store(o_ptr + i, tl.cumsum(b, 0) + a * tl.max(b, 0))

    monkeypatch.setenv("DITRON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DITRON_COMPILE_CACHE", "0")        # Triton's ptxas runs (no cached cubin): its log is kept
    sig = {"x_ptr": "*fp32", "o_ptr": "*fp32"}
    for block, opts, spill in ((1024, {"maxnreg": 32}, True), (128, {}, False)):
        ck = ditron.compile(spills, target="sm_90a", signature=sig, constexprs={"BLOCK": block}, num_warps=1, **opts)
        plain = C.ptxas_usage(ck.asm["ptx"])
        assert (plain["spill_stores"] > 0) == spill and (plain["stack"] > 0) == spill, plain
        assert {k: v for k, v in ck.usage().items() if k != "shared"} == plain
        kept = C.recorded_usage(ck.asm["cubin"])
        if not _compat.ptxas_run_is_plain(ck.metadata):
            assert _compat.TRITON_VERSION[:2] != (3, 6) and kept is None
            continue
        assert not _compat.ptxas_run_is_plain(ck.metadata._replace(enable_fp_fusion=False))   # --fmad=false
        assert kept == plain
        assert C.cubin_usage(ck.asm["cubin"], ck.metadata.name) == (None if spill else plain)
        os.remove(C._usage_path(ck.asm["cubin"]))       # as if the cubin had come from Triton's cache
        assert {k: v for k, v in ck.usage().items() if k != "shared"} == plain
    with _compat.ptxas_log() as logs:                     # what else is printed meanwhile still reaches stdout
        print("not a ptxas log")
    assert logs == [] and capsys.readouterr().out == "not a ptxas log\n"


@pytest.mark.skipif(not GPU_TRITON, reason="ptxas register budgets of the GPU machines' Triton (3.6): run in CI's "
                    "triton-3.6 environment")
def test_decoder_gemv_stream_registers():
    # issue 26: at batch 1 the megakernel's register budget is set by the GEMV branches (255 registers, spills in
    # the whole step: 2 programs per SM).  With the weights streamed by cp.async into shared memory
    # (gemv_stream) the whole step at Qwen3-8B's shapes needs at most 168 registers and spills nothing (3 programs
    # per SM fit), and the cap of max_regs reaches ptxas.  ptxas -v on the CPU (kernels/decoder/resources.py)
    import ditron
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    ditron.init("sim")
    try:
        cfg = qwen3_8b(n_layers=1)
        assert cfg.tiles.gemv_stream and cfg.tiles.programs_per_sm == 3      # the 8B defaults since issue 26
        base = RZ.usage(cfg.with_tiles(gemv_stream=False, max_regs=0), 1, ("qkv", "gu", "down"))
        # (the stream without the gate/up in-loop waits of the default, whose spills test_decoder_regs.py guards)
        streamed = RZ.usage(cfg.with_tiles(stream_wait=0), 1)
        capped = RZ.usage(cfg.with_tiles(gemv_stream=True, max_regs=128), 1, ("qkv", "gu", "down"))
    finally:
        ditron.finalize()
    assert base["registers"] > 200 and not base["cp_async"], base
    assert streamed["cp_async"] and streamed["registers"] <= 168, streamed
    # no spills to speak of: 24 bytes with Triton 3.6 (the GPUs' version; 0 before the FMA GEMV kept per-thread
    # partial sums, whose default step went from 88 to 8: test_decoder_regs.py, which also checks that no spill is in
    # a K loop), 4 with 3.9's ptxas; the old default spilled 124 / 152 bytes per thread at batch 1 and 820 / 672 at
    # batch 2
    assert streamed["spill_stores"] <= 32 and streamed["spill_loads"] <= 32, streamed
    from ditron._compat import TRITON_VERSION
    if TRITON_VERSION[:2] == (3, 6):
        # the measured default (H100, 2026-11-27) is 3 programs per SM: 68 KiB of shared memory with Triton 3.6.
        # Triton 3.9 gives the same step 139 KiB (1 per SM): untuned there, noted in docs/megakernel.md
        assert streamed["resident_per_sm"] >= 3, streamed
    else:
        assert streamed["resident_per_sm"] >= 1, streamed
    assert capped["registers"] <= 128, capped


@pytest.mark.skipif(not GPU_TRITON, reason="ptxas register budgets of the GPU machines' Triton (3.6): run in CI's "
                    "triton-3.6 environment")
def test_decoder_batch_step_fits_three_programs_per_sm():
    # issue 26: on one H200 batch 2 took 1.32x batch 1 and batch 8 1.77x: their whole steps needed 239 / 233
    # registers (the FMA path holds the float32 weight chunk once per batch row; the tl.dot path double-buffered
    # its weights in registers), so 2 programs per SM ran where batch 1 runs 3.  From batch 2 the 8B defaults
    # stream the tl.dot path's weights through shared memory (cp.async) under a 168-register cap: the whole step
    # (every branch, Qwen3-8B's shapes) spills nothing and 3 programs fit per SM.  ptxas -v on the CPU
    import ditron
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    from ditron._compat import TRITON_VERSION
    ditron.init("sim")
    try:
        cfg = qwen3_8b(n_layers=1)
        got = {b: RZ.usage(cfg, b) for b in (2, 16)}
        # the default's ring: activation rows padded to 8 and 48 KiB per program at batches up to 8 (3 stages at
        # batch 2), 72 KiB above
        assert cfg.tiles.dot_pad == 8, cfg.tiles
        assert (cfg.tiles.dot_ring, cfg.tiles.dot_ring_small) == (73728, 49152), cfg.tiles
        assert (cfg.tiles.ring_for(2), cfg.tiles.ring_for(8), cfg.tiles.ring_for(16)) == (49152, 49152, 73728)
        ring = got[2]
        old = RZ.usage(cfg.with_tiles(dot_stream=False, dot_block_k=256, max_regs=0, gu_wdot=0, dot_ksplit=0,
                                      prenorm_dot=False), 16)
    finally:
        ditron.finalize()
    for b, use in got.items():
        assert cfg.tiles.dot_for(b) and use["cp_async"], (b, use)
        assert use["registers"] <= 168, (b, use)
        # Spills: none with the batch path before issue 26's b8 levers; with them (gu_wdot, dot_ksplit, prenorm_dot)
        # 156-264 bytes on Triton 3.6's ptxas at batch 8-16 with the attention branch's V stream compiled
        # (resources.step_specs: K and V distinct; 52-86 as the H200's driver reported), mostly stores of the
        # persistent loop's item fields once per item, and the step 13-15% faster
        # (bench/results/h200-2026-11-27-b8.md); the bound catches the kilobyte spills of a register-held chunk
        # (~27 KB per thread: 35x slower).  3 programs per SM with Triton 3.6 and 3.9 alike (with the 72 KiB ring at
        # batch 2-8, Triton 3.9 took 108 KiB: 2 per SM, 4-13% slower; docs/megakernel.md "Triton versions")
        assert use["spill_stores"] <= 384 and use["spill_loads"] <= 384, (b, use)
        assert use["resident_per_sm"] >= 3, (b, use)
    assert ring["registers"] <= 168, ring
    if TRITON_VERSION[:2] == (3, 6):
        # the ring's budget is Triton 3.6's layout: 48 KiB of shared memory at batch 2 (3.9: 54 KiB)
        assert 40960 < ring["shared"] <= 49152, ring
    # the register-buffered tl.dot path (the default before) is what the cap and the stream replaced
    assert old["registers"] > 168, old


@pytest.mark.skipif(__import__("os").environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                    reason="simulator race finder")
@pytest.mark.parametrize("fuse,ranks", [(True, 2), (False, 2), (True, 1)])
def test_decoder_megakernel_is_race_free(fuse, ranks):
    # every buffer on the symmetric heap: the race finder checks that the tile-range dependencies (rope <- qkv
    # heads, attention <- rope group, combine <- attention splits, all-reduce chunk <- GEMV columns, residual
    # commits) order every write before every read of each tile, under random program interleavings
    from conftest import race_world
    from ditron.kernels.decoder import tiny
    # fused: per-projection tile widths (qkv 8 columns: a head spans 2 tiles; o_proj 32: an all-reduce chunk
    # of 32 elements needs one o tile, down 16: two).  One rank with direct_tp1: o_proj and down_proj
    # overwrite the delta that the fused-norm GEMVs and the residual commits read (no all-reduce between)
    cfg = tiny().with_tiles(fuse_norm=fuse, direct_tp1=ranks == 1,
                            **(dict(qkv_block_n=8, o_block_n=32) if fuse else {}))
    errs = race_world(ranks).run(B.decoder_steps_symmetric, steps=2, cfg=cfg)
    assert len(errs) == ranks and all(len(e) == 2 for e in errs)
