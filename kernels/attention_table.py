"""Per-GPU attention-core tables (issue 52 items 3 and 5): which core and config
:func:`ditron.kernels.attention.flash_attention` / ``ring_attention`` run at world size 1 on a GPU when the
caller picks none -- measured per GPU kind, not chosen on one machine.

A table is a JSON file in ``kernels/attention_tables/``::

    {"gpu": "NVIDIA H100 80GB HBM3", "match": ["H100"], "capability": 90,
     "measured_on": "NVIDIA H100 80GB HBM3", "source": "...command, date, triton, torch, results dir...",
     "default": {"core": "gluon", "config": {"block_n": 128, "stages": 2, "pingpong": true, ...},
                 "candidate": "gluon ws 128x128 s2 pingpong"},
     "max_distance": 1.0,
     "entries": [{"seq": 8192, "causal": false, "core": "gluon", "config": {...}, "candidate": "...",
                  "ratio_vs_cudnn": 0.999, "us": 1611.3, "cudnn_us": 1610.2, ...}, ...]}

* which table (:func:`table_for`): the first file (by name) one of whose ``match`` substrings is in the
  device's name (and whose ``capability``, when given, is the device's); else the first file with an empty
  ``match`` and the device's ``capability`` (the fallback of a GPU family: ``sm90.json`` gives every Hopper
  GPU without its own table the config measured on H100, and says so in its ``source``).
  ``DITRON_ATTN_TABLE=/path/to/table.json`` (or ``off``: no table, so the ``tl`` core) overrides the search;
* which entry (:meth:`AttnTable.lookup`): among the entries of the same ``causal``, the one nearest in
  ``|log2 seq/seq_e|`` (the first on ties) if within ``max_distance``; otherwise the table's ``default``.
  ``seq`` is the number of keys a query row sees at most (the whole sequence at world size 1).

A ``core`` of ``"tl"`` in an entry means: the ``tl`` core with its own default config
(kernels/attention.py ``default_config``) -- a table may say the Gluon core loses at some shape.

This module reads files and compares numbers only (no torch, triton or device queries): kernels/attention.py
turns an entry's ``config`` into a ``HopperAttnConfig``.
"""
from __future__ import annotations

import math
import os

import ditron

from .gpu_tables import find_table, name_matches, nearest, read_json

TABLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_tables")
CORES = ("tl", "gluon")
ENV = "DITRON_ATTN_TABLE"


