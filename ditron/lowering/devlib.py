"""The ditron device library: small LLVM IR functions linked into kernels.

Stock Triton cannot declare module globals, call LLVM intrinsics that it does
not wrap, or pass a generic ``ptr`` to an extern function.  A device library
does all three: Triton calls its functions through ``extern_elementwise``
with scalar integer arguments, the library casts them to the exact C types
(for NVSHMEM / rocSHMEM wrappers), and Triton's own link step
(``extern_libs``, LinkOnlyNeeded) pulls in only the functions a kernel
uses; everything is ``alwaysinline``, so no call survives optimisation.

The library also holds the **world descriptor** ``__ditron_world``: an array
of 64-bit words (rank, world size, node layout, symmetric-heap deltas, debug
settings) that the runtime writes into each loaded module
(``cuModuleGetGlobal`` / ``hipModuleGetGlobal``).  Kernels therefore never pass
heap bases or world handles by hand, and helper ``@triton.jit`` functions can
use ``dl.rank()`` or ``dl.symm_at`` as freely as the kernel itself.

The library text is generated here (deterministically) and written once per
content hash under the ditron cache directory; the path goes into Triton's
``extern_libs`` option, whose hash covers the file's content.
"""
from __future__ import annotations

import hashlib
import os
import threading

from .. import _compat

# ---------------------------------------------------------------------------
# World descriptor layout (shared with the runtime)
# ---------------------------------------------------------------------------
WORLD_SYMBOL = "__ditron_world"
WORLD_MAGIC = 0x4449_5452_4F4E_0001          # "DITRON" v1
WORLD_FIELDS = {
    "magic": 0,
    "rank": 1,
    "world_size": 2,
    "local_rank": 3,
    "local_world_size": 4,
    "node": 5,
    "nnodes": 6,
    "flags": 7,
    "wait_timeout_ns": 8,
    "debug_buffer": 9,
    "heap_size": 10,
}
#: symmetric-heap deltas (peer base - own base, in HEAP_ALIGN units) start here,
#: one per local rank
WORLD_HEAP_DELTAS = 16
MAX_LOCAL_RANKS = 128
WORLD_WORDS = WORLD_HEAP_DELTAS + MAX_LOCAL_RANKS
#: symmetric heaps are aligned to (at least) this many bytes, so that
#: ``symm_at`` keeps the pointer alignment that Triton's vectoriser relies on
HEAP_ALIGN = 4096


class DeviceLibrary:
    """An LLVM IR library for one backend, assembled from named pieces."""

    def __init__(self, name: str, backend: str, *, const_addrspace: int, header: str = ""):
        self.name = name                 # the key in Triton's ``extern_libs``
        self.backend = backend
        self.const_as = const_addrspace
        self.header = header
        self._pieces: dict[str, str] = {}
        self._decls: dict[str, str] = {}
        self._path = None
        self._lock = threading.Lock()

    def define(self, symbol: str, text: str):
        if symbol in self._pieces and self._pieces[symbol] != text:
            raise RuntimeError(f"device library {self.name}: {symbol} defined twice")
        self._pieces[symbol] = text
        self._path = None
        return symbol

    def declare(self, symbol: str, text: str):
        self._decls[symbol] = text
        self._path = None

    def has(self, symbol: str) -> bool:
        return symbol in self._pieces

    def text(self) -> str:
        parts = [f"; ditron device library for {self.backend} (generated; do not edit)", self.header]
        parts += [self._decls[k] for k in sorted(self._decls)]
        parts += [self._pieces[k] for k in sorted(self._pieces)]
        parts.append("attributes #0 = { alwaysinline nounwind }")
        parts.append("attributes #1 = { alwaysinline nounwind convergent }")
        return "\n".join(p for p in parts if p) + "\n"

    def path(self) -> str:
        with self._lock:
            if self._path is not None and os.path.exists(self._path):
                return self._path
            text = self.text()
            digest = hashlib.sha256(text.encode()).hexdigest()[:16]
            directory = os.path.join(_compat.ditron_cache_dir(), "devlib")
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"lib{self.name}_{self.backend}_{digest}.ll")
            if not os.path.exists(path):
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(text)
                os.replace(tmp, path)
            self._path = path
            return path


