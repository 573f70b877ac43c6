"""C of the folds, ``Sum`` and ``Dot``: the terms added left to right, as
straight-line code or, where at least ``MIN_RUN`` consecutive terms lie in
arithmetic progression in one array, with a ``for`` over them:
``acc = t0; acc += t1; ...`` is the same left fold, rounding for rounding,
as ``t0 + t1 + ...`` (and ``acc += a * b`` rounds the product, then the
sum: the C is compiled without contraction into FMA). Backward adds the
fold's gradient to each term's, last term first (a term listed twice gets
it twice), as the interpreter reaches them.

The places of terms are ``Place`` values; ``compiler/codegen/loops.py``
renders the folds in a loop's body with places that also move with the
loop's ``i``.
"""
from typing import NamedTuple

from compiler.constants import TERMS_PER_LINE

MIN_RUN = 4         # consecutive terms in progression worth a loop

# Said before every generated loop: clang unrolls each small loop and tries
# to vectorize it, which loops over exp() or a fold cannot gain from (a fold
# may not be reassociated). Without that, microgpt's loops take a sixth less
# compiler time at -O2 (6.1 s -> 5.3 s CPU for the module) for the same step
# time (0.047 ms). gcc and tcc ignore it.
LOOP_HINT = ('#ifdef __clang__', '#pragma clang loop unroll(disable) vectorize(disable)', '#endif')


def loop(header, indent=''):
    """``header`` (``for (...) ...``) after ``LOOP_HINT``, one string of lines."""
    return '\n'.join(indent + line for line in (*LOOP_HINT, header))


class Place(NamedTuple):
    """A value's place: ``array[base + step * i]`` (``i``: the enclosing
    loop's index; ``step`` 0 outside loops), or ``text`` when it is not of
    that form (``base`` is then None)."""
    array: str
    base: int
    step: int
    text: str

    def at(self, k_step=0):
        """The C of this place, moved ``k_step`` per ``k`` of an inner loop."""
        if self.base is None:
            return self.text
        index = [str(self.base)]
        if k_step:
            index.append('k' if k_step == 1 else f'{k_step} * k')
        if self.step:
            index.append('i' if self.step == 1 else f'{self.step} * i')
        return f'{self.array}[{" + ".join(index)}]'


NOWHERE = Place('', None, 0, '')


def place_of(text):
    """The ``Place`` of a layout string such as ``v[812]``."""
    return Place(text[0], int(text[2:-1]), 0, text)


def _segments(columns, ok=None):
    """Terms ``0..n-1`` as ``(first, count, k_steps)``: runs of at least
    ``MIN_RUN`` terms whose places, in every column (a list of places),
    are in one array, with one ``step``, their bases in arithmetic
    progression (``k_steps``: one per column), with ``ok`` true for each;
    and single terms between them (``count`` 1)."""
    n = len(columns[0])
    ends = [_run_ends(col) for col in columns]
    out, j = [], 0
    while j < n:
        end = min(e[j] for e in ends)
        if ok is not None:
            end = j + 1 if not ok[j] else next((t for t in range(j + 1, end) if not ok[t]), end)
        if end - j >= MIN_RUN:
            out.append((j, end - j, [c[j + 1].base - c[j].base for c in columns]))
            j = end
        else:
            out.append((j, 1, None))
            j += 1
    return out


def _run_ends(col):
    """For each term j of a column of places, the end of the longest run
    from j whose places go on as j's and j + 1's do: one array, one step,
    the base moving by the same amount (j + 1 where j has no such next)."""
    n = len(col)
    diff = [None] * n           # j to j + 1: the base's move, None where no run goes on
    for t in range(n - 1):
        p, q = col[t], col[t + 1]
        if p.base is not None and q.base is not None and p.array == q.array and p.step == q.step:
            diff[t] = q.base - p.base
    ends = list(range(1, n + 1))
    for t in range(n - 2, -1, -1):
        if diff[t] is not None:
            ends[t] = ends[t + 1] if diff[t + 1] == diff[t] else t + 2
    return ends


def _fold_forward(out, head, columns, term):
    """Lines of ``out = [head +] term(0) + term(1) + ...``; ``term(j, k_steps)``
    is the C of term ``j`` (moved by ``k_steps`` per ``k`` in a run)."""
    segments = _segments(columns)
    if all(count == 1 for _, count, _ in segments):
        lines = []
        terms = ([head.at()] if head else []) + [term(j, None) for j in range(len(columns[0]))]
        for start in range(0, len(terms), TERMS_PER_LINE):
            chunk = terms[start:start + TERMS_PER_LINE]
            if start:
                chunk.insert(0, out)     # ((acc + t) + t) ...: the same left fold
            lines.append(f'{out} = {" + ".join(chunk)};' + ('' if start else ' /* sum */'))
        return lines
    lines = ['{   /* sum */', f'    double acc = {head.at() if head else term(0, None)};']
    for first, count, steps in segments:
        start = 1 if first == 0 and not head else 0      # the first term started acc
        if count == 1:
            if start == 0:
                lines.append(f'    acc += {term(first, None)};')
            continue
        lines.append(loop(f'for (int k = {start}; k < {count}; k++) acc += {term(first, steps)};', '    '))
    # one statement: a function split into chunks never cuts it
    return ['\n'.join(lines + [f'    {out} = acc;', '}'])]


