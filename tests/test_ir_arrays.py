"""The array IR: what ``trace`` builds (``ir.ScalarArrays``) and the
analyses that read it, against plain reference implementations over the
``Value`` graph and over ``Op`` objects."""
import random

import numpy as np
import pytest

import micrograd
from compiler import ir
from compiler.vectorize import vectorize
from compiler.ir import OP_NAMES, Op, Program, ScalarArrays, features, graph_hash, inputs_used, needs_grad, \
    prefix_cuts, prefixes_hold
from compiler.trace import trace_graph, trace_with_slots
from micrograd import Value
from micrograd.engine import topological_order
from tests.graphs import every_op_graph, mlp_builder

UNARY = [lambda a: -a, lambda a: a.relu(), lambda a: a.tanh(), lambda a: a.exp(), lambda a: a.log(),
         lambda a: a.sigmoid(), lambda a: a ** 2, lambda a: a ** -0.5]
BINARY = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b,
          lambda a, b: micrograd.max(a, b), lambda a, b: a + 2.0, lambda a, b: 3.0 * b]


def random_graph(seed, n_ops=300):
    """(loss, inputs, params, outputs): ops over random earlier values, some
    dead, some shared, constants the ops wrap."""
    rng = random.Random(seed)
    inputs = [Value(rng.uniform(-1, 1)) for _ in range(rng.randint(1, 6))]
    params = [Value(rng.uniform(-1, 1)) for _ in range(rng.randint(1, 8))]
    pool = inputs + params
    for _ in range(n_ops):
        a = pool[-1 - min(len(pool) - 1, int(rng.expovariate(1 / 8)))]
        b = rng.choice(pool)
        pool.append(rng.choice(UNARY)(a) if rng.random() < 0.4 else rng.choice(BINARY)(a, b))
    loss = pool[-1] + pool[-2]
    outputs = rng.sample(pool[len(inputs) + len(params):], 3)
    return loss, inputs, params, outputs


def as_objects(program):
    """The same program with ``Op`` objects only: the analyses' object path."""
    return Program(n_slots=program.n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                   constants=program.constants, ops=list(program.ops), n_grad_ops=program.n_grad_ops,
                   loss=program.loss, outputs=program.outputs, input_grads=program.input_grads,
                   prefix_sums=program.prefix_sums)


@pytest.mark.parametrize('seed', range(12))
def test_trace_numbers_values_in_the_interpreters_order(seed):
    loss, inputs, params, outputs = random_graph(seed)
    program, slots = trace_with_slots(loss, inputs, params, outputs)
    order = topological_order([loss])
    order += topological_order(outputs, set(order))
    computed = [v for v in order if v._prev]
    leaves = [v for v in order if not v._prev and v not in set(inputs) | set(params)]
    assert [slots[v] for v in inputs + params] == list(range(len(inputs) + len(params)))
    assert [slots[v] for v in leaves] == list(range(len(inputs) + len(params), program.n_leaves))
    assert [slots[v] for v in computed] == list(range(program.n_leaves, program.n_slots))
    arrays = program.arrays
    for v, code, out, a, b in zip(computed, arrays.code, arrays.out, arrays.a, arrays.b):
        assert OP_NAMES[code] == v._op and out == slots[v]
        assert [a, b][:len(v._prev)] == [slots[c] for c in v._prev]
        assert b == -1 or len(v._prev) == 2
    assert program.n_grad_ops == sum(1 for v in topological_order([loss]) if v._prev)
    for op, v in zip(program.ops, computed):
        assert op.k == (v._arg if v._op == '**' else None)


def reference_needs_grad(program):
    """By definition, from the ops as objects in a fresh order: a slot needs a
    gradient if a parameter (or an input, with input_grads) is among its
    operands' ancestors, in the loss's cone."""
    flags = [False] * program.n_slots
    for s in range(program.param_start, program.param_end):
        flags[s] = True
    if program.input_grads:
        for s in range(program.n_inputs):
            flags[s] = True
    for op in program.ops[:program.n_grad_ops]:
        flags[op.out] = any(flags[a] for a in op.args)
    return flags


