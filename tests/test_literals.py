"""Every numeric literal in the program's C is a floating literal the
compiler wrote exactly (no bare integers, no suffixes, no inexact decimals),
and constants survive each C compiler bit for bit."""
import math
import re

import numpy as np
import pytest

import compiler
import micrograd
from compiler.ir import SCALAR_OPS
from micrograd import Value
from micrograd.nn import MLP

from tests.differential import COMPILERS, assert_matches_interpreter, same
from tests.graphs import emit


C_NUMBER = re.compile(r'(?<![\w.])(0[xX][0-9a-fA-F]*\.?[0-9a-fA-F]*(?:[pP][+-]?\d+)?'
                      r'|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)([uUlLfF]*)(?![\w.])')
# Declarations of integers and pointers (slot offsets, loop counters, flags, row orders).
INTEGER_DECLARATION = re.compile(r'^(?:static\s+)?(?:const\s+)?(?:Py_ssize_t|int|double\s*\*\s*restrict'
                                 r'|double\s+\*|static\s+NOINLINE|static\s+void)\b|\*\s*restrict')
KERNEL_CALL = re.compile(r'(?:\bb->k->\w+|\bmv_\w+|\bmatvec\w*)\(')   # b->k: the Block's loop kernels
INTEGER_VARIABLES = re.compile(r'\b(?:int|Py_ssize_t)\s+([^;{}()]*)')


def _drop_balanced(text, opener, open_ch, close_ch):
    """``text`` without every ``opener ... close_ch`` span (balanced)."""
    out, i = [], 0
    while True:
        j = text.find(opener, i)
        if j < 0:
            return ''.join(out) + text[i:]
        out.append(text[i:j])
        depth, k = 0, j + len(opener) - 1
        while k < len(text):
            depth += {open_ch: 1, close_ch: -1}.get(text[k], 0)
            k += 1
            if depth == 0:
                break
        i = k


def kernel_literal_problems(source):
    """Numeric literals in the double arithmetic of the program bodies that are
    not exact floating literals: bare integers, suffixes, decimal fractions.
    Integers are expected, and skipped, in ``[]`` indices, loop headers,
    ``memset`` and ``memcpy`` arguments, ``case`` labels, the arguments of the loop kernels (shapes and offsets),
    integer and pointer declarations, and assignments to integer variables."""
    kernels = source[source.index('/* ---- the program'):source.index('/* ---- tables')]
    kernels = re.sub(r'/\*.*?\*/', ' ', kernels, flags=re.S)
    integers = set()
    for m in INTEGER_VARIABLES.finditer(kernels):
        for part in _drop_balanced(m.group(1), '[', '[', ']').split(','):
            # ints and int arrays, in declarations and parameter lists
            name = re.match(r'\s*(?:int\s+)?(?:\*\s*)?(?:restrict\s+)?(\w+)', part)
            if name:
                integers.add(name.group(1))
    integer_test = re.compile(r'\b(?:%s)\s*(?:[=!]=|[<>]=?)\s*\d+\b' % '|'.join(sorted(integers))
                              if integers else r'(?!)')
    problems = []
    for line in kernels.splitlines():
        if INTEGER_DECLARATION.search(line.strip()):
            continue
        code = _drop_balanced(line, 'for (', '(', ')')
        code = _drop_balanced(code, 'memset(', '(', ')')
        code = _drop_balanced(code, 'memcpy(', '(', ')')
        for call in set(KERNEL_CALL.findall(code)):     # shapes and offsets of the loop kernels
            code = _drop_balanced(code, call, '(', ')')
        code = _drop_balanced(code, '[', '[', ']')
        code = re.sub(r'\bcase \d+:', ' ', code)      # switch labels (refresh_packs' pieces)
        for statement in re.split(r'[;{}]', code):
            statement = re.sub(r'^\s*(?:else\s+)?', '', statement)
            condition = ''
            if statement.startswith('if ('):
                rest = _drop_balanced(statement, 'if (', '(', ')')
                condition, statement = statement[:len(statement) - len(rest)], rest
                condition = integer_test.sub(' ', condition)    # an integer compared
            target = re.match(r'\s*(\w+)\s*(?:=[^=]|\+=|-=|\+\+|--)', statement)
            if target and target.group(1) in integers:
                statement = ''     # an integer counter or flag
            for m in C_NUMBER.finditer(condition + ' ' + statement):
                text, suffix = m.groups()
                if suffix:
                    problems.append((line, m.group(0), 'suffix'))
                elif text.lower().startswith('0x'):
                    if 'p' not in text.lower():
                        problems.append((line, text, 'hex integer'))
                elif '.' not in text:
                    problems.append((line, text, 'bare integer'))
                elif 'e' in text.lower() or float(text) != math.floor(float(text)) or float(text) >= 2 ** 53:
                    problems.append((line, text, 'inexact decimal'))
    return problems


CONSTANTS = [2.0, -3.0, 0.5, 0.1, 1e300, 1e-300, 5e-324, -0.0, 1e16, 2.0 ** 53 - 1, 123456789.0,
             math.inf, -math.inf, math.nan, np.float32(0.1), np.int64(7), 2.2250738585072014e-308]


