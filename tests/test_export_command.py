"""``python -m compiler export FILE.py:FUNC -o DIR``: the seed's workflow
(build the graph, emit and build ``nn``, ``import nn`` later) as one command."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.differential import FAST_CC, needs_cc
from tests.test_export import run_bare

pytestmark = needs_cc
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODEL = textwrap.dedent('''
    from micrograd import Value
    from micrograd.nn import MLP

    def graph(row):
        """The graph with its inputs at ``row`` (three features and the target)."""
        model = MLP(3, [4, 1], seed=7, init='scaled')
        xs = [Value(x, label=f'x{i}') for i, x in enumerate(row[:3])]
        y = Value(row[3], label='y')
        out = model(xs)
        return (out - y) ** 2, xs + [y], model.parameters(), [out]

    def build():
        return graph([0.0] * 4)

    def as_dict():
        loss, inputs, params, outputs = build()
        return {'loss': loss, 'inputs': inputs, 'params': params}

    def not_a_graph():
        return 42

    def bad_keys():
        return {'loss': build()[0], 'weights': []}

    def needs_args(width, depth=2):
        return build()

    def raises():
        raise ValueError("no graph today\\n(second line)")

    def sleeps():
        import sys, time
        print("ready", flush=True)
        time.sleep(60)

    def forgot_params():
        loss, inputs, params, outputs = build()
        return loss, inputs, [], outputs
''')


def export(tmp_path, target, *more):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, '-m', 'compiler', 'export', target, *more], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / 'model.py'
    path.write_text(MODEL)
    return path


@pytest.mark.parametrize('func', ['build', 'as_dict'])
def test_export_from_a_file_then_import_nn_in_a_bare_python(tmp_path, model_file, func):
    out = tmp_path / 'exported'
    r = export(tmp_path, f'{model_file}:{func}', '-o', str(out), '--cc', FAST_CC)
    assert r.returncode == 0, r.stderr
    assert 'exported 4 inputs, 21 params' in r.stdout
    assert sorted(os.listdir(out)) == ['nn.abi3.so', 'nn.c', 'nn.h', 'nn.json']
    assert json.loads((out / 'nn.json').read_text())['input_labels'] == ['x0', 'x1', 'x2', 'y']
    # the exported module, without micrograd or compiler, gives the interpreter's bits
    rows = [[0.5, -1.0, 2.0, 0.25], [0.0, 0.0, 0.0, 1.0], [3.0, 0.125, -2.5, -1.0]]
    got = run_bare(out, rows, tmp_path)
    namespace = {}
    exec(MODEL, namespace)
    for row, loss_hex, grads in zip(rows, got['loss'], got['grads']):
        loss, inputs, params, outputs = namespace['graph'](row)
        loss.backward()
        assert got['params'] == [p.data.hex() for p in params]
        assert float.fromhex(loss_hex) == loss.data
        assert grads == [p.grad.hex() for p in params]


@pytest.mark.parametrize('target, words', [
    ('model.py', 'expected FILE.py:FUNC'),
    ('missing.py:build', 'missing.py: no such file'),
    ('model.py:nothing', 'has no function nothing'),
    ('model.py:not_a_graph', 'returned int'),
    ('model.py:bad_keys', "keys ['loss', 'weights']"),
    ('model.py:forgot_params', 'params'),
    ('.:build', '. is a folder: give the Python file that defines build'),
    ('model.py:needs_args', 'needs_args(width, depth=2) needs arguments'),
    ('model.py:raises', 'raises() raised ValueError: no graph today (second line)'),
])
def test_mistakes_are_one_line_errors_and_write_nothing(tmp_path, model_file, target, words):
    out = tmp_path / 'exported'
    r = export(tmp_path, target, '-o', str(out), '--cc', FAST_CC)
    assert r.returncode == 1, r.stdout + r.stderr
    assert words in r.stderr and 'Traceback' not in r.stderr, r.stderr
    assert not out.exists()


def test_the_output_folder_is_required(tmp_path, model_file):
    r = export(tmp_path, f'{model_file}:build')
    assert r.returncode == 2 and '-o' in r.stderr


def test_a_file_that_fails_to_run_is_one_line(tmp_path):
    (tmp_path / 'broken.py').write_text('import no_such_module_here\n')
    r = export(tmp_path, 'broken.py:build', '-o', str(tmp_path / 'out'))
    assert r.returncode == 1 and 'Traceback' not in r.stderr, r.stderr
    assert "broken.py failed to run: ModuleNotFoundError: No module named 'no_such_module_here'" in r.stderr


def test_ctrl_c_is_one_line_and_status_130(tmp_path, model_file):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, '-m', 'compiler', 'export', f'{model_file}:sleeps',
                             '-o', str(tmp_path / 'out')], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == 'ready\n'
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err == '\ninterrupted\n', err
