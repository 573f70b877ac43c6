"""The positions pass: a matrix applied at every position of a sequence runs
as one ``MatMat`` and the sequence layer by layer, bit for bit the
interpreter's for every number of positions, compiler and thread count."""
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compiler
from compiler.ir import MatMat, MatVec, positions_of_ops
from compiler.positions import positions
from compiler.vectorize import vectorize
from micrograd import Value, cross_entropy
from microgpt import Config, init_weights, sequence_graph, value_weights

from tests.differential import COMPILERS, FAST_CC, needs_cc, same, split_flags

pytestmark = needs_cc

CONFIG = Config(vocab_size=5, n_embd=8, n_layer=2, n_head=2, block_size=4)


def gpt_case(seed=0, config=CONFIG):
    """A tiny microgpt: its weights, and ``graph(n, row)``: the interpreter's
    graph of ``n`` positions for a row of one-hot inputs (``row=None``: the
    placeholders to compile), with its fresh parameter Values."""
    weights = init_weights(config, random.Random(seed))

    def graph(n, tokens=None):
        sd, params = value_weights(weights)
        return sequence_graph(sd, config, n, tokens), params
    return weights, graph


def random_tokens(rng, n, config=CONFIG):
    return [rng.randrange(config.vocab_size) for _ in range(n + 1)]


def one_hot_row(tokens, config=CONFIG):
    """The compiled model's input row of a name's ``tokens``: its first
    positions' one-hot tokens, then their targets (the next tokens)."""
    T, V = config.block_size, config.vocab_size
    row = [0.0] * (2 * T * V)
    for t in range(len(tokens) - 1):
        row[t * V + tokens[t]] = 1.0
        row[T * V + t * V + tokens[t + 1]] = 1.0
    return row


def compile_gpt(graph, cc, config=CONFIG, **kwargs):
    g, params = graph(config.block_size)
    return compiler.compile(g.losses, g.inputs, params, outputs=[z for row in g.logits for z in row],
                            cc=cc, **kwargs)


def assert_positions_match(m, graph, rng, ns, config=CONFIG):
    """forward(n), the outputs, backward: the interpreter's bits, for each n."""
    V = config.vocab_size
    for n in ns:
        tokens = random_tokens(rng, n, config)
        row = one_hot_row(tokens, config)
        g, params = graph(n, tokens)
        loss = (1 / n) * sum(g.losses)
        loss.backward()
        m.zero_grad()
        m.set_input(row)
        got = m.forward(n)
        assert same(got, loss.data), (n, got, loss.data)
        outputs = m.outputs()
        assert outputs[:n * V].tolist() == [z.data for zs in g.logits for z in zs], n
        assert np.isnan(outputs[n * V:]).all(), n
        m.backward()
        grads = m.grads().tolist()
        bad = [i for i, (a, p) in enumerate(zip(grads, params)) if not same(a, p.grad)]
        assert not bad, f"n={n}: {len(bad)} gradients differ, first {params[bad[0]].label}"


def test_every_shared_matrix_of_microgpt_becomes_one_matmat():
    _, graph = gpt_case()
    g, params = graph(CONFIG.block_size)
    program = compiler.trace(g.losses, g.inputs, params, [z for row in g.logits for z in row])
    lifted = positions(vectorize(program))
    assert lifted.passes[-1] == 'positions'
    matmats = [op for op in lifted.ops if type(op) is MatMat]
    # wte (one-hot), then per layer q/k/v (one matrix of 3 * n_embd rows), wo, fc1, fc2, and lm_head
    assert len(matmats) == 2 + 4 * CONFIG.n_layer
    assert all(len(op.uses) == CONFIG.block_size for op in matmats)
    assert not any(type(op) is MatVec for op in lifted.ops)
    # every op has a position (or runs over them), the runs cover the program in order
    runs = lifted.position_runs
    assert runs[0][0] == 0 and runs[-1][1] == lifted.n_ops
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    position = positions_of_ops(lifted)
    assert {p for op, p in zip(lifted.ops, position) if type(op) is MatMat} == {-1}
    assert position[-1] == CONFIG.block_size - 1        # the mean of the losses: all positions only


