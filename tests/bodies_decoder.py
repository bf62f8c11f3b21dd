"""Test bodies (run on every rank; see conftest.py) for the Qwen3-like
decoder of kernels/decoder: each tile function in a one-task (or two-task)
graph against torch at small odd shapes, and the whole decoder step as one
megakernel against the torch reference.

Tolerances: every tile computes in float32 and rounds to bf16 where the
reference does, so a tile differs from torch by its accumulation order (fp32:
~1e-6 relative) plus at most one bf16 rounding flip of its output (2^-8
relative); the tile checks use ``atol = rtol = 2^-7`` on outputs of magnitude
~1.  The whole step additionally differs from the torch baseline in where it
rounds (the kernel keeps o_proj / down_proj partial sums and the all-reduce
in float32, torch rounds them to bf16), so the final hidden states (magnitude
~3) may differ by a few bf16 ulps: ``3e-2 * max|ref| + 2e-2``, one order below
what a wrong mask, position or head mapping gives (>= 0.3, checked by the
planted-error test)."""
import re

import torch
import torch.nn.functional as F
import triton

import ditron.task as dtask
from ditron.kernels.decoder import tiles as T
from ditron.kernels.decoder import tiny
from ditron.kernels.decoder.config import next_pow2
from ditron.kernels.decoder.model import build_megakernel, decoder_tasks, make_buffers, register
from ditron.kernels.decoder.reference import _rms, _rope, lockstep_step
from ditron.kernels.decoder.weights import PagedKV, contexts, make_cache, make_input, make_weights

TILE_TOL = dict(atol=2 ** -7, rtol=2 ** -7)


def _randn(world, shape, seed, dtype=torch.bfloat16, scale=1.0):
    g = torch.Generator().manual_seed(1000 * seed + 17)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(world.device)


def _one(fn, name, num_tiles, args, reads, writes, scalars=None, num_programs=3):
    g = dtask.TaskGraph(name)
    g.register_task(fn, name=name, num_tiles=num_tiles, args=args, reads=reads, writes=writes,
                    scalars=scalars or {})
    return g.compile(num_programs=num_programs)


def _close(got, ref, what, **tol):
    torch.testing.assert_close(got.float().cpu(), ref.float().cpu(), msg=lambda m: f"{what}: {m}",
                               **(tol or TILE_TOL))


def rmsnorm_tile(world, B=3, N=37, block=16):
    x = _randn(world, (B, N), 1)
    resid = _randn(world, (B, N), 2, torch.float32)
    delta = _randn(world, (B, N), 3, torch.float32)
    w = _randn(world, (3, N), 4, scale=0.1) + 1
    checked = 0
    for first in (1, 0):
        r = resid.clone()
        out = torch.zeros(B, N, dtype=torch.bfloat16, device=world.device)
        mk = _one(T.add_rmsnorm_tile, "norm", B,
                  {"x_ptr": x, "delta_ptr": delta, "resid_ptr": r, "w_ptr": w, "out_ptr": out, "N": N, "eps": 1e-6,
                   "BLOCK": block}, ("x_ptr", "delta_ptr", "resid_ptr", "w_ptr"), ("resid_ptr", "out_ptr"),
                  scalars={"layer": 2, "first": first})
        mk.step()
        new = x.float() if first else resid + delta
        _close(r, new, f"resid first={first}", atol=1e-6, rtol=1e-6)
        _close(out, _rms(new, w[2], 1e-6), f"out first={first}")
        checked += 1
    return checked


