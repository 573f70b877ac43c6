"""The C of the gradients of weights that scalar code reads too.

A ``MatVec``'s weights (and parameter heads) may also be read by scalar
code: an L2 regulariser ``alpha * sum(p * p)``, a weight tied into another
place, a second use of the matrix as scalar products. The interpreter adds
each row's contributions to such a weight's gradient in that row's backward
order, row after row (``micrograd.engine.topological_order`` reversed); the
compiled code must add them in the same order. Two cases, by where scalar
code puts its contributions (``Layout.recorded``):

- **recorded** (rows run in parallel, each scalar contribution recorded in
  its row): the block's weight gradient (``interleaved_grad``) walks the
  rows in order and, within a row, adds each parameter's contributions in
  that row's backward order: recorded ones (``g[n_row + u]``) and the
  block's own, ``x * gy`` for a weight (as ``Value.__mul__``'s backward:
  the other operand times the output's gradient), ``gy`` for a head (as
  ``__add__``'s). Parameters whose lists of contributions have the same
  kinds in the same order share one loop, its indices read from tables (or
  computed, where they step evenly).
- **direct** (more contributions than a row records: scalar code adds into
  ``gp``, rows one after another on one thread): the ``MatVec``'s backward
  adds its contributions into ``gp`` at its place in the row's backward
  (``direct_grads``).

Contributions that are the same in every row (``compiler/invariant.py``:
Karpathy's regulariser, whose ``p * g`` are computed once per change of the
parameters) are read from ``aux`` (``'once'``) instead of the row; where
every weight of a block gets the same kinds of contributions, from the same
uses, and no recorded one varies by row, the block's weights are one loop
nest per row over its columns and rows, 8 weights at a time in vectors
(``_once_weights``). The other loops are plain C, slower per multiply-add
than the main weight gradient kernel (``templates/kernels_body.c``), which
handles the blocks whose weights only layers read.
"""
from collections import defaultdict

from compiler.codegen.layout import PANEL, round_up
from compiler.ir import MatVec, Op, Sum, unfolded

# Above this many (parameter group x contribution) lines, one table-driven
# loop serves every parameter instead of a loop per group.
MAX_GROUP_LINES = 2000


def mixed_blocks(program, flags, uses):
    """``{wt0: parameter slots}`` of the weight blocks (with a backward, in
    ``uses``: wt0 -> its ``MatVec`` uses) whose weights or parameter heads
    scalar code also reads in the loss's cone, or whose parameter heads
    several uses share (the main kernels add a head's gradient use by use,
    not row by row): the slots are all the block's weights and parameter
    heads that need a gradient."""
    if not uses:
        return {}
    owner, mixed = {}, set()
    for wt0, ops in uses.items():
        op = ops[0]
        for s in range(wt0, wt0 + op.rows * op.cols):
            owner[s] = wt0
        heads = [h for u in ops for h in u.heads or () if program.param_start <= h < program.param_end]
        for h in heads:
            owner[h] = wt0
        if len(set(heads)) < len(heads) and any(flags[h] for h in heads):
            mixed.add(wt0)
    for op in unfolded(program.grad_ops):
        if type(op) is MatVec:
            continue
        read = {owner[s] for s in op.reads if s in owner}
        if not read or not any(flags[w] for w in op.writes):
            continue
        if read and type(op) not in (Op, Sum):
            # its contributions would go straight into gp, out of each row's order
            raise NotImplementedError(f'{type(op).__name__} reads the weights of a MatVec: its gradient '
                                      'contributions must be recorded per row like scalar code (Layout)')
        mixed.update(read)
    by_block = defaultdict(list)
    for s, wt0 in owner.items():
        if wt0 in mixed and flags[s]:
            by_block[wt0].append(s)
    return {wt0: sorted(slots) for wt0, slots in by_block.items()}


