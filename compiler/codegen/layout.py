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
  its backward order; and what is the same in every row
  (``place_hoisted``, compiler/invariant.py), computed there once: one row
  of values and one of gradients and contributions, at the row's indices.
"""
from dataclasses import dataclass

import numpy as np

from compiler.codegen.scalar import SCALAR_C
from compiler.constants import MV_NR, MV_PW, ROW_ALIGN
from compiler.ir import OP_CODES, OP_NAMES, MatVec, Op, ScalarArrays, Sum, all_slots, unfolded

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
    panels: int       # forward panels: round16(R) * C doubles (-1: W itself, in_place)
    finite: int       # 1.0 when every weight is finite


def in_place(rows):
    """Whether a weight block of ``rows`` rows is its own forward panel, read
    where it is in ``p``: one panel (at most MV_PW rows) whose width,
    round8(R), is the stride of W's columns, round16(R), so that
    mv_pack_fwd would copy it unchanged (W's padding stays 0). microgpt's
    64-row and 16-row weights are; MNIST's layers (50 rows, or more than 64)
    are not."""
    return rows <= MV_PW and round_up(rows, 8) == round_up(rows, PANEL)


@dataclass(frozen=True)
class MatVecAux:
    """Where one ``MatVec``'s part of ``aux`` is."""
    heads: int        # round16(R) doubles (-1: no heads, or heads in the rows)
    skip: int         # 1.0 when its forward may skip zeros
    bgx: int          # input-gradient panels (-1: the gradient of x is not needed)


@dataclass(frozen=True)
class ScalarPart:
    """A program's ops split without building an ``Op`` per scalar op: the
    scalar ops as ``ScalarArrays`` (``arrays``), the position in
    ``program.ops`` of each (``positions``), and the other ops as
    ``(position, op)`` pairs (``lifted``)."""
    arrays: ScalarArrays
    positions: object     # numpy int64, increasing
    lifted: list

    @classmethod
    def of(cls, program):
        if program.arrays is not None:
            arrays, lifted = program.arrays, list(program.lifted)
        else:
            ops = program.ops
            lifted = [(i, op) for i, op in enumerate(ops) if type(op) is not Op]
            arrays = ScalarArrays.from_ops([op for op in ops if type(op) is Op])
        n = len(arrays.code) + len(lifted)
        positions = np.arange(n, dtype=np.int64)
        if lifted:
            positions = np.delete(positions, [i for i, _ in lifted])
        return cls(arrays, positions, lifted)


class _Places:
    """The C location of each slot's value (``v[i]`` in the row, ``p[i]``
    shared) or gradient (``g[i]``, ``gp[i]``; None for a constant),
    formatted when asked for: ``places[slot]``."""

    def __init__(self, loc, row, shared, no_shared_from=None):
        self._loc = loc                     # list: the row index, or -1 - the shared index
        self._row, self._shared = row + '[%d]', shared + '[%d]'
        self._none_from = len(loc) if no_shared_from is None else no_shared_from
        # (shared slots from _none_from have no place: constants' gradients)

    def __len__(self):
        return len(self._loc)

    def __getitem__(self, slot):
        x = self._loc[slot]
        if x >= 0:
            return self._row % x
        return None if slot >= self._none_from else self._shared % (-1 - x)

    def __iter__(self):
        return (self[s] for s in range(len(self._loc)))

    def all(self):
        """Every slot's place, as a list (for rendering many statements)."""
        row, shared, none_from = self._row, self._shared, self._none_from
        return [row % x if x >= 0 else (shared % (-1 - x) if s < none_from else None)
                for s, x in enumerate(self._loc)]


class Layout:
    """The C location of every slot, value and gradient, and the sizes of
    the arrays. ``loc`` (numpy, one per slot) holds them all: ``v[x]`` for
    ``x >= 0``, else ``p[-1 - x]``; ``value[slot]`` and ``grad[slot]`` are
    the same as C text. Everything per slot is computed with numpy, in bulk."""

    def __init__(self, program, flags):
        self.program = program
        n_in, n_leaves, n_slots = program.n_inputs, program.n_leaves, program.n_slots
        p0, p1 = program.param_start, program.param_end
        self.scalar_part = ScalarPart.of(program)
        self.lifted = self.scalar_part.lifted
        # (a MatMat's uses too)
        self.matvecs = [op for op in unfolded(op for _, op in self.lifted) if type(op) is MatVec]
        blocks = {}                         # weight block start slot -> (R, C)
        for op in self.matvecs:
            blocks[op.wt0] = (op.rows, op.cols)
        loc = np.empty(n_slots, dtype=np.int64)
        # shared: each weight block padded and aligned, then the other parameters, then constants
        at = 0
        self.weight_base = {}
        in_block = np.zeros(n_slots, dtype=bool)
        for wt0, (R, C) in sorted(blocks.items()):
            at = round_up(at, ROW_ALIGN)
            self.weight_base[wt0] = at
            RP = round_up(R, PANEL)
            k, n = np.divmod(np.arange(R * C, dtype=np.int64), R)
            loc[wt0:wt0 + R * C] = -1 - (at + k * RP + n)
            in_block[wt0:wt0 + R * C] = True
            at += C * RP
        others = p0 + np.flatnonzero(~in_block[p0:p1])
        loc[others] = -1 - (at + np.arange(len(others), dtype=np.int64))
        at += len(others)
        self.param_span = at                # parameters and their padding: p[0:param_span]
        loc[p1:n_leaves] = -1 - (at + np.arange(n_leaves - p1, dtype=np.int64))
        self.n_shared = at + n_leaves - p1
        # rows: the inputs, then computed slots, each MatVec's y aligned and padded
        loc[:n_in] = np.arange(n_in, dtype=np.int64)
        at, s = n_in, n_leaves
        for y0, R in sorted({op.y0: op.rows for op in self.matvecs}.items()):
            loc[s:y0] = at + np.arange(y0 - s, dtype=np.int64)
            at = round_up(at + y0 - s, ROW_ALIGN)
            loc[y0:y0 + R] = at + np.arange(R, dtype=np.int64)
            at += round_up(R, PANEL)
            s = y0 + R
        loc[s:] = at + np.arange(n_slots - s, dtype=np.int64)
        self.n_row = at + n_slots - s
        self.loc = loc
        self.loc_list = loc.tolist()          # (the same, as a list: read an entry at a time)
        self.value = _Places(self.loc_list, 'v', 'p')
        self.grad = _Places(self.loc_list, 'g', 'gp', no_shared_from=p1)
        # the contributions of scalar code to parameter gradients, in backward order
        use_out, use_operand, use_slot = _scalar_param_uses(program, flags, self.scalar_part)
        self.recorded = len(use_out) <= MAX_RECORDED
        self.n_contrib = len(use_out) if self.recorded else 0
        self.row_stride = round_up(self.n_row + self.n_contrib, ROW_ALIGN)
        self._contrib = {}        # (op's output slot, operand index) -> contribution index
        self.param_uses = {}      # parameter slot -> its contribution indices, in backward order
        if self.recorded:
            for u, (o, i, slot) in enumerate(zip(use_out.tolist(), use_operand.tolist(), use_slot.tolist())):
                self._contrib[o, i] = u
                self.param_uses.setdefault(slot, []).append(u)
        # aux
        at = 0
        self.weight_aux, self.aux = {}, {}
        for wt0, (R, C) in sorted(blocks.items()):
            at = round_up(at, ROW_ALIGN)
            panels = 0 if in_place(R) else round_up(R, PANEL) * C
            self.weight_aux[wt0] = WeightAux(-1 if in_place(R) else at, at + panels)
            at += panels + 1
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
        self.hoisted, self.once_uses = None, frozenset()      # (place_hoisted)

    def reserve_aux(self, n):
        """The place of ``n`` more doubles of ``aux``, on a 64-byte boundary."""
        at = round_up(self.n_aux, ROW_ALIGN)
        self.n_aux = at + n
        return at

    def place_hoisted(self, hoisted):
        """Room in ``aux`` for what is computed once per change of the
        parameters (``compiler.invariant.Hoisted``): one row of values
        (``once_v``) and of gradients and contributions (``once_g``), at
        the row's indices; ``once_uses``: the recorded contributions found
        there instead of in each row."""
        self.hoisted = hoisted
        self.once_v = self.reserve_aux(self.n_row)
        self.once_g = self.reserve_aux(self.row_stride)
        ops = self.program.ops
        outs = {ops[i].out for i in hoisted.backward}
        self.once_uses = frozenset(u for (o, _), u in self._contrib.items() if o in outs)

    def is_row(self, slot):
        """Whether ``slot`` lives in the rows (an input or a computed value)."""
        return slot < self.program.n_inputs or slot >= self.program.n_leaves

    def row_index(self, slot):
        return self.loc_list[slot]

    def shared_index(self, slot):
        return -1 - self.loc_list[slot]

    def grad_target(self, op, operand, slot):
        """Where ``op``'s contribution to the gradient of its operand number
        ``operand`` (slot ``slot``) goes: ``('+=', location)`` to add it, or
        ``('=', location)`` to record it."""
        u = self._contrib.get((op.out, operand))
        if u is not None:
            return '=', f'g[{self.n_row + u}]'
        return '+=', self.grad[slot]

    def recorded_at(self, out, operand):
        """The row index where the contribution of the scalar op writing
        ``out`` to its operand ``operand`` is recorded, or None (added)."""
        u = self._contrib.get((out, operand))
        return None if u is None else self.n_row + u


def _scalar_param_uses(program, flags, part):
    """``(op's output slot, operand index, parameter slot)`` of every use of
    a parameter by scalar code (``Op`` and ``Sum``) whose gradient is
    needed, in the order the backward code adds them (ops last to first;
    within an op, its gradient entries in ``SCALAR_C``'s order; a Sum's
    terms last to first), as three numpy arrays."""
    p0, p1 = program.param_start, program.param_end
    arrays, n_grad = part.arrays, program.n_grad_ops
    needs = np.frombuffer(bytes(flags), dtype=np.uint8).astype(bool)
    grads = np.zeros((len(OP_NAMES), 2), dtype=bool)
    for name, row in SCALAR_C.items():
        for operand, _, _ in row.grads:
            grads[OP_CODES[name], operand] = True
    code = arrays.code.astype(np.int64)
    live = (part.positions < n_grad) & needs[arrays.out]
    keys, outs, operands, slots = [], [], [], []
    for operand, x in ((0, arrays.a), (1, arrays.b)):
        hit = np.flatnonzero(live & (x >= p0) & (x < p1) & grads[code, operand])
        keys.append(np.stack([-part.positions[hit], np.full(len(hit), operand, dtype=np.int64)]))
        outs.append(arrays.out[hit])
        operands.append(np.full(len(hit), operand, dtype=np.int64))
        slots.append(x[hit])
    # the Sums' terms (thousands of Sums: their terms as one array)
    sums = [(position, op) for position, op in part.lifted if type(op) is Sum and position < n_grad and flags[op.out]]
    terms, lengths = all_slots(op for _, op in sums)
    owner = np.repeat(np.arange(len(sums)), lengths)
    index = np.arange(len(terms)) - (np.cumsum(lengths) - lengths)[owner]      # the term's operand index
    hit = np.flatnonzero((terms >= p0) & (terms < p1))
    owner = owner[hit]
    position = np.fromiter((position for position, _ in sums), dtype=np.int64, count=len(sums))
    keys.append(np.stack([-position[owner], lengths[owner] - 1 - index[hit]]))
    outs.append(np.fromiter((op.out for _, op in sums), dtype=np.int64, count=len(sums))[owner])
    operands.append(index[hit])
    slots.append(terms[hit])
    key = np.concatenate(keys, axis=1)
    order = np.lexsort((key[1], key[0]))
    return np.concatenate(outs)[order], np.concatenate(operands)[order], np.concatenate(slots)[order]
