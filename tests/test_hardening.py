"""Hardening: hostile graphs, exact literals, bad arguments, threads.

1. Nothing from the user's graph reaches the C text but numbers the compiler
   formats and slot indices: labels leave the source byte-identical, unknown
   or disguised op names and malformed graphs are a ``TraceError``.
2. Every numeric literal in the kernels is a floating literal the compiler
   wrote exactly (no bare integers, no suffixes); constants survive each C
   compiler bit for bit.
3. Every entry point refuses bad arguments with a clear exception naming the
   function and the argument, leaves the module's state as it was, and
   releases every buffer it took; a fuzzer in a subprocess calls them in
   random order with random arguments.
4. Modules are independent; ``train_batch`` and ``predict`` release the GIL,
   and a second thread calling into the same module is refused.
"""
import gc
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from fractions import Fraction

import numpy as np
import pytest

import compiler
import micrograd
from compiler.codegen import c_double
from compiler.load import load_module
from compiler.ops import OPS
from micrograd import Value
from micrograd.nn import MLP

from differential import COMPILERS, assert_matches_interpreter, same
from fuzz_module import compile_small, small_graph

pytestmark = pytest.mark.skipif(not COMPILERS, reason="no C compiler installed")
FAST_CC = 'tcc' if 'tcc' in COMPILERS else (COMPILERS[0] if COMPILERS else None)
FUZZ = os.path.join(os.path.dirname(__file__), 'fuzz_module.py')

HOSTILE = ['*/ system("id"); /*', '"); system("id"); ("', "'", '\n#include <stdlib.h>\nint x;\n',
           '\\', '%s%s%n', '${kernels}', '$n_slots', '}; void evil(void) {', '\r\n', '\x00',
           '??/', 'relu */ /*', 'data[0] = 1;', 'é\u202e']


# -- 1. no injection -------------------------------------------------------------

def every_op_graph():
    """A graph with every op of the op table. Returns (loss, inputs, params, outputs)."""
    x, t = Value(0.0), Value(0.0)
    w, b, v = Value(0.5), Value(-0.25), Value(1.5)
    h = (x * w + b).tanh()
    y = micrograd.max(h, x / v).relu() - h.sigmoid() + (h * h + 1.0).log() + (-h).exp()
    loss = (y - t) ** 2 + v ** -1.5
    return loss, [x, t], [w, b, v], [y, h]


def emit(graph, vectorize=True):
    loss, inputs, params, outputs = graph
    program = compiler.trace(loss, inputs, params, outputs)
    if vectorize:
        program = compiler.lift_loops(program)
    return compiler.emit_module(program)


def nodes_of(graph):
    loss, _, _, outputs = graph
    return micrograd.topological_order([loss, *outputs])


@pytest.mark.parametrize('vectorize', [True, False])
@pytest.mark.parametrize('hostile', HOSTILE)
def test_labels_leave_the_c_source_byte_identical(hostile, vectorize):
    plain = emit(every_op_graph(), vectorize)
    graph = every_op_graph()
    for i, v in enumerate(nodes_of(graph)):
        v.label = hostile + str(i)
        if v._op not in ('**', ''):
            v._arg = hostile          # only the exponent of '**' is read
    labelled = emit(graph, vectorize)
    assert labelled == plain
    assert 'system' not in labelled and 'evil' not in labelled


