"""ditron.sim.interp_fast: each cheaper replacement of the interpreter's bookkeeping gives what Triton's own
function gives (values, types, names, errors), compared side by side on this Triton."""
import pytest
import triton.language as tl
from triton.language import core

from ditron.sim import interp_fast as F


@pytest.fixture(scope="module", autouse=True)
def installed():
    F.install()
    for name in ("_get_np_dtype", "tensor.__init__", "block_type.__init__", "_patch_attr"):
        assert name in F.ORIGINALS, f"{name} not installed on this Triton (its source changed?)"


SCALARS = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64,
           tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]


import contextlib


@contextlib.contextmanager
def triton_own():
    """Triton's own functions back in place for the duration (the reference)."""
    new = {name: getattr(*F.TARGETS[name]) for name in F.ORIGINALS}
    for name, orig in F.ORIGINALS.items():
        if orig is F.ABSENT:
            delattr(*F.TARGETS[name])
        else:
            setattr(*F.TARGETS[name], orig)
    try:
        yield
    finally:
        for name, fn in new.items():
            setattr(*F.TARGETS[name], fn)


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 -- compared
        return ("raised", type(e), str(e))


def test_np_dtype_matches_triton():
    from triton.runtime import interpreter as interp
    fast, orig = interp._get_np_dtype, F.ORIGINALS["_get_np_dtype"]
    assert fast is not orig
    types = SCALARS + [tl.pointer_type(t) for t in SCALARS] + [tl.block_type(t, [4, 2]) for t in SCALARS] + \
        [tl.block_type(tl.pointer_type(tl.float32), [8]), tl.void, "not a type"]
    for _ in range(2):                 # the second round answers from the remembered names
        for t in types:
            assert _outcome(fast, t) == _outcome(orig, t), t


def _tensor_state(t):
    shape = t.shape
    return (t.handle, type(t.numel), t.numel.value, t.type, str(t.type), t.dtype, [type(c) for c in shape],
            [c.value for c in shape], shape.type, str(shape.type), len(shape))


def test_tensor_init_matches_triton():
    assert "tensor.__init__" in F.ORIGINALS and F.ORIGINALS["tensor.shape"] is F.ABSENT
    for ty in [tl.int32, tl.pointer_type(tl.float16), tl.block_type(tl.float32, [16]),
               tl.block_type(tl.bfloat16, [4, 8]), tl.block_type(tl.pointer_type(tl.int8), [2, 1, 4])]:
        a = core.tensor(object(), ty)
        with triton_own():
            assert "shape" not in vars(core.tensor)
            b = core.tensor(a.handle, ty)
        assert set(vars(a)) == {"handle", "type", "dtype"}                 # shape and numel: when read
        assert set(vars(b)) == {"handle", "type", "dtype", "shape", "numel"}
        assert "type" in vars(b.shape)
        assert _tensor_state(a) == _tensor_state(b)
        assert a.shape is a.shape and a.numel is a.numel                   # and then kept
        assert vars(a.shape)["type"] == b.shape.type


def test_block_type_matches_triton():
    orig = F.ORIGINALS["block_type.__init__"]

    def make(init, elem, shape):
        b = core.block_type.__new__(core.block_type)
        if init is orig:
            with triton_own():
                init(b, elem, shape)
        else:
            init(b, elem, shape)
        return (list(vars(b)), b.element_ty, type(b.shape), list(b.shape), b.shape.type, b.numel, b.name)

    shapes = [[16], [4, 8], [1, 2, 1], [core.constexpr(8), 2], core.tuple([4, 4]), [3], [4, 6], [], [True, 2],
              [1 << 21, 1 << 20], (4, 4), [4.0]]
    for _ in range(2):                 # the second round answers from the remembered checks
        for shape in shapes:
            for elem in (tl.float32, tl.pointer_type(tl.int64)):
                assert _outcome(make, core.block_type.__init__, elem, shape) == _outcome(make, orig, elem, shape), \
                    shape
    # through the constructor, as the interpreter calls it
    assert core.block_type(tl.float16, [2, 8]) == tl.block_type(tl.float16, [core.constexpr(2), 8])
    with pytest.raises(ValueError, match="power of 2"):
        core.block_type(tl.float16, [2, 6])


