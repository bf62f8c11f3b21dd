"""What a GPU executes for each synchronisation rule, pinned structurally.

The CUDA rules emit inline PTX: the blocks are cut out of a compiled kernel's
PTX and *executed* for one thread on a tiny PTX machine (tests/sync_blocks.py)
against scripted memory, so the compare, the branch direction, the loop bounds
and the order of loads, fences, barriers and release stores are all checked,
not the presence of a string.  The P2P / bounded-wait CUDA functions and the
AMD functions live in the ditron device libraries (LLVM IR): their blocks are
parsed and their event sequences compared.  The NVSHMEM constants are pinned to
the NVSHMEM 3.4.5 headers (rocSHMEM's are pinned next to the rocSHMEM table).
"""
import os
import re

import pytest
import triton.language as tl

import ditron
import ditron.language as dl
from ditron.language import shmem
from ditron.lowering import cuda, cuda_p2p, hip, shmem_table
from sync_blocks import PtxHang, ir_events, llvm_function, ptx_blocks, run_ptx


@ditron.jit
def k_sync_all(sig, sig64, slots, x, out, peer, n):
    tok = dl.wait(sig, n, "sys", "acquire", waitValue=7)
    tok2 = dl.wait(sig64, n, "gpu", "relaxed", waitValue=5)
    tok3 = dl.wait_deps(slots, n, 3)
    v = tl.load(dl.consume_token(dl.consume_token(dl.consume_token(x, tok), tok2), tok3))
    tl.store(out, v)
    dl.notify(sig, peer, signal=3, sig_op="set", comm_scope="intra_node")
    dl.notify(sig64, peer, signal=2, sig_op="add", comm_scope="gpu")
    dl.release_tile(slots, 4)
    dl.fence("sc", "sys")
    dl.fence("acq_rel", "gpu")


SIG = {"sig": "*i32", "sig64": "*i64", "slots": "*i32", "x": "*fp32", "out": "*fp32", "peer": "i32", "n": "i32"}


@pytest.fixture(scope="module")
def cuda_blocks():
    with cuda.compile_variant("nvshmem", bounded=False):
        ck = ditron.compile(k_sync_all, target="sm_90a", signature=SIG, constexprs={})
    ptx = ck.asm["ptx"]
    blocks = ptx_blocks(ptx)
    sync = [b for b in blocks if any(s.startswith(("bar.sync", "fence.")) for s in b)]
    # program order: wait(acquire, sys, i32), wait(relaxed, gpu, i64), wait_deps, notify(set), notify(add),
    # release_tile, fence(sc, sys), fence(acq_rel, gpu)
    assert len(sync) == 8, sync
    return dict(zip(["wait32", "wait64", "deps", "notify_set", "notify_add", "release", "fence_sc", "fence_ar"],
                    sync)), ptx


def _roles(block):
    """The outer registers of a polling block: the word count (bound check before
    the loop), the base pointer (``add.u64 %a, PTR, %off``) and the awaited value
    (operand 2 of the compare right after the poll)."""
    n = next(s for s in block if s.startswith("setp.ge.u32")).split(",")[2].strip()
    ptr = next(s for s in block if s.startswith("add.u64 %a,")).split(",")[1].strip()
    ld = next(i for i, s in enumerate(block) if s.startswith("ld."))
    cmp = next(s for s in block[ld:] if s.startswith("setp."))
    return n, ptr, cmp.split(",")[2].strip()


def _wait_run(block, n, want, words, *, tid=0, ntid=1, stride=4):
    rn, rp, rw = _roles(block)
    mem = {1000 + stride * i: list(seq) for i, seq in enumerate(words)}
    return run_ptx(block, {rn: n, rp: 1000, rw: want}, mem, tid=tid, ntid=ntid)


