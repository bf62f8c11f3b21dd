"""NVIDIA device-library pieces for the P2P transport (bounded waits: cuda_bounded.py).

* **P2P** (one node, no NVSHMEM): ``shmem.*`` calls become loads, stores and
  atomics through the symmetric-heap deltas of the world descriptor, with
  NVSHMEM's semantics (``ditron_p2p_*``).  Data moves with 16-byte vector
  accesses when source and destination share their alignment modulo 16;
  signals are ``st.release.sys`` / ``red.release.sys.add`` on the peer's word;
  waits poll with ``ld.acquire.sys``; ``quiet`` / ``fence`` are ``fence.sc.sys``;
  ``barrier_all`` / ``sync_all`` use per-rank arrival words in a runtime-owned
  symmetric *sync area* (world word :data:`SYNC_AREA_WORD`) with a monotonically
  increasing generation, so the barrier can be reused any number of times
  without resetting anything.
* **Bounded** variants of ``shmem.signal_wait_until`` and of the P2P barrier
  (``DITRON_WAIT_TIMEOUT_S``): the timer check (:func:`_expired`) and the
  abort word; the report and the other bounded waits are in cuda_bounded.py.
  The runtime *sync area* (world word :data:`SYNC_AREA_WORD`) also holds the
  abort word (:data:`SYNC_HANG_CLAIM`).

Everything here is LLVM IR text using only inline PTX and world-descriptor
reads; no NVSHMEM symbol is referenced.
"""
from __future__ import annotations

from . import devlib

#: the end of a bounded function after its vote (``%any``: whether any thread of the group saw an expired
#: wait or the abort word): then every thread leaves the kernel, else the function returns 0
LEAVE_IF_ANY = """  %stop = icmp ne i32 %any, 0
  br i1 %stop, label %leave, label %out
leave:
  call void @ditron_exit()
  unreachable
out:
  ret i32 0"""

#: extra world-descriptor words used by the GPU runtime (devlib reserves 11..15)
SYNC_AREA_WORD = 11          # address of this rank's sync area (in its own symmetric heap)
#: layout of the sync area (64-bit words)
SYNC_GEN = 0                 # barrier generation of this rank (touched only by this rank)
SYNC_HANG_CLAIM = 1          # first timed-out waiter claims the report slot here: the abort word every bounded wait polls
SYNC_ARRIVE = 8              # arrival word of local rank i at SYNC_ARRIVE + i
SYNC_AREA_BYTES = 4096

#: sig_op values of the ditron_p2p_* functions
P2P_SIGNAL = {"set": 0, "add": 1}

_W = devlib.WORLD_FIELDS


def _world(reg, idx):
    return f"  {reg} = call i64 @ditron_world_get(i32 {idx})"


def _asm(text, constraints, ret="void", args=""):
    return f'call {ret} asm sideeffect "{text}", "{constraints}"({args})'


def _sreg(reg, name):
    return f'  {reg} = call i32 asm "mov.u32 $0, %{name};", "=r"()'


def _globaltimer(reg):
    return f'  {reg} = call i64 asm sideeffect "mov.u64 $0, %globaltimer;", "=l"()'


_BAR = '  call void @llvm.nvvm.barrier0()'
_WARP_SYNC = '  call void @llvm.nvvm.bar.warp.sync(i32 -1)'


def _byte_loop(name, dst, src, lo, hi, idx, stride, next_label):
    """Strided byte copy of [lo, hi) (element k by thread idx, idx+stride, ...)."""
    return f"""  %{name}.k0 = add i64 {lo}, {idx}
  br label %{name}.cond
{name}.cond:
  %{name}.k = phi i64 [%{name}.k0, %{name}.pre], [%{name}.kn, %{name}.body]
  %{name}.ok = icmp ult i64 %{name}.k, {hi}
  br i1 %{name}.ok, label %{name}.body, label %{next_label}
{name}.body:
  %{name}.sa = add i64 {src}, %{name}.k
  %{name}.da = add i64 {dst}, %{name}.k
  %{name}.sp = inttoptr i64 %{name}.sa to ptr addrspace(1)
  %{name}.dp = inttoptr i64 %{name}.da to ptr addrspace(1)
  %{name}.v = load i8, ptr addrspace(1) %{name}.sp, align 1
  store i8 %{name}.v, ptr addrspace(1) %{name}.dp, align 1
  %{name}.kn = add i64 %{name}.k, {stride}
  br label %{name}.cond"""


