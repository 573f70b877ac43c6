"""Where every IR slot lives in the generated module, decided in one place.

A compiled program runs over a *block* of input rows at once. Each row has
its own values and gradients; parameters and constants are shared:

- ``v`` / ``g``: one row's values and gradients, ``ROW_STRIDE`` doubles
  apart from the next row's: the inputs first, then every computed slot in
  order. The outputs ``y`` of a ``MatVec`` start on a 64-byte boundary and
  have room for ``round16(R)`` values (the loop kernels work on 16 lanes;
  the gradient padding stays 0). In the gradient row, after those, come the
  *contributions*: what scalar ops add to parameter gradients, recorded per
  row so that rows can run in parallel and still be added up in row order
  (``recorded``); above ``MAX_RECORDED`` the scalar ops add straight into
  ``gp``, rows in order on one thread.
- ``p`` / ``gp``: the parameters, then the constants; and the parameters'
  gradients. A ``MatVec``'s weights are one block by column,
  ``W[n][k]`` at ``p[base + k * round16(R) + n]``, starting on a 64-byte
  boundary; the padding stays 0 (and the optimizer leaves a 0 at 0).
- ``aux``: what is derived from the parameters after every change of them
  (``refresh_aux``): per weight block the forward panels and a flag "every
  weight is finite"; per ``MatVec`` its heads (padded), a flag "skip zeros"
  and, when the gradient of ``x`` is needed, the input-gradient panels in
  its backward order.
"""
from dataclasses import dataclass

from compiler.codegen.scalar import SCALAR_C
from compiler.constants import MV_NR, ROW_ALIGN
from compiler.ir import MatVec, Op, Sum, unfolded

# Scalar parameter uses per row that a program may record; above this the
# contributions would cost more memory than threads gain, and the program
# adds them directly, on one thread.
MAX_RECORDED = 4096

PANEL = MV_NR   # lanes of the loop kernels' panels


def round_up(n, m):
    return (n + m - 1) // m * m


@dataclass(frozen=True)
class WeightAux:
    """Where one weight block's part of ``aux`` is."""
    panels: int       # forward panels: round16(R) * C doubles
    finite: int       # 1.0 when every weight is finite


@dataclass(frozen=True)
class MatVecAux:
    """Where one ``MatVec``'s part of ``aux`` is."""
    heads: int        # round16(R) doubles (-1: no heads, or heads in the rows)
    skip: int         # 1.0 when its forward may skip zeros
    bgx: int          # input-gradient panels (-1: the gradient of x is not needed)


