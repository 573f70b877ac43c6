"""C of a ``MatVec`` (``y = heads + W x``): exact loops, each direction a
function of its own (built for several instruction sets, ``LOOPS`` in the
template).

Every loop runs across independent rows (one vector lane per row), never
inside one row's sum, so each row is summed in column order as the
interpreter sums it. ``W`` is stored column by column (``W[r][c]`` at
``wt[c * R + r]``), so a column's weights, and their gradients, are
contiguous. Scratch (compiler/codegen/layout.py): ``aux[aux0]`` says whether
every weight is finite; when the gradient of ``x`` is needed, a row-major
copy of ``W`` follows. Forward lists the columns it added at
``index[index0:]`` and their count at ``index[index0 + cols]``; backward adds
the weight gradients of those columns.

Within ``train_batch``, backward only records them (``place`` is the input
row's place among the ``DEFER_ROWS`` recorded): ``x[c]`` of each listed
column into that column's bucket at ``defer[defer0:]``, with the row's place
in ``index``, and the gradients of ``y`` into ``defer``; ``flush`` then adds
every bucket's contributions to its column of weight gradients in row order,
the column's running sums in registers instead of in memory.
"""
from compiler.constants import DEFER_ROWS, ROW_BLOCK, ZERO_GROUP

LOOPS = True      # loops: functions of their own


def _buckets(op, s):
    """The C declarations of the buckets: counts, row places, values."""
    C, K = op.cols, DEFER_ROWS
    count0 = s.index + C + 1
    return [f'    int *restrict count = index + {count0};   /* rows recorded per column */',
            f'    int *restrict places = index + {count0 + C};   /* places[c * {K} + j]: their places */',
            f'    double *restrict value = defer + {s.defer};   /* value[c * {K} + j]: their x[c] */',
            f'    double *restrict grads = defer + {s.defer + C * K};   /* grads[place * {op.rows} + r]: their gy */']


def forward(op, scalar, s):
    R, C = op.rows, op.cols
    c0 = 0 if op.heads else 1
    lines = [f'{{   /* {op}: each row summed in column order */',
             f'    double *restrict y = data + {op.y0};',
             f'    const double *restrict x = data + {op.x0};',
             f'    const double *restrict wt = data + {op.wt0};   /* wt[c * {R} + r] = W[r][c] */',
             f'    int *restrict cols = index + {s.index};   /* the columns added, for backward too */']
    strided = op.heads and op.strided_heads()
    if strided:
        lines += [f'    const double *restrict h = data + {strided[0]};',
                  f'    for (int r = 0; r < {R}; r++) y[r] = h[{_stride(strided[1])}];']
    elif op.heads:
        lines += [f'    y[{r}] = {scalar.data[h]};' for r, h in enumerate(op.heads)]
    else:
        lines.append(f'    for (int r = 0; r < {R}; r++) y[r] = wt[r] * x[0];')
    # Columns where x[c] == 0 add w * x[c], a signed zero when w is
    # finite, and y + (±0) == y unless y is -0.0. A sum never becomes -0.0
    # from a value that is not -0.0, so while every W entry is finite and
    # no row starts at -0.0, skipping those columns leaves every row's sum
    # exactly as it is.
    G = ZERO_GROUP
    lines += [f'    int skip_zeros = aux[{s.aux}] != 0.0;   /* every W entry is finite */',
              f'    for (int r = 0; r < {R}; r++)',
              '        if (y[r] == 0.0 && signbit(y[r])) skip_zeros = 0;',
              '    int n = 0;']
    if c0:
        lines.append('    cols[n++] = 0;   /* added above */')
    lines += ['    if (skip_zeros) {',
              f'        /* groups of {G} columns: a blank stretch of x costs one test */',
              f'        for (int c = {c0}; c < {C}; c += {G}) {{',
              f'            const int end = c + {G} < {C} ? c + {G} : {C};',
              '            int any = 0;',
              '            for (int j = c; j < end; j++) any |= x[j] != 0.0;',
              '            if (any)',
              '                for (int j = c; j < end; j++) {',
              '                    cols[n] = j;',
              '                    n += x[j] != 0.0;',
              '                }',
              '        }',
              '    } else {',
              f'        for (int c = {c0}; c < {C}; c++) cols[n++] = c;',
              '    }',
              f'    cols[{C}] = n;']
    lines += _row_blocks(R, 'y', f'for (int k = {c0}; k < n; k++)', 'x[cols[k]]', f'wt + cols[k] * {R}')
    lines.append('}')
    return lines


