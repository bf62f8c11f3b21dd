"""Code generation: one readable persistent ``@ditron.jit`` kernel for a task
graph.

Tasks that share a tile function, the same ``args`` (tensors by pointer and
dtype, equal constants) and the same scalar names share one *branch*; the
kernel has one ``if branch == k`` per branch, not per task.  The source is
written to ``$DITRON_CACHE_DIR/megakernel/<graph>_<hash>.py`` (so Triton can
read it) and imported with the tile functions as module globals.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field

from .. import _compat
from .common import EPOCH, MAX_SCALARS, TASK_SLOTS, _is_tensor

#: int32 words per work item in the item table: its branch and tile, its scoreboard slot, its first dependency
#: range inline (first slot, count), the rest in the dependency table (rows dep_lo .. dep_hi), up to 4 scalars,
#: and its index in topological order.  Static schedulers lay the rows out in queue order (program 0's items,
#: then program 1's, ...), so a program reads its next row without first reading an item index.
FIELDS = ("branch", "tile", "slot", "d0_first", "d0_count", "dep_lo", "dep_hi", "s0", "s1", "s2", "s3", "item")
ENTRY = len(FIELDS)
F = {name: i for i, name in enumerate(FIELDS)}


@dataclass
class Branch:
    index: int
    fn: object
    fn_name: str                     # global name in the generated module
    tasks: list = field(default_factory=list)
    call_args: list = field(default_factory=list)     # one source expression per parameter after the tile
    prefetch_name: str = ""                            # global name of the prefetch function ('' if none)
    prefetch_args: list = field(default_factory=list)


@dataclass
class Generated:
    source: str
    kernel_name: str
    branches: list
    task_branch: dict               # task index -> branch index
    tensor_params: list             # [(param name, tensor)]
    scalar_params: list             # [(param name, value)]
    globals: dict                   # tile-function globals of the module
    path: str = ""

    def load(self):
        """Write the source under the ditron cache dir (once per content hash)
        and import it; returns the ``@ditron.jit`` kernel."""
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:16]
        d = os.path.join(_compat.ditron_cache_dir(), "megakernel")
        os.makedirs(d, exist_ok=True)
        self.path = os.path.join(d, f"{self.kernel_name}_{digest}.py")
        if not os.path.exists(self.path):
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(self.source)
            os.replace(tmp, self.path)
        modname = f"ditron_megakernel_{self.kernel_name}_{digest}_{id(self):x}"
        spec = importlib.util.spec_from_file_location(modname, self.path)
        module = importlib.util.module_from_spec(spec)
        module.__dict__.update(self.globals)
        sys.modules[modname] = module
        spec.loader.exec_module(module)
        return getattr(module, self.kernel_name)


def _branch_key(task):
    parts = [id(task.fn), id(task.prefetch)]
    for k in sorted(task.args):
        v = task.args[k]
        if _is_tensor(v):
            parts.append((k, "tensor", v.data_ptr(), str(v.dtype), str(v.device)))
        elif v is EPOCH:
            parts.append((k, "epoch"))
        elif v is TASK_SLOTS:
            parts.append((k, "task_slots"))
        else:
            parts.append((k, type(v).__name__, v))
    parts.append(tuple(task.scalars))
    return tuple(parts)


def _literal(v):
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return f"float({str(v)!r})"
    return repr(v)


def _global_name(fn, fn_names, fn_globals, reserved):
    fid = id(fn)
    if fid not in fn_names:
        base = fn.fn.__name__
        name = base
        while name in fn_globals or name in reserved:
            name = f"{base}_{len(fn_globals)}"
        fn_names[fid] = name
        fn_globals[name] = fn
    return fn_names[fid]


def generate(graph, dynamic: bool, trace: bool = False, wait_acquire: str = "fence",
             noinline_branches: bool = False) -> Generated:
    kname = f"{graph.name}_megakernel"
    branches: list[Branch] = []
    by_key: dict = {}
    task_branch = {}
    tensors: dict = {}              # (data_ptr, dtype, device) -> param name
    tensor_params, scalar_params, fn_globals = [], [], {}
    fn_names: dict = {}
    for task in graph.tasks:
        key = _branch_key(task)
        if key in by_key:
            b = by_key[key]
            b.tasks.append(task)
            task_branch[task.index] = b.index
            continue
        reserved = ("triton", "tl", "ditron", "dl", kname)
        b = Branch(len(branches), task.fn, _global_name(task.fn, fn_names, fn_globals, reserved), [task])
        const = {p for p, c in task.params + task.prefetch_params if c}
        scalar_slot = {k: i for i, k in enumerate(task.scalars)}
        exprs = {}                  # parameter -> source expression (no consume_token)
        for p, _ in task.params[1:] + task.prefetch_params[1:]:
            if p in exprs:
                continue
            if p in scalar_slot:
                exprs[p] = f"s{scalar_slot[p]}"
                continue
            v = task.args[p]
            if v is EPOCH:
                exprs[p] = "epoch"
            elif v is TASK_SLOTS:
                exprs[p] = "slots_ptr + (slot - tile)"
            elif _is_tensor(v):
                tk = (v.data_ptr(), str(v.dtype), str(v.device))
                if tk not in tensors:
                    tensors[tk] = f"t{len(tensors)}_{p}"
                    tensor_params.append((tensors[tk], v))
                exprs[p] = tensors[tk]
            elif p in const:
                exprs[p] = _literal(v)
            else:
                pname = f"b{b.index}_{p}"
                scalar_params.append((pname, v))
                exprs[p] = pname
        b.call_args = [f"dl.consume_token({exprs[p]}, tok)" if p in task.reads and _is_tensor(task.args.get(p))
                       else exprs[p] for p, _ in task.params[1:]]
        if task.prefetch is not None:
            b.prefetch_name = _global_name(task.prefetch, fn_names, fn_globals, reserved)
            b.prefetch_args = [exprs[p] for p, _ in task.prefetch_params[1:]]
        by_key[key] = b
        task_branch[task.index] = b.index
        branches.append(b)
    n_scalars = max([len(t.scalars) for t in graph.tasks] + [0])
    assert n_scalars <= MAX_SCALARS
    src = _source(graph, kname, branches, tensor_params, scalar_params, n_scalars, dynamic, trace, wait_acquire,
                  noinline_branches)
    return Generated(src, kname, branches, task_branch, tensor_params, scalar_params, fn_globals)


def _source(graph, kname, branches, tensor_params, scalar_params, n_scalars, dynamic, trace, wait_acquire="fence",
            noinline_branches=False):
    params = ["items_ptr", "queue_ptr", "deps_ptr", "slots_ptr", "epoch_ptr", "counter_ptr", "n_items"]
    if trace:
        params.append("trace_ptr")
    params += [n for n, _ in tensor_params] + [n for n, _ in scalar_params]
    L = [f"# Generated by ditron.task from TaskGraph '{graph.name}': {len(graph.tasks)} tasks, "
         f"{graph.num_slots} tiles, {len(branches)} branches.",
         f"# Scheduler: {'dynamic (device work queue, dl.fetch_task)' if dynamic else 'static per-program queues'}.",
         *(["# Trace: int64 x 4 per item: clock_ns at start, after the dependency wait, after the release; program."]
           if trace else []),
         "# Item table: int32 x %d per item: %s." % (ENTRY, ", ".join(FIELDS)),
         "# Scoreboard: one int32 slot per (task, tile); a slot holds the epoch of the last step that released it.",
         "#", "# tasks (scoreboard slots):"]
    for t in graph.tasks:
        L.append(f"#   {t.name}: slots [{t.slot_base}, {t.slot_base + t.num_tiles}), {t.fn.fn.__name__}"
                 + (f", scalars {t.scalars}" if t.scalars else ""))
    L += ["import triton", "import triton.language as tl", "", "import ditron", "import ditron.language as dl",
          "", "", "@ditron.jit", *_wrap(f"def {kname}(", params, "):"),
          "    pid = tl.program_id(0)",
          "    epoch = tl.load(epoch_ptr)           # this step's number (incremented on the stream by step())"]
    ind = "        "
    fields = ["branch", "tile", "slot", "d0_first", "d0_count", "dep_lo", "dep_hi"] + \
        [f"s{i}" for i in range(n_scalars)] + (["item"] if trace else [])
    if dynamic:
        L += ["    ticket = dl.fetch_task(counter_ptr)     # a ticket = the next item in topological order",
              "    while ticket < n_items:",
              f"{ind}entry = items_ptr + ticket * {ENTRY}"]
        L += [f"{ind}{name} = tl.load(entry + {F[name]})" for name in fields]
    else:
        L += ["    # this program's rows of the item table: [queue_ptr[pid], queue_ptr[pid + 1]); the fields of the next",
              "    # row are loaded while the current tile runs (loop-carried nx_* values)",
              "    q_lo = tl.load(queue_ptr + pid)",
              "    q_hi = tl.load(queue_ptr + pid + 1)"]
        L += [f"    nx_{name} = tl.load(items_ptr + q_lo * {ENTRY} + {F[name]}, mask=q_lo < q_hi, other=0)"
              for name in fields]
        L += ["    for q in range(q_lo, q_hi):"]
        L += [f"{ind}{name} = nx_{name}" for name in fields]
        L += [f"{ind}nxt = items_ptr + (q + 1) * {ENTRY}"]
        L += [f"{ind}nx_{name} = tl.load(nxt + {F[name]}, mask=q + 1 < q_hi, other=0)" for name in fields]
    if trace:
        L.append(f"{ind}t_start = dl.clock_ns()")
    pf = [b for b in branches if b.prefetch_name]
    if pf:
        L.append(f"{ind}# prefetch (before the wait): data no producer writes")
        for i, b in enumerate(pf):
            L.append(f"{ind}{'if' if i == 0 else 'elif'} branch == {b.index}:")
            L.append(f"{ind}    {b.prefetch_name}(tile, {', '.join(b.prefetch_args)})")
    acq = ', acquire="load"' if wait_acquire == "load" else ""        # Megakernel(wait_acquire=...)
    wrappers = []
    L += [f"{ind}# wait for the producer tiles of each dependency range (acquire)",
          f"{ind}tok = dl.wait_deps(slots_ptr + d0_first, d0_count, epoch{acq})",
          f"{ind}for d in range(dep_lo, dep_hi):",
          f"{ind}    tok += dl.wait_deps(slots_ptr + tl.load(deps_ptr + 2 * d), tl.load(deps_ptr + 2 * d + 1), "
          f"epoch{acq})"]
    if trace:
        L.append(f"{ind}t_ready = dl.clock_ns()")
    for b in branches:
        kw = "if" if b.index == 0 else "elif"
        names = [t.name for t in b.tasks]
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} tasks)" if len(names) > 6 else "")
        pnames = [p for p, _ in b.tasks[0].params]
        L.append(f"{ind}{kw} branch == {b.index}:")
        L.append(f"{ind}    # {shown}")
        L.append(f"{ind}    # {b.fn_name}({', '.join(pnames)})")
        if noinline_branches:
            # the branch as a called function (``noinline``): what its tile function computes before its loops
            # (offsets, masks, ...) stays in it, where otherwise LLVM hoists it out of the item loop and holds it
            # in registers across every other branch (the Qwen3-8B whole step spilled 276 B per thread under
            # Triton 3.6, reloaded inside the GEMV K loops; 0 B this way)
            L.append(f"{ind}    _branch_{b.index}(tile, {', '.join(b.call_args)})")
            wrappers += ["", "", "@triton.jit(noinline=True)",
                         f"def _branch_{b.index}(tile, {', '.join(pnames[1:])}):",
                         f"    {b.fn_name}(tile, {', '.join(pnames[1:])})"]
        else:
            L.append(f"{ind}    {b.fn_name}(tile, {', '.join(b.call_args)})")
    L += [f"{ind}dl.release_tile(slots_ptr + slot, epoch)   # release: this tile's writes are visible"]
    if trace:
        L += [f"{ind}t_rec = trace_ptr + item.to(tl.int64) * 4      # trace records are in item order",
              f"{ind}tl.store(t_rec, t_start)",
              f"{ind}tl.store(t_rec + 1, t_ready)",
              f"{ind}tl.store(t_rec + 2, dl.clock_ns())",
              f"{ind}tl.store(t_rec + 3, pid.to(tl.int64))"]
    if dynamic:
        L.append(f"{ind}ticket = dl.fetch_task(counter_ptr)")
    return "\n".join(L + wrappers) + "\n"


def _wrap(head, names, tail, width=110):
    lines, cur = [], head
    for i, n in enumerate(names):
        piece = n + (", " if i < len(names) - 1 else "")
        if len(cur) + len(piece) > width and cur.strip():
            lines.append(cur.rstrip())
            cur = " " * len(head) + piece
        else:
            cur += piece
    lines.append(cur + tail)
    return lines
