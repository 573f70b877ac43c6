"""Matrices applied at several positions (shared weights) and sequences of
per-position losses: lifted, and bit for bit the interpreter's."""
import os
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compiler
from compiler.ir import MatMat, MatVec, prefixes_hold
from micrograd import Value, cross_entropy

from tests.differential import COMPILERS, FAST_CC, assert_matches_interpreter, needs_cc, same, split_flags

pytestmark = needs_cc


def linear(x, W):
    return [sum(w * xi for w, xi in zip(row, x)) for row in W]


# -- shared weights: one matrix used 1-5 times, interleaved with other ops ------

@st.composite
def shared_recipes(draw):
    n_in = draw(st.integers(2, 5))
    n_out = draw(st.integers(1, 4))
    uses = draw(st.integers(1, 5))
    between = draw(st.lists(st.sampled_from(['tanh', 'relu', 'scale', 'mix', 'none']), min_size=uses,
                            max_size=uses))
    return n_in, n_out, uses, between


def shared_builder(recipe):
    """One matrix W (n_out x n_in) applied to `uses` vectors made from the
    inputs and from earlier results, other ops in between."""
    n_in, n_out, uses, between = recipe

    def build(inputs, params):
        W = [params[r * n_in:(r + 1) * n_in] for r in range(n_out)]
        extra = params[n_out * n_in:]
        x = list(inputs[:n_in])
        outs = []
        for u, kind in enumerate(between):
            y = linear(x, W)
            outs += y
            if u == uses - 1:
                break
            if kind == 'tanh':
                x = [v.tanh() for v in (y * n_in)[:n_in]]
            elif kind == 'relu':
                x = [(v + e).relu() for v, e in zip((y * n_in)[:n_in], extra)]
            elif kind == 'scale':
                x = [xi * extra[i % len(extra)] for i, xi in enumerate(x)]
            elif kind == 'mix':
                x = [xi + (y[i % n_out] * 0.5) for i, xi in enumerate(x)]
            else:
                x = [xi - 0.25 for xi in x]
        loss = sum((o * o for o in outs), Value(0.0, label='zero')) * (1.0 / len(outs))
        return loss, outs[:3]
    return build


@pytest.mark.parametrize('cc', COMPILERS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=shared_recipes(), data=st.data())
def test_a_matrix_applied_several_times_matches_the_interpreter(cc, recipe, data):
    n_in, n_out, uses, between = recipe
    values = st.floats(-2, 2, allow_nan=False)
    params = data.draw(st.lists(values, min_size=n_out * n_in + n_in, max_size=n_out * n_in + n_in))
    samples = data.draw(st.lists(st.lists(values, min_size=n_in, max_size=n_in), min_size=1, max_size=2))
    for vectorize in (True, False):
        assert_matches_interpreter(shared_builder(recipe), samples, params, cc, vectorize=vectorize)


def test_the_pass_lifts_every_use_of_a_shared_matrix_onto_one_block():
    recipe = (4, 3, 3, ['tanh', 'tanh', 'none'])      # each x feeds the matrix alone
    inputs = [Value(0.0) for _ in range(4)]
    params = [Value(random.Random(i).uniform(-1, 1)) for i in range(3 * 4 + 4)]
    loss, outs = shared_builder(recipe)(inputs, params)
    program = compiler.vectorize.vectorize(compiler.trace(loss, inputs, params, outs))
    mvs = [op for op in program.ops if type(op) is MatVec]
    assert len(mvs) == 3 and len({op.wt0 for op in mvs}) == 1


# -- sequences: per-position losses, the first n positions alone ---------------

V, E, T = 5, 4, 5       # vocabulary, embedding width, positions


def tiny_lm(seed=0):
    """A causal model over T positions: one-hot tokens, a shared embedding
    and output matrix, attention-like mixing of earlier positions. Returns
    (build(n) -> (losses of n positions, inputs, logits), params)."""
    rng = random.Random(seed)
    params = [Value(rng.gauss(0, 0.5)) for _ in range(V * E + E * E + V * E)]
    emb = [params[v * E:(v + 1) * E] for v in range(V)]
    mix = [params[V * E + r * E:V * E + (r + 1) * E] for r in range(E)]
    out = [params[V * E + E * E + v * E:V * E + E * E + (v + 1) * E] for v in range(V)]

    def build(n, inputs):
        toks = [inputs[t * V:(t + 1) * V] for t in range(n)]
        tgts = [inputs[T * V + t * V:T * V + (t + 1) * V] for t in range(n)]
        hidden, losses, logits = [], [], []
        for t in range(n):
            x = [sum(o * emb[v][d] for v, o in enumerate(toks[t])) for d in range(E)]
            hidden.append([h.tanh() for h in linear(x, mix)])
            ctx = [sum(h[d] for h in hidden) * (1.0 / (t + 1)) for d in range(E)]
            lg = linear(ctx, out)
            logits += lg
            losses.append(cross_entropy(lg, tgts[t]))
        return losses, logits
    return build, params


