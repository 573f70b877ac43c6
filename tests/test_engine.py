"""The interpreter: gradients against finite differences, known values, IEEE cases."""
import math
import random

import numpy as np

import pytest
from hypothesis import assume, given, settings, strategies as st

import micrograd
from micrograd import Value, cross_entropy, mse, softmax
from micrograd.nn import MLP, Layer, Neuron

# Central differences in float64: the truncation error is O(EPS^2) and the
# rounding error O(ulp / EPS); EPS = 1e-6 balances them at about 1e-9 relative
# to the function's scale, so RTOL = 1e-5 leaves room without hiding a wrong
# derivative (a wrong one is off by O(1)).
EPS = 1e-6
RTOL = 1e-5
ATOL = 1e-6

moderate = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False)
positive = st.floats(min_value=0.1, max_value=5.0)
away_from_zero = moderate.filter(lambda x: abs(x) > 0.1)


def numeric_grad(f, xs):
    grads = []
    for i in range(len(xs)):
        up = list(xs); up[i] += EPS
        down = list(xs); down[i] -= EPS
        grads.append((f(*[Value(v) for v in up]).data - f(*[Value(v) for v in down]).data) / (2 * EPS))
    return grads


def check_grad(f, *xs):
    leaves = [Value(x) for x in xs]
    f(*leaves).backward()
    for i, (leaf, expected) in enumerate(zip(leaves, numeric_grad(f, xs))):
        assert leaf.grad == pytest.approx(expected, rel=RTOL, abs=ATOL), f"operand {i} of {xs}"


# Each op with a Value on both sides, and with a plain number on either side.
BINARY = {
    'add': (lambda a, b: a + b, moderate, moderate),
    'sub': (lambda a, b: a - b, moderate, moderate),
    'mul': (lambda a, b: a * b, moderate, moderate),
    'div': (lambda a, b: a / b, moderate, away_from_zero),
    'max': (lambda a, b: micrograd.max(a, b + 0.5), moderate, moderate),
}
# Operands where an op has no derivative: max at a tie (a == b + 0.5 above),
# so finite differences see the average of its two slopes.
UNDEFINED = {'max': lambda a, b: abs(a - (b + 0.5)) < 0.01}
UNARY = {
    'neg': (lambda a: -a, moderate),
    'pow2': (lambda a: a ** 2, moderate),
    'pow3': (lambda a: a ** 3, moderate),
    'pow-1.5': (lambda a: a ** -1.5, positive),
    'pow0.5': (lambda a: a ** 0.5, positive),
    'relu': (lambda a: a.relu(), away_from_zero),
    'tanh': (lambda a: a.tanh(), moderate),
    'exp': (lambda a: a.exp(), moderate),
    'log': (lambda a: a.log(), positive),
    'sigmoid': (lambda a: a.sigmoid(), moderate),
}


@pytest.mark.parametrize('name', sorted(BINARY))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_binary_gradients(name, data):
    f, sa, sb = BINARY[name]
    a, b = data.draw(sa), data.draw(sb)
    assume(not UNDEFINED.get(name, lambda a, b: False)(a, b))
    check_grad(f, a, b)
    check_grad(lambda x: f(x, b), a)   # number on the right
    check_grad(lambda y: f(a, y), b)   # number on the left


@pytest.mark.parametrize('name', sorted(UNARY))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_unary_gradients(name, data):
    f, sa = UNARY[name]
    check_grad(f, data.draw(sa))


def test_numbers_on_either_side_give_the_same_values():
    a = Value(3.0)
    assert (2 + a).data == 5.0 and (a + 2).data == 5.0
    assert (2 - a).data == -1.0 and (a - 2).data == 1.0
    assert (2 * a).data == 6.0 and (a * 2).data == 6.0
    assert (6 / a).data == 2.0 and (a / 6).data == 0.5
    assert micrograd.max(4, a).data == 4.0 and a.max(4).data == 4.0


def test_op_results_set_every_slot_as_the_constructor_does():
    a, b = Value(1.5), Value(-2.0)
    for made, op, children, arg in [(a + b, '+', (a, b), None), (a ** 3, '**', (a,), 3.0),
                                    (a.tanh(), 'tanh', (a,), None), (a - 2, '-', (a,), None)]:
        children += made._prev[len(children):]         # (a - 2: its Constant 2)
        built = Value(made.data, children, op, arg, _backward=made._backward)
        assert type(made) is Value
        for slot in Value.__slots__:
            assert getattr(made, slot) == getattr(built, slot), slot


