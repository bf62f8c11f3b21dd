import os
import shutil

import pytest

import ditron
from ditron import libs

TARGETS = ("sm_90a", "gfx942")


def compile_for(kernel, target, signature, constexprs=None, **options):
    return ditron.compile(kernel, target=target, signature=signature, constexprs=constexprs or {}, **options)


def device_asm(ck):
    return ck.asm["ptx"] if ck.target.backend == "cuda" else ck.asm["amdgcn"]


def code_lines(text):
    """Instruction lines (comments and debug directives dropped)."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ";", ".loc", ".file")):
            continue
        out.append(s)
    return out


@pytest.fixture(scope="session")
def nvshmem_bc():
    """NVSHMEM's device bitcode.  CI installs nvidia-nvshmem-cu13 and sets
    DITRON_REQUIRE_NVSHMEM=1, so there a missing bitcode fails these tests."""
    path = libs.nvshmem_bitcode()
    if path is None or not os.path.exists(path):
        if os.environ.get("DITRON_REQUIRE_NVSHMEM") == "1":
            pytest.fail("DITRON_REQUIRE_NVSHMEM=1 but no libnvshmem_device.bc was found")
        pytest.skip("nvidia-nvshmem-cu13 not installed (pip install nvidia-nvshmem-cu13==3.4.5)")
    return path


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # device libraries are written under DITRON_CACHE_DIR; keep tests off ~/.cache
    d = tmp_path_factory.getbasetemp() / "ditron-cache"
    monkeypatch.setenv("DITRON_CACHE_DIR", str(d))
    yield


def has_tool(name):
    return shutil.which(name) is not None