def reference_live(program, roots):
    live = set(roots)
    for op in reversed(program.ops):
        if op.out in live:
            live.update(op.args)
    return live


@pytest.mark.parametrize('seed', range(12))
@pytest.mark.parametrize('input_grads', [False, True])
def test_analyses_on_arrays_match_references(monkeypatch, seed, input_grads):
    loss, inputs, params, outputs = random_graph(seed)
    program = trace_graph(loss, inputs, params, outputs, input_grads=input_grads)[0]
    assert program.scalar_arrays is not None
    objects = as_objects(program)
    flags = needs_grad(program)
    assert list(map(bool, flags)) == reference_needs_grad(program)
    assert flags == needs_grad(objects)
    live = reference_live(program, (program.loss, *program.outputs))
    assert inputs_used(program) == [s for s in range(program.n_inputs) if s in live] == inputs_used(objects)
    live = reference_live(program, program.outputs)
    assert features(program) == [s for s in range(program.n_inputs) if s in live] == features(objects)
    assert graph_hash(program) == graph_hash(objects) == program.graph_hash
    monkeypatch.setattr(ir, 'HASH_CHUNK_OPS', 7)          # the arrays hashed in chunks: the same bytes
    assert graph_hash(program) == program.graph_hash


def test_graph_hash_names_the_graph_across_builds():
    def build(seed):
        return trace_graph(*random_graph(seed))[0]
    first, again, other = build(3), build(3), build(4)
    assert first.graph_hash == again.graph_hash != other.graph_hash
    assert vectorize(first).graph_hash == first.graph_hash
    # a different exponent, constant or output is a different graph
    x, w = Value(0.0), Value(0.5)
    hashes = {trace_graph(loss, [x], [w])[0].graph_hash
              for loss in ((x * w) ** 2, (x * w) ** 3, x * w + 1.0, x * w + 2.0, x * w)}
    assert len(hashes) == 5


def test_graph_hash_is_the_hash_of_before_the_arrays():
    """The bytes hashed are those of the Op-object IR (weights saved by an
    earlier build of a graph fit this one): a golden value."""
    program = trace_graph(*every_op_graph())[0]
    assert program.graph_hash == graph_hash(as_objects(program))
    assert program.graph_hash == '13846f86c5257394'   # main at 99d057e


def test_ops_are_built_only_when_read_and_round_trip():
    loss, inputs, params, outputs = random_graph(5)
    program = trace_graph(loss, inputs, params, outputs)[0]
    assert program._ops is None
    ops = program.ops
    assert all(type(op) is Op for op in ops) and program.ops is ops
    again = ScalarArrays.from_ops(ops)
    for name in ('code', 'out', 'a', 'b'):
        assert np.array_equal(getattr(again, name), getattr(program.arrays, name))
    assert again.k == program.arrays.k



