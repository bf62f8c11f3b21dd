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
import math
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
from ditron.kernels.decoder.weights import make_cache, make_input, make_weights

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
    for dot in (False, True):
        for out_dtype in (torch.float32, torch.bfloat16):
            out = torch.zeros(B, N, dtype=out_dtype, device=world.device)
            c = dict(B=B, N=N, K=K, BLOCK_B=16 if dot else next_pow2(B), BLOCK_N=BN, BLOCK_K=BK, DOT=dot)
            mk = _one(T.linear_tile, "lin", triton.cdiv(N, BN), {"x_ptr": x, "w_ptr": w, "out_ptr": out, **c},
                      ("x_ptr", "w_ptr"), ("out_ptr",), scalars={"layer": 1})
            mk.step()
            _close(out, (x.float() @ w[1].float().t()).to(out_dtype), f"linear dot={dot} {out_dtype}")
            checked += 1
        act = torch.zeros(B, N, dtype=torch.bfloat16, device=world.device)
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
        for first in (1, 0):
            h = _rms(x.float() if first else resid + delta, nw[2], 1e-6).float()
            norm_args = {"x_ptr": x, "resid_ptr": resid, "delta_ptr": delta, "nw_ptr": nw, "eps": 1e-6}
            rd = ("x_ptr", "resid_ptr", "delta_ptr", "nw_ptr", "w_ptr")
            sc = {"layer": 1, "norm": 2, "first": first}
            out = torch.zeros(B, N, dtype=torch.bfloat16, device=world.device)
            _one(T.rms_linear_tile, "rms_lin", triton.cdiv(N, BN), {**norm_args, "w_ptr": w, "out_ptr": out, **c},
                 rd, ("out_ptr",), scalars=sc).step()
            _close(out, h @ w[1].float().t(), f"rms_linear dot={dot} first={first}")
            _one(T.rms_gate_up_tile, "rms_gu", triton.cdiv(N, BN), {**norm_args, "w_ptr": wgu, "out_ptr": act, **c},
                 rd, ("out_ptr",), scalars=sc).step()
            gu = h @ wgu[1].float().t()
            _close(act, F.silu(gu[:, :N]) * gu[:, N:], f"rms_gate_up dot={dot} first={first}")
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


