"""Misuse of the zoo and the runtime fails loudly (issue 15, items 3 and 5):
ranks that disagree on a collective's arguments or skip a call, a context of
the wrong kind, inputs aliasing a context's buffers, contexts and tensors
used after their heap_scope or after finalize, failed creations, a second
init with other settings, dtype names.  Bodies in bodies_reliability.py run
on an odd-sized simulated world with a short hang timeout."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

import bodies_reliability as B
from ditron.errors import DitronHangError

HANG_S = 3.0
NRANKS = 3


@pytest.fixture(scope="module")
def cluster():
    from ditron.sim.pool import SimCluster
    c = SimCluster(NRANKS, hang_timeout=HANG_S)
    yield c
    c.close()


def _same_error(results, *needles):
    assert all(r is not None for r in results), f"some rank raised nothing: {results}"
    assert len(set(results)) == 1, f"ranks reported differently: {results}"
    for needle in needles:
        assert needle in results[0], f"{needle!r} not in {results[0]!r}"
    return results[0]


# -- cross-rank consistency (item 3) ------------------------------------------------------------

@pytest.mark.parametrize("op,method", [("all_reduce", "ll"), ("all_reduce", "one_shot"), ("all_reduce", "two_shot"),
                                       ("all_gather", "push"), ("reduce_scatter", "mesh"), ("all_to_all", None),
                                       ("ag_gemm", None), ("gemm_rs", None), ("gemm_ar", "one_shot")])
def test_divergent_sizes_fail_every_rank(cluster, op, method):
    msg = _same_error(cluster.run(B.divergent, op, method, 12, 10), f"{op}: ranks disagree on argument",
                      "call #2")
    # each rank's value is named
    for r in range(NRANKS):
        assert f"rank {r}: " in msg


def test_divergent_all_reduce_names_values(cluster):
    msg = _same_error(cluster.run(B.divergent, "all_reduce", "auto", 120, 100),
                      "all_reduce: ranks disagree on argument 'x.shape'", "rank 0: (100,)")
    assert all(f"rank {r}: (120,)" in msg for r in range(1, NRANKS))


def test_divergent_method(cluster):
    _same_error(cluster.run(B.divergent_method, ["one_shot", "ll"]), "argument 'method'", "rank 0: one_shot",
                "rank 1: ll")


# one method per op (the check is the op's, before any method's kernels; each case waits out the hang bound)
@pytest.mark.parametrize("op,method", [("all_reduce", "ll"), ("all_gather", "pull"), ("gemm_ar", "two_shot")])
def test_skipped_call_is_reported(cluster, op, method, tmp_path):
    with pytest.raises(DitronHangError) as info:
        cluster.run(B.skip_call, op, method, str(tmp_path))
    # the bound, from the moment the hang began (the last rank finished the good first call)
    began = max(float((tmp_path / f"rank{r}").read_text()) for r in range(NRANKS))
    assert time.time() - began < HANG_S + 10, time.time() - began
    text = str(info.value)
    assert "cross-rank argument check" in text and "ranks [0] have not made this call" in text, text
    assert "rank 0: call #0" in text                # what the missing rank did last
    assert len(info.value.report) == NRANKS - 1


def test_store_exchange_reports_mismatch_and_missing_rank():
    """The GPU path (DITRON_DEBUG=1) through a torch.distributed store, with ranks as threads."""
    import threading

    import torch.distributed as dist
    from ditron.runtime import consistency
    store = dist.HashStore()
    W = 3
    fps = [{"op": "all_reduce", "call": 0, "fields": [("x.shape", "(8,)" if r else "(4,)")], "site": "t.py:1"}
           for r in range(W)]
    errors = [None] * W

    def rank(r, present):
        try:
            got = consistency.exchange_via_store(store, "p", r, W, fps[r], 0, "ctx", 5.0)
            consistency.compare(got, 0, "ctx")
        except Exception as e:  # noqa: BLE001
            errors[r] = e
    threads = [threading.Thread(target=rank, args=(r, True)) for r in range(W)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert all("argument 'x.shape'" in str(e) and "rank 0: (4,)" in str(e) for e in errors), errors
    # rank 2 never arrives at call 1
    errors = [None] * W
    for r in range(W):
        fps[r] = dict(fps[r], call=1, fields=[("x.shape", "(8,)")])
    threads = [threading.Thread(target=lambda r=r: errors.__setitem__(r, _catch(
        lambda: consistency.exchange_via_store(store, "p", r, W, fps[r], 1, "ctx", 0.5)))) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for e in errors[:2]:
        assert isinstance(e, DitronHangError) and "ranks [2] did not make this call" in str(e), e
        assert "rank 2: call #0" in str(e)


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


_SCRIPT = """
import sys, torch, ditron
from ditron import kernels as K
world = ditron.init()
ctx = K.create_all_reduce_context(256, torch.float16)
for _ in range(2):
    K.all_reduce(torch.ones(120, dtype=torch.float16), ctx, method="ll")
mode = sys.argv[1]
if mode == "divergent":
    K.all_reduce(torch.ones(100 if world.rank == 0 else 120, dtype=torch.float16), ctx, method="ll")
elif world.rank != 0:
    K.all_reduce(torch.ones(120, dtype=torch.float16), ctx, method="ll")
