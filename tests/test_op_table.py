"""The scalar op table (compiler/codegen/table.py): programs whose scalar code
runs from a table in one C loop give the interpreter's bits, forward and
backward, for every op and its edge cases, with and without the pass."""
import math
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compiler
import micrograd
from compiler.codegen import table
from tests.differential import COMPILERS, FAST_CC, assert_matches_interpreter, assert_train_batch_matches_interpreter
from tests.graphs import every_op_graph, mlp_builder
from tests import test_sequences
from tests.test_compiler import graphs, leaf_values, make_builder

pytestmark = pytest.mark.skipif(not COMPILERS, reason="no C compiler installed")


@pytest.fixture
def always_table(monkeypatch):
    monkeypatch.setattr(table, 'TABLE_MIN_OPS', 0)


def uses_table(m):
    return 'vm_forward(' in m.source


@pytest.mark.parametrize('vectorize_on', [True, False])
@pytest.mark.parametrize('cc', COMPILERS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(recipe=graphs(), data=st.data())
def test_random_graphs_from_the_table_match_the_interpreter(always_table, cc, vectorize_on, recipe, data):
    n_inputs, n_params = recipe[0], recipe[1]
    params = data.draw(st.lists(leaf_values, min_size=n_params, max_size=n_params))
    samples = data.draw(st.lists(st.lists(leaf_values, min_size=n_inputs, max_size=n_inputs),
                                 min_size=1, max_size=3))
    assert_matches_interpreter(make_builder(recipe), samples, params, cc, vectorize=vectorize_on,
                               input_grads=data.draw(st.booleans()))


# every op at its edge cases: max's ties (+0.0 against -0.0 too), -0.0, inf, NaN
EDGES = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e-300, 1e300, math.inf, -math.inf, math.nan]


def edge_graph(inputs, params):
    x, y = inputs
    w, c = params
    terms = [x + y, x - y, x * y, x / y, -x, x ** 2, y ** -1.5, x ** 0.5, x.relu(), y.relu(), x.tanh(),
             y.exp(), x.log(), y.sigmoid(), micrograd.max(x, y), micrograd.max(y, x),
             micrograd.max(x, w), micrograd.max(w * x, c), (x * w).relu(), x * x, w * w, (w / y).tanh()]
    loss = terms[0]
    for t in terms[1:]:
        loss = loss + t * w
    return loss, terms


@pytest.mark.parametrize('cc', COMPILERS)
def test_every_op_at_its_edges(always_table, cc):
    samples = [[a, b] for a in EDGES for b in EDGES]
    for params in ([0.5, -0.0], [0.0, 0.0], [-0.0, 0.0], [1e300, -1e-300]):
        for vectorize_on in (False, True):
            assert_matches_interpreter(edge_graph, samples, params, cc, vectorize=vectorize_on,
                                       input_grads=True)


def test_the_table_is_used_and_reported(always_table):
    loss, inputs, params, outputs = every_op_graph()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    assert uses_table(m)
    assert 'op table' in m.summary()


def test_small_programs_keep_statements():
    loss, inputs, params, outputs = every_op_graph()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    assert not uses_table(m) and 'op table' not in m.summary()


@pytest.mark.parametrize('cc', COMPILERS)
def test_training_from_the_table_matches_the_interpreter(always_table, cc):
    """train_batch: parameter gradients recorded per row (or added in row
    order), then the update, several steps."""
    sizes = [3, 4, 2]
    rng = random.Random(0)
    n = sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))
    params = [rng.uniform(-1, 1) for _ in range(n)]
    X = [[rng.uniform(-1, 1) for _ in range(3)] + [1.0, 0.0] for _ in range(6)]
    assert_train_batch_matches_interpreter(mlp_builder(sizes), X, params, 0.1, cc, steps=3, vectorize=False)


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('vectorize', [True, False])
def test_a_sequence_runs_its_positions_from_the_table(always_table, cc, vectorize):
    """The first n positions (forward(n), backward entering at position n)
    from table ranges: test_sequences' check with the table forced."""
    test_sequences.test_the_first_n_positions_give_the_interpreters_loss_and_gradients(cc, vectorize)


@pytest.mark.parametrize('cc', COMPILERS)
def test_steps_run_from_a_plan_in_order(always_table, monkeypatch, cc):
    """A long run of steps (table ranges between functions of statements) runs from
    a table of them (Table.plan_steps): forced here for every run, the same
    bits forward, backward and in training as the interpreter."""
    monkeypatch.setattr(table, 'PLAN_LOOPS', 0)
    sizes = [3, 4, 2]
    rng = random.Random(1)
    n = sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))
    params = [rng.uniform(-1, 1) for _ in range(n)]
    X = [[rng.uniform(-1, 1) for _ in range(3)] + [1.0, 0.0] for _ in range(6)]
    inputs, ps = [micrograd.Value(x) for x in X[0]], [micrograd.Value(p) for p in params]
    loss, outputs = mlp_builder(sizes)(inputs, ps)
    m = compiler.compile(loss, inputs, ps, outputs, cc=FAST_CC, vectorize=True)
    assert 'vm_forward_plan(' in m.source and 'vm_backward_plan(' in m.source
    assert re.search(r'\{0, 0, seg\d+_forward\}', m.source), "a plan with a function of sums between table ranges"
    assert_train_batch_matches_interpreter(mlp_builder(sizes), X, params, 0.1, cc, steps=3, vectorize=True)
    samples = [[a, b] for a in EDGES for b in EDGES]
    assert_matches_interpreter(edge_graph, samples, [0.5, -0.0], cc, vectorize=True, input_grads=True)


def folds_graph(inputs, params):
    """Chains of '+' the pass folds into ``Sum`` ops: of rows, of parameters,
    and mixed, some terms listed twice, feeding each other."""
    x0, x1, x2 = inputs
    w = params
    s1 = x0 + w[0] + x1 + w[1]
    s2 = s1.tanh() + x2 + w[2] + s1
    s3 = w[0] + w[1] + w[2] + w[3]
    s4 = (x0 * x1) + s2 + x0 + x2 + w[3] * s3
    loss = s4 * s4 + s3 * w[4] + (s2 + s1 + x1).relu()
    return loss, [s1, s2, s4]


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('recorded', [True, False])
def test_sums_run_from_the_table(always_table, monkeypatch, cc, recorded):
    """The pass's Sum folds are entries of the table (VM_SUM): forward,
    input and parameter gradients, and train_batch with the parameters'
    contributions recorded per row or (above MAX_RECORDED) added in place,
    give the interpreter's bits."""
    if not recorded:
        monkeypatch.setattr('compiler.codegen.layout.MAX_RECORDED', 0)
    rng = random.Random(2)
    params = [rng.uniform(-1, 1) for _ in range(5)]
    samples = [[rng.uniform(-2, 2) for _ in range(3)] for _ in range(4)] + [[0.0, -0.0, 1.0], [-0.0, -0.0, -0.0]]
    m = assert_matches_interpreter(folds_graph, samples, params, cc, vectorize=True, input_grads=True)
    sums = int(re.search(r'the scalar op table: [\d,]+ ops and ([\d,]+) sums', m.source).group(1))
    assert sums >= 4 and not re.search(r'seg\d+_forward', m.source), "every fold runs from the table"
    assert_train_batch_matches_interpreter(folds_graph, samples, params, 0.1, cc, steps=3, vectorize=True)
