"""mnist_train.py's --save file format, --optimizer (and its state through
--save and --load), --threads, --export and -v's summary: real runs with tcc
on the embedded digits."""
import json
import os
import subprocess
import sys
import re

import numpy as np
import pytest

import compiler
import compiler.weights
import mnist_data
import mnist_train
from tests.test_mnist_train import SCRIPT, TCC, run_main, untrained_model

QUICK = [*TCC, '--limit', '300', '--epochs', '1']      # 10 batches of 32 (the last of 12)
BATCHES = 10
N_PARAMS = 785 * 50 + 51 * 10


def run(argv, tmp_path, name='run'):
    """A quick run saving weights and metrics: ``(stdout, saved arrays, metrics)``."""
    save, metrics = tmp_path / f'{name}.npz', tmp_path / f'{name}.json'
    status, out, err = run_main([*QUICK, *argv, '--save', save, '--metrics', metrics])
    assert status == 0, err
    return out, compiler.weights.read(save), json.loads(metrics.read_text())


# -- --save writes CompiledModel.save_weights's file -----------------------------------

def test_save_writes_the_compilers_weights_file(tmp_path):
    out, saved, report = run([], tmp_path)
    assert saved['meta_layer_sizes'].tolist() == [784, 50, 10]
    assert str(saved['meta_optimizer']) == 'sgd'
    model = untrained_model()
    assert str(saved['graph_hash']) == model.module.graph_hash
    model.load_weights(tmp_path / 'run.npz')         # the compiler's own loader takes it
    rows = mnist_data.input_rows(*mnist_data.load_embedded()['test'])
    accuracy = (model.predict(rows).argmax(axis=1) == mnist_data.load_embedded()['test'][1]).mean()
    assert accuracy == report['history'][-1]['test_accuracy']


# -- --optimizer ------------------------------------------------------------------------

def by_hand(optimizer, lr, limit=300, batch_size=32, seed=0):
    """The parameters after one epoch of ``train_batch`` calls written out
    here, on a model compiled with ``optimizer`` (a compiler optimizer or None)."""
    graph = mnist_data.mnist_graph([50], seed=seed)
    model = compiler.compile(graph.loss, inputs=graph.inputs, params=graph.params, outputs=graph.logits,
                             cc='tcc', optimizer=optimizer)
    images, labels = (part[:limit] for part in mnist_data.load_embedded()['train'])
    order = np.random.default_rng(seed).permutation(limit)
    for start in range(0, limit, batch_size):
        picked = order[start:start + batch_size]
        model.train_batch(mnist_data.input_rows(images[picked], labels[picked]), lr)
    return model.params()


def test_the_default_is_plain_sgd_as_before_bit_for_bit(tmp_path):
    # train_batch(rows, 0.1) on a model compiled without an optimizer is
    # what every run did before --optimizer existed.
    out, default, report = run([], tmp_path, 'default')
    _, sgd, _ = run(['--optimizer', 'sgd'], tmp_path, 'sgd')
    assert default['params'].tobytes() == sgd['params'].tobytes()
    assert default['params'].tobytes() == by_hand(None, 0.1).tobytes()
    assert str(default['optimizer']) == 'none'
    assert (report['optimizer'], report['lr']) == ('sgd', 0.1)
    assert 'model: 784-50-10 MLP, 39,760 parameters; SGD, learning rate 0.1\n' in out


@pytest.mark.parametrize('name, compiled, lr, state_size, described', [
    ('momentum', compiler.SGD(0.01, momentum=0.9), 0.01, 1 + N_PARAMS, 'SGD with momentum 0.9'),
    ('adam', compiler.Adam(1e-3), 1e-3, 1 + 2 * N_PARAMS, 'Adam'),
])
def test_momentum_and_adam_run_the_compiled_optimizer_at_their_default_rate(
        tmp_path, name, compiled, lr, state_size, described):
    out, saved, report = run(['--optimizer', name], tmp_path)
    assert f'; {described}, learning rate {lr:g}\n' in out
    assert (report['optimizer'], report['lr']) == (name, lr)
    assert saved['params'].tobytes() == by_hand(compiled, lr).tobytes()
    state = saved['optimizer_state']
    assert str(saved['optimizer']) == type(compiled).__name__ and state.shape == (state_size,)
    assert state[0] == BATCHES and np.any(state[1:] != 0), 'the state after 10 steps is saved'
    history = report['history']
    assert history[-1]['test_accuracy'] > 0.2, 'chance is 0.1'


