"""Ops that ``compiler/vectorize.py`` lifts out of scalar code, and their C.

Both keep the interpreter's order of floating-point operations, so their
results equal the scalar program's bit for bit:

- ``Sum``: ``t0 + t1 + ... + tn``, a left fold, as a chain of ``+`` nodes is.
- ``MatVec``: ``y[r] = h[r] + W[r][0]*x[0] + ... + W[r][C-1]*x[C-1]`` for every
  row ``r``, each row summed left to right in column order, as the ``+`` chain
  of a neuron is. ``W`` is stored column by column, and the forward loop runs
  over columns outside and rows inside, so that the C compiler vectorizes
  across independent rows and never reassociates one row's sum. The weight
  gradients, one contribution each, are added a column at a time.
"""
from dataclasses import dataclass

# Terms per C statement of a long Sum: keeps expression trees shallow.
TERMS_PER_LINE = 32
# Rows whose running sums a loop keeps in registers at once: 8 AVX-512
# registers. Each row's sum is a chain of dependent additions, so the loop is
# only as fast as it has independent rows in flight (benchmarks: 64 trains
# 5-20% faster than 16 with AVX2 and AVX-512).
ROW_BLOCK = 64
# Columns of x tested at once for zeros.
ZERO_GROUP = 8
# Images whose weight gradients train_batch collects before adding them up.
DEFER_IMAGES = 64


@dataclass(eq=False)
class Sum:
    out: int
    terms: list
    loops = False          # straight-line C

    @property
    def reads(self):
        return self.terms

    @property
    def writes(self):
        return (self.out,)

    def __str__(self):
        return f'%{self.out} = sum({", ".join(f"%{t}" for t in self.terms)})'

    def c_forward(self, em):
        lines = []
        for start in range(0, len(self.terms), TERMS_PER_LINE):
            terms = [em.d(t) for t in self.terms[start:start + TERMS_PER_LINE]]
            if start:
                terms.insert(0, f'data[{self.out}]')   # ((acc + t) + t) ...: the same left fold
            lines.append(f'data[{self.out}] = {" + ".join(terms)};' + ('' if start else ' /* sum */'))
        return lines

    def c_backward(self, em, flags):
        # d sum / d t = 1 for every term; a term listed twice gets g twice.
        return [f'grad[{t}] += grad[{self.out}];' for t in reversed(self.terms) if flags[t]]

    def c_refresh_aux(self):
        return []

    def c_flush(self):
        return []


