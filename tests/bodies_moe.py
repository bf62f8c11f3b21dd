"""Test bodies (run on every rank; see conftest.py) for the zoo's MoE
kernels: the grouped GEMM core (kernels/moe.py) and TP MoE (ag_moe, moe_rs,
moe_ar; kernels/moe_tp.py), against plain torch in float32.  Simulated ranks
in CI, GPUs under torchrun."""
import torch

import ditron
from ditron.kernels.moe import grouped_gemm, grouped_gemm_reference

from bodies_ag_gemm import _check, _rand_of, error_messages

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def grouped_gemm_cases(world, dtype, cases, K=40, N=24, seed=0, **cfg):
    """``cases``: lists of per-expert counts (zeros included).  Every case
    once with contiguous rows and once with a gather index (a permutation of
    the token rows, as EP / TP MoE use it).  Returns the number of checks."""
    from ditron.kernels.gemm import GemmConfig
    dtype = DTYPES[dtype]
    config = GemmConfig(**cfg) if cfg else None
    done = 0
    for i, counts in enumerate(cases):
        E, M = len(counts), sum(counts)
        a = _rand_of(world.rank, (M + 3, K), dtype, seed + i).to(world.device)
        w = _rand_of(world.rank, (E, K, N), dtype, seed + i, salt=1).to(world.device)
        c = torch.tensor(counts, dtype=torch.int32 if i % 2 else torch.int64, device=world.device)
        out = grouped_gemm(a[:M], w, c, config=config)
        assert out.shape == (M, N) and out.dtype == dtype
        _check(out, grouped_gemm_reference(a[:M].cpu(), w.cpu(), c.cpu()), f"case {i} counts={counts}")
        g = torch.Generator().manual_seed(seed + i)
        idx = torch.randperm(M + 3, generator=g)[:M].to(world.device)
        out = torch.full((M, N), -7.0, dtype=dtype, device=world.device)
        grouped_gemm(a, w, c, out=out, gather_idx=idx, config=config)
        _check(out, grouped_gemm_reference(a.cpu(), w.cpu(), c.cpu(), idx.cpu()), f"gather case {i}")
        done += 2
    return done


def grouped_gemm_errors(world):
    a = torch.ones(5, 16, dtype=torch.float16, device=world.device)
    w = torch.ones(3, 16, 8, dtype=torch.float16, device=world.device)
    c = torch.tensor([2, 0, 3], device=world.device)
    cases = {
        "counts_len": lambda: grouped_gemm(a, w, c[:2]),
        "counts_dtype": lambda: grouped_gemm(a, w, c.float()),
        "w_dtype": lambda: grouped_gemm(a, w.bfloat16(), c),
        "w_k": lambda: grouped_gemm(a, w[:, :8], c),
        "w_2d": lambda: grouped_gemm(a, w[0], c),
        "a_dtype": lambda: grouped_gemm(a.float(), w, c),
        "out": lambda: grouped_gemm(a, w, c, out=torch.empty(5, 9, dtype=torch.float16, device=world.device)),
    }
    return error_messages(cases)


# ---------------------------------------------------------------------------
# TP MoE: ag_moe -> act -> moe_rs, and moe_ar
# ---------------------------------------------------------------------------

def _silu(v):
    return torch.nn.functional.silu(v)


def _tp_inputs(rank, m, H, E, k, dtype, seed, used):
    """Rank ``rank``'s tokens, routing (experts ``0 .. used - 1`` only, so the
    others get no pair; repeated experts allowed) and weights."""
    x = _rand_of(rank, (m, H), dtype, seed)
    g = torch.Generator().manual_seed(977 * seed + 13 * rank + 1)
    idx = torch.randint(0, used, (m, k), generator=g)
    w = torch.rand(m, k, generator=g) + 0.1
    return x, idx, w


