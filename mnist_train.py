"""Train a micrograd MLP or LeNet on MNIST (or Fashion-MNIST), compiled to C once.

    python mnist_train.py                   # the embedded 4,000 + 1,000 digits, offline
    python mnist_train.py --model lenet     # a LeNet-5 style conv net instead of the MLP
    python mnist_train.py --data DIR        # a folder of the four IDX files
    python mnist_train.py --fashion         # Debian's dataset-fashion-mnist package
    python mnist_train.py --download        # full MNIST, fetched into the cache folder

The network is ``micrograd.nn.MLP`` with ``cross_entropy`` (``mnist_data.mnist_graph``),
or with ``--model lenet`` convolutions from ``micrograd.nn`` (``mnist_data.lenet_graph``),
traced and compiled by ``compiler.compile`` once with its optimizer; training
is one ``train_batch`` call (one step on the mean gradient) per mini-batch.
An input row is the 784 pixels scaled to [0, 1], then the one-hot label.
The plumbing (output checks, progress, signals, plots) is ``compiler/cli.py``;
weights files are ``compiler/weights.py``.

Exit status: 0 when training ends; 1 on an error, when the loss diverges, or
when training collapses (final test accuracy at most 1.5 / N_CLASSES, no
better than guessing); 128 + the signal's number when stopped by SIGINT
(130), SIGHUP (129) or SIGTERM (143): training stops after the current batch
and ``--save``, ``--metrics``, ``--plot`` and ``--export`` are still written.
"""
import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field

try:
    import numpy as np
except ImportError:
    sys.exit("mnist_train.py needs numpy; set up with: "
             "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'")

import compiler
import mnist_data
from compiler import cli
from compiler.export import SO_NAME
from compiler.build.cache import cache_root
from compiler.files import atomic_write
from compiler.model import MAX_THREADS, resolve_threads
from compiler.weights import WeightsError, read as read_weights_file
from micrograd import gc_paused
from mnist_data import MODELS, N_CLASSES, ModelSpec, input_rows


def main(argv=None):
    return cli.run_cli(parse_args, run, argv)


def run(args):
    """Compile, then train, then evaluate: the whole program."""
    say, spec = cli.sayer(args.quiet), ModelSpec(args.model, args.hidden)
    try:        # everything that can be refused is refused before any work
        check_outputs(args)
        if args.plot:
            cli.require_matplotlib()
        threads = resolve_threads(args.threads)         # a bad $MICROGRAD_THREADS, now
        saved = read_weights(args.load, spec.sizes, spec.name, spec.n_params) if args.load else None
        dataset, data = load_dataset(args)
    except (ImportError, OSError, ValueError) as e:     # WeightsError is a ValueError
        return cli.fail(e)
    images, labels = data['train']
    say(f"data: {dataset}: {len(images):,} training and {len(data['test'][0]):,} test images")
    try:
        model = build_model(spec.hidden, seed=args.seed, cc=args.cc, optimizer=args.optimizer,
                            lr=args.lr, threads=threads, model=spec.name)           # compile
        say(f"model: {spec.description}, {model.n_params:,} parameters; "
            f"{OPTIMIZERS[args.optimizer][0]}, learning rate {args.lr:g}")
        say(cli.compile_line(model))
        if args.verbose:
            print(model.summary(), flush=True)
        if saved is not None:
            say(load_saved(model, args.load, saved, args.optimizer))
    except (compiler.BuildError, WeightsError) as e:   # the file changed since it was read
        return cli.fail(e)
    with cli.stop_on_signals() as stop:     # the first signal stops after the batch
        if args.epochs == 0:
            test = evaluate(model, *data['test'])                                   # evaluate
            train_acc = evaluate(model, images[:TRAIN_ACCURACY_IMAGES], labels[:TRAIN_ACCURACY_IMAGES])
            print(f"test loss {test.loss:.4f}  train acc {train_acc.accuracy:.4f}  "
                  f"test acc {test.accuracy:.4f}", flush=True)      # the final line, even with --quiet
        elif len(images) > TRAIN_ACCURACY_IMAGES:
            say(f"(train acc is measured on the first {TRAIN_ACCURACY_IMAGES:,} training images)")
        started = time.perf_counter()
        result = train(model, data, args.epochs, args.batch_size, args.lr, seed=args.seed,  # train
                       progress=cli.progress_for(args), on_batch=batch_printer(args), stop=stop,
                       on_epoch=lambda e: say(epoch_line(e, args.epochs)))                # + evaluate
        failed = report_outcome(args, result, time.perf_counter() - started)
        failed |= not write_outputs(args, dataset, data, model, spec, result, say)
    if stop.is_set():
        return cli.exit_status(stop.signum)
    return cli.EXIT_ERROR if failed else 0


