"""``ditron`` command line.

    ditron compile FILE.py::KERNEL --target sm_90a --signature "x=*fp16,n=i32" --constexpr BLOCK=1024 \
        [--value n=4096] --emit dist-ir|ttir|ttgir|llir|ptx|cubin|amdgcn|hsaco [-o OUT]
    ditron doctor
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import platform
import sys

EMIT = {"dist-ir": "dist_ir", "ttir": "ttir", "ttgir": "ttgir", "llir": "llir", "ptx": "ptx", "cubin": "cubin",
        "amdgcn": "amdgcn", "hsaco": "hsaco"}


def _is_main_guard(stmt) -> bool:
    """``if __name__ == "__main__":`` (either order of the comparison)."""
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare) or len(stmt.test.ops) != 1:
        return False
    sides = [stmt.test.left, stmt.test.comparators[0]]
    return (isinstance(stmt.test.ops[0], ast.Eq) and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


class _Names(ast.NodeVisitor):
    """The module-level names one top-level statement defines and the names it reads (a function's or a
    class's body: its free names, i.e. the names it reads less its parameters and its own assignments)."""

    def __init__(self):
        self.defs, self.uses = set(), set()

    def _scope(self, node, args=None):
        inner = _Names()
        for stmt in node.body:
            inner.visit(stmt)
        local = set(inner.defs)
        if args is not None:
            local |= {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            local |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        self.uses |= inner.uses - local

    def visit_FunctionDef(self, node):
        self.defs.add(node.name)
        for expr in node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(expr)
        for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            if a.annotation is not None:
                self.visit(a.annotation)
        self._scope(node, node.args)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.defs.add(node.name)
        for expr in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(expr)
        self._scope(node)

    def visit_Lambda(self, node):
        inner = _Names()
        inner.visit(node.body)
        self.uses |= inner.uses - {a.arg for a in node.args.args}

    def visit_Name(self, node):
        (self.defs if isinstance(node.ctx, (ast.Store, ast.Del)) else self.uses).add(node.id)

    def visit_alias(self, node):
        self.defs.add((node.asname or node.name).split(".")[0])

    def visit_ExceptHandler(self, node):
        if node.name:
            self.defs.add(node.name)
        self.generic_visit(node)


def _kernel_slice(tree, name):
    """The top-level statements of ``tree`` that ``name`` needs: every import, and the definitions and
    assignments of the names it reads, transitively (a function's body counts).  Everything else -- calls
    such as ``main()`` or ``ditron.init()``, argument parsing, prints, ``if __name__ == "__main__":`` -- is left
    out, so that compiling a kernel never runs a script."""
    facts = []
    for stmt in tree.body:
        if _is_main_guard(stmt):
            continue
        n = _Names()
        n.visit(stmt)
        facts.append((stmt, n.defs, n.uses))
    keep = {id(s) for s, _, _ in facts if isinstance(s, (ast.Import, ast.ImportFrom))}
    need, grown = {name}, True
    while grown:
        grown = False
        for stmt, defs, uses in facts:
            if id(stmt) not in keep and defs & need:
                keep.add(id(stmt))
                need |= uses
                grown = True
    return [s for s, _, _ in facts if id(s) in keep]


GUARD_HINT = ("ditron compile reads the kernel from the file without running it as a script: it runs only the "
              "file's imports and the definitions and assignments the kernel needs (with __name__ = {mod!r}, "
              "never '__main__'); keep script code (argument parsing, ditron.init(), launches) out of them, "
              "under `if __name__ == \"__main__\":`")


def _load_kernel(spec: str):
    if "::" not in spec:
        raise SystemExit(f"ditron compile: expected FILE.py::KERNEL, got {spec!r}")
    path, name = spec.rsplit("::", 1)
    if not os.path.exists(path):
        raise SystemExit(f"ditron compile: no such file {path!r}")
    mod_name = f"_ditron_cli_{os.path.splitext(os.path.basename(path))[0]}"
    with open(path, "rb") as f:
        source = f.read()
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        raise SystemExit(f"ditron compile: {path}:{e.lineno}: syntax error: {e.msg}") from None
    body = _kernel_slice(tree, name)
    if not any(name in _defs(s) for s in body):
        guarded = any(_is_main_guard(s) and any(name in _defs(t) for t in s.body) for s in tree.body)
        raise SystemExit(f"ditron compile: {path} has no kernel {name!r} at its top level"
                         + (" (it is defined under `if __name__ == \"__main__\":`, which ditron compile does not "
                            "run: define the kernel at the top level)" if guarded else ""))
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    for stmt in body:
        code = compile(ast.Module(body=[stmt], type_ignores=[]), path, "exec")
        try:
            exec(code, module.__dict__)
        except (Exception, SystemExit) as e:    # noqa: BLE001 -- reported with the statement and the rule
            what = f"exit({e.code})" if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
            raise SystemExit(f"ditron compile: {path}:{stmt.lineno}, a statement that kernel {name!r} needs, "
                             f"failed: {what}\n  " + GUARD_HINT.format(mod=mod_name)) from None
    return getattr(module, name)


def _defs(stmt):
    n = _Names()
    n.visit(stmt)
    return n.defs


def _parse_value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text in ("True", "False"):
        return text == "True"
    return text


def parse_signature(text: str, params):
    """``"x=*fp16,n=i32"`` (by name) or ``"*fp16,i32"`` (in parameter order)."""
    if not text:
        return {}
    items = [s.strip() for s in text.split(",") if s.strip()]
    if all("=" in s or ":" in s for s in items):
        out = {}
        for s in items:
            k, v = s.replace(":", "=", 1).split("=", 1)
            out[k.strip()] = v.strip()
        return out
    return dict(zip(params, items))


def cmd_compile(args):
    import ditron
    from ditron import _compat

    kernel = _load_kernel(args.kernel)
    if not isinstance(kernel, _compat.JITFunction):
        raise SystemExit(f"ditron compile: {args.kernel} is not a @ditron.jit / @triton.jit kernel")
    params = _compat.jit_function_params(kernel)
    constexprs = {}
    for c in args.constexpr or []:
        if "=" not in c:
            raise SystemExit(f"ditron compile: --constexpr expects NAME=VALUE, got {c!r}")
        k, v = c.split("=", 1)
        constexprs[k.strip()] = _parse_value(v.strip())
    values = {}
    for c in args.value or []:
        k, _, v = c.partition("=")
        try:
            values[k.strip()] = int(v.strip(), 0)
        except ValueError:
            raise SystemExit(f"ditron compile: --value expects NAME=INTEGER (an argument a launch would pass), "
                             f"got {c!r}") from None
    signature = parse_signature(args.signature or "", [p for p in params if p not in constexprs and p not in values])
    options = {}
    if args.num_warps:
        options["num_warps"] = args.num_warps
    if args.num_stages:
        options["num_stages"] = args.num_stages
    import warnings
    try:
        with warnings.catch_warnings():            # lint findings are printed below, once
            warnings.simplefilter("ignore", ditron.DitronLintWarning)
            ck = ditron.compile(kernel, target=args.target, signature=signature, constexprs=constexprs,
                                values=values or None, **options)
    except ditron.DitronError as e:
        print(f"ditron compile: error: {e}", file=sys.stderr)
        return 1
    except _compat.CompilationError as e:
        print(f"ditron compile: error: {e}", file=sys.stderr)
        return 1
    for finding in ck.lint:
        print(f"ditron compile: warning: {finding}", file=sys.stderr)
    key = EMIT[args.emit]
    if key not in ck.asm:
        print(f"ditron compile: target {ck.target.name} has no {args.emit} output (have: "
              f"{', '.join(k for k, v in EMIT.items() if v in ck.asm)})", file=sys.stderr)
        return 1
    out = ck.asm[key]
    if args.output:
        mode = "wb" if isinstance(out, bytes) else "w"
        with open(args.output, mode) as f:
            f.write(out)
    elif isinstance(out, bytes):
        print(f"ditron compile: {args.emit} is binary; use -o FILE", file=sys.stderr)
        return 1
    else:
        sys.stdout.write(out if out.endswith("\n") else out + "\n")
    return 0


def cmd_doctor(args):
    import triton

    import ditron
    from ditron import libs
    from ditron.ir import OPS
    from ditron.lowering import rules_for

    print(f"ditron        {ditron.__version__}")
    print(f"python        {platform.python_version()}")
    tested = triton.__version__ in libs.CI_TESTED_TRITON
    print(f"triton        {triton.__version__} ("
          + ("tested by ditron's CI" if tested else
             f"not tested by ditron's CI, which runs {' and '.join(libs.CI_TESTED_TRITON)}") + ")")
    try:
        import torch
        print(f"torch         {torch.__version__}")
        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            print(f"GPUs          {len(names)}: {', '.join(names)}")
        else:
            print("GPUs          none visible (compiling and the simulator still work)")
    except Exception as e:  # noqa: BLE001 -- doctor reports, never fails
        print(f"torch         not usable ({e})")
    print("targets       sm_90a, sm_90 (PTX/cubin via Triton's ptxas); gfx942 (AMDGCN/hsaco via Triton's LLVM)")
    for backend in ("cuda", "hip", "sim"):
        have = rules_for(backend)
        legal = [k for k, spec in OPS.items() if backend in spec.backends]
        missing = [k for k in legal if k not in have]
        print(f"lowering      {backend:5s} {len(legal) - len(missing)}/{len(legal)} ops"
              + (f" (not yet lowered: {', '.join(missing)})" if missing else ""))
    rep = libs.compatibility_report()
    print(f"NVSHMEM       bitcode {rep['nvshmem_bitcode'] or 'not found'}")
    if rep["nvshmem_bitcode"]:
        print(f"              package version {rep['nvshmem_version'] or '?'}; "
              f"with Triton {triton.__version__}: {rep['nvshmem_status']}")
    from ditron.lowering.shmem_table import rocshmem_symbols
    print(f"rocSHMEM      bitcode {libs.rocshmem_report(rocshmem_symbols())[1]}")
    from ditron.runtime.gpu import auto_backend_report   # reads package metadata only; touches no GPU
    print(f"runtime       {auto_backend_report()}")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    # `ditron sim` and `ditron demo` pass everything after the script to it
    if argv and argv[0] == "sim":
        from .sim.launcher import main as sim_main
        return sim_main(argv[1:])
    if argv and argv[0] == "bench":
        from .bench import main as bench_main
        return bench_main(argv[1:])
    if argv and argv[0] == "demo":
        from .demo import main as demo_main
        return demo_main(argv[1:])
    parser = argparse.ArgumentParser(prog="ditron", description="ditron: distributed kernels on stock Triton")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("sim", help="run a script on N simulated ranks: ditron sim -n 4 script.py [args]")
    from .bench import FAMILIES
    from .demo import DEMOS
    sub.add_parser("bench", help="benchmark the zoo against NCCL / cuBLAS / torch (under torchrun or ditron sim): "
                   + ", ".join(op for ops in FAMILIES.values() for op in ops))
    sub.add_parser("demo", help="run a zoo kernel on 4 simulated ranks (or on GPUs under torchrun) and check it; "
                   f"also: {', '.join(f'ditron demo {d}' for d in DEMOS)}")
    p = sub.add_parser("compile", help="compile a kernel for a target without a GPU")
    p.add_argument("kernel", help="FILE.py::KERNEL")
    from .target import ACCEPTED
    p.add_argument("--target", default="sm_90a",
                   help=f"{ACCEPTED.replace(' or sim', '')} (default sm_90a; the simulator compiles nothing)")
    p.add_argument("--signature", default="", help='"name=*fp16,n=i32" or "*fp16,i32" in parameter order')
    p.add_argument("--constexpr", "-D", action="append", help="NAME=VALUE (repeatable)")
    p.add_argument("--value", "-V", action="append",
                   help="NAME=INTEGER (repeatable): an integer argument specialised as a launch passing that value "
                        "specialises it (1: a constant; a multiple of 16: known divisible by 16)")
    p.add_argument("--emit", default="dist-ir", choices=sorted(EMIT))
    p.add_argument("--num-warps", type=int)
    p.add_argument("--num-stages", type=int)
    p.add_argument("-o", "--output")
    p.set_defaults(func=cmd_compile)
    d = sub.add_parser("doctor", help="versions, targets, GPUs, device libraries")
    d.set_defaults(func=cmd_doctor)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
