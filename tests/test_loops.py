"""The loop pass (compiler/loops.py): periodic stretches of ops as ``Loop``
ops, folds as C loops; bit for bit the interpreter's, with and without the
pass, on every compiler, at every thread count, for every ``forward(n)``."""
import random

import numpy as np
import pytest

import compiler
from compiler.codegen import loops as loops_c
from compiler.ir import Dot, Loop, Op, Sum, MatVec, prefixes_hold
from compiler.loops import MIN_OPS, fuse_dots, lift_loops
from compiler.trace import trace
from compiler.vectorize import vectorize
from micrograd import Value

from tests.differential import (COMPILERS, FAST_CC, assert_matches_interpreter,
                                assert_train_batch_matches_interpreter, needs_cc, same)

pytestmark = needs_cc

ELEMENTWISE = ('tanh', 'relu', 'exp', 'sigmoid', 'neg', 'square', 'log', 'max', 'shift', 'halve')


def _elementwise(kind, y):
    if kind == 'tanh':
        return [v.tanh() for v in y]
    if kind == 'relu':
        return [v.relu() for v in y]
    if kind == 'exp':
        return [(v * 0.25).exp() for v in y]
    if kind == 'sigmoid':
        return [v.sigmoid() for v in y]
    if kind == 'neg':
        return [-v for v in y]
    if kind == 'square':
        return [v ** 2 for v in y]
    if kind == 'log':
        return [(v * v + 1.0).log() for v in y]
    if kind == 'max':
        return [a.max(b) for a, b in zip(y, y[1:] + y[:1])]
    if kind == 'shift':
        return [v - 0.5 for v in y]
    return [v / 2.0 for v in y]


def _rmsnorm(x):
    ms = sum(xi * xi for xi in x) / len(x)
    scale = (ms + 1e-5) ** -0.5
    return [xi * scale for xi in x]


def _softmax(logits):
    m = logits[0]
    for z in logits[1:]:
        m = m.max(z)
    exps = [(z - m).exp() for z in logits]
    total = sum(exps)
    return [e / total for e in exps]


def attention_model(T, C, H, kinds, seed):
    """A small causal attention model: per position rmsnorm, q/k/v from
    shared matrices, per head the dot products of q with every earlier key,
    a softmax (max chain, exp run, sum, divisions) and the weighted sums of
    the values, a residual add, then an elementwise op per ``kinds`` (one
    per position, cycled) and a squared-error loss per position. Returns
    ``(build(n, inputs, params) -> (losses, outputs), parameter values)``;
    the inputs are T vectors of C, then T targets of C."""
    rng = random.Random(seed)
    values = [rng.gauss(0, 0.5) for _ in range(3 * C * C + C)]
    hd = C // H

    def build(n, inputs, params):
        Wq, Wk, Wv = ([params[m * C * C + r * C:m * C * C + (r + 1) * C] for r in range(C)] for m in range(3))
        gain = params[3 * C * C:]
        keys, vals, losses, outputs = [], [], [], []
        for t in range(n):
            x = inputs[t * C:(t + 1) * C]
            target = inputs[(T + t) * C:(T + t + 1) * C]
            h = [hi * g for hi, g in zip(_rmsnorm(x), gain)]
            q = [sum(w * hi for w, hi in zip(row, h)) for row in Wq]
            keys.append([sum(w * hi for w, hi in zip(row, h)) for row in Wk])
            vals.append([sum(w * hi for w, hi in zip(row, h)) for row in Wv])
            attn = []
            for head in range(H):
                s = head * hd
                logits = [sum(q[s + j] * k[s + j] for j in range(hd)) / hd ** 0.5 for k in keys]
                weights = _softmax(logits)
                attn += [sum(weights[u] * vals[u][s + j] for u in range(len(keys))) for j in range(hd)]
            y = [a + b for a, b in zip(attn, x)]
            y = _elementwise(kinds[t % len(kinds)], y)
            outputs += y
            losses.append(sum((yi - ti) ** 2 for yi, ti in zip(y, target)))
        return losses, outputs
    return build, values


def whole_graph(build, T):
    """``build`` as one loss over all T positions, for the differential helpers."""
    def graph(inputs, params):
        losses, outputs = build(T, inputs, params)
        return sum(losses), outputs
    return graph


