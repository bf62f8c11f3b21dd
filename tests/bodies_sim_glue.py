"""Test bodies for the simulator's interpreter glue (ditron/_compat_interp.py): the per-launch patch of
``triton.language`` replayed, ``tl.reduce`` with an elementwise combine function over whole slices."""
import numpy as np
import torch
import triton
import triton.language as tl

import ditron
import helpers_named_builtins


@triton.jit
def _fadd(a, b):
    return a + b


@triton.jit
def _imax(a, b):
    return tl.maximum(a, b)


@triton.jit
def _mix(a, b):
    return tl.where(a > b, a - b * 0.5, b.to(tl.float32) + a)


@triton.jit
def _branchy(a, b):
    return a + b if True else a       # a branch: not provably elementwise, Triton's own path


@ditron.jit
def reduce_kernel(x_ptr, rows_ptr, cols_ptr, imax_ptr, mix_ptr, branchy_ptr, M: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    x = tl.load(x_ptr + offs)
    tl.store(rows_ptr + tl.arange(0, M), tl.reduce(x, 1, _fadd))
    tl.store(cols_ptr + tl.arange(0, N)[None, :], tl.reduce(x, 0, _fadd, keep_dims=True))
    tl.store(imax_ptr + tl.arange(0, M), tl.reduce(x.to(tl.int32), 1, _imax))
    tl.store(mix_ptr + tl.arange(0, N), tl.reduce(x, 0, _mix))
    tl.store(branchy_ptr + tl.arange(0, M), tl.reduce(x, 1, _branchy))


def _run_reduce(x):
    M, N = x.shape
    outs = [torch.zeros(M), torch.zeros(N), torch.zeros(M, dtype=torch.int32), torch.zeros(N), torch.zeros(M)]
    reduce_kernel[(1,)](x, *outs, M=M, N=N)
    return outs


def _fold(x, axis, f):
    """A left fold along ``axis`` in float32 (each step rounded), as the interpreter's per-element path does."""
    x = np.moveaxis(x, axis, 0)
    acc = x[0].copy()
    for k in range(1, x.shape[0]):
        acc = f(acc, x[k]).astype(x.dtype)
    return acc


def reduce_over_slices(world):
    """The sliced reductions equal a float32 left fold bit for bit, and Triton's one-call-per-element path."""
    from triton.runtime import interpreter as I
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(8, 32, generator=g) * torch.logspace(-3, 6, 32)).float()
    got = _run_reduce(x)
    xn = x.numpy()
    rows = _fold(xn, 1, np.add)
    cols = _fold(xn, 0, np.add)
    mix = _fold(xn, 0, lambda a, b: np.where(a > b, a - b * np.float32(0.5), b + a))
    assert np.array_equal(got[0].numpy(), rows), (got[0], rows)
    assert np.array_equal(got[1].numpy(), cols), (got[1], cols)
    assert np.array_equal(got[2].numpy(), xn.astype(np.int32).max(1))
    assert np.array_equal(got[3].numpy(), mix), (got[3], mix)
    assert np.array_equal(got[4].numpy(), rows)
    # a pairwise (tree) sum rounds differently here: the fold order is what is checked
    assert not np.array_equal(xn.sum(1, dtype=np.float32), rows) or not np.array_equal(xn.sum(0), cols)
    sliced = I.ReduceOps.generic_reduce
    per_element = getattr(sliced, "interpreter_generic_reduce", None)
    assert per_element is not None, "the sliced reduction is not installed"
    I.ReduceOps.generic_reduce = per_element
    try:
        ref = _run_reduce(x)
    finally:
        I.ReduceOps.generic_reduce = sliced
    assert all(torch.equal(a, b) for a, b in zip(got, ref)), (got, ref)
    return True


@triton.jit
def _iadd(a, b):
    return b + a


@triton.jit
def _imin(a, b):
    return tl.minimum(b, a)


@ditron.jit
def int_reduce_kernel(x_ptr, w_ptr, sum1_ptr, sumall_ptr, max_ptr, min_ptr, M: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    x = tl.load(x_ptr + offs)                       # int32, sums that wrap
    w = tl.load(w_ptr + offs)                       # int64
    tl.store(sum1_ptr, tl.reduce(tl.load(x_ptr + tl.arange(0, N)), 0, _iadd))
    tl.store(sumall_ptr, tl.reduce(x, None, _iadd))
    tl.store(max_ptr + tl.arange(0, M)[:, None], tl.reduce(w, 1, _imax, keep_dims=True))
    tl.store(min_ptr + tl.arange(0, N), tl.reduce(w, 0, _imin))


def _run_int_reduce(x, w):
    M, N = x.shape
    outs = [torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), torch.zeros(M, dtype=torch.int64),
            torch.zeros(N, dtype=torch.int64)]
    int_reduce_kernel[(1,)](x, w, *outs, M=M, N=N)
    return outs


