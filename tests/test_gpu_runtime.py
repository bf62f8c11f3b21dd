"""The GPU runtime's CPU-testable parts: transport-specific compilation
(P2P lowering of shmem.*, bounded waits), the world descriptor, the kernel-load
hook, hang reports, backend selection and bring-up errors (with stand-ins for
the GPU, torch.distributed and nvshmem4py).  The GPU runs themselves are in
tests/test_dist_runtime.py and tests/gpu/ (tests/gpu/run.sh)."""
import re
import types

import pytest
import torch

import ditron
import kernels_for_tests as K
from conftest import compile_for
from ditron import _compat
from ditron.errors import DitronCompileError, DitronError
from ditron.lowering import cuda, cuda_bounded, cuda_p2p, devlib
from ditron.runtime import gpu, gpu_base
from ditron.runtime.heap import SymmetricHeap

SIG = {"dst": "*i8", "src": "*i8", "nbytes": "i64", "sig": "*u64", "pe": "i32", "out": "*u64"}


def _compile(kernel, sig, variant, constexprs=None):
    with cuda.compile_variant(*variant):
        return compile_for(kernel, "sm_90a", sig, constexprs)


# ---------------------------------------------------------------------------
# compilation per transport
# ---------------------------------------------------------------------------

def test_p2p_shmem_needs_no_nvshmem():
    for kernel, sig in ((K.k_shmem_put_get, {"dst": "*i8", "src": "*i8", "nbytes": "i64", "pe": "i32"}),
                        (K.k_shmem_signal, SIG), (K.k_shmem_sync, {}), (K.k_shmem_ids, {"out": "*i32"}),
                        (K.k_shmem_ptrs, {"x": "*fp32", "out": "*fp32", "pe": "i32"})):
        ck = _compile(kernel, sig, ("p2p", False))
        ptx = ck.asm["ptx"]
        assert ck.libraries == [], kernel.__name__
        assert "nvshmem" not in ptx, kernel.__name__
        assert "call" not in [ln.split()[0] for ln in ptx.splitlines() if ln.strip()], kernel.__name__


def test_p2p_lowering_instructions():
    ck = _compile(K.k_shmem_signal, SIG, ("p2p", False))
    ptx = ck.asm["ptx"]
    assert "st.release.sys.global.b64" in ptx            # putmem_signal / signal_op (set)
    assert "red.release.sys.global.add.u64" in ptx       # signal add
    assert "ld.acquire.sys.global.b64" in ptx            # signal_wait_until
    assert "ld.global.v4" in ptx and "st.global.v4" in ptx   # 16-byte data path
    assert "globaltimer" not in ptx                      # unbounded: no timer code at all
    ck = _compile(K.k_shmem_sync, {}, ("p2p", False))
    ptx = ck.asm["ptx"]
    assert "fence.sc.sys" in ptx and "bar.warp.sync" in ptx and "bar.sync" in ptx


def test_p2p_rejects_multicast():
    with pytest.raises(Exception) as e:
        _compile(K.k_shmem_mc, {"x": "*fp32", "out": "*fp32"}, ("p2p", False))
    assert "P2P transport" in str(e.value)


def test_bounded_waits_variant():
    sig = {"sig": "*i32", "x": "*fp32", "out": "*fp32", "n": "i32"}
    ce = {"BLOCK": 128, "SCOPE": "sys", "SEM": "acquire"}
    plain = _compile(K.k_wait, sig, ("nvshmem", False), ce).asm["ptx"]
    bounded = _compile(K.k_wait, sig, ("nvshmem", True), ce).asm["ptx"]
    assert "globaltimer" not in plain and "trap;" not in plain and "exit;" not in plain
    assert "globaltimer" in bounded and "ld.acquire.sys.global.b32" in bounded
    # no trap on expiry: the block votes (bar.red.or.pred) and leaves the kernel together (exit); the abort word
    # (sync area word SYNC_HANG_CLAIM) is polled while it spins.  The one trap left in the library is
    # ditron_hang's no-world path (LLVM lowers `unreachable` to trap too, after exit: never reached)
    assert "exit;" in bounded and "bar.red.or.pred" in bounded and "atom.relaxed.sys.global.cas.b64" in bounded
    no_loc = re.sub(r"\n\t\.loc\t[^\n]*", "", bounded)   # Triton 3.9 puts .loc lines inside asm blocks
    assert no_loc.count("// begin inline asm\n\ttrap;") == 1


