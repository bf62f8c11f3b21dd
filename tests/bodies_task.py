"""Test bodies (run on every rank) for ditron.task megakernels: small graphs
of elementwise / row-sum tile functions checked against torch."""
import time

import torch
import triton
import triton.language as tl

import ditron
import ditron.language as dl
import ditron.task as dtask


@triton.jit
def scale_add_tile(tile, x, y, out, n, alpha, BLOCK: tl.constexpr):
    """out[tile] = alpha * x[tile] + y[tile] (BLOCK elements per tile, masked tail)."""
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = alpha * tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m)
    tl.store(out + offs, v, mask=m)


@triton.jit
def row_sum_tile(tile, x, out, rows, cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    """out[r] = sum(x[r, :]) for the ROWS rows of this tile."""
    r = tile * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    m = (r[:, None] < rows) & (c[None, :] < cols)
    v = tl.load(x + r[:, None] * cols + c[None, :], mask=m, other=0.0)
    tl.store(out + r, tl.sum(v, axis=1), mask=r < rows)


@triton.jit
def layer_tile(tile, w, x, out, n, layer, BLOCK: tl.constexpr):
    """out[tile] = x[tile] * w[layer, tile] + layer (per-layer weights stacked in w[L, n])."""
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m) * tl.load(w + layer * n + offs, mask=m) + layer
    tl.store(out + offs, v, mask=m)


@triton.jit
def layer_prefetch(tile, w, n, layer, BLOCK: tl.constexpr):
    """Prefetch hook of layer_tile: its slice of w[layer] into L2 (before the dependency wait)."""
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    dl.prefetch_l2(w + layer * n + offs, mask=offs < n)


def _rand(world, shape, seed):
    g = torch.Generator().manual_seed(100 * seed + world.rank)
    return torch.randn(shape, generator=g).to(world.device)


def chain_graph(world, n=37, block=8, rows=5, layers=3, prefetch=False):
    """a: t = 2x + y (5 tiles); b: u = t + 3*t  (Dep same); c: row sums of u viewed
    as [rows, n//rows...] with range deps; then `layers` stacked layer tasks sharing
    one branch."""
    x, y = _rand(world, n, 1), _rand(world, n, 2)
    t, u = torch.zeros_like(x), torch.zeros_like(x)
    cols = n // rows
    s = torch.zeros(rows, device=world.device)
    w = _rand(world, (layers, n), 3)
    h = torch.zeros_like(x)                 # layers run in place on h: layers 1.. share one branch
    g = dtask.TaskGraph("chain")
    nt = triton.cdiv(n, block)
    a = g.register_task(scale_add_tile, name="a", num_tiles=nt,
                        args={"x": x, "y": y, "out": t, "n": n, "alpha": 2.0, "BLOCK": block},
                        reads=("x", "y"), writes=("out",))
    b = g.register_task(scale_add_tile, name="b", num_tiles=nt,
                        args={"x": t, "y": t, "out": u, "n": n, "alpha": 3.0, "BLOCK": block},
                        reads=("x", "y"), writes=("out",), deps=[dtask.Dep(a, "same")])
    rows_per = 2
    # row tile i covers rows [2i, 2i+2) = elements [2i*cols, (2i+2)*cols) of u
    c = g.register_task(row_sum_tile, name="c", num_tiles=triton.cdiv(rows, rows_per),
                        args={"x": u, "out": s, "rows": rows, "cols": cols, "ROWS": rows_per,
                              "COLS": triton.next_power_of_2(cols)},
                        reads=("x",), writes=("out",),
                        deps=[dtask.Dep(b, lambda i: (rows_per * i * cols // block,
                                                      min(nt, triton.cdiv(min(rows, rows_per * (i + 1)) * cols,
                                                                          block))))])
    prev, src = b, u
    for l in range(layers):
        prev = g.register_task(layer_tile, name=f"layer.{l}", num_tiles=nt,
                               args={"w": w, "x": src, "out": h, "n": n, "BLOCK": block},
                               reads=("x", "w"), writes=("out",), deps=[dtask.Dep(prev, "same")],
                               scalars={"layer": l}, prefetch=layer_prefetch if prefetch else None)
        src = h
    ref_t = 2 * x + y
    ref_u = 4 * ref_t
    ref_s = ref_u[:rows * cols].reshape(rows, cols).sum(1)
    ref_h = ref_u
    for l in range(layers):
        ref_h = ref_h * w[l] + l
    outs = (t, u, s, h)
    refs = (ref_t, ref_u, ref_s, ref_h)
    return g, outs, refs