def integer_reduce(world):
    """Integer +, max, min reductions (one NumPy reduction): the wrapped sums and extremes of the per-element
    path, bit for bit."""
    from triton.runtime import interpreter as I
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-2 ** 31, 2 ** 31 - 1, (4, 16), generator=g, dtype=torch.int64).to(torch.int32)
    w = torch.randint(-2 ** 62, 2 ** 62, (4, 16), generator=g, dtype=torch.int64)
    got = _run_int_reduce(x, w)
    xn = x.numpy()
    assert got[0].item() == np.add.reduce(xn[0], dtype=np.int32)       # wrapped modulo 2**32
    assert got[0].item() != int(xn[0].astype(np.int64).sum()), "no wrap exercised"
    assert got[1].item() == np.add.reduce(xn.ravel(), dtype=np.int32)
    assert torch.equal(got[2], w.max(1).values) and torch.equal(got[3], w.min(0).values)
    sliced = I.ReduceOps.generic_reduce
    I.ReduceOps.generic_reduce = sliced.interpreter_generic_reduce
    try:
        ref = _run_int_reduce(x, w)
    finally:
        I.ReduceOps.generic_reduce = sliced
    assert all(torch.equal(a, b) for a, b in zip(got, ref)), (got, ref)
    return True


@ditron.jit
def scale_kernel(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.where(x > 0, x * s, tl.abs(x)) + tl.sum(x, 0) * 0
    tl.store(y_ptr + offs, y.to(tl.float32), mask=mask)


def launch_patch_replayed(world):
    """Launch after launch: the results, triton.language restored after each, the recorded patch replayed; a
    change to a patched module (a new attribute) makes the next launch patch afresh."""
    from ditron import _compat, _compat_interp
    names = ("add", "load", "where", "store", "arange", "maximum")

    def pristine():     # Triton's builtins themselves, not the interpreter's wrappers of them (lambdas)
        return all(tl.core.is_builtin(getattr(m, n)) for m in (tl, tl.core) for n in names if hasattr(m, n)) \
            and "__index__" not in vars(tl.core.tensor) and "__bool__" not in vars(tl.core.tensor)

    assert pristine(), "triton.language was left patched by an earlier launch"
    x = torch.randn(300)
    want = torch.where(x > 0, x * 2.5, x.abs())
    plans = []
    for i in range(4):
        y = torch.zeros(300)
        scale_kernel[(3,)](x, y, 300, 2.5, BLOCK=128)
        assert torch.equal(y, want), i
        assert pristine(), "triton.language was not restored"
        plans.append(_compat_interp._LANG_PLAN)
        assert plans[-1] is not None, "the launch's patch was not recorded"
        if i == 1:
            tl.core._ditron_test_marker = True          # the key sees it: the next launch patches afresh
    assert plans[0] is plans[1] and plans[1] is not plans[2] and plans[2] is plans[3], "replayed / re-recorded"
    del tl.core._ditron_test_marker
    return True


def tuple_type_names(world):
    """On Triton 3.6 the tuple types' names are made when read (as 3.9 does): the same strings as Triton's own
    constructor gives."""
    from ditron._compat import TRITON_VERSION
    x = torch.randn(300)
    y = torch.zeros(300)
    scale_kernel[(3,)](x, y, 300, 2.0, BLOCK=128)       # a launch installs the glue
    T = tl.core.tuple_type
    eager = getattr(T.__init__, "eager_init", None)
    if TRITON_VERSION[:2] == (3, 6):
        assert eager is not None and "name" in vars(T), "the lazy name is not installed on Triton 3.6"
    cases = [[tl.int32, tl.constexpr_type(3)], [tl.float32], [], [tl.block_type(tl.float16, [4, 8]), tl.int1]]
    checked = 0
    for types in cases:
        for fields in (None, ["a", "b"][:len(types)] or None):
            lazy = T(list(types), fields)
            assert isinstance(lazy.name, str) and lazy.name.startswith("[") and str(lazy) == lazy.name
            if eager is not None:
                ref = T.__new__(T)
                eager(ref, list(types), fields)
                assert "name" in vars(ref) and lazy.name == ref.name and lazy == ref, (lazy.name, ref.name)
                checked += 1
    return checked


@ditron.jit
def _named_builtin_kernel(out_ptr, X: tl.constexpr):
    tl.store(out_ptr, helpers_named_builtins.plus_one_by_name(X))


def named_builtin_helper(world):
    """A helper whose module imported ``to_tensor`` by name computes (``X + 1``) on every simulated rank."""
    out = torch.zeros(1, dtype=torch.int32, device=world.device)
    _named_builtin_kernel[(1,)](out, X=41 + world.rank)
    got = int(out.item())
    ditron.jit(helpers_named_builtins.store_by_name_kernel.fn)[(1,)](out, X=41 + world.rank)
    return got, int(out.item())
