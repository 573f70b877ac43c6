"""The model this project trains on MNIST, as a micrograd graph, and its input rows.

One definition for ``mnist_train.py``, ``benchmarks/`` and the tests: a
``micrograd.nn.MLP`` with ReLU hidden layers and a linear output layer,
scored by ``cross_entropy`` against a one-hot label. The label entries are
inputs of the graph like the pixels, so one compiled module serves every
image: an input row is the 784 pixels scaled to [0, 1], then the one-hot label.
"""
from dataclasses import dataclass

import numpy as np

from micrograd import Value, cross_entropy, nn

N_PIXELS = 28 * 28
N_CLASSES = 10


@dataclass
class MnistGraph:
    """The traced-to-be graph: ``loss`` over ``inputs`` (pixels, then label)
    and ``params``, with the ``logits`` as outputs."""
    model: nn.MLP
    pixels: list
    label: list
    logits: list
    loss: Value

    @property
    def inputs(self):
        return self.pixels + self.label

    @property
    def params(self):
        return self.model.parameters()

    @property
    def sizes(self):
        return [N_PIXELS, *(len(layer.neurons) for layer in self.model.layers)]


def mnist_graph(hidden=(50,), seed=0):
    """The graph of ``MLP(784, hidden + [10])`` (scaled initialisation, drawn
    from ``seed``) and its cross-entropy loss."""
    model = nn.MLP(N_PIXELS, [*hidden, N_CLASSES], seed=seed, init='scaled')
    pixels = [Value(0.0) for _ in range(N_PIXELS)]
    label = [Value(0.0) for _ in range(N_CLASSES)]
    logits = pixels
    for layer in model.layers:      # as model(pixels), but a one-neuron layer's bare Value stays a list
        logits = layer(logits)
        logits = [logits] if isinstance(logits, Value) else logits
    return MnistGraph(model, pixels, label, logits, cross_entropy(logits, label))


def input_rows(images, labels):
    """Input rows of the graph (float64 ``[N, 794]``): pixels scaled to
    [0, 1], then the one-hot label."""
    n = len(images)
    rows = np.zeros((n, N_PIXELS + N_CLASSES))
    rows[:, :N_PIXELS] = np.asarray(images).reshape(n, N_PIXELS) / 255.0
    rows[np.arange(n), N_PIXELS + np.asarray(labels).astype(np.intp)] = 1.0
    return rows
