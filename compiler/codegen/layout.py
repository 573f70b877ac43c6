"""The scratch arrays of the generated module, decided in one place.

Besides ``data`` and ``grad`` (one double per slot), the vector ops' C uses
three scratch arrays, each op owning one contiguous part of each:

- ``aux`` (doubles derived from the parameters, refreshed after every
  change of them): a ``MatVec``'s flag "every weight is finite", then, when
  the gradient of ``x`` is needed, a row-major copy of ``W``;
- ``index`` (ints): the columns forward added and their count, and the
  buckets in which ``train_batch``'s backward records input rows;
- ``defer`` (doubles): the recorded ``x[c]`` values and gradients of ``y``.
"""
from dataclasses import dataclass

from compiler.constants import DEFER_ROWS
from compiler.ir import MatVec


@dataclass(frozen=True)
class Scratch:
    """Where one op's parts of the scratch arrays start."""
    aux: int
    index: int
    defer: int


def scratch_sizes(op):
    """``(aux, index, defer)`` sizes one op needs."""
    if type(op) is not MatVec:
        return 0, 0, 0
    R, C = op.rows, op.cols
    aux = 1 + (R * C if op.grad_x else 0)
    # the columns forward added and their count; per column, the number of
    # recorded rows, and their places among the DEFER_ROWS
    index = C + 1 + C + C * DEFER_ROWS
    # per column, the recorded x[c]; per recorded row, the gradients of y
    defer = (C + R) * DEFER_ROWS
    return aux, index, defer


class ScratchLayout:
    """Every op's ``Scratch`` offsets, and the total size of each array."""

    def __init__(self, program):
        self.of = {}
        aux = index = defer = 0
        for op in program.ops:
            sizes = scratch_sizes(op)
            if any(sizes):
                self.of[id(op)] = Scratch(aux, index, defer)
                aux, index, defer = aux + sizes[0], index + sizes[1], defer + sizes[2]
        self.n_aux, self.n_index, self.n_defer = aux, index, defer

    def get(self, op):
        """``op``'s offsets, or None for an op that uses no scratch."""
        return self.of.get(id(op))
