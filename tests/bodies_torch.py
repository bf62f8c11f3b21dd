"""Test bodies (run on every rank; see conftest.py) for the torch integration: the registered ops
(``torch.ops.ditron.*``, ditron/torch_ops.py), ``torch.compile`` of a model calling them, and the
tensor-parallel layers (ditron/nn.py), each checked against plain torch on the full (unsharded) data, which
every rank regenerates from seeds."""
import copy

import torch
from torch import nn

import ditron
import ditron.nn as dnn
from ditron import torch_ops

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _rand(shape, dtype, seed, salt=0):
    g = torch.Generator().manual_seed(1_000_003 * seed + 104_729 * salt + 17)
    return (torch.randn(shape, generator=g, dtype=torch.float32) + 0.25).to(dtype)


def _close(got, ref, what, rel=2e-2):
    got, ref = got.float().cpu(), ref.float().cpu()
    assert got.shape == ref.shape, f"{what}: shape {list(got.shape)}, expected {list(ref.shape)}"
    err = (got - ref).abs().max().item() if ref.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    assert err <= rel * scale + 1e-2, f"{what}: max abs error {err} (scale {scale})"


def _dev(world, t):
    return t.to(world.device)


def op_cases(world, dtype, m=5, K=24, N=40, hidden=12):
    """{op: (args, reference)} with this rank's inputs and the float32 reference of its output."""
    W, R = world.world_size, world.rank
    xs = [_rand((m, hidden), dtype, 1, r) for r in range(W)]               # collectives: [m, hidden] per rank
    big = [_rand((W * m, hidden), dtype, 2, r) for r in range(W)]          # [W * m, hidden] per rank
    a = [_rand((m, K), dtype, 3, r) for r in range(W)]
    b = [_rand((K, N), dtype, 4, r) for r in range(W)] if dtype != torch.float32 else None
    full = sum(t.float() for t in big)
    cases = {
        "all_reduce": ((xs[R],), sum(t.float() for t in xs)),
        "all_gather": ((xs[R], W), torch.cat([t.float() for t in xs])),
        "reduce_scatter": ((big[R], W), full[R * m:(R + 1) * m]),
        "all_to_all": ((big[R],), torch.cat([big[s].float()[R * m:(R + 1) * m] for s in range(W)])),
    }
    if b is not None:       # the GEMM kernels take float16 / bfloat16
        ga = [_rand((W * m, K), dtype, 5, r) for r in range(W)]
        cases["ag_gemm"] = ((a[R], b[R], W), torch.cat([t.float() for t in a]) @ b[R].float())
        cases["gemm_rs"] = ((ga[R], b[R], W), sum(ga[r].float() @ b[r].float() for r in range(W))[R * m:(R + 1) * m])
        cases["gemm_ar"] = ((ga[R], b[R]), sum(ga[r].float() @ b[r].float() for r in range(W)))
    return {k: (tuple(_dev(world, t) if isinstance(t, torch.Tensor) else t for t in args), ref) for k, (args, ref) in cases.items()}


def ops_match_torch(world, dtype):
    """Every registered op against torch; twice, so the second call reuses the cached context."""
    dtype = DTYPES[dtype]
    done = []
    for name, (args, ref) in op_cases(world, dtype).items():
        for i in range(2):
            _close(getattr(torch.ops.ditron, name)(*args), ref, f"rank {world.rank}: torch.ops.ditron.{name} call {i}")
        done.append(name)
    assert len(torch_ops.contexts()) == len(done), torch_ops.contexts().keys()
    return sorted(done)


def opcheck_ops(world, dtype):
    """torch.library.opcheck (schema, fake tensor, autograd registration, AOT dispatch) on every op."""
    from torch.library import opcheck
    dtype = DTYPES[dtype]
    done = []
    for name, (args, _) in op_cases(world, dtype).items():
        opcheck(getattr(torch.ops.ditron, name).default, args)
        done.append(name)
    return sorted(done)