def _compile(losses, inputs, params, outputs, cc, loops=True, **kwargs):
    if loops:
        return compiler.compile(losses, inputs, params, outputs, cc=cc, **kwargs)
    saved = compiler.passes.lift_loops
    compiler.passes.lift_loops = lambda program: program
    try:
        return compiler.compile(losses, inputs, params, outputs, cc=cc, **kwargs)
    finally:
        compiler.passes.lift_loops = saved


def _sample(rng, T, C):
    return [rng.uniform(-1.5, 1.5) for _ in range(2 * T * C)]


def _check_every_prefix(m, build, params, T, C, rng):
    """forward(n) and backward for every n against the interpreter on n positions."""
    for n in [T] + list(range(1, T + 1)):
        row = _sample(rng, T, C)
        inputs = [Value(v) for v in row]
        for p in params:
            p.grad = 0.0
        losses, _ = build(n, inputs, params)
        loss = (1 / n) * sum(losses)
        loss.backward()
        m.zero_grad()
        m.set_input(row)
        got = m.forward(n)
        assert same(got, loss.data), (n, got, loss.data)
        m.backward()
        grads = m.grads().tolist()
        for i, p in enumerate(params):
            assert same(grads[i], p.grad), (n, i, grads[i], p.grad)


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('loops', [True, False])
@pytest.mark.parametrize('seed', [0, 1])
def test_attention_sequences_match_the_interpreter_for_every_n(cc, loops, seed):
    rng = random.Random(seed)
    T, C, H = 5, 8, 2
    kinds = rng.sample(ELEMENTWISE, 3)
    build, values = attention_model(T, C, H, kinds, seed)
    params = [Value(v) for v in values]
    inputs = [Value(0.0) for _ in range(2 * T * C)]
    losses, outputs = build(T, inputs, params)
    m = _compile(losses, inputs, params, outputs, cc, loops=loops)
    lifted = [op for op in m.program.ops if type(op) is Loop]
    assert bool(lifted) == loops
    assert m.module.positions == T
    _check_every_prefix(m, build, params, T, C, rng)


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('kind', ELEMENTWISE)
def test_one_graph_per_elementwise_op_matches_the_interpreter(cc, kind):
    T, C, H = 3, 8, 2
    build, values = attention_model(T, C, H, [kind], seed=5)
    rng = random.Random(11)
    samples = [_sample(rng, T, C) for _ in range(3)]
    m = assert_matches_interpreter(whole_graph(build, T), samples, values, cc)
    assert any(type(op) is Loop for op in m.program.ops)


@pytest.mark.parametrize('threads', [1, 2])
def test_train_batch_is_the_interpreters_at_every_thread_count(threads):
    T, C, H = 3, 8, 2
    build, values = attention_model(T, C, H, ['tanh', 'max'], seed=3)
    X = np.random.default_rng(4).uniform(-1, 1, size=(37, 2 * T * C))
    m = assert_train_batch_matches_interpreter(whole_graph(build, T), X, values, 0.05, FAST_CC,
                                               steps=2, threads=threads)
    assert any(type(op) is Loop for op in m.program.ops)


def _graph(T, C, H, kinds, seed):
    build, values = attention_model(T, C, H, kinds, seed)
    params = [Value(v) for v in values]
    inputs = [Value(0.0) for _ in range(2 * T * C)]
    losses, outputs = build(T, inputs, params)
    return losses, inputs, params, outputs


# -- the pass itself, without a compiler ---------------------------------------------

def _expanded(program):
    """The program's ops with every Loop replaced by the ops it stands for."""
    out = []
    for op in program.ops:
        out += op.ops() if type(op) is Loop else [op]
    return out


def _same_op(a, b, constants):
    """Equal ops, a constant read as any constant of the same bits."""
    def slot_value(s):
        return ('c', np.float64(constants[s]).tobytes()) if s in constants else s
    if type(a) is not type(b):
        return False
    if type(a) is Op:
        return (a.name, a.k, a.out, [slot_value(s) for s in a.args]) == \
            (b.name, b.k, b.out, [slot_value(s) for s in b.args])
    if type(a) is Sum:
        return a.out == b.out and [slot_value(s) for s in a.terms] == [slot_value(s) for s in b.terms]
    if type(a) is Dot:
        return ((a.out, slot_value(a.head) if a.head is not None else None, a.a, a.b)
                == (b.out, slot_value(b.head) if b.head is not None else None, b.a, b.b))
    return a is b