# Train accuracy is measured on at most this many training images (the first
# ones, the same every epoch): on all 60,000 it would add a third to each epoch.
TRAIN_ACCURACY_IMAGES = 10_000
PREDICT_CHUNK = 2_000   # rows per predict call: bounds the float64 copy of the images
# A run that trained and ends at most this close to guessing (chance is
# 1 / N_CLASSES) has collapsed: --lr 50 on the embedded digits ends at
# exactly 0.1000 with a finite loss.
COLLAPSED_ACCURACY = 1.5 / N_CLASSES
NO_HIDDEN = 'none'      # --hidden none: a 784-10 network, softmax regression
# --optimizer NAME: its name in messages, its default --lr, and what it
# compiles into the module (None: train_batch's plain SGD step). Momentum 0.9
# makes steps up to ten times larger, hence the smaller rate; Adam's is the
# usual 1e-3 (Kingma and Ba, 2015).
MOMENTUM = 0.9
OPTIMIZERS = {
    'sgd': ('SGD', 0.1, lambda lr: None),
    'momentum': (f'SGD with momentum {MOMENTUM}', 0.01, lambda lr: compiler.SGD(lr, momentum=MOMENTUM)),
    'adam': ('Adam', 1e-3, lambda lr: compiler.Adam(lr)),
}
EXPORT_FILES = ('nn.c', 'nn.h', SO_NAME, 'nn.json')     # what CompiledModel.export writes in its folder


# ---- the model --------------------------------------------------------------

def layer_sizes(hidden, model='mlp'):
    return ModelSpec(model, hidden).sizes


def architecture(sizes):
    return '-'.join(str(s) for s in sizes)


def build_model(hidden=None, seed=0, cc=None, optimizer='sgd', lr=None, threads=None, model='mlp'):
    """Trace ``MLP(784, hidden + [10])`` (or the LeNet, ``model='lenet'``,
    with ``hidden`` linear layers) and its cross-entropy loss once and
    compile it with ``optimizer`` (a key of ``OPTIMIZERS``; ``lr`` defaults
    to its rate). The label is an input, so one module serves every image."""
    _, default_lr, make = OPTIMIZERS[optimizer]
    with gc_paused():       # the graph is dropped inside: the collector never scans it
        graph = ModelSpec(model, hidden).graph(seed)
        compiled = compiler.compile(graph.loss, inputs=graph.inputs, params=graph.params,
                                    outputs=graph.logits, cc=cc, threads=threads,
                                    optimizer=make(default_lr if lr is None else lr))
        del graph
    return compiled


@dataclass
class Scores:
    loss: float         # mean cross-entropy over the images
    accuracy: float


def evaluate(model, images, labels):
    """Cross-entropy and accuracy of the model's logits (``predict``) on
    ``images``: in numpy, float64, log-softmax shifted by the largest logit
    (``exp`` cannot overflow), ``-(z_y - max z) + log sum exp(z - max z)``."""
    loss_sum, correct = 0.0, 0
    for start in range(0, len(images), PREDICT_CHUNK):
        chunk = labels[start:start + PREDICT_CHUNK].astype(np.intp)
        logits = model.predict(input_rows(images[start:start + PREDICT_CHUNK], chunk))
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_sum = np.log(np.exp(shifted).sum(axis=1))
        loss_sum += float((log_sum - shifted[np.arange(len(chunk)), chunk]).sum())
        correct += int((logits.argmax(axis=1) == chunk).sum())
    return Scores(loss_sum / len(images), correct / len(images))


