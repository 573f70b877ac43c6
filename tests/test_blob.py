"""Large tables of the generated C as hex blobs (compiler/codegen/blob.py):
the op table and the constants, unpacked once, give the interpreter's bits
(NaN, infinities and -0.0 among the constants) with every compiler."""
import math
import random

import pytest

from compiler.codegen import blob, table
from tests.differential import COMPILERS, assert_matches_interpreter, assert_train_batch_matches_interpreter
from tests.graphs import mlp_builder
from tests.test_op_table import EDGES, edge_graph

pytestmark = pytest.mark.skipif(not COMPILERS, reason="no C compiler installed")


@pytest.fixture
def always_blobs(monkeypatch):
    monkeypatch.setattr(table, 'TABLE_MIN_OPS', 0)
    monkeypatch.setattr(blob, 'MIN_VALUES', 0)


def constants_graph(inputs, params):
    """Constants of every kind (NaN, infinities, -0.0, subnormals, huge) the ops wrap."""
    x, y = inputs
    w, = params
    loss = x * w
    for c in (math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308, 0.1, -2.5):
        loss = loss + micrograd_max(x * c, y) * w
    return loss, [loss]


def micrograd_max(a, b):
    import micrograd
    return micrograd.max(a, b)


@pytest.mark.parametrize('cc', COMPILERS)
def test_blobs_give_the_interpreters_bits(always_blobs, cc):
    samples = [[a, b] for a in EDGES[::2] for b in EDGES[1::3]]
    m = assert_matches_interpreter(constants_graph, samples, [0.75], cc, vectorize=False, input_grads=True)
    assert 'vm_packed' in m.source and 'value_hex' in m.source
    m = assert_matches_interpreter(edge_graph, samples, [0.5, -0.0], cc, vectorize=True, input_grads=True)
    assert 'vm_packed' in m.source


@pytest.mark.parametrize('cc', COMPILERS)
def test_training_from_blobs(always_blobs, cc):
    sizes = [3, 4, 2]
    rng = random.Random(1)
    n = sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))
    params = [rng.uniform(-1, 1) for _ in range(n)]
    X = [[rng.uniform(-1, 1) for _ in range(3)] + [0.0, 1.0] for _ in range(5)]
    assert_train_batch_matches_interpreter(mlp_builder(sizes), X, params, 0.1, cc, steps=2, vectorize=False)


def test_the_blob_literal_is_the_bytes():
    data = bytes(range(256)) * 3
    text = blob.literal('x', data)
    assert text.startswith('static const char x[] =\n"') and text.endswith('";')
    digits = ''.join(line.strip().strip('";').split('"')[-1] for line in text.splitlines()[1:])
    assert bytes.fromhex(digits) == data
    assert max(len(line) for line in text.splitlines()) <= blob.LINE + 3


def test_the_build_reports_the_op_table(monkeypatch):
    import compiler
    from tests.differential import FAST_CC
    from tests.graphs import every_op_graph
    loss, inputs, params, outputs = every_op_graph()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    assert m.build.table_ops == 0 and m.build.scalar_code() == 'straight-line statements'
    monkeypatch.setattr(table, 'TABLE_MIN_OPS', 0)
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    n = m.source.count('\n') and int(m.source.split('the scalar op table: ')[1].split(' ops')[0].replace(',', ''))
    assert m.build.table_ops == n > 0
    assert m.build.scalar_code() == f'an op table of {n:,} scalar ops, one C loop each way'
    assert 'op table' in m.summary()


def exponents_graph(inputs, params):
    """Exponents that are equal as numbers but not as bits (0.0 and -0.0), and repeated ones."""
    x, y = inputs
    w, = params
    terms = [x ** 0.0, x ** -0.0, (x * w) ** 2, (y * w) ** 2, y ** -0.0, x ** 3, (x + y) ** 0.0]
    loss = terms[0] * w
    for t in terms[1:]:
        loss = loss + t * w
    return loss, terms


@pytest.mark.parametrize('cc', COMPILERS)
def test_the_table_keeps_exponents_apart_by_their_bits(always_blobs, cc):
    samples = [[a, b] for a in EDGES[::2] for b in EDGES[1::2]]
    m = assert_matches_interpreter(exponents_graph, samples, [0.75], cc, vectorize=False, input_grads=True)
    assert 'static const double vm_k[4] =' in m.source     # the distinct exponents 0.0, -0.0, 2.0, 3.0
