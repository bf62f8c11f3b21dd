"""Simulator lowering (Triton's interpreter on N simulated ranks).

The CPU simulator registers its rules here; until it does, every op fails
with a :class:`~ditron.errors.LoweringError` naming the op and the ``sim``
target, never silently.
"""