# ---- training ---------------------------------------------------------------

@dataclass
class Epoch:
    epoch: int
    loss: float             # mean over the epoch's images, each at the weights of its batch
    test_loss: float        # mean cross-entropy over the test images, at the epoch's final weights
    train_accuracy: float
    test_accuracy: float
    train_seconds: float    # the batches only
    seconds: float          # with both evaluation passes


@dataclass
class Training:
    stopped: str                        # 'completed', 'interrupted' or 'diverged'
    history: list = field(default_factory=list)
    batch_losses: list = field(default_factory=list)    # every finite batch loss, in order
    message: str = ''                   # what happened, for interrupted or diverged runs
    divergence: dict = None             # epoch, batch and reason, when diverged
    signal: str = None                  # 'SIGINT', 'SIGTERM' or 'SIGHUP', when interrupted


def train(model, data, epochs, batch_size, lr, seed=0, progress=None, on_epoch=None, on_batch=None,
          stop=None):
    """One step of the model's optimizer at rate ``lr`` per shuffled
    mini-batch of ``data['train']`` (``numpy.random.default_rng(seed)``, a
    fresh permutation every epoch), both evaluations after each epoch;
    returns a ``Training``. ``progress(label, total)`` makes an epoch's
    progress display, ``on_batch(epoch, batch, n_batches, loss)`` and
    ``on_epoch(Epoch)`` hear about each; ``stop`` is a ``cli.StopRequest``.

    Divergence: a batch whose loss is not finite, or weights that are not
    (a ReLU turns NaN into 0, so NaN weights can hide behind a finite loss),
    stop training, and the model gets back the weights that last gave a
    finite loss (``train_batch`` reports the loss of the weights it started
    from); if the first batch's loss is not finite, it keeps its start.
    """
    if stop is None:
        with cli.stop_on_signals() as stop:
            return train(model, data, epochs, batch_size, lr, seed, progress, on_epoch, on_batch, stop)
    images, labels = data['train']
    rng = np.random.default_rng(seed)
    n_batches = math.ceil(len(images) / batch_size)
    good_weights, any_finite = model.params(), False
    result = Training('completed')
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        order = rng.permutation(len(images))
        bar = progress(f'epoch {epoch:{len(str(epochs))}}/{epochs}', len(images)) if progress else None
        loss_sum, done = 0.0, 0
        for batch in range(1, n_batches + 1):
            picked = order[(batch - 1) * batch_size:batch * batch_size]
            rows = input_rows(images[picked], labels[picked])
            weights = model.params()
            problem = None if np.isfinite(weights).all() else 'the weights are no longer finite'
            if problem is None:
                loss = model.train_batch(rows, lr)
                problem = None if math.isfinite(loss) else f'the loss is {loss}'
            if problem:
                if bar:
                    bar.close()
                model.set_params(good_weights)
                result.stopped = 'diverged'
                result.divergence = {'epoch': epoch, 'batch': batch, 'reason': problem}
                where = f"diverged at epoch {epoch}, batch {batch} of {n_batches}: {problem}"
                result.message = (f"{where} (learning rate {lr:g} too high?); the model holds the last "
                                  f"weights that gave a finite loss" if any_finite else
                                  f"{where} with the starting weights, before any update: no weights "
                                  f"gave a finite loss; the model keeps the ones it started from")
                return result
            good_weights, any_finite = weights, True
            result.batch_losses.append(loss)
            loss_sum, done = loss_sum + loss * len(rows), done + len(rows)
            if on_batch:
                on_batch(epoch, batch, n_batches, loss)
            if bar:
                bar.update(done, loss_sum / done, force=batch == n_batches)
            if stop.is_set():
                if bar:
                    bar.close()
                return interrupted(result, stop, f"at epoch {epoch}, batch {batch} of {n_batches}")
        train_seconds = time.perf_counter() - started
        if bar:
            bar.close()
        train_scores = evaluate(model, images[:TRAIN_ACCURACY_IMAGES], labels[:TRAIN_ACCURACY_IMAGES])
        test_scores = evaluate(model, *data['test'])
        finished = Epoch(epoch, loss_sum / done, test_scores.loss, train_scores.accuracy,
                         test_scores.accuracy, train_seconds, time.perf_counter() - started)
        result.history.append(finished)
        if on_epoch:
            on_epoch(finished)
        if stop.is_set():    # a signal during the evaluation passes
            return interrupted(result, stop, f"after epoch {epoch}")
    return result


