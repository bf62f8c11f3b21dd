"""Test bodies (run on every rank; see conftest.py) for the attention zoo
(kernels/attention.py).  Every rank builds the same whole-sequence Q, K, V
from a seed, computes ``scaled_dot_product_attention`` on them, and checks
its own shard of the kernel's output (and LSE) against the matching rows."""
import math

import torch

import ditron
import importlib

A = importlib.import_module("ditron.kernels.attention")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


def _qkv(B, HQ, HKV, N, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, N, D, generator=g).to(dtype)
    k = torch.randn(B, HKV, N, D, generator=g).to(dtype)
    v = torch.randn(B, HKV, N, D, generator=g).to(dtype)
    return q, k, v


def reference(q, k, v, causal):
    """SDPA in fp32 on the gathered tensors (KV heads repeated for GQA) and the LSE."""
    G = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(G, 1)
    vf = v.float().repeat_interleave(G, 1)
    o = torch.nn.functional.scaled_dot_product_attention(q.float(), kf, vf, is_causal=causal)
    s = q.float() @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return o, torch.logsumexp(s, -1)


def ring_cases(world, cases, config=None, calls=1, plant_no_wait=False, core="tl"):
    """``cases``: (B, Hq, Hkv, S per rank, D, causal, layout, dtype).  One
    context for all of them; every case is run ``calls`` times with fresh
    inputs (context reuse).  Returns the number of checked outputs.
    ``core="gluon"``: the Gluon Hopper core (world size 1 on a Hopper GPU;
    elsewhere returns None without running anything)."""
    if core == "gluon":
        from ditron.kernels import attention_hopper as AH
        if world.world_size != 1 or not AH.supported(world.device):
            return None
    W, r = world.world_size, world.rank
    maxb = max(c[0] * c[2] for c in cases)
    ctx = A.create_ring_attention_context(1, max(c[3] for c in cases), maxb, max(c[4] for c in cases),
                                          DTYPES[cases[0][7]])
    checked = 0
    for i, (B, HQ, HKV, S, D, causal, layout, dt) in enumerate(cases):
        dtype = DTYPES[dt]
        if dtype != ctx.dtype or D != ctx.head_dim:
            ctx = A.create_ring_attention_context(1, S, maxb, D, dtype)
        for call in range(calls):
            q, k, v = _qkv(B, HQ, HKV, S * W, D, dtype, 1000 * i + call)
            o_ref, lse_ref = reference(q, k, v, causal)
            sh = [A.shard(t, r, W, layout).to(world.device) for t in (q, k, v)]
            out, lse = A.ring_attention(*sh, ctx, causal=causal, layout=layout, config=config, return_lse=True,
                                        _plant_no_wait=plant_no_wait, core=core)
            what = f"rank {r}/{W} case {(B, HQ, HKV, S, D, causal, layout, dt)} call {call}"
            torch.testing.assert_close(out.float().cpu(), A.shard(o_ref, r, W, layout), rtol=TOL[dtype],
                                       atol=TOL[dtype], msg=lambda m: f"{what}: out: {m}")
            torch.testing.assert_close(lse.cpu(), A.shard(lse_ref, r, W, layout), rtol=1e-3, atol=1e-3,
                                       msg=lambda m: f"{what}: lse: {m}")
            checked += 1
    return checked


def errors(world):
    """Clear errors before launch; returns the messages."""
    ctx = A.create_ring_attention_context(1, 8, 2, 16, torch.float16)
    dev = world.device
    q = torch.zeros(1, 4, 8, 16, dtype=torch.float16, device=dev)
    k = torch.zeros(1, 2, 8, 16, dtype=torch.float16, device=dev)
    msgs = {}

    def grab(key, fn):
        try:
            fn()
        except ditron.DitronError as e:
            msgs[key] = str(e)

    grab("gqa", lambda: A.ring_attention(q, k[:, :1].expand(1, 3, 8, 16).contiguous(), k[:, :1].expand(1, 3, 8, 16)
                                         .contiguous(), ctx))
    grab("dtype", lambda: A.ring_attention(q.float(), k.float(), k.float(), ctx))
    grab("too_long", lambda: A.ring_attention(torch.zeros(1, 4, 9, 16, dtype=torch.float16, device=dev),
                                              torch.zeros(1, 2, 9, 16, dtype=torch.float16, device=dev),
                                              torch.zeros(1, 2, 9, 16, dtype=torch.float16, device=dev), ctx))
    grab("layout", lambda: A.ring_attention(q, k, k, ctx, layout="striped"))
    grab("head_dim", lambda: A.create_ring_attention_context(1, 8, 2, 24, torch.float16))
    grab("shape", lambda: A.ring_attention(q, k[:, :, :4].contiguous(), k[:, :, :4].contiguous(), ctx))
    grab("core", lambda: A.ring_attention(q, k, k, ctx, core="cudnn"))
    grab("gluon_config", lambda: A.ring_attention(q, k, k, ctx, core="gluon", config=A.SIM_CONFIG))
    if ctx.sim:
        # the Gluon core is refused on the simulator, naming the tl core (head_dim 64: a shape it takes)
        ctx64 = A.create_ring_attention_context(1, 8, 2, 64, torch.float16)
        q64 = torch.zeros(1, 4, 8, 64, dtype=torch.float16, device=dev)
        k64 = torch.zeros(1, 2, 8, 64, dtype=torch.float16, device=dev)
        grab("gluon_sim", lambda: A.ring_attention(q64, k64, k64, ctx64, core="gluon"))
        grab("gluon_head_dim", lambda: A.ring_attention(q, k, k, ctx, core="gluon"))
    fctx = FD.create_flash_decode_context(1, 4, 2, 16, torch.float16)
    lens = torch.full((1,), 8, dtype=torch.int32, device=dev)
    grab("fuse_splits", lambda: FD.flash_decode(q[:, :, 0].contiguous(), k, k, lens, fctx,
                                                splits=FD.FUSE_MAX_SPLITS + 1, fuse_combine=True))
    return msgs