@pytest.mark.parametrize('cc', COMPILERS)
def test_microgpt_forward_n_matches_the_interpreter_for_every_n(cc):
    _, graph = gpt_case()
    m = compile_gpt(graph, cc)
    assert 'positions' in m.program.passes
    assert m.source.count('positions at once */') >= 2 + 4 * CONFIG.n_layer   # one kernel call each
    T = CONFIG.block_size
    assert_positions_match(m, graph, random.Random(1), [T, 1, 2, 3, T, 2, 1])
    assert m.summary().count(f'{T} positions at once') == 2 + 4 * CONFIG.n_layer


def test_microgpt_from_the_op_table_runs_its_positions_the_same(monkeypatch):
    """The scalar ops of each position's runs as ranges of the op table
    (large programs), the MatMat ops between them."""
    from compiler.codegen import table
    monkeypatch.setattr(table, 'TABLE_MIN_OPS', 0)
    _, graph = gpt_case(seed=7)
    m = compile_gpt(graph, FAST_CC)
    assert 'vm_forward(' in m.source and 'positions at once */' in m.source
    assert_positions_match(m, graph, random.Random(8), [CONFIG.block_size, 2, 1, 3])


def test_without_the_pass_the_same_bits():
    """The same model with the positions pass and without (vectorize alone):
    the same losses, outputs and gradients."""
    _, graph = gpt_case(seed=3)
    m = compile_gpt(graph, FAST_CC)
    real = compiler.passes.positions
    try:
        compiler.passes.positions = lambda p: p
        plain = compile_gpt(graph, FAST_CC)
    finally:
        compiler.passes.positions = real
    assert 'positions' not in plain.program.passes and 'positions' in m.program.passes
    rng = random.Random(4)
    for n in (4, 1, 3):
        row = one_hot_row(random_tokens(rng, n))
        results = []
        for model in (m, plain):
            model.zero_grad()
            model.set_input(row)
            loss = model.forward(n)
            model.backward()
            results.append((loss, model.outputs()[:n * CONFIG.vocab_size].tolist(), model.grads().tolist()))
        assert results[0] == results[1], n


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [2, 3])
def test_backward_of_one_row_shares_its_parameter_gradients_between_threads(cc, threads):
    """backward() of one sequence hands its weight gradients to the threads
    (their helpers woken while the row's backward runs): the interpreter's
    bits for every n, at any thread count (built to split any work)."""
    _, graph = gpt_case(seed=9)
    m = compile_gpt(graph, cc, threads=threads, flags=split_flags(cc))
    assert_positions_match(m, graph, random.Random(10), [CONFIG.block_size, 1, 3, 2, CONFIG.block_size])


@pytest.mark.parametrize('threads', [1, 2, 3])
def test_train_batch_of_sequences_is_the_interpreters_at_every_thread_count(threads):
    """Whole sequences as the rows of train_batch, on 1, 2, 3 threads: every
    row runs every position, gradients added up in row order."""
    weights, graph = gpt_case(seed=5)
    m = compile_gpt(graph, FAST_CC, threads=threads)
    rng = random.Random(6)
    names = [random_tokens(rng, CONFIG.block_size) for _ in range(7)]
    X = np.array([one_hot_row(tokens) for tokens in names])
    lr = 0.05
    got = m.train_batch(X, lr)
    sd, params = value_weights(weights)
    total = 0.0
    for tokens in names:
        g = sequence_graph(sd, CONFIG, CONFIG.block_size, tokens)
        loss = (1 / CONFIG.block_size) * sum(g.losses)
        loss.backward()          # accumulates into the shared parameters
        total += loss.data
    assert same(got, total / len(X))
    expected = [p.data - lr * (p.grad / len(X)) for p in params]
    assert m.params().tolist() == expected


# -- other sequences: recurrences, matrices at some positions, refusals -------------

V, E, T = 4, 4, 5


