"""NVIDIA device-library pieces for bounded waits (``DITRON_WAIT_TIMEOUT_S``):
the hang report, the abort word, and the bounded ``dl.wait`` /
``dl.wait_deps`` / ``dl.poll_timeout`` (the bounded P2P barrier and
``shmem.signal_wait_until`` are in cuda_p2p.py and call the functions here).

``dl.wait``, ``shmem.signal_wait_until``, ``dl.wait_deps``, ``dl.poll_timeout``
and the P2P barrier poll ``%globaltimer`` and, past the world's
``wait_timeout_ns``, the first expired thread claims the report slot (the
*abort word* of the rank's sync area, cuda_p2p.SYNC_HANG_CLAIM) and writes a
report record into the world's ``debug_buffer`` (pinned host memory the
runtime watches).  No trap: every bounded wait also polls the abort word while
it spins, and a thread that expired or saw the word set leaves the kernel
(``exit``) -- the block-wide waits decide together (``bar.red.or.pred``: the
whole block leaves or none of it), so every program stops at its next wait
and the kernel returns; the host then raises the report
(ditron/runtime/gpu_base.py).  A trap would end the CUDA context -- under MPS
every client's on the GPU.  The abort word stays set: the world is unusable
after a report.  These functions exist in every variant of the library but
are only called from kernels compiled in the bounded variant, so unbounded
kernels pay nothing.
"""
from __future__ import annotations

from .cuda_p2p import LEAVE_IF_ANY, SYNC_AREA_WORD, SYNC_HANG_CLAIM, _W, _asm, _expired, _globaltimer, _sreg, _world

#: layout of the debug (hang report) record in pinned host memory, 64-bit words
HANG_WORDS = {"valid": 0, "rank": 1, "ctaid_x": 2, "ctaid_y": 3, "ctaid_z": 4, "tid": 5, "addr": 6, "expected": 7,
              "observed": 8, "elapsed_ns": 9, "kind": 10, "cmp": 11, "timeout_ns": 12}
HANG_RECORD_WORDS = 16
HANG_VALID = 0x48414E47      # "HANG"
HANG_KINDS = {1: "dl.wait", 2: "shmem.signal_wait_until", 3: "shmem.barrier_all", 4: "dl.wait_deps",
              5: "polling loop (dl.poll_timeout)"}


def _hang_fn():
    """``ditron_hang(addr, expected, observed, elapsed, kind, cmp)``: the first
    expired thread of the rank claims the abort word and writes the report
    record; every other caller returns at once.  The caller then leaves the
    kernel (``ditron_exit``, or a block vote first).  Without a debug buffer or
    sync area (no world) nothing can report: trap."""
    f = HANG_WORDS
    stores = []
    fields = [("rank", "%rank"), ("ctaid_x", "%cx"), ("ctaid_y", "%cy"), ("ctaid_z", "%cz"), ("tid", "%tx"),
              ("addr", "%addr"), ("expected", "%exp"), ("observed", "%obs"), ("elapsed_ns", "%dt"),
              ("kind", "%kind64"), ("cmp", "%cmp64"), ("timeout_ns", "%tmo")]
    for name, reg in fields:
        stores.append(f"  %a.{name} = add i64 %buf, {8 * f[name]}")
        stores.append("  " + _asm("st.relaxed.sys.global.b64 [$0], $1;", "l,l,~{memory}", args=f"i64 %a.{name}, i64 {reg}"))
    body = "\n".join(stores)
    return f"""
define void @ditron_hang(i64 %addr, i64 %exp, i64 %obs, i64 %dt, i32 %kind, i32 %cmp) #0 {{
entry:
{_world('%buf', _W['debug_buffer'])}
{_world('%sync', SYNC_AREA_WORD)}
  %hb = icmp ne i64 %buf, 0
  %hs = icmp ne i64 %sync, 0
  %h = and i1 %hb, %hs
  br i1 %h, label %claim, label %die
claim:
  %ca = add i64 %sync, {8 * SYNC_HANG_CLAIM}
  %old = {_asm("atom.relaxed.sys.global.cas.b64 $0, [$1], 0, 1;", "=l,l,~{memory}", ret="i64", args="i64 %ca")}
  %first = icmp eq i64 %old, 0
  br i1 %first, label %write, label %done
write:
{_world('%rank', _W['rank'])}
{_world('%tmo', _W['wait_timeout_ns'])}
{_sreg('%cx32', 'ctaid.x')}
{_sreg('%cy32', 'ctaid.y')}
{_sreg('%cz32', 'ctaid.z')}
{_sreg('%tx32', 'tid.x')}
  %cx = zext i32 %cx32 to i64
  %cy = zext i32 %cy32 to i64
  %cz = zext i32 %cz32 to i64
  %tx = zext i32 %tx32 to i64
  %kind64 = zext i32 %kind to i64
  %cmp64 = zext i32 %cmp to i64
{body}
  {_asm("fence.sc.sys;", "~{memory}")}
  %a.valid = add i64 %buf, {8 * f['valid']}
  {_asm("st.relaxed.sys.global.b64 [$0], $1;", "l,l,~{memory}", args=f"i64 %a.valid, i64 {HANG_VALID}")}
  {_asm("fence.sc.sys;", "~{memory}")}
  br label %done
done:
  ret void
die:
  {_asm("trap;", "~{memory}")}
  unreachable
}}"""


