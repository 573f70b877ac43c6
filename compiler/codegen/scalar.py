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

from compiler.ir import Op


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


class Exponent(NamedTuple):
    """The exponent of ``**`` read at run time (the op table, compiler/codegen/table.py):
    C expressions of ``k`` and of ``k - 1.0`` (computed in Python: the same double)."""
    k: str
    k_minus_1: str


def _k(k):
    return k.k if type(k) is Exponent else c_double(k)


def _k_minus_1(k):
    return k.k_minus_1 if type(k) is Exponent else c_double(k - 1.0)


def _pow_grad(a, b, o, g, k):
    # d(x^k)/dx = k x^(k-1)
    return f'({_k(k)} * pow({a}, {_k_minus_1(k)})) * {g}'


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
    '**': CScalar(lambda a, b, k: f'pow({a}, {_k(k)})', ((0, _pow_grad, None),)),
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


class _Template(NamedTuple):
    forward: str     # '{o} = <expression>;' over {o}, {a}, {b}
    grads: tuple     # ((operand, '<target {t}> += <contribution>;'), ...)


def _templates():
    """Each row of ``SCALAR_C`` without a ``k`` as ``str.format`` templates:
    the row's own functions called on the placeholders, so the text is the
    table's. (The C never holds braces, so the placeholders are unambiguous.)"""
    out = {}
    for name, row in SCALAR_C.items():
        if name == '**':
            continue      # its exponent is a literal of each op's own: rendered by ``forward``
        forward = '{o} = ' + row.forward('{a}', '{b}', None) + ';' + (f' /* {name} */' if row.comment else '')
        grads = []
        for i, contribution, condition in row.grads:
            expr = contribution('{a}', '{b}', '{o}', '{g}', None)
            grads.append((i, f'if ({condition("{a}", "{b}")}) {{t}} += {expr};' if condition
                          else f'{{t}} += {expr};'))
        out[name] = _Template(forward, tuple(grads))
    return out


class ScalarRenderer:
    """C statements of scalar ops over one row (``v``, ``g``) and the shared
    parameters and constants (``p``, ``gp``); ``layout`` says where each slot
    lives (compiler/codegen/layout.py).

    Constants are read from their slots (set once by ``init_constants``), not
    written into expressions as literals: a C compiler then cannot fold
    ``exp(2.0)`` with its own arithmetic instead of libm's, nor rewrite
    ``a >= -0.0 ? a : -0.0`` into a ``maxsd`` that returns -0.0 for +0.0
    (clang 14 does, at -O2).
    """

    def __init__(self, layout):
        self.layout = layout
        self.value = layout.value      # slot -> its C location (formatted when asked for)
        self.grad = layout.grad
        program = layout.program
        self._params = (program.param_start, program.param_end)
        self.loop_places = {}           # id(Loop) -> its places (codegen/loops.py), for forward and backward

    def forward_lines(self, ops, other):
        """``forward`` of each op of ``ops`` in order (``other(op)``: the lines
        of an op that is not an ``Op``, a ``Sum``):
        each scalar op one ``str.format`` of its row's template (the
        templates are the op table's own text, see ``_TEMPLATES``)."""
        value, lines = self.value, []
        append = lines.append
        for op in ops:
            if type(op) is not Op:
                lines += other(op)
                continue
            t = _TEMPLATES.get(op.name)
            if t is None or op.k is not None:
                append(self.forward(op))
                continue
            args = op.args
            append(t.forward.format(o=value[op.out], a=value[args[0]],
                                    b=value[args[1]] if len(args) == 2 else ''))
        return lines

    def backward_lines(self, ops, flags, other):
        """``backward`` of each op of ``ops`` (in the order to run, i.e.
        reversed) whose result needs a gradient (``other(op)``: the lines of
        an op that is not an ``Op``). A
        parameter's contribution may be recorded (``add``); every other
        operand's is added to its gradient in place."""
        value, grad, lines = self.value, self.grad, []
        append = lines.append
        p0, p1 = self._params
        for op in ops:
            o = op.out
            if not flags[o]:
                continue
            if type(op) is not Op:
                lines += other(op)
                continue
            t = _TEMPLATES.get(op.name)
            args = op.args
            if t is None or op.k is not None or any(p0 <= x < p1 for x in args):
                lines += self.backward(op, flags)
                continue
            a = value[args[0]]
            b = value[args[1]] if len(args) == 2 else ''
            ov, g = value[o], grad[o]
            for i, template in t.grads:
                x = args[i]
                if flags[x]:
                    append(template.format(a=a, b=b, o=ov, g=g, t=grad[x]))
        return lines

    def forward(self, op):
        value, args = self.value, op.args
        row = SCALAR_C[op.name]
        b = value[args[1]] if len(args) == 2 else ''
        expr = row.forward(value[args[0]], b, op.k)
        return f'{value[op.out]} = {expr};' + (f' /* {op.name} */' if row.comment else '')

    def backward(self, op, flags):
        value, args = self.value, op.args
        a = value[args[0]]
        b = value[args[1]] if len(args) == 2 else ''
        o, g = value[op.out], self.grad[op.out]
        lines = []
        for i, contribution, condition in SCALAR_C[op.name].grads:
            if flags[args[i]]:
                lines.append(self.add(op, i, args[i], contribution(a, b, o, g, op.k),
                                      condition(a, b) if condition else None))
        return lines

    def add(self, op, operand, slot, expr, condition=None):
        """The statement adding ``expr`` to the gradient of ``slot`` (operand
        number ``operand`` of ``op``), only where ``condition`` holds.

        A recorded contribution is the value the interpreter would have added,
        or +0.0 where it adds nothing: the recorded values are added to a
        parameter gradient later, and a gradient never holds -0.0 (it starts
        at +0.0, and a sum that does not start at -0.0 never becomes -0.0),
        so adding +0.0 leaves it as it is."""
        how, target = self.layout.grad_target(op, operand, slot)
        if how == '=':
            note = f'   /* for {self.grad[slot]}, added in row order by param_grads */'
            return (f'{target} = {condition} ? {expr} : 0.0;' if condition else f'{target} = {expr};') + note
        return f'if ({condition}) {target} += {expr};' if condition else f'{target} += {expr};'


_TEMPLATES = _templates()