def _vec_ops(tag, idx_reg):
    """Load (or store) one 16-byte vector at vector index ``idx_reg`` relative to %vd/%vs."""
    return (f"  %{tag}.o = shl i64 {idx_reg}, 4\n"
            f"  %{tag}.sa = add i64 %vs, %{tag}.o\n"
            f"  %{tag}.da = add i64 %vd, %{tag}.o\n"
            f"  %{tag}.sp = inttoptr i64 %{tag}.sa to ptr addrspace(1)\n"
            f"  %{tag}.dp = inttoptr i64 %{tag}.da to ptr addrspace(1)\n")


def _copy_fn():
    """``ditron_p2p_copy(dst, src, n, idx, stride)``: threads idx, idx+stride, ...
    copy n bytes.  Head bytes up to 16-byte alignment, a 4x-unrolled 16-byte
    vector body, tail bytes; everything bytewise when dst and src are not
    congruent modulo 16."""
    u = []
    for j in range(4):
        u.append(f"  %u{j}.i = add i64 %ui, %us{j}")
    loads, stores = [], []
    for j in range(4):
        loads.append(_vec_ops(f"u{j}", f"%u{j}.i") + f"  %u{j}.v = load <4 x i32>, ptr addrspace(1) %u{j}.sp, align 16")
        stores.append(f"  store <4 x i32> %u{j}.v, ptr addrspace(1) %u{j}.dp, align 16")
    unrolled = "\n".join(u + loads + stores)
    return f"""
define void @ditron_p2p_copy(i64 %dst, i64 %src, i64 %n, i64 %idx, i64 %stride) #0 {{
entry:
  %x = xor i64 %dst, %src
  %xm = and i64 %x, 15
  %cong = icmp eq i64 %xm, 0
  %neg = sub i64 0, %dst
  %h16 = and i64 %neg, 15
  %hmin = call i64 @llvm.umin.i64(i64 %h16, i64 %n)
  %head = select i1 %cong, i64 %hmin, i64 %n
  br label %h.pre
h.pre:
{_byte_loop("h", "%dst", "%src", "0", "%head", "%idx", "%stride", "v.pre")}
v.pre:
  %rest = sub i64 %n, %head
  %nv = lshr i64 %rest, 4
  %vd = add i64 %dst, %head
  %vs = add i64 %src, %head
  %us0 = add i64 0, 0
  %us1 = add i64 %stride, 0
  %us2 = shl i64 %stride, 1
  %us3 = mul i64 %stride, 3
  %us4 = shl i64 %stride, 2
  br label %u.cond
u.cond:
  %ui = phi i64 [%idx, %v.pre], [%ui.n, %u.body]
  %ulast = add i64 %ui, %us3
  %uok = icmp ult i64 %ulast, %nv
  br i1 %uok, label %u.body, label %s.cond
u.body:
{unrolled}
  %ui.n = add i64 %ui, %us4
  br label %u.cond
s.cond:
  %si = phi i64 [%ui, %u.cond], [%si.n, %s.body]
  %sok = icmp ult i64 %si, %nv
  br i1 %sok, label %s.body, label %t.pre
s.body:
{_vec_ops("s", "%si")}  %s.v = load <4 x i32>, ptr addrspace(1) %s.sp, align 16
  store <4 x i32> %s.v, ptr addrspace(1) %s.dp, align 16
  %si.n = add i64 %si, %stride
  br label %s.cond
t.pre:
  %vb = shl i64 %nv, 4
  %tlo = add i64 %head, %vb
{_byte_loop("t", "%dst", "%src", "%tlo", "%n", "%idx", "%stride", "done")}
done:
  ret void
}}"""


def _cmp_fn():
    return """
define i1 @ditron_cmp_u64(i32 %cmp, i64 %a, i64 %b) #0 {
entry:
  switch i32 %cmp, label %ne [ i32 0, label %eq
                               i32 2, label %gt
                               i32 3, label %le
                               i32 4, label %lt
                               i32 5, label %ge ]
eq:
  %r0 = icmp eq i64 %a, %b
  ret i1 %r0
ne:
  %r1 = icmp ne i64 %a, %b
  ret i1 %r1
gt:
  %r2 = icmp ugt i64 %a, %b
  ret i1 %r2
le:
  %r3 = icmp ule i64 %a, %b
  ret i1 %r3
lt:
  %r4 = icmp ult i64 %a, %b
  ret i1 %r4
ge:
  %r5 = icmp uge i64 %a, %b
  ret i1 %r5
}"""