def _abort_fns():
    """``ditron_aborted()``: whether a bounded wait of this rank has expired (the
    abort word of the sync area is set; false without a world).
    ``ditron_exit()``: this thread leaves the kernel (``exit``: barriers count
    exited threads as arrived).  ``ditron_block_any(x)`` / ``ditron_warp_any(x)``:
    a barrier of the block (warp) that returns whether any thread passed a
    non-zero ``x`` (``bar.red.or.pred`` / ``vote.sync.any``), so a block-wide
    wait leaves as a whole or not at all."""
    return f"""
define i1 @ditron_aborted() #0 {{
entry:
{_world('%sync', SYNC_AREA_WORD)}
  %has = icmp ne i64 %sync, 0
  br i1 %has, label %rd, label %no
rd:
  %ca = add i64 %sync, {8 * SYNC_HANG_CLAIM}
  %v = {_asm("ld.relaxed.sys.global.b64 $0, [$1];", "=l,l,~{memory}", ret="i64", args="i64 %ca")}
  %r = icmp ne i64 %v, 0
  ret i1 %r
no:
  ret i1 false
}}

define void @ditron_exit() #0 {{
entry:
  {_asm("exit;", "~{memory}")}
  unreachable
}}

define i32 @ditron_block_any(i32 %x) #1 {{
entry:
  %r = {_asm("{ .reg .pred %p, %q; setp.ne.u32 %p, $1, 0; bar.red.or.pred %q, 0, %p; selp.u32 $0, 1, 0, %q; }",
             "=r,r,~{memory}", ret="i32", args="i32 %x")}
  ret i32 %r
}}

define i32 @ditron_warp_any(i32 %x) #1 {{
entry:
  %r = {_asm("{ .reg .pred %p, %q; setp.ne.u32 %p, $1, 0; vote.sync.any.pred %q, %p, 0xffffffff; selp.u32 $0, 1, 0, %q; }",
             "=r,r,~{memory}", ret="i32", args="i32 %x")}
  ret i32 %r
}}"""


