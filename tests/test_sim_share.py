"""The kernels' first-launch work, done once in the fork server of the simulated ranks (ditron.sim.prewarm) and
inherited by every rank, is the work a rank does itself: the same rewritten code, the same analysis, the same lint
findings; and a rank's settings still come from its own environment.

The bodies below run on the simulated ranks (this module is importable there, as tests/bodies_*.py are)."""
import os

import pytest

import ditron

pytestmark = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                                reason="the simulator's fork server and caches")


def _fresh(fn_cache_pairs, compute):
    """``compute()`` with the given caches emptied (then restored): what a rank computes without inherited work."""
    saved = [(cache, dict(cache)) for cache in fn_cache_pairs]
    for cache, _ in saved:
        cache.clear()
    try:
        return compute()
    finally:
        for cache, items in saved:
            cache.clear()
            cache.update(items)


#: the modules whose functions are compared with fresh results (all of the zoo's would cost ~20 CPU-s): the zoo's
#: shared helpers and kernels with symmetric arguments, lint events and a persistent GEMM
COMPARED = ("ditron.kernels._common", "ditron.kernels.all_gather", "ditron.kernels.ag_gemm", "ditron.kernels.gemm")


def inherited_first_launch(world, compared=COMPARED):
    """In a rank: how many zoo functions arrived warmed, and (in rank 0, for the functions of ``compared``)
    whether each warmed result equals a fresh one.  Returns (number warmed, [names whose inherited rewrite /
    analysis / lint differs from a fresh one], [names of kernels whose lint walk has events])."""
    from triton.runtime.interpreter import FunctionRewriter, InterpretedFunction

    from ditron import analysis, lint
    from ditron.runtime import world as world_mod
    from ditron.sim import prewarm, simt
    from ditron.sim.executor import SimKernel

    simt.install()              # as a launch does before its first rewrite (the fresh rewrites below)
    funcs = prewarm.jit_functions(("ditron.kernels",))
    warmed = [f for f in funcs if f.fn in InterpretedFunction.rewritten_fn]
    differs, linted = [], []
    for f in (warmed if world.rank == 0 else []):
        if f.fn.__module__ not in compared:
            continue
        name = f"{f.fn.__module__}.{f.fn.__name__}"
        inherited = InterpretedFunction.rewritten_fn[f.fn]
        fresh = FunctionRewriter(f.fn, **f.kwargs).rewrite_ast()
        if inherited.__code__ != fresh.__code__ or inherited.__globals__ is not fresh.__globals__:
            differs.append(name + ": rewrite")
        fn = analysis._python_function(f)
        if fn not in lint._PARSED or fn.__code__ not in analysis._SOURCES:
            differs.append(name + ": not warmed")
        if isinstance(f, SimKernel) and (id(fn) not in lint._WALKS or id(f) not in world_mod._POSITIONS):
            differs.append(name + ": walk / positions not warmed")
        if isinstance(f, SimKernel):
            sym = analysis.symmetric_params(f)
            sym_fresh = _fresh([analysis._cache, analysis._SOURCES], lambda: analysis.symmetric_params(f))
            pos = world_mod._symmetric_positions(f)
            pos_fresh = _fresh([analysis._cache, analysis._SOURCES, world_mod._POSITIONS],
                               lambda: world_mod._symmetric_positions(f))
            if sym != sym_fresh or pos != pos_fresh:
                differs.append(name + ": analysis")
            walk = lint._walk(fn, {})[0]          # the lint's events (what its findings are made of)
            walk_fresh = _fresh([lint._PARSED, lint._WALKS, analysis._SOURCES], lambda: lint._walk(fn, {})[0])
            found = lint.lint(f, None, {})
            found_fresh = _fresh([lint._PARSED, lint._WALKS, analysis._SOURCES], lambda: lint.lint(f, None, {}))
            summary = lint._summary(f, {})
            summary_fresh = _fresh([lint._PARSED, lint._WALKS, lint._SUMMARIES, analysis._SOURCES],
                                   lambda: lint._summary(f, {}))
            if walk != walk_fresh or found != found_fresh or summary != summary_fresh:
                differs.append(name + ": lint")
            if walk:
                linted.append(name)
    return len(warmed), differs, linted


def test_ranks_inherit_the_first_launch_work_and_it_is_a_rank_s_own(dist):
    results = dist.run(inherited_first_launch)
    for warmed, _, _ in results:
        assert warmed >= 20, f"only {warmed} zoo functions arrived rewritten in a forked rank"
    _, differs, linted = results[0]
    assert not differs, differs
    assert len(linted) >= 3, linted        # kernels whose lint has events to compare


def triton_key_state(world):
    """In a rank: whether Triton's compiler key arrived computed, and (rank 0) whether it equals a fresh one."""
    from triton.runtime.cache import triton_key
    arrived = triton_key.cache_info().currsize == 1
    if world.rank != 0:
        return arrived, None
    inherited = triton_key()
    triton_key.cache_clear()
    return arrived, triton_key() == inherited


def test_ranks_inherit_triton_key(dist):
    """torch.compile's cache key and a Triton compile in a rank use it: hashed once in the fork server (~0.4 CPU-s)
    instead of in every rank that compiles; what a rank computes itself is the same key."""
    results = dist.run(triton_key_state)
    assert all(arrived for arrived, _ in results), results
    assert results[0][1] is True


def skew_plan(world):
    from ditron.sim import skew
    plan = skew._STATE["plan"]
    return None if plan is None else (plan["rank"], plan["at"], plan["nth"])


def test_a_forked_rank_reads_the_skew_plan_from_its_own_environment(monkeypatch):
    """The fork server imported ditron.sim.skew (the zoo imports the executor) with the environment of whichever
    cluster started it: each cluster's ranks still get the plan of theirs (DITRON_SIM_SKEW), or none."""
    from ditron.sim.pool import SimCluster
    monkeypatch.setenv("DITRON_SIM_SKEW", "rank=1,at=signal,nth=3,seconds=0.01")
    with SimCluster(2) as c:
        assert c.run(skew_plan) == [(1, "signal", 3)] * 2
    monkeypatch.delenv("DITRON_SIM_SKEW")
    with SimCluster(2) as c:
        assert c.run(skew_plan) == [None, None]


def test_warm_does_nothing_without_the_interpreter(monkeypatch):
    """Without TRITON_INTERPRET=1 the kernels are compiled ones: nothing is imported (a server importing the zoo
    then would hand its ranks compiled kernels) and nothing is warmed."""
    import importlib

    from ditron.sim import prewarm
    imported = []
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name))
    monkeypatch.setattr(ditron._compat, "interpreter_enabled", lambda: False)
    assert prewarm.warm() == 0
    assert imported == []