def rnn_case(seed=0, fed_back=True, some_positions=False, bias=False):
    """A recurrence over T positions: h[t] = tanh(U x[t] + a[t-1]), a[t] =
    W h[t], the logits a[t] (W on its own result: a cycle, kept per
    position), or without ``fed_back`` h[t] = tanh(U x[t]); with
    ``some_positions`` a matrix S on h of the first two positions only;
    with ``bias`` U's sums start from values of their own position (heads
    in the rows), tanh(x[t][r] * q[r])."""
    rng = random.Random(seed)

    def build(n, inputs, params):
        U = [params[r * V:(r + 1) * V] for r in range(E)]
        W = [params[V * E + r * E:V * E + (r + 1) * E] for r in range(E)]
        S = [params[V * E + E * E + r * E:V * E + E * E + (r + 1) * E] for r in range(E)]
        q = params[V * E + 2 * E * E:]
        a = None
        losses, logits = [], []
        for t in range(n):
            x = inputs[t * V:(t + 1) * V]
            c = [(xi * qi + 0.5).tanh() for xi, qi in zip(x, q)] if bias else [0] * E
            u = [sum((w * xi for w, xi in zip(row, x)), ci) for row, ci in zip(U, c)]
            h = [(ui + ai).tanh() for ui, ai in zip(u, a)] if fed_back and a else [ui.tanh() for ui in u]
            if some_positions and t < 2:
                h = [sum(w * hi for w, hi in zip(row, h)).relu() for row in S]
            a = [sum(w * hi for w, hi in zip(row, h)) for row in W]
            logits += a
            losses.append(cross_entropy(a, inputs[T * V + t * V:T * V + (t + 1) * V]))
        return losses, logits
    return build, [rng.gauss(0, 0.7) for _ in range(V * E + 2 * E * E + (E if bias else 0))]


def assert_rnn_matches(build, values, cc, rng, ns):
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    params = [Value(x) for x in values]
    losses, logits = build(T, inputs, params)
    m = compiler.compile(losses, inputs, params, logits, cc=cc)
    for n in ns:
        row = [0.0] * (2 * T * V)
        for t in range(n):
            row[t * V + rng.randrange(V)] = 1.0
            row[T * V + t * V + rng.randrange(V)] = 1.0
        ref_params = [Value(x) for x in values]
        ref_losses, ref_logits = build(n, [Value(x) for x in row], ref_params)
        loss = (1 / n) * sum(ref_losses)
        loss.backward()
        m.zero_grad()
        m.set_input(row)
        assert same(m.forward(n), loss.data), n
        assert m.outputs()[:n * V].tolist() == [z.data for z in ref_logits], n
        m.backward()
        assert m.grads().tolist() == [p.grad for p in ref_params], n
    return m


@pytest.mark.parametrize('fed_back', [True, False])
def test_a_recurrence_keeps_its_fed_back_matrix_per_position(fed_back):
    build, values = rnn_case(fed_back=fed_back)
    m = assert_rnn_matches(build, values, FAST_CC, random.Random(2), [T, 1, 3, T, 2])
    matmats = [op for op in m.program.ops if type(op) is MatMat]
    per_position = [op for op in m.program.ops if type(op) is MatVec]
    assert 'positions' in m.program.passes
    # U (on the inputs) at once; W, on its own result, one position at a time
    assert [len(op.uses) for op in matmats] == ([T] if fed_back else [T, T])
    assert len(per_position) == (T if fed_back else 0)


def test_heads_computed_at_each_position_start_that_positions_sums():
    build, values = rnn_case(fed_back=False, bias=True, seed=2)
    m = assert_rnn_matches(build, values, FAST_CC, random.Random(4), [T, 2, 1, T, 3])
    matmats = [op for op in m.program.ops if type(op) is MatMat]
    assert len(matmats) == 2 and m.source.count('positions at once */') == 2
    assert all(h >= m.program.n_leaves for u in matmats[0].uses for h in u.heads)    # in the rows


def test_a_matrix_on_the_first_positions_only_runs_on_those_run():
    build, values = rnn_case(fed_back=False, some_positions=True, seed=1)
    m = assert_rnn_matches(build, values, FAST_CC, random.Random(3), [T, 1, 2, 3, 1, T])
    assert sorted(len(op.uses) for op in m.program.ops if type(op) is MatMat) == [2, T, T]


def test_a_schedule_that_would_reorder_a_gradient_is_refused():
    """e[0] is read at position 0 after a matrix's product and at position 1
    before any: layer by layer, position 1's read would come first, and the
    gradient of e[0] would add its contributions in another order. The pass
    gives the program back."""
    x = [Value(0.0) for _ in range(2 * T)]
    rng = random.Random(0)
    W = [[Value(rng.gauss(0, 1)) for _ in range(2)] for _ in range(2)]
    e = [Value(rng.gauss(0, 1)) for _ in range(T)]
    params = [w for row in W for w in row] + e
    losses = []
    for t in range(T):
        y = [sum(w * xi for w, xi in zip(row, x[2 * t:2 * t + 2])) for row in W]
        if t == 0:
            losses.append((y[0] * e[0]).tanh() + y[1])
        else:
            losses.append((e[0] * x[2 * t]).tanh() + y[0] * e[t] + y[1])
    program = vectorize(compiler.trace(losses, x, params))
    assert any(type(op) is MatVec for op in program.ops)
    assert positions(program) is program


