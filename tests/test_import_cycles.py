"""No import cycles anywhere in ditron/, not even between two modules of one package.

Every import a module makes counts (top level or inside a function, which runs later; relative imports resolved;
``from pkg import name`` where ``name`` is a submodule counts as importing that submodule), read with
tests/test_layering.py's reader.  docs/architecture.md draws the layout that this keeps true; where two modules
need each other, the shared part moves to a module below both (runtime/transport.py, sim/events.py,
task/common.py) or the upper one registers itself (``ditron.lowering.provide``).
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_layering import ALL, imports_of, modules  # noqa: E402


@functools.lru_cache(maxsize=None)
def import_graph():
    """module -> the ditron modules it imports (the module itself and the implicit parent packages left out)."""
    return {m: sorted(t for t in imports_of(m, is_pkg, path) if t in ALL and t != m)
            for m, is_pkg, path in modules()}


def find_cycles(graph):
    """One cycle (a list of modules, first == last) per strongly connected component of more than one module."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []

    def visit(root):
        # iterative Tarjan: (node, iterator over its successors)
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, succ = work[-1]
            for w in succ:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        comps.append(set(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, comp) for comp in comps]


def _cycle_in(graph, comp):
    """A shortest cycle through the first module (by name) of a strongly connected component."""
    start = min(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph[v]:
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w in comp and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(comp)}")


def test_the_reader_sees_imports_inside_functions_and_relative_ones():
    graph = import_graph()
    assert "ditron.runtime.gpu" in graph["ditron.runtime.world"]          # `from .gpu import ...` inside init()
    assert "ditron.runtime.transport" in graph["ditron.runtime.gpu"]      # top-level relative import
    assert "ditron.sim_memory" in graph["ditron.sim.race"]                # `from .. import sim_memory as M`


def test_find_cycles_finds_a_planted_one():
    g = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e2"], "e2": ["e"]}
    assert sorted(find_cycles(g)) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert find_cycles({"a": ["b"], "b": ["c"], "c": []}) == []


def test_no_import_cycles():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in ditron/ (make the dependency one-way; see docs/architecture.md):\n" + \
        "\n".join("  " + " -> ".join(c) for c in cycles)
