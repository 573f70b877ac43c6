"""Optimizers in C: bit for bit the documented formulas (compiler/optim.py's
plain-Python reference_step), and within 1e-12 of torch.optim."""
import math
import re

import numpy as np
import pytest

import compiler
from micrograd import Value

from tests.differential import FAST_CC, COMPILERS, needs_cc

pytestmark = needs_cc
N = 7


def gradient_feeder(optimizer, cc=FAST_CC, p0=None, n=N):
    """A model of ``n`` parameters whose gradients are its inputs: loss =
    sum g_i p_i, so d loss / d p_i = g_i exactly. Returns (model, step(g, lr))."""
    g = [Value(0.0) for _ in range(n)]
    p = [Value(v) for v in (p0 if p0 is not None else np.linspace(-1.5, 2.0, n))]
    loss = sum(gi * pi for gi, pi in zip(g, p))
    m = compiler.compile(loss, g, p, cc=cc, optimizer=optimizer)

    def step(grad, lr=None):
        m.zero_grad()
        m.set_input(grad)
        m.forward()
        m.backward()
        assert m.grads().tolist() == list(grad)
        m.step(lr) if lr is not None else m.step()
    return m, step


OPTIMIZERS = [
    compiler.SGD(0.1), compiler.SGD(0.05, momentum=0.9), compiler.SGD(0.05, momentum=0.8, nesterov=True),
    compiler.SGD(0.1, momentum=0.5, weight_decay=0.01), compiler.Adam(0.01),
    compiler.Adam(0.01, betas=(0.85, 0.99), eps=1e-8), compiler.Adam(0.003, weight_decay=0.1),
    compiler.AdamW(0.01), compiler.AdamW(0.02, betas=(0.8, 0.9), weight_decay=0.3),
]


def gradients(steps, seed=0, n=N):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3) for _ in range(steps)]


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('opt', OPTIMIZERS, ids=repr)
def test_each_step_is_the_reference_formula_bit_for_bit(opt, cc):
    m, step = gradient_feeder(opt, cc)
    p = m.params().tolist()
    state = [0.0] + [[0.0] * N for _ in range(opt.state_vectors)]
    for k, g in enumerate(gradients(30)):
        lr = 0.5 * opt.lr if k % 7 == 3 else None       # an lr override now and then (a schedule)
        step(g, lr)
        opt.reference_step(p, g.tolist(), state, lr)
        assert m.params().tolist() == p, (k, opt)
    got = m.optimizer_state()
    assert got[0] == state[0] == 30.0
    assert got[1:].tolist() == [x for vec in state[1:] for x in vec]


@pytest.mark.parametrize('cc', COMPILERS)
def test_adams_vector_steps_stay_the_formula_when_its_bias_corrections_reach_one(cc):
    # with b1 = 0.5 and b2 = 0.6, 1 - b^t is exactly 1.0 from step 54 and 74:
    # the vector loops then leave out those divisions, on single steps
    # (divisor 1) and on batches (the mean gradient), over 37 parameters
    # (vectors of 8, 4 or 2, and a tail)
    n, opt = 37, compiler.Adam(0.01, betas=(0.5, 0.6), weight_decay=0.01)
    assert 1.0 - 0.5 ** 53 != 1.0 == 1.0 - 0.5 ** 54 and 1.0 - 0.6 ** 73 != 1.0 == 1.0 - 0.6 ** 74
    m, step = gradient_feeder(opt, cc, n=n)
    p = m.params().tolist()
    state = [0.0, [0.0] * n, [0.0] * n]
    for k in range(90):
        if k % 3:
            g = gradients(1, seed=k, n=n)[0]
            step(g)
        else:
            X = np.array(gradients(3, seed=k, n=n))
            m.train_batch(X)
            g = [sum(X[r, j] for r in range(3)) / 3 for j in range(n)]
        opt.reference_step(p, list(g), state)
        assert m.params().tolist() == p, k
    assert m.optimizer_state()[1:].tolist() == state[1] + state[2]


def extreme_numbers(rng, n, low, high, signed=True):
    """``n`` doubles, most of them of ordinary size and the rest at the edges
    of the range: +-0, subnormal, and magnitudes from 2^low to 2^high."""
    kind = rng.integers(0, 10, n)
    x = np.where(kind < 5, 2.0 ** rng.uniform(-40, 40, n),
                 np.where(kind < 8, 2.0 ** rng.uniform(low, high, n),
                          np.where(kind == 8, 0.0, 2.0 ** rng.uniform(-1074, -1022, n))))
    x = x * rng.uniform(1.0, 2.0, n)
    return np.where(rng.random(n) < 0.5, -x, x) if signed else x


def bits(values):
    return np.asarray(values, dtype=np.float64).view(np.uint64).tolist()


