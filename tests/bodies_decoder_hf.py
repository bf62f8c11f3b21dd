"""Test bodies (run on every rank) for issue 53: Hugging Face checkpoints through the decode megakernel
(kernels/decoder/hf.py, generate.py, tiles_head.py); the transformers side is in tests/test_decoder_hf.py."""
import torch
import triton
import triton.language as tl

from ditron.kernels.decoder.tiles_head import sample_tile, topk_merge_tile, topk_part_tile


def run_cases(world, cases):
    """Every case ``(path, runs[, max_top_k])``: one :class:`Generator` over the checkpoint at ``path`` (compiled for
    the largest batch and context of its runs: a smaller run's padding rows cost as much as real ones), then each run ``dict(prompts=..., **generate kwargs)`` (no stop
    tokens unless given); returns per case and run the tokens, this rank's logits of every step ``[steps, B, V_r]``
    and its vocabulary slice ``(v_off, n_valid)``."""
    from ditron.kernels.decoder.generate import Generator
    out = []
    for path, runs, *top in cases:
        batch = max(len(r["prompts"]) for r in runs)
        ctx = max(len(p) + (max(r["max_new_tokens"]) if isinstance(r["max_new_tokens"], (list, tuple))
                            else r["max_new_tokens"]) for r in runs for p in r["prompts"])
        gen = Generator(path, world=world, max_batch=batch, max_ctx=ctx + 1, num_programs=1,
                        max_top_k=top[0] if top else 64)
        res = []
        for r in runs:
            kw = {k: v for k, v in r.items() if k != "prompts"}
            kw.setdefault("stop_tokens", ())
            tok, logits = gen.generate(r["prompts"], return_logits=True, **kw)
            res.append((tok, logits.to(torch.float32), gen.head.v_off, gen.head.n_valid))
        out.append(res)
    return out


@triton.jit
def _sample_rows(cand_ptr, tok_ptr, seq_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, B, W, K: tl.constexpr,
                 NC: tl.constexpr):
    sample_tile(tl.program_id(0), cand_ptr, tok_ptr, seq_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, B, W, K, NC)


@triton.jit
def _topk_parts(logits_ptr, part_ptr, temp_ptr, n_valid, N: tl.constexpr, K: tl.constexpr, NSPLIT: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    topk_part_tile(tl.program_id(0), logits_ptr, part_ptr, temp_ptr, n_valid, N, K, NSPLIT, CHUNK, BLOCK)


@triton.jit
def _topk_merge(part_ptr, cand_ptr, temp_ptr, v_off, K: tl.constexpr, NSPLIT: tl.constexpr, BLOCK: tl.constexpr):
    topk_merge_tile(tl.program_id(0), part_ptr, cand_ptr, temp_ptr, v_off, K, NSPLIT, BLOCK)


def sampler_topk(world, logits, n_valid, temperature, K, v_off, block=None):
    """Stage 1 of the sampler (:func:`topk_part_tile` over :func:`topk_splits`'s chunks, then
    :func:`topk_merge_tile`) on ``logits [B, N]`` (float32; the first ``n_valid`` columns are tokens ``v_off + j``)
    with per-row ``temperature``; returns ``cand [B, 2K]`` and the number of chunks."""
    from ditron.kernels.decoder.tiles_head import topk_splits
    B, N = logits.shape
    nsplit, chunk = topk_splits(N)
    bl = block or min(1024, triton.next_power_of_2(chunk))
    part = torch.zeros((B, nsplit, 2 * K), dtype=torch.float32)
    cand = torch.zeros((B, 2 * K), dtype=torch.float32)
    temp = torch.tensor(temperature, dtype=torch.float32)
    _topk_parts[(B * nsplit,)](logits, part, temp, n_valid, N=N, K=K, NSPLIT=nsplit, CHUNK=chunk, BLOCK=bl)
    _topk_merge[(B,)](part, cand, temp, v_off, K=K, NSPLIT=nsplit,
                      BLOCK=min(1024, triton.next_power_of_2(nsplit * K)))
    return cand, nsplit


def sampler_draws(world, values, n, temperature, top_k, top_p, seed):
    """Stage 2 of the sampler (:func:`~ditron.kernels.decoder.tiles_head.sample_tile`) alone: ``n`` draws (rows of
    one launch, positions ``1..n`` of one sequence seed) from the candidates ``values`` (token ids ``0..K-1``,
    ``K`` = ``len(values)``, one rank); returns the drawn ids."""
    K = len(values)
    cand = torch.tensor([list(values) + list(range(K))] * n, dtype=torch.float32)
    tok = torch.full((n,), -1, dtype=torch.int32)
    seq = torch.arange(1, n + 1, dtype=torch.int32)
    f = torch.full((n,), float(temperature), dtype=torch.float32)
    _sample_rows[(n,)](cand, tok, seq, f, torch.full((n,), top_k, dtype=torch.int32),
                       torch.full((n,), float(top_p), dtype=torch.float32),
                       torch.full((n,), seed, dtype=torch.int32), n, 1, K=K, NC=max(16, K))
    return tok
