"""C of a ``Sum``: straight-line, the terms added left to right."""
from compiler.constants import TERMS_PER_LINE


def forward(op, scalar):
    lines = []
    value, out = scalar.value, scalar.value[op.out]
    for start in range(0, len(op.terms), TERMS_PER_LINE):
        terms = [value[t] for t in op.terms[start:start + TERMS_PER_LINE]]
        if start:
            terms.insert(0, out)     # ((acc + t) + t) ...: the same left fold
        lines.append(f'{out} = {" + ".join(terms)};' + ('' if start else ' /* sum */'))
    return lines


def backward(op, scalar, flags):
    # d sum / d t = 1 for every term; a term listed twice gets g twice, and
    # the interpreter's backward reaches the terms last to first.
    g = scalar.grad[op.out]
    return [scalar.add(op, i, t, g) for i, t in reversed(list(enumerate(op.terms))) if flags[t]]
