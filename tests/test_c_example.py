"""examples/mnist_c/main.c, built with one cc line against an exported
MNIST model (784-50-10) by every installed compiler, with and without
threads: its predictions, the loss of a row and the loss after one step on
it are the Python module's bits."""
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import compiler
import mnist_data
from tests.differential import COMPILERS

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / 'examples' / 'mnist_c' / 'main.c'
LR = 0.1            # main.c's LR


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    """The compiled model, its export folder and five test rows in a float64 file."""
    if 'gcc' not in COMPILERS:
        pytest.skip('gcc is not installed')
    graph = mnist_data.mnist_graph([50], seed=0)
    m = compiler.compile(graph.loss, inputs=graph.inputs, params=graph.params, outputs=graph.logits, cc='gcc')
    images, labels = mnist_data.load_embedded()['test']
    rows = mnist_data.input_rows(images[:5], labels[:5])
    folder = tmp_path_factory.mktemp('mnist_c')
    m.export(folder / 'model')
    rows.astype('=f8').tofile(folder / 'digits.f64')
    return m, folder, rows


def run_example(folder, cc, threads):
    """Build main.c with nn.c of the export (one cc line, no Python headers) and run it on digits.f64."""
    work = folder / f'{cc}-{"threads" if threads else "one"}'
    work.mkdir()
    for name in ('nn.c', 'nn.h'):
        shutil.copy(folder / 'model' / name, work)
    shutil.copy(EXAMPLE, work)
    command = [shutil.which(cc), '-O2', *([] if threads else ['-DNN_NO_THREADS']), 'main.c', 'nn.c', '-lm',
               *(['-lpthread'] if threads else [])]
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    run = subprocess.run([str(work / 'a.out'), str(folder / 'digits.f64')], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


@pytest.mark.parametrize('threads', [True, False], ids=['threads', 'no-threads'])
@pytest.mark.parametrize('cc', COMPILERS)
def test_the_c_example_predicts_and_trains_to_the_modules_bits(exported, cc, threads):
    m, folder, rows = exported
    lines = run_example(folder, cc, threads)
    assert len(lines) == len(rows) + 2, lines
    logits = m.predict(rows)
    labels = rows[:, mnist_data.N_PIXELS:].argmax(axis=1)
    for r, line in enumerate(lines[:len(rows)]):
        head, numbers = line.split(', logits ')
        assert head == f'row {r}: label {labels[r]}, predicted {logits[r].argmax()}'
        assert [float(v) for v in numbers.split()] == list(logits[r]), r
    before = m.params()
    try:
        m.set_input(rows[0])
        loss = m.forward()
        m.zero_grad()
        m.backward()
        m.update(LR)
        after = m.forward()
    finally:
        m.set_params(before)      # the fixture's model is shared
    assert float(lines[-2].split(': ')[1]) == loss
    assert float(lines[-1].split(': ')[1]) == after and after != loss


def test_the_c_example_says_what_is_wrong_with_its_file(exported, tmp_path):
    m, folder, rows = exported
    (folder / 'short.f64').write_bytes(b'\0' * 12)
    work = folder / 'errors'
    work.mkdir()
    for name in ('nn.c', 'nn.h'):
        shutil.copy(folder / 'model' / name, work)
    shutil.copy(EXAMPLE, work)
    done = subprocess.run([shutil.which(COMPILERS[0]), '-DNN_NO_THREADS', 'main.c', 'nn.c', '-lm'], cwd=work,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    run = subprocess.run([str(work / 'a.out'), str(folder / 'short.f64')], capture_output=True, text=True)
    assert run.returncode == 1 and 'not rows of 794 float64 values' in run.stderr
    run = subprocess.run([str(work / 'a.out')], capture_output=True, text=True)
    assert run.returncode == 2 and 'usage' in run.stderr
