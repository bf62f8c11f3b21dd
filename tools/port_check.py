"""Run Triton-distributed's own kernels, bodies unchanged, on ditron's simulator.

    python tools/port_check.py /path/to/Triton-distributed [--ranks 2 3 4] [--only NAME ...] [--hang-s 15]
    python tools/port_check.py /path/to/Triton-distributed --tutorials [01 02 ...] [--ranks 2] [--no-race]

Given a local checkout of ByteDance-Seed/Triton-distributed (never committed
here), this script

1. extracts kernel functions from its tutorials and intra-node NVIDIA
   collectives -- each ``def`` exactly as written (its ``@...jit`` decorator
   and body), with the ``triton`` / ``triton_dist`` import lines of the file
   it comes from, also as written -- into a generated module in a temporary
   directory;
2. launches it on ``N`` simulated ranks (``ditron.sim.pool.SimCluster``, the
   engine of ``ditron sim``) for N in ``--ranks``, with host code written here
   on ``triton_dist.utils`` (symmetric tensors, barriers), and compares the
   result with a torch reference;
3. prints a pass / fail table; a failure shows its first line of error, a
   hang is reported by the simulator's deadlock watchdog.

Only the host drivers and the list of kernels are ditron's; every kernel body
is read from the checkout at run time.

``--tutorials`` instead runs the tutorial *scripts* of the checkout, host code
included, under ``ditron sim -n N``, each with only the two-line port applied
(the lines ``import nvshmem.core`` and ``nvshmem.core.finalize()`` deleted;
docs/porting.md section 3.1), and prints one line per run: pass, or the
launcher's first line of failure.  The ``note`` column says why a kernel
is expected to fail (docs/porting.md has the details).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
import tempfile

# ---------------------------------------------------------------------------
# what to extract: case -> (kernels to launch and their helpers, as (file, function) pairs)
# ---------------------------------------------------------------------------

T = "tutorials/"
K = "python/triton_dist/kernels/nvidia/"
_GRID_BARRIER = [(K + "common_ops.py", f) for f in ("_is_cta_master", "_is_gpu_master", "unsafe_barrier_on_this_grid",
                                                    "load_envreg", "load_grid_ws_abi_address",
                                                    "cooperative_barrier_on_this_grid", "barrier_on_this_grid")]
_RS_HELPERS = [(K + "reduce_scatter.py", f) for f in ("add_continuous_kernel", "copy_continuous_kernel",
                                                      "kernel_ring_reduce_non_tma")]
_BARRIERS = [(K + "common_ops.py", f) for f in ("barrier_all_intra_node_atomic_cas_block",
                                               "_barrier_all_intra_node_non_atomic_once_block",
                                               "barrier_all_intra_node_non_atomic_block")]
#: Triton-distributed's profiler (`triton_dist/tools/profiler/language.py`, a `@tl.core._aggregate` class), which the
#: all-to-all-v kernels create and record into; driven with `profiling=False` (their host ops' default), where
#: its `smid()` / `globaltimer_lo()` (which ditron does not provide) are never reached
_PROFILER = [("python/triton_dist/tools/profiler/language.py", f) for f in (
    "NUM_BITS_ID", "NUM_BITS_TASK_TYPE", "NUM_BITS_EVENT", "NUM_BITS_PAYLOAD", "Profiler")]
_PROFILER_IMPORTS = ["from triton_dist.language.extra.cuda.language_extra import fence, pack_b32_v2\n"]
_VDEV = K + "all_to_all_vdev_2d_offset.py"
_PREFIX_SUM = [(K + "gemm_rs_threadblock_swizzle.py", "warp_prefix_sum_kernel"),
               (_VDEV, "single_block_prefix_sum_kernel_scan_scan")]
_VDEV_HELPERS = (_PROFILER + _GRID_BARRIER + [(K + "common_ops.py", "barrier_all_intra_node_atomic_cas_block")]
                 + _PREFIX_SUM)
VDEV_NOTE = ("MoE all-to-all-v with on-device splits (`all_to_all_vdev_2d_offset.py`); its `Profiler` extracted from "
             "`triton_dist/tools/profiler` (with `profiling=False`: its `smid` / `globaltimer_lo` unused); its "
             "`Profiler.create(..., is_leader=(tid(0) == 0))` runs per simulated thread")
SHFL_NOTE = ("its warp shuffles (`warp_prefix_sum_kernel`'s `__shfl_up_sync_i32`, then `__shfl_sync` from a higher "
             "lane) run in lockstep lanes and compute the right sums; with `MAJOR_ALIGN` > 1 its last block (`if lane_id "
             "< valid_len: st(res_ptr + tile_start_flat + lane_id, ...)`, not guarded by `is_valid_tile`) stores the "
             "rows of the warps past the last tile PAST THE END of its output (also on GPUs: Triton-distributed's own "
             "host code allocates that buffer with `nsplits` elements and launches 32 warps); the simulator reports "
             "the out-of-bounds `dl.st`")
PER_THREAD = "one item per thread (`if thread_idx < world_size`), simulated per thread"
POW2 = "; its `tl.arange(0, world_size)` needs a power-of-2 world size (also on GPUs)"
PACKED_MC = "packed 128-bit multicast (`multimem_ld_reduce_v4`, `multimem_st_b64`), per thread"

CASES = {
    "t01_notify_wait": dict(src=[(T + "01-distributed-notify-wait.py", "producer_consumer_kernel")],
                            note="PTX data race: its `dl.wait(..., \"gpu\", \"acquire\")` on another GPU's signals "
                                 "(fix: `\"sys\"`)"),
    "t02_allgather_put": dict(src=[(T + "02-intra-node-allgather.py",
                                    "nvshmem_device_producer_all_gather_2d_put_block_kernel")]),
    "t03_allgather_push_1d": dict(src=[(T + "03-inter-node-allgather.py", "all_gather_push_1d_kernel")],
                                  note=PER_THREAD),
    "t03_allgather_push_2d": dict(src=[(T + "03-inter-node-allgather.py", "all_gather_push_2d_kernel")],
                                  note=PER_THREAD),
    "t03_allgather_push_2d_2nodes": dict(src=[(T + "03-inter-node-allgather.py", "all_gather_push_2d_kernel")],
                                         nnodes=2, note=PER_THREAD),
    "t03a_allgather_push_1d_amd": dict(src=[(T + "03a-inter-node-allgather.py", "all_gather_push_1d_kernel")],
                                       note=PER_THREAD),
    "t05_ring_reduce": dict(src=[(T + "05-intra-node-reduce-scatter.py", "kernel_ring_reduce")],
                            note="tensor descriptors (TMA), through Triton's interpreter"),
    "t06_inter_node_p2p": dict(src=[(T + "06-inter-node-reduce-scatter.py",
                                     "kernel_inter_node_p2p_for_same_local_rank")], nnodes=2),
    "t07_inter_node_put_block": dict(src=[(T + "07-overlapping-allgather-gemm.py",
                                           "nvshmem_device_producer_p2p_put_block_kernel")], nnodes=2),
    "ag_2d_put_block_2nodes": dict(src=[(K + "allgather.py",
                                         "nvshmem_device_producer_all_gather_2d_put_block_kernel")], nnodes=2),
    "ag_2d_put_block": dict(src=[(K + "allgather.py", "nvshmem_device_producer_all_gather_2d_put_block_kernel")]),
    "ll_allgather_pull": dict(src=[(K + "low_latency_allgather.py", "_forward_pull_kernel")], note=PER_THREAD),
    "ar_one_shot_push": dict(src=_GRID_BARRIER + _RS_HELPERS + [(K + "allreduce.py",
                                                                 "allreduce_one_shot_push_intra_node_kernel")],
                             note=PER_THREAD + POW2),
    "ar_two_shot_push": dict(src=_GRID_BARRIER + _RS_HELPERS + [(K + "allreduce.py",
                                                                 "allreduce_two_shot_push_intra_node_kernel")],
                             note=PER_THREAD + POW2),
    "ar_one_shot_multimem": dict(src=_GRID_BARRIER + _BARRIERS + [(K + "allreduce.py",
                                                       "allreduce_one_shot_multimem_intra_node_kernel")],
                                 note=PACKED_MC),
    "ar_two_shot_multimem": dict(src=_GRID_BARRIER + [(K + "allreduce.py",
                                                       "allreduce_two_shot_multimem_intra_node_kernel")],
                                 note=PACKED_MC),
    "ar_double_tree": dict(src=[(K + "allreduce.py", f) for f in ("get_tree_parent_and_children",
                                                                  "allreduce_double_tree_intra_node_kernel")],
                           imports=["import math\n"],
                           note="two complementary binary trees (host: its `get_tree_parent_and_children`, which "
                                "asserts a power-of-2 world size, on GPUs too)"),
    "ar_one_shot_tma_push": dict(src=_GRID_BARRIER + [(K + "reduce_scatter.py", "kernel_ring_reduce_tma"),
                                                      (K + "allreduce.py",
                                                       "allreduce_one_shot_tma_push_intra_node_kernel")],
                                 note="tensor descriptors (TMA), through Triton's interpreter" + POW2),
    "rs_ring_push_1d": dict(src=_RS_HELPERS + [(K + "reduce_scatter.py",
                                                "reduce_scatter_ring_push_1d_intra_node_kernel")],
                            note="PTX data race: the counter's `atomic_add(..., semantic=\"release\")` does not "
                                 "acquire the other programs' pushes before the flag (fix: `\"acq_rel\"`)"),
    "barrier_atomic_cas_simt": dict(src=[(K + "common_ops.py", "barrier_all_intra_node_atomic_cas_block")]),
    "barrier_non_atomic": dict(src=[(K + "common_ops.py", f) for f in (
        "_barrier_all_intra_node_non_atomic_once_block", "barrier_all_intra_node_non_atomic_block")]),
    "p2p_copy_remote_to_local": dict(src=[(K + "p2p.py", "p2p_copy_remote_to_local_kernel")]),
    "ll_allgather_push_2d": dict(src=[(K + "low_latency_allgather.py", "_forward_push_2d_kernel")], note=PER_THREAD),
    "ll_allgather_push_2d_2nodes": dict(src=[(K + "low_latency_allgather.py", "_forward_push_2d_kernel")], nnodes=2,
                                        note=PER_THREAD),
    "ll_allgather_push_2d_ll_2nodes": dict(src=[(K + "low_latency_allgather.py", f) for f in (
        "_recv_ll_block", "_pack_ll_block", "_forward_push_2d_ll_kernel")], nnodes=2,
        note="LL protocol, per thread; `putmem_nbi_warp` in a warp-uniform branch; PTX data race: it polls the LL "
             "words with weak `load_v4_u32` loads (fix: `load_v4_b32(..., scope=\"sys\", semantic=\"relaxed\")`)"),
    "ll_allgather_push_numa_2d_ll": dict(src=[(K + "low_latency_allgather.py", f) for f in (
        "_recv_ll_block", "_pack_ll_block", "_forward_push_numa_2d_ll_kernel")], even=True,
        note="LL protocol across two NUMA halves (an even world size), per thread; PTX data race: the same weak "
             "`load_v4_u32` LL polls (fix: `load_v4_b32(..., scope=\"sys\", semantic=\"relaxed\")`)"),
    "ll_allgather_push_numa_2d_ll_2nodes": dict(src=[(K + "low_latency_allgather.py", f) for f in (
        "_recv_ll_block", "_pack_ll_block", "_forward_push_numa_2d_ll_multinode_kernel")], nnodes=2, local_even=True,
        note="LL protocol between nodes, two NUMA halves per node (an even number of ranks per node), per thread; "
             "PTX data race: the same weak `load_v4_u32` LL polls"),
    "ll_allgather_push_3d": dict(src=[(K + "low_latency_allgather.py", f) for f in (
        "_recv_ll_block", "_pack_ll_block", "_forward_push_3d_kernel")], local_even=True,
        note=PER_THREAD + "; two NUMA halves (an even world size)"),
    "ll_allgather_push_3d_2nodes": dict(src=[(K + "low_latency_allgather.py", f) for f in (
        "_recv_ll_block", "_pack_ll_block", "_forward_push_3d_kernel")], nnodes=2, local_even=True,
        note="`putmem_signal_nbi_warp` between nodes, two NUMA halves per node (an even number of ranks per node)"),
    "ll_allgather_push_3d_ll_2nodes": dict(src=[(K + "low_latency_allgather.py", f) for f in (
        "_recv_ll_block", "_pack_ll_block", "_forward_push_3d_kernel")], nnodes=2, local_even=True,
        note="LL protocol between nodes (`INTER_NODE_WITH_LL`), two NUMA halves per node; PTX data race: the same "
             "weak `load_v4_u32` LL polls"),
    "ll_allgather_push_2d_ll_multimem_2nodes": dict(src=[(K + "low_latency_allgather.py", f) for f in (
        "_recv_ll_block", "_pack_ll_block", "_recv_ll_and_multimem_st_ll_block", "broadcast_naive_block",
        "_forward_push_2d_ll_multimem_kernel")], nnodes=2,
        imports=["from triton_dist.language.extra.cuda.language_extra import pack_b32_v2\n"],
        note="LL protocol between nodes, LL words broadcast in the node with `multimem_st_b64`; `pack_b32_v2` "
             "imported from `language_extra` (the file takes it from `triton_dist.kernels.common_ops`); PTX data "
             "race: the same weak `load_v4_u32` LL polls"),
    "ll_allgather_push_numa_2d": dict(src=[(K + "low_latency_allgather.py", "_forward_push_numa_2d_kernel")],
                                      even=True, note=PER_THREAD + "; two NUMA halves (an even world size)"),
    "ll_all_to_all": dict(src=[(K + "low_latency_all_to_all.py", "all_to_all_kernel")],
                          note="MoE token all-to-all (`low_latency_all_to_all.py`), called twice (both halves of its "
                               "double buffer; without and with the scales)"),
    "all_to_all_single_2d": dict(src=[(K + "common_ops.py", "barrier_all_intra_node_atomic_cas_block")] + [
        (K + "all_to_all_single_2d.py", f) for f in ("get_element_at", "all_to_all_single_2d_kernel",
                                                     "cp_from_recv_buf")],
        launched=("all_to_all_single_2d_kernel",),
        note="two kernels (push, then an intra-node barrier and the copy out)" + POW2),
    "a2a_vdev_prefix_sum": dict(src=_PREFIX_SUM, note="`all_to_all_vdev_2d_offset.py`'s warp-shuffle prefix sum "
                                                      "(`MAJOR_ALIGN` 1, 4 and 8), one rank's memory; " + SHFL_NOTE),
    "a2a_vdev_exchange_splits": dict(src=[(K + "common_ops.py", "barrier_all_intra_node_atomic_cas_block")]
                                     + _PREFIX_SUM + [(_VDEV, "exchange_split_offset_2d_intra_node")],
                                     note="the splits / offsets exchange of `all_to_all_v_2d_kernel` (a SIMT region "
                                          "of `dl.symm_at` stores), launched alone; both split layouts, with the "
                                          "caller's input offsets (`has_input_off=True`) and without them (it runs "
                                          "the warp-shuffle prefix sum first, `MAJOR_ALIGN` 1)"),
    "a2a_vdev_2d": dict(src=_VDEV_HELPERS + [(_VDEV, "exchange_split_offset_2d_intra_node"),
                                             (_VDEV, "all_to_all_v_2d_kernel")],
                        imports=_PROFILER_IMPORTS,
                        note=VDEV_NOTE + "; `all_to_all_vdev_2d` (rank-major splits, `MAJOR_ALIGN` 1 and 4): its on-device "
                                         "prefix sum: " + SHFL_NOTE),
    "a2a_vdev_2d_offset": dict(src=_VDEV_HELPERS + [(_VDEV, "exchange_split_offset_2d_intra_node"),
                                                    (_VDEV, "all_to_all_v_2d_kernel")],
                               imports=_PROFILER_IMPORTS,
                               note=VDEV_NOTE + "; `all_to_all_vdev_2d_offset` (expert-major splits, the caller's "
                                                "input offsets)"),
    "a2a_vdev_2d_v2": dict(src=_VDEV_HELPERS + [(_VDEV, "all_to_all_v_2d_kernel_v2")], imports=_PROFILER_IMPORTS,
                           note=VDEV_NOTE + "; `all_to_all_v_2d_kernel_v2` (both split layouts)"),
    "p2p_signal": dict(src=[(K + "p2p.py", "p2p_set_signal"), (K + "p2p.py", "p2p_wait_signal")],
                       note=PER_THREAD),
    "p2p_copy": dict(src=[(K + "p2p.py", "p2p_copy_kernel")]),
    "p2p_put": dict(src=[(K + "p2p.py", "p2p_put_kernel")]),
    # memory_ops.py: plain Triton (one rank's memory), launched with @triton.jit there
    "mem_copy_1d_tilewise": dict(src=[(K + "memory_ops.py", "copy_1d_tilewise_kernel")]),
    "mem_copy_2d": dict(src=[(K + "memory_ops.py", f) for f in ("copy_2d_persistent_kernel", "copy_2d_kernel")],
                        launched=("copy_2d_persistent_kernel",)),
    "mem_fill": dict(src=[(K + "memory_ops.py", f) for f in ("fill_1d_persistent_kernel", "fill_2d_persistent_kernel",
                                                             "fill_3d_persistent_kernel")],
                     launched=("fill_1d_persistent_kernel", "fill_2d_persistent_kernel")),
    # (reduce_2d_persistent_kernel is left out: its `tl.zeros((BLOCK_SIZE_M), ...)` is a scalar shape, which stock
    # Triton rejects when compiling for GPUs too)
    "mem_reduce": dict(src=[(K + "memory_ops.py", f) for f in ("reduce_1d_persistent_kernel",
                                                               "reduce_3d_persistent_kernel")],
                       launched=("reduce_1d_persistent_kernel",)),
}

#: import lines of the source files that are kept (Triton and Triton-distributed's device names); host-only
#: modules (nvshmem, triton_dist.utils, kernels, profiler) are left out: the drivers below replace the host code
_KEEP_PREFIXES = ("triton", "triton_dist")
_DROP_PREFIXES = ("triton_dist.kernels", "triton_dist.utils", "triton_dist.profiler_utils", "triton_dist.tools")


def _imports(tree, lines):
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if all(n.startswith(_KEEP_PREFIXES) and not n.startswith(_DROP_PREFIXES) for n in names):
                out.append("".join(lines[node.lineno - 1:node.end_lineno]))
    return out


def _function(tree, lines, name, path, launched=False):
    """The function's source as written (its ``jit`` decorator and body), or
    a class (with its decorators) or a module constant ``NAME = ...``.  A
    launched kernel decorated ``@triton.jit`` gets ``@triton_dist.jit``: the
    one documented change (stock Triton's jit attaches no ditron library and
    runs no simulator; helpers it calls keep ``@triton.jit``)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:       # e.g. its profiler's `@tl.core._aggregate`
            decos = [ast.get_source_segment("".join(lines), d) for d in node.decorator_list]
            return "".join("@" + d + "\n" for d in decos) + "".join(lines[node.lineno - 1:node.end_lineno]), False
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name):                     # a module constant a class or body reads
            return "".join(lines[node.lineno - 1:node.end_lineno]), False
        if isinstance(node, ast.FunctionDef) and node.name == name:
            decos = [ast.get_source_segment("".join(lines), d) for d in node.decorator_list
                     if "jit" in ast.unparse(d)]
            changed = launched and any(d.startswith("triton.jit") for d in decos)
            if changed:
                decos = ["triton_dist.jit" + d[len("triton.jit"):] if d.startswith("triton.jit") else d
                         for d in decos]
            text = "".join("@" + d + "\n" for d in decos) + "".join(lines[node.lineno - 1:node.end_lineno])
            return text, changed
    raise KeyError(f"{path} has no function {name!r} (Triton-distributed changed?)")


