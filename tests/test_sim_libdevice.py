"""Every libdevice path Triton offers computes on the simulator as on a GPU (issue 56): the generic
``triton.language.extra.libdevice`` (which Triton maps to the backend's module when it compiles, and whose stubs
returned None on the simulator), ``triton.language.extra.cuda.libdevice``, ``...hip.libdevice`` and ``tl.math``,
for every function and argument type the installed Triton's modules list, against NumPy / torch / mpmath and exact
rational references (tests/bodies_sim_libdevice.py).  Correctly rounded operations (``*_rn/_rz/_rd/_ru``, ``fma``)
and integer / bit functions are checked bit for bit, the rest to a few ulp."""
import os

import pytest

import bodies_sim_libdevice as B

sim_only = pytest.mark.skipif(os.environ.get("DITRON_TEST_BACKEND", "sim") != "sim",
                              reason="the references are the GPU's semantics; on GPUs libdevice itself runs")


@pytest.mark.parametrize("which", ["generic", "cuda", "hip"])
@sim_only
def test_every_libdevice_function_computes_as_a_gpu(dist_world, which):
    [(calls, failures)] = dist_world(1).run(B.every_function, which)
    assert calls > 100 and not failures, "\n".join(failures)


@sim_only
def test_tl_math_functions_compute_as_a_gpu(dist_world):
    [(calls, failures)] = dist_world(1).run(B.tl_math)
    assert calls > 20 and not failures, "\n".join(failures)


@sim_only
def test_plain_triton_kernel_calls_the_generic_libdevice_module(dist_world):
    # the case: @triton.jit (launched by Triton's interpreter, not ditron) + the generic module
    assert dist_world(1).run(B.plain_triton_generic) == [40]


def test_fma_f32_rounds_once_at_ties():
    import numpy as np
    from fractions import Fraction
    from ditron.sim.numerics import fma_f32
    # a * b + c whose fp64 sum lands exactly on a midpoint of two fp32 values while the exact value does not
    # ((1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 is a midpoint; c = +-2^-80 decides the direction)
    a = np.array([1 + 2.0 ** -12, 1 + 2.0 ** -12, 3.0], np.float32)
    b = np.array([1 + 2.0 ** -12, -(1 + 2.0 ** -12), 5.0], np.float32)
    c = np.array([2.0 ** -80, -(2.0 ** -80), 7.0], np.float32)
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert naive[0] == np.float32(1 + 2.0 ** -11)           # two roundings: the tie goes to even, down
    got = fma_f32(a, b, c)
    assert got[0] == np.nextafter(naive[0], np.float32(2)) and got[1] == -got[0] and got[2] == 22
    for x, y, z, g in zip(a, b, c, got):
        q = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        f = np.float32(g)
        up, dn = np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))
        assert abs(Fraction(float(f)) - q) <= abs(Fraction(float(up)) - q), (x, y, z, g)
        assert abs(Fraction(float(f)) - q) <= abs(Fraction(float(dn)) - q), (x, y, z, g)
