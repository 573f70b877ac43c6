"""Ops that ``compiler/vectorize.py`` lifts out of scalar code, and their C.

Both keep the interpreter's order of floating-point operations, so their
results equal the scalar program's bit for bit:

- ``Sum``: ``t0 + t1 + ... + tn``, a left fold, as a chain of ``+`` nodes is.
- ``MatVec``: ``y[r] = h[r] + W[r][0]*x[0] + ... + W[r][C-1]*x[C-1]`` for every
  row ``r``, each row summed left to right in column order, as the ``+`` chain
  of a neuron is. The forward loop runs over columns outside and rows inside,
  reading a transposed copy of ``W`` kept in ``aux``, so that the C compiler
  vectorizes across independent rows and never reassociates one row's sum.
"""
from dataclasses import dataclass

# Terms per C statement of a long Sum: keeps expression trees shallow.
TERMS_PER_LINE = 32
# Rows whose running sums a forward loop keeps in registers at once.
ROW_BLOCK = 16
# Widest x for which the weight-gradient loop lists x's nonzeros on the stack.
SPARSE_MAX_COLS = 16384


@dataclass(eq=False)
class Sum:
    out: int
    terms: list

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


@dataclass(eq=False)
class MatVec:
    """``y[0:R] = heads + W x``.

    ``W[r][c]`` is slot ``w0 + r * ldw + c`` (a parameter), ``x[c]`` is slot
    ``x0 + c``, ``y[r]`` slot ``y0 + r``. ``heads[r]`` is the slot row ``r``'s
    sum starts from (a bias), or ``heads`` is ``None`` when each row starts
    with its first product. ``bwd_rows`` is the order in which the
    interpreter's backward pass reaches the rows, which decides the order of
    the contributions to ``grad x``. The transposed copy of ``W`` lives at
    ``aux[aux0:aux0 + R*C]``.
    """
    y0: int
    rows: int
    cols: int
    w0: int
    ldw: int
    x0: int
    heads: list
    bwd_rows: list
    aux0: int = 0

    @property
    def aux_size(self):
        return self.rows * self.cols + 1     # W transposed, then "W is finite"

    @property
    def reads(self):
        w = [self.w0 + r * self.ldw + c for r in range(self.rows) for c in range(self.cols)]
        return w + list(range(self.x0, self.x0 + self.cols)) + list(self.heads or ())

    @property
    def writes(self):
        return range(self.y0, self.y0 + self.rows)

    def __str__(self):
        heads = f', heads={_slot_list(self.heads)}' if self.heads else ''
        ys = f'%{self.y0}' if self.rows == 1 else f'%{self.y0}..%{self.y0 + self.rows - 1}'
        return (f'{ys} = matvec('
                f'W=%{self.w0}[{self.rows}x{self.cols}, ld {self.ldw}], '
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
        lines = [f'{{   /* {self}: each row summed in column order */',
                 f'    double *restrict y = data + {self.y0};',
                 f'    const double *restrict x = data + {self.x0};',
                 f'    const double *restrict wt = aux + {self.aux0};   /* wt[c * {R} + r] = W[r][c] */']
        c0 = 0
        strided = self.heads and self._strided_heads()
        if strided:
            lines.append(f'    for (Py_ssize_t r = 0; r < {R}; r++) y[r] = data[{strided[0]} + r * {strided[1]}];')
        elif self.heads:
            lines += [f'    y[{r}] = {em.d(h)};' for r, h in enumerate(self.heads)]
        else:
            lines.append(f'    for (Py_ssize_t r = 0; r < {R}; r++) y[r] = wt[r] * x[0];')
            c0 = 1
        if C <= SPARSE_MAX_COLS:
            # Columns where x[c] == 0 add w * x[c], a signed zero when w is
            # finite, and y + (±0) == y unless y is -0.0. A sum never becomes
            # -0.0 from a value that is not -0.0, so while every W entry is
            # finite and no row starts at -0.0, skipping those columns leaves
            # every row's sum exactly as it is.
            lines += [f'    Py_ssize_t cols[{C}], n = 0;',
                      f'    int skip_zeros = aux[{self.aux0 + R * C}] != 0.0;   /* every W entry is finite */',
                      f'    for (Py_ssize_t r = 0; r < {R} && skip_zeros; r++)',
                      '        if (y[r] == 0.0 && signbit(y[r])) skip_zeros = 0;',
                      f'    for (Py_ssize_t c = {c0}; c < {C}; c++)',
                      '        if (!skip_zeros || x[c] != 0.0) cols[n++] = c;']
            columns = ['for (Py_ssize_t k = 0; k < n; k++) {', '    const Py_ssize_t c = cols[k];']
        else:
            columns = [f'for (Py_ssize_t c = {c0}; c < {C}; c++) {{']
        B = ROW_BLOCK
        full = R - R % B if B else 0
        if full:
            # blocks of B rows: their partial sums stay in registers across all columns
            lines += [f'    for (Py_ssize_t r0 = 0; r0 < {full}; r0 += {B}) {{',
                      f'        double acc[{B}];',
                      f'        for (int k = 0; k < {B}; k++) acc[k] = y[r0 + k];',
                      *['        ' + s for s in columns],
                      '            const double xc = x[c];',
                      f'            const double *restrict w = wt + c * {R} + r0;',
                      f'            for (int i = 0; i < {B}; i++) acc[i] += w[i] * xc;',
                      '        }',
                      f'        for (int k = 0; k < {B}; k++) y[r0 + k] = acc[k];',
                      '    }']
        if full < R:
            lines += [*['    ' + s for s in columns],
                      '        const double xc = x[c];',
                      f'        const double *restrict w = wt + c * {R};',
                      f'        for (Py_ssize_t r = {full}; r < {R}; r++) y[r] += w[r] * xc;',
                      '    }']
        lines.append('}')
        return lines

    def c_backward(self, em, flags):
        C = self.cols
        lines = [f'{{   /* backward of {self} */',
                 f'    const double *restrict gy = grad + {self.y0};',
                 f'    const double *restrict x = data + {self.x0};']
        if flags[self.w0]:
            # dW[r][c] += x[c] * gy[r], the outer product. A term that is a
            # signed zero leaves a parameter gradient unchanged (they start at
            # +0.0, and a sum that does not start at -0.0 never becomes -0.0),
            # so with finite factors the zeros of x and of gy are skipped: a
            # ReLU layer's inactive rows and a digit's blank pixels.
            dense = f'for (Py_ssize_t c = 0; c < {C}; c++) gw[c] += x[c] * g;'
            if C <= SPARSE_MAX_COLS:
                lines += [f'    Py_ssize_t nz[{C}], n = 0;',
                          f'    double xv[{C}];',
                          '    int x_finite = 1;',
                          f'    for (Py_ssize_t c = 0; c < {C}; c++) {{',
                          '        if (x[c] != 0.0) { nz[n] = c; xv[n++] = x[c]; }',
                          '        if (!isfinite(x[c])) x_finite = 0;',
                          '    }']
                update = ['        if (!isfinite(g) || !x_finite) {',
                          '            ' + dense,
                          '        } else if (g != 0.0) {',
                          '            for (Py_ssize_t k = 0; k < n; k++) gw[nz[k]] += xv[k] * g;',
                          '        }']
            else:
                update = ['        ' + dense]
            lines += [f'    for (Py_ssize_t r = 0; r < {self.rows}; r++) {{',
                      '        const double g = gy[r];',
                      f'        double *restrict gw = grad + {self.w0} + r * {self.ldw};',
                      *update,
                      '    }']
        if self.heads:
            strided = self._strided_heads()
            if strided and all(flags[h] for h in self.heads):
                lines.append(f'    for (Py_ssize_t r = 0; r < {self.rows}; r++) '
                             f'grad[{strided[0]} + r * {strided[1]}] += gy[r];')
            else:
                lines += [f'    grad[{h}] += gy[{r}];' for r, h in enumerate(self.heads) if flags[h]]
        if flags[self.x0]:
            lines += ["    /* dx[c] += W[r][c] * gy[r], rows in the interpreter's order */",
                      f'    double *restrict gx = grad + {self.x0};',
                      *_row_loop(self.bwd_rows),
                      '        const double g = gy[r];',
                      f'        const double *restrict w = data + {self.w0} + r * {self.ldw};',
                      f'        for (Py_ssize_t c = 0; c < {C}; c++) gx[c] += w[c] * g;',
                      '    }']
        lines.append('}')
        return lines

    def c_refresh_aux(self):
        R, C = self.rows, self.cols
        return [f'aux[{self.aux0 + R * C}] = 1.0;   /* W of {self} is finite */',
                f'for (Py_ssize_t r = 0; r < {R}; r++)   /* transpose W */',
                f'    for (Py_ssize_t c = 0; c < {C}; c++) {{',
                f'        const double w = data[{self.w0} + r * {self.ldw} + c];',
                f'        aux[{self.aux0} + c * {R} + r] = w;',
                f'        if (!isfinite(w)) aux[{self.aux0 + R * C}] = 0.0;',
                '    }']


def _row_loop(order):
    """A C loop header binding ``r`` to the rows in ``order``."""
    n = len(order)
    if list(order) == list(range(n - 1, -1, -1)):
        return [f'    for (Py_ssize_t r = {n - 1}; r >= 0; r--) {{']
    if list(order) == list(range(n)):
        return [f'    for (Py_ssize_t r = 0; r < {n}; r++) {{']
    return [f'    static const int order[{n}] = {{{", ".join(map(str, order))}}};',
            f'    for (Py_ssize_t k = 0; k < {n}; k++) {{',
            '        const Py_ssize_t r = order[k];']


def _slot_list(slots):
    if len(slots) > 1 and all(slots[r] == slots[0] + r * (slots[1] - slots[0]) for r in range(len(slots))):
        return f'%{slots[0]}+{slots[1] - slots[0]}r'
    return '[' + ', '.join(f'%{s}' for s in slots) + ']'
