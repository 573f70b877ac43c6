"""The slot layout computed in bulk (compiler/codegen/layout.py) and the
analyses over arrays with lifted ops between them, against per-slot and
per-``Op`` reference implementations."""
import numpy as np
import pytest

from compiler.codegen.layout import MAX_RECORDED, PANEL, Layout, round_up
from compiler.codegen.scalar import SCALAR_C
from compiler.constants import ROW_ALIGN
from compiler.ir import MatVec, Op, Program, Sum, features, inputs_used, needs_grad
from compiler.trace import trace_graph
from compiler.vectorize import vectorize
from micrograd import Value
from tests.graphs import mlp_builder
from tests.test_ir_arrays import random_graph


def as_objects(program):
    """The same program with its ops as objects only (no arrays)."""
    objects = Program(n_slots=program.n_slots, n_inputs=program.n_inputs, n_params=program.n_params,
                      constants=program.constants, ops=list(program.ops), n_grad_ops=program.n_grad_ops,
                      loss=program.loss, outputs=program.outputs, input_grads=program.input_grads,
                      prefix_sums=program.prefix_sums)
    objects.param_order = program.param_order
    return objects


def fresh(program):
    """The program with its ``Op`` objects dropped: the analyses read the arrays."""
    program._ops = None
    program.known_needs_grad = None
    return program


def reference_places(program):
    """Each slot's (row index or None, shared index or None), slot by slot
    as the layout was first written."""
    n_in, n_leaves = program.n_inputs, program.n_leaves
    matvecs = [op for op in program.ops if type(op) is MatVec]
    blocks = {op.wt0: (op.rows, op.cols) for op in matvecs}
    shared, at = {}, 0
    for wt0, (R, C) in sorted(blocks.items()):
        at = round_up(at, ROW_ALIGN)
        for s in range(wt0, wt0 + R * C):
            k, n = divmod(s - wt0, R)
            shared[s] = at + k * round_up(R, PANEL) + n
        at += C * round_up(R, PANEL)
    for s in range(program.param_start, n_leaves):
        if s not in shared:
            shared[s] = at
            at += 1
    y_blocks = {op.y0: op.rows for op in matvecs}
    row, at, s = {s: s for s in range(n_in)}, n_in, n_leaves
    while s < program.n_slots:
        R = y_blocks.get(s)
        if R:
            at = round_up(at, ROW_ALIGN)
            for n in range(R):
                row[s + n] = at + n
            at += round_up(R, PANEL)
            s += R
        else:
            row[s] = at
            at, s = at + 1, s + 1
    return row, shared, at


def reference_uses(program, flags):
    """(op's output, operand, parameter slot) of each scalar use of a
    parameter whose gradient is needed, in backward order."""
    def is_param(s):
        return program.param_start <= s < program.param_end
    uses = []
    for op in reversed(program.grad_ops):
        if type(op) is Op and flags[op.out]:
            uses += [(op.out, i, op.args[i]) for i, _, _ in SCALAR_C[op.name].grads if is_param(op.args[i])]
        elif type(op) is Sum and flags[op.out]:
            uses += [(op.out, i, op.terms[i]) for i in reversed(range(len(op.terms))) if is_param(op.terms[i])]
    return uses


def programs():
    """Traced programs, with and without lifted ops, of random graphs and MLPs."""
    out = []
    for seed in range(4):
        out.append(trace_graph(*random_graph(seed, 600))[0])
        out.append(vectorize(trace_graph(*random_graph(seed, 600))[0]))
    for sizes in ([4, 3, 2], [6, 5, 5, 3], [3, 20, 2]):
        build = mlp_builder(sizes)
        inputs = [Value(0.0) for _ in range(sizes[0] + sizes[-1])]
        params = [Value(0.1 * i) for i in range(sum((a + 1) * b for a, b in zip(sizes, sizes[1:])))]
        loss, logits = build(inputs, params)
        for input_grads in (False, True):
            out.append(vectorize(trace_graph(loss, inputs, params, logits, input_grads=input_grads)[0]))
    # Sums of several parameters (their terms' uses last to first), one of them twice
    x, p = [Value(0.5), Value(-2.0)], [Value(0.1 * i) for i in range(1, 5)]
    ys = [p[0] + p[1] + x[0] * p[2] + p[3] + x[1], p[3] + x[1] + p[1] + p[3] + p[0]]
    out.append(vectorize(trace_graph((ys[0] * ys[1]).tanh(), x, p, ys)[0]))
    return out