def test_lr_overrides_the_optimizers_default(tmp_path):
    out, saved, report = run(['--optimizer', 'adam', '--lr', '0.01'], tmp_path)
    assert report['lr'] == 0.01 and '; Adam, learning rate 0.01\n' in out
    assert saved['params'].tobytes() == by_hand(compiler.Adam(0.01), 0.01).tobytes()


def test_load_restores_the_optimizer_state_of_the_same_optimizer(tmp_path):
    _, first, _ = run(['--optimizer', 'adam'], tmp_path, 'first')
    first_path = tmp_path / 'first.npz'
    # --epochs 0: nothing trains, so --save writes back exactly what --load set.
    out, again, _ = run(['--optimizer', 'adam', '--load', first_path, '--epochs', '0'], tmp_path, 'again')
    assert f'loaded weights and Adam state (after {BATCHES} steps) from {first_path}\n' in out
    assert again['optimizer_state'].tobytes() == first['optimizer_state'].tobytes()
    assert again['params'].tobytes() == first['params'].tobytes()
    # Another optimizer takes the weights, not the state.
    out, other, _ = run(['--optimizer', 'momentum', '--load', first_path, '--epochs', '0'], tmp_path, 'other')
    assert (f"loaded weights from {first_path}, without its optimizer state (--optimizer adam's; "
            f"this run uses --optimizer momentum)\n") in out
    assert other['params'].tobytes() == first['params'].tobytes()
    assert other['optimizer_state'].shape == (1 + N_PARAMS,) and not other['optimizer_state'].any()


def test_training_on_from_a_restored_state_continues_adam(tmp_path):
    # Adam after 10 steps takes other steps than Adam from step 0: the
    # restored state is used, not just stored.
    run(['--optimizer', 'adam'], tmp_path, 'first')
    _, resumed, _ = run(['--optimizer', 'adam', '--load', tmp_path / 'first.npz'], tmp_path, 'resumed')
    restart = compiler.weights.read(tmp_path / 'first.npz')
    restart['optimizer_state'] = np.zeros_like(restart['optimizer_state'])
    np.savez(tmp_path / 'restart.npz', **restart)
    _, afresh, _ = run(['--optimizer', 'adam', '--load', tmp_path / 'restart.npz'], tmp_path, 'afresh')
    assert resumed['optimizer_state'][0] == 2 * BATCHES and afresh['optimizer_state'][0] == BATCHES
    assert not np.array_equal(resumed['params'], afresh['params'])


def test_an_unknown_optimizer_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        mnist_train.parse_args(['--optimizer', 'rmsprop'])
    assert exit_info.value.code == 2
    assert "invalid choice: 'rmsprop' (choose from 'sgd', 'momentum', 'adam')" in capsys.readouterr().err


# -- --threads --------------------------------------------------------------------------

def test_threads_are_used_shown_and_change_no_result(tmp_path):
    out1, one, report1 = run(['--threads', '1'], tmp_path, 'one')
    out2, two, report2 = run(['--threads', '2'], tmp_path, 'two')
    assert re.search(r'^compiled in .*; 1 thread$', out1, re.MULTILINE), out1
    assert re.search(r'^compiled in .*; 2 threads$', out2, re.MULTILINE), out2
    assert (report1['threads'], report2['threads']) == (1, 2)
    assert one['params'].tobytes() == two['params'].tobytes()
    assert report1['batch_losses'] == report2['batch_losses']


