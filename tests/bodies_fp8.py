"""Test bodies of tests/test_fp8.py: the fp8 GEMM core and overlap ops against torch._scaled_mm (per-tensor,
per-row / per-column; torch 2.13 runs it on CPU) and a float32 reference of the blockwise recipe, on
simulated ranks.  Operands are seeded, scaled so that the fp8 values use the whole e4m3 range."""
import importlib

import torch
import triton.language as tl

import ditron

G = importlib.import_module("ditron.kernels.gemm")
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def quant_rows(x, dtype=E4):
    """Per-row fp8 quantisation of a float32 [M, K]: (fp8 values, float32 [M, 1] decode scales)."""
    top = torch.finfo(dtype).max
    s = (x.abs().amax(dim=1, keepdim=True) / top).clamp(min=1e-12)
    return (x / s).to(dtype), s.float()


def quant_tensor(x, dtype=E4):
    top = torch.finfo(dtype).max
    s = (x.abs().max() / top).clamp(min=1e-12)
    return (x / s).to(dtype), s.float().reshape(())


def quant_groups(x, gk=128, dtype=E4):
    """DeepSeek activations: one scale per 1 x gk group of a row -> (fp8 [M, K], scales [M, cdiv(K, gk)])."""
    M, K = x.shape
    nk = -(-K // gk)
    xp = torch.nn.functional.pad(x, (0, nk * gk - K)).reshape(M, nk, gk)
    s = (xp.abs().amax(dim=2) / torch.finfo(dtype).max).clamp(min=1e-12)
    q = (xp / s[:, :, None]).reshape(M, nk * gk)[:, :K].to(dtype)
    return q, s.float()


def quant_blocks(w, gk=128, gn=128, dtype=E4):
    """DeepSeek weights: one scale per gk x gn block of b [K, N] -> (fp8 [K, N], scales [cdiv(K, gk), cdiv(N, gn)])."""
    K, N = w.shape
    nk, nn = -(-K // gk), -(-N // gn)
    wp = torch.nn.functional.pad(w, (0, nn * gn - N, 0, nk * gk - K)).reshape(nk, gk, nn, gn)
    s = (wp.abs().amax(dim=(1, 3)) / torch.finfo(dtype).max).clamp(min=1e-12)
    q = (wp / s[:, None, :, None]).reshape(nk * gk, nn * gn)[:K, :N].to(dtype)
    return q, s.float()


def blockwise_reference(a, b, sa, sb, gk=128, gn=128):
    """float32 reference of the blockwise recipe: for each K group g, the exact fp32 product of the fp8
    slices, scaled by scale_a[:, g] (per row) and scale_b[g, n // gn] (per column block), summed over g."""
    M, K = a.shape
    N = b.shape[1]
    out = torch.zeros(M, N, dtype=torch.float64)
    for g in range(-(-K // gk)):
        part = a[:, g * gk:(g + 1) * gk].double() @ b[g * gk:(g + 1) * gk].double()
        colscale = sb[g].double().repeat_interleave(gn)[:N]
        out += part * sa[:, g].double()[:, None] * colscale[None, :]
    return out.float()


def rand(shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale


def operands(M, N, K, recipe, seed, dtype_a=E4, dtype_b=E4, gk=128, gn=128):
    """(a [M, K], b [K, N] column-major (w.t()), scale_a, scale_b, reference float32 [M, N])."""
    x = rand((M, K), seed) * (1 + torch.arange(M)[:, None] % 5)        # rows of different magnitudes
    w = rand((N, K), seed + 1) * (1 + torch.arange(N)[:, None] % 3)
    if recipe == "block":
        a, sa = quant_groups(x, gk, dtype_a)
        bq, sb = quant_blocks(w.t().contiguous(), gk, gn, dtype_b)
        b = bq.t().contiguous().t()                                     # column-major, as torch._scaled_mm
        return a, b, sa, sb, blockwise_reference(a, b, sa, sb, gk, gn)
    if recipe == "tensor":
        a, sa = quant_tensor(x, dtype_a)
        wq, sb = quant_tensor(w, dtype_b)
    else:
        a, sa = quant_rows(x, dtype_a)
        wq, sbt = quant_rows(w, dtype_b)
        sb = sbt.t()                                                    # [1, N]
    b = wq.t()
    return a, b, sa, sb, None


def exact_scaled_mm(a, b, sa, sb, out_dtype):
    """``torch._scaled_mm``'s semantics (per-tensor or rowwise scales), exactly: the float64 product of the fp8
    operands (every product of two fp8 values and every sum of up to 2**20 of them is exact in float64 for these
    magnitudes), times ``scale_a`` (``[]`` / ``[M, 1]``) and ``scale_b`` (``[]`` / ``[1, N]``), rounded once to
    float32 and then to ``out_dtype`` (as torch's fp32 accumulation and epilogue)."""
    return ((a.double() @ b.double()) * sa.double() * sb.double()).float().to(out_dtype)


#: why torch._scaled_mm did not give the reference, per device (a refusal of the installed torch: torch 2.11's
#: CPU build takes per-tensor scales only, cuBLASLt refuses e5m2 x e5m2 and rowwise scales with fp32 output)
SCALED_MM_REFUSED = {}


def _torch_scaled_mm(a, b, sa, sb, out_dtype, device):
    try:
        return torch._scaled_mm(a.to(device), b.to(device), scale_a=sa.to(device), scale_b=sb.to(device),
                                out_dtype=out_dtype)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        SCALED_MM_REFUSED[str(device)] = f"{type(e).__name__}: {str(e).splitlines()[0][:400]}"
        return None


def _cuda_usable():
    """A GPU this process may use: not in a simulated rank forked from a parent that had started CUDA (CUDA
    cannot start again in a forked child; the simulator's ranks are forked on Linux)."""
    bad_fork = getattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    return torch.cuda.is_available() and not bad_fork()


def scaled_mm_reference(a, b, sa, sb, out_dtype):
    """The reference of the per-tensor / rowwise recipes: ``torch._scaled_mm`` on CPU where the installed torch
    runs it (torch 2.13 has a CPU kernel for per-tensor and rowwise scales; torch 2.11's takes per-tensor
    only), else :func:`exact_scaled_mm`.  Either way it is held to the exact product first, and so is
    ``torch._scaled_mm`` on the GPU (cuBLASLt) where one is present and it takes the operands -- the reference
    and the vendor kernel agree before the op is compared with them."""
    exact = exact_scaled_mm(a, b, sa, sb, out_dtype)
    ref = _torch_scaled_mm(a, b, sa, sb, out_dtype, "cpu")
    if ref is not None:
        check(ref, exact, out_dtype, "torch._scaled_mm (CPU) against the exact product")
    else:
        ref = exact
    if _cuda_usable():
        dev = torch.device("cuda", torch.cuda.current_device())
        on_gpu = _torch_scaled_mm(a, b, sa, sb, out_dtype, dev)
        if on_gpu is not None:
            check(on_gpu, exact, out_dtype, "torch._scaled_mm (cuBLASLt) against the exact product",
                  product_magnitudes(a, b, sa, sb))
    return ref


#: The GPU allowance of an fp8 GEMM, per output element, relative to ``S = sum_k |a_k b_k| * scales`` (the sum of
#: the magnitudes of its scaled products; :func:`product_magnitudes`).  Hopper's fp8 ``wgmma`` does not add in
#: fp32: within one chain of the tensor core (here one ``BLOCK_K`` step of <= 128 products: every ditron fp8 kernel
#: promotes each step into an fp32 register -- ``max_num_imprecise_acc=BLOCK_K`` in the tl core, ``use_acc=False``
#: + ``acc + part`` in the Gluon core, for every recipe) the products and the running sum are aligned to the
#: largest addend's exponent and cut to 13 fraction bits (an e8m13 accumulator; DeepSeek-V3 section 3.3.2: "around
#: 14 bits"; Khattak and Mikaitis, "Accurate models of NVIDIA tensor cores", 2025).  Each product then loses less
#: than 2^-13 of its step's largest addend; the cuts of products of both signs cancel on average.  A model of that
#: accumulator (:func:`h100_fp8_dot`, groups of 32 products) gives at most 1.26 * 2^-13 * S on every case of
#: tests/test_fp8.py (mean 0.06-0.1), and the H100 run of 2026-12-07e at most 1.2 * 2^-13 * S: the GPU bound is
#: 2^-12 * S (plus the output dtype's rounding).  A wrong scale, a missing K step or a transposed tile is off by a
#: good fraction of the product's own magnitude, S / sqrt(K) or more: far beyond (test_gpu_bound_catches_bugs).
GPU_FP8_ACCUMULATION = 2.0 ** -12


def product_magnitudes(a, b, sa, sb, block=None):
    """``S [M, N]`` (float64) of :data:`GPU_FP8_ACCUMULATION`: ``sum_k |a[m, k] b[k, n]|`` times the scales that
    multiply that product -- ``|scale_a| |scale_b|`` per tensor / per row / per column, or with ``block = (gk,
    gn)`` the blockwise scales of each K group."""
    A, Bm = a.double().abs(), b.double().abs()
    if block is None:
        return (A @ Bm) * sa.double().abs() * sb.double().abs()
    gk, gn = block
    M, K = A.shape
    N = Bm.shape[1]
    out = torch.zeros(M, N, dtype=torch.float64)
    for g in range(-(-K // gk)):
        col = sb[g].double().abs().repeat_interleave(gn)[:N]
        out += (A[:, g * gk:(g + 1) * gk] @ Bm[g * gk:(g + 1) * gk]) * sa[:, g].double().abs()[:, None] * col
    return out


def _trunc13(x, e):
    u = torch.ldexp(torch.ones_like(x), e - 13)
    return torch.trunc(x / u) * u


def h100_fp8_dot(a, b, step=128, group=32):
    """A model of sm_90's fp8 ``wgmma`` accumulation (what :data:`GPU_FP8_ACCUMULATION` is calibrated on; CPU,
    float64): per ``step`` of K (the kernels' fp32 promotion) a zeroed accumulator takes ``group`` products at a
    time, each group's products and the accumulator aligned to the largest one's exponent and cut toward zero
    to 13 fraction bits, the sum cut again to 13 bits; the steps' partial sums are returned (``[K / step]`` of
    ``[M, N]``) for the caller's scales and fp32 sum."""
    A, Bm = a.double(), b.double()
    M, K = A.shape
    parts = []
    for s0 in range(0, K, step):
        acc = torch.zeros(M, Bm.shape[1], dtype=torch.float64)
        for g0 in range(s0, min(K, s0 + step), group):
            terms = torch.cat([acc[..., None], A[:, None, g0:g0 + group] * Bm.t()[None, :, g0:g0 + group]], dim=2)
            e = torch.floor(torch.log2(terms.abs().amax(dim=2).clamp(min=1e-300))).long()
            acc = _trunc13(terms, e[..., None]).sum(dim=2)
            acc = _trunc13(acc, torch.floor(torch.log2(acc.abs().clamp(min=1e-300))).long())
        parts.append(acc)
    return parts


def _verdict(err, bound, got, want, what, extra=""):
    bad = err > bound
    if bool(bad.any()):
        ratio = err / bound
        i = tuple(int(v) for v in (ratio == ratio.max()).nonzero()[0])
        first = tuple(int(v) for v in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} elements beyond the bound{extra}; worst at {list(i)}: {got[i].item()} vs "
            f"{want[i].item()}, error {err[i].item():.4g} = {ratio[i].item():.3g} x its bound {bound[i].item():.4g}; "
            f"first at {list(first)}: {got[first].item()} vs {want[first].item()}")


def check(got, want, out_dtype, what, S=None):
    """Simulator: fp32 output within fp32 rounding of a different summation order; bf16 / fp16: every element at
    most one rounding step of the output dtype from the reference's, and at most 2% of them differ at all (two
    fp32 sums that agree to fp32 rounding round to the same bf16 value unless they straddle a rounding boundary;
    a systematic error of a fraction of an ulp moves far more than 2%).

    GPU (``got`` on cuda; ``S``: :func:`product_magnitudes` of the operands): the tensor core's fp8 accumulation,
    :data:`GPU_FP8_ACCUMULATION` ``* S`` per element, on top of one rounding step of the output dtype (a shifted
    sum may round to the neighbouring value); no count of differing elements (the accumulator's error moves
    a few percent of bf16 / fp16 roundings by construction)."""
    gpu = got.device.type == "cuda"
    got = got.detach().cpu().float()
    want = want.float()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.isfinite(got).all(), what
    err = (got - want).abs()
    if gpu:
        assert S is not None, f"{what}: a GPU result needs the product magnitudes S for its bound"
        eps = torch.finfo(out_dtype).eps
        bound = (want.abs() * eps * 1.01 + (GPU_FP8_ACCUMULATION * S + 2.0 ** -20 * S.abs().max()).float())
        _verdict(err, bound, got, want, what, f" (GPU: one {out_dtype} rounding + 2^-12 * sum_k |a b| scales)")
        return
    if out_dtype == torch.float32:
        tol = 2e-6 * want.abs().max().item() + 1e-30
        e = err.max().item()
        assert e <= tol, f"{what}: max abs error {e} > {tol}"
        return
    eps = torch.finfo(out_dtype).eps
    bound = want.abs() * eps * 1.01 + 1e-6 * want.abs().max()
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} elements beyond one {out_dtype} ulp, e.g. " \
                             f"{got[tuple(bad[0])].item()} vs {want[tuple(bad[0])].item()}"
    differ = (got != want).float().mean().item()
    assert differ <= 0.02, f"{what}: {differ:.1%} of the elements differ from the reference"


def matmul_recipes(world, cases):
    """matmul on fp8 operands of every recipe against the references; returns the number of cases run."""
    dev = world.device
    n = 0
    for i, (M, N, K, recipe, out_dtype, da, db) in enumerate(cases):
        out_dtype = getattr(torch, out_dtype)
        da, db = getattr(torch, da), getattr(torch, db)
        a, b, sa, sb, ref = operands(M, N, K, recipe, 10 * i, da, db)
        got = G.matmul(a.to(dev), b.to(dev), scale_a=sa.to(dev), scale_b=sb.to(dev), out_dtype=out_dtype)
        assert got.dtype == out_dtype
        if ref is None:
            ref = scaled_mm_reference(a, b, sa, sb, out_dtype)
        else:
            ref = ref.to(out_dtype) if out_dtype != torch.float32 else ref
        check(got, ref, out_dtype, f"{M}x{N}x{K} {recipe} -> {out_dtype}",
              product_magnitudes(a, b, sa, sb, (128, 128) if recipe == "block" else None))
        n += 1
    return n


# ---------------------------------------------------------------------------
# overlap ops on several simulated ranks
# ---------------------------------------------------------------------------

def _rank_operands(rank, M, N, K, recipe, seed, dtype_a=E4, dtype_b=E4):
    """Rank ``rank``'s fp8 operands (every rank can rebuild every other rank's) and its partial product's
    float32 reference (torch._scaled_mm in fp32 for per-tensor / rowwise, the blockwise reference)."""
    a, b, sa, sb, ref = operands(M, N, K, recipe, 1000 * seed + 17 * rank, dtype_a, dtype_b)
    if ref is None:
        ref = scaled_mm_reference(a, b, sa, sb, torch.float32)
    return a, b, sa, sb, ref


def _partials_reference(world, M, N, K, recipe, seed, out_dtype, dtype_a=E4):
    """``(sum_s round(partial_s), gpu_slack)``: the sum as the ops compute it (each rank's partial rounded once to
    the output dtype, summed in fp32), and what a GPU may add per element -- each partial's fp8 accumulation
    (:data:`GPU_FP8_ACCUMULATION` of its product magnitudes) and the rounding step of the output dtype that a
    shifted partial may round to."""
    eps = torch.finfo(out_dtype).eps
    rounded, slack = 0, 0
    for s in range(world.world_size):
        a, b, sa, sb, p = _rank_operands(s, M, N, K, recipe, seed, dtype_a)
        rounded = rounded + p.to(out_dtype).float()
        S = product_magnitudes(a, b, sa, sb, (128, 128) if recipe == "block" else None)
        slack = slack + (GPU_FP8_ACCUMULATION * S).float() + eps * p.abs().float()
    return rounded, slack


def check_sum(got, want, out_dtype, what, W, slack=None):
    """A sum of ``W`` rounded partials, rounded again: every element within (W + 1) rounding steps of the
    output dtype of the reference's magnitude, and at most 5% of the elements differ from it.  On a GPU
    (``slack`` from :func:`_partials_reference`): within that plus each partial's accumulation and rounding
    allowance, no count of differing elements (see :func:`check`)."""
    gpu = got.device.type == "cuda"
    got = got.detach().cpu().float()
    assert torch.isfinite(got).all(), what
    eps = torch.finfo(out_dtype).eps if out_dtype != torch.float32 else 4e-6
    err = (got - want).abs()
    if gpu:
        assert slack is not None, f"{what}: a GPU result needs the partials' slack for its bound"
        bound = (W + 1) * torch.finfo(out_dtype).eps * want.abs() + slack + 2.0 ** -20 * slack.max()
        _verdict(err, bound, got, want, what, f" (GPU: {W + 1} {out_dtype} roundings of the sum + per partial one "
                                              "rounding and 2^-12 * sum_k |a b| scales)")
        return
    bound = (W + 1) * eps * want.abs() + 2e-6 * want.abs().max()
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} elements off, e.g. {got[tuple(bad[0])].item()} vs " \
                             f"{want[tuple(bad[0])].item()}"
    if out_dtype != torch.float32:
        differ = (got != want.to(out_dtype).float()).float().mean().item()
        assert differ <= 0.05, f"{what}: {differ:.1%} of the elements differ from the reference"


def gemm_rs_fp8(world, cases, method, config=None):
    """gemm_rs on fp8 operands: ``(m, N, K, recipe, out dtype)`` per call, one context per call."""
    from ditron.kernels.gemm_rs import create_gemm_rs_context, gemm_rs
    W, r, dev = world.world_size, world.rank, world.device
    n = 0
    for i, (m, N, K, recipe, out_dtype) in enumerate(cases):
        out_dtype = getattr(torch, out_dtype)
        ctx = create_gemm_rs_context(W * m, N, out_dtype, method=method, config=config or G.SIM_CONFIG)
        a, b, sa, sb, _ = _rank_operands(r, W * m, N, K, recipe, i)
        got = gemm_rs(a.to(dev), b.to(dev), ctx, scale_a=sa.to(dev), scale_b=sb.to(dev))
        assert got.dtype == out_dtype and got.shape == (m, N)
        want, slack = (t[r * m:(r + 1) * m] for t in _partials_reference(world, W * m, N, K, recipe, i, out_dtype))
        check_sum(got, want, out_dtype, f"gemm_rs {method} {recipe} call {i} rank {r}", W, slack)
        n += 1
    return n


def gemm_ar_fp8(world, cases, method):
    """gemm_ar on fp8 operands: ``(M, N, K, recipe, out dtype)`` per call."""
    GA = importlib.import_module("ditron.kernels.gemm_ar")
    W, r, dev = world.world_size, world.rank, world.device
    n = 0
    for i, (M, N, K, recipe, out_dtype) in enumerate(cases):
        out_dtype = getattr(torch, out_dtype)
        ctx = GA.create_gemm_ar_context(M, N, out_dtype)
        a, b, sa, sb, _ = _rank_operands(r, M, N, K, recipe, i)
        got = GA.gemm_ar(a.to(dev), b.to(dev), ctx, method=method, scale_a=sa.to(dev), scale_b=sb.to(dev))
        assert got.dtype == out_dtype and got.shape == (M, N)
        want, slack = _partials_reference(world, M, N, K, recipe, i, out_dtype)
        check_sum(got, want, out_dtype, f"gemm_ar {method} {recipe} call {i} rank {r}", W, slack)
        n += 1
    return n


def ag_gemm_fp8(world, cases, producer):
    """ag_gemm on fp8 shards: ``(m, N, K, recipe, out dtype)`` per call, every call on one context (the
    scales of earlier calls must not leak into later ones).  Rank ``s``'s rows of the result are its shard
    times b with its own scales (the scales travel with the rows)."""
    from ditron.kernels.ag_gemm import ag_gemm, create_ag_gemm_context
    W, r, dev = world.world_size, world.rank, world.device
    K = cases[0][2]
    ctx = create_ag_gemm_context(max(c[0] for c in cases), K, E4, producer=producer, config=G.SIM_CONFIG,
                                 out_dtype=getattr(torch, cases[0][4]))
    n = 0
    for i, (m, N, K_, recipe, out_dtype) in enumerate(cases):
        assert K_ == K and getattr(torch, out_dtype) == ctx.out_dtype
        out_dtype = ctx.out_dtype
        a, _, sa, _, _ = _rank_operands(r, m, N, K, recipe, i)
        _, b, _, sb, _ = _rank_operands(0, m, N, K, recipe, i)            # b is the same on every rank
        got = ag_gemm(a.to(dev), b.to(dev), ctx, scale_a=sa.to(dev), scale_b=sb.to(dev))
        assert got.dtype == out_dtype and got.shape == (W * m, N)
        want, mags = [], []
        for s in range(W):
            a_s, _, sa_s, _, _ = _rank_operands(s, m, N, K, recipe, i)
            mags.append(product_magnitudes(a_s, b, sa_s, sb, (128, 128) if recipe == "block" else None))
            if recipe == "block":
                want.append(blockwise_reference(a_s, b, sa_s, sb).to(out_dtype))
            else:
                want.append(scaled_mm_reference(a_s, b, sa_s, sb, out_dtype))
        check(got, torch.cat(want), out_dtype, f"ag_gemm {producer} {recipe} call {i} rank {r}", torch.cat(mags))
        n += 1
    return n


def grouped_gemm_fp8(world, cases):
    """The MoE grouped GEMM on fp8 tokens and experts with blockwise scales: ``(counts, N, K, gather)`` per
    case; each expert's rows against the blockwise reference of that expert."""
    from ditron.kernels.moe import grouped_gemm
    dev = world.device
    n = 0
    for i, (counts, N, K, gather) in enumerate(cases):
        E, rows = len(counts), sum(counts)
        x = rand((rows + 3, K), 50 + i) * (1 + torch.arange(rows + 3)[:, None] % 4)
        a, sa = quant_groups(x)
        ws, sws = zip(*(quant_blocks(rand((K, N), 60 + 10 * i + e)) for e in range(E)))
        w, sw = torch.stack(ws), torch.stack(sws)
        idx = torch.randperm(rows + 3, generator=torch.Generator().manual_seed(i))[:rows] if gather else None
        if not gather:
            a, sa = a[:rows], sa[:rows]
        got = grouped_gemm(a.to(dev), w.to(dev), torch.tensor(counts, device=dev), scale_a=sa.to(dev),
                           scale_w=sw.to(dev), gather_idx=None if idx is None else idx.to(dev))
        assert got.dtype == torch.bfloat16 and got.shape == (rows, N)
        src = idx if gather else torch.arange(rows)
        want, mags, off = [], [], 0
        for e, c in enumerate(counts):
            r = src[off:off + c]
            want.append(blockwise_reference(a[r], w[e], sa[r], sw[e]).to(torch.bfloat16))
            mags.append(product_magnitudes(a[r], w[e], sa[r], sw[e], (128, 128)))
            off += c
        check(got, torch.cat(want), torch.bfloat16, f"grouped_gemm case {i}", torch.cat(mags))
        n += 1
    return n


def error_cases(world):
    """Messages of the DitronErrors raised before launch for bad fp8 arguments."""
    from bodies_ag_gemm import error_messages
    from ditron.kernels.moe import grouped_gemm
    dev = world.device
    a, b, sa, sb, _ = operands(20, 24, 256, "row", 3)
    a, b, sa, sb = a.to(dev), b.to(dev), sa.to(dev), sb.to(dev)
    ab, bb, sab, sbb, _ = operands(20, 24, 256, "block", 3)
    ab, bb, sab, sbb = ab.to(dev), bb.to(dev), sab.to(dev), sbb.to(dev)
    mm = G.matmul
    cases = {
        "no_scales": lambda: mm(a, b),
        "scale_dtype": lambda: mm(a, b, scale_a=sa.double(), scale_b=sb),
        "scale_a_shape": lambda: mm(a, b, scale_a=sa[:7], scale_b=sb),
        "scale_b_shape": lambda: mm(a, b, scale_a=sa, scale_b=sb[:, :5]),
        "block_b_shape": lambda: mm(ab, bb, scale_a=sab, scale_b=sbb[:1]),
        "mixed": lambda: mm(ab, bb, scale_a=sab, scale_b=sb),
        "b_dtype": lambda: mm(a, b.to(torch.bfloat16), scale_a=sa, scale_b=sb),
        "out_dtype": lambda: mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float8_e4m3fn),
        "out": lambda: mm(a, b, scale_a=sa, scale_b=sb, out=torch.empty(20, 24, device=dev)),
        "bf16_scales": lambda: mm(a.float().bfloat16(), b.float().bfloat16(), scale_a=sa, scale_b=sb),
        "block_k": lambda: mm(ab, bb, scale_a=sab, scale_b=sbb, config=G.GemmConfig(16, 16, 256)),
        "block_group": lambda: mm(ab, bb, scale_a=sab, scale_b=sbb, scale_block=(32, 128)),
        "scale_block": lambda: mm(ab, bb, scale_a=sab, scale_b=sbb, scale_block=(100, 128)),
        "moe_scales": lambda: grouped_gemm(ab, bb.reshape(1, 256, 24), torch.tensor([20], device=dev), scale_a=sab,
                                           scale_w=sbb),
    }
    return error_messages(cases)


@ditron.jit
def fp8_dot_loop_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BK: tl.constexpr, PROMOTE: tl.constexpr):
    r = tl.arange(0, BM)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BM), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + r[:, None] * K + k0 + ks[None, :])
        b = tl.load(b_ptr + (k0 + ks[:, None]) * BM + r[None, :])
        if PROMOTE:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BK)
        else:
            acc = tl.dot(a, b, acc)
    tl.store(c_ptr + r[:, None] * BM + r[None, :], acc)


