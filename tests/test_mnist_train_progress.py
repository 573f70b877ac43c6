"""What mnist_train.py shows while it trains: the progress bar with ETA, plain
progress lines off a terminal, the test loss, --quiet, -v, the metavars,
the per-batch losses in --metrics, and the --plot figure."""
import io
import json
import math
import re

import numpy as np
import pytest

import mnist_data
import mnist_train
from compiler import cli
from tests.test_mnist_train import HAVE_MATPLOTLIB, SHORT_RUN, TCC, run_main


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize('seconds, text', [(0, '0:00'), (59.9, '0:59'), (75, '1:15'), (3725, '1:02:05')])
def test_duration(seconds, text):
    assert cli.duration(seconds) == text


def test_progress_bar_shows_rate_elapsed_and_eta():
    stream, clock = io.StringIO(), FakeClock()
    bar = cli.ProgressBar(stream, 'epoch 2/5', total=60_000, clock=clock)
    clock.now += 30     # 15,000 images in 30 s: 500 img/s, 45,000 to go: 90 s
    bar.update(15_000, 0.4321)
    assert stream.getvalue() == ('\repoch 2/5 [######..................] 15,000/60,000  500 img/s  '
                                 '0:30 elapsed  ETA 1:30  loss 0.4321')


def test_progress_lines_every_quarter_of_a_long_epoch():
    stream, clock = io.StringIO(), FakeClock()
    lines = cli.ProgressLines(stream, 'epoch 1/2', total=1000, clock=clock)
    for done in range(100, 1001, 100):
        clock.now += 1.0    # 100 images a second: a 10 s epoch
        lines.update(done, 2.0 - done / 1000)
    assert stream.getvalue().splitlines() == [
        'epoch 1/2  30%  300/1,000  100 img/s  0:03 elapsed  ETA 0:07  loss 1.7000',
        'epoch 1/2  50%  500/1,000  100 img/s  0:05 elapsed  ETA 0:05  loss 1.5000',
        'epoch 1/2  80%  800/1,000  100 img/s  0:08 elapsed  ETA 0:02  loss 1.2000',
    ]   # at 100% the epoch line follows instead


def test_progress_lines_skip_a_quick_epoch():
    stream, clock = io.StringIO(), FakeClock()
    lines = cli.ProgressLines(stream, 'epoch 1/2', total=1000, clock=clock)
    for done in range(100, 1001, 100):
        clock.now += 0.1    # a 1 s epoch: its epoch line comes soon enough
        lines.update(done, 1.0)
    assert stream.getvalue() == ''


