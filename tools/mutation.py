#!/usr/bin/env python
"""A small mutation runner for ditron's synchronisation-critical code.

Each mutant is a realistic one-line bug (a flipped compare, a swapped
constant, a dropped fence or barrier, an off-by-one in a wait or a bounds
check, acquire/release swapped, a release moved before its store, a weakened
cross-rank check...) in the lowering rules, the simulator, the race finder,
the zoo protocols, the task runtime or the consistency checks.  The runner
copies the repository once into a temporary directory, then for each mutant
patches the copy, runs the tests mapped to that mutant (``pytest -x``, with a
timeout), and restores the file.  A mutant is *killed* when the tests fail (or
time out), *survived* when they pass.

    python tools/mutation.py                  # every mutant, the working tree
    python tools/mutation.py --rev b639d04    # the same mutants on a commit
    python tools/mutation.py --only cuda      # mutants whose id contains 'cuda'
    python tools/mutation.py --list           # the mutants and their tests

Not part of CI (one run takes ~15-25 minutes on 2 cores).  Run it before
resolving an issue that touches a protocol; add a mutant when you fix a bug
the tests missed.  A mutant whose text is not found (the code moved) is
reported as ``stale``: update its ``old`` text.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Mutant:
    id: str
    path: str
    old: str
    new: str
    tests: tuple
    what: str
    nth: int = 0          # which occurrence of ``old`` (0: the first)


# test groups (pytest node ids).  An id starting with "?" is a fallback: it runs only when none of the
# other ids exists (an older commit, before the tests written for this runner), so a run on an old
# commit measures the tests that commit had for that layer.
EMIT = ("tests/test_sync_emitted.py", "?tests/test_compile_tile.py", "?tests/test_compile_thread.py")
SHMEM = ("tests/test_sync_emitted.py", "?tests/test_compile_shmem.py", "?tests/test_gpu_runtime.py")
SIMSEM = ("tests/test_sim_semantics.py", "?tests/test_dist_primitives.py")
RACE = ("tests/test_sim_race.py",)
CHECKS = ("tests/test_zoo_checks.py", "?tests/test_reliability_api.py")
TASK = ("tests/test_task_sim.py",)


def SKEW(*fallback):
    return ("tests/test_zoo_skew.py",) + tuple("?" + f for f in fallback)


M = Mutant
MUTANTS = [
    # ---- CUDA lowering (inline PTX) ------------------------------------------------------------------
    M("cuda.wait.cmp", "ditron/lowering/cuda.py", "setp.ne.b{bits} %p1, %v, $3;", "setp.eq.b{bits} %p1, %v, $3;",
      EMIT, "dl.wait spins while the word EQUALS the value"),
    M("cuda.wait.branch", "ditron/lowering/cuda.py", "@%p1 bra L_spin_${{:uid}};", "@!%p1 bra L_spin_${{:uid}};",
      EMIT, "dl.wait spin-loop branch inverted"),
    M("cuda.wait.bound", "ditron/lowering/cuda.py", "setp.ge.u32 %p0, %i, $2;\n    @%p0 bra L_done_${{:uid}};",
      "setp.gt.u32 %p0, %i, $2;\n    @%p0 bra L_done_${{:uid}};", EMIT, "dl.wait polls one word too many"),
    M("cuda.wait.nobar", "ditron/lowering/cuda.py", "L_done_${{:uid}}:\n    bar.sync 0;",
      "L_done_${{:uid}}:\n    ", EMIT, "dl.wait without the CTA barrier"),
    M("cuda.wait.stride", "ditron/lowering/cuda.py", 'else "mul.wide.u32 %off, %i, 4;"',
      'else "mul.wide.u32 %off, %i, 8;"', EMIT, "32-bit dl.wait polls every other word"),
    M("cuda.notify.relaxed", "ditron/lowering/cuda.py", 'instr = f"st.release.{scope}.global.b{bits} [$1], $2;"',
      'instr = f"st.relaxed.{scope}.global.b{bits} [$1], $2;"', EMIT, "notify(set) store is relaxed"),
    M("cuda.notify.add.relaxed", "ditron/lowering/cuda.py", 'f"red.release.{scope}.global.add.u{bits}',
      'f"red.relaxed.{scope}.global.add.u{bits}', EMIT, "notify(add) reduction is relaxed"),
    M("cuda.notify.before.bar", "ditron/lowering/cuda.py",
      "    bar.sync 0;\n    mov.u32 %t, %tid.x;\n    setp.eq.u32 %p, %t, 0;\n    @%p {instr}\n",
      "    mov.u32 %t, %tid.x;\n    setp.eq.u32 %p, %t, 0;\n    @%p {instr}\n    bar.sync 0;\n",
      EMIT, "notify releases before the CTA barrier (other threads' writes not covered)"),
    M("cuda.notify.everyone", "ditron/lowering/cuda.py", "setp.eq.u32 %p, %t, 0;\n    @%p {instr}",
      "setp.ne.u32 %p, %t, 0;\n    @%p {instr}", EMIT, "every thread but 0 signals"),
    M("cuda.scope.intra", "ditron/lowering/cuda.py", '"intra_node": "sys"', '"intra_node": "gpu"', EMIT,
      "intra-node signals at GPU scope"),
    M("cuda.deps.cmp", "ditron/lowering/cuda.py", "setp.lt.s32 %p1, %v, $3;", "setp.le.s32 %p1, %v, $3;", EMIT,
      "wait_deps needs slot > epoch"),
    M("cuda.deps.unsigned", "ditron/lowering/cuda.py", "setp.lt.s32 %p1, %v, $3;", "setp.lt.u32 %p1, %v, $3;",
      EMIT, "wait_deps compares unsigned"),
    M("cuda.deps.nofence", "ditron/lowering/cuda.py", "    @%p2 fence.acq_rel.gpu;\n", "", EMIT,
      "wait_deps: relaxed polls without the acquire fence"),
    M("cuda.release.relaxed", "ditron/lowering/cuda.py", "@%p st.release.gpu.global.b32 [$1], $2;",
      "@%p st.relaxed.gpu.global.b32 [$1], $2;", EMIT, "release_tile store is relaxed"),
    M("cuda.release.before.bar", "ditron/lowering/cuda.py",
      "    bar.sync 0;\n    mov.u32 %t, %tid.x;\n    setp.eq.u32 %p, %t, 0;\n    @%p st.release.gpu",
      "    mov.u32 %t, %tid.x;\n    setp.eq.u32 %p, %t, 0;\n    @%p st.release.gpu", EMIT,
      "release_tile without the CTA barrier before the store"),
    M("cuda.fence.sc", "ditron/lowering/cuda.py", 'sem = "sc" if semantic == "sc" else "acq_rel"',
      'sem = "acq_rel"', EMIT, "dl.fence('sc') emits acq_rel"),
    # ---- CUDA device library (P2P transport, bounded waits) -------------------------------------------
    M("p2p.signal.swap", "ditron/lowering/cuda_p2p.py", 'P2P_SIGNAL = {"set": 0, "add": 1}',
      'P2P_SIGNAL = {"set": 1, "add": 0}', SHMEM, "P2P signal op codes swapped"),
    M("p2p.signal.relaxed", "ditron/lowering/cuda_p2p.py", '_asm("st.release.sys.global.b64 [$0], $1;", "l,l,~{memory}", args="i64 %raddr',
      '_asm("st.relaxed.sys.global.b64 [$0], $1;", "l,l,~{memory}", args="i64 %raddr', SHMEM,
      "P2P signal set is relaxed"),
    M("p2p.cmp.ge", "ditron/lowering/cuda_p2p.py", "%r5 = icmp uge i64 %a, %b", "%r5 = icmp ugt i64 %a, %b",
      SHMEM, "signal_wait_until(ge) compares >"),
    M("p2p.bounded.cmp", "ditron/lowering/cuda_bounded.py", 'cond, kind, cmp = ("sge", 4, 5) if deps else ("eq", 1, 0)',
      'cond, kind, cmp = ("sge", 4, 5) if deps else ("uge", 1, 0)', SHMEM, "bounded dl.wait accepts >="),
    M("bounded.no.abort.poll", "ditron/lowering/cuda_bounded.py", "  br i1 %c.exp, label %fail, label %chk.ab",
      "  br i1 %c.exp, label %fail, label %spin", SHMEM,
      "a bounded dl.wait ignores the abort word (spins on after another wait of the rank reported)"),
    M("bounded.no.vote", "ditron/lowering/cuda_bounded.py", "  %any = call i32 @ditron_block_any(i32 %mine)",
      "  %any = add i32 %mine, 0", SHMEM, "a bounded dl.wait leaves per thread, not as a block"),
    M("p2p.barrier.arrived", "ditron/lowering/cuda_p2p.py", "%arrived = icmp uge i64 %v, %g",
      "%arrived = icmp uge i64 %v, %g0", SHMEM, "P2P barrier accepts the previous generation"),
    M("p2p.putsig.nobar", "ditron/lowering/cuda_p2p.py", '"block": ("tid.x", "ntid.x", _BAR, _BAR)',
      '"block": ("tid.x", "ntid.x", _BAR, "")', SHMEM, "block putmem_signal signals before the copy is joined"),
    # ---- shmem table (NVSHMEM constants) -----------------------------------------------------------------
    M("nvshmem.signal.swap", "ditron/lowering/shmem_table.py", 'NVSHMEM_SIGNAL = {"set": 9, "add": 10}',
      'NVSHMEM_SIGNAL = {"set": 10, "add": 9}', SHMEM, "NVSHMEM_SIGNAL_SET/ADD swapped"),
    M("nvshmem.cmp.swap", "ditron/lowering/shmem_table.py", '"gt": 2, "le": 3', '"gt": 3, "le": 2', SHMEM,
      "NVSHMEM_CMP_GT/LE swapped"),
    M("nvshmem.cmp.lt.ge", "ditron/lowering/shmem_table.py", '"lt": 4, "ge": 5', '"lt": 5, "ge": 4', SHMEM,
      "NVSHMEM_CMP_LT/GE swapped"),
    # ---- AMD lowering ------------------------------------------------------------------------------------------
    M("hip.wait.cmp", "ditron/lowering/hip.py", 'f"{_SYNCSCOPE[scope]}{_ORDER[semantic]}", "eq"))',
      'f"{_SYNCSCOPE[scope]}{_ORDER[semantic]}", "uge"))', EMIT, "AMD dl.wait accepts >="),
    M("hip.deps.cmp", "ditron/lowering/hip.py", 'f"{_SYNCSCOPE[\'gpu\']}acquire", "sge"))',
      'f"{_SYNCSCOPE[\'gpu\']}acquire", "sgt"))', EMIT, "AMD wait_deps needs > epoch"),
    M("hip.notify.relaxed", "ditron/lowering/hip.py", "%a {ss}release, align {bits // 8}\"),",
      "%a {ss}monotonic, align {bits // 8}\"),", EMIT, "AMD notify(set) store is relaxed"),
    M("hip.barrier.fence", "ditron/lowering/hip.py", '_BARRIER = """  fence syncscope("workgroup") release\n',
      '_BARRIER = """', EMIT, "AMD CTA barrier without its release fence"),
    M("hip.scope", "ditron/lowering/hip.py", '"gpu": \'syncscope("agent") \', "sys": "",',
      '"gpu": \'syncscope("agent") \', "sys": \'syncscope("agent") \',', EMIT, "AMD system scope narrowed to agent"),
    # ---- simulator lowering ------------------------------------------------------------------------------------
    M("sim.rank.upper", "ditron/lowering/sim_base.py", "if not 0 <= rank < world.world_size:",
      "if not 0 <= rank <= world.world_size:", SIMSEM, "rank == world size accepted"),
    M("sim.rank.lower", "ditron/lowering/sim_base.py", "if not 0 <= rank < world.world_size:",
      "if not -1 <= rank < world.world_size:", SIMSEM, "rank -1 accepted"),
    M("sim.rank.last", "ditron/lowering/sim_base.py", "if not 0 <= rank < world.world_size:",
      "if not 0 <= rank < world.world_size - 1:", SIMSEM, "the last rank rejected"),
    M("sim.wait.ge", "ditron/lowering/sim.py", "lambda v: np.all(v == want), f\"== {int(want)}\"",
      "lambda v: np.all(v >= want), f\"== {int(want)}\"", SIMSEM, "simulated dl.wait accepts a word past the value"),
    M("sim.wait.count", "ditron/lowering/sim.py", "addrs = np.uint64(base) + np.arange(n, dtype=np.uint64)",
      "addrs = np.uint64(base) + np.arange(max(n - 1, 1), dtype=np.uint64)", SIMSEM,
      "simulated dl.wait checks one word too few"),
    M("sim.deps.gt", "ditron/lowering/sim.py", "lambda v: np.all(v >= want), f\">= {want}\"",
      "lambda v: np.all(v > want - 1) & np.all(v != want), f\">= {want}\"", TASK + SIMSEM,
      "simulated wait_deps misses slot == epoch"),
    M("sim.cmp.gt", "ditron/lowering/sim_shmem.py", '"gt": np.greater,', '"gt": np.greater_equal,', SIMSEM,
      "simulated signal_wait_until(gt) accepts equality"),
    M("sim.cmp.le", "ditron/lowering/sim_shmem.py", '"le": np.less_equal}', '"le": np.less}', SIMSEM,
      "simulated signal_wait_until(le) rejects equality"),
    M("sim.signal.op", "ditron/lowering/sim_base.py", "    if sig_op == \"set\":\n        M.atomic_xchg",
      "    if sig_op != \"add\" and False:\n        M.atomic_xchg", SIMSEM, "simulated signal set adds"),
    M("sim.wait.relaxed", "ditron/lowering/sim.py",
      "        if semantic == \"acquire\":\n            race().signal_acquire(addrs, scope == \"sys\")\n        else:\n"
      "            race().signal_relaxed_read(addrs)\n    return _scalar(0, tl.int32)",
      "        race().signal_relaxed_read(addrs)\n    return _scalar(0, tl.int32)", RACE,
      "simulated acquire waits do not acquire (race finder sees no order)"),
    M("sim.notify.scope", "ditron/lowering/sim.py", "race().signal_release(addr, comm_scope != \"gpu\")",
      "race().signal_release(addr, False)", RACE, "simulated intra-node notify releases at GPU scope only"),
    M("sim.swu.acquire", "ditron/lowering/sim_shmem.py", "    race().signal_acquire(addr, True)\n    return _scalar(",
      "    return _scalar(", RACE, "simulated signal_wait_until does not acquire"),
    M("sim.device.barrier", "ditron/lowering/sim_shmem.py", "if ctl.add(cnt_w, 1) + 1 == world.world_size:",
      "if ctl.add(cnt_w, 1) + 2 >= world.world_size:", SIMSEM, "device barrier opens one rank early"),
    # ---- race finder ----------------------------------------------------------------------------------------------
    M("race.ww", "ditron/sim/race.py", 'self._report(t, "write", "write", a, bad_w, sh.w_info[g], w, info, describe)',
      "pass", RACE, "write-write races not reported"),
    M("race.rw", "ditron/sim/race.py", 'self._report(t, "read", "write", a, bad_r, sh.r_info[g], r, info, describe)',
      "pass", RACE, "read-then-write races not reported"),
    M("race.unordered", "ditron/sim/race.py", "(t.vc[np.minimum(tid, self.dims - 1)] < clk)",
      "(t.vc[np.minimum(tid, self.dims - 1)] + 1 < clk)", RACE, "happens-before off by one"),
    M("race.same.value", "ditron/sim/race.py", "same = (before == new) & (w != 0)", "same = (w != 0)", RACE,
      "every write after a write counts as 'the same value'"),
    # ---- zoo protocols ----------------------------------------------------------------------------------------------
    M("zoo.ag_gemm.wait", "kernels/ag_gemm.py",
      'tok2 = dl.wait(sigp + s_above * per_seg, n_above * per_seg, "sys", "acquire", waitValue=val)',
      'tok2 = dl.wait(sigp + s_above * per_seg, n_above * per_seg - 1, "sys", "acquire", waitValue=val)', SKEW("tests/test_ag_gemm.py::test_ag_gemm_shapes"),
      "AG-GEMM consumer waits for one signal word too few"),
    M("zoo.gemm_rs.wait", "kernels/gemm_rs.py", 'tok2 = dl.wait(ready_ptr + me + 1, W - 1 - me, "sys", "acquire"',
      'tok2 = dl.wait(ready_ptr + me + 1, W - 2 - me, "sys", "acquire"', SKEW("tests/test_gemm_rs.py::test_gemm_rs_reuse_delayed_rank"),
      "GEMM-RS reducer waits for one source too few"),
    M("zoo.gemm_ar.wait", "kernels/gemm_ar.py", "tok = dl.wait(flag + t64 * WORLD, WORLD, \"sys\", \"acquire\", "
      "waitValue=val)", "tok = dl.wait(flag + t64 * WORLD, WORLD - 1, \"sys\", \"acquire\", waitValue=val)", SKEW("tests/test_gemm_ar.py::test_reuse_delayed_rank_per_rank_k", "tests/test_gemm_ar.py::test_methods_dtypes"),
      "GEMM-AR reducer waits for one rank too few"),
    M("zoo.rs.acc", "kernels/reduce_scatter.py", "acc += tl.load(bufp + src * ss + offs, mask=mask).to(tl.float32)",
      "acc = (acc + tl.load(bufp + src * ss + offs, mask=mask).to(tl.float32)).to(bufp.dtype.element_ty)"
      ".to(tl.float32)", SKEW("tests/test_zoo_ag_rs_a2a.py::test_reduce_scatter"), "reduce_scatter accumulates in the data type"),
    M("zoo.ar.acc", "kernels/all_reduce.py", "acc += tl.load(dl.symm_at(src + o, q), mask=m, other=0.0).to(tl.float32)",
      "acc = (acc + tl.load(dl.symm_at(src + o, q), mask=m, other=0.0).to(tl.float32)).to(src.dtype.element_ty)"
      ".to(tl.float32)", SKEW("tests/test_zoo_all_reduce.py::test_methods_dtypes_odd_sizes"), "all_reduce (one-shot) accumulates in the data type"),
    M("zoo.gemm_rs.acc", "kernels/gemm_rs.py", "acc += v.to(tl.float32)",
      "acc = (acc + v.to(tl.float32)).to(v.dtype).to(tl.float32)", SKEW("tests/test_gemm_rs.py::test_gemm_rs_shapes"), "GEMM-RS reduction in the data type"),
    M("zoo.ep.route.wait", "kernels/ep_kernels.py", "tok = dl.wait_deps(rslot_ptr, P, epoch)",
      "tok = dl.wait_deps(rslot_ptr, P - 1, epoch)", ("tests/test_ep.py::test_ep_routing_over_several_programs",),
      "EP routing reads the counts of every program but waits for one program too few"),
    M("zoo.ep.route.epoch", "kernels/ep_kernels.py", "dl.release_tile(rslot_ptr + pid, epoch)",
      "dl.release_tile(rslot_ptr + pid, epoch + 1)", ("tests/test_ep.py::test_ep_routing_over_several_programs",),
      "EP routing releases its counts with the next call's epoch (the next call does not wait)"),
    M("zoo.ep.ll.route.before", "kernels/ep_ll_kernels.py", "before, _ = _route_count(idx_ptr, 0, lo, E, EP, BLK)",
      "before, _ = _route_count(idx_ptr, 1, lo, E, EP, BLK)", ("tests/test_ep.py::test_ep_routing_over_several_programs",),
      "EP LL dispatch's routing misses the first pair when counting the pairs before a program's share"),
    M("zoo.ep.ll.rank.direct", "kernels/ep_ll_kernels.py", "(j[None, :] < r[:, None])",
      "(j[None, :] <= r[:, None])", ("tests/test_ep.py::test_ep_ll_strided_pairs",),
      "EP LL dispatch's direct rank (strided pairs) counts the pair itself among the earlier pairs of its expert"),
    # ---- task runtime ---------------------------------------------------------------------------------------------
    M("task.release.epoch", "ditron/task/codegen.py", 'dl.release_tile(slots_ptr + slot, epoch)',
      'dl.release_tile(slots_ptr + slot, epoch - 1)', TASK, "tiles released with the previous epoch"),
    M("task.deps.first", "ditron/task/codegen.py", "tok = dl.wait_deps(slots_ptr + d0_first, d0_count, epoch)",
      "tok = dl.wait_deps(slots_ptr + d0_first, d0_count - 1, epoch)", TASK, "one dependency slot too few"),
    # ---- cross-rank checks ------------------------------------------------------------------------------------------
    M("checks.compare", "ditron/runtime/consistency.py", "        if len(set(vals)) > 1:\n            each",
      "        if len(set(vals)) > 2:\n            each", CHECKS, "a field differing on one rank of three passes"),
    M("checks.fields.first", "ditron/runtime/consistency.py", "    for fp in fps:\n        for k, _ in fp[\"fields\"]:",
      "    for fp in fps[:1]:\n        for k, _ in fp[\"fields\"][:2]:", CHECKS, "only the first fields compared"),
    M("checks.gemm_rs.fields", "kernels/gemm_rs.py", 'op_fields(a, name="a") + op_fields(b, name="b")[:1]',
      'op_fields(a, name="a")', CHECKS, "GEMM-RS does not compare b's shape"),
    M("checks.fastpath", "ditron/runtime/world.py", "if all(i < len(args) and hasattr(args[i], \"data_ptr\") and contains",
      "if any(i < len(args) and hasattr(args[i], \"data_ptr\") and contains", CHECKS,
      "the launch check's fast path lets a plain operand through when another is symmetric"),
    M("checks.ar.fields", "kernels/all_reduce.py", '[("block", block), ("chunk", chunk),',
      '[("chunk", chunk),', CHECKS, "all_reduce does not compare block"),
]