def test_threads_default_to_every_core(tmp_path, monkeypatch):
    monkeypatch.delenv('MICROGRAD_THREADS', raising=False)
    cores = len(os.sched_getaffinity(0))
    out, _, report = run([], tmp_path)
    assert report['threads'] == cores
    assert re.search(rf'^compiled in .*; {cores} threads?$', out, re.MULTILINE), out


@pytest.mark.parametrize('value', ['0', '1025', 'two'])     # compiler.constants.MAX_THREADS is 1024
def test_a_bad_thread_count_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mnist_train.parse_args(['--threads', value])
    assert exit_info.value.code == 2
    assert 'argument --threads: ' in capsys.readouterr().err


def test_a_bad_micrograd_threads_is_refused_before_any_work(monkeypatch):
    monkeypatch.setenv('MICROGRAD_THREADS', 'many')
    status, out, err = run_main(QUICK)
    assert (status, out) == (1, '')
    assert err == "error: MICROGRAD_THREADS must be a whole number of threads, not 'many'\n"


def test_micrograd_threads_zero_names_the_variable(monkeypatch):
    monkeypatch.setenv('MICROGRAD_THREADS', '0')
    status, out, err = run_main(QUICK)
    assert (status, out) == (1, '')
    assert err == "error: MICROGRAD_THREADS must be at least 1, not '0'\n"


def test_a_one_neuron_hidden_layer_trains(tmp_path):
    """micrograd's Layer returns a bare Value for one neuron; the graph keeps a list."""
    status, out, err = run_main([*TCC, '--limit', '64', '--epochs', '1', '--hidden', '1'])
    assert status in (0, 1) and 'Traceback' not in err and 'is not iterable' not in err, err
    assert 'model: 784-1-10 MLP, 805 parameters' in out
    assert 'trained 1 epoch' in out


def test_a_negative_seed_is_a_usage_error_in_a_real_process():
    r = subprocess.run([sys.executable, str(SCRIPT), '--seed', '-1'], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(SCRIPT.parent)))
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
    assert "argument --seed: must be >= 0, got -1" in r.stderr


# -- --export ---------------------------------------------------------------------------

def test_export_writes_a_folder_that_imports_and_predicts_as_trained(tmp_path):
    folder = tmp_path / 'new' / 'model'          # created, with its parent
    out, saved, _ = run(['--export', folder], tmp_path)
    assert (f'exported the model to {folder}: nn.c, nn.h, nn.abi3.so, nn.json '
            f"(sys.path.insert(0, '{folder}'); import nn)\n") in out
    assert sorted(os.listdir(folder)) == ['nn.abi3.so', 'nn.c', 'nn.h', 'nn.json']
    exported = compiler.load(folder)
    model = untrained_model()
    model.set_params(saved['params'])
    rows = mnist_data.input_rows(*mnist_data.load_embedded()['test'])
    np.testing.assert_array_equal(exported.params(), saved['params'])
    assert exported.predict(rows).tobytes() == model.predict(rows).tobytes()
    # An earlier export is replaced; so is an empty folder filled.
    (tmp_path / 'empty').mkdir()
    for again in (folder, tmp_path / 'empty'):
        status, out, err = run_main([*QUICK, '--lr', '0.05', '--export', again])
        assert status == 0, err
        assert sorted(os.listdir(again)) == ['nn.abi3.so', 'nn.c', 'nn.h', 'nn.json']
    assert not np.array_equal(compiler.load(folder).params(), saved['params'])


def test_an_export_that_fails_after_training_is_an_error_and_the_rest_is_written(tmp_path, monkeypatch):
    def fails(model, folder):
        raise compiler.BuildError('tcc failed to compile the generated module')
    monkeypatch.setattr(compiler.CompiledModel, 'export', fails)
    save = tmp_path / 'weights.npz'
    status, out, err = run_main([*QUICK, '--save', save, '--export', tmp_path / 'model'])
    assert status == 1
    assert err == f"error: --export {tmp_path / 'model'}: tcc failed to compile the generated module\n"
    assert f'saved weights to {save}' in out and 'exported' not in out