class Layout:
    """The C location of every slot, value and gradient, and the sizes of
    the arrays."""

    def __init__(self, program, flags):
        self.program = program
        n_in, n_leaves = program.n_inputs, program.n_leaves
        self.matvecs = [op for op in unfolded(program.ops) if type(op) is MatVec]   # (a MatMat's uses too)
        blocks = {}                         # weight block start slot -> (R, C)
        for op in self.matvecs:
            blocks[op.wt0] = (op.rows, op.cols)
        # shared: each weight block padded and aligned, then the other parameters, then constants
        self._shared = {}
        at = 0
        self.weight_base = {}
        for wt0, (R, C) in sorted(blocks.items()):
            at = round_up(at, ROW_ALIGN)
            self.weight_base[wt0] = at
            RP = round_up(R, PANEL)
            for s in range(wt0, wt0 + R * C):
                k, n = divmod(s - wt0, R)
                self._shared[s] = at + k * RP + n
            at += C * RP
        for s in range(program.param_start, program.param_end):
            if s not in self._shared:
                self._shared[s] = at
                at += 1
        self.param_span = at                # parameters and their padding: p[0:param_span]
        for s in range(program.param_end, n_leaves):
            self._shared[s] = at
            at += 1
        self.n_shared = at
        # rows: the inputs, then computed slots, each MatVec's y aligned and padded
        y_blocks = {op.y0: op.rows for op in self.matvecs}
        self._row = list(range(n_in)) + [0] * (program.n_slots - n_leaves)
        at, s = n_in, n_leaves
        while s < program.n_slots:
            R = y_blocks.get(s)
            if R:
                at = round_up(at, ROW_ALIGN)
                for n in range(R):
                    self._row[n_in + s + n - n_leaves] = at + n
                at += round_up(R, PANEL)
                s += R
            else:
                self._row[n_in + s - n_leaves] = at
                at += 1
                s += 1
        self.n_row = at
        uses = _scalar_param_uses(program, flags)
        self.recorded = len(uses) <= MAX_RECORDED
        self.n_contrib = len(uses) if self.recorded else 0
        self.row_stride = round_up(self.n_row + self.n_contrib, ROW_ALIGN)
        self._contrib = {}        # (id(op), operand index) -> contribution index
        self.param_uses = {}      # parameter slot -> its contribution indices, in backward order
        if self.recorded:
            for u, (op, i, slot) in enumerate(uses):
                self._contrib[id(op), i] = u
                self.param_uses.setdefault(slot, []).append(u)
        self.value = [self._value(s) for s in range(program.n_slots)]
        self.grad = [self._grad(s) for s in range(program.n_slots)]
        # aux
        at = 0
        self.weight_aux, self.aux = {}, {}
        for wt0, (R, C) in sorted(blocks.items()):
            at = round_up(at, ROW_ALIGN)
            self.weight_aux[wt0] = WeightAux(at, at + round_up(R, PANEL) * C)
            at += round_up(R, PANEL) * C + 1
        # A weight applied at several places (a sequence's positions) shares
        # what is the same for each: the padded heads and their skip flag,
        # and the input-gradient panels of one backward row order.
        shared = {}
        for op in self.matvecs:
            heads_key = (op.wt0, tuple(op.heads or ()))
            if heads_key not in shared:
                at = round_up(at, ROW_ALIGN)
                heads = at if op.heads and not any(self.is_row(h) for h in op.heads) else -1
                at += round_up(op.rows, PANEL) if heads >= 0 else 0
                shared[heads_key], at = (heads, at), at + 1
            heads, skip = shared[heads_key]
            bgx = -1
            if op.grad_x:
                bgx_key = (op.wt0, tuple(op.bwd_rows))
                if bgx_key not in shared:
                    at = round_up(at, ROW_ALIGN)
                    shared[bgx_key], at = at, at + round_up(op.cols, PANEL) * op.rows
                bgx = shared[bgx_key]
            self.aux[id(op)] = MatVecAux(heads, skip, bgx)
        self.n_aux = at

    def is_row(self, slot):
        """Whether ``slot`` lives in the rows (an input or a computed value)."""
        return slot < self.program.n_inputs or slot >= self.program.n_leaves

    def row_index(self, slot):
        p = self.program
        return slot if slot < p.n_inputs else self._row[p.n_inputs + slot - p.n_leaves]

    def shared_index(self, slot):
        return self._shared[slot]

    def _value(self, slot):
        return f'v[{self.row_index(slot)}]' if self.is_row(slot) else f'p[{self.shared_index(slot)}]'

    def _grad(self, slot):
        if self.is_row(slot):
            return f'g[{self.row_index(slot)}]'
        if slot < self.program.param_end:
            return f'gp[{self.shared_index(slot)}]'
        return None           # a constant: no gradient

    def grad_target(self, op, operand, slot):
        """Where ``op``'s contribution to the gradient of its operand number
        ``operand`` (slot ``slot``) goes: ``('+=', location)`` to add it, or
        ``('=', location)`` to record it."""
        u = self._contrib.get((id(op), operand))
        if u is not None:
            return '=', f'g[{self.n_row + u}]'
        return '+=', self.grad[slot]


def _scalar_param_uses(program, flags):
    """``(op, operand index, parameter slot)`` of every use of a parameter by
    scalar code (``Op`` and ``Sum``) whose gradient is needed, in the order
    the backward code adds them."""
    def is_param(s):
        return program.param_start <= s < program.param_end
    uses = []
    for op in reversed(program.grad_ops):
        if type(op) is Op and flags[op.out]:
            uses += [(op, i, op.args[i]) for i, _, _ in SCALAR_C[op.name].grads if is_param(op.args[i])]
        elif type(op) is Sum and flags[op.out]:
            uses += [(op, i, op.terms[i]) for i in reversed(range(len(op.terms))) if is_param(op.terms[i])]
    return uses
