"""Train Karpathy's microgpt on a list of names, compiled to C once.

    python microgpt_train.py                    # 1,000 Adam steps on data/names.txt, then 20 names
    python microgpt_train.py --interpreter      # the same training on the micrograd interpreter (slow)
    python microgpt_train.py --check 5          # the first 5 steps both ways: bit-identical or exit 1

The model is Karpathy's microgpt (a GPT with token and position embeddings,
rmsnorm, causal multi-head attention and a ReLU MLP, no biases), written on
``micrograd`` ``Value``s. The graph is traced once for ``--block-size``
positions: the tokens and the targets are one-hot *inputs*, so one compiled
program serves every name, and ``forward(n)`` runs only a name's ``n``
positions (no work on padding). The loss of a step is the mean of the
per-position cross-entropies, ``(1 / n) * sum(losses)`` as Python computes
it; Adam (with the learning rate decaying linearly to 0) runs in C.

``--interpreter`` does each step the way microgpt does it: build the graph of
the name's positions from ``Value``s, ``backward()``, and Adam in plain
Python with the compiler's formulas (``compiler.Adam.reference_step``). The
two are the same arithmetic in the same order, so every loss and every
parameter is the same float64 bit for bit; ``--check N`` proves it for the
first ``N`` steps.

``--metrics`` is checked before any work and replaced atomically. Exit
status: 0 when training ends (or ``--check`` finds every step identical); 1
on an error, when the loss diverges, or when ``--check`` finds a difference;
2 on bad arguments; 128 + the signal's number when stopped by SIGINT (130),
SIGHUP (129) or SIGTERM (143): training stops after the current step and
``--metrics`` is still written.
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass

try:
    import numpy as np
except ImportError:
    sys.exit("microgpt_train.py needs numpy; set up with: "
             "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'")

import compiler
from compiler import cli
from compiler.cli import first_difference, same_bits
from compiler.files import atomic_write
from micrograd import Value, cross_entropy

NAMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'names.txt')
INIT_STD = 0.08             # microgpt's random.gauss(0, 0.08) for every weight
RMS_EPS = 1e-5              # rmsnorm: x * (mean(x^2) + 1e-5) ** -0.5
BETAS, ADAM_EPS = (0.85, 0.99), 1e-8
AVERAGE_STEPS = 100         # loss_first100 / loss_last100: averages over this many steps
EXIT_USAGE = 2              # argparse's status for bad arguments
# A step whose loss is this many times guessing's (ln vocab_size, 3.3 for the
# names) has diverged, finite or not: a healthy run starts near 1x and falls;
# --lr 1e6 reaches 1e21 with finite numbers.
DIVERGED = 100


def main(argv=None):
    return cli.run_cli(parse_args, run, argv)


def run(args):
    """Compile, then train, then sample: the whole program."""
    say = cli.sayer(args.quiet)
    try:        # everything that can be refused is refused before any work
        if args.metrics:
            cli.check_output_path('metrics', args.metrics, 'metrics.json')
        if not args.interpreter:
            compiler.resolve_threads(None)      # a bad $MICROGRAD_THREADS, before seconds of tracing
        names = load_names(args.data)
    except (OSError, ValueError) as e:          # OutputPathError is a ValueError
        return cli.fail(e)
    names, tokenizer, config, weights, rng = prepare(names, args.seed, args.n_embd, args.n_layer,
                                                     args.n_head, args.block_size)
    n_params = sum(rows * cols for _, rows, cols in matrix_shapes(config))
    say(f"data: {len(names):,} names from {args.data}, {tokenizer.vocab_size} tokens "
        f"({len(tokenizer.chars)} characters and BOS)")
    say(f"model: microgpt, n_embd {config.n_embd}, {config.n_layer} layer{'s' * (config.n_layer != 1)}, "
        f"{config.n_head} head{'s' * (config.n_head != 1)}, block {config.block_size}; {n_params:,} parameters")
    compiled = None
    if not args.interpreter:
        say(f"compiling the graph of {config.block_size} positions...")
        try:
            compiled = CompiledGPT(config, weights, args.lr, cc=args.cc)                  # compile
        except compiler.BuildError as e:
            return cli.fail(e)
        say(cli.compile_line(compiled.model))
    if args.check is not None:
        return check_run(args, compiled, names, tokenizer, config, weights, say)
    model = compiled if compiled is not None else InterpreterGPT(config, weights, args.lr)
    with cli.stop_on_signals() as stop:     # the first signal stops after the step
        result = train(model, names, tokenizer, config, args.steps, args.lr, stop=stop,    # train
                       progress=cli.progress_for(args, 'steps', 10, 'step'), on_step=step_printer(args))
        if result.message:
            print(result.message, file=sys.stderr)
        if result.losses:
            done = len(result.losses)
            print(f"trained {done:,} step{'s' * (done != 1)} in {result.seconds:.2f} s "
                  f"({1e3 * result.seconds / done:.3f} ms/step{', interpreter' if compiled is None else ''}): "
                  f"loss {mean(result.losses[-AVERAGE_STEPS:]):.4f} (mean of the last "
                  f"{min(done, AVERAGE_STEPS)} steps)", flush=True)
        samples = []
        if result.stopped == 'completed' and args.samples:                                  # evaluate
            print(f"samples (temperature {args.temperature:g}):", flush=True)
            for i in range(args.samples):
                samples.append(sample(model, tokenizer, config, rng, args.temperature))
                print(f"{i + 1:3} {samples[-1]}", flush=True)
        if args.metrics:
            with atomic_write(args.metrics, 'w') as f:
                f.write(json.dumps(metrics(args, config, n_params, compiled, result, samples), indent=1))
    if stop.is_set():
        return cli.exit_status(stop.signum)
    return cli.EXIT_ERROR if result.stopped == 'diverged' else 0


# ---- data -------------------------------------------------------------------

def load_names(path=NAMES):
    """The non-empty lines of ``path``, stripped (one name a line): UTF-8
    text without control characters, else a ``ValueError`` naming the file."""
    try:
        with open(path, encoding='utf-8') as f:
            names = [line.strip() for line in f]
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a text file of names: byte {e.start} is not UTF-8") from None
    names = [name for name in names if name]
    control = next((c for name in names for c in name if c < ' ' or c == '\x7f'), None)
    if control is not None:
        raise ValueError(f"{path} is not a text file of names: it holds the control character {control!r}")
    if not names:
        raise ValueError(f"{path} holds no names (one name a line)")
    return names


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


# ---- the model ----------------------------------------------------------------

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


# ---- the two ways to train ------------------------------------------------------

def adam(lr):
    return compiler.Adam(lr, betas=BETAS, eps=ADAM_EPS)


class CompiledGPT:
    """microgpt traced once for ``block_size`` positions and compiled; each
    step runs only the name's positions."""

    def __init__(self, config, weights, lr, cc=None):
        self.config = config
        sd, params = value_weights(weights)
        graph = sequence_graph(sd, config, config.block_size)
        self.model = compiler.compile(graph.losses, graph.inputs, params,
                                      outputs=[z for row in graph.logits for z in row],
                                      optimizer=adam(lr), cc=cc)
        self.row = np.zeros(len(graph.inputs))
        self._cells = memoryview(self.row)     # item writes: faster than numpy indexing here
        self._hot = []                          # where self.row holds a 1

    def _feed(self, tokens, positions, targets=True):
        """Set the one-hot rows of ``positions`` tokens (and their targets) and nothing else."""
        cells, vocab = self._cells, self.config.vocab_size
        for i in self._hot:
            cells[i] = 0.0
        hot = [t * vocab + tokens[t] for t in range(positions)]
        if targets:
            base = self.config.block_size * vocab
            hot += [base + t * vocab + tokens[t + 1] for t in range(positions)]
        for i in hot:
            cells[i] = 1.0
        self._hot = hot
        self.model.set_input(self.row)

    def train_step(self, tokens, lr):
        """One Adam step on the name ``tokens``; returns the loss before it."""
        m = self.model
        n = positions_of(tokens, self.config)
        self._feed(tokens, n)
        loss = m.forward(n)
        m.backward()
        m.step(lr)
        m.zero_grad()
        return loss

    def next_logits(self, tokens):
        """The logits after ``tokens`` (position ``len(tokens) - 1``), as floats."""
        t, vocab = len(tokens), self.config.vocab_size
        self._feed(tokens, t, targets=False)
        self.model.forward(t)
        return self.model.outputs()[(t - 1) * vocab:t * vocab].tolist()

    def params(self):
        return self.model.params().tolist()

    def optimizer_state(self):
        return self.model.optimizer_state().tolist()