def test_bounded_barrier_and_signal_wait_leave_without_trap():
    """The P2P device barrier (thread, warp, block) and signal_wait_until, bounded: past the timeout or once the
    abort word is set the group leaves the kernel -- a warp votes (vote.sync.any), a block votes
    (bar.red.or.pred) -- instead of trapping (a trap ends the CUDA context, under MPS every client's)."""
    sync = _compile(K.k_shmem_sync, {}, ("p2p", True)).asm["ptx"]
    assert "exit;" in sync and "bar.red.or.pred" in sync and "vote.sync.any.pred" in sync
    sig = _compile(K.k_shmem_signal, SIG, ("p2p", True)).asm["ptx"]
    assert "exit;" in sig and "globaltimer" in sig
    plain = _compile(K.k_shmem_sync, {}, ("p2p", False)).asm["ptx"]
    assert "exit;" not in plain and "globaltimer" not in plain


def test_bounded_signal_wait_until_on_nvshmem(nvshmem_bc):
    """signal_wait_until under bounded waits on NVSHMEM: our own loop (NVSHMEM's has no timeout)."""
    ck = _compile(K.k_shmem_signal, SIG, ("nvshmem", True))
    assert "globaltimer" in ck.asm["ptx"] and ck.libraries == ["libnvshmem_device"]


def test_poll_timeout_is_free_unbounded_and_leaves_bounded():
    """dl.poll_timeout emits nothing without DITRON_WAIT_TIMEOUT_S; bounded, a
    timer check that reaches the hang report, then the thread leaves the kernel
    (exit; no trap).  The zoo's LL polls
    (all_reduce ll, EP low-latency) are bounded the same way."""
    import importlib
    ar = importlib.import_module("ditron.kernels.all_reduce")
    ep_ll_kernels = importlib.import_module("ditron.kernels.ep_ll_kernels")
    sig = {"flags": "*i64", "out": "*i64", "flag": "i64"}
    plain = _compile(K.k_poll_bounded, sig, ("p2p", False), {"BLOCK": 64}).asm["ptx"]
    bounded = _compile(K.k_poll_bounded, sig, ("p2p", True), {"BLOCK": 64}).asm["ptx"]
    assert "trap;" not in plain and "exit;" not in plain and plain.count("%globaltimer") == 2   # the two dl.clock_ns
    assert "exit;" in bounded and bounded.count("%globaltimer") > 2
    ll_sig = {"x_ptr": "*bf16", "out_ptr": "*bf16", "ll_ptr": "*i64", "calls_ptr": "*i64", "n": "i32", "nwords": "i32",
              "ntiles": "i32", "slot": "i32"}
    ce = {"WORLD": 2, "EPW": 2, "BW": 256}
    # (symm_at traps for a rank off the node in both variants: count the extra report paths)
    plain, bounded = (_compile(ar.all_reduce_ll_kernel, ll_sig, ("p2p", b), ce).asm["ptx"] for b in (False, True))
    assert "exit;" in bounded and "exit;" not in plain and "ditron_hang" not in plain
    comb_sig = {n: t for n, t in zip(
        ("y_ptr", "out_ptr", "peid_ptr", "pslot_ptr", "w_ptr", "lrc_ptr", "lcomb_ptr", "lstage_ptr", "calls_ptr",
         "trace_ptr", "T", "TK", "H", "HW", "Eloc", "cap"),
        ("*bf16", "*bf16", "*i64", "*i64", "*fp32", "*i64", "*i64", "*i64", "*i64", "*i64") + ("i32",) * 6)}
    # small tiles and top-2 (KT: the pairs per token, unrolled): the polls are the same code at any size, and the
    # top-8 / 256-word tiles of the GPU took ~28 CPU-s for the two compiles (test_ep.py compiles that size)
    plain, bounded = (_compile(ep_ll_kernels.ep_ll_combine_kernel, comb_sig, ("p2p", b),
                               {"MULTI_NODE": False, "PEERS": True, "EPW": 2, "WP": 2, "ELP": 16, "BR": 2, "BW": 32,
                                "RB": 2, "KT": 2, "RW": 32, "TRACE": False}).asm["ptx"]
                      for b in (False, True))
    assert "exit;" in bounded and "exit;" not in plain


