"""DeepEP's Python interface on ditron's EP kernels (kernels/ep.py), so that a serving engine written against
``deep_ep`` (SGLang's and vLLM's DeepEP dispatchers) runs on ditron by changing its import:

    import ditron.deep_ep as deep_ep               # instead of: import deep_ep
    world = ditron.init()                          # ditron's world (group: torch's process group or None)
    buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes, low_latency_mode=True,
                            num_qps_per_rank=num_experts // group.size())

    # decode: low-latency dispatch (fp8 or bf16 payload) -> experts -> low-latency combine (bf16)
    recv_x, recv_count, handle, event, hook = buffer.low_latency_dispatch(
        x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8=True)
    (x_fp8, x_scales) = recv_x                     # [E_local, W * max, H] e4m3, [E_local, W * max, H / 128] fp32
    combined_x, event, hook = buffer.low_latency_combine(y, topk_idx, topk_weights, handle)

    # prefill: normal dispatch / combine (one node)
    num_tokens_per_rank, _, num_tokens_per_expert, is_token_in_rank, _ = buffer.get_dispatch_layout(topk_idx, E)
    recv_x, recv_topk_idx, recv_topk_weights, counts_list, handle, event = buffer.dispatch(
        x, topk_idx=topk_idx, topk_weights=topk_weights, num_tokens_per_rank=num_tokens_per_rank,
        is_token_in_rank=is_token_in_rank, num_tokens_per_expert=num_tokens_per_expert)
    combined_x, combined_topk_weights, event = buffer.combine(y, handle, topk_weights=recv_topk_weights)

Calls, arguments and return values are DeepEP's (``deep_ep/buffers/legacy.py``); what ditron does not do is
an error (``DitronError``) naming it, never a silent difference.  The differences in *how*:

* **Streams and events.**  ditron launches on the current stream.  ``async_finish=True`` returns an
  ``EventOverlap`` recorded after the launch (``current_stream_wait()`` then waits for nothing new: the
  current stream is already ordered after the kernels); ``previous_event``: the current stream waits for it
  before the launch; ``allocate_on_comm_stream`` needs ``previous_event`` and ``async_finish`` (as DeepEP)
  and changes nothing (one stream).  Same results, no overlap of the communication with other work of the
  current stream.  ``get_comm_stream()`` returns the current stream.
* **Receive hooks.**  ditron's low-latency kernels send and receive in one launch: with
  ``return_recv_hook=True`` the returned hook does nothing (the data has arrived when the launch completes, in
  stream order); calling it is still right.  The overlap DeepEP gets from issuing the receive later is not
  there.
* **Buffers.**  ``num_nvl_bytes`` / ``num_rdma_bytes`` are not used for sizing: each call's ditron context
  (kernels/ep.py) is made on first use of its shapes, collectively, from ditron's symmetric heap
  (``DITRON_HEAP_SIZE``), so the first call of a shape must not be inside a CUDA-graph capture (run it once
  eagerly; a capture that would make a context raises).  ``Config`` and ``Buffer.num_sms`` are accepted and
  do not change results (ditron's kernels pick their own grids).
* **Handles.**  ``dispatch`` returns DeepEP's 6-tuple (``rank_prefix_matrix``, ``None``, ``None``,
  ``recv_src_idx``, ``is_token_in_rank``, ``None``: the channel matrices and send heads of DeepEP's kernels
  have no meaning here); ``low_latency_dispatch`` a 5-tuple whose ``layout_range`` (``[E_local, W]``, int64
  ``begin << 32 | count``) and sizes are DeepEP's; its ``recv_src_info`` (``handle[0]``) is not produced by
  ditron's kernels and reading it raises.  Combines take only handles of this buffer.
* **Bad routing.**  Expert ids outside ``[-1, num_experts)`` and low-latency pairs beyond a rank's capacity
  (``num_max_dispatch_tokens_per_rank`` pairs per source and expert: a token routed twice to one expert) are
  dropped and counted, not undefined: ``buffer.check_dropped(handle)`` raises naming them (a host read).
* **Outputs.**  Low-latency ``recv_x`` / ``recv_count`` reuse two buffers, as DeepEP's (hold at most two
  calls' results); normal-mode outputs and every combined output are new tensors, as DeepEP's.

Not supported (an error): ``use_ue8m0``, ``use_logfmt``, the ``*_wait_recv_cost_stats`` tensors, the shrink
/ mask-buffer calls, ``enable_shrink``, normal mode across nodes (low latency works across nodes), the
``mpi4py`` communicator.
"""
from __future__ import annotations

