"""The tracer's C walk (compiler/templates/walk.c, compiler/walk.py) against
its Python twin (``trace._Walk``): the same arrays, numbers, labels and
slots on random graphs, and the same error wherever either refuses a graph."""
import random
import sys

import numpy as np
import pytest

import compiler
import micrograd
from compiler import walk
from compiler.ir import OP_CODES, POW
from compiler.trace import _ARITY, trace_graph
from micrograd import Value
from micrograd.engine import Constant
from tests.graphs import every_op_graph, nodes_of
from tests.test_ir_arrays import random_graph


@pytest.fixture(scope='module')
def walker():
    module = walk.native_walker()
    assert module is not None, f"the C walk did not build here: {walk.problem()}"
    return module


def outcome(graph, native, constants=(), want_slots=True):
    """What ``trace_graph`` makes of ``graph`` with one walk: its results as
    plain data, or the error it raised (type and message)."""
    loss, inputs, params, outputs = graph
    try:
        program, slots, undeclared = trace_graph(loss, inputs, params, outputs, constants,
                                                 want_slots=want_slots, native=native)
    except Exception as e:
        return type(e), str(e)
    arrays = program.arrays
    roots = [*(loss if isinstance(loss, list) else [loss]), *outputs]
    users = {id(v) for v in micrograd.topological_order(roots)}      # a sequence's sums are trace's own
    return dict(code=arrays.code.tolist(), out=arrays.out.tolist(), a=arrays.a.tolist(), b=arrays.b.tolist(),
                k=[(i, v.hex()) for i, v in sorted(arrays.k.items())], code_dtype=str(arrays.code.dtype),
                constants=[(s, v.hex()) for s, v in program.constants.items()], n_slots=program.n_slots,
                n_grad_ops=program.n_grad_ops, loss=program.loss, outputs=program.outputs,
                prefix_sums=program.prefix_sums, labels=sorted(program.labels.items()),
                graph_hash=program.graph_hash, undeclared=[id(v) for v in undeclared],
                slots=None if slots is None else [(id(v) if id(v) in users else 'new', s) for v, s in slots.items()])


def same_either_way(graph, constants=()):
    c, python = outcome(graph, True, constants), outcome(graph, False, constants)
    assert c == python
    return python


def raw_walk(walker, graph):
    """The C walk's own answer (None: it left the graph to the Python walk)."""
    loss, inputs, params, outputs = graph
    return walker.walk(Value, Constant, list(inputs) + list(params), loss, list(outputs), OP_CODES, _ARITY,
                       POW, [loss], False)


def shared_graph(seed, n_ops=2000):
    """A random graph with shared subgraphs, constants the ops wrap, constant
    leaves of the user's, labels, dead ops and outputs outside the loss's cone."""
    rng = random.Random(seed)
    loss, inputs, params, outputs = random_graph(seed, n_ops)
    mine = [Value(rng.uniform(-1, 1), label=f'c{i}') for i in range(3)]
    shared = (loss * mine[0] + mine[1]).tanh()
    loss = shared * shared + micrograd.max(shared, mine[2]) - 2.5
    for v in rng.sample(nodes_of((loss, inputs, params, outputs)), 40):
        v.label = rng.choice(['', 'h', 'layer 1', 'é', 0, None, 'x' * 100])
    extra = (outputs[0] + 1.0).exp()        # only an output needs it
    return loss, inputs, params, [*outputs, extra, shared]


@pytest.mark.parametrize('seed', range(10))
def test_random_graphs_give_the_python_walks_program(walker, seed):
    graph = shared_graph(seed)
    assert raw_walk(walker, graph) is not None           # the C walk read it itself
    result = same_either_way(graph)
    assert result['constants'] and result['labels'] and result['k']