def test_poll_hang_report_names_the_polling_loop():
    rec = {"rank": 1, "ctaid_x": 3, "ctaid_y": 0, "ctaid_z": 0, "tid": 5, "addr": 0x1000, "expected": 7,
           "observed": 6, "elapsed_ns": 2_000_000_000, "kind": 5, "cmp": 0, "timeout_ns": 1_000_000_000}
    text = gpu_base.format_hang(rec, None)
    assert "polling loop (dl.poll_timeout)" in text and "expected value == 7, observed 6" in text
    assert "rank 1" in text and "program (3, 0, 0)" in text
    assert "no trap" in text and "launches no more kernels" in text


def test_expired_wait_is_raised_by_the_host(monkeypatch):
    """A kernel stopped by a bounded wait returns normally (no trap); the record in the pinned debug buffer is the
    only sign: the next launch on the world, and gpu.check_hang(), raise DitronHangError with the report (rank,
    program, signal, expected, observed).  A fake transport (no GPU) holds the record."""
    import numpy as np
    from ditron.errors import DitronHangError
    monkeypatch.setattr(gpu_base, "_LAST_REPORT", None)
    monkeypatch.setattr(gpu_base, "_LAST_ENTRY", None)
    t = gpu_base.GpuTransport.__new__(gpu_base.GpuTransport)
    t.rank, t.wait_timeout_ns, t.heap, t.peer_bases, t.node, t.local_world_size = 2, 2 * 10**9, None, [], 0, 1
    t._debug_np = np.zeros(cuda_bounded.HANG_RECORD_WORDS, dtype=np.int64)
    monkeypatch.setattr(gpu_base, "_ACTIVE", t)
    gpu.check_hang()                                      # no record: nothing to raise
    rec = {"rank": 2, "ctaid_x": 1, "ctaid_y": 0, "ctaid_z": 0, "tid": 0, "addr": 0x1000, "expected": 1,
           "observed": 0, "elapsed_ns": 2_000_000_000, "kind": 1, "cmp": 0, "timeout_ns": 2 * 10**9}
    for k, v in rec.items():
        t._debug_np[cuda_bounded.HANG_WORDS[k]] = v
    t._debug_np[cuda_bounded.HANG_WORDS["valid"]] = cuda_bounded.HANG_VALID
    with pytest.raises(DitronHangError) as e:
        t.before_launch(types.SimpleNamespace(__name__="k_next"), ())
    msg = str(e.value)
    assert "kernel k_next not launched" in msg and "bounded wait expired on rank 2" in msg
    assert "program (1, 0, 0)" in msg and "dl.wait" in msg and "expected value == 1, observed 0" in msg
    assert e.value.report == [{"rank": 2, "program": (1, 0, 0), "primitive": "dl.wait", "where": "device",
                               "signal": "address 0x1000 (not in a symmetric heap)", "expected": "== 1",
                               "observed": 0}]
    with pytest.raises(DitronHangError, match="bounded wait expired on rank 2"):
        gpu.check_hang()


def test_variants_have_distinct_libraries():
    paths = {cuda.variant_library(t, b).path() for t in cuda.TRANSPORTS for b in (False, True)}
    assert len(paths) == 4
    assert cuda.variant_library() is cuda.LIB
    for t in cuda.TRANSPORTS:
        for b in (False, True):
            lib = cuda.variant_library(t, b)
            assert lib.text().replace(lib.header, "") == cuda.LIB.text().replace(cuda.LIB.header, "") or \
                lib.text().count("define ") == cuda.LIB.text().count("define ")


