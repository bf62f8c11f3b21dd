"""Bodies of tests/test_sim_libdevice.py: every function of every libdevice module Triton offers -- the generic
``triton.language.extra.libdevice``, ``triton.language.extra.cuda.libdevice``, ``...hip.libdevice`` and
``tl.math`` -- for every argument type Triton's module lists (read from the installed Triton's source), against
references computed here from NumPy, torch and exact rational arithmetic (``fractions``), independently of the
simulator's implementation."""
import ast
import importlib
import math
from fractions import Fraction

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice as generic_ld
from triton.language.extra.cuda import libdevice as cuda_ld
from triton.language.extra.hip import libdevice as hip_ld

import ditron

MODULES = {"generic": "triton.language.extra.libdevice", "cuda": "triton.language.extra.cuda.libdevice",
           "hip": "triton.language.extra.hip.libdevice"}
N = 24                         # elements per call


def _fn(which, name):
    return getattr({"generic": generic_ld, "cuda": cuda_ld, "hip": hip_ld, "math": tl.math}[which], name)


# one kernel per arity; the module and function are constexprs (the interpreter resolves them in Python)
@ditron.jit
def k1(a, o, n, WHICH: tl.constexpr, NAME: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, _fn(WHICH, NAME)(tl.load(a + offs, mask=m)), mask=m)


@ditron.jit
def k2(a, b, o, n, WHICH: tl.constexpr, NAME: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, _fn(WHICH, NAME)(tl.load(a + offs, mask=m), tl.load(b + offs, mask=m)), mask=m)


@ditron.jit
def k3(a, b, c, o, n, WHICH: tl.constexpr, NAME: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, _fn(WHICH, NAME)(tl.load(a + offs, mask=m), tl.load(b + offs, mask=m),
                                        tl.load(c + offs, mask=m)), mask=m)


@ditron.jit
def k4(a, b, c, d, o, n, WHICH: tl.constexpr, NAME: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, _fn(WHICH, NAME)(tl.load(a + offs, mask=m), tl.load(b + offs, mask=m),
                                        tl.load(c + offs, mask=m), tl.load(d + offs, mask=m)), mask=m)


# the case: a plain Triton kernel (launched by Triton's interpreter, not ditron) on the generic module,
# calling it as Triton's extern-functions tutorial does
@triton.jit
def plain_generic_asin(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, generic_ld.asin(tl.load(x_ptr + offs, mask=m)), mask=m)


def signatures(modname):
    """{function: [(argument dtypes, symbol, result dtype)]} as the installed Triton's module lists them."""
    mod = importlib.import_module(modname)
    with open(mod.__file__) as f:
        tree = ast.parse(f.read())
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        sigs = []
        for d in ast.walk(node):
            if isinstance(d, ast.Dict):
                for k, v in zip(d.keys, d.values):
                    sigs.append((tuple(e.args[0].value for e in k.elts), v.elts[0].value, v.elts[1].args[0].value))
        out[node.name] = sigs
    return out


NP = {"fp32": np.float32, "fp64": np.float64, "int32": np.int32, "int64": np.int64, "uint32": np.uint32,
      "uint64": np.uint64}


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------

def _floats(rng, dt, lo, hi):
    return rng.uniform(lo, hi, N).astype(dt)


def _ints(rng, dt):
    info = np.iinfo(dt)
    v = rng.integers(info.min, info.max, N, dtype=dt, endpoint=True)
    v[:4] = np.array([0, 1, info.max, info.min], dtype=dt) if info.min < 0 else np.array([0, 1, info.max, 7], dtype=dt)
    return v


DOMAIN = {     # name -> (lo, hi) for float arguments (default: -4, 4)
    "log": (0.01, 50), "log2": (0.01, 50), "log10": (0.01, 50), "log1p": (-0.9, 50), "sqrt": (0, 50),
    "rsqrt": (0.01, 50), "asin": (-1, 1), "acos": (-1, 1), "acosh": (1, 20), "atanh": (-0.99, 0.99),
    "erfinv": (-0.99, 0.99), "erfcinv": (0.01, 1.99), "normcdfinv": (0.01, 0.99), "lgamma": (0.1, 20),
    "tgamma": (0.1, 20), "y0": (0.1, 20), "y1": (0.1, 20), "yn": (0.5, 20), "jn": (-20, 20), "j0": (-20, 20),
    "j1": (-20, 20), "fast_logf": (0.01, 50), "fast_log2f": (0.01, 50), "fast_log10f": (0.01, 50),
    "pow": (0.1, 4), "fast_powf": (0.1, 4), "sqrt_rn": (0, 50), "sqrt_rz": (0, 50), "sqrt_rd": (0, 50),
    "sqrt_ru": (0, 50), "rsqrt_rn": (0.01, 50), "exp": (-20, 20), "exp2": (-20, 20), "exp10": (-8, 8),
    "double2float_rn": (-1e30, 1e30), "double2float_rz": (-1e30, 1e30), "double2float_rd": (-1e30, 1e30),
    "double2float_ru": (-1e30, 1e30),
}
for _p in ("float2int", "double2int", "float2ll", "double2ll"):
    for _m in ("rn", "rz", "rd", "ru"):
        DOMAIN[f"{_p}_{_m}"] = (-3e9, 3e9) if _p.endswith("int") else (-1.5e19, 1.5e19)
