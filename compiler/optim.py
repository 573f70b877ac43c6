"""Optimizers compiled into the module: ``compile(..., optimizer=Adam(1e-2))``.

Each is a description: its numbers are compiled in as constants, and its
step runs in C on the parameter gradients (``m.step()``, and
``m.train_batch`` on the mean gradient over a batch). Each follows the
update rule PyTorch documents for ``torch.optim.SGD``, ``Adam`` and
``AdamW`` (no dampening, no amsgrad), written in the documented order of
operations; ``reference_step`` is the same arithmetic in plain Python.
"""
import math
from dataclasses import dataclass


def _check(name, value, low=0.0, high=math.inf, high_open=False):
    """``value`` as a float, or an error: a finite real number (not a bool)
    from ``low`` to ``high``. An infinite rate, momentum or decay would make
    the first step's parameters inf or NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, not {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:       # an int beyond float64
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not (low <= value and (value < high if high_open else value <= high)):
        bound = f"< {high:g}" if high_open else f"<= {high:g}"
        raise ValueError(f"{name} must be >= {low:g}" + (f" and {bound}" if high != math.inf else "")
                         + f", got {value!r}")
    return value


@dataclass(frozen=True)
class SGD:
    """``g = grad + weight_decay * p``; with momentum, ``b = g`` at the first
    step, else ``b = momentum * b + g``, and ``g = g + momentum * b``
    (nesterov) or ``g = b``; then ``p = p - lr * g``."""
    lr: float
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, 'lr', _check('lr', self.lr))
        object.__setattr__(self, 'momentum', _check('momentum', self.momentum))
        object.__setattr__(self, 'weight_decay', _check('weight_decay', self.weight_decay))
        if not isinstance(self.nesterov, bool):     # 'yes' or 0.5 would compile as one thing and run as another
            raise TypeError(f"nesterov must be True or False, not {self.nesterov!r}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov needs a momentum > 0")

    @property
    def state_vectors(self):
        return 1 if self.momentum else 0

    def reference_step(self, p, g, state, lr=None):
        """One step in plain Python floats on lists ``p`` (changed in place),
        ``g``, and ``state`` ([t, vectors...], changed in place)."""
        lr = self.lr if lr is None else lr
        first = state[0] == 0.0
        for j in range(len(p)):
            gj = g[j]
            if self.weight_decay != 0:
                gj = gj + self.weight_decay * p[j]
            if self.momentum != 0:
                b = gj if first else self.momentum * state[1][j] + gj
                state[1][j] = b
                gj = gj + self.momentum * b if self.nesterov else b
            p[j] = p[j] - lr * gj
        state[0] += 1.0


@dataclass(frozen=True)
class Adam:
    """``g = grad + weight_decay * p``; ``m = b1 m + (1 - b1) g``;
    ``v = b2 v + (1 - b2) g g``; ``mhat = m / (1 - b1^t)``;
    ``vhat = v / (1 - b2^t)``; ``p = p - lr mhat / (sqrt(vhat) + eps)``."""
    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled = False       # AdamW: weight decay on p, not added to g

    def __post_init__(self):
        object.__setattr__(self, 'lr', _check('lr', self.lr))
        betas = tuple(self.betas)
        if len(betas) != 2:
            raise ValueError(f"betas must be two numbers, got {self.betas!r}")
        object.__setattr__(self, 'betas', tuple(_check(f'betas[{i}]', b, 0.0, 1.0, high_open=True)
                                                for i, b in enumerate(betas)))
        object.__setattr__(self, 'eps', _check('eps', self.eps))
        object.__setattr__(self, 'weight_decay', _check('weight_decay', self.weight_decay))

    state_vectors = 2

    def reference_step(self, p, g, state, lr=None):
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        t = state[0] + 1.0
        state[0] = t
        c1, c2 = 1.0 - math.pow(b1, t), 1.0 - math.pow(b2, t)
        m, v = state[1], state[2]
        for j in range(len(p)):
            gj = g[j]
            if self.decoupled and self.weight_decay != 0:
                p[j] = p[j] - lr * self.weight_decay * p[j]
            if not self.decoupled and self.weight_decay != 0:
                gj = gj + self.weight_decay * p[j]
            m[j] = b1 * m[j] + (1.0 - b1) * gj
            v[j] = b2 * v[j] + (1.0 - b2) * gj * gj
            mhat, vhat = m[j] / c1, v[j] / c2
            p[j] = p[j] - lr * mhat / (math.sqrt(vhat) + self.eps)


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay: ``p = p - lr * weight_decay * p``
    first, then Adam's step without it."""
    weight_decay: float = 1e-2
    decoupled = True


OPTIMIZERS = (SGD, Adam, AdamW)