ditron.finalize()
"""


@pytest.mark.parametrize("mode", ["divergent", "skip"])
def test_ditron_sim_exits_nonzero_with_report(tmp_path, mode):
    """The acceptance case end to end: `ditron sim` on the ll method (which used to hang forever)."""
    script = tmp_path / "divergent.py"
    script.write_text(_SCRIPT)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "2", "--hang-timeout", str(HANG_S),
                        str(script), mode], capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    if mode == "divergent":
        assert "all_reduce: ranks disagree on argument 'x.shape'" in p.stderr, p.stderr
        assert "rank 0: (100,)" in p.stderr and "rank 1: (120,)" in p.stderr
    else:
        assert "cross-rank argument check" in p.stderr and "ranks [0] have not made this call" in p.stderr, \
            p.stderr


# -- contexts and lifecycle (item 5) --------------------------------------------------------------

def test_wrong_context_type(cluster):
    ag, rs, ar, a2a, junk = cluster.run(B.wrong_context)[0]
    assert "all_gather: ctx is a reduce_scatter context (ReduceScatterContext" in ag
    assert "needs a context from create_all_gather_context()" in ag
    assert "reduce_scatter: ctx is a all_gather context" in rs or "reduce_scatter: ctx is an all_gather" in rs
    assert "all_reduce: ctx is a all_gather context" in ar and "create_all_reduce_context" in ar
    assert "all_to_all" in a2a and "create_all_to_all_context" in a2a
    assert "ctx must be a context from create_all_gather_context(), got str" in junk


def test_aliasing_context_buffers(cluster):
    for msgs in cluster.run(B.aliasing):
        assert all(m is not None and "overlaps this context's own buffers" in m for m in msgs), msgs
        assert "argument 'x'" in msgs[0] and "argument 'out'" in msgs[1] and "all_gather" in msgs[2]


def test_heap_scope_invalidates(cluster):
    for errs, newer_intact in cluster.run(B.scope_lifetime):
        ctx_err, t_err, peer_err = errs
        assert ctx_err and "context's symmetric buffers were freed" in ctx_err and "heap_scope" in ctx_err
        assert t_err and "argument 'x' is the symmetric tensor 'scoped'" in t_err and "was freed" in t_err
        assert peer_err and "'scoped'" in peer_err
        assert newer_intact


def test_failed_creation_rolls_back(cluster):
    for (small, full), same in cluster.run(B.failed_creation):
        assert small and "less than the world size" in small
        assert full and "symmetric heap of rank" in full and "is full" in full
        assert same, "the failed context kept its symmetric memory"


def test_dtype_strings(cluster):
    got, bad, wrong_type = cluster.run(B.dtype_strings)[0]
    assert got == ["torch.float16", "torch.bfloat16", "torch.float32", "torch.int64", "torch.int32",
                   "torch.float16"]
    assert "unknown dtype name 'float17'" in bad and "bf16" in bad
    assert "dtype must be a torch.dtype or a name" in wrong_type


def test_reinit_with_other_settings(cluster):
    same, err = cluster.run(B.reinit_settings)[0]
    assert same
    assert err and "already initialised" in err and "ditron.finalize() first" in err


_FINALIZE = """
import torch, ditron
from ditron import kernels as K
ditron.init()
ctx = K.create_all_reduce_context(64, torch.float32)
t = ditron.symm_zeros((8,), torch.float32, name="t")
ditron.finalize()
for what, fn in (("context", lambda: K.all_reduce(torch.ones(8), ctx)),
                 ("tensor", lambda: ditron.peer_tensor(t, 0))):
    try:
        fn()
        print(what, "NO ERROR")
    except ditron.DitronError as e:
        print(what, e)
ditron.init()
ctx2 = K.create_all_reduce_context(64, torch.float32)
for what, fn in (("reinit", lambda: K.all_reduce(torch.ones(8), ctx)),
                 ("old-tensor", lambda: ditron.peer_tensor(t, 0)),
                 ("old-tensor-op", lambda: K.all_reduce(t, ctx2))):
    try:
        fn()
        print(what, "NO ERROR")
    except ditron.DitronError as e:
        print(what, e)
ditron.finalize()
"""


def test_use_after_finalize():
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(_FINALIZE)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "context all_reduce: this all_reduce context belongs to a world that was finalized" in out, out
    assert "tensor ditron.peer_tensor needs a ditron world" in out, out
    assert "reinit all_reduce: this all_reduce context belongs to a world that was finalized" in out, out
    for what in ("old-tensor ditron.peer_tensor", "old-tensor-op all_reduce"):
        assert f"{what}: argument " in out and "'t' (float32[8]" in out and "was freed: ditron.finalize() was called" \
            in out, out


def test_call_site_names_the_callers_line_outside_ditron():
    """Fingerprints (and the disagreement reports) name the user's line: the first frame outside ditron, the zoo,
    torch and triton, also when the check runs inside ditron's own frames."""
    import inspect
    import types
    from ditron.runtime.consistency import CallBoard, call_site
    here = inspect.currentframe().f_lineno
    assert call_site() == f"test_reliability_api.py:{here + 1}"
    board = CallBoard(types.SimpleNamespace(backend="p2p", world_size=1), "op")
    assert board.fingerprint("op", [("n", 4)])["site"] == f"test_reliability_api.py:{here + 3}"