# -- random sequence models ---------------------------------------------------------

LAYERS = ['linear', 'tanh', 'relu', 'attend', 'residual', 'gate']


@st.composite
def sequence_recipes(draw):
    e = draw(st.integers(2, 4))
    t = draw(st.integers(2, 4))
    layers = draw(st.lists(st.sampled_from(LAYERS), min_size=1, max_size=4))
    return e, t, layers


def sequence_model(recipe, seed):
    """``(build(n, inputs, params) -> (losses, logits), parameter values, T)``:
    one-hot tokens embedded by a matrix, the recipe's layers at each position
    (``attend``: the mean of this layer's states of the positions so far),
    an output matrix and a cross-entropy loss per position."""
    e, t_max, layers = recipe
    v = 3
    shapes = [('emb', e, v)] + [(f'{i}', e, e) for i, kind in enumerate(layers) if kind in ('linear', 'residual')]
    shapes += [(f'{i}', 1, e) for i, kind in enumerate(layers) if kind == 'gate'] + [('out', v, e)]
    rng = random.Random(seed)
    values = [rng.gauss(0, 0.8) for _, r, c in shapes for _ in range(r * c)]

    def build(n, inputs, params):
        mats, at = {}, 0
        for name, r, c in shapes:
            mats[name] = [params[at + i * c:at + (i + 1) * c] for i in range(r)]
            at += r * c
        states = {i: [] for i in range(len(layers))}
        losses, logits = [], []
        for t in range(n):
            x = [sum(w * o for w, o in zip(row, inputs[t * v:(t + 1) * v])) for row in mats['emb']]
            for i, kind in enumerate(layers):
                if kind == 'linear':
                    x = [sum(w * xi for w, xi in zip(row, x)) for row in mats[f'{i}']]
                elif kind == 'residual':
                    x = [a + sum(w * xi for w, xi in zip(row, x)) for a, row in zip(x, mats[f'{i}'])]
                elif kind == 'tanh':
                    x = [xi.tanh() for xi in x]
                elif kind == 'relu':
                    x = [xi.relu() for xi in x]
                elif kind == 'gate':
                    x = [xi * g for xi, g in zip(x, mats[f'{i}'][0])]
                else:
                    states[i].append(x)
                    x = [sum(s[d] for s in states[i]) * (1.0 / len(states[i])) for d in range(e)]
            z = [sum(w * xi for w, xi in zip(row, x)) for row in mats['out']]
            logits += z
            losses.append(cross_entropy(z, inputs[t_max * v + t * v:t_max * v + (t + 1) * v]))
        return losses, logits
    return build, values, t_max, v


@pytest.mark.parametrize('cc', COMPILERS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=sequence_recipes(), seed=st.integers(0, 1000), data=st.data())
def test_random_sequence_models_match_the_interpreter_for_every_n(cc, recipe, seed, data):
    build, values, t_max, v = sequence_model(recipe, seed)
    inputs = [Value(0.0) for _ in range(2 * t_max * v)]
    params = [Value(x) for x in values]
    losses, logits = build(t_max, inputs, params)
    m = compiler.compile(losses, inputs, params, logits, cc=cc)
    rng = random.Random(seed)
    for n in data.draw(st.lists(st.integers(1, t_max), min_size=1, max_size=3)) + [t_max]:
        row = [0.0] * (2 * t_max * v)
        for t in range(n):
            row[t * v + rng.randrange(v)] = 1.0
            row[t_max * v + t * v + rng.randrange(v)] = 1.0
        ref_params = [Value(x) for x in values]
        ref_losses, ref_logits = build(n, [Value(x) for x in row], ref_params)
        loss = (1 / n) * sum(ref_losses)
        loss.backward()
        m.zero_grad()
        m.set_input(row)
        assert same(m.forward(n), loss.data), (recipe, n)
        assert m.outputs()[:n * v].tolist() == [z.data for z in ref_logits], (recipe, n)
        m.backward()
        assert m.grads().tolist() == [p.grad for p in ref_params], (recipe, n)