def backward(op, flags, s):
    R, C = op.rows, op.cols
    lines = [f'{{   /* backward of {op} */',
             f'    const double *restrict gy = grad + {op.y0};',
             f'    const double *restrict x = data + {op.x0};']
    if flags[op.wt0]:
        # dW[r][c] += x[c] * gy[r], the outer product: one contribution to
        # each weight. The columns forward skipped have x[c] == 0: while
        # every gy is finite they add signed zeros, which leave a parameter
        # gradient unchanged (they start at +0.0, and a sum that does not
        # start at -0.0 never becomes -0.0). Otherwise every column counts.
        lines += [f'    int *restrict cols = index + {s.index};   /* from forward */',
                  f'    int n = cols[{C}];',
                  f'    for (int r = 0; r < {R}; r++) {{',
                  '        if (!isfinite(gy[r])) {',
                  f'            for (int c = 0; c < {C}; c++) cols[c] = c;',
                  f'            n = cols[{C}] = {C};',
                  '            break;',
                  '        }',
                  '    }',
                  '    if (place < 0) {',
                  '        for (int k = 0; k < n; k++) {',
                  '            const double xc = x[cols[k]];',
                  f'            double *restrict gw = grad + {op.wt0} + cols[k] * {R};',
                  f'            for (int r = 0; r < {R}; r++) gw[r] += xc * gy[r];',
                  '        }',
                  '    } else {   /* train_batch: record for flush */',
                  *['    ' + line for line in _buckets(op, s)],
                  f'        for (int r = 0; r < {R}; r++) grads[place * {R} + r] = gy[r];',
                  '        for (int k = 0; k < n; k++) {',
                  '            const int c = cols[k];',
                  f'            const int j = c * {DEFER_ROWS} + count[c]++;',
                  '            places[j] = place;',
                  '            value[j] = x[c];',
                  '        }',
                  '    }']
    if op.heads:
        strided = op.strided_heads()
        if strided and all(flags[h] for h in op.heads):
            lines += [f'    double *restrict gh = grad + {strided[0]};',
                      f'    for (int r = 0; r < {R}; r++) gh[{_stride(strided[1])}] += gy[r];']
        else:
            lines += [f'    grad[{h}] += gy[{r}];' for r, h in enumerate(op.heads) if flags[h]]
    if op.grad_x:
        lines += ["    /* dx[c] += W[r][c] * gy[r], rows in the interpreter's order, W row by row */",
                  f'    double *restrict gx = grad + {op.x0};',
                  *_row_loop(op.bwd_rows),
                  '        const double g = gy[r];',
                  f'        const double *restrict w = aux + {s.aux + 1} + r * {C};',
                  f'        for (int c = 0; c < {C}; c++) gx[c] += w[c] * g;',
                  '    }']
    lines.append('}')
    return lines


def flush(op, s):
    """Add the recorded weight gradients: each column's, in row order."""
    R, C, K = op.rows, op.cols, DEFER_ROWS
    return [f'{{   /* the recorded weight gradients of {op} */',
            *_buckets(op, s),
            f'    for (int c = 0; c < {C}; c++) {{',
            '        const int m = count[c];',
            '        if (m == 0)',
            '            continue;',
            '        count[c] = 0;',
            f'        double *restrict gw = grad + {op.wt0} + c * {R};',
            f'        const int *restrict at = places + c * {K};',
            f'        const double *restrict xv = value + c * {K};',
            *['    ' + line for line in _row_blocks(R, 'gw', 'for (int j = 0; j < m; j++)', 'xv[j]',
                                                  f'grads + at[j] * {R}')],
            '    }',
            '}']


def refresh_aux(op, s):
    R, C = op.rows, op.cols
    copy = [f'        aux[{s.aux + 1} + r * {C} + c] = w;   /* W row by row */'] if op.grad_x else []
    return [f'aux[{s.aux}] = 1.0;   /* every W entry of {op} is finite */',
            f'for (int c = 0; c < {C}; c++)',
            f'    for (int r = 0; r < {R}; r++) {{',
            f'        const double w = data[{op.wt0} + c * {R} + r];',
            *copy,
            f'        if (!isfinite(w)) aux[{s.aux}] = 0.0;',
            '    }']


def _row_blocks(R, target, loop, factor, vector):
    """``target[r] += vector[r] * factor`` for each item of ``loop``, in order,
    for every row ``r < R``: each row's sum in the loop's order, a block of
    rows at a time, their running sums in registers (independent sums: the C
    compiler vectorizes across them)."""
    def block(r0, size):
        at = '' if r0 == 0 else f'{r0} + '
        return [f'        double acc[{size}];',
                f'        for (int i = 0; i < {size}; i++) acc[i] = {target}[{at}i];',
                f'        {loop} {{',
                f'            const double f = {factor};',
                f'            const double *restrict v = {vector}{"" if r0 == 0 else f" + {r0}"};',
                f'            for (int i = 0; i < {size}; i++) acc[i] += v[i] * f;',
                '        }',
                f'        for (int i = 0; i < {size}; i++) {target}[{at}i] = acc[i];']
    B = ROW_BLOCK
    full = R - R % B
    lines = []
    if full:
        lines += [f'    for (int r0 = 0; r0 < {full}; r0 += {B}) {{', *block('r0', B), '    }']
    if full < R:
        lines += ['    {', *block(full, R - full), '    }']
    return lines


def _stride(stride):
    """The C index of row ``r`` at ``stride``."""
    return 'r' if stride == 1 else f'r * {stride}'


def _row_loop(order):
    """A C loop header binding ``r`` to the rows in ``order``."""
    n = len(order)
    if list(order) == list(range(n - 1, -1, -1)):
        return [f'    for (int r = {n - 1}; r >= 0; r--) {{']
    if list(order) == list(range(n)):
        return [f'    for (int r = 0; r < {n}; r++) {{']
    return [f'    static const int order[{n}] = {{{", ".join(map(str, order))}}};',
            f'    for (int k = 0; k < {n}; k++) {{',
            '        const int r = order[k];']
