"""ditron.task without a world: graph registration, dependency ranges, the
missing-dependency check, schedulers, generated source, and compiling the
generated kernel for sm_90a / gfx942."""
import pytest
import torch
import triton
import triton.language as tl

import bodies_task as B
import ditron
import ditron.task as dtask
from conftest import TARGETS, device_asm
from ditron.errors import DitronError


class _W:                      # what bodies_task's graph builders read from a world
    rank = 0
    world_size = 1
    device = torch.device("cpu")


def _t(n=16):
    return torch.zeros(n)


def _simple(g, name, x, out, deps=(), tiles=2, **kw):
    return g.register_task(B.scale_add_tile, name=name, num_tiles=tiles,
                           args={"x": x, "y": x, "out": out, "n": x.numel(), "alpha": 1.0, "BLOCK": 8},
                           reads=("x", "y"), writes=("out",), deps=deps, **kw)


# -- graph and deps -------------------------------------------------------------------

def test_dep_ranges_all_same_and_callable():
    g = dtask.TaskGraph("g")
    x, y, z = _t(), _t(), _t()
    a = _simple(g, "a", x, y, tiles=3)
    b = _simple(g, "b", y, z, deps=[dtask.Dep(a, "same")], tiles=3)
    c = g.register_task(B.row_sum_tile, name="c", num_tiles=2,
                        args={"x": z, "out": x, "rows": 2, "cols": 8, "ROWS": 1, "COLS": 8},
                        reads=("x",), writes=("out",),
                        deps=[dtask.Dep(b, lambda i: (i, i + 2)), dtask.Dep(a)])
    assert [it.slot for it in g.items()] == list(range(8))
    assert b.tile_ranges(2) == [(2, 1)]                       # a's slots are 0..2
    assert c.tile_ranges(1) == [(3 + 1, 2), (0, 3)]           # b tiles [1, 3) at slots 4, 5; all of a
    assert g.num_slots == 8


def test_bad_deps_are_rejected_with_names():
    g = dtask.TaskGraph("g")
    x, y, z = _t(), _t(), _t()
    a = _simple(g, "a", x, y, tiles=2)
    with pytest.raises(DitronError, match=r"'b' tile 2: Dep\('a', 'same'\) but 'a' has only 2 tiles"):
        _simple(g, "b", y, z, deps=[dtask.Dep(a, "same")], tiles=3)
    with pytest.raises(DitronError, match=r"'b' tile 1: the Dep on 'a' asks for producer tiles \[1, 3\)"):
        _simple(g, "b", y, z, deps=[dtask.Dep(a, lambda i: (i, i + 2))], tiles=2)
    other = dtask.TaskGraph("other")
    o = _simple(other, "o", x, y)
    with pytest.raises(DitronError, match="not an earlier task of this graph"):
        _simple(g, "b", y, z, deps=[dtask.Dep(o)])
    with pytest.raises(DitronError, match="already registered"):
        _simple(g, "a", x, z, deps=[dtask.Dep(a)])
    assert [t.name for t in g.tasks] == ["a"]                 # failed registrations leave no trace


def test_argument_checks():
    g = dtask.TaskGraph("g")
    x, y = _t(), _t()
    with pytest.raises(DitronError, match="no value for parameter"):
        g.register_task(B.scale_add_tile, name="a", num_tiles=1, args={"x": x, "y": x, "out": y})
    with pytest.raises(DitronError, match="'nope' is not a parameter"):
        g.register_task(B.square_tile, name="a", num_tiles=1, args={"x": x, "out": y, "n": 16, "BLOCK": 8,
                                                                     "nope": 1})
    with pytest.raises(DitronError, match="reads names 'n', which is not a tensor"):
        g.register_task(B.square_tile, name="a", num_tiles=1, args={"x": x, "out": y, "n": 16, "BLOCK": 8},
                        reads=("n",))
    with pytest.raises(DitronError, match="at most 4 scalars"):
        g.register_task(B.square_tile, name="a", num_tiles=1, args={"x": x, "out": y, "n": 16, "BLOCK": 8},
                        scalars=dict(a=1, b=2, c=3, d=4, e=5))
    with pytest.raises(DitronError, match="tile function"):
        g.register_task(lambda tile: None, name="a", num_tiles=1)


