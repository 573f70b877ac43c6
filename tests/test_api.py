"""The model API users reach for first: input gradients, prediction without
labels, weights to and from Values and files, and no silent mistakes."""
import math
import warnings

import numpy as np
import pytest

import compiler
from compiler.weights import WeightsError
from micrograd import Value, cross_entropy
from micrograd.nn import MLP

from tests.differential import (COMPILERS, FAST_CC, assert_matches_interpreter, assert_train_batch_matches_interpreter,
                                needs_cc, same)

pytestmark = needs_cc


def mlp_with_labels(sizes=(5, 4, 3), seed=2):
    model = MLP(sizes[0], list(sizes[1:]), seed=seed, init='scaled')
    xs = [Value(0.0) for _ in range(sizes[0])]
    ts = [Value(0.0) for _ in range(sizes[-1])]
    logits = model(xs)
    return model, xs, ts, logits, cross_entropy(logits, ts)


def mlp_builder(sizes):
    def build(inputs, params):
        it = iter(params)
        x = inputs[:sizes[0]]
        for i, (nin, nout) in enumerate(zip(sizes, sizes[1:])):
            rows = [[next(it) for _ in range(nin)] + [next(it)] for _ in range(nout)]
            x = [sum((w * v for w, v in zip(r[:-1], x)), r[-1]) for r in rows]
            if i < len(sizes) - 2:
                x = [v.relu() for v in x]
        return cross_entropy(x, inputs[sizes[0]:]), x
    return build


# -- input gradients -------------------------------------------------------------

@pytest.mark.parametrize('cc', COMPILERS)
def test_input_gradients_through_matrix_vector_layers_match_the_interpreter(cc):
    sizes = [6, 5, 3]
    params = [p.data for p in MLP(6, [5, 3], seed=1, init='scaled').parameters()]
    samples = [[0.5, -1.0, 0.0, 2.0, 0.25, 0.0, 0.0, 1.0, 0.0],
               [0.0, 0.0, 0.0, 1.0, -3.0, 0.5, 1.0, 0.0, 0.0]]
    m = assert_matches_interpreter(mlp_builder(sizes), samples, params, cc, input_grads=True)
    assert any(type(op).__name__ == 'MatVec' and op.grad_x for op in m.program.ops)


def test_input_gradients_accumulate_until_zero_grad():
    model, xs, ts, logits, loss = mlp_with_labels()
    m = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC, input_grads=True)
    row = [0.1, 0.2, -0.3, 0.4, 0.5, 0.0, 1.0, 0.0]
    m.set_input(row)
    m.forward()
    m.backward()
    once = m.input_grads()
    assert once[:5].any()
    m.backward()
    # the interpreter's leaves accumulate the same way: each contribution added again
    for x, v in zip(xs + ts, row):
        x.data = v
    for _ in range(2):
        again = cross_entropy(model(xs), ts)
        again.backward()
    assert m.input_grads().tolist() == [x.grad for x in xs + ts]
    assert not np.array_equal(m.input_grads(), once)
    m.zero_grad()
    assert not m.input_grads().any() and not m.grads().any()
    # train_batch runs rows of its own and leaves them alone
    m.backward()
    m.train_batch(np.array([row]), 0.1)
    assert np.array_equal(m.input_grads(), once)


def test_without_input_grads_they_are_zero():
    model, xs, ts, logits, loss = mlp_with_labels()
    m = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC)
    m.set_input([1.0] * 5 + [0.0, 1.0, 0.0])
    m.forward()
    m.backward()
    assert not m.input_grads().any()


# -- prediction without labels -----------------------------------------------------

def test_predict_takes_rows_with_only_the_features():
    model, xs, ts, logits, loss = mlp_with_labels()
    m = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC)
    assert m.features == [0, 1, 2, 3, 4]
    X = np.random.default_rng(0).standard_normal((7, 8))
    full = m.predict(X)
    assert np.array_equal(m.predict(np.ascontiguousarray(X[:, :5])), full)
    with pytest.raises(ValueError, match=r'has 6 columns, expected 8 \(every input\) or 5'):
        m.predict(np.zeros((2, 6)))