def test_off_a_terminal_the_run_prints_progress_lines_not_a_bar(monkeypatch):
    monkeypatch.setattr(cli.ProgressLines, "MIN_SECONDS", 0)    # epochs here are quick
    status, out, err = run_main([*TCC, '--limit', '1000', '--epochs', '2'])
    assert status == 0, err
    assert '\r' not in err
    for epoch in (1, 2):
        percents = re.findall(rf'^epoch {epoch}/2 +(\d+)%  [\d,]+/1,000  [\d,]+ img/s  \d+:\d\d elapsed  '
                              rf'ETA \d+:\d\d  loss \d+\.\d{{4}}$', err, re.MULTILINE)
        assert [int(p) // 25 for p in percents] == [1, 2, 3], err


@pytest.fixture(scope='module')
def verbose_run(tmp_path_factory):
    metrics = tmp_path_factory.mktemp('verbose') / 'metrics.json'
    status, out, err = run_main([*SHORT_RUN, '--verbose', '--metrics', metrics])
    return status, out, err, json.loads(metrics.read_text())


def test_verbose_prints_every_batch_loss(verbose_run):
    status, out, err, report = verbose_run
    assert status == 0, err
    batches = re.findall(r'^epoch (\d)/2  batch +(\d+)/32  loss (\d+\.\d{4})$', out, re.MULTILINE)
    assert [(int(e), int(b)) for e, b, _ in batches] == [(e, b) for e in (1, 2) for b in range(1, 33)]
    assert [loss for _, _, loss in batches] == [f'{x:.4f}' for x in report['batch_losses']]
    assert err == '', 'no progress lines: the batch lines show the progress'


def test_metrics_batch_losses_add_up_to_the_epoch_losses(verbose_run):
    *_, report = verbose_run
    sizes = [32] * 31 + [1000 - 31 * 32]       # 1,000 images in batches of 32
    assert report['batches_per_epoch'] == 32
    for e, epoch in enumerate(report['history']):
        losses = report['batch_losses'][32 * e:32 * (e + 1)]
        assert np.average(losses, weights=sizes) == pytest.approx(epoch['loss'], rel=1e-12)


def test_test_loss_is_the_mean_cross_entropy_of_the_test_set(tmp_path):
    """Checked against the compiled graph's own loss, forward() per test image."""
    save, metrics = tmp_path / 'weights.npz', tmp_path / 'metrics.json'
    status, out, err = run_main([*TCC, '--limit', '300', '--epochs', '1', '--save', save, '--metrics', metrics])
    assert status == 0, err
    test_loss = json.loads(metrics.read_text())['history'][-1]['test_loss']
    model = mnist_train.build_model([50], cc='tcc')
    model.load_weights(save)
    losses = []
    for row in mnist_data.input_rows(*mnist_data.load_embedded()['test']):
        model.set_input(row)
        losses.append(model.forward())
    assert test_loss == pytest.approx(math.fsum(losses) / len(losses), rel=1e-12)
    assert f'test loss {test_loss:.4f}' in out


def test_quiet_prints_only_the_final_line(tmp_path):
    save = tmp_path / 'weights.npz'
    status, out, err = run_main([*TCC, '--limit', '300', '--epochs', '2', '--quiet', '--save', save])
    assert status == 0, err
    assert err == ''
    assert re.fullmatch(r'trained 2 epochs in [\d.]+ s: test loss [\d.]+  test acc [\d.]+\n', out), out
    assert save.exists()
    status, out, err = run_main([*TCC, '--epochs', '0', '-q'])
    assert status == 0 and err == ''
    assert re.fullmatch(r'test loss [\d.]+  train acc [\d.]+  test acc [\d.]+\n', out), out


def test_quiet_and_verbose_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_info:
        mnist_train.parse_args(['-q', '-v'])
    assert exit_info.value.code == 2
    assert 'argument -v/--verbose: not allowed with argument -q/--quiet' in capsys.readouterr().err


def test_metavars_are_like_pytorchs_examples(capsys, monkeypatch):
    monkeypatch.setenv('COLUMNS', '200')
    with pytest.raises(SystemExit):
        mnist_train.parse_args(['--help'])
    usage = capsys.readouterr().out
    for option in ('--epochs N', '--batch-size N', '--limit N', '--lr LR', '--seed S', '--data DIR',
                   '--mirror URL', '--load PATH', '--save PATH', '--metrics PATH', '--plot PATH',
                   '--hidden N,N', '--cc CC', '-q, --quiet', '-v, --verbose', '--threads N',
                   '--export DIR', '--optimizer {sgd,momentum,adam}'):
        assert option in usage, option
    assert 'kept as PATH.bak' in usage
    assert '(default: 0.1 for sgd, 0.01 for momentum, 0.001 for adam)' in ' '.join(usage.split())


def fake_history(n_epochs):
    return [mnist_train.Epoch(e, 1 / e, 1.2 / e, 0.8 + e / 100, 0.75 + e / 100, 0.1, 0.2)
            for e in range(1, n_epochs + 1)]


def visible_ticks(axes):
    low, high = axes.get_xlim()
    return [float(t) for t in axes.get_xticks() if low <= t <= high]


needs_matplotlib = pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='matplotlib is not installed '
                                      "(pip install 'micrograd-compiler[plot]')")


@needs_matplotlib
def test_plot_of_many_epochs_marks_points_on_whole_epochs():
    fig = cli.draw_curves(fake_history(5), [1.0] * 50, 10, 'title')
    try:
        for axes in fig.axes:
            assert axes.get_xlabel() == 'epoch'
            assert all(line.get_marker() not in (None, '', 'None') for line in axes.get_lines())
            assert [len(line.get_xdata()) for line in axes.get_lines()] == [5, 5]
            assert visible_ticks(axes) == [1, 2, 3, 4, 5]
    finally:
        cli.require_matplotlib().close(fig)


@needs_matplotlib
@pytest.mark.parametrize('n_epochs', [1, 2])
def test_plot_of_one_or_two_epochs_shows_every_batch(n_epochs):
    batch_losses = list(np.linspace(2.3, 0.5, 10 * n_epochs))
    fig = cli.draw_curves(fake_history(n_epochs), batch_losses, 10, 'title')
    try:
        loss, accuracy = fig.axes
        assert loss.get_xlabel() == 'batch'
        per_batch, test = loss.get_lines()
        assert list(per_batch.get_ydata()) == batch_losses
        assert list(test.get_xdata()) == [10 * e for e in range(1, n_epochs + 1)]
        assert visible_ticks(accuracy) == list(range(1, n_epochs + 1))
        assert all(float(t).is_integer() for t in loss.get_xticks())
        assert all(line.get_marker() not in (None, '', 'None') for line in accuracy.get_lines())
    finally:
        cli.require_matplotlib().close(fig)
