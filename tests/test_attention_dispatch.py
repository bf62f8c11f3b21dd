"""Which attention core a call runs (issue 52 items 3 and 5; kernels/attention_choice.py ``choose_core`` /
``resolve_core``, kernels/attention_table.py, kernels/attention_tables/*.json): the Gluon core on a Hopper CUDA
GPU at world size 1 for the shapes it takes, with the config of the GPU's measured table; the tl core
elsewhere, each with its reason; explicit cores and configs honoured; the per-GPU tables load and say where
they were measured; the decision is cached; the simulator's refusal of ``core="gluon"`` names the twin.

No GPU and no simulator: devices are described by ``DeviceKind`` objects (no probing)."""
import json
import os

import pytest
import torch

import ditron
from ditron.kernels import attention as A
from ditron.kernels import attention_choice as AC
from ditron.kernels import attention_hopper as H
from ditron.kernels import attention_table as T

K = A.DeviceKind
H100 = K("cuda", 90, "NVIDIA H100 80GB HBM3")
H200 = K("cuda", 90, "NVIDIA H200")
A100 = K("cuda", 80, "NVIDIA A100-SXM4-80GB")
MI300 = K("hip", None, "AMD Instinct MI300X")
SIM = K("sim")
BF16 = torch.bfloat16
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEST = H.HopperAttnConfig(128, 2, True)


def choose(kind, seq=8192, causal=False, world=1, D=128, HQ=32, HKV=8, B=1, dtype=BF16, **kw):
    return A.choose_core(kind, world, (B, HQ, seq, D), (B, HKV, seq, D), dtype, causal, **kw)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(T.ENV, raising=False)
    A.clear_core_cache()
    yield
    A.clear_core_cache()


@pytest.mark.parametrize("seq", [8192, 16384, 32768, 1024, 128, 262144])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_world_one_runs_the_gluon_core_with_the_measured_config(seq, causal):
    c = choose(H100, seq, causal)
    assert c.core == "gluon" and c.config == BEST, c
    assert c.label() == "gluon ws 128x128 s2 pingpong"
    assert "table h100.json" in c.why
    if seq in (8192, 16384, 32768):
        assert f"entry {seq} keys{' causal' if causal else ''}, distance 0.00" in c.why
    for kw in (dict(HQ=8, HKV=8), dict(B=3), dict(HQ=6, HKV=2)):     # GQA and batch: grid dimensions
        assert choose(H100, seq, causal, **kw).core == "gluon", kw


@pytest.mark.parametrize("kw,why", [
    (dict(seq=1000), "lengths 1000 / 1000 not multiples of 128"),
    (dict(seq=129), "lengths 129 / 129 not multiples of 128"),
    (dict(D=64), "head_dim 64 not yet checked on a GPU"),
    (dict(dtype=torch.float16), "fp16 not yet checked on a GPU"),
])
def test_the_default_keeps_the_tl_core_where_no_gpu_run_checked_the_gluon_core(kw, why):
    """The shipped tables' ``verified`` domain: a core becomes the default only where a GPU has checked it.  The
    H100 table's domain was widened after tests/gpu/attention_hopper_twin.py passed on an H100 (odd lengths, head
    dim 64, fp16); sm90.json (other Hopper GPUs: the H200) keeps the first run's (bf16, head dim 128, multiples of
    128)."""
    c = choose(H200, **kw)
    assert c.core == "tl" and why in c.why and "attention_hopper_twin.py" in c.why, c
    c = choose(H100, **kw)
    assert c.core == "gluon" and c.config == BEST, c
    # the rule itself takes these inputs: a table without a 'verified' domain picks the Gluon core
    data = json.load(open(os.path.join(REPO, "kernels", "attention_tables", "sm90.json")))
    data.pop("verified")
    c = choose(H200, table=T.AttnTable(data, "sm90-unrestricted.json"), **kw)
    assert c.core == "gluon" and c.config == BEST, c


@pytest.mark.parametrize("bad", [[], {"dtypes": "bf16"}, {"head_dims": [0]}, {"seq_multiple": 0},
                                 {"what": 1}])
def test_a_bad_verified_domain_is_an_error(bad):
    data = {"match": ["X"], "default": {"core": "tl"}, "entries": [], "verified": bad}
    with pytest.raises(ditron.DitronError, match="'verified' must be an object"):
        T.AttnTable(data, "bad.json")


def test_other_hopper_gpus_get_the_h100_config_marked_as_such():
    for name in ("NVIDIA H200", "NVIDIA H800", "NVIDIA GH200 480GB", "NVIDIA H20"):
        c = choose(K("cuda", 90, name))
        assert c.core == "gluon" and c.config == BEST
        assert "table sm90.json" in c.why and "measured on NVIDIA H100" in c.why, c.why


