"""Layers whose weights have other uses: an L2 regulariser (before, after or
between the layers in the interpreter's order), a weight tied into scalar
code, one matrix applied twice. The layers still lift, and every gradient
gets its contributions in the interpreter's order, bit for bit: per sample,
and over a batch (``train_batch``), at one and two threads, with and
without the pass, with every compiler."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler.ir import MatVec
from micrograd import Value
from micrograd.nn import MLP

from tests.differential import (COMPILERS, FAST_CC, assert_matches_interpreter,
                                assert_train_batch_matches_interpreter, compile_graph, needs_cc, split_flags)


def squares(params, alpha=1e-4):
    """Karpathy's regulariser: ``alpha * sum(p * p for p in params)``."""
    return alpha * sum(p * p for p in params)


def layer(x, W, b):
    return [sum((w * xi for w, xi in zip(row, x)), bias) for row, bias in zip(W, b)]


def unpack(params, sizes):
    """Weights and biases of an MLP of ``sizes`` from a flat list, neuron by
    neuron (``MLP.parameters()``'s order)."""
    it = iter(params)
    out = []
    for nin, nout in zip(sizes, sizes[1:]):
        W, b = [], []
        for _ in range(nout):
            W.append([next(it) for _ in range(nin)])
            b.append(next(it))
        out.append((W, b))
    return out


def n_params(sizes):
    return sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))


def hinge_mlp(sizes, where):
    """Karpathy's two-moons loss (SVM hinge on an MLP) with the regulariser
    ``where`` the interpreter meets it: 'after' the layers (his demo),
    'before' them, 'between' layer 1 and layer 2, 'none'; or 'some': only a
    few weights of the middle layer, in its rows' order."""
    def build(inputs, params):
        layers = unpack(params, sizes)
        x, label = inputs[:sizes[0]], inputs[sizes[0]]
        reg = squares(params) if where in ('before', 'between', 'after') else None
        if where == 'before':
            start = reg * 1.0        # met first: backward adds it last
        ys = layer(x, *layers[0])
        h = [y.relu() for y in ys]
        if where == 'between':
            # layer 1, then the regulariser, then layer 2: backward adds the
            # regulariser's contributions after layer 2's and before layer 1's
            mid = sum(ys) * 0.0 + reg
        for W, b in layers[1:-1]:
            h = [y.relu() for y in layer(h, W, b)]
        score = layer(h, *layers[-1])[0]
        loss = (1 + -label * score).relu()
        if where == 'before':
            return start + loss, [score]
        if where == 'between':
            return mid + loss, [score]
        if where == 'after':
            return loss + reg, [score]
        if where == 'some':
            W = layers[1][0]
            return loss + squares([W[3][1], W[0][2], W[3][0]], 0.5), [score]
        return loss, [score]
    return build


def tied(inputs, params):
    """An autoencoder with tied weights: the decoder is the encoder's
    transpose (scalar code: another place in the matrix), plus the regulariser."""
    W = [params[r * 4:(r + 1) * 4] for r in range(3)]        # 3x4 encoder
    h = [y.tanh() for y in layer(inputs, W, params[12:15])]
    out = [sum((W[r][c] * h[r] for r in range(3)), params[15 + c]) for c in range(4)]
    loss = sum((o - x) * (o - x) for o, x in zip(out, inputs)) + squares(params[:12], 1e-2)
    return loss, out


def twice(inputs, params):
    """One square matrix applied twice (``W relu(W x + b) + b``), and the
    regulariser on it."""
    W = [params[r * 4:(r + 1) * 4] for r in range(4)]
    b = params[16:20]
    h = [y.relu() for y in layer(inputs[:4], W, b)]
    y = layer(h, W, b)
    return sum(v * v for v in y) * 0.25 + squares(params, 1e-3), y


def samples(n_in, rows, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, n_in))
    return X


def hinge_rows(sizes, rows, seed=0):
    rng = np.random.default_rng(seed)
    return np.hstack([rng.normal(size=(rows, sizes[0])), np.sign(rng.normal(size=(rows, 1)))])


def start_params(n, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, n).tolist()


def matvecs(model):
    return [(op.rows, op.cols) for op in model.program.ops if type(op) is MatVec]


