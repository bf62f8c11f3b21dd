"""The compiled megakernel: device tables, scoreboard, epoch, ``step()``, and
the slot -> (task, tile) map used by hang reports."""
from __future__ import annotations

import re
import weakref
from typing import Optional

from ..errors import DitronError, DitronHangError
from . import codegen, schedule

_SIM_PROGRAMS = 4
_TYPE_NAMES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float64": "fp64",
               "torch.int32": "i32", "torch.int64": "i64", "torch.int16": "i16", "torch.int8": "i8",
               "torch.uint8": "u8", "torch.bool": "i1"}


def _sm_count(device) -> int:
    """SMs this rank may fill: all of the GPU's, or its share when ranks of the world share the GPU."""
    import torch

    from ..runtime import sharing
    return sharing.usable_sms(torch.device(device).index, torch.cuda.get_device_properties(device).multi_processor_count)


def _device_of(graph):
    for t in graph.tasks:
        for v in t.args.values():
            if hasattr(v, "device") and hasattr(v, "data_ptr"):
                return v.device
    import torch
    return torch.device("cpu")


#: programs per SM of the default grid (when the compiled kernel's resources let that many be resident)
DEFAULT_PROGRAMS_PER_SM = 2


def _on_gpu(device) -> bool:
    return getattr(device, "type", "cpu") == "cuda"


def _is_hip() -> bool:
    import torch
    return getattr(torch.version, "hip", None) is not None


