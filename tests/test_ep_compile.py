"""sm_90a compile sweep of the EP kernels (kernels/ep_kernels.py, kernels/ep_ll_kernels.py) over the tile
configurations kernels/ep.py picks (``ep.ep_tiles`` + ``ep.launch_constexprs``) for the sizes that
``ditron.deep_ep`` and ditron's own EP API give them, with the integer specialisation a launch would get (``H``
divisible by 16, or 1).  Runs under every supported Triton (3.6 and 3.9).  Each compile is also checked for what
it links: one node, global loads and stores and no NVSHMEM; two nodes, NVSHMEM calls on the inter-node paths
(``MULTI_NODE``).

Why: Triton 3.6 aborted compiling the normal-mode dispatch of ``ditron.deep_ep`` on an H100
(``ScanOpToLLVM.cpp:265``, ``AddPartialReduceOneWarp``, bench/results/h100-2026-12-07-fp8): with one local
expert (``ELP = 2``) and ``H % 16 == 0`` the layout passes gave the ``[WP, ELP]`` count tile the row copy's
vectorised layout (``sizePerThread = [1, 8]``), and 3.6's scan lowering asserts on a layout that holds more
elements per thread along a dimension than the tile has.  The kernels now take small prefix sums with
reductions (kernels/all_to_all.py ``_exclusive_cumsum``).  A C++ assertion kills the process, so every
configuration compiles in a forked child and a failure is reported with its message.

Every configuration is a distinct set of constexprs; there are ~1100 of them (one node), so by default the
test compiles, under Triton 3.6 (the GPU machines' Triton, whose scan lowering aborted), a cover in which every
(constexpr, value) of a kernel appears at least once, plus the configurations that failed on a GPU (~40
compiles); under newer Tritons, and for two nodes, one configuration per kernel and the failed ones.
``DITRON_EP_COMPILE_SWEEP=1`` forces the cover, ``=2`` compiles a pairwise cover (~130), ``=all`` all of them,
``=first`` one per kernel.
"""
import inspect
import multiprocessing
import os
import tempfile

import pytest
import torch

from conftest import GPU_BACKEND

BF, F16, F32 = torch.bfloat16, torch.float16, torch.float32
_I64 = {"tok_ptr", "send_ptr", "rc_ptr", "rcnt_ptr", "cnt_ptr", "cstage_ptr", "sig_ptr", "calls_ptr", "pos_ptr",
        "lrc_ptr", "lrecv_ptr", "lcnt_ptr", "lstage_ptr", "peid_ptr", "pslot_ptr", "lcomb_ptr", "start_ptr",
        "trace_ptr", "key_ptr", "skey_ptr", "sslot_ptr", "dropped_ptr", "rcalls_ptr"}
_I32 = {"hist_ptr", "rslot_ptr"}
_DATA = {"x_ptr", "out_ptr", "buf_ptr", "stage_ptr", "y_ptr", "cbuf_ptr"}
_TY = {BF: "bf16", F16: "fp16", F32: "fp32", torch.int64: "i64", torch.int32: "i32"}


def _cases():
    """``(mode, W, num_experts, H, dtype, T, k, use_fp8, idx dtype)`` that reach the kernels."""
    out = []
    for W in (1, 2, 3, 4, 8):
        # ditron.deep_ep normal dispatch / combine (ditron/deep_ep.py): num_experts = topk = W; the rows (bf16
        # hidden), the fp8 codes as 16-bit words (hidden / 2), the metadata (1 + 2 topk fp32), the fp8 scales
        # (hidden / 128 fp32) and the combined topk weights (topk fp32)
        for T in (1, 128, 4096):
            for kk in (1, 8):
                for H, dt in ((7168, BF), (3584, BF), (1 + 2 * kk, F32), (56, F32), (kk, F32)):
                    out.append(("normal", W, W, H, dt, T, W, False, torch.int64))
        # ditron's API (and deep_ep's low-latency calls): E_local experts per rank, both modes, fp8 payloads
        for El in (1, 2, 8, 32):
            for H, dt in ((7168, BF), (4096, F16), (2048, F32), (72, BF)):
                for T, k in ((1, 1), (128, 8), (4096, 8)):
                    idt = torch.int32 if T == 128 else torch.int64
                    out.append(("normal", W, W * El, H, dt, T, k, False, idt))
                    for fp8 in ((False, True) if H % 128 == 0 and dt != F32 else (False,)):
                        out.append(("low_latency", W, W * El, H, dt, T, k, fp8, idt))
    return out


def _spec(v):
    return "one" if v == 1 else "div16" if v % 16 == 0 else "any"