def generate(checkout, case, out_dir):
    """Write ``pc_<case>.py``: the import lines and functions, verbatim."""
    srcs = CASES[case]["src"]
    imports, bodies, cache = [], [], {}
    changed = False
    for i, (rel, name) in enumerate(srcs):
        path = os.path.join(checkout, rel)
        if path not in cache:
            text = open(path).read()
            cache[path] = (ast.parse(text), text.splitlines(keepends=True))
            for line in _imports(*cache[path]):
                if line not in imports:
                    imports.append(line)
        text, ch = _function(*cache[path], name, rel,
                             launched=i == len(srcs) - 1 or name in CASES[case].get("launched", ()))
        changed |= ch
        bodies.append(f"# {rel}: {name}\n" + text)
    mod = f"pc_{case}"
    with open(os.path.join(out_dir, mod + ".py"), "w") as f:
        f.write("# generated by tools/port_check.py from a Triton-distributed checkout; not part of ditron\n")
        f.write("import torch\nimport triton\nimport triton.language as tl\nimport triton_dist\n")
        f.write("".join(imports) + "".join(CASES[case].get("imports", ())) + "\n\n" + "\n\n".join(bodies))
    return mod, changed


# ---------------------------------------------------------------------------
# host drivers (ditron's, on triton_dist.utils): return None on success, raise on a wrong result
# ---------------------------------------------------------------------------