@pytest.mark.parametrize("kind,kw,why", [
    (SIM, {}, "the simulator runs the tl core (the Gluon core's twin: attention_hopper.twin_config)"),
    (MI300, {}, "AMD GPU"),
    (A100, {}, "sm_80 is not Hopper"),
    (K("cuda", 100, "NVIDIA B200"), {}, "sm_100 is not Hopper"),
    (H100, dict(world=2), "world size 2"),
    (H100, dict(world=3, causal=True), "world size 3"),
    (H100, dict(D=32), "head_dim 32"),
    (H100, dict(D=256), "head_dim 256"),
    (H100, dict(dtype=torch.float32), "float32"),
    (H100, dict(dtype=None), "k's dtype differs from q's"),
    (H100, dict(HQ=6, HKV=4), "Hq not a multiple of Hkv"),
    (H100, dict(seq=0), "empty input"),
    (H100, dict(contiguous=False), "non-contiguous"),
    (H100, dict(B=64, HQ=64, seq=1 << 19), "int32"),
    (H100, dict(table=None), "no attention table"),
])
def test_the_tl_core_elsewhere_with_its_reason(kind, kw, why):
    c = choose(kind, **kw)
    assert c.core == "tl" and c.config is None and why in c.why, c


def test_a_table_entry_may_keep_the_tl_core_and_the_default_covers_the_rest():
    table = T.AttnTable({"match": ["X"], "max_distance": 0.5,
                         "default": {"core": "gluon", "config": {"block_n": 64, "stages": 3}},
                         "entries": [{"seq": 4096, "causal": True, "core": "tl"},
                                     {"seq": 4096, "causal": False, "core": "gluon",
                                      "config": {"block_n": 128, "stages": 2, "pingpong": False}}]}, "t.json")
    assert choose(H100, 4096, True, table=table).core == "tl"
    assert choose(H100, 5000, True, table=table).core == "tl"                # within log2 distance 0.5
    far = choose(H100, 16384, True, table=table)                             # none near: the default
    assert far.core == "gluon" and far.config == H.HopperAttnConfig(64, 3) and "its default" in far.why
    near = choose(H100, 4096, False, table=table)
    assert near.config == H.HopperAttnConfig(128, 2, False) and "entry 4096 keys, distance 0.00" in near.why


def test_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(T.ENV, "off")
    assert choose(H100).core == "tl" and "DITRON_ATTN_TABLE=off" in choose(H100).why
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"match": [], "entries": [], "default": {"core": "tl"}}))
    monkeypatch.setenv(T.ENV, str(path))
    c = choose(H100)
    assert c.core == "tl" and "table mine.json" in c.why


def test_table_errors(tmp_path):
    E = ditron.DitronError
    good = {"core": "gluon", "config": {"block_n": 128}}
    with pytest.raises(E, match="expected an object with an 'entries' list"):
        T.AttnTable({"default": good})
    with pytest.raises(E, match="'default' is not an object"):
        T.AttnTable({"entries": []})
    with pytest.raises(E, match=r"entry 0: seq=-1 must be a positive integer"):
        T.AttnTable({"default": good, "entries": [dict(good, seq=-1, causal=True)]})
    with pytest.raises(E, match=r"entry 0: causal=1 must be true or false"):
        T.AttnTable({"default": good, "entries": [dict(good, seq=8, causal=1)]})
    with pytest.raises(E, match=r"core='cudnn'; use one of tl, gluon"):
        T.AttnTable({"default": {"core": "cudnn"}, "entries": []})
    with pytest.raises(E, match=r"'config' must be an object of HopperAttnConfig fields"):
        T.AttnTable({"default": {"core": "gluon"}, "entries": []})
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(E, match="cannot read it"):
        T.AttnTable.load(str(bad))
    # an entry whose config the Gluon core rejects is an error at the call, naming the table
    table = T.AttnTable({"default": {"core": "gluon", "config": {"block_n": 32}}, "entries": []}, "odd.json")
    with pytest.raises(E, match="block_n=32 must be 64 or 128"):
        choose(H100, table=table)
    table = T.AttnTable({"default": {"core": "gluon", "config": {"tiles": 3}}, "entries": []}, "odd.json")
    with pytest.raises(E, match=r"attention table odd.json: config \{'tiles': 3\}"):
        choose(H100, table=table)


