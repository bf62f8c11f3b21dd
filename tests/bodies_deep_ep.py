"""Test bodies for ditron.deep_ep (DeepEP's interface on ditron's EP kernels), driven the way SGLang's DeepEP
dispatcher drives ``deep_ep.Buffer`` (python/sglang/srt/layers/moe/token_dispatcher/deepep.py): low latency
(``low_latency_dispatch`` with ``use_fp8`` and ``async_finish`` / ``return_recv_hook``, the hook or the event,
experts, ``low_latency_combine``) and normal (``get_dispatch_layout``, ``dispatch`` with the layout, experts,
``combine`` with the handle).  Each result is compared with ditron's own API (kernels/ep.py) on the same inputs
and with a torch reference that every rank computes from every rank's regenerated inputs."""
import torch

import ditron
import ditron.deep_ep as deep_ep
from ditron.kernels.ep import (create_ep_context, ep_combine, ep_dispatch, ep_reference, fp8_dequantize,
                               fp8_quantize_reference)

from bodies_ag_gemm import _check, _rand_of, error_messages
from bodies_ep import expert_fn


def _routing(rank, T, k, E, seed, holes=True):
    """SGLang-style top-k: distinct experts per token, a few -1 slots."""
    g = torch.Generator().manual_seed(9173 * seed + 131 * rank + 3)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else \
        torch.empty(0, k, dtype=torch.int64)
    if holes and T:
        idx[torch.rand(T, k, generator=g) < 0.15] = -1
    w = torch.rand(T, k, generator=g) + 0.1
    return idx.to(torch.int64), w


def _inputs(rank, tokens, H, k, E, seed):
    T = tokens[rank % len(tokens)]
    x = _rand_of(rank, (T, H), torch.bfloat16, seed)
    idx, w = _routing(rank, T, k, E, seed)
    return x, idx, w


def _experts_ll(recv, counts, rank, El, fp8):
    """The experts of a low-latency dispatch: expert_fn on every received row (dequantised if fp8), bf16."""
    if fp8:
        codes, scales = recv
        rows = fp8_dequantize(codes.cpu(), scales.cpu())
    else:
        rows = recv.cpu().float()
    y = torch.zeros(rows.shape, dtype=torch.bfloat16)
    for l, c in enumerate(counts.cpu().tolist()):
        y[l, :c] = expert_fn(rank * El + l, rows[l, :c]).to(torch.bfloat16)
    return y