@pytest.mark.parametrize("case", ["raw", "war", "waw", "view"])
def test_missing_dependency_is_reported(case):
    g = dtask.TaskGraph("g")
    x, y, z = _t(32), _t(32), _t(32)
    _simple(g, "w", x, y)                                     # reads x, writes y
    with pytest.raises(DitronError, match="missing dependency") as info:
        if case == "raw":
            _simple(g, "r", y, z)                             # reads y: no Dep on w
        elif case == "war":
            _simple(g, "r", z, x)                             # writes x, which w reads
        elif case == "waw":
            _simple(g, "r", z, y)                             # writes y too
        else:
            _simple(g, "r", y[8:16], z[:8])                   # a view overlapping y
    msg = str(info.value)
    assert "'r'" in msg and "'w'" in msg


def test_dependency_through_a_chain_and_disjoint_views_pass():
    g = dtask.TaskGraph("g")
    x, y, z, u = _t(32), _t(32), _t(32), _t(32)
    a = _simple(g, "a", x, y)
    b = _simple(g, "b", y, z, deps=[dtask.Dep(a)])
    _simple(g, "c", y, u, deps=[dtask.Dep(b)])                # reads y (a's) through b
    w = torch.zeros(64)
    _simple(g, "d", x[:8], w[:16])                            # read-after-read of x needs nothing
    _simple(g, "e", x[8:16], w[32:48])                        # writes bytes of w that d does not touch
    with pytest.raises(DitronError, match="missing dependency: task 'f' writes tensor 'out'"):
        _simple(g, "f", x, w[8:24])                           # ... but these overlap d's output


# -- schedulers -----------------------------------------------------------------------