def linear_tiles(world, B=3, N=21, K=45, BN=8, BK=16):
    x = _randn(world, (B, K), 5)
    w = _randn(world, (2, N, K), 6, scale=K ** -0.5)
    wgu = _randn(world, (2, 2 * N, K), 7, scale=K ** -0.5)
    checked = 0
    # the pipelined weight stream (STREAM = num_stages of the K loop, on both paths): float32 linear and
    # fused-norm gate/up after the first layer
    for dot, stream in ((False, 0), (True, 0), (True, 3), (False, 2)):
        for out_dtype in (torch.float32,) if stream else (torch.float32, torch.bfloat16):
            out = torch.zeros(B, N, dtype=out_dtype, device=world.device)
            c = dict(B=B, N=N, K=K, BLOCK_B=16 if dot else next_pow2(B), BLOCK_N=BN, BLOCK_K=BK, DOT=dot,
                     STREAM=stream)
            mk = _one(T.linear_tile, "lin", triton.cdiv(N, BN), {"x_ptr": x, "w_ptr": w, "out_ptr": out, **c},
                      ("x_ptr", "w_ptr"), ("out_ptr",), scalars={"layer": 1})
            mk.step()
            _close(out, (x.float() @ w[1].float().t()).to(out_dtype), f"linear dot={dot} stream={stream}")
            checked += 1
        act = torch.zeros(B, N, dtype=torch.bfloat16, device=world.device)
        if not stream:
            mk = _one(T.gate_up_tile, "gu", triton.cdiv(N, BN), {"x_ptr": x, "w_ptr": wgu, "out_ptr": act, **c},
                      ("x_ptr", "w_ptr"), ("out_ptr",), scalars={"layer": 1})
            mk.step()
            gu = x.float() @ wgu[1].float().t()
            _close(act, F.silu(gu[:, :N]) * gu[:, N:], f"gate_up dot={dot}")
            checked += 1
        # the fused-norm variants: the GEMV input is rms(x) (first) or rms(resid + delta), norm weight nw[2]
        resid = _randn(world, (B, K), 14, torch.float32)
        delta = _randn(world, (B, K), 15, torch.float32)
        nw = _randn(world, (3, K), 16, scale=0.1) + 1
        for first in (0,) if stream else (1, 0):
            h = _rms(x.float() if first else resid + delta, nw[2], 1e-6).float()
            norm_args = {"x_ptr": x, "resid_ptr": resid, "delta_ptr": delta, "nw_ptr": nw, "eps": 1e-6}
            rd = ("x_ptr", "resid_ptr", "delta_ptr", "nw_ptr", "w_ptr")
            sc = {"layer": 1, "norm": 2, "first": first}
            out = torch.zeros(B, N, dtype=torch.bfloat16, device=world.device)
            _one(T.rms_linear_tile, "rms_lin", triton.cdiv(N, BN), {**norm_args, "w_ptr": w, "out_ptr": out, **c},
                 rd, ("out_ptr",), scalars=sc).step()
            _close(out, h @ w[1].float().t(), f"rms_linear dot={dot} stream={stream} first={first}")
            _one(T.rms_gate_up_tile, "rms_gu", triton.cdiv(N, BN), {**norm_args, "w_ptr": wgu, "out_ptr": act, **c},
                 rd, ("out_ptr",), scalars=sc).step()
            gu = h @ wgu[1].float().t()
            _close(act, F.silu(gu[:, :N]) * gu[:, N:],
                   f"rms_gate_up dot={dot} stream={stream} first={first}")
            checked += 2
    return checked


def add_resid_tile(world, B=3, N=37, block=16):
    x = _randn(world, (B, N), 1)
    delta = _randn(world, (B, N), 3, torch.float32)
    for first in (1, 0):
        resid = _randn(world, (B, N), 2, torch.float32)
        ref = x.float() if first else resid + delta
        _one(T.add_resid_tile, "res", triton.cdiv(B * N, block),
             {"x_ptr": x, "resid_ptr": resid, "delta_ptr": delta, "N": B * N, "BLOCK": block},
             ("x_ptr", "resid_ptr", "delta_ptr"), ("resid_ptr",), scalars={"first": first}).step()
        _close(resid, ref, f"add_resid first={first}", atol=0, rtol=0)
    return 2


def _pages(world, B, KH, D, L, max_ctx, page, fill, seed):
    """A paged cache (k, v filled with ``fill``) and a shuffled block table: ``[L, NP, page, KH, D]``, ``[B, MP]``."""
    MP = triton.cdiv(max_ctx, page)
    NP = B * MP + 1
    bt = torch.randperm(NP, generator=torch.Generator().manual_seed(seed))[:B * MP].view(B, MP).to(torch.int32)
    kc = torch.full((L, NP, page, KH, D), fill, dtype=torch.bfloat16)
    return kc.to(world.device), kc.clone().to(world.device), bt.to(world.device)