class _Model(nn.Module):
    """Calls ag_gemm and gemm_rs directly: the TP MLP written with the raw ops."""

    def __init__(self, w1, w2, world_size):
        super().__init__()
        self.w1, self.w2, self.world_size = w1, w2, world_size

    def forward(self, x):
        h = torch.ops.ditron.ag_gemm(x, self.w1.t(), self.world_size)
        return torch.ops.ditron.gemm_rs(torch.nn.functional.gelu(h), self.w2.t(), self.world_size) * 0.5 + x


def compiled_matches_eager(world, backend, m=5, d=24, hidden_per_rank=16, dtype="bf16"):
    """torch.compile(fullgraph=True) of a model calling ag_gemm and gemm_rs equals eager (twice: the second
    call runs the cached compiled graph) and the unsharded float32 reference."""
    dtype = DTYPES[dtype]
    W, R = world.world_size, world.rank
    w1 = [_rand((hidden_per_rank, d), dtype, 6, r) * 0.2 for r in range(W)]
    w2 = [_rand((d, hidden_per_rank), dtype, 7, r) * 0.2 for r in range(W)]
    x = [_rand((m, d), dtype, 8, r) for r in range(W)]
    model = _Model(_dev(world, w1[R]), _dev(world, w2[R]), W)
    xr = _dev(world, x[R])
    eager = model(xr)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    outs = [compiled(xr) for _ in range(2)]
    xf = torch.cat([t.float() for t in x])
    h = torch.nn.functional.gelu(torch.cat([xf @ w1[r].float().t() for r in range(W)], 1))
    ref = (sum(h[:, r * hidden_per_rank:(r + 1) * hidden_per_rank] @ w2[r].float().t() for r in range(W)) * 0.5
           + xf)[R * m:(R + 1) * m]
    _close(eager, ref, f"rank {R}: eager")
    for i, y in enumerate(outs):       # inductor may fuse gelu / scale / add differently: bf16 rounding
        _close(y, eager, f"rank {R}: compiled call {i} vs eager", rel=1e-2)
    # another sequence length: a recompilation (dynamic rows), the fake implementations on symbolic shapes
    x2 = _dev(world, _rand((m + 3, d), dtype, 10, R))
    _close(compiled(x2), model(x2), f"rank {R}: compiled vs eager with {m + 3} rows", rel=1e-2)
    return tuple(outs[0].shape)


def _full_mlp(d, hidden, d_out, dtype, bias):
    torch.manual_seed(11)
    fc1, fc2 = nn.Linear(d, hidden, bias=bias), nn.Linear(hidden, d_out, bias=bias)
    with torch.no_grad():
        for p in list(fc1.parameters()) + list(fc2.parameters()):
            p.mul_(2.0)
    return fc1.to(dtype), fc2.to(dtype)


