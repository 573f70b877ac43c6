"""C of a ``Loop``: one C ``for`` over its iterations, the body's statements
those of the op table (``scalar.SCALAR_C``) with each slot's place written
as a function of ``i``: ``v[812 + 7 * i]`` where the layout puts the
iterations' slots in arithmetic progression, else read from a small table
(``v[at0[i]]``).

Forward runs ``i`` upwards and the body in order; backward runs ``i``
downwards and the body in reverse, each op's contributions as its scalar
statement adds them: the same roundings and the same order as the
straight-line code of the ops the loop stands for. A loop is one C
statement (a block) of the per-row functions, so that splitting a long
function into chunks never cuts it.

``forward_lines`` and ``backward_lines`` render a run of scalar ops,
``Sum``, ``Dot`` and ``Loop`` ops (the folds: compiler/codegen/sums.py), for
compiler/codegen/program.py.
"""
import numpy as np

from compiler.codegen import sums
from compiler.codegen.scalar import SCALAR_C
from compiler.codegen.sums import Place
from compiler.ir import Loop, Op, Sum, loop_slots


# Loops per generated function at most: clang's loop passes take superlinear
# time in the loops of one function (500 small loops: 2.0 s at -O1 in one
# function, 0.7 s in functions of 10 to 50 loops).
LOOPS_PER_FUNCTION = 16

# A loop's slots times its iterations up to which its places are found in
# Python lists (above: numpy, over all of them at once).
SMALL_CELLS = 4096


def function_runs(run):
    """``run`` (the order to run) cut into consecutive parts of at most
    ``LOOPS_PER_FUNCTION`` loops each; nothing when ``run`` is empty."""
    parts, part, count = [], [], 0
    for op in run:
        n = 1 if type(op) is Loop else 0
        if count + n > LOOPS_PER_FUNCTION:
            parts.append(part)
            part, count = [], 0
        part.append(op)
        count += n
    return parts + ([part] if part else [])


def work(op):
    """About how many floating-point operations a scalar op, ``Sum``,
    ``Dot`` or ``Loop`` does forward and backward (for the threads' share)."""
    if type(op) is Loop:
        return op.n * sum(work(b) for b in op.body)
    if type(op) is Sum:
        return 3 * len(op.terms)
    if type(op) is Op:
        return 3
    return 6 * len(op.a)


def forward_lines(run, scalar):
    """The forward statements of ``run`` (in order)."""
    return scalar.forward_lines(run, lambda op: forward(op, scalar) if type(op) is Loop
                                else sums.forward(op, scalar))


def backward_lines(run, scalar, flags):
    """The backward statements of ``run`` (given in the order to run)."""
    lines, part = [], []

    def flush():
        if part:
            lines.extend(scalar.backward_lines(part, flags, lambda op: sums.backward(op, scalar, flags)))
            part.clear()
    for op in run:
        if type(op) is Loop:
            flush()
            lines += backward(op, scalar, flags)
        else:
            part.append(op)
    flush()
    return lines


def _places(op, scalar):
    """The loop's ``_Places``, made once for its forward and its backward."""
    places = scalar.loop_places.get(id(op))
    if places is None or places.op is not op:
        places = scalar.loop_places[id(op)] = _Places(op, scalar)
    return places


