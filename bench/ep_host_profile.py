"""Host cost of the EP low-latency eager path on a CPU machine (issue 51): ``ep_dispatch`` + ``ep_combine`` at the
shapes of ``ditron bench overhead --ops ep`` (128 tokens, hidden 7168, 8 experts per rank, top-8, world 1,
``validate=False``), launched through Triton's real ``JITFunction.run`` / ditron's direct launch over the stub
driver of tests/stub_driver.py (kernels compile for sm_90; launching does nothing).  What it measures is the
Python of the eager path, the two launches' host side included, without a GPU's launch call.

    python bench/ep_host_profile.py                      # best-of-rounds us per dispatch + combine, and a plain
                                                         # @triton.jit launch on the same stub for scale
    python bench/ep_host_profile.py --profile 20         # + cProfile of the warm calls, top 20 by own time
    python bench/ep_host_profile.py --hidden 512         # host cost does not depend on hidden (less memory)

The GPU number is ``ditron bench overhead --ops ep`` (bench/overhead_gpu.sh with OPS=ep).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _add(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def timed(fn, calls, rounds):
    """Best and median over ``rounds`` of the mean ns per call of ``calls`` back-to-back calls."""
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter_ns() - t0) / calls)
    return min(per), statistics.median(per)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--local-experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile the warm calls: top N by tottime")
    args = p.parse_args(argv)

    import ditron.kernels as K
    from stub_driver import stub_driver, stub_world

    T, H, El, k = args.tokens, args.hidden, args.local_experts, args.topk
    bf = torch.bfloat16
    # the context's symmetric buffers: lrecv + lcomb (2 x El x cap x ceil(H/2) words each) and small ones
    heap = 4 * 2 * El * T * ((H + 1) // 2) * 8 + (64 << 20)
    with stub_driver() as drv, stub_world(heap):
        g = torch.Generator().manual_seed(77)
        x = torch.randn(T, H, generator=g).to(bf)
        idx = torch.stack([torch.randperm(El, generator=g)[:k] for _ in range(T)]).to(torch.int32)
        wts = torch.rand(T, k, generator=g)
        ctx = K.create_ep_context(T, H, El, k, bf, mode="low_latency")

        def run_d():                                  # ditron/bench/overhead.py's "ep" row, verbatim
            recv, _, handle = K.ep_dispatch(x, idx, wts, ctx, validate=False)
            K.ep_combine(recv, handle, ctx)

        a, b, o = torch.rand(4096), torch.rand(4096), torch.empty(4096)

        def run_t():
            _add[(4,)](a, b, o, 4096, BLOCK=1024)

        t0 = time.time()
        for _ in range(4):                            # compile (both call parities), then the direct path
            run_d()
            run_t()
        print(f"# compiled in {time.time() - t0:.1f} s (stub driver, sm_90); T={T} H={H} E_local={El} k={k}, "
              f"world 1, validate=False; {args.calls} calls x {args.rounds} rounds", flush=True)
        n0 = drv.launches
        run_d()
        launches = drv.launches - n0
        best_d, med_d = timed(run_d, args.calls, args.rounds)
        best_t, med_t = timed(run_t, args.calls, args.rounds)
        print(f"ep dispatch + combine ({launches} launches): best {best_d / 1e3:7.2f} us, median {med_d / 1e3:7.2f} us")
        print(f"@triton.jit add launch           : best {best_t / 1e3:7.2f} us, median {med_t / 1e3:7.2f} us")
        print(f"ep minus {launches} x @triton.jit launch : {(best_d - launches * best_t) / 1e3:7.2f} us")
        if args.profile:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(args.calls):
                run_d()
            pr.disable()
            st = pstats.Stats(pr)
            st.sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
