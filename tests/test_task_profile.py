"""ditron.task.profile on hand-made traces (no kernel): the critical path of a step and its signal latency."""
from types import SimpleNamespace

from ditron.task.profile import critical_path


def _items(spec):
    """spec: [(task name, [(first slot, count), ...])] in slot order."""
    out = []
    for i, (name, ranges) in enumerate(spec):
        task = SimpleNamespace(name=name, tile_ranges=lambda tile, r=tuple(ranges): list(r))
        out.append(SimpleNamespace(task=task, tile=0, index=i))
    return out


def test_critical_path_follows_the_last_producer_and_the_program_queue():
    # slots 0, 1: producers a.0 (ends 1000 ns) and a.1 (ends 3000 ns) on programs 0 and 1;
    # slot 2: b.0 needs both, starts on program 0 at 1100, its wait is satisfied at 3500 (signal 500 ns after a.1);
    # slot 3: c.0 needs nothing, runs on program 0 after b.0 (queued: starts 5100, ready 5200, ends 6000)
    items = _items([("a.0", []), ("a.1", []), ("b.0", [(0, 2)]), ("c.0", [])])
    rec = [(0, 0, 1000, 0), (0, 0, 3000, 1), (1100, 3500, 5000, 0), (5100, 5200, 6000, 0)]
    cp = critical_path(items, rec)
    rows = {r.kind: r for r in cp.rows}
    assert cp.step_us == 6.0
    assert rows["c"].items == 1 and rows["c"].queue_us == 0.2 and rows["c"].run_us == 0.8
    assert rows["b"].items == 1 and rows["b"].signal_us == 0.5 and rows["b"].run_us == 1.5
    assert rows["a"].items == 1 and rows["a"].run_us == 3.0 and rows["a"].queue_us == 0.0    # a.1, not a.0
    assert rows["b"].waited == 1 and rows["b"].lag_us == 0.5 and rows["a"].waited == 0
    assert abs(sum(r.run_us + r.signal_us + r.queue_us for r in cp.rows) - cp.step_us) < 1e-9
    assert "| b | 1 | 1.5 | 0.5 | 0.0 | 1 | 0.50 |" in cp.table()


def test_a_tile_whose_producers_were_done_waited_for_its_program():
    # b.0's producer released before b.0 started: b.0 is on the path through program 0's previous tile x.0
    items = _items([("a.0", []), ("x.0", []), ("b.0", [(0, 1)])])
    rec = [(0, 0, 100, 1), (0, 0, 2000, 0), (2100, 2150, 2400, 0)]
    cp = critical_path(items, rec)
    rows = {r.kind: r for r in cp.rows}
    assert set(rows) == {"x", "b"} and rows["b"].queue_us == 0.15 and rows["b"].waited == 0
    assert rows["x"].run_us == 2.0