def contributions(program, layout, flags, params, uses):
    """For each parameter of a mixed block, its contributions within one row
    in backward order: ``('rec', u)`` (scalar code's, recorded as
    contribution ``u``; ``('once', u)`` where it is the same in every row,
    computed once: ``Layout.once_uses``), ``('weight', use, n, k)`` and ``('head', use, n)``
    (the block's use ``use``: its row ``n``, column ``k``)."""
    wanted = set(params)
    items = {s: [] for s in params}
    recorded = {s: iter(layout.param_uses.get(s, ())) for s in params}
    backward_uses = {id(u) for u in uses}
    for op in reversed(list(unfolded(program.grad_ops))):
        if type(op) is MatVec:
            if id(op) not in backward_uses:
                continue
            R = op.rows
            for s in range(op.wt0, op.wt0 + R * op.cols):
                if s in wanted:
                    k, n = divmod(s - op.wt0, R)
                    items[s].append(('weight', op, n, k))
            for n, h in enumerate(op.heads or ()):
                if h in wanted:
                    items[h].append(('head', op, n))
        elif type(op) in (Op, Sum) and flags[op.out]:
            # the scalar code's contributions, in the order Layout recorded them
            for i, s in enumerate(op.reads):
                if s in wanted and layout.grad_target(op, i, s)[0] == '=':
                    u = next(recorded[s])
                    items[s].append(('once' if u in layout.once_uses else 'rec', u))
    return items


def _index(name, values):
    """A C expression of ``values[i]``, and the table it needs (or None).
    (Values that step evenly in runs, say a block's weights column by
    column, computed as ``c + a * (i / p) + b * (i % p)``, measured no
    faster than a table here.)"""
    step = values[1] - values[0] if len(values) > 1 else 0
    if all(v == values[0] + i * step for i, v in enumerate(values)):
        return f'{values[0]} + {step} * i' if step else f'{values[0]}', None
    return f'{name}[i]', f'static const int {name}[{len(values)}] = {{{", ".join(map(str, values))}}};'


def interleaved_grad(name, layout, items, params):
    """``{name}_weight_grad``: the gradients of a mixed block's parameters
    over a block's rows, rows in order, each row's contributions in its
    backward order; this part's share of the parameters. Returns its C and
    the ``refresh_aux`` statements it needs (``_once_weights``)."""
    n_row = layout.n_row
    weights, packing, helper, call = _once_weights(name, layout, items, params)
    params = [s for s in params if s not in weights]

    def places(item):
        """(x in the row or None, the gradient read: g index, or once index for 'once')"""
        kind = item[0]
        if kind in ('rec', 'once'):
            return None, n_row + item[1]
        use, n = item[1], item[2]
        y = layout.row_index(use.y0) + n
        return (layout.row_index(use.x0) + item[3], y) if kind == 'weight' else (None, y)
    groups = defaultdict(list)              # the kinds of a parameter's contributions -> its parameters
    for s in params:
        groups[tuple(it[0] for it in items[s])].append(s)
    if sum(len(kinds) for kinds in groups) > MAX_GROUP_LINES:
        groups = None

    tables, body = [], []
    for gi, (kinds, slots) in enumerate((groups or {}).items()):
        label = f'{name}_g{gi}'
        expr, table = _index(f'{label}_p', [layout.shared_index(s) for s in slots])
        tables += [table] if table else []
        lines = [f'double a = gp[{expr}];']
        for j, kind in enumerate(kinds):
            x_at, g_at = zip(*(places(items[s][j]) for s in slots))
            g_expr, table = _index(f'{label}_g{j}', list(g_at))
            tables += [table] if table else []
            if kind == 'weight':
                x_expr, table = _index(f'{label}_x{j}', list(x_at))
                tables += [table] if table else []
                lines.append(f'a += v[{x_expr}] * g[{g_expr}];')
            elif kind == 'once':
                lines.append(f'a += once[{g_expr}];')
            else:
                lines.append(f'a += g[{g_expr}];')
        lines.append(f'gp[{expr}] = a;')
        N = len(slots)
        what = ', '.join(k if k != 'rec' else 'recorded' for k in kinds[:6]) + (', ...' if len(kinds) > 6 else '')
        body += [f'/* {N} parameters, each: {what} */',
                 f'for (int i = {N} * part / parts; i < {N} * (part + 1) / parts; i++) {{',
                 *['    ' + line for line in lines], '}']
    if groups is None:
        body, tables = _generic_loop(name, layout, items, params, places)
    return '\n'.join([
        *helper,
        f"/* the gradients of {name}'s weights and heads that scalar code also reads: row after row, */",
        "/* each row's contributions in its backward order (compiler/codegen/shared_grads.py) */",
        *tables,
        f'static void\n{name}_weight_grad(const Block *b, int rows, int part, int parts, void *scratch)\n{{',
        '    double *restrict gp = b->gp;',
        *([f'    const double *restrict once = b->aux + {layout.once_g};   /* contributions computed once */']
          if layout.hoisted else []),
        "    for (int r = 0; r < rows; r++) {   /* rows outside: each row's values are read once */",
        '        const double *restrict v = ROW(b->v, r), *restrict g = ROW(b->g, r);',
        *(['        ' + call] if call else []),
        *['        ' + line for line in body],
        '        (void)v;',
        '    }',
        '    (void)scratch;' + (' (void)once;' if layout.hoisted else ''),
        '}']), packing


