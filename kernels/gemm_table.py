"""Per-GPU GEMM-core config tables (issue 52 item 5): which core and config :func:`ditron.kernels.gemm.matmul`
runs for an ``[M, K] @ [K, N]`` GEMM, measured per GPU kind rather than chosen on one machine.

A table is a JSON file in ``kernels/gemm_tables/`` (written by ``bench/gemm_core_levers.py --write-table``
from a measured run, one file per GPU kind)::

    {"gpu": "NVIDIA H100 80GB HBM3", "match": ["H100"], "sms": 132, "max_distance": 1.0,
     "source": "...the command, date, triton and torch of the run...",
     "entries": [{"M": 8192, "N": 5504, "K": 4096, "dtype": "bf16", "core": "tl",
                  "config": {"block_m": 128, ...}, "candidate": "tl 128x128x64 s5",
                  "ratio_vs_cublas": 0.97, "us": 505.1, "cublas_us": 493.6}, ...]}

* which table: the first file (by name) one of whose ``match`` substrings is in the device's name and whose
  ``sms`` (when given) is the device's SM count; ``DITRON_GEMM_TABLE=/path/to/table.json`` (or ``off``)
  overrides the search;
* which entry (:meth:`GemmTable.lookup`), the nearest rule: among the entries of the dtype (of any 16-bit
  dtype when the table has none of it), the one nearest in ``|log2 M/M_e| + |log2 N/N_e| + |log2 K/K_e|``
  (the first on ties), if that distance is at most ``max_distance`` (default 1.0: a factor 2 in one
  dimension, or less spread over several); otherwise none and the caller falls back to its rule
  (:func:`ditron.kernels.gemm.gpu_default_config`).

This module reads files and compares numbers only (no torch, triton or device queries): the kernel modules
turn an entry's ``config`` into their config classes.
"""
from __future__ import annotations

import math
import os

import ditron

from .gpu_tables import find_table, name_matches, nearest, read_json

TABLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_tables")
CORES = ("tl", "gluon")
DTYPES = ("bf16", "fp16")
ENV = "DITRON_GEMM_TABLE"


def distance(a, b) -> float:
    """``|log2 M/M'| + |log2 N/N'| + |log2 K/K'|`` of two ``(M, N, K)``."""
    return sum(abs(math.log2(x / y)) for x, y in zip(a, b))


class GemmTable:
    """A loaded, validated table (module docstring)."""

    def __init__(self, data: dict, path: str = "<dict>"):
        E = ditron.DitronError
        self.path = path
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise E(f"GEMM table {path}: expected an object with an 'entries' list")
        self.gpu = str(data.get("gpu", ""))
        self.match = [str(m) for m in data.get("match", [])]
        self.sms = data.get("sms")
        self.source = data.get("source", "")
        self.max_distance = float(data.get("max_distance", 1.0))
        self.entries = []
        for i, e in enumerate(data["entries"]):
            where = f"GEMM table {path}: entry {i}"
            if not isinstance(e, dict):
                raise E(f"{where} is not an object")
            for k in ("M", "N", "K"):
                if not isinstance(e.get(k), int) or e[k] < 1:
                    raise E(f"{where}: {k}={e.get(k)!r} must be a positive integer")
            if e.get("dtype") not in DTYPES:
                raise E(f"{where}: dtype={e.get('dtype')!r}; use one of {', '.join(DTYPES)}")
            if e.get("core") not in CORES:
                raise E(f"{where}: core={e.get('core')!r}; use one of {', '.join(CORES)}")
            if not isinstance(e.get("config"), dict):
                raise E(f"{where}: 'config' must be an object of config fields")
            self.entries.append(e)

    @classmethod
    def load(cls, path: str) -> "GemmTable":
        return cls(read_json(path, "GEMM table"), path)

    def applies_to(self, device_name: str, sms=None) -> bool:
        if not name_matches(self.match, device_name):
            return False
        return self.sms is None or sms is None or int(self.sms) == int(sms)

    def lookup(self, M, N, K, dtype="bf16"):
        """``(entry, distance)`` of the nearest entry within ``max_distance``, or ``(None, distance)``."""
        cands = [e for e in self.entries if e["dtype"] == dtype] or self.entries
        return nearest(cands, lambda e: distance((M, N, K), (e["M"], e["N"], e["K"])), self.max_distance)


_TABLES: dict = {}


def table_for(device_name: str, sms=None):
    """The table for a GPU named ``device_name`` with ``sms`` SMs (module docstring), or None.  Cached per
    (name, SMs, ``DITRON_GEMM_TABLE``)."""
    return find_table(_TABLES, ENV, TABLE_DIR, GemmTable.load, lambda t: t.applies_to(device_name, sms),
                      key=(device_name, sms))


def clear_cache():
    _TABLES.clear()


__all__ = ["GemmTable", "table_for", "distance", "clear_cache", "TABLE_DIR", "ENV"]
