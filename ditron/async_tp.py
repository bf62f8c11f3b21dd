"""Async tensor parallelism in ``torch.compile``: an Inductor post-grad pass that replaces a functional
all-gather feeding a GEMM by ``torch.ops.ditron.ag_gemm`` and a GEMM feeding a functional reduce-scatter by
``torch.ops.ditron.gemm_rs`` (as torch's own micro-pipeline TP pass, ``torch._inductor.config._micro_pipeline_tp``,
does with its fused symmetric-memory ops), in the forward and the backward graphs.

    import ditron.async_tp
    ditron.async_tp.enable()                       # every torch.compile from now on (inductor backend)
    with ditron.async_tp.enabled(): ...            # or for a block
    torch.compile(f, options={"post_grad_custom_post_pass": ditron.async_tp.AsyncTPPass()})   # or per compile

The matched patterns, in the post-grad (ATen) graph, with ``W`` the ditron world's size:

    ag = _c10d_functional.all_gather_into_tensor(x, W, group)      x: 2-D, float16 / bfloat16
    g  = _c10d_functional.wait_tensor(ag)
    y  = aten.mm(g, b)                             -> y = ditron.ag_gemm(x, b, W)

    p  = aten.mm(a, b)                             a: [M, K], M % W == 0, float16 / bfloat16
    rs = _c10d_functional.reduce_scatter_tensor(p, "sum", W, group)
    y  = _c10d_functional.wait_tensor(rs)          -> y = ditron.gemm_rs(a, b, W)

where ``group`` is the ditron world's group: its members are the world's ranks in order (the world built by
``ditron.init(group=g)`` from ``g``, or the whole job's ranks for a world on the whole job).  Anything else (another
group, another reduce op, a gathered tensor used as the right operand, ``addmm``/``bmm``, other dtypes, no ditron
world at compile time) is left alone.  The all-gather stays in the graph when its result has users other than the
rewritten ``mm`` (e.g. the backward's ``dB = all_gather(A)^T @ dC``); the ``mm`` feeding a rewritten reduce-scatter
goes when it has no other users (dead code).
"""
from __future__ import annotations

import contextlib
import hashlib

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

#: the nodes rewritten by the last runs of the pass: ``[(graph id, "ag_gemm" | "gemm_rs"), ...]`` (for tests/debugging)
LOG: list = []


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


def rewrite(graph: torch.fx.Graph, world=None) -> list:
    """Rewrite ``graph`` in place (the patterns of the module docstring); returns the ops inserted, in order."""
    import ditron.torch_ops  # noqa: F401 -- registers torch.ops.ditron.*
    world = world if world is not None else _world()
    if world is None:
        return []
    c10d = torch.ops._c10d_functional
    aten = torch.ops.aten
    W = world.world_size
    done = []
    for node in list(graph.nodes):
        # all_gather_into_tensor -> wait_tensor -> mm(gathered, b)
        if node.op == "call_function" and node.target is c10d.all_gather_into_tensor.default:
            x, size, group = node.args[:3]
            if not (_ok_2d(x) and _group_is_world(group, size, world)):
                continue
            for wait in [u for u in node.users if u.target is c10d.wait_tensor.default]:
                for mm in [u for u in wait.users if u.target is aten.mm.default]:
                    if mm.args[0] is not wait or mm.args[1] is wait or not _ok_2d(mm.args[1]):
                        continue
                    with graph.inserting_before(mm):
                        new = graph.call_function(torch.ops.ditron.ag_gemm.default, (x, mm.args[1], W))
                    _copy_meta(new, mm)
                    mm.replace_all_uses_with(new)
                    graph.erase_node(mm)
                    done.append("ag_gemm")
        # mm(a, b) -> reduce_scatter_tensor(sum) -> wait_tensor
        elif node.op == "call_function" and node.target is c10d.reduce_scatter_tensor.default:
            p, op, size, group = node.args[:4]
            if not (isinstance(p, torch.fx.Node) and p.target is aten.mm.default and op == "sum"
                    and _ok_2d(p.args[0]) and _ok_2d(p.args[1]) and _group_is_world(group, size, world)):
                continue
            M = _val(p.args[0]).shape[0]
            if not isinstance(M, int) or M % W:
                continue
            waits = [u for u in node.users if u.target is c10d.wait_tensor.default]
            if len(waits) != 1 or len(node.users) != 1:
                continue
            wait = waits[0]
            with graph.inserting_before(wait):
                new = graph.call_function(torch.ops.ditron.gemm_rs.default, (p.args[0], p.args[1], W))
            _copy_meta(new, wait)
            wait.replace_all_uses_with(new)
            graph.erase_node(wait)
            graph.erase_node(node)
            if not p.users:
                graph.erase_node(p)
            done.append("gemm_rs")
    if done:
        graph.lint()
    LOG.extend((id(graph), d) for d in done)
    return done


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