@pytest.mark.parametrize('seed', range(6))
def test_a_loop_stands_for_exactly_the_ops_it_replaces_in_their_order(seed):
    rng = random.Random(seed)
    T, C, H = rng.choice([(3, 4, 1), (4, 8, 2), (6, 8, 4)])
    before = fuse_dots(vectorize(trace(*_graph(T, C, H, rng.sample(ELEMENTWISE, 4), seed))))
    assert any(type(op) is Dot for op in before.ops)
    after = lift_loops(before)
    assert any(type(op) is Loop for op in after.ops)
    assert after.n_ops < before.n_ops
    old, new = before.ops, _expanded(after)
    assert len(old) == len(new)
    for a, b in zip(old, new):
        assert _same_op(a, b, before.constants), (a, b)
    # the loss's cone, the positions and the loss stay where they were
    assert len(_expanded_prefix(after, after.n_grad_ops)) == before.n_grad_ops
    assert after.prefix_sums == before.prefix_sums and prefixes_hold(after)
    assert lift_loops(after) is after


def test_a_dot_is_a_fold_of_products_used_by_it_alone():
    T, C, H = 4, 8, 2
    before = vectorize(trace(*_graph(T, C, H, ['tanh'], 1)))
    after = fuse_dots(before)
    producer = {op.out: op for op in before.ops if type(op) is Op}
    folds = {op.out: op for op in before.ops if type(op) is Sum}
    dots = [op for op in after.ops if type(op) is Dot]
    assert dots and after.n_ops == before.n_ops - sum(len(d.a) for d in dots)
    for d in dots:
        terms = folds[d.out].terms
        products = terms[1:] if d.head is not None else terms
        assert d.head is None or d.head == terms[0]
        assert [producer[t].name for t in products] == ['*'] * len(products)
        assert [producer[t].args for t in products] == list(zip(d.a, d.b))


def _expanded_prefix(program, n):
    out = []
    for op in program.ops[:n]:
        out += op.ops() if type(op) is Loop else [op]
    return out


def test_parameter_reads_the_loss_and_the_partial_sums_stay_scalar():
    T, C, H = 4, 8, 2
    program = lift_loops(vectorize(trace(*_graph(T, C, H, ['tanh'], 0))))
    ends = {program.loss, *program.prefix_sums}
    for op in program.ops:
        if type(op) is Loop:
            assert not any(program.param_start <= s < program.param_end for s in op.reads)
            assert not ends & set(op.writes)


def test_the_program_prints_its_loops():
    x = [Value(0.0) for _ in range(8)]
    loss = sum(v.tanh() for v in x)
    program = lift_loops(trace(loss, inputs=x))
    text = str(program)
    # the first tanh starts the fold, the last '+' writes the loss: 6 iterations between
    assert 'loop i < 6:' in text and '%11+2i = tanh(%1+i)' in text and '%12+2i = +(%10+2i, %11+2i)' in text


def test_the_c_of_a_loop_is_one_statement_over_places_in_progression():
    x = [Value(0.0) for _ in range(6)]
    loss = sum(v.exp() for v in x)
    program = lift_loops(vectorize(trace(loss, inputs=x)))     # the fold: a Sum
    loop = next(op for op in program.ops if type(op) is Loop)
    from compiler.codegen.layout import Layout
    from compiler.codegen.scalar import ScalarRenderer
    from compiler.ir import needs_grad
    flags = needs_grad(program)
    scalar = ScalarRenderer(Layout(program, flags))
    (forward,) = loops_c.forward_lines([loop], scalar)
    assert 'for (int i = 0; i < 6; i++)' in forward and 'exp(v[0 + i])' in forward, forward
    assert loops_c.function_runs([loop] * 40) == [[loop] * 16, [loop] * 16, [loop] * 8]


def test_a_matvec_stays_a_matvec():
    T, C, H = 3, 8, 2
    before = vectorize(trace(*_graph(T, C, H, ['relu'], 0)))
    after = lift_loops(before)
    assert sum(type(op) is MatVec for op in before.ops) == sum(type(op) is MatVec for op in after.ops) > 0


