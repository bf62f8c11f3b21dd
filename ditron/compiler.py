"""Ahead-of-time compilation without a GPU: ``ditron.compile``.

    ck = ditron.compile(kernel, target="sm_90a", signature={"x": "*fp16", "n": "i32", "BLOCK": "constexpr"},
                        constexprs={"BLOCK": 1024})
    ck.asm["dist_ir"], ck.asm["ttir"], ck.asm["ptx"], ck.asm["cubin"]

Works for ``sm_90a``/``sm_90`` (PTX + cubin through Triton's bundled ptxas) and
``gfx942`` (AMDGCN + hsaco through Triton's bundled LLVM / lld) on a machine
with no GPU and no ROCm.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from . import _compat
from .errors import DitronCompileError
from .ir import Module, recording
from .jit import compile_with_libraries
from .target import Target, parse_target


@dataclass
class CompiledKernel:
    """The result of :func:`compile`: ``asm`` maps a stage name (``dist_ir``,
    ``ttir``, ``ttgir``, ``llir``, ``ptx``/``cubin`` or ``amdgcn``/``hsaco``) to
    its text or bytes."""
    name: str
    target: Target
    asm: dict
    dist_ir: Module
    libraries: list = field(default_factory=list)
    triton_kernel: object = None
    #: findings of the compile-time lint (:mod:`ditron.lint`), also issued as DitronLintWarning
    lint: list = field(default_factory=list)

    @property
    def metadata(self):
        return getattr(self.triton_kernel, "metadata", None)

    def usage(self) -> dict:
        """Resources of an NVIDIA kernel without a GPU: ``{"registers", "spill_stores", "spill_loads", "stack",
        "shared"}`` (registers per thread and bytes per thread from ``ptxas -v`` on the PTX, as the driver reports
        ``n_regs`` / ``n_spills`` when it loads the kernel; ``shared``: bytes per program, Triton's metadata)."""
        if "ptx" not in self.asm:
            raise DitronCompileError(f"{self.name}: usage() needs an NVIDIA target (PTX), not {self.target.name}")
        use = None
        if _compat.ptxas_run_is_plain(self.metadata):
            # Triton's own ptxas -v run gave these numbers when it wrote this cubin (ditron.compile keeps them,
            # named by the cubin), or the cubin tells them (no stack frame: nothing spills): no second ptxas run
            cubin = self.asm.get("cubin")
            use = recorded_usage(cubin) or cubin_usage(cubin, getattr(self.metadata, "name", None))
        if use is None:
            use = ptxas_usage(self.asm["ptx"], self.target.name if self.target.name.startswith("sm_") else "sm_90a")
        use["shared"] = int(getattr(self.metadata, "shared", 0) or 0)
        return use

    def sass(self) -> str:
        """The NVIDIA kernel's SASS: ``cuobjdump -sass`` of its cubin (Triton's bundled tool; no GPU needed)."""
        import subprocess
        import tempfile
        if not isinstance(self.asm.get("cubin"), (bytes, bytearray)):
            raise DitronCompileError(f"{self.name}: sass() needs an NVIDIA target (a cubin), not {self.target.name}")
        with tempfile.TemporaryDirectory() as d:
            with open(f"{d}/k.cubin", "wb") as f:
                f.write(self.asm["cubin"])
            run = subprocess.run([_compat.cuobjdump_path(), "-sass", f"{d}/k.cubin"], capture_output=True, text=True)
        if run.returncode:
            raise DitronCompileError(f"{self.name}: cuobjdump -sass failed:\n{run.stderr}")
        return run.stdout

    def spills_in_loops(self) -> dict:
        """Where the kernel's register spills sit, read from its SASS (:meth:`sass`): ``{"spills": n, "in_loops":
        n}``, the local loads and stores off the stack pointer (``LDL`` / ``STL [R1...]``: what ``ptxas -v`` counts
        as spill bytes) and those inside a loop other than the kernel's outermost one (a loop is a backward
        branch; the outermost, e.g. a persistent kernel's loop over its tiles, reloads its spills once per tile,
        an inner loop, e.g. over K chunks, once per iteration)."""
        return sass_spills_in_loops(self.sass())

    def inner_loops(self) -> list:
        """The kernel's loops other than its outermost, with the opcodes of each (:func:`sass_inner_loops` of
        :meth:`sass`): e.g. whether a K loop reduces across lanes (``SHFL``) or streams by ``cp.async``
        (``LDGSTS``)."""
        return sass_inner_loops(self.sass())


def _sass_insns(sass: str) -> list:
    """``(address, instruction text)`` of a ``cuobjdump -sass`` listing (one function)."""
    import re
    insns = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2)))
    return insns