@pytest.mark.parametrize("name,sem,scope,stride", [("wait32", "acquire", "sys", 4), ("wait64", "relaxed", "gpu", 8)])
def test_cuda_wait_spins_until_equal_then_joins_the_cta(cuda_blocks, name, sem, scope, stride):
    block = cuda_blocks[0][name]
    # the word reads below, above, then exactly the awaited value: three polls, then the CTA barrier
    trace = _wait_run(block, 1, 7, [[6, 8, 7]], stride=stride)
    assert trace == [("ld", sem, scope, 1000)] * 3 + [("bar",)], trace
    # dl.wait is equality: a word already past the value never satisfies it (the simulator agrees:
    # test_sim_semantics.py::test_wait_value_exceeded_hangs)
    with pytest.raises(PtxHang):
        _wait_run(block, 1, 7, [[8]], stride=stride)
    # words tid, tid + ntid, ... below n: thread 0 of 2 polls words 0 and 2 of 3, thread 1 word 1
    t0 = _wait_run(block, 3, 7, [[7]] * 3, tid=0, ntid=2, stride=stride)
    t1 = _wait_run(block, 3, 7, [[7]] * 3, tid=1, ntid=2, stride=stride)
    assert [e[3] for e in t0 if e[0] == "ld"] == [1000, 1000 + 2 * stride]
    assert [e[3] for e in t1 if e[0] == "ld"] == [1000 + stride]
    # no words: no poll, the barrier only
    assert _wait_run(block, 0, 7, [[0]], stride=stride) == [("bar",)]


def test_cuda_wait_deps_is_signed_at_least_then_fence_then_barrier(cuda_blocks):
    block = cuda_blocks[0]["deps"]
    # slot below the epoch, then past it: ready (>= epoch); relaxed polls, then one acquire-side fence, then bar
    trace = _wait_run(block, 1, 3, [[2, 5]])
    assert trace == [("ld", "relaxed", "gpu", 1000)] * 2 + [("fence", "acq_rel", "gpu"), ("bar",)], trace
    assert _wait_run(block, 1, 3, [[3]]) == [("ld", "relaxed", "gpu", 1000), ("fence", "acq_rel", "gpu"), ("bar",)]
    # signed: a slot holding -1 (0xFFFFFFFF) is not ready for epoch 3
    trace = _wait_run(block, 1, 3, [[0xFFFFFFFF, 3]])
    assert sum(e[0] == "ld" for e in trace) == 2
    # a thread without a slot neither polls nor fences
    assert _wait_run(block, 1, 3, [[3]], tid=1, ntid=2) == [("bar",)]
    t1 = _wait_run(block, 2, 3, [[3], [3]], tid=1, ntid=2)
    assert t1 == [("ld", "relaxed", "gpu", 1004), ("fence", "acq_rel", "gpu"), ("bar",)]


def test_cuda_wait_deps_polls_four_slots_per_round_trip(cuda_blocks):
    block = cuda_blocks[0]["deps"]
    ld = lambda trace: [e[3] for e in trace if e[0] == "ld"]
    # thread 0 of 2 owns slots 0, 2, 4, 6, 8 of 9: it loads 0, 2, 4, 6 back to back (one round trip), then 8
    assert ld(_wait_run(block, 9, 3, [[3]] * 9, tid=0, ntid=2)) == [1000, 1008, 1016, 1024, 1032]
    # a group with a slot not ready yet is polled again as a whole, and only then does the thread move on
    trace = _wait_run(block, 9, 3, [[3], [3], [3], [3], [2, 3]] + [[3]] * 4, tid=0, ntid=2)
    assert ld(trace) == [1000, 1008, 1016, 1024] * 2 + [1032], trace
    assert trace[-2:] == [("fence", "acq_rel", "gpu"), ("bar",)]
    # a slot past the thread's last (n) is never loaded: thread 1 owns slots 1, 3 of 4
    assert ld(_wait_run(block, 4, 3, [[3]] * 4, tid=1, ntid=2)) == [1004, 1012]