def fold_forward(out, places):
    """Lines of ``out = places[0] + places[1] + ...`` (``out``: C of the result)."""
    return _fold_forward(out, None, [places], lambda j, s: places[j].at(s[0] if s else 0))


def fold_backward(grad_out, grads, add=None):
    """Lines adding ``grad_out`` to each term's gradient, last term first:
    ``grads[j]`` the ``Place`` of term ``j``'s gradient, None where it needs
    none; ``add(j)`` the statement of a term outside the runs (default:
    ``grads[j] += grad_out``)."""
    wanted = [g is not None for g in grads]
    segments = _segments([[g if g is not None else NOWHERE for g in grads]], wanted)
    lines = []
    for first, count, steps in reversed(segments):
        if count == 1:
            if wanted[first]:
                lines.append(add(first) if add else f'{grads[first].at()} += {grad_out};')
            continue
        lines.append(loop(f'for (int k = {count - 1}; k >= 0; k--) {grads[first].at(steps[0])} += {grad_out};'))
    return lines


def dot_forward(out, head, a, b):
    """Lines of ``out = [head +] a[0] * b[0] + a[1] * b[1] + ...``."""
    def term(j, s):
        return f'{a[j].at(s[0] if s else 0)} * {b[j].at(s[1] if s else 0)}'
    return _fold_forward(out, head, [a, b], term)


def dot_backward(grad_out, head_grad, a, b, ga, gb):
    """Lines of a ``Dot``'s backward: the head's gradient (``head_grad``,
    None: none needed) gets ``grad_out``, then, last product first, ``a[k]``
    gets ``b[k] * g`` and ``b[k]`` gets ``a[k] * g`` (``ga``/``gb``: their
    gradients' places, None where not needed). ``g`` is what the product's
    own gradient held in the ops the ``Dot`` replaced: ``0.0 + grad_out``
    (+0.0 for a -0.0, as the fold added it to a gradient starting at +0.0)."""
    lines = [f'{head_grad.at()} += {grad_out};'] if head_grad is not None else []
    any_a, any_b = any(x is not None for x in ga), any(y is not None for y in gb)
    columns = [a, b] + [[x if x is not None else NOWHERE for x in col] for col, used in ((ga, any_a), (gb, any_b))
                        if used]
    pattern = (any_a, any_b)
    segments = _segments(columns, [(x is not None, y is not None) == pattern for x, y in zip(ga, gb)])
    wanted = [(x is not None, y is not None) for x, y in zip(ga, gb)]
    body = []
    for first, count, steps in reversed(segments):
        s = steps or [0, 0, 0, 0]
        s_ga, s_gb = s[2] if any_a else 0, s[3 if any_a else 2] if any_b else 0
        grads = []
        if wanted[first][0]:
            grads.append(f'{ga[first].at(s_ga)} += {b[first].at(s[1])} * gd;')
        if wanted[first][1]:
            grads.append(f'{gb[first].at(s_gb)} += {a[first].at(s[0])} * gd;')
        if count == 1:
            body += grads
        elif grads:
            body.append(loop(f'for (int k = {count - 1}; k >= 0; k--) {{ {" ".join(grads)} }}'))
    if body:
        lines.append('\n'.join(['{   /* dot */', f'    const double gd = 0.0 + {grad_out};',
                                *['    ' + line.replace('\n', '\n    ') for line in body], '}']))
    return lines


def forward(op, scalar):
    """A top-level ``Sum`` or ``Dot``."""
    value = scalar.value
    if type(op).__name__ == 'Dot':
        return dot_forward(value[op.out], place_of(value[op.head]) if op.head is not None else None,
                           [place_of(value[s]) for s in op.a], [place_of(value[s]) for s in op.b])
    return fold_forward(value[op.out], [place_of(value[t]) for t in op.terms])


def backward(op, scalar, flags):
    """A top-level ``Sum`` or ``Dot`` (whose result needs a gradient)."""
    # d sum / d t = 1 for every term; the runs in loops are of terms whose
    # gradients are in the rows (a parameter's may be recorded: scalar.add)
    g, lay, value = scalar.grad[op.out], scalar.layout, scalar.value

    def grad(t):
        return place_of(scalar.grad[t]) if flags[t] and lay.is_row(t) else NOWHERE if flags[t] else None
    if type(op).__name__ == 'Dot':
        head = grad(op.head) if op.head is not None else None
        return dot_backward(g, head, [place_of(value[s]) for s in op.a], [place_of(value[s]) for s in op.b],
                            [grad(s) for s in op.a], [grad(s) for s in op.b])
    return fold_backward(g, [grad(t) for t in op.terms], add=lambda j: scalar.add(op, j, op.terms[j], g))