def _files(rev):
    """Paths of the repository at ``rev`` (None: the working tree, tracked and untracked-not-ignored)."""
    if rev:
        return None
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return [p for p in out if p and os.path.isfile(os.path.join(ROOT, p))]


def make_copy(rev):
    tmp = tempfile.mkdtemp(prefix="ditron-mutation-")
    if rev:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    else:
        for p in _files(None):
            dst = os.path.join(tmp, p)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, p), dst)
    # ditron.kernels is the top-level kernels/ package (an editable install maps it to the original
    # checkout): a link inside the copy's ditron/ makes the copy's zoo the one imported
    link = os.path.join(tmp, "ditron", "kernels")
    if not os.path.exists(link):
        os.symlink(os.path.join(tmp, "kernels"), link)
    return tmp


def _env(tmp):
    env = dict(os.environ)
    env["PYTHONPATH"] = tmp + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"         # a restored file must never be shadowed by a stale .pyc
    env.pop("DITRON_TEST_BACKEND", None)
    return env


def check_copy_is_imported(tmp, python):
    code = "import ditron, ditron.kernels.all_reduce as _, sys; print(ditron.__file__); " \
           "print(sys.modules['ditron.kernels'].__file__)"
    out = subprocess.run([python, "-c", code], cwd=tmp, env=_env(tmp), capture_output=True, text=True)
    paths = out.stdout.split()
    if out.returncode or len(paths) != 2 or not all(os.path.realpath(p).startswith(os.path.realpath(tmp))
                                                      for p in paths):
        sys.exit(f"mutation: the copy is not the ditron that gets imported ({out.stdout} {out.stderr})")