def test_known_forward_values():
    a, b = Value(-4.0), Value(2.0)
    c = a + b
    d = a * b + b ** 3
    c += c + 1
    c += 1 + c + (-a)
    d += d * 2 + (b + a).relu()
    d += 3 * d + (b - a).relu()
    e = c - d
    f = e ** 2
    g = f / 2.0
    g += 10.0 / f
    g.backward()
    # the classic micrograd example, whose values PyTorch gives
    assert g.data == pytest.approx(24.70408163265306, abs=1e-12)
    assert a.grad == pytest.approx(138.83381924198252, abs=1e-10)
    assert b.grad == pytest.approx(645.5772594752186, abs=1e-10)
    assert Value(0.0).tanh().data == 0.0
    assert Value(0.0).sigmoid().data == 0.5
    assert Value(1.0).exp().data == math.e
    assert Value(math.e).log().data == 1.0
    assert Value(-2.0).relu().data == 0.0


def test_reused_nodes_sum_their_paths():
    a = Value(3.0)
    b = a + a
    c = b + b
    c.backward()
    assert a.grad == 4.0
    x = Value(2.0)
    y = x * x * x
    y.backward()
    assert x.grad == 12.0


def test_interior_grads_restart_and_leaves_accumulate():
    x = Value(2.0)
    y = x * 3
    y.backward()
    y.backward()
    assert y.grad == 1.0
    assert x.grad == 6.0


def test_max_tie_goes_to_the_first_argument():
    a, b = Value(1.0), Value(1.0)
    a.max(b).backward()
    assert (a.grad, b.grad) == (1.0, 0.0)
    a, b = Value(1.0), Value(2.0)
    a.max(b).backward()
    assert (a.grad, b.grad) == (0.0, 1.0)


def test_a_200000_node_chain_needs_no_recursion():
    x = Value(1.0)
    y = x
    for _ in range(200_000):
        y = y + 1.0
    y.backward()
    assert y.data == 200_001.0
    assert x.grad == 1.0


def test_ieee_edge_cases_follow_c():
    assert Value(0.0).log().data == -math.inf
    assert math.isnan(Value(-1.0).log().data)
    assert (Value(1.0) / 0.0).data == math.inf
    assert (Value(-1.0) / 0.0).data == -math.inf
    assert (Value(1.0) / -0.0).data == -math.inf
    assert math.isnan((Value(0.0) / 0.0).data)
    assert Value(1000.0).exp().data == math.inf
    assert Value(-1000.0).exp().data == 0.0
    assert (Value(0.0) ** -1).data == math.inf
    assert (Value(-0.0) ** -1).data == -math.inf
    assert (Value(-0.0) ** -2).data == math.inf
    assert math.isnan((Value(-8.0) ** (1 / 3)).data)
    assert (Value(10.0) ** 400).data == math.inf
    assert (Value(-10.0) ** 401).data == -math.inf
    assert Value(-1000.0).sigmoid().data == 0.0
    assert Value(1000.0).sigmoid().data == 1.0
    x = Value(0.0)
    x.log().backward()      # d log(x)/dx at 0: 1/0 = inf, no exception
    assert x.grad == math.inf


def test_unsupported_operands_raise_type_error():
    with pytest.raises(TypeError):
        Value(1.0) + 'a'
    with pytest.raises(TypeError):
        Value(1.0) ** Value(2.0)
    with pytest.raises(TypeError):
        micrograd.max('a', 1.0)


def test_losses():
    probs = softmax([Value(1.0), Value(2.0), Value(3.0)])
    assert sum(p.data for p in probs) == pytest.approx(1.0, abs=1e-15)
    # numerically stable: huge logits do not overflow
    loss = cross_entropy([Value(1000.0), Value(0.0)], 0)
    assert loss.data == pytest.approx(0.0, abs=1e-12)
    loss = cross_entropy([Value(0.0), Value(1000.0)], 0)
    assert loss.data == pytest.approx(1000.0)
    onehot = cross_entropy([Value(0.5), Value(-0.5)], [0.0, 1.0])
    assert onehot.data == pytest.approx(math.log(1 + math.e))
    assert mse([Value(1.0), Value(3.0)], [0.0, 1.0]).data == 2.5
    with pytest.raises(ValueError):
        cross_entropy([Value(0.0)], 3)
    with pytest.raises(ValueError):
        mse([Value(1.0)], [])


