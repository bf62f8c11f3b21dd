"""``ditron.compile(..., values=)``: integer arguments specialised as a launch with those values specialises them
(1 becomes a constant; a multiple of 16 is known divisible by 16; nothing for a ``do_not_specialize`` parameter),
so that a CPU compile -- its registers and spills included -- is the kernel that launch runs on the GPU.  Found
needed in 2026-12-08: the EP fp8 dispatch (world size 1, ``ll_fp8_once`` with 8 groups a step) compiled without
``H``'s specialisation took 216 registers and no spills; as launched (``H = 7168``, divisible by 16) 128 registers
and 8 B of spills on Triton 3.6 (tests/test_ep.py compiles the default as launched)."""
import pytest
import triton.language as tl

import ditron


def _branchy(o_ptr, x_ptr, n):
    offs = tl.arange(0, 64)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if n == 1:
        tl.store(o_ptr + offs, x, mask=offs < n)
    else:
        tl.store(o_ptr + offs, x * 2.0, mask=offs < n)


_SIG = {"o_ptr": "*fp32", "x_ptr": "*fp32"}


def _head(ttir):
    """The kernel's ``tt.func`` line (its arguments and their attributes)."""
    return next(line for line in ttir.splitlines() if "tt.func" in line)


def _ttir(values=None, kernel=None, **kw):
    return ditron.compile(kernel or ditron.jit(_branchy), target="sm_90a", signature=dict(_SIG, **kw),
                          values=values).asm["ttir"]


def test_one_becomes_a_constant_as_at_a_launch():
    generic = _ttir(n="i32")
    assert "scf.if" in generic
    one = _ttir({"n": 1})
    assert "scf.if" not in one and "arith.mulf" not in one, "n == 1 folded: the kernel a launch with n = 1 runs"


def test_a_multiple_of_16_is_known_divisible():
    head = _head(_ttir({"n": 4096}))
    assert head.count("tt.divisibility = 16") == 3, head      # both pointers and n
    head = _head(_ttir({"n": 4095}))
    assert head.count("tt.divisibility = 16") == 2, head


def test_do_not_specialize_is_respected():
    k = ditron.jit(_branchy, do_not_specialize=["n"])
    ttir = _ttir({"n": 1}, kernel=k)
    assert "scf.if" in ttir
    head = _head(_ttir({"n": 4096}, kernel=k))
    assert head.count("tt.divisibility = 16") == 2, head


def test_errors_name_the_parameter():
    k = ditron.jit(_branchy)
    with pytest.raises(ditron.DitronError, match="no parameter 'm'"):
        ditron.compile(k, target="sm_90a", signature=dict(_SIG, n="i32"), values={"m": 3})
    with pytest.raises(ditron.DitronError, match="only integer arguments"):
        ditron.compile(k, target="sm_90a", signature=_SIG, values={"n": 2.5})
    with pytest.raises(ditron.DitronError, match="gives it 'i32'"):
        ditron.compile(k, target="sm_90a", signature=dict(_SIG, n="fp32"), values={"n": 3})