def _signal_roles(block):
    instr = next(s for s in block if s.startswith("@") and (" st." in s or " red." in s))
    m = re.search(r"\[(%\w+)\], (%\w+)", instr)
    return m.group(1), m.group(2)


@pytest.mark.parametrize("name,kind,scope,value", [("notify_set", "st", "sys", 3), ("notify_add", "red", "gpu", 2),
                                                   ("release", "st", "gpu", 4)])
def test_cuda_signal_is_barrier_then_one_release_by_thread_0(cuda_blocks, name, kind, scope, value):
    block = cuda_blocks[0][name]
    ra, rv = _signal_roles(block)
    t0 = run_ptx(block, {ra: 4096, rv: value}, {}, tid=0, ntid=128)
    assert t0 == [("bar",), (kind, "release", scope, 4096, value)], t0
    for tid in (1, 127):
        assert run_ptx(block, {ra: 4096, rv: value}, {}, tid=tid, ntid=128) == [("bar",)]


def test_cuda_fences(cuda_blocks):
    blocks = cuda_blocks[0]
    assert run_ptx(blocks["fence_sc"], {}, {}) == [("fence", "sc", "sys")]
    assert run_ptx(blocks["fence_ar"], {}, {}) == [("fence", "acq_rel", "gpu")]


def test_cuda_wait_guards_the_data_load(cuda_blocks):
    """consume_token makes the data load depend on every wait: it comes after the three polling blocks."""
    ptx = cuda_blocks[1]
    order = [b for b in ptx_blocks(ptx) if any(s.startswith(("bar.sync", "ld.global")) for s in b)]
    first_data = next(i for i, b in enumerate(order) if any(s.startswith("ld.global.b32") for s in b))
    assert first_data == 3, [b[:3] for b in order]


# ---------------------------------------------------------------------------
# device libraries (LLVM IR): CUDA bounded waits and P2P transport
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def p2p_text():
    return cuda.variant_library("p2p", bounded=True).text()


def _asm(ev):
    return ev[1] if ev[0] == "asm" else None


