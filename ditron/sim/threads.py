"""CPU threads of a simulated rank's libraries.

A rank of a ``ditron sim`` job (or of a :class:`~ditron.sim.pool.SimCluster`) runs on the machine's cores beside
the job's other ranks, and it runs its kernel's programs as threads of its own, so intra-op thread pools in
every rank only oversubscribe the cores. As torchrun does for its ranks, a rank whose job does not set
``OMP_NUM_THREADS`` gets ``OMP_NUM_THREADS=1`` (:func:`default_env`). On 2 cores the OpenMP workers spinning
between a rank's small torch operations cost 11% of the CPU of ``tests/test_decoder_attention.py``.

Likewise ``TORCHINDUCTOR_COMPILE_THREADS=1``: a rank that runs ``torch.compile`` would otherwise start inductor's
pool of compile workers (``compile_threads`` is the machine's core count), fresh processes in every such rank for
the few small kernels a rank compiles, which the job's other ranks compile too; with one thread inductor compiles
them in the rank (``tests/test_torch.py`` on 2 cores, cold caches: 90 CPU-s instead of 100).

A rank started as a new process reads the variables when it imports torch; a rank forked from a server that
imported torch (or inductor's config) already takes them from :func:`apply` (torch reads ``OMP_NUM_THREADS`` once,
at import; inductor its variable when its config module is imported)."""
from __future__ import annotations

import os
import sys

VAR = "OMP_NUM_THREADS"
#: inductor's compile workers (torch._inductor.config.compile_threads)
INDUCTOR_VAR = "TORCHINDUCTOR_COMPILE_THREADS"
#: the value a rank gets for each variable when neither the job's environment nor the launcher's sets it
RANK_DEFAULTS = {VAR: "1", INDUCTOR_VAR: "1"}


def default_env(base, launcher=None) -> dict:
    """The :data:`RANK_DEFAULTS` that a rank's environment ``base`` (and the launcher's, ``launcher``: default
    this process's) does not set."""
    launcher = os.environ if launcher is None else launcher
    return {k: v for k, v in RANK_DEFAULTS.items() if k not in base and k not in launcher}


def _positive(env, var):
    try:
        n = int(env.get(var, ""))
    except ValueError:
        return None                     # unset, or what torch itself does with a value it cannot read: its default
    return n if n > 0 else None


def apply(env) -> None:
    """In a forked rank, after it took its environment ``env``: torch's intra-op threads and inductor's compile
    threads as ``env`` says (positive integers in :data:`VAR` / :data:`INDUCTOR_VAR`), where torch / inductor's
    config is already imported; nothing otherwise."""
    torch = sys.modules.get("torch")
    n = _positive(env, VAR)
    if torch is not None and n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    config = sys.modules.get("torch._inductor.config")
    n = _positive(env, INDUCTOR_VAR)
    if config is not None and n is not None:
        config.compile_threads = n
