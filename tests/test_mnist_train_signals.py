"""SIGINT, SIGTERM and SIGHUP sent to a real mnist_train.py process: it stops
after the batch, writes --save and --metrics, and exits 128 + the signal."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import mnist_train
from compiler import cli
from tests.test_mnist_train import SCRIPT, TCC

ENDLESS_RUN = [*TCC, '--limit', '500', '--epochs', '100000']


def start(argv, ignored=()):
    """mnist_train.py in a child with the three stop signals at their default
    action (a shell's background job would inherit SIGINT ignored), except
    ``ignored`` ones, as ``nohup`` does for SIGHUP."""
    def dispositions():
        for signum in cli.STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
    return subprocess.Popen([sys.executable, str(SCRIPT), *map(str, argv)], cwd=SCRIPT.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=dispositions)


def wait_for_epoch_lines(process, count=1):
    """Read stdout until ``count`` epoch lines have come: training is under way."""
    seen = []
    for line in process.stdout:
        seen.append(line)
        count -= line.startswith('epoch')
        if count == 0:
            return seen
    raise AssertionError(f"the run ended before its epoch lines: {''.join(seen)}{process.stderr.read()}")


@pytest.mark.parametrize('signum, status', [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_saves_writes_metrics_and_exits_128_plus_its_number(tmp_path, signum, status):
    save, metrics = tmp_path / 'weights.npz', tmp_path / 'metrics.json'
    process = start([*ENDLESS_RUN, '--save', save, '--metrics', metrics])
    try:
        wait_for_epoch_lines(process)
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    name = signal.Signals(signum).name
    assert process.returncode == status, err
    assert f'interrupted by {name} at epoch' in err or f'interrupted by {name} after epoch' in err
    assert 'Traceback' not in err
    assert f'saved weights to {save}' in out
    assert np.isfinite(mnist_train.read_weights(save, [784, 50, 10])['params']).all()
    report = json.loads(metrics.read_text())
    assert (report['stopped'], report['signal']) == ('interrupted', name)
    assert report['history'], 'at least the first epoch was finished'


def test_sighup_ignored_at_start_stays_ignored(tmp_path):
    """Under ``nohup`` a hangup must not stop the run; SIGTERM still does."""
    save = tmp_path / 'weights.npz'
    process = start([*ENDLESS_RUN, '--save', save], ignored=(signal.SIGHUP,))
    try:
        wait_for_epoch_lines(process)
        process.send_signal(signal.SIGHUP)
        wait_for_epoch_lines(process, count=3)     # still training
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, err
    assert 'SIGHUP' not in err and 'interrupted by SIGTERM' in err
    assert save.exists()


def test_the_first_signal_asks_to_stop_a_second_aborts_and_handlers_are_restored():
    before = {signum: signal.getsignal(signum) for signum in cli.STOP_SIGNALS}
    with cli.stop_on_signals() as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.is_set() and stop.name == 'SIGTERM'
        with pytest.raises(cli.Aborted) as aborted:
            os.kill(os.getpid(), signal.SIGHUP)
        assert aborted.value.signum == signal.SIGHUP
    assert {signum: signal.getsignal(signum) for signum in cli.STOP_SIGNALS} == before


def test_an_abort_exits_with_its_signals_status(monkeypatch, capsys):
    def aborted(args):
        raise cli.Aborted(signal.SIGTERM)
    monkeypatch.setattr(mnist_train, 'run', aborted)
    assert mnist_train.main([]) == 143
    assert capsys.readouterr().err == '\naborted\n'