def interrupted(result, stop, where):
    result.stopped, result.signal = 'interrupted', stop.name
    result.message = f"interrupted by {stop.name} {where}"
    return result


def collapsed(result):
    """True when the run trained and its final test accuracy is at chance
    level (at most ``COLLAPSED_ACCURACY``), whatever its loss."""
    return (result.stopped != 'diverged' and bool(result.history)
            and result.history[-1].test_accuracy <= COLLAPSED_ACCURACY)


# ---- command line -----------------------------------------------------------

def hidden_sizes(text):
    """``'50'`` -> ``[50]``, ``'128,64'`` -> ``[128, 64]``, ``'none'`` or ``''`` -> ``[]``."""
    if text.strip().lower() in ('', NO_HIDDEN):
        return []
    try:
        sizes = [int(part) for part in text.split(',')]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive layer sizes like 50 or 128,64 "
                                         f"(or {NO_HIDDEN} for no hidden layer), got {text!r}")
    return sizes


def hidden_option(sizes):
    """The ``--hidden`` value that builds ``sizes`` hidden layers."""
    return ','.join(map(str, sizes)) if sizes else NO_HIDDEN


def parse_args(argv):
    number = cli.number
    parser = argparse.ArgumentParser(
        prog='mnist_train.py', description=__doc__.split('\n\n')[0],
        epilog='--save, --metrics, --plot and --export are checked before any work; files are '
               'replaced atomically with the permissions the umask gives, and written through a '
               'symlink to its target. Exit status: 0 done; 1 error, diverged, or collapsed (final '
               f'test accuracy at most {COLLAPSED_ACCURACY:.2f}, chance level); 130, 143 or 129 when '
               'stopped by Ctrl-C, SIGTERM or SIGHUP (after the current batch, with --save, '
               '--metrics, --plot and --export still written).')
    source = parser.add_mutually_exclusive_group()
    source.add_argument('--data', metavar='DIR', help='folder of MNIST-format IDX files (MNIST, '
                        'Fashion-MNIST, ...); default: the embedded 4,000 + 1,000 MNIST digits')
    source.add_argument('--fashion', action='store_true',
                        help="Fashion-MNIST from Debian's dataset-fashion-mnist package")
    source.add_argument('--download', action='store_true',
                        help=f'fetch the full MNIST (SHA-256 checked) into {default_download_dir()}')
    parser.add_argument('--mirror', metavar='URL', default=mnist_data.download.MNIST_URL,
                        help='where --download fetches the four .gz files from (default: %(default)s)')
    parser.add_argument('--model', choices=MODELS, default='mlp',
                        help='mlp: an MLP (the default); lenet: a LeNet-5 style conv net (conv 5x5 '
                             'with 6 channels, max-pool 2, conv 5x5 with 16, max-pool 2, then '
                             'linear layers); each convolution compiles to one lifted op')
    parser.add_argument('--hidden', metavar='N,N', type=hidden_sizes,
                        help=f'hidden linear layer sizes, e.g. 50 (the MLP\'s default) or 128,64 '
                             f'(LeNet\'s default: 120,84); {NO_HIDDEN} for no hidden layer')
    parser.add_argument('--epochs', metavar='N', type=number(int, 0), default=10,
                        help='passes over the training set; 0 only evaluates (default: %(default)s)')
    parser.add_argument('--batch-size', metavar='N', type=number(int, 1), default=32,
                        help='images per training step (default: %(default)s)')
    parser.add_argument('--optimizer', choices=OPTIMIZERS, default='sgd',
                        help=f'sgd: plain SGD (the default); momentum: SGD with momentum {MOMENTUM}; '
                             f'adam: Adam (betas 0.9, 0.999), compiled into the module with its '
                             f'state, which --save keeps and --load restores')
    parser.add_argument('--lr', metavar='LR', type=number(float, 0, inclusive=False),
                        help='learning rate, applied to the mean gradient of a batch (default: '
                             + ', '.join(f'{lr:g} for {name}' for name, (_, lr, _) in OPTIMIZERS.items())
                             + ')')
    parser.add_argument('--seed', metavar='S', type=number(int, 0), default=0,
                        help='seeds the initial weights and the per-epoch shuffle (default: %(default)s)')
    parser.add_argument('--limit', metavar='N', type=number(int, 1),
                        help='train on the first N training images only')
    parser.add_argument('--cc', metavar='CC', help="C compiler: tcc, clang, gcc or a path "
                                                   "(default: $CC, else the best one installed)")
    parser.add_argument('--threads', metavar='N', type=number(int, 1, maximum=MAX_THREADS),
                        help='threads that train and predict, the same results for any number '
                             '(default: $MICROGRAD_THREADS, else every core this process may use)')
    parser.add_argument('--load', metavar='PATH', help="start from weights saved by --save, and from "
                        "their optimizer's state if it is this --optimizer's")
    parser.add_argument('--save', metavar='PATH', help="write the final weights and the optimizer's "
                        "state (.npz); when PATH is the --load file, the previous one is kept as PATH.bak")
    parser.add_argument('--metrics', metavar='PATH',
                        help='write the run as JSON: per-epoch losses and accuracies, per-batch losses')
    parser.add_argument('--plot', metavar='PATH', help='draw loss and accuracy curves (PNG; needs matplotlib)')
    parser.add_argument('--export', metavar='DIR',
                        help='write the trained model as a folder that `import nn` works from, with '
                             'neither micrograd nor the compiler: nn.c, nn.h, nn.abi3.so, nn.json '
                             '(DIR is created, or must be empty or an earlier export)')
    chatter = parser.add_mutually_exclusive_group()
    chatter.add_argument('-q', '--quiet', action='store_true', help='print only the final line (and errors)')
    chatter.add_argument('-v', '--verbose', action='store_true',
                         help="print what was compiled (m.summary()) and every batch's loss")
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = OPTIMIZERS[args.optimizer][1]
    return args