def test_variant_from_world(monkeypatch):
    from ditron.runtime import world as W
    fake = types.SimpleNamespace(backend="p2p", transport=types.SimpleNamespace(compile_transport="p2p",
                                                                                 wait_timeout_ns=2_000_000_000))
    monkeypatch.setattr(W, "_WORLD", fake)
    assert cuda.current_variant() == ("p2p", True)
    fake.transport.wait_timeout_ns = 0
    fake.backend, fake.transport.compile_transport = "nvshmem", "nvshmem"
    assert cuda.current_variant() == ("nvshmem", False)
    with cuda.compile_variant("p2p", True):
        assert cuda.current_variant() == ("p2p", True)
    monkeypatch.setattr(W, "_WORLD", None)
    assert cuda.current_variant() == ("nvshmem", False)


# ---------------------------------------------------------------------------
# world descriptor, hang report
# ---------------------------------------------------------------------------

class _FakeTransport(gpu_base.GpuTransport):
    name = "p2p"

    def __init__(self):
        super().__init__((5, 8, 1, 4, 2, 1), torch.device("cpu"), 1 << 20, 3_000_000_000)
        buf = torch.zeros(1 << 20, dtype=torch.uint8)
        self.heap = SymmetricHeap(buf, 5, "fake")
        self.sync = self.heap.alloc((512,), torch.int64, name="ditron.sync")
        base = self.heap.base
        self.peer_bases = [base - (1 << 30), base, base + (3 << 30), base + (5 << 30)]
        self.debug = torch.zeros(16, dtype=torch.int64)


def test_descriptor_layout():
    t = _FakeTransport()
    w = t.descriptor()
    f = devlib.WORLD_FIELDS
    assert len(w) == devlib.WORLD_WORDS
    assert w[f["magic"]] == devlib.WORLD_MAGIC
    assert [w[f[k]] for k in ("rank", "world_size", "local_rank", "local_world_size", "node", "nnodes")] == \
        [5, 8, 1, 4, 1, 2]
    assert w[f["flags"]] == gpu_base.FLAG_P2P | gpu_base.FLAG_BOUNDED
    assert w[f["wait_timeout_ns"]] == 3_000_000_000
    assert w[f["heap_size"]] == 1 << 20
    assert w[cuda_p2p.SYNC_AREA_WORD] == t.sync.data_ptr()
    assert w[devlib.WORLD_HEAP_DELTAS:devlib.WORLD_HEAP_DELTAS + 4] == [-(1 << 18), 0, 3 << 18, 5 << 18]


def test_hang_report_names_everything():
    t = _FakeTransport()
    flags = t.heap.alloc((4,), torch.int32, name="flags")
    peer_addr = t.peer_bases[2] + (flags.data_ptr() - t.heap.base) + 8
    rec = {"valid": cuda_bounded.HANG_VALID, "rank": 5, "ctaid_x": 3, "ctaid_y": 0, "ctaid_z": 0, "tid": 17,
           "addr": flags.data_ptr() + 4, "expected": 1, "observed": 0, "elapsed_ns": 3_000_100_000, "kind": 1,
           "cmp": 0, "timeout_ns": 3_000_000_000}
    text = gpu_base.format_hang(rec, t)
    for want in ("rank 5", "program (3, 0, 0)", "thread 17", "dl.wait", "'flags'", "element offset 1",
                 "expected value == 1", "observed 0", "3.000 s", "DITRON_WAIT_TIMEOUT_S=3"):
        assert want in text, (want, text)
    rec.update(addr=peer_addr, kind=2, cmp=5, expected=7, observed=6)
    text = gpu_base.format_hang(rec, t)
    assert "shmem.signal_wait_until" in text and "rank 6's copy of" in text and "element offset 2" in text
    assert "expected value >= 7" in text


