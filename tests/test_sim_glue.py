"""The simulator's interpreter glue (ditron/_compat_interp.py) computes what Triton's interpreter computes, faster."""
import bodies_sim_glue as B


def test_reduce_over_slices_is_the_same_fold(dist_world):
    assert dist_world(1).run(B.reduce_over_slices) == [True]


def test_integer_reduce_is_exact(dist_world):
    assert dist_world(1).run(B.integer_reduce) == [True]


def test_launch_patch_is_replayed_and_restored():
    # a fresh rank process: the body starts by checking that triton.language holds Triton's builtins, and Triton
    # 3.9's own interpreter leaves triton.language.core patched after a plain @triton.jit kernel calls a jit helper
    # (no ditron involved), which other tests' bodies do in the session's shared rank processes
    from ditron.sim.pool import SimCluster
    with SimCluster(1) as cluster:
        assert cluster.run(B.launch_patch_replayed) == [True]


def test_tuple_type_names_are_triton_s(dist_world):
    from ditron._compat import TRITON_VERSION
    assert dist_world(1).run(B.tuple_type_names) == [8 if TRITON_VERSION[:2] == (3, 6) else 0]


def test_helper_with_builtins_imported_by_name(dist_world):
    # Triton's interpreter patched the tl / tl.core module attributes only: a helper module's own name for a
    # builtin (`from triton.language.core import to_tensor`) failed with "_semantic argument must be provided"; the kernel's own module (second value) is covered too
    assert dist_world(2).run(B.named_builtin_helper) == [(42, 43), (43, 44)]