@pytest.mark.parametrize('small_cells', [0, loops_c.SMALL_CELLS])     # found by numpy, and in lists
def test_places_out_of_progression_come_from_a_table(small_cells, monkeypatch):
    monkeypatch.setattr(loops_c, 'SMALL_CELLS', small_cells)

    class Rows:     # where each slot lives (layout.loc: v[x], or p[-1 - x] below 0): irregular places
        class layout:
            loc = np.arange(40)
        loop_places = {}
    Rows.layout.loc[12], Rows.layout.loc[13] = 30, 35
    Rows.layout.loc[5:8] = [-1 - 7, -1 - 9, -1 - 11]       # a shared value's places, in progression
    Rows.layout.loc_list = Rows.layout.loc.tolist()
    loop = Loop(3, (Op('exp', 20, (11,)), Op('*', 24, (20, 5))), ((1, 1), (1, 1, 1)))
    (forward,) = loops_c.forward(loop, Rows())
    assert 'static const int at0[3] = {11, 30, 35};' in forward
    assert 'v[20 + i] = exp(v[at0[i]]);' in forward and 'v[24 + i] = v[20 + i] * p[7 + 2 * i];' in forward
    assert [str(op) for op in loop.ops()] == ['%20 = exp(%11)', '%24 = *(%20, %5)', '%21 = exp(%12)',
                                              '%25 = *(%21, %6)', '%22 = exp(%13)', '%26 = *(%22, %7)']


@pytest.mark.parametrize('cc', [FAST_CC])
def test_the_op_table_runs_loops_and_dots_between_its_entries(cc, monkeypatch):
    from compiler.codegen import table
    monkeypatch.setattr(table, 'TABLE_MIN_OPS', 10)
    T, C, H = 4, 8, 2
    build, values = attention_model(T, C, H, ['sigmoid', 'exp'], seed=2)
    params = [Value(v) for v in values]
    inputs = [Value(0.0) for _ in range(2 * T * C)]
    losses, outputs = build(T, inputs, params)
    m = _compile(losses, inputs, params, outputs, cc)
    assert 'vm_forward' in m.source and any(type(op) is Loop for op in m.program.ops)
    assert any(type(op) is Dot for op in m.program.ops)
    _check_every_prefix(m, build, params, T, C, random.Random(9))


@pytest.mark.parametrize('cc', COMPILERS)
def test_a_loss_that_is_a_dot_of_activations_with_input_gradients(cc):
    def graph(inputs, params):
        h = [(a * b).tanh() for a, b in zip(inputs, params)]
        g = [a.sigmoid() for a in inputs]
        return sum(hi * gi for hi, gi in zip(h, g)) + sum(hi * hi for hi in h), h
    rng = random.Random(6)
    samples = [[rng.uniform(-2, 2) for _ in range(9)] for _ in range(3)] + [[0.0] * 9]
    m = assert_matches_interpreter(graph, samples, [rng.uniform(-1, 1) for _ in range(9)], cc, input_grads=True)
    assert sum(type(op) is Dot for op in m.program.ops) == 2


def _read_between(where):
    """Three products ``h[2k] * h[2k + 1]`` folded into a sum, where ``where
    = (k, j)`` makes product ``k + 1``'s second operand ``exp(h[j])``: in the
    interpreter's order that reads ``h[j]`` between product ``k`` and the
    fold (None: no such read)."""
    def graph(inputs, params):
        h = [(a * b).tanh() for a, b in zip(inputs, params)]
        products = []
        for k in range(3):
            second = h[where[1]].exp() if where is not None and k == where[0] + 1 else h[2 * k + 1]
            products.append(h[2 * k] * second)
        return sum(products), h
    return graph


@pytest.mark.parametrize('where, fused', [((0, 0), False), ((0, 1), False), ((1, 2), False), ((1, 3), False),
                                          ((0, 4), True), (None, True)])
def test_a_read_of_an_operand_between_a_product_and_its_fold_keeps_the_products(where, fused):
    # Fused, that product's gradient would reach its operand at the fold,
    # after the other reader's (backward): the interpreter's order moved.
    # A read of a later product's operand moves nothing.
    rng = random.Random(4)
    samples = [[rng.uniform(-2, 2) for _ in range(6)] for _ in range(3)]
    m = assert_matches_interpreter(_read_between(where), samples, [rng.uniform(-1, 1) for _ in range(6)], FAST_CC,
                                   input_grads=True)
    assert any(type(op) is Dot for op in m.program.ops) == fused


@pytest.mark.parametrize('n', range(6))
def test_tiny_programs_pass_through(n):
    x = [Value(0.0) for _ in range(n)]
    p = Value(0.5)
    loss = sum((v * v for v in x), p) if n else p
    program = trace(loss, inputs=x, params=[p])
    out = lift_loops(program)
    if program.n_ops < MIN_OPS:
        assert out is program