def test_the_shipped_tables():
    """Every file loads; its configs validate; the H100 entries are the rows of the results file they cite."""
    T.clear_cache()
    names = sorted(os.listdir(T.TABLE_DIR))
    assert names == ["h100.json", "sm90.json"]
    for name in names:
        t = T.AttnTable.load(os.path.join(T.TABLE_DIR, name))
        for e in [t.default] + t.entries:
            assert e["core"] == "gluon" and H.HopperAttnConfig(**e["config"]).validate() == BEST
        assert t.measured_on == "NVIDIA H100 80GB HBM3" and t.capability == 90
    h100 = T.AttnTable.load(os.path.join(T.TABLE_DIR, "h100.json"))
    res = "bench/results/h100-2026-12-07e-attention-gluon/attention_core_levers.json"
    assert res in h100.source
    with open(os.path.join(REPO, res)) as f:
        rows = json.load(f)["rows"]
    assert len(h100.entries) == len(rows) == 6
    for e, r in zip(h100.entries, rows):
        assert (e["seq"], e["causal"]) == (r["seq"], r["causal"])
        assert e["ratio_vs_cudnn"] == round(r["cands"][e["candidate"]]["vs_cudnn"], 4)
    assert min(e["ratio_vs_cudnn"] for e in h100.entries) == 0.9363           # 32768 keys, non-causal (0.936)
    sm90 = T.AttnTable.load(os.path.join(T.TABLE_DIR, "sm90.json"))
    assert sm90.match == [] and "NOT measured on these GPUs" in sm90.source
    # the H100 by name; an unnamed Hopper by capability; nothing for other capabilities
    assert os.path.basename(T.table_for("NVIDIA H100 80GB HBM3", 90).path) == "h100.json"
    assert os.path.basename(T.table_for("NVIDIA H200", 90).path) == "sm90.json"
    assert T.table_for("NVIDIA A100", 80) is None


def test_explicit_core_and_config_are_honoured():
    q = torch.zeros(1, 4, 8, 64, dtype=BF16)
    assert A.resolve_core(q, q, core="tl").core == "tl"
    assert A.resolve_core(q, q, core="gluon").core == "gluon"
    assert A.resolve_core(q, q, config=A.GPU_CONFIG) == A.CoreChoice("tl", A.GPU_CONFIG, "an AttnConfig: the tl core")
    assert A.resolve_core(q, q, config=BEST).core == "gluon"
    with pytest.raises(ditron.DitronError, match="config must be an AttnConfig .* or a HopperAttnConfig"):
        A.resolve_core(q, q, config="fast")
    with pytest.raises(ditron.DitronError, match="core='cudnn'; use one of tl, gluon"):
        A.resolve_core(q, q, core="cudnn")
    with pytest.raises(ditron.DitronError, match="core='tl' takes an AttnConfig"):
        A.flash_attention(q, q, q, core="tl", config=BEST)
    # a CPU tensor: the simulator, the tl core
    c = A.resolve_core(q, q)
    assert c.core == "tl" and "simulator" in c.why


def test_the_decision_is_cached_per_call_signature(monkeypatch):
    calls = []
    real = AC.choose_core

    def counting(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(AC, "choose_core", counting)
    monkeypatch.setitem(AC._DEVICE_KINDS, "cpu", H100)          # a CPU tensor described as an H100
    q = torch.zeros(1, 4, 256, 128, dtype=BF16)
    k = torch.zeros(1, 2, 256, 128, dtype=BF16)
    first = A.resolve_core(q, k, causal=True)
    assert first.core == "gluon" and first.config == BEST
    for _ in range(3):
        assert A.resolve_core(q, k, causal=True) is first
    assert len(calls) == 1
    A.resolve_core(q, k, causal=False)                          # another signature: decided once more
    nc = torch.zeros(1, 256, 4, 128, dtype=BF16).transpose(1, 2)             # q's shape, not contiguous
    assert "non-contiguous" in A.resolve_core(nc, k, causal=False).why
    assert len(calls) == 3


def test_twin_config_and_the_refusal_naming_it():
    assert H.twin_config() == A.AttnConfig(128, 128, 8, 3, tma=True) == A.HOPPER_CONFIG
    assert H.twin_config(H.HopperAttnConfig(64, 3)) == A.AttnConfig(128, 64, 8, 3, tma=True)
    q = torch.zeros(1, 4, 100, 128, dtype=BF16)
    k = torch.zeros(1, 2, 100, 128, dtype=BF16)
    with pytest.raises(ditron.DitronError, match=r"not on the simulator; use core='tl', its tl twin: "
                       r"config=attention_hopper.twin_config\(cfg\) = AttnConfig\(128, 128, 8, 3, True"):
        A.flash_attention(q, k, k, core="gluon")
    with pytest.raises(ditron.DitronError, match=r"twin_config\(cfg\) -- the same tiles and operation order"):
        H.attention_hopper(q, k, k)
