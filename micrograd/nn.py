"""Neural-network building blocks over ``Value``, as in micrograd.

``Neuron``, ``Layer`` and ``MLP`` work on lists of Values; ``Conv2d``,
``MaxPool2d``, ``AvgPool2d``, ``ReLU`` and ``Flatten`` on images: nested
lists ``[channel][row][column]`` of Values (or numbers); ``Sequential``
chains any of them. All are plain Python over scalar ``Value`` ops, so the
interpreter computes every model the compiler compiles.
"""
import math
import random

from micrograd.engine import Value
from micrograd.losses import max_of


class Module:

    def zero_grad(self):
        for p in self.parameters():
            p.grad = 0.0

    def parameters(self):
        return []


INITS = ('uniform', 'scaled')


class Neuron(Module):
    """``relu(b + sum_i w_i * x_i)``, summed left to right in input order.

    ``init='uniform'`` draws each weight from ``uniform(-1, 1)``, as
    Karpathy's micrograd does; ``init='scaled'`` from ``uniform(-s, s)`` with
    ``s = 1/sqrt(nin)`` (LeCun-style: the pre-activation variance stays O(1)
    for 784 inputs). The bias starts at 0 (no draw). ``rng`` is a
    ``random.Random``; the default is the ``random`` module.
    """

    def __init__(self, nin, nonlin=True, rng=None, init='uniform'):
        if init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, not {init!r}")
        rng = rng or random
        scale = 1.0 if init == 'uniform' else 1.0 / math.sqrt(nin)
        self.w = [Value(rng.uniform(-scale, scale)) for _ in range(nin)]
        self.b = Value(0.0)
        self.nonlin = nonlin

    def __call__(self, x):
        act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
        return act.relu() if self.nonlin else act

    def parameters(self):
        return self.w + [self.b]

    def __repr__(self):
        return f"{'ReLU' if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module):

    def __init__(self, nin, nout, **kwargs):
        self.neurons = [Neuron(nin, **kwargs) for _ in range(nout)]

    def __call__(self, x):
        out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out

    def parameters(self):
        return [p for n in self.neurons for p in n.parameters()]

    def __repr__(self):
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"


class MLP(Module):
    """ReLU layers of sizes ``nouts``, the last one linear.

    By default the weights are drawn exactly as Karpathy's micrograd draws
    them (``random.uniform(-1, 1)`` per weight from the global ``random``,
    neuron by neuron, layer by layer; biases 0), so his demo's numbers come
    out the same. ``init='scaled'`` draws from ``±1/sqrt(nin)`` instead (what
    deep or wide layers need); ``seed`` draws from ``random.Random(seed)``,
    leaving the global ``random`` state alone.
    """

    def __init__(self, nin, nouts, seed=None, init='uniform'):
        rng = random.Random(seed) if seed is not None else random
        sz = [nin] + list(nouts)
        self.layers = [Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1, rng=rng, init=init)
                       for i in range(len(nouts))]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self):
        return [p for layer in self.layers for p in layer.parameters()]

    def __repr__(self):
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"


def _uniform_weights(n, fan_in, rng, init):
    if init not in INITS:
        raise ValueError(f"init must be one of {', '.join(INITS)}, not {init!r}")
    scale = 1.0 if init == 'uniform' else 1.0 / math.sqrt(fan_in)
    return [Value(rng.uniform(-scale, scale)) for _ in range(n)]


