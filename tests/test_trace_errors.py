"""Nothing from the user's graph reaches the C text but numbers the compiler
formats and slot indices: labels leave the source byte-identical, unknown or
disguised op names and malformed graphs are a ``TraceError``."""
from fractions import Fraction

import numpy as np
import pytest

import compiler
from compiler.codegen import c_double
from micrograd import Value

from tests.differential import FAST_CC
from tests.graphs import emit, every_op_graph, nodes_of

HOSTILE = ['*/ system("id"); /*', '"); system("id"); ("', "'", '\n#include <stdlib.h>\nint x;\n',
           '\\', '%s%s%n', '${kernels}', '$n_slots', '}; void evil(void) {', '\r\n', '\x00',
           '??/', 'relu */ /*', 'data[0] = 1;', 'é\u202e']


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
    assert f'pow(v[0], {c_double(float(k))})' in source


@pytest.mark.parametrize('bad', ['1.5', 'nan', None, True, 1 + 2j, [1.0], object()])
@pytest.mark.parametrize('where', ['constant', 'inputs', 'params'])
def test_non_numeric_data_is_a_trace_error(where, bad):
    x, w, c = Value(0.0), Value(2.0), Value(3.0)
    loss = x * w + c
    leaf = {'constant': c, 'inputs': x, 'params': w}[where]
    with pytest.raises(TypeError, match='real number'):
        leaf.data = bad                 # Value.data refuses it ...
    leaf._data = bad                    # ... and trace too, if it got there anyway
    name = {'constant': "constant leaf's data", 'inputs': r'inputs\[0\].data', 'params': r'params\[0\].data'}[where]
    with pytest.raises(compiler.TraceError, match=name):
        compiler.trace(loss, [x], [w])
    with pytest.raises(compiler.TraceError, match=name):     # compile() reads params' data
        compiler.compile(loss, [x], [w], cc=FAST_CC)


def test_numpy_scalar_data_is_read_as_its_float():
    x, w, c = Value(0.0), Value(2.0), Value(3.0)
    loss = x * w + c
    c.data, w.data = np.float32(0.1), np.float16(0.3)
    assert type(c.data) is float and type(w.data) is float
    program = compiler.trace(loss, [x], [w])
    assert program.constants == {2: float(np.float32(0.1))}
    with pytest.warns(UserWarning, match='compiled as constants'):    # c: neither input nor param
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