for _p in ("float2uint", "double2uint", "float2ull", "double2ull"):
    for _m in ("rn", "rz", "rd", "ru"):
        DOMAIN[f"{_p}_{_m}"] = (-10, 6e9) if _p.endswith("int") else (-10, 3e19)


def inputs(name, argtypes, rng):
    lo, hi = DOMAIN.get(name, (-4, 4))
    out = []
    for i, t in enumerate(argtypes):
        dt = NP[t]
        if dt in (np.float32, np.float64):
            v = _floats(rng, dt, lo, hi)
            if name.endswith(("_rn", "_rz", "_rd", "_ru")) and name.startswith(("float2", "double2")):
                v[:6] = np.array([0.5, 1.5, -2.5, np.nan, np.inf, -np.inf], dtype=dt)   # ties, NaN -> 0, saturation
            elif name in ("round", "rint", "nearbyint", "llrint", "llround", "floor", "ceil", "trunc"):
                v[:6] = np.array([0.5, 1.5, -2.5, -0.5, 2.5, 3.0], dtype=dt)
            out.append(v)
        else:
            if name in ("ldexp", "scalbn", "pow"):
                v = rng.integers(-6, 7, N).astype(dt)
            elif name in ("jn", "yn"):
                v = rng.integers(0, 6, N).astype(dt)
            elif name == "byte_perm" and i == 2:
                v = rng.integers(0, 1 << 16, N).astype(dt)
            else:
                v = _ints(rng, dt)
            out.append(v)
    return out


# ---------------------------------------------------------------------------
# references
# ---------------------------------------------------------------------------

def _u(v, bits):
    return int(v) % (1 << bits)


def _s(v, bits):
    v = int(v) % (1 << bits)
    return v - (1 << bits) if v >> (bits - 1) else v


def _each(fn, *arrays):
    return [fn(*vals) for vals in zip(*arrays)]


def _t(fn):
    return lambda *a: fn(*[torch.from_numpy(np.asarray(x, np.float64)) for x in a]).numpy()


def _series_jn(n, x):
    # the power series of J_n (enough terms for |x| <= 20, in exact rationals)
    n, x = int(n), Fraction(float(x))
    s, term, k = Fraction(0), (x / 2) ** n / math.factorial(n), 0
    while k < 120:
        s += term
        k += 1
        term = -term * (x / 2) ** 2 / (k * (k + n))
    return float(s)


def _mpf(fn):
    import mpmath
    with mpmath.workprec(96):
        return float(fn(mpmath))


def _yn_ref(n, x):
    import mpmath           # torch's dependency (sympy); torch.special.bessel_y0 is off by ~1e-9 at x ~ 10
    return float(mpmath.bessely(int(n), float(x)))


def _ieee_remainder(x, y):
    return math.remainder(float(x), float(y))