def test_watchdog_reads_debug_buffer(monkeypatch):
    t = _FakeTransport()
    monkeypatch.setattr(gpu_base, "_LAST_REPORT", None)
    t._debug_np = t.debug.numpy()
    assert t._check_debug() is None
    d = t._debug_np
    for k, v in {"rank": 5, "addr": t.sync.data_ptr(), "expected": 4, "observed": 2, "kind": 3, "cmp": 5,
                 "timeout_ns": 10**9, "elapsed_ns": 10**9 + 5}.items():
        d[cuda_bounded.HANG_WORDS[k]] = v
    d[cuda_bounded.HANG_WORDS["valid"]] = cuda_bounded.HANG_VALID
    text = t._check_debug()
    assert text and "shmem.barrier_all" in text and "'ditron.sync'" in text
    assert gpu_base.hang_report() == text


# ---------------------------------------------------------------------------
# kernel-load hook
# ---------------------------------------------------------------------------

def test_hooks_chain():
    calls = []

    def a(*args):
        calls.append(("a", args))

    _compat.add_kernel_load_hook(a)
    try:
        _compat.triton.knobs.runtime.kernel_load_end_hook(1, 2, "k", {}, "h")
        assert calls == [("a", (1, 2, "k", {}, "h"))]
    finally:
        _compat.remove_kernel_load_hook(a)
    _compat.triton.knobs.runtime.kernel_load_end_hook(1, 2, "k", {}, "h")
    assert len(calls) == 1


def test_metadata_extern_libs(tmp_path):
    import json
    p = tmp_path / "k.json"
    p.write_text(json.dumps({"extern_libs": [["ditron", "/x.ll"], ["libnvshmem_device", "/y.bc"]]}))
    group = {"k.json": str(p), "k.cubin": str(tmp_path / "k.cubin")}
    assert _compat.metadata_extern_libs(group) == [("ditron", "/x.ll"), ("libnvshmem_device", "/y.bc")]
    assert gpu_base._links_nvshmem(group)


def test_kernel_load_writes_descriptor(monkeypatch, tmp_path):
    import json
    from ditron.runtime import gpu_driver
    written = {}
    monkeypatch.setattr(gpu_driver, "module_global", lambda m, s: (0x7000 + m, 8 * devlib.WORLD_WORDS)
                        if m != 99 else None)
    monkeypatch.setattr(gpu_driver, "write_words", lambda d, w, size: written.__setitem__(d, list(w)))
    monkeypatch.setattr(gpu_base, "_current_device_index", lambda: 0)
    monkeypatch.setattr(gpu_base, "_MODULES", {})
    t = _FakeTransport()
    monkeypatch.setattr(gpu_base, "_ACTIVE", t)
    plain = tmp_path / "a.json"
    plain.write_text(json.dumps({"extern_libs": [["ditron", "/x.ll"]]}))
    gpu_base._on_kernel_load(5, 6, "k", {"a.json": str(plain)})
    assert written[0x7005][0] == devlib.WORLD_MAGIC and written[0x7005][1] == 5
    gpu_base._on_kernel_load(99, 6, "plain_triton_kernel", {})          # no descriptor, no NVSHMEM: ignored
    assert [m[0] for m in gpu_base.loaded_modules()] == ["k"]
    nv = tmp_path / "b.json"
    nv.write_text(json.dumps({"extern_libs": [["ditron", "/x.ll"], ["libnvshmem_device", "/y.bc"]]}))
    with pytest.raises(DitronError, match="through NVSHMEM, but the world uses the p2p transport"):
        gpu_base._on_kernel_load(7, 8, "kshmem", {"b.json": str(nv)})
    monkeypatch.setattr(gpu_base, "_ACTIVE", None)
    gpu_base._on_kernel_load(10, 11, "k2", {"a.json": str(plain)})
    assert written[0x700A] == [0] * devlib.WORLD_WORDS             # no world: magic 0


# ---------------------------------------------------------------------------
# bring-up decisions and errors
# ---------------------------------------------------------------------------

def test_nvshmem_requested_but_unusable(monkeypatch):
    monkeypatch.setattr(gpu, "nvshmem_status", lambda: (False, "nvshmem4py is not installed (pip install "
                                                               "nvshmem4py-cu13, or -cu12 for CUDA 12)"))
    monkeypatch.setattr(gpu, "_all_gather", lambda obj: [obj] * 4)
    with pytest.raises(DitronError, match="backend='nvshmem' requested but NVSHMEM is not usable on rank 0: "
                                          "nvshmem4py is not installed"):
        gpu._choose_backend("nvshmem", 1)
    assert gpu._choose_backend("auto", 1) == "p2p"
    assert gpu._choose_backend("p2p", 1) == "p2p"
    with pytest.raises(DitronError, match="spans 2 nodes"):
        gpu._choose_backend("auto", 2)


