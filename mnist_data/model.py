"""The models this project trains on MNIST, as micrograd graphs, and their input rows.

One definition for ``mnist_train.py``, ``benchmarks/`` and the tests:

- ``mnist_graph``: a ``micrograd.nn.MLP`` with ReLU hidden layers and a
  linear output layer;
- ``lenet_graph``: a LeNet-5 style convolutional net for 28x28 images, built
  from ``micrograd.nn`` modules (conv 5x5 with 6 channels, ReLU, max-pool 2,
  conv 5x5 with 16 channels, ReLU, max-pool 2, flatten, then ReLU layers of
  120 and 84 and a linear layer of 10);

each scored by ``cross_entropy`` against a one-hot label. The label entries
are inputs of the graph like the pixels, so one compiled module serves every
image: an input row is the 784 pixels scaled to [0, 1] (row by row), then the
one-hot label, for either model. ``graph_for(name, ...)`` picks one by its
``--model`` name (``MODELS``).
"""
import random
from dataclasses import dataclass

import numpy as np

from micrograd import Value, cross_entropy, nn

IMAGE_SIZE = 28
N_PIXELS = IMAGE_SIZE * IMAGE_SIZE
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

    name = 'mlp'

    @property
    def sizes(self):
        """Input and layer sizes, e.g. ``[784, 50, 10]``."""
        return [N_PIXELS, *(len(layer.neurons) for layer in self.model.layers)]

    @property
    def description(self):
        return '-'.join(map(str, self.sizes)) + ' MLP'


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


# LeNet-5's shape for 28x28 inputs (LeCun et al., 1998, with ReLU and max
# pooling as in most modern renditions, and no padding): 28 -> conv 5 -> 24
# -> pool 2 -> 12 -> conv 5 -> 8 -> pool 2 -> 4, so 16 * 4 * 4 = 256 features.
LENET_CHANNELS = (6, 16)
LENET_HIDDEN = (120, 84)
LENET_KERNEL = 5
LENET_POOL = 2


def lenet_features(channels=LENET_CHANNELS):
    """How many values the flattened conv part hands the first linear layer."""
    side = ((IMAGE_SIZE - LENET_KERNEL + 1) // LENET_POOL - LENET_KERNEL + 1) // LENET_POOL
    return channels[-1] * side * side


@dataclass
class LeNetGraph(MnistGraph):
    """The LeNet graph: ``model`` is the ``nn.Sequential`` of the whole net.

    Parameters, in ``params`` order (``model.parameters()``): the first conv
    (per output channel: its 25 weights in (row, column) order, then its
    bias, as ``Conv2d``'s docstring says), the second conv (per output
    channel: 6 * 25 weights in (channel, row, column) order, then its bias),
    then the linear layers as in the MLP: neuron by neuron, its weights over
    the 256 flattened features (channel, row, column), then its bias.
    """
    name = 'lenet'

    @property
    def layers(self):
        return [m for m in self.model.modules if isinstance(m, nn.Layer)]

    @property
    def channels(self):
        return tuple(m.out_channels for m in self.model.modules if isinstance(m, nn.Conv2d))

    @property
    def sizes(self):
        """The linear part: flattened features, hidden layers, classes
        (``[256, 120, 84, 10]``)."""
        return [lenet_features(self.channels), *(len(layer.neurons) for layer in self.layers)]

    @property
    def description(self):
        return ModelSpec('lenet', self.sizes[1:-1], self.channels).description


def lenet(channels=LENET_CHANNELS, hidden=LENET_HIDDEN, seed=0):
    """The LeNet ``nn.Sequential`` for one-channel 28x28 images; weights
    drawn from one ``random.Random(seed)``, module by module in parameter
    order (scaled: ``±1/sqrt(fan_in)``; biases 0)."""
    rng = random.Random(seed)
    c1, c2 = channels
    sizes = [lenet_features(channels), *hidden, N_CLASSES]
    return nn.Sequential(
        nn.Conv2d(1, c1, LENET_KERNEL, rng=rng), nn.ReLU(), nn.MaxPool2d(LENET_POOL),
        nn.Conv2d(c1, c2, LENET_KERNEL, rng=rng), nn.ReLU(), nn.MaxPool2d(LENET_POOL),
        nn.Flatten(),
        *(nn.Layer(n_in, n_out, nonlin=i < len(sizes) - 2, rng=rng, init='scaled')
          for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]))))


def lenet_graph(seed=0, channels=LENET_CHANNELS, hidden=LENET_HIDDEN, row=None):
    """The graph of ``lenet(channels, hidden, seed)`` and its cross-entropy
    loss, over the MLP's input row (784 pixels, row by row, then the label),
    its inputs set to ``row`` (one of ``input_rows``; default zeros) so that
    the interpreter's loss is that row's. The full LeNet is about 250,000
    scalar ops per image (forward)."""
    model = lenet(channels, hidden, seed)
    row = [0.0] * (N_PIXELS + N_CLASSES) if row is None else [float(x) for x in row]
    pixels = [Value(x) for x in row[:N_PIXELS]]
    label = [Value(x) for x in row[N_PIXELS:]]
    image = [[pixels[r * IMAGE_SIZE:(r + 1) * IMAGE_SIZE] for r in range(IMAGE_SIZE)]]
    logits = model(image)
    return LeNetGraph(model, pixels, label, logits, cross_entropy(logits, label))


MODELS = ('mlp', 'lenet')       # the --model names
DEFAULT_HIDDEN = {'mlp': (50,), 'lenet': LENET_HIDDEN}


@dataclass(frozen=True)
class ModelSpec:
    """Which model to build, known before any graph is: ``name`` (one of
    ``MODELS``), the hidden linear layers (default ``DEFAULT_HIDDEN[name]``)
    and, for LeNet, the two convs' channels. What the training script checks
    a weights file against, and what builds the graph."""
    name: str = 'mlp'
    hidden: tuple = None
    channels: tuple = LENET_CHANNELS

    def __post_init__(self):
        if self.name not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, not {self.name!r}")
        hidden = DEFAULT_HIDDEN[self.name] if self.hidden is None else self.hidden
        object.__setattr__(self, 'hidden', tuple(hidden))
        object.__setattr__(self, 'channels', tuple(self.channels))

    @property
    def sizes(self):
        """The linear layers' sizes, input first: ``[784, 50, 10]`` for the
        default MLP, ``[256, 120, 84, 10]`` for LeNet."""
        first = N_PIXELS if self.name == 'mlp' else lenet_features(self.channels)
        return [first, *self.hidden, N_CLASSES]

    @property
    def n_params(self):
        sizes = self.sizes
        linear = sum((n_in + 1) * n_out for n_in, n_out in zip(sizes, sizes[1:]))
        if self.name == 'mlp':
            return linear
        c1, c2 = self.channels
        area = LENET_KERNEL * LENET_KERNEL
        return c1 * (area + 1) + c2 * (c1 * area + 1) + linear

    @property
    def description(self):
        linear = '-'.join(map(str, self.sizes))
        if self.name == 'mlp':
            return f'{linear} MLP'
        k = LENET_KERNEL
        convs = ', '.join(f'conv {k}x{k}x{c}, max-pool {LENET_POOL}' for c in self.channels)
        return f'LeNet ({convs}; {linear})'

    def graph(self, seed=0):
        """The ``MnistGraph`` (or ``LeNetGraph``) of this model, weights drawn from ``seed``."""
        if self.name == 'mlp':
            return mnist_graph(self.hidden, seed=seed)
        return lenet_graph(seed=seed, channels=self.channels, hidden=self.hidden)