def one_hot_rows(rng, n):
    row = [0.0] * (2 * T * V)
    for t in range(n):
        row[t * V + rng.randrange(V)] = 1.0
        row[T * V + t * V + rng.randrange(V)] = 1.0
    return row


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('vectorize', [True, False])
def test_the_first_n_positions_give_the_interpreters_loss_and_gradients(cc, vectorize):
    build, params = tiny_lm()
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    losses, logits = build(T, inputs)
    m = compiler.compile(losses, inputs, params, logits, cc=cc, vectorize=vectorize)
    assert m.module.positions == T
    if vectorize:
        assert any(type(op) in (MatVec, MatMat) for op in m.program.ops)
    rng = random.Random(3)
    for n in [T, 1, 3, T, 2]:
        row = one_hot_rows(rng, n)
        # the interpreter: the same model (same weights) over n positions, Karpathy's mean
        b2, _ = tiny_lm()
        ref_losses, _ = b2(n, [Value(x) for x in row])
        loss = (1 / n) * sum(ref_losses)
        loss.backward()
        m.zero_grad()
        m.set_input(row)
        got = m.forward(n)
        assert same(got, loss.data), (n, got, loss.data)
        m.backward()
        assert m.grads().tolist() == [p.grad for p in _params_of(b2)], n


def _params_of(build):
    """The parameter Values a tiny_lm builder closes over, in order."""
    cells = {name: cell.cell_contents for name, cell in zip(build.__code__.co_freevars, build.__closure__)}
    return [p for rows in (cells['emb'], cells['mix'], cells['out']) for row in rows for p in row]


def test_a_sequence_trains_with_adam_as_the_interpreter_does():
    build, params = tiny_lm(seed=1)
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    losses, logits = build(T, inputs)
    opt = compiler.Adam(0.05, betas=(0.85, 0.99), eps=1e-8)
    m = compiler.compile(losses, inputs, params, logits, cc=FAST_CC, optimizer=opt)
    b2, _ = tiny_lm(seed=1)
    ref = _params_of(b2)
    p = [v.data for v in ref]
    state = [0.0, [0.0] * len(p), [0.0] * len(p)]
    rng = random.Random(5)
    for step in range(6):
        n = rng.randint(1, T)
        row = one_hot_rows(rng, n)
        m.zero_grad()
        m.set_input(row)
        got = m.forward(n)
        m.backward()
        lr = 0.05 * (1 - step / 6)
        m.step(lr)
        for v, x in zip(ref, p):
            v.data, v.grad = x, 0.0
        loss = (1 / n) * sum(b2(n, [Value(x) for x in row])[0])
        loss.backward()
        assert same(got, loss.data), step
        opt.reference_step(p, [v.grad for v in ref], state, lr)
        assert m.params().tolist() == p, step


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="zeroing beside the forward needs a second CPU")
@pytest.mark.parametrize('cc', [cc for cc in COMPILERS if cc != 'tcc'])   # tcc's helpers sleep: never beside
def test_gradients_zeroed_beside_the_forward_are_those_zeroed_by_the_backward(cc):
    """On two threads, a helper zeroes the gradients a row's backward adds
    into while its forward runs. Whatever the order of calls (a second
    backward, a second forward before the backward, a shorter one), the
    gradients are those of one thread, which zeroes them in the backward."""
    build, params = tiny_lm(seed=2)
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    losses, logits = build(T, inputs)
    two, one = (compiler.compile(losses, inputs, params, logits, cc=cc, flags=split_flags(cc), threads=t)
                for t in (2, 1))
    rng = random.Random(11)
    rows = [one_hot_rows(rng, T) for _ in range(3)]
    calls = [('input', 0), ('forward', T), ('backward',), ('backward',), ('forward', 2), ('forward', 4),
             ('backward',), ('input', 1), ('forward', 3), ('backward',), ('zero_grad',), ('input', 2),
             ('forward', 1), ('forward', T), ('backward',)]
    for k, (name, *args) in enumerate(calls):
        for m in (two, one):
            if name == 'input':
                m.set_input(rows[args[0]])
            else:
                getattr(m, name)(*args)
        if name == 'backward':
            assert two.grads().tobytes() == one.grads().tobytes(), (k, calls[:k + 1])
    b2, _ = tiny_lm(seed=2)        # the last forward and backward, on the interpreter
    loss = (1 / T) * sum(b2(T, [Value(x) for x in rows[2]])[0])
    loss.backward()
    assert two.grads().tolist() == [p.grad for p in _params_of(b2)]