def _keys(case, two_nodes):
    """``(key, case)`` per kernel the case launches: the key is what a compile depends on (kernel, constexprs,
    warps, dtypes, integer specialisation)."""
    from ditron.kernels import ep
    mode, W, E, H, dt, T, k, fp8, idt = case
    t = ep.ep_tiles(mode, W, E, H, dt, sms=132, nnodes=2 if two_nodes else 1)
    for name, (const, warps) in ep.launch_constexprs(t, T * k, k, dt, use_fp8=fp8).items():
        ints = {"H": H, "HW": t.hw, "K": k}
        spec = tuple(sorted((n, _spec(v)) for n, v in ints.items() if n in _SPECIALISED[name]))
        yield (name, tuple(sorted(const.items())), warps, _TY[dt], spec,
               _TY[idt] if name in ("ep_route_kernel", "ep_ll_dispatch_kernel") else ""), case


def _configs(two_nodes, how="1"):
    """``{key: case}``: one case per distinct compile."""
    seen = {}
    for case in _cases():
        mode, W, E, H, dt, T, k, fp8, idt = case
        if two_nodes and (W != 2 or E > 2 * W or T != 128) and how != "all":
            continue                # two nodes: the multi-node paths at the smallest tiles (ELP = WP = 2)
        if two_nodes and (W < 2 or W % 2):
            continue
        for key, c in _keys(case, two_nodes):
            seen.setdefault(key, c)
    return seen


#: integer parameters a launch specialises on (the others are in the kernel's do_not_specialize)
_SPECIALISED = {"ep_route_kernel": {"K"}, "ep_dispatch_kernel": {"H"}, "ep_combine_kernel": {"H"},
                "ep_ll_dispatch_kernel": {"K", "H", "HW"}, "ep_ll_combine_kernel": {"H", "HW"}}


def _cover(seen, width):
    """A greedy cover of each kernel's configurations: every ``width`` (1 or 2) of its (field, value) -- a
    constexpr, the warps, the dtypes, the specialisation -- in at least one compiled configuration."""
    bykern = {}
    for key, case in seen.items():
        fields = dict(key[1])
        fields.update({f"_{i}": v for i, v in enumerate(key[2:])})
        bykern.setdefault(key[0], []).append((key, case, fields))
    picked = []
    for items in bykern.values():
        def tuples(f):
            ks = sorted(f)
            if width == 1:
                return {(a, f[a]) for a in ks}
            return {((a, f[a]), (b, f[b])) for i, a in enumerate(ks) for b in ks[i + 1:]}
        todo = set().union(*(tuples(f) for _, _, f in items))
        while todo:
            best = max(items, key=lambda it: len(tuples(it[2]) & todo))
            todo -= tuples(best[2])
            picked.append(best[:2])
    return picked


#: cases compiled whatever the cover: ditron.deep_ep's normal dispatch at 2 ranks with an fp8 payload
#: (bench/results/h100-2026-12-07-fp8: Triton 3.6 aborted on its dispatch kernel)
_MUST = [("normal", 2, 2, H, dt, 128, 2, False, torch.int64) for H, dt in ((3584, BF), (17, F32), (56, F32))]


def _default_sweep():
    """The cover under Triton 3.6 (whose scan lowering aborted on a layout; the GPU machines run it), the first
    configuration of each kernel under newer Tritons (CI time: the cover is ~40 compiles a Triton)."""
    import triton
    return "1" if tuple(int(x) for x in triton.__version__.split(".")[:2]) == (3, 6) else "first"


def _params(two_nodes):
    how = os.environ.get("DITRON_EP_COMPILE_SWEEP") or _default_sweep()
    seen = _configs(two_nodes, how)
    chosen = list(seen.items()) if how == "all" else _cover(seen, 1 if how == "first" else int(how))
    if (two_nodes and how == "1") or how == "first":
        # two nodes by default, and one node under Triton > 3.6: the cover's first configuration of each kernel
        # (the multi-node paths link NVSHMEM's bitcode, ~4 s a compile; the one-node cover already has every tile
        # constexpr's values)
        firsts = {}
        for key, c in chosen:
            firsts.setdefault(key[0], (key, c))
        chosen = list(firsts.values())
    keys = {key for key, _ in chosen}
    for case in _MUST:                              # the configurations that failed on a GPU, whatever the cover
        for key, c in _keys(case, two_nodes):
            if key not in keys:
                chosen.append((key, c))
                keys.add(key)
    return [pytest.param(key, case, id=f"{key[0]}-{i}") for i, (key, case) in enumerate(chosen)]