APPROX = {      # name -> reference in fp64 (the result must be within a few ulp of the result's precision)
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: 10.0 ** x, "expm1": np.expm1, "log": np.log,
    "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "atan2": np.arctan2, "sinh": np.sinh,
    "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "rsqrt_rn": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt,
    "rcbrt": lambda x: 1 / np.cbrt(x), "hypot": np.hypot, "rhypot": lambda x, y: 1 / np.hypot(x, y),
    "norm3d": lambda a, b, c: np.sqrt(a * a + b * b + c * c), "rnorm3d": lambda a, b, c: 1 / np.sqrt(a * a + b * b + c * c),
    "norm4d": lambda a, b, c, d: np.sqrt(a * a + b * b + c * c + d * d),
    "rnorm4d": lambda a, b, c, d: 1 / np.sqrt(a * a + b * b + c * c + d * d),
    "erf": _t(torch.erf), "erfc": _t(torch.erfc), "erfinv": _t(torch.erfinv), "erfcinv": _t(lambda y: torch.erfinv(1 - y)),
    "erfcx": _t(torch.special.erfcx), "normcdf": lambda x: np.array(_each(lambda v: _mpf(lambda m: m.ncdf(float(v))), x)), "normcdfinv": _t(torch.special.ndtri),
    "lgamma": _t(torch.lgamma), "tgamma": _t(lambda x: torch.exp(torch.lgamma(x))),
    "j0": lambda x: np.array(_each(lambda v: _series_jn(0, v), x)),
    "j1": lambda x: np.array(_each(lambda v: _series_jn(1, v), x)), "y0": lambda x: np.array(_each(lambda v: _yn_ref(0, v), x)),
    "y1": lambda x: np.array(_each(lambda v: _yn_ref(1, v), x)), "cyl_bessel_i0": _t(torch.special.i0), "cyl_bessel_i1": _t(torch.special.i1),
    "jn": lambda n, x: np.array(_each(_series_jn, n, x)), "yn": lambda n, x: np.array(_each(_yn_ref, n, x)),
    "sinpi": lambda x: np.sin(np.pi * x), "cospi": lambda x: np.cos(np.pi * x),
    "pow": lambda x, y: np.power(x.astype(np.float64), y.astype(np.float64)),
    "fast_sinf": np.sin, "fast_cosf": np.cos, "fast_log2f": np.log2, "fast_logf": np.log, "fast_expf": np.exp,
    "fast_tanf": np.tan, "fast_exp10f": lambda x: 10.0 ** x, "fast_log10f": np.log10, "fast_powf": np.power,
    "fast_dividef": np.divide, "fast_tanhf": np.tanh, "div_rn": np.divide, "fdiv": np.divide,
    "umulhi": None,
}
EXACT = {       # name -> reference giving the exact result (compared bit for bit; NaN == NaN)
    "abs": lambda x: np.array(_each(lambda v: _s(abs(int(v)), x.dtype.itemsize * 8), x)) if x.dtype.kind == "i"
    else np.abs(x),
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "nearbyint": np.rint,
    "round": lambda x: np.array([math.copysign(math.floor(abs(v) + 0.5), v) for v in x.astype(np.float64)]),
    "saturatef": lambda x: np.clip(x, 0, 1), "copysign": np.copysign, "nextafter": np.nextafter,
    "fmod": lambda x, y: np.array(_each(math.fmod, x.astype(np.float64), y.astype(np.float64))),
    "remainder": lambda x, y: np.array(_each(_ieee_remainder, x, y)),
    "fdim": lambda x, y: np.maximum(x - y, 0), "ldexp": lambda x, e: np.ldexp(x, e), "scalbn": lambda x, e: np.ldexp(x, e),
    "isnan": lambda x: np.isnan(x).astype(np.int32), "isinf": lambda x: np.isinf(x).astype(np.int32),
    "finitef": lambda x: np.isfinite(x).astype(np.int32), "isfinited": lambda x: np.isfinite(x).astype(np.int32),
    "signbit": lambda x: np.signbit(x).astype(np.int32),
    "ilogb": lambda x: np.array([math.frexp(v)[1] - 1 for v in x.astype(np.float64)]),
    "logb": lambda x: np.array([float(math.frexp(v)[1] - 1) for v in x.astype(np.float64)]),
    "llrint": lambda x: np.rint(x).astype(np.int64), "llround": lambda x: np.array(
        [int(math.copysign(math.floor(abs(v) + 0.5), v)) for v in x.astype(np.float64)]),
    "clz": lambda x: np.array(_each(lambda v: (lambda b: len(b) - len(b.lstrip("0")))(
        format(_u(v, x.dtype.itemsize * 8), f"0{x.dtype.itemsize * 8}b")), x)),
    "popc": lambda x: np.array(_each(lambda v: format(_u(v, x.dtype.itemsize * 8), "b").count("1"), x)),
    "brev": lambda x: np.array(_each(lambda v: _s(int(format(_u(v, x.dtype.itemsize * 8),
                                                             f"0{x.dtype.itemsize * 8}b")[::-1], 2),
                                                  x.dtype.itemsize * 8), x)),
    "ffs": lambda x: np.array(_each(lambda v: 0 if v == 0 else
                                    format(_u(v, x.dtype.itemsize * 8), "b")[::-1].index("1") + 1, x)),
    "byte_perm": lambda x, y, s: np.array(_each(
        lambda a, b, c: _s(int.from_bytes(bytes(
            (np.array([a], np.int32).tobytes() + np.array([b], np.int32).tobytes())[(int(c) >> (4 * i)) & 7]
            for i in range(4)), "little"), 32), x, y, s)),
    "mulhi": lambda x, y: np.array(_each(lambda a, b: _s((int(a) * int(b)) >> (x.dtype.itemsize * 8),
                                                         x.dtype.itemsize * 8), x, y)),
    "mul24": lambda x, y: np.array(_each(
        lambda a, b: _s(_s(_u(a, 24), 24 if x.dtype.kind == "i" else 25) * _s(_u(b, 24), 24 if x.dtype.kind == "i"
                                                                              else 25), 32), x, y)),
    "sad": lambda x, y, z: np.array(_each(lambda a, b, c: _s(abs(int(a) - int(b)) + int(c), 32), x, y, z)),
    "hadd": lambda x, y: np.array(_each(lambda a, b: (int(a) + int(b)) // 2, x, y)),
    "rhadd": lambda x, y: np.array(_each(lambda a, b: (int(a) + int(b) + 1) // 2, x, y)),
    "float_as_int": lambda x: x.view(np.int32), "float_as_uint": lambda x: x.view(np.int32),
    "int_as_float": lambda x: x.view(np.float32), "uint_as_float": lambda x: x.view(np.float32),
    "double_as_longlong": lambda x: x.view(np.int64), "longlong_as_double": lambda x: x.view(np.float64),
    "double2hiint": lambda x: (x.view(np.uint64) >> np.uint64(32)).astype(np.uint32).view(np.int32),
    "double2loint": lambda x: x.view(np.uint64).astype(np.uint32).view(np.int32),
    "hiloint2double": lambda h, l: ((h.astype(np.int64).view(np.uint64) << np.uint64(32)) |
                                    l.view(np.uint32).astype(np.uint64)).view(np.float64),
    "int2double_rn": lambda x: x.astype(np.float64), "uint2double_rn": lambda x: x.astype(np.float64),
    "umulhi": lambda x, y: np.array(_each(lambda a, b: (int(a) * int(b)) >> 32, x, y)),
}


def _frac(v):
    return Fraction(float(v))


def _next(v, up):
    return np.nextafter(v, v.dtype.type(np.inf if up else -np.inf))


def rounded_ok(r, cmp, mode):
    """``r`` is the rounding by ``mode`` of the real number that ``cmp(Fraction) -> sign(candidate - real)``
    describes (checked against both neighbours of r by definition, not computed)."""
    c = cmp(_frac(r))
    if c == 0:
        return True
    lo_side = c < 0                  # r below the real value
    if mode == "rn":
        # no neighbour is nearer: the real value lies between the midpoints around r
        up, dn = _next(r, True), _next(r, False)
        mid_up, mid_dn = (_frac(r) + _frac(up)) / 2, (_frac(r) + _frac(dn)) / 2
        return cmp(mid_up) >= 0 and cmp(mid_dn) <= 0
    if mode == "rz":
        mode = "rd" if cmp(Fraction(0)) < 0 else "ru"      # toward zero: down above zero, up below
    if mode == "rd":
        return lo_side and cmp(_frac(_next(r, True))) > 0
    return (not lo_side) and cmp(_frac(_next(r, False))) < 0


def _sign(x):
    return (x > 0) - (x < 0)


ARITH = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
         "fma": lambda a, b, c: a * b + c, "rcp": lambda a: 1 / a}


def check_rounding(name, args, got):
    """The correctly rounded operations and conversions with a rounding mode; None or a message."""
    op, _, mode = name.rpartition("_")
    for i in range(N):
        vals = [a[i] for a in args]
        r = got[i]
        if op.startswith(("float2", "double2")) and op[op.index("2") + 1:] in ("int", "uint", "ll", "ull"):
            kind = op[op.index("2") + 1:]
            lo, hi = {"int": (-2 ** 31, 2 ** 31 - 1), "uint": (0, 2 ** 32 - 1), "ll": (-2 ** 63, 2 ** 63 - 1),
                      "ull": (0, 2 ** 64 - 1)}[kind]
            v = float(vals[0])
            if v != v:
                want = 0
            elif math.isinf(v):
                want = hi if v > 0 else lo
            else:
                rv = {"rn": round, "rz": math.trunc, "rd": math.floor, "ru": math.ceil}[mode](Fraction(v))
                want = min(max(int(rv), lo), hi)
            bits = 64 if kind in ("ll", "ull") else 32
            if _u(int(r), bits) != _u(want, bits):
                return f"{name}({v!r}) = {int(r)}, want {want}"
            continue
        if op == "double2float" and not math.isfinite(vals[0]):
            if not (r == vals[0] or (r != r and vals[0] != vals[0])):
                return f"{name}({vals[0]!r}) = {r!r}"
            continue
        if op.startswith(("int2", "uint2", "ll2", "ull2", "double2float")):
            q = _frac(vals[0]) if op.startswith("double") else Fraction(int(vals[0]))
            cmp = (lambda q: lambda c: _sign(c - q))(q)
        elif op in ("sqrt",):
            x = _frac(vals[0])
            cmp = (lambda x: lambda c: _sign(c * c - x) if c >= 0 else -1)(x)
        else:
            q = ARITH[op](*[_frac(v) for v in vals])
            cmp = (lambda q: lambda c: _sign(c - q))(q)
        if not rounded_ok(r, cmp, mode):
            return f"{name}{tuple(float(v) for v in vals)} = {float(r)!r} is not rounded {mode}"
    return None


def _ulps(dt):
    return {np.dtype(np.float32): 2.0 ** -23, np.dtype(np.float64): 2.0 ** -52}[np.dtype(dt)]


def check(name, argtypes, ret, args, got):
    """None when ``got`` (the simulator's result) is what a GPU computes, else a message."""
    rdt = NP.get(ret, None)
    if name.endswith(("_rn", "_rz", "_rd", "_ru")) and name != "rsqrt_rn":
        return check_rounding(name, args, got)
    if name in ("fma",):
        return check_rounding("fma_rn", args, got)
    if name in EXACT:
        want = np.asarray(EXACT[name](*args))
        if rdt is not None and np.dtype(rdt).kind in "iu":
            bits = np.dtype(rdt).itemsize * 8
            ok = [_u(int(a), bits) == _u(int(b), bits) for a, b in zip(got, want)]
        else:
            g, w = got.astype(np.float64), want.astype(got.dtype).astype(np.float64)
            ok = [(a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b) for a, b in zip(g, w)]
        if not all(ok):
            i = ok.index(False)
            return f"{name}{tuple(a[i] for a in args)} = {got[i]!r}, want {want[i]!r}"
        return None
    if name in APPROX:
        want = np.asarray(APPROX[name](*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in args]),
                          np.float64)
        g = got.astype(np.float64)
        tol = (8 * _ulps(got.dtype)) * np.maximum(np.abs(want), np.finfo(got.dtype).tiny)
        if name in ("lgamma", "jn", "yn", "tgamma", "j0", "j1", "y0", "y1", "sinpi", "cospi", "exp10", "fast_exp10f"):
            tol = np.maximum(tol, 64 * _ulps(got.dtype) * np.maximum(1.0, np.abs(want)))   # reference's own error
        bad = ~((np.abs(g - want) <= tol) | (np.isnan(g) & np.isnan(want)) | (g == want))
        if bad.any():
            i = int(np.argmax(bad))
            return f"{name}{tuple(a[i] for a in args)} = {g[i]!r}, want {want[i]!r}"
        return None
    return f"no reference for {name} in tests/bodies_sim_libdevice.py (a libdevice function Triton added?)"


REFUSED = {"rcp64h"}        # the hardware's approximation of the high word's reciprocal: refused by the simulator


def run_call(which, name, argtypes, ret, rng, dev):
    args = inputs(name, argtypes, rng)
    out = torch.empty(N, dtype=getattr(torch, {"fp32": "float32", "fp64": "float64"}.get(ret, ret)), device=dev)
    kernel = {1: k1, 2: k2, 3: k3, 4: k4}[len(args)]
    kernel[(1,)](*[torch.from_numpy(a).to(dev) for a in args], out, N, WHICH=which, NAME=name, BLOCK=32)
    got = out.cpu().numpy()
    return check(name, argtypes, ret, args, got)


def every_function(world, which):
    """Every function of module ``which`` for every signature; the failures (empty when all agree)."""
    from ditron.errors import DitronError
    rng = np.random.default_rng(56)
    failures, calls = [], 0
    table = signatures(MODULES[which]) if which != "generic" else {
        name: sigs for name, sigs in signatures(MODULES["cuda"]).items()} | {
        name: sigs for name, sigs in signatures(MODULES["hip"]).items()
        if name not in signatures(MODULES["cuda"])}
    if which == "generic":
        names = {n for n, v in vars(generic_ld).items() if callable(v) and not n.startswith("_")}
        missing = names - set(table)
        assert not missing, missing
        table = {n: table[n] for n in sorted(names)}
    for name, sigs in table.items():
        for argtypes, symbol, ret in sigs:
            calls += 1
            try:
                msg = run_call(which, name, argtypes, ret, rng, world.device)
            except Exception as e:     # noqa: BLE001 -- reported below
                text = str(e)
                if name in REFUSED and "rcp64h" in text and isinstance(e, DitronError | triton.runtime.errors.InterpreterError):
                    continue
                msg = f"{name}{argtypes}: {type(e).__name__}: {text[:300]}"
            else:
                if name in REFUSED:
                    msg = f"{name} computed a value instead of being refused"
            if msg:
                failures.append(f"{which}.{symbol}: {msg}")
    return calls, failures


MATH = {      # tl.math: (argument dtype, reference, exact?)
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "cos": np.cos, "sin": np.sin,
    "sqrt": np.sqrt, "sqrt_rn": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "erf": _t(torch.erf),
    "floor": np.floor, "ceil": np.ceil, "abs": np.abs,
}


FP32_ONLY = {"rsqrt", "sqrt_rn"}       # Triton accepts only fp32 for these (on GPUs as well)


def tl_math(world):
    failures = []
    rng = np.random.default_rng(7)
    for name, ref in MATH.items():
        for t in ("fp32",) if name in FP32_ONLY else ("fp32", "fp64"):
            lo, hi = DOMAIN.get(name, (-4, 4))
            if name in ("sqrt_rn", "rsqrt"):
                lo, hi = 0.01, 50
            a = _floats(rng, NP[t], lo, hi)
            out = torch.empty(N, dtype=torch.float32 if t == "fp32" else torch.float64, device=world.device)
            k1[(1,)](torch.from_numpy(a).to(world.device), out, N, WHICH="math", NAME=name, BLOCK=32)
            g = out.cpu().numpy().astype(np.float64)
            want = np.asarray(ref(a.astype(np.float64)), np.float64)
            tol = 8 * _ulps(NP[t]) * np.abs(want)
            if not (np.abs(g - want) <= tol).all():
                i = int(np.argmax(np.abs(g - want) > tol))
                failures.append(f"tl.math.{name}({a[i]!r}) [{t}] = {g[i]!r}, want {want[i]!r}")
    for name, ref in (("div_rn", np.divide), ("fdiv", np.divide)):
        a, b = _floats(rng, np.float32, -4, 4), _floats(rng, np.float32, 0.5, 4)
        out = torch.empty(N, device=world.device)
        k2[(1,)](torch.from_numpy(a).to(world.device), torch.from_numpy(b).to(world.device), out, N, WHICH="math",
                 NAME=name, BLOCK=32)
        want = (a.astype(np.float64) / b).astype(np.float32)      # the correctly rounded quotient
        g = out.cpu().numpy()
        tol = 0 if name == "div_rn" else 2 * _ulps(np.float32) * np.abs(want)      # div.full.f32: 2 ulp
        if not (np.abs(g.astype(np.float64) - want) <= tol).all():
            failures.append(f"tl.math.{name}: {g.tolist()} != {want.tolist()}")
    a, b, c = (_floats(rng, np.float32, -4, 4) for _ in range(3))
    out = torch.empty(N, device=world.device)
    k3[(1,)](*(torch.from_numpy(v).to(world.device) for v in (a, b, c)), out, N, WHICH="math", NAME="fma", BLOCK=32)
    g = out.cpu().numpy()
    for i in range(N):
        q = _frac(a[i]) * _frac(b[i]) + _frac(c[i])
        if not rounded_ok(g[i], lambda x: _sign(x - q), "rn"):
            failures.append(f"tl.math.fma({a[i]}, {b[i]}, {c[i]}) = {g[i]!r} is not fma.rn")
    return len(MATH) * 2 + 3, failures


def plain_triton_generic(world):
    x = torch.linspace(-0.95, 0.95, 40)
    y = torch.empty_like(x)
    plain_generic_asin[(1,)](x, y, 40, BLOCK=64)
    want = torch.asin(x.double())
    assert ((y.double() - want).abs() <= 4 * 2.0 ** -23 * want.abs()).all(), (y, want)
    return 40
