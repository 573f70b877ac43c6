"""C of a ``MatVec`` (``y = heads + W x``): small wrappers that call the
fixed loop kernels (``templates/kernels.c``, ``kernels_body.c``; ``b->k`` is the
set chosen for this CPU) with this op's shapes and places.

Several ``MatVec`` ops may share one ``W`` (a matrix applied at several
positions): its gradient is one reduction over the rows of a block and,
within a row, over those uses in the interpreter's backward order
(``weight_grad``), which the kernel sees as a list of (x, gy) row pointers.

A block whose weights (or parameter heads) scalar code also reads (a
regulariser, a tied weight) gets its gradient from ``shared_grads.py``
instead: each row's contributions in that row's backward order.
"""
import math

import numpy as np

from compiler.codegen.layout import PANEL, round_up
from compiler.codegen.shared_grads import contributions, direct_grads, interleaved_grad, mixed_blocks
from compiler.constants import (MV_BGW_MK as GROUP, MV_L1_DOUBLES as L1_DOUBLES, MV_PW as PW,  # the
                                MV_RB_MAX as RB_MAX, MV_RCH as RCH)   # kernels' sizes, for their scratch
from compiler.ir import MatVec, all_slots, unfolded


def reads_only_inputs(program, layout, mixed):
    """The ``MatVec`` ops (their ids) whose ``x`` is all inputs: batch runs
    read those rows of the caller's ``X`` where it lies (``b->x``), not a
    copy in the rows. Not those of a ``mixed`` weight block (its gradient,
    shared_grads.py, reads x from the rows), nor a ``MatMat``'s uses."""
    return {id(op) for _, op in layout.lifted
            if type(op) is MatVec and op.x0 + op.cols <= program.n_inputs and op.wt0 not in mixed}


def row_input_runs(program, layout, direct):
    """The inputs read from the rows by anything but the ``direct`` MatVecs'
    ``x`` (scalar ops, other lifted ops, heads, the loss and the outputs), as
    runs ``[first, count]``: what a batch run copies into each row."""
    n = program.n_inputs
    need = np.zeros(n + 1, dtype=bool)          # need[n]: every slot past the inputs, and -1

    def mark(slots):
        s = np.asarray(slots, dtype=np.int64)
        need[np.where((s >= 0) & (s < n), s, n)] = True

    part = layout.scalar_part
    mark(part.arrays.a)
    mark(part.arrays.b)
    # a direct MatVec reads its weights (parameters) and x from elsewhere: only its heads here
    mark(all_slots(op for _, op in part.lifted if id(op) not in direct)[0])
    mark([h for _, op in part.lifted if id(op) in direct for h in op.heads or ()])
    mark([program.loss, *program.outputs])
    edges = np.flatnonzero(np.diff(np.concatenate(([0], need[:n].astype(np.int8), [0]))))
    return [[int(k), int(j - k)] for k, j in zip(edges[::2], edges[1::2])]


def is_strided(slots):
    """``(first, step)`` when ``slots`` are in arithmetic progression, else None."""
    step = slots[1] - slots[0] if len(slots) > 1 else 1
    return (slots[0], step) if all(s == slots[0] + i * step for i, s in enumerate(slots)) else None