def default_download_dir():
    """Where ``--download`` keeps MNIST: beside the compiler's build cache."""
    return os.path.join(cache_root(), 'mnist')


def check_outputs(args):
    """``--save``, ``--metrics``, ``--plot`` and ``--export`` checked before any work."""
    cli.check_outputs({'save': args.save, 'metrics': args.metrics, 'plot': args.plot},
                      {'save': 'weights.npz', 'metrics': 'metrics', 'plot': 'plot'},
                      load=args.load, folder=('export', args.export, EXPORT_FILES))


def load_dataset(args):
    """``(description, {'train': ..., 'test': ...})`` for ``--data``, ``--fashion``,
    ``--download`` or the embedded digits, the training set cut to ``--limit``."""
    name, data = mnist_data.load_source(args.data, args.fashion, args.download and default_download_dir(),
                                        args.mirror)
    if args.limit:
        data['train'] = tuple(part[:args.limit] for part in data['train'])
    return name, data


# ---- weights files ----------------------------------------------------------

def save_weights(model, path, sizes, optimizer='sgd', kind='mlp'):
    """``model.save_weights`` with the ``--model``, its linear layer sizes and
    the ``--optimizer`` as metadata."""
    model.save_weights(path, metadata={'model': kind, 'layer_sizes': sizes, 'optimizer': optimizer})


