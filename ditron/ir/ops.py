"""The distributed IR: a small, backend-neutral op set, written as an
executable specification.

Each primitive of ``ditron.language`` creates exactly one :class:`Op` whose
``kind`` names an :class:`OpSpec` in :data:`OPS`.  The spec says which operands
the op takes (and of what sort), which attributes and values are legal, what
it returns, what memory effects it has and which targets can express it.
:func:`verify` checks an op against its spec; it runs on every op before any
lowering rule sees it, so lowering rules may assume a valid op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import DitronCompileError

# operand sorts ------------------------------------------------------------
PTR = "ptr"                # pointer: scalar or tensor of pointers
SCALAR_PTR = "scalar_ptr"  # one pointer (not a tensor)
INT = "int"                # integer: Python int, scalar or tensor
INT_SCALAR = "int_scalar"  # one integer (Python int or 0-d value)
VALUE = "value"            # any tensor / scalar / pointer
TOKEN = "token"            # the result of wait

SCOPES = ("gpu", "sys")
THREAD_SCOPES = ("cta", "gpu", "sys")
SEMANTICS_LOAD = ("acquire", "relaxed", "volatile")
SEMANTICS_STORE = ("release", "relaxed", "volatile")
SEMANTICS_RMW = ("acquire", "release", "acq_rel", "relaxed")
SIG_OPS = ("set", "add")
COMM_SCOPES = ("gpu", "intra_node", "inter_node")
CMP_OPS = ("eq", "ne", "gt", "ge", "lt", "le")


@dataclass(frozen=True)
class OpSpec:
    kind: str
    level: str                                  # "tile" | "thread" | "chunk"
    operands: tuple = ()                        # ((name, sort), ...)
    attrs: dict = field(default_factory=dict)   # name -> tuple of legal values | type
    result: Optional[str] = None                # description of the result
    effects: tuple = ()                         # "read", "write", "remote", "sync", "barrier"
    backends: tuple = ("cuda", "hip", "sim")
    min_sm: int = 0                             # minimum NVIDIA capability
    library: Optional[str] = None               # "shmem" when an OpenSHMEM library must be linked
    doc: str = ""


def _spec(kind, level, operands=(), attrs=None, result=None, effects=(), **kw):
    return OpSpec(kind, level, tuple(operands), dict(attrs or {}), result, tuple(effects), **kw)


_PUT_OPS = (("dst", PTR), ("src", PTR), ("nbytes", INT_SCALAR), ("pe", INT_SCALAR))
_SIG_OPS = (("dst", PTR), ("src", PTR), ("nbytes", INT_SCALAR), ("sig_addr", SCALAR_PTR), ("signal", INT_SCALAR),
            ("pe", INT_SCALAR))
_COOP = ("thread", "warp", "block")

OPS: dict[str, OpSpec] = {}


def _add(spec: OpSpec):
    OPS[spec.kind] = spec


# tile level -----------------------------------------------------------------
_add(_spec("rank", "tile", attrs={"axis": (-1, 0, 1)}, result="i32"))
_add(_spec("num_ranks", "tile", attrs={"axis": (-1, 0, 1)}, result="i32"))
_add(_spec("symm_at", "tile", [("ptr", PTR), ("rank", INT_SCALAR)], result="pointer like ptr"))
_add(_spec("wait", "tile", [("barrier_ptrs", SCALAR_PTR), ("num_barriers", INT_SCALAR), ("wait_value", INT_SCALAR)],
           {"scope": SCOPES, "semantic": ("acquire", "relaxed")}, result="token", effects=("read", "sync", "barrier")))
_add(_spec("consume_token", "tile", [("value", VALUE), ("token", TOKEN)], result="value"))
_add(_spec("notify", "tile", [("ptr", SCALAR_PTR), ("rank", INT_SCALAR), ("signal", INT_SCALAR)],
           {"sig_op": SIG_OPS, "comm_scope": COMM_SCOPES}, effects=("write", "remote", "sync", "barrier")))
# task level: the scoreboard and work queue of a megakernel (ditron.task)
_add(_spec("wait_deps", "tile", [("slot_ptr", SCALAR_PTR), ("num_slots", INT_SCALAR), ("epoch", INT_SCALAR)],
           {"acquire": ("fence", "load")}, result="token", effects=("read", "sync", "barrier"),
           doc="poll int32 slots [0, num_slots) with acquire (gpu) until each is >= epoch, then a CTA barrier"))
_add(_spec("release_tile", "tile", [("slot_ptr", SCALAR_PTR), ("epoch", INT_SCALAR)],
           effects=("write", "sync", "barrier"),
           doc="CTA barrier, then one thread stores epoch with release (gpu)"))
_add(_spec("fetch_task", "tile", [("counter_ptr", SCALAR_PTR)], result="i32", effects=("read", "write", "sync"),
           doc="one atomic add (acq_rel, gpu) per program; the ticket is broadcast to all threads"))
_add(_spec("multimem_ld_reduce", "tile", [("ptrs", PTR)], {"op": ("sum", "min", "max"), "acc_dtype": object},
           result="tensor", effects=("read", "remote"), backends=("cuda", "sim"), min_sm=90))
_add(_spec("multimem_st", "tile", [("ptrs", PTR), ("value", VALUE)], effects=("write", "remote"),
           backends=("cuda", "sim"), min_sm=90))
# packed multicast accesses per thread (Triton-distributed's language_extra helpers, ditron.language.extra)
_add(_spec("multimem_ld_reduce_v4", "thread", [("ptr", PTR), ("mask", VALUE)], {"acc_dtype": object},
           result="4 x 32-bit words", effects=("read", "remote"), backends=("cuda", "sim"), min_sm=90,
           doc="one 128-bit multimem.ld_reduce.add per pointer (per thread): the sum over every rank's copy of "
               "the 16 bytes, per fp32 / fp16 / bf16 lane (16-bit lanes accumulate in fp32), as four 32-bit words "
               "(fp32 values, or int32 words of two packed 16-bit lanes); a mask skips the access (words 0)"))
_add(_spec("multimem_st_packed", "thread", [("ptr", PTR), ("values", VALUE), ("mask", VALUE)],
           {"form": ("b32", "b64", "v2", "v4")}, effects=("write", "remote"), backends=("cuda", "sim"), min_sm=90,
           doc="one multimem.st per pointer (per thread) of one 32-bit (b32), one 64-bit (b64), two (v2) or four "
               "(v4) 32-bit words: their bits reach every rank's copy; a mask skips the store"))

# thread level ---------------------------------------------------------------
_add(_spec("tid", "thread", attrs={"axis": (0, 1, 2)}, result="i32"))
_add(_spec("laneid", "thread", result="i32"))
_add(_spec("num_threads", "thread", result="i32"))
_add(_spec("num_warps", "thread", result="i32"))
_add(_spec("simt_region", "thread", result="(thread index, threads in the program): i32, i32",
           doc="enter per-thread (SIMT) code: the values of tid(0) and num_threads() for the region's body"))
_add(_spec("ld", "thread", [("ptr", PTR)], {"scope": THREAD_SCOPES, "semantic": SEMANTICS_LOAD}, result="value",
           effects=("read", "sync")))
_add(_spec("st", "thread", [("ptr", PTR), ("value", VALUE)], {"scope": THREAD_SCOPES, "semantic": SEMANTICS_STORE},
           effects=("write", "sync")))
# one vector access per thread (Triton-distributed's load_v4_* / st_v4_* / load_v2_b64 / st_v2_u32): a 16-byte
# (or 8-byte) aligned access that a GPU performs as one access; "" semantic is a weak access (no scope)
_add(_spec("ld_vec", "thread", [("ptr", PTR)], {"words": (2, 4), "scope": ("",) + THREAD_SCOPES,
                                                "semantic": ("",) + SEMANTICS_LOAD},
           result="words x the pointer's element (a tuple)", effects=("read", "sync"),
           doc="one aligned vector load of `words` 32- or 64-bit words at ptr per pointer (per thread): "
               "ld{.sem.scope}.global.v2/.v4 on NVIDIA, one 128-/64-bit global load on AMD, one access on the "
               "simulator; the address must be aligned to the vector's size"))
_add(_spec("st_vec", "thread", [("ptr", PTR), ("values", VALUE)], {"scope": ("",) + THREAD_SCOPES,
                                                                   "semantic": ("",) + SEMANTICS_STORE},
           effects=("write", "sync"),
           doc="one aligned vector store of 2 or 4 words (of the pointer's element type) per pointer (per thread)"))
_add(_spec("atomic_add", "thread", [("ptr", PTR), ("value", VALUE)],
           {"scope": THREAD_SCOPES, "semantic": SEMANTICS_RMW}, result="old value", effects=("read", "write", "sync")))
_add(_spec("atomic_cas", "thread", [("ptr", PTR), ("cmp", VALUE), ("value", VALUE)],
           {"scope": THREAD_SCOPES, "semantic": SEMANTICS_RMW}, result="old value", effects=("read", "write", "sync")))
_add(_spec("syncthreads", "thread", effects=("barrier",)))
_add(_spec("fence", "thread", attrs={"semantic": ("acquire", "release", "acq_rel", "sc"), "scope": THREAD_SCOPES},
           effects=("sync",)))
_add(_spec("ballot_sync", "thread", [("mask", INT), ("pred", VALUE)], result="lane mask"))
for _k in ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync"):
    _add(_spec(_k, "thread", [("mask", INT), ("value", VALUE), ("lane", INT)], result="value"))
_add(_spec("ffs", "thread", [("x", INT)], result="i32"))
_add(_spec("clock_ns", "thread", result="i64"))
_add(_spec("poll_timeout", "tile", [("start", INT_SCALAR), ("ptr", PTR), ("expected", INT), ("observed", INT),
                                    ("pending", VALUE)], effects=("sync",)))

_add(_spec("prefetch_l2", "tile", [("ptr", PTR), ("mask", VALUE)],
           doc="a hint: bring the lines of the unmasked addresses into L2; no result, no ordering"))

# chunk level (OpenSHMEM) ----------------------------------------------------
_add(_spec("shmem.my_pe", "chunk", result="i32", library="shmem"))
_add(_spec("shmem.n_pes", "chunk", result="i32", library="shmem"))
_add(_spec("shmem.remote_ptr", "chunk", [("ptr", PTR), ("pe", INT_SCALAR)], result="pointer like ptr",
           library="shmem"))
_add(_spec("shmem.remote_mc_ptr", "chunk", [("team", INT_SCALAR), ("ptr", PTR)], result="pointer like ptr",
           backends=("cuda", "sim"), min_sm=90, library="shmem"))
for _name in ("putmem", "getmem"):
    _add(_spec(f"shmem.{_name}", "chunk", _PUT_OPS, {"nbi": (False, True), "coop": _COOP},
               effects=("read", "write", "remote"), library="shmem"))
_add(_spec("shmem.putmem_signal", "chunk", _SIG_OPS, {"nbi": (False, True), "coop": _COOP, "sig_op": SIG_OPS},
           effects=("read", "write", "remote", "sync"), library="shmem"))
_add(_spec("shmem.signal_op", "chunk", [("sig_addr", SCALAR_PTR), ("signal", INT_SCALAR), ("pe", INT_SCALAR)],
           {"sig_op": SIG_OPS}, effects=("write", "remote", "sync"), library="shmem"))
_add(_spec("shmem.signal_wait_until", "chunk", [("sig_addr", SCALAR_PTR), ("cmp_value", INT_SCALAR)],
           {"cmp": CMP_OPS}, result="i64",
           effects=("read", "sync"), library="shmem"))
_add(_spec("shmem.quiet", "chunk", effects=("sync",), library="shmem"))
_add(_spec("shmem.fence", "chunk", effects=("sync",), library="shmem"))
_add(_spec("shmem.barrier_all", "chunk", attrs={"coop": _COOP}, effects=("sync", "barrier", "remote"),
           library="shmem"))
_add(_spec("shmem.sync_all", "chunk", attrs={"coop": _COOP}, effects=("sync", "barrier", "remote"),
           library="shmem"))


# --------------------------------------------------------------------------
# Ops and modules
# --------------------------------------------------------------------------

@dataclass
class Op:
    kind: str
    operands: dict            # name -> Triton value (or Python value)
    attrs: dict               # name -> Python value
    fn: Optional[str] = None  # kernel / function that holds the op
    file: Optional[str] = None
    line: Optional[int] = None
    exprs: dict = field(default_factory=dict)   # operand name -> source text
    index: int = -1
    result_type: Optional[str] = None

    @property
    def spec(self) -> OpSpec:
        return OPS[self.kind]

    @property
    def loc(self) -> Optional[str]:
        if self.line is None:
            return None
        import os
        return f"{os.path.basename(self.file or '?')}:{self.line}"

    def text(self) -> str:
        ops = []
        for name, _sort in self.spec.operands:
            if name not in self.operands or (_sort == VALUE and self.operands[name] is None):
                continue
            expr = self.exprs.get(name) or _value_text(self.operands[name])
            ops.append(f"{name}={expr} : {type_text(self.operands[name])}")
        attrs = ", ".join(f"{k} = {_attr_text(v)}" for k, v in self.attrs.items())
        res = f"%{self.index} = " if self.spec.result else ""
        s = f"{res}dist.{self.kind.replace('shmem.', 'shmem_')}({', '.join(ops)})"
        if attrs:
            s += f" {{{attrs}}}"
        if self.spec.result:
            s += f" -> {self.result_type or self.spec.result}"
        if self.spec.effects:
            s += f"  [{', '.join(self.spec.effects)}]"
        if self.loc:
            s += f"  loc({self.loc})"
        return s


def _attr_text(v):
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


class _Detached:
    """An operand after its compilation: its type, without the Triton IR value."""
    __slots__ = ("type",)

    def __init__(self, t):
        self.type = t

    @staticmethod
    def of(v):
        return _Detached(v.type) if hasattr(v, "handle") and hasattr(v, "type") else v

    def __repr__(self):
        return "<value>"


def _value_text(v):
    from .. import _compat
    v = _compat.unwrap(v)
    return repr(v) if not hasattr(v, "type") else "<value>"


def type_text(v) -> str:
    """Compact type of a Triton value: ``!ptr<i32>``, ``tensor<128x!ptr<fp16>>``, ``i32``."""
    from .. import _compat
    v = _compat.unwrap(v)
    t = getattr(v, "type", None)
    if t is None:
        return type(v).__name__
    return _type_str(t)


def _type_str(t) -> str:
    if not hasattr(t, "is_block"):          # a tensor descriptor (tl.make_tensor_descriptor / TensorDescriptor)
        block = getattr(t, "block_type", None)
        return f"!tt.tensordesc<{_type_str(block)}>" if block is not None else str(t)
    if t.is_block():
        shape = "x".join(str(int(_unwrap(d))) for d in t.shape)
        return f"tensor<{shape}x{_type_str(t.element_ty)}>"
    if t.is_ptr():
        return f"!ptr<{_type_str(t.element_ty)}>"
    name = str(t)
    return {"int32": "i32", "int64": "i64", "int1": "i1", "uint32": "u32", "uint64": "u64", "int16": "i16",
            "int8": "i8", "float16": "fp16", "float32": "fp32", "bfloat16": "bf16", "float64": "fp64"}.get(name, name)


def _unwrap(d):
    from .. import _compat
    return _compat.unwrap(d)


@dataclass
class Module:
    """The distributed ops of one compilation, grouped by function."""
    name: str
    target: str = ""
    ops: list = field(default_factory=list)

    def add(self, op: Op):
        op.index = len(self.ops)
        self.ops.append(op)
        return op

    def detach(self):
        """Drop the Triton IR values the operands hold (keep their types), once the compilation that made
        them is over: a module kept with a compiled kernel must not keep Triton's MLIR objects alive (under
        nanobind, Triton >= 3.7, objects alive at exit print a "nanobind: leaked ..." dump)."""
        for op in self.ops:
            op.operands = {k: _Detached.of(v) for k, v in op.operands.items()}

    @property
    def kinds(self):
        return [op.kind for op in self.ops]

    @property
    def libraries(self):
        return sorted({op.spec.library for op in self.ops if op.spec.library})

    def text(self) -> str:
        lines = [f"// ditron distributed IR, target {self.target}"]
        by_fn: dict[str, list[Op]] = {}
        for op in self.ops:
            by_fn.setdefault(op.fn or self.name, []).append(op)
        if not by_fn:
            lines.append(f"dist.func @{self.name} {{\n  // no distributed ops\n}}")
        for fn, ops in by_fn.items():
            lines.append(f"dist.func @{fn} {{")
            lines.extend("  " + op.text() for op in ops)
            lines.append("}")
        return "\n".join(lines) + "\n"

    __str__ = text


# --------------------------------------------------------------------------
# Verifier
# --------------------------------------------------------------------------

def _sort_ok(sort: str, v) -> Optional[str]:
    """None if ``v`` is of operand sort ``sort``, else what it is instead."""
    from .. import _compat
    raw = _compat.unwrap(v)
    t = getattr(raw, "type", None)
    if sort == VALUE:
        return None
    if sort == TOKEN:
        return None if t is not None else f"a Python {type(raw).__name__} (pass the result of dl.wait)"
    if sort in (PTR, SCALAR_PTR):
        if t is None:
            return f"a Python {type(raw).__name__}, not a pointer"
        elem = t.element_ty if t.is_block() else t
        if not elem.is_ptr():
            return f"a {_type_str(t)} value, not a pointer"
        if sort == SCALAR_PTR and t.is_block():
            return f"a tensor of pointers ({_type_str(t)}); pass one pointer"
        return None
    if sort in (INT, INT_SCALAR):
        if t is None:
            return None if isinstance(raw, (int, bool)) and not isinstance(raw, float) else \
                f"a Python {type(raw).__name__}, not an integer"
        elem = t.element_ty if t.is_block() else t
        if not elem.is_int():
            return f"a {_type_str(t)} value, not an integer"
        if sort == INT_SCALAR and t.is_block():
            return f"a tensor ({_type_str(t)}); pass one integer"
        return None
    raise AssertionError(sort)


def verify(op: Op, target) -> None:
    """Check ``op`` against its :class:`OpSpec` for ``target``.

    Raises :class:`DitronCompileError` naming the op, the argument and the
    target on the first violation.
    """
    spec = OPS.get(op.kind)
    name = op.kind
    tname = getattr(target, "name", str(target))
    if spec is None:
        raise DitronCompileError("not a distributed-IR op", op=name, target=tname, loc=op.loc)
    for attr, value in op.attrs.items():
        legal = spec.attrs.get(attr)
        if legal is None:
            raise DitronCompileError(f"unknown attribute (legal: {sorted(spec.attrs)})", op=name, arg=attr,
                                     target=tname, loc=op.loc)
        if isinstance(legal, tuple) and value not in legal:
            choices = ", ".join(repr(c) for c in legal)
            raise DitronCompileError(f"{value!r} is not one of {choices}", op=name, arg=attr, target=tname,
                                     loc=op.loc)
    for operand, sort in spec.operands:
        if operand not in op.operands:
            raise DitronCompileError("missing operand", op=name, arg=operand, target=tname, loc=op.loc)
        why = _sort_ok(sort, op.operands[operand])
        if why is not None:
            want = {PTR: "a pointer", SCALAR_PTR: "one pointer", INT: "an integer", INT_SCALAR: "one integer",
                    TOKEN: "a token"}[sort]
            raise DitronCompileError(f"expected {want}, got {why}", op=name, arg=operand, target=tname,
                                     loc=op.loc)
    backend = getattr(target, "backend", None)
    if backend is not None and backend not in spec.backends:
        raise DitronCompileError(_unsupported_reason(spec, target), op=name, target=tname, loc=op.loc)
    if backend == "cuda" and spec.min_sm and target.capability < spec.min_sm:
        raise DitronCompileError(f"needs sm_{spec.min_sm} or newer (NVLink SHARP / multicast memory)", op=name,
                                 target=tname, loc=op.loc)


def _unsupported_reason(spec: OpSpec, target) -> str:
    if spec.kind.startswith("multimem") or spec.kind == "shmem.remote_mc_ptr":
        return ("NVLink SHARP multicast memory exists only on NVIDIA sm_90+ GPUs; "
                f"{target.name} has no multimem instructions -- use a symm_at load/store loop instead")
    return f"not available on the {target.backend} backend"


def spec_table() -> str:
    """The op set as a Markdown table (used by docs and ``ditron doctor``)."""
    rows = ["| op | level | operands | attributes | result | effects | backends |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for spec in OPS.values():
        operands = ", ".join(f"{n}: {s}" for n, s in spec.operands) or "-"
        attrs = "; ".join(f"{k} in {v}" if isinstance(v, tuple) else f"{k}" for k, v in spec.attrs.items()) or "-"
        rows.append(f"| {spec.kind} | {spec.level} | {operands} | {attrs} | {spec.result or '-'} | "
                    f"{', '.join(spec.effects) or '-'} | {', '.join(spec.backends)} |")
    return "\n".join(rows)
