"""Vector loads and stores of Triton-distributed's helpers (``load_v4_*``,
``load_v2_b64``, ``st_v4_*``, ``st_v2_u32``) are one access each (the
``ld_vec`` / ``st_vec`` ops): one ``v4`` / ``v2`` instruction on sm_90a and
gfx942; on the simulator a concurrently written vector is never observed torn
(tests/bodies_vector.py), the race finder treats it as one access, and a
misaligned address is refused as a GPU faults."""
import re

import pytest

import kernels_for_tests as K
from conftest import code_lines, compile_for

import bodies_vector as B


def _count(lines, pattern):
    return sum(1 for ln in lines if re.search(pattern, ln))


@pytest.mark.parametrize("scope,ld,st", [("sys", "relaxed", "release"), ("gpu", "acquire", "relaxed"),
                                         ("cta", "volatile", "volatile")])
def test_one_vector_instruction_sm90(scope, ld, st):
    ck = compile_for(K.k_vec_access, "sm_90a", {"p": "*i32", "q": "*i32"},
                     {"SCOPE": scope if ld != "volatile" else "", "LD_SEM": ld, "ST_SEM": st})
    lines = code_lines(ck.asm["ptx"])
    q = "volatile" if ld == "volatile" else f"{ld}.{scope}"
    assert _count(lines, rf"ld\.{q}\.global\.v4\.b32 \{{%r\d+, %r\d+, %r\d+, %r\d+\}}") == 1
    sq = "volatile" if st == "volatile" else f"{st}.{scope}"
    assert _count(lines, rf"st\.{sq}\.global\.v4\.b32 \[") == 1
    assert _count(lines, r"ld\.volatile\.global\.v2\.b64 \{") == 1            # load_v2_b64
    assert _count(lines, r"st\.volatile\.global\.v2\.b32 \[") == 1            # st_v2_u32
    assert _count(lines, r"ld\.global\.v4\.b32 \{") == 1                      # load_v4_u32: weak
    assert _count(lines, r"st\.global\.v4\.b32 \[") == 1                      # st_v4_u32: weak
    # no scalar global accesses left: each helper is one vector instruction
    assert _count(lines, r"\b(ld|st)(\.\w+)*\.global\.b(32|64)\b") == 0


def test_one_vector_instruction_gfx942():
    ck = compile_for(K.k_vec_access, "gfx942", {"p": "*i32", "q": "*i32"},
                     {"SCOPE": "sys", "LD_SEM": "acquire", "ST_SEM": "release"})
    amd = ck.asm["amdgcn"]
    assert len(re.findall(r"global_load_dwordx4 v\[0:3\], v\[\d+:\d+\], off sc0 sc1", amd)) == 2   # v4 + v2.b64
    assert len(re.findall(r"global_load_dwordx4 v\[0:3\], v\[\d+:\d+\], off\n", amd)) == 1         # weak
    assert len(re.findall(r"global_store_dwordx4 v\[\d+:\d+\], v\[0:3\], off sc0 sc1", amd)) == 1
    assert len(re.findall(r"global_store_dwordx2 v\[\d+:\d+\], v\[0:1\], off sc0 sc1", amd)) == 1  # volatile v2
    assert "buffer_inv sc0 sc1" in amd and "buffer_wbl2 sc0 sc1" in amd
    assert not re.search(r"global_(load|store)_dword\b", amd)


def test_scope_without_semantic_is_refused():
    with pytest.raises(Exception, match="needs a semantic"):
        compile_for(K.k_vec_access, "sm_90a", {"p": "*i32", "q": "*i32"},
                    {"SCOPE": "sys", "LD_SEM": "", "ST_SEM": "relaxed"})


@pytest.mark.parametrize("vector", [True, False], ids=["vector_writer", "word_writer"])
def test_concurrent_vector_never_torn(dist_world, vector):
    got = dist_world(2).run(B.concurrent_vector, 400, vector)[0]
    bad, polls = got
    assert polls >= 1
    assert bad == 0, f"{bad} of {polls} polls saw a vector memory never held"


def test_weak_vector_poll_is_a_race_for_the_race_finder():
    # a weak load_v4_u32 poll races with the writer (the race finder reports it) -- and any stale value it
    # returns is the whole vector's: never torn
    from ditron.sim.pool import SimCluster
    with SimCluster(2, race=True, hang_timeout=20) as c:
        with pytest.raises(Exception, match="data race") as e:
            c.run(B.concurrent_vector, 200, True, True)
    assert "vec_reader_kernel" in str(e.value) or "bodies_vector.py" in str(e.value)


def test_misaligned_vector_refused(dist_world):
    with pytest.raises(Exception, match="16-byte aligned"):
        dist_world(1).run(B.misaligned)


def test_failed_cas_spin_lends_its_turn(dist_world):
    # program 0 spins on atomic_cas until program 1 has run; a failed CAS writes nothing, so the spin is a
    # polling loop and lends its turn (before: the simulator counted every CAS as progress and hung)
    assert dist_world(1).run(B.cas_spin) == [(2, 1)]
