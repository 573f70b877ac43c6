"""The vectorizing pass: what it recognises, what it leaves alone, and that
every program it produces matches the interpreter bit for bit."""
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compiler
from compiler.ir import MatVec, Op
from compiler.vectorize import vectorize
from micrograd import Value
from micrograd.nn import MLP
from mnist_data import mnist_graph

from tests.differential import (COMPILERS, assert_matches_interpreter, compile_graph,
                                assert_train_batch_matches_interpreter, needs_cc, same)
from tests.graphs import mlp_builder


def vector_op_kinds(program):
    return [type(op).__name__ for op in program.ops if not isinstance(op, Op)]


def test_the_mnist_graph_becomes_two_matvecs_and_under_2000_lines_of_c():
    g = mnist_graph([50])
    program = vectorize(compiler.trace(g.loss, g.inputs, g.params, g.logits))
    mvs = [op for op in program.ops if isinstance(op, MatVec)]
    assert [(m.rows, m.cols) for m in mvs] == [(50, 784), (10, 50)]
    # each layer's weights are renumbered column by column, its biases after them
    assert 'matvec(W=%794[50x784, by column], x=%0..%783, heads=%39994..%40043)' in str(program)
    source = compiler.emit_module(program)
    generated = source[source.index('/* ---- the program'):source.index('/* ---- tables')]
    assert len(generated.splitlines()) < 2000      # besides the fixed C of templates/


def test_the_pass_lays_each_weight_matrix_out_by_column_and_keeps_params_order():
    g = mnist_graph([3])
    traced = compiler.trace(g.loss, g.inputs, g.params, g.logits)
    program = vectorize(traced)
    mv = next(op for op in program.ops if isinstance(op, MatVec))
    slots = program.param_slots
    # params: neuron r's 784 weights, then its bias (nn.Neuron's order)
    for r in range(3):
        for c in (0, 1, 783):
            assert slots[r * 785 + c] == mv.wt0 + c * 3 + r
        assert slots[r * 785 + 784] == mv.heads[r]
    assert sorted(slots) == list(range(program.param_start, program.param_end))
    assert traced.param_order is None and list(traced.param_slots) == list(range(794, 794 + len(slots)))


@needs_cc
def test_a_layer_whose_weights_are_listed_in_any_order_is_lifted_and_exact():
    # params listed backwards: the pass still lays W out as one block
    def build(inputs, params):
        W = [[params[len(params) - 1 - (r * 3 + c)] for c in range(3)] for r in range(4)]
        ys = [sum((w * x for w, x in zip(row, inputs)), Value(0.0)) for row in W]
        return sum(y.tanh() for y in ys), ys
    params = [0.1 * i - 0.5 for i in range(12)]
    m = assert_matches_interpreter(build, [[0.5, -1.0, 2.0], [0.0, 1.0, 0.0]], params, COMPILERS[0])
    assert 'MatVec' in vector_op_kinds(m.program)


@pytest.mark.parametrize('cc', COMPILERS)
def test_a_row_finished_by_its_own_sum_before_the_next_row_is_run_after_the_layer(cc):
    # z[r] = (b[r] + W[r] . x) + e[r] + f[r], one row after the other: the
    # fold splits into the layer's row and a Sum of y[r], e[r] and f[r] that
    # the interpreter runs before the next row, and that must now wait for
    # the whole layer (the schedule's lifted unit reading a later one)
    def build(inputs, params):
        x, e, f = inputs[:3], inputs[3:7], inputs[7:]
        z = [sum((params[4 * r + c + 1] * x[c] for c in range(3)), params[4 * r]) + e[r] + f[r] for r in range(4)]
        return sum(zr.tanh() for zr in z), z
    rng = random.Random(5)
    samples = [[rng.uniform(-2, 2) for _ in range(11)] for _ in range(2)]
    m = assert_matches_interpreter(build, samples, [rng.uniform(-1, 1) for _ in range(16)], cc)
    assert 'MatVec' in vector_op_kinds(m.program) and 'Sum' in vector_op_kinds(m.program)


def test_a_hand_built_layer_is_recognised_too():
    # the same shape as a Layer, written by hand, with x * w operand order
    # and no bias: sum() starts from the constant 0
    xs = [Value(0.0) for _ in range(4)]
    w = [[Value(0.1 * (r + c)) for c in range(4)] for r in range(3)]
    ys = [sum(x * wi for x, wi in zip(xs, row)) for row in w]
    loss = sum(y.tanh() for y in ys)
    params = [p for row in w for p in row]
    program = vectorize(compiler.trace(loss, xs, params))
    assert vector_op_kinds(program) == ['MatVec', 'Sum'] or vector_op_kinds(program) == ['MatVec']
    mv = next(op for op in program.ops if isinstance(op, MatVec))
    assert (mv.rows, mv.cols) == (3, 4)


