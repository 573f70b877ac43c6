"""``--load`` of damaged and foreign files, networks without a hidden layer,
and weights that never give a finite loss."""
import io
import json
import pickle

import numpy as np
import pytest

import mnist_train
from tests.test_mnist_train import TCC, run_main

SIZES = [784, 50, 10]
N_PARAMS = 785 * 50 + 51 * 10


def good_file_bytes():
    buffer = io.BytesIO()
    np.savez(buffer, params=np.random.default_rng(0).normal(0, 0.05, N_PARAMS), layer_sizes=np.asarray(SIZES))
    return buffer.getvalue()


def npz_bytes(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def npy_bytes(array, allow_pickle=False):
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def flipped(data, at):
    data = bytearray(data)
    data[at] ^= 0xFF
    return bytes(data)


GOOD = good_file_bytes()
DAMAGED = {
    'empty': (b'', 'it is empty'),
    'truncated': (GOOD[:len(GOOD) // 2], 'or it is damaged'),
    'bit-flipped data': (flipped(GOOD, len(GOOD) // 2), 'or it is damaged (Bad CRC-32'),
    'bit-flipped zip directory': (flipped(GOOD, len(GOOD) - 30), 'or it is damaged'),
    '.npy': (npy_bytes(np.zeros(N_PARAMS)), 'it holds a single array (.npy)'),
    'pickled .npy': (npy_bytes(np.array([{'a': 1}], dtype=object), allow_pickle=True), 'or it is damaged'),
    'pickle': (pickle.dumps({'params': [0.0] * 10}), 'it is neither an .npz nor an .npy file'),
    'text': (b'hello, world\n', 'it is neither an .npz nor an .npy file'),
    'other .npz': (npz_bytes(something=np.zeros(3)), "or it is damaged ('params is not a file"),
    'object params': (npz_bytes(params=np.array([None] * 3), layer_sizes=np.asarray(SIZES)),
                      'or it is damaged'),
    'text layer sizes': (npz_bytes(params=np.zeros(N_PARAMS), layer_sizes=np.array(['784', '10'])),
                         'its layer_sizes are'),
    'integer params': (npz_bytes(params=np.zeros(N_PARAMS, dtype=int), layer_sizes=np.asarray(SIZES)),
                       'int64 parameters'),
    'NaN params': (npz_bytes(params=np.full(N_PARAMS, np.nan), layer_sizes=np.asarray(SIZES)),
                   f'{N_PARAMS} of its parameters are not finite'),
}


@pytest.mark.parametrize('kind', DAMAGED)
def test_loading_a_damaged_or_foreign_file_is_one_line_and_before_any_work(tmp_path, kind):
    data, phrase = DAMAGED[kind]
    path = tmp_path / 'weights.npz'
    path.write_bytes(data)
    status, out, err = run_main([*TCC, '--load', path])
    assert status == 1
    assert out == '', 'the file should be refused before loading data or compiling'
    assert err.startswith(f'error: {path}') and err.count('\n') == 1, err
    assert phrase in err, err


@pytest.mark.parametrize('name, phrase', [('missing.npz', 'No such file or directory'),
                                          ('.', 'Is a directory')])
def test_loading_a_path_that_is_no_file_is_one_line(tmp_path, name, phrase):
    status, out, err = run_main([*TCC, '--load', tmp_path / name])
    assert status == 1 and out == ''
    assert err.startswith('error: cannot read ') and err.count('\n') == 1 and phrase in err, err


def test_every_single_byte_corruption_is_refused_or_harmless(tmp_path):
    """Flip each byte of a small weights file in turn: load_weights must
    return the saved numbers exactly or raise WeightsError, nothing else."""
    path = tmp_path / 'small.npz'
    params = np.arange(9, dtype=float) / 8
    mnist_train.save_weights(path, params, [2, 3])
    data = path.read_bytes()
    refused = 0
    for at in range(len(data)):
        path.write_bytes(flipped(data, at))
        try:
            np.testing.assert_array_equal(mnist_train.load_weights(path, [2, 3]), params)
        except mnist_train.WeightsError as e:
            assert '\n' not in str(e)
            refused += 1
    assert refused > len(data) // 2


@pytest.fixture(scope='module')
def no_hidden_weights(tmp_path_factory):
    """A saved 784-10 network."""
    path = tmp_path_factory.mktemp('no_hidden') / 'weights.npz'
    mnist_train.save_weights(path, np.random.default_rng(0).normal(0, 0.05, 785 * 10), [784, 10])
    return path


def test_the_hint_for_a_saved_network_without_hidden_layer_works(no_hidden_weights):
    status, out, err = run_main([*TCC, '--load', no_hidden_weights])
    assert status == 1
    assert err == (f'error: {no_hidden_weights} holds a 784-10 network, but this run builds 784-50-10; '
                   f'pass --hidden none to use it\n')
    status, out, err = run_main([*TCC, '--load', no_hidden_weights, '--hidden', 'none', '--epochs', '0'])
    assert status == 0, err
    assert 'model: 784-10 MLP, 7,850 parameters' in out
    assert f'loaded weights from {no_hidden_weights}' in out


@pytest.mark.parametrize('text', ['none', 'None', ''])
def test_hidden_none_or_empty_means_no_hidden_layer(text):
    assert mnist_train.parse_args(['--hidden', text]).hidden == []


def test_weights_that_never_give_a_finite_loss_are_reported_as_such(tmp_path):
    huge, save, metrics = tmp_path / 'huge.npz', tmp_path / 'out.npz', tmp_path / 'metrics.json'
    mnist_train.save_weights(huge, np.full(N_PARAMS, 1e300), SIZES)
    status, out, err = run_main([*TCC, '--load', huge, '--limit', '100', '--epochs', '1',
                                 '--save', save, '--metrics', metrics])
    assert status == 1
    assert ('diverged at epoch 1, batch 1 of 4: the loss is nan with the starting weights, before any '
            'update: no weights gave a finite loss; the model keeps the ones it started from') in err
    assert 'last weights that gave a finite loss' not in err
    assert 'learning rate' not in err, 'no update happened: the learning rate is not the cause'
    np.testing.assert_array_equal(mnist_train.load_weights(save, SIZES), np.full(N_PARAMS, 1e300))
    report = json.loads(metrics.read_text())
    assert report['divergence'] == {'epoch': 1, 'batch': 1, 'reason': 'the loss is nan'}
    assert report['batch_losses'] == [] and report['history'] == []