def add_world(lib: DeviceLibrary, trap: str = "llvm.trap"):
    """The world descriptor and its accessors (target-independent IR)."""
    cas = lib.const_as
    lib.declare(trap, f"declare void @{trap}()")
    lib.declare(WORLD_SYMBOL, f"@{WORLD_SYMBOL} = addrspace({cas}) externally_initialized global "
                              f"[{WORLD_WORDS} x i64] zeroinitializer, align 8")
    lib.define("ditron_world_get", f"""
define i64 @ditron_world_get(i32 %idx) #0 {{
  %i = zext i32 %idx to i64
  %p = getelementptr [{WORLD_WORDS} x i64], ptr addrspace({cas}) @{WORLD_SYMBOL}, i64 0, i64 %i
  %v = load i64, ptr addrspace({cas}) %p, align 8
  ret i64 %v
}}""")
    # delta (in HEAP_ALIGN units) from this rank's heap to ``rank``'s heap; traps
    # when ``rank`` is not on this node (no load/store path exists to it)
    f = WORLD_FIELDS
    lib.define("ditron_symm_delta", f"""
define i64 @ditron_symm_delta(i32 %rank) #0 {{
entry:
  %pn = getelementptr [{WORLD_WORDS} x i64], ptr addrspace({cas}) @{WORLD_SYMBOL}, i64 0, i64 {f['node']}
  %node = load i64, ptr addrspace({cas}) %pn, align 8
  %pl = getelementptr [{WORLD_WORDS} x i64], ptr addrspace({cas}) @{WORLD_SYMBOL}, i64 0, i64 {f['local_world_size']}
  %lws = load i64, ptr addrspace({cas}) %pl, align 8
  %first = mul i64 %node, %lws
  %r = sext i32 %rank to i64
  %local = sub i64 %r, %first
  %ok = icmp ult i64 %local, %lws
  br i1 %ok, label %in, label %bad
bad:
  call void @{trap}()
  unreachable
in:
  %slot = add i64 %local, {WORLD_HEAP_DELTAS}
  %pd = getelementptr [{WORLD_WORDS} x i64], ptr addrspace({cas}) @{WORLD_SYMBOL}, i64 0, i64 %slot
  %d = load i64, ptr addrspace({cas}) %pd, align 8
  ret i64 %d
}}""")


# ---------------------------------------------------------------------------
# C prototypes -> exact LLVM wrappers for OpenSHMEM device libraries
# ---------------------------------------------------------------------------
#: LLVM type of each C parameter kind, and the Triton dtype that carries it
C_TYPES = {
    "ptr": ("ptr", "int64"),      # void *, const void *, uint64_t *
    "size_t": ("i64", "int64"),
    "int": ("i32", "int32"),
    "uint64": ("i64", "uint64"),
    "team": ("i32", "int32"),
    "void": ("void", None),
    "i64": ("i64", "int64"),
}


def add_c_wrapper(lib: DeviceLibrary, wrapper: str, callee: str, ret: str, params: list[str], *, guard=None):
    """Define ``wrapper`` with Triton-friendly integer parameters that calls
    ``callee`` with its exact C prototype (pointers as ``ptr``, void result
    returned as ``i32 0``).  ``guard`` is IR computing ``%guard`` (i1) in the
    entry block; the call then runs only where it is true."""
    ll_ret = C_TYPES[ret][0]
    wrap_params, casts, call_args = [], [], []
    for i, kind in enumerate(params):
        ll = C_TYPES[kind][0]
        if ll == "ptr":
            wrap_params.append(f"i64 %a{i}")
            casts.append(f"  %p{i} = inttoptr i64 %a{i} to ptr")
            call_args.append(f"ptr %p{i}")
        else:
            wrap_params.append(f"{ll} %a{i}")
            call_args.append(f"{ll} %a{i}")
    decl_args = ", ".join(C_TYPES[k][0] for k in params)
    lib.declare(callee, f"declare {ll_ret} @{callee}({decl_args})")
    wrap_ret = "i64" if ll_ret == "ptr" else ("i32" if ll_ret == "void" else ll_ret)
    body = list(casts)
    if ll_ret == "void":
        call = f"  call void @{callee}({', '.join(call_args)})"
        result = "  ret i32 0"
    elif ll_ret == "ptr":
        call = f"  %r = call ptr @{callee}({', '.join(call_args)})\n  %ri = ptrtoint ptr %r to i64"
        result = "  ret i64 %ri"
    else:
        call = f"  %r = call {ll_ret} @{callee}({', '.join(call_args)})"
        result = f"  ret {ll_ret} %r"
    if guard:
        assert ll_ret == "void", "guarded wrappers return nothing"
        text = (f"define {wrap_ret} @{wrapper}({', '.join(wrap_params)}) #1 {{\nentry:\n{guard}\n"
                f"  br i1 %guard, label %do, label %done\ndo:\n" + "\n".join(body + [call]) +
                "\n  br label %done\ndone:\n  ret i32 0\n}")
    else:
        text = (f"define {wrap_ret} @{wrapper}({', '.join(wrap_params)}) #0 {{\n" + "\n".join(body + [call, result]) +
                "\n}")
    lib.define(wrapper, text)
    return wrapper, wrap_ret
