"""GPU diagnosis of `ditron bench ep --dtype fp8`'s "codes differ from torch's quantiser" (2026-12-07e): the fp8
LL dispatch at world size 1 against kernels/ep.py fp8_quantize_reference, element by element.
    torchrun --standalone --nproc-per-node 1 bench/diag/ep_fp8_codes.py [hidden] [experts]"""
import sys

import torch

import ditron
from ditron.bench.moe import _rand, _routing
from ditron.kernels import ep

H = int(sys.argv[1]) if len(sys.argv) > 1 else 7168
E = int(sys.argv[2]) if len(sys.argv) > 2 else 32
T, k = 128, 8
world = ditron.init()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


dev = world.device
x = _rand((T, H), 0, torch.bfloat16, dev)
idx, w = _routing(T, E, k, 0, dev)
ctx = ep.create_ep_context(T, H, E, k, torch.bfloat16, mode="low_latency", capacity=T)
(c8d, s8d), counts, handle = ep.ep_dispatch(x, idx, w, ctx, use_fp8=True)
sync()
qc, qs = ep.fp8_quantize_reference(x.cpu())
idxc = idx.cpu()
print("codes", tuple(c8d.shape), c8d.dtype, "scales", tuple(s8d.shape), "counts", counts.cpu().tolist()[:8])
xf = x.cpu().float().reshape(T, H // 128, 128)


def diag(label, c8, s8, detail):
  c8, s8 = c8.cpu(), s8.cpu()
  print("==", label)
  for e in range(min(E, 3 if detail else 1)):
      toks = (idxc == e).any(1).nonzero().flatten()
      n = toks.numel()
      got, want = c8[e, :n], qc[toks]
      sg = s8[e][:, :n].t() if s8[e].shape[0] == H // 128 else s8[e, :n]
      bad = (got.view(torch.uint8) != want.view(torch.uint8))
      print(f"expert {e}: {n} rows, {int(bad.sum())} codes differ; rows with a difference: "
            f"{bad.any(1).nonzero().flatten().tolist()[:20]}; scales equal: {torch.equal(sg, qs[toks])}")
      if bad.any() and detail:
          gf, wf = got.float(), want.float()
          d = (gf - wf)[bad]
          print("   got-want of differing codes: min", d.min().item(), "max", d.max().item(),
                "| differing codes one e4m3 step apart:",
                int(((got.view(torch.uint8).int() - want.view(torch.uint8).int()).abs()[bad] == 1).sum()))
          for r, c in bad.nonzero()[:8].tolist():
              t = toks[r].item()
              g = c // 128
              amax = xf[t, g].abs().max().clamp_min(1e-4)
              sc = torch.tensor(448.0) / amax
              v = xf[t, g, c % 128]
              print(f"   [row {r} tok {t} ch {c}] x={v.item()!r} amax={amax.item()!r} scale={sc.item()!r} "
                    f"x*scale={(v * sc).item()!r} got={gf[r, c].item()} want={wf[r, c].item()} "
                    f"(x/ (amax/448)={(v / (amax * (1 / 448.0))).item()!r})")
          # is a differing row some other token's row?
          r0 = bad.any(1).nonzero().flatten()[0].item()
          match = [t for t in range(T) if torch.equal(got[r0].view(torch.uint8), qc[t].view(torch.uint8))]
          print(f"   row {r0} equals the reference row of tokens {match} (expected {toks[r0].item()})")


diag("first dispatch, synchronised, before any combine", c8d, s8d, True)
y8 = ep.fp8_dequantize(c8d, s8d).to(torch.bfloat16)
ep.ep_combine(y8, handle, ctx)
sync()
diag("the same buffers after a combine (the bench checks here)", c8d, s8d, False)
(c8b, s8b), _, _ = ep.ep_dispatch(x, idx, w, ctx, use_fp8=True)
sync()
diag("second dispatch", c8b, s8b, False)