def fp8_accumulation(world):
    from bodies_ag_gemm import error_messages
    dev = world.device
    a = rand((16, 64), 1).to(E4).to(dev)
    b = rand((64, 16), 2).to(E4).to(dev)
    c = torch.empty(16, 16, device=dev)

    def promoted():
        fp8_dot_loop_kernel[(1,)](a, b, c, 64, BM=16, BK=32, PROMOTE=True)
        exact = a.cpu().double() @ b.cpu().double()
        if c.device.type == "cuda":         # the tensor core's accumulation (:data:`GPU_FP8_ACCUMULATION`)
            one = torch.ones((), dtype=torch.float32)
            check(c, exact.float(), torch.float32, "promoted fp8 tl.dot",
                  product_magnitudes(a.cpu(), b.cpu(), one, one))
        else:                               # the simulator: the exact products summed in fp32
            torch.testing.assert_close(c.cpu(), exact.float(), rtol=1e-6, atol=1e-5)
    return error_messages({"default": lambda: fp8_dot_loop_kernel[(1,)](a, b, c, 64, BM=16, BK=32, PROMOTE=False),
                           "promoted": promoted})


# ---------------------------------------------------------------------------
# the Gluon core's fp8 path (kernels/gemm_hopper.py): matmul(..., core="gluon")
# ---------------------------------------------------------------------------