# The vectors of the weight loops of ``_once_weights`` (before the first of them).
ONCE_VECTORS_C = """\
#if defined(HAVE_VECTOR_LEVEL)
typedef double ONCE_V __attribute__((vector_size(64), aligned(8)));   /* 8 doubles, any alignment */
static int once_level = -1;       /* vector_level(): set by refresh_aux, at nn_init, before any thread reads it */
#endif"""


def _once_weights(name, layout, items, params):
    """A weight block whose every weight gets, in each row, the same kinds
    of contributions from the same uses, each either computed once
    (``'once'``) or the block's own (``x gy``): Karpathy's regulariser
    beside the layer. Then its weights' gradients are one loop nest over
    the columns and the rows of the block, contiguous (vectorizable), the
    contributions computed once copied by ``refresh_aux`` into arrays laid
    out as the weights (``packing``). Returns ``(weight slots, packing,
    helper function, its call in a row)``, or no weights."""
    none = (frozenset(), [], [], None)
    first = next((it for s in params for it in items[s] if it[0] == 'weight'), None)
    if first is None or not layout.hoisted:
        return none
    wt0, R, C = first[1].wt0, first[1].rows, first[1].cols
    weights = range(wt0, wt0 + R * C)
    kinds = [it[0] for it in items[wt0]]
    if 'once' not in kinds or 'rec' in kinds or not set(weights) <= set(params):
        return none
    for s in weights:
        its = items[s]
        if [it[0] for it in its] != kinds or any(
                it[0] == 'weight' and it[1] is not items[wt0][j][1] for j, it in enumerate(its)):
            return none
    RP, base = round_up(R, PANEL), layout.weight_base[wt0]
    packing, terms, sources = [f'/* {name}: contributions computed once, laid out as its weights */'], [], []
    for j, kind in enumerate(kinds):
        if kind == 'once':
            at = layout.reserve_aux(C * RP)
            src = [layout.n_row + items[wt0 + k * R + n][j][1] for k in range(C) for n in range(R)]
            packing += ['{', f'    static const int at[{R * C}] = {{{", ".join(map(str, src))}}};',
                        f'    for (int k = 0; k < {C}; k++)',
                        f'        for (int n = 0; n < {R}; n++)',
                        f'            aux[{at} + k * {RP} + n] = g[at[k * {R} + n]];', '}']
            terms.append(('aux', f'{at} + k * {RP} + n'))
        else:
            use = items[wt0][j][1]
            sources.append(f'const double x{j} = v[{layout.row_index(use.x0)} + k];')
            terms.append((f'x{j}', f'{layout.row_index(use.y0)} + n'))

    def body(vector):
        """The loop nest: 8 weights at a time in GCC vectors (``ONCE_V``), or one."""
        T, step = ('ONCE_V', 8) if vector else ('double', 1)

        def at(array, index):
            cast = '(ONCE_V *)' if array == 'gp' else '(const ONCE_V *)'
            return f'*{cast}({array} + {index})' if vector else f'{array}[{index}]'
        lines = [f'{T} a = {at("gp", f"{base} + k * {RP} + n")};']
        for x, index in terms:
            lines.append(f'a += {at("aux", index)};' if x == 'aux' else f'a += {x} * {at("g", index)};')
        lines.append(f'{at("gp", f"{base} + k * {RP} + n")} = a;')
        bound = f'n + 8 <= {R}' if vector else f'n < {R}'
        return [f'for (n = 0; {bound}; n += {step}) {{', *['    ' + line for line in lines], '}']
    params = ('double *restrict gp, const double *restrict aux, const double *restrict v, '
              'const double *restrict g, int k0, int k1')

    def function(suffix, target, vector):
        return [*([f'__attribute__((target("{target}")))'] if target else []),
                f'static void\n{name}_once_row{suffix}({params})\n{{',
                '    for (int k = k0; k < k1; k++) {', *['        ' + line for line in sources],
                '        int n;', *['        ' + line for line in (body(True) if vector else [])],
                *['        ' + line for line in (['for (; n < %d; n++) {' % R] + body(False)[1:] if vector
                                                   else body(False))],
                '    }', '}']
    helper = [f"/* one row's contributions to the gradients of {name}'s weights W[n][k], k0 <= k < k1, in the",
              " * row's backward order: computed once (aux) or x gy; each weight's gradient its own,",
              " * so 8 of them at a time in vectors where the compiler has them */",
              '#if defined(HAVE_VECTOR_LEVEL)',
              *function('_avx512', 'avx512f', True), *function('_avx2', 'avx2', True),
              *function('_base', None, True),
              f'#define {name}_once_row(...) (once_level == 2 ? {name}_once_row_avx512(__VA_ARGS__) : '
              f'once_level == 1 ? {name}_once_row_avx2(__VA_ARGS__) : {name}_once_row_base(__VA_ARGS__))',
              '#else', *function('', None, False), '#endif', '']
    call = f'{name}_once_row(gp, b->aux, v, g, {C} * part / parts, {C} * (part + 1) / parts);'
    return frozenset(weights), packing, helper, call


