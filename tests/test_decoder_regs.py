"""Issue 26, batch 1 near the HBM limit: the streamed prenorm GEMV tiles that wait on their producers inside their
K loop (``TileConfig.stream_wait``, ``Dep(inner=True)``): the step against the torch reference on simulated ranks
(the lever applies at one rank, where o_proj / down_proj write the next norm's input; at 2 ranks it is a no-op),
the race finder over every buffer, the generated graph's waits, and the sm_90a compile (registers and spills of the
8B step's streamed tiles; gfx942: a clear error, the lever is NVIDIA-only)."""
import pytest

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


def test_stream_wait_8b_compiles():
    # the 8B step at batch 1 with the in-tile waits (one layer: the same branches as 36): sm_90a keeps the weight
    # stream in shared memory (cp.async: Triton's pipeliner accepts the loop, whose waits feed no pipelined load) at
    # 3 programs per SM
    import ditron
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder import resources as RZ
    cfg = qwen3_8b(n_layers=1).with_tiles(stream_wait=1)
    ditron.init("sim")
    try:
        use = RZ.usage(cfg, 1)
        ck = RZ.compile_step(cfg.with_tiles(stream_wait_exact=True), 1, kinds=("o", "gu"))
        ckl = RZ.compile_step(cfg.with_tiles(stream_wait_exact=True, stream_wait_load=True), 1, kinds=("o", "gu"))
    finally:
        ditron.finalize()
    assert use["cp_async"] and use["resident_per_sm"] == 3, use
    # stream_wait_exact: gate/up's activations by dl.ld (ld.relaxed per element), its weights still by cp.async
    ptx = ck.asm["ptx"]
    assert "ld.relaxed.gpu.global.b16" in ptx and "cp.async.cg.shared.global" in ptx
    # stream_wait_load: the waits after a tile's first chunk poll with ld.acquire, no fence (the first keeps its
    # relaxed polls and fence: an acquire load invalidates L1 at every poll)
    ptxl = ckl.asm["ptx"]
    assert "ld.acquire.gpu.global.b32" not in ptx and "ld.acquire.gpu.global.b32" in ptxl
    # ptxas spills some loop-invariant addresses of the 168-register step (reloaded once per tile, none in the K
    # loops; 12-14 B without the lever, 80 B with it on Triton 3.6): a collapse (a GEMV loop spilling, e.g. 240 B
    # with 128-deep gate/up chunks) fails here
    assert use["registers"] <= 168 and use["spill_stores"] <= 128, use


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
    check_target(cfg.with_tiles(stream_wait=1), "sm_90a")
    check_target(cfg, "gfx942")
    ditron.init("sim")
    try:
        src = {}
        for sw in (0, 1):
            with ditron.heap_scope():
                g = dtask.TaskGraph("b8")
                register(g, RZ.step_specs(cfg.with_tiles(stream_wait=sw), 8))
                src[sw] = codegen.generate(g, False).source
    finally:
        ditron.finalize()
    assert src[0] == src[1] and "_sw_tile" not in src[1]


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