def gluon_core_recipes(world, cases):
    """``matmul(..., core="gluon")`` on fp8 operands: the Gluon core on an sm_90 GPU, its tl twin (same tiles
    and K order) on the simulator; ``(M, N, K, recipe, out dtype, dtype a, dtype b, config)`` per case
    (config: None for the default, else ``HopperGemmConfig`` fields and optionally ``scale_block``), against
    torch._scaled_mm's numerics (per-tensor, rowwise) or the float32 reference of the blockwise recipe."""
    from ditron.kernels import gemm_hopper as H
    dev = world.device
    n = 0
    for i, (M, N, K, recipe, out_dtype, da, db, cfg) in enumerate(cases):
        out_dtype = getattr(torch, out_dtype)
        fields = dict(cfg or {})
        gk, gn = fields.pop("scale_block", (128, 128))
        a, b, sa, sb, ref = operands(M, N, K, recipe, 50 + i, getattr(torch, da), getattr(torch, db), gk, gn)
        assert b.stride(0) == 1                                 # w.t(): column-major
        config = H.HopperGemmConfig(**fields) if fields else None
        got = G.matmul(a.to(dev), b.to(dev), scale_a=sa.to(dev), scale_b=sb.to(dev), out_dtype=out_dtype,
                       config=config, scale_block=(gk, gn), core="gluon")
        assert got.dtype == out_dtype and got.shape == (M, N)
        if ref is None:
            ref = scaled_mm_reference(a, b, sa, sb, out_dtype)
        elif out_dtype != torch.float32:
            ref = ref.to(out_dtype)
        check(got, ref, out_dtype, f"gluon {M}x{N}x{K} {recipe} {da}x{db} -> {out_dtype} {cfg or 'default'}",
              product_magnitudes(a, b, sa, sb, (gk, gn) if recipe == "block" else None))
        if recipe == "block" and torch.device(dev).type == "cuda" and H.supported(dev):
            # on an sm_90 GPU the Gluon kernel ran: its tl twin (what the simulator runs) gives the same bits
            cfg_used = config or H.fp8_default_config(M, N, K, 132, out_dtype, gk)
            twin = G.matmul(a.to(dev), b.to(dev), scale_a=sa.to(dev), scale_b=sb.to(dev), out_dtype=out_dtype,
                            config=H.twin_config(cfg_used), scale_block=(gk, gn), core="tl")
            differ = int((twin != got).sum())
            assert differ == 0, f"gluon blockwise {M}x{N}x{K} {cfg or 'default'}: {differ} elements differ " \
                                "from the tl twin's"
        n += 1
    return n