def resident_per_sm(props, n_regs: int, shared: int, num_warps: int) -> int:
    """How many programs of a kernel using ``n_regs`` registers per thread and ``shared`` bytes of shared memory
    fit on one SM at once (``props``: ``torch.cuda.get_device_properties``).  NVIDIA's allocation rules:
    registers per warp rounded up to 256, 1 KiB of shared memory reserved per program; at most 32 programs."""
    warp = int(getattr(props, "warp_size", 32) or 32)
    threads = num_warps * warp
    by_threads = int(getattr(props, "max_threads_per_multi_processor", 2048)) // threads
    regs_sm = int(getattr(props, "regs_per_multiprocessor", 65536))
    per_warp = -(-max(int(n_regs), 1) * warp // 256) * 256
    by_regs = (regs_sm // per_warp) // num_warps
    smem_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0)
    by_smem = smem_sm // (int(shared) + 1024) if shared and smem_sm else 32
    return max(0, min(by_threads, by_regs, by_smem, 32))


class Megakernel:
    """One persistent kernel running every tile of a :class:`TaskGraph`.

    ``source`` is the generated kernel's text; ``step()`` runs the graph once
    (one launch; CUDA-graph capturable).  Buffers: ``slots`` (the scoreboard,
    one int32 per tile plus one unused sink slot), ``epoch`` (int32, the step
    number, incremented on the stream before each launch), ``counter``
    (dynamic scheduler), and the int32 tables ``items``, ``queue``, ``deps``.
    """

    def __init__(self, graph, scheduler="round_robin", num_programs: Optional[int] = None, num_warps: int = 4,
                 trace: bool = False, maxnreg: Optional[int] = None, programs_per_sm: Optional[int] = None,
                 wait_acquire: str = "fence", noinline_branches: bool = False, _plant_missing_release=None):
        import torch
        if not graph.tasks:
            raise DitronError(f"TaskGraph '{graph.name}' has no tasks")
        self.graph = graph
        self.items = graph.items()
        self.device = _device_of(graph)
        self.scheduler, _ = schedule.resolve(scheduler)
        self.dynamic = self.scheduler == schedule.DYNAMIC
        if num_programs is not None and (not isinstance(num_programs, int) or isinstance(num_programs, bool)
                                         or num_programs < 1):
            raise DitronError(f"num_programs must be a positive int, got {num_programs!r}")
        self.num_warps = num_warps
        if maxnreg is not None and (not isinstance(maxnreg, int) or isinstance(maxnreg, bool)
                                    or not 24 <= maxnreg <= 255):
            raise DitronError(f"maxnreg must be an int in 24..255 (registers per thread), got {maxnreg!r}")
        #: register cap per thread passed to ptxas (NVIDIA; the heaviest branch sets the kernel's registers, and a
        #: cap lets more programs be resident at the price of spills); ``None``: ptxas chooses
        self.maxnreg = maxnreg
        self.trace_enabled = bool(trace)
        if wait_acquire not in ("fence", "load"):
            raise DitronError(f"wait_acquire must be 'fence' or 'load' (how the scoreboard waits acquire on NVIDIA: "
                              f"dl.wait_deps(acquire=...)), got {wait_acquire!r}")
        #: ``dl.wait_deps(acquire=...)`` of the dependency waits before each tile
        self.wait_acquire = wait_acquire
        #: each branch a called (``noinline``) function instead of inlined into the item loop (codegen.py)
        self.noinline_branches = bool(noinline_branches)
        self.code = codegen.generate(graph, self.dynamic, trace=self.trace_enabled, wait_acquire=wait_acquire,
                                     noinline_branches=self.noinline_branches)
        self.source = self.code.source
        self.kernel = self.code.load()
        self.sink_slot = graph.num_slots
        self._scheduler_arg = scheduler
        self._planted = self._planted_item(_plant_missing_release)
        i32 = dict(dtype=torch.int32, device=self.device)
        self.slots = torch.zeros(graph.num_slots + 1, **i32)
        # one epoch per graph, shared by every kernel compiled from it: the communication tasks' signal
        # values (the epoch) then never repeat, whichever of them runs a step
        if getattr(graph, "_epoch", None) is None or graph._epoch.device != self.device:
            graph._epoch = torch.zeros(1, **i32)
        self.epoch = graph._epoch
        self.counter = torch.zeros(1, **i32)
        self.trace_buf = torch.zeros(4 * len(self.items) if trace else 1, dtype=torch.int64, device=self.device)
        self.steps = 0
        self.resources = None
        if programs_per_sm is not None and (not isinstance(programs_per_sm, int) or isinstance(programs_per_sm, bool)
                                            or not 1 <= programs_per_sm <= 32):
            raise DitronError(f"programs_per_sm must be an int in 1..32, got {programs_per_sm!r}")
        if num_programs is None:
            per_sm = programs_per_sm or DEFAULT_PROGRAMS_PER_SM
            P = per_sm * _sm_count(self.device) if _on_gpu(self.device) else _SIM_PROGRAMS
        else:
            P = num_programs
        self._build_rows()
        self._set_programs(P)
        if _on_gpu(self.device):
            self._check_residency(explicit=num_programs is not None)
        self._finish_init()

    def _build_rows(self):
        """The item rows (topological order) and the dependency table: independent of the grid."""
        import torch
        rows, dep_rows = [], []
        self._waits = []                       # per item: [(first slot, count)] it depends on (declared)
        for it in self.items:
            self._waits.append(it.task.tile_ranges(it.tile))
            ranges = it.task.wait_ranges(it.tile)  # ... of which the megakernel waits on (not Dep(inner=True))
            sc = list(it.task.scalars.values()) + [0] * (4 - len(it.task.scalars))
            slot = self.sink_slot if it.index == self._planted else it.slot
            first, rest = (ranges[0], ranges[1:]) if ranges else ((0, 0), [])
            rows.append([self.code.task_branch[it.task.index], it.tile, slot, first[0], first[1], len(dep_rows),
                         len(dep_rows) + len(rest), *sc, it.index])
            dep_rows.extend(rest)
        assert all(len(r) == codegen.ENTRY for r in rows)
        self._rows = rows
        self.dep_table = torch.tensor(dep_rows or [[0, 0]], dtype=torch.int32, device=self.device).reshape(-1)

    def _set_programs(self, P):
        """(Re)build the per-program queues, the item table in their order and the queue table for a grid of
        ``P`` programs."""
        import torch
        self.num_programs = min(P, len(self.items))
        self.queues = schedule.make_queues(self._scheduler_arg, self.items, self.num_programs)
        i32 = dict(dtype=torch.int32, device=self.device)
        if self.queues is None:                # dynamic: rows in topological order, taken by ticket
            self.item_table = torch.tensor(self._rows, **i32).reshape(-1)
            queue = [0] * (self.num_programs + 1)
        else:                                  # static: rows in queue order; queue = row offsets per program
            order = [j for q in self.queues for j in q]
            self.item_table = torch.tensor([self._rows[j] for j in order], **i32).reshape(-1)
            queue = [0]
            for q in self.queues:
                queue.append(queue[-1] + len(q))
        self.queue_table = torch.tensor(queue, **i32)
        self._args = [self.item_table, self.queue_table, self.dep_table, self.slots, self.epoch, self.counter,
                      len(self.items)] + ([self.trace_buf] if self.trace_enabled else []) + \
            [t for _, t in self.code.tensor_params] + [v for _, v in self.code.scalar_params]

    def _check_residency(self, explicit: bool):
        """Compile now and make sure every program of the grid can be resident at once (a persistent kernel whose
        programs wait on each other deadlocks otherwise): a default grid shrinks to what fits, an explicit
        ``num_programs`` that does not fit is an error before any launch."""
        import torch
        ck = self.kernel.warmup(*self._args, grid=(self.num_programs,), **self._launch_options())
        init = getattr(ck, "_init_handles", None)
        if init is not None:
            init()
        n_regs = getattr(ck, "n_regs", None)
        shared = getattr(getattr(ck, "metadata", None), "shared", 0) or 0
        if not n_regs:
            return
        props = torch.cuda.get_device_properties(self.device)
        per_sm = resident_per_sm(props, n_regs, shared, self.num_warps)
        sms = _sm_count(self.device)            # this rank's share of the SMs when ranks share the GPU
        self.resources = {"n_regs": int(n_regs), "n_spills": int(getattr(ck, "n_spills", 0) or 0),
                          "shared": int(shared), "resident_per_sm": per_sm, "sms": sms}
        fit = per_sm * sms
        if self.num_programs <= fit:
            return
        if explicit or fit < 1:
            raise DitronError(
                f"megakernel '{self.graph.name}': num_programs={self.num_programs} programs cannot all be resident "
                f"on this GPU ({sms} SMs x {per_sm} programs per SM: {n_regs} registers per thread, {shared} bytes "
                f"of shared memory, {self.num_warps} warps); programs that wait on each other would deadlock. Use "
                f"num_programs <= {fit}, fewer warps, or smaller tiles")
        self._set_programs(fit)

    def _finish_init(self):
        graph = self.graph
        if getattr(graph, "_comm_pools", None):
            self._check_same_graph()
            # every rank's staging and signal words are zeroed (on its stream) before any rank's first
            # step can signal into them
            from ..runtime.world import barrier_all
            barrier_all()
        from ..runtime.heap import add_address_namer
        ref = weakref.ref(self)
        self._namer = lambda addr: (lambda mk: mk.describe_address(addr) if mk is not None else None)(ref())
        add_address_namer(self._namer)

    def _check_same_graph(self):
        """The communication tasks of a graph are collective: every rank must register the same ones, in the
        same order, with the same tiles (compute tasks may differ per rank, e.g. an uneven split).  Compared
        across ranks (simulator always, GPUs under DITRON_DEBUG=1) so that graphs of different sizes are an
        error naming what differs, not a hang."""
        import hashlib
        from ..runtime.consistency import CallBoard
        from ..runtime.world import current_world
        from .comm import barrier_tile, exchange_tile
        world = current_world(required=False)
        if world is None or world.world_size == 1:
            return
        comm = [(t.name, t.num_tiles, t.fn.fn.__name__) for t in self.graph.tasks
                if t.fn in (exchange_tile, barrier_tile)]
        digest = hashlib.sha1(repr(comm).encode()).hexdigest()[:12]
        board = CallBoard(world, f"megakernel '{self.graph.name}'")
        board.check("TaskGraph.compile", [("graph", self.graph.name), ("communication tasks", len(comm)),
                                          ("communication tiles", sum(n for _, n, _ in comm)),
                                          ("communication tasks and tiles (digest)", digest)])

    def __del__(self):
        namer = self.__dict__.get("_namer")
        if namer is None:
            return
        try:
            from ..runtime.heap import remove_address_namer
        except ImportError:                    # interpreter shutdown
            return
        remove_address_namer(namer)

    def _planted_item(self, plant):
        """Test hook: ``(task name, tile)`` whose release goes to the sink slot
        (its consumers then wait forever -- a planted missing dependency)."""
        if plant is None:
            return None
        name, tile = plant
        for it in self.items:
            if it.task.name == name and it.tile == tile:
                return it.index
        raise DitronError(f"_plant_missing_release: no item {name}[{tile}]")

    def signature(self) -> dict:
        """Parameter types of the generated kernel, for ``ditron.compile``
        (ahead-of-time compilation without a GPU, e.g. for sm_90a / gfx942)."""
        sig = {n: "*i32" for n in ("items_ptr", "queue_ptr", "deps_ptr", "slots_ptr", "epoch_ptr", "counter_ptr")}
        sig["n_items"] = "i32"
        if self.trace_enabled:
            sig["trace_ptr"] = "*i64"
        for name, t in self.code.tensor_params:
            sig[name] = "*" + _TYPE_NAMES[str(t.dtype)]
        for name, v in self.code.scalar_params:
            sig[name] = "fp32" if isinstance(v, float) else "i32"
        return sig

    def _launch_options(self) -> dict:
        opts = {"num_warps": self.num_warps}
        if self.maxnreg is not None and _on_gpu(self.device) and not _is_hip():
            opts["maxnreg"] = self.maxnreg      # a ptxas option: no meaning on the simulator or AMD
        return opts

    # -- running ------------------------------------------------------------------------
    def step(self):
        """Run the graph once: bump the epoch (and reset the dynamic counter)
        on the current stream, then launch the persistent kernel."""
        self.epoch.add_(1)
        if self.dynamic:
            self.counter.zero_()
        self.steps += 1
        try:
            with self._access_check():
                self.kernel[(self.num_programs,)](*self._args, **self._launch_options())
        except DitronHangError as e:
            raise DitronHangError(f"megakernel '{self.graph.name}' (step {self.steps}) stopped; blocked waits:",
                                  [self._explain(dict(entry)) for entry in e.report]) from e

    __call__ = step

    def _access_check(self):
        """On the simulator: every load and store of the tiles is checked against the tasks' reads, writes and
        Deps (:mod:`ditron.sim.taskcheck`); on GPUs nothing."""
        import contextlib
        if _on_gpu(self.device):
            return contextlib.nullcontext()
        from ..runtime.world import current_world
        from ..sim import taskcheck
        world = current_world(required=False)
        return taskcheck.checking(self, world.heap.contains if world is not None else (lambda t: False))

    # -- tracing ---------------------------------------------------------------------------
    def trace(self):
        """Per-item records of the last step (``[n_items, 4]`` int64 on the host: ``clock_ns`` at the item's
        start, when its dependencies were satisfied, after its release; the program that ran it).  Needs
        ``compile(trace=True)``; synchronises with the device."""
        if not self.trace_enabled:
            raise DitronError(f"megakernel '{self.graph.name}' was compiled without tracing; use "
                              "g.compile(..., trace=True)")
        if self.steps == 0:
            raise DitronError(f"megakernel '{self.graph.name}': no step has run yet, nothing to trace")
        return self.trace_buf.reshape(-1, 4).cpu()

    def profile(self):
        """:class:`ditron.task.profile.Profile` of the last step: time per kind of task (``print(p.table())``)."""
        from .profile import summarize
        return summarize(self.items, self.trace().tolist(), self.num_programs)

    def critical_path(self):
        """:class:`ditron.task.profile.CriticalPath` of the last step: the chain of tiles that ended it, split into
        tile run time, scoreboard signal latency and program queueing per kind of task."""
        from .profile import critical_path
        return critical_path(self.items, self.trace().tolist())

    # -- reports ---------------------------------------------------------------------------
    def slot_info(self, slot: int):
        """``(task name, tile, scalars)`` of scoreboard slot ``slot`` (None for the sink)."""
        if 0 <= slot < len(self.items):
            it = self.items[slot]
            return it.task.name, it.tile, dict(it.task.scalars)
        return None

    def describe_address(self, addr: int):
        base = self.slots.data_ptr()
        off = addr - base
        if not 0 <= off < 4 * self.slots.numel() or off % 4:
            return None
        slot = off // 4
        info = self.slot_info(slot)
        if info is None:
            return f"megakernel '{self.graph.name}' scoreboard sink slot {slot}"
        name, tile, sc = info
        return (f"megakernel '{self.graph.name}' scoreboard slot {slot} = task '{name}' tile {tile}"
                + (f" {sc}" if sc else ""))

    def _explain(self, entry):
        """Add task / tile / slot of the slot a ``dl.wait_deps`` is blocked on and
        the waiting task / tile to a hang-report entry."""
        if entry.get("primitive") != "dl.wait_deps":
            return entry
        m = re.search(rf"megakernel '{re.escape(self.graph.name)}' scoreboard slot (\d+)", str(entry.get("signal")))
        if m is None:
            return entry
        slot = int(m.group(1))
        entry["slot"] = slot
        entry["task"], entry["tile"], _ = self.slot_info(slot)
        epoch = int(self.epoch.reshape(-1)[0])
        done = self.slots.cpu()
        waiting = [it for it in self.items if int(done[it.slot]) < epoch and
                   any(f <= slot < f + n for f, n in self._waits[it.index])]
        pid = (entry.get("program") or (None,))[0]
        if self.queues is not None and pid is not None and pid < len(self.queues):
            mine = [it for it in waiting if it.index in set(self.queues[pid])]
            waiting = mine or waiting
        if waiting:
            entry["waiting_task"], entry["waiting_tile"] = waiting[0].task.name, waiting[0].tile
            entry["signal"] = (f"{entry['signal']} -- waited on by task '{waiting[0].task.name}' tile "
                               f"{waiting[0].tile}; task '{entry['task']}' tile {entry['tile']} has not released "
                               f"it in step {epoch}")
        return entry