def _expired(prefix, t0, timeout, bounded):
    """IR computing %<prefix>.exp (i1): bounded and 0 < timeout < now - t0."""
    return f"""{_globaltimer(f'%{prefix}.now')}
  %{prefix}.dt = sub i64 %{prefix}.now, {t0}
  %{prefix}.over = icmp ugt i64 %{prefix}.dt, {timeout}
  %{prefix}.has = icmp ne i64 {timeout}, 0
  %{prefix}.b = icmp ne i32 {bounded}, 0
  %{prefix}.e0 = and i1 %{prefix}.over, %{prefix}.has
  %{prefix}.exp = and i1 %{prefix}.e0, %{prefix}.b"""


def _signal_wait_fn(bounded):
    """``ditron_signal_wait_until[_bounded](sig, cmp, value)``: NVSHMEM's
    signal_wait_until on a local 64-bit word (acquire, system scope); the
    bounded version also watches the world's timeout."""
    name = "ditron_signal_wait_until" + ("_bounded" if bounded else "")
    if bounded:
        pre = f"{_globaltimer('%t0')}\n{_world('%tmo', _W['wait_timeout_ns'])}"
        miss = f"""check:
{_expired('c', '%t0', '%tmo', '1')}
  br i1 %c.exp, label %fail, label %chk.ab
chk.ab:
  %ab = call i1 @ditron_aborted()
  br i1 %ab, label %leave, label %spin
fail:
  call void @ditron_hang(i64 %sig, i64 %val, i64 %v, i64 %c.dt, i32 2, i32 %cmp)
  br label %leave
leave:
  call void @ditron_exit()
  unreachable"""
        target = "check"
    else:
        pre, miss, target = "", "", "spin"
    return name, f"""
define i64 @{name}(i64 %sig, i32 %cmp, i64 %val) #0 {{
entry:
{pre}
  br label %spin
spin:
  %v = {_asm("ld.acquire.sys.global.b64 $0, [$1];", "=l,l,~{memory}", ret="i64", args="i64 %sig")}
  %ok = call i1 @ditron_cmp_u64(i32 %cmp, i64 %v, i64 %val)
  br i1 %ok, label %done, label %{target}
{miss}
done:
  ret i64 %v
}}"""


def _peer_fns():
    return f"""
define i64 @ditron_p2p_ptr(i64 %addr, i32 %pe) #0 {{
entry:
{_world('%node', _W['node'])}
{_world('%lws', _W['local_world_size'])}
  %first = mul i64 %node, %lws
  %r = sext i32 %pe to i64
  %local = sub i64 %r, %first
  %ok = icmp ult i64 %local, %lws
  br i1 %ok, label %in, label %out
in:
  %slot = add i64 %local, {devlib.WORLD_HEAP_DELTAS}
  %slot32 = trunc i64 %slot to i32
  %d = call i64 @ditron_world_get(i32 %slot32)
  %off = shl i64 %d, 12
  %p = add i64 %addr, %off
  ret i64 %p
out:
  ret i64 0
}}

define i64 @ditron_p2p_remote(i64 %addr, i32 %pe) #0 {{
entry:
  %d = call i64 @ditron_symm_delta(i32 %pe)
  %off = shl i64 %d, 12
  %p = add i64 %addr, %off
  ret i64 %p
}}

define void @ditron_p2p_signal(i64 %raddr, i64 %v, i32 %op) #0 {{
entry:
  %isadd = icmp eq i32 %op, {P2P_SIGNAL['add']}
  br i1 %isadd, label %add, label %set
set:
  {_asm("st.release.sys.global.b64 [$0], $1;", "l,l,~{memory}", args="i64 %raddr, i64 %v")}
  br label %done
add:
  {_asm("red.release.sys.global.add.u64 [$0], $1;", "l,l,~{memory}", args="i64 %raddr, i64 %v")}
  br label %done
done:
  ret void
}}

define i32 @ditron_p2p_signal_op(i64 %sig, i64 %v, i32 %op, i32 %pe) #0 {{
entry:
  %r = call i64 @ditron_p2p_remote(i64 %sig, i32 %pe)
  call void @ditron_p2p_signal(i64 %r, i64 %v, i32 %op)
  ret i32 0
}}

define i32 @ditron_p2p_signal_op_once(i64 %sig, i64 %v, i32 %op, i32 %pe) #1 {{
entry:
{_sreg('%tid', 'tid.x')}
  %z = icmp eq i32 %tid, 0
  br i1 %z, label %do, label %done
do:
  %r = call i64 @ditron_p2p_remote(i64 %sig, i32 %pe)
  call void @ditron_p2p_signal(i64 %r, i64 %v, i32 %op)
  br label %done
done:
  ret i32 0
}}

define i32 @ditron_p2p_quiet() #0 {{
entry:
  {_asm("fence.sc.sys;", "~{memory}")}
  ret i32 0
}}

define i32 @ditron_p2p_fence() #0 {{
entry:
  {_asm("fence.sc.sys;", "~{memory}")}
  ret i32 0
}}"""