KERNEL_SETS = [(cc, kernels) for cc in COMPILERS for kernels in (['avx512', 'avx2', 'base'] if cc != 'tcc' else [''])]


@pytest.mark.parametrize('cc, kernels', KERNEL_SETS)
def test_adams_divisions_by_the_step_numbers_are_the_dividers_on_every_lane(cc, kernels, monkeypatch):
    """The vector loops divide by the batch's divisor and by 1 - b^t with a
    reciprocal and two FMA corrections, not the divider (optimizer.c): every
    lane must still get the division's bits, from moments and gradients of
    every size (+-0, subnormal, huge; with lr 1, p 0 and v tiny, a quotient's
    last bit shows in p even near 2^-1022), on single rows and on batches, while
    the corrections are below 1 and at 1 (b1 = 0.5 reaches 1 at step 54),
    and where 1 - b1 is too small for them (b1 = 1 - 2^-24: the divider)."""
    monkeypatch.setenv('MICROGRAD_KERNELS', kernels)
    n, rng = 203, np.random.default_rng(11)
    for opt in (compiler.Adam(0.01, betas=(0.85, 0.99)), compiler.Adam(0.003, betas=(0.5, 0.999), weight_decay=0.01),
                compiler.Adam(1.0, betas=(0.9, 0.99)), compiler.Adam(0.01, betas=(1.0 - 2.0 ** -24, 0.9))):
        m, _ = gradient_feeder(opt, cc, n=n)
        for k, t in enumerate([0, 1, 2, 7, 60, 0, 3, 400]):
            rows = 1 + k % 3
            p, mean, var = (extreme_numbers(rng, n, -1074, 600), extreme_numbers(rng, n, -1074, 600),
                            extreme_numbers(rng, n, -1074, 1000, signed=False))
            X = np.array([extreme_numbers(rng, n, -1074, 600) for _ in range(rows)])
            # the first 40: where a tiny quotient shows in p: p, m and v tiny or 0 (p and m
            # also -0), gradients of a few subnormal steps below 0 (so m may stay -0)
            tiny = slice(0, 40)
            p[tiny] = rng.choice([-0.0, 0.0, -0.0, 0.0, -2.0 ** -1040, 2.0 ** -1030], 40)
            mean[tiny] = rng.choice([-0.0, 0.0, -2.0 ** -1070, 2.0 ** -1050, 2.0 ** -1000], 40)
            mean[tiny] *= np.where(mean[tiny] == 0.0, 1.0, rng.uniform(1.0, 2.0, 40))
            mean[tiny][::3] = rng.uniform(-2.0, 2.0, 14) * 2.0 ** -1022     # 2^-1042..2^-1002: wrong there without the guard
            var[tiny] = rng.choice([0.0, 2.0 ** -1074, 2.0 ** -1060, 2.0 ** -1030], 40)
            X[:, tiny] = -2.0 ** -1074 * rng.integers(1, 4, (rows, 40))
            m.set_params(p)
            state = [float(t), mean.tolist(), var.tolist()]
            m.set_optimizer_state([state[0]] + state[1] + state[2])
            p = m.params().tolist()
            if rows == 1:
                m.zero_grad()
                m.set_input(X[0])
                m.forward()
                m.backward()
                g = m.grads().tolist()
                assert bits(g) == bits(X[0] + 0.0)
                m.step()
            else:
                m.train_batch(X)
                g = [float(sum(X[r, j] for r in range(rows))) / rows for j in range(n)]
            opt.reference_step(p, g, state)
            assert np.isfinite(p).all()
            assert bits(m.params()) == bits(p), (opt, t, rows)
            assert bits(m.optimizer_state()) == bits([state[0]] + state[1] + state[2]), (opt, t, rows)


@pytest.mark.torch
@pytest.mark.parametrize('opt', OPTIMIZERS, ids=repr)
def test_a_hundred_steps_stay_within_1e_12_of_torch(opt):
    torch = pytest.importorskip('torch')
    m, step = gradient_feeder(opt)
    w = torch.tensor(m.params(), dtype=torch.float64, requires_grad=True)
    if type(opt) is compiler.SGD:
        t = torch.optim.SGD([w], lr=opt.lr, momentum=opt.momentum, nesterov=opt.nesterov,
                            weight_decay=opt.weight_decay)
    else:
        cls = torch.optim.AdamW if type(opt) is compiler.AdamW else torch.optim.Adam
        t = cls([w], lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)
    for g in gradients(100, seed=1):
        step(g)
        w.grad = torch.tensor(g, dtype=torch.float64)
        t.step()
    ours, theirs = m.params(), w.detach().numpy()
    assert np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)) <= 1e-12


