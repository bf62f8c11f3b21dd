"""Issue 26, batch 1 near the HBM limit: the streamed prenorm GEMV tiles that wait on their producers inside their
K loop (``TileConfig.stream_wait``, ``Dep(inner=True)``): the step against the torch reference on simulated ranks
(the lever applies at one rank, where o_proj / down_proj write the next norm's input; at 2 ranks it is a no-op),
the race finder over every buffer, the generated graph's waits, and the sm_90a compile (registers and spills of the
8B step's streamed tiles; gfx942: a clear error, the lever is NVIDIA-only)."""
import pytest
import ditron

import bodies_decoder as B
from ditron.errors import DitronError


def _sw_cfg(seg, projs="qkv,o,gate_up,down", ranks=1, exact=False):
    from ditron.kernels.decoder import tiny
    return tiny(**(dict(n_q_heads=6, n_kv_heads=3) if ranks == 3 else {})).with_tiles(
        gemv_stream=True, direct_tp1=True, prenorm=True, stream_wait=seg, stream_wait_projs=projs, gemv_block_k=8,
        stream_wait_exact=exact, stream_wait_load=exact)


@pytest.mark.parametrize("ranks,seg,batch,exact", [(1, 1, 1, False), (1, 2, 1, True), (2, 1, 1, True),
                                                   (3, 1, 2, False)])
def test_stream_wait_step_matches_reference(dist_world, ranks, seg, batch, exact):
    # tiny with K chunks of 8: qkv / gate-up / o over K 64 (8 chunks; producer tiles of 16 columns: o / down
    # tiles, comb heads), down over K 96 (12 chunks; gate/up tiles of 16): the first 3 chunks' producers (stream
    # stages) before the loop, the others inside it; seg 1 waits per chunk, 2 per two chunks (a producer tile spans
    # two chunks); ragged contexts at batch 2 (o keeps its upfront wait there: comb tiles are per sequence); exact:
    # each segment waited at its own chunk, the activations loaded outside the pipeline (stream_wait_exact)
    cfg = _sw_cfg(seg, ranks=ranks, exact=exact)
    errs = dist_world(ranks).run(B.decoder_steps, steps=2, B=batch, ctx=[33, 5][:batch], cfg=cfg)
    assert len(errs) == ranks and all(len(e) == 2 for e in errs)


@pytest.mark.skipif(__import__("os").environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                    reason="simulator race finder")
@pytest.mark.parametrize("exact", [False, True])
def test_stream_wait_is_race_free(exact):
    # every buffer on the symmetric heap: the race finder checks that each chunk's activation load comes after
    # the acquire of its producers' slots (the in-tile waits), and that the epilogues (hn / ss / resid written,
    # ss read) come after all of them, under random program interleavings
    from conftest import race_world
    errs = race_world(1).run(B.decoder_steps_symmetric, steps=2, cfg=_sw_cfg(1, exact=exact))
    assert len(errs) == 1 and len(errs[0]) == 2