def gluon_error_cases(world):
    """Messages of the DitronErrors the fp8 Gluon path raises before launch (on every device)."""
    from bodies_ag_gemm import error_messages
    from ditron.kernels import gemm_hopper as H
    dev = world.device
    a, b, sa, sb, _ = operands(20, 24, 256, "row", 3)
    a, b, sa, sb = a.to(dev), b.to(dev), sa.to(dev), sb.to(dev)
    blocks = {gk: [t.to(dev) for t in operands(20, 24, 256, "block", 3, gk=gk)[:4]] for gk in (16, 64)}
    unaligned = [t.to(dev) for t in operands(20, 24, 200, "row", 4)[:4]]      # K = 200: rows of 200 bytes

    def mm(*args, **kw):
        return G.matmul(*args, core="gluon", **kw)
    cases = {
        "b_row_major": lambda: mm(a, b.contiguous(), scale_a=sa, scale_b=sb),
        "a_col_major": lambda: mm(a.t().contiguous().t(), b, scale_a=sa, scale_b=sb),
        "scale_a_shape": lambda: mm(a, b, scale_a=sa[:7], scale_b=sb),
        "scale_b_shape": lambda: mm(a, b, scale_a=sa, scale_b=sb.t()),
        "blockwise": lambda: mm(*blocks[16][:2], scale_a=blocks[16][2], scale_b=blocks[16][3],
                                scale_block=(16, 128)),
        "block_k_group": lambda: mm(*blocks[64][:2], scale_a=blocks[64][2], scale_b=blocks[64][3],
                                    scale_block=(64, 128), config=H.HopperGemmConfig(128, 128, 128, stages=4)),
        "tl_config": lambda: mm(a, b, scale_a=sa, scale_b=sb, config=G.GemmConfig(128, 128, 128)),
        "registers": lambda: mm(a, b, scale_a=sa, scale_b=sb, config=H.HopperGemmConfig(128, 256, 128, stages=2)),
        "smem": lambda: mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32,
                           config=H.HopperGemmConfig(128, 128, 128, stages=6)),
        "block_k": lambda: mm(a, b, scale_a=sa, scale_b=sb, config=H.HopperGemmConfig(128, 128, 256, stages=2)),
        "core": lambda: G.matmul(a, b, scale_a=sa, scale_b=sb, core="cutlass"),
        "unaligned_k": lambda: mm(*unaligned[:2], scale_a=unaligned[2], scale_b=unaligned[3]),
    }
    return error_messages(cases)


