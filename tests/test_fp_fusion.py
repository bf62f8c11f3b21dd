"""ditron decides ``enable_fp_fusion`` itself (ditron/_compat.py ``fp_fusion_default``): FMA contraction on -- what
every ditron kernel was validated and measured with, Triton 3.6's default -- under every Triton, unless the user
says otherwise (a launch's or ``ditron.compile``'s ``enable_fp_fusion=``, ``TRITON_DEFAULT_FP_FUSION``,
``TRITON_FORCE_DISABLE_FP_FUSION``).  Triton 3.9 warns that its own default turns to off in 3.10: left to Triton,
a Triton upgrade would silently change ditron's kernels (the megakernel's FMA GEMV path among them).  Checked on
both compile paths: ``@ditron.jit`` launches (Triton's ``JITFunction.run`` over a stub driver, compiling for
sm_90) and ``ditron.compile``."""
import pytest
import torch
import triton
import triton.language as tl

import ditron
from ditron import _compat

from stub_driver import stub_driver


def _axpy(x_ptr, y_ptr, z_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(x_ptr + offs, mask=m)
    b = tl.load(y_ptr + offs, mask=m)
    c = tl.load(z_ptr + offs, mask=m)
    tl.store(o_ptr + offs, a * b + c, mask=m)


_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "z_ptr": "*fp32", "o_ptr": "*fp32", "n": "i32"}


def _contracted(ptx):
    return "fma.rn.f32" in ptx


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    monkeypatch.delenv("TRITON_FORCE_DISABLE_FP_FUSION", raising=False)
    return monkeypatch


@pytest.fixture
def triton_3_10(clean_env):
    """Triton's own default turned off, as Triton 3.9 announces for 3.10 (the environment variable unset: the knob's
    descriptor replaced on its class -- setting the knob on the instance would set the variable)."""
    cls = type(triton.knobs.language)
    knob = cls.__dict__["default_fp_fusion"]
    cls.default_fp_fusion = False
    try:
        assert triton.knobs.language.default_fp_fusion is False
        yield clean_env
    finally:
        cls.default_fp_fusion = knob


@pytest.fixture
def requests(monkeypatch):
    """The ``requested`` argument of every call of Triton >= 3.9's ``knobs.language.fp_fusion_enabled`` (None:
    Triton's own default decided, with its warning); Triton 3.6 has no such call."""
    seen = []
    lang = triton.knobs.language
    if hasattr(type(lang), "fp_fusion_enabled"):
        orig = type(lang).fp_fusion_enabled

        def spy(self, requested):
            seen.append(requested)
            return orig(self, requested)
        monkeypatch.setattr(type(lang), "fp_fusion_enabled", spy)
    return seen


def _launch(**opts):
    kernel = ditron.jit(_axpy)
    x, y, z, o = (torch.rand(1024) for _ in range(4))
    with stub_driver():
        return kernel[(1,)](x, y, z, o, 1024, BLOCK=1024, **opts)


def test_jit_launch_contracts_by_default_under_every_triton(triton_3_10, requests):
    ck = _launch()
    assert ck.metadata.enable_fp_fusion is True
    assert _contracted(ck.asm["ptx"]), "a * b + c: one fma.rn.f32 with ditron's default"
    assert None not in requests, "Triton's own default decided (and warned): ditron passes its choice"


def test_jit_launch_option_wins(clean_env, requests):
    ck = _launch(enable_fp_fusion=False)
    assert ck.metadata.enable_fp_fusion is False
    assert not _contracted(ck.asm["ptx"]) and "mul.rn.f32" in ck.asm["ptx"]
    assert None not in requests


def test_ditron_compile_contracts_by_default_and_the_option_wins(triton_3_10, requests):
    ptx = ditron.compile(_axpy, target="sm_90a", signature=_SIG, constexprs={"BLOCK": 256}).asm["ptx"]
    assert _contracted(ptx)
    ptx = ditron.compile(_axpy, target="sm_90a", signature=_SIG, constexprs={"BLOCK": 256},
                         enable_fp_fusion=False).asm["ptx"]
    assert not _contracted(ptx)
    assert None not in requests


@pytest.mark.parametrize("var,value", [("TRITON_DEFAULT_FP_FUSION", "0"), ("TRITON_FORCE_DISABLE_FP_FUSION", "1")])
def test_the_users_environment_wins(clean_env, var, value):
    clean_env.setenv(var, value)
    assert _compat.fp_fusion_default() is False
    ptx = ditron.compile(_axpy, target="sm_90a", signature=_SIG, constexprs={"BLOCK": 128}).asm["ptx"]
    assert not _contracted(ptx)
    assert _launch().metadata.enable_fp_fusion is False
    clean_env.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    if var == "TRITON_DEFAULT_FP_FUSION":
        assert _compat.fp_fusion_default() is True
