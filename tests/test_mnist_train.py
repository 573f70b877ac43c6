"""mnist_train.py end to end on real digits: the embedded MNIST subset and Debian's Fashion-MNIST.

Every run compiles with tcc (about a second); the compiler's default may be
slower to build the 784-input graph.
"""
import contextlib
import functools
import importlib.util
import io
import json
import re
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

import mnist_data
import mnist_train
from compiler import cli

SCRIPT = Path(mnist_train.__file__)
TCC = ['--cc', 'tcc']
SHORT_RUN = [*TCC, '--limit', '1000', '--epochs', '2']
HAVE_MATPLOTLIB = importlib.util.find_spec('matplotlib') is not None


def run_main(argv):
    """``(exit status, stdout, stderr)`` of ``mnist_train.main(argv)`` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = mnist_train.main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


@functools.cache
def untrained_model(hidden=(50,), optimizer='sgd'):
    """The network ``--hidden`` builds, compiled with tcc once per test session."""
    return mnist_train.build_model(list(hidden), cc='tcc', optimizer=optimizer)


def write_weights(path, params, hidden=(50,)):
    """A weights file as ``--save`` writes it, holding ``params``."""
    model = untrained_model(tuple(hidden))
    model.set_params(params)
    mnist_train.save_weights(model, path, mnist_train.layer_sizes(list(hidden)))


def saved_params(path, hidden=(50,)):
    """The parameters of a file ``--save`` wrote, read as ``--load`` reads them."""
    return mnist_train.read_weights(path, mnist_train.layer_sizes(list(hidden)))['params']


@pytest.fixture(scope='module')
def short_run(tmp_path_factory):
    """One 2-epoch run on 1,000 embedded digits, saving weights, metrics and (if it can) a plot."""
    folder = tmp_path_factory.mktemp('short_run')
    paths = {'save': folder / 'weights.npz', 'metrics': folder / 'metrics.json',
             'plot': folder / 'curves.png'}
    argv = [*SHORT_RUN, '--save', paths['save'], '--metrics', paths['metrics']]
    if HAVE_MATPLOTLIB:
        argv += ['--plot', paths['plot']]
    status, out, err = run_main(argv)
    return {'status': status, 'out': out, 'err': err, **paths,
            'metrics_json': json.loads(paths['metrics'].read_text())}


def test_short_run_loss_falls_and_accuracy_beats_chance(short_run):
    assert short_run['status'] == 0, short_run['err']
    history = short_run['metrics_json']['history']
    assert [e['epoch'] for e in history] == [1, 2]
    assert history[1]['loss'] < history[0]['loss'] < 2.5   # ln(10) = 2.30 is a guess at random
    assert history[-1]['test_accuracy'] > 0.5, 'chance is 0.1'
    assert history[-1]['train_accuracy'] > 0.5
    out = short_run['out']
    assert 'compiled in' in out and 'tcc' in out
    for epoch in (1, 2):
        assert re.search(rf'^epoch {epoch}/2  train loss [\d.]+  test loss [\d.]+  '
                         rf'train acc [\d.]+  test acc [\d.]+  [\d.]+ s$', out, re.MULTILINE), out
    assert re.search(r'^trained 2 epochs in [\d.]+ s: test loss [\d.]+  test acc [\d.]+$', out, re.MULTILINE)
    # stderr is not a terminal here: no progress bar redrawn with \r.
    assert '\r' not in short_run['err'] + out


def test_metrics_json_has_every_field(short_run):
    report = short_run['metrics_json']
    assert report['layer_sizes'] == [784, 50, 10]
    assert report['params'] == 785 * 50 + 51 * 10
    assert (report['train_images'], report['test_images']) == (1000, 1000)
    assert (report['epochs'], report['batch_size'], report['seed']) == (2, 32, 0)
    assert report['stopped'] == 'completed' and report['divergence'] is None
    assert report['compiler']['name'] == 'tcc'
    assert 'tcc version' in report['compiler']['version']
    assert isinstance(report['compiler']['flags'], list) and report['compiler']['flags']
    for stage in ('trace', 'codegen', 'compile'):
        assert report['timings'][stage] >= 0
    assert report['timings']['trace'] > 0
    for epoch in report['history']:
        assert set(epoch) == {'epoch', 'loss', 'test_loss', 'train_accuracy', 'test_accuracy',
                              'train_seconds', 'seconds'}
        assert 0 < epoch['train_seconds'] <= epoch['seconds']
        assert 0 < epoch['test_loss'] < 2.5
    assert report['batches_per_epoch'] == 32    # 1,000 images in batches of 32
    assert len(report['batch_losses']) == 2 * 32
    assert report['signal'] is None and report['collapsed'] is False


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='matplotlib is not installed (pip install matplotlib)')
def test_plot_is_a_png(short_run):
    assert short_run['plot'].read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_plot_without_matplotlib_fails_before_training(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, 'matplotlib', None)    # makes `import matplotlib` fail
    status, out, err = run_main([*SHORT_RUN, '--plot', tmp_path / 'curves.png'])
    assert status == 1
    assert '--plot needs matplotlib: pip install matplotlib' in err
    assert 'epoch' not in out, 'should fail before compiling and training'


def test_saved_weights_reload_to_identical_predictions(tmp_path):
    data = mnist_data.load_embedded()
    data['train'] = tuple(part[:500] for part in data['train'])
    trained = mnist_train.build_model([50], seed=0, cc='tcc')
    mnist_train.train(trained, data, epochs=1, batch_size=32, lr=0.1)
    path = tmp_path / 'weights.npz'
    mnist_train.save_weights(trained, path, [784, 50, 10])

    rows = mnist_data.input_rows(*data['test'])
    other = mnist_train.build_model([50], seed=1, cc='tcc')
    assert not np.array_equal(other.predict(rows), trained.predict(rows))
    saved = mnist_train.read_weights(path, [784, 50, 10])
    assert mnist_train.load_saved(other, path, saved, 'sgd') == f'loaded weights from {path}'
    np.testing.assert_array_equal(other.predict(rows), trained.predict(rows))


def test_load_and_evaluate_reports_the_saved_accuracy(short_run):
    status, out, err = run_main([*TCC, '--limit', '1000', '--load', short_run['save'], '--epochs', '0'])
    assert status == 0, err
    final = short_run['metrics_json']['history'][-1]
    assert f"train acc {final['train_accuracy']:.4f}  test acc {final['test_accuracy']:.4f}" in out


def test_load_with_wrong_hidden_fails_clearly(short_run):
    status, out, err = run_main([*TCC, '--load', short_run['save'], '--hidden', '64,32'])
    assert status == 1
    assert 'holds a 784-50-10 network, but this run builds 784-64-32-10' in err
    assert 'pass --hidden 50' in err
    assert 'compiled' not in out, 'the check should come before compiling'


def test_load_of_a_file_that_is_not_weights_fails_clearly(tmp_path):
    path = tmp_path / 'junk.npz'
    np.savez(path, something=np.zeros(3))
    status, _, err = run_main([*TCC, '--load', path])
    assert status == 1 and f'{path}: not a weights file written by save_weights (no format, params' in err


def test_divergence_stops_with_a_message_and_keeps_finite_weights(tmp_path):
    # lr 1e6 is not enough here: the ReLUs die and the loss stays finite near 5e5.
    # At 1e200 the second batch's logits overflow and its loss is NaN.
    save, metrics = tmp_path / 'weights.npz', tmp_path / 'metrics.json'
    status, out, err = run_main([*SHORT_RUN, '--lr', '1e200', '--save', save, '--metrics', metrics])
    assert status == 1
    assert 'diverged at epoch 1, batch 2 of 32: the loss is nan' in err
    report = json.loads(metrics.read_text())
    assert report['stopped'] == 'diverged'
    assert report['divergence'] == {'epoch': 1, 'batch': 2, 'reason': 'the loss is nan'}
    saved = np.load(save)['params']
    assert np.isfinite(saved).all()
    # Batch 1 gave a finite loss from the initial weights, so they are the last good ones.
    np.testing.assert_array_equal(saved, mnist_train.build_model([50], seed=0, cc='tcc').params())
    assert 'the model holds the last weights that gave a finite loss' in err   # true here: batch 1's


def test_collapse_to_chance_level_without_nan_fails(tmp_path):
    # --lr 50 never gives a NaN: the loss stays finite (near 28 here) while
    # every test image gets the same class, so the accuracy is 0.1.
    metrics = tmp_path / 'metrics.json'
    status, out, err = run_main([*TCC, '--limit', '500', '--epochs', '1', '--lr', '50', '--metrics', metrics])
    assert status == 1
    assert re.search(r'training collapsed: the final test accuracy 0\.(0\d|1[0-4])\d\d is no better than '
                     r'guessing \(chance is 0\.10; a run at or below 0\.15 counts as failed\)', err), err
    assert 'learning rate 50 too high?' in err
    report = json.loads(metrics.read_text())
    assert report['collapsed'] is True and report['stopped'] == 'completed'
    assert np.isfinite(report['batch_losses']).all()


def chance_level_run(test_loss, steps):
    epoch = mnist_train.Epoch(1, 2.3, test_loss, 0.1, 0.1, 0.1, 0.2)
    return mnist_train.Training('completed', history=[epoch], batch_losses=[2.3] * steps)


@pytest.mark.parametrize('test_loss, steps, why', [
    (28.5, 16, "its test loss 28.5000 is far worse than guessing's 2.3026: learning rate 0.1 too high?"),
    (2.29, 1, 'after 1 SGD step at learning rate 0.1: train longer, or change the rate'),
])
def test_a_collapse_says_what_is_likely_wrong(capsys, test_loss, steps, why):
    args = mnist_train.parse_args([])
    assert mnist_train.report_outcome(args, chance_level_run(test_loss, steps), 1.0) is True
    err = capsys.readouterr().err
    assert err.startswith('training collapsed: the final test accuracy 0.1000') and err.endswith(why + '\n')


def test_evaluating_an_untrained_model_is_not_a_collapse():
    status, out, err = run_main([*TCC, '--epochs', '0'])
    assert status == 0 and err == ''
    assert re.search(r'^test loss [\d.]+  train acc [\d.]+  test acc [\d.]+$', out, re.MULTILINE)


@pytest.mark.skipif(mnist_data.debian_fashion_mnist_dir() is None,
                    reason="Debian's dataset-fashion-mnist package is not installed")
def test_fashion_mnist_slice(tmp_path):
    metrics = tmp_path / 'metrics.json'
    status, out, err = run_main([*TCC, '--fashion', '--limit', '2000', '--epochs', '2', '--metrics', metrics])
    assert status == 0, err
    report = json.loads(metrics.read_text())
    assert report['dataset'].startswith('Fashion-MNIST')
    assert (report['train_images'], report['test_images']) == (2000, 10000)
    assert report['history'][-1]['test_accuracy'] > 0.5, 'chance is 0.1'


def test_download_refuses_files_with_the_wrong_sha256(tmp_path, monkeypatch):
    """A mirror serving other bytes (the embedded subset) under MNIST's names is refused."""
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(tmp_path / 'cache'))
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(mnist_data.folder.EMBEDDED_DIR))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, out, err = run_main([*TCC, '--download', '--mirror', f'http://127.0.0.1:{server.server_port}/'])
    finally:
        server.shutdown()
        server.server_close()
    assert status == 1
    assert 'SHA-256 mismatch' in err
    assert list((tmp_path / 'cache' / 'mnist').iterdir()) == []


def test_missing_data_folder_fails_clearly(tmp_path):
    status, _, err = run_main([*TCC, '--data', tmp_path])
    assert status == 1 and 'missing MNIST files' in err


def test_progress_bar_redraws_one_line():
    stream = io.StringIO()
    bar = cli.ProgressBar(stream, 'epoch 1/3', total=1000)
    bar.update(500, 0.5, force=True)
    assert stream.getvalue().startswith('\repoch 1/3 [############............] 500/1,000')
    assert re.search(r'img/s  0:00 elapsed  ETA 0:00  loss 0\.5000', stream.getvalue())
    bar.close()
    assert stream.getvalue().endswith('\r') and '\n' not in stream.getvalue()


@pytest.mark.parametrize('text, sizes', [('50', [50]), ('128,64', [128, 64])])
def test_hidden_sizes(text, sizes):
    assert mnist_train.parse_args(['--hidden', text]).hidden == sizes


@pytest.mark.parametrize('argv', [['--hidden', '0'], ['--hidden', 'a,b'], ['--lr', '-1'],
                                  ['--batch-size', '0'], ['--data', 'x', '--fashion']])
def test_bad_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mnist_train.parse_args(argv)
    assert exit_info.value.code == 2