# ---------------------------------------------------------------------------
# the overlap ops on the Gluon core (core="gluon"): AG-GEMM, GEMM-RS, GEMM-AR (rs_ag)
# ---------------------------------------------------------------------------

def _gluon_cfg(fields):
    from ditron.kernels import gemm_hopper as H
    return H.HopperGemmConfig(**fields) if fields else None


def _twin_tl_config(world, gluon_config, M, N, K, recipe, out_dtype):
    """The tl config of the bit-for-bit comparison: on an sm_90 GPU the twin of the Gluon config the call used
    (``twin_config``: the same tiles and K order), on the simulator the tl config the core="gluon" context's twin
    runs (the simulator's small tiles: the same kernel, so the same bits)."""
    from ditron.kernels import gemm_hopper as H
    if torch.device(world.device).type == "cuda" and H.supported(world.device):
        used = gluon_config or H.fp8_default_config(M, N, K, 132, out_dtype, 128 if recipe == "block" else None)
        return H.twin_config(used)
    return G.SIM_CONFIG


def _same_bits(fast, slow, what):
    differ = int((fast.view(torch.uint8) != slow.view(torch.uint8)).sum())
    assert differ == 0 and fast.shape == slow.shape, f"{what}: the Gluon core's result differs from its tl twin's " \
                                                     f"({differ} bytes of {fast.numel() * fast.element_size()})"


