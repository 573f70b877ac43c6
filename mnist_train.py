"""Train a micrograd MLP on MNIST (or Fashion-MNIST), compiled to C once.

    python mnist_train.py                   # the embedded 4,000 + 1,000 digits, offline
    python mnist_train.py --data DIR        # a folder of the four IDX files
    python mnist_train.py --fashion         # Debian's dataset-fashion-mnist package
    python mnist_train.py --download        # full MNIST, fetched into the cache folder

The network is ``micrograd.nn.MLP`` with ``cross_entropy``, traced and compiled
by ``compiler.compile`` once; training is one ``train_batch`` call (one SGD
step on the mean gradient) per mini-batch. An input row is the 784 pixels
scaled to [0, 1] followed by the one-hot label, so the label is an input of
the graph like the pixels.

Exit status: 0 when training ends, 1 on an error or when the loss diverges,
130 when stopped by Ctrl-C (after the current batch; ``--save`` still saves).
"""
import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import compiler
import mnist_data
from compiler.files import atomic_write, cache_root
from mnist_data import N_CLASSES, N_PIXELS, input_rows, mnist_graph
# Train accuracy is measured on at most this many training images (the first
# ones, the same every epoch): on the full 60,000 a forward pass over all of
# them would add a third to the time of each epoch.
TRAIN_ACCURACY_IMAGES = 10_000
PREDICT_CHUNK = 2_000   # rows per predict call: bounds the float64 copy of the images
EXIT_ERROR, EXIT_INTERRUPTED = 1, 130


def default_download_dir():
    """Where ``--download`` keeps MNIST: beside the compiler's build cache."""
    return os.path.join(cache_root(), 'mnist')


# ---- command line -----------------------------------------------------------

def hidden_sizes(text):
    """``'50'`` -> ``[50]``, ``'128,64'`` -> ``[128, 64]``."""
    try:
        sizes = [int(part) for part in text.split(',')]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive layer sizes like 50 or 128,64, got {text!r}")
    return sizes