def test_a_program_without_scalar_ops_has_no_dots():
    x, w = [Value(0.0) for _ in range(3)], [[Value(0.5) for _ in range(3)] for _ in range(5)]
    ys = [sum(wi * xi for wi, xi in zip(row, x)) for row in w]
    program = vectorize(trace(sum(ys), inputs=x, params=[p for row in w for p in row], outputs=ys))
    assert len(program.arrays.code) == 0
    assert fuse_dots(program) is program


def test_row_ranks_are_numpys_ranks_of_the_rows():
    from compiler.loops import _row_ranks
    rng = np.random.default_rng(1)
    for _ in range(100):
        n, k = int(rng.integers(1, 300)), int(rng.integers(1, 4))
        columns = [rng.integers(-3, int(rng.integers(1, 6)), n) << int(rng.integers(0, 60)) for _ in range(k)]
        expected = np.unique(np.column_stack(columns), axis=0, return_inverse=True)[1].reshape(-1)
        assert np.array_equal(_row_ranks(columns), expected)



def _tempting(inputs, params):
    """Stretches of ops whose slots step alike but that must not repeat each
    other: '**' with exponents 2, 2, 3 in turn, and products whose second
    operand (its slot one after the last's) needs a gradient every other
    time. The loss's one long sum makes the operands first, in order."""
    w, = params
    n = len(inputs) // 2
    wz, c0 = w * 1.0, inputs[0] * 0.5                  # a gradient; none
    powered = [(x * 1.5 * wz) ** (3 if i % 3 == 2 else 2) for i, x in enumerate(inputs[:n])]
    uv = [t for z in inputs[n:] for t in (z * c0, z * wz)]
    tails = [(p * q).tanh() for p, q in zip(powered + powered, uv)]      # and as the first operand
    heads = [(q * p).sigmoid() for p, q in zip(powered + powered, uv)]
    return sum(powered + uv + tails + heads), tails[:5]


def _tempting_graph(n):
    inputs, params = [Value(0.0) for _ in range(2 * n)], [Value(0.25)]
    loss, outputs = _tempting(inputs, params)
    return loss, inputs, params, outputs


def test_ops_that_differ_only_in_an_exponent_or_an_operands_gradient_are_no_repeats():
    before = fuse_dots(vectorize(trace(*_tempting_graph(24))))
    after = lift_loops(before)
    assert sum(type(op) is Loop for op in after.ops) >= 2
    old, new = before.ops, _expanded(after)
    assert len(old) == len(new) and all(_same_op(a, b, before.constants) for a, b in zip(old, new))


@pytest.mark.parametrize('cc', COMPILERS)
def test_ops_that_differ_only_in_an_exponent_or_an_operands_gradient_match_the_interpreter(cc):
    rng = random.Random(3)
    samples = [[rng.uniform(-2, 2) for _ in range(48)] for _ in range(2)]
    assert_matches_interpreter(_tempting, samples, [0.25], cc)


def test_signatures_are_equal_exactly_where_ops_may_repeat_each_other():
    # kind: -1 never in a loop, an op code, or a fold; head: the kind and what
    # else must match; code: 4 bits a cell (a scalar op's cells past its
    # third are all unused: 8)
    from compiler.loops import _DOT, _SUM, _signatures
    rng = np.random.default_rng(2)
    for _ in range(200):
        n, width = int(rng.integers(1, 60)), int(rng.integers(3, 33))
        kind = rng.choice([-1, 0, 1, 2, _SUM, _DOT], n)
        head = (kind + 1) | rng.integers(0, 3, n) << 8 | rng.integers(0, 2, n) << 20
        code = rng.integers(0, 3, (n, width)).astype(np.int8) * 3
        code[kind < _SUM, 3:] = 8
        for i in range(1, n):               # near-twins: a copy of an earlier row, one cell changed or none
            if rng.random() < 0.6:
                j = int(rng.integers(0, i))
                kind[i], head[i], code[i] = kind[j], head[j], code[j]
                c = int(rng.integers(0, 3 if kind[i] < _SUM else width))
                code[i, c] = rng.choice([code[i, c], (code[i, c] + 3) % 9])
        sig = _signatures(kind, head, code[:, :3], code[kind >= _SUM])
        assert np.array_equal(sig < 0, kind < 0)
        rows = [(int(h), bytes(c)) for h, c in zip(head, code)]
        for i in np.flatnonzero(kind >= 0):
            for j in np.flatnonzero(kind >= 0):
                assert (sig[i] == sig[j]) == (rows[i] == rows[j]), (i, j)
