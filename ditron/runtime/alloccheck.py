"""Ranks allocate alike: every symmetric allocation compared across ranks.

A symmetric tensor lives at the same heap offset on every rank only if every
rank makes the same allocations in the same order.  One extra (or smaller)
allocation on one rank shifts every later offset: puts land in the wrong
tensor and signals are never seen, and the hang that follows points
elsewhere.  Here each rank publishes every allocation -- its position, heap
offset, bytes, dtype, shape, name and call site -- and compares it with what
the other ranks published for the same position; a mismatch is an error on
the rank that finds it, naming both ranks' allocation sites and values.  The
comparison never waits: the rank that allocates second finds the mismatch.

* **simulator**: always; the records are small append-only files in the
  job's directory (one per rank).
* **GPUs**: with ``DITRON_DEBUG=1``, through torch.distributed's key-value
  store (one ``set`` and one ``check`` per peer per allocation, host only).

Positions are counted per *generation* of the heap (a ``heap_scope`` that
ends starts a new one), so ranks that free and reallocate alike compare
alike.
"""
from __future__ import annotations

import json
import os

from ..errors import DitronError


def _record(alloc, generation, rank):
    return {"gen": generation, "index": alloc.index, "offset": alloc.offset, "nbytes": alloc.nbytes,
            "dtype": str(alloc.dtype).replace("torch.", ""), "shape": list(alloc.shape), "name": alloc.name,
            "site": alloc.site, "rank": rank}


def _text(r):
    shape = "x".join(str(s) for s in r["shape"]) or "scalar"
    name = f"'{r['name']}' " if r.get("name") else ""
    return f"{name}{r['dtype']}[{shape}] ({r['nbytes']} bytes at heap offset {r['offset']}) allocated at {r['site']}"


def compare(mine, theirs):
    """Raise when two ranks' records of the same allocation position differ."""
    keys = ("offset", "nbytes", "dtype", "shape")
    if all(mine[k] == theirs[k] for k in keys):
        return
    raise DitronError(
        f"ranks allocate symmetric memory differently: symmetric allocation #{mine['index']} is\n"
        f"    rank {mine['rank']}: {_text(mine)}\n"
        f"    rank {theirs['rank']}: {_text(theirs)}\n"
        "every rank must make the same symmetric allocations (ditron.symm_empty / symm_zeros, zoo contexts) in the "
        "same order with the same sizes and dtypes; otherwise every later symmetric tensor sits at a different "
        "offset on each rank")


class FileLedger:
    """Simulator: records in ``<job dir>/allocs-<rank>``, one JSON line per allocation."""

    def __init__(self, sim_dir, rank, world_size):
        self.dir, self.rank, self.world_size = sim_dir, rank, world_size
        self.path = os.path.join(sim_dir, f"allocs-{rank}")
        self.seen = {r: {} for r in range(world_size) if r != rank}     # peer -> {(gen, index): record}
        self.pos = {r: 0 for r in self.seen}
        self.gen0 = {r: None for r in self.seen}
        open(self.path, "a").close()

    def _refresh(self, peer):
        path = os.path.join(self.dir, f"allocs-{peer}")
        try:
            with open(path) as f:
                f.seek(self.pos[peer])
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind("\n") + 1
        self.pos[peer] += len(chunk[:end].encode())
        for line in chunk[:end].splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            self.seen[peer][(r["gen"], r["index"])] = r

    def __call__(self, alloc, generation):
        mine = _record(alloc, generation, self.rank)
        for peer in self.seen:
            self._refresh(peer)
            theirs = self.seen[peer].get((generation, alloc.index))
            if theirs is not None:
                compare(mine, theirs)
        with open(self.path, "a") as f:
            f.write(json.dumps(mine) + "\n")


class StoreLedger:
    """GPUs under ``DITRON_DEBUG=1``: records in torch.distributed's store."""

    def __init__(self, store, rank, world_size, prefix="ditron/alloc"):
        self.store, self.rank, self.world_size, self.prefix = store, rank, world_size, prefix

    def __call__(self, alloc, generation):
        mine = _record(alloc, generation, self.rank)
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            key = f"{self.prefix}/{generation}/{alloc.index}/{peer}"
            if self.store.check([key]):
                compare(mine, json.loads(self.store.get(key)))
        self.store.set(f"{self.prefix}/{generation}/{alloc.index}/{self.rank}", json.dumps(mine))


def debug_enabled() -> bool:
    """``DITRON_DEBUG=1``: the checks that cost host time also run on GPUs."""
    return os.environ.get("DITRON_DEBUG", "") not in ("", "0")


def gpu_ledger(rank, world_size):
    """The store ledger when ``DITRON_DEBUG=1`` and torch.distributed is up, else None."""
    if not debug_enabled():
        return None
    try:
        import torch.distributed as dist
        if not dist.is_initialized():
            return None
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 -- no store: no check
        return None
    return StoreLedger(store, rank, world_size)
