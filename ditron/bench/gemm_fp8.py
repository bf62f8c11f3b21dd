"""What runs one shape of an overlap op on fp8 operands (``ditron bench ag_gemm|gemm_rs|gemm_ar --dtype fp8
--recipe tensor,row,block``): every rank's e4m3 operands quantised from fresh seeded float32 ones per recipe
(:func:`ditron.bench.gemm_sweep.quantise_rows`, as ``ditron bench gemm --dtype fp8``), the float32 reference of
the dequantised operands with the op's collective semantics, ditron's fp8 op (each ``--methods``), ditron's bf16
op on the same (dequantised, rounded to bf16) operands, and the vendor baseline a user would write:

* ``cublas_nccl``: AG-GEMM: ``all_gather_into_tensor`` of the fp8 A rows and of their scales, then
  ``torch._scaled_mm`` (per-tensor A scales differ per rank: the gathered ones are expanded to a rowwise
  ``[M, 1]`` scale and B's to ``[1, N]``, the rowwise cuBLASLt kernel); GEMM-RS / GEMM-AR: ``torch._scaled_mm``
  to bf16, then ``reduce_scatter_tensor`` / ``all_reduce`` of the bf16 partial;
* ``gemm_only`` / ``comm_only`` / ``ditron_gemm_only``: the vendor fp8 GEMM, the collective, ditron's fp8
  ``matmul`` alone at the local shape (for the communication-hidden fraction);
* ``torch_fused``: not measured for fp8 (n/a).

Where ``torch._scaled_mm`` refuses a recipe or gives a wrong result (blockwise on a torch / cuBLASLt without the
kernel, blockwise at a local K not a multiple of 128 -- bench/results/h100-2026-12-07d-fp8-block/), the vendor
cells are ``n/a`` with the reason, and left out of the geomeans: that is not a ditron failure.
"""
from __future__ import annotations

import importlib
import json

from .gemm_run import Inputs, _failing, _heap_hint, _kernel_module, make_check, partial_comm_impl, tolerance
from .gemm_shapes import Shape, local_dims
from .gemm_sweep import quantise_rows, vendor_blockwise
from .harness import Impl


def _baseline_unavailable(what, e):
    text = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    if "baseline unavailable" in text:
        return text[text.index("baseline unavailable"):]
    return f"baseline unavailable: {what}: {text}"


def vendor_mm(a, b, sa, sb, out, recipe, ref, atol):
    """``run()`` of the vendor's fp8 GEMM into ``out`` (torch._scaled_mm; blockwise: :func:`vendor_blockwise`),
    tried once and held to ``ref()`` within ``atol`` before it is used; a refusal or a wrong result raises a
    ``RuntimeError`` starting ``baseline unavailable``."""
    import torch
    if recipe == "block":
        run = vendor_blockwise(a, b, sa, sb, out, ref)
    else:
        def run():
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out.dtype, out=out)
    try:
        out.fill_(float("nan"))
        got = run()
        make_check(ref, atol)(got if got is not None else out)
    except Exception as e:  # noqa: BLE001 -- the baseline's cells say why
        raise RuntimeError(_baseline_unavailable(f"torch._scaled_mm ({recipe})", e)) from None
    return run


