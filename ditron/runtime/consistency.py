"""Cross-rank consistency of collective calls.

Every zoo op is collective: all ranks must make the same calls on a context,
in the same order, with the same sizes, dtypes and method.  A rank that
disagrees makes the kernels read stale data or wait forever; this module
turns that into an error on every rank, before anything is launched.

A :class:`CallBoard` belongs to one context (created with it, collectively).
At each call, :meth:`CallBoard.check` publishes this rank's *fingerprint*
(the op, the context's call number and the arguments that must agree) and
reads every other rank's fingerprint for the same call number:

* equal everywhere: the call goes on;
* different: every rank raises :class:`~ditron.errors.DitronError` naming the
  op, the first argument that differs and each rank's value;
* a rank that never makes the call (it skipped it, or called another op):
  the exchange is bounded and raises :class:`~ditron.errors.DitronHangError`
  with a report entry per waiting rank (which ranks are missing and the last
  call each of them made).

Where it runs:

* **simulator**: always.  The fingerprints live in a small symmetric
  ``int64`` array of the context (each rank writes its own copy, peers read
  it through the shared heap); the wait is an ordinary simulator wait, so the
  deadlock watchdog bounds it (``--hang-timeout`` / ``DITRON_HANG_TIMEOUT_S``).
* **GPUs**: with ``DITRON_DEBUG=1``.  The fingerprints travel through
  torch.distributed's key-value store (host only, no kernel, no device
  synchronisation): one ``set`` and one ``wait`` per call, bounded by
  ``DITRON_WAIT_TIMEOUT_S`` (default 60 s here).
"""
from __future__ import annotations

import json
import os
import threading

from ..errors import DitronError, DitronHangError

#: fingerprints kept per rank (a rank runs at most one call ahead of the slowest)
SLOTS = 4
#: int64 words per fingerprint slot: header (call number + 1), payload length, payload bytes
WORDS = 128
_PAYLOAD_BYTES = (WORDS - 2) * 8
DEFAULT_GPU_TIMEOUT_S = 60.0

_UIDS = [0]
_UID_LOCK = threading.Lock()


from .alloccheck import debug_enabled  # noqa: E402,F401  (defined below consistency: alloccheck uses it too)