def test_nn_matches_reference_signatures_and_is_reproducible():
    n = Neuron(3, nonlin=False)
    assert len(n.parameters()) == 4
    layer = Layer(3, 2)
    assert len(layer.parameters()) == 8
    a, b = MLP(784, [50, 10], seed=1, init='scaled'), MLP(784, [50, 10], seed=1, init='scaled')
    assert [p.data for p in a.parameters()] == [p.data for p in b.parameters()]
    assert len(a.parameters()) == 784 * 50 + 50 + 50 * 10 + 10
    bound = 1 / math.sqrt(784)
    assert all(abs(p.data) <= bound for p in a.layers[0].parameters())
    assert max(abs(p.data) for p in a.layers[0].parameters()) > bound / 2
    out = a([0.0] * 784)
    assert len(out) == 10
    a.zero_grad()
    assert all(p.grad == 0.0 for p in a.parameters())


def test_mlp_draws_its_weights_as_karpathys_micrograd():
    """MLP(nin, nouts) with no seed draws random.uniform(-1, 1) per weight from
    the global random, neuron by neuron, layer by layer, biases 0 without a
    draw: his micrograd's order, so his demo's numbers come out the same."""
    random.seed(1337)
    model = MLP(2, [16, 16, 1])
    random.seed(1337)
    expected = []
    for nin, nout in [(2, 16), (16, 16), (16, 1)]:
        for _ in range(nout):
            expected += [random.uniform(-1, 1) for _ in range(nin)] + [0.0]
    assert [p.data for p in model.parameters()] == expected
    random.seed(1337)
    seeded = MLP(2, [16, 16, 1], seed=5)
    assert [p.data for p in seeded.parameters()] != expected
    assert random.uniform(-1, 1) == expected[0], "seed= must leave the global random alone"
    with pytest.raises(ValueError, match='init'):
        MLP(2, [1], init='xavier')


def test_value_data_stays_a_python_float():
    v = Value(1.0)
    v.data = np.float32(0.1)
    assert type(v.data) is float and v.data == float(np.float32(0.1))
    w = v * 3.0
    assert w.data == float(np.float32(0.1)) * 3.0      # float64 arithmetic, not float32
    with pytest.raises(TypeError, match='real number'):
        v.data = '1.5'
    with pytest.raises(TypeError, match='real number'):
        v.data = None


def test_mlp_learns_xor():
    model = MLP(2, [8, 1], seed=0)
    data = [((0.0, 0.0), -1.0), ((0.0, 1.0), 1.0), ((1.0, 0.0), 1.0), ((1.0, 1.0), -1.0)]
    for _ in range(300):
        loss = mse([model(x) for x, _ in data], [y for _, y in data])
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= 0.1 * p.grad
    assert loss.data < 0.05


def test_draw_dot_shows_values_grads_and_ops():
    graphviz = pytest.importorskip('graphviz')
    x = Value(2.0, label='x')
    y = (x * 3).relu()
    y.backward()
    dot = micrograd.draw_dot(y)
    assert isinstance(dot, graphviz.Digraph)
    src = dot.source
    assert 'relu' in src and 'data 6.0000' in src and 'grad 3.0000' in src


def test_draw_dot_refuses_a_graph_too_big_to_lay_out_and_says_what_to_draw_instead():
    pytest.importorskip('graphviz')
    x = Value(1.0)
    for _ in range(666):           # 3 values per step (a constant, a product, a relu)
        x = (x * 1.0001).relu()
    assert micrograd.draw_dot(x).source.count('->') > 1500      # 1,999 values: drawn
    x = x * 1.0001                 # 2,001
    with pytest.raises(ValueError, match=r"2,001 values.*\.draw\('model\.svg'\)"):
        micrograd.draw_dot(x)
    assert 'relu' in micrograd.draw_dot(x, max_nodes=3000).source


def test_gc_paused_pauses_the_collector_and_gives_back_its_state_even_on_an_error():
    import gc
    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            with micrograd.gc_paused():
                assert not gc.isenabled()
                with micrograd.gc_paused():          # nested: the outer block's state stays
                    pass
                assert not gc.isenabled()
            assert gc.isenabled() == before
            with pytest.raises(ZeroDivisionError):
                with micrograd.gc_paused():
                    1 / 0
            assert gc.isenabled() == before
        gc.enable()
        with micrograd.gc_paused():                  # a graph built and run inside is the same graph
            x = Value(3.0)
            y = (x * x + x).relu()
            y.backward()
        assert (y.data, x.grad) == (12.0, 7.0)
    finally:
        (gc.enable if was else gc.disable)()