import torch

from .errors import DitronError
from .runtime.world import barrier_all, current_world, peer_tensor, symm_zeros

#: DeepEP's ``deep_ep.topk_idx_t``
topk_idx_t = torch.int64


def _err(msg):
    return DitronError("ditron.deep_ep: " + msg)


def _cuda(device):
    return device is not None and torch.device(device).type == "cuda"


class EventHandle:
    """A point in the current stream (a recorded ``torch.cuda.Event``; on the CPU simulator, whose launches
    are synchronous, an already complete one)."""

    def __init__(self):
        self.event = None
        world = current_world(required=False)
        if world is not None and _cuda(world.device):
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream())

    def current_stream_wait(self):
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


class EventOverlap:
    """DeepEP's event wrapper: ``current_stream_wait()``, and ``with event: ...`` (the current stream waits at
    the end of the block)."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors
        self.hook_after_wait = None
        self._release = False

    def current_stream_wait(self, release_handle=False):
        if self.event is None:
            raise _err("this EventOverlap holds no event: the call that returned it ran with async_finish=False "
                       "(as in DeepEP, its event is valid only with async_finish=True)")
        self.event.current_stream_wait()
        if self.hook_after_wait is not None:
            self.hook_after_wait()
            self.hook_after_wait = None
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook):
        if self.hook_after_wait is not None:
            raise _err("a hook is already registered on this EventOverlap")
        self.hook_after_wait = hook

    def __call__(self, release_handle=False):
        self._release = release_handle
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release)
        self._release = False


class Config:
    """DeepEP's tuning config of the normal kernels (accepted; ditron's kernels choose their own grids, results do
    not depend on it).  The size hints give DeepEP's numbers so that callers sizing buffers with them work."""

    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6, num_max_nvl_chunked_recv_tokens=256,
                 num_max_rdma_chunked_send_tokens=6, num_max_rdma_chunked_recv_tokens=256):
        self.num_sms = int(num_sms)
        self.num_max_nvl_chunked_send_tokens = int(num_max_nvl_chunked_send_tokens)
        self.num_max_nvl_chunked_recv_tokens = int(num_max_nvl_chunked_recv_tokens)
        self.num_max_rdma_chunked_send_tokens = int(num_max_rdma_chunked_send_tokens)
        self.num_max_rdma_chunked_recv_tokens = int(num_max_rdma_chunked_recv_tokens)

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        # channels x ranks x (recv tokens x (hidden + metadata)) plus the prefix matrices, as DeepEP's estimate
        channels = max(1, self.num_sms // 2)
        per_token = int(hidden_bytes) + 4 * 128 + 64
        return int(channels * num_ranks * self.num_max_nvl_chunked_recv_tokens * per_token + 4 * num_ranks ** 2
                   * channels * 2 + (1 << 20))

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        return 0                                # ditron's normal mode through DeepEP's interface: one node

    def __repr__(self):
        return (f"Config(num_sms={self.num_sms}, {self.num_max_nvl_chunked_send_tokens}, "
                f"{self.num_max_nvl_chunked_recv_tokens}, {self.num_max_rdma_chunked_send_tokens}, "
                f"{self.num_max_rdma_chunked_recv_tokens})")


def _bucket(n):
    return max(16, 1 << max(0, int(n) - 1).bit_length())


class LowLatencyHandle(tuple):
    """DeepEP's low-latency handle ``(recv_src_info, layout_range, num_max_dispatch_tokens_per_rank, hidden,
    num_experts)``; ``handle[0]`` (the source token index of each received row) is not produced by ditron's
    kernels and raises; ``layout_range`` is computed when read."""

    def __new__(cls, buffer, ctx, ep_handle, topk_idx, num_max, hidden, num_experts):
        self = super().__new__(cls, (None, None, num_max, hidden, num_experts))
        self.buffer, self.ctx, self.ep, self.topk_idx = buffer, ctx, ep_handle, topk_idx
        return self

    def _item(self, i):
        if i == 0:
            raise _err("recv_src_info (handle[0] of a low-latency dispatch) is not produced by ditron's kernels "
                       "(rows carry no source index); handle[1] (layout_range) and the sizes are DeepEP's")
        if i == 1:
            lrc = self.ep.lrc                   # [E_local, W] rows per (local expert, source)
            begin = torch.cumsum(lrc, 1) - lrc
            return (begin << 32) | lrc
        return tuple.__getitem__(self, i)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self._item(j) for j in range(len(self))[i])
        return self._item(range(len(self))[i])

    def __iter__(self):
        return (self._item(i) for i in range(len(self)))


