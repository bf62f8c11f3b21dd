"""Importing this module runs :func:`ditron.sim.prewarm.warm`: the last entry of the preload list of
:class:`ditron.sim.pool.SimCluster`'s fork server (multiprocessing's preload takes module names), so that the
ranks it forks inherit the kernels' first-launch work instead of each doing it again."""
from .prewarm import warm

WARMED = warm()
