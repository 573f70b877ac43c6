"""microgpt_train.py: --check on a tiny model (and that it can fail), training,
sampling, the metrics file, the interpreter run, and bad arguments.

Every run is a tiny microgpt (n_embd 8, 2 heads, block 6) built with the
fastest compiler installed (tcc where there is one): well under a second each.
"""
import contextlib
import io
import json
import signal
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import microgpt_train
from tests.differential import FAST_CC

SCRIPT = Path(microgpt_train.__file__)
TINY = ['--n-embd', '8', '--n-head', '2', '--block-size', '6', '--cc', FAST_CC]
NAME_CHARS = set(''.join(microgpt_train.load_names()))

pytestmark = pytest.mark.skipif(FAST_CC is None, reason='no C compiler installed')


def run_main(argv):
    """``(exit status, stdout, stderr)`` of ``microgpt_train.main(argv)`` in this process;
    argparse's exit on bad arguments gives its status too."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = microgpt_train.main([str(a) for a in argv])
        except SystemExit as e:
            status = e.code
    return status, out.getvalue(), err.getvalue()


def samples_printed(out):
    """The names after the ``samples`` line: ``'  1 kamon'`` -> ``'kamon'``."""
    lines = out.split('samples (temperature', 1)[1].splitlines()[1:]
    return [line.split(None, 1)[1] if len(line.split()) > 1 else '' for line in lines]


# ---- --check -----------------------------------------------------------------------

def test_check_passes_on_a_tiny_model():
    status, out, err = run_main([*TINY, '--check', '5'])
    assert status == 0, err
    assert 'check passed: 5 steps' in out
    for step in range(1, 6):
        assert f'check step {step}/5: loss ' in out


@pytest.mark.parametrize('part', ['param', 'lr'])
def test_check_fails_when_the_interpreter_side_differs(monkeypatch, part):
    """One weight of the interpreter's copy one ulp off, or its Adam steps at a
    learning rate one ulp off: exit 1, naming the step and what differs."""
    real = microgpt_train.interpreter_model

    def perturbed(config, weights, lr):
        if part == 'param':
            weights = {name: [list(row) for row in rows] for name, rows in weights.items()}
            weights['lm_head'][3][1] = math.nextafter(weights['lm_head'][3][1], math.inf)
        model = real(config, weights, lr)
        if part == 'lr':
            step = model.train_step
            model.train_step = lambda tokens, lr_t: step(tokens, math.nextafter(lr_t, 0.0))
        return model

    monkeypatch.setattr(microgpt_train, 'interpreter_model', perturbed)
    status, out, err = run_main([*TINY, '--check', '3'])
    assert status == 1
    assert 'check passed' not in out
    assert err.startswith('check failed at step 1 ('), err
    if part == 'param':
        assert 'lm_head[3][1]: compiled ' in err
    assert 'ulp apart' in err


# ---- training, sampling, metrics ---------------------------------------------------

@pytest.fixture(scope='module')
def short_run(tmp_path_factory):
    """20 compiled steps with 8 samples and a metrics file."""
    path = tmp_path_factory.mktemp('microgpt') / 'metrics.json'
    status, out, err = run_main([*TINY, '--steps', '20', '--samples', '8', '--metrics', path])
    return {'status': status, 'out': out, 'err': err, 'metrics': json.loads(path.read_text())}


def test_short_run_trains_and_samples_names_of_known_characters(short_run):
    assert short_run['status'] == 0, short_run['err']
    out = short_run['out']
    assert 'compiled in' in out
    assert 'trained 20 steps in' in out and '(mean of the last 20 steps)' in out
    names = samples_printed(out)
    assert len(names) == 8
    for name in names:
        assert set(name) <= NAME_CHARS and len(name) <= 6, name
    assert names == short_run['metrics']['samples']
    assert '\r' not in short_run['err'] + out       # not a terminal: no redrawn bar


def test_metrics_json_has_its_fields(short_run):
    report = short_run['metrics']
    assert report['steps'] == 20 and report['backend'] == 'compiled'
    assert report['compile_s'] > 0 and report['ms_per_step_median'] > 0
    losses = report['losses']
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
    assert report['loss_first100'] == pytest.approx(sum(losses) / 20)
    assert report['loss_last100'] == pytest.approx(sum(losses) / 20)
    assert report['config'] == {'vocab_size': 27, 'n_embd': 8, 'n_layer': 1, 'n_head': 2, 'block_size': 6}
    assert report['params'] == 27 * 8 + 6 * 8 + 27 * 8 + 4 * 8 * 8 + 2 * 4 * 8 * 8
    assert report['compiler']['name'] == FAST_CC
    assert report['stopped'] == 'completed'


def test_the_interpreter_run_is_the_compiled_run_bit_for_bit(short_run, tmp_path):
    """--interpreter: the same losses, and (same weights, same rng) the same samples."""
    path = tmp_path / 'interpreter.json'
    status, out, err = run_main([*TINY, '--steps', '20', '--samples', '8', '--metrics', path, '--interpreter'])
    assert status == 0, err
    report = json.loads(path.read_text())
    assert report['backend'] == 'interpreter' and report['compile_s'] is None
    assert report['losses'] == short_run['metrics']['losses']
    assert report['samples'] == short_run['metrics']['samples']
    assert 'compiled in' not in out and 'interpreter' in out


def test_verbose_prints_every_step_and_quiet_only_the_results():
    status, out, err = run_main([*TINY, '--steps', '3', '--samples', '2', '-v'])
    assert status == 0, err
    assert [line.split('  ')[0] for line in out.splitlines() if line.startswith('step ')] == \
        ['step 1/3', 'step 2/3', 'step 3/3']
    status, out, err = run_main([*TINY, '--steps', '3', '--samples', '2', '-q'])
    assert status == 0, err
    assert out.splitlines()[0].startswith('trained 3 steps in ')
    assert len(samples_printed(out)) == 2 and len(out.splitlines()) == 4


def test_tokenizer_round_trip():
    tok = microgpt_train.Tokenizer(['emma', 'bo'])
    assert tok.chars == ['a', 'b', 'e', 'm', 'o'] and tok.bos == 5 and tok.vocab_size == 6
    assert tok.encode('bob') == [5, 1, 4, 1, 5]
    assert tok.decode(tok.encode('mob')) == 'mob'


# ---- bad arguments -----------------------------------------------------------------

@pytest.mark.parametrize('argv, message', [
    (['--n-embd', '10', '--n-head', '4'], '--n-embd 10 is not divisible by --n-head 4'),
    (['--steps', '0'], '--steps: must be >= 1'),
    (['--n-head', 'two'], "--n-head: not a whole number: 'two'"),
    (['--check', '5', '--steps', '3'], '--check 5 is more than --steps 3'),
    (['--check', '2', '--interpreter'], 'not allowed with argument'),
    (['--check', '2', '--metrics', 'm.json'], '--metrics does not apply'),
    (['--temperature', '0'], '--temperature: must be > 0'),
    (['--lr', 'nan'], '--lr: must be > 0'),
    (['--quiet', '--verbose'], 'not allowed with argument'),
])
def test_bad_arguments_are_usage_errors(argv, message):
    status, out, err = run_main(argv)
    assert status == 2
    assert message in err and err.startswith('usage: microgpt_train.py'), err


def test_the_script_exits_2_on_bad_arguments():
    r = subprocess.run([sys.executable, str(SCRIPT), '--n-embd', '6', '--n-head', '4'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'is not divisible by --n-head' in r.stderr


def test_an_unwritable_metrics_path_fails_before_any_work(tmp_path):
    status, out, err = run_main([*TINY, '--metrics', tmp_path / 'no' / 'such' / 'm.json'])
    assert status == 1
    assert err.startswith('error: --metrics') and 'does not exist' in err
    assert 'compiled' not in out


def test_a_names_file_without_names_is_an_error(tmp_path):
    empty = tmp_path / 'names.txt'
    empty.write_text('\n  \n')
    status, out, err = run_main([*TINY, '--data', empty])
    assert status == 1 and 'holds no names' in err


def test_sigterm_stops_after_the_step_and_still_writes_the_metrics(tmp_path):
    """SIGTERM once a step has printed: exit 143, the metrics say where it stopped."""
    path = tmp_path / 'metrics.json'
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *TINY, '--interpreter', '--steps', '5000',
                             '--metrics', str(path), '-v'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith('step '):
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert 'interrupted by SIGTERM after step' in err
    report = json.loads(path.read_text())
    assert report['stopped'] == 'interrupted' and 1 <= report['steps'] < 5000
    assert report['samples'] == []


def test_a_diverging_run_exits_1_without_samples(tmp_path):
    path = tmp_path / 'metrics.json'
    status, out, err = run_main([*TINY, '--lr', '1e300', '--steps', '50', '--metrics', path])
    assert status == 1
    assert 'diverged at step' in err and 'samples' not in out
    report = json.loads(path.read_text())
    assert report['stopped'] == 'diverged' and report['steps'] < 50 and report['samples'] == []


# ---- issue 21: divergence with finite numbers, files, threads, numpy -------------------

def test_a_huge_rate_with_finite_losses_is_divergence_and_exits_1(tmp_path):
    """--lr 1e6: the loss reaches 1e21 without becoming inf; the help's promise holds."""
    path = tmp_path / 'metrics.json'
    status, out, err = run_main([*TINY, '--lr', '1e6', '--steps', '30', '--metrics', path])
    assert status == 1, out + err
    assert 'diverged at step' in err and "times guessing's" in err, err
    assert 'samples' not in out
    report = json.loads(path.read_text())
    assert report['stopped'] == 'diverged' and report['samples'] == []
    assert max(report['losses'], default=0) <= 100 * math.log(report['config']['vocab_size'])