def literal_graph(op):
    """``op`` applied to an input, a parameter and every kind of constant."""
    x, w = Value(0.0), Value(0.5)
    terms = []
    for c in CONSTANTS:
        a = x * c + w
        terms.append({
            '+': lambda: a + c, '-': lambda: c - a, '*': lambda: a * c, '/': lambda: a / c,
            'neg': lambda: -a, '**': lambda: a ** c if math.isfinite(c) else a ** 2.5,
            'relu': lambda: a.relu(), 'tanh': lambda: a.tanh(), 'exp': lambda: a.exp(),
            'log': lambda: a.log(), 'sigmoid': lambda: a.sigmoid(), 'max': lambda: micrograd.max(a, c),
        }[op]())
    loss = sum(terms[1:], terms[0])
    return loss, [x], [w], terms[:3]


def matvec_graph():
    model = MLP(4, [8, 3], seed=2)
    xs = [Value(0.0) for _ in range(4)]
    out = model(xs)
    loss = sum(((o - 0.5) ** 2 for o in out), Value(0.0)) * 0.25
    return loss, xs, model.parameters(), out


@pytest.mark.parametrize('vectorize', [True, False])
@pytest.mark.parametrize('op', SCALAR_OPS)
def test_every_kernel_literal_is_an_exact_floating_literal(op, vectorize):
    source = emit(literal_graph(op), vectorize)
    assert kernel_literal_problems(source) == []


@pytest.mark.parametrize('vectorize', [True, False])
def test_vector_op_loops_have_only_index_integers(vectorize):
    graph = matvec_graph()
    source = emit(graph, vectorize)
    assert ('matvec' in source) == vectorize
    assert kernel_literal_problems(source) == []


def test_the_literal_checker_finds_bad_literals():
    good = '/* ---- the program */\n    data[3] = data[1] * 0x1.999999999999ap-4 + 2.0;\n/* ---- tables */'
    assert kernel_literal_problems(good) == []
    for bad in ['2', '0.1', '1e300', '2.0L', '1.5f', '0x10', '1.0e5']:
        text = good.replace('2.0', bad)
        assert kernel_literal_problems(text), bad
    wrap = '/* ---- the program */\n{}\n/* ---- tables */'.format
    assert kernel_literal_problems(wrap('    if (data[3] >= 2) grad[1] += grad[5];'))
    assert kernel_literal_problems(wrap('    int flag = 1;\n    if (data[2] < 0) flag = 0;'))
    assert kernel_literal_problems(wrap('    int n = 1;\n    if (data[n] > 0) n = 2;'))
    assert not kernel_literal_problems(wrap('    int n = 1, *restrict count = index;\n'
                                            '    if (n == 0) count[n] = 0;'))
    assert not kernel_literal_problems(wrap('    int flag = 1;\n    if (data[2] < 0.0) flag = 0;\n'
                                            '    for (Py_ssize_t r = 0; r < 4; r++) y[r + 1] = 1.0;'))
    assert not kernel_literal_problems(wrap('    b->k->fwd(b->aux + 0, NULL, 8, 3, 1, 1, b->v + 4, ROW_STRIDE, b->v + 40, ROW_STRIDE, r0, r1, s);'))
    assert kernel_literal_problems(wrap('    b->k->fwd(b->aux + 0, NULL, 8, 3, 1, 1, b->v, 8, b->v, 8, r0, r1, s) * 2;'))


def random_doubles(n, seed):
    """Doubles from random bit patterns (every exponent, subnormals, both signs),
    without NaNs and infinities (those are in ``CONSTANTS``)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 64, size=4 * n, dtype=np.uint64)
    xs = bits.view(np.float64)
    xs = xs[np.isfinite(xs)][:n // 2]
    subnormal = (rng.integers(1, 2 ** 52, size=n // 4, dtype=np.uint64)).view(np.float64)
    near_2_53 = [2.0 ** 53 + d for d in (-2, -1, 0, 2, 4)] + [-(2.0 ** 53) + 1, 2.0 ** 63, 1e22, 1e23]
    return [float(v) for v in xs] + [float(v) for v in subnormal] + [-float(v) for v in subnormal[:8]] + near_2_53


@pytest.mark.parametrize('cc', COMPILERS)
def test_random_constants_and_exponents_survive_every_compiler(cc):
    """Beyond ``test_special_constants_survive_every_compiler``: a few hundred
    doubles from random bit patterns, numpy scalars of several types, and
    special exponents of ``**``, read back bit for bit."""
    constants = random_doubles(300, seed=11) + [np.float32(1 / 3), np.float16(0.1), np.int64(-9),
                                                np.longdouble(0.1), np.uint8(200)] + CONSTANTS
    x = Value(0.0)
    outputs = [x * c for c in constants]
    m = compiler.compile(outputs[0], [x], outputs=outputs, cc=cc)
    m.set_input([1.0])
    m.forward()
    for got, c in zip(m.outputs(), constants):
        assert same(got, float(c)), (cc, float(c).hex(), float(got).hex())

    exponents = [-0.0, 0.0, 5e-324, -5e-324, 1e-300, 0.1, 1 / 3, 2.5, -1.5, 3.0, 1e300]

    def build(inputs, params):
        terms = [(params[0] * inputs[0]) ** k for k in exponents]
        return sum(terms[1:], terms[0]), terms
    assert_matches_interpreter(build, [[1.5], [0.25], [2.0]], [0.75], cc, vectorize=False)