def gluon_ag_gemm_fp8(world, cases, gluon_config=None):
    """``ag_gemm`` on a ``core="gluon"`` fp8 context: ``(m, N, K, recipe, out dtype)`` per call, every call on one
    context; each rank's rows scaled by that rank's own scales (they travel with the rows), against the
    references of :func:`ag_gemm_fp8`, and bit for bit against a ``core="tl"`` context on the Gluon core's twin
    config (:func:`_twin_tl_config`)."""
    from ditron.kernels.ag_gemm import ag_gemm, create_ag_gemm_context
    W, r, dev = world.world_size, world.rank, world.device
    K, out_dtype = cases[0][2], getattr(torch, cases[0][4])
    gcfg = _gluon_cfg(gluon_config)
    twin = _twin_tl_config(world, gcfg, max(c[0] for c in cases) * W, cases[0][1], K, cases[0][3], out_dtype)
    max_m = max(c[0] for c in cases)
    gctx = create_ag_gemm_context(max_m, K, E4, core="gluon", gluon_config=gcfg, out_dtype=out_dtype)
    tctx = create_ag_gemm_context(max_m, K, E4, config=twin, out_dtype=out_dtype)
    n = 0
    for i, (m, N, K_, recipe, od) in enumerate(cases):
        assert K_ == K and getattr(torch, od) == out_dtype
        a, _, sa, _, _ = _rank_operands(r, m, N, K, recipe, 40 + i)
        _, b, _, sb, _ = _rank_operands(0, m, N, K, recipe, 40 + i)
        assert b.stride(0) == 1                                          # w.t(), as the Gluon core takes it
        args = (a.to(dev), b.to(dev))
        scales = dict(scale_a=sa.to(dev), scale_b=sb.to(dev))
        got = ag_gemm(*args, gctx, **scales)
        assert got.dtype == out_dtype and got.shape == (W * m, N)
        want, mags = [], []
        for s in range(W):
            a_s, _, sa_s, _, _ = _rank_operands(s, m, N, K, recipe, 40 + i)
            mags.append(product_magnitudes(a_s, b, sa_s, sb, (128, 128) if recipe == "block" else None))
            if recipe == "block":
                want.append(blockwise_reference(a_s, b, sa_s, sb).to(out_dtype))
            else:
                want.append(scaled_mm_reference(a_s, b, sa_s, sb, out_dtype))
        what = f"ag_gemm gluon {recipe} m={m} N={N} K={K} call {i} rank {r}"
        check(got, torch.cat(want), out_dtype, what, torch.cat(mags))
        _same_bits(got, ag_gemm(*args, tctx, **scales), what)
        n += 1
    assert int(gctx.calls[0]) == n
    return n