class _Places:
    """The C place (``sums.Place``) of every body slot of one loop as a
    function of ``i``, and the tables of those whose places are not in
    arithmetic progression (``v[at0[i]]``)."""

    def __init__(self, op, scalar):
        self.op, self.n, self.scalar, self.tables = op, op.n, scalar, []
        slots = [loop_slots(body) for body in op.body]
        flat = [s for body in slots for s in body]
        steps = [d for step in op.steps for d in step]
        # every slot's places over the iterations (layout.loc: v[x] for x >= 0, else p[-1 - x])
        if len(flat) * op.n <= SMALL_CELLS:       # (numpy's calls cost more than a small loop's work)
            loc, n = scalar.layout.loc_list, op.n
            cells = [[loc[s + d * i] for i in range(n)] for s, d in zip(flat, steps)]
        else:
            cells = scalar.layout.loc[np.array(flat, dtype=np.int64)[:, None]
                                      + np.array(steps, dtype=np.int64)[:, None] * np.arange(op.n)].tolist()
        places = list(map(self._place, cells))
        ends = np.cumsum([len(body) for body in slots]).tolist()
        self.where = [places[e - len(body):e] for body, e in zip(slots, ends)]

    def _place(self, loc):
        """The ``Place`` of a slot at the places ``loc`` (layout.loc's) of the iterations."""
        row = loc[0] >= 0
        assert (min(loc) >= 0) if row else (max(loc) < 0), "a loop slot moves between the rows and the shared values"
        at = loc if row else [-1 - x for x in loc]
        array, first, n = ('v' if row else 'p'), at[0], len(at)
        step = at[1] - first if n > 1 else 0
        if at == (list(range(first, first + step * n, step)) if step else [first] * n):
            return Place(array, first, step, '')
        name = f'at{len(self.tables)}'
        self.tables.append(f'static const int {name}[{self.n}] = {{{", ".join(map(str, at))}}};')
        return Place(array, None, 0, f'{array}[{name}[i]]')

    def value(self, j, k):
        return self.where[j][k].at()

    def grad(self, j, k):
        """The place of the gradient of body op ``j``'s slot ``k``."""
        p = self.where[j][k]
        assert p.array == 'v', "a gradient outside the rows"
        return p._replace(array='g', text=p.text.replace('v[', 'g[', 1))


def forward(op, scalar):
    """The loop's forward: one C statement (a block)."""
    places = _places(op, scalar)
    body = []
    for j, b in enumerate(op.body):
        out = places.value(j, 0)
        if type(b) is Op:
            row = SCALAR_C[b.name]
            args = [places.value(j, k) for k in range(1, 1 + len(b.args))]
            expr = row.forward(args[0], args[1] if len(args) == 2 else '', b.k)
            body.append(f'{out} = {expr};' + (f' /* {b.name} */' if row.comment else ''))
        elif type(b) is Sum:
            body += sums.fold_forward(out, places.where[j][1:])
        else:
            h, n = (1 if b.head is not None else 0), len(b.a)
            where = places.where[j]
            body += sums.dot_forward(out, where[1] if h else None, where[1 + h:1 + h + n], where[1 + h + n:])
    return [_block(op, places, 'for (int i = 0; i < {n}; i++) {{', body)]


def backward(op, scalar, flags):
    """The loop's backward: one C statement (a block), or none when no body
    op needs a gradient."""
    places = _places(op, scalar)
    body = []
    for j in reversed(range(len(op.body))):
        b = op.body[j]
        slots = loop_slots(b)
        if not flags[slots[0]]:
            continue
        g = places.grad(j, 0).at()
        if type(b) is Op:
            a = places.value(j, 1)
            bv = places.value(j, 2) if len(b.args) == 2 else ''
            o = places.value(j, 0)
            for operand, contribution, condition in SCALAR_C[b.name].grads:
                if flags[slots[1 + operand]]:
                    target, expr = places.grad(j, 1 + operand).at(), contribution(a, bv, o, g, b.k)
                    body.append(f'if ({condition(a, bv)}) {target} += {expr};' if condition
                                else f'{target} += {expr};')
        elif type(b) is Sum:
            # d sum / d t = 1 for every term, reached last to first
            body += sums.fold_backward(g, [places.grad(j, k) if flags[slots[k]] else None
                                           for k in range(1, len(slots))])
        else:
            h, n = (1 if b.head is not None else 0), len(b.a)
            where = places.where[j]
            grads = [places.grad(j, k) if flags[slots[k]] else None for k in range(len(slots))]
            body += sums.dot_backward(g, grads[1] if h else None, where[1 + h:1 + h + n], where[1 + h + n:],
                                      grads[1 + h:1 + h + n], grads[1 + h + n:])
    if not body:
        return []
    return [_block(op, places, 'for (int i = {last}; i >= 0; i--) {{', body)]


def _block(op, places, head, body):
    lines = [f'{{   /* loop: {op.n} x {len(op.body)} ops */', *['    ' + t for t in places.tables],
             sums.loop(head.format(n=op.n, last=op.n - 1), '    '),
             *['        ' + line.replace('\n', '\n        ') for line in body], '    }', '}']
    return '\n'.join(lines)
