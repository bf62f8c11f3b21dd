"""ditron.deep_ep: DeepEP's Buffer interface on ditron's EP kernels, driven as SGLang's DeepEP dispatcher drives
it, against ditron's own EP API and torch at 1-4 simulated ranks (tests/bodies_deep_ep.py)."""
import pytest

import bodies_deep_ep as B
from conftest import GPU_BACKEND

ON_GPU = GPU_BACKEND != "sim"
H = 7168 if ON_GPU else 128


@pytest.mark.parametrize("n,tokens", [(1, (5,)), (2, (4, 0)), (4, (3, 5, 1, 4))])
def test_deep_ep_low_latency_as_sglang(dist_world, n, tokens):
    # bf16 and fp8 payloads, the event and the hook, a zero-copy combine; a rank that sends nothing (2)
    got = dist_world(n).run(B.low_latency, tokens, H=H, rounds=4 if n < 4 else 2)
    assert len(got) == n and sum(got) > 0


@pytest.mark.parametrize("n,tokens,fp8,worst", [(1, (4,), False, False), (2, (5, 3), True, False),
                                                (3, (4, 0, 6), False, True)])
def test_deep_ep_normal_as_sglang(dist_world, n, tokens, fp8, worst):
    # layout, dispatch (bf16 or an fp8 pair, num_worst_tokens), experts, combine, a cached dispatch
    got = dist_world(n).run(B.normal, tokens, H=H, fp8=fp8, worst=worst)
    assert len(got) == n


def test_deep_ep_errors(dist_world):
    msgs = dist_world(2).run(B.errors)[0]
    assert "use_ue8m0=True" in msgs["ue8m0"] and "not supported" in msgs["ue8m0"]
    assert "use_logfmt=True" in msgs["logfmt"]
    assert "low_latency_mode=True" in msgs["not_ll"]
    assert "bfloat16" in msgs["fp16"]
    assert "more than num_max_dispatch_tokens_per_rank=1" in msgs["too_many"]
    assert "int64" in msgs["idx32"]
    assert "differs from the dispatch's" in msgs["other_idx"]
    assert "async_finish=False" in msgs["no_event"]
    assert "allocate_on_comm_stream=True needs previous_event" in msgs["alloc"]
    assert "cannot both be set" in msgs["hook_async"]
    assert "recv_src_info" in msgs["src_info"]
    assert "get_next_low_latency_combine_buffer" in msgs["zero_copy"]
    assert "handle must come from dispatch of this Buffer" in msgs["handle"]
    assert "enable_shrink" in msgs["shrink"]


def test_deep_ep_group_must_be_the_world(dist_world):
    assert "is not the ditron world" in dist_world(1).run(B.world_size_check)[0]