def _wait_bounded_fn(semantic, scope, bits, deps=False):
    """Bounded ``dl.wait``: the inline-PTX wait of cuda.py plus a %globaltimer
    check and the abort word; its closing barrier is a block vote: if any
    thread expired or saw the abort word, the whole block leaves the kernel.  ``deps=True``: bounded ``dl.wait_deps`` (``slot >= value``, signed;
    reported as kind 4 with cmp ``>=``)."""
    ty = f"i{bits}"
    reg = "l" if bits == 64 else "r"
    nbytes = bits // 8
    name = "ditron_wait_deps_bounded_i32" if deps else f"ditron_wait_bounded_{semantic}_{scope}_{ty}"
    cond, kind, cmp = ("sge", 4, 5) if deps else ("eq", 1, 0)
    if bits == 64:
        widen = "  %ve = add i64 %val, 0\n  %vo = add i64 %v, 0"
    else:
        widen = f"  %ve = zext {ty} %val to i64\n  %vo = zext {ty} %v to i64"
    return name, f"""
define i32 @{name}(i64 %ptr, i32 %n, {ty} %val) #1 {{
entry:
{_sreg('%tid', 'tid.x')}
{_sreg('%nt', 'ntid.x')}
{_globaltimer('%t0')}
{_world('%tmo', _W['wait_timeout_ns'])}
  br label %next
next:
  %i = phi i32 [%tid, %entry], [%i2, %adv]
  %more = icmp ult i32 %i, %n
  br i1 %more, label %poll, label %done
poll:
  %iw = zext i32 %i to i64
  %off = mul i64 %iw, {nbytes}
  %a = add i64 %ptr, %off
  br label %spin
spin:
  %v = {_asm(f"ld.{semantic}.{scope}.global.b{bits} $0, [$1];", f"={reg},l,~{{memory}}", ret=ty, args="i64 %a")}
  %ok = icmp {cond} {ty} %v, %val
  br i1 %ok, label %adv, label %check
check:
{_expired('c', '%t0', '%tmo', '1')}
  br i1 %c.exp, label %fail, label %chk.ab
chk.ab:
  %ab = call i1 @ditron_aborted()
  br i1 %ab, label %done, label %spin
fail:
{widen}
  call void @ditron_hang(i64 %a, i64 %ve, i64 %vo, i64 %c.dt, i32 {kind}, i32 {cmp})
  br label %done
adv:
  %i2 = add i32 %i, %nt
  br label %next
done:
  %mine = phi i32 [0, %next], [1, %chk.ab], [1, %fail]
  %any = call i32 @ditron_block_any(i32 %mine)
{LEAVE_IF_ANY}
}}"""


def _poll_timeout_fn():
    """``ditron_poll_timeout(t0, addr, expected, observed, pending)``: for a
    pending element, report once the world's timeout has passed since ``t0``
    (dl.poll_timeout; called elementwise, so not convergent); the thread
    leaves the kernel then, or as soon as the abort word is set (checked for
    every element, pending or not, so every thread of the polling loop
    leaves)."""
    return f"""
define i32 @ditron_poll_timeout(i64 %t0, i64 %addr, i64 %exp, i64 %obs, i32 %pending) #0 {{
entry:
  %ab = call i1 @ditron_aborted()
  br i1 %ab, label %leave, label %test
test:
  %p = icmp ne i32 %pending, 0
  br i1 %p, label %check, label %ok
check:
{_world('%tmo', _W['wait_timeout_ns'])}
{_expired('c', '%t0', '%tmo', '1')}
  br i1 %c.exp, label %fail, label %ok
fail:
  call void @ditron_hang(i64 %addr, i64 %exp, i64 %obs, i64 %c.dt, i32 5, i32 0)
  br label %leave
leave:
  call void @ditron_exit()
  unreachable
ok:
  ret i32 0
}}"""


def add_bounded(lib):
    """Define the hang report, the abort functions and the bounded waits in ``lib``."""
    lib.declare("llvm.nvvm.barrier0", "declare void @llvm.nvvm.barrier0()")
    lib.define("ditron_hang", _hang_fn())
    lib.define("ditron_abort", _abort_fns())
    lib.define("ditron_poll_timeout", _poll_timeout_fn())
    for semantic in ("acquire", "relaxed"):
        for scope in ("gpu", "sys"):
            for bits in (32, 64):
                name, text = _wait_bounded_fn(semantic, scope, bits)
                lib.define(name, text)
    name, text = _wait_bounded_fn("acquire", "gpu", 32, deps=True)
    lib.define(name, text)
