"""The C of one program's computation: its scalar code as per-row functions
(``_Functions``), its vector ops' calls, and the functions that run them over
a block's rows (``forward_rows``, ``backward_rows``, ``param_grads``), with
the numbers the module template needs (``_Program.emit``)."""
import itertools
import math

import numpy as np

from compiler.codegen import blob, loops, rolled, shared_grads, table
from compiler.codegen.conv import ConvRenderer
from compiler.codegen.layout import Layout
from compiler.codegen.matmat import MatMatRenderer
from compiler.codegen.matvec import MatVecRenderer
from compiler.codegen.scalar import ScalarRenderer, c_double
from compiler.constants import (BACKWARD_PARAMS, BLOCK_BYTES, BLOCK_ROWS, CHUNK, FORWARD_PARAMS, MAX_PARTS,
                                PART)
from compiler.invariant import NOTHING, hoisted
from compiler.ir import Conv, MatMat, MatVec, needs_grad, prefix_cuts, unfolded


class _Functions:
    """Per-row functions of straight-line code, each split into ``noinline``
    chunks (clang and gcc are superlinear in the size of one function), and
    grouped into parts of about ``PART`` statements: the translation units
    that build in parallel."""

    def __init__(self):
        self.definitions = []     # [(statements, C text)] per function
        self.prototypes = []
        self.count = 0

    def define(self, kind, params, lines, preamble=()):
        """A function running ``lines`` on one row; returns its name.
        ``preamble``: C declarations (file scope) it alone reads, placed just
        before it (in its translation unit; it must fit one chunk)."""
        self.count += 1
        name = f'seg{self.count}_{kind}'
        if len(lines) <= CHUNK:
            self._function(name, params, lines, preamble)
            return name
        assert not preamble
        calls = []
        for n, start in enumerate(range(0, len(lines), CHUNK)):
            self._function(f'{name}_{n}', params, lines[start:start + CHUNK])
            calls.append(f'    {name}_{n}({params[1]});')
        self.prototypes.append(f'HIDDEN void {name}({params[0]});')
        self.definitions.append((0, '\n'.join([f'HIDDEN NOINLINE void\n{name}({params[0]})\n{{', *calls, '}\n'])))
        return name

    def _function(self, name, params, lines, preamble=()):
        self.prototypes.append(f'HIDDEN void {name}({params[0]});')
        # a loop or a fold is one item of several lines: count its lines
        self.definitions.append((sum(line.count('\n') + 1 for line in lines), '\n'.join([
            *preamble, f'HIDDEN NOINLINE void\n{name}({params[0]})\n{{',
            '    ' + '\n'.join(lines).replace('\n', '\n    '), '}\n'])))

    @property
    def statements(self):
        return sum(n for n, _ in self.definitions)

    def parts(self):
        """The definitions grouped into parts of about ``PART`` statements
        (larger, for huge programs: at most about ``MAX_PARTS`` of them)."""
        target = max(PART, -(-self.statements // MAX_PARTS))
        parts, current, size = [], [], 0
        for n, text in self.definitions:
            if current and size + n > target:
                parts.append(current)
                current, size = [], 0
            current.append(text)
            size += n
        return parts + ([current] if current else [])


def _init_constants(lay, constants, table=False):
    """``init_constants``: the graph's constants into their slots, from a
    table (thousands of assignments would cost the C compiler seconds; a
    large table is a blob: compiler/codegen/blob.py); with ``table``, it
    first unpacks the op table."""
    out = ['static void\ninit_constants(double *restrict p)\n{']
    if table:
        out.append('    vm_unpack();   /* the op table (compiler/codegen/table.py) */')
    if len(constants) >= blob.MIN_VALUES:
        return '\n'.join(out + _constants_blob(lay, constants) + ['}\n'])
    if constants:
        at = [lay.shared_index(s) for s in constants]
        # (tcc takes INFINITY and NAN for no constants in a static table: set them after it)
        values = [c_double(v if math.isfinite(v) else 0.0) for v in constants.values()]
        table = [', '.join(values[i:i + 6]) for i in range(0, len(values), 6)]
        out += [f'    static const double value[{len(values)}] = {{', *[f'        {line},' for line in table], '    };']
        if at == list(range(at[0], at[0] + len(at))):
            out.append(f'    memcpy(p + {at[0]}, value, sizeof value);')
        else:
            out += [f'    static const int at[{len(at)}] = {{{", ".join(map(str, at))}}};',
                    f'    for (int i = 0; i < {len(at)}; i++) p[at[i]] = value[i];']
        out += [f'    p[{i}] = {c_double(v)};' for i, v in zip(at, constants.values()) if not math.isfinite(v)]
    return '\n'.join(out + ['    (void)p;\n}\n'])


def _constants_blob(lay, constants):
    """``init_constants``' body for many constants: their doubles (bit for
    bit, NaN and infinities too) and their places as blobs."""
    at = -1 - lay.loc[np.fromiter(constants, dtype=np.int64, count=len(constants))]
    values = np.fromiter(constants.values(), dtype=np.float64, count=len(constants))
    n = len(values)
    return ['    ' + line for line in [
        blob.literal('value_hex', blob.little_endian(values, 'double')),
        blob.literal('at_hex', blob.little_endian(at, 'int')),
        f'static double value[{n}];', f'static int at[{n}];',
        blob.unpack_statement('value_hex', 'value', 'double', n),
        blob.unpack_statement('at_hex', 'at', 'int', n),
        f'for (int i = 0; i < {n}; i++) p[at[i]] = value[i];']]


def _weight_packs(blocks, param_span):
    """``pack_weights`` and the places ``optimizer.c`` deals a step's work
    by (``WEIGHT_SPANS``, ``OTHER_SPANS``): each weight block's place in p
    with its packs (``MatVecs.packs``), heaviest first, and the parameters
    outside every block (with the padding between blocks), so that a thread
    can step a block's parameters and pack them while they are in its
    cache. Returns (C lines, weight spans, other spans)."""
    blocks = sorted(blocks, key=lambda block: -block[1])
    taken = sorted(span for span, _, _ in blocks)
    assert all(a[1] <= b[0] for a, b in zip(taken, taken[1:])) and (not taken or taken[-1][1] <= param_span)
    others, at = [], 0
    for lo, hi in taken + [(param_span, param_span)]:
        if at < lo:
            others.append((at, lo))
        at = hi
    out = ['/* the packed copies of weight block i (WEIGHT_SPANS[i], heaviest first) from its part of p alone:',
           ' * the forward\'s (and the flag "all finite"; finite: whether all of that part is finite, 1 or 0;',
           ' * -1 not known: checked here), then the input gradient\'s */']
    for name, params, pick in (('pack_weights_fwd', ', int finite', lambda st: st[:1]),
                               ('pack_weights_bgx', '', lambda st: st[1:])):
        out.append(f'static void\n{name}(const double *restrict p, double *restrict aux, int i{params})\n{{')
        cases = [(i, pick(statements)) for i, (_, _, statements) in enumerate(blocks) if pick(statements)]
        if cases:
            out += ['    switch (i) {']
            for i, statements in cases:
                out += [f'    case {i}:'] + [f'        {statement}' for statement in statements] + ['        break;']
            out += ['    }']
        out += [f'    (void)p; (void)aux; (void)i;{" (void)finite;" if params else ""}\n}}\n']
    out += ['static void\npack_weights(const double *restrict p, double *restrict aux, int i, int finite)\n{',
            '    pack_weights_fwd(p, aux, i, finite);', '    pack_weights_bgx(p, aux, i);\n}\n']
    return out, [span for span, _, _ in blocks], others


def _loss_of(layout, program):
    """The C macro of a row's loss."""
    loss = program.loss
    if layout.is_row(loss):
        return f'#define LOSS_OF(row, p) ((row)[{layout.row_index(loss)}])'
    return f'#define LOSS_OF(row, p) ((p)[{layout.shared_index(loss)}])'


def _seed(layout, program):
    """The statement that starts backward: d loss / d loss = 1 (set, as the
    interpreter sets it, not added)."""
    loss = program.loss
    if layout.is_row(loss):
        return f'ROW(b->g, r)[{layout.row_index(loss)}] = 1.0;'
    if program.param_start <= loss < program.param_end:
        return f'b->gp[{layout.shared_index(loss)}] = 1.0;'
    return ';   /* a constant loss: no gradient */'


class _Program:
    """The C of one program: per-row functions of its scalar code, the
    wrappers of its vector ops, and the functions that run them over rows."""

    def __init__(self, program):
        self.program = program
        self.flags = needs_grad(program)
        self.layout = Layout(program, self.flags)
        # (max(1, ...): a loss that is a parameter has rows of nothing)
        self.block = max(1, min(BLOCK_ROWS, BLOCK_BYTES // (16 * max(1, self.layout.row_stride))))
        self.scalar = ScalarRenderer(self.layout)
        self.matvecs = MatVecRenderer(program, self.layout, self.flags, self.block)
        self.matmats = MatMatRenderer(program, self.layout, self.flags, self.matvecs)
        self.convs = ConvRenderer(program, self.layout, self.flags)
        self.functions = _Functions()
        self._tables = 0        # the position loops' tables of moves (rolled.template)
        # a sequence's positions: ops[:cuts[n - 1] + 1] compute the first n
        self.cuts = prefix_cuts(program) if program.prefix_sums else []
        # a large scalar remainder runs from an op table (compiler/codegen/table.py)
        n_scalar = len(self.layout.scalar_part.arrays.code)
        self.table = table.OpTable(program, self.layout, self.flags) \
            if n_scalar >= table.TABLE_MIN_OPS else None
        # what is the same in every row, computed once per change of the
        # parameters (compiler/invariant.py): with recorded contributions, and
        # neither the op table nor MatMat/Conv (whose renderers read the rows)
        self.hoisted = NOTHING
        if self.table is None and self.layout.recorded and \
                not any(type(op) in (MatMat, Conv) for _, op in self.layout.lifted):
            self.hoisted = hoisted(program, self.flags)
            if self.hoisted:
                self.layout.place_hoisted(self.hoisted)

    def _steps(self, indexed_ops, direction):
        """C statements running ``indexed_ops`` ((index, op) pairs, in the
        order to run) over rows r0..r1: runs of scalar ops become per-row
        functions, vector ops calls of their wrappers."""
        if self.table is not None and indexed_ops:
            ends = (indexed_ops[0][0], indexed_ops[-1][0])
            return self._table_steps(min(ends), max(ends) + 1, direction)
        steps, run = [], []

        def flush():
            steps.extend(self._scalar_steps(run, direction == 'forward'))
            run.clear()

        for i, op in indexed_ops:
            if type(op) is MatVec:
                flush()
                steps += self._matvec_step(op, direction == 'forward')
            elif type(op) is MatMat:
                flush()
                steps += self._matmat_step(op, direction == 'forward')
            elif type(op) is Conv:
                flush()
                steps += self.convs.step(op, direction == 'forward')
            else:
                run.append(op)
        flush()
        return steps

    def _scalar_steps(self, run, forward):
        """Calls of per-row functions running ``run`` (scalar ops, ``Sum``,
        ``Dot`` and ``Loop`` ops, in the order to run) in one direction; a function holds
        at most ``loops.LOOPS_PER_FUNCTION`` loops (clang's loop passes slow
        down with the loops of one function)."""
        return [f'for (int r = r0; r < r1; r++) {name}({table.ROW_ARGS[forward]});'
                for name in self._scalar_functions(run, forward)]

    def _scalar_functions(self, run, forward):
        """The names of the per-row functions that run ``run`` in one
        direction, defined (none for a part without gradient statements)."""
        return self._defined(self._statements(run, forward), forward)

    def _statements(self, run, forward):
        """The statements of each per-row function of ``run`` (scalar ops,
        in the order to run) in one direction: ``loops.function_runs``."""
        parts = loops.function_runs(run)
        if forward:
            return [loops.forward_lines(part, self.scalar) for part in parts]
        return [loops.backward_lines(part, self.scalar, self.flags) for part in parts]

    def _defined(self, statements, forward):
        """The names of per-row functions of ``statements`` (one list each),
        defined; none for an empty list (a part without gradients)."""
        kind, params = ('forward', FORWARD_PARAMS) if forward else ('backward', BACKWARD_PARAMS)
        return [self.functions.define(kind, params, lines) for lines in statements if lines]

    def _matvec_step(self, op, forward):
        """The call running a ``MatVec`` in one direction (none backward
        where it has no gradient to pass on)."""
        if forward:
            return [self.matvecs.forward_call(op)]
        return [self.matvecs.backward_call(op)] if id(op) in self.matvecs.has_backward else []

    def _matmat_step(self, op, forward):
        return self.matmats.forward_call(op) if forward else self.matmats.backward_call(op)

    def _table_steps(self, p0, p1, direction):
        """``_steps`` of the ops at positions ``p0..p1-1`` when the scalar ops
        run from the table: a loop call per range of them, found between the
        other ops (few) without visiting each op. The table runs the Sums
        too; consecutive Dots and loops share one function of statements."""
        tab, ops = self.table, dict(self.layout.lifted)      # the other ops, by position
        others = tab.others[np.searchsorted(tab.others, p0):np.searchsorted(tab.others, p1)].tolist()
        segments, at = [], p0
        for q in others:
            if q > at:
                segments.append((at, q))
            segments.append(q)
            at = q + 1
        if at < p1:
            segments.append((at, p1))
        forward = direction == 'forward'
        if not forward:
            segments.reverse()
        steps, run, plan = [], [], []

        def flush_run():
            plan.extend((0, 0, name) for name in self._scalar_functions(run, forward))
            run.clear()

        def flush_plan():
            flush_run()
            steps.extend(tab.plan_steps(plan, forward, f'{direction}_plan{len(steps) + 1}'))
            plan.clear()
        for seg in segments:
            if type(seg) is tuple:
                flush_run()
                plan.append((tab.entry(seg[0]), tab.entry(seg[1] - 1) + 1, None))
                continue
            op = ops[seg]
            if type(op) is MatVec:
                flush_plan()
                steps += self._matvec_step(op, forward)
            elif type(op) is MatMat:
                flush_plan()
                steps += self._matmat_step(op, forward)
            elif type(op) is Conv:
                flush_plan()
                steps += self.convs.step(op, forward)
            else:
                run.append(op)
        flush_plan()
        return steps

    def _indexed(self, n):
        """``(index, op)`` of the first ``n`` ops. From the op table only
        the indices are read (``_table_steps``): the ops are not built (a
        million ``Op`` objects cost seconds)."""
        if self.table is not None:
            return list(zip(range(n), itertools.repeat(None)))
        return list(enumerate(self.program.ops[:n]))

    def forward(self):
        """``forward_rows``: every op; a sequence stops after ``b->upto``
        positions, its loss then the mean of theirs."""
        if self.table is not None and not self.cuts:
            return self._table_steps(0, self.program.n_ops, 'forward')
        ops = self._indexed(self.program.n_ops)
        if not self.cuts:
            once = self.hoisted.forward
            return self._copies() + self._steps([(i, op) for i, op in ops if i not in once], 'forward')
        if self.program.position_runs is not None:
            return self._forward_by_runs(ops)
        lay, out, start = self.layout, [], 0
        loss = lay.row_index(self.program.loss)
        for n, cut in enumerate(self.cuts[:-1], 1):
            out += self._steps(ops[start:cut + 1], 'forward')
            s = lay.row_index(self.program.prefix_sums[n - 1])
            out += [f'if (b->upto == {n}) {{   /* the first {n} positions: loss = (1 / {n}) * their sum */',
                    f'    for (int r = r0; r < r1; r++) ROW(b->v, r)[{loss}] = (1.0 / {n}) * ROW(b->v, r)[{s}];',
                    '    return;', '}']
            start = cut + 1
        return out + self._steps(ops[start:], 'forward')

    def backward(self):
        """``backward_rows``: the loss's cone in reverse; a sequence enters at
        position ``b->upto``."""
        if self.table is not None and not self.cuts:
            return self._table_steps(0, self.program.n_grad_ops, 'backward')
        grad_ops = self._indexed(self.program.n_grad_ops)
        if not self.cuts:
            once = self.hoisted.backward
            return self._steps([(i, op) for i, op in reversed(grad_ops) if i not in once], 'backward')
        if self.program.position_runs is not None:
            return self._backward_by_runs(grad_ops)
        lay, T = self.layout, len(self.cuts)
        loss = lay.row_index(self.program.loss)
        sums_at = [lay.row_index(s) for s in self.program.prefix_sums]
        out = [f'static const int prefix[{T}] = {{{", ".join(map(str, sums_at))}}};   /* partial sums */',
               f'if (b->upto < {T})   /* d loss / d sum = 1 / n (the loss is (1 / n) * sum) */',
               f'    for (int r = r0; r < r1; r++) ROW(b->g, r)[prefix[b->upto - 1]] += '
               f'(1.0 / b->upto) * ROW(b->g, r)[{loss}];',
               'switch (b->upto) {']
        bounds = [-1] + self.cuts
        for n in range(T, 0, -1):
            part = grad_ops[bounds[n - 1] + 1:bounds[n] + 1]
            if n == T:
                part += grad_ops[bounds[T] + 1:]      # the final loss op
            out.append(f'case {n}:   /* position {n - 1} */')
            out += ['    ' + step for step in self._steps(list(reversed(part)), 'backward')]
        return out + ['}']

    def _copies(self):
        """Each row's copy of the values computed once that its code reads."""
        copies, lay = self.hoisted.copies, self.layout
        if not copies:
            return []
        at = [lay.row_index(s) for s in copies]
        head = ['for (int r = r0; r < r1; r++) {   /* values computed once per change of the parameters */',
                '    double *restrict v = ROW(b->v, r);',
                f'    const double *restrict once = b->aux + {lay.once_v};']
        if len(at) <= 16:
            return head + [f'    v[{i}] = once[{i}];' for i in at] + ['}']
        return head + [f'    static const int at[{len(at)}] = {{{", ".join(map(str, at))}}};',
                       f'    for (int i = 0; i < {len(at)}; i++) v[at[i]] = once[at[i]];', '}']

    def _once(self):
        """``refresh_aux``'s statements computing what is the same in every
        row on one row of ``aux``: the values (forward), then the gradients
        from the loss's (1.0, as in every row) through the ops whose
        gradient is invariant, in backward order; then the copies of its
        contributions the weight-gradient loops read."""
        h, lay = self.hoisted, self.layout
        if not h:
            return []
        ops = self.program.ops
        forward = loops.forward_lines([ops[i] for i in sorted(h.forward)], self.scalar)
        backward = loops.backward_lines([ops[i] for i in h.template], self.scalar, self.flags)
        lines = [f'{{   /* the same in every row, once: {len(h.forward)} ops forward, {len(h.backward)} backward '
                 '(compiler/invariant.py) */',
                 f'    double *restrict v = aux + {lay.once_v}, *restrict g = aux + {lay.once_g};',
                 f'    memset(v, 0, sizeof(double) * {lay.n_row});',
                 f'    memset(g, 0, sizeof(double) * {lay.row_stride});',
                 '#if defined(HAVE_VECTOR_LEVEL)   /* (the loops of shared_grads._once_weights) */',
                 '    if (once_level < 0)',
                 '        once_level = vector_level();',
                 '#endif',
                 f'    {self.functions.define("forward", FORWARD_PARAMS, forward)}(v, p);',
                 f'    g[{lay.row_index(self.program.loss)}] = 1.0;']
        if backward:
            lines.append(f'    {self.functions.define("backward", BACKWARD_PARAMS, backward)}(v, g, p, NULL);')
        return lines + ['    ' + line for line in self.matvecs.once_packing] + ['}']

    def _once_values(self):
        """``once_values``: the values computed once into a row (the
        debugging view of ``nn_read_data``)."""
        lay = self.layout
        at = sorted(lay.row_index(out) for out in self.program.outs_of(self.hoisted.forward))
        body = [f'static const int at[{len(at)}] = {{{", ".join(map(str, at))}}};',
                f'for (int i = 0; i < {len(at)}; i++) row[at[i]] = aux[{lay.once_v} + at[i]];'] if at else []
        return ['static void\nonce_values(const double *restrict aux, double *restrict row)\n{',
                *['    ' + line for line in body], '    (void)aux; (void)row;\n}\n']

    def _forward_by_runs(self, ops):
        """``forward_rows`` of a sequence scheduled layer by layer
        (``Program.position_runs``): each run of one position's ops when that
        position runs, each op over positions on the positions run; then,
        for fewer positions than all, the loss from their partial sum."""
        lay, T, out = self.layout, len(self.cuts), []
        for group in _position_groups(self.program.position_runs):
            out += self._group_steps([ops[start:end] for start, end, _ in group], group[0][2], True)
        loss = lay.row_index(self.program.loss)
        sums_at = [lay.row_index(s) for s in self.program.prefix_sums]
        return out + [f'if (b->upto < {T}) {{   /* the first n positions: loss = (1 / n) * their sum */',
                      f'    static const int prefix[{T}] = {{{", ".join(map(str, sums_at))}}};',
                      '    for (int r = r0; r < r1; r++)',
                      f'        ROW(b->v, r)[{loss}] = (1.0 / b->upto) * ROW(b->v, r)[prefix[b->upto - 1]];', '}']

    def _backward_by_runs(self, grad_ops):
        """``backward_rows`` of a sequence scheduled layer by layer: the runs in
        reverse, each when its position ran."""
        lay, T = self.layout, len(self.cuts)
        loss = lay.row_index(self.program.loss)
        sums_at = [lay.row_index(s) for s in self.program.prefix_sums]
        out = [f'static const int prefix[{T}] = {{{", ".join(map(str, sums_at))}}};   /* partial sums */',
               f'if (b->upto < {T})   /* d loss / d sum = 1 / n (the loss is (1 / n) * sum) */',
               f'    for (int r = r0; r < r1; r++) ROW(b->g, r)[prefix[b->upto - 1]] += '
               f'(1.0 / b->upto) * ROW(b->g, r)[{loss}];']
        for group in reversed(_position_groups(self.program.position_runs)):
            out += self._group_steps([list(reversed(grad_ops[start:end])) for start, end, _ in group],
                                     group[0][2], False)
        return out

    def _group_steps(self, runs, p0, forward):
        """The steps of ``runs``, the runs of positions ``p0``, ``p0 + 1``, ...
        (each its ops in the order to run; a ``MatMat``'s run alone, ``p0``
        -1): where consecutive positions' C is the same function of the
        position (compiler/codegen/rolled.py), one loop over them; each other
        run when its position runs. Backward (``forward`` False), the last
        position first."""
        direction, pos = ('forward' if forward else 'backward'), rolled.POS
        kind, params = ('forward', FORWARD_PARAMS) if forward else ('backward', BACKWARD_PARAMS)
        with_pos = (params[0] + f', int {pos}', params[1] + f', {pos}')   # the functions of a stretch
        statements = self._scalar_statements(runs, forward)
        if statements is None:          # (a MatMat's run is a group alone: p0 -1 guards nothing)
            pieces = [_when_position(p0 + i, self._steps(run, direction)) for i, run in enumerate(runs)]
            return [step for steps in (pieces if forward else reversed(pieces)) for step in steps]
        pieces = []         # the steps of each stretch of positions, in position order
        for first, last, bodies in self._stretches(statements, p0):
            if bodies is None:          # a position alone
                pieces.append(_when_position(p0 + first, [
                    f'for (int r = r0; r < r1; r++) {name}({table.ROW_ARGS[forward]});'
                    for name in self._defined(statements[first], forward)]))
                continue
            a, b = p0 + first, p0 + last
            calls = [f'    for (int r = r0; r < r1; r++) {self.functions.define(kind, with_pos, body, decls)}'
                     f'({table.ROW_ARGS[forward]}, {pos});' for body, decls in bodies]
            if forward:
                head = f'for (int {pos} = {a}; {pos} <= {b} && {pos} < b->upto; {pos}++) {{'
            else:
                head = f'for (int {pos} = (b->upto <= {b} ? b->upto - 1 : {b}); {pos} >= {a}; {pos}--) {{'
            pieces.append([head + f'   /* positions {a}..{b} */', *calls, '}'])
        return [step for steps in (pieces if forward else reversed(pieces)) for step in steps]

    def _scalar_statements(self, runs, forward):
        """``statements[t][j]``: the statements of run ``t``'s ``j``-th
        function (``loops.function_runs``), when there are two or more runs
        of scalar ops only, outside the op table, each function within one
        chunk; else None."""
        if len(runs) < 2 or self.table is not None or \
                any(type(op) in (MatVec, MatMat, Conv) for run in runs for _, op in run):
            return None
        statements = [self._statements([op for _, op in run], forward) for run in runs]
        if any(len(lines) > CHUNK for functions in statements for lines in functions):
            return None
        return statements

    def _stretches(self, statements, p0):
        """The runs (of positions ``p0``, ``p0 + 1``, ...) as stretches
        ``(first, last, bodies)`` of consecutive runs whose C differs in its
        integers only: ``bodies`` the stretch's functions of the position,
        ``(statements, table declarations)`` each (rolled.template); None
        for a run alone."""
        splits = [[rolled.split(_JOIN.join(lines)) for lines in functions] for functions in statements]
        shapes = [[pieces for pieces, _ in functions] for functions in splits]
        stretches, first = [], 0
        for i in range(1, len(splits) + 1):
            if i < len(splits) and shapes[i] == shapes[first]:
                continue
            bodies = [rolled.template([t[j] for t in splits[first:i]], p0 + first, self._table_name)
                      for j in range(len(splits[first])) if statements[first][j]] if i - first >= 2 else [None]
            if None in bodies:          # one position, or a loop's table of places that moves
                stretches += [(k, k, None) for k in range(first, i)]
            else:
                stretches.append((first, i - 1, [(body.split(_JOIN), decls) for body, decls in bodies]))
            first = i
        return stretches

    def _table_name(self, _):
        """A new name for a table of a position loop's moves."""
        self._tables += 1
        return f'pos_moves{self._tables}'

    def param_grads(self):
        """``param_grads``: this part's share of the parameter gradients
        added up over a block's rows, in row order (and, within a row, in
        backward order)."""
        lay = self.layout
        out = ['static void\nparam_grads(const Block *b, int rows, int part, int parts, void *scratch)\n{']
        out += ['    ' + call for call in self.matvecs.weight_grad_calls() + self.matmats.weight_grad_calls()]
        out += ['    ' + call for call in self.convs.weight_grad_calls()]
        uses = {s: u for s, u in lay.param_uses.items() if s not in self.matvecs.mixed_params}
        if uses:
            params = list(uses)
            starts, flat = [0], []
            for slot in params:
                flat += uses[slot]
                starts.append(len(flat))
            # a contribution computed once (lay.once_uses) is read from aux, the same in every row
            once = [int(u in lay.once_uses) for u in flat]
            add = 'a += (once[k] ? t : g)[use[k]];' if any(once) else 'a += g[use[k]];'
            out += ['    /* contributions scalar code recorded in each row */',
                    f'    static const int param[] = {{{", ".join(str(lay.shared_index(s)) for s in params)}}};',
                    f'    static const int start[] = {{{", ".join(map(str, starts))}}};',
                    f'    static const int use[] = {{{", ".join(str(lay.n_row + u) for u in flat)}}};',
                    *([f'    static const char once[] = {{{", ".join(map(str, once))}}};',
                       f'    const double *restrict t = b->aux + {lay.once_g};'] if any(once) else []),
                    f'    const int i0 = {len(params)} * part / parts, i1 = {len(params)} * (part + 1) / parts;',
                    '    for (int i = i0; i < i1; i++) {',
                    '        double a = b->gp[param[i]];',
                    '        for (int r = 0; r < rows; r++) {',
                    '            const double *restrict g = ROW(b->g, r);',
                    f'            for (int k = start[i]; k < start[i + 1]; k++) {add}',
                    '        }',
                    '        b->gp[param[i]] = a;',
                    '    }']
        out += ['    (void)b; (void)rows; (void)part; (void)parts; (void)scratch;\n}\n']
        return out

    def emit(self):
        """The C of the program, and the numbers the template needs."""
        program, lay = self.program, self.layout
        out = [_loss_of(lay, program), '']
        if self.table is not None or len(program.constants) >= blob.MIN_VALUES:
            out.append(blob.UNPACK_C)
        if self.table is not None:
            out.append(self.table.c_text())
        out.append(_init_constants(lay, program.constants, table=self.table is not None))
        if self.hoisted:
            out.append(shared_grads.ONCE_VECTORS_C)
        out += self.matvecs.functions(inside=self.matmats.inside())
        out += self.matmats.functions()
        out += self.convs.functions()
        once = self._once()
        forward, backward = self.forward(), self.backward()
        out += self.functions.prototypes
        packs, weight_spans, other_spans = _weight_packs(self.matvecs.packs(), lay.param_span)
        out += packs
        block_at = {span[0]: i for i, span in enumerate(weight_spans)}
        out.append(self.matmats.pipeline_functions(lambda wt0: block_at[lay.weight_base[wt0]]))
        fixed, each = self.matvecs.refresh()
        out += ['', 'static void\ninit_aux(const double *restrict p, double *restrict aux)\n{']
        out += ['    ' + line for line in fixed]
        out += ['    (void)p; (void)aux;\n}\n']
        out += ['', 'static void\nrefresh_rest(const double *restrict p, double *restrict aux)\n{']
        out += ['    ' + line for line in each + once]
        out += ['    (void)p; (void)aux;\n}\n']
        out += self._once_values()
        if not lay.recorded:
            # scalar code adds to parameter gradients directly: a row's whole
            # backward before the next row's, so that each gradient gets its
            # contributions in row order
            backward = ['for (int row = r0; row < r1; row++) {', '    const int r0 = row, r1 = row + 1;',
                        *['    ' + s for s in backward], '}']
        out += ['static void\nforward_rows(const Block *b, int r0, int r1, void *scratch)\n{']
        out += ['    ' + s for s in forward]
        out += ['    (void)b; (void)r0; (void)r1; (void)scratch;\n}\n',
                'static void\nbackward_rows(const Block *b, int r0, int r1, void *scratch)\n{',
                f'    for (int r = r0; r < r1; r++) {_seed(lay, program)}']
        out += ['    ' + s for s in backward]
        out += ['    (void)b; (void)r0; (void)r1; (void)scratch;\n}\n']
        out += self.param_grads()
        work = 3 * len(lay.scalar_part.arrays.code) + sum(
            6 * op.rows * op.cols if type(op) is MatVec else 6 * op.macs if type(op) is Conv else loops.work(op)
            for _, op in lay.lifted for op in unfolded([op]))
        numbers = dict(n_shared=lay.n_shared, param_span=lay.param_span, n_aux=lay.n_aux,
                       row_values=lay.n_row, row_stride=lay.row_stride, block_rows=self.block,
                       # every contribution a row records is written in every row (no sequence):
                       # only the gradients before them need zeroes
                       row_zero=lay.n_row if self.hoisted else lay.row_stride,
                       recorded=int(lay.recorded), scratch_bytes=max(64, self.matvecs.scratch_bytes(),
                                                                self.convs.scratch_bytes()),
                       work_per_row=max(1, work), positions=len(self.cuts),
                       weight_spans=weight_spans, other_spans=other_spans,
                       pipelined=len(self.matmats.pipelined))
        return '\n'.join(out), numbers


# joins a function's statements into one text for rolled.template (no C holds it)
_JOIN = '\x00'


def _position_groups(runs):
    """``Program.position_runs`` cut into groups of runs of consecutive
    positions from 0 (one stage's scalar code, position by position); a
    ``MatMat``'s run (position -1) and any other run make a group alone."""
    groups = []
    for run in runs:
        p = run[2]
        if groups and p > 0 and groups[-1][-1][2] == p - 1:
            groups[-1].append(run)
        else:
            groups.append([run])
    return groups


def _when_position(p, steps):
    """``steps`` guarded to run when position ``p`` does (``p < 0``: an op over
    positions, which runs the positions itself)."""
    if p < 0 or not steps:
        return steps
    return [f'if (b->upto > {p}) {{', *['    ' + s for s in steps], '}']
