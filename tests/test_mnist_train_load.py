"""``--load`` of damaged and foreign files, networks without a hidden layer,
and weights that never give a finite loss."""
import io
import json
import pickle

import numpy as np
import pytest

import compiler
import mnist_train
from micrograd import Value, nn
from tests.test_mnist_train import TCC, run_main, saved_params, write_weights

SIZES = [784, 50, 10]
N_PARAMS = 785 * 50 + 51 * 10


@pytest.fixture(scope='module')
def good(tmp_path_factory):
    """The bytes of a weights file as --save writes it."""
    path = tmp_path_factory.mktemp('good') / 'weights.npz'
    write_weights(path, np.random.default_rng(0).normal(0, 0.05, N_PARAMS))
    return path.read_bytes()


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


def changed(**arrays):
    """The good file with some arrays replaced (``None``: removed)."""
    def make(good):
        saved = dict(np.load(io.BytesIO(good)))
        saved.update(arrays)
        return npz_bytes(**{key: value for key, value in saved.items() if value is not None})
    return make


DAMAGED = {     # how to make it from the good file's bytes, a phrase of its error
    'empty': (lambda good: b'', 'it is empty'),
    'truncated': (lambda good: good[:len(good) // 2], 'not a readable weights file (BadZipFile'),
    'bit-flipped data': (lambda good: flipped(good, len(good) // 2), 'not a readable weights file '
                                                                     '(BadZipFile: Bad CRC-32'),
    'bit-flipped zip directory': (lambda good: flipped(good, len(good) - 30), 'not a readable weights file'),
    '.npy': (lambda good: npy_bytes(np.zeros(N_PARAMS)), 'it holds a single array (.npy)'),
    'pickled .npy': (lambda good: npy_bytes(np.array([{'a': 1}], dtype=object), allow_pickle=True),
                     'it holds a single array (.npy)'),
    'pickle': (lambda good: pickle.dumps({'params': [0.0] * 10}), 'it is neither an .npz nor an .npy file'),
    'text': (lambda good: b'hello, world\n', 'it is neither an .npz nor an .npy file'),
    'other .npz': (lambda good: npz_bytes(something=np.zeros(3)),
                   'not a weights file written by save_weights (no format, params, graph_hash)'),
    'an earlier mnist_train.py file': (lambda good: npz_bytes(params=np.zeros(N_PARAMS), layer_sizes=SIZES),
                                       'not a weights file written by save_weights (no format, graph_hash)'),
    'another format': (changed(format=np.array(2)), 'weights format array(2), this version reads 1'),
    'object params': (changed(params=np.array([None] * 3)), 'not a readable weights file (ValueError: '
                                                            'Object arrays cannot be loaded'),
    'no layer sizes': (changed(meta_layer_sizes=None), 'it has no layer sizes (meta_layer_sizes)'),
    'text layer sizes': (changed(meta_layer_sizes=np.array(['784', '10'])), 'its layer sizes are'),
    'integer params': (changed(params=np.zeros(N_PARAMS, dtype=int)), 'int64 parameters'),
    'NaN params': (changed(params=np.full(N_PARAMS, np.nan)), f'{N_PARAMS} of its parameters are not finite'),
    'NaN optimizer state': (changed(optimizer_state=np.array([np.nan])), 'its optimizer state is not finite'),
}


@pytest.mark.parametrize('kind', DAMAGED)
def test_loading_a_damaged_or_foreign_file_is_one_line_and_before_any_work(tmp_path, good, kind):
    make, phrase = DAMAGED[kind]
    path = tmp_path / 'weights.npz'
    path.write_bytes(make(good))
    status, out, err = run_main([*TCC, '--load', path])
    assert status == 1
    assert out == '', 'the file should be refused before loading data or compiling'
    assert err.startswith(f'error: {path}') and err.count('\n') == 1, err
    assert phrase in err, err


@pytest.mark.parametrize('name, phrase', [('missing.npz', ': no such file'),
                                          ('.', 'cannot read {path}: Is a directory')])
def test_loading_a_path_that_is_no_file_is_one_line(tmp_path, name, phrase):
    status, out, err = run_main([*TCC, '--load', tmp_path / name])
    assert status == 1 and out == ''
    assert err.startswith('error: ') and err.count('\n') == 1, err
    assert phrase.format(path=tmp_path / name) in err, err


def test_every_single_byte_corruption_is_refused_or_harmless(tmp_path):
    """Flip each byte of a small weights file in turn: reading it as --load
    does, then loading it into the model, must give the saved numbers
    exactly or raise a one-line WeightsError, nothing else."""
    mlp = nn.MLP(2, [3], seed=0)            # sizes 2-3: 9 parameters
    xs = [Value(0.0), Value(0.0)]
    logits = mlp(xs)
    model = compiler.compile(sum(logits), inputs=xs, params=mlp.parameters(), outputs=logits, cc='tcc')
    params = np.arange(9, dtype=float) / 8
    model.set_params(params)
    path = tmp_path / 'small.npz'
    mnist_train.save_weights(model, path, [2, 3])
    data = path.read_bytes()
    refused = 0
    for at in range(len(data)):
        path.write_bytes(flipped(data, at))
        model.set_params(np.zeros(9))
        try:
            saved = mnist_train.read_weights(path, [2, 3])
            np.testing.assert_array_equal(saved['params'], params)
            mnist_train.load_saved(model, path, saved, 'sgd')
            np.testing.assert_array_equal(model.params(), params)
        except compiler.weights.WeightsError as e:
            assert '\n' not in str(e)
            refused += 1
    assert refused > len(data) // 2


@pytest.fixture(scope='module')
def no_hidden_weights(tmp_path_factory):
    """A saved 784-10 network."""
    path = tmp_path_factory.mktemp('no_hidden') / 'weights.npz'
    write_weights(path, np.random.default_rng(0).normal(0, 0.05, 785 * 10), hidden=())
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
    write_weights(huge, np.full(N_PARAMS, 1e300))
    status, out, err = run_main([*TCC, '--load', huge, '--limit', '100', '--epochs', '1',
                                 '--save', save, '--metrics', metrics])
    assert status == 1
    assert ('diverged at epoch 1, batch 1 of 4: the loss is nan with the starting weights, before any '
            'update: no weights gave a finite loss; the model keeps the ones it started from') in err
    assert 'last weights that gave a finite loss' not in err
    assert 'learning rate' not in err, 'no update happened: the learning rate is not the cause'
    np.testing.assert_array_equal(saved_params(save), np.full(N_PARAMS, 1e300))
    report = json.loads(metrics.read_text())
    assert report['divergence'] == {'epoch': 1, 'batch': 1, 'reason': 'the loss is nan'}
    assert report['batch_losses'] == [] and report['history'] == []
