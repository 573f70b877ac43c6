"""Position loops: scalar code that is the same at consecutive positions of a
sequence, written once as a function of the position.

A sequence scheduled layer by layer (compiler/positions.py) runs each stage's
scalar ops position by position: the embedding's add and rmsnorm, the
attention of each position over the ones before it, the residual adds, the
relu, ... at positions 0, 1, 2, ... one after the other. Where consecutive
positions' C differs only in its integers (where it reads and writes, a
loop's count), the stretch is one function of ``pos``: each integer that
moves by a fixed step from one position to the next is written ``N + D *
pos``, one that moves otherwise ``N + T[pos - first]`` with T a table of its
moves (the layout does not give every position's values the same
arrangement: a position's attention holds one more value than the last's),
everything else as it is. Floating literals and identifiers never move.

Exactness: for each ``pos`` the function runs exactly the statements of that
position's own code (``template`` writes back every integer of every
position's text, and the rest of the texts is equal character for
character), and the loop over ``pos`` runs them in the positions' order,
forward and backward. Only the size of the C changes: microgpt's scalar code
shrinks about sevenfold, so it builds sooner and at a higher level.
"""
import re

import numpy as np

# A decimal integer on its own: not part of an identifier (x2, seg12), of a
# floating literal (2.5, 1e-05, 0x1.8p+0) or of a suffixed or hex integer
# (8L, 0x1F), not octal (010) and not beyond int64. The generated C puts
# spaces around binary operators, so a sign just before digits after e or p
# is an exponent's. (The lookahead first: the search skips a non-digit
# without trying the lookbehinds, a third of the time of a split.)
_INTEGER = re.compile(r'(?=\d)(?<![\w.])(?<![eEpP][+-])(0|[1-9]\d{0,17})(?![\w.])')
POS = 'pos'     # the name of the position in the functions written here


def split(text):
    """``(pieces, integers)``: ``text`` = pieces[0] + integers[0] + pieces[1]
    + ... + pieces[-1] (the integers as their digits); two positions' texts
    that one template writes have the same pieces."""
    parts = _INTEGER.split(text)
    return tuple(parts[0::2]), parts[1::2]


def template(splits, first, table_name):
    """The C of positions ``first``, ``first + 1``, ... (their texts'
    ``split``s, the same pieces) as one text in ``pos``, with the
    declarations of the tables it reads: ``(text, [C line])``. An integer
    that moves by a fixed step is written ``N + D * pos``; one that moves
    otherwise ``N + T[pos - first]``, T a table of its moves (named
    ``table_name(j)``, one per distinct sequence of moves). None where an
    integer moves inside a ``static`` declaration (a loop's table of
    places), whose initializer must stay constant."""
    pieces = splits[0][0]
    assert len(splits) >= 2 and all(p == pieces for p, _ in splits[1:])
    numbers = np.array([n for _, n in splits], dtype=np.int64).reshape(len(splits), -1)
    start, moves = numbers[0], numbers - numbers[0]
    step = moves[1]
    affine = (moves == np.arange(len(splits))[:, None] * step).all(axis=0)
    tables, decls = {}, []
    out = [pieces[0]]
    line = pieces[0].rpartition('\n')[2]        # the current line up to the integer
    for j, (n, d, before, after) in enumerate(zip(start.tolist(), step.tolist(), pieces, pieces[1:])):
        static = line.lstrip().startswith('static')
        line = (line + splits[0][1][j] + after) if '\n' not in after else after.rpartition('\n')[2]
        if affine[j] and d == 0:
            out += [splits[0][1][j], after]
            continue
        if static:
            return None
        if affine[j]:
            n -= d * first                              # its value at position 0
            term = f'{abs(d)} * {POS}'
            moving = (f'{n} + {term}' if d > 0 else f'{n} - {term}') if n else (term if d > 0 else f'-{term}')
        else:
            key = tuple(moves[:, j].tolist())
            if key not in tables:
                tables[key] = table_name(len(tables))
                decls.append(f'static const int {tables[key]}[{len(splits)}] = {{{", ".join(map(str, key))}}};')
            moving = f'{n} + {tables[key]}[{POS}' + (f' - {first}]' if first else ']')
        # an index's first term, as in v[68960 + 2 * k], needs no brackets
        bare = before.endswith('[') and (after.startswith(']') or after[:3] in (' + ', ' - '))
        out += [moving if bare else f'({moving})', after]
    return ''.join(out), decls