@pytest.mark.parametrize('seed', range(4))
def test_taken_ops_keep_their_exponents_and_renamed_slots(seed):
    """``ScalarArrays.taken``: a shuffled subset of the ops, each ``**``
    with its own exponent, slots renamed, against the ``Op`` objects."""
    program = trace_graph(*random_graph(seed))[0]
    arrays, ops = program.arrays, program.ops
    assert arrays.k, 'the graph has ** ops'
    rng = np.random.default_rng(seed)
    picked = rng.permutation(len(ops))[:len(ops) // 2]
    rename = rng.permutation(program.n_slots)
    for names in (None, rename):
        got = arrays.taken(picked, rename=names)
        want = [ops[i] for i in picked.tolist()]
        to = (lambda s: s) if names is None else (lambda s: int(names[s]))
        assert got.out.tolist() == [to(op.out) for op in want]
        assert got.a.tolist() == [to(op.args[0]) for op in want]
        assert got.b.tolist() == [to(op.args[1]) if len(op.args) == 2 else -1 for op in want]
        assert [OP_NAMES[c] for c in got.code.tolist()] == [op.name for op in want]
        assert got.k == {j: op.k for j, op in enumerate(want) if op.k is not None}
        assert any(op.k is not None for op in want)

def sequence(n_positions, seed=0):
    """A toy sequence: each position's loss reads the earlier positions' states."""
    rng = random.Random(seed)
    w = [Value(rng.uniform(-1, 1)) for _ in range(3)]
    xs = [Value(0.0) for _ in range(n_positions)]
    states, losses = [], []
    for t in range(n_positions):
        h = (xs[t] * w[0] + sum((s * w[1] for s in states), Value(0.0, label='zero'))).tanh()
        states.append(h)
        losses.append((h - w[2]) ** 2)
    return losses, xs, w


@pytest.mark.parametrize('n', [1, 2, 5])
def test_prefix_cuts_and_prefixes_hold_on_arrays(n):
    losses, xs, w = sequence(n)
    program = trace_graph(losses, xs, w, constants=[])[0]
    assert program.scalar_arrays is not None
    objects = as_objects(program)
    assert prefix_cuts(program) == prefix_cuts(objects)
    assert [program.ops[c].out for c in prefix_cuts(program)] == list(program.prefix_sums)
    assert prefixes_hold(program) and prefixes_hold(objects)
    lifted = vectorize(program)
    assert prefixes_hold(lifted)


def test_prefixes_hold_refuses_a_position_reading_a_later_one():
    losses, xs, w = sequence(3)
    program = trace_graph(losses, xs, w)[0]
    arrays = program.arrays
    # make position 0's partial sum's cone miss an op of its range: swap two ops' operands
    cut = prefix_cuts(program)[0]
    broken = ScalarArrays(arrays.code.copy(), arrays.out.copy(), arrays.a.copy(), arrays.b.copy(), dict(arrays.k))
    broken.a[cut] = broken.b[cut] = 0        # the partial sum reads an input only
    bad = Program(n_slots=program.n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                  constants=program.constants, arrays=broken, n_grad_ops=program.n_grad_ops,
                  loss=program.loss, outputs=program.outputs, prefix_sums=program.prefix_sums)
    assert not prefixes_hold(bad)
    assert not prefixes_hold(as_objects(bad))


@pytest.mark.parametrize('sizes', [[4, 3, 2], [5, 1], [6, 4, 4, 3]])
def test_vectorize_from_arrays_equals_vectorize_from_objects(sizes):
    """The pass reads arrays whether the program came with them or as Op objects."""
    build = mlp_builder(sizes)
    inputs = [Value(0.0) for _ in range(sizes[0] + sizes[-1])]
    n = sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))
    params = [Value(random.Random(i).uniform(-1, 1)) for i in range(n)]
    loss, logits = build(inputs, params)
    program = trace_graph(loss, inputs, params, logits)[0]
    a, b = vectorize(program), vectorize(as_objects(program))
    assert str(a) == str(b)
    assert a.slot_map == b.slot_map and a.param_order == b.param_order
    assert any(type(op).__name__ == 'MatVec' for op in a.ops)


@pytest.mark.parametrize('seed', range(6))
def test_the_pass_carries_needs_grad_over(seed):
    """The lifted program's flags, carried over from the traced one, are
    what needs_grad computes from its ops."""
    graphs = [random_graph(seed, 2000)]
    sizes = [[4, 3, 2], [5, 4, 4, 3]][seed % 2]
    build = mlp_builder(sizes)
    inputs = [Value(0.0) for _ in range(sizes[0] + sizes[-1])]
    params = [Value(0.1 * i) for i in range(sum((a + 1) * b for a, b in zip(sizes, sizes[1:])))]
    loss, logits = build(inputs, params)
    graphs.append((loss, inputs, params, logits))
    for graph in graphs:
        for input_grads in (False, True):
            lifted = vectorize(trace_graph(*graph, input_grads=input_grads)[0])
            assert 'vectorize' in lifted.passes
            carried = needs_grad(lifted)
            lifted.known_needs_grad = None
            assert carried == needs_grad(lifted)


