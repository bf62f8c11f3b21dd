"""ditron.analysis: which kernel parameters must be symmetric tensors."""
import inspect
import os

import pytest
import triton
import triton.language as tl

import ditron
import ditron.language as dl
import ditron.language.libshmem_device as libshmem_device
from ditron.analysis import Use, check_symmetric_args, symmetric_params
from ditron.errors import DitronError
from ditron.language import shmem, symm_at
import kernels_for_tests as K

try:  # the porting example may live in the package (ditron.kernels) or in the repository's kernels/
    from ditron.kernels import copy_kernel, ring_pull_kernel
except ImportError:
    from kernels.porting_example import copy_kernel, ring_pull_kernel

HERE = __file__


def line_of(fn, needle, nth=0):
    """Absolute line of the ``nth`` source line of ``fn`` containing ``needle``."""
    f = getattr(fn, "fn", fn)
    lines, start = inspect.getsourcelines(f)
    hits = [start + i for i, text in enumerate(lines) if needle in text]
    return hits[nth]


def ops(result, param):
    return [u.op for u in result[param]]


# ---------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------

@ditron.jit
def k_direct(x_ptr, out_ptr, peer, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(dl.symm_at(x_ptr + offs, peer)))


@ditron.jit
def k_local_and_loop(buf, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    base = buf + tl.program_id(0) * BLOCK
    p = tl.multiple_of(base, 16)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in range(dl.num_ranks()):
        q = p if r > 0 else base
        acc += tl.load(dl.symm_at(q + offs, r))
        p += BLOCK
    tl.store(out + offs, acc)


@ditron.jit
def k_keywords(sig, data, peer):
    dl.symm_at(rank=peer, ptr=data)
    dl.notify(rank=peer, ptr=sig, signal=2, sig_op="add")


@ditron.jit
def k_put_signal(dst, src, sig, nbytes, pe):
    shmem.putmem_signal_nbi_block(dst, src, nbytes, sig, 1, shmem.NVSHMEM_SIGNAL_SET, pe)


@ditron.jit
def k_put_signal_kw(d, s, flag, nbytes, pe):
    shmem.putmem_signal(dst=d, src=s, nbytes=nbytes, sig_addr=flag, signal=1, sig_op="set", pe=pe)


@ditron.jit
def k_get(local, remote, nbytes, pe):
    shmem.getmem_block(local, remote, nbytes, pe)


@ditron.jit
def k_load_only(x, y, out, peer, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(y + offs)                   # y only feeds a load
    tl.store(out + offs, tl.load(dl.symm_at(x + offs, peer)) + v)


@ditron.jit
def k_index_from_load(x, idx_ptr, out, peer, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    idx = tl.load(idx_ptr + offs)           # data, not a pointer
    src = dl.symm_at(x + idx, peer)
    tl.store(out + offs, tl.load(src))


@triton.jit
def _peer_load(ptr, peer):
    return tl.load(dl.symm_at(ptr, peer))


@triton.jit
def _peer_ptr(ptr, peer):
    return dl.symm_at(ptr, peer)


@triton.jit
def _outer_helper(a, b, peer):
    return _peer_load(b, peer) + tl.load(a)


@ditron.jit
def k_helper(x, out, peer):
    tl.store(out, _peer_load(x, peer))


@ditron.jit
def k_helper_kw_and_nested(x, y, out, peer):
    tl.store(out, _outer_helper(b=x, a=y, peer=peer))


@ditron.jit
def k_helper_returns_pointer(x, out, peer):
    p = _peer_ptr(x, peer)                  # p is x's pointer: a helper that returns it propagates taint
    shmem.putmem(p, out, 4, peer)


@ditron.jit
def k_notify_only(sig, peer):
    dl.notify(sig, peer, signal=1, sig_op="set", comm_scope="intra_node")


@ditron.jit
def k_alias(dst, src, nbytes, pe):
    libshmem_device.putmem_nbi_block(dst, src, nbytes, pe)
    ditron.language.libshmem_device.signal_op(src, 1, "add", pe)


@ditron.jit
def k_bare(x, out, peer):
    tl.store(out, tl.load(symm_at(x, peer)))


@ditron.jit
def k_full_path(x, out, peer):
    tl.store(out, tl.load(ditron.language.symm_at(x, peer)))
    p = dl.shmem.remote_ptr(out, peer)
    tl.store(p, 1)


@ditron.jit
def k_no_dist(x, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n))


@ditron.jit
def k_wait_only(sig, x, out):
    tok = dl.wait(sig, 1, "sys", "acquire")
    tl.store(out, tl.load(dl.consume_token(x, tok)))


@ditron.jit
def k_flow(a, b, c, d, e, sig, peer, pe, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    pa, pb = a + offs, b                    # tuple unpacking
    pc = tl.where(offs < 4, c + offs, pb)    # both values of where
    if (pd := d.to(tl.pointer_type(tl.int32))) is not None:  # walrus, .to()
        pass
    blk = tl.make_block_ptr(base=e, shape=[BLOCK], strides=[1], offsets=[0], block_shape=[BLOCK], order=[0])
    blk = tl.advance(blk, [BLOCK])
    rp = dl.consume_token(shmem.remote_ptr(pa, pe), dl.wait(sig, 1))
    tl.store(dl.symm_at(pc, peer), tl.load(rp))
    shmem.signal_wait_until(pd, shmem.NVSHMEM_CMP_GE, 1)
    tl.store(dl.symm_at(blk, peer), tl.load(pb))


@ditron.jit
def k_tuple_param(ptrs, out, peer):
    tl.store(out, tl.load(dl.symm_at(ptrs[1], peer)))


@ditron.jit
def k_mc(x, out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mc = shmem.remote_mc_ptr(shmem.NVSHMEM_TEAM_WORLD, x)
    dl.multimem_st(mc + offs, dl.multimem_ld_reduce(mc + offs, op="sum"))
    tl.store(out + offs, tl.load(x + offs))


# ---------------------------------------------------------------------------
# symmetric_params
# ---------------------------------------------------------------------------

def test_direct_symm_at_with_offsets():
    r = symmetric_params(k_direct)
    assert list(r) == ["x_ptr"]
    (u,) = r["x_ptr"]
    assert isinstance(u, Use)
    assert (u.op, u.operand, u.file, u.line) == ("dl.symm_at", "ptr", HERE, line_of(k_direct, "dl.symm_at"))
    assert u.loc == f"test_analysis.py:{u.line}"
    assert u.describe() == f"dl.symm_at at test_analysis.py:{u.line}"


def test_through_locals_and_loop():
    r = symmetric_params(k_local_and_loop)
    assert list(r) == ["buf"]
    assert ops(r, "buf") == ["dl.symm_at"]


def test_keyword_arguments():
    r = symmetric_params(k_keywords)
    assert set(r) == {"sig", "data"}
    assert [(u.op, u.operand) for u in r["data"]] == [("dl.symm_at", "ptr")]
    assert [(u.op, u.operand) for u in r["sig"]] == [("dl.notify", "ptr")]


def test_putmem_signal_dst_and_sig_addr():
    for k, d, s, src in ((k_put_signal, "dst", "sig", "src"), (k_put_signal_kw, "d", "flag", "s")):
        r = symmetric_params(k)
        assert set(r) == {d, s}, k
        assert [u.operand for u in r[d]] == ["dst"]
        assert [u.operand for u in r[s]] == ["sig_addr"]
        assert src not in r


def test_getmem_src():
    r = symmetric_params(k_get)
    assert list(r) == ["remote"]
    assert [(u.op, u.operand) for u in r["remote"]] == [("shmem.getmem_block", "src")]


def test_param_only_loaded_is_not_reported():
    assert list(symmetric_params(k_load_only)) == ["x"]


def test_index_loaded_from_param_is_not_reported():
    assert list(symmetric_params(k_index_from_load)) == ["x"]


def test_helper_reported_for_callers_param():
    r = symmetric_params(k_helper)
    assert list(r) == ["x"]
    (u,) = r["x"]
    assert u.via == ("_peer_load",)
    assert u.line == line_of(_peer_load, "dl.symm_at")
    assert u.describe() == f"via _peer_load: dl.symm_at at test_analysis.py:{u.line}"
    assert list(symmetric_params(_peer_load)) == ["ptr"]


def test_nested_helpers_with_keywords():
    r = symmetric_params(k_helper_kw_and_nested)
    assert list(r) == ["x"]
    assert r["x"][0].via == ("_outer_helper", "_peer_load")


def test_helper_returning_pointer_propagates():
    r = symmetric_params(k_helper_returns_pointer)
    assert [(u.op, u.via) for u in r["x"]] == [("shmem.putmem", ()), ("dl.symm_at", ("_peer_ptr",))]
    assert "out" not in r


def test_notify():
    r = symmetric_params(k_notify_only)
    assert [(u.op, u.operand) for u in r["sig"]] == [("dl.notify", "ptr")]
    assert "peer" not in r


def test_libshmem_device_alias_and_module_paths():
    r = symmetric_params(k_alias)
    assert ops(r, "dst") == ["shmem.putmem_nbi_block"]
    assert ops(r, "src") == ["shmem.signal_op"]
    r = symmetric_params(k_full_path)
    assert ops(r, "x") == ["dl.symm_at"]
    assert ops(r, "out") == ["shmem.remote_ptr"]


def test_bare_imported_name():
    assert ops(symmetric_params(k_bare), "x") == ["dl.symm_at"]


def test_no_distributed_ops():
    assert symmetric_params(k_no_dist) == {}
    assert symmetric_params(copy_kernel) == {}
    assert symmetric_params(k_wait_only) == {}      # dl.wait needs no symmetric memory


def test_flow_constructs():
    r = symmetric_params(k_flow)
    assert set(r) == {"a", "b", "c", "d", "e"}
    assert ops(r, "a") == ["shmem.remote_ptr"]
    assert ops(r, "b") == ["dl.symm_at"]             # through tuple unpacking and tl.where's second value
    assert ops(r, "c") == ["dl.symm_at"]
    assert ops(r, "d") == ["shmem.signal_wait_until"]
    assert ops(r, "e") == ["dl.symm_at"]             # make_block_ptr(base=) + advance
    assert "sig" not in r


def test_tuple_param_and_multicast():
    assert ops(symmetric_params(k_tuple_param), "ptrs") == ["dl.symm_at"]
    r = symmetric_params(k_mc)
    assert [(u.op, u.operand) for u in r["x"]] == [("shmem.remote_mc_ptr", "ptr")]
    assert "out" not in r


def test_real_kernels():
    r = symmetric_params(ring_pull_kernel)
    assert list(r) == ["x_ptr"]                      # out_ptr: stores only; sig_ptr: dl.wait only
    assert r["x_ptr"][0].line == line_of(ring_pull_kernel, "dl.symm_at")
    assert symmetric_params(K.k_shmem_signal).keys() == {"dst", "sig"}
    assert symmetric_params(K.k_shmem_put_get).keys() == {"dst", "src"}
    assert symmetric_params(K.k_uses_helper).keys() == {"x"}
    assert symmetric_params(K.k_wait) == {}
    assert symmetric_params(K.k_plain) == {}


def test_cached_and_fresh_lists():
    a = symmetric_params(k_direct)
    a["x_ptr"].clear()
    b = symmetric_params(k_direct)
    assert len(b["x_ptr"]) == 1
    assert symmetric_params(k_direct.fn) == b        # the plain function works too


def test_robust_to_missing_source():
    ns = {}
    exec("def f(x, peer):\n    return x\n", {"dl": dl}, ns)  # no source file
    assert symmetric_params(ns["f"]) == {}
    assert symmetric_params(object()) == {}
    assert symmetric_params(None) == {}


# ---------------------------------------------------------------------------
# check_symmetric_args
# ---------------------------------------------------------------------------

class FakeTensor:
    def __init__(self, symmetric):
        self.symmetric = symmetric

    def data_ptr(self):
        return 0x1000


def is_sym(t):
    return t.symmetric


def test_check_raises_naming_the_argument():
    args = {"x_ptr": FakeTensor(False), "out_ptr": FakeTensor(False), "sig_ptr": FakeTensor(False), "n": 4}
    with pytest.raises(DitronError) as ei:
        check_symmetric_args(ring_pull_kernel, args, is_sym)
    msg = str(ei.value)
    line = line_of(ring_pull_kernel, "dl.symm_at")
    assert msg == (f"kernel 'ring_pull_kernel': argument 'x_ptr' reaches dl.symm_at at {os.path.basename(inspect.getsourcefile(ring_pull_kernel.fn))}:{line} "
                   "and must be a symmetric tensor (allocate it with ditron.symm_empty / ditron.symm_zeros), but the "
                   "tensor passed is not in the symmetric heap")
    assert ei.value.arg == "x_ptr"


def test_check_passes_when_symmetric_and_ignores_non_tensors():
    check_symmetric_args(ring_pull_kernel, {"x_ptr": FakeTensor(True), "out_ptr": FakeTensor(False),
                                            "sig_ptr": FakeTensor(False), "n": 4}, is_sym)
    check_symmetric_args(ring_pull_kernel, {"x_ptr": 1234, "out_ptr": None}, is_sym)
    check_symmetric_args(k_no_dist, {"x": FakeTensor(False), "out": FakeTensor(False)}, is_sym)
    # an int that got tainted through index arithmetic is never checked
    check_symmetric_args(k_keywords, {"sig": 7, "data": None, "peer": 1}, lambda t: False)


def test_check_via_helper_and_tuple_args():
    with pytest.raises(DitronError, match=r"argument 'x' reaches dl.symm_at at test_analysis.py:\d+ \(via _peer_load\)"):
        check_symmetric_args(k_helper, {"x": FakeTensor(False), "out": FakeTensor(False), "peer": 1}, is_sym)
    with pytest.raises(DitronError, match=r"argument 'ptrs\[1\]'"):
        check_symmetric_args(k_tuple_param, {"ptrs": (FakeTensor(True), FakeTensor(False))}, is_sym)


def test_kernel_defined_in_a_function_with_closure_helper():
    def make(prefix):
        @triton.jit
        def h(p, r):
            return dl.symm_at(p, r)

        @ditron.jit
        def k(a, b, r):
            tl.store(h(a, r), tl.load(b))
        return k

    r = symmetric_params(make(0))
    assert [(u.op, u.via) for u in r["a"]] == [("dl.symm_at", ("h",))]
    assert "b" not in r


def test_param_names_kept_per_function_and_code():
    """``_param_names`` (asked at every call site by the analysis and the lint) gives inspect's answer, kept per
    function while its code object stays; a new code object, a builtin, a callable object and an unhashable one
    get their own answer."""
    import functools

    from ditron import analysis as A

    def f(a, b, _private, *args, c=1, **kw):
        pass

    def g(x):
        pass

    class Call:
        def __call__(self, p, q=2):
            pass

    class Unhashable(Call):
        __hash__ = None

    assert A._param_names(f) == ("a", "b", "c") and A._param_names(f) == ("a", "b", "c")
    assert A._PARAMS[f][1] == ("a", "b", "c")
    f.__code__ = g.__code__                                # the same function object, another code
    assert A._param_names(f) == ("x",)
    assert A._param_names(len) == ("obj",)
    assert A._param_names(Call()) == ("p", "q") and A._param_names(Unhashable()) == ("p", "q")
    assert A._param_names(functools.partial(g, 1)) == ()
    for fn in (f, g, len, tl.program_id, getattr(tl.sum, "fn", tl.sum)):       # inspect's answer, twice
        sig = inspect.signature(fn)
        want = tuple(p.name for p in sig.parameters.values() if not p.name.startswith("_") and p.kind in
                     (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        assert A._param_names(fn) == want and A._param_names(fn) == want, fn