def run_tests(tmp, tests, python, timeout):
    exists = [t for t in tests if os.path.exists(os.path.join(tmp, t.lstrip("?").split("::")[0]))]
    tests = [t for t in exists if not t.startswith("?")] or [t[1:] for t in exists]
    if not tests:
        return "no tests", 0.0, ""
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=tmp, env=_env(tmp), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.time() - t0, ""
    tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or [""]
    return ("pass" if p.returncode == 0 else "fail"), time.time() - t0, tail[0]


def apply(tmp, m):
    path = os.path.join(tmp, m.path)
    with open(path) as f:
        text = f.read()
    start = -1
    for _ in range(m.nth + 1):
        start = text.find(m.old, start + 1)
        if start < 0:
            return None
    with open(path, "w") as f:
        f.write(text[:start] + m.new + text[start + len(m.old):])
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="run on this commit (git archive) instead of the working tree")
    ap.add_argument("--only", action="append", help="mutant ids containing this text (repeatable)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mutant's test run (default 300)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy")
    args = ap.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or any(o in m.id for o in args.only)]
    if args.list:
        for m in mutants:
            print(f"{m.id:28} {m.path:34} {m.what}\n{'':28} tests: {' '.join(m.tests)}")
        return 0
    tmp = make_copy(args.rev)
    results = []
    try:
        check_copy_is_imported(tmp, args.python)
        print(f"mutation: {len(mutants)} mutants on {args.rev or 'the working tree'} (copy in {tmp})", flush=True)
        for m in mutants:
            original = apply(tmp, m)
            if original is None:
                results.append((m, "stale", 0.0, "text not found"))
                print(f"  {m.id:28} STALE    (text not found in {m.path})", flush=True)
                continue
            try:
                outcome, secs, tail = run_tests(tmp, m.tests, args.python, args.timeout)
            finally:
                with open(os.path.join(tmp, m.path), "w") as f:
                    f.write(original)
            status = {"fail": "killed", "timeout": "killed", "pass": "survived", "no tests": "no tests"}[outcome]
            results.append((m, status, secs, "timeout" if outcome == "timeout" else tail))
            print(f"  {m.id:28} {status.upper():9} {secs:6.1f}s  {outcome if outcome != 'fail' else tail}",
                  flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    by_module = {}
    for m, status, _, _ in results:
        by_module.setdefault(m.path, []).append(status)
    print("\nper module (killed / mutants):")
    for path, st in sorted(by_module.items()):
        print(f"  {path:36} {st.count('killed')} / {len(st)}")
    counted = [r for r in results if r[1] in ("killed", "survived")]
    killed = sum(r[1] == "killed" for r in counted)
    timeouts = sum(r[3] == "timeout" for r in counted)
    print(f"\nscore: {killed} / {len(counted)} killed ({100.0 * killed / max(1, len(counted)):.0f}%)"
          + (f" ({timeouts} of them by the timeout: a slow test run, or a mutant that hangs)" if timeouts else "")
          + "".join(f"; {sum(r[1] == s for r in results)} {s}" for s in ("stale", "no tests")
                    if any(r[1] == s for r in results)))
    survivors = [r for r in results if r[1] == "survived"]
    if survivors:
        print("survivors:")
        for m, _, _, _ in survivors:
            print(f"  {m.id}: {m.what} ({m.path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
