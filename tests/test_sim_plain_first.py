"""Plain ``@triton.jit`` kernels as the first launches of a fresh simulated rank compute as GPUs do, as they do
after a ditron kernel has run: ``range()`` over a scalar ``tl.where`` (Triton 3.6's interpreter turns a 1-element
array into an int with ``int()``, which NumPy 2.4 refuses), fp32 -> bf16 casts rounded to nearest even (the
interpreter truncates), bf16 ``tl.dot`` on values (Triton 3.6 multiplied the raw storage) and a block mask with a
scalar condition (Triton 3.9 refused it).  These patches used to be installed by ditron's launches only, so the same
plain kernel computed differently depending on what its process had run before."""
import subprocess
import sys
import textwrap


def test_plain_kernels_first_in_a_fresh_rank_compute_as_gpus_do(tmp_path):
    script = tmp_path / "plain_first.py"
    script.write_text(textwrap.dedent('''
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def k(t_ptr, out_ptr, K: tl.constexpr):
            temp = tl.load(t_ptr + tl.program_id(0))
            n = tl.where(temp > 0.0, K, 1)
            acc = tl.sum(tl.zeros([16], tl.int32), axis=0)
            for i in range(0, n):
                acc += i + 1
            tl.store(out_ptr + tl.program_id(0), acc)

        @triton.jit
        def cast_k(x_ptr, y_ptr):
            i = tl.arange(0, 4)
            tl.store(y_ptr + i, tl.load(x_ptr + i).to(tl.bfloat16))

        @triton.jit
        def dot_k(a_ptr, b_ptr, c_ptr):
            i = tl.arange(0, 16)
            a = tl.load(a_ptr + i[:, None] * 16 + i[None, :])
            b = tl.load(b_ptr + i[:, None] * 16 + i[None, :])
            tl.store(c_ptr + i[:, None] * 16 + i[None, :], tl.dot(a, b))

        @triton.jit
        def splat_k(x_ptr, y_ptr, flag):
            i = tl.arange(0, 4)
            m = (i < 3) & (flag > 0)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m, other=0.0), mask=m)

        # the first launch of this process is a plain kernel's
        x = torch.tensor([1 + 2**-8 + 2**-10, 1 + 2**-9, 3 + 2**-7 + 2**-9, -1 - 2**-8 - 2**-12])
        y = torch.empty(4, dtype=torch.bfloat16)
        cast_k[(1,)](x, y)
        assert y.float().tolist() == x.to(torch.bfloat16).float().tolist(), (y, x.to(torch.bfloat16))
        t = torch.tensor([1.0, 0.0, 2.0])
        out = torch.zeros(3, dtype=torch.int32)
        k[(3,)](t, out, K=4)
        assert out.tolist() == [10, 1, 10], out.tolist()
        g = torch.Generator().manual_seed(0)
        a = torch.randn(16, 16, generator=g).to(torch.bfloat16)
        b = torch.randn(16, 16, generator=g).to(torch.bfloat16)
        c = torch.empty(16, 16)
        dot_k[(1,)](a, b, c)
        assert (c - a.float() @ b.float()).abs().max().item() < 1e-3
        yy = torch.zeros(4)
        splat_k[(1,)](torch.ones(4), yy, 1)
        assert yy.tolist() == [1.0, 1.0, 1.0, 0.0], yy.tolist()
        print("plain-first ok")
    '''))
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "1", str(script)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and "plain-first ok" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