def read_weights(path, sizes, kind='mlp', n_params=None):
    """The arrays of a weights file (``compiler.weights.read`` checks the
    file itself) saved by ``--save`` for a ``--model kind`` network of
    linear layer ``sizes`` and ``n_params`` parameters (default: an MLP's):
    read before any work, so that a bad file is refused at once. Files
    without a ``meta_model`` (older ones) hold MLPs."""
    saved = read_weights_file(path)
    not_ours = f"{path}: not a weights file written by --save"
    saved_kind = str(saved['meta_model']) if 'meta_model' in saved else 'mlp'
    if saved_kind not in MODELS:
        raise WeightsError(f"{not_ours}: its model is {saved_kind!r}, not one of {', '.join(MODELS)}")
    if saved_kind != kind:
        raise WeightsError(f"{path} holds a --model {saved_kind} network, but this run builds "
                           f"--model {kind}; pass --model {saved_kind} to use it")
    saved_sizes = saved.get('meta_layer_sizes')
    if saved_sizes is None:
        raise WeightsError(f"{not_ours}: it has no layer sizes (meta_layer_sizes)")
    if saved_sizes.ndim != 1 or saved_sizes.dtype.kind not in 'iu' or len(saved_sizes) < 2 or saved_sizes.min() < 1:
        raise WeightsError(f"{not_ours}: its layer sizes are {saved_sizes!r}")
    saved_sizes = [int(s) for s in saved_sizes]
    if saved_sizes != list(sizes):
        hint = (f"; pass --hidden {hidden_option(saved_sizes[1:-1])} to use it"
                if saved_sizes[0] == sizes[0] and saved_sizes[-1] == N_CLASSES else '')
        raise WeightsError(f"{path} holds a {architecture(saved_sizes)} network, "
                           f"but this run builds {architecture(sizes)}{hint}")
    expected = n_params or sum((n_in + 1) * n_out for n_in, n_out in zip(sizes, sizes[1:]))
    if saved['params'].shape != (expected,):
        raise WeightsError(f"{path}: {saved['params'].size} parameters; a {architecture(sizes)} "
                           f"network has {expected}")
    return saved


def load_saved(model, path, saved, optimizer):
    """Set ``model``'s weights from the file ``read_weights`` checked, and its
    optimizer's state when the file holds this one's; returns what was loaded."""
    model.load_weights(path)
    state = saved.get('optimizer_state')
    saved_vectors = state is not None and state.size > 1        # more than a step count
    if saved_vectors and np.array_equal(model.optimizer_state(), state):
        return (f"loaded weights and {OPTIMIZERS[optimizer][0]} state "
                f"(after {int(state[0]):,} steps) from {path}")
    if saved_vectors:
        other = (f"--optimizer {saved['meta_optimizer']}" if 'meta_optimizer' in saved else
                 f"the optimizer {saved['optimizer']}" if 'optimizer' in saved else 'no optimizer')
        return (f"loaded weights from {path}, without its optimizer state ({other}'s; "
                f"this run uses --optimizer {optimizer})")
    return f"loaded weights from {path}"


# ---- reports ----------------------------------------------------------------

def epoch_line(e, epochs):
    return (f"epoch {e.epoch:{len(str(epochs))}}/{epochs}  train loss {e.loss:.4f}  test loss "
            f"{e.test_loss:.4f}  train acc {e.train_accuracy:.4f}  test acc {e.test_accuracy:.4f}  "
            f"{e.seconds:.1f} s")