def _data(rank, n, dtype, seed=0):
    import torch
    g = torch.Generator().manual_seed(7919 * seed + rank)
    return torch.randn(n, generator=g).to(dtype)


def _close(got, ref, what, tol=1e-2):
    # (not torch.testing.assert_close: it imports torch.distributed.tensor, seconds per simulated rank)
    import torch
    got, ref = got.cpu().float().reshape(-1), ref.cpu().float().reshape(-1)
    bad = ~torch.isclose(got, ref, rtol=tol, atol=tol)
    if got.shape != ref.shape or bool(bad.any()):
        i = int(bad.nonzero()[0]) if got.shape == ref.shape else -1
        raise AssertionError(f"{what}: {int(bad.sum())} of {ref.numel()} elements differ"
                             + (f"; first at {i}: {got[i].item()} != {ref[i].item()}" if i >= 0 else ""))


def drive_t01_notify_wait(m, w, U):
    import torch
    blocks, qsize, block = 6, 2, 128
    queue = U.nvshmem_create_tensor((qsize * block,), torch.float32)
    signal = U.nvshmem_create_tensor((qsize,), U.NVSHMEM_SIGNAL_DTYPE)
    signal.zero_()
    x = _data(w.rank, blocks * block, torch.float32).to(w.device)
    out = torch.empty_like(x)
    U.nvshmem_barrier_all_on_stream()
    m.producer_consumer_kernel[(2,)](w.rank, w.world_size, x, out, blocks, queue, signal, qsize, BLOCK_SIZE=block,
                                     NUM_PRODUCER_SMS=1, NUM_CONSUMER_SMS=1)
    U.nvshmem_barrier_all_on_stream()
    _close(out, _data((w.rank - 1) % w.world_size, blocks * block, torch.float32), "output")


def _gathered(w, elems, dtype):
    import torch
    return torch.cat([_data(r, elems, dtype, seed=2) for r in range(w.world_size)])


def drive_t02_allgather_put(m, w, U):
    # launched as the tutorial does: ``num_ranks`` programs and DISPATCH_BLOCK_NUM=num_ranks, so the last program
    # puts the rank's own segment onto itself (the same values: not a race, docs/porting.md section 6)
    import torch
    elems, n = 96, w.world_size
    buf = U.nvshmem_create_tensor((n * elems,), torch.float16)
    buf.zero_()
    buf[w.rank * elems:(w.rank + 1) * elems].copy_(_data(w.rank, elems, torch.float16, seed=2))
    sig = U.nvshmem_create_tensor((n,), U.NVSHMEM_SIGNAL_DTYPE)
    sig.zero_()
    U.nvshmem_barrier_all_on_stream()
    m.nvshmem_device_producer_all_gather_2d_put_block_kernel[(n,)](buf, sig, elems, 2, 1, w.rank, n,
                                                                   DISPATCH_BLOCK_NUM=n)
    U.nvshmem_barrier_all_on_stream()
    _close(buf, _gathered(w, elems, torch.float16), "gathered")


def drive_ag_2d_put_block(m, w, U):
    import torch
    elems, n = 96, w.world_size
    buf = U.nvshmem_create_tensor((n * elems,), torch.float16)
    buf.zero_()
    buf[w.rank * elems:(w.rank + 1) * elems].copy_(_data(w.rank, elems, torch.float16, seed=2))
    sig = U.nvshmem_create_tensor((n,), U.NVSHMEM_SIGNAL_DTYPE)
    sig.zero_()
    sig[w.rank] = 1                          # this rank's segment is ready (a producer would signal it)
    U.nvshmem_barrier_all_on_stream()
    # one node: local_world_size - 1 dispatch programs, no inter-node send programs
    m.nvshmem_device_producer_all_gather_2d_put_block_kernel[(max(n - 1, 1),)](
        buf, sig, elems, 2, 1, w.rank, w.local_world_size, n, DISPATCH_BLOCK_NUM=n - 1, SEND_BLOCK_NUM=0)
    U.nvshmem_barrier_all_on_stream()
    _close(buf, _gathered(w, elems, torch.float16), "gathered")


def drive_ag_2d_put_block_2nodes(m, w, U):
    import torch
    elems, n, lws = 96, w.world_size, w.local_world_size
    nnodes = n // lws
    buf = U.nvshmem_create_tensor((n * elems,), torch.float16)
    buf.zero_()
    buf[w.rank * elems:(w.rank + 1) * elems].copy_(_data(w.rank, elems, torch.float16, seed=2))
    sig = U.nvshmem_create_tensor((n,), U.NVSHMEM_SIGNAL_DTYPE)
    sig.zero_()
    sig[w.rank] = 1
    U.nvshmem_barrier_all_on_stream()
    dispatch, send = lws - 1, nnodes - 1
    m.nvshmem_device_producer_all_gather_2d_put_block_kernel[(max(dispatch + send, 1),)](
        buf, sig, elems, 2, 1, w.rank, lws, n, DISPATCH_BLOCK_NUM=dispatch, SEND_BLOCK_NUM=send)
    U.nvshmem_barrier_all_on_stream()
    _close(buf, _gathered(w, elems, torch.float16), "gathered")


def drive_t07_inter_node_put_block(m, w, U):
    import torch
    elems, n, lws = 96, w.world_size, w.local_world_size
    nnodes = n // lws
    buf = U.nvshmem_create_tensor((n * elems,), torch.float16)
    buf.zero_()
    buf[w.rank * elems:(w.rank + 1) * elems].copy_(_data(w.rank, elems, torch.float16, seed=2))
    sig = U.nvshmem_create_tensor((n,), U.NVSHMEM_SIGNAL_DTYPE)
    sig.zero_()
    U.nvshmem_barrier_all_on_stream()
    m.nvshmem_device_producer_p2p_put_block_kernel[(max(nnodes - 1, 1),)](buf, sig, elems, 2, 1, w.rank, lws, n)
    U.nvshmem_barrier_all_on_stream()
    same_local = [w.local_rank + q * lws for q in range(nnodes)]        # the segments that travel between nodes
    for r in range(n):
        want = _data(r, elems, torch.float16, seed=2) if r in same_local else torch.zeros(elems, dtype=torch.float16)
        _close(buf[r * elems:(r + 1) * elems], want, f"segment {r}")
        assert int(sig[r]) == (1 if r in same_local and r != w.rank else 0), (r, sig)