def tp_layers_match(world, dtype, m=5, d=24, hidden=40, d_out=20, bias=True):
    """ColumnParallelLinear, RowParallelLinear (rs and ar) and TensorParallelMLP built from full nn.Linear
    layers equal the unsharded modules (float32 reference) on this rank's rows."""
    dtype = DTYPES[dtype]
    W, R = world.world_size, world.rank
    fc1, fc2 = _full_mlp(d, hidden, d_out, dtype, bias)
    x = _rand((W * m, d), dtype, 9)                      # the whole sequence; rank R holds rows [R*m, (R+1)*m)
    xr = _dev(world, x[R * m:(R + 1) * m])
    f1, f2 = copy.deepcopy(fc1).float(), copy.deepcopy(fc2).float()      # Module.float() is in place
    with torch.no_grad():
        ref_h = f1(x.float())
        ref_y = f2(torch.nn.functional.gelu(ref_h))
        col = dnn.ColumnParallelLinear.from_linear(fc1).to(world.device)
        assert col.weight.t().is_contiguous(), "the GEMM operand weight.t() is not row-major contiguous"
        h = col(xr)
        per = -(-hidden // W)
        lo = min(R * per, hidden)
        assert h.shape == (W * m, per) and col.local_features == min(hidden, lo + per) - lo
        _close(h[:, :col.local_features], ref_h[:, lo:lo + col.local_features], f"rank {R}: ColumnParallelLinear")
        assert not h[:, col.local_features:].any(), "padded columns are not zero"
        hr = torch.nn.functional.gelu(ref_h).to(dtype)
        hr = torch.nn.functional.pad(hr, (0, per * W - hidden))[:, R * per:(R + 1) * per]
        for reduce in ("rs", "ar"):
            row = dnn.RowParallelLinear.from_linear(fc2, reduce=reduce).to(world.device)
            y = row(_dev(world, hr))
            want = f2(torch.nn.functional.gelu(ref_h).to(dtype).float())
            _close(y, want[R * m:(R + 1) * m] if reduce == "rs" else want, f"rank {R}: RowParallelLinear {reduce}")
        mlp = dnn.TensorParallelMLP.from_linears(fc1, fc2).to(world.device)
        _close(mlp(xr), ref_y[R * m:(R + 1) * m], f"rank {R}: TensorParallelMLP")
        mlp_ar = dnn.TensorParallelMLP.from_linears(fc1, fc2, reduce="ar").to(world.device)
        _close(mlp_ar(xr), ref_y, f"rank {R}: TensorParallelMLP (ar)")
    return True


def tp_from_shards(world, dtype="fp16", m=3, d=16, hidden_per_rank=8):
    """Layers built from this rank's shards (no full layer anywhere) equal the unsharded computation."""
    dtype = DTYPES[dtype]
    W, R = world.world_size, world.rank
    w1 = [_rand((hidden_per_rank, d), dtype, 12, r) * 0.3 for r in range(W)]
    b1 = [_rand((hidden_per_rank,), dtype, 13, r) for r in range(W)]
    w2 = [_rand((d, hidden_per_rank), dtype, 14, r) * 0.3 for r in range(W)]
    b2 = _rand((d,), dtype, 15)
    x = [_rand((m, d), dtype, 16, r) for r in range(W)]
    mlp = dnn.TensorParallelMLP(dnn.ColumnParallelLinear(w1[R], b1[R]), dnn.RowParallelLinear(w2[R], b2),
                                nn.ReLU()).to(world.device)
    with torch.no_grad():
        y = mlp(_dev(world, x[R]))
    xf = torch.cat([t.float() for t in x])
    h = torch.relu(torch.cat([xf @ w1[r].float().t() + b1[r].float() for r in range(W)], 1)).to(dtype).float()
    ref = sum(h[:, r * hidden_per_rank:(r + 1) * hidden_per_rank] @ w2[r].float().t() for r in range(W)) + b2.float()
    _close(y, ref[R * m:(R + 1) * m], f"rank {R}: TensorParallelMLP from shards")
    return True


def wrong_world_size(world):
    a = _dev(world, _rand((4, 16), torch.bfloat16, 1))
    try:
        torch.ops.ditron.ag_gemm(a, a.t().contiguous(), world.world_size + 1)
    except ditron.DitronError as e:
        return str(e)
    return None


def world_from_torch_group(world, store_path):
    """Inside the simulated ranks: a gloo process group and CPU device meshes; ``ditron.init(group=...)`` and
    ``ditron.init(device_mesh=..., mesh_dim=...)`` on the whole job give this world (rank i = group rank i),
    the registered ops run on it; a sub-group (TP inside DP) of a process that already has a world is
    refused, naming both ranks."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    W, R = world.world_size, world.rank
    tdist.init_process_group("gloo", init_method=f"file://{store_path}", rank=R, world_size=W)
    try:
        assert ditron.init(group=tdist.group.WORLD) is world
        mesh = init_device_mesh("cpu", (W,), mesh_dim_names=("tp",))
        w = ditron.init(device_mesh=mesh, mesh_dim="tp")
        assert w is world and (w.rank, w.world_size) == (mesh.get_local_rank("tp"), W)
        x = _rand((3, 4), torch.float32, 21, R)
        _close(torch.ops.ditron.all_reduce(x), sum(_rand((3, 4), torch.float32, 21, r) for r in range(W)),
               f"rank {R}: all_reduce on the mesh's world")
        refused = None
        if W % 2 == 0 and W > 2:
            mesh2 = init_device_mesh("cpu", (2, W // 2), mesh_dim_names=("dp", "tp"))
            try:
                ditron.init(device_mesh=mesh2, mesh_dim="tp")
            except ditron.DitronError as e:
                refused = str(e)
            try:
                ditron.init(device_mesh=mesh2)
            except ditron.DitronError as e:
                assert "name one with mesh_dim=" in str(e), str(e)
            else:
                raise AssertionError("a 2-D mesh without mesh_dim was accepted")
        return refused
    finally:
        tdist.destroy_process_group()


def tp_mlp_compiled_graphs(world, m=256, d=512, hidden=1024, dtype="bf16"):
    """GPUs: the TP MLP compiled with fullgraph=True equals eager, a manual CUDA-graph capture of the compiled
    step replays to the same output for new inputs, and so does mode="reduce-overhead" (inductor's CUDA
    graphs)."""
    dtype = DTYPES[dtype]
    W, R = world.world_size, world.rank
    fc1, fc2 = _full_mlp(d, hidden, d, dtype, True)
    mlp = dnn.TensorParallelMLP.from_linears(fc1, fc2).to(world.device)
    xs = [_dev(world, _rand((W * m, d), dtype, 30 + i)[R * m:(R + 1) * m]) for i in range(2)]
    with torch.no_grad():
        eager = [mlp(x) for x in xs]
        ref = copy.deepcopy(fc2).float()(torch.nn.functional.gelu(copy.deepcopy(fc1).float()(
            _rand((W * m, d), dtype, 30).float())))[R * m:(R + 1) * m]
        _close(eager[0], ref, f"rank {R}: eager TP MLP")
        torch._dynamo.reset()
        compiled = torch.compile(mlp, fullgraph=True)
        _close(compiled(xs[0]), eager[0], f"rank {R}: compiled", rel=1e-2)
        static_x = xs[0].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            compiled(static_x)                   # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = compiled(static_x)
        for i in (1, 0, 1):
            static_x.copy_(xs[i])
            graph.replay()
            _close(static_y, eager[i], f"rank {R}: CUDA-graph replay {i}", rel=1e-2)
        torch._dynamo.reset()
        overhead = torch.compile(mlp, fullgraph=True, mode="reduce-overhead")
        for i in (0, 1, 0, 1):
            _close(overhead(xs[i]), eager[i], f"rank {R}: reduce-overhead call with input {i}", rel=1e-2)
    torch.cuda.synchronize()
    return True


def configure_contexts(world):
    """``torch_ops.configure`` changes the options of the contexts made afterwards (here ag_gemm's producer),
    results stay right, and an unknown op is an error naming it."""
    W, R = world.world_size, world.rank
    a = [_rand((5, 32), torch.bfloat16, 40, r) for r in range(W)]
    b = _dev(world, _rand((32, 24), torch.bfloat16, 41))
    ref = torch.cat([t.float() for t in a]) @ b.float().cpu()
    producers = []
    try:
        for producer in ("sm", "ce"):
            torch_ops.configure("ag_gemm", producer=producer)
            _close(torch.ops.ditron.ag_gemm(_dev(world, a[R]), b, W), ref, f"rank {R}: producer {producer}")
            producers.append(torch_ops.context_for("ag_gemm", a[R], b).producer)
    finally:
        torch_ops.configure("ag_gemm")
    try:
        torch_ops.configure("all_gatherr")
    except ditron.DitronError as e:
        producers.append(str(e).split(";")[0])
    return producers