class InterpreterGPT:
    """microgpt on the interpreter: a fresh graph of the name's positions
    each step, ``backward()``, then the compiler's Adam in plain Python."""

    def __init__(self, config, weights, lr):
        self.config = config
        self.sd, self.param_values = value_weights(weights)
        self.optimizer = adam(lr)
        n = len(self.param_values)
        self.state = [0.0, [0.0] * n, [0.0] * n]     # t, m, v (as optimizer_state() lays them out)

    def train_step(self, tokens, lr):
        n = positions_of(tokens, self.config)
        graph = sequence_graph(self.sd, self.config, n, tokens)
        loss = (1 / n) * sum(graph.losses)
        for p in self.param_values:
            p.grad = 0.0
        loss.backward()
        p = [v.data for v in self.param_values]
        self.optimizer.reference_step(p, [v.grad for v in self.param_values], self.state, lr)
        for v, x in zip(self.param_values, p):
            v.data = x
        return loss.data

    def next_logits(self, tokens):
        # the one-hot of every token so far; the last position's logits (no targets)
        t = len(tokens)
        graph = sequence_graph(self.sd, self.config, t, tokens + [0])
        return [z.data for z in graph.logits[-1]]

    def params(self):
        return [v.data for v in self.param_values]

    def optimizer_state(self):
        return [self.state[0], *self.state[1], *self.state[2]]