def test_round_robin_and_zigzag_queues():
    items = list(range(7))
    assert dtask.round_robin(items, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert dtask.zigzag(items, 3) == [[0, 5, 6], [1, 4], [2, 3]]


def _graph_for_schedulers():
    g = dtask.TaskGraph("s")
    x, y = _t(), _t()
    _simple(g, "a", x, y, tiles=5)
    return g


def test_user_scheduler_is_used_and_invalid_ones_are_rejected():
    g = _graph_for_schedulers()

    def backwards_blocks(items, p):               # valid: contiguous blocks
        per = -(-len(items) // p)
        return [list(range(i * per, min(len(items), (i + 1) * per))) for i in range(p)]

    mk = g.compile(scheduler=backwards_blocks, num_programs=2)
    assert mk.queues == [[0, 1, 2], [3, 4]]
    assert mk.queue_table.tolist() == [0, 3, 5]                   # row offsets per program
    from ditron.task.codegen import ENTRY, F
    assert mk.item_table.reshape(-1, ENTRY)[:, F["item"]].tolist() == [0, 1, 2, 3, 4]
    rr = g.compile(scheduler="round_robin", num_programs=2)       # rows in queue order: program 0's, then 1's
    assert rr.item_table.reshape(-1, ENTRY)[:, F["item"]].tolist() == [0, 2, 4, 1, 3]
    with pytest.raises(DitronError, match="not in increasing topological order"):
        g.compile(scheduler=lambda items, p: [[1, 0], [2, 3, 4]], num_programs=2)
    with pytest.raises(DitronError, match="in no queue"):
        g.compile(scheduler=lambda items, p: [[0], [2, 3, 4]], num_programs=2)
    with pytest.raises(DitronError, match="queues of programs 0 and 1"):
        g.compile(scheduler=lambda items, p: [[0, 1], [1, 2, 3, 4]], num_programs=2)
    with pytest.raises(DitronError, match="returned 1 queues for 2 programs"):
        g.compile(scheduler=lambda items, p: [[0, 1, 2, 3, 4]], num_programs=2)
    with pytest.raises(DitronError, match="unknown scheduler"):
        g.compile(scheduler="fifo")


def test_num_programs_is_capped_by_the_items():
    mk = _graph_for_schedulers().compile(num_programs=64)
    assert mk.num_programs == 5


# -- codegen ----------------------------------------------------------------------------

def test_generated_source_shares_branches_and_is_readable():
    g, _, _ = B.chain_graph(_W())
    mk = g.compile(scheduler="round_robin", num_programs=3)
    src = mk.source
    assert len(mk.code.branches) == 5                          # a, b, c, layer.0, layer.1+layer.2
    assert src.count("dl.release_tile(") == 1 and src.count("dl.wait_deps(") == 2     # inline range + the rest
    assert "elif branch == 4:" in src and "branch == 5" not in src
    assert "# layer.1, layer.2" in src                           # the tasks of the shared branch
    assert "layer_tile(tile, dl.consume_token(t5_w, tok), dl.consume_token(t6_out, tok), t6_out, b4_n, s0, 8)" in src
    assert "fetch_task" not in src and "for q in range(" in src
    dyn = g.compile(scheduler="dynamic", num_programs=3).source
    assert "ticket = dl.fetch_task(counter_ptr)" in dyn and "while ticket < n_items:" in dyn
    assert mk.code.path.endswith(".py") and open(mk.code.path).read() == src
    assert mk.slot_info(19) == ("layer.1", 1, {"layer": 1})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("scheduler", ["round_robin", "dynamic"])
def test_generated_kernel_compiles(target, scheduler):
    g, _, _ = B.chain_graph(_W())
    mk = g.compile(scheduler=scheduler, num_programs=3)
    ck = ditron.compile(mk.kernel, target=target, signature=mk.signature(), num_warps=4)
    asm = device_asm(ck)
    kinds = ck.asm["dist_ir"]
    assert "dist.wait_deps" in kinds and "dist.release_tile" in kinds
    if target == "sm_90a":
        # wait_deps polls relaxed (with a nanosleep backoff) and acquires with one fence per thread
        assert "ld.relaxed.gpu.global.b32" in asm and "nanosleep.u32" in asm and "fence.acq_rel.gpu" in asm
        assert "ld.acquire.gpu.global.b32" not in asm
        assert "st.release.gpu.global.b32" in asm                # release_tile
        assert "bar.sync 0" in asm
        if scheduler == "dynamic":
            assert "atom.global.gpu.acq_rel.add" in asm          # fetch_task
    else:
        assert "buffer_inv" in asm and "buffer_wbl2" in asm      # agent-scope acquire / release
        if scheduler == "dynamic":
            assert "global_atomic_add" in asm


def test_bounded_wait_deps_and_lint():
    """Under DITRON_WAIT_TIMEOUT_S the wait polls %globaltimer and reports
    kind 4 (dl.wait_deps, cmp >=); the lint knows the new ops and finds
    nothing to say about the generated kernel."""
    from ditron import lint
    from ditron.lowering import cuda, cuda_bounded
    from ditron.runtime.gpu_base import format_hang
    g, _, _ = B.chain_graph(_W())
    mk = g.compile(scheduler="dynamic", num_programs=2)
    with cuda.compile_variant("p2p", bounded=True):
        ck = ditron.compile(mk.kernel, target="sm_90a", signature=mk.signature())
    ptx = ck.asm["ptx"]
    assert "%globaltimer" in ptx and "ld.acquire.gpu.global.b32" in ptx
    assert cuda_bounded.HANG_KINDS[4] == "dl.wait_deps"
    rec = {k: 0 for k in cuda_bounded.HANG_WORDS}
    rec.update(kind=4, cmp=5, expected=3, observed=2, addr=mk.slots.data_ptr() + 4 * 7, timeout_ns=10**9)

    class T:
        describe_address = staticmethod(lambda addr: mk.describe_address(addr) or "?")
    text = format_hang(rec, T)
    assert "dl.wait_deps on megakernel 'chain' scoreboard slot 7 = task 'b' tile 2" in text
    assert "expected value >= 3, observed 2" in text
    assert lint.lint(mk.kernel) == []


@pytest.mark.parametrize("target", TARGETS)
def test_generated_kernel_with_comm_tiles_compiles(target):
    """The communication tile functions inside a generated kernel (registered
    by hand here: dtask.comm's helpers need a world to allocate staging)."""
    from ditron.task import comm
    g = dtask.TaskGraph("c")
    x, out = torch.zeros(100, dtype=torch.bfloat16), torch.zeros(100, dtype=torch.bfloat16)
    stage, sig = torch.zeros(2 * 4 * 2 * 100, dtype=torch.bfloat16), torch.zeros(2 * 4 * 2 * 2, dtype=torch.int32)
    bsig = torch.zeros(2 * 4 * 2, dtype=torch.int32)
    ar = g.register_task(comm.exchange_tile, name="ar", num_tiles=2,
                         args={"x": x, "out": out, "stage": stage, "sig": sig, "n": 100, "epoch": dtask.EPOCH,
                               "CAP": 4, "NTILES": 2, "REDUCE": True, "BLOCK": 64},
                         reads=("x",), writes=("out",), scalars={"inst": 0})
    g.register_task(comm.barrier_tile, name="bar", num_tiles=1, args={"sig": bsig, "epoch": dtask.EPOCH, "CAP": 4},
                    deps=[dtask.Dep(ar)], scalars={"inst": 0})
    mk = g.compile(num_programs=2)
    assert "exchange_tile(tile, dl.consume_token(t0_x, tok), t1_out, t2_stage, t3_sig, b0_n, s0, epoch, 4, 2, True, 64)" \
        in mk.source
    asm = device_asm(ditron.compile(mk.kernel, target=target, signature=mk.signature()))
    if target == "sm_90a":
        assert "st.release.sys.global.b32" in asm and "ld.acquire.sys.global.b32" in asm    # notify / wait
        assert "ld.relaxed.gpu.global.b32" in asm and "st.release.gpu.global.b32" in asm    # scoreboard
    else:
        assert "buffer_inv sc0 sc1" in asm                                                   # system acquire


# -- prefetch hooks and residency --------------------------------------------------------

def test_prefetch_hook_registration_checks():
    g = dtask.TaskGraph("pf")
    x, out = _t(), _t()

    def not_jit(tile, x):
        pass
    with pytest.raises(DitronError, match="prefetch must be a @triton.jit"):
        _simple(g, "a", x, out, prefetch=not_jit)

    @triton.jit
    def pf_const_mismatch(tile, x, BLOCK):               # BLOCK is a tl.constexpr of the tile function
        pass
    with pytest.raises(DitronError, match=r"\['BLOCK'\] are tl.constexpr in only one of"):
        _simple(g, "b", x, out, prefetch=pf_const_mismatch)

    @triton.jit
    def pf_extra(tile, x, LINES: tl.constexpr):          # a parameter only the hook has: filled from args
        pass
    with pytest.raises(DitronError, match=r"no value for parameter\(s\) \['LINES'\]"):
        _simple(g, "c", x, out, prefetch=pf_extra)
    t = g.register_task(B.scale_add_tile, name="d", num_tiles=2, prefetch=pf_extra,
                        args={"x": x, "y": x, "out": out, "n": 16, "alpha": 1.0, "BLOCK": 8, "LINES": 4},
                        reads=("x", "y"), writes=("out",))
    src = g.compile(num_programs=2).source
    assert "pf_extra(tile, t0_x, 4)" in src and t.prefetch is pf_extra
    # the hook runs before the dependency wait
    assert src.index("pf_extra(tile,") < src.index("tok = dl.wait_deps(")


def test_resident_programs_per_sm():
    from types import SimpleNamespace

    from ditron.task.runtime import resident_per_sm
    h100 = SimpleNamespace(warp_size=32, max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
                           shared_memory_per_multiprocessor=233472)
    assert resident_per_sm(h100, 255, 0, 4) == 2         # 255 regs -> 8192 per warp: 8 warps of 64
    assert resident_per_sm(h100, 128, 0, 4) == 4
    assert resident_per_sm(h100, 168, 0, 4) == 3         # 5376 per warp (a multiple of 256): 12 warps
    assert resident_per_sm(h100, 255, 0, 8) == 1
    assert resident_per_sm(h100, 32, 0, 4) == 16         # the thread limit
    assert resident_per_sm(h100, 64, 100 * 1024, 4) == 2  # the shared-memory limit (1 KiB reserved each)
    assert resident_per_sm(h100, 64, 300 * 1024, 4) == 0
