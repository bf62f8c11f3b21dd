"""``triton_dist.profiler_utils.perf_func`` on ditron: average time of
``func()`` (CUDA events on GPUs, wall clock on the simulator)."""
import time

import torch


def perf_func(func, iters, warmup_iters):
    """Run ``func`` ``warmup_iters`` times, then ``iters`` times; return
    ``(last output, milliseconds per call)``."""
    import ditron
    world = ditron.current_world(required=False)
    gpu = torch.cuda.is_available() and not (world is not None and world.backend == "sim")
    for _ in range(warmup_iters):
        func()
    output = None
    if gpu:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            output = func()
        stop.record()
        torch.cuda.synchronize()
        return output, start.elapsed_time(stop) / max(iters, 1)
    t0 = time.perf_counter()
    for _ in range(iters):
        output = func()
    return output, (time.perf_counter() - t0) * 1e3 / max(iters, 1)