class AttnTable:
    """A loaded, validated table (module docstring)."""

    def __init__(self, data: dict, path: str = "<dict>"):
        E = ditron.DitronError
        self.path = path
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise E(f"attention table {path}: expected an object with an 'entries' list")
        self.gpu = str(data.get("gpu", ""))
        self.match = [str(m) for m in data.get("match", [])]
        self.capability = data.get("capability")
        self.measured_on = str(data.get("measured_on", ""))
        self.source = str(data.get("source", ""))
        self.max_distance = float(data.get("max_distance", 1.0))
        self.default = self._check(data.get("default"), f"attention table {path}: 'default'", shape=False)
        self.entries = [self._check(e, f"attention table {path}: entry {i}") for i, e in enumerate(data["entries"])]
        self.verified = self._check_verified(data.get("verified"), f"attention table {path}: 'verified'")

    @staticmethod
    def _check_verified(v, where):
        """``verified``: the inputs a GPU run has checked the Gluon core on (``dtypes``, ``head_dims``,
        ``seq_multiple``: lengths that are multiples of it); absent: no restriction."""
        if v is None:
            return None
        E = ditron.DitronError
        ok = isinstance(v, dict) and set(v) <= {"dtypes", "head_dims", "seq_multiple", "source"} and \
            isinstance(v.get("dtypes", []), list) and isinstance(v.get("head_dims", []), list) and \
            all(isinstance(x, str) for x in v.get("dtypes", [])) and \
            all(isinstance(x, int) and x > 0 for x in v.get("head_dims", [])) and \
            isinstance(v.get("seq_multiple", 1), int) and v.get("seq_multiple", 1) >= 1
        if not ok:
            raise E(f"{where} must be an object of 'dtypes' (names such as \"bf16\"), 'head_dims' (integers), "
                    f"'seq_multiple' (an integer) and 'source', not {v!r}")
        return v

    def unverified(self, dtype_name: str, head_dim: int, seq_q: int, seq_k: int):
        """None when a GPU run has checked the Gluon core on inputs of this kind (:attr:`verified`), else why
        not (the default then keeps the tl core: a core made the default is checked where it runs)."""
        v = self.verified
        if v is None:
            return None
        if "dtypes" in v and dtype_name not in v["dtypes"]:
            return f"{dtype_name} not yet checked on a GPU (verified: {', '.join(v['dtypes'])})"
        if "head_dims" in v and int(head_dim) not in v["head_dims"]:
            return f"head_dim {head_dim} not yet checked on a GPU (verified: {v['head_dims']})"
        m = int(v.get("seq_multiple", 1))
        if seq_q % m or seq_k % m:
            return f"lengths {seq_q} / {seq_k} not multiples of {m}: not yet checked on a GPU"
        return None

    @staticmethod
    def _check(e, where, shape=True):
        E = ditron.DitronError
        if not isinstance(e, dict):
            raise E(f"{where} is not an object")
        if shape:
            if not isinstance(e.get("seq"), int) or e["seq"] < 1:
                raise E(f"{where}: seq={e.get('seq')!r} must be a positive integer")
            if not isinstance(e.get("causal"), bool):
                raise E(f"{where}: causal={e.get('causal')!r} must be true or false")
        if e.get("core") not in CORES:
            raise E(f"{where}: core={e.get('core')!r}; use one of {', '.join(CORES)}")
        if e["core"] == "gluon" and not isinstance(e.get("config"), dict):
            raise E(f"{where}: 'config' must be an object of HopperAttnConfig fields")
        return e

    @classmethod
    def load(cls, path: str) -> "AttnTable":
        return cls(read_json(path, "attention table"), path)

    def applies_to(self, device_name: str, capability=None) -> bool:
        """By name (a ``match`` substring in ``device_name``) and, when both are known, capability."""
        if not name_matches(self.match, device_name):
            return False
        return self.capability is None or capability is None or int(self.capability) == int(capability)

    def is_fallback_for(self, capability) -> bool:
        """A family table: no names, the device's capability."""
        return not self.match and self.capability is not None and capability is not None and \
            int(self.capability) == int(capability)

    def lookup(self, seq, causal):
        """``(entry, distance)``: the nearest entry of the same ``causal`` within ``max_distance``, else
        ``(default, distance to the nearest)`` (``math.inf`` when the table has no such entry)."""
        best, best_d = nearest([e for e in self.entries if e["causal"] == bool(causal)],
                               lambda e: abs(math.log2(max(int(seq), 1) / e["seq"])), self.max_distance)
        return (self.default, best_d) if best is None else (best, best_d)

    def describe(self, entry, distance) -> str:
        """One line naming the table, the entry (or the default) and where it was measured."""
        name = os.path.basename(self.path)
        what = entry.get("candidate", entry["core"])
        if entry is self.default:
            where = "its default"
        else:
            where = f"entry {entry['seq']} keys{' causal' if entry['causal'] else ''}, distance {distance:.2f}"
        measured = f"; measured on {self.measured_on}" if self.measured_on and \
            not any(m and m in self.measured_on for m in self.match) else ""
        return f"table {name}: {what} ({where}{measured})"


_TABLES: dict = {}


def table_for(device_name: str, capability=None):
    """The table for a GPU named ``device_name`` of compute capability ``capability`` (``90`` for 9.0; module
    docstring), or None.  Cached per (name, capability, ``DITRON_ATTN_TABLE``)."""
    return find_table(_TABLES, ENV, TABLE_DIR, AttnTable.load, lambda t: t.applies_to(device_name, capability),
                      lambda t: t.is_fallback_for(capability), key=(device_name, capability))


def clear_cache():
    _TABLES.clear()


__all__ = ["AttnTable", "table_for", "clear_cache", "TABLE_DIR", "ENV", "CORES"]
