"""A ditron world on one dimension of a torch DeviceMesh (``ditron.init(device_mesh=..., mesh_dim="tp")``):
the world's rank and size are the TP group's, and torch.ops.ditron.ag_gemm / gemm_rs on it gather and reduce
over the TP group only (each TP group of a (DP, TP) mesh is its own world, side by side in one job).

    torchrun --standalone --nproc-per-node 2 tests/gpu/mesh_world.py --backend p2p --mesh 2,1
    torchrun --standalone --nproc-per-node 2 tests/gpu/mesh_world.py --backend p2p --mesh 1,2
    torchrun --standalone --nproc-per-node 4 tests/gpu/mesh_world.py --backend nvshmem --mesh 2,2

One mesh per process run (NVSHMEM stays bound to the PEs of its first world for the life of the process).
"""
import argparse
import os
import sys
import traceback

import torch
import torch.distributed as tdist
from torch.distributed.device_mesh import init_device_mesh

import ditron
import ditron.torch_ops  # noqa: F401


def rand(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) + 0.25).to(torch.bfloat16)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="auto")
    p.add_argument("--mesh", default="1,2", help="DP,TP")
    args = p.parse_args()
    dp, tp = (int(v) for v in args.mesh.split(","))
    per_gpu = int(os.environ.get("DITRON_RANKS_PER_GPU", "1") or 1)     # ranks sharing a GPU: NCCL refuses them
    local = int(os.environ.get("LOCAL_RANK", 0)) // per_gpu
    torch.cuda.set_device(local)
    if per_gpu > 1:
        tdist.init_process_group("gloo")
    else:
        tdist.init_process_group("nccl", device_id=torch.device("cuda", local))
    g_rank = tdist.get_rank()
    failures = []
    try:
        if dp * tp != tdist.get_world_size():
            raise SystemExit(f"--mesh {args.mesh} needs {dp * tp} ranks, the job has {tdist.get_world_size()}")
        mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
        world = ditron.init(args.backend, device_mesh=mesh, mesh_dim="tp")
        R, W = world.rank, world.world_size
        if (R, W) != (mesh.get_local_rank("tp"), tp):
            failures.append(f"world rank/size {(R, W)}, mesh says {(mesh.get_local_rank('tp'), tp)}")
        dp_index = mesh.get_local_rank("dp")
        m, K, N = 24, 64, 48
        # every TP group has its own data (seeded by its DP index): results must not mix groups
        a = [rand((m, K), 1000 * dp_index + r) for r in range(W)]
        b = rand((K, N), 77 + dp_index)
        got = torch.ops.ditron.ag_gemm(a[R].cuda(), b.cuda(), W)
        ref = torch.cat([t.float() for t in a]) @ b.float()
        err = (got.float().cpu() - ref).abs().max().item()
        if not err <= 2e-2 * ref.abs().max().item() + 1e-2:
            failures.append(f"ag_gemm over the TP group: max error {err}")
        ga = [rand((W * m, K), 2000 * dp_index + r) for r in range(W)]
        got = torch.ops.ditron.gemm_rs(ga[R].cuda(), b.cuda(), W)
        ref = sum(t.float() @ b.float() for t in ga)[R * m:(R + 1) * m]
        err = (got.float().cpu() - ref).abs().max().item()
        if not err <= 2e-2 * ref.abs().max().item() + 1e-2:
            failures.append(f"gemm_rs over the TP group: max error {err}")
        torch.cuda.synchronize()
        ditron.finalize()
    except Exception:  # noqa: BLE001 -- reported below
        failures.append(traceback.format_exc())
    finally:
        tdist.destroy_process_group()
    for f in failures:
        print(f"mesh_world rank {g_rank} FAILED: {f}", flush=True)
    print(f"mesh_world rank {g_rank} ({args.backend}, mesh {args.mesh}): "
          f"{'passed' if not failures else 'FAILED'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