#: (index of this thread within the group, group size, sync before, sync after, leader test)
_COOP = {
    "thread": (None, None, "", ""),
    "warp": ("laneid", "32", _WARP_SYNC, _WARP_SYNC),
    "block": ("tid.x", "ntid.x", _BAR, _BAR),
}


def _coop_index(coop):
    sreg, size, _, _ = _COOP[coop]
    if sreg is None:
        return "  %idx = add i64 0, 0\n  %stride = add i64 1, 0\n  %lead = icmp eq i32 0, 0"
    size_ir = (f"  %stride = add i64 {size}, 0" if size.isdigit() else
               f"{_sreg('%nt32', size)}\n  %stride = zext i32 %nt32 to i64")
    return (f"{_sreg('%idx32', sreg)}\n  %idx = zext i32 %idx32 to i64\n{size_ir}\n"
            f"  %lead = icmp eq i32 %idx32, 0")


def _mem_fns():
    out = []
    for coop, (_, _, before, after) in _COOP.items():
        attr = "#0" if coop == "thread" else "#1"
        for op in ("putmem", "getmem"):
            remote = "%dst" if op == "putmem" else "%src"
            d, s = ("%r", "%src") if op == "putmem" else ("%dst", "%r")
            out.append(f"""
define i32 @ditron_p2p_{op}_{coop}(i64 %dst, i64 %src, i64 %n, i32 %pe) {attr} {{
entry:
{before}
{_coop_index(coop)}
  %r = call i64 @ditron_p2p_remote(i64 {remote}, i32 %pe)
  call void @ditron_p2p_copy(i64 {d}, i64 {s}, i64 %n, i64 %idx, i64 %stride)
{after}
  ret i32 0
}}""")
        out.append(f"""
define i32 @ditron_p2p_putmem_signal_{coop}(i64 %dst, i64 %src, i64 %n, i64 %sig, i64 %sv, i32 %op, i32 %pe) {attr} {{
entry:
{before}
{_coop_index(coop)}
  %r = call i64 @ditron_p2p_remote(i64 %dst, i32 %pe)
  call void @ditron_p2p_copy(i64 %r, i64 %src, i64 %n, i64 %idx, i64 %stride)
{after}
  br i1 %lead, label %do.sig, label %done
do.sig:
  %rs = call i64 @ditron_p2p_remote(i64 %sig, i32 %pe)
  call void @ditron_p2p_signal(i64 %rs, i64 %sv, i32 %op)
  br label %done
done:
  ret i32 0
}}""")
    return "\n".join(out)