def batch_printer(args):
    if not args.verbose:
        return None
    return lambda epoch, batch, n_batches, loss: print(
        f"epoch {epoch}/{args.epochs}  batch {batch:{len(str(n_batches))}}/{n_batches}  loss {loss:.4f}")


def report_outcome(args, result, seconds):
    """Print how training ended (the final line; what went wrong on stderr);
    True when the run failed: it diverged, or collapsed to chance level."""
    if result.message:
        print(result.message, file=sys.stderr)
    if result.history:
        last, n = result.history[-1], len(result.history)
        print(f"trained {n} epoch{'s' if n != 1 else ''} in {seconds:.1f} s: "
              f"test loss {last.test_loss:.4f}  test acc {last.test_accuracy:.4f}", flush=True)
    if not collapsed(result):
        return result.stopped == 'diverged'
    last, steps, guessing = result.history[-1], len(result.batch_losses), math.log(N_CLASSES)
    if last.test_loss > 2 * guessing:
        why = (f"its test loss {last.test_loss:.4f} is far worse than guessing's {guessing:.4f}: "
               f"learning rate {args.lr:g} too high?")
    else:
        why = (f"after {steps} {OPTIMIZERS[args.optimizer][0]} step{'s' * (steps != 1)} at learning "
               f"rate {args.lr:g}: train longer, or change the rate")
    print(f"training collapsed: the final test accuracy {last.test_accuracy:.4f} is no better than "
          f"guessing (chance is {1 / N_CLASSES:.2f}; a run at or below {COLLAPSED_ACCURACY:.2f} "
          f"counts as failed); {why}", file=sys.stderr)
    return True


def write_outputs(args, dataset, data, model, spec, result, say):
    """``--save`` (keeping the ``--load`` file as ``.bak`` if it is the same),
    ``--metrics``, ``--plot``, ``--export``; False if one could not be written."""
    batches_per_epoch = math.ceil(len(data['train'][0]) / args.batch_size)
    if args.save:
        backup = cli.keep_backup(args.save) if args.load and cli.same_file(args.load, args.save) else None
        save_weights(model, args.save, spec.sizes, args.optimizer, spec.name)
        say(f"saved weights to {args.save}" + (f" (the previous file is kept as {backup})" if backup else ''))
    if args.metrics:
        n_train = len(data['train'][0])
        report = {'dataset': dataset, 'train_images': n_train, 'test_images': len(data['test'][0]),
                  'train_accuracy_images': min(n_train, TRAIN_ACCURACY_IMAGES), 'model': spec.name,
                  'layer_sizes': spec.sizes,
                  'params': model.n_params, 'epochs': args.epochs, 'batch_size': args.batch_size,
                  'optimizer': args.optimizer, 'lr': args.lr, 'seed': args.seed, 'threads': model.threads,
                  'compiler': cli.build_info(model), 'timings': dict(model.timings),
                  'history': [asdict(e) for e in result.history], 'batches_per_epoch': batches_per_epoch,
                  'batch_losses': result.batch_losses, 'stopped': result.stopped, 'signal': result.signal,
                  'divergence': result.divergence, 'collapsed': collapsed(result)}
        with atomic_write(args.metrics, 'w') as f:
            f.write(json.dumps(report, indent=1))
    if args.plot and result.history:
        cli.plot_curves(args.plot, result.history, f"{spec.description} on {dataset}",
                        result.batch_losses, batches_per_epoch)
        say(f"plotted to {args.plot}")
    elif args.plot:
        print(f"no finished epoch: {args.plot} not written", file=sys.stderr)
    if args.export:
        try:
            model.export(args.export)
        except (compiler.BuildError, compiler.ExportError, OSError) as e:
            print(f"error: --export {args.export}: {e}", file=sys.stderr)
            return False
        say(f"exported the model to {args.export}: {', '.join(EXPORT_FILES)} "
            f"(sys.path.insert(0, {args.export!r}); import nn)")
    return True


if __name__ == '__main__':
    sys.exit(main())