def test_predict_and_train_batch_take_any_2d_array_like():
    """The README's ``m.predict(X[:, :784])``: a slice (not C-contiguous), a
    list of lists, float32 and ints are copied to float64 rows; the result
    is the same bits as on the contiguous float64 copy."""
    model, xs, ts, logits, loss = mlp_with_labels()
    m = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC)
    X = np.random.default_rng(0).standard_normal((7, 8))
    wide = np.hstack([X, np.ones((7, 3))])
    full = m.predict(X)
    assert np.array_equal(m.predict(wide[:, :8]), full)
    assert np.array_equal(m.predict(wide[:, :5]), full)
    assert np.array_equal(m.predict(X.tolist()), full)
    assert np.array_equal(m.predict(np.asfortranarray(X)), full)
    ints = np.arange(16).reshape(2, 8) % 3
    assert np.array_equal(m.predict(ints), m.predict(ints.astype(float)))
    for bad in (X[0], 'abc', [[1.0, 'x'] * 4], np.zeros((2, 8), dtype=bool)):
        with pytest.raises(TypeError, match='2-D array of real numbers'):
            m.predict(bad)
    before = m.params()
    loss_slice = m.train_batch(wide[:, :8], 0.1)
    m.set_params(before)
    assert m.train_batch(np.ascontiguousarray(X), 0.1) == loss_slice
    with pytest.raises(TypeError, match='2-D array of real numbers'):
        m.train_batch(X[0], 0.1)


# -- weights ------------------------------------------------------------------------

def test_write_back_puts_the_trained_weights_and_gradients_into_the_values():
    model, xs, ts, logits, loss = mlp_with_labels()
    m = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC)
    X = np.random.default_rng(1).standard_normal((10, 8))
    m.train_batch(X, 0.5)
    m.set_input(X[0])
    m.forward()
    m.backward()
    m.write_back()
    assert [p.data for p in model.parameters()] == m.params().tolist()
    assert [p.grad for p in model.parameters()] == m.grads().tolist()
    # the interpreter now computes what the compiled model computes
    for x, v in zip(xs + ts, X[0]):
        x.data = float(v)
    assert model(xs)[0].data == m.outputs()[0]


def test_weights_round_trip_through_a_file(tmp_path):
    model, xs, ts, logits, loss = mlp_with_labels()
    model.parameters()[0].label = 'w00'
    m = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC,
                         optimizer=compiler.Adam(0.01))
    X = np.random.default_rng(2).standard_normal((10, 8))
    m.train_batch(X)
    m.save_weights(tmp_path / 'w.npz', metadata={'sizes': [5, 4, 3]})
    saved = np.load(tmp_path / 'w.npz')
    assert saved['param_labels'][0] == 'w00' and list(saved['meta_sizes']) == [5, 4, 3]
    other = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC,
                             optimizer=compiler.Adam(0.01))
    other.load_weights(tmp_path / 'w.npz')
    assert np.array_equal(other.params(), m.params())
    assert np.array_equal(other.optimizer_state(), m.optimizer_state())
    assert same(other.train_batch(X), m.train_batch(X))       # the same next step, moments and all
    assert np.array_equal(other.params(), m.params())


@pytest.mark.parametrize('value', [{'a': 1}, [1, 'a', None], object(), [[1, 2], [3]]])
def test_metadata_that_needs_pickle_is_refused_before_writing(tmp_path, value):
    model, xs, ts, logits, loss = mlp_with_labels()
    m = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC)
    path = tmp_path / 'w.npz'
    with pytest.raises(TypeError, match=r"metadata\['x'\].*without pickle"):
        m.save_weights(path, metadata={'x': value})
    assert not path.exists() and list(tmp_path.iterdir()) == []
    m.save_weights(path, metadata={'x': 'a string', 'sizes': [5, 4, 3], 'rate': 0.5})
    m.load_weights(path)