def rope_tile(world, B=2, QH=4, KH=2, D=12, max_ctx=9, seq=6, L=2, layer=1, theta=1e4):
    G = QH // KH
    qkv = _randn(world, (B, (QH + 2 * KH) * D), 8)
    qn = _randn(world, (L, D), 9, scale=0.1) + 1
    kn = _randn(world, (L, D), 10, scale=0.1) + 1
    q = torch.zeros(B, QH, D, dtype=torch.bfloat16, device=world.device)
    kc = torch.full((L, B, KH, max_ctx, D), 7.0, dtype=torch.bfloat16, device=world.device)
    vc = kc.clone()
    seq_t = torch.tensor([seq], dtype=torch.int32, device=world.device)
    mk = _one(T.qk_norm_rope_tile, "rope", B * KH * (G + 2),
              {"qkv_ptr": qkv, "qn_ptr": qn, "kn_ptr": kn, "q_ptr": q, "kc_ptr": kc, "vc_ptr": vc, "seq_ptr": seq_t,
               "B": B, "QH": QH, "KH": KH, "max_ctx": max_ctx, "eps": 1e-6, "log2_theta": math.log2(theta),
               "HEAD_D": D, "BLOCK_H": next_pow2(D // 2)},
              ("qkv_ptr", "qn_ptr", "kn_ptr", "seq_ptr"), ("q_ptr", "kc_ptr", "vc_ptr"), scalars={"layer": layer})
    mk.step()
    h = qkv.view(B, QH + 2 * KH, D)
    pos = torch.tensor(seq - 1)
    ref_q = _rope(_rms(h[:, :QH], qn[layer], 1e-6).float().cpu(), pos, theta)
    ref_k = _rope(_rms(h[:, QH:QH + KH], kn[layer], 1e-6).float().cpu(), pos, theta)
    _close(q, ref_q, "q")
    ref_kc = torch.full_like(kc.cpu(), 7.0)
    ref_vc = ref_kc.clone()
    ref_kc[layer, :, :, seq - 1] = ref_k.to(torch.bfloat16)
    ref_vc[layer, :, :, seq - 1] = h[:, QH + KH:].cpu()
    _close(kc, ref_kc, "k cache (only position seq-1 of the layer written)")
    _close(vc, ref_vc, "v cache", atol=0, rtol=0)
    return 3


def attention_tiles(world, B=2, QH=4, KH=2, D=12, max_ctx=37, seq=29, split=16, block=16):
    """Flash-decoding splits (split 0 full, split 1 partial, split 2 empty) + combine, GQA G=2, D not a power
    of two, against SDPA over the first ``seq`` positions."""
    G, S = QH // KH, triton.cdiv(max_ctx, split)
    L, layer = 2, 1
    q = _randn(world, (B, QH, D), 11)
    kc = _randn(world, (L, B, KH, max_ctx, D), 12)
    vc = _randn(world, (L, B, KH, max_ctx, D), 13)
    kc[:, :, :, seq:] = 1000.0                         # past the end: must never be read
    vc[:, :, :, seq:] = 1000.0
    o_part = torch.zeros(B, QH, S, D, device=world.device)
    lse = torch.zeros(B, QH, S, device=world.device)
    out = torch.zeros(B, QH * D, dtype=torch.bfloat16, device=world.device)
    seq_t = torch.tensor([seq], dtype=torch.int32, device=world.device)
    g = dtask.TaskGraph("attn")
    a = g.register_task(T.attn_split_tile, name="attn", num_tiles=B * KH * S,
                        args={"q_ptr": q, "kc_ptr": kc, "vc_ptr": vc, "seq_ptr": seq_t, "o_ptr": o_part,
                              "lse_ptr": lse, "B": B, "QH": QH, "KH": KH, "max_ctx": max_ctx, "nsplit": S,
                              "sm_scale": D ** -0.5, "HEAD_D": D, "BLOCK_D": 16, "BLOCK_G": 16, "SPLIT": split,
                              "BLOCK_P": block},
                        reads=("q_ptr", "kc_ptr", "vc_ptr", "seq_ptr"), writes=("o_ptr", "lse_ptr"),
                        scalars={"layer": layer})
    g.register_task(T.attn_combine_tile, name="comb", num_tiles=B * QH,
                    args={"o_ptr": o_part, "lse_ptr": lse, "out_ptr": out, "nsplit": S, "HEAD_D": D, "BLOCK_D": 16,
                          "BLOCK_S": next_pow2(S)},
                    reads=("o_ptr", "lse_ptr"), writes=("out_ptr",),
                    deps=[dtask.Dep(a, lambda t: ((t // QH * KH + t % QH // G) * S,
                                                  (t // QH * KH + t % QH // G + 1) * S))])
    g.compile(num_programs=3).step()
    k, v = kc[layer, :, :, :seq].float().cpu(), vc[layer, :, :, :seq].float().cpu()
    ref = F.scaled_dot_product_attention(q.float().cpu()[:, :, None], k, v, scale=D ** -0.5, enable_gqa=True)
    _close(out, ref.reshape(B, QH * D), "attention")
    assert torch.isinf(lse[:, :, 2]).all(), "split 2 (positions >= 32 > seq) must be empty"
    return 1


# ---------------------------------------------------------------------------
# the whole step
# ---------------------------------------------------------------------------

def _setup(world, cfg, B, max_ctx, ctx, seed=0):
    W, r = world.world_size, world.rank
    w = make_weights(cfg, r, W, seed=seed)
    k, v = make_cache(cfg, r, W, B, max_ctx, ctx, seed=seed)
    refs = []
    for rr in range(W):                      # every rank's shard, for the in-process TP reference
        wr = make_weights(cfg, rr, W, seed=seed)
        kr, vr = make_cache(cfg, rr, W, B, max_ctx, ctx, seed=seed)
        refs.append((cfg, cfg.shard(W), wr, kr, vr, torch.tensor([ctx], dtype=torch.int32)))
    dev = world.device
    return (w.__class__(*[getattr(w, f).to(dev) for f in w.__dataclass_fields__]), k.to(dev), v.to(dev)), refs


def decoder_steps(world, steps=2, B=1, max_ctx=40, ctx=33, scheduler="round_robin", num_programs=4, cfg=None,
                  check_cache=True):
    """The tiny decoder megakernel for ``steps`` steps (pos advances, KV cache appended) against the torch
    reference of all ranks computed in this process; returns per-step max errors."""
    cfg = cfg or tiny()
    (w, k, v), refs = _setup(world, cfg, B, max_ctx, ctx)
    dm = build_megakernel(cfg, w, (k, v), world_size=world.world_size, batch=B, ctx=ctx, scheduler=scheduler,
                          num_programs=num_programs)
    errs = []
    for s in range(steps):
        x = make_input(cfg, B, s)
        y = dm.step(x.to(world.device)).float().cpu()
        ref = lockstep_step(refs, x)[world.rank].float()
        err = (y - ref).abs().max().item()
        scale = ref.abs().max().item()
        assert err <= 3e-2 * scale + 2e-2, f"step {s} rank {world.rank}: max abs error {err:.3g} (scale {scale:.3g})"
        assert int(dm.seq.cpu()[0]) == ctx + s + 1
        if check_cache:
            mine = refs[world.rank]
            _close(k, mine[3], f"k cache after step {s}", atol=0.07, rtol=2 ** -7)
            _close(v, mine[4], f"v cache after step {s}", atol=0.07, rtol=2 ** -7)
        errs.append(err)
    return errs


def missing_dep_is_rejected(world):
    """Drop the rope task's dependency on the QKV projection: registration fails naming both tasks."""
    cfg = tiny()
    (w, k, v), _ = _setup(world, cfg, 1, 20, 5)
    buf = make_buffers(cfg, world.world_size, 1, 20, 5, world.device)
    specs = decoder_tasks(cfg, world.world_size, w, k, v, buf)
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
    (w, k, v), _ = _setup(world, cfg, 1, 20, 5)
    dm = build_megakernel(cfg, w, (k, v), world_size=world.world_size, batch=1, ctx=5, num_programs=3,
                          _plant_missing_release=(task, tile))
    dm.step(make_input(cfg, 1, 0).to(world.device))


def compile_generated(world, target, gemv_dot=False, prefetch_k=0):
    """The decoder megakernel generated with Qwen3-8B's tile sizes (head_dim 128, GEMV tiles 16 x 1024 and 8 x 1024 for gate/up, attention
    splits of 128 positions; smaller hidden / intermediate / layers keep the weights small: the code does not
    depend on them) compiled for ``target``; returns what the tests check in the assembly."""
    import ditron
    from conftest import device_asm
    from ditron.kernels.decoder import qwen3_8b
    cfg = qwen3_8b(hidden=256, intermediate=512, n_layers=2).with_tiles(gemv_dot=gemv_dot, prefetch_k=prefetch_k)
    w = make_weights(cfg, world.rank, world.world_size)
    k, v = make_cache(cfg, world.rank, world.world_size, 1, 300, 40)
    dm = build_megakernel(cfg, w, (k, v), world_size=world.world_size, batch=1, ctx=40, num_programs=132,
                          name=f"decoder_{target}")
    ck = ditron.compile(dm.mk.kernel, target=target, signature=dm.mk.signature(), num_warps=cfg.tiles.num_warps)
    asm = device_asm(ck)
    ir = ck.asm["dist_ir"]
    return {"branches": len(dm.mk.code.branches), "wait_deps": "dist.wait_deps" in ir,
            "symm_at": "dist.symm_at" in ir, "notify": "dist.notify" in ir,
            "v4_loads": len(re.findall(r"ld\.global[\w.:]*\.v4\.b32", asm)) if target.startswith("sm")
            else asm.count("global_load_dwordx4"),
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
    (w, k0, v0), refs = _setup(world, cfg, B, max_ctx, ctx)
    k = ditron.symm_zeros(tuple(k0.shape), k0.dtype, name="k_cache")
    v = ditron.symm_zeros(tuple(v0.shape), v0.dtype, name="v_cache")
    k.copy_(k0)
    v.copy_(v0)
    buf = make_buffers(cfg, world.world_size, B, max_ctx, ctx, world.device, symmetric=True)
    dm = build_megakernel(cfg, w, (k, v), world_size=world.world_size, batch=B, ctx=ctx, scheduler=scheduler,
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
        k, v = make_cache(cfg, rank, world_size, B, max_ctx, ctx)
        ref = TorchDecoder(cfg, cfg.shard(world_size), make_weights(cfg, rank, world_size), k, v,
                           torch.tensor([ctx], dtype=torch.int32))
        # by value (NumPy): a tensor would be shared through this process's fd listener, gone once it exits
        queue.put((rank, [ref.step(make_input(cfg, B, s)).float().numpy() for s in range(steps)]))
    finally:
        dist.destroy_process_group()