def test_forward_n_is_checked():
    build, params = tiny_lm()
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    losses, logits = build(T, inputs)
    m = compiler.compile(losses, inputs, params, logits, cc=FAST_CC)
    for bad in (0, T + 1, -1):
        with pytest.raises(ValueError, match=f'from 1 to {T}'):
            m.forward(bad)
    with pytest.raises(TypeError, match='int'):
        m.forward(2.5)
    with pytest.raises(TypeError, match='n must be an int, not bool'):
        m.forward(True)                     # True is no count
    with pytest.raises(ValueError, match=f'n must be from 1 to {T}, got {2 ** 70}'):
        m.forward(2 ** 70)
    assert m.forward(np.int64(2)) == m.forward(2)
    assert np.isfinite(m.forward())        # all positions by default


@pytest.mark.parametrize('vectorize', [True, False])
def test_forward_n_leaves_no_stale_outputs(vectorize):
    """forward(n) computes the outputs of the first n positions: those are
    the interpreter's for the input just set, the later ones read as NaN,
    never as the values of an earlier, longer forward."""
    build, params = tiny_lm()
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    losses, logits = build(T, inputs)
    m = compiler.compile(losses, inputs, params, logits, cc=FAST_CC, vectorize=vectorize)
    rng = random.Random(7)
    first, second = one_hot_rows(rng, T), one_hot_rows(rng, T)
    m.set_input(first)
    m.forward(T)
    assert np.isfinite(m.outputs()).all()
    for n in (1, 3, T):
        m.set_input(second)
        m.forward(n)
        b2, _ = tiny_lm()
        _, ref_logits = b2(n, [Value(x) for x in second])
        got = m.outputs()
        assert got[:n * V].tolist() == [v.data for v in ref_logits], n
        assert np.isnan(got[n * V:]).all(), f"forward({n}) left outputs of later positions: {got[n * V:]}"
        m.set_input(first)
        m.forward(T)


def test_a_sequence_with_outputs_its_losses_do_not_use_is_refused():
    x = [Value(0.0) for _ in range(2)]
    w = Value(0.5)
    first, second = (x[0] * w) ** 2, (x[1] * w).tanh()
    aside = (x[0] + x[1]).exp()           # computed for the outputs alone
    with pytest.raises(compiler.TraceError, match='outputs of a sequence'):
        compiler.compile([first, second], x, [w], [aside], cc=FAST_CC)
    with pytest.raises(compiler.TraceError, match='empty'):
        compiler.compile([], x, [w], cc=FAST_CC)


def test_every_matrix_wrapper_written_is_called():
    """A use that its MatMat runs in its own calls has no wrapper of its own
    written (it would be dead C for the compiler to parse), and every wrapper
    written is called."""
    build, params = tiny_lm()
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    losses, logits = build(T, inputs)
    m = compiler.compile(losses, inputs, params, logits, cc=FAST_CC)
    assert any(type(op) is MatMat for op in m.program.ops)
    src = m.source
    defined = re.findall(r'^(mat(?:vec|mat)\d+_(?:forward|backward))\(', src, re.MULTILINE)
    assert any(name.startswith('matmat') for name in defined)
    assert [name for name in defined if len(re.findall(rf'\b{name}\(', src)) < 2] == []


def test_the_pass_keeps_every_position_self_contained():
    # whatever the pass reorders, the program it returns still runs position
    # by position (or the pass gives the program back unchanged)
    build, params = tiny_lm()
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    losses, logits = build(T, inputs)
    program = compiler.vectorize.vectorize(compiler.trace(losses, inputs, params, logits))
    assert 'vectorize' in program.passes and prefixes_hold(program) and program.prefix_sums
