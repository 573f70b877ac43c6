"""The C of every scalar op: its forward expression and its backward
statements, side by side, mirroring ``micrograd/engine.py`` operation by
operation so that C computes the same IEEE doubles in the same order.

Each row is plain Python: ``forward(a, b, k)`` returns the C expression of the
result from the operands' C expressions, and each gradient entry
``(operand, contribution(a, b, o, g, k), condition)`` says what is added to
that operand's gradient (``o`` is the result, ``g`` its gradient, ``k`` the
float exponent of ``**``) and, where the interpreter adds only sometimes,
under which C condition. An entry is left out when its operand needs no
gradient (an input or a constant).

Adding an op:
1. ``micrograd/engine.py``: the method, with its ``_backward`` right beside it
   (and ``micrograd/ieee.py`` where Python would raise instead of returning
   C's IEEE result).
2. ``compiler/ir.py``: its name and arity in ``SCALAR_OPS``.
3. Here: its row in ``SCALAR_C``, the same roundings in the same order as
   the interpreter; cite the derivative where it is not obvious.
4. ``tests/test_engine.py``: the op in the finite-difference gradient check.
5. ``tests/test_compiler.py``: the op in the random-graph differential test
   (``OPS`` there), which compares the compiled bits with the interpreter's.
"""
import math
from typing import NamedTuple


def c_double(x):
    """An exact C literal for the double ``x``: no rounding in any compiler's parser.

    Small integers are written in decimal, everything else as a hex float;
    ``inf``, ``nan`` and ``-0.0`` are spelled out. Negative literals are
    parenthesised so that ``-{a}`` can never become ``--``.
    """
    x = float(x)
    if math.isnan(x):
        return 'NAN'
    if math.isinf(x):
        return 'INFINITY' if x > 0 else '(-INFINITY)'
    if x == 0.0:
        return '(-0.0)' if math.copysign(1.0, x) < 0 else '0.0'
    if x == math.floor(x) and abs(x) < 2.0 ** 53:
        text = f'{x:.1f}'
    else:
        text = x.hex()
    return f'({text})' if x < 0 else text


class CScalar(NamedTuple):
    forward: object         # (a, b, k) -> C expression
    grads: tuple            # ((operand, (a, b, o, g, k) -> C expression, condition or None), ...)
    comment: bool = False   # the forward expression does not name the op: say it in a comment


def _pow_grad(a, b, o, g, k):
    # d(x^k)/dx = k x^(k-1)
    return f'({c_double(k)} * pow({a}, {c_double(k - 1.0)})) * {g}'


SCALAR_C = {
    '+': CScalar(lambda a, b, k: f'{a} + {b}',
                 ((0, lambda a, b, o, g, k: g, None), (1, lambda a, b, o, g, k: g, None))),
    '-': CScalar(lambda a, b, k: f'{a} - {b}',
                 ((0, lambda a, b, o, g, k: g, None), (1, lambda a, b, o, g, k: f'-{g}', None))),
    '*': CScalar(lambda a, b, k: f'{a} * {b}',
                 ((0, lambda a, b, o, g, k: f'{b} * {g}', None),
                  (1, lambda a, b, o, g, k: f'{a} * {g}', None))),
    # d(a/b)/da = 1/b;  d(a/b)/db = -a/b^2 = -(a/b)/b
    '/': CScalar(lambda a, b, k: f'{a} / {b}',
                 ((0, lambda a, b, o, g, k: f'{g} / {b}', None),
                  (1, lambda a, b, o, g, k: f'-({g} * {o}) / {b}', None))),
    'neg': CScalar(lambda a, b, k: f'-{a}', ((0, lambda a, b, o, g, k: f'-{g}', None),), comment=True),
    '**': CScalar(lambda a, b, k: f'pow({a}, {c_double(k)})', ((0, _pow_grad, None),)),
    # the derivative at 0 is taken as 0: the interpreter adds (o > 0) * g
    'relu': CScalar(lambda a, b, k: f'{a} < 0.0 ? 0.0 : {a}',
                    ((0, lambda a, b, o, g, k: f'({o} > 0.0) * {g}', None),), comment=True),
    # d tanh(x)/dx = 1 - tanh(x)^2
    'tanh': CScalar(lambda a, b, k: f'tanh({a})',
                    ((0, lambda a, b, o, g, k: f'(1.0 - {o} * {o}) * {g}', None),)),
    'exp': CScalar(lambda a, b, k: f'exp({a})', ((0, lambda a, b, o, g, k: f'{o} * {g}', None),)),
    'log': CScalar(lambda a, b, k: f'log({a})', ((0, lambda a, b, o, g, k: f'{g} / {a}', None),)),
    # d s(x)/dx = s(x) (1 - s(x))
    'sigmoid': CScalar(lambda a, b, k: f'1.0 / (1.0 + exp(-{a}))',
                       ((0, lambda a, b, o, g, k: f'({o} * (1.0 - {o})) * {g}', None),), comment=True),
    # ties (and a NaN comparison) decide as in the interpreter: a >= b picks a,
    # and only the chosen operand's gradient is touched
    'max': CScalar(lambda a, b, k: f'{a} >= {b} ? {a} : {b}',
                   ((0, lambda a, b, o, g, k: g, lambda a, b: f'{a} >= {b}'),
                    (1, lambda a, b, o, g, k: g, lambda a, b: f'!({a} >= {b})')), comment=True),
}


class ScalarRenderer:
    """C statements of scalar ops over the ``data`` and ``grad`` arrays.

    Constants are read from their slots (set once by ``init_constants``), not
    written into expressions as literals: a C compiler then cannot fold
    ``exp(2.0)`` with its own arithmetic instead of libm's, nor rewrite
    ``a >= -0.0 ? a : -0.0`` into a ``maxsd`` that returns -0.0 for +0.0
    (clang 14 does, at -O2).
    """

    def __init__(self, n_slots):
        self.data = [f'data[{s}]' for s in range(n_slots)]
        self.grad = [f'grad[{s}]' for s in range(n_slots)]

    def forward(self, op):
        data, args = self.data, op.args
        row = SCALAR_C[op.name]
        b = data[args[1]] if len(args) == 2 else ''
        expr = row.forward(data[args[0]], b, op.k)
        return f'data[{op.out}] = {expr};' + (f' /* {op.name} */' if row.comment else '')

    def backward(self, op, flags):
        data, grad, args = self.data, self.grad, op.args
        a = data[args[0]]
        b = data[args[1]] if len(args) == 2 else ''
        o, g = data[op.out], grad[op.out]
        lines = []
        for i, contribution, condition in SCALAR_C[op.name].grads:
            if flags[args[i]]:
                stmt = f'{grad[args[i]]} += {contribution(a, b, o, g, op.k)};'
                lines.append(f'if ({condition(a, b)}) {stmt}' if condition else stmt)
        return lines
