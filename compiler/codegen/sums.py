"""C of a ``Sum``: the terms added left to right, as straight-line code or,
where at least ``MIN_RUN`` consecutive terms lie in arithmetic progression
in one array, with a ``for`` over them: ``acc = t0; acc += t1; ...`` is the
same left fold, rounding for rounding, as ``t0 + t1 + ...``. Backward adds
the sum's gradient to each term's, last term first (a term listed twice
gets it twice), as the interpreter reaches them.

``fold_forward`` and ``fold_backward`` render a fold over terms whose places
are given as ``Place`` values; ``compiler/codegen/loops.py`` uses them for
the folds in a loop's body, whose places also move with the loop's ``i``.
"""
from typing import NamedTuple

from compiler.constants import TERMS_PER_LINE

MIN_RUN = 4         # consecutive terms in progression worth a loop


class Place(NamedTuple):
    """A value's place: ``array[base + step * i]`` (``i``: the enclosing
    loop's index; ``step`` 0 outside loops), or ``text`` when it is not of
    that form (``base`` is then None)."""
    array: str
    base: int
    step: int
    text: str

    def at(self, k_expr=None, k_step=0):
        """The C of this place, moved ``k_step`` per ``k`` of an inner loop."""
        if self.base is None:
            return self.text
        index = [str(self.base)]
        if k_step:
            index.append('k' if k_step == 1 else f'{k_step} * k')
        if self.step:
            index.append('i' if self.step == 1 else f'{self.step} * i')
        return f'{self.array}[{" + ".join(index)}]'


def place_of(text):
    """The ``Place`` of a layout string such as ``v[812]``."""
    return Place(text[0], int(text[2:-1]), 0, text)


def _segments(places, ok=None):
    """The terms as ``(first, count, k_step)``: runs of at least ``MIN_RUN``
    places in one array, with one ``step``, their bases in arithmetic
    progression (and ``ok`` true for each), and single terms between them."""
    out, j, n = [], 0, len(places)
    while j < n:
        p = places[j]
        end = j + 1
        if p.base is not None and (ok is None or ok[j]) and j + 1 < n:
            q = places[j + 1]
            d = None if q.base is None else q.base - p.base
            while end < n:
                q = places[end]
                if (q.base is None or q.array != p.array or q.step != p.step or q.base != p.base + d * (end - j)
                        or ok is not None and not ok[end]):
                    break
                end += 1
            if end - j >= MIN_RUN:
                out.append((j, end - j, d))
                j = end
                continue
        out.append((j, 1, 0))
        j += 1
    return out


def fold_forward(out, places):
    """Lines of ``out = places[0] + places[1] + ...`` (``out``: C of the result)."""
    segments = _segments(places)
    if all(count == 1 for _, count, _ in segments):
        lines = []
        terms = [p.at() for p in places]
        for start in range(0, len(terms), TERMS_PER_LINE):
            chunk = terms[start:start + TERMS_PER_LINE]
            if start:
                chunk.insert(0, out)     # ((acc + t) + t) ...: the same left fold
            lines.append(f'{out} = {" + ".join(chunk)};' + ('' if start else ' /* sum */'))
        return lines
    lines = ['{   /* sum */', f'    double acc = {places[0].at()};']
    for first, count, k_step in segments:
        if count == 1:
            if first:
                lines.append(f'    acc += {places[first].at()};')
            continue
        p = places[first]
        start = 1 if first == 0 else 0       # the first term starts acc
        lines.append(f'    for (int k = {start}; k < {count}; k++) acc += {p.at("k", k_step)};')
    # one statement: a function split into chunks never cuts it
    return ['\n'.join(lines + [f'    {out} = acc;', '}'])]


def fold_backward(grad_out, grads, add=None):
    """Lines adding ``grad_out`` to each term's gradient, last term first:
    ``grads[j]`` the ``Place`` of term ``j``'s gradient, None where it needs
    none; ``add(j)`` the statement of a term outside the runs (default:
    ``grads[j] += grad_out``)."""
    wanted = [g is not None for g in grads]
    segments = _segments([g if g is not None else Place('', None, 0, '') for g in grads], wanted)
    lines = []
    for first, count, k_step in reversed(segments):
        if count == 1:
            if wanted[first]:
                lines.append(add(first) if add else f'{grads[first].at()} += {grad_out};')
            continue
        g = grads[first]
        lines.append(f'for (int k = {count - 1}; k >= 0; k--) {g.at("k", k_step)} += {grad_out};')
    return lines


def forward(op, scalar):
    value = scalar.value
    return fold_forward(value[op.out], [place_of(value[t]) for t in op.terms])


def backward(op, scalar, flags):
    # d sum / d t = 1 for every term; the runs in loops are of terms whose
    # gradients are in the rows (a parameter's may be recorded: scalar.add)
    g, lay = scalar.grad[op.out], scalar.layout
    grads = [place_of(scalar.grad[t]) if flags[t] and lay.is_row(t) else
             Place('', None, 0, '') if flags[t] else None for t in op.terms]
    return fold_backward(g, grads, add=lambda j: scalar.add(op, j, op.terms[j], g))