SIZES = [2, 6, 5, 1]


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('where', ['after', 'before', 'between', 'some'])
def test_the_layers_of_a_regularised_mlp_lift_and_match_the_interpreter(cc, where):
    build, params = hinge_mlp(SIZES, where), start_params(n_params(SIZES))
    X = hinge_rows(SIZES, 4)
    m = assert_matches_interpreter(build, X.tolist(), params, cc)
    assert matvecs(m) == [(6, 2), (5, 6), (1, 5)]


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2])
@pytest.mark.parametrize('where', ['after', 'before', 'between', 'some'])
def test_train_batch_of_a_regularised_mlp_adds_each_rows_contributions_in_order(cc, threads, where):
    # 150 rows: more than one block of rows, the last one short
    build, params = hinge_mlp(SIZES, where), start_params(n_params(SIZES))
    m = assert_train_batch_matches_interpreter(build, hinge_rows(SIZES, 150), params, 0.05, cc, steps=2,
                                               threads=threads)
    assert matvecs(m) == [(6, 2), (5, 6), (1, 5)]


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_without_the_pass_the_same_models_match_too(cc):
    for where in ('after', 'between'):
        build, params = hinge_mlp(SIZES, where), start_params(n_params(SIZES))
        m = assert_train_batch_matches_interpreter(build, hinge_rows(SIZES, 40), params, 0.05, cc,
                                                   vectorize=False)
        assert matvecs(m) == []


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2])
def test_tied_weights_lift_the_encoder_and_keep_the_decoder_scalar(cc, threads):
    params = start_params(19, seed=3)
    X = samples(4, 70, seed=4)
    m = assert_matches_interpreter(tied, X[:3].tolist(), params, cc)
    # one of the two lifts (the decoder, with more rows, is met first); the
    # other reads the same weights in other places: it stays scalar, and says so
    assert matvecs(m) == [(4, 3)]
    (why,) = m.program.not_lifted
    assert (why.rows, why.cols) == (3, 4) and 'another place of its matrix' in why.reason
    assert_train_batch_matches_interpreter(tied, X, params, 0.05, cc, steps=2, threads=threads)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2])
def test_a_matrix_applied_twice_with_a_regulariser(cc, threads):
    params = start_params(20, seed=5)
    X = samples(4, 70, seed=6)
    m = assert_matches_interpreter(twice, X[:3].tolist(), params, cc)
    assert matvecs(m) == [(4, 4), (4, 4)]
    assert_train_batch_matches_interpreter(twice, X, params, 0.05, cc, steps=2, threads=threads)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_the_whole_batch_graph_of_karpathys_demo(cc):
    # every example of the batch is a use of each matrix, and the
    # regulariser one more: the gradient interleaves them in one row
    sizes, batch = [2, 8, 8, 1], 6
    data = hinge_rows(sizes, batch, seed=8)

    def build(inputs, params):
        layers = unpack(params, sizes)
        losses = []
        for i in range(batch):
            h = inputs[3 * i:3 * i + 2]
            for W, b in layers[:-1]:
                h = [y.relu() for y in layer(h, W, b)]
            score = layer(h, *layers[-1])[0]
            losses.append((1 + -inputs[3 * i + 2] * score).relu())
        return sum(losses) * (1.0 / batch) + squares(params), []
    m = assert_matches_interpreter(build, [data.ravel().tolist()], start_params(n_params(sizes)), cc)
    assert len(matvecs(m)) == 3 * batch


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_above_the_recorded_limit_the_matvec_adds_in_the_rows_backward(cc):
    # more scalar parameter uses than Layout records (MAX_RECORDED): scalar
    # code adds into gp directly, rows one after another, and so do the layers
    from compiler.codegen.layout import MAX_RECORDED
    sizes = [40, 50, 1]
    assert 2 * n_params(sizes) > MAX_RECORDED
    build, params = hinge_mlp(sizes, 'after'), start_params(n_params(sizes))
    m = assert_matches_interpreter(build, hinge_rows(sizes, 2).tolist(), params, cc)
    assert matvecs(m) == [(50, 40), (1, 50)]
    assert 'd W += x gy' in m.source
    assert_train_batch_matches_interpreter(build, hinge_rows(sizes, 70), params, 0.05, cc, threads=2)


