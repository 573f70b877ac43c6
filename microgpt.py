"""Karpathy's microgpt, written on ``micrograd`` ``Value``s: the model that
``microgpt_train.py`` compiles and trains (and ``benchmarks/bench_microgpt.py``
times).

A GPT with token and position embeddings, rmsnorm, causal multi-head
attention and a ReLU MLP, no biases, as in Karpathy's microgpt: the same
initialisation (``random.gauss(0, 0.08)`` in the same order), the same
operations in the same order. ``sequence_graph`` builds the graph of a
name's positions; with the tokens as one-hot inputs, one graph traced for
``block_size`` positions serves every name.
"""
import math
import random
from dataclasses import dataclass

from micrograd import Value, cross_entropy

INIT_STD = 0.08             # microgpt's random.gauss(0, 0.08) for every weight
RMS_EPS = 1e-5              # rmsnorm: x * (mean(x^2) + 1e-5) ** -0.5


class Tokenizer:
    """Characters to token ids as microgpt numbers them: the distinct
    characters in sorted order, then ``BOS`` (begin/end of a name) last."""

    def __init__(self, names):
        self.chars = sorted(set(''.join(names)))
        self.bos = len(self.chars)
        self.vocab_size = len(self.chars) + 1
        self._ids = {c: i for i, c in enumerate(self.chars)}

    def encode(self, name):
        """``[BOS] + the name's characters + [BOS]``."""
        return [self.bos] + [self._ids[c] for c in name] + [self.bos]

    def decode(self, tokens):
        return ''.join(self.chars[t] for t in tokens if t != self.bos)


@dataclass(frozen=True)
class Config:
    vocab_size: int
    n_embd: int = 16
    n_layer: int = 1
    n_head: int = 4
    block_size: int = 16

    @property
    def head_dim(self):
        return self.n_embd // self.n_head


def matrix_shapes(config):
    """``(name, rows, columns)`` of every weight matrix, in microgpt's order
    (which is the order of the parameter vector)."""
    c, e = config, config.n_embd
    shapes = [('wte', c.vocab_size, e), ('wpe', c.block_size, e), ('lm_head', c.vocab_size, e)]
    for i in range(c.n_layer):
        shapes += [(f'layer{i}.attn_wq', e, e), (f'layer{i}.attn_wk', e, e),
                   (f'layer{i}.attn_wv', e, e), (f'layer{i}.attn_wo', e, e),
                   (f'layer{i}.mlp_fc1', 4 * e, e), (f'layer{i}.mlp_fc2', e, 4 * e)]
    return shapes


def init_weights(config, rng):
    """``{name: rows of floats}``, each weight ``rng.gauss(0, 0.08)``, drawn in
    microgpt's order (matrix by matrix, row by row)."""
    return {name: [[rng.gauss(0, INIT_STD) for _ in range(cols)] for _ in range(rows)]
            for name, rows, cols in matrix_shapes(config)}


def flatten(weights):
    """The parameter vector: every matrix's rows in ``matrix_shapes`` order."""
    return [x for rows in weights.values() for row in rows for x in row]


def value_weights(weights):
    """The matrices as ``Value``s labelled ``name[row][column]``, and the flat parameter list."""
    sd = {name: [[Value(x, label=f'{name}[{i}][{j}]') for j, x in enumerate(row)]
                 for i, row in enumerate(rows)]
          for name, rows in weights.items()}
    return sd, [p for rows in sd.values() for row in rows for p in row]


def linear(x, w):
    return [sum(wi * xi for wi, xi in zip(row, x)) for row in w]


def rmsnorm(x):
    ms = sum(xi * xi for xi in x) / len(x)
    scale = (ms + RMS_EPS) ** -0.5
    return [xi * scale for xi in x]


def softmax(logits):
    """Shifted by the largest logit, taken as a graph node (a chain of
    ``max``): a Python float read at trace time would be frozen into the
    compiled program as a constant."""
    m = logits[0]
    for z in logits[1:]:
        m = m.max(z)
    exps = [(z - m).exp() for z in logits]
    total = sum(exps)
    return [e / total for e in exps]