def _tp_weights(H, I, E, dtype, seed):
    w1 = (_rand_of(0, (E, H, I), dtype, seed, salt=5).float() * 0.2).to(dtype)
    w2 = (_rand_of(0, (E, I, H), dtype, seed, salt=6).float() * 0.2).to(dtype)
    return w1, w2


def _shards(w1, w2, rank, W):
    il = w1.shape[2] // W
    return (w1[:, :, rank * il:(rank + 1) * il].contiguous(), w2[:, rank * il:(rank + 1) * il, :].contiguous())


def tp_moe_layer(world, dtype, ms, H=16, I_local=16, E=4, k=2, seed=0, used=None, **cfg):
    """One ag_moe and one moe_rs context; per ``m`` in ``ms`` (every call
    reuses them): h = ag_moe(x, idx, w1 shard) checked row by row against
    torch in the plan's order, then out = moe_rs(silu(h), plan, w2 shard,
    weights) against the whole torch MoE layer.  Returns the calls checked."""
    from ditron.kernels.gemm import GemmConfig
    from ditron.kernels.moe_tp import ag_moe, create_ag_moe_context, create_moe_rs_context, moe_reference, moe_rs
    dtype = DTYPES[dtype]
    W, me = world.world_size, world.rank
    used = used or E
    opts = dict(config=GemmConfig(**cfg)) if cfg else {}
    agc = create_ag_moe_context(max(ms), H, E, k, dtype, **opts)
    rsc = create_moe_rs_context(max(ms), H, E, k, dtype, **opts)
    w1_full, w2_full = _tp_weights(H, I_local * W, E, dtype, seed)
    w1, w2 = (t.to(world.device) for t in _shards(w1_full, w2_full, me, W))
    for i, m in enumerate(ms):
        ins = [_tp_inputs(s, m, H, E, k, dtype, seed + i, used) for s in range(W)]
        x_all = torch.cat([t[0] for t in ins])
        idx_all = torch.cat([t[1] for t in ins])
        w_all = torch.cat([t[2] for t in ins])
        x, idx, w = (t.to(world.device) for t in ins[me])
        h, plan = ag_moe(x, idx, w1, agc)
        assert h.shape == (W * m * k, I_local) and int(plan.dropped) == 0
        pairs = plan.perm.cpu()
        ids = idx_all.reshape(-1)[pairs]
        assert torch.equal(pairs // (m * k), torch.arange(W * m * k) // (m * k)), "rows are segment-major"
        h_ref = torch.stack([x_all[int(g) // k].float() @ w1[int(e)].float().cpu() for g, e in zip(pairs, ids)])
        _check(h, h_ref, f"ag_moe call {i} m={m} rank={me}")
        a = _silu(h.float()).to(dtype)
        out = moe_rs(a, plan, w2, w, rsc)
        ref = moe_reference(x_all, idx_all, w_all, w1_full, w2_full, _silu)[me * m:(me + 1) * m]
        assert out.shape == (m, H)
        _check(out, ref, f"moe_rs call {i} m={m} rank={me}")
    return int(agc.calls[0]) + int(rsc.calls[0])


def tp_moe_ar(world, dtype, ms, H=16, I_local=16, E=4, k=2, seed=0):
    """moe_ar on replicated tokens: plan from every token's routing,
    plan_gemm, silu, moe_ar -> [T, H] on every rank, against torch."""
    from ditron.kernels.moe_tp import create_moe_ar_context, moe_ar, moe_plan, moe_reference, plan_gemm
    dtype = DTYPES[dtype]
    W, me = world.world_size, world.rank
    arc = create_moe_ar_context(W * max(ms), H, E, k, dtype)
    w1_full, w2_full = _tp_weights(H, I_local * W, E, dtype, seed)
    w1, w2 = (t.to(world.device) for t in _shards(w1_full, w2_full, me, W))
    for i, m in enumerate(ms):
        ins = [_tp_inputs(s, m, H, E, k, dtype, seed + i, E) for s in range(W)]
        x_all = torch.cat([t[0] for t in ins])
        idx_all = torch.cat([t[1] for t in ins])
        w_all = torch.cat([t[2] for t in ins])
        plan = moe_plan(idx_all.to(world.device), W, me, E)
        h = plan_gemm(x_all.to(world.device), w1, plan)
        out = moe_ar(_silu(h.float()).to(dtype), plan, w2, w_all.to(world.device), arc)
        assert out.shape == (W * m, H)
        _check(out, moe_reference(x_all, idx_all, w_all, w1_full, w2_full, _silu), f"moe_ar call {i} rank={me}")
    return len(ms)


def tp_moe_errors(world):
    from ditron.kernels.moe_tp import ag_moe, create_ag_moe_context, create_moe_rs_context, moe_plan, moe_rs
    W = world.world_size
    dev = world.device
    agc = create_ag_moe_context(4, 16, 4, 2, torch.bfloat16)
    rsc = create_moe_rs_context(4, 16, 4, 2, torch.bfloat16)
    x = torch.ones(3, 16, dtype=torch.bfloat16, device=dev)
    idx = torch.zeros(3, 2, dtype=torch.int64, device=dev)
    w1 = torch.ones(4, 16, 8, dtype=torch.bfloat16, device=dev)
    w2 = torch.ones(4, 8, 16, dtype=torch.bfloat16, device=dev)
    plan = moe_plan(torch.zeros(3 * W, 2, dtype=torch.int64, device=dev), W, world.rank, 4)
    h = torch.ones(plan.rows, 8, dtype=torch.bfloat16, device=dev)
    wts = torch.ones(3, 2, device=dev)
    cases = {
        "too_many": lambda: ag_moe(torch.ones(5, 16, dtype=torch.bfloat16, device=dev), idx, w1, agc),
        "k": lambda: ag_moe(x, torch.zeros(3, 3, dtype=torch.int64, device=dev), w1, agc),
        "experts": lambda: ag_moe(x, idx, w1[:3], agc),
        "w1_dtype": lambda: ag_moe(x, idx, w1.half(), agc),
        "bad_id": lambda: moe_plan(torch.full((3 * W, 2), 4, dtype=torch.int64, device=dev), W, world.rank, 4),
        "h_rows": lambda: moe_rs(h[:-1], plan, w2, wts, rsc),
        "w2_shape": lambda: moe_rs(h, plan, w2[:, :, :8], wts, rsc),
        "weights": lambda: moe_rs(h, plan, w2, wts[:, :1], rsc),
        "ctx_dtype": lambda: create_moe_rs_context(4, 16, 4, 2, torch.float32),
    }
    msgs = error_messages(cases)
    assert int(agc.calls[0]) == 0 and int(rsc.calls[0]) == 0
    return msgs


def tp_moe_rs_gluon(world, dtype, ms, H=40, I_local=72, E=4, k=2, seed=0, used=None, gluon_config=None,
                    twin_equal=True, ar=False):
    """moe_rs (``ar``: moe_ar) of a ``core="gluon"`` context, per ``m`` in ``ms`` (the context reused): h from
    replicated tokens (``plan_gemm``), silu, then the Gluon GEMM's partials (the simulator: its tl twin) through
    the unchanged protocol, against the whole torch MoE layer, and (``twin_equal``) bit for bit against a ``tl``
    context with the twin config.  Returns the calls checked."""
    from ditron.kernels import gemm_hopper as Hh
    from ditron.kernels.moe_tp import (create_moe_ar_context, create_moe_rs_context, moe_ar, moe_plan,
                                       moe_reference, moe_rs, plan_gemm)
    dtype = DTYPES[dtype]
    W, me = world.world_size, world.rank
    used = used or E
    cfg = gluon_config or Hh.DEFAULT_CONFIG
    if ar:
        ctx = create_moe_ar_context(W * max(ms), H, E, k, dtype, core="gluon", gluon_config=gluon_config)
        twin = create_moe_ar_context(W * max(ms), H, E, k, dtype, config=Hh.twin_config(cfg)) if twin_equal else None
    else:
        ctx = create_moe_rs_context(max(ms), H, E, k, dtype, core="gluon", gluon_config=gluon_config)
        twin = create_moe_rs_context(max(ms), H, E, k, dtype, config=Hh.twin_config(cfg)) if twin_equal else None
    w1_full, w2_full = _tp_weights(H, I_local * W, E, dtype, seed)
    w1, w2 = (t.to(world.device) for t in _shards(w1_full, w2_full, me, W))
    done = 0
    for i, m in enumerate(ms):
        ins = [_tp_inputs(s, m, H, E, k, dtype, seed + i, used) for s in range(W)]
        x_all = torch.cat([t[0] for t in ins])
        idx_all = torch.cat([t[1] for t in ins])
        w_all = torch.cat([t[2] for t in ins])
        plan = moe_plan(idx_all.to(world.device), W, me, E)
        a = _silu(plan_gemm(x_all.to(world.device), w1, plan).float()).to(dtype)
        ref = moe_reference(x_all, idx_all, w_all, w1_full, w2_full, _silu)
        if ar:
            out = moe_ar(a, plan, w2, w_all.to(world.device), ctx)
        else:
            ref = ref[me * m:(me + 1) * m]
            out = moe_rs(a, plan, w2, w_all[me * m:(me + 1) * m].to(world.device), ctx)
        _check(out, ref, f"gluon moe_{'ar' if ar else 'rs'} call {i} m={m} rank={me}")
        done += 1
        if twin is not None:
            got = (moe_ar(a, plan, w2, w_all.to(world.device), twin) if ar else
                   moe_rs(a, plan, w2, w_all[me * m:(me + 1) * m].to(world.device), twin))
            assert torch.equal(out, got), f"gluon moe_rs call {i} m={m} rank={me}: not bitwise the tl twin's"
            done += 1
    return done


def tp_moe_gluon_errors(world):
    from ditron.kernels import gemm_hopper as Hh
    from ditron.kernels.gemm import GemmConfig
    from ditron.kernels.moe_tp import create_moe_rs_context, moe_plan, moe_rs
    W = world.world_size
    dev = world.device
    rsc = create_moe_rs_context(4, 16, 4, 2, torch.bfloat16, core="gluon")
    plan = moe_plan(torch.zeros(3 * W, 2, dtype=torch.int64, device=dev), W, world.rank, 4)
    h12 = torch.ones(plan.rows, 12, dtype=torch.bfloat16, device=dev)
    w2_12 = torch.ones(4, 12, 16, dtype=torch.bfloat16, device=dev)
    wts = torch.ones(3, 2, device=dev)
    cases = {
        "core": lambda: create_moe_rs_context(4, 16, 4, 2, torch.bfloat16, core="cublas"),
        "pingpong": lambda: create_moe_rs_context(4, 16, 4, 2, torch.bfloat16, core="gluon",
                                                  gluon_config=Hh.HopperGemmConfig(128, 128, 64, mode="pingpong")),
        "config": lambda: create_moe_rs_context(4, 16, 4, 2, torch.bfloat16, core="gluon",
                                                config=GemmConfig(16, 16, 16)),
        "gluon_config_tl": lambda: create_moe_rs_context(4, 16, 4, 2, torch.bfloat16,
                                                         gluon_config=Hh.DEFAULT_CONFIG),
        "hidden": lambda: create_moe_rs_context(4, 12, 4, 2, torch.bfloat16, core="gluon"),
        "h_rows": lambda: moe_rs(h12, plan, w2_12, wts, rsc),
    }
    msgs = error_messages(cases)
    assert int(rsc.calls[0]) == 0
    return msgs


# ---------------------------------------------------------------------------
# grouped_gemm(core="gluon") (kernels/moe_hopper.py): the Gluon Hopper kernel on GPUs, its tl twin on the simulator
# ---------------------------------------------------------------------------

def grouped_gemm_gluon_cases(world, dtype, cases, K, N, seed=0, gluon_config=None, twin_equal=True):
    """Each case (per-expert counts) through ``core="gluon"`` against the fp32 reference, rows past
    ``sum(counts)`` untouched, and (``twin_equal``) bit for bit against the tl twin (``core="tl"`` with
    ``gemm_hopper.twin_config``): on the simulator both run the twin; on a Hopper GPU the Gluon kernel.
    Returns the number of checks."""
    from ditron.kernels import gemm_hopper as H
    dtype = DTYPES[dtype]
    cfg = gluon_config or H.DEFAULT_CONFIG
    done = 0
    for i, counts in enumerate(cases):
        E, M = len(counts), max(0, sum(max(c, 0) for c in counts))
        rows = M + 5                                     # rows past sum(counts) must stay untouched
        a = _rand_of(world.rank, (rows, K), dtype, seed + i).to(world.device)
        w = _rand_of(world.rank, (E, K, N), dtype, seed + i, salt=1).to(world.device)
        c = torch.tensor(counts, dtype=torch.int32 if i % 2 else torch.int64, device=world.device)
        out = torch.full((rows, N), -7.0, dtype=dtype, device=world.device)
        got = grouped_gemm(a, w, c, out=out, config=gluon_config, core="gluon")
        assert got is out
        ref = grouped_gemm_reference(a.cpu(), w.cpu(), c.cpu())
        if M:
            _check(out[:M], ref[:M], f"gluon case {i} counts={counts}")
        assert bool((out[M:] == -7.0).all()), f"gluon case {i}: rows past sum(counts) were written"
        done += 1
        if twin_equal:
            twin = torch.full((rows, N), -7.0, dtype=dtype, device=world.device)
            grouped_gemm(a, w, c, out=twin, config=H.twin_config(cfg), core="tl")
            assert torch.equal(out, twin), f"gluon case {i} counts={counts}: not bitwise the tl twin's"
            done += 1
    return done


def grouped_gemm_gluon_errors(world):
    from ditron.kernels.gemm import GemmConfig
    a = torch.ones(5, 16, dtype=torch.bfloat16, device=world.device)
    w = torch.ones(3, 16, 8, dtype=torch.bfloat16, device=world.device)
    c = torch.tensor([2, 0, 3], device=world.device)
    idx = torch.arange(5, device=world.device)
    f8 = torch.ones(5, 16, device=world.device).to(torch.float8_e4m3fn)
    w8 = torch.ones(3, 16, 8, device=world.device).to(torch.float8_e4m3fn)
    s_a = torch.ones(5, 1, device=world.device)
    s_w = torch.ones(3, 1, 1, device=world.device)
    wide = torch.ones(3, 16, 16, dtype=torch.bfloat16, device=world.device)
    cases = {
        "core": lambda: grouped_gemm(a, w, c, core="cublas"),
        "gather": lambda: grouped_gemm(a, w, c, gather_idx=idx, core="gluon"),
        "fp8": lambda: grouped_gemm(f8, w8, c, scale_a=s_a, scale_w=s_w, core="gluon"),
        "config": lambda: grouped_gemm(a, w, c, config=GemmConfig(16, 16, 16), core="gluon"),
        "w_layout": lambda: grouped_gemm(a, wide[:, :8].transpose(1, 2)[:, :, :8], c, core="gluon"),
        "a_rows": lambda: grouped_gemm(torch.ones(5, 12, dtype=torch.bfloat16, device=world.device),
                                       torch.ones(3, 12, 8, dtype=torch.bfloat16, device=world.device), c,
                                       core="gluon"),
    }
    return error_messages(cases)