def row_with_a_squared_weight_head(inputs, params):
    """A 4x3 layer whose third row starts from tanh(W[0][0]**2): the square reads
    W[0][0] after row 0's product and before the layer is complete, so a
    lifted layer would move that weight's gradient contributions."""
    W = [params[r * 3:(r + 1) * 3] for r in range(4)]
    ys = []
    for r in range(4):
        head = (W[0][0] * W[0][0]).tanh() if r == 2 else params[12 + r]
        ys.append(sum((w * x for w, x in zip(W[r], inputs)), head))
    return sum(y.tanh() for y in ys), ys


@needs_cc
def test_a_layer_that_would_reorder_a_gradient_stays_scalar_and_the_summary_says_why():
    params = start_params(16, seed=9)
    m = assert_matches_interpreter(row_with_a_squared_weight_head, samples(3, 2, seed=2).tolist(), params, FAST_CC)
    assert matvecs(m) == []
    (why,) = m.program.not_lifted
    assert (why.rows, why.cols) == (4, 3)
    assert 'weight W[0][0]' in why.reason and 'order of gradient accumulation' in why.reason
    text = m.summary()
    assert 'not lifted' in text and 'W[0][0]' in text


def test_a_sum_of_squares_is_no_layer_and_needs_no_reason():
    import compiler
    from compiler.vectorize import vectorize
    xs = [Value(0.0), Value(0.0)]
    model = MLP(2, [4, 1], seed=0)
    loss = model(xs) + squares(model.parameters())
    program = vectorize(compiler.trace(loss, xs, model.parameters()))
    assert [(op.rows, op.cols) for op in program.ops if type(op) is MatVec] == [(4, 2), (1, 4)]
    assert program.not_lifted == ()


@needs_cc
def test_the_summary_of_the_regularised_demo_shows_three_layers():
    build = hinge_mlp([2, 16, 16, 1], 'after')
    m = compile_graph(build, 3, start_params(n_params([2, 16, 16, 1])), FAST_CC)
    text = m.summary()
    assert text.count('MatVec') == 3 and 'not lifted' not in text
    # 337 squares, their sum and alpha * sum: once per step, not per row
    assert 'once per change of the parameters, not per row: 339 scalar ops forward, 339 backward' in text


@needs_cc
@pytest.mark.parametrize('threads', [1, 2])
def test_the_table_driven_loop_for_many_kinds_of_parameters_is_exact_too(monkeypatch, threads):
    # above MAX_GROUP_LINES one loop reads every parameter's contributions
    # from tables: force it on the models above
    import compiler.codegen.shared_grads as shared_grads
    monkeypatch.setattr(shared_grads, 'MAX_GROUP_LINES', 0)
    for where in ('between', 'some'):
        build, params = hinge_mlp(SIZES, where), start_params(n_params(SIZES))
        m = assert_train_batch_matches_interpreter(build, hinge_rows(SIZES, 90), params, 0.05, FAST_CC, steps=2,
                                                   threads=threads)
        assert 'mix_item' in m.source
    m = assert_train_batch_matches_interpreter(tied, samples(4, 40, seed=4), start_params(19, seed=3), 0.05, FAST_CC,
                                               threads=threads)
    assert 'mix_item' in m.source




def shared_biases(inputs, params):
    """One matrix and its biases applied to three vectors (a whole batch as
    one graph, a convolution's positions): the biases are heads shared by
    the three uses, with no regulariser."""
    W = [params[r * 3:(r + 1) * 3] for r in range(4)]
    out = []
    for i in range(3):
        out += [y.tanh() for y in layer(inputs[3 * i:3 * i + 3], W, params[12:16])]
    return sum(v * v for v in out), out


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2])
def test_biases_shared_by_the_uses_of_a_matrix_get_each_rows_contributions_in_order(cc, threads):
    params, X = start_params(16, seed=11), samples(9, 70, seed=12)
    m = assert_matches_interpreter(shared_biases, X[:2].tolist(), params, cc)
    assert matvecs(m) == [(4, 3)] * 3
    assert_train_batch_matches_interpreter(shared_biases, X, params, 0.05, cc, steps=2, threads=threads)