def learning_rate(lr, step, steps):
    """microgpt's schedule: ``lr`` decaying linearly to 0 over the run."""
    return lr * (1 - step / steps)


def sample(model, tokenizer, config, rng, temperature):
    """One name: tokens drawn from softmax(logits / temperature) until BOS or the block is full."""
    tokens = [tokenizer.bos]
    for _ in range(config.block_size):
        probs = probabilities(model.next_logits(tokens), temperature)
        token = rng.choices(range(config.vocab_size), weights=probs)[0]
        if token == tokenizer.bos:
            break
        tokens.append(token)
    return tokenizer.decode(tokens)


# ---- training -----------------------------------------------------------------

@dataclass
class Training:
    stopped: str            # 'completed', 'interrupted' or 'diverged'
    losses: list
    step_seconds: list
    seconds: float = 0.0
    message: str = ''


def train(model, names, tokenizer, config, steps, lr, progress=None, on_step=None, stop=None,
          limit=None):
    """``steps`` Adam steps, one name each (``names[step % len(names)]``), the
    learning rate decaying linearly to 0; returns a ``Training``. ``limit``
    runs only that many first steps of the ``steps``-step schedule.

    ``progress(total)`` makes a ``ProgressBar`` or ``ProgressLines`` (the
    loss shown is the mean of the last 100 steps); ``on_step(step, loss)``
    is called after each; ``stop`` is a ``StopRequest`` (training ends after
    the current step once it is set). A loss that is not finite, or above
    ``DIVERGED`` times guessing's (ln vocab_size), stops the run as diverged.
    """
    too_high = DIVERGED * math.log(config.vocab_size)
    result = Training('completed', [], [])
    todo = steps if limit is None else min(limit, steps)
    bar = progress(todo) if progress else None
    clock = time.perf_counter
    started = clock()
    try:
        for step in range(todo):
            tokens = tokenizer.encode(names[step % len(names)])
            t0 = clock()
            loss = model.train_step(tokens, learning_rate(lr, step, steps))
            result.step_seconds.append(clock() - t0)
            if not loss <= too_high:        # NaN too
                result.stopped = 'diverged'
                why = '' if not math.isfinite(loss) else f", over {DIVERGED} times guessing's {too_high / DIVERGED:.4f}"
                result.message = (f"diverged at step {step + 1}: the loss is {loss:.6g}{why} "
                                  f"(learning rate {lr:g} too high?)")
                break
            result.losses.append(loss)
            if on_step:
                on_step(step + 1, loss)
            if bar:
                recent = result.losses[-AVERAGE_STEPS:]
                bar.update(step + 1, sum(recent) / len(recent), force=step + 1 == todo)
            if stop is not None and stop.is_set():
                result.stopped = 'interrupted'
                result.message = f"interrupted by {stop.name} after step {step + 1} of {todo}"
                break
    finally:
        if bar:
            bar.close()
    result.seconds = clock() - started
    return result