def overlap_fp8_impls(op, shape: Shape, world, dtype, methods, peers, seed=0, log=None, *, recipe):
    """(impls, n/a {name: reason}, inputs) for one shape of an overlap op on fp8 operands of ``recipe``
    (the signature of :func:`ditron.bench.gemm_run.overlap_impls`; ``dtype`` is ``"fp8"``)."""
    import torch
    import torch.distributed as dist

    import ditron
    BF, E4 = torch.bfloat16, torch.float8_e4m3fn
    W, R, dev = world.world_size, world.rank, world.device
    a_shape, b_shape, out_shape = local_dims(op, shape, W)
    M, N, K = shape.M, shape.N, shape.K
    on_gpu = str(dev).startswith("cuda")
    have_dist = on_gpu and dist.is_available() and dist.is_initialized()
    nccl_why = "needs CUDA and NCCL (not on the simulator)"
    if have_dist and dist.get_backend() != "nccl":      # ranks sharing a GPU run torch.distributed on gloo
        have_dist = False
        nccl_why = f"needs NCCL (torch.distributed runs on {dist.get_backend()}: ranks share a GPU)"
    inp = Inputs(dev, torch.float32, seed)
    impls, na = [], {}

    def a_of(r):          # rank r's A shard: (fp8, scales, dequantised float32)
        return quantise_rows(inp.rand(a_shape, r, 0), recipe, 1)

    def b_of(r):          # rank r's B: (fp8 [K, N] column-major, scales, dequantised float32 [K, N])
        wq, sw, w_deq = quantise_rows(inp.rand((b_shape[1], b_shape[0]), r, 1), recipe, 128)
        return wq.t(), sw.t(), w_deq.t()

    a, sa, a_deq = a_of(R)
    b, sb, b_deq = b_of(R)
    a16, b16 = a_deq.to(BF), b_deq.to(BF).contiguous()       # ditron's bf16 op: row-major B, its fast layout

    def nan_empty(shape_, dt=BF):
        return torch.full(tuple(shape_), float("nan"), dtype=dt, device=dev)

    def full_a():
        """The gathered A (every rank's shard, made locally), its scales (per-tensor: expanded to rows) and
        its dequantised float32 copy."""
        parts = [(a, sa, a_deq) if r == R else a_of(r) for r in range(W)]
        qa = torch.cat([p[0] for p in parts])
        if recipe == "tensor":
            s = torch.cat([p[1].reshape(1, 1).expand(a_shape[0], 1) for p in parts]).contiguous()
        else:
            s = torch.cat([p[1] for p in parts])
        return qa, s, torch.cat([p[2] for p in parts])

    if op == "ag_gemm":
        ref = inp.ref("out", lambda: full_a()[2] @ b_deq)
        atol_op = atol_gemm = tolerance(BF, K)
        check_op = check_gemm = make_check(ref, atol_op)
        ref_gemm = ref
    else:
        rows = slice(R * (M // W), (R + 1) * (M // W)) if op == "gemm_rs" else slice(None)

        def reduced():
            acc = None
            for r in range(W):
                ad = a_deq if r == R else a_of(r)[2]
                bd = b_deq if r == R else b_of(r)[2]
                part = ad[rows] @ bd
                acc = part if acc is None else acc.add_(part)
            return acc
        ref = inp.ref("out", reduced)
        check_op = make_check(ref, tolerance(BF, K, W))
        ref_gemm = inp.ref("partial", lambda: a_deq @ b_deq)
        atol_gemm = tolerance(BF, K)
        check_gemm = make_check(ref_gemm, atol_gemm)

    # -- ditron: the fp8 op and the bf16 op of each method ---------------------------------------------
    kern, why = _kernel_module(op)
    if kern is None:
        for label, _, _ in methods:
            na[f"ditron {label}"] = why
            na[f"bf16 ditron {label}"] = why
    else:
        mod, create_name, run_name = kern
        create, fn = getattr(mod, create_name), getattr(mod, run_name)
        contexts = {}

        def context(kind, ctx_opts):
            # GEMM-RS / GEMM-AR contexts are of the output dtype and take fp8 and bf16 operands alike
            kind = kind if op == "ag_gemm" else "out"
            key = kind + json.dumps(ctx_opts, sort_keys=True, default=str)
            if key not in contexts:
                try:
                    if op == "ag_gemm":
                        contexts[key] = (create(a_shape[0], K, E4, out_dtype=BF, **ctx_opts) if kind == "fp8"
                                         else create(a_shape[0], K, BF, **ctx_opts))
                    else:
                        contexts[key] = create(M, N, BF, **ctx_opts)
                except Exception as e:  # noqa: BLE001 -- the same on every rank: reported as a failure
                    if isinstance(e, ditron.DitronError) and "symmetric heap" in str(e):
                        e = ditron.DitronError(_heap_hint(e))
                        if log:
                            log(f"{op} {shape.label}: {e}")
                    contexts[key] = e
            return contexts[key]

        for label, ctx_opts, call_opts in methods:
            opts = ", ".join(f"{k}={v}" for k, v in {**ctx_opts, **call_opts}.items())
            for kind, name in (("fp8", f"ditron {label}"), ("bf16", f"bf16 ditron {label}")):
                ctx = context(kind, ctx_opts)
                if isinstance(ctx, Exception):
                    impls.append(_failing(name, ctx))
                    continue
                kw = dict(call_opts, out=nan_empty(out_shape))
                if kind == "fp8":
                    impls.append(Impl(name, lambda ctx=ctx, kw=kw: fn(a, b, ctx, scale_a=sa, scale_b=sb, **kw),
                                      check_op, f"fp8 {recipe}" + (f"; {opts}" if opts else "")))
                else:
                    impls.append(Impl(name, lambda ctx=ctx, kw=kw: fn(a16, b16, ctx, **kw), check_op,
                                      "ditron's bf16 op on the dequantised operands" + (f"; {opts}" if opts else "")))

    # -- the vendor: torch._scaled_mm and the torch.distributed collective -------------------------------
    if "torch_fused" in peers:
        na["torch_fused"] = ("not measured for fp8 (torch.ops.symm_mem.fused_all_gather_scaled_matmul / "
                             "fused_scaled_matmul_reduce_scatter are not wired into this bench)")
    want_gemm = {"cublas_nccl", "gemm_only", "ditron_gemm_only"} & set(peers)
    vendor_gemm, vendor_why = None, ""
    if op == "ag_gemm":
        kg = -(-K // 128)
        if want_gemm:
            qa_full, sa_full, _ = full_a()          # for the vendor's and ditron's local GEMMs (and their checks)
            # the GEMM's buffers: the gathered fp8 A and its scales in _scaled_mm's layout
            a_g = qa_full.clone()
            if recipe == "tensor":
                sa_mm, sb_mm = sa_full.clone(), sb.reshape(1, 1).expand(1, b.shape[1]).contiguous()
            elif recipe == "row":
                sa_mm, sb_mm = sa_full.clone(), sb
            else:
                sa_mm = torch.empty((kg, M), dtype=torch.float32, device=dev).t()     # [M, K/128], strides (1, M)
                sa_mm.copy_(sa_full)
                sb_mm = sb
            try:
                out_v = nan_empty(out_shape)
                vendor_gemm = vendor_mm(a_g, b, sa_mm, sb_mm, out_v, recipe, ref, atol_op)
            except RuntimeError as e:
                vendor_why = str(e)

        def gather_into(ag, sg):
            """all_gather_into_tensor of the fp8 A rows (as bytes) and of their scales."""
            src_s = sa.reshape(1) if recipe == "tensor" else sa.contiguous()

            def run():
                dist.all_gather_into_tensor(ag.view(torch.uint8), a.view(torch.uint8))
                dist.all_gather_into_tensor(sg, src_s)
            return run
        if "cublas_nccl" in peers:
            if not have_dist:
                na["cublas_nccl"] = nccl_why
            elif vendor_gemm is None:
                na["cublas_nccl"] = vendor_why
            else:
                # row: the scales are gathered straight into _scaled_mm's scale_a [M, 1]
                sg = sa_mm if recipe == "row" else torch.empty((W,) if recipe == "tensor" else (M, kg),
                                                               dtype=torch.float32, device=dev)
                gather = gather_into(a_g, sg)
                m = a_shape[0]

                def seq():
                    gather()
                    if recipe == "tensor":        # one scale per rank's rows: rowwise for _scaled_mm
                        sa_mm.view(W, m).copy_(sg[:, None].expand(W, m))
                    elif recipe == "block":       # into _scaled_mm's layout (outer-dim-major)
                        sa_mm.copy_(sg)
                    return vendor_gemm()
                impls.append(Impl("cublas_nccl", seq, check_op,
                                  "all_gather_into_tensor of the fp8 A rows and of their scales, then "
                                  f"torch._scaled_mm ({recipe}"
                                  + ("; per-rank A scales as rowwise [M, 1], B's as [1, N])" if recipe == "tensor"
                                     else ")")))
        if "gemm_only" in peers:
            if vendor_gemm is None:
                na["gemm_only"] = vendor_why
            else:
                impls.append(Impl("gemm_only", vendor_gemm, check_gemm,
                                  f"torch._scaled_mm ({recipe}) of the gathered A at the local shape"))
        if "comm_only" in peers:
            if not have_dist:
                na["comm_only"] = nccl_why
            else:
                ag2 = torch.empty((M, K), dtype=E4, device=dev)
                sg2 = torch.empty((W,) if recipe == "tensor" else (M, 1 if recipe == "row" else kg),
                                  dtype=torch.float32, device=dev)
                gather2 = gather_into(ag2, sg2)
                impls.append(Impl("comm_only", lambda: (gather2(), ag2)[1],
                                  make_check(lambda: full_a()[0].float(), 0.0),
                                  "all_gather_into_tensor of the fp8 A shards and of their scales"))
        if "ditron_gemm_only" in peers:
            gemm_mod = importlib.import_module("ditron.kernels.gemm")
            d_out = nan_empty(out_shape)
            sa_d = sa_full if recipe != "block" else sa_full.contiguous()
            impls.append(Impl("ditron_gemm_only",
                              lambda: gemm_mod.matmul(qa_full, b, out=d_out, scale_a=sa_d, scale_b=sb),
                              check_gemm, f"ditron.kernels.gemm.matmul, fp8 {recipe}, of the gathered A"))
    else:
        if want_gemm - {"ditron_gemm_only"}:
            try:
                c = nan_empty((M, N))
                vendor_gemm = vendor_mm(a, b, sa, sb, c, recipe, ref_gemm, atol_gemm)
            except RuntimeError as e:
                vendor_why = str(e)
        if "cublas_nccl" in peers:
            if not have_dist:
                na["cublas_nccl"] = nccl_why
            elif vendor_gemm is None:
                na["cublas_nccl"] = vendor_why
            elif op == "gemm_rs":
                out = nan_empty(out_shape)

                def seq():
                    vendor_gemm()
                    dist.reduce_scatter_tensor(out, c)
                    return out
                impls.append(Impl("cublas_nccl", seq, check_op,
                                  f"torch._scaled_mm ({recipe}) to bf16, then reduce_scatter_tensor"))
            else:
                def seq():
                    vendor_gemm()
                    dist.all_reduce(c)
                    return c
                impls.append(Impl("cublas_nccl", seq, check_op,
                                  f"torch._scaled_mm ({recipe}) to bf16, then all_reduce (in place)"))
        if "gemm_only" in peers:
            if vendor_gemm is None:
                na["gemm_only"] = vendor_why
            else:
                impls.append(Impl("gemm_only", vendor_gemm, check_gemm, f"torch._scaled_mm ({recipe}), local"))
        if "comm_only" in peers:
            if not have_dist:
                na["comm_only"] = nccl_why
            else:
                partial = (a_deq @ b_deq).to(BF)     # this rank's partial C, the collective's input
                impls.append(partial_comm_impl(op, partial, lambda: nan_empty(out_shape), check_op,
                                                   "the bf16 partial C"))
        if "ditron_gemm_only" in peers:
            gemm_mod = importlib.import_module("ditron.kernels.gemm")
            d_out = nan_empty((M, N))
            impls.append(Impl("ditron_gemm_only", lambda: gemm_mod.matmul(a, b, out=d_out, scale_a=sa, scale_b=sb),
                              check_gemm, f"ditron.kernels.gemm.matmul, fp8 {recipe}, local"))
    return impls, na, inp