def test_irregular_graphs_compile_unchanged():
    a, b = Value(1.0), Value(2.0)
    loss = (a * b).tanh() + (a - b).exp() * a
    program = compiler.trace(loss, [a], [b])
    assert vectorize(program) is program


def test_an_input_used_outside_the_layer_blocks_the_matvec_when_its_gradient_matters():
    # x is a computed value used by the layer AND by another op: lifting the
    # layer would move x's gradient contributions, so only sums are lifted
    a = Value(0.5)
    xs = [(a * k).tanh() for k in (1.0, 2.0, 3.0)]
    w = [[Value(0.1 * (r + c + 1)) for c in range(3)] for r in range(2)]
    ys = [sum((wi * x for wi, x in zip(row, xs)), Value(0.0)) for row in w]
    loss = ys[0] * ys[1] + xs[0] * xs[1] + xs[2]
    params = [a] + [p for row in w for p in row]
    program = vectorize(compiler.trace(loss, [], params))
    assert 'MatVec' not in vector_op_kinds(program)


def test_printed_program_shows_the_vector_ops():
    xs = [Value(0.0), Value(0.0)]
    model = MLP(2, [2, 1], seed=0)
    loss = model(xs)
    text = str(vectorize(compiler.trace(loss, xs, model.parameters())))
    assert 'passes: vectorize' in text and 'matvec(W=%2[2x2, by column], x=%0..%1, heads=%6..%7)' in text


# -- differential: random layered graphs, with and without the pass -------------

ACTS = ['relu', 'tanh', 'sigmoid', 'none']


