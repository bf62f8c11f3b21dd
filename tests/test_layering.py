"""The package layout shows the architecture: imports go one way.

    base (errors, _compat, _compat_interp, target, libs, sim_memory)
      <- ir <- lowering <- language <- analysis <- runtime <- everything else

A layer may import the layers below it, never one above (docs/architecture.md has the map).  Checked twice:
statically (every import statement, also those inside functions, which run later) and by importing each
layer's modules in a fresh interpreter in which the layers above it cannot be imported.
"""
import ast
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ditron")

BASE = ("ditron._compat", "ditron._compat_interp", "ditron.errors", "ditron.target", "ditron.libs", "ditron.sim_memory")
LAYERS = ("base", "ditron.ir", "ditron.lowering", "ditron.language", "ditron.analysis", "ditron.runtime")


def layer_of(module):
    """Index in LAYERS, or None for the top (jit, compiler, sim, cli, bench, nn, torch integration...)."""
    if module in BASE:
        return 0
    for i, name in enumerate(LAYERS[1:], 1):
        if module == name or module.startswith(name + "."):
            return i
    return None


def modules():
    for dirpath, _, files in os.walk(ROOT):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                is_pkg = rel.endswith(".__init__")
                yield (rel[:-len(".__init__")] if is_pkg else rel), is_pkg, path


ALL = {m for m, _, _ in modules()}


def imports_of(module, is_pkg, path):
    """Absolute names of the ditron modules ``module`` imports, anywhere in its source."""
    pkg = module if is_pkg else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("ditron"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("ditron"):
                continue
            # "from .. import sim_memory" imports the module ditron.sim_memory (not the package ditron)
            subs = {target + "." + a.name for a in node.names} & ALL
            out.update(subs or {target})
    return out


def test_layer_map_covers_the_tree():
    found = {m for m, _, _ in modules()}
    for name in BASE + LAYERS[1:]:
        assert name in found, f"{name} named in the layer map but not in the tree"


def test_no_upward_imports():
    bad = []
    for module, is_pkg, path in modules():
        mine = layer_of(module)
        if mine is None:
            continue
        for target in imports_of(module, is_pkg, path):
            theirs = layer_of(target)
            if theirs is None or theirs > mine:
                bad.append(f"{module} ({LAYERS[mine]}) imports {target} "
                           f"({'top' if theirs is None else LAYERS[theirs]})")
    assert not bad, "imports against the layer direction:\n" + "\n".join(bad)


def test_gpu_transports_import_only_the_base():
    """gpu.py (bring-up), gpu_p2p.py and gpu_nvshmem.py share gpu_base.py; none imports another."""
    found = {m: (p, path) for m, p, path in modules()}
    for m in ("gpu_base", "gpu_p2p", "gpu_nvshmem"):
        name = "ditron.runtime." + m
        imported = imports_of(name, *found[name])
        assert "ditron.runtime.gpu" not in imported, f"{name} imports ditron.runtime.gpu"
        if m == "gpu_base":
            assert not {"ditron.runtime.gpu_p2p", "ditron.runtime.gpu_nvshmem"} & imported
        else:
            assert "ditron.runtime.gpu_base" in imported
    assert "ditron.runtime.gpu_base" in imports_of("ditron.runtime.gpu", *found["ditron.runtime.gpu"])


_PROBE = r"""
import importlib, json, sys, types
root, layer, blocked, names = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
pkg = types.ModuleType("ditron"); pkg.__path__ = [root]       # the package without running ditron/__init__.py
sys.modules["ditron"] = pkg

class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ImportError(f"layer {layer} imported {name}, a layer above it")
        return None

sys.meta_path.insert(0, Block())
for n in names:
    importlib.import_module(n)
print("ok", len(names))
"""


@pytest.mark.parametrize("index", range(len(LAYERS)), ids=LAYERS)
def test_layer_imports_with_the_layers_above_blocked(index):
    names = [m for m, _, _ in modules() if layer_of(m) == index]
    above = [n for n in LAYERS[index + 1:]] + ["ditron.jit", "ditron.compiler", "ditron.sim.executor",
                                                 "ditron.sim.launcher", "ditron.sim.pool", "ditron.bench",
                                                 "ditron.nn", "ditron.torch_ops", "ditron.kernels", "ditron.task"]
    p = subprocess.run([sys.executable, "-c", _PROBE, ROOT, LAYERS[index], json.dumps(above), json.dumps(names)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("ok"), p.stderr[-3000:]