@pytest.mark.parametrize('hostile', HOSTILE + ['Relu', 'relu ', ' +', '+\n', 'pow', 'sqrt', ''])
def test_an_interior_node_with_an_unknown_op_is_a_trace_error(hostile):
    graph = every_op_graph()
    interior = [v for v in nodes_of(graph) if v._prev]
    for victim in (interior[0], interior[len(interior) // 2], graph[0]):
        old, victim._op = victim._op, hostile
        with pytest.raises(compiler.TraceError, match='unknown op') as e:
            compiler.trace(graph[0], graph[1], graph[2], graph[3])
        assert isinstance(e.value, TypeError)
        victim._op = old


class Disguised(str):
    """A string that claims to equal, and hash like, every op name."""

    def __eq__(self, other):
        return True

    def __hash__(self):
        return hash('relu')


@pytest.mark.parametrize('op', [Disguised('*/ system("id"); /*'), Disguised('relu'), 42, None,
                                ('relu',), b'relu', ['+']])
def test_an_op_that_is_not_exactly_a_str_is_a_trace_error(op):
    graph = every_op_graph()
    victim = [v for v in nodes_of(graph) if v._op == 'relu'][0]
    victim._op = op
    with pytest.raises(compiler.TraceError, match='unknown op'):
        compiler.trace(graph[0], graph[1], graph[2], graph[3])


def test_a_hostile_op_is_refused_before_anything_is_built(monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("build_extension was called")
    monkeypatch.setattr(compiler, 'build_extension', no_build)
    loss, inputs, params, outputs = every_op_graph()
    loss._op = '*/ system("id"); /*'
    with pytest.raises(compiler.TraceError):
        compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)


@pytest.mark.parametrize('where', ['constant', 'inputs', 'params'])
@pytest.mark.parametrize('op', ['*', 'relu', '*/ system("id"); /*'])
def test_a_leaf_with_an_op_is_a_trace_error(where, op):
    x, w = Value(0.0), Value(2.0)
    c = Value(3.0)
    loss = x * w + c
    {'constant': c, 'inputs': x, 'params': w}[where]._op = op
    with pytest.raises(compiler.TraceError, match='leaf'):
        compiler.trace(loss, [x], [w])


def test_wrong_arity_is_a_trace_error():
    x, w = Value(0.0), Value(2.0)
    for op, operands in [('relu', (x, w)), ('+', (x,)), ('*', (x, w, x)), ('neg', (x, x)), ('**', (x, w))]:
        y = x * w
        y._op, y._prev, y._arg = op, operands, 2.0
        with pytest.raises(compiler.TraceError, match='operands, expected'):
            compiler.trace(y.tanh(), [x], [w])


@pytest.mark.parametrize('k', ['2', None, True, Value(2.0), 2j, [2.0], '*/ system("id"); /*'])
def test_a_non_numeric_exponent_is_a_trace_error(k):
    x = Value(0.0)
    y = x ** 2
    y._arg = k
    with pytest.raises(compiler.TraceError, match="exponent of '\\*\\*'"):
        compiler.trace(y, [x])


@pytest.mark.parametrize('k', [np.int64(3), np.float32(0.5), Fraction(1, 3), np.float64(-1.5), 2])
def test_numeric_exponents_of_any_real_type_are_emitted_exactly(k):
    x = Value(0.0)
    y = x ** 2
    y._arg = k
    source = emit((y, [x], [], []))
    assert f'pow(data[0], {c_double(float(k))})' in source


@pytest.mark.parametrize('bad', ['1.5', 'nan', None, True, 1 + 2j, [1.0], object()])
@pytest.mark.parametrize('where', ['constant', 'inputs', 'params'])
def test_non_numeric_data_is_a_trace_error(where, bad):
    x, w, c = Value(0.0), Value(2.0), Value(3.0)
    loss = x * w + c
    {'constant': c, 'inputs': x, 'params': w}[where].data = bad
    name = {'constant': "constant leaf's data", 'inputs': r'inputs\[0\].data', 'params': r'params\[0\].data'}[where]
    with pytest.raises(compiler.TraceError, match=name):
        compiler.trace(loss, [x], [w])
    with pytest.raises(compiler.TraceError, match=name):     # compile() reads params' data
        compiler.compile(loss, [x], [w], cc=FAST_CC)


def test_numpy_scalar_data_is_read_as_its_float():
    x, w, c = Value(0.0), Value(2.0), Value(3.0)
    loss = x * w + c
    c.data, w.data = np.float32(0.1), np.float16(0.3)
    program = compiler.trace(loss, [x], [w])
    assert program.constants == {2: float(np.float32(0.1))}
    m = compiler.compile(loss, [x], [w], cc=FAST_CC)
    assert m.params()[0] == float(np.float16(0.3))


def test_malformed_graphs_are_trace_errors():
    def fresh():
        x, w = Value(0.0), Value(2.0)
        y = x * w
        return x, w, y, y.relu()

    x, w, y, z = fresh()
    y._prev = (x, 3.0)                       # a number among the operands
    with pytest.raises(compiler.TraceError, match='not a Value'):
        compiler.trace(z, [x], [w])
    x, w, y, z = fresh()
    y._prev = (x, [w])                       # an unhashable one
    with pytest.raises(compiler.TraceError, match='not a Value'):
        compiler.trace(z, [x], [w])
    x, w, y, z = fresh()
    y._prev = [x, w]                         # a list instead of a tuple
    with pytest.raises(compiler.TraceError, match='tuple'):
        compiler.trace(z, [x], [w])
    x, w, y, z = fresh()
    y._prev = (z, w)                         # a cycle
    with pytest.raises(compiler.TraceError, match='cycle'):
        compiler.trace(z, [x], [w])

    class LooksLikeAValue:
        _prev, _op, data = (), '', 1.0
    x, w, y, z = fresh()
    y._prev = (x, LooksLikeAValue())
    with pytest.raises(compiler.TraceError, match='LooksLikeAValue'):
        compiler.trace(z, [x], [w])


# -- 2. exact, portable literals ---------------------------------------------------

C_NUMBER = re.compile(r'(?<![\w.])(0[xX][0-9a-fA-F]*\.?[0-9a-fA-F]*(?:[pP][+-]?\d+)?'
                      r'|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)([uUlLfF]*)(?![\w.])')
# Declarations of integers and pointers (slot offsets, loop counters, flags, row orders).
INTEGER_DECLARATION = re.compile(r'^(?:static\s+)?(?:const\s+)?(?:Py_ssize_t|int|double\s*\*\s*restrict'
                                 r'|double\s+\*|static\s+NOINLINE|static\s+void)\b|\*\s*restrict')
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
    ``memset`` sizes, integer and pointer declarations, and assignments to
    integer variables (a lifted loop's counters and flags)."""
    kernels = source[source.index('/* ---- the program'):source.index('/* ---- module state')]
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
        code = _drop_balanced(code, '[', '[', ']')
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
@pytest.mark.parametrize('op', OPS)
def test_every_kernel_literal_is_an_exact_floating_literal(op, vectorize):
    source = emit(literal_graph(op), vectorize)
    assert kernel_literal_problems(source) == []


@pytest.mark.parametrize('vectorize', [True, False])
def test_lifted_loops_have_only_index_integers(vectorize):
    graph = matvec_graph()
    source = emit(graph, vectorize)
    assert ('matvec' in source) == vectorize
    assert kernel_literal_problems(source) == []


def test_the_literal_checker_finds_bad_literals():
    good = '/* ---- the program */\n    data[3] = data[1] * 0x1.999999999999ap-4 + 2.0;\n/* ---- module state */'
    assert kernel_literal_problems(good) == []
    for bad in ['2', '0.1', '1e300', '2.0L', '1.5f', '0x10', '1.0e5']:
        text = good.replace('2.0', bad)
        assert kernel_literal_problems(text), bad
    wrap = '/* ---- the program */\n{}\n/* ---- module state */'.format
    assert kernel_literal_problems(wrap('    if (data[3] >= 2) grad[1] += grad[5];'))
    assert kernel_literal_problems(wrap('    int flag = 1;\n    if (data[2] < 0) flag = 0;'))
    assert kernel_literal_problems(wrap('    int n = 1;\n    if (data[n] > 0) n = 2;'))
    assert not kernel_literal_problems(wrap('    int n = 1, *restrict count = index;\n'
                                            '    if (n == 0) count[n] = 0;'))
    assert not kernel_literal_problems(wrap('    int flag = 1;\n    if (data[2] < 0.0) flag = 0;\n'
                                            '    for (Py_ssize_t r = 0; r < 4; r++) y[r + 1] = 1.0;'))


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


# -- 3. arguments of the compiled module -----------------------------------------------

@pytest.fixture(scope='module')
def small():
    return compile_small(FAST_CC)


P0 = np.linspace(-0.6, 0.6, 13)


def reset(m):
    m.set_params(P0)
    m.set_input([0.25, -0.5, 1.0])
    m.zero_grad()
    m.forward()
    m.backward()


def snapshot(m):
    data, grad = np.empty(m.module.n_slots), np.empty(m.n_params)
    m.module.read_data(data)
    m.module.read_grads(grad)
    return data, grad


def watched(args):
    objs = []
    for a in args:
        objs.append(a)
        if isinstance(a, (list, tuple)):
            objs.extend(a)
    return [o for o in objs if type(o) not in (int, bool, type(None))]


def assert_refused(m, fn, args, exc, words):
    """``fn(*args)`` raises ``exc`` with every one of ``words`` in its message,
    leaves the module's values and gradients unchanged and every argument's
    reference count as it was (an unreleased buffer holds a reference)."""
    before = snapshot(m)
    objs = watched(args)
    counts = [sys.getrefcount(o) for o in objs]
    with pytest.raises(exc) as e:
        fn(*args)
    message = str(e.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    del e
    assert [sys.getrefcount(o) for o in objs] == counts, "an argument's reference count changed"
    after = snapshot(m)
    assert np.array_equal(before[0], after[0], equal_nan=True) and np.array_equal(before[1], after[1])


def readonly(a):
    a.flags.writeable = False
    return a


class Boom:
    def __float__(self):
        raise ZeroDivisionError("from __float__")


N_IN, N_P, N_OUT = 3, 13, 2
good_X = np.zeros((4, N_IN))
good_out = np.zeros((4, N_OUT))


def bad_buffers(func, arg, n, writable):
    """The usual bad 1-D buffers for argument ``arg`` of ``func`` expecting
    ``n`` float64: (name, the arguments, exception, words of its message)."""
    cases = [
        ('list', ([0.0] * n,), TypeError, [f'{func}()', arg, 'buffer']),
        ('str', ('abc',), TypeError, [f'{func}()', arg]),
        ('None', (None,), TypeError, [f'{func}()', arg]),
        ('bytes', (b'\0' * (8 * n),), TypeError, [f'{func}()', arg, "format 'B'"]),
        ('float32', (np.zeros(n, np.float32),), TypeError, [arg, "format 'f'", 'itemsize 4']),
        ('int64', (np.zeros(n, np.int64),), TypeError, [arg, "format 'l'"]),
        ('object', (np.array([0.5] * n, dtype=object),), TypeError, [arg, "format 'O'"]),
        ('bigendian', (np.zeros(n, '>f8'),), TypeError, [arg, "'>d'"]),
        ('short', (np.zeros(n - 1),), ValueError, [f'{func}()', arg, f'expected {n}']),
        ('long', (np.zeros(n + 1),), ValueError, [arg, f'expected {n}']),
        ('2d', (np.zeros((1, n)),), ValueError, [arg, '1-dimensional']),
        ('strided', (np.zeros(2 * n)[::2],), ValueError, [arg, 'C-contiguous']),
        ('reversed', (np.zeros(n)[::-1],), ValueError, [arg, 'C-contiguous']),
        ('nargs0', (), TypeError, [f'{func}() takes 1 argument (0 given)']),
        ('nargs2', (np.zeros(n), np.zeros(n)), TypeError, [f'{func}() takes 1 argument (2 given)']),
    ]
    if writable:
        cases.append(('readonly', (readonly(np.zeros(n)),), ValueError, [arg, 'read-only']))
        cases.append(('bytes-view', (memoryview(bytes(8 * n)).cast('d'),), ValueError, [arg, 'read-only']))
    return cases


def _cases():
    """(entry point, a function of the model giving the arguments, exception, words of its message)."""
    cases = []

    def add(func, name, args, exc, words):
        make = args if callable(args) else (lambda m: args)
        cases.append(pytest.param(func, make, exc, words, id=f'{func}-{name}'))

    for func, arg, n, writable in [('set_input', 'values', N_IN, False), ('read_params', 'out', N_P, True),
                                   ('read_grads', 'out', N_P, True), ('write_params', 'values', N_P, False),
                                   ('read_outputs', 'out', N_OUT, True), ('read_data', 'out', 99, True)]:
        for name, args, exc, words in bad_buffers(func, arg, n, writable):
            if func == 'set_input' and name == 'list':
                continue             # set_input takes lists
            if func == 'read_data' and name in ('short', 'long'):
                continue             # its length is the program's slot count: below
            add(func, name, args, exc, words)
    add('read_data', 'short', lambda m: (np.zeros(m.module.n_slots - 1),), ValueError,
        ['read_data()', 'out', 'expected'])
    add('set_input', 'short-list', ([0.0] * (N_IN - 1),), ValueError, ['set_input()', 'values', 'expected 3'])
    add('set_input', 'long-tuple', ((0.0,) * (N_IN + 1),), ValueError, ['values has 4 values'])
    add('set_input', 'str-item', ([0.0, 'a', 0.0],), TypeError, ['set_input()', 'values[1]', 'str'])
    add('set_input', 'none-item', ((0.0, 0.0, None),), TypeError, ['values[2]', 'NoneType'])
    add('set_input', 'complex-item', ([1j, 0.0, 0.0],), TypeError, ['values[0]', 'complex'])
    add('set_input', 'list-item', ([[0.0], 0.0, 0.0],), TypeError, ['values[0]'])
    add('set_input', 'huge-item', ([0.0, 10 ** 400, 0.0],), ValueError, ['values', 'too large'])
    add('set_input', 'float-raises', ([0.0, 0.0, Boom()],), ZeroDivisionError, ['from __float__'])
    add('set_input', 'dict', ({},), TypeError, ['set_input()', 'values', 'list of numbers'])
    add('set_input', 'number', (3.0,), TypeError, ['set_input()', 'values'])
    add('write_params', 'nan', (np.array([0.0] * 5 + [math.nan] + [0.0] * 7),), ValueError,
        ['write_params()', 'values[5]', 'not finite'])
    add('write_params', 'inf', (np.full(N_P, -math.inf),), ValueError, ['values[0]', 'not finite'])
    for name, lr, exc, words in [('str', 'a', TypeError, ['lr', 'real number', 'str']),
                                 ('None', None, TypeError, ['lr']), ('list', [0.1], TypeError, ['lr']),
                                 ('complex', 0.1j, TypeError, ['lr']), ('nan', math.nan, ValueError, ['lr', 'finite']),
                                 ('inf', math.inf, ValueError, ['lr', 'finite']), ('-inf', -math.inf, ValueError, ['lr']),
                                 ('negative', -0.1, ValueError, ['lr', '>= 0']),
                                 ('huge', 10 ** 400, ValueError, ['lr', 'too large'])]:
        add('update', f'lr-{name}', (lr,), exc, ['update()'] + words)
        add('train_batch', f'lr-{name}', (good_X, lr), exc, ['train_batch()'] + words)
    add('update', 'lr-raises', (Boom(),), ZeroDivisionError, ['from __float__'])
    add('update', 'nargs0', (), TypeError, ['update() takes 1 argument (0 given)'])
    add('update', 'nargs2', (0.1, 0.1), TypeError, ['update() takes 1 argument (2 given)'])
    for func in ('forward', 'backward', 'zero_grad'):
        add(func, 'nargs1', (0.0,), TypeError, [f'{func}() takes 0 arguments (1 given)'])
    for name, X, exc, words in [
            ('1d', np.zeros(N_IN), ValueError, ['X', '2-dimensional']),
            ('3d', np.zeros((2, N_IN, 1)), ValueError, ['X', '2-dimensional']),
            ('cols', np.zeros((4, N_IN + 1)), ValueError, ['X has 4 columns, expected 3']),
            ('float32', np.zeros((4, N_IN), np.float32), TypeError, ['X', "format 'f'"]),
            ('int64', np.zeros((4, N_IN), np.int64), TypeError, ['X', "format 'l'"]),
            ('object', np.full((4, N_IN), 0.5, dtype=object), TypeError, ['X', "format 'O'"]),
            ('strided', np.zeros((4, 2 * N_IN))[:, ::2], ValueError, ['X', 'C-contiguous']),
            ('fortran', np.asfortranarray(np.zeros((4, N_IN))), ValueError, ['X', 'C-contiguous']),
            ('lists', [[0.0] * N_IN] * 4, TypeError, ['X', '2-D float64 buffer'])]:
        add('train_batch', f'X-{name}', (X, 0.1), exc, ['train_batch()'] + words)
        add('predict', f'X-{name}', (X, good_out), exc, ['predict()'] + words)
    add('train_batch', 'X-empty', (np.zeros((0, N_IN)), 0.1), ValueError, ['train_batch()', 'no rows'])
    for name, out, exc, words in [
            ('rows', np.zeros((3, N_OUT)), ValueError, ['out has 3 rows, expected 4']),
            ('cols', np.zeros((4, N_OUT + 1)), ValueError, ['out has 3 columns, expected 2']),
            ('1d', np.zeros(4 * N_OUT), ValueError, ['out', '2-dimensional']),
            ('readonly', readonly(np.zeros((4, N_OUT))), ValueError, ['out', 'read-only']),
            ('strided', np.zeros((4, 2 * N_OUT))[:, ::2], ValueError, ['out', 'C-contiguous']),
            ('float32', np.zeros((4, N_OUT), np.float32), TypeError, ['out', "format 'f'"]),
            ('none', None, TypeError, ['out'])]:
        add('predict', f'out-{name}', (good_X, out), exc, ['predict()'] + words)
    for func in ('train_batch', 'predict'):
        add(func, 'nargs1', (good_X,), TypeError, [f'{func}() takes 2 arguments (1 given)'])
        add(func, 'nargs3', (good_X, good_out, 0.1), TypeError, [f'{func}() takes 2 arguments (3 given)'])
    return cases


@pytest.mark.parametrize('func, make, exc, words', _cases())
def test_bad_arguments_are_refused_clearly_and_change_nothing(small, func, make, exc, words):
    reset(small)
    assert_refused(small, getattr(small.module, func), make(small), exc, words)


def test_good_arguments_of_every_kind_are_accepted(small):
    reset(small)
    from array import array
    for values in ([0.5, 1, np.float32(0.25)], (0.5, 1.0, 0.25), np.array([0.5, 1.0, 0.25]),
                   array('d', [0.5, 1.0, 0.25]), memoryview(array('d', [0.5, 1.0, 0.25])),
                   np.array([0.5, 1.0, 0.25], '<f8'), readonly(np.array([0.5, 1.0, 0.25])),
                   np.zeros((2, 3))[1], np.zeros((3, 1))[:, 0]):
        small.set_input(values)
    small.module.write_params(readonly(P0.copy()))
    small.update(np.float64(0.0))
    small.update(1)
    assert small.train_batch(np.zeros((3, 3)), -0.0) == small.train_batch(np.zeros((3, 3)), 0)
    small.module.predict(np.zeros((0, 3)), np.zeros((0, 2)))
    small.set_params(np.zeros(13, np.float32))
    small.set_params([0] * 13)
    assert not small.params().any()


@pytest.mark.parametrize('values, exc, words', [
    ('abc', TypeError, ['set_params()', 'real numbers', '<U3']),
    ([0.5, 'a'] + [0.0] * 11, TypeError, ['set_params()', 'real numbers']),
    ([None] * 13, TypeError, ['set_params()', 'object']),
    (np.zeros(13, dtype=bool), TypeError, ['set_params()', 'bool']),
    (np.zeros(13, dtype=complex), TypeError, ['set_params()', 'complex']),
    ([[0.0, 1.0], [2.0]], TypeError, ['set_params()', 'sequence of 13 numbers']),
    (np.zeros(14), ValueError, ['set_params()', 'shape (13,)', '(14,)']),
    (np.zeros((1, 13)), ValueError, ['set_params()', '(1, 13)']),
    ([math.nan] * 13, ValueError, ['set_params()', 'values[0]', 'not finite']),
])
def test_set_params_refuses_what_is_not_13_finite_reals(small, values, exc, words):
    reset(small)
    assert_refused(small, small.set_params, (values,), exc, words)


@pytest.mark.parametrize('X, exc, words', [
    ([[0.0] * 3], TypeError, ['predict()', '2-D float64 array', 'list']),
    (np.zeros(3), TypeError, ['predict()', 'shape (3,)']),
    (None, TypeError, ['predict()', 'NoneType']),
    (np.zeros((2, 4)), ValueError, ['predict()', 'X has 4 columns, expected 3']),
    (np.zeros((2, 3), np.float32), TypeError, ['predict()', "format 'f'"]),
])
def test_the_predict_wrapper_refuses_what_is_not_a_2d_array(small, X, exc, words):
    reset(small)
    assert_refused(small, small.predict, (X,), exc, words)


def test_backward_needs_a_forward_after_every_change(small):
    def refused():
        with pytest.raises(RuntimeError, match=r'backward\(\) needs the values of forward\(\)'):
            small.backward()

    fresh = load_module(small.build.path)     # a new module: nothing has run
    with pytest.raises(RuntimeError, match='needs the values of forward'):
        fresh.backward()
    reset(small)
    small.backward()                           # after forward: fine
    for change in (lambda: small.set_input([0.0, 0.0, 0.0]), lambda: small.update(0.1),
                   lambda: small.set_params(P0), lambda: small.train_batch(good_X, 0.1)):
        small.forward()
        change()
        refused()
    small.predict(good_X)                      # rows were run forward: backward may follow
    small.backward()
    small.set_input([0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        small.set_input([0.0])                 # a refused call changes nothing ...
    refused()                                  # ... not even this flag
    small.forward()
    with pytest.raises(TypeError):
        small.set_input('abc')
    small.backward()


def _export_free(ba):
    """True if nothing holds a buffer of the bytearray ``ba`` (it can be resized)."""
    try:
        ba.append(0)
        del ba[-1]
        return True
    except BufferError:
        return False


@pytest.mark.parametrize('func, shape, fmt, writable, other', [
    ('set_input', (N_IN + 1,), 'd', True, None),
    ('set_input', (1, N_IN), 'd', True, None),
    ('set_input', (N_IN,), 'f', True, None),
    ('set_input', (2 * N_IN,), 'd', True, 'strided'),
    ('read_params', (N_P,), 'd', False, None),        # read-only
    ('read_params', (N_P - 1,), 'd', True, None),
    ('write_params', (N_P,), 'd', True, 'nan'),
    ('read_outputs', (N_OUT,), 'd', False, None),
    ('train_batch', (4, N_IN + 1), 'd', True, None),
    ('train_batch', (4, N_IN), 'f', True, None),
    ('predict', (4, N_IN), 'd', True, 'bad out'),
    ('predict', (4, N_IN), 'd', True, 'good'),
    ('set_input', (N_IN,), 'd', True, 'good'),
])
def test_every_buffer_is_released_after_a_refusal(small, func, shape, fmt, writable, other):
    """A bytearray cannot be resized while a buffer of it is exported, and a
    memoryview cannot be released while it is: both tell a leaked export."""
    reset(small)
    size = 8 if fmt == 'd' else 4
    ba = bytearray(size * int(np.prod(shape)))
    mv = memoryview(ba).cast('B').cast(fmt, shape)
    if other == 'nan':
        mv[3] = math.nan
    arg = mv if writable else mv.toreadonly()
    if other == 'strided':
        arg = mv[::2] if fmt == 'd' and len(shape) == 1 else mv
    out_rows = (shape[0] if len(shape) == 2 else 1) - (other == 'bad out')
    out_ba = bytearray(8 * out_rows * N_OUT)
    out_mv = memoryview(out_ba).cast('d', (out_rows, N_OUT))
    args = {'train_batch': (arg, 0.1), 'predict': (arg, out_mv)}.get(func, (arg,))
    if other == 'good':
        getattr(small.module, func)(*args)
    else:
        with pytest.raises((TypeError, ValueError)):
            getattr(small.module, func)(*args)
    for view in (arg, mv, out_mv):
        view.release()          # BufferError if the module kept an export
    assert _export_free(ba) and _export_free(out_ba)


@pytest.mark.parametrize('cc', COMPILERS)
def test_fuzz_random_calls_in_a_subprocess(cc, private_build_cache):
    """Random call sequences with random good and bad arguments (see
    tests/fuzz_module.py): no crash, no unclear error, no state change on
    error, no reference or memory growth."""
    calls = 40000 if cc == FAST_CC else 15000
    r = subprocess.run([sys.executable, FUZZ, '--calls', str(calls), '--seed', str(len(cc)), '--cc', cc],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'MICROGRAD_CACHE_DIR': private_build_cache})
    if r.returncode < 0:
        pytest.fail(f"the fuzzer was killed by {signal.Signals(-r.returncode).name}\n{r.stderr[-3000:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"fuzz [{cc}]: {report}")
    assert report['calls'] == calls
    assert report['succeeded'] > calls // 4 and sum(report['errors'].values()) > calls // 4
    assert report['traced_growth'] < 4096, report       # bytes traced by tracemalloc
    assert report['gc_objects_growth'] <= 10, report


def test_refused_calls_do_not_leak_memory(small):
    """What ``tracemalloc`` traces (``PyMem_Malloc`` scratch copies included)
    does not grow over thousands of refused calls."""
    import tracemalloc
    mod = small.module
    nan_params = np.full(N_P, math.nan)
    calls = [lambda: mod.set_input([0.0, None, 0.0]), lambda: mod.set_input((0.0, 0.0, 'x')),
             lambda: mod.set_input([0.0]), lambda: mod.set_input([0.0, 10 ** 400, 0.0]),
             lambda: mod.set_input(np.zeros(N_IN, np.float32)), lambda: mod.write_params(nan_params),
             lambda: mod.update(math.nan), lambda: mod.train_batch(np.zeros((4, N_IN + 1)), 0.1),
             lambda: mod.predict(good_X, np.zeros((3, N_OUT))), lambda: mod.read_params(readonly(np.zeros(N_P))),
             lambda: mod.forward(1)]

    def run(n):
        for _ in range(n):
            for call in calls:
                try:
                    call()
                except (TypeError, ValueError):
                    pass
    reset(small)
    tracemalloc.start()
    try:
        run(200)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        run(3000)
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a leak is at least one allocation (16 bytes or more) per refused call;
    # a few kilobytes come and go with the interpreter's own caches
    n = 3000 * len(calls)
    assert growth < n, f"{growth} bytes more after {n} refused calls"


def test_the_fuzzer_catches_a_leaked_reference(small):
    """The fuzzer's reference count check works: an argument that gains a
    reference during a call (as with a missing DECREF or PyBuffer_Release)
    is reported."""
    import fuzz_module
    fresh = load_module(small.build.path)     # the fuzzer starts from a module that has not run

    class Leaky:
        kept = []

        def __getattr__(self, name):
            real = getattr(fresh, name)
            if name != 'set_input':
                return real

            def set_input(*args):
                Leaky.kept.extend(args)
                return real(*args)
            return set_input
    with pytest.raises(AssertionError, match='set_input.*changed reference counts'):
        fuzz_module.fuzz(Leaky(), 2000, seed=1)


# -- 4. state and threads ---------------------------------------------------------

def test_two_loads_of_one_cached_shared_object_are_independent(small):
    again = compile_small(FAST_CC)            # the same graph: the cached .so
    assert again.build.cached and again.build.path == small.build.path
    third = load_module(small.build.path)
    assert again.module is not small.module and third is not small.module
    reset(small)
    again.set_params(P0 * 2)
    third.write_params(np.array(P0 * -1))
    for m in (again.module, third):
        m.set_input([0.25, -0.5, 1.0])
    losses = [small.forward(), again.forward(), third.forward()]
    assert len(set(losses)) == 3
    np.testing.assert_array_equal(small.params(), P0)
    np.testing.assert_array_equal(again.params(), P0 * 2)
    with pytest.raises(RuntimeError, match='needs the values of forward'):
        load_module(small.build.path).backward()   # and the flag is per module
    small.backward()


def big_batch(rows, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, N_IN))


def run_in_thread(fn, *args):
    result = {}

    def target():
        try:
            result['value'] = fn(*args)
        except BaseException as e:      # noqa: BLE001 -- reported by the caller
            result['error'] = e
    t = threading.Thread(target=target)
    t.start()
    return t, result


def test_two_models_in_two_threads_match_running_them_one_after_the_other(small):
    other = compiler.compile(*_mlp_regression(), cc=FAST_CC)
    X1, X2 = big_batch(20000, 1), np.random.default_rng(2).standard_normal((20000, 4))
    p_other = other.params()

    def steps(m, X, n=4):
        return [m.train_batch(X, 0.05) for _ in range(n)] + [m.predict(X[:50])]

    reset(small)
    seq = steps(small, X1), steps(other, X2)
    seq_params = small.params(), other.params()
    reset(small)
    other.set_params(p_other)
    t1, r1 = run_in_thread(steps, small, X1)
    t2, r2 = run_in_thread(steps, other, X2)
    t1.join()
    t2.join()
    assert 'error' not in r1 and 'error' not in r2, (r1.get('error'), r2.get('error'))
    for got, want in zip((r1['value'], r2['value']), seq):
        assert got[:4] == want[:4]
        np.testing.assert_array_equal(got[4], want[4])
    np.testing.assert_array_equal(small.params(), seq_params[0])
    np.testing.assert_array_equal(other.params(), seq_params[1])


def _mlp_regression():
    model = MLP(4, [16, 16, 1], seed=5)
    xs = [Value(0.0) for _ in range(4)]
    out = model(xs)
    return (out - xs[0] * 0.5) ** 2, xs, model.parameters(), [out]


def _refusals(probes, thread):
    """Call ``probes`` in turn while ``thread`` runs: the indices of those that
    were refused as "in use by another thread" (any other error is raised)."""
    refused = set()
    while thread.is_alive():
        for i, probe in enumerate(probes):
            try:
                probe()
            except RuntimeError as e:
                if 'needs the values of forward' in str(e):
                    continue       # backward() between the calls: not a refusal
                assert 'in use by another thread' in str(e)
                refused.add(i)
    return refused


def byte_views(*shapes):
    """Float64 memoryviews over bytearrays: the arrays tell if a view of them is still exported."""
    arrays = [bytearray(8 * int(np.prod(shape))) for shape in shapes]
    return arrays, [memoryview(a).cast('d', shape) for a, shape in zip(arrays, shapes)]


@pytest.mark.parametrize('call', ['train_batch', 'predict'])
def test_a_second_thread_in_the_same_module_is_refused_not_raced(small, call):
    """Every entry point is refused while another thread's call runs, and
    releases the buffers it was given. Observing the refusal also shows the
    GIL is released: the probing thread could not run at all otherwise."""
    X = big_batch(100000)
    out = np.empty((len(X), N_OUT))
    arrays, (params_v, input_v, X_v, out_v) = byte_views((N_P,), (N_IN,), (2, N_IN), (2, N_OUT))
    mod = small.module
    probes = [lambda: mod.read_params(params_v), lambda: mod.write_params(params_v),
              lambda: mod.set_input(input_v), lambda: mod.set_input([0.0] * N_IN),
              mod.forward, mod.backward, mod.zero_grad, lambda: mod.update(0.0),
              lambda: mod.train_batch(X_v, 0.0), lambda: mod.predict(X_v, out_v),
              lambda: mod.read_outputs(np.empty(N_OUT)), lambda: mod.read_data(np.empty(mod.n_slots))]
    twin = load_module(small.build.path)      # the same .so, its own state: never refused
    twin_probes = [twin.forward, lambda: twin.predict(X_v, out_v)]
    reset(small)
    refused, attempts = set(), 0
    while len(refused) < len(probes) and attempts < 40:
        attempts += 1
        args = (X, 0.0) if call == 'train_batch' else (X, out)
        t, result = run_in_thread(getattr(mod, call), *args)
        if attempts % 4:
            refused |= _refusals(probes, t)
        else:
            assert not _refusals(twin_probes, t), "a module with a state of its own was refused"
        t.join()
        assert 'error' not in result, result
    missing = [i for i in range(len(probes)) if i not in refused]
    assert not missing, f"probes {missing} never overlapped the running call in {attempts} attempts"
    for view in (params_v, input_v, X_v, out_v):
        view.release()          # BufferError if a refused call kept an export
    assert all(_export_free(a) for a in arrays)


def test_refused_calls_leave_the_running_call_exact(small):
    """While a train_batch runs, a second thread's calls are refused and
    change nothing: the result equals the same train_batch run alone."""
    X = big_batch(100000, 3)
    alone = compile_small(FAST_CC)
    reset(alone)
    expected = alone.train_batch(X, 0.05), alone.params()
    # each would corrupt the batch if it raced it, and is harmless after it
    probes = [lambda: small.module.set_input([9.0, 9.0, 9.0]), small.module.zero_grad]
    for attempt in range(20):
        reset(small)
        t, result = run_in_thread(small.module.train_batch, X, 0.05)
        refused = _refusals(probes, t)
        t.join()
        assert result['value'] == expected[0]
        np.testing.assert_array_equal(small.params(), expected[1])
        if refused:
            break
    assert refused, "the batch always finished before a second call got in"


@pytest.mark.parametrize('entry', ['update', 'set_input', 'train_batch'])
def test_a_conversion_that_lets_another_thread_start_is_still_refused(small, entry):
    """A ``__float__`` runs Python code, so another thread can start a
    train_batch in the middle of converting this call's arguments; the state
    is claimed only after the conversion, so this call is refused too."""
    X = big_batch(200000, 4)
    buf = np.empty(N_P)

    def wait_until_busy(thread):
        """Whether ``thread``'s call was seen running (refusing a probe)."""
        while thread.is_alive():
            try:
                small.module.read_params(buf)
            except RuntimeError:
                return True
        return False

    class LetsOthersIn:
        """Starts a train_batch in another thread, and returns once it runs."""
        thread = None

        def __float__(self):
            if LetsOthersIn.thread is None:
                LetsOthersIn.thread, _ = run_in_thread(small.module.train_batch, X, 0.05)
                self.seen = wait_until_busy(LetsOthersIn.thread)
            return 0.01

    refused_while_busy = 0
    for attempt in range(10):
        reset(small)
        LetsOthersIn.thread = None
        lr = LetsOthersIn()
        args = {'update': (lr,), 'set_input': ([0.0, lr, 0.0],), 'train_batch': (X[:3], lr)}[entry]
        try:
            getattr(small.module, entry)(*args)
            refused = False
        except RuntimeError as e:
            assert 'in use by another thread' in str(e)
            refused = True
        LetsOthersIn.thread.join()
        if lr.seen:        # the other call was running just before this one claimed the state
            refused_while_busy += refused
        if refused_while_busy >= 2:
            break
    assert refused_while_busy >= 1, "the other thread's call was never running when the conversion ended"