@pytest.mark.parametrize('sizes', [[4, 3, 2], [6, 4, 4, 3]])
def test_outs_and_lifted_ops_are_read_without_building_the_scalar_ops(sizes):
    """``outs_of`` and ``lifted_of`` answer from the arrays and the lifted
    ops (codegen asks them of million-op programs) what ``ops`` would."""
    build = mlp_builder(sizes)
    inputs = [Value(0.0) for _ in range(sizes[0] + sizes[-1])]
    n = sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))
    params = [Value(random.Random(i).uniform(-1, 1)) for i in range(n)]
    loss, logits = build(inputs, params)
    program = vectorize(trace_graph(loss, inputs, params, logits)[0])
    assert program.arrays is not None and program.lifted and program._ops is None
    kinds = {type(op) for _, op in program.lifted}
    with_out = [i for i in range(program.n_ops) if i not in {j for j, op in program.lifted if not hasattr(op, 'out')}]
    outs, lifted = program.outs_of(with_out), {kind: program.lifted_of(kind) for kind in kinds}
    assert program._ops is None
    ops = program.ops
    assert outs == [ops[i].out for i in with_out]
    assert lifted == {kind: [op for op in ops if type(op) is kind] for kind in kinds}


def test_reads_array_is_reads():
    """The MatVec's and the MatMat's reads as numpy arrays (what the liveness
    walk marks) are their reads, in order, duplicates and all."""
    from compiler.ir import MatMat, MatVec
    uses = [MatVec(y0=100 + 10 * t, rows=3, cols=4, wt0=20, x0=50 + 4 * t, heads=heads, bwd_rows=[2, 1, 0],
                   grad_x=True) for t, heads in enumerate([None, [7, 8, 9], []])]
    for op in [*uses, MatMat(tuple(uses))]:
        got = op.reads_array()
        assert got.dtype == np.int64 and got.tolist() == list(op.reads)
    # read_slots: any lifted op's reads, through its own array where it has one
    from compiler.ir import Sum, read_slots
    for op in [*uses, MatMat(tuple(uses)), Sum(60, [3, 9, 3])]:
        got = read_slots(op)
        assert got.dtype == np.int64 and got.tolist() == list(op.reads)


def test_live_marks_a_matmats_reads():
    """features() and inputs_used() through a MatMat: what its uses read."""
    from compiler.ir import MatMat, MatVec, _mark_reads
    uses = (MatVec(y0=30, rows=2, cols=3, wt0=10, x0=0, heads=[40], bwd_rows=[1, 0], grad_x=True),
            MatVec(y0=32, rows=2, cols=3, wt0=10, x0=3, heads=None, bwd_rows=[1, 0], grad_x=True))
    marks = bytearray(50)
    _mark_reads(marks, MatMat(uses))
    assert [i for i, m in enumerate(marks) if m] == list(range(0, 6)) + list(range(10, 16)) + [40]
    marks = bytearray(50)
    _mark_reads(marks, uses[0])
    assert [i for i, m in enumerate(marks) if m] == list(range(0, 3)) + list(range(10, 16)) + [40]


@pytest.mark.parametrize('order', [(0, 1, 2, 3), (1, 0, 3, 2), (2, 3, 0, 1), ()])
def test_all_slots_are_each_ops_slots_one_after_the_other(order):
    ops = [ir.Sum(9, [3, 4, 3]), ir.MatVec(y0=20, rows=2, cols=3, wt0=10, x0=16, heads=[5, 6], bwd_rows=[1, 0],
                                          grad_x=True),
           ir.Sum(30, [20, 21]), ir.MatVec(y0=40, rows=1, cols=2, wt0=31, x0=33, heads=None, bwd_rows=[0],
                                          grad_x=False)]
    ops = [ops[i] for i in order]
    reads, counts = ir.all_slots(ops)
    assert reads.dtype == np.int64 and reads.tolist() == [s for op in ops for s in ir.read_slots(op).tolist()]
    assert counts.tolist() == [len(ir.read_slots(op)) for op in ops]
    writes, counts = ir.all_slots(iter(ops), 'writes')
    assert writes.tolist() == [s for op in ops for s in op.writes] and counts.tolist() == [len(op.writes) for op in ops]