def test_bias_correction_at_the_first_step():
    # Adam's first step moves every parameter by lr * sign(g) (to within eps)
    m, step = gradient_feeder(compiler.Adam(0.01, eps=0.0))
    before = m.params()
    g = np.array([3.0, -2.0, 0.5, -0.25, 1e-3, -7.0, 2.0])
    step(g)
    assert np.allclose(before - m.params(), 0.01 * np.sign(g), rtol=1e-15, atol=0)


def test_train_batch_steps_on_the_mean_gradient():
    opt = compiler.Adam(0.05)
    m, _ = gradient_feeder(opt)
    X = np.array([gradients(1, seed=s)[0] for s in range(4)])
    p = m.params().tolist()
    m.train_batch(X)
    mean = [sum(X[r, j] for r in range(4)) / 4 for j in range(N)]    # row order, then / rows
    state = [0.0, [0.0] * N, [0.0] * N]
    opt.reference_step(p, mean, state)
    assert m.params().tolist() == p


def test_bad_optimizer_arguments_are_refused():
    with pytest.raises(ValueError, match='betas'):
        compiler.Adam(0.1, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match='lr'):
        compiler.SGD(-1.0)
    with pytest.raises(ValueError, match='nesterov'):
        compiler.SGD(0.1, nesterov=True)
    with pytest.raises(TypeError, match='optimizer'):
        x = Value(0.0)
        compiler.compile(x * 2.0, [x], cc=FAST_CC, optimizer='adam')


def test_step_takes_lr_and_zero_grad_by_position_or_by_name():
    w, x = Value(0.5), Value(0.0)
    m = compiler.compile((w * x) ** 2, [x], [w], cc=FAST_CC, optimizer=compiler.SGD(0.1))
    m.set_input([2.0])
    m.forward()
    m.backward()
    m.step(0.05, True)                      # w -= 0.05 * 2 * (w x) x = 0.05 * 4
    assert m.params().tolist() == [0.5 - 0.05 * 4.0] and m.grads().tolist() == [0.0]
    m.step(lr=None, zero_grad=False)        # a zero gradient: no move
    assert m.params().tolist() == [0.5 - 0.05 * 4.0]
    for call, message in [(lambda: m.step(zero_grad=1), 'zero_grad must be True or False, not 1'),
                          (lambda: m.step(0.1, lr=0.2), "multiple values for argument 'lr'"),
                          (lambda: m.step(rate=0.1), "unexpected keyword argument 'rate'"),
                          (lambda: m.step(0.1, False, 3), 'takes 0 to 2 arguments (3 given)')]:
        with pytest.raises(TypeError, match=re.escape(message)):
            call()
    assert m.params().tolist() == [0.5 - 0.05 * 4.0]


def test_step_without_an_optimizer_needs_an_lr():
    x, w = Value(0.0), Value(1.0)
    m = compiler.compile(x * w, [x], [w], cc=FAST_CC)
    with pytest.raises(TypeError, match='lr is required'):
        m.step()
    m.set_input([2.0])
    m.forward()
    m.backward()
    m.step(0.25)                   # plain SGD with that lr
    assert m.params()[0] == 1.0 - 0.25 * 2.0
    assert math.isfinite(m.optimizer_state()[0])


# -- settings and states that would poison training (issue 21, items 3 and 4) --------

@pytest.mark.parametrize('make, word', [
    (lambda: compiler.Adam(math.inf), 'lr must be a finite number'),
    (lambda: compiler.AdamW(weight_decay=math.inf), 'weight_decay must be a finite number'),
    (lambda: compiler.SGD(0.1, momentum=math.inf), 'momentum must be a finite number'),
    (lambda: compiler.Adam(0.1, eps=math.inf), 'eps must be a finite number'),
    (lambda: compiler.SGD(10 ** 400), 'lr must be a finite number'),
])
def test_infinite_settings_are_refused_at_construction(make, word):
    with pytest.raises(ValueError, match=word):
        make()


@pytest.mark.parametrize('nesterov', ['yes', 0.5, 1, None])
def test_nesterov_must_be_a_boolean(nesterov):
    with pytest.raises(TypeError, match='nesterov must be True or False'):
        compiler.SGD(0.1, momentum=0.9, nesterov=nesterov)


def poisoned_states():
    n = N
    good = np.concatenate([[3.0], np.full(n, 0.1), np.full(n, 0.2)])    # Adam: t, m, v
    cases = {'t = -1': (0, -1.0, 'step count t must be a whole number >= 0'),
             't = 2.5': (0, 2.5, 'step count t must be a whole number >= 0'),
             'negative v': (1 + n + 2, -1e-3, 'second moment v of parameter 2'),
             'nan m': (1 + 4, np.nan, 'first moment m of parameter 4 is nan'),
             'inf v': (1 + n + 1, np.inf, 'second moment v of parameter 1 is inf')}
    for name, (at, value, word) in cases.items():
        state = good.copy()
        state[at] = value
        yield pytest.param(state, word, id=name)
    yield pytest.param(good[:-1], f'has {2 * n} numbers', id='one short')
    yield pytest.param(np.array(['3'] + ['0.1'] * (2 * n)), 'must be a vector of numbers', id='strings')