class DispatchHandle(tuple):
    """DeepEP's intranode handle ``(rank_prefix_matrix, channel_prefix_matrix, recv_channel_prefix_matrix,
    recv_src_idx, is_token_in_rank, send_head)``: the channel matrices and send heads are ``None`` (ditron's
    kernels have no channels); ``rank_prefix_matrix[i][j]`` is the number of tokens rank ``j`` receives from
    ranks ``0..i``; ``recv_src_idx`` the source token index of every received row."""

    def __new__(cls, items, **state):
        self = super().__new__(cls, items)
        self.__dict__.update(state)
        return self


class Buffer:
    """DeepEP's ``deep_ep.Buffer`` on ditron's EP kernels (see the module docstring)."""

    num_sms: int = 20

    def __init__(self, group=None, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
                 num_qps_per_rank=24, allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False,
                 explicitly_destroy=False, enable_shrink=False, comm=None):
        world = current_world(required=False)
        if world is None:
            raise _err("Buffer needs a ditron world: call ditron.init() (with group=... for a sub-group) first")
        if comm is not None:
            raise _err("Buffer(comm=...) (an mpi4py communicator) is not supported; pass the torch process group "
                       "of the ditron world (or None)")
        if enable_shrink:
            raise _err("enable_shrink=True (rank masking) is not supported by ditron's EP kernels")
        if group is not None:
            size, rank = group.size(), group.rank()
            if (size, rank) != (world.world_size, world.rank):
                raise _err(f"the group (rank {rank} of {size}) is not the ditron world (rank {world.rank} of "
                           f"{world.world_size}); call ditron.init(group=group)")
        self.world = world
        self.group = group
        self.rank, self.group_size = world.rank, world.world_size
        self.num_nvl_bytes, self.num_rdma_bytes = int(num_nvl_bytes), int(num_rdma_bytes)
        self.low_latency_mode = bool(low_latency_mode)
        self.explicitly_destroy = bool(explicitly_destroy)
        self._contexts = {}
        # normal mode: the ranks' token counts and sends, exchanged once per dispatch ([T, sent to rank 0..W-1])
        self._xchg = symm_zeros((1 + world.world_size,), torch.int64, name="deep_ep.exchange")
        self._alive = True

    # ------------------------------------------------------------------ lifetime / misc
    def destroy(self):
        if not self.explicitly_destroy:
            raise _err("destroy() needs Buffer(..., explicitly_destroy=True), as in DeepEP")
        self._contexts.clear()
        self._alive = False

    def _check_alive(self):
        if not self._alive:
            raise _err("this Buffer was destroyed")
        if current_world(required=False) is not self.world:
            raise _err("this Buffer's ditron world was finalized; make a new Buffer")

    @staticmethod
    def is_sm90_compiled():
        return True

    @staticmethod
    def set_num_sms(new_num_sms):
        if new_num_sms % 2:
            raise _err("the SM count must be even")
        Buffer.num_sms = int(new_num_sms)

    @staticmethod
    def capture():
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        """Bytes of symmetric memory ditron's low-latency context takes for these sizes (bf16): per parity and
        local expert, ``num_ranks * num_max`` slots of ``hidden / 2`` 8-byte packets, for dispatch and combine."""
        local = num_experts // num_ranks
        words = (int(hidden) + 1) // 2
        rows = local * num_ranks * int(num_max_dispatch_tokens_per_rank)
        return 2 * 2 * rows * words * 8 + 2 * local * num_ranks * 8

    @staticmethod
    def get_dispatch_config(num_ranks):
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    def get_comm_stream(self):
        if _cuda(self.world.device):
            return torch.cuda.current_stream()
        raise _err("get_comm_stream: the CPU simulator has no streams")

    def get_local_buffer_tensor(self, *args, **kwargs):
        raise _err("get_local_buffer_tensor (DeepEP's raw buffer) is not supported: ditron's buffers are per "
                   "shape (kernels/ep.py contexts)")

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """Nothing to clean: ditron's low-latency packets carry their call's epoch, a buffer is never dirty."""
        self._check_alive()

    def low_latency_update_mask_buffer(self, *a, **k):
        raise _err("rank masking (shrink mode) is not supported")

    low_latency_query_mask_buffer = low_latency_clean_mask_buffer = low_latency_update_mask_buffer

    def check_dropped(self, handle):
        """ditron's check (a host read): raise if the dispatch of ``handle`` dropped pairs (expert ids out of
        range, or beyond the low-latency capacity)."""
        from .kernels.ep import check_dropped
        ep = handle.ep if isinstance(handle, LowLatencyHandle) else getattr(handle, "hx", None)
        if ep is None:
            raise _err("check_dropped: not a handle of this Buffer")
        check_dropped(ep)
        return handle

    # ------------------------------------------------------------------ helpers
    def _context(self, key, **make):
        ctx = self._contexts.get(key)
        if ctx is None or not _ctx_alive(ctx):
            if _cuda(self.world.device) and torch.cuda.is_current_stream_capturing():
                raise _err(f"no ditron context yet for {key} while a CUDA graph is being captured (making one is "
                           "collective and allocates); run the step once before capturing it")
            from .kernels.ep import create_ep_context
            ctx = self._contexts[key] = create_ep_context(**make)
            ctx.deep_ep = {}
        return ctx

    @staticmethod
    def _events(previous_event, async_finish, allocate_on_comm_stream, what):
        if allocate_on_comm_stream and not (previous_event is not None and async_finish):
            raise _err(f"{what}: allocate_on_comm_stream=True needs previous_event and async_finish=True (as "
                       "DeepEP)")
        if previous_event is not None:
            ev = getattr(previous_event, "event", None)
            if ev is None:
                raise _err(f"{what}: previous_event holds no event")
            ev.current_stream_wait()

    @staticmethod
    def _done(async_finish, tensors=None):
        return EventOverlap(EventHandle(), tensors) if async_finish else EventOverlap(None)

    # ------------------------------------------------------------------ low latency
    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8=True, round_scale=False, use_ue8m0=False, async_finish=False,
                             return_recv_hook=False):
        from .kernels import ep
        self._check_alive()
        what = "low_latency_dispatch"
        if not self.low_latency_mode:
            raise _err(f"{what} needs Buffer(..., low_latency_mode=True), as in DeepEP")
        if use_ue8m0:
            raise _err(f"{what}: use_ue8m0=True (packed UE8M0 scales) is not supported; round_scale=True gives the "
                       "same power-of-two scales as fp32")
        if dispatch_wait_recv_cost_stats is not None:
            raise _err(f"{what}: dispatch_wait_recv_cost_stats is not supported")
        if round_scale and not use_fp8:
            raise _err(f"{what}: round_scale=True needs use_fp8=True")
        if async_finish and return_recv_hook:
            raise _err(f"{what}: async_finish and return_recv_hook cannot both be set (as DeepEP)")
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16:
            desc = f"{x.dtype}{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise _err(f"{what}: x must be a bfloat16 [num_tokens, hidden] tensor (as DeepEP), got {desc}")
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype != topk_idx_t or topk_idx.dim() != 2 or \
                topk_idx.shape[0] != x.shape[0]:
            desc = f"{topk_idx.dtype}{list(topk_idx.shape)}" if isinstance(topk_idx, torch.Tensor) else \
                type(topk_idx).__name__
            raise _err(f"{what}: topk_idx must be an int64 (deep_ep.topk_idx_t) [num_tokens={x.shape[0]}, "
                       f"num_topk] tensor, got {desc}")
        M = int(num_max_dispatch_tokens_per_rank)
        if x.shape[0] > M:
            raise _err(f"{what}: {x.shape[0]} tokens, more than num_max_dispatch_tokens_per_rank={M}")
        T, H, k = x.shape[0], x.shape[1], topk_idx.shape[1]
        ctx = self._context(("ll", M, H, int(num_experts), k), max_tokens=M, hidden=H, num_experts=int(num_experts),
                            topk=k, dtype=torch.bfloat16, mode="low_latency", capacity=M)
        st = ctx.deep_ep
        if "ones" not in st:
            st["ones"] = torch.ones((M, k), dtype=torch.float32, device=ctx.device)
            st["counts"] = [torch.empty(ctx.local_experts, dtype=torch.int32, device=ctx.device) for _ in range(2)]
        counts = st["counts"][ctx.dcalls_host % 2]
        if cumulative_local_expert_recv_stats is not None:
            s = cumulative_local_expert_recv_stats
            if not isinstance(s, torch.Tensor) or s.dtype != torch.int32 or tuple(s.shape) != (ctx.local_experts,):
                raise _err(f"{what}: cumulative_local_expert_recv_stats must be an int32 [{ctx.local_experts}] "
                           "tensor")
        ones = st.get(("ones", T))
        if ones is None:                  # the unit weights of T tokens: one view, made once (not a view per call)
            ones = st[("ones", T)] = st["ones"][:T]
        recv_x, recv_count, h = ep._dispatch(x, topk_idx, ones, ctx, validate=False, use_fp8=use_fp8,
                                             round_scale=round_scale, counts=counts)
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats.add_(recv_count)
        handle = LowLatencyHandle(self, ctx, h, topk_idx, M, H, int(num_experts))
        hook = (lambda: None) if return_recv_hook else None
        return recv_x, recv_count, handle, self._done(async_finish and not return_recv_hook), hook

    def get_next_low_latency_combine_buffer(self, handle):
        """The bf16 ``[E_local, W * num_max, hidden]`` tensor the next ``low_latency_combine(...,
        zero_copy=True)`` of this handle's shapes reads (fill it, then combine)."""
        ctx = self._ll_handle(handle, "get_next_low_latency_combine_buffer").ctx
        zc = ctx.deep_ep.setdefault("zero_copy", [None, None])
        p = ctx.ccalls_host % 2
        if zc[p] is None:
            zc[p] = torch.empty((ctx.local_experts, ctx.world_size * ctx.capacity, ctx.hidden), dtype=torch.bfloat16,
                                device=ctx.device)
        return zc[p]

    def _ll_handle(self, handle, what):
        self._check_alive()
        if not isinstance(handle, LowLatencyHandle) or handle.buffer is not self:
            raise _err(f"{what}: handle must come from low_latency_dispatch of this Buffer")
        return handle

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False, zero_copy=False,
                            async_finish=False, return_recv_hook=False, out=None, combine_wait_recv_cost_stats=None):
        from .kernels import ep
        what = "low_latency_combine"
        h = self._ll_handle(handle, what)
        if use_logfmt:
            raise _err(f"{what}: use_logfmt=True (LogFMT payload) is not supported; the combine is bf16")
        if combine_wait_recv_cost_stats is not None:
            raise _err(f"{what}: combine_wait_recv_cost_stats is not supported")
        ctx = h.ctx
        if not isinstance(topk_idx, torch.Tensor) or tuple(topk_idx.shape) != tuple(h.topk_idx.shape):
            raise _err(f"{what}: topk_idx must be the dispatch's [{h.ep.T}, {h.ep.k}] topk_idx")
        if topk_idx.data_ptr() != h.topk_idx.data_ptr() or topk_idx.stride() != h.topk_idx.stride():
            # another tensor: its ids must be the dispatch's (the slots were assigned by them)
            if _cuda(self.world.device) and torch.cuda.is_current_stream_capturing():
                raise _err(f"{what}: topk_idx is not the tensor given to low_latency_dispatch; under CUDA-graph "
                           "capture pass that same tensor")
            if not torch.equal(topk_idx, h.topk_idx):
                raise _err(f"{what}: topk_idx differs from the dispatch's (the combine reads the rows where that "
                           "dispatch put them)")
        if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32:
            raise _err(f"{what}: topk_weights must be a float32 [num_tokens, num_topk] tensor")
        if zero_copy:
            zc = ctx.deep_ep.get("zero_copy", [None, None])[ctx.ccalls_host % 2]
            if zc is None:
                raise _err(f"{what}: zero_copy=True without get_next_low_latency_combine_buffer(handle) before it")
            y = zc
        else:
            if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
                raise _err(f"{what}: x must be bfloat16 [num_local_experts, num_ranks * num_max, hidden]")
            y = x if x.is_contiguous() else x.contiguous()
        if out is None:
            out = torch.empty((h.ep.T, ctx.hidden), dtype=torch.bfloat16, device=ctx.device)
        elif not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or \
                tuple(out.shape) != (h.ep.T, ctx.hidden) or not out.is_contiguous():
            raise _err(f"{what}: out must be a contiguous bfloat16 [{h.ep.T}, {ctx.hidden}] tensor")
        if async_finish and return_recv_hook:
            raise _err(f"{what}: async_finish and return_recv_hook cannot both be set (as DeepEP)")
        combined = ep._combine(y, h.ep, ctx, out=out, topk_weights=topk_weights)
        hook = (lambda: None) if return_recv_hook else None
        return combined, self._done(async_finish and not return_recv_hook), hook

    # ------------------------------------------------------------------ normal mode
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        """``(num_tokens_per_rank [W] int32, None, num_tokens_per_expert [E] int32, is_token_in_rank [T, W] bool,
        event)`` (torch on this rank's ids; one node: the RDMA counts are ``None``)."""
        self._check_alive()
        what = "get_dispatch_layout"
        self._events(previous_event, async_finish, allocate_on_comm_stream, what)
        W = self.group_size
        E = int(num_experts)
        if E % W:
            raise _err(f"{what}: num_experts={E} is not a multiple of the {W} ranks")
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.dtype != topk_idx_t:
            raise _err(f"{what}: topk_idx must be an int64 (deep_ep.topk_idx_t) [num_tokens, num_topk] tensor")
        El = E // W
        valid = (topk_idx >= 0) & (topk_idx < E)
        ids = torch.where(valid, topk_idx, E)
        per_expert = torch.zeros(E + 1, dtype=torch.int32, device=topk_idx.device)
        per_expert.scatter_add_(0, ids.reshape(-1), torch.ones_like(ids.reshape(-1), dtype=torch.int32))
        ranks = torch.where(valid, topk_idx // El, W)
        in_rank = torch.zeros((topk_idx.shape[0], W + 1), dtype=torch.bool, device=topk_idx.device)
        in_rank.scatter_(1, ranks, True)
        is_token_in_rank = in_rank[:, :W].contiguous()
        per_rank = is_token_in_rank.sum(0, dtype=torch.int32)
        return per_rank, None, per_expert[:E], is_token_in_rank, self._done(async_finish)

    def _exchange(self, T, per_rank):
        """Every rank's token count and sends (host: ``[W]`` counts, device: ``[W, W]`` sends)."""
        W = self.group_size
        self._xchg[0].fill_(T)
        self._xchg[1:].copy_(per_rank)
        barrier_all()
        rows = [peer_tensor(self._xchg, r) if r != self.rank else self._xchg for r in range(W)]
        sends = torch.stack([r[1:].clone() for r in rows])
        counts = [int(r[0]) for r in rows]
        barrier_all()                           # every rank has read before the next dispatch writes again
        return counts, sends

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                 expert_alignment=1, num_worst_tokens=0, config=None, previous_event=None, async_finish=False,
                 allocate_on_comm_stream=False):
        from .kernels import ep
        self._check_alive()
        what = "dispatch"
        if self.world.nnodes > 1:
            raise _err(f"{what}: normal mode across nodes is not supported through this interface (use "
                       "ditron.kernels.ep.ep_dispatch, or the low-latency calls)")
        self._events(previous_event, async_finish, allocate_on_comm_stream, what)
        W, me = self.group_size, self.rank
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise _err(f"{what}: x must be [num_tokens, hidden] bfloat16 or (float8_e4m3fn, fp32 scales)")
        T, H = x.shape
        fp8 = x_scales is not None
        if fp8:
            if x.dtype != torch.float8_e4m3fn or H % 128 or not isinstance(x_scales, torch.Tensor) or \
                    x_scales.dtype != torch.float32 or tuple(x_scales.shape) != (T, H // 128):
                raise _err(f"{what}: an fp8 x must be (float8_e4m3fn [T, H], float32 [T, H / 128]) with H % 128 "
                           f"== 0")
            xv = x.contiguous().view(torch.bfloat16)            # the codes travel as 16-bit words, bit for bit
        else:
            if x.dtype != torch.bfloat16:
                raise _err(f"{what}: x must be bfloat16 (or an fp8 pair), got {x.dtype}")
            xv = x.contiguous()
        if num_worst_tokens < 0:
            raise _err(f"{what}: num_worst_tokens must be >= 0")
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise _err(f"{what}: a cached dispatch (handle given) takes no topk_idx / topk_weights (as DeepEP)")
            if not isinstance(handle, DispatchHandle) or handle.buffer is not self:
                raise _err(f"{what}: handle must come from dispatch of this Buffer")
            if (T, H, fp8) != (handle.T, handle.H, handle.fp8):
                raise _err(f"{what}: x must be like the handle's dispatch: [{handle.T}, {handle.H}] "
                           f"{'fp8' if handle.fp8 else 'bf16'}")
            st = handle
            cx = handle.cx
            recv, _, _ = ep._dispatch(xv, st.idx_r, st.w_r, cx, validate=False)
            R = handle.R
            recv_x = self._recv_x(recv, R, fp8)
            if fp8:
                meta, _, _ = ep._dispatch(x_scales.contiguous(), st.idx_r, st.w_r, handle.cs, validate=False)
                recv_x = (recv_x, meta[:R].clone())
            return recv_x, None, None, None, None, self._done(async_finish)
        if num_tokens_per_rank is None or is_token_in_rank is None or num_tokens_per_expert is None:
            raise _err(f"{what}: num_tokens_per_rank, is_token_in_rank and num_tokens_per_expert are needed (from "
                       "get_dispatch_layout) when no handle is given")
        if not isinstance(is_token_in_rank, torch.Tensor) or is_token_in_rank.dtype != torch.bool or \
                tuple(is_token_in_rank.shape) != (T, W):
            raise _err(f"{what}: is_token_in_rank must be a bool [{T}, {W}] tensor")
        with_topk = topk_idx is not None
        if with_topk != (topk_weights is not None):
            raise _err(f"{what}: give both topk_idx and topk_weights, or neither")
        k = 0
        if with_topk:
            if topk_idx.dtype != topk_idx_t or topk_idx.dim() != 2 or topk_idx.shape[0] != T:
                raise _err(f"{what}: topk_idx must be an int64 [{T}, num_topk] tensor")
            k = topk_idx.shape[1]
            if topk_weights.dtype != torch.float32 or tuple(topk_weights.shape) != (T, k):
                raise _err(f"{what}: topk_weights must be a float32 [{T}, {k}] tensor")
        counts, sends = self._exchange(T, num_tokens_per_rank)
        B = _bucket(max(counts))
        dev = x.device
        Hx = xv.shape[1]
        cx = self._context(("normal", B, Hx, torch.bfloat16), max_tokens=B, hidden=Hx, num_experts=W, topk=W,
                           dtype=torch.bfloat16)
        Hm = 1 + 2 * k
        cm = self._context(("normal", B, Hm, torch.float32), max_tokens=B, hidden=Hm, num_experts=W, topk=W,
                           dtype=torch.float32)
        ar = torch.arange(W, device=dev)
        idx_r = torch.where(is_token_in_rank, ar, -1)
        w_r = torch.ones((T, W), dtype=torch.float32, device=dev)
        meta = torch.empty((T, Hm), dtype=torch.float32, device=dev)
        meta[:, 0] = torch.arange(T, device=dev, dtype=torch.float32)
        if with_topk:
            meta[:, 1:1 + k] = topk_idx.to(torch.float32)
            meta[:, 1 + k:] = topk_weights
        recv, cnt, hx = ep._dispatch(xv, idx_r, w_r, cx, validate=False)
        rmeta, _, _ = ep._dispatch(meta, idx_r, w_r, cm, validate=False)
        cs = None
        scales = None
        if fp8:
            G = H // 128
            cs = self._context(("normal", B, G, torch.float32), max_tokens=B, hidden=G, num_experts=W, topk=W,
                               dtype=torch.float32)
            rsc, _, _ = ep._dispatch(x_scales.contiguous(), idx_r, w_r, cs, validate=False)
        if num_worst_tokens:
            R = int(num_worst_tokens)
            if R > cx.slot_rows * W:
                raise _err(f"{what}: num_worst_tokens={R} is more than the {cx.slot_rows * W} rows this dispatch "
                           "can receive")
            real = cnt[0]
        else:
            R = int(sends[:, me].sum())
            real = None
        recv_x = self._recv_x(recv, R, fp8)
        if fp8:
            scales = rsc[:R].clone()
            recv_x = (recv_x, scales)
        rm = rmeta[:R]
        recv_src_idx = rm[:, 0].to(torch.int32)
        recv_topk_idx = recv_topk_weights = None
        El = 0
        if with_topk:
            E = int(num_tokens_per_expert.shape[0])
            El = E // W
            gid = rm[:, 1:1 + k].to(torch.int64)
            mine = (gid >= 0) & (gid // El == me)
            recv_topk_idx = torch.where(mine, gid - me * El, -1)
            recv_topk_weights = torch.where(mine, rm[:, 1 + k:], 0.0)
            if real is not None:
                pad = torch.arange(R, device=dev) >= real
                recv_topk_idx = recv_topk_idx.masked_fill(pad[:, None], -1)
                recv_topk_weights = recv_topk_weights.masked_fill(pad[:, None], 0.0)
        if num_worst_tokens:
            per_expert = []
        elif with_topk:
            c = torch.zeros(El + 1, dtype=torch.int64, device=dev)
            c.scatter_add_(0, torch.where(recv_topk_idx >= 0, recv_topk_idx, El).reshape(-1),
                           torch.ones(recv_topk_idx.numel(), dtype=torch.int64, device=dev))
            a = int(expert_alignment)
            per_expert = [(v + a - 1) // a * a for v in c[:El].tolist()]
        else:
            per_expert = []
        rank_prefix_matrix = torch.cumsum(sends.to(dev), 0).to(torch.int32)
        # the handle keeps its own copy of the routing (the context's slots are reused two dispatches later)
        hx = ep.EpHandle(hx.mode, hx.T, hx.k, w_r, hx.dropped.clone(), pos=hx.pos.clone(), rc=hx.rc.clone())
        handle = DispatchHandle((rank_prefix_matrix, None, None, recv_src_idx, is_token_in_rank, None),
                                buffer=self, cx=cx, cm=cm, cs=cs, hx=hx, idx_r=idx_r, w_r=w_r, R=R, T=T, H=H,
                                fp8=fp8, B=B)
        return recv_x, recv_topk_idx, recv_topk_weights, per_expert, handle, self._done(async_finish)

    @staticmethod
    def _recv_x(recv, R, fp8):
        r = recv[:R].clone()
        return r.view(torch.float8_e4m3fn) if fp8 else r

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None, async_finish=False,
                allocate_on_comm_stream=False):
        """``combined_x [T, H]``: for each of this rank's tokens the sum of its rows of ``x`` over the ranks that
        received it (no weights, as DeepEP); ``combined_topk_weights``: the same sum of ``topk_weights``."""
        from .kernels import ep
        self._check_alive()
        what = "combine"
        if not isinstance(handle, DispatchHandle) or handle.buffer is not self:
            raise _err(f"{what}: handle must come from dispatch of this Buffer")
        self._events(previous_event, async_finish, allocate_on_comm_stream, what)
        R, T, H, W = handle.R, handle.T, handle.H, self.group_size
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != H or \
                x.shape[0] < R:
            raise _err(f"{what}: x must be bfloat16 [{R}, {H}] (the dispatch's received rows)")
        if handle.fp8:
            cc = self._context(("normal", handle.B, H, torch.bfloat16), max_tokens=handle.B, hidden=H, num_experts=W,
                               topk=W, dtype=torch.bfloat16)
        else:
            cc = handle.cx
        out = torch.empty((T, H), dtype=torch.bfloat16, device=x.device)
        y = x if x.is_contiguous() else x.contiguous()
        ep._combine(y, handle.hx, cc, out=out, rows=R)
        combined_w = None
        if topk_weights is not None:
            if topk_weights.dtype != torch.float32 or topk_weights.dim() != 2 or topk_weights.shape[0] < R:
                raise _err(f"{what}: topk_weights must be float32 [{R}, num_topk]")
            k = topk_weights.shape[1]
            cw = self._context(("normal", handle.B, k, torch.float32), max_tokens=handle.B, hidden=k, num_experts=W,
                               topk=W, dtype=torch.float32)
            combined_w = torch.empty((T, k), dtype=torch.float32, device=x.device)
            ep._combine(topk_weights.contiguous(), handle.hx, cw, out=combined_w, rows=R)
        if bias is not None:
            for b in (bias if isinstance(bias, tuple) else (bias,)):
                if b is not None:
                    out += b
        return out, combined_w, self._done(async_finish)


def _ctx_alive(ctx):
    try:
        ctx.check_alive("ditron.deep_ep")
    except DitronError:
        return False
    return True
