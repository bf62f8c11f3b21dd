"""The per-phase account of EP dispatch + combine (``ditron bench ep --trace``).

Two parts, per mode and token count, on one eager ``dispatch -> combine``
call after a warm-up call (compiles first):

* host work: every aten op the call runs is seen by a ``TorchDispatchMode``
  (the EP kernels' own launches are not, they are counted by
  ``kernels/ep.py``'s ``_launch``): tensors allocated (outputs that share no
  storage with an input), memsets (``zeros``, ``fill_``, ...), host syncs
  (``item``, ``nonzero``, device-to-host copies, ...), other device ops (each
  one launch or more), and on CUDA the GPU kernels the profiler sees;
* kernel phases: the EP kernels compiled with ``TRACE=True`` write their
  programs' ``dl.clock_ns`` (``%globaltimer`` on NVIDIA) at the end of each
  phase into ``ctx.trace_buf``; the report gives, per kernel, when the last
  program ended each phase, from the kernel's first program start, and the
  gaps between the kernels (launch latency).

On the simulator the times are the interpreter's (meaningless) but every
path runs; the counts are the real ones (the simulator's own work inside a
launch is not counted; with several simulated ranks the cross-rank argument
check of every zoo op, on by default there, writes its fingerprint: two
``copy_`` per op, absent on GPUs unless ``DITRON_DEBUG=1``).
"""
from __future__ import annotations

import contextlib

_MEMSET = {"zero_", "fill_", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros",
           "new_ones", "new_full", "scalar_tensor"}
_SYNC = {"_local_scalar_dense", "item", "nonzero", "equal", "is_nonzero", "unique", "_unique2", "masked_select",
         "repeat_interleave"}
_META = {"detach", "alias", "lift_fresh", "_to_copy_meta", "set_", "resize_"}


def _host_counter():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def tensors(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from tensors(v)
        elif isinstance(x, dict):
            for v in x.values():
                yield from tensors(v)

    class HostCount(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.paused = 0
            self.ops = {}
            self.counts = {"allocations": 0, "memsets": 0, "host syncs": 0, "device ops": 0}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if self.paused:
                return out
            name = func.overloadpacket.__name__
            ins = list(tensors(args)) + list(tensors(kwargs))
            outs = list(tensors(out))
            in_st = {t.untyped_storage().data_ptr() for t in ins if t.numel()}
            fresh = [t for t in outs if t.numel() and t.untyped_storage().data_ptr() not in in_st]
            view = bool(getattr(func, "is_view", False)) or (outs and not fresh and name not in _MEMSET and
                                                            not name.endswith("_"))
            d2h = name in ("_to_copy", "copy_") and any(t.device.type != "cpu" for t in ins) and \
                any(t.device.type == "cpu" for t in outs)
            kinds = []
            if fresh:
                kinds.append("allocations")
            if name in _MEMSET:
                kinds.append("memsets")
            if name in _SYNC or d2h:
                kinds.append("host syncs")
            if not view and name not in _META and name not in ("empty", "empty_strided", "empty_like"):
                kinds.append("device ops")
            for k in kinds:
                self.counts[k] += 1
            if kinds:
                self.ops[name] = self.ops.get(name, 0) + 1
            return out

    return HostCount()


@contextlib.contextmanager
def _paused(counter):
    counter.paused += 1
    try:
        yield
    finally:
        counter.paused -= 1


def host_account(run, device):
    """Counts of one call of ``run()`` (see the module docstring)."""
    import torch

    from ..kernels import ep
    counter = _host_counter()
    launches = {}

    def hook(name):
        launches[name] = launches.get(name, 0) + 1
        return _paused(counter)
    ep.LAUNCH_HOOKS.append(hook)
    try:
        with counter:
            run()
    finally:
        ep.LAUNCH_HOOKS.remove(hook)
    res = dict(counter.counts)
    res["EP kernel launches"] = sum(launches.values())
    res["ops"] = dict(sorted(counter.ops.items()))
    res["ep launches"] = launches
    if str(device).startswith("cuda"):
        try:
            from torch.profiler import ProfilerActivity, profile
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
            res["GPU kernels (profiler)"] = sum(1 for e in prof.events()
                                                if e.device_type == torch.autograd.DeviceType.CUDA)
        except Exception as e:  # noqa: BLE001 -- the profiler is optional
            res["GPU kernels (profiler)"] = f"n/a ({type(e).__name__})"
    return res


def kernel_phases(ctx, run, device):
    """Per traced kernel: ``(name, [(phase, end_us)], span_us, start_us)``, the
    times from the first program start of the route kernel."""
    from ..kernels import ep
    ctx.trace = True
    try:
        run()                      # compiles the TRACE variants
        _sync(device)
        ctx.trace_buf.zero_()
        run()
        _sync(device)
        rec = ctx.trace_buf.cpu()
    finally:
        ctx.trace = False
    names = {"route": ep.PHASES["route"], **ep.PHASES[ctx.mode]}
    t0 = None
    rows = []
    for i, kname in enumerate(ep.TRACED):
        r = rec[i]
        used = r[:, 0] > 0
        if not bool(used.any()):
            continue
        r = r[used]
        start = int(r[:, 0].min())
        t0 = start if t0 is None else t0
        ends = []
        for j, ph in enumerate(names[kname]):
            col = r[:, j + 1]
            if ph and bool((col > 0).all()):
                ends.append((ph, (int(col.max()) - start) / 1e3))
        span = (int(r[:, 1:].max()) - start) / 1e3
        rows.append((kname, ends, span, (start - t0) / 1e3, int(used.sum())))
    return rows


def _sync(device):
    import torch
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def report(label, mode, host, phases):
    """Markdown lines of one (token count, mode)."""
    md = [f"#### {label}, {mode}", ""]
    cnt = ", ".join(f"{k} {host[k]}" for k in ("allocations", "memsets", "host syncs", "device ops",
                                                "EP kernel launches", "GPU kernels (profiler)") if k in host)
    md.append(f"Host work of one dispatch + combine: {cnt}.")
    if host["ops"]:
        md.append("Torch ops: " + ", ".join(f"{k} x{v}" for k, v in host["ops"].items()) + ".")
    md.append("EP launches: " + ", ".join(f"{k} x{v}" for k, v in host["ep launches"].items()) + ".")
    md += ["", "| kernel | programs | starts at (us) | phases: end of the last program (us from the kernel's start) "
           "| span (us) |", "| --- | --- | --- | --- | --- |"]
    for kname, ends, span, start, progs in phases:
        ph = ", ".join(f"{p} {t:.1f}" for p, t in ends)
        md.append(f"| {kname} | {progs} | {start:.1f} | {ph} | {span:.1f} |")
    return md + [""]