def _compile(key, case, two_nodes):
    import ditron
    from ditron import _compat
    from ditron.kernels import ep_kernels, ep_ll_kernels
    name, const, warps = key[0], dict(key[1]), key[2]
    mode, W, E, H, dt, T, k, fp8, idt = case
    kern = getattr(ep_ll_kernels if name.startswith("ep_ll_") else ep_kernels, name)
    hw = (H + (4 // dt.itemsize) - 1) // (4 // dt.itemsize)
    ints = {"H": H, "HW": hw, "K": k}
    sig, attrs = {}, {}
    for i, p in enumerate(inspect.signature(kern.fn).parameters):
        if p in const:
            continue
        if p.endswith("_ptr"):
            if name == "ep_ll_dispatch_kernel" and p in ("out_ptr", "scale_ptr"):
                ty = ("*i32" if p == "out_ptr" else "*fp32") if fp8 else ("*" + _TY[dt] if p == "out_ptr" else "*i64")
            elif p == "idx_ptr":
                ty = "*" + _TY[idt]
            elif p == "w_ptr":
                ty = "*fp32"
            elif p == "rcnt_ptr" and name == "ep_ll_dispatch_kernel":
                ty = "*i64"
            else:
                ty = "*i64" if p in _I64 else "*i32" if p in _I32 else "*" + _TY[dt] if p in _DATA else None
            assert ty is not None, (name, p)
            sig[p] = ty
            attrs[(i,)] = _compat.divisibility_attr(16)
        elif p in _SPECIALISED[name] and ints[p] == 1:
            const[p] = 1
        else:
            sig[p] = "i32"
            if p in _SPECIALISED[name] and ints[p] % 16 == 0:
                attrs[(i,)] = _compat.divisibility_attr(16)
    ck = ditron.compile(kern, target="sm_90a", signature=sig, constexprs=const, attrs=attrs, num_warps=warps)
    ptx = ck.asm["ptx"]
    assert "ld.global" in ptx and "st.global" in ptx, "no global loads / stores in the PTX"
    if not two_nodes:
        assert "nvshmem" not in ptx, "one node: loads and stores only, no NVSHMEM linked"
    elif const.get("MULTI_NODE"):
        assert "nvshmem" in ck.asm["llir"], "two nodes: the inter-node paths call NVSHMEM"


def _child(key, case, two_nodes, err_path, conn):
    fd = os.open(err_path, os.O_WRONLY)
    os.dup2(fd, 2)
    try:
        _compile(key, case, two_nodes)
        conn.send(None)
    except BaseException as e:          # noqa: BLE001 -- reported to the parent
        conn.send(f"{type(e).__name__}: {e}")


def _compile_isolated(key, case, two_nodes):
    """Compile in a forked child: Triton's C++ assertions abort the process."""
    ctx = multiprocessing.get_context("fork")
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as err:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(key, case, two_nodes, err.name, child))
        p.start()
        child.close()
        msg = parent.recv() if parent.poll(300) else "no answer in 300 s"
        p.join(30)
        if p.exitcode != 0 and msg is None:
            msg = f"exit code {p.exitcode}"
        err.seek(0)
        tail = "\n".join(line for line in err.read().splitlines()
                         if "Assertion" in line or "error" in line.lower())[-2000:]
    return msg, tail


def _check(key, case, two_nodes):
    msg, tail = _compile_isolated(key, case, two_nodes)
    mode, W, E, H, dt, T, k, fp8, idt = case
    assert msg is None, (f"{key[0]} did not compile for sm_90a ({mode}, world {W}, {E} experts, hidden {H} "
                         f"{dt}, {T} tokens x top-{k}, fp8={fp8}; constexprs {dict(key[1])}, {key[2]} warps, "
                         f"{key[4]}): {msg}\n{tail}")


@pytest.mark.parametrize("key,case", _params(False))
def test_ep_kernels_compile_for_sm90a_one_node(key, case):
    _check(key, case, False)


@pytest.mark.skipif(GPU_BACKEND == "p2p", reason="under a live P2P world shmem.* lower to loads and stores, "
                                                  "not NVSHMEM calls (CPU compile test)")
@pytest.mark.parametrize("key,case", _params(True))
def test_ep_kernels_compile_for_sm90a_two_nodes(nvshmem_bc, key, case):
    _check(key, case, True)


def test_sweep_holds_the_configuration_that_aborted():
    # deep_ep's normal dispatch at 2 ranks, fp8 codes as 16-bit words (hidden 7168 -> 3584): one local expert
    # (ELP 2), BH 1024, H % 16 == 0 -- and its metadata / scale rows (fp32, BH 64)
    from ditron.kernels import ep
    keys = {p.values[0] for p in _params(False)}
    for H, dt in ((3584, BF), (17, F32), (56, F32)):
        const, warps = ep.launch_constexprs(ep.ep_tiles("normal", 2, 2, H, dt, sms=132), 256, 2, dt)[
            "ep_dispatch_kernel"]
        assert const["ELP"] == 2 and const["WP"] == 2 and const["BH"] == (1024 if H > 1024 else 64)
        assert ("ep_dispatch_kernel", tuple(sorted(const.items())), warps, _TY[dt], (("H", _spec(H)),), "") in keys