def test_stream_wait_graph():
    # the waits move from the item table into the tiles: the consumers' upfront ranges drop the inner producer
    # (what the static hazard check and the simulator's access check see is unchanged: tile_ranges)
    import ditron
    import ditron.task as dtask
    from ditron.kernels.decoder.model import decoder_tasks, make_buffers, register
    from ditron.kernels.decoder.weights import make_cache, make_weights

    def step_specs(cfg):
        cache = make_cache(cfg, 0, 1, 1, 40, 33)
        return decoder_tasks(cfg, 1, make_weights(cfg, 0, 1), cache, make_buffers(cfg, 1, 1, cache.max_ctx, 33, "cpu"))
    cfg = _sw_cfg(1)
    ditron.init("sim")
    try:
        with ditron.heap_scope():
            specs = step_specs(cfg)
            g = dtask.TaskGraph("sw")
            tasks = register(g, specs)
            for name, producer in (("qkv.1", "down.0"), ("o.0", "comb.0"), ("gu.0", "o.0"), ("down.0", "gu.0")):
                t = tasks[name]
                assert t.fn.fn.__name__.endswith("_sw_tile"), (name, t.fn)
                assert t.args["WAIT_OFF"] == tasks[producer].slot_base - t.slot_base < 0
                assert t.wait_ranges(0) == [] and t.tile_ranges(0) == [(tasks[producer].slot_base,
                                                                       tasks[producer].num_tiles)]
            assert tasks["qkv.0"].wait_ranges(0) == tasks["qkv.0"].tile_ranges(0) != []   # layer 0: x, not hn
            mk = g.compile(num_programs=3)
            assert "slots_ptr + (slot - tile)" in mk.source
            # a subset of projections
            specs = step_specs(_sw_cfg(2, "gate_up"))
            names = {s.name: s.fn.fn.__name__ for s in specs}
            assert names["gu.0"] == "gate_up_rstd_sw_tile" and names["down.0"] == "linear_resnorm_tile"
    finally:
        ditron.finalize()
    with pytest.raises(DitronError, match="stream_wait=-1"):
        _sw_cfg(-1)
    with pytest.raises(DitronError, match="unknown projection"):
        _sw_cfg(1, "qkv,up")


@pytest.mark.skipif(ditron._compat.TRITON_VERSION[:2] != (3, 6),
                    reason="ptxas register budgets of the GPU machines' Triton (3.6): run in CI's triton-3.6 environment")
def test_stream_wait_8b_compiles():
    # the 8B step at batch 1 with its default in-tile waits (gate/up, acquire-load polls; one layer: the same
    # branches as 36): sm_90a keeps the weight stream in shared memory (cp.async: Triton's pipeliner accepts the
    # loop, whose waits feed no pipelined load) at 3 programs per SM
    import ditron
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    cfg = qwen3_8b(n_layers=1)
    assert cfg.tiles.stream_wait is None and cfg.tiles.wait_segment() == 1
    # (the waits before each tile with the fence below: an ld.acquire can only come from the in-loop waits)
    every = cfg.with_tiles(stream_wait=1, stream_wait_projs="qkv,o,gate_up,down", stream_wait_exact=True,
                           wait_acquire="fence")
    ditron.init("sim")
    try:
        ck_default = RZ.compile_step(cfg, 1)
        use = ck_default.usage()
        use["resident_per_sm"] = RZ.resident_per_sm(use, cfg.tiles.num_warps)
        use["cp_async"] = "cp.async.cg" in ck_default.asm["ptx"]
        ptx_default = RZ.compile_step(cfg.with_tiles(wait_acquire="fence"), 1, kinds=("gu",)).asm["ptx"]
        ck = RZ.compile_step(every.with_tiles(stream_wait_load=False), 1, kinds=("o", "gu"))
        ckl = RZ.compile_step(every, 1, kinds=("o", "gu"))
    finally:
        ditron.finalize()
    assert use["cp_async"] and use["resident_per_sm"] == 3, use
    # the default gate/up tile polls its producers inside the loop with ld.acquire
    assert "ld.acquire.gpu.global.b32" in ptx_default and "cp.async.cg.shared.global" in ptx_default
    # wait_acquire="load" (the default): the waits before each tile poll with ld.acquire and have no fence; the one
    # fence left in the step is the gate/up tile's first in-loop wait (relaxed polls and the fence, see below); with
    # wait_acquire="fence" the gate/up branch alone has three (its waits before the tile, its first in-loop wait)
    assert ck_default.asm["ptx"].count("fence.acq_rel.gpu") == 1
    assert ptx_default.count("fence.acq_rel.gpu") == 3
    # stream_wait_exact: gate/up's activations by dl.ld (ld.relaxed per element), its weights still by cp.async
    ptx = ck.asm["ptx"]
    assert "ld.relaxed.gpu.global.b16" in ptx and "cp.async.cg.shared.global" in ptx
    # stream_wait_load: the waits after a tile's first chunk poll with ld.acquire, no fence (the first keeps its
    # relaxed polls and fence: an acquire load invalidates L1 at every poll)
    ptxl = ckl.asm["ptx"]
    assert "ld.acquire.gpu.global.b32" not in ptx and "ld.acquire.gpu.global.b32" in ptxl
    # ptxas spills some loop-invariant addresses of the 168-register step (reloaded once per tile, none in the K
    # loops; Triton 3.6: 8 B with the default gate/up waits, 24 B without them, 80 B with all four; 88 / 12 B before
    # the FMA GEMV kept per-thread partial sums): a collapse (a GEMV loop spilling, e.g. 240 B with 128-deep gate/up
    # chunks) fails here
    assert use["registers"] <= 168 and use["spill_stores"] <= 32, use
    # ... and in the SASS: every spill instruction (LDL / STL off the stack pointer) sits in the persistent loop over
    # tiles, none in a K loop (Triton 3.6, the GPUs' version: 46 spill instructions, 0 in inner loops)
    from ditron._compat import TRITON_VERSION
    where = ck_default.spills_in_loops()
    if TRITON_VERSION[:2] == (3, 6):
        assert where["spills"] and where["in_loops"] == 0, where
    # the FMA GEMV's K loops (weights streamed by cp.async: LDGSTS, no tensor-core MMA: qkv, o, gate/up, down) add
    # each thread's products into per-thread partial sums (_mac) and reduce across lanes once per tile, after the
    # loop: no shuffle tree and no shared-memory round trip per chunk (Triton 3.6 before: 80-82 SHFL, 17 STS and 3
    # barriers in every such loop; 1.4% / 0.9% of a batch-1 step on one H200)
    fma = [lp["ops"] for lp in ck_default.inner_loops() if lp["ops"]["LDGSTS"] and not lp["ops"]["HMMA"]]
    assert len(fma) >= 4 and all(ops["FFMA"] + ops["FMUL"] >= 64 for ops in fma), fma
    assert all(ops["SHFL"] == 0 and ops["STS"] == 0 for ops in fma), fma