def test_the_summary_lists_a_few_groups_of_rows_per_part_and_counts_the_rest():
    # a convolution's windows overlap: every position's rows look like a
    # layer whose input feeds other windows too
    import compiler
    from compiler.summary import not_lifted, parts
    from compiler.vectorize import vectorize
    from micrograd.nn import Conv2d, Flatten, ReLU, Sequential
    model = Sequential(Conv2d(1, 2, 3, seed=0), ReLU(), Conv2d(2, 3, 3, seed=1), Flatten())
    image = [[[Value(0.0) for _ in range(7)] for _ in range(7)]]
    loss = sum(o * o for o in model(image))
    program = vectorize(compiler.trace(loss, [v for row in image[0] for v in row], model.parameters()))
    assert len(program.not_lifted) > 4
    lines = [line for _, ops in parts(program) for line in not_lifted(program, ops)]
    assert any('more such groups of rows' in line for line in lines)
    assert all(line.startswith('not lifted: ') for line in lines)


# -- random graphs: penalties on random weights, anywhere in the order ----------

PENALTIES = {
    'square': lambda p: p * p,
    'relu': lambda p: p.relu(),
    'tanh_times': lambda p: p.tanh() * p,
    'minus': lambda p: p - p * 0.5,
}


@st.composite
def penalised_mlps(draw):
    """An MLP of random widths whose chosen weights and biases also feed a
    penalty of a random kind, added to the loss at a random place: before
    the layers, after them, or right after layer ``k``."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=3, max_size=4))
    n = n_params(sizes)
    chosen = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n, 12), unique=True))
    kind = draw(st.sampled_from(sorted(PENALTIES)))
    where = draw(st.integers(-1, len(sizes) - 1))      # -1: before the layers; len - 1: after
    return sizes, chosen, kind, where


def penalised_builder(shape):
    sizes, chosen, kind, where = shape

    def penalty(params):
        return 0.01 * sum(PENALTIES[kind](params[i]) for i in chosen)

    def build(inputs, params):
        first = penalty(params) if where == -1 else None
        x, after = list(inputs), None
        for li, (W, b) in enumerate(unpack(params, sizes)):
            ys = layer(x, W, b)
            if li == where:
                after = sum(ys) * 0.0 + penalty(params)    # met right after this layer
            x = [y.tanh() for y in ys] if li < len(sizes) - 2 else ys
        loss = sum(v * v for v in x)
        if first is not None:
            loss = first + loss
        if after is not None:
            loss = after + loss
        if where == len(sizes) - 1:
            loss = loss + penalty(params)
        return loss, x
    return build


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=penalised_mlps(), data=st.data())
def test_random_penalised_mlps_match_the_interpreter(cc, shape, data):
    values = st.floats(-2, 2, allow_nan=False)
    n = n_params(shape[0])
    params = data.draw(st.lists(values, min_size=n, max_size=n))
    rows = data.draw(st.lists(st.lists(values, min_size=shape[0][0], max_size=shape[0][0]),
                              min_size=1, max_size=3))
    build = penalised_builder(shape)
    assert_matches_interpreter(build, rows, params, cc)
    threads = data.draw(st.sampled_from([1, 2]))
    assert_train_batch_matches_interpreter(build, np.array(rows * 30), params, 0.01, cc, threads=threads)


# -- what is the same in every row, once per change of the parameters ------------
#
# compiler/invariant.py: the regulariser's value, the gradients reaching its
# squares and their contributions p * g are the same in every row; they run
# once (refresh_aux), and each row still adds its own copies of the
# contributions in its backward order. Built with every thread doing a share
# of even a small batch (-DMICROGRAD_MIN_WORK_PER_THREAD=0).

def hoisted_part(m):
    from compiler.invariant import hoisted
    from compiler.ir import needs_grad
    return hoisted(m.program, needs_grad(m.program))


def squares_of(m):
    """The positions of the regulariser's ``p * p`` ops in the compiled program."""
    p0, p1 = m.program.param_start, m.program.param_end
    return {i for i, op in enumerate(m.program.ops)
            if getattr(op, 'name', None) == '*' and op.args[0] == op.args[1] and p0 <= op.args[0] < p1}


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2, 3])
@pytest.mark.parametrize('where', ['after', 'before', 'between', 'some'])
def test_the_regulariser_runs_once_per_step_and_every_row_still_adds_its_contributions(cc, threads, where):
    build, params = hinge_mlp(SIZES, where), start_params(n_params(SIZES))
    m = assert_train_batch_matches_interpreter(build, hinge_rows(SIZES, 150), params, 0.05, cc, steps=2,
                                               threads=threads, flags=split_flags(cc))
    part = hoisted_part(m)
    squares = squares_of(m)
    assert squares and squares <= part.backward          # their forward and backward: once
    assert len(part.copies) == 1                          # a row reads the regulariser's value only
    # every weight of a block gets the same contributions (Karpathy's): one vector loop per row
    assert ('_once_row(' in m.source) == (where != 'some')
    # the trained parameters: the values computed once follow every change of them
    assert_matches_interpreter(build, hinge_rows(SIZES, 3).tolist(), list(m.params()), cc, model=m)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2, 3])
