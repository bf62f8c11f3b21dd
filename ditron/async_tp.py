"""Async tensor parallelism in ``torch.compile``: an Inductor post-grad pass that replaces a functional
all-gather feeding a GEMM by ``torch.ops.ditron.ag_gemm`` and a GEMM feeding a functional reduce-scatter by
``torch.ops.ditron.gemm_rs`` (as torch's own micro-pipeline TP pass, ``torch._inductor.config._micro_pipeline_tp``,
does with its fused symmetric-memory ops), in the forward and the backward graphs.

    import ditron.async_tp
    ditron.async_tp.enable()                       # every torch.compile from now on (inductor backend)
    with ditron.async_tp.enabled(): ...            # or for a block
    torch.compile(f, options={"post_grad_custom_post_pass": ditron.async_tp.AsyncTPPass()})   # or per compile

The matched patterns, in the post-grad (ATen) graph, with ``W`` the ditron world's size:

    ag = _c10d_functional.all_gather_into_tensor(x, W, group)      x: >= 2 dims, float16 / bfloat16
    g  = _c10d_functional.wait_tensor(ag)
    g2 = reshape(g, [-1, K])                       (only when x has more than 2 dims: [S, B, K] -> [W S B, K])
    y  = aten.mm(g2, b)                            -> y = ditron.ag_gemm(reshape(x, [-1, K]), b, W)
    y  = aten.addmm(bias, g2, b)                   -> y = ditron.ag_gemm(reshape(x, [-1, K]), b, W) + bias

    p  = aten.mm(a, b)                             a: [M, K], M % W == 0, float16 / bfloat16
    p3 = reshape(p, [W * S, B, N])                 (optional: a 3-D activation; leading dims only)
    rs = _c10d_functional.reduce_scatter_tensor(p3, "sum", W, group)
    y  = _c10d_functional.wait_tensor(rs)          -> y = reshape(ditron.gemm_rs(a, b, W), [S, B, N])
    p  = aten.addmm(c, a, b)                       c: a bias row, [N] or [1, N] (DTensor's row-parallel bias: c =
                                                   bias / W on every rank)
                                                   -> y = ditron.gemm_rs(a, b, W) + wait_tensor(all_reduce(c, "sum"))

These are the graphs DTensor gives a model parallelised by ``parallelize_module`` in the sequence-parallel layout
(``ColwiseParallel(input_layouts=Shard(0))`` + ``RowwiseParallel(output_layouts=Shard(0))``, forward and
backward; a row-parallel ``nn.Linear``'s bias is the ``addmm(bias / W, ...)`` above): such models get the rewrite
without code changes (tests/test_async_tp.py ``test_dtensor_*``).

The reshapes must keep the last dimension (they merge or split leading ones: rows keep their order, so the dim-0
collective commutes with them).  ``group`` is the ditron world's group: its members are the world's ranks in order
(the world built by ``ditron.init(group=g)`` from ``g``, or the whole job's ranks for a world on the whole job).
Anything else is left alone, and each collective left alone is logged (``logging.getLogger("ditron.async_tp")``,
INFO) and recorded in :data:`SKIPPED` with its reason: another group (e.g. a TP sub-group while the ditron world
is the whole job), another reduce op, a gathered tensor used as the right operand, a gather along another dim, a
full ``[M, N]`` addend before the reduce-scatter (only a bias row is summed by the small all_reduce),
``addmm`` with ``beta`` / ``alpha``, other dtypes, no ditron world at compile time.  The all-gather stays in the
graph when its result has users other than the rewritten GEMMs (e.g. the backward's ``dB = all_gather(A)^T @
dC``); the ``mm`` feeding a rewritten reduce-scatter goes when it has no other users (dead code).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

#: the nodes rewritten by the last runs of the pass: ``[(graph id, "ag_gemm" | "gemm_rs"), ...]`` (for tests/debugging)
LOG: list = []
#: the collectives (or GEMMs) left alone, with the reason: ``[(graph id, node name, reason), ...]``; also logged
SKIPPED: list = []
_log = logging.getLogger("ditron.async_tp")


def _world():
    from .runtime.world import current_world
    return current_world(required=False)


def _group_is_world(group_name, group_size, world) -> bool:
    """Whether the process group named ``group_name`` is the ditron world's: same size, same members in order."""
    if world is None or group_size != world.world_size:
        return False
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group
        from .runtime.groups import group_ranks
        members = group_ranks(_resolve_process_group(group_name))
        if getattr(world, "group", None) is not None:
            return members == group_ranks(world.group)
        return members == list(range(world.world_size)) and dist.get_world_size() == world.world_size
    except Exception:  # noqa: BLE001 -- an unknown group (or no torch.distributed): not ours, leave it
        return False


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _ok_2d(node, dims=2):
    v = _val(node)
    return isinstance(v, torch.Tensor) and v.dim() == dims and v.dtype in (torch.float16, torch.bfloat16)