def test_bad_weight_files_are_refused_and_change_nothing(tmp_path):
    model, xs, ts, logits, loss = mlp_with_labels()
    m = compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC)
    before = m.params()
    m.save_weights(tmp_path / 'good.npz')
    a, b, c, d, e = mlp_with_labels((5, 6, 3))
    m2 = compiler.compile(e, b + c, a.parameters(), d, cc=FAST_CC)
    m2.save_weights(tmp_path / 'other.npz')
    good = dict(np.load(tmp_path / 'good.npz'))
    cases = {
        'other.npz': None,
        'nan.npz': {**good, 'params': np.where(np.arange(len(before)) == 3, np.nan, good['params'])},
        'short.npz': {**good, 'params': good['params'][:-1]},
        'format.npz': {**good, 'format': np.array(7)},
    }
    for name, arrays in cases.items():
        if arrays is not None:
            np.savez(tmp_path / name, **arrays)
    (tmp_path / 'empty.npz').write_bytes(b'')
    (tmp_path / 'cut.npz').write_bytes((tmp_path / 'good.npz').read_bytes()[:200])
    np.save(tmp_path / 'one.npy', before)
    words = {'other.npz': 'another graph', 'nan.npz': 'not finite', 'short.npz': 'must be float64',
             'format.npz': 'format', 'empty.npz': 'not a readable', 'cut.npz': 'not a readable',
             'one.npy': 'single array', 'missing.npz': 'no such file'}
    for name, word in words.items():
        with pytest.raises(WeightsError, match=word):
            m.load_weights(tmp_path / name)
        assert np.array_equal(m.params(), before), name


# -- no silent mistakes ---------------------------------------------------------------

def test_forgetting_params_is_an_error_that_says_what_to_pass():
    model, xs, ts, logits, loss = mlp_with_labels()
    with pytest.raises(compiler.TraceError, match=r'params is empty.*params=model.parameters\(\)'):
        compiler.compile(loss, xs + ts, cc=FAST_CC)


def test_a_module_given_as_params_is_an_error():
    model, xs, ts, logits, loss = mlp_with_labels()
    with pytest.raises(compiler.TraceError, match=r'params= got a MLP.*model.parameters\(\)'):
        compiler.compile(loss, xs + ts, model, cc=FAST_CC)


def test_a_loss_of_inputs_only_needs_no_params():
    x = Value(0.0)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        m = compiler.compile((x * 2.0 + 1.0).tanh(), [x], cc=FAST_CC)
    m.set_input([0.5])
    assert m.forward() == math.tanh(2.0)


@pytest.mark.parametrize('cc', COMPILERS)
def test_a_parameter_as_the_loss_matches_the_interpreter(cc):
    """compile(w, params=[w]): no rows to compute, d w / d w = 1 (set by
    backward, as the interpreter sets the root's gradient), for one row and
    for a batch."""
    def build(inputs, params):
        return params[0], [params[0]]
    for params in ([2.5], [-0.0]):
        model = assert_matches_interpreter(build, [[]], params, cc)
        assert model.grads().tolist() == [1.0]
    def build_in(inputs, params):      # and with inputs nothing depends on
        return params[1], [params[0] * inputs[0]]
    assert_matches_interpreter(build_in, [[0.5], [-2.0]], [3.0, 1.5], cc)
    assert_train_batch_matches_interpreter(build_in, np.ones((5, 1)), [3.0, 1.5], 0.25, cc, steps=3)


def test_an_undeclared_leaf_is_warned_about_by_count_and_label():
    model, xs, ts, logits, loss = mlp_with_labels()
    scale = Value(2.0, label='temperature')
    loss = loss * scale
    with pytest.warns(UserWarning, match=r"1 leaf Values you created .*temperature"):
        compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC)
    with warnings.catch_warnings():
        warnings.simplefilter('error')          # declared: no warning; numbers wrapped by ops: none
        compiler.compile(loss, xs + ts, model.parameters(), logits, cc=FAST_CC, constants=[scale])


def test_a_label_left_out_of_inputs_is_warned_about():
    model, xs, ts, logits, loss = mlp_with_labels()
    ts[1].label = 'label1'
    with pytest.warns(UserWarning, match=r'3 leaf Values you created.*label1'):
        compiler.compile(loss, xs, model.parameters(), logits, cc=FAST_CC)


def test_an_input_nothing_depends_on_is_warned_about():
    model, xs, ts, logits, loss = mlp_with_labels()
    spare = Value(0.0, label='spare')
    with pytest.warns(UserWarning, match=r'1 inputs affect neither the loss nor the outputs \(spare\)'):
        compiler.compile(loss, xs + ts + [spare], model.parameters(), logits, cc=FAST_CC)