def gpt(sd, config, token, pos, keys, values):
    """microgpt's forward pass for one position: the logits of the next token.

    ``token`` is the one-hot vector of the current token (Values), ``pos`` the
    position (known when the graph is built, so the position embedding is the
    row ``wpe[pos]``); ``keys`` and ``values`` hold the earlier positions'
    keys and values, one list per layer, and get this position's appended.
    """
    wte = sd['wte']
    # sum(onehot * column) is the row wte[token] exactly: 0 * w adds zeros
    tok = [sum(o * wte[v][d] for v, o in enumerate(token)) for d in range(config.n_embd)]
    x = [t + p for t, p in zip(tok, sd['wpe'][pos])]
    x = rmsnorm(x)
    hd = config.head_dim
    for li in range(config.n_layer):
        layer = f'layer{li}.'
        x_residual = x
        x = rmsnorm(x)
        q = linear(x, sd[layer + 'attn_wq'])
        k = linear(x, sd[layer + 'attn_wk'])
        v = linear(x, sd[layer + 'attn_wv'])
        keys[li].append(k)
        values[li].append(v)
        x_attn = []
        for h in range(config.n_head):
            hs = h * hd
            q_h = q[hs:hs + hd]
            k_h = [ki[hs:hs + hd] for ki in keys[li]]
            v_h = [vi[hs:hs + hd] for vi in values[li]]
            attn_logits = [sum(q_h[j] * k_h[t][j] for j in range(hd)) / hd ** 0.5
                           for t in range(len(k_h))]
            attn_weights = softmax(attn_logits)
            x_attn.extend(sum(attn_weights[t] * v_h[t][j] for t in range(len(v_h))) for j in range(hd))
        x = linear(x_attn, sd[layer + 'attn_wo'])
        x = [a + b for a, b in zip(x, x_residual)]
        x_residual = x
        x = rmsnorm(x)
        x = linear(x, sd[layer + 'mlp_fc1'])
        x = [xi.relu() for xi in x]
        x = linear(x, sd[layer + 'mlp_fc2'])
        x = [a + b for a, b in zip(x, x_residual)]
    return linear(x, sd['lm_head'])


@dataclass
class Sequence:
    """The graph of ``positions`` positions: per-position losses and logits,
    and the input Values (the one-hot tokens, then the one-hot targets)."""
    losses: list
    logits: list        # one list of vocab_size Values per position
    inputs: list


def sequence_graph(sd, config, positions, tokens=None):
    """Build microgpt's graph for ``positions`` positions.

    With ``tokens`` (a name's ids, ``[BOS] + chars + [BOS]``) the one-hot
    inputs hold them, as the interpreter needs; without, they are 0.0
    placeholders for ``compiler.compile``, fed by ``set_input``.
    """
    vocab = config.vocab_size

    def one_hot(index):
        return [Value(1.0 if index == i else 0.0) for i in range(vocab)]

    token_inputs = [one_hot(None if tokens is None else tokens[t]) for t in range(positions)]
    target_inputs = [one_hot(None if tokens is None else tokens[t + 1]) for t in range(positions)]
    keys, values = [[] for _ in range(config.n_layer)], [[] for _ in range(config.n_layer)]
    losses, logits = [], []
    for t in range(positions):
        logits_t = gpt(sd, config, token_inputs[t], t, keys, values)
        logits.append(logits_t)
        losses.append(cross_entropy(logits_t, target_inputs[t]))
    inputs = [v for row in token_inputs for v in row] + [v for row in target_inputs for v in row]
    return Sequence(losses, logits, inputs)


def positions_of(tokens, config):
    """How many positions a name trains: one per next token, at most the block."""
    return min(config.block_size, len(tokens) - 1)


def probabilities(logits, temperature):
    """softmax(logits / temperature) in Python floats, shifted by the largest."""
    scaled = [z / temperature for z in logits]
    top = max(scaled)
    exps = [math.exp(z - top) for z in scaled]
    total = sum(exps)
    return [e / total for e in exps]


def prepare(names, seed, n_embd=16, n_layer=1, n_head=4, block_size=16):
    """microgpt's setup from ``random.Random(seed)``: the names shuffled (a
    copy), then the initial weights. Returns ``(names, tokenizer, config,
    weights, rng)``; the rng goes on to draw the samples."""
    rng = random.Random(seed)
    names = list(names)
    rng.shuffle(names)
    tokenizer = Tokenizer(names)
    config = Config(tokenizer.vocab_size, n_embd, n_layer, n_head, block_size)
    return names, tokenizer, config, init_weights(config, rng), rng
