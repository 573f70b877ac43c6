"""C of a ``Sum``: straight-line, the terms added left to right."""
from compiler.constants import TERMS_PER_LINE

LOOPS = False     # straight-line code, not a function of its own


def forward(op, scalar, scratch):
    lines = []
    data = scalar.data
    for start in range(0, len(op.terms), TERMS_PER_LINE):
        terms = [data[t] for t in op.terms[start:start + TERMS_PER_LINE]]
        if start:
            terms.insert(0, f'data[{op.out}]')   # ((acc + t) + t) ...: the same left fold
        lines.append(f'data[{op.out}] = {" + ".join(terms)};' + ('' if start else ' /* sum */'))
    return lines


def backward(op, flags, scratch):
    # d sum / d t = 1 for every term; a term listed twice gets g twice, and
    # the interpreter's backward reaches the terms last to first.
    return [f'grad[{t}] += grad[{op.out}];' for t in reversed(op.terms) if flags[t]]


def flush(op, scratch):
    return []


def refresh_aux(op, scratch):
    return []