def _whole(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, not {value!r}")
    return value


def _image_shape(x, what):
    """``(channels, rows, columns)`` of a nested list, checked rectangular."""
    try:
        channels, rows, cols = len(x), len(x[0]), len(x[0][0])
    except (TypeError, IndexError):
        raise TypeError(f"{what} takes an image: a list of channels, each a list of rows of "
                        f"Values") from None
    for c in x:
        if len(c) != rows or any(len(r) != cols for r in c):
            raise ValueError(f"{what}: the image is not rectangular (channels x {rows} x {cols})")
    return channels, rows, cols


class Conv2d(Module):
    """A 2-D convolution (cross-correlation, as PyTorch's ``nn.Conv2d``) over
    an image ``x[in_channel][row][column]``.

    Output ``[o][y][x] = b[o] + sum of w[o][c][i][j] * in[c][y*stride+i-padding][x*stride+j-padding]``
    over ``c``, then ``i``, then ``j`` in ascending order, added left to right
    after the bias (a ``Neuron``'s order); window positions that fall in the
    padding are left out of the sum (they would add ``w * 0``). Output size:
    ``(size + 2 * padding - kernel_size) // stride + 1`` per side.

    Parameters, in ``parameters()`` order: output channel by output channel,
    each its ``in_channels * kernel_size**2`` weights in ``(c, i, j)`` order,
    then its bias — ``p[k:k + out * (n + 1)].reshape(out, n + 1)`` with
    ``n = in_channels * kernel_size**2`` (last column: biases), which is
    ``weight.reshape(out, -1)`` and ``bias`` of PyTorch's ``nn.Conv2d``.
    ``init='uniform'`` draws weights from ``uniform(-1, 1)`` like the MLP,
    ``'scaled'`` from ``±1/sqrt(n)``; biases start at 0.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, seed=None,
                 init='scaled', rng=None):
        self.in_channels = _whole('in_channels', in_channels, 1)
        self.out_channels = _whole('out_channels', out_channels, 1)
        self.kernel_size = _whole('kernel_size', kernel_size, 1)
        self.stride = _whole('stride', stride, 1)
        self.padding = _whole('padding', padding, 0)
        rng = rng or (random.Random(seed) if seed is not None else random)
        n = in_channels * kernel_size * kernel_size
        self.w = [_uniform_weights(n, n, rng, init) for _ in range(out_channels)]
        self.b = [Value(0.0) for _ in range(out_channels)]

    def output_size(self, size):
        return (size + 2 * self.padding - self.kernel_size) // self.stride + 1

    def __call__(self, x):
        channels, rows, cols = _image_shape(x, 'Conv2d')
        if channels != self.in_channels:
            raise ValueError(f"Conv2d({self.in_channels}, ...) takes images of {self.in_channels} channels, got {channels}")
        k, s, pad = self.kernel_size, self.stride, self.padding
        out_rows, out_cols = self.output_size(rows), self.output_size(cols)
        if out_rows < 1 or out_cols < 1:
            raise ValueError(f"Conv2d: a {rows}x{cols} image is smaller than the {k}x{k} kernel "
                             f"(padding {pad})")
        out = []
        for w, b in zip(self.w, self.b):
            plane = []
            for y in range(out_rows):
                row = []
                for xo in range(out_cols):
                    terms = [w[(c * k + i) * k + j] * x[c][y * s + i - pad][xo * s + j - pad]
                             for c in range(channels) for i in range(k) for j in range(k)
                             if 0 <= y * s + i - pad < rows and 0 <= xo * s + j - pad < cols]
                    row.append(sum(terms, b))
                plane.append(row)
            out.append(plane)
        return out

    def parameters(self):
        return [p for w, b in zip(self.w, self.b) for p in w + [b]]

    def __repr__(self):
        return (f"Conv2d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding})")


class _Pool(Module):
    """Windows of ``kernel_size x kernel_size``, ``stride`` apart (default:
    ``kernel_size``), each channel on its own; no padding; windows that
    would run past the edge are left out (PyTorch's floor mode)."""

    def __init__(self, kernel_size, stride=None):
        self.kernel_size = _whole('kernel_size', kernel_size, 1)
        self.stride = _whole('stride', kernel_size if stride is None else stride, 1)

    def __call__(self, x):
        channels, rows, cols = _image_shape(x, type(self).__name__)
        k, s = self.kernel_size, self.stride
        if rows < k or cols < k:
            raise ValueError(f"{type(self).__name__}: a {rows}x{cols} image is smaller than the "
                             f"{k}x{k} window")
        return [[[self.reduce([plane[y * s + i][xo * s + j] for i in range(k) for j in range(k)])
                  for xo in range((cols - k) // s + 1)]
                 for y in range((rows - k) // s + 1)]
                for plane in x]

    def __repr__(self):
        return f"{type(self).__name__}({self.kernel_size}, stride={self.stride})"


class MaxPool2d(_Pool):
    """The largest value of each window, row by row: ``((x0 max x1) max x2) ...``
    with ``Value.max`` (a tie keeps the earlier value, which alone gets the gradient)."""

    reduce = staticmethod(max_of)


class AvgPool2d(_Pool):
    """The mean of each window: its values added left to right, row by row,
    then multiplied by ``1 / kernel_size**2``."""

    def reduce(self, window):
        return sum(window[1:], window[0]) * (1.0 / len(window))


class ReLU(Module):
    """``relu`` of every value of an image (or of a list)."""

    def __call__(self, x):
        if isinstance(x, Value):
            return x.relu()
        return [self(v) for v in x]

    def __repr__(self):
        return 'ReLU()'


class Flatten(Module):
    """An image as one list: channel by channel, row by row (``numpy``'s C order)."""

    def __call__(self, x):
        _image_shape(x, 'Flatten')
        return [v for plane in x for row in plane for v in row]

    def __repr__(self):
        return 'Flatten()'


class Sequential(Module):
    """Modules applied in turn; ``parameters()`` are theirs, in that order."""

    def __init__(self, *modules):
        self.modules = list(modules)

    def __call__(self, x):
        for module in self.modules:
            x = module(x)
        return x

    def parameters(self):
        return [p for m in self.modules for p in m.parameters()]

    def __repr__(self):
        return 'Sequential(' + ', '.join(map(repr, self.modules)) + ')'
