"""Neural-network building blocks over ``Value``, as in micrograd."""
import math
import random

from micrograd.engine import Value


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
