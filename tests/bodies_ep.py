"""Test bodies (run on every rank; see conftest.py) for EP dispatch / combine
(kernels/ep.py), normal and low-latency, against plain torch: every rank
rebuilds every rank's seeded tokens and routing, checks the rows its experts
received (exact copies, in the documented order) and the combined output
(fp32 reference).  Simulated ranks in CI, GPUs under torchrun."""
import torch

import ditron
from ditron.kernels.ep import check_dropped, create_ep_context, ep_combine, ep_dispatch

from bodies_ag_gemm import _check, _rand_of, error_messages

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def routing(rank, T, k, E, seed, kind):
    """``topk_idx [T, k]`` (int64) and ``topk_weights [T, k]`` (fp32) of ``rank``.
    ``kind``: ``"uniform"`` (distinct experts per token), ``"skewed"`` (most
    pairs on the first experts, the last half of the experts never chosen,
    some slots -1), ``"dup"`` (repeated experts inside a token)."""
    g = torch.Generator().manual_seed(7919 * seed + 31 * rank + 5)
    if kind == "uniform":
        idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else \
            torch.empty(0, k, dtype=torch.int64)
    elif kind == "skewed":
        hot = max(1, E // 2)
        idx = torch.minimum(torch.randint(0, hot, (T, k), generator=g),
                            torch.randint(0, hot, (T, k), generator=g))
        idx[torch.rand(T, k, generator=g) < 0.2] = -1
    else:
        idx = torch.randint(0, E, (T, k), generator=g)
    w = torch.rand(T, k, generator=g) + 0.1
    return idx.to(torch.int64), w


def expert_fn(e, v):
    """The 'expert MLP' of the tests: a different affine map per global expert."""
    return v * (0.5 + 0.25 * (e % 5)) + 0.125 * (e % 3)


def _inputs(world, r, tokens, H, k, E, dtype, seed, kind):
    T = tokens[r % len(tokens)]
    x = _rand_of(r, (T, H), dtype, seed)
    idx, w = routing(r, T, k, E, seed, kind)
    return x, idx, w


def _expected_recv(world, tokens, H, k, E, dtype, seed, kind, cap=None):
    """Per local expert of this rank: the rows it must receive, in order, and
    every rank's delivered-pair mask (pairs over ``cap`` are not delivered)."""
    W = world.world_size
    El = E // W
    rows = [[] for _ in range(El)]
    keep = []
    for s in range(W):
        x, idx, _ = _inputs(world, s, tokens, H, k, E, dtype, seed, kind)
        flat = idx.reshape(-1)
        kp = torch.zeros(flat.numel(), dtype=torch.bool)
        for e in range(E):
            pairs = (flat == e).nonzero().flatten()
            if cap is not None:
                pairs = pairs[:cap]
            kp[pairs] = True
            if e // El == world.rank:
                rows[e % El].extend(x[int(p) // k] for p in pairs)
        keep.append(kp.reshape(idx.shape))
    return rows, keep


def _expert_outputs(recv_x, recv_counts, rank, El, mode):
    """y: expert_fn applied to every received row (the test's expert MLP)."""
    y = torch.zeros_like(recv_x)
    counts = recv_counts.cpu().tolist()
    off = 0
    for l, c in enumerate(counts):
        e = rank * El + l
        if mode == "normal":
            y[off:off + c] = expert_fn(e, recv_x[off:off + c].float()).to(y.dtype)
            off += c
        else:
            y[l, :c] = expert_fn(e, recv_x[l, :c].float()).to(y.dtype)
    return y


def ep_rounds(world, mode, dtype, tokens, H=24, k=2, experts_per_rank=2, seed=0, kind="uniform", rounds=2,
              capacity=None, validate=True, tune=None):
    """``rounds`` dispatch -> expert -> combine rounds on one context (reuse),
    with fresh inputs per round; rank ``r`` has ``tokens[r % len(tokens)]``
    tokens (0: a rank that sends nothing).  Returns the pairs delivered to
    this rank over all rounds."""
    dtype = DTYPES[dtype]
    W = world.world_size
    E = experts_per_rank * W
    El = experts_per_rank
    ctx = create_ep_context(max(max(tokens), 1), H, E, k, dtype, mode=mode, capacity=capacity)
    for name, v in (tune or {}).items():          # the context's tuning attributes (e.g. ll_strided)
        setattr(ctx, name, v)
    received = 0
    for rnd in range(rounds):
        sd = seed + 101 * rnd
        x, idx, w = _inputs(world, world.rank, tokens, H, k, E, dtype, sd, kind)
        recv_x, recv_counts, handle = ep_dispatch(x.to(world.device), idx.to(world.device), w.to(world.device), ctx,
                                                  validate=validate)
        exp_rows, keep = _expected_recv(world, tokens, H, k, E, dtype, sd, kind, ctx.capacity if mode != "normal"
                                        else None)
        counts = recv_counts.cpu().tolist()
        assert counts == [len(r) for r in exp_rows], (rnd, counts, [len(r) for r in exp_rows])
        got = recv_x.cpu()
        off = 0
        for l, rows in enumerate(exp_rows):
            if rows:
                ref = torch.stack(rows)
                part = got[off:off + len(rows)] if mode == "normal" else got[l, :len(rows)]
                assert torch.equal(part, ref), f"round {rnd}: rows of local expert {l} on rank {world.rank}"
            off += len(rows)
        received += sum(counts)
        y = _expert_outputs(recv_x, recv_counts, world.rank, El, mode)
        out = ep_combine(y, handle, ctx)
        x_me, idx_me, w_me = _inputs(world, world.rank, tokens, H, k, E, dtype, sd, kind)
        w_ref = torch.where(keep[world.rank], w_me, 0.0)
        # the reference sees the expert outputs rounded to the dtype, as the kernel does
        fn = (lambda e, v: expert_fn(e, v).to(dtype).float())
        from ditron.kernels.ep import ep_reference
        ref = ep_reference(x_me, idx_me, w_ref, fn, E)
        assert out.shape == x_me.shape and out.dtype == dtype
        if out.numel():
            _check(out, ref, f"round {rnd} combine on rank {world.rank}")
        dropped = handle.dropped.cpu().tolist()
        exp_over = int((~keep[world.rank] & (idx_me >= 0)).sum())
        assert dropped == [0, exp_over], (dropped, exp_over)
    return received


def overflow_report(world, H=8, k=2):
    """LL capacity 1 with every pair of every rank on expert 0: all but the
    first pair of each rank are dropped, counted and reported."""
    W = world.world_size
    ctx = create_ep_context(4, H, W, k, torch.bfloat16, mode="low_latency", capacity=1)
    x = _rand_of(world.rank, (4, H), torch.bfloat16, 3).to(world.device)
    idx = torch.zeros(4, k, dtype=torch.int64, device=world.device)
    w = torch.ones(4, k, device=world.device)
    recv_x, recv_counts, handle = ep_dispatch(x, idx, w, ctx)
    n_dropped = int(handle.dropped[1])
    try:
        check_dropped(handle)
        msg = None
    except ditron.DitronError as e:
        msg = str(e)
    y = recv_x.clone()
    out = ep_combine(y, handle, ctx)
    # only token 0's slot 0 was delivered: out[0] = x[0], the others 0
    ref = torch.zeros(4, H)
    ref[0] = x[0].float().cpu()
    _check(out, ref, "overflow combine")
    return n_dropped, msg, recv_counts.cpu().tolist()


def invalid_ids(world, H=8, k=2):
    """An id out of range: an error before launch with ``validate=True``;
    dropped and counted with ``validate=False``."""
    W = world.world_size
    E = 2 * W
    ctx = create_ep_context(3, H, E, k, torch.float16)
    x = _rand_of(world.rank, (3, H), torch.float16, 5).to(world.device)
    idx = torch.tensor([[0, 1], [E, 1], [-1, E - 1]], device=world.device)      # E - 1: the last rank's expert
    w = torch.ones(3, k, device=world.device)
    msgs = error_messages({"validate": lambda: ep_dispatch(x, idx, w, ctx)})
    assert int(ctx.calls[0]) == 0
    recv_x, recv_counts, handle = ep_dispatch(x, idx, w, ctx, validate=False)
    out = ep_combine(recv_x, handle, ctx)           # identity experts
    ref = x.float().cpu().clone()
    ref[0] *= 2                                     # pairs (0, 0) and (0, 1)
    ref[2] *= 1                                     # (2, 1) only; (1, 0) dropped, (1, 1) kept
    _check(out, ref, "invalid ids dropped")
    msgs["dropped"] = handle.dropped.cpu().tolist()
    try:
        check_dropped(handle)
    except ditron.DitronError as e:
        msgs["report"] = str(e)
    return msgs


def errors(world):
    W = world.world_size
    ctx = create_ep_context(4, 16, 2 * W, 2, torch.bfloat16)
    x = torch.ones(3, 16, dtype=torch.bfloat16, device=world.device)
    idx = torch.zeros(3, 2, dtype=torch.int64, device=world.device)
    w = torch.ones(3, 2, device=world.device)
    cases = {
        "too_many": lambda: ep_dispatch(torch.ones(5, 16, dtype=torch.bfloat16, device=world.device),
                                        torch.zeros(5, 2, dtype=torch.int64, device=world.device),
                                        torch.ones(5, 2, device=world.device), ctx),
        "hidden": lambda: ep_dispatch(x[:, :8], idx, w, ctx),
        "x_dtype": lambda: ep_dispatch(x.half(), idx, w, ctx),
        "k": lambda: ep_dispatch(x, torch.zeros(3, 3, dtype=torch.int64, device=world.device), w, ctx),
        "idx_dtype": lambda: ep_dispatch(x, idx.float(), w, ctx),
        "w_shape": lambda: ep_dispatch(x, idx, w[:, :1], ctx),
        "w_dtype": lambda: ep_dispatch(x, idx, w.double(), ctx),
        "experts": lambda: create_ep_context(4, 16, 2 * W + 1, 2, torch.bfloat16) if W > 1 else
        create_ep_context(4, 16, 0, 2, torch.bfloat16),
        "mode": lambda: create_ep_context(4, 16, 2 * W, 2, torch.bfloat16, mode="fast"),
        "y_shape": lambda: ep_combine(torch.ones(2, 16, dtype=torch.bfloat16, device=world.device),
                                      ep_dispatch(x, idx, w, ctx)[2], ctx),
    }
    return error_messages(cases)


def ep_graph_replay(world, mode, T=64, H=4104, k=4, experts_per_rank=4, replays=3):
    """GPUs: one dispatch -> (identity experts) -> combine round captured in a
    CUDA graph (``validate=False``: nothing read back), replayed with fresh
    inputs copied into the captured tensors; every replay checked."""
    W = world.world_size
    E = experts_per_rank * W
    dev = world.device
    ctx = create_ep_context(T, H, E, k, torch.bfloat16, mode=mode, capacity=T)
    x_s = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    idx_s = torch.empty(T, k, dtype=torch.int64, device=dev)
    w_s = torch.empty(T, k, dtype=torch.float32, device=dev)

    def load(rnd):
        x, idx, w = _inputs(world, world.rank, (T,), H, k, E, torch.bfloat16, 50 + rnd, "uniform")
        x_s.copy_(x)
        idx_s.copy_(idx)
        w_s.copy_(w)
        return x, w

    def step():
        recv_x, _, handle = ep_dispatch(x_s, idx_s, w_s, ctx, validate=False)
        return ep_combine(recv_x, handle, ctx)

    load(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()                                   # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    for rnd in range(1, replays + 1):
        x, w = load(rnd)
        g.replay()
        torch.cuda.synchronize()
        _check(out, x.float() * w.sum(1, keepdim=True), f"replay {rnd} on rank {world.rank}")
    return replays


def ep_fp8_rounds(world, tokens, H=128, k=2, experts_per_rank=2, seed=0, kind="uniform", rounds=2, capacity=None,
                  round_scale=False, dtype="bf16", tune=None):
    """Low-latency dispatch with ``use_fp8=True`` -> experts on the
    dequantised rows -> bf16 combine, ``rounds`` times on one context (fp8
    and bf16 dispatches alternate from round 1 on: the slots' two payloads).
    Checks: the codes and scales every local expert received are exactly
    ``fp8_quantize_reference`` of the expected rows (in order), the scales
    are column-major as DeepEP's, the round trip ``dequant(quant(x))`` is
    within e4m3's bound, and the combine matches torch on the dequantised
    rows and the exact ``x`` within the fp8 bound.  Returns the pairs
    received."""
    from ditron.kernels.ep import ep_reference, fp8_dequantize, fp8_quantize_reference
    dt = DTYPES[dtype]
    W = world.world_size
    E = experts_per_rank * W
    El = experts_per_rank
    ctx = create_ep_context(max(max(tokens), 1), H, E, k, dt, mode="low_latency", capacity=capacity)
    for name, v in (tune or {}).items():          # the context's tile attributes (e.g. a GPU's, on the simulator)
        setattr(ctx, name, v)
    received = 0
    for rnd in range(rounds):
        fp8 = rnd % 2 == 0 or rounds == 1
        sd = seed + 101 * rnd
        x, idx, w = _inputs(world, world.rank, tokens, H, k, E, dt, sd, kind)
        recv, recv_counts, handle = ep_dispatch(x.to(world.device), idx.to(world.device), w.to(world.device), ctx,
                                                use_fp8=fp8, round_scale=round_scale and fp8)
        exp_rows, keep = _expected_recv(world, tokens, H, k, E, dt, sd, kind, ctx.capacity)
        counts = recv_counts.cpu().tolist()
        assert counts == [len(r) for r in exp_rows], (rnd, counts)
        if fp8:
            codes, scales = recv
            N = W * ctx.capacity
            assert codes.dtype == torch.float8_e4m3fn and tuple(codes.shape) == (El, N, H)
            assert scales.dtype == torch.float32 and tuple(scales.shape) == (El, N, H // 128)
            assert scales.stride() == (N * (H // 128), 1, N), scales.stride()
            codes, scales = codes.cpu(), scales.cpu()
            deq = torch.zeros(El, N, H)
            for l, rows in enumerate(exp_rows):
                if rows:
                    ref = torch.stack(rows)
                    rc, rs = fp8_quantize_reference(ref, round_scale)
                    n = len(rows)
                    assert torch.equal(codes[l, :n].view(torch.uint8), rc.view(torch.uint8)), \
                        f"round {rnd}: e4m3 codes of local expert {l} on rank {world.rank}"
                    assert torch.equal(scales[l, :n], rs), f"round {rnd}: scales of local expert {l}"
                    deq[l, :n] = fp8_dequantize(codes[l, :n], scales[l, :n])
                    # the round trip: e4m3 keeps 3 mantissa bits (relative 2^-4), subnormals 2^-9 of the scale
                    bound = ref.float().abs() * 2 ** -4 * (2 if round_scale else 1) + \
                        rs.repeat_interleave(128, 1) * 2 ** -9
                    assert ((deq[l, :n] - ref.float()).abs() <= bound).all(), f"round {rnd}: round-trip error"
            y = torch.zeros(El, N, H, dtype=dt)
            for l, c in enumerate(counts):
                y[l, :c] = expert_fn(world.rank * El + l, deq[l, :c]).to(dt)
        else:
            y = _expert_outputs(recv.cpu(), recv_counts, world.rank, El, "low_latency")
        received += sum(counts)
        out = ep_combine(y.to(world.device), handle, ctx)
        x_me, idx_me, w_me = _inputs(world, world.rank, tokens, H, k, E, dt, sd, kind)
        w_ref = torch.where(keep[world.rank], w_me, 0.0)
        fn = (lambda e, v: expert_fn(e, v).to(dt).float())
        if fp8:
            qc, qs = fp8_quantize_reference(x_me, round_scale) if x_me.numel() else (None, None)
            x_deq = fp8_dequantize(qc, qs) if x_me.numel() else x_me.float()
            ref = ep_reference(x_deq, idx_me, w_ref, fn, E)
            exact = ep_reference(x_me, idx_me, w_ref, lambda e, v: expert_fn(e, v), E)
            if out.numel():
                _check(out, ref, f"round {rnd} fp8 combine on rank {world.rank}")
                err = (out.float().cpu() - exact).abs().max().item()
                assert err <= 0.15 * exact.abs().max().item() + 1e-2, f"round {rnd}: fp8 round trip error {err}"
        else:
            ref = ep_reference(x_me, idx_me, w_ref, fn, E)
            if out.numel():
                _check(out, ref, f"round {rnd} bf16 combine on rank {world.rank}")
    return received


def fp8_errors(world):
    """use_fp8 misuse: an error before launch."""
    W = world.world_size
    dev = world.device
    ll = create_ep_context(4, 72, 2 * W, 2, torch.bfloat16, mode="low_latency")
    nm = create_ep_context(4, 128, 2 * W, 2, torch.bfloat16)
    x72 = torch.ones(2, 72, dtype=torch.bfloat16, device=dev)
    x = torch.ones(2, 128, dtype=torch.bfloat16, device=dev)
    idx = torch.zeros(2, 2, dtype=torch.int64, device=dev)
    w = torch.ones(2, 2, device=dev)
    return error_messages({
        "hidden": lambda: ep_dispatch(x72, idx, w, ll, use_fp8=True),
        "normal": lambda: ep_dispatch(x, idx, w, nm, use_fp8=True),
        "round": lambda: ep_dispatch(x72, idx, w, ll, round_scale=True),
    })
