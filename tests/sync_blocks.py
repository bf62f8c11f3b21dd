"""Read the synchronisation code a GPU will execute, structurally.

* :func:`ptx_blocks` cuts the inline-asm blocks out of a kernel's PTX (between
  ``// begin inline asm`` and ``// end inline asm``) into instruction lists;
  :func:`run_ptx` executes one block for one thread on a tiny PTX machine
  (the handful of instructions ditron's rules emit; anything else fails) and
  returns the trace of memory-model events: ``("ld", sem, scope, addr)``,
  ``("st"|"red", sem, scope, addr, value)``, ``("fence", sem, scope)``,
  ``("bar",)``.  Loads read successive values from a script per address, so
  a test can say "the word reads 6, then 8, then 7" and check when the loop
  exits -- the compare and the branch direction, not the presence of a string.
* :func:`llvm_function` parses one function of a device library (LLVM IR)
  into ``{block label: [instruction, ...]}``; :func:`ir_events` lists the
  memory-model events of a block in order.
"""
import re

# ---------------------------------------------------------------------------
# PTX
# ---------------------------------------------------------------------------


def ptx_blocks(ptx):
    """The inline-asm blocks of ``ptx``, each a list of statements (labels end in ':')."""
    out = []
    for body in re.findall(r"// begin inline asm\n(.*?)// end inline asm", ptx, re.S):
        stmts = []
        for raw in re.split(r"[;\n]", body):
            s = raw.strip().strip("{}").strip()
            if not s or s.startswith((".reg", "//", ".loc", ".file")):   # Triton 3.9 puts .loc lines inside asm blocks
                continue
            stmts.append(s)
        out.append(stmts)
    return out


def sync_blocks(ptx, marker):
    """The inline-asm blocks of ``ptx`` that contain an instruction starting with ``marker``."""
    return [b for b in ptx_blocks(ptx) if any(_opcode(s).startswith(marker) for s in b)]


def _opcode(stmt):
    s = stmt
    if s.startswith("@"):
        s = s.split(None, 1)[1] if " " in s else ""
    return s.split(None, 1)[0] if s else ""


class PtxHang(AssertionError):
    pass


_MASK = {16: 0xFFFF, 32: 0xFFFFFFFF, 64: 0xFFFFFFFFFFFFFFFF}


def _signed(v, bits):
    v &= _MASK[bits]
    return v - (1 << bits) if v >> (bits - 1) else v


def run_ptx(block, regs, memory, *, tid=0, ntid=1, max_steps=2000):
    """Execute ``block`` for thread ``tid`` of ``ntid``.  ``regs``: the values
    of the block's operands (outer registers such as ``%r4``); ``memory``:
    address -> list of values successive loads read (the last one repeats);
    stores append to the trace (and to memory).  Returns the event trace;
    raises :class:`PtxHang` when the block does not finish."""
    labels = {s[:-1]: i for i, s in enumerate(block) if s.endswith(":")}
    env = dict(regs)
    env["%tid.x"], env["%ntid.x"] = tid, ntid
    reads = {a: 0 for a in memory}
    trace = []

    def val(x):
        x = x.strip()
        if x in env:
            return env[x]
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", x):
            return int(x, 0)
        raise AssertionError(f"unknown operand {x!r} in {block}")

    def addr(x):
        m = re.fullmatch(r"\[\s*([^\]+]+?)\s*(?:\+\s*(\d+))?\s*\]", x.strip())
        assert m, x
        return val(m.group(1)) + int(m.group(2) or 0)

    def load(a):
        seq = memory.get(a)
        assert seq, f"load of address {a}, which the test did not script"
        k = reads.get(a, 0)
        reads[a] = k + 1
        return seq[min(k, len(seq) - 1)]

    pc = steps = 0
    while pc < len(block):
        steps += 1
        if steps > max_steps:
            raise PtxHang(f"thread {tid} still running after {max_steps} steps; trace {trace[-6:]}")
        s = block[pc]
        pc += 1
        if s.endswith(":"):
            continue
        pred = None
        if s.startswith("@"):
            pred, s = s.split(None, 1)
        op, _, rest = s.partition(" ")
        args = [a.strip() for a in re.split(r",(?![^\[]*\])", rest)] if rest.strip() else []
        if pred is not None:
            neg = pred.startswith("@!")
            p = bool(env[pred[2:] if neg else pred[1:]])
            if p == neg:
                continue
        parts = op.split(".")
        head = parts[0]
        if head == "mov":
            env[args[0]] = val(args[1])
        elif head == "setp":
            cmp, ty = parts[1], parts[2]
            bits = int(ty[1:])
            a, b = val(args[1]) & _MASK[bits], val(args[2]) & _MASK[bits]
            if ty[0] == "s":
                a, b = _signed(a, bits), _signed(b, bits)
            elif ty[0] == "b":
                assert cmp in ("eq", "ne"), f"{op}: bit types compare for equality only"
            env[args[0]] = {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b,
                            "ge": a >= b}[cmp]
        elif head == "bra":
            pc = labels[args[0]]
        elif head in ("add", "mul"):
            bits = int(parts[-1][1:])
            a, b = val(args[1]), val(args[2])
            r = a + b if head == "add" else a * b
            env[args[0]] = r & (_MASK[64] if "wide" in parts else _MASK[bits])
        elif head == "ld":
            sem, scope = parts[1], parts[2]
            v = load(addr(args[1]))
            env[args[0]] = v
            trace.append(("ld", sem, scope, addr(args[1])))
        elif head == "st":
            sem, scope = parts[1], parts[2]
            a, v = addr(args[0]), val(args[1])
            trace.append(("st", sem, scope, a, v))
            memory[a] = [v]
        elif head == "red":
            sem, scope = parts[1], parts[2]
            assert parts[4] == "add", op
            trace.append(("red", sem, scope, addr(args[0]), val(args[1])))
        elif head == "fence":
            trace.append(("fence", parts[1], parts[2]))
        elif head == "bar":
            assert parts[1] == "sync" and args == ["0"], s
            trace.append(("bar",))
        elif head == "nanosleep":
            pass
        else:
            raise AssertionError(f"run_ptx does not know {op!r} (block {block})")
    return trace