def _steps_match(mk, outs, refs, steps):
    """``steps`` steps of ``mk``, every output zeroed before and compared with torch after each."""
    for _ in range(steps):
        for o in outs:
            o.zero_()
        mk.step()
        for o, r in zip(outs, refs):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def run_chain(world, scheduler="round_robin", num_programs=3, steps=3):
    g, outs, refs = chain_graph(world)
    mk = g.compile(scheduler=scheduler, num_programs=num_programs)
    _steps_match(mk, outs, refs, steps)
    assert int(mk.epoch[0]) == steps
    assert int(mk.slots[:-1].min()) == steps          # every tile released in every step
    return len(mk.code.branches)


def run_chain_traced(world, scheduler="round_robin", num_programs=3, steps=2):
    """The chain graph with prefetch hooks on the layer tasks, compiled with trace=True: outputs match torch, and
    the trace is consistent with the graph (every item's dependency wait ended after its producers' tiles
    started running; static queues: the recorded program is the one whose queue holds the item)."""
    g, outs, refs = chain_graph(world, prefetch=True)
    mk = g.compile(scheduler=scheduler, num_programs=num_programs, trace=True)
    assert "layer_prefetch(tile, " in mk.source
    _steps_match(mk, outs, refs, steps)
    tr = mk.trace().tolist()
    assert len(tr) == len(mk.items)
    for it, (start, ready, end, pid) in zip(mk.items, tr):
        assert 0 < start <= ready <= end, (it, start, ready, end)
        for first, count in it.task.tile_ranges(it.tile):
            for slot in range(first, first + count):
                assert ready >= tr[slot][1], (it, slot)        # slot index == item index (topological order)
        if mk.queues is not None:
            assert it.index in mk.queues[pid], (it, pid)
    prof = mk.profile()
    kinds = {r.kind: r for r in prof.rows}
    assert set(kinds) == {"a", "b", "c", "layer"}, kinds
    assert kinds["layer"].instances == 3 and sum(r.tiles for r in prof.rows) == len(mk.items)
    assert prof.step_us > 0 and 0 < prof.busy <= 1
    assert "| layer | 3 |" in prof.table()
    cp = mk.critical_path()          # the walk back from the last release accounts for the whole step
    parts = sum(r.run_us + r.signal_us + r.queue_us for r in cp.rows)
    assert abs(parts - prof.step_us) < 1e-6 and abs(cp.step_us - prof.step_us) < 1e-6, (parts, prof.step_us)
    assert sum(r.items for r in cp.rows) >= 1 and set(r.kind for r in cp.rows) <= set(kinds)
    return prof.step_us


def planted_missing_release(world, task="b", tile=2, num_programs=2):
    g, _, _ = chain_graph(world)
    mk = g.compile(scheduler="round_robin", num_programs=num_programs, _plant_missing_release=(task, tile))
    mk.step()
    return mk          # on GPUs the launch is asynchronous: the caller keeps the buffers alive


# ---------------------------------------------------------------------------
# communication tasks
# ---------------------------------------------------------------------------

@triton.jit
def square_tile(tile, x, out, n, BLOCK: tl.constexpr):
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    tl.store(out + offs, v * v, mask=m)


