"""``backward_step()``: ``backward()`` then ``step()`` in one call, the step
of each weight matrix that only its ``MatMat`` reads begun on the helper
threads while the rest of the backward runs. Every number must be the
two calls' bits, with a regulariser on one matrix (which then waits for
the whole backward), at every thread count and with every compiler."""
import os
import random

import numpy as np
import pytest

import compiler
from microgpt import init_weights, sequence_graph, value_weights

from tests.differential import COMPILERS, FAST_CC, needs_cc, split_flags
from tests.test_positions import CONFIG, one_hot_row, random_tokens

pytestmark = needs_cc

MATMATS = 2 + 4 * CONFIG.n_layer     # wte (one-hot rows), per layer q/k/v, wo, fc1, fc2, and lm_head
SPINNING_CC = next((cc for cc in COMPILERS if cc != 'tcc'), FAST_CC)   # (tcc's helpers do not spin)


def graph_of(weights):
    """microgpt's graph of ``n`` positions, and its parameter Values."""
    def graph(n, tokens=None):
        sd, params = value_weights(weights)
        return sequence_graph(sd, CONFIG, n, tokens), params
    return graph


def compile_pair(graph, cc, threads, optimizer=None):
    g, params = graph(CONFIG.block_size)
    models = [compiler.compile(g.losses, g.inputs, params, outputs=[z for row in g.logits for z in row],
                               optimizer=optimizer or compiler.Adam(0.02), cc=cc, threads=threads,
                               flags=split_flags(cc))
              for _ in range(2)]
    return models


def bits(a):
    return np.asarray(a, dtype=np.float64).view(np.uint64).tolist()


def assert_same_steps(separate, fused, seed, steps=8):
    """Each step on one name: separate runs backward() and step(), fused
    backward_step(); after each, the same loss, parameters, gradients,
    input gradients and optimizer state, to the bit."""
    rng = random.Random(seed)
    ns = [CONFIG.block_size, 1, 3, 2, CONFIG.block_size, 2, 1, 3][:steps]
    for i, n in enumerate(ns):
        row = one_hot_row(random_tokens(rng, n))
        lr, zero = 0.02 / (i + 1), i % 3 != 1      # every third step keeps its gradients
        losses = []
        for m in (separate, fused):
            m.set_input(row)
            losses.append(m.forward(n))
        separate.backward()
        separate.step(lr, zero_grad=zero)
        fused.backward_step(lr, zero_grad=zero)
        assert bits(losses[0]) == bits(losses[1]), i
        for what in ('params', 'grads', 'input_grads', 'optimizer_state'):
            a, b = getattr(separate, what)(), getattr(fused, what)()
            assert bits(a) == bits(b), f'step {i} (n={n}): {what} differ'


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [1, 2, 3])
def test_backward_step_is_backward_then_step_to_the_bit(cc, threads):
    """With 2 threads (on 2 cores or more) the helper makes, steps and packs
    each matrix while the backward runs; 1 thread, 3 threads on 2 cores
    (helpers that would not spin) and tcc (no spinning) run the two calls."""
    weights = init_weights(CONFIG, random.Random(11))
    separate, fused = compile_pair(graph_of(weights), cc, threads)
    assert fused.source.count('weight_ready(b, ') == MATMATS      # every matrix pipelined
    assert_same_steps(separate, fused, seed=12)


@pytest.mark.parametrize('optimizer', [compiler.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
                                       compiler.AdamW(0.02, weight_decay=0.1)], ids=['sgd', 'adamw'])
def test_every_optimizer_steps_the_same_in_the_pipeline(optimizer):
    weights = init_weights(CONFIG, random.Random(19))
    separate, fused = compile_pair(graph_of(weights), SPINNING_CC, 2, optimizer)
    assert_same_steps(separate, fused, seed=20)


@pytest.mark.parametrize('cc', [cc for cc in COMPILERS if cc != 'tcc'])
def test_a_matrix_with_another_use_is_stepped_after_the_backward(cc):
    """A matrix whose weights something else reads (here one of fc1's
    weights is also an output) is not stepped before the backward has
    ended; the others are, and the bits stay the two calls'."""
    weights = init_weights(CONFIG, random.Random(13))
    sd, params = value_weights(weights)
    g = sequence_graph(sd, CONFIG, CONFIG.block_size)
    outputs = [z for row in g.logits for z in row] + [sd['layer0.mlp_fc1'][1][2]]
    separate, fused = [compiler.compile(g.losses, g.inputs, params, outputs=outputs, optimizer=compiler.Adam(0.02),
                                        cc=cc, threads=2, flags=split_flags(cc)) for _ in range(2)]
    assert fused.source.count('positions at once */') == MATMATS
    assert fused.source.count('weight_ready(b, ') == MATMATS - 1
    assert_same_steps(separate, fused, seed=14)
    assert bits(separate.outputs()) == bits(fused.outputs())