@pytest.mark.parametrize('content, words', [
    (bytes(range(256)) * 4, 'is not a text file of names: byte 128 is not UTF-8'),
    (b'ann\x00\x01\x02\nbob\n', "is not a text file of names: it holds the control character '\\x00'"),
])
def test_a_binary_data_file_is_named(tmp_path, content, words):
    path = tmp_path / 'names.bin'
    path.write_bytes(content)
    status, out, err = run_main([*TINY, '--data', path])
    assert status == 1 and err == f'error: {path} {words}\n', err


@pytest.mark.parametrize('value, words', [('abc', "must be a whole number of threads, not 'abc'"),
                                          ('0', "must be at least 1, not '0'")])
def test_a_bad_micrograd_threads_is_refused_before_tracing(value, words):
    env = dict(os.environ, MICROGRAD_THREADS=value)
    r = subprocess.run([sys.executable, str(SCRIPT), *TINY, '--steps', '3'], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 1 and 'Traceback' not in r.stderr, r.stderr
    assert r.stderr == f"error: MICROGRAD_THREADS {words}\n"
    assert 'compiling' not in r.stdout


def test_without_numpy_the_script_says_how_to_set_up_in_one_line():
    from tests.test_mnist_train_options import SETUP, without_numpy
    r = without_numpy(SCRIPT)
    assert r.returncode == 1 and r.stdout == ''
    assert r.stderr == f"microgpt_train.py needs numpy; set up with: {SETUP}\n"