@pytest.mark.parametrize("sem,scope,bits", [("acquire", "sys", 32), ("relaxed", "gpu", 64)])
def test_cuda_bounded_wait_polls_until_equal(p2p_text, sem, scope, bits):
    f = llvm_function(p2p_text, f"ditron_wait_bounded_{sem}_{scope}_i{bits}")
    spin = ir_events(f["spin"])
    assert spin[0] == ("asm", f"ld.{sem}.{scope}.global.b{bits} $0, [$1];")
    assert spin[1] == ("icmp", "eq", f"i{bits}", "%v", "%val", "%ok")
    assert spin[2] == ("br", "%ok", "adv", "check")          # equal: next word; else: timer check, poll again
    # expired: report (fail), else the abort word: set (another wait of the rank reported) -> out, else poll again
    assert ir_events(f["check"])[-1] == ("br", "%c.exp", "fail", "chk.ab")
    assert ir_events(f["chk.ab"]) == [("call", "ditron_aborted"), ("br", "%ab", "done", "spin")]
    assert ir_events(f["next"])[:2] == [("icmp", "ult", "i32", "%i", "%n", "%more"), ("br", "%more", "poll", "done")]
    # the closing barrier is a block vote: any thread out -> the whole block leaves the kernel (no trap)
    assert ir_events(f["done"]) == [("call", "ditron_block_any"), ("icmp", "ne", "i32", "%any", "0", "%stop"),
                                    ("br", "%stop", "leave", "out")]
    assert ir_events(f["leave"]) == [("call", "ditron_exit")]
    assert any("mul i64 %iw, " + str(bits // 8) in s for s in f["poll"])


def test_cuda_bounded_wait_deps_is_signed_at_least(p2p_text):
    f = llvm_function(p2p_text, "ditron_wait_deps_bounded_i32")
    spin = ir_events(f["spin"])
    assert spin[0] == ("asm", "ld.acquire.gpu.global.b32 $0, [$1];")
    assert spin[1] == ("icmp", "sge", "i32", "%v", "%val", "%ok")
    assert spin[2] == ("br", "%ok", "adv", "check")
    assert ir_events(f["done"])[0] == ("call", "ditron_block_any")


def test_cuda_hang_report_claims_the_abort_word_and_never_traps_with_a_world(p2p_text):
    """The report does not trap (a trap ends the CUDA context, under MPS every client's): the first expired thread
    claims the abort word (CAS 0 -> 1 on the sync area's SYNC_HANG_CLAIM word) and writes the record, the others
    return; only without a world (no debug buffer or sync area) is there nothing to report to, and it traps.  Every
    bounded wait reads the same word (ditron_aborted); the per-thread ones leave at once (exit), the block-wide
    ones after a block vote."""
    claim = f"add i64 %sync, {8 * cuda_p2p.SYNC_HANG_CLAIM}"
    hang = llvm_function(p2p_text, "ditron_hang")
    assert ir_events(hang["claim"]) == [("asm", "atom.relaxed.sys.global.cas.b64 $0, [$1], 0, 1;"),
                                        ("icmp", "eq", "i64", "%old", "0", "%first"), ("br", "%first", "write", "done")]
    assert ir_events(hang["done"]) == [] and ir_events(hang["die"]) == [("asm", "trap;")]
    assert any(claim in line for line in hang["claim"])
    assert sum(e == ("asm", "trap;") for b in hang.values() for e in ir_events(b)) == 1
    aborted = llvm_function(p2p_text, "ditron_aborted")
    assert ir_events(aborted["rd"])[0] == ("asm", "ld.relaxed.sys.global.b64 $0, [$1];")
    assert any(claim in line for line in aborted["rd"])
    for fn in ("ditron_poll_timeout", "ditron_signal_wait_until_bounded"):
        f = llvm_function(p2p_text, fn)
        assert ir_events(f["leave"]) == [("call", "ditron_exit")] and ir_events(f["fail"]) == [
            ("call", "ditron_hang"), ("br", "leave")]
    assert ir_events(llvm_function(p2p_text, "ditron_poll_timeout")["entry"]) == [
        ("call", "ditron_aborted"), ("br", "%ab", "leave", "test")]      # every element, pending or not
    for coop, vote in (("block", "ditron_block_any"), ("warp", "ditron_warp_any")):
        f = llvm_function(p2p_text, f"ditron_p2p_barrier_{coop}_bounded")
        assert ir_events(f["done"])[0] == ("call", vote) and ir_events(f["leave"]) == [("call", "ditron_exit")]


def test_p2p_signal_op_values_and_release(p2p_text):
    f = llvm_function(p2p_text, "ditron_p2p_signal")
    assert ir_events(f["entry"]) == [("icmp", "eq", "i32", "%op", str(cuda_p2p.P2P_SIGNAL["add"]), "%isadd"),
                                     ("br", "%isadd", "add", "set")]
    assert _asm(ir_events(f["set"])[0]) == "st.release.sys.global.b64 [$0], $1;"
    assert _asm(ir_events(f["add"])[0]) == "red.release.sys.global.add.u64 [$0], $1;"
    assert cuda_p2p.P2P_SIGNAL == {"set": 0, "add": 1}


@pytest.mark.parametrize("coop", ["thread", "warp", "block"])
def test_p2p_putmem_signal_copies_joins_then_signals(p2p_text, coop):
    f = llvm_function(p2p_text, f"ditron_p2p_putmem_signal_{coop}")
    ev = [e for e in ir_events(f["entry"]) if e[0] in ("barrier", "call", "br")]
    names = [e[1] if e[0] == "call" else e[0] for e in ev]
    names = [n for n in names if not n.startswith("llvm.nvvm.read")]
    want = {"thread": ["ditron_p2p_remote", "ditron_p2p_copy", "br"],
            "warp": ["llvm.nvvm.bar.warp.sync", "ditron_p2p_remote", "ditron_p2p_copy", "llvm.nvvm.bar.warp.sync",
                     "br"],
            "block": ["barrier", "ditron_p2p_remote", "ditron_p2p_copy", "barrier", "br"]}[coop]
    assert names == want, names
    assert ev[-1] == ("br", "%lead", "do.sig", "done")
    assert [e[1] for e in ir_events(f["do.sig"]) if e[0] == "call"] == ["ditron_p2p_remote", "ditron_p2p_signal"]


def test_p2p_signal_wait_until_compares_with_nvshmem_codes(p2p_text):
    f = llvm_function(p2p_text, "ditron_signal_wait_until")
    spin = ir_events(f["spin"])
    assert spin[0] == ("asm", "ld.acquire.sys.global.b64 $0, [$1];")
    assert spin[1] == ("call", "ditron_cmp_u64") and spin[2] == ("br", "%ok", "done", "spin")
    # the compare's switch: NVSHMEM_CMP_* code -> block -> unsigned predicate
    text = re.search(r"define i1 @ditron_cmp_u64.*?\n\}", p2p_text, re.S).group(0)
    sw = re.search(r"switch i32 %cmp, label %(\w+) \[(.*?)\]", text, re.S)
    cases = {int(c): lab for c, lab in re.findall(r"i32 (\d+), label %(\w+)", sw.group(2))}
    cases.setdefault(next(v for v in range(6) if v not in cases), sw.group(1))       # the default
    g = llvm_function(p2p_text, "ditron_cmp_u64")
    pred = {lab: ir_events(g[lab])[0][1] for lab in cases.values()}
    want = {"eq": "eq", "ne": "ne", "gt": "ugt", "ge": "uge", "lt": "ult", "le": "ule"}
    for name, code in NVSHMEM_3_4_5_CMP.items():
        assert pred[cases[code]] == want[name], (name, code, cases, pred)


def test_p2p_barrier_fences_releases_then_acquires(p2p_text):
    f = llvm_function(p2p_text, "ditron_p2p_barrier_one")
    assert _asm(ir_events(f["entry"])[0]) == "fence.sc.sys;"          # quiet before arriving
    assert any(_asm(e) == "st.release.sys.global.b64 [$0], $1;" for e in ir_events(f["s.body"]))
    spin = ir_events(f["w.spin"])
    assert spin[0] == ("asm", "ld.acquire.sys.global.b64 $0, [$1];")
    assert spin[1] == ("icmp", "uge", "i64", "%v", "%g", "%arrived")
    assert spin[2] == ("br", "%arrived", "w.next", "w.spin")


def test_p2p_quiet_and_fence_are_sc_fences(p2p_text):
    for name in ("ditron_p2p_quiet", "ditron_p2p_fence"):
        assert [_asm(e) for e in ir_events(llvm_function(p2p_text, name)["entry"])] == ["fence.sc.sys;"]


# ---------------------------------------------------------------------------
# AMD (LLVM IR with AMDGPU atomics)
# ---------------------------------------------------------------------------

_CTA_BARRIER = [("fence", "release", "cta"), ("barrier",), ("fence", "acquire", "cta")]


@pytest.mark.parametrize("sem,scope,bits", [("acquire", "sys", 32), ("acquire", "gpu", 64), ("relaxed", "gpu", 32),
                                            ("relaxed", "sys", 64)])
def test_hip_wait_polls_until_equal_then_joins(sem, scope, bits):
    f = llvm_function(hip.LIB.text(), f"ditron_wait_{sem}_{scope}_i{bits}")
    spin = ir_events(f["spin"])
    assert spin == [("load", {"acquire": "acquire", "relaxed": "monotonic"}[sem], scope),
                    ("icmp", "eq", f"i{bits}", "%w", "%v", "%ok"), ("br", "%ok", "got", "spin")], spin
    assert ir_events(f["next"]) == [("icmp", "slt", "i32", "%i", "%n", "%more"), ("br", "%more", "spin", "done")]
    assert any(s == "%inext = add i32 %i, %nt" for s in f["got"])
    assert ir_events(f["done"]) == _CTA_BARRIER


def test_hip_wait_deps_is_signed_at_least_acquire_gpu():
    f = llvm_function(hip.LIB.text(), "ditron_wait_deps_i32")
    assert ir_events(f["spin"]) == [("load", "acquire", "gpu"), ("icmp", "sge", "i32", "%w", "%v", "%ok"),
                                    ("br", "%ok", "got", "spin")]
    assert ir_events(f["done"]) == _CTA_BARRIER


@pytest.mark.parametrize("sig_op", ["set", "add"])
@pytest.mark.parametrize("scope,bits", [("gpu", 32), ("sys", 64)])
def test_hip_notify_barrier_then_release_by_thread_0(sig_op, scope, bits):
    f = llvm_function(hip.LIB.text(), f"ditron_notify_{sig_op}_{scope}_i{bits}")
    entry = ir_events(f["entry"])
    assert entry[:3] == _CTA_BARRIER
    assert entry[3:] == [("call", "llvm.amdgcn.workitem.id.x"), ("icmp", "eq", "i32", "%tid", "0", "%first"),
                         ("br", "%first", "do", "done")]
    do = ir_events(f["do"])
    assert do[0] == (("store", "release", scope) if sig_op == "set" else ("rmw", "add", "release", scope))


def test_hip_release_tile_is_a_gpu_scope_release_set():
    """release_tile lowers to notify(set, gpu) on AMD: pinned above; check the rule calls that function."""
    import inspect
    assert '"ditron_notify_set_gpu_i32"' in inspect.getsource(hip._release_tile)


# ---------------------------------------------------------------------------
# NVSHMEM constants: facts from NVSHMEM 3.4.5's headers
# ---------------------------------------------------------------------------

#: include/device_host_transport/nvshmem_constants.h (enum nvshmemi_cmp_type, NVSHMEM 3.4.5)
NVSHMEM_3_4_5_CMP = {"eq": 0, "ne": 1, "gt": 2, "le": 3, "lt": 4, "ge": 5}
#: include/device_host_transport/nvshmem_common_transport.h (nvshmemx_signal_op_t, NVSHMEM 3.4.5)
NVSHMEM_3_4_5_SIGNAL = {"set": 9, "add": 10}
#: include/device_host/nvshmem_common.cuh (nvshmem_team_id_t, NVSHMEM 3.4.5)
NVSHMEM_3_4_5_TEAM = {"NVSHMEM_TEAM_WORLD": 0, "NVSHMEM_TEAM_SHARED": 1, "NVSHMEMX_TEAM_NODE": 2}


def test_nvshmem_constants_are_the_3_4_5_header_values():
    assert shmem_table.NVSHMEM_CMP == NVSHMEM_3_4_5_CMP
    assert shmem_table.NVSHMEM_SIGNAL == NVSHMEM_3_4_5_SIGNAL
    assert (shmem.NVSHMEM_CMP_EQ, shmem.NVSHMEM_CMP_NE, shmem.NVSHMEM_CMP_GT, shmem.NVSHMEM_CMP_LE,
            shmem.NVSHMEM_CMP_LT, shmem.NVSHMEM_CMP_GE) == (0, 1, 2, 3, 4, 5)
    assert (shmem.NVSHMEM_SIGNAL_SET, shmem.NVSHMEM_SIGNAL_ADD) == (9, 10)
    assert shmem.NVSHMEM_TEAM_WORLD == NVSHMEM_3_4_5_TEAM["NVSHMEM_TEAM_WORLD"]
    # the host side's hang report decodes the same codes
    from ditron.runtime import gpu_base
    assert gpu_base._CMP_TEXT == {0: "==", 1: "!=", 2: ">", 3: "<=", 4: "<", 5: ">="}


def test_nvshmem_constants_match_the_installed_headers():
    """Re-read the values from nvidia-nvshmem-cu13's headers when they are installed (the facts above are
    what this test checked against 3.4.5)."""
    try:
        import nvidia.nvshmem as nv
    except ImportError:
        pytest.skip("nvidia-nvshmem-cu13 is not installed (the values above are pinned as facts)")
    inc = os.path.join(list(nv.__path__)[0], "include")
    with open(os.path.join(inc, "device_host_transport", "nvshmem_constants.h")) as f:
        enum = re.search(r"enum nvshmemi_cmp_type \{(.*?)\}", f.read(), re.S).group(1)
    names = re.findall(r"NVSHMEM_CMP_(\w+)", enum)
    assert {n.lower(): i for i, n in enumerate(names) if n != "SENTINEL"} == NVSHMEM_3_4_5_CMP
    with open(os.path.join(inc, "device_host_transport", "nvshmem_common_transport.h")) as f:
        text = f.read()
    assert int(re.search(r"NVSHMEM_SIGNAL_SET = (\d+)", text).group(1)) == NVSHMEM_3_4_5_SIGNAL["set"]
    assert int(re.search(r"NVSHMEM_SIGNAL_ADD = (\d+)", text).group(1)) == NVSHMEM_3_4_5_SIGNAL["add"]
    with open(os.path.join(inc, "device_host", "nvshmem_common.cuh")) as f:
        text = f.read()
    for name, value in NVSHMEM_3_4_5_TEAM.items():
        assert int(re.search(rf"\b{name} = (-?\d+)", text).group(1)) == value


# ---------------------------------------------------------------------------
# barriers, inter-node signals, fences
# ---------------------------------------------------------------------------

def test_p2p_block_barrier_joins_then_one_thread_then_joins(p2p_text):
    f = llvm_function(p2p_text, "ditron_p2p_barrier_block")
    assert ir_events(f["entry"]) == [("barrier",), ("icmp", "eq", "i32", "%idx32", "0", "%lead"),
                                     ("br", "%lead", "do", "done")]
    assert [e[1] for e in ir_events(f["do"]) if e[0] == "call"] == ["ditron_p2p_barrier_one"]
    assert ir_events(f["done"]) == [("barrier",)]


@pytest.mark.parametrize("name,call", [("ditron_nvshmemx_signal_op_once", ["nvshmemx_signal_op"]),
                                       ("ditron_p2p_signal_op_once", ["ditron_p2p_remote", "ditron_p2p_signal"])])
def test_inter_node_notify_signals_once_from_thread_0(p2p_text, name, call):
    """notify(comm_scope='inter_node'): the rule joins the CTA (debug_barrier) and then thread 0 only signals."""
    f = llvm_function(p2p_text, name)
    entry = ir_events(f["entry"])
    assert entry[-2][:5] == ("icmp", "eq", "i32", "%tid", "0") and entry[-1][0] == "br"
    assert [e[1] for e in ir_events(f[entry[-1][2]]) if e[0] == "call"] == call
    assert not [e for e in ir_events(f[entry[-1][3]]) if e[0] == "call"]


@pytest.mark.parametrize("name,want", [("ditron_fence_acq_rel_gpu", [("fence", "acq_rel", "gpu")]),
                                       ("ditron_fence_sc_sys", [("fence", "seq_cst", "sys")]),
                                       ("ditron_fence_release_cta", [("fence", "release", "cta")]),
                                       ("ditron_syncthreads", _CTA_BARRIER)])
def test_hip_fences_and_syncthreads(name, want):
    assert ir_events(llvm_function(hip.LIB.text(), name)["entry"]) == want