def drive_t06_inter_node_p2p(m, w, U):
    import torch
    M, N, n, lws = 8, 16, w.world_size, w.local_world_size
    nnodes = n // lws
    inp = U.nvshmem_create_tensor((nnodes * M, N), torch.float32)
    inp.copy_(_data(w.rank, nnodes * M * N, torch.float32, seed=6).view(nnodes * M, N))
    out = U.nvshmem_create_tensor((nnodes * M, N), torch.float32)
    out.zero_()
    U.nvshmem_barrier_all_on_stream()
    for offset in range(nnodes - 1):
        m.kernel_inter_node_p2p_for_same_local_rank[(1,)](offset, lws, M, N, inp, out)
    U.nvshmem_barrier_all_on_stream()
    node = w.rank // lws
    for p in range(nnodes):                                   # block p came from the same local rank on node p
        if p != node:
            sender = w.local_rank + p * lws
            ref = _data(sender, nnodes * M * N, torch.float32, seed=6).view(nnodes, M, N)[node]
            _close(out[p * M:(p + 1) * M], ref, f"block from rank {sender}")


def _push_gather(m, w, U, kernel, grid, args_of, check_before_barrier=True, kwargs=None):
    import torch
    elems, n = 64, w.world_size
    buf = U.nvshmem_create_tensor((n * elems,), torch.float32)
    buf.zero_()
    buf[w.rank * elems:(w.rank + 1) * elems].copy_(_data(w.rank, elems, torch.float32, seed=2))
    flag = U.nvshmem_create_tensor((n,), U.NVSHMEM_SIGNAL_DTYPE)
    flag.zero_()
    U.nvshmem_barrier_all_on_stream()
    getattr(m, kernel)[grid](*args_of(buf, elems * 4, flag), **(kwargs or {}))
    got = buf.clone()                       # the kernel's waits must have made every segment visible
    U.nvshmem_barrier_all_on_stream()
    _close(got, torch.cat([_data(r, elems, torch.float32, seed=2) for r in range(n)]),
           "gathered right after the kernel")


def drive_t03_allgather_push_1d(m, w, U):
    n = w.world_size
    _push_gather(m, w, U, "all_gather_push_1d_kernel", (n,), lambda b, nb, f: (b, nb, f, n, w.rank, 1))


def drive_t03a_allgather_push_1d_amd(m, w, U):
    n = w.world_size                 # ctx: rocSHMEM's context pointer, ignored by ditron (set_rocshmem_ctx)
    _push_gather(m, w, U, "all_gather_push_1d_kernel", (n,), lambda b, nb, f: (b, nb, f, n, w.rank, 1, f))