def test_weights_of_minus_zero_and_overflowing_squares_under_the_regulariser(cc, threads):
    # p * p of -0.0 is +0.0 and its contributions -0.0 * g; squares of 1e200
    # overflow: the regulariser is inf in every row's loss, then NaN reaches
    # the weights (inf - inf in a layer)
    for special in ([-0.0, 0.0, -0.0], [1e200, -0.0], [1e308, -1e308, 1e200]):
        params = start_params(n_params(SIZES))
        for i, x in zip((3, 17, 40), special):
            params[i] = x
        build = hinge_mlp(SIZES, 'after')
        assert_train_batch_matches_interpreter(build, hinge_rows(SIZES, 70), params, 0.05, cc, steps=2,
                                               threads=threads, flags=split_flags(cc))
        assert_matches_interpreter(build, hinge_rows(SIZES, 2).tolist(), params, cc)


def partly_invariant(inputs, params):
    """A regulariser whose value is the same in every row but whose gradient
    is not (scaled by an input), and a square shared by the regulariser and
    the row (``q``): only what depends on neither runs backward once."""
    layers = unpack(params, SIZES)
    x, label = inputs[:2], inputs[2]
    h = [y.tanh() for y in layer(x, *layers[0])]
    for W, b in layers[1:-1]:
        h = [y.tanh() for y in layer(h, W, b)]
    score = layer(h, *layers[-1])[0]
    loss = (1 + -label * score).relu()
    q = params[0] * params[0]
    # (no product in the loss's chain of additions: the loops pass would make it a Dot, which
    # compiler/invariant.py leaves to every row)
    shared = (q + params[1] * params[1]) / 100.0              # gradient 1 / 100 in every row
    scaled = (squares(params[5:9], 1e-2) * inputs[0]).tanh()   # value invariant, gradient not
    return loss + shared + scaled + (q * inputs[1]).tanh(), [score]


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2, 3])
def test_values_the_same_in_every_row_whose_gradients_are_not(cc, threads):
    params = start_params(n_params(SIZES), seed=7)
    m = assert_train_batch_matches_interpreter(partly_invariant, hinge_rows(SIZES, 90, seed=3), params, 0.05, cc,
                                               steps=2, threads=threads, flags=split_flags(cc))
    part, ops = hoisted_part(m), m.program.ops
    slots = list(m.program.param_slots)         # (the pass orders the weights by column)
    once = {slots.index(ops[i].args[0]) for i in part.backward if getattr(ops[i], 'name', None) == '*'}
    assert once == {1}                     # params[1] * params[1] alone: q's gradient varies by row
    assert all(i in part.forward for i in squares_of(m))     # every square's value: once
    assert_matches_interpreter(partly_invariant, hinge_rows(SIZES, 3, seed=4).tolist(), list(m.params()), cc,
                               model=m)


@needs_cc
def test_read_data_shows_the_values_computed_once():
    from compiler.codegen.layout import Layout
    from compiler.ir import needs_grad
    build, params = hinge_mlp(SIZES, 'after'), start_params(n_params(SIZES))
    m = compile_graph(build, 3, params, FAST_CC)
    m.set_input([0.5, -0.25, 1.0])
    m.forward()
    data = np.empty(m.module.n_data)
    m.module.read_data(data)
    layout = Layout(m.program, needs_grad(m.program))
    for i in squares_of(m):
        op = m.program.ops[i]
        p = m.params()[m.program.param_slots.index(op.args[0])]
        assert data[layout.row_index(op.out)] == p * p