def _sass_loop_ranges(insns) -> tuple:
    """``(loops, outer)``: the ``(first, last)`` address ranges of the loops (backward branches) and the outermost
    (the longest; ``None`` without loops)."""
    import re
    loops = []
    for addr, text in insns:
        m = re.search(r"\bBRA(?:\.\S+)?\s+(?:`?\(?)0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= addr:
            loops.append((int(m.group(1), 16), addr))
    return loops, (max(loops, key=lambda ab: ab[1] - ab[0]) if loops else None)


def sass_inner_loops(sass: str) -> list:
    """The loops of a ``cuobjdump -sass`` listing other than the outermost (e.g. a persistent kernel's loop over
    its tiles): one ``{"first": address, "last": address, "ops": Counter}`` each, ``ops`` counting the opcodes of
    the loop's body without modifiers or predicate (``LDGSTS``, ``SHFL``, ``HMMA``, ...), nested loops included."""
    from collections import Counter
    insns = _sass_insns(sass)
    loops, outer = _sass_loop_ranges(insns)

    def opcode(text):
        return (text.split()[1] if text.startswith("@") else text.split()[0]).split(".")[0]
    return [{"first": lo, "last": hi, "ops": Counter(opcode(t) for a, t in insns if lo <= a <= hi)}
            for lo, hi in sorted(loops) if (lo, hi) != outer]


def sass_spills_in_loops(sass: str) -> dict:
    """:meth:`CompiledKernel.spills_in_loops` of a ``cuobjdump -sass`` listing (one function)."""
    import re
    insns = _sass_insns(sass)
    loops, outer = _sass_loop_ranges(insns)
    spills = [addr for addr, text in insns if re.search(r"\b(?:LDL|STL)(?:\.\S+)?\s.*\[R1\b", text)]
    inner = [a for a in spills if any(lo <= a <= hi for lo, hi in loops if (lo, hi) != outer)]
    return {"spills": len(spills), "in_loops": len(inner)}


_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT = 0x11, 0x2F


def cubin_usage(cubin, kernel: str = None):
    """:func:`ptxas_usage` read from a cubin (an ELF file) when it can be read there exactly, else None: the
    register count of ``kernel`` (``EIATTR_REGCOUNT`` of its symbol in ``.nv.info``, what ``ptxas -v`` prints as
    "Used N registers") when no function of the cubin has a stack frame (``EIATTR_FRAME_SIZE``), so that
    nothing spills (spills go to the stack frame) and ``ptxas -v`` would print "0 bytes stack frame, 0 bytes
    spill stores, 0 bytes spill loads"."""
    import struct
    if not isinstance(cubin, (bytes, bytearray)) or not kernel or cubin[:6] != b"\x7fELF\x02\x01":
        return None
    try:
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        sections = []
        for i in range(shnum):
            name, typ, _, _, off, size, link, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize)
            sections.append((name, typ, off, size, link))
        strtab = sections[shstrndx]
        names = [cubin[strtab[2] + s[0]:cubin.index(b"\0", strtab[2] + s[0])].decode() for s in sections]
        info = [s for s, n in zip(sections, names) if n == ".nv.info"]
        symtab = [s for s, n in zip(sections, names) if n == ".symtab"]
        if len(info) != 1 or len(symtab) != 1:
            return None
        _, _, off, size, link = symtab[0]
        sym_strtab = sections[link][2]
        symbols = {}
        for j in range(size // 24):
            st_name, = struct.unpack_from("<I", cubin, off + 24 * j)
            symbols[j] = cubin[sym_strtab + st_name:cubin.index(b"\0", sym_strtab + st_name)].decode()
        regs, frames = {}, []
        _, _, off, size, _ = info[0]
        pos, end = off, off + size
        while pos + 4 <= end:
            fmt, attr, val = struct.unpack_from("<BBH", cubin, pos)
            pos += 4
            if fmt != 0x04:              # EIFMT_NVAL / BVAL / HVAL: the value is in the header
                continue
            if attr in (_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT) and val == 8:
                sym, value = struct.unpack_from("<II", cubin, pos)
                if attr == _EIATTR_REGCOUNT:
                    regs[symbols.get(sym)] = value
                else:
                    frames.append(value)
            pos += val
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None
    if kernel not in regs or any(frames):
        return None
    return {"registers": regs[kernel], "spill_stores": 0, "spill_loads": 0, "stack": 0}


def ptxas_usage(ptx: str, arch: str = "sm_90a") -> dict:
    """``{"registers", "spill_stores", "spill_loads", "stack"}`` (bytes per thread) of ``ptx`` by Triton's bundled
    ``ptxas -v`` (no GPU needed)."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.ptx", "w") as f:
            f.write(ptx)
        log = subprocess.run([get_ptxas(90).path, "-v", f"--gpu-name={arch}", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                             capture_output=True, text=True, check=True).stderr
    use = parse_ptxas_log(log)
    if use is None:
        raise DitronCompileError(f"ptxas -v gave no register / spill line:\n{log}")
    return use


def parse_ptxas_log(log: str):
    """``{"registers", "spill_stores", "spill_loads", "stack"}`` from a ``ptxas -v`` log of one entry function
    (its first "bytes stack frame" line and its "Used N registers" line), or None."""
    import re
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    r = re.search(r"Used (\d+) registers", log)
    if not (m and r):
        return None
    return {"registers": int(r.group(1)), "spill_stores": int(m.group(2)), "spill_loads": int(m.group(3)),
            "stack": int(m.group(1))}


def _usage_path(cubin: bytes) -> str:
    return os.path.join(_compat.ditron_cache_dir(), "ptxas-usage", hashlib.sha256(cubin).hexdigest() + ".json")


def record_usage(cubin, log: str):
    """Keep the numbers of the ``ptxas -v`` log that Triton's ptxas printed when it wrote ``cubin`` (under
    ``DITRON_CACHE_DIR``, named by the cubin's digest), for :meth:`CompiledKernel.usage`; a kernel that later comes
    from Triton's cache has the same cubin."""
    import json
    import tempfile
    use = parse_ptxas_log(log) if isinstance(cubin, (bytes, bytearray)) else None
    if use is None:
        return
    path = _usage_path(cubin)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(use, f)
        os.replace(tmp, path)
    except OSError:
        pass                            # a cache that cannot be written: usage() runs ptxas -v instead


def recorded_usage(cubin):
    """What :func:`record_usage` kept for ``cubin``, or None."""
    import json
    if not isinstance(cubin, (bytes, bytearray)):
        return None
    try:
        with open(_usage_path(cubin)) as f:
            use = json.load(f)
    except (OSError, ValueError):
        return None
    keys = ("registers", "spill_stores", "spill_loads", "stack")
    if not (isinstance(use, dict) and all(isinstance(use.get(k), int) for k in keys)):
        return None
    return {k: use[k] for k in keys}


def _as_jit_function(kernel):
    if isinstance(kernel, _compat.JITFunction):
        return kernel
    if callable(kernel):
        from .jit import DitronJITFunction
        return DitronJITFunction(kernel)
    raise DitronCompileError(f"ditron.compile expects a @ditron.jit kernel, got {type(kernel).__name__}")


def _specialize_values(fn, signature, constexprs, values):
    """``compile``'s ``values``: ``(signature, constexprs, names known divisible by 16)`` as a launch with those
    integer arguments specialises them (:func:`ditron._compat.launch_int_specialization`)."""
    if not values:
        return signature, constexprs, []
    signature = _signature_dict(fn, signature)
    constexprs = dict(constexprs or {})
    params = {p.name: p for p in getattr(fn, "params", ())}
    divisible = []
    for name, v in values.items():
        p = params.get(name)
        if p is None:
            raise DitronCompileError(f"values: kernel {fn.__name__} has no parameter {name!r}; its parameters are "
                                     f"{list(params)}")
        if p.is_constexpr or name in constexprs:
            raise DitronCompileError(f"values: {name!r} is a constexpr of {fn.__name__}: give it in constexprs")
        if isinstance(v, bool) or not isinstance(v, int):
            raise DitronCompileError(f"values: {name!r} = {v!r}: only integer arguments are specialised by value")
        ty, spec = _compat.launch_int_specialization(v, not p.do_not_specialize)
        if ty == "constexpr":
            signature[name] = "constexpr"
            constexprs[name] = v
        else:
            if signature.get(name, ty) not in (ty, "i32", "i64"):
                raise DitronCompileError(f"values: {name!r} has type {signature[name]!r} in the signature; a launch "
                                         f"passing {v} gives it {ty!r}")
            signature[name] = ty
            if spec == "D":
                divisible.append(name)
    return signature, constexprs, divisible


def _signature_dict(fn, signature) -> dict:
    """``signature`` by parameter name (a list or tuple gives one type per parameter, in order)."""
    if isinstance(signature, (list, tuple)):
        params = _compat.jit_function_params(fn)
        if len(signature) != len(params):
            raise DitronCompileError(f"signature lists {len(signature)} types for {len(params)} parameters "
                                     f"{params}")
        return dict(zip(params, signature))
    return dict(signature or {})


def normalize_signature(fn, signature, constexprs):
    """Complete a signature: every parameter needs a type string; parameters
    given in ``constexprs`` may be left out (they become ``"constexpr"``), and
    so may ``tl.constexpr`` parameters with a default (they take it)."""
    params = _compat.jit_function_params(fn)
    signature = _signature_dict(fn, signature)
    constexprs = dict(constexprs or {})
    unknown = sorted((set(signature) | set(constexprs)) - set(params))
    if unknown:
        raise DitronCompileError(f"kernel {fn.__name__} has no parameter(s) {unknown}; its parameters are {params}")
    for p in getattr(fn, "params", ()):      # constexpr parameters with a default take it, as at a launch
        if p.is_constexpr and p.has_default and p.name not in signature and p.name not in constexprs:
            constexprs[p.name] = p.default
    for name in constexprs:
        signature.setdefault(name, "constexpr")
    missing = [p for p in params if p not in signature]
    if missing:
        raise DitronCompileError(f"signature of {fn.__name__} is missing parameter(s) {missing} "
                                 f"(give a type such as '*fp16' or 'i32', or a value in constexprs)")
    for name, ty in signature.items():
        if ty == "constexpr" and name not in constexprs:
            raise DitronCompileError(f"parameter {name!r} is constexpr but has no value in constexprs")
    ordered = {p: signature[p] for p in params}
    return ordered, {(params.index(k),): v for k, v in constexprs.items()}


def compile_cache_enabled() -> bool:
    """``ditron.compile`` reuses Triton's on-disk cache (``TRITON_CACHE_DIR``) for the backend stages unless
    ``DITRON_COMPILE_CACHE=0`` (or Triton's ``TRITON_ALWAYS_COMPILE=1``)."""
    return os.environ.get("DITRON_COMPILE_CACHE", "1") != "0"


_SOURCE_DIGEST = []


def _source_digest() -> str:
    """Digest of ditron's own Python sources (read once per process): a cached backend result is only reused by
    the ditron that produced it."""
    if not _SOURCE_DIGEST:
        root = os.path.dirname(os.path.abspath(__file__))
        h = hashlib.sha256()
        for dirpath, dirnames, files in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    h.update(os.path.relpath(path, root).encode() + b"\0")
                    with open(path, "rb") as fh:
                        h.update(fh.read())
        _SOURCE_DIGEST.append(h.hexdigest())
    return _SOURCE_DIGEST[0]


def _cache_key(ttir_text: str) -> str:
    """What ditron adds to Triton's cache key, which already covers the kernel's source, signature, constants,
    options (device libraries included, by path: ditron's cut of a library carries a digest in its file name) and
    Triton's own environment: the Triton IR the front end produced, so whatever ditron's lowering, its
    configuration or its environment changed in the kernel is part of the key, and ditron's sources."""
    h = hashlib.sha256(ttir_text.encode())
    h.update(_source_digest().encode())
    return h.hexdigest()


def compile(kernel, target="sm_90a", signature=None, constexprs=None, attrs=None, *, aligned=True,
            values=None, extern_libs=None, **options):
    """Compile ``kernel`` for ``target`` without launching it.

    ``signature``: parameter name -> Triton type string (``"*fp16"``, ``"i32"``,
    ``"constexpr"``), as for Triton's ``ASTSource``.  ``constexprs``: values of
    constexpr parameters.  ``aligned`` (default True) tells the compiler that
    pointer arguments are 16-byte aligned, as they are for tensors from torch;
    ``values``: integer parameter name -> the value a launch would pass, specialised as the launch specialises it
    (1 becomes a constant, a multiple of 16 is known divisible by 16; none for a ``do_not_specialize``
    parameter), so that what is compiled -- registers and spills included -- is what that launch runs; the type
    of such a parameter may be left out of ``signature``.
    ``attrs`` overrides per-argument attributes.  Other keywords are backend
    options: every field of the installed Triton's ``CUDAOptions`` / ``HIPOptions`` (``num_warps``,
    ``num_stages``, ``maxnreg``, ``matrix_instr_nonkdim``, ``waves_per_eu``, ...); others are an error
    that lists the valid ones.
    """
    fn = _as_jit_function(kernel)
    tgt = parse_target(target)
    if tgt.backend == "sim":
        raise DitronCompileError("the 'sim' target has no binary: run the kernel under `ditron sim` instead",
                                 target="sim")
    known = _compat.backend_option_names(tgt.backend)
    unknown = set(options) - set(known)
    if unknown:
        raise DitronCompileError(f"unknown compile option(s) {sorted(unknown)} for {tgt.name} (Triton's "
                                 f"{tgt.backend} backend); valid options: {sorted(known)}", target=tgt.name)
    signature, constexprs, divisible = _specialize_values(fn, signature, constexprs, values)
    sig, cexprs = normalize_signature(fn, signature, constexprs)
    if attrs is None:
        attrs = {}
        if aligned:
            for i, ty in enumerate(sig.values()):
                if isinstance(ty, str) and ty.startswith("*"):
                    attrs[(i,)] = _compat.divisibility_attr(16)
        params = list(sig)
        for n in divisible:
            attrs[(params.index(n),)] = _compat.divisibility_attr(16)
    name = fn.__name__ if hasattr(fn, "__name__") else fn.fn.__name__
    needs = set()

    def once(libs):
        src = _compat.ast_source(fn, sig, cexprs, attrs)
        opts = dict(options, extern_libs=libs)
        if not compile_cache_enabled():
            with recording(name, tgt.name) as module, _compat.always_compile():
                ck = _compat.compile_source(src, tgt.to_triton(), opts)
            return ck, module
        # the front end always runs (it records the distributed IR and says which device libraries the kernel
        # needs); the backend stages come from Triton's cache when the same Triton IR was compiled before
        with recording(name, tgt.name) as module:
            front = _compat.FrontEnd(src, tgt.to_triton(), opts)
        ck = _compat.compile_front_end(src, tgt.to_triton(), opts, front, _cache_key(front.text))
        return ck, module

    with _compat.ptxas_log() as logs:
        ck, module = compile_with_libraries(once, tgt, needs, extern_libs)
    if len(logs) == 1 and "cubin" in ck.asm and _compat.ptxas_run_is_plain(getattr(ck, "metadata", None)):
        record_usage(ck.asm["cubin"], logs[0])
    asm = dict(ck.asm)
    asm["dist_ir"] = module.text()
    from . import lint
    findings = lint.lint(fn, module, constexprs) if module.ops else []
    lint.report(name, findings)
    return CompiledKernel(name=name, target=tgt, asm=asm, dist_ir=module, libraries=sorted(needs), triton_kernel=ck,
                          lint=findings)
