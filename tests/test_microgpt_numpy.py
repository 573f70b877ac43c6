"""``benchmarks/microgpt_numpy.py``, the numpy port that ``bench_microgpt.py``
times against ours: the same model, so the same loss and gradients as the
interpreter (to 1e-10 relative: its sums run in other orders), Adam with
``compiler.Adam``'s bits on the same gradients, training that tracks the
compiled model's, and a comparison that catches a wrong gradient.
"""
import importlib.util
import math
import random
from pathlib import Path

import numpy as np
import pytest

import microgpt_train as gpt
from compiler import Adam
from microgpt import Config, init_weights, matrix_shapes, positions_of, sequence_graph, value_weights
from tests.differential import FAST_CC

PORT = Path(__file__).resolve().parent.parent / 'benchmarks' / 'microgpt_numpy.py'
RTOL = 1e-10
FLOOR = 1e-3        # of a matrix's largest gradient: below it an element counts as near 0


def load_port():
    spec = importlib.util.spec_from_file_location('microgpt_numpy', PORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


port = load_port()
NAMES, TOKENIZER, DEFAULT, WEIGHTS, _ = gpt.prepare(gpt.load_names(), 42)
# two layers, two heads, a block of 6 (longer names are cut), its own weights
SMALL = Config(DEFAULT.vocab_size, n_embd=8, n_layer=2, n_head=2, block_size=6)
SMALL_WEIGHTS = init_weights(SMALL, random.Random(7))


def interpreter_loss_and_grad(config, weights, tokens):
    """The interpreter's mean loss over the name's positions and ``d loss / d p``
    for every parameter (``InterpreterGPT.train_step``'s graph), with the labels."""
    sd, params = value_weights(weights)
    n = positions_of(tokens, config)
    loss = (1 / n) * sum(sequence_graph(sd, config, n, tokens).losses)
    loss.backward()
    return loss.data, np.array([p.grad for p in params]), [p.label for p in params]


def worst_mismatch(config, ours, theirs, labels):
    """``(error, label)`` of the gradient furthest from the interpreter's:
    ``|ours - theirs| / max(|theirs|, FLOOR * the matrix's largest |theirs|)``."""
    worst, offset = (0.0, None), 0
    for _, rows, cols in matrix_shapes(config):
        a, b = ours[offset:offset + rows * cols], theirs[offset:offset + rows * cols]
        error = np.abs(a - b) / np.maximum(np.abs(b), FLOOR * np.abs(b).max() or 1e-300)
        i = int(np.argmax(error))
        if error[i] > worst[0]:
            worst = (float(error[i]), labels[offset + i])
        offset += rows * cols
    return worst


def port_loss_and_grad(config, weights, tokens):
    model = port.NumpyGPT(config, weights, 1e-2)
    return model.loss_and_grad(tokens), model.grad.copy()


CASES = [(DEFAULT, WEIGHTS, NAMES[0]), (DEFAULT, WEIGHTS, 'anna'),             # a token twice: wte rows add up
         (DEFAULT, WEIGHTS, 'christopheralexander'),                               # 21 tokens: the 16-position block
         (DEFAULT, WEIGHTS, 'x'), (SMALL, SMALL_WEIGHTS, 'annabelle'), (SMALL, SMALL_WEIGHTS, 'bo')]


@pytest.mark.parametrize('config, weights, name', CASES,
                         ids=[f'{c.n_embd}-{c.n_layer}-{c.n_head}-{name}' for c, _, name in CASES])
def test_loss_and_every_gradient_match_the_interpreter(config, weights, name):
    tokens = TOKENIZER.encode(name)
    loss, grad, labels = interpreter_loss_and_grad(config, weights, tokens)
    our_loss, our_grad = port_loss_and_grad(config, weights, tokens)
    assert abs(our_loss - loss) <= RTOL * abs(loss), (our_loss, loss)
    error, where = worst_mismatch(config, our_grad, grad, labels)
    assert error <= RTOL, f"gradient of {where} off by {error:.1e} relative"
    assert np.count_nonzero(grad) > len(grad) // 4          # the comparison is not of zeros


def test_a_gradient_one_part_in_1e8_off_is_caught():
    tokens = TOKENIZER.encode('anna')
    _, grad, labels = interpreter_loss_and_grad(SMALL, SMALL_WEIGHTS, tokens)
    _, ours = port_loss_and_grad(SMALL, SMALL_WEIGHTS, tokens)
    i = labels.index('layer1.attn_wk[3][5]')
    assert grad[i] != 0
    ours[i] *= 1 + 1e-8
    error, where = worst_mismatch(SMALL, ours, grad, labels)
    assert where == 'layer1.attn_wk[3][5]' and 0.5e-8 < error < 2e-8


def test_a_wrong_derivative_is_caught(monkeypatch):
    """rmsnorm's backward taking the scale as a constant (a classic slip) is found."""
    monkeypatch.setattr(port, 'rmsnorm_backward', lambda x, s, dy: s * dy)
    tokens = TOKENIZER.encode('anna')
    _, grad, labels = interpreter_loss_and_grad(SMALL, SMALL_WEIGHTS, tokens)
    _, ours = port_loss_and_grad(SMALL, SMALL_WEIGHTS, tokens)
    error, where = worst_mismatch(SMALL, ours, grad, labels)
    assert error > 1e-3, where


def test_adam_gives_reference_steps_bits(monkeypatch):
    """On the same gradients, three steps at decaying rates, in blocks with a
    remainder: every parameter and state number is ``reference_step``'s."""
    monkeypatch.setattr(port, 'ADAM_BLOCK', 100)
    model = port.NumpyGPT(SMALL, SMALL_WEIGHTS, 1e-2)
    n = len(model.flat)
    assert n % 100
    rng = np.random.default_rng(3)
    p, state = model.params(), [0.0, [0.0] * n, [0.0] * n]
    reference = Adam(1e-2, betas=gpt.BETAS, eps=gpt.ADAM_EPS)
    for step in range(3):
        g = rng.normal(size=n) * 10.0 ** rng.integers(-12, 2, size=n)
        g[:5] = 0.0
        lr = gpt.learning_rate(1e-2, step, 10)
        model.grad[:] = g
        model.adam_step(lr)
        reference.reference_step(p, g.tolist(), state, lr)
    assert model.params() == p
    assert model.optimizer_state() == [state[0], *state[1], *state[2]]


def test_adam_differs_when_the_rate_does():
    model = port.NumpyGPT(SMALL, SMALL_WEIGHTS, 1e-2)
    other = port.NumpyGPT(SMALL, SMALL_WEIGHTS, 1e-2)
    model.grad[:] = other.grad[:] = 1.0
    model.adam_step(1e-2)
    other.adam_step(math.nextafter(1e-2, 1))
    assert model.params() != other.params()


@pytest.mark.skipif(FAST_CC is None, reason='no C compiler installed')
def test_training_tracks_the_compiled_model():
    """Five steps of the 1,000-step schedule from the same weights: the same
    losses to 1e-12 relative, the parameters within 1e-9, then the same logits."""
    steps, limit, lr = 1000, 5, 1e-2
    compiled = gpt.CompiledGPT(SMALL, SMALL_WEIGHTS, lr, cc=FAST_CC)
    ours = gpt.train(compiled, NAMES, TOKENIZER, SMALL, steps, lr, limit=limit)
    model = port.NumpyGPT(SMALL, SMALL_WEIGHTS, lr)
    theirs = gpt.train(model, NAMES, TOKENIZER, SMALL, steps, lr, limit=limit)
    assert len(ours.losses) == len(theirs.losses) == limit
    for a, b in zip(ours.losses, theirs.losses):
        assert abs(a - b) <= 1e-12 * abs(a), (a, b)
    assert np.abs(np.array(compiled.params()) - model.flat).max() < 1e-9
    assert ours.losses[-1] != ours.losses[0]        # it trained
    tokens = TOKENIZER.encode('emma')[:4]           # sampling's next-token logits too
    assert np.allclose(model.next_logits(tokens), compiled.next_logits(tokens), rtol=1e-9, atol=1e-12)
