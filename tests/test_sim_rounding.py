"""The simulator converts fp32 -> bf16 / fp16 like GPUs: round to nearest even
(Triton 3.6's interpreter truncates to bf16)."""
import bodies_sim_rel as B


def test_fp32_to_bf16_and_fp16_round_to_nearest_even_bitwise(dist_world):
    assert dist_world(1).run(B.rounding) == [B.rounding_values().numel()]
