"""The lifting passes, in the one order they compose in.

1. ``vectorize``: ``+`` chains into ``Sum``, layers and shared weights into
   ``MatVec`` (it records what it left scalar and why: ``not_lifted``);
2. ``lift_convs``: a kernel applied at every position into one ``Conv`` (it
   reads the ``Sum``/``MatVec`` program the first pass leaves);
3. ``lift_loops``: dot products of activations into ``Dot``, periodic
   stretches into ``Loop`` (each position of a sequence stays self-contained);
4. ``positions``: a sequence rescheduled layer by layer, a matrix applied at
   every position into one ``MatMat`` (last: it records the schedule).

Each pass returns its input unchanged where it finds nothing to lift, and
every lifted form keeps the interpreter's bits.
"""
from compiler.conv import lift_convs
from compiler.loops import lift_loops
from compiler.positions import positions
from compiler.vectorize import vectorize


def run_passes(program):
    """``Program -> Program`` through every pass."""
    lifted = vectorize(program)
    out = positions(lift_loops(lift_convs(lifted)))
    if out is not lifted:
        out.not_lifted = lifted.not_lifted     # (the later passes keep the slots it names)
    return out
