"""Differential tests: compiled graphs against the interpreter, exactly."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compiler
import micrograd
from compiler.codegen import c_double
from micrograd import Value, cross_entropy, mse
from micrograd.nn import MLP

from tests.differential import COMPILERS, assert_matches_interpreter, same

pytestmark = pytest.mark.skipif(not COMPILERS, reason="no C compiler installed")

# -- random graphs using every op of the interpreter ---------------------------

UNARY = ['neg', 'relu', 'tanh', 'exp', 'log', 'sigmoid', 'pow']
BINARY = ['+', '-', '*', '/', 'max']
EXPONENTS = [2, 3, -1, 0.5, -1.5, 1 / 3, 0]
SPECIAL = [0.0, -0.0, 1.0, -2.5, 0.1, 1e-300, 5e-324, 1e300, math.inf, -math.inf, math.nan]


def apply(op, a, b, k):
    if op == 'pow':
        return a ** k
    if op in UNARY:
        return {'neg': lambda: -a, 'relu': a.relu, 'tanh': a.tanh, 'exp': a.exp,
                'log': a.log, 'sigmoid': a.sigmoid}[op]()
    if op == 'max':
        return micrograd.max(a, b)
    return {'+': lambda: a + b, '-': lambda: a - b, '*': lambda: a * b, '/': lambda: a / b}[op]()


@st.composite
def graphs(draw, max_ops=25):
    """A recipe: leaves, then ops over earlier nodes (reuse and sharing
    happen by drawing the same index twice), plain-number operands on
    either side, and a few outputs."""
    n_inputs = draw(st.integers(1, 4))
    n_params = draw(st.integers(1, 4))
    steps = []
    n_nodes = n_inputs + n_params
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(UNARY + BINARY))
        # bias towards recent nodes, so deep chains form
        pick = st.integers(0, n_nodes - 1).map(lambda i, n=n_nodes: max(i, n - 1 - i // 2))
        a = draw(pick)
        b = draw(st.one_of(pick, st.sampled_from(SPECIAL).map(lambda x: ('num', x)),
                           st.floats(-3, 3).map(lambda x: ('num', x))))
        swap = draw(st.booleans())
        steps.append((op, a, b, draw(st.sampled_from(EXPONENTS)), swap))
        n_nodes += 1
    outputs = draw(st.lists(st.integers(0, n_nodes - 1), max_size=3))
    return n_inputs, n_params, steps, outputs


def make_builder(recipe):
    n_inputs, n_params, steps, output_ids = recipe

    def build(inputs, params):
        nodes = list(inputs) + list(params)
        for op, a, b, k, swap in steps:
            x = nodes[a]
            y = b[1] if isinstance(b, tuple) else nodes[b]
            if op in BINARY and swap and isinstance(y, float):
                x, y = y, x      # a plain number on the left
            if isinstance(x, float):
                nodes.append(apply(op, Value(x), y, k) if op in UNARY or op == 'pow'
                             else {'+': lambda: x + y, '-': lambda: x - y, '*': lambda: x * y,
                                   '/': lambda: x / y, 'max': lambda: micrograd.max(x, y)}[op]())
            else:
                nodes.append(apply(op, x, y if op in BINARY else None, k))
        return nodes[-1], [nodes[i] for i in output_ids]
    return build


leaf_values = st.floats(-3, 3, allow_nan=False)


@pytest.mark.parametrize('vectorize_on', [True, False])
@pytest.mark.parametrize('cc', COMPILERS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=graphs(), data=st.data())
def test_random_graphs_match_the_interpreter_exactly(cc, vectorize_on, recipe, data):
    n_inputs, n_params = recipe[0], recipe[1]
    params = data.draw(st.lists(leaf_values, min_size=n_params, max_size=n_params))
    samples = data.draw(st.lists(st.lists(leaf_values, min_size=n_inputs, max_size=n_inputs),
                                 min_size=1, max_size=3))
    assert_matches_interpreter(make_builder(recipe), samples, params, cc, vectorize=vectorize_on)


@pytest.mark.parametrize('cc', COMPILERS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=graphs(), data=st.data())
def test_input_gradients_of_random_graphs_match_the_interpreter(cc, recipe, data):
    n_inputs, n_params = recipe[0], recipe[1]
    params = data.draw(st.lists(leaf_values, min_size=n_params, max_size=n_params))
    samples = data.draw(st.lists(st.lists(leaf_values, min_size=n_inputs, max_size=n_inputs),
                                 min_size=1, max_size=3))
    assert_matches_interpreter(make_builder(recipe), samples, params, cc,
                               vectorize=data.draw(st.booleans()), input_grads=True)


# -- training equivalence --------------------------------------------------------

XOR = [((0.0, 0.0), 0), ((0.0, 1.0), 1), ((1.0, 0.0), 1), ((1.0, 1.0), 0)]


def xor_graph(seed=0):
    model = MLP(2, [6, 2], seed=seed)
    xs = [Value(0.0), Value(0.0)]
    target = [Value(0.0), Value(0.0)]
    logits = model(xs)
    return model, xs, target, logits, cross_entropy(logits, target)


@pytest.mark.parametrize('cc', COMPILERS)
def test_training_20_sgd_steps_gives_identical_parameters(cc):
    model, xs, target, logits, loss = xor_graph()
    m = compiler.compile(loss, inputs=xs + target, params=model.parameters(), outputs=logits, cc=cc)
    X = np.array([[a, b, 1.0 - y, float(y)] for (a, b), y in XOR])
    lr = 0.5
    ref, _, _, _, _ = xor_graph()        # the interpreter, same initial weights
    for step in range(20):
        compiled_loss = m.train_batch(X, lr)
        ref.zero_grad()
        total = 0.0
        for (a, b), y in XOR:
            out = ref([a, b])
            sample_loss = cross_entropy(out, [1.0 - y, float(y)])
            sample_loss.backward()
            total += sample_loss.data
        for p in ref.parameters():
            p.data -= lr * (p.grad / len(XOR))
        assert same(compiled_loss, total / len(XOR)), f"step {step}"
    np.testing.assert_array_equal(m.params(), [p.data for p in ref.parameters()])
    assert compiled_loss < 0.6   # and it learned something


def mlp_on_leaves(sizes, seed, params):
    """An ``MLP`` whose parameters are the given leaf Values, in ``parameters()`` order."""
    model = MLP(sizes[0], sizes[1:], seed=seed)
    it = iter(params)
    for layer in model.layers:
        for n in layer.neurons:
            n.w = [next(it) for _ in n.w]
            n.b = next(it)
    return model


@pytest.mark.parametrize('cc', COMPILERS)
def test_mlp_regression_graph_matches(cc):
    def build(inputs, params):
        out = mlp_on_leaves([3, 4, 4, 1], 3, params)(inputs)
        return mse([out], [inputs[0] * 2]), [out]
    params = [p.data for p in MLP(3, [4, 4, 1], seed=3).parameters()]
    assert_matches_interpreter(build, [[0.1, -0.2, 0.3], [1.0, 2.0, -3.0]], params, cc)


# -- golden output -------------------------------------------------------------

def tiny_graph():
    x = Value(0.0)
    w = Value(0.5)
    y = (x * w + 2.0).relu()
    return x, w, y


def test_printed_program_is_golden():
    x, w, y = tiny_graph()
    assert str(compiler.trace(y, [x], [w])) == '\n'.join([
        'program: 6 slots, 3 ops',
        '  inputs  %0',
        '  params  %1',
        '  const   %2 = 2.0',
        '  %3 = *(%0, %1)',
        '  %4 = +(%3, %2)',
        '  %5 = relu(%4)',
        '  loss    %5',
    ])


def test_emitted_c_is_golden():
    x, w, y = tiny_graph()
    source = compiler.emit_module(compiler.trace(y, [x], [w]))
    # one row's values v (input, then computed), the parameters and constants p
    assert '\n'.join([
        'seg1_forward(double *restrict v, const double *restrict p)',
        '{',
        '    v[1] = v[0] * p[0];',
        '    v[2] = v[1] + p[1];',
        '    v[3] = v[2] < 0.0 ? 0.0 : v[2]; /* relu */',
        '}',
    ]) in source
    # the parameter's contribution is recorded in the row, for param_grads
    assert '\n'.join([
        'seg2_backward(const double *restrict v, double *restrict g, const double *restrict p, '
        'double *restrict gp)',
        '{',
        '    g[2] += (v[3] > 0.0) * g[3];',
        '    g[1] += g[2];',
        '    g[4] = v[0] * g[1];   /* for gp[0], added in row order by param_grads */',
        '}',
    ]) in source


# -- literals --------------------------------------------------------------------

@pytest.mark.parametrize('x, text', [
    (2.0, '2.0'), (-1.0, '(-1.0)'), (0.0, '0.0'), (-0.0, '(-0.0)'), (0.1, '0x1.999999999999ap-4'),
    (math.inf, 'INFINITY'), (-math.inf, '(-INFINITY)'), (math.nan, 'NAN'),
    (5e-324, '0x0.0000000000001p-1022'), (2.0 ** 60, '0x1.0000000000000p+60'),
])
def test_c_literals_are_exact(x, text):
    assert c_double(x) == text


@pytest.mark.parametrize('cc', COMPILERS)
def test_max_against_a_negative_zero_constant(cc):
    # clang 14 -O2 turns `a >= -0.0 ? a : -0.0` with a literal -0.0 into
    # maxsd, which returns -0.0 for a == +0.0; constants are read from slots
    def build(inputs, params):
        return micrograd.max(params[0], -0.0) + micrograd.max(-0.0, params[0]), []
    assert_matches_interpreter(build, [[0.0]], [0.0], cc)


@pytest.mark.parametrize('cc', COMPILERS)
def test_special_constants_survive_every_compiler(cc):
    specials = [math.inf, -math.inf, -0.0, 5e-324, 2.2250738585072014e-308 / 3, 0.1, 1e308, np.float64(1.5)]

    def build(inputs, params):
        terms = [inputs[0] * s for s in specials]   # constants as operands
        return params[0] * inputs[0], terms
    m = assert_matches_interpreter(build, [[1.0], [-1.0]], [0.5], cc)
    init = m.source[m.source.index('\ninit_constants(double'):]   # the definition (program.h declares it)
    init = init[:init.index('\n}')]
    # finite constants from a table, in slot order; inf and nan set after it
    assert '    p[1] = INFINITY;' in init and '    p[2] = (-INFINITY);' in init
    assert '0.0, 0.0, (-0.0), 0x0.0000000000001p-1022' in init
    m.set_input([1.0])
    m.forward()
    got = m.outputs()
    for g, s in zip(got, specials):
        assert same(g, float(s)), (g, s)


# -- the module's independence, size, and API --------------------------------------

def test_two_models_in_one_process_are_independent():
    cc = COMPILERS[0]
    a = Value(0.0)
    w1, w2 = Value(2.0), Value(3.0)
    m1 = compiler.compile(a * w1, [a], [w1], cc=cc)
    m2 = compiler.compile(a * w2 + 1.0, [a], [w2], cc=cc)
    m3 = compiler.compile(a * w1, [a], [w1], cc=cc)     # same graph, same .so
    for m in (m1, m2, m3):
        m.set_input([5.0])
    m3.set_params([7.0])
    assert (m1.forward(), m2.forward(), m3.forward()) == (10.0, 16.0, 35.0)


def test_a_100000_node_graph_compiles_with_tcc():
    if 'tcc' not in COMPILERS:
        pytest.skip("tcc is not installed")
    x, w = Value(0.0), Value(1.0)
    y = x
    for _ in range(50_000):
        y = y * w + 1e-6
    assert len(compiler.trace(y, [x], [w]).ops) == 100_000
    m = compiler.compile(y, [x], [w], cc='tcc')
    m.set_input([0.0])
    y.backward()
    assert same(m.forward(), y.data)
    m.backward()
    assert same(m.grads()[0], w.grad)


def test_inputs_and_params_may_be_generators():
    model, xs, target, logits, loss = xor_graph(seed=1)
    m = compiler.compile(loss, inputs=iter(xs + target), params=(p for p in model.parameters()),
                         outputs=iter(logits), cc=COMPILERS[0])
    np.testing.assert_array_equal(m.params(), [p.data for p in model.parameters()])
    assert m.n_outputs == 2


def test_api_batches_and_buffers():
    cc = COMPILERS[0]
    model, xs, target, logits, loss = xor_graph(seed=1)
    m = compiler.compile(loss, inputs=xs + target, params=model.parameters(), outputs=logits, cc=cc)
    X = np.array([[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    preds = m.predict(X)
    assert preds.shape == (2, 2)
    for row, pred in zip(X, preds):
        m.set_input(row)                      # a numpy row
        m.forward()
        np.testing.assert_array_equal(m.outputs(), pred)
    from array import array
    m.set_input(array('d', X[0]))
    m.set_input(memoryview(array('d', X[0])))
    m.set_input(tuple(X[0]))
    p = m.params()
    m.set_params(p * 2)
    np.testing.assert_array_equal(m.params(), p * 2)
    m.zero_grad()
    assert not m.grads().any()
    m.set_input(X[0]); m.forward(); m.backward()
    g = m.grads()
    m.forward(); m.backward()
    np.testing.assert_array_equal(m.grads(), 2 * g)   # gradients accumulate until zero_grad
    m.update(0.1)
    np.testing.assert_array_equal(m.params(), p * 2 - 0.1 * (2 * g))


@pytest.mark.skipif(not COMPILERS, reason="no C compiler installed")
def test_compile_leaves_the_cyclic_gc_as_it_found_it():
    # compile() pauses the cyclic collector while it traces; it must come back
    # on (or stay off) whatever happens
    import gc
    a, b = Value(1.0), Value(2.0)
    assert gc.isenabled()
    compiler.compile(a * b, [a], [b], cc=COMPILERS[0])
    assert gc.isenabled()
    with pytest.raises(compiler.TraceError):
        compiler.compile(a * b, [a], [b, b], cc=COMPILERS[0])
    assert gc.isenabled()
    gc.disable()
    try:
        compiler.compile(a * b, [a], [b], cc=COMPILERS[0])
        assert not gc.isenabled()
    finally:
        gc.enable()