@pytest.fixture
def places(tmp_path):
    """``tmp_path`` with a file, a folder holding a file, an export folder."""
    (tmp_path / 'file').write_text('not a folder')
    (tmp_path / 'busy').mkdir()
    (tmp_path / 'busy' / 'notes.txt').write_text('mine')
    (tmp_path / 'export').mkdir()
    (tmp_path / 'export' / 'nn.json').write_text('{}')
    return tmp_path


@pytest.mark.parametrize('argv, phrase', [
    (['--export', '{}/file'], '--export {}/file exists and is not a folder'),
    (['--export', '{}/file/model'], '--export {}/file/model: {}/file is not a folder'),
    (['--export', '{}/busy'], '--export {}/busy holds other files than an export\'s (notes.txt): '
                              'give a new or empty folder, or an earlier export'),
    (['--export', '{}/out', '--save', '{}/out'], '--save and --export both name {}/out: '
                                                 'give each option its own path'),
    (['--export', '{}/export', '--metrics', '{}/export/nn.json'],
     '--metrics {}/export/nn.json is a file --export writes: give each option its own path'),
])
def test_a_bad_export_folder_is_refused_before_any_work(places, argv, phrase):
    status, out, err = run_main([*TCC, *(a.format(places) for a in argv)])
    assert (status, out) == (1, ''), 'nothing should be loaded, compiled or trained'
    assert err == f'error: {phrase.format(places, places)}\n'
    assert (places / 'busy' / 'notes.txt').read_text() == 'mine'


@pytest.mark.skipif(os.geteuid() == 0, reason='root may write in a folder of mode 0555')
def test_an_export_folder_that_cannot_be_created_is_refused(tmp_path):
    locked = tmp_path / 'locked'
    locked.mkdir()
    locked.chmod(0o555)
    try:
        status, out, err = run_main([*TCC, '--export', locked / 'model'])
    finally:
        locked.chmod(0o755)
    assert (status, out) == (1, '') and f'cannot write in {locked} (Permission denied)' in err


@pytest.mark.skipif(not os.path.isdir('/sys/kernel'), reason='needs Linux sysfs')
def test_an_export_folder_in_sysfs_is_refused():
    status, out, err = run_main([*TCC, '--export', '/sys/kernel/model'])
    assert (status, out) == (1, '')
    assert err.startswith('error: --export /sys/kernel/model: cannot write in /sys/kernel (')


# -- -v ---------------------------------------------------------------------------------

def test_verbose_prints_the_summary_after_compiling():
    status, out, err = run_main([*TCC, '--limit', '64', '--epochs', '1', '-v', '--optimizer', 'adam'])
    assert status == 0, err
    lines = out.splitlines()
    compiled = next(i for i, line in enumerate(lines) if line.startswith('compiled in'))
    summary = untrained_model(optimizer='adam').summary().splitlines()
    assert lines[compiled + 1].split() == summary[0].split()        # the table's heading
    assert any(re.fullmatch(r'1 +MatVec +784 -> 50 \(W 50x784, heads\) +39,250', line)
               for line in lines[compiled:]), out
    assert 'optimizer: Adam; threads: ' in out
    assert lines[compiled + len(summary) + 1].startswith('epoch 1/1  batch 1/2  loss ')
    status, out, err = run_main([*TCC, '--limit', '64', '--epochs', '1'])
    assert 'MatVec' not in out, 'only -v prints the summary'


SETUP = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'"


def without_numpy(script, *argv):
    """Run ``script`` in a real process in which ``import numpy`` fails."""
    code = ("import runpy, sys; sys.modules['numpy'] = None; "
            f"sys.argv = [{str(script)!r}, *{list(argv)!r}]; runpy.run_path({str(script)!r}, run_name='__main__')")
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(script.parent)))


def test_without_numpy_the_script_says_how_to_set_up_in_one_line():
    r = without_numpy(SCRIPT)
    assert r.returncode == 1 and r.stdout == ''
    assert r.stderr == f"mnist_train.py needs numpy; set up with: {SETUP}\n"