def _generic_loop(name, layout, items, params, places):
    """One loop over every parameter, its contributions from tables
    (``0 <= item < ROW_STRIDE``: ``g[item]``; from ``ROW_STRIDE``: computed
    once, ``once[item - ROW_STRIDE]``; else term ``-1 - item``: ``x`` (-1: a
    head) and ``gy``)."""
    terms, where, codes, starts = [], {}, [], [0]
    for s in params:
        for item in items[s]:
            x, g = places(item)
            if item[0] in ('rec', 'once'):
                codes.append(g if item[0] == 'rec' else layout.row_stride + g)
                continue
            key = (-1 if x is None else x, g)
            if key not in where:
                where[key] = len(terms)
                terms.append(key)
            codes.append(-1 - where[key])
        starts.append(len(codes))

    def table(label, values):
        return f'static const int {name}_{label}[{max(1, len(values))}] = {{{", ".join(map(str, values or [0]))}}};'
    P = len(params)
    tables = [table('mix_param', [layout.shared_index(s) for s in params]), table('mix_start', starts),
              table('mix_item', codes), table('mix_x', [t[0] for t in terms]), table('mix_gy', [t[1] for t in terms])]
    body = [f'for (int i = {P} * part / parts; i < {P} * (part + 1) / parts; i++) {{',
            f'    double a = gp[{name}_mix_param[i]];',
            f'    for (int k = {name}_mix_start[i]; k < {name}_mix_start[i + 1]; k++) {{',
            f'        const int t = {name}_mix_item[k];',
            '        if (t >= 0)   /* recorded: in the row, or (from ROW_STRIDE) computed once */',
            f'            a += t < {layout.row_stride} ? g[t] : once[t - {layout.row_stride}];',
            f'        else if ({name}_mix_x[-1 - t] >= 0)',
            f'            a += v[{name}_mix_x[-1 - t]] * g[{name}_mix_gy[-1 - t]];',
            '        else',
            f'            a += g[{name}_mix_gy[-1 - t]];',
            '    }',
            f'    gp[{name}_mix_param[i]] = a;',
            '}']
    return body, tables


def direct_grads(layout, flags, op):
    """Per row, ``op``'s contributions to the gradients of its weights and
    parameter heads, added into ``gp`` at its place in the row's backward
    (rows run one after another, and scalar code adds there too)."""
    R, C, RP = op.rows, op.cols, round_up(op.rows, PANEL)
    x, y = layout.row_index(op.x0), layout.row_index(op.y0)
    lines = ["    for (int r = r0; r < r1; r++) {   /* d W += x gy, in the row's backward order */",
             '        const double *restrict v = ROW(b->v, r), *restrict g = ROW(b->g, r);',
             '        double *restrict gw = b->gp;']
    if flags[op.wt0]:
        lines += [f'        for (int k = 0; k < {C}; k++)',
                  f'            for (int n = 0; n < {R}; n++)',
                  f'                gw[{layout.weight_base[op.wt0]} + k * {RP} + n] += v[{x} + k] * g[{y} + n];']
    for n, h in enumerate(op.heads or ()):
        if not layout.is_row(h) and flags[h]:
            lines.append(f'        gw[{layout.shared_index(h)}] += g[{y + n}];')
    return lines + ['        (void)v; (void)gw;', '    }']