@pytest.mark.parametrize('state, word', list(poisoned_states()))
def test_a_state_that_would_poison_training_is_refused_by_file_and_by_call(tmp_path, state, word):
    from compiler.weights import WeightsError
    m, step = gradient_feeder(compiler.Adam(0.01))
    step(np.ones(N))
    path = tmp_path / 'w.npz'
    m.save_weights(path)
    arrays = dict(np.load(path))
    arrays['optimizer_state'] = state
    np.savez(path, **arrays)
    before, before_state = m.params(), m.optimizer_state()
    with pytest.raises(WeightsError, match='optimizer state.*' + word):
        m.load_weights(path)
    if state.dtype.kind == 'f' and state.size == 1 + 2 * N:
        with pytest.raises(WeightsError, match=word):
            m.set_optimizer_state(state)
    assert m.params().tolist() == before.tolist()
    assert m.optimizer_state().tolist() == before_state.tolist()
    step(np.ones(N))
    assert np.isfinite(m.params()).all()


def test_a_valid_state_round_trips_and_sgd_momentum_state_is_not_applied_to_plain_sgd(tmp_path):
    m, step = gradient_feeder(compiler.SGD(0.1, momentum=0.9))
    step(np.arange(N, dtype=float))
    m.save_weights(tmp_path / 'w.npz')
    other, _ = gradient_feeder(compiler.SGD(0.1, momentum=0.9))
    other.load_weights(tmp_path / 'w.npz')
    assert other.optimizer_state().tolist() == m.optimizer_state().tolist()
    plain, _ = gradient_feeder(compiler.SGD(0.1))
    plain.load_weights(tmp_path / 'w.npz')     # another configuration: parameters only
    assert plain.params().tolist() == m.params().tolist() and plain.optimizer_state().tolist() == [0.0]



# Past MIN_SPLIT_PARAMS (optimizer.c) the step runs on the threads and so do
# the packs of the weights the loops read. MLP(200, [72, 40, 10]) (17,802
# parameters) has one block of most of them: each part steps an even range,
# then after a barrier packs every parts-th block. MLP(52, [52] * 6 + [10])
# (17,020) has seven blocks, dealt at 2 and 3 threads: each part steps its
# blocks and packs each right after, then its share of the other parameters.
LARGE_MODELS = [(200, [72, 40, 10]), (52, [52] * 6 + [10])]


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2, 3])
@pytest.mark.parametrize('shape', LARGE_MODELS, ids=['one-block', 'blocks-dealt'])
def test_a_large_models_step_and_its_packed_weights_are_the_interpreters_on_any_thread_count(shape, threads, cc):
    """Every weight's new value must reach the next forward, from any split
    of the step and the packs; ``step(zero_grad=True)`` (odd steps) leaves
    every gradient 0, as ``zero_grad()`` after ``step()`` (even steps) does."""
    from micrograd.nn import MLP
    opt, targets = compiler.Adam(0.01), np.linspace(-1.0, 1.0, 10).tolist()
    rng = np.random.default_rng(5)
    n_in, sizes = shape
    model = MLP(n_in, sizes)
    params = model.parameters()
    assert len(params) >= 16384
    for p, v in zip(params, rng.standard_normal(len(params)) * 0.1):
        p.data = float(v)

    def loss_of(x):
        return sum((o - t) ** 2 for o, t in zip(model(x), targets))
    x = [Value(0.0) for _ in range(n_in)]
    m = compiler.compile(loss_of(x), x, params, cc=cc, optimizer=opt, threads=threads, input_grads=True)
    assert m.summary().count('MatVec') == len(sizes), m.summary()   # the packed weights' loops
    state = [0.0] + [[0.0] * len(params) for _ in range(opt.state_vectors)]
    for k in range(4):
        row = rng.standard_normal(n_in).tolist()
        for p in params:
            p.grad = 0.0
        want = loss_of([Value(v) for v in row])   # the interpreter, at this step's weights
        want.backward()
        m.set_input(row)
        assert m.forward() == want.data, k
        m.backward()
        assert m.grads().tolist() == [p.grad for p in params], k
        if k % 2:
            m.step(zero_grad=True)
        else:
            m.step()
            m.zero_grad()
        assert not m.grads().any() and not m.input_grads().any(), k
        p_ref = [p.data for p in params]
        opt.reference_step(p_ref, [p.grad for p in params], state)
        for p, v in zip(params, p_ref):
            p.data = v
        assert m.params().tolist() == p_ref, k