def _number(kind, minimum, inclusive=True):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value >= minimum if inclusive else value > minimum) or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {minimum}, got {text}")
        return value
    return parse


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog='mnist_train.py', description=__doc__.split('\n\n')[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument('--data', metavar='DIR',
                        help='folder of MNIST-format IDX files (MNIST, Fashion-MNIST, ...); '
                             'default: the embedded 4,000 + 1,000 MNIST digits')
    source.add_argument('--fashion', action='store_true',
                        help="Fashion-MNIST from Debian's dataset-fashion-mnist package")
    source.add_argument('--download', action='store_true',
                        help=f'fetch the full MNIST (SHA-256 checked) into {default_download_dir()}')
    parser.add_argument('--mirror', default=mnist_data.download.MNIST_URL,
                        help='where --download fetches the four .gz files from (default: %(default)s)')
    parser.add_argument('--hidden', type=hidden_sizes, default=[50],
                        help='hidden layer sizes, e.g. 50 (the default) or 128,64')
    parser.add_argument('--epochs', type=_number(int, 0), default=10,
                        help='passes over the training set; 0 only evaluates (default: %(default)s)')
    parser.add_argument('--batch-size', type=_number(int, 1), default=32,
                        help='images per SGD step (default: %(default)s)')
    parser.add_argument('--lr', type=_number(float, 0, inclusive=False), default=0.1,
                        help='SGD learning rate, applied to the mean gradient of a batch '
                             '(default: %(default)s)')
    parser.add_argument('--seed', type=int, default=0,
                        help='seeds the initial weights and the per-epoch shuffle (default: %(default)s)')
    parser.add_argument('--limit', type=_number(int, 1), metavar='N',
                        help='train on the first N training images only')
    parser.add_argument('--cc', help="C compiler: tcc, clang, gcc or a path "
                                     "(default: $CC, else the best one installed)")
    parser.add_argument('--load', metavar='PATH', help='start from weights saved by --save')
    parser.add_argument('--save', metavar='PATH', help='write the final weights (.npz)')
    parser.add_argument('--metrics', metavar='PATH', help='write per-epoch numbers as JSON')
    parser.add_argument('--plot', metavar='PATH', help='draw loss and accuracy curves (PNG; needs matplotlib)')
    return parser.parse_args(argv)


# ---- data -------------------------------------------------------------------

def load_dataset(args):
    """``(description, {'train': (images, labels), 'test': (...)})`` for the chosen source."""
    if args.data:
        name, data = f'IDX files in {args.data}', mnist_data.load(args.data)
    elif args.fashion:
        folder = mnist_data.debian_fashion_mnist_dir()
        if folder is None:
            raise FileNotFoundError("--fashion needs Debian's Fashion-MNIST: apt-get install "
                                    "dataset-fashion-mnist (or pass --data DIR)")
        name, data = f'Fashion-MNIST ({folder})', mnist_data.load(folder)
    elif args.download:
        folder = mnist_data.download_mnist(default_download_dir(), base_url=args.mirror)
        name, data = f'MNIST ({folder})', mnist_data.load(folder)
    else:
        name, data = 'embedded MNIST subset', mnist_data.load_embedded()
    for split, (images, labels) in data.items():
        if images.shape[1:] != (28, 28) or not len(labels) or labels.max() >= N_CLASSES:
            raise ValueError(f"{name}: the {split} split is not 28x28 images labelled 0..9 "
                             f"(images of shape {images.shape}, labels {set(labels[:100].tolist())}...)")
    if args.limit:
        images, labels = data['train']
        data['train'] = (images[:args.limit], labels[:args.limit])
    return name, data


# ---- model ------------------------------------------------------------------

def layer_sizes(hidden):
    return [N_PIXELS, *hidden, N_CLASSES]


def architecture(sizes):
    return '-'.join(str(s) for s in sizes)


def build_model(hidden, seed=0, cc=None):
    """Trace ``MLP(784, hidden + [10])`` and its cross-entropy loss once, and compile it.

    The graph's inputs are the pixels and the one-hot label, so one compiled
    module serves every image; the Value graph is dropped once compiled.
    """
    graph = mnist_graph(hidden, seed=seed)
    return compiler.compile(graph.loss, inputs=graph.inputs, params=graph.params,
                            outputs=graph.logits, cc=cc)


def accuracy(model, images, labels):
    correct = 0
    for start in range(0, len(images), PREDICT_CHUNK):
        rows = input_rows(images[start:start + PREDICT_CHUNK], labels[start:start + PREDICT_CHUNK])
        correct += int((model.predict(rows).argmax(axis=1) == labels[start:start + PREDICT_CHUNK]).sum())
    return correct / len(images)


# ---- weights on disk --------------------------------------------------------

class WeightsError(ValueError):
    """A weights file is unreadable or was saved for another architecture."""

    def __init__(self, message, saved_sizes=None):
        super().__init__(message)
        self.saved_sizes = saved_sizes


def save_weights(path, params, sizes):
    # Written through a file object: np.savez given a name would append '.npz'.
    with atomic_write(path) as f:
        np.savez(f, params=params, layer_sizes=np.asarray(sizes))


def load_weights(path, sizes):
    """The parameter vector saved at ``path``, checked to be for a network of ``sizes``."""
    try:
        with np.load(path) as saved:
            params, saved_sizes = saved['params'], [int(s) for s in saved['layer_sizes']]
    except (OSError, ValueError, KeyError) as e:
        raise WeightsError(f"{path}: not a weights file written by --save ({e})") from None
    if saved_sizes != list(sizes):
        raise WeightsError(f"{path} holds a {architecture(saved_sizes)} network, "
                           f"but this run builds {architecture(sizes)}", saved_sizes)
    expected = sum((n_in + 1) * n_out for n_in, n_out in zip(sizes, sizes[1:]))
    if params.shape != (expected,):
        raise WeightsError(f"{path}: {params.size} parameters, a {architecture(sizes)} network has {expected}")
    return params


# ---- training ---------------------------------------------------------------

class ProgressBar:
    """One line on a terminal, redrawn with ``\\r``: share done, images/s, running loss."""
    WIDTH = 24
    EVERY = 0.1     # seconds between redraws: more would cost time for nothing

    def __init__(self, stream, label, total):
        self.stream, self.label, self.total = stream, label, total
        self.start = self.drawn_at = time.perf_counter()
        self.line_length = 0

    def update(self, done, loss, force=False):
        now = time.perf_counter()
        if not force and now - self.drawn_at < self.EVERY:
            return
        self.drawn_at = now
        filled = self.WIDTH * done // self.total
        rate = done / max(now - self.start, 1e-9)
        line = (f"{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done:,}/{self.total:,}"
                f"  {rate:,.0f} img/s  loss {loss:.4f}")
        self.stream.write('\r' + line.ljust(self.line_length))
        self.stream.flush()
        self.line_length = len(line)

    def close(self):
        """Erase the bar so that the epoch line takes its place."""
        self.stream.write('\r' + ' ' * self.line_length + '\r')
        self.stream.flush()


@dataclass
class Epoch:
    epoch: int
    loss: float             # mean over the epoch's images, each at the weights of its batch
    train_accuracy: float
    test_accuracy: float
    train_seconds: float    # the batches only
    seconds: float          # with both accuracy passes


@dataclass
class Training:
    stopped: str                        # 'completed', 'interrupted' or 'diverged'
    history: list = field(default_factory=list)
    message: str = ''                   # what happened, for interrupted or diverged runs
    divergence: dict = None             # epoch, batch and reason, when diverged


@contextlib.contextmanager
def stop_on_interrupt():
    """The first Ctrl-C sets the yielded event (training stops after the batch); a second one aborts.

    The handler only sets a flag: ``train_batch`` runs in C without the GIL, so
    Python sees the signal when the batch returns, never halfway through it.
    """
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested     # signal handlers can only be set from the main thread
        return

    def handler(signum, frame):
        requested.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


def train(model, data, epochs, batch_size, lr, seed=0, progress=None, on_epoch=None):
    """SGD over ``data['train']`` in shuffled mini-batches; returns a ``Training``.

    ``progress`` is a stream for a ``ProgressBar`` (None: no bar), ``on_epoch``
    is called with each finished ``Epoch``. The shuffle uses
    ``numpy.random.default_rng(seed)``, a fresh permutation every epoch.

    Divergence: before each batch the weights are copied. A batch whose loss
    is NaN or infinite, or weights that are no longer finite (a ReLU turns NaN
    into 0, so NaN first-layer weights can hide behind a finite loss), stop
    training, and the model is set back to the weights that last gave a finite
    loss: those from before the previous batch, since ``train_batch`` reports
    the loss of the weights it started from.
    """
    images, labels = data['train']
    test_images, test_labels = data['test']
    rng = np.random.default_rng(seed)
    n_batches = math.ceil(len(images) / batch_size)
    good_weights = model.params()
    result = Training('completed')
    with stop_on_interrupt() as interrupted:
        for epoch in range(1, epochs + 1):
            started = time.perf_counter()
            order = rng.permutation(len(images))
            bar = ProgressBar(progress, f'epoch {epoch}/{epochs}', len(images)) if progress else None
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
                    result.message = (f"diverged at epoch {epoch}, batch {batch} of {n_batches}: "
                                      f"{problem} (learning rate {lr:g} too high?); the model holds "
                                      f"the last weights that gave a finite loss")
                    return result
                good_weights = weights
                loss_sum += loss * len(rows)
                done += len(rows)
                if bar:
                    bar.update(done, loss_sum / done, force=batch == n_batches)
                if interrupted.is_set():
                    if bar:
                        bar.close()
                    result.stopped = 'interrupted'
                    result.message = f"interrupted at epoch {epoch}, batch {batch} of {n_batches}"
                    return result
            train_seconds = time.perf_counter() - started
            if bar:
                bar.close()
            train_accuracy = accuracy(model, images[:TRAIN_ACCURACY_IMAGES], labels[:TRAIN_ACCURACY_IMAGES])
            test_accuracy = accuracy(model, test_images, test_labels)
            finished = Epoch(epoch, loss_sum / done, train_accuracy, test_accuracy,
                             train_seconds, time.perf_counter() - started)
            result.history.append(finished)
            if on_epoch:
                on_epoch(finished)
            if interrupted.is_set():    # Ctrl-C during the accuracy passes
                result.stopped = 'interrupted'
                result.message = f"interrupted after epoch {epoch}"
                return result
    return result


# ---- reports ----------------------------------------------------------------

def epoch_line(e, epochs):
    width = len(str(epochs))
    return (f"epoch {e.epoch:{width}}/{epochs}  loss {e.loss:.4f}  train acc {e.train_accuracy:.4f}  "
            f"test acc {e.test_accuracy:.4f}  {e.seconds:.1f} s")


def compile_line(model):
    """Total and per-stage seconds, in the compiler's own stage order, then the toolchain."""
    build = model.build
    stages = ', '.join(f'{stage} {seconds:.2f} s' for stage, seconds in model.timings.items())
    cached = ', cached build' if build.cached else ''
    return (f"compiled in {sum(model.timings.values()):.2f} s ({stages}{cached}) "
            f"with {build.toolchain.version} [{' '.join(build.flags)}]")


def metrics(args, dataset, data, model, sizes, result):
    return {
        'dataset': dataset,
        'train_images': len(data['train'][0]),
        'test_images': len(data['test'][0]),
        'train_accuracy_images': min(len(data['train'][0]), TRAIN_ACCURACY_IMAGES),
        'layer_sizes': sizes,
        'params': model.n_params,
        'epochs': args.epochs, 'batch_size': args.batch_size, 'lr': args.lr, 'seed': args.seed,
        'compiler': {'name': model.build.toolchain.family, 'version': model.build.toolchain.version,
                     'path': model.build.toolchain.path, 'flags': list(model.build.flags),
                     'cached': model.build.cached},
        'timings': dict(model.timings),
        'history': [asdict(e) for e in result.history],
        'stopped': result.stopped,
        'divergence': result.divergence,
    }


def require_matplotlib():
    """``matplotlib.pyplot`` on a file-only backend, or an ImportError that says how to get it."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install matplotlib "
                          "(or pip install 'micrograd-compiler[plot]')") from None
    return plt


def plot_curves(path, history, title):
    plt = require_matplotlib()
    epochs = [e.epoch for e in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(epochs, [e.loss for e in history], marker='o')
    left.set(xlabel='epoch', ylabel='mean training loss', title='loss')
    right.plot(epochs, [e.train_accuracy for e in history], marker='o', label='train')
    right.plot(epochs, [e.test_accuracy for e in history], marker='o', label='test')
    right.set(xlabel='epoch', ylabel='accuracy', title='accuracy')
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format='png')
    plt.close(fig)


# ---- main -------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:   # before or after training, or a second Ctrl-C during it
        print("\naborted", file=sys.stderr)
        return EXIT_INTERRUPTED


def run(args):
    sizes = layer_sizes(args.hidden)
    try:
        if args.plot:
            require_matplotlib()    # now, not after a long run
        dataset, data = load_dataset(args)
        loaded = load_weights(args.load, sizes) if args.load else None
    except WeightsError as e:
        hint = f"; pass --hidden {','.join(map(str, e.saved_sizes[1:-1]))} to use it" if e.saved_sizes else ''
        print(f"error: {e}{hint}", file=sys.stderr)
        return EXIT_ERROR
    except (ImportError, OSError, ValueError) as e:    # missing files, download, bad data
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    images, labels = data['train']
    print(f"data: {dataset}: {len(images):,} training and {len(data['test'][0]):,} test images")
    try:
        model = build_model(args.hidden, seed=args.seed, cc=args.cc)
    except compiler.BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(f"model: {architecture(sizes)} MLP, {model.n_params:,} parameters")
    print(compile_line(model), flush=True)
    if loaded is not None:
        model.set_params(loaded)
        print(f"loaded weights from {args.load}")
    if args.epochs == 0:
        print(f"train acc {accuracy(model, images[:TRAIN_ACCURACY_IMAGES], labels[:TRAIN_ACCURACY_IMAGES]):.4f}  "
              f"test acc {accuracy(model, *data['test']):.4f}")
    elif len(images) > TRAIN_ACCURACY_IMAGES:
        print(f"(train acc is measured on the first {TRAIN_ACCURACY_IMAGES:,} training images)")

    started = time.perf_counter()
    result = train(model, data, args.epochs, args.batch_size, args.lr, seed=args.seed,
                   progress=sys.stderr if sys.stderr.isatty() else None,
                   on_epoch=lambda e: print(epoch_line(e, args.epochs), flush=True))
    if result.message:
        print(result.message, file=sys.stderr)
    if result.history:
        print(f"trained {len(result.history)} epochs in {time.perf_counter() - started:.1f} s: "
              f"test acc {result.history[-1].test_accuracy:.4f}")
    if args.save:
        save_weights(args.save, model.params(), sizes)
        print(f"saved weights to {args.save}")
    if args.metrics:
        report = metrics(args, dataset, data, model, sizes, result)
        with atomic_write(args.metrics, 'w') as f:
            f.write(json.dumps(report, indent=1))
    if args.plot:
        if result.history:
            plot_curves(args.plot, result.history, f"{architecture(sizes)} MLP on {dataset}")
            print(f"plotted to {args.plot}")
        else:
            print(f"no finished epoch: {args.plot} not written", file=sys.stderr)
    return {'completed': 0, 'diverged': EXIT_ERROR, 'interrupted': EXIT_INTERRUPTED}[result.stopped]


if __name__ == '__main__':
    sys.exit(main())