FD = importlib.import_module("ditron.kernels.flash_decode")


def _fd_inputs(B, HQ, HKV, cap, D, W, dtype, seed):
    """Every rank's cache (ragged lengths per sequence and rank, some 0) and the query."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, D, generator=g).to(dtype)
    ks = [torch.randn(B, HKV, cap, D, generator=g).to(dtype) for _ in range(W)]
    vs = [torch.randn(B, HKV, cap, D, generator=g).to(dtype) for _ in range(W)]
    lens = torch.randint(0, cap + 1, (W, B), generator=g, dtype=torch.int32)
    lens[seed % W, lens.sum(0) == 0] = 1         # every sequence has a key somewhere
    return q, ks, vs, lens


def flash_decode_cases(world, cases, calls=1, plant_no_wait=False, **tuning):
    """``cases``: (B, Hq, Hkv, cap per rank, D, dtype); against SDPA on every
    sequence's keys of all ranks concatenated.  Returns the checked count."""
    W, r = world.world_size, world.rank
    checked = 0
    for i, (B, HQ, HKV, cap, D, dt) in enumerate(cases):
        dtype = DTYPES[dt]
        ctx = FD.create_flash_decode_context(B, HQ, HKV, D, dtype)
        for call in range(calls):
            q, ks, vs, lens = _fd_inputs(B, HQ, HKV, cap, D, W, dtype, 100 * i + call)
            dev = world.device
            out, lse = FD.flash_decode(q.to(dev), ks[r].to(dev), vs[r].to(dev), lens[r].to(dev), ctx,
                                       return_lse=True, _plant_no_wait=plant_no_wait, **tuning)
            for b in range(B):
                kk = torch.cat([ks[s][b:b + 1, :, :int(lens[s, b])] for s in range(W)], 2)
                vv = torch.cat([vs[s][b:b + 1, :, :int(lens[s, b])] for s in range(W)], 2)
                o_ref, lse_ref = reference(q[b:b + 1, :, None], kk, vv, False)
                what = f"rank {r}/{W} case {(B, HQ, HKV, cap, D, dt)} call {call} seq {b} lens {lens[:, b].tolist()}"
                torch.testing.assert_close(out[b].float().cpu(), o_ref[0, :, 0], rtol=TOL[dtype], atol=TOL[dtype],
                                           msg=lambda m: f"{what}: out: {m}")
                torch.testing.assert_close(lse[b].cpu(), lse_ref[0, :, 0], rtol=1e-3, atol=1e-3,
                                           msg=lambda m: f"{what}: lse: {m}")
            checked += 1
    return checked


U = importlib.import_module("ditron.kernels.ulysses")


def ulysses_check(world, S, hidden, HQ, HKV, D, causal, dt, calls=1, plant_no_wait=False):
    """Ulysses (QKV GEMM + A2A, attention, A2A + o_proj) against the same
    layer in fp32 torch on the gathered sequence (the q / k / v and attention
    outputs rounded to the dtype like the kernels' intermediates)."""
    W, r = world.world_size, world.rank
    dtype = DTYPES[dt]
    ctx = U.create_ulysses_context(S, hidden, HQ, HKV, D, dtype)
    for call in range(calls):
        g = torch.Generator().manual_seed(500 + call)
        x = (torch.randn(W * S, hidden, generator=g) * 0.5).to(dtype)
        wqkv = (torch.randn(hidden, (HQ + 2 * HKV) * D, generator=g) / hidden ** 0.5).to(dtype)
        wo = (torch.randn(HQ * D, hidden, generator=g) / (HQ * D) ** 0.5).to(dtype)
        y = U.ulysses_attention(x[r * S:(r + 1) * S].contiguous().to(world.device), wqkv.to(world.device),
                                wo.to(world.device), ctx, causal=causal, _plant_no_wait=plant_no_wait)
        qkv = (x.float() @ wqkv.float()).to(dtype).float()
        q = qkv[:, :HQ * D].view(W * S, HQ, D).transpose(0, 1)[None]
        k = qkv[:, HQ * D:(HQ + HKV) * D].view(W * S, HKV, D).transpose(0, 1)[None]
        v = qkv[:, (HQ + HKV) * D:].view(W * S, HKV, D).transpose(0, 1)[None]
        o, _ = reference(q, k, v, causal)
        ref = o.to(dtype).float()[0].transpose(0, 1).reshape(W * S, HQ * D) @ wo.float()
        ref = ref[r * S:(r + 1) * S]
        tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
        torch.testing.assert_close(y.float().cpu(), ref, rtol=tol, atol=tol,
                                   msg=lambda m: f"rank {r}/{W} ulysses S={S} causal={causal} call {call}: {m}")
    return calls


def ulysses_error(world, HQ, HKV):
    try:
        U.create_ulysses_context(8, 16, HQ, HKV, 16, torch.bfloat16)
    except ditron.DitronError as e:
        return str(e)
    return None