def test_patch_attr_wrappers_pass_the_same_arguments():
    from triton.runtime import interpreter as interp
    seen = []

    def member(*args, **kwargs):
        seen.append((args, {k: v for k, v in kwargs.items() if k != "_semantic"}, list(kwargs),
                     type(kwargs["_semantic"]).__name__))
        return len(seen)

    class Obj:
        pass

    results = []
    for patch in (interp._patch_attr, F.ORIGINALS["_patch_attr"]):
        scope = interp._LangPatchScope()
        o = Obj()
        patch(o, "f", member, interp.interpreter_builder, scope)
        seen.clear()
        o.f(1, 2, x=3)
        o.f(4, _semantic="caller's", y=5)
        o.f(_semantic=None)
        results.append(list(seen))
        scope.restore()
    assert results[0] == results[1]
    assert results[0][1][2] == ["y", "_semantic"]           # the interpreter's semantic, last, as Triton passes it


def test_lazy_tuple_type_is_the_eager_one():
    vals = [core.constexpr(3), core.constexpr(5)]
    eager = core.tuple(vals)
    lazy = core.tuple.__new__(core.tuple)
    lazy.values = list(vals)
    assert lazy.type == eager.type and str(lazy.type) == str(eager.type)
    lazy._setitem(0, core.constexpr(7))                        # Triton's own update still recomputes it
    eager._setitem(0, core.constexpr(7))
    assert lazy.type == eager.type


def test_taskcheck_unique_shortcuts_match_numpy():
    import numpy as np
    from ditron.sim import taskcheck as T
    rng = np.random.default_rng(0)
    for x in [np.array([], dtype=np.int64), np.array([3]), np.array([2, 2, 2]), np.array([5, 1, 5, 0]),
              rng.integers(0, 4, 50)]:
        got, want = T._ascending_unique(x), np.unique(x)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()

    class Mk:                      # items 0..3: 1 after 0, 2 after 1 (so after 0), 3 after nothing
        _waits = [[], [(0, 1)], [(1, 1)], []]

    ck = T.Checker.__new__(T.Checker)
    ck.waits, ck._closure, ck._after_mask, ck.items = Mk._waits, {}, {}, [None] * 4
    for i in range(4):
        for others in [np.array([0, 0]), np.array([3]), np.array([i, i, i]), np.array([0, 1, 3, 1]), np.array([2])]:
            c = ck.closure(i)
            want = np.array([int(x) == i or bool((c >> int(x)) & 1) for x in others])
            assert ck._after(i, others).tolist() == want.tolist(), (i, others)
    # a graph of 150 items (closures wider than a machine word), each waiting on a few random earlier ranges
    n = 150
    waits = [[(int(f), int(rng.integers(1, 4))) for f in rng.integers(0, max(i - 3, 1), int(rng.integers(0, 3)))]
             if i > 4 else [] for i in range(n)]
    ck = T.Checker.__new__(T.Checker)
    ck.waits, ck._closure, ck._after_mask, ck.items = waits, {}, {}, [None] * n
    for _ in range(3):                                       # the second and third time from the kept masks
        for i in rng.integers(0, n, 40):
            i = int(i)
            others = rng.integers(0, n, int(rng.integers(1, 30)))
            c = ck.closure(i)
            want = [int(x) == i or bool((c >> int(x)) & 1) for x in others]
            got = ck._after(i, others)
            assert got.dtype == bool and got.shape == others.shape and got.tolist() == want, (i, others)
    assert any(ck.closure(i).bit_length() > 64 for i in range(n))


