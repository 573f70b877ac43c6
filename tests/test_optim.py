"""Optimizers in C: bit for bit the documented formulas (compiler/optim.py's
plain-Python reference_step), and within 1e-12 of torch.optim."""
import math

import numpy as np
import pytest

import compiler
from micrograd import Value

from tests.differential import FAST_CC, COMPILERS, needs_cc

pytestmark = needs_cc
N = 7


def gradient_feeder(optimizer, cc=FAST_CC, p0=None):
    """A model whose parameter gradients are its inputs: loss = sum g_i p_i,
    so d loss / d p_i = g_i exactly. Returns (model, step(g, lr))."""
    g = [Value(0.0) for _ in range(N)]
    p = [Value(v) for v in (p0 if p0 is not None else np.linspace(-1.5, 2.0, N))]
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


def gradients(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(N) * 10.0 ** rng.integers(-3, 3) for _ in range(steps)]


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
