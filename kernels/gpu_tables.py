"""What the per-GPU tables share (kernels/gemm_table.py, kernels/attention_table.py): reading a table file,
matching a device by name, the nearest measured entry, and finding the table of a device -- an environment
variable's path or ``off``, else the first file of the table directory that applies -- cached per device and
variable.  Files and numbers only: no torch, triton or device queries."""
from __future__ import annotations

import glob
import json
import math
import os

import ditron


def read_json(path: str, what: str):
    """The JSON object of a table file; a clear error naming ``what`` ("GEMM table") where it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise ditron.DitronError(f"{what} {path}: cannot read it ({err})") from None


def name_matches(match, device_name: str) -> bool:
    """Whether one of a table's ``match`` substrings is in ``device_name``."""
    return any(m and m in device_name for m in match)


def nearest(entries, dist, max_distance):
    """``(entry, distance)`` of the entry nearest by ``dist(entry)`` (the first on ties), or ``(None,
    distance)`` where the nearest is farther than ``max_distance`` or there is none (``math.inf``)."""
    best, best_d = None, math.inf
    for e in entries:
        d = dist(e)
        if d < best_d - 1e-12:
            best, best_d = e, d
    if best is None or best_d > max_distance + 1e-9:
        return None, best_d
    return best, best_d


def find_table(cache: dict, env: str, table_dir: str, load, applies, fallback=None, key=()):
    """The table of a device: ``$env`` = a path (that table) or ``off`` (None); else the first file of
    ``table_dir`` (by name) for which ``applies(table)``, else the first for which ``fallback(table)``, else
    None.  ``load(path)`` builds a table; cached in ``cache`` per (``key``, ``$env``)."""
    value = os.environ.get(env, "")
    k = (key, value)
    if k in cache:
        return cache[k]
    if value.lower() == "off":
        table = None
    elif value:
        table = load(value)
    else:
        tables = [load(p) for p in sorted(glob.glob(os.path.join(table_dir, "*.json")))]
        table = next((t for t in tables if applies(t)), None)
        if table is None and fallback is not None:
            table = next((t for t in tables if fallback(t)), None)
    cache[k] = table
    return table


__all__ = ["read_json", "name_matches", "nearest", "find_table"]