def comm_graph(world, n=21, block=8):
    """y = x^2 (local) -> all_reduce(y) -> z = z^2 -> all_gather(z) -> barrier -> all_reduce(z)
    (a second all_reduce instance of the same pool)."""
    ws = world.world_size
    x = torch.zeros(n, device=world.device)
    y, z, w = torch.zeros_like(x), torch.zeros_like(x), torch.zeros_like(x)
    gat = torch.zeros(ws * n, device=world.device)
    g = dtask.TaskGraph("comm")
    nt = triton.cdiv(n, block)
    sq = g.register_task(square_tile, name="sq", num_tiles=nt, args={"x": x, "out": y, "n": n, "BLOCK": block},
                         reads=("x",), writes=("out",))
    ar = dtask.comm.all_reduce(g, "ar.0", y, z, deps=[dtask.Dep(sq)], block=block)
    sq2 = g.register_task(square_tile, name="sq2", num_tiles=nt, args={"x": z, "out": z, "n": n, "BLOCK": block},
                          reads=("x",), writes=("out",), deps=[dtask.Dep(ar, "same")])
    ag = dtask.comm.all_gather(g, "ag", z, gat, deps=[dtask.Dep(sq2)], block=block)
    bar = dtask.comm.barrier(g, "bar", deps=[dtask.Dep(ag)])
    dtask.comm.all_reduce(g, "ar.1", z, w, deps=[dtask.Dep(bar)], block=block)
    return g, x, (z, gat, w)


def _comm_inputs(world, n, s):
    xs = [_rand_rank(r, n, seed=10 + s) for r in range(world.world_size)]
    ref_z = sum(v * v for v in xs) ** 2
    return xs[world.rank].to(world.device), (ref_z, ref_z.repeat(world.world_size), ref_z * world.world_size)


def _check_comm(outs, refs):
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-5, atol=1e-5)


def comm_graph_run(world, scheduler="round_robin", n=21, block=8, steps=3, num_programs=3, stagger=0.0):
    """Back-to-back steps with new inputs (no host synchronisation between ranks).  ``stagger``: the
    last rank builds its graph (allocates and zeroes its staging) that many seconds late."""
    if stagger and world.rank == world.world_size - 1:
        time.sleep(stagger)
    g, x, outs = comm_graph(world, n, block)
    mk = g.compile(scheduler=scheduler, num_programs=num_programs)
    other = g.compile(scheduler="zigzag", num_programs=2)          # a second kernel of the same graph
    from ditron import lint
    assert lint.lint(mk.kernel) == []
    for s in range(steps):
        xs, refs = _comm_inputs(world, n, s)
        x.copy_(xs)
        (mk if s % 2 == 0 else other).step()                     # alternate: the comm pools are shared
        _check_comm(outs, refs)
    assert int(mk.epoch[0]) == steps
    return len(mk.code.branches)


def cuda_graph_replay(world, scheduler="round_robin", n=300, block=64, steps=3):
    """GPU only: capture one step in a CUDA graph and replay it with new inputs."""
    g, x, outs = comm_graph(world, n, block)
    mk = g.compile(scheduler=scheduler)
    xs, refs = _comm_inputs(world, n, 0)
    x.copy_(xs)
    mk.step()                                     # compile + warm up outside the capture
    torch.cuda.synchronize()
    _check_comm(outs, refs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mk.step()
    for s in range(1, steps + 1):
        xs, refs = _comm_inputs(world, n, s)
        x.copy_(xs)
        graph.replay()
        torch.cuda.synchronize()
        _check_comm(outs, refs)
    assert int(mk.epoch[0]) == steps + 1          # warm-up + replays (capture does not run the kernel)


def _rand_rank(rank, n, seed):
    g = torch.Generator().manual_seed(100 * seed + rank)
    return torch.randn(n, generator=g)


def narrow_range_dep(world, complete=False):
    """b's tiles read 16 elements = two of a's 8-element tiles but (unless
    ``complete``) depend on the first only: a race the static check cannot see
    (it works per task) and the race finder must."""
    n = 32
    x = ditron.symm_zeros((n,), torch.float32, name="x")
    t = ditron.symm_zeros((n,), torch.float32, name="t")
    u = ditron.symm_zeros((n,), torch.float32, name="u")
    x.copy_(_rand(world, n, 4))
    g = dtask.TaskGraph("narrow")
    a = g.register_task(square_tile, name="a", num_tiles=4, args={"x": x, "out": t, "n": n, "BLOCK": 8},
                        reads=("x",), writes=("out",))
    hi = 2 if complete else 1
    g.register_task(square_tile, name="b", num_tiles=2, args={"x": t, "out": u, "n": n, "BLOCK": 16},
                    reads=("x",), writes=("out",), deps=[dtask.Dep(a, lambda i: (2 * i, 2 * i + hi))])
    mk = g.compile(scheduler="round_robin", num_programs=4)
    mk.step()
    torch.testing.assert_close(u, x ** 4)