def test_tuple_init_matches_triton():
    orig = F.ORIGINALS["tuple.__init__"]
    t16 = core.tensor(object(), tl.block_type(tl.float16, [4]))
    cases = [([1, 2],), ([core.constexpr(2), 8],), ([],), ([t16, 3],), ([1.5, tl.float32],), ((4, 4),),
             ([1, 2], core.tuple_type([core.constexpr_type(1), core.constexpr_type(2)])),
             ([1, 2], [core.constexpr_type(1), core.constexpr_type(2)]), ([None, 1],), ([True, 1],)]

    def make(init, *args):
        t = core.tuple.__new__(core.tuple)
        init(t, *args)
        lazy = "type" not in vars(t)
        return (t.values, t.type, str(t.type), list(vars(t)), lazy)

    for args in cases:
        fast, slow = _outcome(make, core.tuple.__init__, *args), _outcome(make, orig, *args)
        assert slow[0] != "ok" or not slow[1][4]
        if fast[0] == "ok":
            lazy = fast[1][4]
            assert lazy == (len(args) == 1 and all(type(v) in (int, core.constexpr) for v in args[0])), args
            fast = ("ok", fast[1][:4] + (False,))
        assert fast == slow, args


def test_taskcheck_skips_unwritten_loads_with_the_same_answers():
    """``record`` drops loads of regions that no task writes, and ``check`` tells an access inside one region and
    its task's own tensors by its bounds: random tiles of loads and stores over a graph of two written tensors and
    a read-only one (partly overlapping views) give the same error, or none, and the same shadows of the written
    regions, with either shortcut, both, and none."""
    import types
    import numpy as np
    import torch
    from ditron.errors import DitronError
    from ditron.sim import taskcheck as T

    buf = torch.zeros(256, dtype=torch.float32)
    w_ro = torch.zeros(64, dtype=torch.float16)               # read by everyone, written by no task
    a_out, b_out = buf[:96], buf[64:192]                      # overlapping views: one region, written
    t_a = types.SimpleNamespace(index=0, name="a", reads=("w",), writes=("out",), args={"w": w_ro, "out": a_out},
                                deps=[])
    t_b = types.SimpleNamespace(index=1, name="b", reads=("w", "x"), writes=("out",),
                                args={"w": w_ro, "x": a_out, "out": b_out}, deps=[])
    items = [types.SimpleNamespace(task=t, index=k, tile=k % 2) for k, t in enumerate([t_a, t_a, t_b, t_b])]
    mk = types.SimpleNamespace(graph=types.SimpleNamespace(name="g", tasks=[t_a, t_b]), items=items,
                               _waits=[[], [], [(0, 2)], [(0, 1)]], slots=torch.zeros(4, dtype=torch.int32))
    ck = T.Checker(mk, lambda v: False)
    assert len(ck.regions) == 2 and ck._written_regions.lo.size == 1
    spans = [(w_ro.data_ptr(), 128, 2), (buf.data_ptr(), 1024, 4)]
    rng = np.random.default_rng(1)

    def run(skip, accesses, bounds=False):
        T.SKIP_UNWRITTEN, T.BOUNDS_SHORTCUT = skip, bounds
        for r in ck.regions:
            r.reset()
        T._ACTIVE, T._T.pending, T._T.checker = ck, [], ck
        kept = []                                             # the addresses record keeps for the check
        try:
            for item, kind, a, size in accesses:
                T.record(kind, a, None, size, lambda: "here")
                kept.append([p[1].tolist() for p in T._T.pending])
                T.released(ck.slots_base + 4 * item, 0, 0)
            err = None
        except DitronError as e:
            err = str(e)
        finally:
            T._ACTIVE, T.SKIP_UNWRITTEN, T.BOUNDS_SHORTCUT = None, True, True
        written = ck._written_regions.covered(np.array([r.lo for r in ck.regions], np.uint64))
        shadows = [(r.writer.tolist(), r.reader.tolist()) for r, w in zip(ck.regions, written) if w]
        return err, shadows, kept

    held = [0, 0]             # accesses inside their task's own tensors (told by the bounds), and the others
    holding = T._Spans.holding

    def counted(self, amin, amax):
        k = holding(self, amin, amax)
        if self is not ck._region_set:
            held[k < 0] += 1
        return k

    T._Spans.holding = counted
    errors = 0
    for trial in range(300):
        accesses = []
        for _ in range(int(rng.integers(1, 7))):
            base, nbytes, size = spans[int(rng.integers(0, 2))]
            offs = rng.integers(0, nbytes // size, int(rng.integers(1, 6))) * size
            accesses.append((int(rng.integers(0, 4)), "read" if rng.random() < 0.6 else "write",
                             np.uint64(base) + offs.astype(np.uint64), size))
        slow = run(False, accesses)
        for skip, bounds in ((True, False), (False, True), (True, True)):
            assert run(skip, accesses, bounds)[:2] == slow[:2], (trial, skip, bounds, accesses)
        # dropping the unwritten loads, the bounds shortcut keeps the same addresses as the search per address
        assert run(True, accesses, True)[2] == run(True, accesses, False)[2], (trial, accesses)
        errors += slow[0] is not None
    assert 30 < errors < 270                                   # both outcomes are exercised
    assert held[0] > 100 and held[1] > 100                     # and both paths of the bounds shortcut
    T._Spans.holding = holding
    # the bounds shortcut of record: no range meets [min, max] exactly when none_in says so
    sp = T._Spans([(100, 200), (300, 310), (400, 401)], merge=False)
    for _ in range(2000):
        lo = int(rng.integers(0, 500))
        hi = lo + int(rng.integers(0, 120))
        meets = any(a < hi + 1 and lo < b for a, b in [(100, 200), (300, 310), (400, 401)])
        assert sp.none_in(lo, hi) == (not meets), (lo, hi)


def test_sim_atomics_values_match_numpy_broadcast():
    """ditron.sim_memory's shortcut for one Python int at one address gives the array (dtype, shape, values, a
    fresh writable copy) or the error of the general expression, for every kind of value the atomics get."""
    import numpy as np
    from ditron import sim_memory as M

    def general(value, shape, dtype):
        return np.broadcast_to(np.asarray(value, dtype=dtype), shape).copy()

    cases = [0, 1, -1, 7, 2**31 - 1, 2**31, -2**31 - 1, 2**32, 2**63 - 1, 2**63, -2**63, 2**64, True, False, 3.7,
             np.int32(5), np.int64(-9), np.uint64(2**63), np.array(4), np.array([1, 2]), [3, 4], (5,)]
    checked = 0
    for value in cases:
        for shape in ((1,), (2,), (3,)):
            for dtype in (np.int32, np.int64, np.uint64, np.uint32):
                try:
                    want = general(value, shape, dtype)
                except Exception as e:  # noqa: BLE001 -- the shortcut must raise the same
                    with pytest.raises(type(e)):
                        M._values(value, shape, dtype)
                    continue
                got = M._values(value, shape, dtype)
                assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all(), \
                    (value, shape, dtype, got, want)
                assert got.flags.writeable and got.flags.owndata
                checked += 1
    assert checked > 150
    for shape in ((1,), (4,)):
        m = M._mask(shape)
        assert m.dtype == np.bool_ and m.shape == shape and m.all()
    # the atomics on a real buffer, through the interpreter's C++ atomics, with the shortcut's arrays
    buf = np.zeros(4, dtype=np.int64)
    a = buf.ctypes.data
    assert M.atomic_add(a, 5).tolist() == [0] and M.atomic_load(a).tolist() == [5]
    assert M.atomic_xchg(a + 8, 7).tolist() == [0] and M.atomic_cas(a + 8, 7, 9).tolist() == [7]
    assert M.atomic_add(np.array([a, a + 8], dtype=np.uint64), np.array([1, 2])).tolist() == [5, 9]
    assert buf[:2].tolist() == [6, 11]
    with pytest.raises(OverflowError):
        M.atomic_add(a, 2**63)
    assert buf[:2].tolist() == [6, 11]


def _binary_operands():
    """Interpreter tensors of many kinds: scalars and blocks (1-D, 2-D, broadcastable shapes) of int / unsigned /
    float / bf16 / bool element types, pointers and blocks of pointers."""
    import numpy as np
    from triton.runtime import interpreter as interp
    TH = interp.TensorHandle
    rng = np.random.default_rng(3)
    out = []
    for ty in (tl.int1, tl.int8, tl.uint8, tl.int32, tl.uint32, tl.int64, tl.float16, tl.bfloat16, tl.float32,
               tl.float64):
        npd = interp._get_np_dtype(ty)
        for shape in ((), (4,), (1, 4), (2, 1), (2, 4)):
            data = rng.integers(0, 5, size=shape or (1,)).astype(npd)
            out.append(core.tensor(TH(data, ty), ty if not shape else tl.block_type(ty, list(shape))))
    for elem in (tl.float32, tl.int8):
        pty = tl.pointer_type(elem)
        out.append(core.tensor(TH(np.array([4096], dtype=np.uint64), pty), pty))
        out.append(core.tensor(TH(np.full((4,), 4096, dtype=np.uint64), pty), tl.block_type(pty, [4])))
    return out


#: Python numbers (Triton's function decides for them every time): of every scalar type Triton gives them, and
#: values its checks reject against some tensors (negative against unsigned, out of range)
NUMBERS = [0, 3, -2, 2**31 + 5, -2**40, 2**63 + 1, 2**70, 0.0, 1.5, -2.5e-3, 1e-40, 1e300, float("inf"),
           float("nan"), True, 1, 1.0, -0.0, False]


def _nan_safe(r):
    return repr(r)          # NaN != NaN: compare the printed values


def _result(fn, *args):
    import numpy as np
    try:
        lhs, rhs = fn(*args)
    except Exception as e:  # noqa: BLE001 -- compared
        return ("raised", type(e), str(e))
    return tuple((str(t.type), t.type, np.asarray(t.handle.data).dtype, np.asarray(t.handle.data).tolist(),
                  np.asarray(t.handle.data).flags.writeable, t.handle.dtype) for t in (lhs, rhs))


def _number_read_only(want, number_is_lhs):
    # a remembered number's tensor (the replaying calls): its array is shared between calls, so read-only
    if want[0] == "raised":
        return want
    side = 0 if number_is_lhs else 1
    fix = list(want)
    fix[side] = want[side][:4] + (False,) + want[side][5:]
    return tuple(fix)


def test_binary_plans_match_triton():
    """Every pair of operand kinds, with every flag combination that Triton's callers pass: the same result
    types, values, NumPy dtypes, writeability and handle dtypes as Triton's own function, or the same error -- on
    the call that takes the decision and on the calls that replay it (where a Python number's tensor is the
    remembered one: read-only, the rest the same)."""
    from triton.runtime import interpreter as interp
    name = "TritonSemantic.binary_op_type_checking_impl"
    assert name in F.ORIGINALS, "not installed on this Triton (its source changed?)"
    fast, orig = interp.TritonSemantic.binary_op_type_checking_impl, F.ORIGINALS[name]
    sem = interp.TritonSemantic(interp.interpreter_builder)
    ops = _binary_operands()
    flags = [(False, False, True, False), (True, False, True, False), (False, True, True, False),
             (False, False, True, True), (False, False, False, False), (True, True, False, False)]
    fast.plans.clear()
    fast.consts.clear()
    pairs = [(a, b) for a in ops for b in ops] + [(a, x) for a in ops for x in NUMBERS] + \
        [(x, a) for a in ops for x in NUMBERS]
    import numpy as np
    with np.errstate(over="ignore"):           # 1e300 as a float16 / float32 constant: inf, as Triton makes it
        remembered = []
        for f in flags:
            remembered += fast.consts.values()
            fast.consts.clear()                # (at most interp_plans._CONSTS_MAX numbers are remembered)
            for lhs, rhs in pairs:
                with triton_own():             # the reference: Triton's own functions throughout
                    want = _result(orig, sem, lhs, rhs, *f)
                number = [x for x in (lhs, rhs) if not isinstance(x, core.tensor)]
                for i in range(3):             # the first call decides (Triton's function), the others replay
                    got = _result(fast, sem, lhs, rhs, *f)
                    if number and number[0] == number[0]:
                        # a remembered number (replays; and the deciding call where ``to_tensor`` remembered it
                        # already) is read-only: the same otherwise
                        expect = _number_read_only(want, number[0] is lhs)
                        if not i:
                            got = _number_read_only(got, number[0] is lhs)
                    else:
                        expect = want
                    assert _nan_safe(got) == _nan_safe(expect), (getattr(lhs, "type", lhs),
                                                                 getattr(rhs, "type", rhs), f, i)
    # decisions were remembered and replayed: casts, splats, expansions and broadcasts, not only identities
    plans = [(k, p) for k, p in fast.plans.items() if isinstance(p, tuple)]
    assert any(p[0] is not None or p[2] is not None for k, p in plans)
    steps = {s[0] for k, p in plans for side in (p[1], p[3]) for s in side}
    assert steps == {"splat", "expand", "broadcast"}
    # numbers' tensors were remembered: splatted to blocks, with and without a cast of the tensor side
    consts = [e for e in remembered + list(fast.consts.values()) if isinstance(e, tuple)]
    assert any(e[0] is not None for e in consts) and any(e[0] is None for e in consts)
    arrays = [e[1][1] for e in consts]          # (the tensor side's cast, (the number's type, array, dtype))
    assert any(a.shape == (2, 4) for a in arrays) and all(not a.flags.writeable for a in arrays)


def test_broadcast_plans_match_triton():
    """``broadcast_impl_value`` (loads' and stores' mask / other / value, ``where``): every pair of operand kinds,
    the same result types, values, NumPy dtypes, writeability and handle dtypes as Triton's own, or the same error,
    on the deciding call and on the replaying ones."""
    from triton.runtime import interpreter as interp
    name = "TritonSemantic.broadcast_impl_value"
    assert name in F.ORIGINALS, "not installed on this Triton (its source changed?)"
    fast, orig = interp.TritonSemantic.broadcast_impl_value, F.ORIGINALS[name]
    sem = interp.TritonSemantic(interp.interpreter_builder)
    ops = _binary_operands()
    fast.plans.clear()
    for lhs in ops:
        for rhs in ops:
            want = _result(orig, sem, lhs, rhs)
            for i in range(3):
                assert _nan_safe(_result(fast, sem, lhs, rhs)) == _nan_safe(want), (lhs.type, rhs.type, i)
    plans = [p for p in fast.plans.values() if isinstance(p, tuple)]
    steps = {s[0] for p in plans for side in (p[1], p[3]) for s in side}
    assert steps == {"splat", "expand", "broadcast"} and any(p == (None, (), None, ()) for p in plans)
    assert all(p[0] is None and p[2] is None for p in plans)              # a broadcast casts nothing
    assert all(isinstance(p, tuple) for p in fast.plans.values())      # none left to Triton each time


def test_expand_dims_matches_triton():
    """``expand_dims`` of every operand kind at every axis (in range, past the end, negative): the same result
    type, values, NumPy dtype, writeability and handle dtype as Triton's own, or the same error."""
    from triton.runtime import interpreter as interp
    name = "TritonSemantic.expand_dims"
    assert name in F.ORIGINALS, "not installed on this Triton (its source changed?)"
    fast, orig = interp.TritonSemantic.expand_dims, F.ORIGINALS[name]
    sem = interp.TritonSemantic(interp.interpreter_builder)
    blocks = 0
    for x in _binary_operands():
        for axis in (0, 1, 2, 3, -1, -3, core.constexpr(1)):
            want, got = (_result(lambda *a: (f(*a),) * 2, sem, x, axis) for f in (orig, fast))
            assert _nan_safe(got) == _nan_safe(want), (x.type, axis)
            blocks += want[0] != "raised" and x.type.is_block()
    assert blocks > 50


def test_cast_plans_match_triton():
    """``cast`` between every pair of scalar types (integers, floats, fp8, bool), of scalars and blocks of random
    values (negative, fractional, large): the same result (type, bits, NumPy dtype, writeability, handle dtype) or
    error as Triton's own, on the deciding call and on the replaying ones; most pairs are replayed."""
    import numpy as np
    from triton.runtime import interpreter as interp
    from ditron._compat_interp import _install_rne_casts
    _install_rne_casts()                   # the simulator's bf16 rounding, as in a launch
    name = "TritonSemantic.cast"
    assert name in F.ORIGINALS, "not installed on this Triton (its source changed?)"
    fast, orig = interp.TritonSemantic.cast, F.ORIGINALS[name]
    sem = interp.TritonSemantic(interp.interpreter_builder)
    rng = np.random.default_rng(5)
    fast.plans.clear()

    def outcome(fn, x, dst):
        try:
            with np.errstate(all="ignore"):
                t = fn(sem, x, dst)
        except Exception as e:  # noqa: BLE001 -- compared
            return ("raised", type(e), str(e))
        d = np.asarray(t.handle.data)
        return (str(t.type), t.type, d.dtype, d.tobytes(), d.shape, d.flags.writeable, t.handle.dtype, t is x)

    for src in SCALARS:
        npd = interp._get_np_dtype(src)
        for shape in ((), (4,), (2, 4)):
            vals = rng.normal(0, 300, size=shape or (1,))
            if src.is_int() or src.is_bool():
                vals = np.rint(vals)
            with np.errstate(all="ignore"):
                data = (vals != 0) if src == tl.int1 else vals.astype(npd) if not src.is_fp8() else \
                    rng.integers(0, 255, size=shape or (1,)).astype(npd)
            x = core.tensor(interp.TensorHandle(data, src), src if not shape else tl.block_type(src, list(shape)))
            for dst in SCALARS:
                want = outcome(orig, x, dst)
                for i in range(3):
                    assert outcome(fast, x, dst) == want, (src, shape, dst, i)
    replayed = [p for p in fast.plans.values() if isinstance(p, tuple) and p]
    assert len(replayed) > 100 and {p[0] for p in replayed} >= {"create_fp_trunc", "create_fp_ext",
                                                                "create_int_cast", "create_si_to_fp"}


def test_number_tensors_match_triton():
    """``to_tensor`` of every kind of Python number (and of what is not one: tensors, constexprs, a string, with
    and without the type check): the same type, values, NumPy dtype and handle dtype as Triton's own, or the same
    error; a remembered number's array is read-only on the calls after the first."""
    from triton.runtime import interpreter as interp
    name = "TritonSemantic.to_tensor"
    assert name in F.ORIGINALS, "not installed on this Triton (its source changed?)"
    fast, orig = interp.TritonSemantic.to_tensor, F.ORIGINALS[name]
    sem = interp.TritonSemantic(interp.interpreter_builder)
    fast.made.clear()
    others = _binary_operands()[:6] + [core.constexpr(3), core.constexpr(-0.0), "text"]
    def outcome(fn, x, check):
        try:
            t = fn(sem, x, check)
        except Exception as e:  # noqa: BLE001 -- compared
            return ("raised", type(e), str(e))
        return _result(lambda *a: (t, t)) if isinstance(t, core.tensor) else ("as given", t is x)

    for x in NUMBERS + others:
        calls = 0
        for check in (True, False):
            with triton_own():
                want = outcome(orig, x, check)
            for i in range(3):
                got = outcome(fast, x, check)
                value = x.value if isinstance(x, core.constexpr) else x
                if (calls or value is not x) and isinstance(value, (int, float)) and value == value \
                        and want[0] not in ("raised", "as given"):
                    # the remembered, read-only array (a constexpr's number: remembered when Triton's 3.6
                    # converts its value through ``to_tensor``; 3.9 unwraps it itself)
                    want_i = tuple(w[:4] + (False,) + w[5:] for w in want)
                    if value is not x:
                        got = tuple(w[:4] + (False,) + w[5:] for w in got)
                else:
                    want_i = want
                assert _nan_safe(got) == _nan_safe(want_i), (x, check, i)
                calls += 1
    assert len(fast.made) == len([x for x in NUMBERS if x == x]) - 1      # 2**70: not representable, raised