def drive_t03_allgather_push_2d(m, w, U):
    n = w.world_size
    _push_gather(m, w, U, "all_gather_push_2d_kernel", (n,),
                 lambda b, nb, f: (b, nb, f, n // w.local_world_size, n, w.rank, 1))


drive_t03_allgather_push_2d_2nodes = drive_t03_allgather_push_2d


def drive_ll_allgather_pull(m, w, U):
    n = w.world_size
    _push_gather(m, w, U, "_forward_pull_kernel", (n,), lambda b, nb, f: (b, nb, f, n, w.rank, 1))


def drive_t05_ring_reduce(m, w, U):
    import torch
    M, N, n = 64, 32, w.world_size
    c = torch.stack([_data(s, M * N, torch.float16, seed=5 + w.rank) for s in range(n)]).view(n * M, N)
    out = torch.empty(M, N, dtype=torch.float16)
    m.kernel_ring_reduce[(2,)](c, out, M, N, w.rank, n, BLOCK_SIZE_M=32, BLOCK_SIZE_N=32)
    _close(out, c.view(n, M, N).float().sum(0), "reduced")


def _ar_inputs(w, elems, dtype):
    x = _data(w.rank, elems, dtype, seed=4).to(w.device)
    ref = sum(_data(r, elems, dtype, seed=4).float() for r in range(w.world_size))
    return x, ref


def drive_ar_one_shot_push(m, w, U):
    import torch
    n, elems = w.world_size, 300
    x, ref = _ar_inputs(w, elems, torch.float32)
    out = torch.empty_like(x)
    sig = U.nvshmem_create_tensor((n,), U.NVSHMEM_SIGNAL_DTYPE)
    buf = U.nvshmem_create_tensor((n * elems,), torch.float32)
    gb = torch.zeros(1, dtype=torch.int32, device=w.device)
    U.nvshmem_barrier_all_on_stream()
    m.allreduce_one_shot_push_intra_node_kernel[(2,)](x, out, sig, buf, gb, w.rank, n, elems, BLOCK_SIZE=128,
                                                      use_cooperative=False)
    _close(out, ref, "all-reduced")
    U.nvshmem_barrier_all_on_stream()


def drive_ar_double_tree(m, w, U):
    import torch
    n, elems, chunk = w.world_size, 3000, 1024           # 3 chunks: programs 0 (tree 0) and 1, 2 (tree 1)
    x, ref = _ar_inputs(w, elems, torch.float32)
    blocks = -(-elems // chunk)
    buf = U.nvshmem_create_tensor((elems,), torch.float32)
    buf.copy_(x)
    sig = U.nvshmem_create_tensor((n * blocks,), U.NVSHMEM_SIGNAL_DTYPE)
    sig.zero_()
    out = torch.empty_like(x)
    trees = m.get_tree_parent_and_children(n, w.rank)
    U.nvshmem_barrier_all_on_stream()
    m.allreduce_double_tree_intra_node_kernel[(blocks,)](buf, sig, out, *trees, numel=elems, rank=w.rank,
                                                          world_size=n, CHUNK_SIZE=chunk, BLOCK_SIZE=256, num_warps=4)
    U.nvshmem_barrier_all_on_stream()
    _close(out, ref, "all-reduced")


def drive_ar_one_shot_tma_push(m, w, U):
    import torch
    n, M, N = w.world_size, 16, 32                        # the host's reshape: (numel,) -> (M, N) per rank
    x, ref = _ar_inputs(w, M * N, torch.float32)
    out = torch.empty_like(x)
    sig = U.nvshmem_create_tensor((n,), U.NVSHMEM_SIGNAL_DTYPE)
    buf = U.nvshmem_create_tensor((n * M * N,), torch.float32)
    gb = torch.zeros(1, dtype=torch.int32, device=w.device)
    U.nvshmem_barrier_all_on_stream()
    m.allreduce_one_shot_tma_push_intra_node_kernel[(2,)](M, N, x, out, sig, buf, gb, w.rank, n, M * N,
                                                          BLOCK_SIZE_REDUCE_M=16, BLOCK_SIZE_REDUCE_N=32,
                                                          use_cooperative=False)
    _close(out, ref, "all-reduced")
    U.nvshmem_barrier_all_on_stream()


def drive_ar_two_shot_push(m, w, U):
    import torch
    n = w.world_size
    elems = 128 * n
    x, ref = _ar_inputs(w, elems, torch.float32)
    out = torch.empty_like(x)
    sig = U.nvshmem_create_tensor((2 * n,), U.NVSHMEM_SIGNAL_DTYPE)
    symm_out = U.nvshmem_create_tensor((2 * elems,), torch.float32)
    gb = torch.zeros(1, dtype=torch.int32, device=w.device)
    U.nvshmem_barrier_all_on_stream()
    m.allreduce_two_shot_push_intra_node_kernel[(n,)](x, symm_out, sig, gb, out, w.rank, n, elems, BLOCK_SIZE=128,
                                                      use_cooperative=False)
    _close(out, ref, "all-reduced")
    U.nvshmem_barrier_all_on_stream()


def drive_ar_one_shot_multimem(m, w, U):
    import torch
    n, elems = w.world_size, 256
    x, ref = _ar_inputs(w, elems, torch.bfloat16)
    symm_in = U.nvshmem_create_tensor((elems,), torch.bfloat16)
    sig = U.nvshmem_create_tensor((3 * n,), U.NVSHMEM_SIGNAL_DTYPE)   # as Triton-distributed's context: 64-bit
    sig.zero_()
    out = torch.empty_like(x)
    gb = torch.zeros(1, dtype=torch.int32, device=w.device)
    U.nvshmem_barrier_all_on_stream()
    m.allreduce_one_shot_multimem_intra_node_kernel[(1,)](x, symm_in, sig, out, elems, gb, w.rank, 1, n,
                                                          BLOCK_SIZE=128, HAS_ATOMIC_CAS=True, use_cooperative=False)
    _close(out, ref, "all-reduced", tol=3e-2)
    U.nvshmem_barrier_all_on_stream()


def drive_ar_two_shot_multimem(m, w, U):
    import torch
    n = w.world_size
    elems = 64 * n                               # each rank reduces 64 bf16 (eight 16-byte vectors) in place
    x, ref = _ar_inputs(w, elems, torch.bfloat16)
    symm = U.nvshmem_create_tensor((elems,), torch.bfloat16)
    symm.copy_(x)
    gb = torch.zeros(1, dtype=torch.int32, device=w.device)
    U.nvshmem_barrier_all_on_stream()
    m.allreduce_two_shot_multimem_intra_node_kernel[(2,)](symm, gb, elems, w.rank, n, use_cooperative=False)
    U.nvshmem_barrier_all_on_stream()
    _close(symm, ref, "all-reduced in place", tol=3e-2)
    U.nvshmem_barrier_all_on_stream()


def drive_rs_ring_push_1d(m, w, U):
    import torch
    n, epr = w.world_size, 200
    x = torch.stack([_data(w.rank, epr, torch.float32, seed=10 + s) for s in range(n)]).view(-1).to(w.device)
    ref = sum(_data(r, epr, torch.float32, seed=10 + w.rank) for r in range(n))
    in_flag = torch.ones(n, dtype=torch.int32, device=w.device)     # the producer (a GEMM) marked every segment
    red = U.nvshmem_create_tensor((n * epr,), torch.float32)
    red_flag = U.nvshmem_create_tensor((n,), torch.int32)
    red_flag.zero_()
    counter = torch.zeros(n, dtype=torch.int32, device=w.device)
    out = torch.empty(epr, dtype=torch.float32, device=w.device)
    U.nvshmem_barrier_all_on_stream()
    m.reduce_scatter_ring_push_1d_intra_node_kernel[(2,)](w.rank, n, x, in_flag, red, red_flag, counter, out, epr,
                                                          BLOCK_SIZE=64, use_cooperative=False)
    U.nvshmem_barrier_all_on_stream()
    _close(out, ref, "reduce-scattered")


def drive_barrier_atomic_cas_simt(m, w, U):
    import torch
    flags = U.nvshmem_create_tensor((w.local_world_size,), torch.int32)
    flags.zero_()
    U.nvshmem_barrier_all_on_stream()
    for _ in range(2):
        m.barrier_all_intra_node_atomic_cas_block[(1,)](w.local_rank, w.rank, w.local_world_size, flags)
    U.nvshmem_barrier_all_on_stream()
    assert flags.cpu().tolist() == [0] * w.local_world_size, flags


def drive_barrier_non_atomic(m, w, U):
    import torch
    # "symm_flags ... has at least num_ranks * 2 elements" (its docstring: the second round uses the upper half;
    # with num_ranks elements it wrote past the tensor, which the simulator now reports)
    flags = U.nvshmem_create_tensor((2 * w.local_world_size,), torch.int32)
    flags.zero_()
    U.nvshmem_barrier_all_on_stream()
    for v in (1, 2):
        m.barrier_all_intra_node_non_atomic_block[(1,)](w.local_rank, w.rank, w.world_size, flags, v)
    U.nvshmem_barrier_all_on_stream()


def drive_p2p_copy_remote_to_local(m, w, U):
    # the kernel pulls the peer's symmetric ``src`` into this rank's ``src`` (then copies it to ``dst``), so a
    # rank that is pulled from must not pull itself: even ranks pull from an odd neighbour
    import torch
    elems = 1000
    src = U.nvshmem_create_tensor((elems,), torch.float32)
    src.copy_(_data(w.rank, elems, torch.float32, seed=8))
    dst = torch.zeros(elems, dtype=torch.float32, device=w.device)
    peer = w.rank + 1 if w.rank + 1 < w.world_size else w.rank - 1
    U.nvshmem_barrier_all_on_stream()
    if w.rank % 2 == 0 and peer >= 0:
        m.p2p_copy_remote_to_local_kernel[(2,)](src, peer, dst, elems * 4, NUM_SMS=2, BLOCK_SIZE=256)
        _close(dst, _data(peer, elems, torch.float32, seed=8), "copied")
    U.nvshmem_barrier_all_on_stream()


def drive_ll_allgather_push_2d(m, w, U):
    n = w.world_size
    _push_gather(m, w, U, "_forward_push_2d_kernel", (n,),
                 lambda b, nb, f: (b, nb, f, n // w.local_world_size, n, w.rank, 1))


drive_ll_allgather_push_2d_2nodes = drive_ll_allgather_push_2d


def drive_ll_allgather_push_numa_2d(m, w, U):
    n = w.world_size
    _push_gather(m, w, U, "_forward_push_numa_2d_kernel", (n,), lambda b, nb, f: (b, nb, f, 2, n, w.rank, 1))


def drive_ll_allgather_push_2d_ll_2nodes(m, w, U):
    n, ll = w.world_size, _ll_buffer(w, U)
    _push_gather(m, w, U, "_forward_push_2d_ll_kernel", (n,),
                 lambda b, nb, f: (b, nb, f, ll, n // w.local_world_size, n, w.rank, 3))


def drive_ll_allgather_push_numa_2d_ll(m, w, U):
    n, ll = w.world_size, _ll_buffer(w, U)
    _push_gather(m, w, U, "_forward_push_numa_2d_ll_kernel", (n,),
                 lambda b, nb, f: (b, nb, f, ll, 2, n, w.rank, 3))


def _ll_buffer(w, U, elems=64):
    import torch
    ll = U.nvshmem_create_tensor((2 * w.world_size * elems * 4,), torch.int8)   # data and flag words: twice the bytes
    ll.zero_()
    return ll


def drive_ll_allgather_push_numa_2d_ll_2nodes(m, w, U):
    n, ll = w.world_size, _ll_buffer(w, U)
    _push_gather(m, w, U, "_forward_push_numa_2d_ll_multinode_kernel", (n,),
                 lambda b, nb, f: (b, nb, f, ll, n // w.local_world_size, 2, n, w.rank, 3))


def drive_ll_allgather_push_3d(m, w, U, with_ll=False):
    n, ll = w.world_size, _ll_buffer(w, U)
    _push_gather(m, w, U, "_forward_push_3d_kernel", (n,),
                 lambda b, nb, f: (b, nb, ll, f, n // w.local_world_size, 2, n, w.rank, 3),
                 kwargs=dict(INTER_NODE_WITH_LL=with_ll, num_warps=4))


drive_ll_allgather_push_3d_2nodes = drive_ll_allgather_push_3d


def drive_ll_allgather_push_3d_ll_2nodes(m, w, U):
    drive_ll_allgather_push_3d(m, w, U, with_ll=True)


def drive_ll_allgather_push_2d_ll_multimem_2nodes(m, w, U):
    # no signal words: every segment arrives through its LL words (the kernel's own flags)
    n, ll = w.world_size, _ll_buffer(w, U)
    _push_gather(m, w, U, "_forward_push_2d_ll_multimem_kernel", (n,),
                 lambda b, nb, f: (b, nb, ll, n // w.local_world_size, n, w.rank, 3))


def drive_ll_all_to_all(m, w, U):
    import torch
    n, E, max_m, hidden = w.world_size, 2, 16, 32
    tot = n * E

    def counts(r):                  # rank r's tokens per expert (experts of rank p: p * E ... p * E + E - 1)
        g = torch.Generator().manual_seed(100 + r)
        return torch.randint(0, max_m // tot + 1, (tot,), generator=g)          # at most max_m in all

    def tokens(r, call):
        return _data(r, max_m * hidden, torch.float16, seed=20 + call).view(max_m, hidden)

    def scales(r, call):
        return _data(r, max_m, torch.float32, seed=30 + call)

    cnt = counts(w.rank)
    assert int(cnt.sum()) <= max_m
    cumsum = torch.zeros(tot + 1, dtype=torch.int32)
    cumsum[1:] = torch.cumsum(cnt, 0)
    send = U.nvshmem_create_tensor((max_m, hidden), torch.float16)
    recv = U.nvshmem_create_tensor((n * max_m * 2, hidden), torch.float16)
    ssend = U.nvshmem_create_tensor((max_m,), torch.float32)
    srecv = U.nvshmem_create_tensor((n * max_m * 2,), torch.float32)
    split_send = U.nvshmem_create_tensor((tot,), torch.int32)
    split_recv = U.nvshmem_create_tensor((tot * 2,), torch.int32)
    sig = U.nvshmem_create_tensor((n * 2,), U.NVSHMEM_SIGNAL_DTYPE)
    for t in (recv, srecv, split_send, split_recv, sig):
        t.zero_()
    U.nvshmem_barrier_all_on_stream()
    for call, with_scale in ((1, False), (2, True)):
        send.copy_(tokens(w.rank, call))
        ssend.copy_(scales(w.rank, call))
        U.nvshmem_barrier_all_on_stream()
        m.all_to_all_kernel[(n,)](send, recv, split_send, split_recv, sig, cumsum.to(w.device), ssend, srecv,
                                  w.rank, call, WITH_SCALE=with_scale, WORLD_SIZE=n, HIDDEN=hidden, MAX_M=max_m,
                                  EXPERTS_PER_RANK=E, NUM_TOT_EXPERTS=tot, ELEMENT_SIZE=2, SCALE_ELEMENT_SIZE=4)
        pos = call % 2
        got_rows, got_splits, got_scales = recv.clone(), split_recv.clone(), srecv.clone()
        for s in range(n):          # the kernel's waits made every source's rows visible
            c = counts(s)
            lo, k = int(c[:w.rank * E].sum()), int(c[w.rank * E:(w.rank + 1) * E].sum())
            at = pos * n * max_m + s * max_m
            _close(got_rows[at:at + k], tokens(s, call)[lo:lo + k], f"call {call}: tokens from rank {s}")
            want = c[w.rank * E:(w.rank + 1) * E].tolist()
            assert got_splits[pos * tot + s * E:pos * tot + (s + 1) * E].tolist() == want, (call, s, want)
            if with_scale:
                _close(got_scales[at:at + k], scales(s, call)[lo:lo + k], f"call {call}: scales from rank {s}")
        U.nvshmem_barrier_all_on_stream()


def drive_all_to_all_single_2d(m, w, U):
    import torch
    n, max_m, hidden = w.world_size, 16, 24            # hidden: not a power of 2 (the copy's mask)

    def splits(r):                  # rows rank r sends to each rank
        g = torch.Generator().manual_seed(200 + r)
        return torch.randint(0, max_m // n + 1, (n,), generator=g).to(torch.int32)

    def rows(r):
        return _data(r, max_m * hidden, torch.float16, seed=40).view(max_m, hidden)

    in_splits = splits(w.rank)
    out_splits = torch.tensor([int(splits(s)[w.rank]) for s in range(n)], dtype=torch.int32)
    send = U.nvshmem_create_tensor((max_m, hidden), torch.float16)
    send.copy_(rows(w.rank))
    recv = U.nvshmem_create_tensor((max_m * n, hidden), torch.float16)
    recv.zero_()
    sync = U.nvshmem_create_tensor((n, n), torch.int32)
    sync.zero_()
    out = torch.zeros(int(out_splits.sum()), hidden, dtype=torch.float16, device=w.device)
    U.nvshmem_barrier_all_on_stream()
    m.all_to_all_single_2d_kernel[(2,)](send, recv, in_splits.to(w.device), out_splits.to(w.device), rank=w.rank,
                                        WORLD_SIZE=n, MAX_M=max_m, HIDDEN_DIM=hidden, ELEMENT_SIZE=2, num_warps=4)
    m.cp_from_recv_buf[(n,)](w.rank, w.rank, n, sync, output_ptr=out, recv_buf_ptr=recv,
                             output_split_ptr=out_splits.to(w.device), WORLD_SIZE=n, MAX_M=max_m, HIDDEN_DIM=hidden,
                             BLOCK_SIZE_M=4, BLOCK_SIZE=32, IS_INTRA_NODE=True, num_warps=4)
    ref = []
    for s in range(n):
        sp = splits(s)
        lo = int(sp[:w.rank].sum())
        ref.append(rows(s)[lo:lo + int(sp[w.rank])])
    _close(out, torch.cat(ref), "all-to-all")
    U.nvshmem_barrier_all_on_stream()


def _vdev_splits(r, w, ne, k, rank_in_row):
    """Rank ``r``'s splits: tokens it sends to expert ``e`` of rank ``p``, flattened rank-major ``(p, e)`` or
    expert-major ``(e, p)``."""
    import torch
    g = torch.Generator().manual_seed(300 + r)
    sp = torch.randint(0, k + 1, (w.world_size, ne), generator=g).to(torch.int32)
    return sp.reshape(-1) if rank_in_row else sp.t().contiguous().reshape(-1)


def _vdev_index(p, e, w, ne, rank_in_row):
    return p * ne + e if rank_in_row else e * w.world_size + p


def _vdev_in_offsets(sp, given):
    """The caller's input offsets: its segments laid out in reverse order (not the prefix sum the kernel would
    compute), or the exclusive prefix sum."""
    import torch
    if not given:
        return torch.cumsum(sp, 0) - sp
    rev = sp.flip(0)
    return (torch.cumsum(rev, 0) - rev).flip(0).to(torch.int32)


def _vdev_reference(w, ne, k, L, rank_in_row, given_off, align=1, with_src=False):
    """(out_splits, local offsets, output rows) of this rank, in the kernel's output order: expert-major
    (``rank_in_row``: row ``e`` holds the tokens from rank 0..W-1, each row aligned to ``align``) or
    source-major (row ``s`` holds experts 0..ne-1)."""
    import torch
    n, r = w.world_size, w.rank
    order = [(s, e) for e in range(ne) for s in range(n)] if rank_in_row else \
        [(s, e) for s in range(n) for e in range(ne)]
    splits, offs, rows, srcs, pos = [], [], [], [], 0
    for i, (s, e) in enumerate(order):
        sp = _vdev_splits(s, w, ne, k, rank_in_row)
        j = _vdev_index(r, e, w, ne, rank_in_row)
        c, lo = int(sp[j]), int(_vdev_in_offsets(sp, given_off)[j])
        splits.append(c)
        srcs.append(lo)
        offs.append(pos)
        tok = _data(s, int(sp.sum()) * L, torch.float16, seed=50).view(-1, L)
        rows.append((pos, tok[lo:lo + c]))
        pos += c
        if align > 1 and (i + 1) % n == 0:                      # end of an expert's row
            pos = max((pos + align - 1) // align * align, align)
    return (splits, offs, rows, srcs) if with_src else (splits, offs, rows)


def _vdev_check(out, rows, what):
    for pos, ref in rows:
        _close(out[pos:pos + ref.shape[0]], ref, f"{what}: rows {pos}..{pos + ref.shape[0]}")


def _drive_vdev(m, w, U, rank_in_row, given_off, aligns):
    """Host code of `all_to_all_v_offset_op` written on ditron's runtime: its context's buffers (symmetric
    split/offset and data buffers, a signal pad, a local offset buffer and partial sums), reused across calls
    as its context does."""
    import torch
    n, ne, k, L = w.world_size, 2, 3, 24            # L: a token length that is not a power of 2
    nsplits = n * ne
    max_tok = k * nsplits * n
    split_meta = U.nvshmem_create_tensor((4 * nsplits,), torch.int32)
    signal = U.nvshmem_create_tensor((n + 8,), torch.int64)
    signal.zero_()
    data = U.nvshmem_create_tensor((2 * max_tok * L,), torch.float16)
    local_off = torch.empty(nsplits, dtype=torch.int32, device=w.device)
    partial = torch.zeros(2 * triton_cdiv(nsplits, 32), dtype=torch.int32, device=w.device)
    prof = torch.zeros(8, dtype=torch.int64, device=w.device)
    dispatch_so, combine_so = split_meta[:2 * nsplits], split_meta[2 * nsplits:]
    dispatch_data, combine_data = data[:max_tok * L], data[max_tok * L:]
    in_so, out_so = (dispatch_so, combine_so) if rank_in_row else (combine_so, dispatch_so)
    send, recv = (dispatch_data, combine_data) if rank_in_row else (combine_data, dispatch_data)
    sp = _vdev_splits(w.rank, w, ne, k, rank_in_row)
    tok = _data(w.rank, int(sp.sum()) * L, torch.float16, seed=50)
    U.nvshmem_barrier_all_on_stream()
    for align in aligns:
        in_so[:nsplits].copy_(sp)
        if given_off:
            in_so[nsplits:].copy_(_vdev_in_offsets(sp, True))
        send[:tok.numel()].copy_(tok)
        U.nvshmem_barrier_all_on_stream()
        m.all_to_all_v_2d_kernel[(ne,)](
            prof, in_so, out_so, local_off, partial, signal, recv, send, token_stride=L, num_expert_per_rank=ne,
            rank_in_row=rank_in_row, has_input_off=given_off, MAJOR_ALIGN=align, num_warps=4,
            **U.launch_cooperative_grid_options())
        splits, offs, rows = _vdev_reference(w, ne, k, L, rank_in_row, given_off, align)
        what = f"rank_in_row={rank_in_row}, MAJOR_ALIGN={align}"
        assert out_so[:nsplits].tolist() == splits, (what, "out_splits", out_so[:nsplits].tolist(), splits)
        assert local_off.tolist() == offs, (what, "offsets", local_off.tolist(), offs)
        assert out_so[nsplits:].tolist() == offs, (what, "written-back offsets", out_so[nsplits:].tolist(), offs)
        _vdev_check(recv.view(-1, L), rows, what)
        U.nvshmem_barrier_all_on_stream()


def drive_a2a_vdev_exchange_splits(m, w, U):
    """`exchange_split_offset_2d_intra_node` launched alone (one program): the split / source-offset exchange
    of `all_to_all_v_2d_kernel`, both layouts, with the caller's offsets, with and without its extra barrier."""
    import torch
    n, ne, k = w.world_size, 3, 3
    nsplits = n * ne
    in_so = U.nvshmem_create_tensor((2 * nsplits,), torch.int32)
    out_so = U.nvshmem_create_tensor((2 * nsplits,), torch.int32)
    signal = U.nvshmem_create_tensor((n,), torch.int64)
    signal.zero_()
    partial = torch.zeros(2 * triton_cdiv(nsplits, 32), dtype=torch.int32, device=w.device)
    # (has_input_off=False first runs the warp-shuffle prefix sum on the splits, into the input offsets)
    for rank_in_row, given_off, extra in ((True, True, False), (False, True, True), (True, True, True),
                                          (True, False, False), (False, False, True)):
        sp = _vdev_splits(w.rank, w, ne, k, rank_in_row)
        in_so[:nsplits].copy_(sp)
        in_so[nsplits:].copy_(_vdev_in_offsets(sp, True) if given_off else torch.full((nsplits,), -7))
        out_so.fill_(-1)
        U.nvshmem_barrier_all_on_stream()
        m.exchange_split_offset_2d_intra_node[(1,)](in_so, out_so, partial, signal, ne, rank_in_row=rank_in_row,
                                                    has_input_off=given_off, extra_barrier=extra, num_warps=4)
        splits, _, _, srcs = _vdev_reference(w, ne, k, 1, rank_in_row, given_off, with_src=True)
        what = f"rank_in_row={rank_in_row}, has_input_off={given_off}"
        assert in_so[nsplits:].tolist() == _vdev_in_offsets(sp, given_off).tolist(), (what, "input offsets")
        assert out_so[:nsplits].tolist() == splits, (what, "out splits", out_so[:nsplits].tolist(), splits)
        assert out_so[nsplits:].tolist() == srcs, (what, "source offsets", out_so[nsplits:].tolist(), srcs)
        U.nvshmem_barrier_all_on_stream()


def drive_a2a_vdev_prefix_sum(m, w, U):
    """`single_block_prefix_sum_kernel_scan_scan` launched alone (one program, each rank its own splits): rows
    wider than a warp, more tiles than warps, with and without the row alignment."""
    import torch
    for M, N, warps, align in ((3, 40, 2, 1), (3, 40, 2, 4), (5, 7, 2, 1), (5, 7, 2, 8)):
        g = torch.Generator().manual_seed(400 + w.rank)
        sp = torch.randint(0, 5, (M * N,), generator=g).to(torch.int32)
        sp[N:2 * N] = 0                                           # an empty row
        partial = torch.zeros(M * triton_cdiv(N, 32) + 32, dtype=torch.int32, device=w.device)
        res = torch.full((M * N,), -1, dtype=torch.int32, device=w.device)
        m.single_block_prefix_sum_kernel_scan_scan[(1,)](sp.to(w.device), partial, res, M, N, num_warps=warps,
                                                         MAJOR_ALIGN=align)
        ref, pos = [], 0
        for i in range(M * N):
            ref.append(pos)
            pos += int(sp[i])
            if align > 1 and (i + 1) % N == 0:
                pos = max((pos + align - 1) // align * align, align)
        assert res.tolist() == ref, ((M, N, warps, align), res.tolist(), ref)


def drive_a2a_vdev_2d(m, w, U):
    _drive_vdev(m, w, U, True, False, (1, 4))


def drive_a2a_vdev_2d_offset(m, w, U):
    _drive_vdev(m, w, U, False, True, (1,))


def drive_a2a_vdev_2d_v2(m, w, U):
    """Host code of `all_to_all_v_offset_op_v2` on ditron's runtime; the caller supplies both splits (local)."""
    import torch
    n, ne, k, L = w.world_size, 2, 3, 24
    nsplits = n * ne
    max_tok = k * nsplits * n
    split_meta = U.nvshmem_create_tensor((4 * nsplits,), torch.int32)
    signal = U.nvshmem_create_tensor((n + 8,), torch.int64)
    signal.zero_()
    data = U.nvshmem_create_tensor((max_tok * L,), torch.float16)
    partial = torch.zeros(2 * triton_cdiv(nsplits, 32), dtype=torch.int32, device=w.device)
    prof = torch.zeros(8, dtype=torch.int64, device=w.device)
    stats = torch.full((8,), -1, dtype=torch.int32, device=w.device)
    U.nvshmem_barrier_all_on_stream()
    for stage, rank_in_row in enumerate((True, False, True)):
        sp = _vdev_splits(w.rank, w, ne, k, rank_in_row)
        inp = _data(w.rank, int(sp.sum()) * L, torch.float16, seed=50).view(-1, L)
        splits, offs, rows = _vdev_reference(w, ne, k, L, rank_in_row, False)
        out = torch.zeros(max_tok, L, dtype=torch.float16, device=w.device)
        U.nvshmem_barrier_all_on_stream()
        m.all_to_all_v_2d_kernel_v2[(ne,)](
            prof, inp, out, sp.to(w.device), torch.tensor(splits, dtype=torch.int32, device=w.device), stats,
            split_meta, data, partial_sum_ptr=partial, signal_pad_ptr=signal, stage=stage, total_stages=4,
            rank_in_row=rank_in_row, token_len=L, num_expert_per_rank=ne, copy_to_symm_buffer=True, num_warps=4,
            COPY_BLOCK_SIZE=16, **U.launch_cooperative_grid_options())
        what = f"stage {stage}, rank_in_row={rank_in_row}"
        assert split_meta[nsplits:2 * nsplits].tolist() == offs, (what, "store offsets")
        assert stats[2 * stage:2 * stage + 2].tolist() == [inp.shape[0], sum(splits)], (what, stats.tolist())
        last = (stage + 3) % 4
        assert stats[2 * last:2 * last + 2].tolist() == [-1, -1], (what, "previous stage reset", stats.tolist())
        _vdev_check(out, rows, what)
        U.nvshmem_barrier_all_on_stream()


def drive_p2p_signal(m, w, U):
    # every rank sets two signal words on its right neighbour (one thread each), then waits for its own two
    n = w.world_size
    sig = U.nvshmem_create_tensor((2,), U.NVSHMEM_SIGNAL_DTYPE)
    sig.zero_()
    U.nvshmem_barrier_all_on_stream()
    m.p2p_set_signal[(1,)](sig, (w.rank + 1) % n, 5 + w.rank, num_barriers=2)
    m.p2p_wait_signal[(1,)](sig, w.rank, 5 + (w.rank - 1) % n, num_barriers=2)
    got = sig.clone()
    U.nvshmem_barrier_all_on_stream()
    assert got.tolist() == [5 + (w.rank - 1) % n] * 2, got


def drive_p2p_copy(m, w, U):
    # getmem_block from ``src_pe``'s symmetric buffer into this rank's same buffer: as for
    # p2p_copy_remote_to_local, a rank that is pulled from does not pull
    import torch
    elems = 1000
    buf = U.nvshmem_create_tensor((elems,), torch.float32)
    buf.copy_(_data(w.rank, elems, torch.float32, seed=11))
    peer = w.rank + 1 if w.rank + 1 < w.world_size else w.rank - 1
    U.nvshmem_barrier_all_on_stream()
    if w.rank % 2 == 0 and peer >= 0:
        m.p2p_copy_kernel[(3,)](buf, peer, elems * 4)
        _close(buf, _data(peer, elems, torch.float32, seed=11), "pulled")
    U.nvshmem_barrier_all_on_stream()


def drive_p2p_put(m, w, U):
    # each rank puts its data into the right neighbour's ``dst`` with one signal per program (nbi + signal)
    import torch
    n, elems, grid = w.world_size, 999, 3
    src = U.nvshmem_create_tensor((elems,), torch.float32)
    src.copy_(_data(w.rank, elems, torch.float32, seed=12))
    dst = U.nvshmem_create_tensor((elems,), torch.float32)
    dst.zero_()
    sig = U.nvshmem_create_tensor((grid,), U.NVSHMEM_SIGNAL_DTYPE)
    sig.zero_()
    U.nvshmem_barrier_all_on_stream()
    m.p2p_put_kernel[(grid,)](src, dst, (w.rank + 1) % n, elems * 4, sig, 9)
    U.nvshmem_barrier_all_on_stream()
    _close(dst, _data((w.rank - 1) % n, elems, torch.float32, seed=12), "put")
    assert sig.tolist() == [9] * grid, sig


def drive_mem_copy_1d_tilewise(m, w, U):
    import torch
    for nel in (1000, 1024):                    # with and without a tail tile
        src = _data(w.rank, nel, torch.float16, seed=13)
        dst = torch.zeros_like(src)
        m.copy_1d_tilewise_kernel[(3,)](dst, src, nel, BLOCK_SIZE=128)
        _close(dst, src, f"copied {nel}", tol=0)


def drive_mem_copy_2d(m, w, U):
    import torch
    M, N = 37, 50
    src = _data(w.rank, M * 64, torch.float32, seed=14).view(M, 64)[:, :N]         # strided rows
    dst = torch.zeros(N, M).t()                                                     # column-major
    m.copy_2d_persistent_kernel[(3,)](dst, src, M, N, *src.stride(), *dst.stride(), BLOCK_SIZE_M=16, BLOCK_SIZE_N=32)
    _close(dst, src, "copy_2d_persistent", tol=0)
    dst2 = torch.zeros(M, N)
    grid = (triton_cdiv(M, 16) * triton_cdiv(N, 32),)
    m.copy_2d_kernel[grid](dst2, src, M, N, *src.stride(), *dst2.stride(), BLOCK_SIZE_M=16, BLOCK_SIZE_N=32)
    _close(dst2, src, "copy_2d", tol=0)


def triton_cdiv(a, b):
    return (a + b - 1) // b


def drive_mem_fill(m, w, U):
    import torch
    x = torch.zeros(300, dtype=torch.bfloat16)
    m.fill_1d_persistent_kernel[(2,)](x, 1.5 + w.rank, 300, 1, BLOCK_SIZE_M=64)
    _close(x, torch.full((300,), 1.5 + w.rank), "fill 1d", tol=0)
    y = torch.zeros(19, 33, dtype=torch.float32)
    m.fill_2d_persistent_kernel[(3,)](y, -2.0, 19, 33, *y.stride(), BLOCK_SIZE_M=8, BLOCK_SIZE_N=16)
    _close(y, torch.full((19, 33), -2.0), "fill 2d", tol=0)
    z = torch.zeros(3, 9, 17, dtype=torch.int32)
    m.fill_3d_persistent_kernel[(2,)](z, 7, 3, 9, 17, *z.stride(), BLOCK_SIZE_M=4, BLOCK_SIZE_N=8)
    assert bool((z == 7).all()), z


def drive_mem_reduce(m, w, U):
    import torch
    v = _data(w.rank, 500, torch.float32, seed=15)
    out = torch.zeros(1, dtype=torch.float32)
    m.reduce_1d_persistent_kernel[(3,)](v, out, 500, 1, BLOCK_SIZE=64)
    _close(out, v.sum().reshape(1), "reduce 1d", tol=1e-4)
    b = _data(w.rank, 4 * 10 * 12, torch.bfloat16, seed=17).view(4, 10, 12)
    out3 = torch.zeros(10, 12, dtype=torch.bfloat16)
    m.reduce_3d_persistent_kernel[(2,)](b, out3, 4, 10, 12, *b.stride(), BLOCK_SIZE_M=8, BLOCK_SIZE_N=8)
    _close(out3, b.float().sum(0), "reduce 3d", tol=2e-2)


def run_case(world, gen_dir, case):
    """Rank body: import the generated module and run the case's driver (an
    exception stops every rank of the simulated job and is reported)."""
    if gen_dir not in sys.path:
        sys.path.insert(0, gen_dir)
    import ditron
    import triton_dist.utils as U
    U.initialize_distributed()
    mod = importlib.import_module(f"pc_{case}")
    with ditron.heap_scope():
        globals()[f"drive_{case}"](mod, world, U)
    return "pass"


# ---------------------------------------------------------------------------
# --tutorials: the tutorial scripts themselves, host code included, under ditron sim
# ---------------------------------------------------------------------------

_PORT_LINES = ("import nvshmem.core", "nvshmem.core.finalize()")
#: symmetric heap a tutorial's own sizes need (tutorial 02 gathers an 8192 x 12288 fp16 tensor)
_TUTORIAL_HEAP = {"02": "256M"}


def two_line_port(text):
    """The tutorial's text with the two lines of the port deleted, and how many were."""
    keep, dropped = [], 0
    for line in text.splitlines(keepends=True):
        if line.strip() in _PORT_LINES:
            dropped += 1
            continue
        keep.append(line)
    return "".join(keep), dropped


def _tutorial_files(checkout, wanted):
    tdir = os.path.join(checkout, "tutorials")
    files = sorted(f for f in os.listdir(tdir) if f.endswith(".py") and f[:2].isdigit())
    return [f for f in files if not wanted or any(f.startswith(w) for w in wanted)]


def _failure_line(text):
    """The launcher's verdict: its one line, or the last line of the failing rank's traceback."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("ditron sim: ") and "failed (exit code" not in ln:
            return ln[len("ditron sim: "):][:240]
    tb = [ln for ln in lines if not ln.startswith(" ") and ("Error" in ln or "error" in ln)]
    return (tb[-1] if tb else (lines[-1] if lines else "no output"))[:240]


def run_tutorials(checkout, wanted, ranks, race, hang_s, timeout_s):
    import subprocess
    out_dir = tempfile.mkdtemp(prefix="ditron-tutorials-")
    rows = []
    for name in _tutorial_files(checkout, wanted):
        text, dropped = two_line_port(open(os.path.join(checkout, "tutorials", name)).read())
        path = os.path.join(out_dir, name)
        with open(path, "w") as f:
            f.write(text)
        for n in ranks:
            cmd = [sys.executable, "-m", "ditron.sim", "-n", str(n), "--hang-timeout", str(hang_s),
                   "--heap-size", _TUTORIAL_HEAP.get(name[:2], "64M")] + ([] if race else ["--no-race"]) + [path]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=out_dir)
                verdict = "pass" if r.returncode == 0 else "FAIL: " + _failure_line(r.stderr + "\n" + r.stdout)
            except subprocess.TimeoutExpired:
                verdict = f"FAIL: still running after {timeout_s} s (--timeout-s)"
            rows.append((name, n, dropped, verdict))
            print(f"[{n} ranks] {name} ({dropped} lines ported): {verdict}", file=sys.stderr, flush=True)
    print("| tutorial | ranks | lines deleted | result |\n| --- | --- | --- | --- |")
    for name, n, dropped, verdict in rows:
        print(f"| {name} | {n} | {dropped} | {verdict.replace('|', '/')} |")
    npass = sum(v == "pass" for *_, v in rows)
    print(f"\n{npass} of {len(rows)} tutorial runs passed" + ("" if race else " (--no-race)"))
    return 0 if npass == len(rows) else 1


def _first_line(e):
    text = (getattr(e, "traceback_text", None) or "").strip().splitlines()
    last = text[-1] if text else str(e).strip().splitlines()[0]
    return last[:200]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", help="a local checkout of ByteDance-Seed/Triton-distributed")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--only", nargs="+", default=None, help="case names (default: all)")
    ap.add_argument("--hang-s", type=float, default=15.0, help="deadlock watchdog timeout per case")
    ap.add_argument("--tutorials", nargs="*", default=None, metavar="NN",
                    help="run the checkout's tutorial scripts (all, or those whose names start with NN) under "
                         "ditron sim with the two-line port, instead of the kernel cases")
    ap.add_argument("--no-race", dest="race", action="store_false", default=True,
                    help="with --tutorials: run without the race finder (ditron sim --no-race)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="with --tutorials: limit per run")
    args = ap.parse_args(argv)
    if args.tutorials is not None:
        return run_tutorials(args.checkout, args.tutorials, args.ranks, args.race, args.hang_s, args.timeout_s)
    cases = args.only or list(CASES)
    gen_dir = tempfile.mkdtemp(prefix="ditron-port-check-")
    decorated = {case for case in cases if generate(args.checkout, case, gen_dir)[1]}
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (here, gen_dir):
        if p not in sys.path:
            sys.path.insert(0, p)
    import port_check as this                       # the rank processes import the bodies by this name
    from ditron.errors import DitronHangError, DitronRankError
    from ditron.sim.pool import SimCluster
    results = {c: {} for c in cases}
    for n in args.ranks:
        if n % 2:
            for case in cases:
                if CASES[case].get("even"):
                    results[case][n] = "n/a: an even world size"
        for case in cases:
            per_node = n // CASES[case].get("nnodes", 1)
            if CASES[case].get("local_even") and n % CASES[case].get("nnodes", 1) == 0 and per_node % 2:
                results[case][n] = "n/a: an even number of ranks per node"
        for nnodes in sorted({CASES[c].get("nnodes", 1) for c in cases}):
            if n % nnodes:
                for case in cases:
                    if CASES[case].get("nnodes", 1) == nnodes:
                        results[case][n] = f"n/a: {nnodes} nodes"
                continue
            _run_size(this, SimCluster, DitronHangError, DitronRankError, n, nnodes,
                      [c for c in cases if CASES[c].get("nnodes", 1) == nnodes and n not in results[c]],
                      gen_dir, args.hang_s, results)
    _print_table(cases, args.ranks, results, decorated)
    npass = sum(r == "pass" for c in cases for r in results[c].values())
    nrun = sum(not r.startswith("n/a") for c in cases for r in results[c].values())
    print(f"\n{npass} of {nrun} runs passed")
    print("\nfirst failure of each kernel:")
    for case in cases:
        bad = [(n, r) for n, r in results[case].items() if r not in ("pass",) and not r.startswith("n/a")]
        if bad:
            print(f"  {case} ({bad[0][0]} ranks): {bad[0][1]}")
    return 0 if npass == nrun else 1


def _run_size(this, SimCluster, DitronHangError, DitronRankError, n, nnodes, cases, gen_dir, hang_s, results):
    cluster = SimCluster(n, nnodes, hang_timeout=hang_s)
    try:
        for case in cases:
            try:
                got = cluster.run(this.run_case, gen_dir, case, timeout=10 * hang_s)
                bad = [g for g in got if g != "pass"]
                results[case][n] = "pass" if not bad else bad[0]
            except DitronHangError as e:
                results[case][n] = "HANG: " + " ".join(str(e).split())[:200]
            except DitronRankError as e:
                results[case][n] = "FAIL: " + _first_line(e)
            where = f"{n} ranks" + (f", {nnodes} nodes" if nnodes > 1 else "")
            print(f"[{where}] {case}: {results[case][n]}", file=sys.stderr, flush=True)
    finally:
        cluster.close()


def _print_table(cases, ranks, results, decorated):
    width = max(len(c) for c in cases)
    print(f"| {'kernel'.ljust(width)} | nodes | " + " | ".join(f"{n} ranks" for n in ranks) + " | note |")
    print(f"| {'-' * width} | ----- | " + " | ".join("-------" for _ in ranks) + " | ---- |")
    for case in cases:
        cells = [results[case][n].split(":")[0] for n in ranks]
        note = CASES[case].get("note", "")
        if case in decorated:
            note = "launched with @triton_dist.jit instead of @triton.jit" + (f"; {note}" if note else "")
        print(f"| {case.ljust(width)} | {CASES[case].get('nnodes', 1):5d} | " + " | ".join(c.ljust(7) for c in cells)
              + f" | {note} |")


if __name__ == "__main__":
    sys.exit(main())