@pytest.mark.parametrize('case', range(15))
def test_the_layout_is_the_per_slot_layout(case):
    program = programs()[case]
    flags = needs_grad(program)
    lay = Layout(fresh(program), flags)
    row, shared, n_row = reference_places(program)
    assert lay.n_row == n_row
    for s in range(program.n_slots):
        if s in row:
            assert lay.is_row(s) and lay.row_index(s) == row[s] and lay.value[s] == f'v[{row[s]}]'
            assert lay.grad[s] == f'g[{row[s]}]'
        else:
            assert not lay.is_row(s) and lay.shared_index(s) == shared[s] and lay.value[s] == f'p[{shared[s]}]'
            assert lay.grad[s] == (f'gp[{shared[s]}]' if s < program.param_end else None)
    assert lay.value.all() == [lay.value[s] for s in range(program.n_slots)]
    assert lay.grad.all() == [lay.grad[s] for s in range(program.n_slots)]
    assert lay.n_shared == len(set(shared.values())) + sum(
        round_up(op.rows, PANEL) * op.cols - op.rows * op.cols for op in {op.wt0: op for op in lay.matvecs}.values())
    uses = reference_uses(program, flags)
    assert lay.recorded == (len(uses) <= MAX_RECORDED)
    expected = {}
    for u, (out, i, slot) in enumerate(uses):
        assert lay.grad_target(Op('+', out, ()), i, slot) == ('=', f'g[{lay.n_row + u}]')
        expected.setdefault(slot, []).append(u)
    assert lay.param_uses == expected


def test_many_parameter_uses_are_added_not_recorded(monkeypatch):
    program = trace_graph(*random_graph(3, 600))[0]
    flags = needs_grad(program)
    uses = reference_uses(program, flags)
    assert len(uses) > 3
    monkeypatch.setattr('compiler.codegen.layout.MAX_RECORDED', len(uses) - 1)
    lay = Layout(fresh(program), flags)
    assert not lay.recorded and lay.param_uses == {} and lay.n_contrib == 0
    out, i, slot = uses[0]
    assert lay.grad_target(Op('+', out, ()), i, slot) == ('+=', lay.grad[slot])


@pytest.mark.parametrize('case', range(15))
def test_the_analyses_over_arrays_and_lifted_ops(case):
    program = programs()[case]
    reference = as_objects(program)
    for input_grads in (False, True):
        program.input_grads = reference.input_grads = input_grads
        assert needs_grad(fresh(program)) == needs_grad(reference)
        assert program._ops is None            # the arrays were read, not Op objects
    assert features(fresh(program)) == features(reference)
    assert inputs_used(fresh(program)) == inputs_used(reference)
    assert program._ops is None


def reference_runs(at):
    runs, i = [], 0
    while i < len(at):
        step = at[i + 1] - at[i] if i + 1 < len(at) else 1
        j = i + 1
        while j < len(at) and at[j] - at[j - 1] == step:
            j += 1
        runs.append(f'{{{j - i}, {i}, 1, {at[i]}, {step}}}')
        i = j
    return runs or ['{0, 0, 1, 0, 1}']


def test_param_runs_found_in_bulk_are_the_runs():
    import random
    from types import SimpleNamespace
    from compiler.codegen.module import _runs
    rng = random.Random(0)
    for _ in range(2000):
        n = rng.randint(0, 12)
        if rng.random() < 0.5:
            at = [rng.choice([0, 1, 2, 3, 5, 8]) + i * rng.choice([0, 1, 1, 2]) for i in range(n)]
        else:
            at = sorted(rng.sample(range(40), n))
        program = SimpleNamespace(param_slots=list(range(n)))
        layout = SimpleNamespace(loc=-1 - np.array(at, dtype=np.int64))
        assert _runs(program, layout) == reference_runs(at), at


@pytest.mark.parametrize('vectorize_on', [True, False])
def test_output_positions_found_from_the_arrays(vectorize_on):
    from compiler.codegen.layout import ScalarPart
    from compiler.codegen.module import _output_positions
    from compiler.ir import prefix_cuts
    from tests.test_sequences import T, V, tiny_lm
    build, params = tiny_lm()
    inputs = [Value(0.0) for _ in range(2 * T * V)]
    losses, logits = build(T, inputs)
    program = trace_graph(losses, inputs, params, [*logits, losses[0], params[0], inputs[1]])[0]
    if vectorize_on:
        program = vectorize(program)
    cuts = prefix_cuts(program)
    at = {slot: i for i, op in enumerate(program.ops) for slot in op.writes}
    expected = [0 if s not in at or s == program.loss else
                next((n for n, cut in enumerate(cuts, 1) if at[s] <= cut), len(cuts)) for s in program.outputs]
    assert _output_positions(fresh(program), cuts, ScalarPart.of(program)) == expected
    assert sorted(set(expected)) == list(range(T + 1))
