"""Graphs and module-state helpers shared by the tests."""
import random

import numpy as np

import compiler
import micrograd
from compiler import vectorize as vectorize_pass
from micrograd import Value, cross_entropy
from micrograd.nn import MLP


def mlp_builder(sizes):
    """``build(inputs, params)`` of ``MLP(sizes)`` with softmax cross-entropy,
    its weights taken from ``params``; the inputs end with a one-hot label."""
    def build(inputs, params):
        model = MLP(sizes[0], sizes[1:], seed=0)
        it = iter(params)
        for layer in model.layers:
            for n in layer.neurons:
                n.w = [next(it) for _ in n.w]
                n.b = next(it)
        x = inputs[:sizes[0]]
        for layer in model.layers:
            x = layer(x)
            x = x if isinstance(x, list) else [x]     # a layer of one neuron gives a Value
        return cross_entropy(x, inputs[sizes[0]:]), x
    return build


# the small graph's numbers of inputs, parameters and outputs
N_IN, N_P, N_OUT = 3, 13, 2


def small_graph():
    """Three inputs (two features and a target), 13 parameters, two outputs;
    every op of the interpreter appears. Returns (loss, inputs, params, outputs)."""
    rng = random.Random(7)
    xs = [Value(0.0), Value(0.0)]
    t = Value(0.0)
    W = [[Value(rng.uniform(-1, 1)) for _ in xs] for _ in range(3)]
    b = [Value(rng.uniform(-0.1, 0.1)) for _ in range(3)]
    v = [Value(rng.uniform(-1, 1)) for _ in range(3)]
    c = Value(0.1)
    h = [(sum((w * x for w, x in zip(row, xs)), bias)).tanh() for row, bias in zip(W, b)]
    y = sum((vi * hi for vi, hi in zip(v, h)), c)
    loss = ((y - t) ** 2 + 0.1 * micrograd.max(h[0], h[1]).relu()
            + (h[2].exp() / 2.0) - (y.sigmoid() + 1.0).log() + (-h[0]))
    params = [p for row in W for p in row] + b + v + [c]
    return loss, xs + [t], params, [y, h[0]]


def compile_small(cc, **kwargs):
    loss, inputs, params, outputs = small_graph()
    return compiler.compile(loss, inputs=inputs, params=params, outputs=outputs, cc=cc, **kwargs)


def every_op_graph():
    """A graph with every op of the op table. Returns (loss, inputs, params, outputs)."""
    x, t = Value(0.0), Value(0.0)
    w, b, v = Value(0.5), Value(-0.25), Value(1.5)
    h = (x * w + b).tanh()
    y = micrograd.max(h, x / v).relu() - h.sigmoid() + (h * h + 1.0).log() + (-h).exp()
    loss = (y - t) ** 2 + v ** -1.5
    return loss, [x, t], [w, b, v], [y, h]


def emit(graph, vectorize=True):
    loss, inputs, params, outputs = graph
    program = compiler.trace(loss, inputs, params, outputs)
    if vectorize:
        program = vectorize_pass.vectorize(program)
    return compiler.emit_module(program)


def nodes_of(graph):
    loss, _, _, outputs = graph
    return micrograd.topological_order([loss, *outputs])


P0 = np.linspace(-0.6, 0.6, 13)


def reset(m):
    m.set_params(P0)
    m.set_input([0.25, -0.5, 1.0])
    m.zero_grad()
    m.forward()
    m.backward()


def snapshot(m):
    data, grad = np.empty(m.module.n_data), np.empty(m.n_params)
    m.module.read_data(data)
    m.module.read_grads(grad)
    return data, grad


def export_free(ba):
    """True if nothing holds a buffer of the bytearray ``ba`` (it can be resized)."""
    try:
        ba.append(0)
        del ba[-1]
        return True
    except BufferError:
        return False