def gluon_gemm_rs_fp8(world, cases, gluon_config=None):
    """``gemm_rs`` with fp8 operands on a ``core="gluon"`` context: ``(m, N, K, recipe, out dtype[, e5m2 a])``
    per call, one context per output dtype (calls of other shapes on it), against :func:`gemm_rs_fp8`'s
    reference and bit for bit against a ``core="tl"`` context on the twin config."""
    from ditron.kernels.gemm_rs import create_gemm_rs_context, gemm_rs
    W, r, dev = world.world_size, world.rank, world.device
    gcfg = _gluon_cfg(gluon_config)
    ctxs = {}
    n = 0
    for i, (m, N, K, recipe, out_dtype, *e5) in enumerate(cases):
        out_dtype = getattr(torch, out_dtype)
        da = E5 if e5 and e5[0] else E4
        key = (out_dtype, N)
        if key not in ctxs:
            max_m = W * max(c[0] for c in cases)
            twin = _twin_tl_config(world, gcfg, W * m, N, K, recipe, out_dtype)
            ctxs[key] = (create_gemm_rs_context(max_m, N, out_dtype, method="ce", core="gluon", gluon_config=gcfg),
                         create_gemm_rs_context(max_m, N, out_dtype, method="ce", config=twin))
        gctx, tctx = ctxs[key]
        a, b, sa, sb, _ = _rank_operands(r, W * m, N, K, recipe, 60 + i, dtype_a=da)
        args = (a.to(dev), b.to(dev))
        scales = dict(scale_a=sa.to(dev), scale_b=sb.to(dev))
        got = gemm_rs(*args, gctx, **scales)
        assert got.dtype == out_dtype and got.shape == (m, N)
        want, slack = (t[r * m:(r + 1) * m] for t in _partials_reference(world, W * m, N, K, recipe, 60 + i,
                                                                           out_dtype, da))
        what = f"gemm_rs gluon {recipe} {da} m={m} N={N} K={K} -> {out_dtype} call {i} rank {r}"
        check_sum(got, want, out_dtype, what, W, slack)
        _same_bits(got, gemm_rs(*args, tctx, **scales), what)
        n += 1
    return n


def gluon_gemm_ar_fp8(world, cases, gluon_config=None):
    """``gemm_ar`` (method ``"rs_ag"``, a ``core="gluon"`` context's one) with fp8 operands: ``(M, N, K, recipe,
    out dtype)`` per call, against :func:`gemm_ar_fp8`'s reference and bit for bit against a ``core="tl"``
    context's rs_ag on the twin config."""
    GA = importlib.import_module("ditron.kernels.gemm_ar")
    W, r, dev = world.world_size, world.rank, world.device
    gcfg = _gluon_cfg(gluon_config)
    n = 0
    for i, (M, N, K, recipe, out_dtype) in enumerate(cases):
        out_dtype = getattr(torch, out_dtype)
        twin = _twin_tl_config(world, gcfg, M, N, K, recipe, out_dtype)
        gctx = GA.create_gemm_ar_context(M, N, out_dtype, core="gluon", gluon_config=gcfg)
        tctx = GA.create_gemm_ar_context(M, N, out_dtype, config=twin)
        a, b, sa, sb, _ = _rank_operands(r, M, N, K, recipe, 80 + i)
        args = (a.to(dev), b.to(dev))
        scales = dict(scale_a=sa.to(dev), scale_b=sb.to(dev))
        got = GA.gemm_ar(*args, gctx, **scales)
        assert got.dtype == out_dtype and got.shape == (M, N)
        what = f"gemm_ar gluon {recipe} M={M} N={N} K={K} -> {out_dtype} call {i} rank {r}"
        want, slack = _partials_reference(world, M, N, K, recipe, 80 + i, out_dtype)
        check_sum(got, want, out_dtype, what, W, slack)
        _same_bits(got, GA.gemm_ar(*args, tctx, method="rs_ag", **scales), what)
        n += 1
    return n


