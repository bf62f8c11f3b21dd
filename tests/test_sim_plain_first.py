"""A plain ``@triton.jit`` kernel as the first launch of a fresh simulated rank: ``range()`` over a scalar
``tl.where`` runs (Triton 3.6's interpreter turns a 1-element array into an int with ``int()``, which NumPy 2.4
refuses; ditron's NumPy-safe ``__index__`` used to be installed only by a ditron launch, so the same kernel passed
or failed depending on what the process had run before)."""
import subprocess
import sys
import textwrap


def test_plain_kernel_range_over_scalar_where_in_a_fresh_rank(tmp_path):
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

        t = torch.tensor([1.0, 0.0, 2.0])
        out = torch.zeros(3, dtype=torch.int32)
        k[(3,)](t, out, K=4)
        assert out.tolist() == [10, 1, 10], out.tolist()
        print("plain-first ok")
    '''))
    p = subprocess.run([sys.executable, "-m", "ditron", "sim", "-n", "1", str(script)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and "plain-first ok" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