def test_a_graph_whose_table_of_numbers_is_a_large_allocation(walker):
    # 100,000 Values: the table outgrows 2 MB, which walk.c allocates apart (on huge pages)
    rng = random.Random(5)
    xs, ws = [Value(rng.uniform(-1, 1)) for _ in range(50)], [Value(rng.uniform(-1, 1)) for _ in range(50)]
    pool = [xs[0]]
    for i in range(50_000):
        pool.append(rng.choice(ws) * pool[-1] + rng.choice(pool[-50:]) if i % 7 else pool[-1].tanh() - xs[i % 50])
    graph = (pool[-1], xs, ws, [pool[len(pool) // 2]])
    assert raw_walk(walker, graph) is not None
    assert len(same_either_way(graph)['code']) == 100_000



def test_the_op_arrays_come_as_bytearrays_of_their_exact_size(walker):
    """code, a and b are handed over in the bytearrays the walk filled (no
    copy; numpy reads them in place, writable), sized to the ops walked."""
    graph = shared_graph(3)
    code, a, b = raw_walk(walker, graph)[:3]
    n = len(same_either_way(graph)['code'])
    assert [type(x) for x in (code, a, b)] == [bytearray] * 3
    assert (len(code), len(a), len(b)) == (n, 8 * n, 8 * n)
    assert np.frombuffer(a, dtype=np.int64).flags.writeable

def test_a_chain_deeper_than_the_recursion_limit(walker):
    x, w = Value(0.5), Value(0.25)
    v = x
    for i in range(3 * sys.getrecursionlimit()):
        v = (v * w).tanh() if i % 2 else v + 1.0
    graph = (v, [x], [w], [])
    assert raw_walk(walker, graph) is not None
    assert same_either_way(graph)['n_grad_ops'] == 3 * sys.getrecursionlimit() * 3 // 2


def test_a_sequence_of_losses(walker):
    xs, w = [Value(float(i)) for i in range(6)], Value(0.5)
    h = Value(0.0)
    losses = []
    for x in xs:
        h = (h * w + x).tanh()
        losses.append((h - 1.0) ** 2)
    result = same_either_way((losses, xs, [w], []))
    assert len(result['prefix_sums']) == 6


def test_declared_constants_and_shared_leaves(walker):
    graph = every_op_graph()
    loss, inputs, params, outputs = graph
    c = Value(3.0)
    graph = (loss * c + c, inputs, params, outputs)
    assert same_either_way(graph, constants=[c])['undeclared'] == []
    assert same_either_way(graph)['undeclared'] == [id(c)]


def test_the_default_walks_large_graphs_in_c(monkeypatch, walker):
    calls = []

    class Spy:
        def walk(self, *args):
            calls.append(len(args))
            return walker.walk(*args)

        def __getattr__(self, name):                  # leaves_ok and the analyses' loops
            return getattr(walker, name)
    monkeypatch.setattr(walk, 'native_walker', lambda: Spy())
    monkeypatch.setattr(walk, 'loaded_walker', lambda: None)     # a process that has not loaded it yet
    graph = shared_graph(1, n_ops=300)
    small = outcome(graph, None)
    assert calls == []
    monkeypatch.setattr(walk, 'NATIVE_MIN_OPS', 50)
    assert outcome(graph, None) == small
    assert calls == [10]
    monkeypatch.setenv('MICROGRAD_NATIVE_WALK', '0')
    assert outcome(graph, None) == small and outcome(graph, True) == small
    assert calls == [10]


def test_once_the_c_walk_is_loaded_it_walks_small_graphs_too(monkeypatch, walker):
    """With the C walk loaded in this process, the default walks a small
    graph in C at once (no Python walk of its first Values, no build, and
    ``on_large`` is not told): the same program."""
    calls, loops = [], set()

    class Spy:
        def walk(self, *args):
            calls.append(len(args))
            return walker.walk(*args)

        def __getattr__(self, name):       # the analyses' loops: in C too
            loops.add(name)
            return getattr(walker, name)
    assert walk.loaded_walker() is walker
    graph = shared_graph(2, n_ops=300)
    small = outcome(graph, False)
    monkeypatch.setattr(walk, 'native_walker', lambda: pytest.fail('nothing is built or loaded'))
    monkeypatch.setattr(walk, 'loaded_walker', lambda: Spy())
    assert outcome(graph, None) == small
    assert calls == [10]
    assert 'hex_repr' in loops      # graph_hash's text, as for a large graph
    told = []
    trace_graph(*graph, on_large=lambda: told.append(1))
    assert calls == [10, 10] and told == []


def fresh():
    x, w = Value(0.0), Value(2.0)
    y = x * w
    return x, w, y, y.relu()


class LooksLikeAValue:
    _prev, _op, data, _data, label = (), '', 1.0, 1.0, ''


class MyValue(Value):
    __slots__ = ()


def malformed():
    """(name, graph) of graphs a walk must refuse, or read another way than
    the C walk's happy path."""
    cases = []
    x, w, y, z = fresh()
    y._prev = (x, 3.0)
    cases.append(('a number operand', (z, [x], [w], [])))
    x, w, y, z = fresh()
    y._prev = (x, [w])
    cases.append(('an unhashable operand', (z, [x], [w], [])))
    x, w, y, z = fresh()
    y._prev = [x, w]
    cases.append(('a list of operands', (z, [x], [w], [])))
    x, w, y, z = fresh()
    y._prev = (z, w)
    cases.append(('a cycle', (z, [x], [w], [])))
    x, w, y, z = fresh()
    y._prev = (x, LooksLikeAValue())
    cases.append(('a look-alike', (z, [x], [w], [])))
    x, w, y, z = fresh()
    y._op = 'relu '
    cases.append(('an unknown op', (z, [x], [w], [])))
    x, w, y, z = fresh()
    y._op = 'relu'
    cases.append(('a wrong arity', (z, [x], [w], [])))
    x, w, y, z = fresh()
    c = Value(1.0)
    c._op = '+'
    cases.append(('a leaf with an op', (z * c, [x], [w], [])))
    x, w, y, z = fresh()
    c = Value(1.0)
    loss = z * c
    c._data = 3                                 # an int: read as a float by the Python walk
    cases.append(('int data', (loss, [x], [w], [])))
    x, w, y, z = fresh()
    c = Value(1.0)
    loss = z * c
    c._data = 'x'
    cases.append(('str data', (loss, [x], [w], [])))
    x, w, y, z = fresh()
    p = z ** 2
    p._arg = 3                                  # an int exponent: read by both
    cases.append(('an int exponent', (p, [x], [w], [])))
    x, w, y, z = fresh()
    p = z ** 2
    p._arg = '2'
    cases.append(('a str exponent', (p, [x], [w], [])))
    x, w, y, z = fresh()
    m = MyValue(2.0)
    cases.append(('a subclass of Value', (z * m, [x], [w], [])))
    x, w, y, z = fresh()
    cases.append(('an input listed twice', (z, [x, x], [w], [])))
    x, w, y, z = fresh()
    cases.append(('an input among the params', (z, [x], [w, x], [])))
    x, w, y, z = fresh()
    cases.append(('a computed input', (z, [y], [w], [])))
    x, w, y, z = fresh()
    del y._prev
    cases.append(('no operands at all', (z, [x], [w], [])))
    return cases


@pytest.mark.parametrize('case', range(len(malformed())))
def test_malformed_graphs_give_the_python_walks_error(walker, case):
    name, graph = malformed()[case]
    c, python = outcome(graph, True), outcome(graph, False)
    assert c == python, name
    if name not in ('int data', 'an int exponent', 'a computed input'):
        assert raw_walk(walker, graph) is None, name        # left to the Python walk


@pytest.mark.parametrize('case', range(len(malformed())))
def test_malformed_graphs_give_the_python_walks_error_with_many_leaves(monkeypatch, walker, case):
    monkeypatch.setattr(walk, 'NATIVE_MIN_LEAVES', 1)        # leaves checked in C too
    name, graph = malformed()[case]
    loss, inputs, params, outputs = graph
    c = outcome(graph, True)
    assert c == outcome(graph, False), name
    if name in ('an input listed twice', 'an input among the params', 'a computed input'):
        assert not walker.leaves_ok(Value, Constant, list(inputs) + list(params)), name
        assert isinstance(c, tuple) and c[0] is compiler.TraceError, name
    else:
        assert walker.leaves_ok(Value, Constant, list(inputs) + list(params)), name


def test_leaves_ok_refuses_what_check_leaves_refuses(walker):
    x, w = Value(0.0), Value(1.0)
    assert walker.leaves_ok(Value, Constant, [x, w])
    assert not walker.leaves_ok(Value, Constant, [x, w, x])
    assert not walker.leaves_ok(Value, Constant, [x, 1.0])
    assert not walker.leaves_ok(Value, Constant, [x, x + w])
    w._data = 1
    assert not walker.leaves_ok(Value, Constant, [x, w])


def sequence_program(seed, positions=6):
    """A traced sequence: each position's loss reads a random mix of that
    position's inputs and a state carried from the position before."""
    rng = random.Random(seed)
    xs = [Value(rng.uniform(-1, 1)) for _ in range(positions)]
    ws = [Value(rng.uniform(-1, 1)) for _ in range(3)]
    h, losses = Value(0.0), []
    for x in xs:
        pool = [h, x, *ws]
        for _ in range(rng.randint(2, 12)):
            a, b = rng.choice(pool), rng.choice(pool)
            pool.append(rng.choice([a + b, a * b, (a - b).tanh(), a.relu() + b]))
        h = pool[-1]
        losses.append(h * h)
    program, _, _ = trace_graph(losses, xs, ws, native=False)
    return program


def both_loops(monkeypatch, walker, analysis, program):
    """``analysis(program)`` with its loops in C, then in Python."""
    monkeypatch.setattr(walk, 'NATIVE_MIN_OPS', 0)
    in_c = analysis(program)
    monkeypatch.setenv('MICROGRAD_NATIVE_WALK', '0')
    in_python = analysis(program)
    monkeypatch.undo()
    return in_c, in_python


def rewired_program(seed):
    """``sequence_program(seed)``, for odd seeds with a few operands read from
    other earlier slots: some positions then stop holding."""
    rng = random.Random(seed)
    program = sequence_program(seed)
    arrays = program.arrays
    for _ in range(seed % 2 * rng.randint(1, 3)):
        i = rng.randrange(len(arrays.out))
        arrays.a[i] = rng.randrange(int(arrays.out[i]))
    return program


@pytest.mark.parametrize('seed', range(40))
def test_the_passes_loops_in_c_give_the_python_loops_answers(monkeypatch, walker, seed):
    from compiler.ir import features, inputs_used, needs_grad, prefixes_hold
    program = rewired_program(seed)
    in_c, in_python = both_loops(monkeypatch, walker, prefixes_hold, program)
    assert in_c == in_python
    assert in_c or seed % 2
    program.input_grads = bool(seed % 3)
    in_c, in_python = both_loops(monkeypatch, walker, needs_grad, program)
    assert in_c == in_python and any(in_c[program.n_leaves:])
    program.outputs = tuple(random.Random(seed).sample(range(program.n_leaves, program.n_slots), 2))
    for analysis in (inputs_used, features):
        in_c, in_python = both_loops(monkeypatch, walker, analysis, program)
        assert in_c == in_python


def test_the_passes_loops_in_c_answer_both_ways_and_refuse_stray_slots(walker):
    from compiler.ir import prefix_cuts
    held, reach = set(), set()
    for seed in range(40):
        program = rewired_program(seed)
        arrays, cuts = program.arrays, np.array(prefix_cuts(program), dtype=np.int64)
        held.add(walker.cones_hold(bytearray(program.n_slots), arrays.out, arrays.a, arrays.either(), cuts))
        live = bytearray(program.n_slots)
        live[int(arrays.out[len(arrays.out) // 2])] = 1         # what an op halfway reads: some inputs only
        walker.mark_operands(live, arrays.out, arrays.a, arrays.either(), 0, len(arrays.out))
        reach.add(sum(live[:program.n_inputs]) / program.n_inputs)
    assert held == {True, False}
    assert len(reach) > 2       # some inputs, not always the same share
    out, a = np.array([3, 4], dtype=np.int64), np.array([0, 9], dtype=np.int64)
    with pytest.raises(ValueError, match='out of range'):
        walker.mark_readers(bytearray(5), out, a, a, 0, 2)
    with pytest.raises(ValueError, match='out of range'):
        walker.mark_readers(bytearray(10), out, a, a, 0, 3)
    with pytest.raises(ValueError, match='out of range'):
        walker.cones_hold(bytearray(5), out, a, a, np.array([1], dtype=np.int64))
    with pytest.raises(ValueError, match='one length'):
        walker.mark_readers(bytearray(10), out, a[:1], a, 0, 1)
    with pytest.raises(BufferError):
        walker.mark_readers(b'\0' * 10, out, a, a, 0, 2)      # flags must be writable


@pytest.mark.parametrize('seed', range(20))
def test_reads_out_of_order_in_c_gives_the_python_pairs(monkeypatch, walker, seed):
    from compiler.ir import reads_out_of_order
    rng = np.random.default_rng(seed)
    n_ops, n_slots = int(rng.integers(1, 400)), int(rng.integers(1, 60))
    a = rng.integers(0, n_slots, n_ops)
    b = np.where(rng.random(n_ops) < 0.3, -1, rng.integers(0, n_slots, n_ops))
    b = np.where(rng.random(n_ops) < 0.1, a, b)                 # x * x: one op reads a slot twice
    pos = np.arange(n_ops) if seed % 4 == 0 else rng.permutation(n_ops)
    if seed % 4 == 1:                                           # a few ops moved, the rest in order
        pos = np.arange(n_ops)
        moved = rng.choice(n_ops, size=min(3, n_ops), replace=False)
        pos[moved] = rng.permutation(pos[moved])
    matters = rng.random(n_slots) < 0.7

    def pairs():
        return np.stack(reads_out_of_order(a, b, pos, matters)).tolist()
    in_c, in_python = both_loops(monkeypatch, walker, lambda _: pairs(), None)
    assert in_c == in_python
    # what the pairs mean, from scratch: consecutive readers of a slot that matters, swapped
    expected = []
    for s in range(n_slots):
        readers = [i for i in range(n_ops) for x in (a[i], b[i]) if x == s] if matters[s] else []
        expected += [(s, r, t) for r, t in zip(readers, readers[1:]) if pos[t] < pos[r]]
    assert [tuple(p) for p in np.array(in_c).T.tolist()] == expected
    if seed % 4 == 0:
        assert not expected               # nothing moved
    elif seed % 4 >= 2 and n_ops > 50:
        assert expected                   # shuffled


def test_reads_out_of_order_refuses_stray_slots(walker):
    a, pos = np.array([0, 9], dtype=np.int64), np.array([1, 0], dtype=np.int64)
    with pytest.raises(ValueError, match='out of range'):
        walker.reads_out_of_order(np.ones(5, dtype=np.uint8), a, a, pos)
    with pytest.raises(ValueError, match='one length'):
        walker.reads_out_of_order(np.ones(10, dtype=np.uint8), a[:1], a, pos)
    assert walker.reads_out_of_order(np.ones(10, dtype=np.uint8), a, a, pos) == []
    assert walker.reads_out_of_order(np.ones(10, dtype=np.uint8), a[::-1].copy(), a, pos) == [(0, 0, 1), (9, 0, 1)]
    assert walker.reads_out_of_order(np.array([0] * 9 + [1], dtype=np.uint8), a[::-1].copy(), a, pos) == [(9, 0, 1)]
    both = np.array([0, 0], dtype=np.int64)
    assert walker.reads_out_of_order(np.ones(1, dtype=np.uint8), both, both, pos) == [(0, 0, 1)]


@pytest.mark.parametrize('seed', range(8))
def test_the_loop_scan_in_c_finds_the_python_scans_stretches(monkeypatch, walker, seed):
    from compiler.loops import _Units, _find_loops, fuse_dots
    from compiler.vectorize import vectorize
    from tests.test_loops import ELEMENTWISE, _graph
    rng = random.Random(seed)
    T, C, H = rng.choice([(3, 4, 1), (4, 8, 2), (6, 8, 4)])
    programs = [fuse_dots(vectorize(compiler.trace(*_graph(T, C, H, rng.sample(ELEMENTWISE, 4), seed)))),
                rewired_program(seed)]
    for program in programs:
        in_c, in_python = both_loops(monkeypatch, walker, lambda p: _find_loops(_Units(p)), program)
        assert in_c == in_python
    assert in_c == [] or seed % 2       # (the random program: no stretch, or one by chance)
    assert both_loops(monkeypatch, walker, lambda p: _find_loops(_Units(p)), programs[0])[0]


def test_loop_periods_refuses_arrays_of_other_lengths(walker):
    n = 5
    sig, hashed = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.uint64)
    best, best_p = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    with pytest.raises(ValueError, match='n \\+ 1'):
        walker.loop_periods(sig, hashed, np.zeros(n, dtype=np.int64), best, best_p, 1, 3)
    walker.loop_periods(sig, hashed, np.full(n + 1, n, dtype=np.int64), best, best_p, 1, 3)
    assert best.tolist() == [5, 4, 3, 0, 0] and best_p.tolist() == [1, 1, 1, 0, 0]


@pytest.mark.parametrize('seed', range(20))
def test_the_period_scan_in_c_gives_the_python_scans_stretches(monkeypatch, walker, seed):
    # periodic signatures and steps, each broken here and there on its own
    from compiler.loops import _periods
    rng = np.random.default_rng(seed)
    n, period = int(rng.integers(10, 400)), int(rng.integers(1, 6))
    j = np.arange(n)
    sig = np.where(rng.random(n) < 0.03, rng.integers(-1, 3, n), j % period)
    sig[n // 2:n // 2 + 4 * period] = -1        # ops never in a loop, however regular
    hashed = (j // period * 1000 + j % period).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    broken = rng.random(n) < 0.03
    hashed[broken] += rng.integers(1, 1 << 62, int(broken.sum()), dtype=np.uint64)
    in_c, in_python = both_loops(monkeypatch, walker, lambda _: [x.tolist() for x in _periods(sig, hashed, 8)],
                                 None)
    assert in_c == in_python
    assert max(in_c[0]) >= 3 * period


def lowest_ready_first(n, deps_of):
    """The order from scratch: repeatedly the lowest node whose dependencies have all run."""
    order, ran = [], set()
    while len(order) < n:
        ready = [u for u in range(n) if u not in ran and all(d in ran for d in deps_of[u])]
        if not ready:
            return None
        order.append(ready[0])
        ran.add(ready[0])
    return order


@pytest.mark.parametrize('seed', range(20))
def test_min_index_order_in_c_gives_the_python_order(monkeypatch, walker, seed):
    from compiler.ir import min_index_order
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    # a DAG over a shuffled numbering (so that nodes wait for later ones),
    # some dependencies listed twice; odd seeds: a cycle in some
    rank = rng.permutation(n)
    deps_of = []
    for u in range(n):
        earlier = [v for v in range(n) if rank[v] < rank[u]]
        k = min(len(earlier), int(rng.integers(0, 4)))
        d = list(rng.choice(earlier, size=k, replace=False)) if k else []
        deps_of.append([int(v) for v in d] + ([int(d[0])] if d and rng.random() < 0.2 else []))
    if seed % 2 and n > 2:
        u, v = (int(x) for x in rng.choice(n, size=2, replace=False))
        deps_of[u].append(v)
        deps_of[v].append(u)
    ptr = np.r_[0, np.cumsum([len(d) for d in deps_of])].astype(np.int64)
    deps = np.array([v for d in deps_of for v in d], dtype=np.int64)

    def order(_):
        try:
            return min_index_order(ptr, deps).tolist()
        except ValueError as e:
            return str(e)
    in_c, in_python = both_loops(monkeypatch, walker, order, None)
    assert in_c == in_python
    expected = lowest_ready_first(n, deps_of)
    if expected is None:
        assert 'a cycle' in in_c
    else:
        assert in_c == expected
    if seed % 2 == 0 and n > 20:
        assert expected != sorted(expected)         # some nodes waited


def test_min_index_order_refuses_bad_arrays(walker):
    order = np.empty(2, dtype=np.int64)
    with pytest.raises(ValueError, match='out of range'):
        walker.min_index_order(order, np.array([0, 1, 1], dtype=np.int64), np.array([2], dtype=np.int64))
    with pytest.raises(ValueError, match='from 0 to len'):
        walker.min_index_order(order, np.array([0, 1, 1], dtype=np.int64), np.array([1, 0], dtype=np.int64))
    with pytest.raises(ValueError, match='one int64 per node'):
        walker.min_index_order(order[:1], np.array([0, 1, 1], dtype=np.int64), np.array([1], dtype=np.int64))
    assert walker.min_index_order(order, np.array([0, 1, 1], dtype=np.int64), np.array([1], dtype=np.int64)) == 2
    assert order.tolist() == [1, 0]


def with_lifted(program, seed):
    """``program`` (scalar) with some of its ops lifted, as a pass leaves a
    program: arrays of the other scalar ops, and the lifted ones between
    them (each '+' a ``Sum``, other ops one-iteration ``Loop``s); and the
    same program as a list of ops (what the analyses read op by op)."""
    from compiler.ir import Loop, Program, ScalarArrays, Sum, loop_slots
    rng = random.Random(seed)
    ops = program.ops
    lifted, scalar = [], []
    for i, op in enumerate(ops):
        if rng.random() < 0.3 and i < len(ops) - 1:      # (the last op writes the loss: an Op)
            lifted.append((i, Sum(op.out, list(op.args)) if op.name == '+' else
                           Loop(1, (op,), ((0,) * len(loop_slots(op)),))))
        else:
            scalar.append(op)

    def make(**how):
        return Program(n_slots=program.n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                       constants=program.constants, n_grad_ops=program.n_grad_ops, loss=program.loss,
                       outputs=program.outputs, prefix_sums=program.prefix_sums, **how)
    return (make(arrays=ScalarArrays.from_ops(scalar), lifted=tuple(lifted)),
            make(ops=[op for _, op in sorted(lifted + [(i, op) for i, op in enumerate(ops)
                                                       if i not in dict(lifted)])]))


@pytest.mark.parametrize('seed', range(40))
def test_prefixes_hold_on_lifted_arrays_gives_the_op_by_op_answer(monkeypatch, walker, seed):
    from compiler.ir import prefixes_hold
    program = rewired_program(seed)
    arrays_form, ops_form = with_lifted(program, seed)
    assert arrays_form.lifted and arrays_form._ops is None
    expected = prefixes_hold(ops_form)
    in_c, in_python = both_loops(monkeypatch, walker, prefixes_hold, arrays_form)
    assert in_c == in_python == expected == prefixes_hold(program)
    assert expected or seed % 2


def sums_graph(seed, n_ops=400):
    """A random graph of '+' chains: products and sums over recent values,
    a chain sometimes the second operand, some values read twice (a chain
    ends there) and some read from outside (an output)."""
    rng = random.Random(seed)
    inputs = [Value(rng.uniform(-1, 1)) for _ in range(4)]
    params = [Value(rng.uniform(-1, 1)) for _ in range(6)]
    pool = inputs + params
    for _ in range(n_ops):
        a, b = pool[-1 - min(len(pool) - 1, int(rng.expovariate(1 / 3)))], rng.choice(pool)
        r = rng.random()
        pool.append(a * b if r < 0.3 else (a + b if r < 0.75 else b + a) if r < 0.95 else a.tanh())
    outputs = rng.sample(pool[10:], 4)
    return pool[-1] + pool[-7], inputs, params, outputs


def chains_from_scratch(g, plus):
    """_fold_chains's answer by its definition: each root expanded recursively."""
    def fold(s):
        j = int(g.producer[s])
        return j if j >= 0 and plus[j] and g.uses[s] == 1 else -1

    def child(i):               # the '+' that i extends, and the term i adds
        a, b = int(g.a[i]), int(g.b[i])
        return (fold(a), b) if fold(a) >= 0 else (fold(b), a) if fold(b) >= 0 else (-1, None)

    def expand(i):
        j, term = child(i)
        if j < 0:
            return [i], [int(g.a[i]), int(g.b[i])]
        members, terms = expand(j)
        return members + [i], terms + [term]
    folded = {child(i)[0] for i in np.flatnonzero(plus[:g.n]).tolist()}
    members, terms, starts = [], [], []
    for i in np.flatnonzero(plus[:g.n]).tolist():
        if i not in folded:
            m, t = expand(i)
            starts.append(len(members))
            members += m
            terms += t
    return members, terms, starts


@pytest.mark.parametrize('seed', range(12))
def test_the_chains_of_sums_in_c_give_the_numpy_chains(monkeypatch, walker, seed):
    from compiler.vectorize import _PLUS, _fold_chains, _Graph
    program, _, _ = trace_graph(*sums_graph(seed))
    g = _Graph(program, program.scalar_arrays)
    plus = np.zeros(g.n + 1, dtype=bool)
    plus[:g.cone] = g.code[:g.cone] == _PLUS
    in_c, in_python = both_loops(monkeypatch, walker, lambda _: [x.tolist() for x in _fold_chains(g, plus)], None)
    assert in_c == in_python == list(chains_from_scratch(g, plus))
    lengths = np.diff(in_c[2] + [len(in_c[0])])
    assert max(lengths) >= 4 and min(lengths) == 1        # long chains and single '+'s


def test_fold_chains_refuses_arrays_that_are_no_program(walker):
    # ops: 0: %2 = %0 + %1;  1: %3 = %2 + %0
    plus = np.ones(2, dtype=bool)
    a, b = np.array([0, 2], dtype=np.int64), np.array([1, 0], dtype=np.int64)
    producer, uses = np.array([-1, -1, 0, 1, -1], dtype=np.int64), np.array([2, 1, 1, 1], dtype=np.int64)

    def run(plus=plus, a=a, b=b, producer=producer, uses=uses, room=2):
        out = [np.zeros(room, dtype=np.int64), np.zeros(2 * room, dtype=np.int64), np.zeros(room, dtype=np.int64)]
        chains = walker.fold_chains(plus, a, b, producer, uses, *out)
        return chains, [x.tolist() for x in out]
    assert run() == (1, [[0, 1], [0, 1, 0, 0], [0, 0]])
    with pytest.raises(ValueError, match='out of range'):
        run(a=np.array([0, 7], dtype=np.int64))
    with pytest.raises(ValueError, match='at or after'):
        run(producer=np.array([-1, -1, 1, 1, -1], dtype=np.int64))
    with pytest.raises(ValueError, match='folded twice'):   # + 2: %4 = %2 + %1, and uses says %2 is read once
        run(plus=np.ones(3, dtype=bool), a=np.array([0, 2, 2], dtype=np.int64), b=np.array([1, 0, 1], dtype=np.int64),
            producer=np.array([-1, -1, 0, 1, 2, -1], dtype=np.int64), uses=np.array([2, 2, 1, 0, 0], dtype=np.int64),
            room=3)
    with pytest.raises(ValueError, match='one slot per op'):
        run(b=b[:1])
    with pytest.raises(ValueError, match='two'):
        run(room=1)


@pytest.mark.parametrize('seed', range(5))
def test_count_reads_in_c_gives_numpys_counts(monkeypatch, walker, seed):
    from compiler.vectorize import _count_reads
    rng = np.random.default_rng(seed)
    n_slots, n = int(rng.integers(1, 50)), int(rng.integers(0, 200))
    a = rng.integers(0, n_slots, n)
    b = np.where(rng.random(n) < 0.3, -1, rng.integers(0, n_slots, n))     # unary ops read a only
    in_c, in_python = both_loops(monkeypatch, walker, lambda _: _count_reads(n_slots, a, b).tolist(), None)
    assert in_c == in_python
    assert sum(in_c) == n + int((b >= 0).sum())


def test_count_reads_refuses_slots_outside_uses(walker):
    uses = np.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match='inside it'):
        walker.count_reads(uses, np.array([0, 3], dtype=np.int64), np.array([-1, 1], dtype=np.int64))
    with pytest.raises(ValueError, match='inside it'):
        walker.count_reads(uses, np.array([0, 1], dtype=np.int64), np.array([-1, 3], dtype=np.int64))
    walker.count_reads(uses, np.array([0, 2], dtype=np.int64), np.array([-1, 2], dtype=np.int64))
    assert uses.tolist() == [1, 0, 2]


def hex_cases(seed):
    """Doubles from random bit patterns (every exponent: subnormals, inf and
    NaN payloads among them) and the edges by name."""
    rng = np.random.default_rng(seed)
    signs = rng.integers(0, 2, 300).astype(np.uint64) << 63
    bits = rng.integers(0, 2 ** 63, 300, dtype=np.int64).view(np.uint64) | signs
    bits[:40] &= ~np.uint64(0x7ff << 52)                          # subnormals and zeros
    bits[40:60] |= np.uint64(0x7ff << 52)                         # NaNs of both signs and payloads
    edges = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0 ** -1022, 5e-324, -5e-324, sys.float_info.max, -sys.float_info.max,
             float('inf'), float('-inf'), float('nan'), -float('nan'), 1e300, 0.1, 2.0 ** 1023, 3.0]
    return edges + bits.view(np.float64).tolist()


@pytest.mark.parametrize('seed', range(3))
def test_hex_repr_writes_pythons_repr_of_float_hex(walker, seed):
    values = hex_cases(seed)
    packed = np.array(values, dtype=np.float64).tobytes()
    assert walker.hex_repr(packed, None) == repr([v.hex() for v in values]).encode()
    for first in (0, 7, 10 ** 12, -3):
        assert walker.hex_repr(packed, first) == repr([(first + i, v.hex()) for i, v in enumerate(values)]).encode()
    assert walker.hex_repr(b'', None) == b'[]' == walker.hex_repr(b'', 5)


def test_hex_repr_refuses_what_is_not_doubles(walker):
    with pytest.raises(ValueError, match='doubles'):
        walker.hex_repr(b'1234567', None)
    with pytest.raises(TypeError, match='first'):
        walker.hex_repr(b'')
    with pytest.raises(TypeError):
        walker.hex_repr(b'', 'one')


def test_graph_hash_is_the_same_with_its_text_written_in_c(monkeypatch, walker):
    """A program's constants and exponents hashed through ``hex_repr``: the
    hash of the Python text, so weights saved before fit."""
    from compiler import ir
    rng = random.Random(5)
    x, w = Value(0.5), Value(-1.5)
    y = x * w
    for _ in range(300):                                  # constants of every kind, exponents too
        c = rng.choice([rng.uniform(-3, 3), 5e-324, -0.0, 1e300, 2.0 ** -1030])
        y = (y + c) * 0.5 if rng.random() < 0.7 else (y * y + 0.25) ** rng.choice([2, 0.5, 1.25, -1.0])
    program = trace_graph(y, [x], [w])[0]
    assert program.scalar_arrays is not None and len(program.constants) > 100 and program.scalar_arrays.k
    calls = []

    def counted(*args):
        calls.append(args[1])
        return in_c_hex_repr(*args)
    in_c_hex_repr = walker.hex_repr
    monkeypatch.setattr(walker, 'hex_repr', counted)
    in_c, in_python = both_loops(monkeypatch, walker, ir.graph_hash, program)
    assert calls == [program.n_inputs + program.n_params, None]       # the constants' run, the exponents
    assert in_c == in_python == program.graph_hash
    # constants whose slots are not a run: the Python text, in C or not
    gapped = dict(program.constants)
    gapped[max(gapped) + 2] = gapped.pop(min(gapped))
    program.constants = gapped
    calls.clear()
    monkeypatch.setattr(walker, 'hex_repr', counted)
    in_c, in_python = both_loops(monkeypatch, walker, ir.graph_hash, program)
    assert in_c == in_python != program.graph_hash
    assert calls == [None]                                             # the exponents only