def test_backward_step_needs_a_forward_and_says_what_is_wrong():
    weights = init_weights(CONFIG, random.Random(15))
    m, _ = compile_pair(graph_of(weights), FAST_CC, 1)
    with pytest.raises(RuntimeError, match=r'backward_step\(\) needs the values of forward\(\)'):
        m.backward_step()
    m.set_input(one_hot_row(random_tokens(random.Random(16), 2)))
    m.forward(2)
    with pytest.raises(TypeError, match=r'backward_step\(\): zero_grad must be True or False'):
        m.backward_step(0.1, zero_grad=1)
    with pytest.raises(TypeError, match=r"backward_step\(\) got an unexpected keyword argument 'rate'"):
        m.backward_step(rate=0.1)
    before = m.params()
    m.backward_step(0.1, zero_grad=True)           # the forward's values are still there
    assert not np.array_equal(before, m.params()) and not m.grads().any()
    with pytest.raises(RuntimeError, match='needs the values of forward'):
        m.backward_step()                          # a step made them stale, as step() does


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason='the pipeline needs two cores')
def test_a_bigger_model_pipelines_every_matrix_and_keeps_the_bits():
    """Wider matrices (several panels, packed input-gradient copies) over
    more steps."""
    from microgpt import Config
    config = Config(vocab_size=7, n_embd=16, n_layer=2, n_head=2, block_size=6)
    weights = init_weights(config, random.Random(17))
    sd, params = value_weights(weights)
    g = sequence_graph(sd, config, config.block_size)
    models = [compiler.compile(g.losses, g.inputs, params, outputs=[z for row in g.logits for z in row],
                               optimizer=compiler.Adam(0.01), cc=SPINNING_CC, threads=2,
                               flags=split_flags(SPINNING_CC))
              for _ in range(2)]
    rng = random.Random(18)
    for i in range(20):
        n = rng.randrange(1, config.block_size + 1)
        tokens = [rng.randrange(config.vocab_size) for _ in range(n + 1)]
        row = [0.0] * (2 * config.block_size * config.vocab_size)
        for t in range(n):
            row[t * config.vocab_size + tokens[t]] = 1.0
            row[(config.block_size + t) * config.vocab_size + tokens[t + 1]] = 1.0
        for m in models:
            m.set_input(row)
            m.forward(n)
        models[0].backward()
        models[0].step(zero_grad=True)
        models[1].backward_step(zero_grad=True)
        assert bits(models[0].params()) == bits(models[1].params()), i
        assert bits(models[0].optimizer_state()) == bits(models[1].optimizer_state()), i


def test_a_module_built_before_backward_step_gets_the_two_calls():
    """An export built by an older compiler has no backward_step in its
    module: the model's is backward() then step(), the same bits."""
    weights = init_weights(CONFIG, random.Random(21))
    separate, fused = compile_pair(graph_of(weights), FAST_CC, 1)

    class OlderModule:
        def __init__(self, module):
            self._module = module

        def __getattr__(self, name):
            if name == 'backward_step':
                raise AttributeError(name)
            return getattr(self._module, name)
    older = compiler.model.CompiledModel(OlderModule(fused.module), fused.program, fused.build, {}, fused.source,
                                         optimizer=fused.optimizer)
    assert older.backward_step.__name__ == '_backward_then_step'
    assert_same_steps(separate, older, seed=22, steps=4)


@pytest.mark.parametrize('cc', [cc for cc in COMPILERS if cc != 'tcc'])
def test_the_input_gradient_packs_a_step_leaves_behind_are_made_before_they_are_read(cc):
    """backward_step() leaves each matrix's input-gradient packs to the next
    forward's helper; a train_batch() (no forward first), a backward() after
    a one-thread forward, and a forward after write_params() must each read
    current ones: the bits of the model that only ran the separate calls."""
    weights = init_weights(CONFIG, random.Random(23))
    separate, fused = compile_pair(graph_of(weights), cc, 2)
    rng = random.Random(24)

    def step(m, row, n, together):
        m.set_input(row)
        m.forward(n)
        if together:
            m.backward_step(0.01, zero_grad=True)
        else:
            m.backward()
            m.step(0.01, zero_grad=True)

    def same():
        for what in ('params', 'grads', 'optimizer_state'):
            assert bits(getattr(separate, what)()) == bits(getattr(fused, what)()), what
    rows = [(one_hot_row(random_tokens(rng, CONFIG.block_size)), CONFIG.block_size) for _ in range(4)]
    for row, n in rows[:2]:
        step(separate, row, n, False)
        step(fused, row, n, True)
    X = np.array([row for row, _ in rows])
    assert bits(separate.train_batch(X, 0.01)) == bits(fused.train_batch(X, 0.01))
    same()
    step(separate, *rows[2], False)
    step(fused, *rows[2], True)
    for m in (separate, fused):
        m.threads = 1
        step(m, *rows[3], False)
        m.threads = 2
    same()
