"""The op table: for each interpreter op, its C forward and backward.

Each entry mirrors the op's definition in ``micrograd/engine.py`` operation by
operation, so that C computes the same IEEE doubles in the same order.
Placeholders: ``{a}``, ``{b}`` the operands' values, ``{o}`` the result,
``{g}`` the result's gradient, ``{ga}``, ``{gb}`` the operands' gradients,
``{k}`` the exponent of ``**`` and ``{km1}`` that exponent minus one.
The backward is a list of ``(operand index, C statement)``; a statement is
left out when its operand needs no gradient (an input or a constant).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class OpCode:
    arity: int
    forward: str
    backward: tuple


OPS = {
    '+': OpCode(2, '{a} + {b}', ((0, '{ga} += {g};'), (1, '{gb} += {g};'))),
    '-': OpCode(2, '{a} - {b}', ((0, '{ga} += {g};'), (1, '{gb} += -{g};'))),
    '*': OpCode(2, '{a} * {b}', ((0, '{ga} += {b} * {g};'), (1, '{gb} += {a} * {g};'))),
    # d(a/b)/da = 1/b;  d(a/b)/db = -a/b^2 = -(a/b)/b
    '/': OpCode(2, '{a} / {b}', ((0, '{ga} += {g} / {b};'), (1, '{gb} += -({g} * {o}) / {b};'))),
    'neg': OpCode(1, '-{a}', ((0, '{ga} += -{g};'),)),
    # d(x^k)/dx = k x^(k-1)
    '**': OpCode(1, 'pow({a}, {k})', ((0, '{ga} += ({k} * pow({a}, {km1})) * {g};'),)),
    # the derivative at 0 is taken as 0
    'relu': OpCode(1, '{a} < 0.0 ? 0.0 : {a}', ((0, '{ga} += ({o} > 0.0) * {g};'),)),
    # d tanh(x)/dx = 1 - tanh(x)^2
    'tanh': OpCode(1, 'tanh({a})', ((0, '{ga} += (1.0 - {o} * {o}) * {g};'),)),
    'exp': OpCode(1, 'exp({a})', ((0, '{ga} += {o} * {g};'),)),
    'log': OpCode(1, 'log({a})', ((0, '{ga} += {g} / {a};'),)),
    # d s(x)/dx = s(x) (1 - s(x))
    'sigmoid': OpCode(1, '1.0 / (1.0 + exp(-{a}))', ((0, '{ga} += ({o} * (1.0 - {o})) * {g};'),)),
    # ties (and a NaN comparison) decide as in the interpreter: a >= b picks a
    'max': OpCode(2, '{a} >= {b} ? {a} : {b}',
                  ((0, 'if ({a} >= {b}) {ga} += {g};'), (1, 'if (!({a} >= {b})) {gb} += {g};'))),
}