def low_latency(world, tokens, H=128, k=2, experts_per_rank=2, seed=0, rounds=2):
    """SGLang's low-latency path, bf16 and fp8 payloads, event and hook modes, zero-copy combine; against
    ditron's ep_dispatch / ep_combine on a context of the same sizes and against torch.  Returns the pairs
    received."""
    W, me, dev = world.world_size, world.rank, world.device
    E, El = experts_per_rank * W, experts_per_rank
    M = max(tokens)
    buffer = deep_ep.Buffer(None, 0, deep_ep.Buffer.get_low_latency_rdma_size_hint(M, H, W, E),
                            low_latency_mode=True, num_qps_per_rank=El)
    own = create_ep_context(M, H, E, k, torch.bfloat16, mode="low_latency", capacity=M)
    stats = torch.zeros(El, dtype=torch.int32, device=dev)
    received = 0
    modes = [(fp8, hook, zc) for fp8, hook, zc in ((True, False, False), (False, True, False), (True, True, True),
                                                   (False, False, True))][:max(2, rounds)]
    for rnd, (use_fp8, return_recv_hook, zero_copy) in enumerate(modes):
        sd = seed + 17 * rnd
        x, idx, w = _inputs(me, tokens, H, k, E, sd)
        xd, idxd, wd = x.to(dev), idx.to(dev), w.to(dev)
        # dispatch_a / dispatch_b as SGLang
        recv, recv_count, handle, event, hook = buffer.low_latency_dispatch(
            xd, idxd, M, E, cumulative_local_expert_recv_stats=stats, use_fp8=use_fp8,
            async_finish=not return_recv_hook, return_recv_hook=return_recv_hook)
        hook() if return_recv_hook else event.current_stream_wait()
        assert recv_count.dtype == torch.int32 and tuple(recv_count.shape) == (El,)
        # ditron's own API on the same inputs
        r2, c2, h2 = ep_dispatch(xd, idxd, wd, own, use_fp8=use_fp8)
        assert recv_count.cpu().tolist() == c2.cpu().tolist()
        counts = recv_count.cpu().tolist()
        received += sum(counts)
        if use_fp8:
            assert recv[0].dtype == torch.float8_e4m3fn and tuple(recv[0].shape) == (El, W * M, H)
            assert tuple(recv[1].shape) == (El, W * M, H // 128) and recv[1].stride()[1] == 1
            for l, c in enumerate(counts):
                assert torch.equal(recv[0][l, :c].cpu().view(torch.uint8), r2[0][l, :c].cpu().view(torch.uint8))
                assert torch.equal(recv[1][l, :c].cpu(), r2[1][l, :c].cpu())
        else:
            assert recv.dtype == torch.bfloat16 and tuple(recv.shape) == (El, W * M, H)
            for l, c in enumerate(counts):
                assert torch.equal(recv[l, :c].cpu(), r2[l, :c].cpu())
        # the handle: DeepEP's layout_range and sizes
        lr = handle[1].cpu()
        assert tuple(lr.shape) == (El, W) and handle[2:] == (M, H, E)
        assert ((lr & 0xFFFFFFFF).sum(1).tolist()) == counts
        assert ((lr >> 32)[:, 1:] == torch.cumsum(lr & 0xFFFFFFFF, 1)[:, :-1]).all()
        # the rows of every source, checked against the torch quantiser / the inputs
        for s in range(W):
            xs, idxs, _ = _inputs(s, tokens, H, k, E, sd)
            for l in range(El):
                e = me * El + l
                rows = xs[(idxs == e).any(1)]
                b, c = int(lr[l, s] >> 32), int(lr[l, s] & 0xFFFFFFFF)
                assert c == rows.shape[0]
                if use_fp8 and c:
                    qc, qs = fp8_quantize_reference(rows)
                    assert torch.equal(recv[0][l, b:b + c].cpu().view(torch.uint8), qc.view(torch.uint8))
                    assert torch.equal(recv[1][l, b:b + c].cpu(), qs)
                elif c:
                    assert torch.equal(recv[l, b:b + c].cpu(), rows)
        # experts, then combine_a / combine_b as SGLang
        y = _experts_ll(recv, recv_count, me, El, use_fp8).to(dev)
        if zero_copy:
            buffer.get_next_low_latency_combine_buffer(handle).copy_(y)
        combined, event, hook = buffer.low_latency_combine(x=y, topk_idx=idxd, topk_weights=wd, handle=handle,
                                                          async_finish=not return_recv_hook,
                                                          return_recv_hook=return_recv_hook, zero_copy=zero_copy)
        hook() if return_recv_hook else event.current_stream_wait()
        own_out = ep_combine(y, h2, own)
        assert torch.equal(combined.cpu(), own_out.cpu()), "deep_ep combine vs ditron's ep_combine"
        xin = fp8_dequantize(*fp8_quantize_reference(x)) if use_fp8 and x.numel() else x.float()
        ref = ep_reference(xin, idx, w, lambda e, v: expert_fn(e, v).to(torch.bfloat16).float(), E)
        if combined.numel():
            _check(combined, ref, f"round {rnd} low-latency combine on rank {me}")
    total = [0] * El
    # the cumulative stats add every round's counts
    assert stats.cpu().sum().item() == received, (stats, received, total)
    return received


def normal(world, tokens, H=128, k=3, experts_per_rank=3, seed=0, fp8=False, worst=False):
    """SGLang's normal path: get_dispatch_layout, dispatch with the layout (async_finish and previous_event as
    SGLang's async mode), experts on the received tokens, combine with the handle; then a cached dispatch.
    Checks the layout, the received tokens and their order (source rank, then token), recv_topk_idx /
    weights, the per-expert list, the handle, the combined output against torch and against ditron's own
    ep_dispatch / ep_combine."""
    W, me, dev = world.world_size, world.rank, world.device
    E, El = experts_per_rank * W, experts_per_rank
    buffer = deep_ep.Buffer(None, deep_ep.Buffer.get_dispatch_config(W).get_nvl_buffer_size_hint(H * 2, W), 0)
    sd = seed + 5
    x, idx, w = _inputs(me, tokens, H, k, E, sd)
    xd, idxd, wd = x.to(dev), idx.to(dev), w.to(dev)
    prev = deep_ep.Buffer.capture()
    num_tokens_per_rank, rdma, num_tokens_per_expert, is_token_in_rank, prev = buffer.get_dispatch_layout(
        idxd, E, previous_event=prev, async_finish=True, allocate_on_comm_stream=True)
    assert rdma is None
    # the layout against torch
    valid = idx >= 0
    ranks = torch.where(valid, idx // El, -1)
    in_rank = torch.stack([(ranks == r).any(1) for r in range(W)], 1) if idx.shape[0] else \
        torch.zeros(0, W, dtype=torch.bool)
    assert torch.equal(is_token_in_rank.cpu(), in_rank)
    assert num_tokens_per_rank.cpu().tolist() == in_rank.sum(0).tolist()
    assert num_tokens_per_expert.cpu().tolist() == [int((idx == e).sum()) for e in range(E)]
    if fp8:
        send = fp8_quantize_reference(x) if x.numel() else (torch.empty(0, H, dtype=torch.float8_e4m3fn),
                                                              torch.empty(0, H // 128))
        send = (send[0].to(dev), send[1].to(dev))
    else:
        send = xd
    recv_x, recv_topk_idx, recv_topk_weights, per_expert, handle, event = buffer.dispatch(
        send, topk_idx=idxd, topk_weights=wd, num_tokens_per_rank=num_tokens_per_rank, num_tokens_per_rdma_rank=rdma,
        is_token_in_rank=is_token_in_rank, num_tokens_per_expert=num_tokens_per_expert, previous_event=prev,
        async_finish=True, allocate_on_comm_stream=True, expert_alignment=4 if worst else 1,
        num_worst_tokens=(W * max(tokens)) if worst else 0, config=deep_ep.Buffer.get_dispatch_config(W))
    event.current_stream_wait()
    # what this rank must receive: every source's tokens with an expert here, by source rank, then token
    exp_rows, exp_idx, exp_w, exp_src, from_src = [], [], [], [], []
    for s in range(W):
        xs, idxs, ws = _inputs(s, tokens, H, k, E, sd)
        mine = (idxs >= 0) & (idxs // El == me)
        sel = mine.any(1)
        exp_rows.append(xs[sel])
        exp_idx.append(torch.where(mine, idxs - me * El, -1)[sel])
        exp_w.append(torch.where(mine, ws, 0.0)[sel])
        exp_src.append(sel.nonzero().flatten())
        from_src.append(int(sel.sum()))
    exp_rows, exp_idx, exp_w = torch.cat(exp_rows), torch.cat(exp_idx), torch.cat(exp_w)
    R = exp_rows.shape[0]
    if fp8:
        codes, scales = recv_x
        qc, qs = fp8_quantize_reference(exp_rows) if R else (torch.empty(0, H, dtype=torch.float8_e4m3fn),
                                                              torch.empty(0, H // 128))
        assert torch.equal(codes[:R].cpu().view(torch.uint8), qc.view(torch.uint8))
        assert torch.equal(scales[:R].cpu(), qs)
        rows_in = fp8_dequantize(codes.cpu(), scales.cpu())
    else:
        assert recv_x.dtype == torch.bfloat16
        assert torch.equal(recv_x[:R].cpu(), exp_rows)
        rows_in = recv_x.cpu().float()
    n_recv = rows_in.shape[0]
    if worst:
        assert n_recv == W * max(tokens) and per_expert == []
        assert (recv_topk_idx[R:].cpu() == -1).all()
    else:
        assert n_recv == R
        counts = [int((exp_idx == l).sum()) for l in range(El)]
        assert per_expert == counts, (per_expert, counts)
    assert torch.equal(recv_topk_idx[:R].cpu(), exp_idx)
    assert torch.equal(recv_topk_weights[:R].cpu(), exp_w)
    rpm, _, _, recv_src_idx, itir, _ = handle
    assert rpm.cpu()[:, me].tolist() == torch.cumsum(torch.tensor(from_src), 0).tolist()
    assert recv_src_idx[:R].cpu().tolist() == torch.cat(exp_src).tolist()
    assert itir is is_token_in_rank
    # experts (DeepEP's normal mode: the expert side applies the weights and sums over its local slots)
    y = torch.zeros(n_recv, H)
    ri, rw = recv_topk_idx.cpu(), recv_topk_weights.cpu()
    for j in range(k):
        for l in range(El):
            m = ri[:, j] == l
            if m.any():
                y[m] += rw[m, j][:, None] * expert_fn(me * El + l, rows_in[m])
    y = y.to(torch.bfloat16).to(dev)
    prev = deep_ep.Buffer.capture()
    combined, combined_w, event = buffer.combine(y, handle, topk_weights=recv_topk_weights, previous_event=prev,
                                                 async_finish=True, allocate_on_comm_stream=True,
                                                 config=deep_ep.Buffer.get_combine_config(W))
    event.current_stream_wait()
    xin = fp8_dequantize(*fp8_quantize_reference(x)) if fp8 and x.numel() else x.float()
    ref = ep_reference(xin, idx, w, expert_fn, E)
    if combined.numel():
        _check(combined, ref, f"normal combine on rank {me}")
        assert torch.allclose(combined_w.cpu(), torch.where(idx >= 0, w, 0.0)), "combined topk_weights"
    # ditron's own API: per pair, the weights at the combine
    ctx = create_ep_context(max(max(tokens), 1), H, E, k, torch.bfloat16)
    r2, c2, h2 = ep_dispatch(xd, idxd, wd, ctx)
    own_y = r2.clone()
    off = 0
    for l, c in enumerate(c2.cpu().tolist()):
        own_y[off:off + c] = expert_fn(me * El + l, r2[off:off + c].float()).to(torch.bfloat16)
        off += c
    own = ep_combine(own_y, h2, ctx)
    if combined.numel() and not fp8:
        _check(combined, own.float().cpu(), f"deep_ep normal vs ditron ep on rank {me}")
    # a cached dispatch (the handle's layout, x only)
    again, n1, n2, n3, n4, event = buffer.dispatch(send, handle=handle)
    assert (n1, n2, n3, n4) == (None, None, None, None) and event.event is None
    if fp8:
        assert torch.equal(again[0][:R].cpu().view(torch.uint8), codes[:R].cpu().view(torch.uint8))
    else:
        assert torch.equal(again[:R].cpu(), exp_rows)
    return R


def errors(world):
    W, dev = world.world_size, world.device
    b = deep_ep.Buffer(None, 0, 0, low_latency_mode=True)
    nb = deep_ep.Buffer(None, 0, 0)
    x = torch.ones(2, 128, dtype=torch.bfloat16, device=dev)
    idx = torch.zeros(2, 2, dtype=torch.int64, device=dev)
    w = torch.ones(2, 2, device=dev)
    recv, cnt, h, ev, hook = b.low_latency_dispatch(x, idx, 4, 2 * W, use_fp8=False)
    return error_messages({
        "ue8m0": lambda: b.low_latency_dispatch(x, idx, 4, 2 * W, round_scale=True, use_ue8m0=True),
        "logfmt": lambda: b.low_latency_combine(recv, idx, w, h, use_logfmt=True),
        "not_ll": lambda: nb.low_latency_dispatch(x, idx, 4, 2 * W),
        "fp16": lambda: b.low_latency_dispatch(x.half(), idx, 4, 2 * W),
        "too_many": lambda: b.low_latency_dispatch(x, idx, 1, 2 * W),
        "idx32": lambda: b.low_latency_dispatch(x, idx.int(), 4, 2 * W),
        "other_idx": lambda: b.low_latency_combine(recv, idx + 1, w, h),
        "no_event": lambda: ev.current_stream_wait(),
        "alloc": lambda: nb.get_dispatch_layout(idx, 2 * W, allocate_on_comm_stream=True),
        "hook_async": lambda: b.low_latency_dispatch(x, idx, 4, 2 * W, async_finish=True, return_recv_hook=True),
        "src_info": lambda: h[0],
        "zero_copy": lambda: b.low_latency_combine(recv, idx, w, h, zero_copy=True),
        "handle": lambda: nb.combine(x, h),
        "shrink": lambda: deep_ep.Buffer(None, enable_shrink=True),
    })


def world_size_check(world):
    class G:
        def size(self):
            return world.world_size + 1

        def rank(self):
            return world.rank
    try:
        deep_ep.Buffer(G())
    except ditron.DitronError as e:
        return str(e)
