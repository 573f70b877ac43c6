"""The LeNet of ``mnist_data.lenet_graph``: its shape and parameter order,
its compiled loss and gradients against the interpreter (the real LeNet with
tcc, its convolutions lifted into two ``Conv`` ops; a small LeNet with every
compiler), ``mnist_train.py
--model lenet`` end to end with --save, --load and --export, the refusal of
another model's weights file, and ``benchmarks/bench_conv.py --quick``."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import compiler.weights
import mnist_data
import mnist_train
from micrograd import Value, cross_entropy
from micrograd.nn import Conv2d, Layer
from mnist_data.model import IMAGE_SIZE, LENET_CHANNELS, LENET_HIDDEN, ModelSpec, lenet
from tests.differential import (COMPILERS, FAST_CC, assert_matches_interpreter,
                                assert_train_batch_matches_interpreter, needs_cc)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT, BENCH = ROOT / 'mnist_train.py', ROOT / 'benchmarks' / 'bench_conv.py'
SMALL = {'channels': (2, 3), 'hidden': (8,)}


def adopt(model, params):
    """Make ``model`` use the Values ``params``, taken in the documented
    parameter order (per conv output channel: weights, bias; per neuron:
    weights, bias)."""
    it = iter(params)
    for m in model.modules:
        if isinstance(m, Conv2d):
            for o in range(m.out_channels):
                m.w[o] = [next(it) for _ in m.w[o]]
                m.b[o] = next(it)
        elif isinstance(m, Layer):
            for n in m.neurons:
                n.w = [next(it) for _ in n.w]
                n.b = next(it)
    assert next(it, None) is None, "more parameters than the model has"
    return model


def lenet_build(channels, hidden):
    def build(inputs, params):
        model = adopt(lenet(channels, hidden), params)
        assert all(p is q for p, q in zip(model.parameters(), params))     # the documented order
        pixels = inputs[:IMAGE_SIZE * IMAGE_SIZE]
        image = [[pixels[r * IMAGE_SIZE:(r + 1) * IMAGE_SIZE] for r in range(IMAGE_SIZE)]]
        logits = model(image)
        return cross_entropy(logits, inputs[IMAGE_SIZE * IMAGE_SIZE:]), logits
    return build


def rows(n, start=0):
    images, labels = mnist_data.load_embedded()['train']
    return mnist_data.input_rows(images[start:start + n], labels[start:start + n])


def initial(channels, hidden, seed=0):
    return [p.data for p in lenet(channels, hidden, seed).parameters()]


# -- the graph -------------------------------------------------------------------------

@pytest.mark.parametrize('spec', [ModelSpec('lenet'), ModelSpec('lenet', (16,), (2, 4)), ModelSpec('mlp'),
                                  ModelSpec('mlp', (128, 64))])
def test_a_model_spec_knows_its_sizes_and_parameter_count_before_the_graph(spec):
    graph = spec.graph(seed=1)
    assert len(graph.params) == spec.n_params
    assert graph.sizes == spec.sizes
    assert graph.description == spec.description
    assert len(graph.inputs) == 794 and len(graph.logits) == 10


def test_the_lenet_is_lenet_5_shaped():
    spec = ModelSpec('lenet')
    assert spec.sizes == [256, 120, 84, 10]
    assert spec.n_params == 6 * 26 + 16 * 151 + 257 * 120 + 121 * 84 + 85 * 10 == 44_426
    assert spec.description == 'LeNet (conv 5x5x6, max-pool 2, conv 5x5x16, max-pool 2; 256-120-84-10)'
    with pytest.raises(ValueError, match='model must be one of mlp, lenet'):
        ModelSpec('resnet')


def test_lenet_graph_row_sets_the_interpreters_inputs():
    row = rows(1)[0]
    graph = mnist_data.lenet_graph(row=row, **SMALL)
    loss, _ = lenet_build(**SMALL)([Value(x) for x in row], [Value(p) for p in initial(**SMALL)])
    assert graph.loss.data == loss.data
    assert [v.data for v in graph.inputs] == row.tolist()


# -- compiled against the interpreter ----------------------------------------------------

@needs_cc
def test_the_real_lenet_compiles_to_the_interpreters_loss_and_gradients():
    """One image through the full LeNet: the loss, the logits and all 44,426
    parameter gradients, bit for bit (tcc, the quickest build: ~15 s)."""
    build = lenet_build(LENET_CHANNELS, LENET_HIDDEN)
    model = assert_matches_interpreter(build, [rows(1, start=7)[0].tolist()], initial(LENET_CHANNELS, LENET_HIDDEN),
                                       FAST_CC)
    assert model.n_params == 44_426
    # the ReLUs and max-pools of the convs are loops, not thousands of
    # straight-line selects (clang took minutes on those at -O2)
    from compiler.ir import Conv, Loop, Op
    ops = model.program.ops
    assert sum(type(op) is Conv for op in ops) == 2
    looped = sum(op.n * len(op.body) for op in ops if type(op) is Loop)
    straight = sum(type(op) is Op and op.name in ('relu', 'max') for op in ops)
    assert looped >= 6 * 24 * 24 + 16 * 8 * 8 + 3 * (6 * 12 * 12 + 16 * 4 * 4) and straight < 20


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_small_lenet_compiles_to_the_interpreters_bits(cc):
    assert_matches_interpreter(lenet_build(**SMALL), rows(2).tolist(), initial(**SMALL, seed=3), cc)


@needs_cc
@pytest.mark.parametrize('vectorize', [True, False])
def test_a_small_lenet_is_exact_with_and_without_the_vectorizing_pass(vectorize):
    assert_matches_interpreter(lenet_build(**SMALL), rows(2, start=9).tolist(), initial(**SMALL, seed=5), FAST_CC,
                               vectorize=vectorize)


@needs_cc
def test_a_small_lenet_trains_to_the_interpreters_bits_at_any_thread_count():
    X = rows(3, start=20)
    for threads in (1, 2, 3):
        assert_train_batch_matches_interpreter(lenet_build(**SMALL), X, initial(**SMALL, seed=4), 0.1,
                                               FAST_CC, steps=2, threads=threads)


# -- mnist_train.py --model lenet -----------------------------------------------------------

def script(*argv, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope='module')
def lenet_run(tmp_path_factory):
    """One real ``--model lenet`` run with --save, --metrics and --export."""
    folder = tmp_path_factory.mktemp('lenet')
    r = script('--model', 'lenet', '--limit', '200', '--epochs', '1', '--cc', 'tcc', '--save',
               folder / 'w.npz', '--metrics', folder / 'm.json', '--export', folder / 'export')
    # 200 images are 7 steps: the accuracy may still be near chance (exit status 1, "collapsed")
    assert r.returncode in (0, 1), r.stderr
    assert r.returncode == 0 or 'training collapsed' in r.stderr, r.stderr
    return folder, r


def test_mnist_train_model_lenet_trains_saves_and_exports(lenet_run):
    folder, r = lenet_run
    assert 'model: LeNet (conv 5x5x6, max-pool 2, conv 5x5x16, max-pool 2; 256-120-84-10), 44,426 parameters' \
        in r.stdout
    saved = compiler.weights.read(folder / 'w.npz')
    assert str(saved['meta_model']) == 'lenet' and saved['meta_layer_sizes'].tolist() == [256, 120, 84, 10]
    report = json.loads((folder / 'm.json').read_text())
    assert report['model'] == 'lenet' and report['params'] == 44_426
    code = ("import array, sys; sys.path.insert(0, sys.argv[1]); import nn; "
            "buf = array.array('d', bytes(8 * nn.n_params)); nn.read_params(buf); print(buf.tobytes().hex())")
    exported = subprocess.run([sys.executable, '-c', code, str(folder / 'export')], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    assert exported.returncode == 0, exported.stderr
    # the exported module holds the trained weights, the ones --save wrote
    assert bytes.fromhex(exported.stdout.strip()) == saved['params'].astype('<f8').tobytes()


def test_mnist_train_model_lenet_loads_its_weights(lenet_run):
    folder, first = lenet_run
    r = script('--model', 'lenet', '--load', folder / 'w.npz', '--epochs', '0', '--limit', '100', '--cc', 'tcc')
    assert r.returncode == 0, r.stderr
    assert f"loaded weights from {folder / 'w.npz'}" in r.stdout
    trained = json.loads((folder / 'm.json').read_text())['history'][-1]
    assert f"test acc {trained['test_accuracy']:.4f}" in r.stdout.splitlines()[-1]


def test_a_lenet_weights_file_is_refused_for_the_mlp_and_the_reverse(lenet_run, tmp_path):
    folder, _ = lenet_run
    r = script('--load', folder / 'w.npz', '--epochs', '0', '--cc', 'tcc')
    assert r.returncode == 1
    assert (f"{folder / 'w.npz'} holds a --model lenet network, but this run builds --model mlp; "
            f"pass --model lenet to use it") in r.stderr
    mlp = mnist_train.build_model([50], cc='tcc')
    mnist_train.save_weights(mlp, tmp_path / 'mlp.npz', [784, 50, 10])
    r = script('--model', 'lenet', '--load', tmp_path / 'mlp.npz', '--epochs', '0', '--cc', 'tcc')
    assert r.returncode == 1
    assert "holds a --model mlp network, but this run builds --model lenet; pass --model mlp" in r.stderr
    assert 'compiled' not in r.stdout       # refused before any work


def test_an_older_weights_file_without_a_model_is_an_mlp(tmp_path):
    mlp = mnist_train.build_model([50], cc='tcc')
    mlp.save_weights(tmp_path / 'old.npz', metadata={'layer_sizes': [784, 50, 10], 'optimizer': 'sgd'})
    assert mnist_train.read_weights(tmp_path / 'old.npz', [784, 50, 10])['params'].shape == (39_760,)
    with pytest.raises(compiler.weights.WeightsError, match='holds a --model mlp network'):
        mnist_train.read_weights(tmp_path / 'old.npz', [256, 120, 84, 10], 'lenet', 44_426)


# -- benchmarks/bench_conv.py ---------------------------------------------------------------

def test_bench_conv_quick_checks_and_reports(tmp_path):
    out = tmp_path / 'conv.json'
    r = subprocess.run([sys.executable, str(BENCH), '--quick', '--threads', '2', '--json', str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert 'checks: all passed' in r.stdout
    report = json.loads(out.read_text())
    systems = {(row['system'], row['threads']) for row in report['rows']}
    assert {('tcc', 1), ('tcc', 2)} <= systems
    for row in report['rows']:
        assert row['loss0_ok'] and row['train_images_per_s'] > 0 and row['s_per_epoch'] > 0
        if row['system'] == 'tcc':
            assert row['loss0'] == report['interpreter']['loss0'] and row['compile_s'] > 0
            # the quick LeNet is 45,543 ops after vectorize; its two convs lifted, 2,537
            assert 0 < row['ops'] < 5_000 and row['c_lines'] > row['ops']