def _library_dirs():
    """Directories whose frames are never the user's: ditron, the kernel zoo, torch and triton (a zoo op
    called through ``torch.ops.ditron.*`` passes through torch's custom-op dispatch)."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [pkg + os.sep, os.path.join(os.path.dirname(pkg), "kernels") + os.sep]
    for name in ("torch", "triton"):
        import sys
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(mod.__file__)) + os.sep)
    return tuple(dirs)


_LIBRARY_FILE: dict = {}


def _is_library_file(filename) -> bool:
    hit = _LIBRARY_FILE.get(filename)
    if hit is None:          # (torch / triton frames exist only once they are imported: a cached answer stays right)
        hit = _LIBRARY_FILE[filename] = os.path.abspath(filename).startswith(_library_dirs())
    return hit


def call_site() -> str:
    """file:line of the first frame outside ditron, the kernel zoo, torch and triton.  Runs on every
    collective call: a walk over the frames (no source lines read), each file classified once."""
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_library_file(filename):
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _text(value) -> str:
    return value if isinstance(value, str) else repr(value)


def _describe(fp) -> str:
    if fp is None:
        return "no call yet"
    args = ", ".join(f"{k}={v}" for k, v in fp["fields"])
    return f"call #{fp['call']}: {fp['op']}({args}) at {fp['site']}"


def compare(fps, call: int, label: str) -> None:
    """Raise :class:`DitronError` if the fingerprints ``fps`` (one per rank,
    same call number) disagree: the op first, then the first field that differs."""
    ops = [fp["op"] for fp in fps]
    if len(set(ops)) > 1:
        each = "; ".join(f"rank {r}: {op} (at {fp['site']})" for r, (op, fp) in enumerate(zip(ops, fps)))
        raise DitronError(f"{label}: ranks disagree on the operation of call #{call}: {each}. Every rank must "
                          "make the same collective calls in the same order")
    names = []
    for fp in fps:
        for k, _ in fp["fields"]:
            if k not in names:
                names.append(k)
    for name in names:
        vals = [dict(fp["fields"]).get(name, "<missing>") for fp in fps]
        if len(set(vals)) > 1:
            each = "; ".join(f"rank {r}: {v} (at {fp['site']})" for r, (v, fp) in enumerate(zip(vals, fps)))
            raise DitronError(f"{ops[0]}: ranks disagree on argument '{name}' (call #{call} on {label}): {each}. "
                              f"Every rank must call {ops[0]} with the same {name}; nothing was launched")


class CallBoard:
    """The fingerprint exchange of one context (see the module docstring).
    Create it collectively (same order on every rank), like the context."""

    def __init__(self, world, op: str):
        self.world = world
        self.calls = 0
        self.last = None
        with _UID_LOCK:
            _UIDS[0] += 1
            self.uid = _UIDS[0]
        self.label = f"{op} context #{self.uid}"
        self.sim = world.backend == "sim"
        self.words = None
        if self.sim and world.world_size > 1:
            from .world import symm_zeros
            import torch
            self.words = symm_zeros((SLOTS, WORDS), torch.int64, name=f"{op}.call_check")
            # every rank's words are zero before any rank's first check writes into a peer's copy (a rank that
            # zeroed its copy late would wipe a faster peer's fingerprint: "lost its call #0")
            from .world import barrier_all
            barrier_all()

    # -- public ---------------------------------------------------------------------
    def check(self, op: str, fields) -> None:
        """Check that every rank makes this call with the same ``fields``
        (a list of ``(name, value)``, or a function that returns it; values are compared as text).  Where nothing is compared (one rank, or a
        GPU world without ``DITRON_DEBUG=1``) only the call is counted: no fingerprint is made."""
        call = self.calls
        if self.world.world_size == 1 or not (self.sim or debug_enabled()):
            self.calls = call + 1
            return
        fp = self.fingerprint(op, fields() if callable(fields) else fields, call)
        fps = self._exchange_sim(fp, call) if self.sim else self._exchange_store(fp, call)
        self.calls = call + 1
        self.last = fp
        compare(fps, call, self.label)

    def fingerprint(self, op: str, fields, call=None) -> dict:
        """What :meth:`check` compares across ranks: the op, the call number, the fields as text and the
        caller's line outside ditron (:func:`call_site`)."""
        return {"op": op, "call": self.calls if call is None else call,
                "fields": [(k, _text(v)) for k, v in fields], "site": call_site()}

    # -- simulator: the context's symmetric words ------------------------------------------
    def _encode(self, fp) -> bytes:
        data = json.dumps(fp, separators=(",", ":")).encode()
        if len(data) > _PAYLOAD_BYTES:           # long argument lists: keep the op, the call and a digest
            import hashlib
            digest = hashlib.sha1(data).hexdigest()[:16]
            data = json.dumps({"op": fp["op"], "call": fp["call"], "site": fp["site"][:64],
                               "fields": [("arguments (digest)", digest)]}).encode()
        return data

    def _exchange_sim(self, fp, call):
        import numpy as np
        import torch
        from .. import sim_memory as M
        transport = self.world.transport
        me, W = self.world.rank, self.world.world_size
        slot = call % SLOTS
        data = self._encode(fp)
        own = self.words[slot]
        payload = np.zeros(WORDS - 2, dtype=np.int64)
        payload.view(np.uint8)[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        own[1] = len(data)
        own[2:] = torch.from_numpy(payload)
        M.atomic_xchg(own.data_ptr(), call + 1)              # header last: the payload is complete
        transport.control.progress()
        peers = [transport.peer_tensor(self.words, r) if r != me else self.words for r in range(W)]
        headers = [p[slot].data_ptr() for p in peers]

        def check():
            seen = [int(M.atomic_load(h)[0]) for h in headers]
            return all(s >= call + 1 for s in seen), seen

        def describe(seen):
            missing = [r for r, s in enumerate(seen) if s < call + 1]
            last = "; ".join(f"rank {r}: {self._peer_last(peers[r])}" for r in missing)
            return {"rank": me, "program": None, "primitive": f"{fp['op']} (cross-rank argument check, "
                                                              f"call #{call} on {self.label})",
                    "where": fp["site"], "signal": f"ranks {missing} have not made this call",
                    "expected": f"every rank at call #{call}", "observed": last}
        from .sim import Blocked
        try:
            transport.spin(check, describe)
        except Blocked as b:
            raise DitronHangError(f"rank {me}: {fp['op']} call #{call} on {self.label}: not every rank made this "
                                  f"call ({b.reason})", [b.info]) from None
        out = []
        for r, p in enumerate(peers):
            out.append(fp if r == me else self._read(p[slot], call, r))
        return out

    def _read(self, row, call, rank):
        import numpy as np
        words = row.numpy().copy()
        if int(words[0]) != call + 1:
            raise DitronError(f"{self.label}: rank {rank} is more than {SLOTS - 1} calls ahead of rank "
                              f"{self.world.rank}; the cross-rank check lost its call #{call}")
        n = int(words[1])
        return json.loads(np.ascontiguousarray(words[2:]).view(np.uint8)[:n].tobytes())

    def _peer_last(self, peer_words):
        """The last call a rank published on this board, as text."""
        header = int(peer_words[:, 0].max())
        if header <= 0:
            return "no call on this context yet"
        prev = header - 1
        try:
            return _describe(self._read(peer_words[prev % SLOTS], prev, -1))
        except Exception:  # noqa: BLE001 -- overwritten meanwhile
            return f"last call #{prev}"

    # -- GPUs: torch.distributed's store -------------------------------------------------
    def _exchange_store(self, fp, call):
        import torch.distributed as dist
        store = dist.distributed_c10d._get_default_store()
        return exchange_via_store(store, f"ditron/check/{self.uid}", self.world.rank, self.world.world_size, fp,
                                  call, self.label, gpu_timeout_s())


def gpu_timeout_s() -> float:
    raw = os.environ.get("DITRON_WAIT_TIMEOUT_S")
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        raise DitronError(f"DITRON_WAIT_TIMEOUT_S={raw!r} is not a number of seconds") from None
    return value if value > 0 else DEFAULT_GPU_TIMEOUT_S


def exchange_via_store(store, prefix, rank, world_size, fp, call, label, timeout_s):
    """All ranks' fingerprints of ``call`` through a torch.distributed store
    (``set`` own, ``wait`` for all); a rank missing after ``timeout_s``
    seconds raises :class:`DitronHangError` naming it and its last call."""
    import datetime
    store.set(f"{prefix}/last/{rank}", json.dumps(fp))
    store.set(f"{prefix}/{call}/{rank}", json.dumps(fp))
    keys = [f"{prefix}/{call}/{r}" for r in range(world_size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 -- torch raises DistStoreError / RuntimeError on a timeout
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        if not missing:
            raise
        lasts = []
        for r in missing:
            k = f"{prefix}/last/{r}"
            lasts.append(f"rank {r}: {_describe(json.loads(store.get(k)))}" if store.check([k]) else
                         f"rank {r}: no call on this context yet")
        info = {"rank": rank, "program": None,
                "primitive": f"{fp['op']} (cross-rank argument check, call #{call} on {label})",
                "where": fp["site"], "signal": f"ranks {missing} have not made this call",
                "expected": f"every rank at call #{call}", "observed": "; ".join(lasts)}
        raise DitronHangError(f"rank {rank}: {fp['op']} call #{call} on {label}: ranks {missing} did not make this "
                              f"call within {timeout_s:g} s (DITRON_WAIT_TIMEOUT_S)", [info]) from e
    fps = [fp if r == rank else json.loads(store.get(k)) for r, k in enumerate(keys)]
    if call >= 2:                                   # keep the store small: a rank is at most one call behind
        try:
            store.delete_key(f"{prefix}/{call - 2}/{rank}")
        except Exception:  # noqa: BLE001 -- stores without delete_key
            pass
    return fps