@st.composite
def layered_graphs(draw):
    """MLP-like graphs built by hand: random widths, activations, operand
    order, bias or none, and sometimes an activation reused elsewhere."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=2, max_size=4))
    acts = draw(st.lists(st.sampled_from(ACTS), min_size=len(sizes) - 1, max_size=len(sizes) - 1))
    bias = draw(st.booleans())
    swap = draw(st.booleans())
    reuse = draw(st.booleans())
    shuffle = draw(st.none() | st.integers(0, 2 ** 16))
    return sizes, acts, bias, swap, reuse, shuffle


def layered_builder(shape):
    """The graph of ``shape``; its layers take the parameters in order, or,
    with a ``shuffle`` seed, in an order shuffled by it."""
    sizes, acts, bias, swap, reuse, shuffle = shape

    def build(inputs, params):
        params = list(params)
        if shuffle is not None:
            random.Random(shuffle).shuffle(params)
        it = iter(params)
        x = list(inputs)
        extra = []
        for n_out, act in zip(sizes[1:], acts):
            ys = []
            for _ in range(n_out):
                ws = [next(it) for _ in x]
                prods = (xi * wi if swap else wi * xi for wi, xi in zip(ws, x))
                y = sum(prods, next(it)) if bias else sum(prods)
                ys.append(y if act == 'none' else getattr(y, act)())
            if reuse:
                extra.append(ys[0] * 0.5)
            x = ys
        loss = sum(x) + sum(extra) if extra else sum(x)
        return loss, x
    return build


def n_params(shape):
    sizes, bias = shape[0], shape[2]
    return sum(a * b + (b if bias else 0) for a, b in zip(sizes, sizes[1:]))


@needs_cc
@pytest.mark.parametrize('vectorize_on', [True, False])
@pytest.mark.parametrize('cc', COMPILERS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=layered_graphs(), data=st.data())
def test_layered_graphs_match_the_interpreter(cc, vectorize_on, shape, data):
    values = st.floats(-2, 2, allow_nan=False)
    params = data.draw(st.lists(values, min_size=n_params(shape), max_size=n_params(shape)))
    samples = data.draw(st.lists(st.lists(values, min_size=shape[0][0], max_size=shape[0][0]),
                                 min_size=1, max_size=2))
    assert_matches_interpreter(layered_builder(shape), samples, params, cc, vectorize=vectorize_on)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_the_mnist_graph_is_exact_with_the_pass(cc):
    import numpy as np
    ref = MLP(784, [20, 10], seed=0)
    values = [p.data for p in ref.parameters()]
    rng = np.random.default_rng(1)
    samples = [list(rng.random(784)) + [0.0] * 9 + [1.0] for _ in range(2)]
    m = assert_matches_interpreter(mlp_builder([784, 20, 10]), samples, values, cc)
    assert 'MatVec' in vector_op_kinds(m.program)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_sparse_weight_gradients_stay_exact_for_nonfinite_gradients(cc):
    # zero inputs let the weight-gradient loop skip columns, which is exact
    # only while the row's gradient is finite: log(relu(y)) at y <= 0 makes it
    # inf or nan, and then 0 * inf must still reach the weights as nan
    params = [0.3 * ((i * 7) % 5 - 2) for i in range(18 * 5)]
    samples = [[0.0, 1.0, 0.0, -2.0], [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 0.5]]
    m = assert_matches_interpreter(log_relu_layer, samples, params, cc)
    assert 'MatVec' in vector_op_kinds(m.program)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_skipping_zeros_stays_exact_at_signed_zeros_and_infinities(cc):
    # The loops skip zero inputs and zero row gradients only where that is
    # exact: a row starting at -0.0 (here a bias of -0.0 with blank inputs)
    # must still turn into +0.0, and an infinite input times a zero gradient
    # must still reach the weight gradient as nan.
    import math

    def build(inputs, params):
        ys = bias_first_layer(inputs, params, 17)
        return sum(y.relu() for y in ys), ys
    params = []
    for r in range(17):
        # each row takes its bias first: sum()'s start is evaluated before the products
        params += [-0.0 if r % 2 else -1.0] + [0.25 * ((r + c) % 3 - 1) + 0.1 for c in range(5)]
    samples = [[0.0] * 5, [0.0, 0.0, 1.0, 0.0, 0.0], [math.inf, 0.0, 0.0, 0.0, 0.0],
               [-0.0, 2.0, 0.0, math.nan, 0.0]]
    m = assert_matches_interpreter(build, samples, params, cc)
    assert 'MatVec' in vector_op_kinds(m.program)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_head_set_to_minus_zero_later_turns_off_the_zero_skipping_at_that_refresh(cc):
    # the even rows start from a bias, the odd ones from the constant 1.0, so
    # the heads are not evenly spaced in p and a table copies them at every
    # refresh; the zero-skipping flag of that refresh must see the heads it
    # copied, not the last ones
    def build(inputs, params):
        it = iter(params)
        ys = [sum((next(it) * x for x in inputs), next(it) if r % 2 == 0 else 1.0) for r in range(17)]
        return sum(y.relu() for y in ys), ys

    def params(bias):
        return [v for r in range(17)
                for v in [bias] * (r % 2 == 0) + [0.25 * ((r + c) % 3 - 1) + 0.1 for c in range(5)]]
    m = compile_graph(build, 5, params(-1.0), cc)
    assert 'static const int copy[' in m.source and 'MatVec' in vector_op_kinds(m.program)
    later = params(-0.0)
    m.set_params(later)
    assert_matches_interpreter(build, [[0.0] * 5, [0.0, 0.0, 1.0, 0.0, 0.0]], later, cc, model=m)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_constant_head_of_minus_zero_turns_off_the_zero_skipping(cc):
    # Heads that are constants are copied once, at load, and whether one is
    # -0.0 is known when the C is written: a row that starts at the constant
    # -0.0 and gets only zero terms must still end at +0.0, as it does when
    # the interpreter adds them.
    def build(inputs, params):
        it = iter(params)
        ys = [sum((next(it) * x for x in inputs), -0.0 if r % 3 == 1 else 0.5) for r in range(17)]
        return sum(ys), ys
    params = [0.25 * ((i * 5) % 7 - 3) + 0.125 for i in range(17 * 5)]
    samples = [[0.0] * 5, [0.0, 0.0, 1.0, 0.0, 0.0], [-0.0, 2.0, 0.0, 0.0, 0.0]]
    m = assert_matches_interpreter(build, samples, params, cc)
    assert 'MatVec' in vector_op_kinds(m.program)
    assert 'a head is -0.0' in m.source


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('rows', [17, 16])
@pytest.mark.parametrize('optimizer', ['update', 'adam'])
def test_an_infinite_weight_turns_off_the_zero_skipping(cc, rows, optimizer):
    # inf * 0 is nan, so once a step has overflowed a weight, zero inputs may
    # no longer be skipped; with 16 rows W is its own forward panel
    # (layout.in_place), checked where it is instead of while it is copied,
    # or (Adam) flagged by the step that wrote it. lr 1.7e308: each weight
    # moves by about lr a step, finite once, infinite the second time
    import numpy as np

    def build(inputs, params):
        ys = bias_first_layer(inputs, params, rows)
        return sum(ys), ys
    params = [0.5] * (rows * 4)
    adam = {'optimizer': compiler.Adam(1.7e308)} if optimizer == 'adam' else {}
    m = compiler.compile(*_graph(build, 3, params), cc=cc, **adam)
    assert ('its own panel' in m.source) == (rows == 16)
    for _ in range(2):
        m.set_input([1.0, 1.0, 1.0])
        m.forward()
        m.backward()                  # every weight gradient is 1.0 (update: then 2.0)
        m.step(zero_grad=True) if adam else m.update(1.7e308)
    p = m.params()
    assert np.isinf(p).any()
    m.set_input([0.0, 0.0, 0.0])
    m.forward()
    inputs = [Value(0.0) for _ in range(3)]
    _, ys = build(inputs, [Value(v) for v in p])
    assert any(math.isnan(y.data) for y in ys)
    for got, y in zip(m.outputs(), ys):
        assert same(got, y.data), (got, y.data)


def log_relu_layer(inputs, params):
    """18 neurons, then sum(log(relu(y))): inf or nan gradients where y <= 0."""
    ys = bias_first_layer(inputs, params, 18)
    return sum(y.relu().log() for y in ys), ys


def bias_first_layer(inputs, params, rows):
    """``rows`` neurons by hand; each takes its bias first, then one weight per input
    (``sum()``'s start is evaluated before its products)."""
    it = iter(params)
    return [sum((next(it) * x for x in inputs), next(it)) for _ in range(rows)]


def _graph(build, n_inputs, params):
    inputs = [Value(0.0) for _ in range(n_inputs)]
    leaves = [Value(v) for v in params]
    loss, outputs = build(inputs, leaves)
    return loss, inputs, leaves, outputs


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_fold_whose_term_has_a_consumer_inside_it_is_not_lifted(cc):
    # a feeds the chain's first '+' and also u = a * 3, which the chain adds
    # later; lifting the chain into one Sum would schedule u before it and
    # swap the order of a's gradient contributions, so the pass must refuse
    def build(inputs, params):
        a, b, d = params
        u = a * 3.0
        s = ((a + b) + u) + d
        return s * a * inputs[0], []
    x, a, b, d = Value(0.0), Value(0.1), Value(0.2), Value(0.3)
    loss, _ = build([x], [a, b, d])
    program = compiler.trace(loss, [x], [a, b, d])
    assert vectorize(program) is program
    for values in ([0.1, 0.7, 1e-9], [1.3, -2.9, 0.123456789], [3.3, 1e-3, 7.77]):
        assert_matches_interpreter(build, [[1.1], [0.37]], values, cc)


@needs_cc
@pytest.mark.parametrize('cc', [cc for cc in COMPILERS if cc != 'tcc'])
def test_the_baseline_build_of_the_loops_gives_the_same_bits(cc):
    # Optimizing compilers build the loops for AVX-512, AVX2 and the baseline
    # and run the best this CPU has; the tests above ran that one. The
    # baseline (SSE2 on x86-64) must compute the same bits.
    import numpy as np
    from compiler.build import default_flags, find_compiler

    def build(inputs, params):
        ys = bias_first_layer(inputs, params, 19)
        return sum(y.relu() * (0.1 * k) for k, y in enumerate(ys)), ys
    n_in = 13
    params = [0.3 * ((i * 7) % 11 - 5) + 0.01 * i for i in range(19 * (n_in + 1))]
    samples = [[0.25 * ((i * j) % 5) for j in range(n_in)] for i in range(1, 4)]
    flags = default_flags(find_compiler(cc)) + ['-DMICROGRAD_NO_CLONES']
    baseline = assert_matches_interpreter(build, samples, params, cc, flags=flags)
    assert 'MatVec' in vector_op_kinds(baseline.program)
    best = compiler.compile(*_graph(build, n_in, params), cc=cc)
    X = np.array([s for s in samples] * 3)
    assert baseline.train_batch(X, 0.1) == best.train_batch(X, 0.1)
    assert baseline.params().tobytes() == best.params().tobytes()


# -- train_batch: weight gradients added up over a block's rows, in row order --

@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_train_batch_over_several_blocks_matches_the_interpreter(cc):
    # two full blocks of rows and a partial one, sparse inputs (blank
    # pixels), two steps
    import numpy as np
    from compiler.constants import BLOCK_ROWS
    sizes = [30, 12, 3]
    ref = MLP(sizes[0], sizes[1:], seed=0)
    rng = np.random.default_rng(7)
    rows = 2 * BLOCK_ROWS + 22
    pixels = rng.random((rows, sizes[0])) * (rng.random((rows, sizes[0])) < 0.3)
    labels = np.eye(sizes[-1])[rng.integers(0, sizes[-1], rows)]
    m = assert_train_batch_matches_interpreter(mlp_builder(sizes), np.hstack([pixels, labels]),
                                               [p.data for p in ref.parameters()], 0.5, cc, steps=2)
    assert vector_op_kinds(m.program).count('MatVec') == 2


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('n_inputs', [4, 16])
def test_train_batch_with_nonfinite_gradients_matches_the_interpreter(cc, n_inputs):
    # log(relu(y)) at y <= 0 makes a row's gradient inf or nan: then a blank
    # input's weight gradient is 0 * inf = nan and must be recorded too.
    # Each neuron takes its bias first; a bias < 0 with weights > 0 makes the
    # gradient nan on blank rows only, where each weight's gradient must
    # become 0 * nan = nan, while the other rows' are finite. 16 inputs: the
    # weight gradient lists 8 consecutive inputs of 8 rows at once (AVX-512)
    q = n_inputs // 4
    params = []
    for r in range(18):
        params += ([-0.1] + [0.5, 0.25, 0.5, 1.0] * q if r % 2
                   else [0.3 * ((r + c) % 5 - 2) for c in range(n_inputs + 1)])
    X = [[1.0, 2.0, 3.0, 0.5] * q] + [[0.0] * n_inputs] * 70 + [[0.0, 1.0, 0.0, 2.0] * q]
    m = assert_train_batch_matches_interpreter(log_relu_layer, X, params, 0.01, cc)
    assert 'MatVec' in vector_op_kinds(m.program)


@pytest.mark.parametrize('case, reason', [
    ('a weight in two rows', 'a weight appears twice in W'),
    ('a head that is a weight', 'is also a weight or an input'),
    ('a head that is an input', 'is also a weight or an input'),
    ('an input twice', 'an input appears twice in x'),
])
def test_rows_that_look_like_a_layer_but_are_none_say_why(case, reason):
    import compiler
    xs = [Value(0.0) for _ in range(3)]
    W = [[Value(0.1 * (r + c + 1)) for c in range(3)] for r in range(4)]
    b = [Value(0.5 - 0.25 * r) for r in range(4)]
    ys = []
    for r in range(4):
        ws, x, head = list(W[r]), xs, b[r]
        if case == 'a weight in two rows' and r == 1:
            ws[0] = W[0][0]
        if case == 'a head that is a weight' and r == 0:
            head = W[0][1]
        if case == 'a head that is an input' and r == 0:
            head = xs[0]
        if case == 'an input twice':
            x = [xs[0], xs[1], xs[0]]
        ys.append(sum((w * xi for w, xi in zip(ws, x)), head))
    params = [w for row in W for w in row] + b
    program = vectorize(compiler.trace(sum(y.tanh() for y in ys), xs, params))
    assert not [op for op in program.ops if type(op) is MatVec]
    assert [why.rows for why in program.not_lifted] == [4], program.not_lifted
    assert reason in program.not_lifted[0].reason


@pytest.mark.parametrize('case, reason', [
    ('a weight that is the head of the larger layer', 'weight W[1][1] (%17) is also the input or head of another layer'),
    ('a head of the larger layer', 'head %15 is also the head of a layer of another matrix'),
])
def test_a_second_layer_that_shares_parameters_with_the_first_says_why(case, reason):
    # layer A (4 x 3, taken first: more rows) feeds layer B (3 x 3); B reads one of A's biases
    import compiler
    xs = [Value(0.0) for _ in range(3)]
    WA = [[Value(0.1 * (r + c + 1)) for c in range(3)] for r in range(4)]
    bA = [Value(0.5 - 0.25 * r) for r in range(4)]
    WB = [[Value(-0.1 * (r + c + 1)) for c in range(3)] for r in range(3)]
    bB = [Value(0.2 + 0.25 * r) for r in range(3)]
    if case == 'a weight that is the head of the larger layer':
        WB[1][1] = bA[2]
    else:
        bB[0] = bA[0]
    hs = [sum((w * x for w, x in zip(WA[r], xs)), bA[r]).tanh() for r in range(4)]
    yb = [sum((w * x for w, x in zip(WB[r], hs[:3])), bB[r]) for r in range(3)]
    params = list(dict.fromkeys([w for row in WA for w in row] + bA + [w for row in WB for w in row] + bB))
    program = vectorize(compiler.trace(sum(y.tanh() for y in yb) + hs[3], xs, params))
    assert [(op.rows, op.cols) for op in program.ops if type(op) is MatVec] == [(4, 3)]
    assert [(why.rows, why.reason) for why in program.not_lifted] == [(3, reason)]