def _seq_pages(kc, bt, layer, b, n):
    """``[KH, n, D]``: positions 0..n-1 of sequence ``b`` (CPU float32)."""
    from ditron.kernels.decoder.weights import PagedKV
    return PagedKV(kc.cpu(), kc.cpu(), bt.cpu()).positions("k", layer, b, 0, n).float()


def rope_tile(world, B=3, QH=4, KH=2, D=12, max_ctx=9, seqs=(6, 1, 9), L=2, layer=1, theta=1e4, page=4):
    """Ragged positions (5, 0, 8: pages 1, 0, 2 of the sequences' block-table rows), paged append."""
    G = QH // KH
    qkv = _randn(world, (B, (QH + 2 * KH) * D), 8)
    qn = _randn(world, (L, D), 9, scale=0.1) + 1
    kn = _randn(world, (L, D), 10, scale=0.1) + 1
    q = torch.zeros(B, QH, D, dtype=torch.bfloat16, device=world.device)
    kc, vc, bt = _pages(world, B, KH, D, L, max_ctx, page, 7.0, 3)
    seq_t = torch.tensor(seqs, dtype=torch.int32, device=world.device)
    inv = (1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))).to(world.device)
    mk = _one(T.qk_norm_rope_tile, "rope", B * KH * (G + 2),
              {"qkv_ptr": qkv, "qn_ptr": qn, "kn_ptr": kn, "q_ptr": q, "kc_ptr": kc, "vc_ptr": vc, "bt_ptr": bt,
               "seq_ptr": seq_t, "B": B, "QH": QH, "KH": KH, "num_pages": kc.shape[1], "max_pages": bt.shape[1],
               "eps": 1e-6, "inv_ptr": inv, "PAGE": page, "HEAD_D": D, "BLOCK_H": next_pow2(D // 2),
               "QK_NORM": True},
              ("qkv_ptr", "qn_ptr", "kn_ptr", "inv_ptr", "bt_ptr", "seq_ptr"), ("q_ptr", "kc_ptr", "vc_ptr"),
              scalars={"layer": layer})
    mk.step()
    h = qkv.view(B, QH + 2 * KH, D).cpu()
    pos = torch.tensor(seqs) - 1
    ref_q = _rope(_rms(h[:, :QH], qn[layer].cpu(), 1e-6).float(), pos, theta)
    ref_k = _rope(_rms(h[:, QH:QH + KH], kn[layer].cpu(), 1e-6).float(), pos, theta)
    _close(q, ref_q, "q")
    ref_kc = torch.full_like(kc.cpu(), 7.0)
    ref_vc = ref_kc.clone()
    btc = bt.cpu().long()
    for b in range(B):
        p = int(pos[b])
        ref_kc[layer, btc[b, p // page], p % page] = ref_k[b].to(torch.bfloat16)
        ref_vc[layer, btc[b, p // page], p % page] = h[b, QH + KH:]
    _close(kc, ref_kc, "k cache (only position seq[b]-1 of each sequence's page of the layer written)")
    _close(vc, ref_vc, "v cache", atol=0, rtol=0)
    return 3


def attention_tiles(world, B=3, QH=4, KH=2, D=12, max_ctx=37, seqs=(29, 5, 37), split=16, block=16, page=8):
    """Flash-decoding splits over a paged cache with ragged contexts (sequence 0: split 0 full, split 1 partial,
    split 2 empty; sequence 1: one partial split; sequence 2: the whole block table, a partial last page) +
    combine, GQA G=2, D not a power of two, against SDPA over the first ``seq[b]`` positions."""
    G, MP = QH // KH, triton.cdiv(max_ctx, page)
    S = triton.cdiv(MP * page, split)
    L, layer = 2, 1
    q = _randn(world, (B, QH, D), 11)
    kc, vc, bt = _pages(world, B, KH, D, L, max_ctx, page, 1000.0, 4)   # past the end: must never be read
    btc = bt.cpu().long()
    for b, n in enumerate(seqs):
        p = torch.arange(n)
        for c, seed in ((kc, 12), (vc, 13)):
            c[:, btc[b, p // page].to(c.device), (p % page).to(c.device)] = _randn(world, (L, n, KH, D), seed + 2 * b)
    o_part = torch.zeros(B, QH, S, D, device=world.device)
    lse = torch.zeros(B, QH, S, device=world.device)
    out = torch.zeros(B, QH * D, dtype=torch.bfloat16, device=world.device)
    seq_t = torch.tensor(seqs, dtype=torch.int32, device=world.device)
    g = dtask.TaskGraph("attn")
    a = g.register_task(T.attn_split_tile, name="attn", num_tiles=B * KH * S,
                        args={"q_ptr": q, "kc_ptr": kc, "vc_ptr": vc, "bt_ptr": bt, "seq_ptr": seq_t, "o_ptr": o_part,
                              "lse_ptr": lse, "B": B, "QH": QH, "KH": KH, "num_pages": kc.shape[1], "max_pages": MP,
                              "nsplit": S, "sm_scale": D ** -0.5, "PAGE": page, "HEAD_D": D, "BLOCK_D": 16,
                              "BLOCK_G": 16, "SPLIT": split, "BLOCK_P": block},
                        reads=("q_ptr", "kc_ptr", "vc_ptr", "bt_ptr", "seq_ptr"), writes=("o_ptr", "lse_ptr"),
                        scalars={"layer": layer})
    g.register_task(T.attn_combine_tile, name="comb", num_tiles=B * QH,
                    args={"o_ptr": o_part, "lse_ptr": lse, "out_ptr": out, "nsplit": S, "HEAD_D": D, "BLOCK_D": 16,
                          "BLOCK_S": next_pow2(S)},
                    reads=("o_ptr", "lse_ptr"), writes=("out_ptr",),
                    deps=[dtask.Dep(a, lambda t: ((t // QH * KH + t % QH // G) * S,
                                                  (t // QH * KH + t % QH // G + 1) * S))])
    g.compile(num_programs=3).step()
    for b, n in enumerate(seqs):
        k, v = _seq_pages(kc, bt, layer, b, n), _seq_pages(vc, bt, layer, b, n)
        ref = F.scaled_dot_product_attention(q[b].float().cpu()[:, None], k, v, scale=D ** -0.5, enable_gqa=True)
        _close(out[b], ref.reshape(QH * D), f"attention of sequence {b} (context {n})")
        empty = [s for s in range(S) if s * split >= n]
        assert torch.isinf(lse[b, :, empty]).all(), f"sequence {b}: splits {empty} lie past its context {n}"
    return 1


# ---------------------------------------------------------------------------
# the whole step
# ---------------------------------------------------------------------------

def _setup(world, cfg, B, max_ctx, ctx, seed=0, page_size=16):
    W, r = world.world_size, world.rank
    w = make_weights(cfg, r, W, seed=seed)
    cache = make_cache(cfg, r, W, B, max_ctx, ctx, seed=seed, page_size=page_size)
    refs = []
    for rr in range(W):                      # every rank's shard, for the in-process TP reference
        wr = make_weights(cfg, rr, W, seed=seed)
        cr = make_cache(cfg, rr, W, B, max_ctx, ctx, seed=seed, page_size=page_size)
        refs.append((cfg, cfg.shard(W), wr, cr, torch.tensor(contexts(ctx, B), dtype=torch.int32)))
    dev = world.device
    return (w.__class__(*[getattr(w, f).to(dev) for f in w.__dataclass_fields__]), cache.to(dev)), refs


def decoder_steps(world, steps=2, B=1, max_ctx=40, ctx=33, scheduler="round_robin", num_programs=4, cfg=None,
                  check_cache=True, page_size=16):
    """The tiny decoder megakernel for ``steps`` steps (positions advance, the paged KV cache is appended) against
    the torch reference of all ranks computed in this process (the same pages); ``ctx``: an int or one context
    length per sequence (ragged).  Returns per-step max errors."""
    cfg = cfg or tiny()
    (w, cache), refs = _setup(world, cfg, B, max_ctx, ctx, page_size=page_size)
    k, v = cache.k, cache.v
    dm = build_megakernel(cfg, w, cache, world_size=world.world_size, batch=B, ctx=ctx, scheduler=scheduler,
                          num_programs=num_programs)
    ctxs = contexts(ctx, B)
    errs = []
    for s in range(steps):
        x = make_input(cfg, B, s)
        y = dm.step(x.to(world.device)).float().cpu()
        ref = lockstep_step(refs, x)[world.rank].float()
        err = (y - ref).abs().max().item()
        scale = ref.abs().max().item()
        assert err <= 3e-2 * scale + 2e-2, f"step {s} rank {world.rank}: max abs error {err:.3g} (scale {scale:.3g})"
        assert dm.seq.cpu().tolist() == [c + s + 1 for c in ctxs]
        if check_cache:
            mine = refs[world.rank][3]
            _close(k, mine.k, f"k cache after step {s}", atol=0.07, rtol=2 ** -7)
            _close(v, mine.v, f"v cache after step {s}", atol=0.07, rtol=2 ** -7)
        errs.append(err)
    return errs


def missing_dep_is_rejected(world):
    """Drop the rope task's dependency on the QKV projection: registration fails naming both tasks."""
    cfg = tiny()
    (w, cache), _ = _setup(world, cfg, 1, 20, 5)
    buf = make_buffers(cfg, world.world_size, 1, cache.max_ctx, 5, world.device)
    specs = decoder_tasks(cfg, world.world_size, w, cache, buf)
    rope = next(s for s in specs if s.name == "rope.1")
    rope.deps = []
    try:
        register(dtask.TaskGraph("broken"), specs)
    except Exception as e:  # noqa: BLE001 -- the message is checked by the test
        return str(e)
    return "no error"


def planted_missing_release(world, task="qkv.0", tile=1):
    """A tile that never releases its scoreboard slot: the step must stop with a report naming it."""
    cfg = tiny()
    (w, cache), _ = _setup(world, cfg, 1, 20, 5)
    dm = build_megakernel(cfg, w, cache, world_size=world.world_size, batch=1, ctx=5, num_programs=3,
                          _plant_missing_release=(task, tile))
    dm.step(make_input(cfg, 1, 0).to(world.device))


def compile_generated(world, target, gemv_dot=False, prefetch_k=0):
    """The decoder megakernel generated with Qwen3-8B's tile sizes (head_dim 128, GEMV tiles 16 x 1024 and 8 x 1024 for gate/up, attention
    splits of 128 positions; smaller hidden / intermediate / layers keep the weights small: the code does not
    depend on them) compiled for ``target``; returns what the tests check in the assembly."""
    import ditron
    from conftest import device_asm
    from ditron.kernels.decoder import qwen3_8b
    cfg = qwen3_8b(hidden=256, intermediate=512, n_layers=2).with_tiles(gemv_dot=gemv_dot, prefetch_k=prefetch_k,
                                                                      prefetch_projs="qkv,o,gate_up,down",
                                                                      direct_tp1=False)   # the comm branch too
    w = make_weights(cfg, world.rank, world.world_size)
    cache = make_cache(cfg, world.rank, world.world_size, 1, 300, 40)
    dm = build_megakernel(cfg, w, cache, world_size=world.world_size, batch=1, ctx=40, num_programs=132,
                          name=f"decoder_{target}", target=target)
    ck = ditron.compile(dm.mk.kernel, target=target, signature=dm.mk.signature(), num_warps=cfg.tiles.num_warps)
    asm = device_asm(ck)
    ir = ck.asm["dist_ir"]
    return {"branches": len(dm.mk.code.branches), "wait_deps": "dist.wait_deps" in ir,
            "symm_at": "dist.symm_at" in ir, "notify": "dist.notify" in ir,
            "v4_loads": len(re.findall(r"ld\.global[\w.:]*\.v4\.b32", asm)) if target.startswith("sm")
            else asm.count("global_load_dwordx4"),
            "cp_async16": len(re.findall(r"cp\.async\.c[ga]\.shared\.global \[[^]]*\], \[[^]]*\], (?:16|0x10)\b",
                                         asm)) if target.startswith("sm") else 0,
            "evict_first": "evict_first" in asm if target.startswith("sm") else None,
            "mma": ("mma" in asm) if target.startswith("sm") else ("v_mfma" in asm),
            "prefetch_l2": "dist.prefetch_l2" in ir,
            "prefetch_insns": asm.count("prefetch.global.L2") if target.startswith("sm") else None}


def decoder_steps_symmetric(world, steps=2, B=1, max_ctx=40, ctx=33, scheduler="round_robin", num_programs=4,
                            cfg=None):
    """:func:`decoder_steps` with every activation buffer and the KV cache on the symmetric heap, so that the
    race finder checks each tile's accesses against the scoreboard's acquire/release edges (tile-exact
    dependency ranges; the static check of the graph works per task)."""
    import ditron
    cfg = cfg or tiny()
    (w, c0), refs = _setup(world, cfg, B, max_ctx, ctx)
    cache = PagedKV(*[ditron.symm_zeros(tuple(t.shape), t.dtype, name=n) for t, n in
                      zip(c0, ("k_cache", "v_cache", "block_table"))])
    for dst, src in zip(cache, c0):
        dst.copy_(src)
    buf = make_buffers(cfg, world.world_size, B, cache.max_ctx, ctx, world.device, symmetric=True)
    dm = build_megakernel(cfg, w, cache, world_size=world.world_size, batch=B, ctx=ctx, scheduler=scheduler,
                          num_programs=num_programs, buffers=buf)
    errs = []
    for s in range(steps):
        x = make_input(cfg, B, s)
        y = dm.step(x.to(world.device)).float().cpu()
        ref = lockstep_step(refs, x)[world.rank].float()
        err = (y - ref).abs().max().item()
        assert err <= 3e-2 * ref.abs().max().item() + 2e-2, f"step {s} rank {world.rank}: max abs error {err:.3g}"
        errs.append(err)
    return errs


def gloo_reference_worker(rank, world_size, init_file, queue, steps=2, B=2, max_ctx=24, ctx=13):
    """One process of a torch.distributed (gloo) job: this rank's TorchDecoder steps (CPU reference path)."""
    import torch.distributed as dist

    from ditron.kernels.decoder.reference import TorchDecoder
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        cfg = tiny()
        cache = make_cache(cfg, rank, world_size, B, max_ctx, ctx)
        ref = TorchDecoder(cfg, cfg.shard(world_size), make_weights(cfg, rank, world_size), cache,
                           torch.tensor([ctx] * B, dtype=torch.int32))
        # numpy arrays travel by value: a torch tensor would be passed as a file descriptor that this process,
        # exiting right after, may close before the parent receives it (ConnectionResetError)
        queue.put((rank, [ref.step(make_input(cfg, B, s)).float().numpy() for s in range(steps)]))
    finally:
        dist.destroy_process_group()


def ptxas_usage(ptx, arch="sm_90a"):
    """``{"registers", "spill_stores", "spill_loads", "stack"}`` (bytes per thread) of ``ptx`` by Triton's bundled
    ``ptxas -v`` (no GPU needed): what the driver reports as ``n_regs`` / ``n_spills`` when it loads the kernel."""
    from ditron.compiler import ptxas_usage as usage
    return usage(ptx, arch)


def gemv_branches_compiled(world, batch, target="sm_90a", **tiles):
    """The decoder's GEMV tasks (fused-norm QKV, fused-norm gate/up, down projection) exactly as
    :func:`decoder_tasks` configures them for ``batch`` rows at Qwen3-8B's shapes (hidden 4096, intermediate
    12288, ``TILES_8B``; ``N`` and ``K`` are compile-time constants, so the real sizes matter), in one graph,
    compiled ahead of time for ``target``.  Returns ``(compiled kernel, the GEMV constexprs)``: the weights are
    1-element placeholders (compiled, never run); ``tiles``: ``TileConfig`` overrides."""
    import ditron
    from ditron.kernels.decoder import qwen3_8b
    from ditron.kernels.decoder.weights import Weights
    cfg = qwen3_8b(n_layers=1).with_tiles(**tiles)
    sh = cfg.shard(1)
    w = Weights(*[torch.empty(1, dtype=torch.bfloat16) for _ in range(7)], torch.empty(1, dtype=torch.float32))
    k = torch.empty((1, 2 * batch, 16, sh.kv_heads, cfg.head_dim), dtype=torch.bfloat16)
    cache = PagedKV(k, k, torch.arange(2 * batch, dtype=torch.int32).view(batch, 2))
    buf = make_buffers(cfg, 1, batch, cache.max_ctx, 8, "cpu")
    specs = {s.name: s for s in decoder_tasks(cfg, 1, w, cache, buf)}
    g = dtask.TaskGraph(f"gemv_b{batch}")
    tasks = {}
    for name, deps in (("qkv.0", ()), ("gu.0", ()), ("down.0", ("gu.0",))):
        s = specs[name]
        tasks[name] = g.register_task(s.fn, name=name, num_tiles=s.num_tiles, args=s.args, reads=s.reads,
                                      writes=s.writes, scalars=s.scalars, deps=[dtask.Dep(tasks[d]) for d in deps])
    mk = g.compile(num_programs=8, num_warps=cfg.tiles.num_warps)
    ck = ditron.compile(mk.kernel, target=target, signature=mk.signature(), num_warps=cfg.tiles.num_warps)
    c = specs["gu.0"].args
    # DOT: the batch path's tiles accumulate with tl.dot (the gu_wdot / dot_ksplit tiles always do: no DOT argument)
    return ck, {**{k: c[k] for k in ("BLOCK_B", "BLOCK_N", "BLOCK_K")}, "DOT": c.get("DOT", cfg.tiles.dot_for(batch))}


def bad_serving_inputs(world, B=2, ctx=(9, 3), max_ctx=16, page_size=4):
    """Every bad input of the serving interface is a DitronError before launch naming the sequence and the values;
    returns the messages (the test checks them).  The kernel never runs: the checks fire first."""
    cfg = tiny()
    (w, cache), _ = _setup(world, cfg, B, max_ctx, list(ctx), page_size=page_size)
    dm = build_megakernel(cfg, w, cache, world_size=world.world_size, batch=B, ctx=list(ctx), num_programs=3)
    msgs = {}

    def expect(what, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- checked below and by the test
            assert type(e).__name__ == "DitronError", (what, repr(e))
            msgs[what] = str(e)
            return
        raise AssertionError(f"{what}: no error")
    x = make_input(cfg, B + 1, 0).to(world.device)
    expect("batch", lambda: dm.step(x))
    bt0, seq0 = cache.block_table.clone(), dm.seq.clone()
    dm.seq[0] = cache.max_ctx                       # the next position lies past the block table
    expect("short_table", dm.check_inputs)
    dm.seq.copy_(seq0)
    cache.block_table[1, 0] = cache.num_pages       # one past the last page
    expect("page_range", dm.check_inputs)
    cache.block_table.copy_(bt0)
    cache.block_table[1, 0] = -1
    expect("negative_page", dm.check_inputs)
    cache.block_table.copy_(bt0)
    cache.block_table[1, 2] = cache.block_table[0, 2]   # both append position 9: row 1 of the same page
    dm.seq[1] = ctx[0]
    expect("shared_page", dm.check_inputs)
    cache.block_table.copy_(bt0)
    dm.seq.copy_(seq0)
    dm.check_inputs()                               # restored: fine
    expect("build_batch", lambda: build_megakernel(cfg, w, cache, world_size=world.world_size, batch=B + 1,
                                                   ctx=3, num_programs=3))
    return msgs