def weight_groups(C):
    """The weight gradient's groups of 16 consecutive inputs (-1: none), the
    unit its threads split (each takes a run of this list). Each input lists
    its own rows (the kernel) and its gradients are its own sums, so only how
    the work is shared depends on this. The groups are dealt in a spread-out
    order (by the fractional part of g times the golden ratio) so that every
    run of them samples the whole input: an image's blank border and busy
    centre are shared evenly, whatever the number of threads (in input order,
    one of two threads got the top half of every image)."""
    order = sorted(range((C + GROUP - 1) // GROUP), key=lambda g: (g * 0.6180339887498949) % 1.0)
    return [[c if c < C else -1 for c in range(g * GROUP, (g + 1) * GROUP)] for g in order]


def _heads_table(copies):
    """One loop copying the heads of ``copies`` (``(name, aux place, p
    slots)``) from p to aux, by a table: a copy's own loop each (64/4/4
    microgpt: 288 of them, each unrolled) took clang -O2 1.1 s of the
    module's unit."""
    if not copies:
        return []
    return ['{',
            f'    /* heads of {len(copies)} MatVecs: aux[copy[c][0] + n] = p[slot[k]] for n < copy[c][1], '
            'k counting on */',
            f'    static const int copy[{len(copies)}][2] = {{',
            *[f'        {{{at}, {len(heads)}}},   /* {name} */' for name, at, heads in copies],
            '    };',
            f'    static const int slot[{sum(len(heads) for _, _, heads in copies)}] = {{',
            *[f'        {", ".join(map(str, heads))},' for _, _, heads in copies],
            '    };',
            f'    for (int c = 0, k = 0; c < {len(copies)}; c++)',
            '        for (int n = 0; n < copy[c][1]; n++)',
            '            aux[copy[c][0] + n] = p[slot[k++]];',
            '}']


class MatVecRenderer:
    """Names, wrappers and calls of a program's ``MatVec`` ops."""

    def __init__(self, program, layout, flags, block_rows):
        self.program, self.layout, self.flags = program, layout, flags
        self.ops = layout.matvecs
        self.name = {id(op): f'matvec{i + 1}' for i, op in enumerate(self.ops)}
        grad_ops = {id(u) for i, op in layout.lifted if i < program.n_grad_ops for u in unfolded([op])}
        self.has_backward = {id(op) for op in self.ops
                             if id(op) in grad_ops and any(flags[o] for o in op.writes)}
        # the uses of each weight block, in the order backward reaches them
        self.uses = {}
        for op in reversed(list(unfolded(op for _, op in layout.lifted))):   # (a MatMat's uses too)
            if id(op) in self.has_backward:
                self.uses.setdefault(op.wt0, []).append(op)
        self.block_rows = block_rows
        # weight blocks whose parameters scalar code reads too: {wt0: their parameter slots}
        self.mixed = mixed_blocks(program, flags, self.uses)
        self.mixed_params = {s for slots in self.mixed.values() for s in slots}
        self.direct = reads_only_inputs(program, layout, self.mixed)   # MatVecs that read b->x
        self.once_packing = []   # refresh_aux's copies of contributions computed once (shared_grads.py)
        self.taken = set()    # weight blocks whose gradient another renderer writes (codegen/matmat.py)

    def _p(self, slot):
        return self.layout.shared_index(slot)

    def _row(self, slot):
        return self.layout.row_index(slot)

    def packs(self):
        """The packed copies of the weights ``refresh_aux`` makes, by weight
        block: [(the block's place in p [lo, hi), doubles its packs copy,
        their C statements)]. A block's packs read only p[lo:hi]. Its forward
        panels also give its flag "every weight finite"; each input-gradient
        order of it has its own panels."""
        lay, blocks = self.layout, {}
        for wt0, wa in lay.weight_aux.items():
            op = next(o for o in self.ops if o.wt0 == wt0)
            RP = round_up(op.rows, PANEL)
            lo = lay.weight_base[wt0]
            if wa.panels < 0:       # W is its own panel: read in place, checked only
                blocks[wt0] = [(lo, lo + op.cols * RP), op.rows * op.cols // 2, [
                    f'aux[{wa.finite}] = finite >= 0 ? finite : mv_all_finite(p + {lo}, {op.cols * RP});   '
                    f'/* W of {self.name[id(op)]}: {op.rows}x{op.cols}, its own panel */']]
                continue
            blocks[wt0] = [(lo, lo + op.cols * RP), op.rows * op.cols, [
                f'aux[{wa.finite}] = mv_pack_fwd(p + {lo}, {op.rows}, {op.cols}, '
                f'{RP}, aux + {wa.panels});   /* W of {self.name[id(op)]}: {op.rows}x{op.cols} */']]
        filled = {-1}
        for op in self.ops:
            at = lay.aux[id(op)].bgx
            if at not in filled:
                filled.add(at)
                blocks[op.wt0][1] += op.rows * op.cols
                blocks[op.wt0][2].append(self._pack_bgx(op, at))
        return [tuple(block) for block in blocks.values()]

    def refresh(self):
        """The rest of ``aux`` from p and the packs (``packs``): padded heads
        and the flags that let the loops skip zeros. Returns (lines run once,
        at nn_init: the heads that are constants, which nothing writes after
        init_constants; lines run at every refresh)."""
        lay, once, lines = self.layout, [], []
        copies = {True: [], False: []}     # heads copied by a table: constants (once), others
        filled = {-1}       # aux places that uses of one weight share (Layout): fill them once
        for op in self.ops:
            a, wa = lay.aux[id(op)], lay.weight_aux[op.wt0]
            name = self.name[id(op)]
            if a.skip in filled:
                continue
            filled.add(a.skip)
            # zeros may be skipped while every weight is finite and no sum starts
            # at -0.0 (a head of -0.0; with heads in the rows: never checked, no skipping)
            if not op.heads:
                lines.append(f'aux[{a.skip}] = aux[{wa.finite}];   /* {name} */')
                continue
            if a.heads < 0:
                lines.append(f'aux[{a.skip}] = 0.0;   /* {name}: heads in the rows */')
                continue
            constants = self.program.constants
            fixed = all(h in constants for h in op.heads)
            (once if fixed else lines).extend(self._copy_heads(op, a.heads, copies[fixed]))
            if not fixed:
                lines += [f'aux[{a.skip}] = aux[{wa.finite}];',
                          f'for (int n = 0; n < {op.rows}; n++)',
                          f'    if (aux[{a.heads} + n] == 0.0 && signbit(aux[{a.heads} + n])) aux[{a.skip}] = 0.0;']
            elif any(constants[h] == 0.0 and math.copysign(1.0, constants[h]) < 0 for h in op.heads):
                lines.append(f'aux[{a.skip}] = 0.0;   /* {name}: a head is -0.0 */')
            else:
                lines.append(f'aux[{a.skip}] = aux[{wa.finite}];   /* {name} */')
        return _heads_table(copies[True]) + once, _heads_table(copies[False]) + lines

    def _copy_heads(self, op, at, table):
        """The statement copying ``op``'s heads from p to aux + ``at`` where
        they are evenly spaced in p; else none, and ``(name, at, p slots)``
        joins ``table`` (``_heads_table``)."""
        name, heads = self.name[id(op)], [self._p(h) for h in op.heads]
        strided = is_strided(heads)
        if strided:
            return [f'for (int n = 0; n < {op.rows}; n++) aux[{at} + n] = p[{strided[0]} + n * {strided[1]}];   '
                    f'/* heads of {name} */']
        table.append((name, at, heads))
        return []

    def forward_panels(self, wt0):
        """The C of a block's forward panels, in a function with ``b``: its
        packed copy in aux, or W itself (``layout.in_place``)."""
        wa = self.layout.weight_aux[wt0]
        return f'b->p + {self.layout.weight_base[wt0]}' if wa.panels < 0 else f'b->aux + {wa.panels}'

    def _pack_bgx(self, op, at):
        return (f'mv_pack_bgx(p + {self.layout.weight_base[op.wt0]}, {self.name[id(op)]}_order, '
                f'{op.rows}, {op.cols}, {round_up(op.rows, PANEL)}, aux + {at});')

    def functions(self, inside=frozenset()):
        """The C wrappers of every ``MatVec``: forward and backward over rows
        (not for those ``inside`` a ``MatMat`` that runs as one: the ids of
        uses its own calls run), and the gradients of each weight block over
        a block's rows."""
        out = []
        for op in self.ops:
            if op.grad_x:
                order = ', '.join(map(str, op.bwd_rows))
                out.append(f'static const int {self.name[id(op)]}_order[{op.rows}] = {{{order}}};   '
                           '/* the rows in backward order */')
        for op in self.ops:
            if id(op) in inside:
                continue
            out.append(self._forward(op))
            if id(op) in self.has_backward:
                out.append(self._backward(op))
        for wt0, uses in self.uses.items():
            if wt0 in self.taken:
                continue
            if wt0 not in self.mixed:
                out.append(self._weight_grad(wt0, uses))
            elif self.layout.recorded:
                params = self.mixed[wt0]
                items = contributions(self.program, self.layout, self.flags, params, uses)
                text, packing = interleaved_grad(self.name[id(uses[0])], self.layout, items, params)
                out.append(text)
                self.once_packing += packing
        return out

    def _forward(self, op):
        name, a = self.name[id(op)], self.layout.aux[id(op)]
        y = self._row(op.y0)
        lines = [f'/* {op} */', f'static void\n{name}_forward(const Block *b, int r0, int r1, void *scratch)\n{{']
        if not op.heads:
            start, hp = 1, 'NULL'
        elif a.heads >= 0:
            start, hp = 0, f'b->aux + {a.heads}'
        else:   # heads in the rows: each row's sums start from what y holds
            start, hp = 2, 'NULL'
            lines += ['    const double *restrict p = b->p;',
                      '    for (int r = r0; r < r1; r++) {',
                      '        double *restrict v = ROW(b->v, r);',
                      *[f'        v[{y + n}] = {self.layout.value[h]};' for n, h in enumerate(op.heads)],
                      '    }', '    (void)p;']
        x = f'b->x + {op.x0}, b->ldx' if id(op) in self.direct else f'b->v + {self._row(op.x0)}, ROW_STRIDE'
        lines += [f'    b->k->fwd({self.forward_panels(op.wt0)}, {hp}, {op.rows}, {op.cols}, {start}, b->aux[{a.skip}] != 0.0, '
                  f'{x}, b->v + {y}, ROW_STRIDE, r0, r1, scratch);',
                  '}']
        return '\n'.join(lines)

    def _backward(self, op):
        """Per row: the gradients of heads in the rows, and of x."""
        name, a, wa = self.name[id(op)], self.layout.aux[id(op)], self.layout.weight_aux[op.wt0]
        y = self._row(op.y0)
        lines = [f'static void\n{name}_backward(const Block *b, int r0, int r1, void *scratch)\n{{']
        row_heads = [(n, h) for n, h in enumerate(op.heads or ()) if self.layout.is_row(h) and self.flags[h]]
        if row_heads:
            lines += ['    for (int r = r0; r < r1; r++) {',
                      '        double *restrict g = ROW(b->g, r);',
                      *[f'        {self.layout.grad[h]} += g[{y + n}];' for n, h in row_heads],
                      '    }']
        if op.wt0 in self.mixed and not self.layout.recorded:
            lines += direct_grads(self.layout, self.flags, op)
        if op.grad_x:
            guard = '    if (b->input_grads)\n    ' if op.x0 < self.program.n_inputs else ''
            lines.append(f'{guard}    b->k->bgx(b->aux + {a.bgx}, {name}_order, {op.rows}, {op.cols}, '
                         f'b->aux[{wa.finite}] != 0.0, b->g + {y}, ROW_STRIDE, b->g + {self._row(op.x0)}, '
                         'ROW_STRIDE, r0, r1, scratch);')
        lines += ['    (void)b; (void)r0; (void)r1; (void)scratch;', '}']
        return '\n'.join(lines)

    def _weight_grad(self, wt0, uses):
        """The gradients of W over a block's rows (all its uses), and of the
        parameter heads; this part's share of them."""
        op = uses[0]
        name, U = self.name[id(op)], len(uses)
        R, C, RP = op.rows, op.cols, round_up(op.rows, PANEL)
        groups = weight_groups(C)
        pairs = ', '.join(f'{self._row(u.x0)}, {self._row(u.y0)}' for u in uses)
        in_x = [int(id(u) in self.direct) for u in uses]
        lines = [f'static const int {name}_groups[{len(groups) * GROUP}] = {{'
                 + ', '.join(str(c) for g in groups for c in g) + '};',
                 f'static void\n{name}_weight_grad(const Block *b, int rows, int part, int parts, void *scratch)\n{{',
                 f'    static const int uses[{2 * U}] = {{{pairs}}};   /* x, y of each use, backward order */']
        if any(in_x):
            lines.append(f'    static const int in_x[{U}] = {{{", ".join(map(str, in_x))}}};   '
                         '/* whose x is read from b->x */')
        xrow = ('(in_x[u] ? b->x + r * b->ldx : ROW(b->v, r)) + uses[2 * u]' if any(in_x)
                else 'ROW(b->v, r) + uses[2 * u]')
        lines += [f'    const int U = {U}, PANELS = {RP // PANEL}, GROUPS = {len(groups)};',
                  '    const double **xrow = (const double **)scratch, **gyrow = xrow + rows * U;',
                  '    void *rest = (void *)(gyrow + rows * U);',
                  '    for (int r = 0; r < rows; r++)',
                  '        for (int u = 0; u < U; u++) {',
                  f'            xrow[r * U + u] = {xrow};',
                  '            gyrow[r * U + u] = ROW(b->g, r) + uses[2 * u + 1];',
                  '        }']
        if self.flags[wt0]:
            base = self.layout.weight_base[wt0]
            # Splitting the groups of inputs shares no work; splitting the
            # neurons makes every thread list and pack every group's inputs
            # (measured: 1.7x the weight-gradient time at 2 threads, 784-50-10)
            lines += ['    if (GROUPS < 2 * parts && PANELS >= parts)   /* split the neurons */',
                      f'        b->k->bgw({R}, {C}, rows * U, xrow, gyrow, b->gp + {base}, {RP}, {name}_groups, '
                      '0, GROUPS, PANELS * part / parts, PANELS * (part + 1) / parts, rest);',
                      '    else                   /* split the groups of inputs */',
                      f'        b->k->bgw({R}, {C}, rows * U, xrow, gyrow, b->gp + {base}, {RP}, {name}_groups, '
                      'GROUPS * part / parts, GROUPS * (part + 1) / parts, 0, PANELS, rest);']
        for i, u in enumerate(uses):
            heads = [h for h in u.heads or () if not self.layout.is_row(h) and self.flags[h]]
            if not heads:
                continue
            y = self._row(u.y0)
            lines.append(f'    if (part == {i} % parts) {{   /* heads of use {i} */')
            lines += ['        const double **gy = xrow;   /* reused: this use\'s gy rows */',
                      f'        const int Y = {y};',
                      '        for (int r = 0; r < rows; r++) gy[r] = ROW(b->g, r) + Y;']
            strided = is_strided([self._p(h) for h in u.heads]) if len(heads) == u.rows else None
            if strided and strided[1] == 1:
                lines.append(f'        b->k->bgh({u.rows}, rows, gy, b->gp + {strided[0]});')
            else:
                for n, h in enumerate(u.heads):
                    if h in heads:
                        lines.append(f'        {{ double a = b->gp[{self._p(h)}]; for (int r = 0; r < rows; r++) '
                                     f'a += gy[r][{n}]; b->gp[{self._p(h)}] = a; }}')
            lines.append('    }')
        lines += ['    (void)rest; (void)PANELS; (void)GROUPS;', '}']
        return '\n'.join(lines)

    def forward_call(self, op):
        return f'{self.name[id(op)]}_forward(b, r0, r1, scratch);   /* {op} */'

    def backward_call(self, op):
        return f'{self.name[id(op)]}_backward(b, r0, r1, scratch);   /* backward of {self.name[id(op)]} */'

    def weight_grad_calls(self):
        return [f'{self.name[id(uses[0])]}_weight_grad(b, rows, part, parts, scratch);'
                for wt0, uses in self.uses.items()
                if wt0 not in self.taken and (wt0 not in self.mixed or self.layout.recorded)]

    def scratch_bytes(self):
        """Bytes of scratch each thread needs (the kernels' and the row pointers):
        templates/kernels_body.c's lists, blocks and packed gy."""
        need = 0
        for op in self.ops:
            U = len(self.uses.get(op.wt0, ())) or 1
            n = self.block_rows * U
            K = len(weight_groups(op.cols)) * GROUP

            def lists(L):       # mv_fwd, mv_bgx: MV_RCH rows' lists of L terms, offsets, sums
                return (RCH * PW * 8 + RCH * L * 12 + RCH * (L // 8 + 2) * 4 + 4 * 64)
            # mv_bgw: packed gy (at most max(L1_DOUBLES, 64 * round8(R)) doubles),
            # and each input's list of a block's rows (a double and an int a
            # row): up to RB_MAX rows when a thread's share of the neurons is narrow
            R8 = round_up(op.rows, 8)
            bgw = (8 * max(L1_DOUBLES, (L1_DOUBLES // PW) * R8) + 8 * PW + K * RB_MAX * 12 + 4 * K
                   + RB_MAX + 6 * 64)
            need = max(need, lists(op.cols), lists(op.rows), 16 * n + bgw)
        return round_up(need, 64)