@dataclass(eq=False)
class MatVec:
    """``y[0:R] = heads + W x``.

    ``W`` is stored column by column: ``W[r][c]`` is slot ``wt0 + c * R + r``
    (parameters, permuted into that order by the pass), so that one column's
    weights, and their gradients, are contiguous. ``x[c]`` is slot
    ``x0 + c``, ``y[r]`` slot ``y0 + r``. ``heads[r]`` is the slot row ``r``'s
    sum starts from (a bias), or ``heads`` is ``None`` when each row starts
    with its first product. ``bwd_rows`` is the order in which the
    interpreter's backward pass reaches the rows, which decides the order of
    the contributions to ``grad x``. ``aux[aux0]`` says whether every weight
    is finite; when ``grad_x`` (x needs a gradient), a row-major copy of
    ``W`` follows at ``aux[aux0 + 1:]``. Forward lists the columns it added
    at ``index[index0:]``, their count at ``index[index0 + cols]``, and
    backward adds the weight gradients of those columns.

    Within ``train_batch``, backward only records them (``slot`` is the
    image's place among the ``DEFER_IMAGES`` collected): ``x[c]`` of each
    listed column into that column's bucket at ``defer[defer0:]``, with the
    image's slot in ``index``, and ``gy`` into ``defer``; ``flush`` then adds
    every bucket's contributions to its column of weight gradients in image
    order, the column's running sums in registers instead of in memory.
    """
    y0: int
    rows: int
    cols: int
    wt0: int
    x0: int
    heads: list
    bwd_rows: list
    grad_x: bool
    aux0: int = 0
    index0: int = 0
    defer0: int = 0
    loops = True           # C loops: functions of their own (compiler/codegen.py)

    @property
    def aux_size(self):
        return 1 + (self.rows * self.cols if self.grad_x else 0)

    @property
    def index_size(self):
        """The columns forward added and their count; per column, the
        number of recorded images, and their slots."""
        return self.cols + 1 + self.cols + self.cols * DEFER_IMAGES

    @property
    def defer_size(self):
        """Per column, the recorded ``x[c]``; per image slot, ``gy``."""
        return (self.cols + self.rows) * DEFER_IMAGES

    def _buckets(self):
        """The C declarations of the buckets: counts, image slots, values."""
        C, K = self.cols, DEFER_IMAGES
        count0 = self.index0 + C + 1
        return [f'    int *restrict count = index + {count0};   /* images recorded per column */',
                f'    int *restrict image = index + {count0 + C};   /* image[c * {K} + j]: their slots */',
                f'    double *restrict value = defer + {self.defer0};   /* value[c * {K} + j]: their x[c] */',
                f'    double *restrict grads = defer + {self.defer0 + C * K};   /* grads[slot * {self.rows} + r]: their gy */']

    @property
    def reads(self):
        return (list(range(self.wt0, self.wt0 + self.rows * self.cols))
                + list(range(self.x0, self.x0 + self.cols)) + list(self.heads or ()))

    @property
    def writes(self):
        return range(self.y0, self.y0 + self.rows)

    def __str__(self):
        heads = f', heads={_slot_list(self.heads)}' if self.heads else ''
        ys = f'%{self.y0}' if self.rows == 1 else f'%{self.y0}..%{self.y0 + self.rows - 1}'
        return (f'{ys} = matvec(W=%{self.wt0}[{self.rows}x{self.cols}, by column], '
                f'x=%{self.x0}..%{self.x0 + self.cols - 1}{heads})')

    def _strided_heads(self):
        """``(first, stride)`` when the head slots are in arithmetic progression."""
        h = self.heads
        stride = h[1] - h[0] if len(h) > 1 else 1
        if all(h[r] == h[0] + r * stride for r in range(len(h))):
            return h[0], stride
        return None

    def c_forward(self, em):
        R, C = self.rows, self.cols
        c0 = 0 if self.heads else 1
        lines = [f'{{   /* {self}: each row summed in column order */',
                 f'    double *restrict y = data + {self.y0};',
                 f'    const double *restrict x = data + {self.x0};',
                 f'    const double *restrict wt = data + {self.wt0};   /* wt[c * {R} + r] = W[r][c] */',
                 f'    int *restrict cols = index + {self.index0};   /* the columns added, for backward too */']
        strided = self.heads and self._strided_heads()
        if strided:
            lines += [f'    const double *restrict h = data + {strided[0]};',
                      f'    for (int r = 0; r < {R}; r++) y[r] = h[{_stride(strided[1])}];']
        elif self.heads:
            lines += [f'    y[{r}] = {em.d(h)};' for r, h in enumerate(self.heads)]
        else:
            lines.append(f'    for (int r = 0; r < {R}; r++) y[r] = wt[r] * x[0];')
        # Columns where x[c] == 0 add w * x[c], a signed zero when w is
        # finite, and y + (±0) == y unless y is -0.0. A sum never becomes -0.0
        # from a value that is not -0.0, so while every W entry is finite and
        # no row starts at -0.0, skipping those columns leaves every row's sum
        # exactly as it is.
        G = ZERO_GROUP
        lines += [f'    int skip_zeros = aux[{self.aux0}] != 0.0;   /* every W entry is finite */',
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

    def c_backward(self, em, flags):
        R, C = self.rows, self.cols
        lines = [f'{{   /* backward of {self} */',
                 f'    const double *restrict gy = grad + {self.y0};',
                 f'    const double *restrict x = data + {self.x0};']
        if flags[self.wt0]:
            # dW[r][c] += x[c] * gy[r], the outer product: one contribution to
            # each weight. The columns forward skipped have x[c] == 0: while
            # every gy is finite they add signed zeros, which leave a parameter
            # gradient unchanged (they start at +0.0, and a sum that does not
            # start at -0.0 never becomes -0.0). Otherwise every column counts.
            lines += [f'    int *restrict cols = index + {self.index0};   /* from forward */',
                      f'    int n = cols[{C}];',
                      f'    for (int r = 0; r < {R}; r++) {{',
                      '        if (!isfinite(gy[r])) {',
                      f'            for (int c = 0; c < {C}; c++) cols[c] = c;',
                      f'            n = cols[{C}] = {C};',
                      '            break;',
                      '        }',
                      '    }',
                      '    if (slot < 0) {',
                      '        for (int k = 0; k < n; k++) {',
                      '            const double xc = x[cols[k]];',
                      f'            double *restrict gw = grad + {self.wt0} + cols[k] * {R};',
                      f'            for (int r = 0; r < {R}; r++) gw[r] += xc * gy[r];',
                      '        }',
                      '    } else {   /* train_batch: record for flush */',
                      *['    ' + s for s in self._buckets()],
                      f'        for (int r = 0; r < {R}; r++) grads[slot * {R} + r] = gy[r];',
                      '        for (int k = 0; k < n; k++) {',
                      '            const int c = cols[k];',
                      f'            const int j = c * {DEFER_IMAGES} + count[c]++;',
                      '            image[j] = slot;',
                      '            value[j] = x[c];',
                      '        }',
                      '    }']
        if self.heads:
            strided = self._strided_heads()
            if strided and all(flags[h] for h in self.heads):
                lines += [f'    double *restrict gh = grad + {strided[0]};',
                          f'    for (int r = 0; r < {R}; r++) gh[{_stride(strided[1])}] += gy[r];']
            else:
                lines += [f'    grad[{h}] += gy[{r}];' for r, h in enumerate(self.heads) if flags[h]]
        if self.grad_x:
            lines += ["    /* dx[c] += W[r][c] * gy[r], rows in the interpreter's order, W row by row */",
                      f'    double *restrict gx = grad + {self.x0};',
                      *_row_loop(self.bwd_rows),
                      '        const double g = gy[r];',
                      f'        const double *restrict w = aux + {self.aux0 + 1} + r * {C};',
                      f'        for (int c = 0; c < {C}; c++) gx[c] += w[c] * g;',
                      '    }']
        lines.append('}')
        return lines

    def c_flush(self):
        """Add the recorded weight gradients: each column's, in image order."""
        R, C, K = self.rows, self.cols, DEFER_IMAGES
        return [f'{{   /* the recorded weight gradients of {self} */',
                *self._buckets(),
                f'    for (int c = 0; c < {C}; c++) {{',
                '        const int m = count[c];',
                '        if (m == 0)',
                '            continue;',
                '        count[c] = 0;',
                f'        double *restrict gw = grad + {self.wt0} + c * {R};',
                f'        const int *restrict im = image + c * {K};',
                f'        const double *restrict xv = value + c * {K};',
                *['    ' + s for s in _row_blocks(R, 'gw', 'for (int j = 0; j < m; j++)', 'xv[j]',
                                               f'grads + im[j] * {R}')],
                '    }',
                '}']

    def c_refresh_aux(self):
        R, C = self.rows, self.cols
        copy = [f'        aux[{self.aux0 + 1} + r * {C} + c] = w;   /* W row by row */'] if self.grad_x else []
        return [f'aux[{self.aux0}] = 1.0;   /* every W entry of {self} is finite */',
                f'for (int c = 0; c < {C}; c++)',
                f'    for (int r = 0; r < {R}; r++) {{',
                f'        const double w = data[{self.wt0} + c * {R} + r];',
                *copy,
                f'        if (!isfinite(w)) aux[{self.aux0}] = 0.0;',
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


def _slot_list(slots):
    """``%a..%b`` for a range, ``%a+sr`` for slots ``s`` apart, else each slot."""
    step = slots[1] - slots[0] if len(slots) > 1 else None
    if step and all(s == slots[0] + r * step for r, s in enumerate(slots)):
        return f'%{slots[0]}..%{slots[-1]}' if step == 1 else f'%{slots[0]}+{step}r'
    return '[' + ', '.join(f'%{s}' for s in slots) + ']'
