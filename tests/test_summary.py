"""Seeing what was built: the folded program text, the summary, the picture."""
import re

import pytest

import compiler
from compiler.ir import Op, Program
from compiler.vectorize import vectorize
from micrograd import Value, cross_entropy
from micrograd.nn import MLP

from tests.differential import FAST_CC, needs_cc


def small_mlp():
    model = MLP(4, [8, 3], seed=0, init='scaled')
    xs = [Value(0.0, label=f'x{i}') for i in range(4)]
    ts = [Value(0.0) for _ in range(3)]
    model.layers[0].neurons[0].b.label = 'b0'
    logits = model(xs)
    loss = cross_entropy(logits, ts)
    loss.label = 'loss'
    return loss, xs + ts, model.parameters(), logits


def test_the_printed_program_folds_runs_and_shows_labels():
    loss, inputs, params, outputs = small_mlp()
    text = str(vectorize(compiler.trace(loss, inputs, params, outputs)))
    assert text.splitlines()[:9] == [
        'program: 113 slots, 28 ops (passes: vectorize)',
        '  inputs  %0..%6  # x0, x1, x2, x3',
        '  params  %7..%73  # b0',
        '  const   %74 = 0.0',
        '  const   %75 = 0.0',
        '  %76..%83 = matvec(W=%7[8x4, by column], x=%0..%3, heads=%39..%46)',
        '  %84..%91 = relu(%76..%83)',
        '  %92..%94 = matvec(W=%47[3x8, by column], x=%84..%91, heads=%71..%73)',
        '  %95 = max(%92, %93)',
    ]
    assert text.splitlines()[-3:] == ['  %112 = neg(%111)  # loss', '  loss    %112  # loss',
                                      '  outputs %92, %93, %94']


def test_folding_keeps_operands_that_stay_the_same_and_never_merges_different_ops():
    ops = ([Op('-', 5 + i, (i, 4)) for i in range(4)]             # x - m for 4 inputs
           + [Op('**', 9 + i, (5 + i,), 2.0) for i in range(4)]   # their squares
           + [Op('**', 13, (8,), 3.0)]                           # another exponent: its own line
           + [Op('+', 14, (9, 10)), Op('+', 15, (14, 11)), Op('+', 16, (15, 12))])   # a chain
    program = Program(n_slots=17, n_inputs=4, n_params=1, constants={}, ops=ops, n_grad_ops=len(ops),
                      loss=16, outputs=())
    assert str(program).splitlines()[3:] == [
        '  %5..%8 = -(%0..%3, %4)',
        '  %9..%12 = **(%5..%8, 2.0)',
        '  %13 = **(%8, 3.0)',
        '  %14 = +(%9, %10)',
        '  %15 = +(%14, %11)',      # each reads the last: not a run
        '  %16 = +(%15, %12)',
        '  loss    %16',
    ]


@needs_cc
def test_the_summary_adds_up_to_the_models_counts():
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    text = m.summary()
    rows = [line.split() for line in text.splitlines()[2:] if re.match(r'\s*\d+\s', line)]
    assert [r[1] for r in rows] == ['MatVec', 'scalar', 'MatVec', 'scalar']
    assert sum(int(r[-1].replace(',', '')) if r[-1].replace(',', '').isdigit() else int(r[-2].replace(',', ''))
               for r in rows) == m.n_params == 4 * 8 + 8 + 8 * 3 + 3
    assert '4 -> 8 (W 8x4, heads)' in text and 'relu x8' in text
    assert f'params {m.n_params:,}' in text and 'inputs 7 (4 that the outputs depend on)' in text
    assert f'C: {m.source.count(chr(10)):,} lines' in text
    for stage in ('trace', 'passes', 'codegen', 'compile', 'load'):
        assert f'{stage} ' in text
    assert repr(m).startswith('<CompiledModel 7 inputs, 67 params, 3 outputs;')


@needs_cc
def test_unused_and_scalar_parameters_are_counted():
    x, w, unused = Value(0.0), Value(2.0), Value(1.0)
    m = compiler.compile((x * w).tanh(), [x], [w, unused], cc=FAST_CC)
    text = m.summary()
    assert 'params 2 (1 unused)' in text
    assert re.search(r'scalar\s+2 ops: \* x1, tanh x1\s+1', text)


@needs_cc
def test_draw_renders_the_network(tmp_path):
    pytest.importorskip('graphviz')
    import shutil
    if not shutil.which('dot'):
        pytest.skip("Graphviz's dot is not installed")
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    for ext in ('png', 'svg'):
        out = m.draw(tmp_path / f'net.{ext}')
        assert out.endswith(f'net.{ext}')
    svg = (tmp_path / 'net.svg').read_text()
    assert 'MatVec' in svg and 'W 8x4' in svg and 'relu x8' in svg
    assert (tmp_path / 'net.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    with pytest.raises(ValueError, match='must end in'):
        m.draw(tmp_path / 'net.txt')