def test_auto_prefers_nvshmem(monkeypatch):
    monkeypatch.setattr(gpu, "nvshmem_status", lambda: (True, "ok"))
    monkeypatch.setattr(gpu, "_all_gather", lambda obj: [obj] * 4)
    import sys
    monkeypatch.setitem(sys.modules, "nvshmem", types.ModuleType("nvshmem"))
    monkeypatch.setitem(sys.modules, "nvshmem.core", types.ModuleType("nvshmem.core"))
    monkeypatch.setitem(sys.modules, "nvshmem.bindings", types.ModuleType("nvshmem.bindings"))
    assert gpu._choose_backend("auto", 1) == "nvshmem"
    # one rank without NVSHMEM: everybody falls back to P2P
    monkeypatch.setattr(gpu, "_all_gather", lambda obj: [obj, (False, "missing"), obj, obj])
    assert gpu._choose_backend("auto", 1) == "p2p"


def test_world_size_mismatch(monkeypatch):
    import torch.distributed as tdist
    monkeypatch.setattr(tdist, "is_initialized", lambda: True)
    monkeypatch.setattr(tdist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(tdist, "get_rank", lambda group=None: 1)
    with pytest.raises(DitronError, match="world-size mismatch: torch.distributed has rank 1 of 2, but RANK=1 "
                                          "WORLD_SIZE=4"):
        gpu._ensure_process_group(torch, 1, 4, None)


def test_device_selection_errors():
    fake = types.SimpleNamespace(device=torch.device, cuda=types.SimpleNamespace(device_count=lambda: 2))
    with pytest.raises(DitronError, match="LOCAL_RANK=3 needs GPU 3, but only 2 GPU"):
        gpu._select_device(fake, None, 3, 4)
    with pytest.raises(DitronError, match="not a CUDA device"):
        gpu._select_device(fake, "cpu", 0, 1)
    with pytest.raises(DitronError, match="does not exist"):
        gpu._select_device(fake, 5, 0, 1)
    assert gpu._select_device(fake, None, 1, 2) == torch.device("cuda", 1)


def test_duplicate_gpu_is_wrong_device(monkeypatch):
    fake_cuda = types.SimpleNamespace(get_device_properties=lambda d: types.SimpleNamespace(uuid="GPU-same"),
                                      can_device_access_peer=lambda a, b: True)
    fake = types.SimpleNamespace(cuda=fake_cuda)
    me = lambda r: {"rank": r, "host": "h", "node": 0, "local_rank": r, "device": 0, "uuid": "GPU-same", "lws": 2,  # noqa: E731
                    "per_gpu": 1}
    monkeypatch.setattr(gpu, "_all_gather", lambda obj: [me(0), me(1)])
    with pytest.raises(DitronError, match="wrong device: ranks 0 and 1 both use GPU 0.*DITRON_RANKS_PER_GPU=2"):
        gpu._check_job(fake, (0, 2, 0, 2, 1, 0), torch.device("cuda", 0))


def test_wait_timeout_env(monkeypatch):
    monkeypatch.setenv("DITRON_WAIT_TIMEOUT_S", "2.5")
    assert gpu_base.wait_timeout_ns() == 2_500_000_000
    monkeypatch.setenv("DITRON_WAIT_TIMEOUT_S", "soon")
    with pytest.raises(DitronError, match="not a number"):
        gpu_base.wait_timeout_ns()
    monkeypatch.delenv("DITRON_WAIT_TIMEOUT_S")
    assert gpu_base.wait_timeout_ns() == 0


def test_multicast_off_by_default():
    import os
    for k, v in gpu_base.MULTICAST_OFF.items():
        assert os.environ.get(k) == v


def test_doctor_reports_runtime(capsys):
    from ditron.cli import main
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "runtime       auto -> " in out