def _barrier_fns(bounded):
    """Barrier of all PEs by one thread: quiet, bump this rank's generation,
    write it into every local rank's arrival word for this rank (release),
    wait until every arrival word here has reached it (acquire).  Generations
    only grow, so nothing is ever reset and back-to-back barriers cannot race."""
    sfx = "_bounded" if bounded else ""
    if bounded:
        # returns 1 when it expired (reported) or saw the abort word: the caller's group then leaves the kernel
        pre = f"{_globaltimer('%t0')}\n{_world('%tmo', _W['wait_timeout_ns'])}"
        miss = f"""w.check:
{_expired('c', '%t0', '%tmo', '1')}
  br i1 %c.exp, label %fail, label %w.ab
w.ab:
  %ab = call i1 @ditron_aborted()
  br i1 %ab, label %quit, label %w.spin
fail:
  call void @ditron_hang(i64 %qa, i64 %g, i64 %v, i64 %c.dt, i32 3, i32 5)
  br label %quit
quit:
  ret i32 1"""
        target = "w.check"
        rty, ret = "i32", "ret i32 0"
    else:
        pre, miss, target = "", "", "w.spin"
        rty, ret = "void", "ret void"
    one = f"""
define {rty} @ditron_p2p_barrier_one{sfx}() #0 {{
entry:
  {_asm("fence.sc.sys;", "~{memory}")}
{_world('%sync', SYNC_AREA_WORD)}
{_world('%me', _W['local_rank'])}
{_world('%lws', _W['local_world_size'])}
  %gp = inttoptr i64 %sync to ptr addrspace(1)
  %g0 = load volatile i64, ptr addrspace(1) %gp, align 8
  %g = add i64 %g0, 1
  store volatile i64 %g, ptr addrspace(1) %gp, align 8
  %mys = add i64 %me, {SYNC_ARRIVE}
  %myo = shl i64 %mys, 3
  %mine = add i64 %sync, %myo
  br label %s.cond
s.cond:
  %p = phi i64 [0, %entry], [%p.n, %s.body]
  %s.ok = icmp ult i64 %p, %lws
  br i1 %s.ok, label %s.body, label %w.pre
s.body:
  %slot = add i64 %p, {devlib.WORLD_HEAP_DELTAS}
  %slot32 = trunc i64 %slot to i32
  %d = call i64 @ditron_world_get(i32 %slot32)
  %doff = shl i64 %d, 12
  %dst = add i64 %mine, %doff
  {_asm("st.release.sys.global.b64 [$0], $1;", "l,l,~{memory}", args="i64 %dst, i64 %g")}
  %p.n = add i64 %p, 1
  br label %s.cond
w.pre:
{pre}
  br label %w.cond
w.cond:
  %q = phi i64 [0, %w.pre], [%q.n, %w.next]
  %w.ok = icmp ult i64 %q, %lws
  br i1 %w.ok, label %w.addr, label %done
w.addr:
  %qs = add i64 %q, {SYNC_ARRIVE}
  %qo = shl i64 %qs, 3
  %qa = add i64 %sync, %qo
  br label %w.spin
w.spin:
  %v = {_asm("ld.acquire.sys.global.b64 $0, [$1];", "=l,l,~{memory}", ret="i64", args="i64 %qa")}
  %arrived = icmp uge i64 %v, %g
  br i1 %arrived, label %w.next, label %{target}
{miss}
w.next:
  %q.n = add i64 %q, 1
  br label %w.cond
done:
  {ret}
}}"""
    out = [one]
    for coop, (_, _, before, after) in _COOP.items():
        attr = "#0" if coop == "thread" else "#1"
        if not bounded:
            out.append(f"""
define i32 @ditron_p2p_barrier_{coop}() {attr} {{
entry:
{before}
{_coop_index(coop)}
  br i1 %lead, label %do, label %done
do:
  call void @ditron_p2p_barrier_one()
  br label %done
done:
{after}
  ret i32 0
}}""")
            continue
        # bounded: the closing sync is a vote on the leader's outcome, so the whole group leaves or none of it
        vote = {"thread": "  %any = add i32 %mine, 0",
                "warp": "  %any = call i32 @ditron_warp_any(i32 %mine)",
                "block": "  %any = call i32 @ditron_block_any(i32 %mine)"}[coop]
        out.append(f"""
define i32 @ditron_p2p_barrier_{coop}{sfx}() {attr} {{
entry:
{before}
{_coop_index(coop)}
  br i1 %lead, label %do, label %done
do:
  %a = call i32 @ditron_p2p_barrier_one{sfx}()
  br label %done
done:
  %mine = phi i32 [0, %entry], [%a, %do]
{vote}
{LEAVE_IF_ANY}
}}""")
    return "\n".join(out)


def add_p2p(lib):
    """Define the P2P transport functions (and their bounded variants) in
    ``lib`` (which already holds the world descriptor, see devlib.add_world;
    cuda_bounded.add_bounded defines the report and abort functions they call)."""
    lib.declare("llvm.nvvm.barrier0", "declare void @llvm.nvvm.barrier0()")
    lib.declare("llvm.nvvm.bar.warp.sync", "declare void @llvm.nvvm.bar.warp.sync(i32)")
    lib.declare("llvm.umin.i64", "declare i64 @llvm.umin.i64(i64, i64)")
    lib.define("ditron_p2p_copy", _copy_fn())
    lib.define("ditron_cmp_u64", _cmp_fn())
    for bounded in (False, True):
        name, text = _signal_wait_fn(bounded)
        lib.define(name, text)
        lib.define("ditron_p2p_barrier" + ("_bounded" if bounded else ""), _barrier_fns(bounded))
    lib.define("ditron_p2p_peer", _peer_fns())
    lib.define("ditron_p2p_mem", _mem_fns())