def gluon_overlap_error_cases(world):
    """Messages of the DitronErrors the fp8 Gluon paths of the overlap ops raise before launch -- on every device
    (the simulator, which runs the tl twin, refuses what the GPU would) -- and the contexts that take fp8
    operands on the Gluon core (a float32 GEMM-RS / GEMM-AR context, an fp8 AG-GEMM one)."""
    from bodies_ag_gemm import error_messages
    from ditron.kernels import gemm_hopper as H
    from ditron.kernels.ag_gemm import ag_gemm, create_ag_gemm_context
    from ditron.kernels.gemm_rs import create_gemm_rs_context, gemm_rs
    GA = importlib.import_module("ditron.kernels.gemm_ar")
    W, r, dev = world.world_size, world.rank, world.device

    def ops(M, N, K, recipe="row", gk=128):
        return [t.to(dev) for t in operands(M, N, K, recipe, 7 + r, gk=gk)[:4]]
    ag = create_ag_gemm_context(128, 160, E4, core="gluon")
    ag72 = create_ag_gemm_context(128, 72, E4, core="gluon")
    ag16 = create_ag_gemm_context(128, 160, E4, core="gluon", scale_block=(16, 128))
    rs = create_gemm_rs_context(8 * W, 24, torch.bfloat16, method="ce", core="gluon")
    rs20 = create_gemm_rs_context(8 * W, 20, torch.bfloat16, method="ce", core="gluon")
    rs32 = create_gemm_rs_context(8 * W, 24, torch.float32, method="ce", core="gluon")
    # a config for fp8 operands only (6 stages of 128 x 128 x 128: too much shared memory for 16-bit ones)
    fp8_only = H.HopperGemmConfig(128, 128, 128, stages=6)
    rs_fp8cfg = create_gemm_rs_context(8 * W, 24, torch.bfloat16, method="ce", core="gluon", gluon_config=fp8_only)
    ar = GA.create_gemm_ar_context(4 * W, 24, torch.bfloat16, core="gluon")
    a, b, sa, sb = ops(128, 24, 160)
    a5, _, sa5, _ = ops(5, 24, 160)
    a72, b72, sa72, sb72 = ops(128, 24, 72)
    ab, bb, sab, sbb = ops(128, 24, 160, "block", gk=16)
    a64, b64, sa64, sb64 = ops(8 * W, 24, 256, "block", gk=64)
    ar_, br_, sar_, sbr_ = ops(8 * W, 24, 160)
    _, b20, _, sb20 = ops(8 * W, 20, 160)
    bf = torch.ones(8 * W, 32, dtype=torch.bfloat16, device=dev)
    bfb = torch.ones(32, 24, dtype=torch.bfloat16, device=dev)
    cases = {
        "ag_m": lambda: ag_gemm(a5, b, ag, scale_a=sa5, scale_b=sb),
        "ag_b_row_major": lambda: ag_gemm(a, b.contiguous(), ag, scale_a=sa, scale_b=sb),
        "ag_k": lambda: ag_gemm(a72, b72, ag72, scale_a=sa72, scale_b=sb72),
        "ag_groups": lambda: ag_gemm(ab, bb, ag16, scale_a=sab, scale_b=sbb),
        "ag_n": lambda: ag_gemm(a, b[:, :20], ag, scale_a=sa, scale_b=sb[:, :20]),
        "ag_config": lambda: create_ag_gemm_context(128, 160, E4, core="gluon",
                                                    gluon_config=H.HopperGemmConfig(128, 256, 128, stages=2)),
        "rs_b_row_major": lambda: gemm_rs(ar_, br_.contiguous(), rs, scale_a=sar_, scale_b=sbr_),
        "rs_n": lambda: gemm_rs(ar_, b20, rs20, scale_a=sar_, scale_b=sb20),
        "rs_block_k": lambda: gemm_rs(a64, b64, rs, scale_a=sa64, scale_b=sb64, scale_block=(64, 128)),
        "rs_block_k_cfg": lambda: gemm_rs(a64, b64, rs_fp8cfg, scale_a=sa64, scale_b=sb64, scale_block=(64, 128)),
        "rs_fp8_only_cfg": lambda: gemm_rs(bf, bfb, rs_fp8cfg),
        "rs_fp32_bf16": lambda: gemm_rs(bf, bfb, rs32),
        "rs_cfg_neither": lambda: create_gemm_rs_context(8 * W, 24, torch.bfloat16, method="ce", core="gluon",
                                                         gluon_config=H.HopperGemmConfig(128, 256, 128, stages=4)),
        "ar_b_row_major": lambda: GA.gemm_ar(ar_[:4 * W], br_.contiguous(), ar, scale_a=sar_[:4 * W],
                                             scale_b=sbr_),
    }
    msgs = error_messages(cases)
    assert int(ag.calls[0]) == int(ag72.calls[0]) == int(ag16.calls[0]) == 0          # nothing was launched
    assert int(rs20.gcalls[0]) == int(rs32.gcalls[0]) == int(rs_fp8cfg.gcalls[0]) == 0
    assert int(rs.gcalls[0]) == 1                                      # rs_block_k ran (block_k 64)
    assert ar._rs_ag is None or int(ar._rs_ag[0].gcalls[0]) == 0
    assert rs32.gluon_config is None and rs_fp8cfg.gluon_config is None and rs_fp8cfg.gluon_fp8_config is fp8_only
    return msgs