def _copy_meta(new, old):
    """The replaced node's output value (same shape, dtype, contiguous strides) and source location; not its
    ``eager_input_vals`` (those of the other op's inputs)."""
    for k in ("val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack"):
        if k in old.meta:
            new.meta[k] = old.meta[k]


_VIEWS = ("reshape", "view", "_unsafe_view")


def _is_view(node):
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and \
        getattr(node.target, "_opname", None) in _VIEWS and _val(node) is not None


def _shape(node):
    return [int(d) if isinstance(d, int) else d for d in _val(node).shape]


def _flattens_rows(src_shape, dst_shape):
    """Whether a reshape from ``src_shape`` to ``dst_shape`` only merges / splits leading dimensions (the last one,
    the GEMM's ``K`` or ``N``, kept): rows stay in order, so a dim-0 collective commutes with it."""
    return len(src_shape) >= 2 and len(dst_shape) >= 2 and src_shape[-1] == dst_shape[-1]


def _unit_scale(node):
    """``addmm``'s ``beta`` and ``alpha`` are 1 (absent or 1)."""
    return all(node.kwargs.get(k, 1) == 1 for k in ("beta", "alpha")) and len(node.args) <= 3


class _Rewriter:
    def __init__(self, graph, world):
        self.graph, self.world, self.W = graph, world, world.world_size
        self.done, self.skipped = [], []

    def skip(self, node, reason):
        self.skipped.append((node.name, reason))
        _log.info("ditron.async_tp: %s left alone: %s", node.name, reason)

    def group_reason(self, group, size):
        if _group_is_world(group, size, self.world):
            return None
        return (f"process group {group!r} ({_describe_group(group, size)}) is not the ditron world's "
                f"({self.W} ranks{_world_members(self.world)}); build the world on it (ditron.init(group=...)) to "
                "rewrite its collectives")

    def _as_rows(self, x):
        """``x`` viewed as ``[rows, K]`` (a reshape inserted when ``x`` has more than 2 dims)."""
        shape = _shape(x)
        if len(shape) == 2:
            return x
        new = self.graph.call_function(torch.ops.aten.reshape.default, (x, [-1, shape[-1]]))
        v = _val(x)
        new.meta["val"] = v.reshape(-1, shape[-1])
        return new

    def all_gather(self, node):
        """``all_gather_into_tensor(x) -> wait_tensor -> [reshapes merging leading dims] -> mm / addmm`` (the
        gathered tensor on the left)."""
        c10d, aten = torch.ops._c10d_functional, torch.ops.aten
        x, size, group = node.args[:3]
        v = _val(x)
        if not (isinstance(v, torch.Tensor) and v.dim() >= 2 and v.dtype in (torch.float16, torch.bfloat16)):
            return self.skip(node, f"the gathered tensor is {_desc(v)}: ditron.ag_gemm takes float16 / bfloat16 "
                                   "with at least 2 dims")
        reason = self.group_reason(group, size)
        if reason:
            return self.skip(node, reason)
        found = False
        for wait in [u for u in node.users if u.target is c10d.wait_tensor.default]:
            # the users of the gathered tensor, through reshapes that only merge leading dims
            frontier, uses = [wait], []
            while frontier:
                cur = frontier.pop()
                for u in cur.users:
                    if _is_view(u) and _flattens_rows(_shape(cur), _shape(u)):
                        frontier.append(u)
                    else:
                        uses.append((cur, u))
            for src, mm in uses:
                if mm.target not in (aten.mm.default, aten.addmm.default):
                    continue
                left, right = (mm.args[0], mm.args[1]) if mm.target is aten.mm.default else (mm.args[1], mm.args[2])
                if left is not src or right is src:
                    self.skip(mm, "the gathered tensor is the GEMM's right operand (ditron.ag_gemm gathers the left "
                                  "one)")
                    found = True
                    continue
                if mm.target is aten.addmm.default and not _unit_scale(mm):
                    self.skip(mm, "addmm with beta / alpha other than 1")
                    found = True
                    continue
                if not _ok_2d(right) or _val(right).dtype != v.dtype:
                    self.skip(mm, f"the GEMM's right operand is {_desc(_val(right))}, not a 2-D {v.dtype}")
                    found = True
                    continue
                with self.graph.inserting_before(mm):
                    a = self._as_rows(x)
                    new = self.graph.call_function(torch.ops.ditron.ag_gemm.default, (a, right, self.W))
                    new.meta["val"] = _val(mm).new_empty(_val(mm).shape)
                    out = new
                    if mm.target is aten.addmm.default:            # ag_gemm(x, b) + bias
                        out = self.graph.call_function(aten.add.Tensor, (new, mm.args[0]))
                _copy_meta(out, mm)
                mm.replace_all_uses_with(out)
                self.graph.erase_node(mm)
                self.done.append("ag_gemm")
                found = True
            _erase_dead_views(self.graph, wait)
        if not found:
            self.skip(node, "the gathered tensor reaches no mm / addmm as its left operand through reshapes of "
                            "leading dims only (e.g. gathered along another dim, or consumed by another op)")

    def reduce_scatter(self, node):
        """``[mm | addmm] -> [reshapes splitting rows] -> reduce_scatter_tensor(sum) -> wait_tensor``; an
        ``addmm``'s bias row is summed over the ranks by an ``all_reduce`` of its ``N`` elements (as the
        reduce-scatter summed it) and added to the GEMM-RS's output."""
        c10d, aten = torch.ops._c10d_functional, torch.ops.aten
        p, op, size, group = node.args[:4]
        reason = self.group_reason(group, size)
        if reason:
            return self.skip(node, reason)
        if op != "sum":
            return self.skip(node, f"reduce op {op!r} (ditron.gemm_rs sums)")
        chain = []
        src = p
        while _is_view(src) and isinstance(src.args[0], torch.fx.Node) and _val(src.args[0]) is not None and \
                _flattens_rows(_shape(src.args[0]), _shape(src)):
            chain.append(src)
            src = src.args[0]
        if not isinstance(src, torch.fx.Node) or src.target not in (aten.mm.default, aten.addmm.default):
            return self.skip(node, "the reduce-scattered tensor is not a GEMM's output (through reshapes of leading "
                                   "dims only)")
        bias = None
        if src.target is aten.addmm.default:
            if not _unit_scale(src):
                return self.skip(node, "addmm with beta / alpha other than 1 before the reduce-scatter")
            bias, a, b = src.args[0], src.args[1], src.args[2]
            bv, bw = _val(bias), _val(b)
            # a bias row ([N] or [1, N], broadcast over the rows): every rank's is summed by the reduce-scatter, so
            # the rewrite sums it by an all_reduce of N elements (DTensor's row-parallel bias: Replicate -> Partial
            # is bias / W on every rank, and the sum gives the bias back)
            if not (isinstance(bv, torch.Tensor) and isinstance(bw, torch.Tensor) and bv.dtype == bw.dtype and
                    bv.dim() in (1, 2) and bv.shape[-1] == bw.shape[-1] and (bv.dim() == 1 or bv.shape[0] == 1)):
                return self.skip(node, f"the GEMM adds {_desc(bv)} before the reduce-scatter (only a bias row, [N] "
                                       "or [1, N] of the GEMM's dtype, is rewritten: gemm_rs + all_reduce(bias))")
        else:
            a, b = src.args[0], src.args[1]
        if not (_ok_2d(a) and _ok_2d(b)):
            return self.skip(node, f"the GEMM's operands are {_desc(_val(a))} and {_desc(_val(b))}, not 2-D "
                                   "float16 / bfloat16")
        M = _val(a).shape[0]
        lead = _shape(p)[0]
        if not isinstance(M, int) or M % self.W or not isinstance(lead, int) or lead % self.W:
            return self.skip(node, f"{M} rows (scattered dim {lead}) are not a multiple of the world size {self.W}")
        waits = [u for u in node.users if u.target is c10d.wait_tensor.default]
        if len(waits) != 1 or len(node.users) != 1:
            return self.skip(node, "the reduce-scatter has users other than one wait_tensor")
        wait = waits[0]
        with self.graph.inserting_before(wait):
            if bias is not None:        # issued before the GEMM-RS, waited for after it
                ar = self.graph.call_function(c10d.all_reduce.default, (bias, "sum", group))
                ar.meta["val"] = _val(bias).new_empty(_val(bias).shape)
            new = self.graph.call_function(torch.ops.ditron.gemm_rs.default, (a, b, self.W))
            new.meta["val"] = _val(a).new_empty((M // self.W, _val(b).shape[1]))
            out = new
            if bias is not None:
                summed = self.graph.call_function(c10d.wait_tensor.default, (ar,))
                summed.meta["val"] = _val(bias).new_empty(_val(bias).shape)
                out = self.graph.call_function(aten.add.Tensor, (new, summed))
                out.meta["val"] = _val(new)
            if chain:                           # back to the reduce-scatter's shape: [lead / W, ...]
                shape = [lead // self.W] + _shape(p)[1:]
                out = self.graph.call_function(aten.reshape.default, (out, shape))
        _copy_meta(out, wait)
        wait.replace_all_uses_with(out)
        self.graph.erase_node(wait)
        self.graph.erase_node(node)
        for n in chain + [src]:
            if not n.users:
                self.graph.erase_node(n)
        self.done.append("gemm_rs")


def _erase_dead_views(graph, node):
    for u in list(node.users):
        if _is_view(u):
            _erase_dead_views(graph, u)
            if not u.users:
                graph.erase_node(u)


def _desc(v):
    return f"{v.dtype}{list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__


def _describe_group(group, size):
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group
        from .runtime.groups import group_ranks
        return f"{size} ranks: {group_ranks(_resolve_process_group(group))}"
    except Exception:  # noqa: BLE001
        return f"{size} ranks"


def _world_members(world):
    try:
        from .runtime.groups import group_ranks
        if getattr(world, "group", None) is not None:
            return f": {group_ranks(world.group)}"
        return f": {list(range(world.world_size))}"
    except Exception:  # noqa: BLE001
        return ""


def rewrite(graph: torch.fx.Graph, world=None) -> list:
    """Rewrite ``graph`` in place (the patterns of the module docstring); returns the ops inserted, in order.  Each
    collective left alone is logged (``logging.getLogger("ditron.async_tp")``, INFO) and recorded in
    :data:`SKIPPED` with the reason."""
    import ditron.torch_ops  # noqa: F401 -- registers torch.ops.ditron.*
    world = world if world is not None else _world()
    c10d = torch.ops._c10d_functional
    if world is None:
        for node in graph.nodes:
            if node.target in (c10d.all_gather_into_tensor.default, c10d.reduce_scatter_tensor.default):
                SKIPPED.append((id(graph), node.name, "no ditron world when the graph was compiled (ditron.init() "
                                                      "first)"))
        return []
    rw = _Rewriter(graph, world)
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "call_function":
            continue
        if node.target is c10d.all_gather_into_tensor.default:
            rw.all_gather(node)
        elif node.target is c10d.reduce_scatter_tensor.default:
            rw.reduce_scatter(node)
    if rw.done:
        graph.lint()
    LOG.extend((id(graph), d) for d in rw.done)
    SKIPPED.extend((id(graph), n, r) for n, r in rw.skipped)
    return rw.done


class AsyncTPPass(CustomGraphPass):
    """The pass as Inductor's ``post_grad_custom_post_pass`` (``then``: another pass to run after it)."""

    def __init__(self, then=None):
        self.then = then

    def __call__(self, graph: torch.fx.Graph) -> None:
        rewrite(graph)
        if self.then is not None:
            self.then(graph)

    def uuid(self):
        # part of Inductor's FX-graph cache key: this file, the world size, and the chained pass's key
        h = hashlib.sha256(open(__file__, "rb").read())
        world = _world()
        h.update(repr(world.world_size if world is not None else None).encode())
        then = self.then.uuid() if self.then is not None and hasattr(self.then, "uuid") else self.then
        h.update(repr(then).encode())
        return h.hexdigest()


def enable():
    """Install the pass as ``torch._inductor.config.post_grad_custom_post_pass`` (a pass already there runs after
    it); every ``torch.compile`` (inductor) from now on rewrites.  Idempotent."""
    import torch._inductor.config as cfg
    cur = cfg.post_grad_custom_post_pass
    if isinstance(cur, AsyncTPPass):
        return cur
    cfg.post_grad_custom_post_pass = AsyncTPPass(then=cur)
    return cfg.post_grad_custom_post_pass


def disable():
    """Remove the pass (restoring the pass it wrapped, if any)."""
    import torch._inductor.config as cfg
    cur = cfg.post_grad_custom_post_pass
    if isinstance(cur, AsyncTPPass):
        cfg.post_grad_custom_post_pass = cur.then


def is_enabled() -> bool:
    import torch._inductor.config as cfg
    return isinstance(cfg.post_grad_custom_post_pass, AsyncTPPass)


@contextlib.contextmanager
def enabled():
    """``with ditron.async_tp.enabled(): ...``: the pass for the compilations inside the block (torch.compile
    compiles at the first call: call the compiled function inside the block)."""
    was = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was:
            disable()