def test_sass_spills_in_loops():
    # the SASS reader of CompiledKernel.spills_in_loops: loops are backward branches, the outermost one excluded
    from ditron.compiler import sass_spills_in_loops
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1+0x4], R2 ;
        /*0020*/                   LDG.E R3, desc[UR4][R4.64] ;
        /*0030*/                   LDL R5, [R1+0x4] ;
        /*0040*/                   FFMA R6, R5, R3, R6 ;
        /*0050*/              @P0 BRA 0x20 ;
        /*0060*/                   STL [R5], R2 ;
        /*0070*/                   BRA 0x10 ;
        /*0080*/                   EXIT ;"""
    assert sass_spills_in_loops(sass) == {"spills": 2, "in_loops": 1}
    assert sass_spills_in_loops(sass.replace("LDL R5, [R1+0x4]", "MOV R5, R2")) == {"spills": 1, "in_loops": 0}
    # ... and CompiledKernel.inner_loops: the inner loop's opcodes (predicates and modifiers dropped)
    from ditron.compiler import sass_inner_loops
    (loop,) = sass_inner_loops(sass)
    assert (loop["first"], loop["last"]) == (0x20, 0x50)
    assert loop["ops"] == {"LDG": 1, "LDL": 1, "FFMA": 1, "BRA": 1}
    assert sass_inner_loops(sass.replace("@P0 BRA 0x20", "NOP")) == []


def test_stream_wait_target_and_batch8():
    # NVIDIA-only (AMD's stream pipeliner cannot predicate the wait in its pipelined loop): a clear error before
    # compiling for gfx942.  At batch 8 (the tl.dot path) the lever changes nothing: the same generated kernel
    import ditron
    import ditron.task as dtask
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    from ditron.kernels.decoder.model import check_target, register
    from ditron.task import codegen
    cfg = qwen3_8b(n_layers=1)      # (resources.step_specs: a one-layer cache)
    with pytest.raises(DitronError, match="stream_wait=1: the in-loop scoreboard waits are NVIDIA-only"):
        check_target(cfg.with_tiles(stream_wait=1), "gfx942")
    with pytest.raises(DitronError, match="stream_wait=1: the in-loop scoreboard waits are NVIDIA-only"):
        RZ.compile_step(cfg.with_tiles(stream_wait=1), 1, target="gfx942")     # before compiling
    assert check_target(cfg.with_tiles(stream_wait=1), "sm_90a").tiles.stream_wait == 1
    # the auto default (None): on for NVIDIA and the simulator, off for AMD
    # the auto fields resolve per target: noinline_branches on for NVIDIA, off for AMD; stream_wait auto off on AMD
    nv, amd = check_target(cfg, "sm_90a"), check_target(cfg, "gfx942")
    assert nv == cfg.with_tiles(noinline_branches=True)
    assert nv.tiles.noinline_branches is True and nv.tiles.stream_wait is None
    assert amd.tiles.noinline_branches is False and amd.tiles.stream_wait == 0
    assert check_target(nv, "sm_90a") is nv                 # resolved: nothing left to change
    assert check_target(cfg.with_tiles(noinline_branches=False), "sm_90a").tiles.noinline_branches is False
    with pytest.raises(DitronError, match="must be None"):
        cfg.with_tiles(stream_wait=1.5)
    ditron.init("sim")
    try:
        gu = {t: next(s for s in RZ.step_specs(check_target(cfg, t), 1) if s.name == "gu.0").fn.fn.__name__
              for t in ("sm_90a", "gfx942")}
        assert gu == {"sm_90a": "gate_up_rstd_sw_tile", "gfx942": "gate_up_rstd_tile"}, gu
        src = {}
        for sw in (0, 1, None):
            with ditron.heap_scope():
                g = dtask.TaskGraph("b8")
                register(g, RZ.step_specs(cfg.with_tiles(stream_wait=sw), 8))
                src[sw] = codegen.generate(g, False).source
    finally:
        ditron.finalize()
    assert src[0] == src[1] == src[None] and "_sw_tile" not in src[1]


def test_wait_acquire_load(dist_world):
    # TileConfig.wait_acquire: "load" (the default: the megakernel's waits before each tile poll with acquire
    # loads, no fence; every other decoder test runs it) or "fence"; the "fence" step on the simulator at 2 ranks
    # (all-reduce tasks too), the generated waits, a bad value
    import ditron.task as dtask
    from ditron.kernels.decoder import tiny
    assert tiny().tiles.wait_acquire == "load"
    errs = dist_world(2).run(B.decoder_steps, steps=2, cfg=tiny().with_tiles(wait_acquire="fence"))
    assert len(errs) == 2 and all(len(e) == 2 for e in errs)
    from ditron.task import codegen
    g = dtask.TaskGraph("wa")
    src = {a: codegen._source(g, "k", [], [], [], 0, False, False, a) for a in ("fence", "load")}
    assert 'epoch, acquire="load")' in src["load"] and "acquire=" not in src["fence"]
    with pytest.raises(DitronError, match="wait_acquire='bogus'"):
        tiny().with_tiles(wait_acquire="bogus")


def test_bench_stream_wait_flags(capsys):
    # ditron bench megakernel: the defaults (auto segments, gate/up, acquire-load polls) unless a flag says otherwise
    from ditron.bench.megakernel import main
    def tiles(*flags):
        assert main(["--dry-run", "--ctx", "33", "--batch", "1", *flags]) == 0
        return capsys.readouterr().out
    out = tiles()
    assert "'stream_wait': None" in out and "'stream_wait_projs': 'gate_up'" in out and "'stream_wait_load': True" in out
    out = tiles("--stream-wait", "0", "--stream-wait-fence", "--stream-wait-projs", "qkv,o")
    assert "'stream_wait': 0" in out and "'stream_wait_projs': 'qkv,o'" in out and "'stream_wait_load': False" in out
    with pytest.raises(SystemExit):
        main(["--dry-run", "--stream-wait-load", "--stream-wait-fence"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_head_tiles_8b_compile():
    # issue 53, the model's ends at Qwen3-8B's shapes (vocabulary 151936, hidden 4096) under the 8B tiles: the
    # embedding gather, the LM head (the qkv projection's GEMV tile over 151936 rows), the sampler's top-k pass and
    # its draw (a [64 x 64] rank matrix, Philox) compiled alone for sm_90a at batch 1 and 16 stay within the step's
    # 168-register budget without spilling (the whole step with them, 1 layer, inlined: 168 registers, 32 B spilled
    # per thread on Triton 3.9 and 276 B on Triton 3.6 -- reloads inside the GEMV K loops -- against 4 B without the
    # head; with TileConfig.noinline_branches none: test_whole_step_noinline_branches_does_not_spill)
    import ditron
    from ditron.kernels.decoder import hf
    from ditron.kernels.decoder import resources as RZ
    cfg = hf.config_from_hf(hf.HF_CONFIGS["qwen3-8b"]).with_(n_layers=1)
    kinds = ("embed", "lm_head", "topk", "sample")
    ditron.init("sim")
    try:
        assert [k for k in RZ.kinds_of(RZ.step_specs(cfg, 1)) if k in kinds] == list(kinds)
        use = {b: RZ.compile_step(cfg, b, kinds=kinds).usage() for b in (1, 16)}
    finally:
        ditron.finalize()
    for b, u in use.items():
        assert u["registers"] <= 168 and u["spill_stores"] == 0 and u["spill_loads"] == 0, (b, u)


def test_noinline_branches_step_matches_reference(dist_world):
    # TileConfig.noinline_branches: each task kind's tile a called function in the megakernel; the step is the same
    # computation (the simulator runs the generated source, the wrappers included) -- against the torch reference
    from ditron.kernels.decoder import tiny
    cfg = tiny().with_tiles(noinline_branches=True)
    errs = dist_world(1).run(B.decoder_steps, steps=1, B=1, ctx=[33], cfg=cfg)
    assert len(errs) == 1 and len(errs[0]) == 1


def test_noinline_branches_source():
    import ditron.task as dtask
    from ditron.task import codegen
    import triton
    import triton.language as tl

    @triton.jit
    def t_add(tile, x_ptr, out_ptr, BLOCK: tl.constexpr):
        o = tile * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + o, tl.load(x_ptr + o) + 1)
    ditron.init("sim")
    try:
        import torch
        x, y = torch.zeros(64), torch.zeros(64)
        g = dtask.TaskGraph("ni")
        g.register_task(t_add, "add", 4, dict(x_ptr=x, out_ptr=y, BLOCK=16), reads=("x_ptr",), writes=("out_ptr",))
        src = codegen.generate(g, dynamic=False, noinline_branches=True).source
        assert "@triton.jit(noinline=True)\ndef _branch_0(tile, x_ptr, out_ptr, BLOCK):" in src
        assert "_branch_0(tile, " in src and "t_add(tile, x_ptr, out_ptr, BLOCK)" in src
        assert "noinline" not in codegen.generate(g, dynamic=False).source
    finally:
        ditron.finalize()


@pytest.mark.skipif(ditron._compat.TRITON_VERSION[:2] != (3, 6),
                    reason="ptxas register counts of the GPU machines' Triton (3.6)")
def test_whole_step_noinline_branches_does_not_spill():
    # the Qwen3-8B whole step (embedding, 1 layer, LM head, top-k stages, sampler) at batch 1 under the 168-register
    # cap: inlined, Triton 3.6 spills 276 B per thread with reloads inside the GEMV K loops (LLVM hoists what each
    # kind computes before its loops out of the item loop); with every kind a called function, none
    from ditron.kernels.decoder import hf
    from ditron.kernels.decoder import resources as RZ
    cfg = hf.config_from_hf(hf.HF_CONFIGS["qwen3-8b"]).with_(n_layers=1).with_tiles(noinline_branches=True)
    ditron.init("sim")
    try:
        u = RZ.compile_step(cfg, 1).usage()
    finally:
        ditron.finalize()
    assert u["registers"] <= 168 and u["spill_stores"] <= 8 and u["spill_loads"] <= 8, u