def mean(values):
    return sum(values) / len(values) if values else None


# ---- --check ------------------------------------------------------------------

def check(compiled, interpreted, names, tokenizer, config, n_steps, steps, lr, param_labels, say):
    """Run the first ``n_steps`` steps (of a ``steps``-step schedule) both ways;
    returns ``None`` when every loss, parameter and Adam state number is the
    same bits after every step, else what differs first."""
    n_params = len(param_labels)

    def state_label(i):
        if i == 0:
            return 'the Adam step count'
        vector, j = divmod(i - 1, n_params)
        return f"Adam's {'mv'[vector]} of {param_labels[j]}"

    for step in range(n_steps):
        tokens = tokenizer.encode(names[step % len(names)])
        lr_t = learning_rate(lr, step, steps)
        ours, theirs = compiled.train_step(tokens, lr_t), interpreted.train_step(tokens, lr_t)
        where = f"step {step + 1} ({names[step % len(names)]!r}, {positions_of(tokens, config)} positions)"
        problem = (None if same_bits(ours, theirs) else cli.describe_difference('the loss', ours, theirs)) \
            or first_difference(compiled.params(), interpreted.params(), lambda i: param_labels[i]) \
            or first_difference(compiled.optimizer_state(), interpreted.optimizer_state(), state_label)
        if problem:
            return f"{where}: {problem}"
        say(f"check step {step + 1}/{n_steps}: loss {ours:.17g}, {n_params:,} parameters and the "
            f"Adam state bit-identical")
    return None


def check_run(args, compiled, names, tokenizer, config, weights, say):
    """``--check N``: the first N steps compiled and on the interpreter; 0 when bit-identical."""
    say(f"checking the first {args.check} step{'s' * (args.check != 1)} against the interpreter")
    labels = [f'{name}[{i}][{j}]' for name, rows, cols in matrix_shapes(config)
              for i in range(rows) for j in range(cols)]
    problem = check(compiled, interpreter_model(config, weights, args.lr), names, tokenizer, config,
                    args.check, args.steps, args.lr, labels, say)
    if problem:
        print(f"check failed at {problem}", file=sys.stderr)
        return cli.EXIT_ERROR
    print(f"check passed: {args.check} step{'s' * (args.check != 1)}, every loss, parameter and "
          f"Adam state number bit-identical to the interpreter's", flush=True)
    return 0


def interpreter_model(config, weights, lr):
    """The interpreter's copy for ``--check`` (a seam: tests perturb it to see the check fail)."""
    return InterpreterGPT(config, weights, lr)


# ---- command line -------------------------------------------------------------