def block_operands(block, names):
    """The outer registers of ``block`` in the order its instructions use
    them: ``names`` maps a role to (instruction prefix, operand index), e.g.
    ``{"n": ("setp.ge", 2)}``."""
    out = {}
    for role, (prefix, idx) in names.items():
        for s in block:
            op = _opcode(s)
            if op.startswith(prefix):
                rest = s.split(op, 1)[1]
                out[role] = [a.strip() for a in re.split(r",(?![^\[]*\])", rest)][idx]
                break
        else:
            raise AssertionError(f"no {prefix} in {block}")
    return out


# ---------------------------------------------------------------------------
# LLVM IR of the device libraries
# ---------------------------------------------------------------------------


def llvm_function(text, name):
    """``{label: [instruction, ...]}`` of function ``@name`` in library text
    ``text`` (the entry block is ``"entry"`` when it has no label)."""
    m = re.search(r"^define [^@]*@" + re.escape(name) + r"\(.*?\{\n(.*?)^\}", text, re.S | re.M)
    assert m, f"no function {name} in the library"
    blocks, label = {}, "entry"
    for raw in m.group(1).splitlines():
        s = raw.strip()
        if not s or s.startswith(";"):
            continue
        if re.fullmatch(r"[\w.]+:", s):
            label = s[:-1]
            continue
        blocks.setdefault(label, []).append(s)
    return blocks


_SCOPES = {'syncscope("workgroup")': "cta", 'syncscope("agent")': "gpu"}


def _ir_scope(s):
    for k, v in _SCOPES.items():
        if k in s:
            return v
    return "sys"


def ir_events(instrs):
    """Memory-model events of LLVM IR instructions, in order: ``("load", order, scope)``,
    ``("store", order, scope)``, ``("rmw", op, order, scope)``, ``("fence", order, scope)``,
    ``("barrier",)``, ``("asm", text)`` for inline PTX, ``("call", name)`` for other calls,
    ``("br", cond, true_label, false_label)`` / ``("br", label)``, ``("icmp", pred, type, a, b)``."""
    out = []
    for s in instrs:
        m = re.search(r"\bload atomic \w+, ptr[^,]*, ptr addrspace\(\d\) %\w+ (.*?)(\w+), align", s) or \
            re.search(r"\bload atomic \w+, ptr addrspace\(\d\) %[\w.]+ (.*?)(\w+), align", s)
        if m:
            out.append(("load", m.group(2), _ir_scope(m.group(1))))
            continue
        m = re.search(r"\bstore atomic \w+ [%\w.]+, ptr addrspace\(\d\) %[\w.]+ (.*?)(\w+), align", s)
        if m:
            out.append(("store", m.group(2), _ir_scope(m.group(1))))
            continue
        m = re.search(r"\batomicrmw (\w+) ptr addrspace\(\d\) %[\w.]+, \w+ [%\w.]+ (.*?)(\w+), align", s)
        if m:
            out.append(("rmw", m.group(1), m.group(3), _ir_scope(m.group(2))))
            continue
        m = re.match(r"fence (.*?)(\w+)$", s)
        if m:
            out.append(("fence", m.group(2), _ir_scope(m.group(1))))
            continue
        if "@llvm.amdgcn.s.barrier" in s or "@llvm.nvvm.barrier0" in s:
            out.append(("barrier",))
            continue
        m = re.search(r'asm sideeffect "([^"]*)"', s)
        if m:
            out.append(("asm", m.group(1)))
            continue
        m = re.match(r"(?:%[\w.]+ = )?call \S+ @([\w.]+)", s)
        if m:
            out.append(("call", m.group(1)))
            continue
        m = re.match(r"br i1 (%[\w.]+), label %([\w.]+), label %([\w.]+)", s)
        if m:
            out.append(("br", m.group(1), m.group(2), m.group(3)))
            continue
        m = re.match(r"br label %([\w.]+)", s)
        if m:
            out.append(("br", m.group(1)))
            continue
        m = re.match(r"(%[\w.]+) = icmp (\w+) (\w+) ([%\w.-]+), ([%\w.-]+)", s)
        if m:
            out.append(("icmp",) + m.groups()[1:] + (m.group(1),))
    return out
