"""Train Karpathy's microgpt on a list of names, compiled to C once.

    python microgpt_train.py                    # 1,000 Adam steps on data/names.txt, then 20 names
    python microgpt_train.py --interpreter      # the same training on the micrograd interpreter (slow)
    python microgpt_train.py --check 5          # the first 5 steps both ways: bit-identical or exit 1

The model is Karpathy's microgpt on ``micrograd`` ``Value``s (``microgpt.py``),
traced once for ``--block-size`` positions with the tokens and targets as
one-hot inputs, so one compiled program serves every name; ``forward(n)``
runs only a name's ``n`` positions. A step's loss is the mean of the
per-position cross-entropies; Adam (the rate decaying linearly to 0) runs in
C. ``--interpreter`` trains the way microgpt does (a graph per name,
``backward()``, ``compiler.Adam.reference_step`` in Python): the same
arithmetic in the same order, so the same bits, which ``--check N`` proves
for the first ``N`` steps. The plumbing is ``compiler/cli.py``.

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
from microgpt import matrix_shapes, positions_of, prepare, probabilities, sequence_graph, value_weights
from microgpt import RMS_EPS, Tokenizer, flatten  # noqa: F401 -- for benchmarks/bench_microgpt.py and the tests
from micrograd import gc_paused

NAMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'names.txt')
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


# ---- the two ways to train ------------------------------------------------------

def adam(lr):
    return compiler.Adam(lr, betas=BETAS, eps=ADAM_EPS)


class CompiledGPT:
    """microgpt traced once for ``block_size`` positions and compiled; each
    step runs only the name's positions."""

    def __init__(self, config, weights, lr, cc=None):
        self.config = config
        with gc_paused():   # millions of nodes, dropped inside: the collector never scans them
            sd, params = value_weights(weights)
            graph = sequence_graph(sd, config, config.block_size)
            self.model = compiler.compile(graph.losses, graph.inputs, params,
                                          outputs=[z for row in graph.logits for z in row],
                                          optimizer=adam(lr), cc=cc)
            n_inputs = len(graph.inputs)
            del sd, params, graph
        self.row = np.zeros(n_inputs)
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
        # backward() then step(lr, zero_grad=True), with each weight matrix's step
        # begun while the rest of the backward runs (the same bits)
        m.backward_step(lr, zero_grad=True)
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
        with gc_paused():   # the step's graph is freed inside, never scanned
            return self._train_step(tokens, lr)

    def _train_step(self, tokens, lr):
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