def parse_args(argv):
    number = cli.number
    parser = argparse.ArgumentParser(
        prog='microgpt_train.py', description=__doc__.split('\n\n')[0],
        epilog='--metrics is checked before any work and replaced atomically. Exit status: 0 done '
               '(or --check found every step identical); 1 error, diverged, or --check found a '
               'difference; 2 bad arguments; 130, 143 or 129 when stopped by Ctrl-C, SIGTERM or '
               'SIGHUP (after the current step, with --metrics still written).')
    parser.add_argument('--steps', metavar='N', type=number(int, 1), default=1000,
                        help='Adam steps, one name each (default: %(default)s)')
    parser.add_argument('--n-embd', metavar='N', type=number(int, 1), default=16,
                        help='embedding width (default: %(default)s)')
    parser.add_argument('--n-layer', metavar='N', type=number(int, 0), default=1,
                        help='transformer blocks (default: %(default)s)')
    parser.add_argument('--n-head', metavar='N', type=number(int, 1), default=4,
                        help='attention heads; must divide --n-embd (default: %(default)s)')
    parser.add_argument('--block-size', metavar='N', type=number(int, 1), default=16,
                        help='most positions of a name (default: %(default)s)')
    parser.add_argument('--lr', metavar='LR', type=number(float, 0, inclusive=False), default=1e-2,
                        help='Adam learning rate at the first step, decaying linearly to 0 '
                             '(default: %(default)s)')
    parser.add_argument('--seed', metavar='S', type=int, default=42,
                        help='seeds the shuffle of the names, the initial weights and the '
                             'sampling (default: %(default)s)')
    parser.add_argument('--data', metavar='FILE', default=NAMES,
                        help='names to learn, one a line (default: data/names.txt)')
    parser.add_argument('--cc', metavar='CC', help="C compiler: tcc, clang, gcc or a path "
                                                   "(default: $CC, else the best one installed)")
    parser.add_argument('--samples', metavar='N', type=number(int, 0), default=20,
                        help='names to generate after training (default: %(default)s)')
    parser.add_argument('--temperature', metavar='T', type=number(float, 0, inclusive=False),
                        default=0.5, help='sampling temperature, in (0, 1] usually (default: %(default)s)')
    parser.add_argument('--metrics', metavar='PATH',
                        help='write the run as JSON: settings, timings, every step\'s loss, samples')
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument('--interpreter', action='store_true',
                      help='train on the micrograd interpreter instead (about 0.1 s a step)')
    mode.add_argument('--check', metavar='N', type=number(int, 1),
                      help='run only the first N steps, compiled and on the interpreter, and '
                           'exit 1 unless every loss and parameter is bit-identical')
    chatter = parser.add_mutually_exclusive_group()
    chatter.add_argument('-q', '--quiet', action='store_true',
                         help='print only the final line and the samples (and errors)')
    chatter.add_argument('-v', '--verbose', action='store_true', help="print every step's loss")
    args = parser.parse_args(argv)
    if args.n_embd % args.n_head:
        parser.error(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}: "
                     f"each head takes n_embd / n_head of the embedding")
    if args.check is not None and args.check > args.steps:
        parser.error(f"--check {args.check} is more than --steps {args.steps}")
    if args.check is not None and args.metrics:
        parser.error("--check runs only the comparison: --metrics does not apply")
    return args


def step_printer(args):
    if not args.verbose:
        return None
    width = len(str(args.steps))
    return lambda step, loss: print(f"step {step:{width}}/{args.steps}  loss {loss:.4f}", flush=True)


def metrics(args, config, n_params, compiled, result, samples):
    losses, seconds, timings = result.losses, result.step_seconds, compiled and compiled.model.timings
    return {
        'steps': len(losses), 'steps_requested': args.steps,
        'backend': 'interpreter' if compiled is None else 'compiled',
        'config': {'vocab_size': config.vocab_size, 'n_embd': config.n_embd, 'n_layer': config.n_layer,
                   'n_head': config.n_head, 'block_size': config.block_size},
        'params': n_params, 'lr': args.lr, 'betas': list(BETAS), 'eps': ADAM_EPS, 'seed': args.seed,
        'data': args.data, 'compile_s': sum(timings.values()) if compiled else None,
        'timings': dict(timings) if compiled else None,
        'compiler': cli.build_info(compiled.model) if compiled else None, 'train_s': result.seconds,
        'ms_per_step_median': 1e3 * statistics.median(seconds) if seconds else None,
        'ms_per_step_mean': 1e3 * mean(seconds) if seconds else None,
        'loss_first100': mean(losses[:AVERAGE_STEPS]), 'loss_last100': mean(losses[-AVERAGE_STEPS:]),
        'losses': losses, 'stopped': result.stopped, 'message': result.message or None,
        'temperature': args.temperature, 'samples': samples,
    }


if __name__ == '__main__':
    sys.exit(main())
