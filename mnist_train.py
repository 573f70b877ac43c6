"""Train a micrograd MLP on MNIST (or Fashion-MNIST), compiled to C once.

    python mnist_train.py                   # the embedded 4,000 + 1,000 digits, offline
    python mnist_train.py --data DIR        # a folder of the four IDX files
    python mnist_train.py --fashion         # Debian's dataset-fashion-mnist package
    python mnist_train.py --download        # full MNIST, fetched into the cache folder

The network is ``micrograd.nn.MLP`` with ``cross_entropy``, traced and compiled
by ``compiler.compile`` once, with the optimizer (``--optimizer``: SGD, SGD
with momentum, or Adam) compiled into it; training is one ``train_batch``
call (one step on the mean gradient) per mini-batch, on ``--threads``
threads. An input row is the 784 pixels scaled to [0, 1] followed by the
one-hot label, so the label is an input of the graph like the pixels.

Output paths (``--save``, ``--metrics``, ``--plot``, ``--export``) are
checked before any work. Files are replaced atomically
(``compiler.files.atomic_write``), with the umask's permissions, and a
symlink is written through to its target. ``--save`` writes
``CompiledModel.save_weights``'s ``.npz`` (the optimizer's state included);
when it names the file ``--load`` read, the previous file is kept as
``PATH.bak``.

Exit status: 0 when training ends; 1 on an error, when the loss diverges, or
when training collapses (final test accuracy at most 1.5 / N_CLASSES, i.e.
no better than guessing); 128 + the signal's number when stopped by SIGINT
(Ctrl-C, 130), SIGHUP (129) or SIGTERM (143): training stops after the
current batch and ``--save``, ``--metrics``, ``--plot`` and ``--export`` are
still written.
"""
import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import compiler
import compiler.weights
import mnist_data
from compiler.cli import (EXIT_ERROR, OutputPathError, ProgressBar, ProgressLines,
                          check_can_create_files, check_output_path, compile_line, exit_status,
                          number, run_cli, same_file, stop_on_signals)
from compiler.export import SO_NAME
from compiler.build.cache import cache_root
from compiler.files import atomic_write
from compiler.model import MAX_THREADS, resolve_threads
from mnist_data import N_CLASSES, N_PIXELS, input_rows, mnist_graph
# Train accuracy is measured on at most this many training images (the first
# ones, the same every epoch): on the full 60,000 a forward pass over all of
# them would add a third to the time of each epoch.
TRAIN_ACCURACY_IMAGES = 10_000
PREDICT_CHUNK = 2_000   # rows per predict call: bounds the float64 copy of the images
# A run that trained and ends at most this close to guessing (chance is
# 1 / N_CLASSES) has collapsed: every image gets the same class, or nearly.
# Without NaN or inf, only the accuracy shows it (--lr 50 on the embedded
# digits ends at exactly 0.1000 with a finite loss).
COLLAPSED_ACCURACY = 1.5 / N_CLASSES
NO_HIDDEN = 'none'      # --hidden none: a 784-10 network, softmax regression
# --optimizer NAME: what it is called in messages, its default --lr, and what
# it compiles into the module (None: train_batch's own plain SGD step,
# p -= lr * mean gradient, as before there were compiled optimizers).
# Momentum 0.9 makes steps up to ten times larger than plain SGD's, hence
# the smaller default rate; Adam's is the usual 1e-3 (Kingma and Ba, 2015).
MOMENTUM = 0.9
OPTIMIZERS = {
    'sgd': ('SGD', 0.1, lambda lr: None),
    'momentum': (f'SGD with momentum {MOMENTUM}', 0.01, lambda lr: compiler.SGD(lr, momentum=MOMENTUM)),
    'adam': ('Adam', 1e-3, lambda lr: compiler.Adam(lr)),
}
EXPORT_FILES = ('nn.c', SO_NAME, 'nn.json')     # what CompiledModel.export writes in its folder


def default_download_dir():
    """Where ``--download`` keeps MNIST: beside the compiler's build cache."""
    return os.path.join(cache_root(), 'mnist')


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
    parser = argparse.ArgumentParser(
        prog='mnist_train.py', description=__doc__.split('\n\n')[0],
        epilog='--save, --metrics, --plot and --export are checked before any work; files are '
               'replaced atomically with the permissions the umask gives, and written through a '
               'symlink to its target. '
               'Exit status: 0 done; 1 error, diverged, or collapsed (final test accuracy at most '
               f'{COLLAPSED_ACCURACY:.2f}, chance level); 130, 143 or 129 when stopped by Ctrl-C, '
               'SIGTERM or SIGHUP (after the current batch, with --save, --metrics, --plot and '
               '--export still written).')
    source = parser.add_mutually_exclusive_group()
    source.add_argument('--data', metavar='DIR',
                        help='folder of MNIST-format IDX files (MNIST, Fashion-MNIST, ...); '
                             'default: the embedded 4,000 + 1,000 MNIST digits')
    source.add_argument('--fashion', action='store_true',
                        help="Fashion-MNIST from Debian's dataset-fashion-mnist package")
    source.add_argument('--download', action='store_true',
                        help=f'fetch the full MNIST (SHA-256 checked) into {default_download_dir()}')
    parser.add_argument('--mirror', metavar='URL', default=mnist_data.download.MNIST_URL,
                        help='where --download fetches the four .gz files from (default: %(default)s)')
    parser.add_argument('--hidden', metavar='N,N', type=hidden_sizes, default=[50],
                        help=f'hidden layer sizes, e.g. 50 (the default) or 128,64; '
                             f'{NO_HIDDEN} for no hidden layer (a 784-10 network)')
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
    parser.add_argument('--seed', metavar='S', type=int, default=0,
                        help='seeds the initial weights and the per-epoch shuffle (default: %(default)s)')
    parser.add_argument('--limit', metavar='N', type=number(int, 1),
                        help='train on the first N training images only')
    parser.add_argument('--cc', metavar='CC', help="C compiler: tcc, clang, gcc or a path "
                                                   "(default: $CC, else the best one installed)")
    parser.add_argument('--threads', metavar='N', type=number(int, 1, maximum=MAX_THREADS),
                        help='threads that train and predict, the same results for any number '
                             '(default: $MICROGRAD_THREADS, else every core this process may use)')
    parser.add_argument('--load', metavar='PATH',
                        help="start from weights saved by --save, and from their optimizer's "
                             "state if it is this --optimizer's")
    parser.add_argument('--save', metavar='PATH',
                        help="write the final weights and the optimizer's state (.npz); when "
                             "PATH is the --load file, the previous one is kept as PATH.bak")
    parser.add_argument('--metrics', metavar='PATH',
                        help='write the run as JSON: per-epoch losses and accuracies, per-batch losses')
    parser.add_argument('--plot', metavar='PATH',
                        help='draw loss and accuracy curves (PNG; needs matplotlib)')
    parser.add_argument('--export', metavar='DIR',
                        help='write the trained model as a folder that `import nn` works from, with '
                             'neither micrograd nor the compiler: nn.c, nn.abi3.so, nn.json (DIR is '
                             'created, or must be empty or an earlier export)')
    chatter = parser.add_mutually_exclusive_group()
    chatter.add_argument('-q', '--quiet', action='store_true', help='print only the final line (and errors)')
    chatter.add_argument('-v', '--verbose', action='store_true',
                         help="print what was compiled (m.summary()) and every batch's loss")
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = OPTIMIZERS[args.optimizer][1]
    return args


# ---- output files -----------------------------------------------------------

OUTPUT_OPTIONS = ('save', 'metrics', 'plot')     # files; --export is a folder


def backup_path(path):
    """Where ``--save`` keeps the previous contents of the ``--load`` file."""
    return os.path.realpath(path) + '.bak'


def keep_backup(path):
    """Copy the file at ``path`` (through a symlink) to ``backup_path(path)``; returns that path."""
    backup = backup_path(path)
    with open(os.path.realpath(path), 'rb') as source, atomic_write(backup) as f:
        shutil.copyfileobj(source, f)
    return backup


def check_export_folder(path):
    """Raise ``OutputPathError`` (one line) unless ``CompiledModel.export`` can
    write ``path``: a folder that is empty, holds an earlier export (only its
    files: they are replaced), or can be created (with its missing parents)."""
    target = os.path.realpath(path)
    named = f"--export {path}"
    if os.path.isdir(target):
        others = sorted(set(os.listdir(target)) - set(EXPORT_FILES))
        if others:
            shown = ', '.join(others[:3]) + (f' and {len(others) - 3} more' if len(others) > 3 else '')
            raise OutputPathError(f"{named} holds other files than an export's ({shown}): give a new "
                                  f"or empty folder, or an earlier export")
        check_can_create_files(named, target)
        return
    if os.path.lexists(target):
        raise OutputPathError(f"{named} exists and is not a folder")
    parent = os.path.dirname(target)
    while not os.path.lexists(parent):      # export creates the missing folders
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputPathError(f"{named}: {parent} is not a folder")
    check_can_create_files(named, parent)


def check_outputs(args):
    """Every problem ``--save``, ``--metrics``, ``--plot`` and ``--export``
    would hit after training, found before it starts: unwritable or missing
    folders, folders given as files and files as folders, two options naming
    one file, ``--metrics`` or ``--plot`` over the ``--load`` file, an
    ``--export`` folder holding other files."""
    seen = {}
    if args.load:
        seen[os.path.realpath(args.load)] = 'load'
    for option in OUTPUT_OPTIONS:
        path = getattr(args, option)
        if not path:
            continue
        check_output_path(option, path, 'weights.npz' if option == 'save' else option)
        target = os.path.realpath(path)
        other = seen.get(target)
        if other == 'load' and option == 'save':
            if os.path.isdir(backup_path(path)):
                raise OutputPathError(f"--save {path} replaces the --load file and keeps it as "
                                      f"{backup_path(path)}, which is a folder")
        elif other:
            raise OutputPathError(f"--{other} and --{option} both name {target}: "
                                  f"give each option its own file")
        seen[target] = option
    if args.export:
        check_export_folder(args.export)
        folder = os.path.realpath(args.export)
        for target, option in seen.items():
            if target == folder:
                raise OutputPathError(f"--{option} and --export both name {folder}: "
                                      f"give each option its own path")
            if os.path.dirname(target) == folder and os.path.basename(target) in EXPORT_FILES:
                raise OutputPathError(f"--{option} {getattr(args, option)} is a file --export "
                                      f"writes: give each option its own path")


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


def build_model(hidden, seed=0, cc=None, optimizer='sgd', lr=None, threads=None):
    """Trace ``MLP(784, hidden + [10])`` and its cross-entropy loss once, and
    compile it with ``optimizer`` (a key of ``OPTIMIZERS``; ``lr`` defaults
    to its rate) running on ``threads`` threads (None: as ``compile`` decides).

    The graph's inputs are the pixels and the one-hot label, so one compiled
    module serves every image; the Value graph is dropped once compiled.
    """
    _, default_lr, make = OPTIMIZERS[optimizer]
    graph = mnist_graph(hidden, seed=seed)
    return compiler.compile(graph.loss, inputs=graph.inputs, params=graph.params,
                            outputs=graph.logits, cc=cc, threads=threads,
                            optimizer=make(default_lr if lr is None else lr))


@dataclass
class Scores:
    loss: float         # mean cross-entropy over the images
    accuracy: float


def evaluate(model, images, labels):
    """Cross-entropy and accuracy of the model's logits (``predict``) on ``images``.

    The loss is computed in numpy, float64, as log-softmax shifted by the
    largest logit (so that ``exp`` cannot overflow): for logits z and label
    y, ``-(z_y - max z) + log sum exp(z - max z)``, the mean over the images.
    """
    loss_sum, correct = 0.0, 0
    for start in range(0, len(images), PREDICT_CHUNK):
        chunk = labels[start:start + PREDICT_CHUNK].astype(np.intp)
        logits = model.predict(input_rows(images[start:start + PREDICT_CHUNK], chunk))
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_sum = np.log(np.exp(shifted).sum(axis=1))
        loss_sum += float((log_sum - shifted[np.arange(len(chunk)), chunk]).sum())
        correct += int((logits.argmax(axis=1) == chunk).sum())
    return Scores(loss_sum / len(images), correct / len(images))


# ---- weights on disk --------------------------------------------------------

class WeightsError(ValueError):
    """A weights file is unreadable or was saved for another architecture."""

    def __init__(self, message, saved_sizes=None):
        super().__init__(message)
        self.saved_sizes = saved_sizes


def save_weights(model, path, sizes, optimizer='sgd'):
    """``model.save_weights`` (its parameters and its optimizer's state) with
    the layer sizes and the ``--optimizer`` as metadata."""
    model.save_weights(path, metadata={'layer_sizes': sizes, 'optimizer': optimizer})


ZIP_MAGIC, NPY_MAGIC = b'PK\x03\x04', b'\x93NUMPY'     # how .npz and .npy files begin


def one_line(error):
    """An exception's message on one line, never empty."""
    return ' '.join(str(error).split()) or type(error).__name__


def read_weights(path, sizes):
    """The arrays of the weights file at ``path`` (``compiler.weights.read``),
    checked to be for a network of ``sizes``, with finite parameters and
    optimizer state: read before any work, so that a bad file is refused at
    once. Anything else raises a one-line ``WeightsError``."""
    not_ours = f"{path}: not a weights file written by --save"
    try:
        with open(path, 'rb') as f:
            start = f.read(len(NPY_MAGIC))
    except OSError as e:    # missing, a folder, unreadable
        raise WeightsError(f"cannot read {path}: {e.strerror or e}") from None
    if not start:
        raise WeightsError(f"{not_ours}: it is empty")
    if start == NPY_MAGIC:
        raise WeightsError(f"{not_ours}: it holds a single array (.npy), not the .npz that --save writes")
    if not start.startswith(ZIP_MAGIC):     # np.load would try to unpickle it
        raise WeightsError(f"{not_ours}: it is neither an .npz nor an .npy file")
    try:
        saved = compiler.weights.read(path)
    except compiler.weights.WeightsError as e:
        raise WeightsError(one_line(e)) from None
    # A damaged file can make zipfile and numpy raise what read() does not
    # expect: NotImplementedError (compression method), RuntimeError
    # ("encrypted"), struct.error... Each means the same thing here.
    except Exception as e:  # noqa: BLE001
        raise WeightsError(f"{not_ours}, or it is damaged ({type(e).__name__}: {one_line(e)})") from None
    if 'meta_layer_sizes' not in saved:
        raise WeightsError(f"{not_ours}: it has no layer sizes (meta_layer_sizes)")
    saved_sizes, params = saved['meta_layer_sizes'], saved['params']
    if (saved_sizes.ndim != 1 or saved_sizes.dtype.kind not in 'iu' or len(saved_sizes) < 2
            or saved_sizes.min() < 1):
        raise WeightsError(f"{not_ours}: its layer sizes are {saved_sizes!r}")
    saved_sizes = [int(s) for s in saved_sizes]
    if saved_sizes != list(sizes):
        raise WeightsError(f"{path} holds a {architecture(saved_sizes)} network, "
                           f"but this run builds {architecture(sizes)}", saved_sizes)
    expected = sum((n_in + 1) * n_out for n_in, n_out in zip(sizes, sizes[1:]))
    if params.dtype != np.float64 or params.shape != (expected,):
        raise WeightsError(f"{path}: {params.dtype} parameters of shape {params.shape}; "
                           f"a {architecture(sizes)} network has {expected} float64 ones")
    bad = np.flatnonzero(~np.isfinite(params))
    if bad.size:
        raise WeightsError(f"{path}: {bad.size} of its parameters are not finite "
                           f"(parameter {bad[0]} is {params[bad[0]]})")
    state = saved.get('optimizer_state')
    if state is not None and (state.dtype.kind != 'f' or not np.isfinite(state).all()):
        raise WeightsError(f"{path}: its optimizer state is not finite")
    return saved


def saved_optimizer(saved):
    """The ``--optimizer`` a weights file was trained with, as far as it says."""
    if 'meta_optimizer' in saved:
        return f"--optimizer {saved['meta_optimizer']}"
    return f"the optimizer {saved['optimizer']}" if 'optimizer' in saved else 'no optimizer'


def load_saved(model, path, saved, optimizer):
    """Set ``model``'s parameters from the file ``read_weights`` checked, and
    its optimizer's state when the file holds this optimizer's
    (``CompiledModel.load_weights`` decides); returns what was loaded, for people."""
    model.load_weights(path)
    state = saved.get('optimizer_state')
    saved_vectors = state is not None and state.size > 1        # more than a step count
    if saved_vectors and np.array_equal(model.optimizer_state(), state):
        return (f"loaded weights and {OPTIMIZERS[optimizer][0]} state "
                f"(after {int(state[0]):,} steps) from {path}")
    if saved_vectors:
        return (f"loaded weights from {path}, without its optimizer state ({saved_optimizer(saved)}'s; "
                f"this run uses --optimizer {optimizer})")
    return f"loaded weights from {path}"


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
    """Train over ``data['train']`` in shuffled mini-batches, one step of the
    model's optimizer (plain SGD without one) at rate ``lr`` per batch;
    returns a ``Training``.

    ``progress(label, total)`` makes a ``ProgressBar`` or ``ProgressLines``
    for an epoch (None: no progress), ``on_batch(epoch, batch, n_batches,
    loss)`` is called after each batch, ``on_epoch`` with each finished
    ``Epoch``. ``stop`` is a ``StopRequest`` from ``stop_on_signals`` (None:
    this call sets up its own). The shuffle uses
    ``numpy.random.default_rng(seed)``, a fresh permutation every epoch.

    Divergence: before each batch the weights are copied. A batch whose loss
    is NaN or infinite, or weights that are no longer finite (a ReLU turns NaN
    into 0, so NaN first-layer weights can hide behind a finite loss), stop
    training, and the model is set back to the weights that last gave a finite
    loss: those from before the previous batch, since ``train_batch`` reports
    the loss of the weights it started from. If the very first batch's loss
    is not finite, no weights gave a finite loss: the model keeps the ones
    it started from, and the message says so.
    """
    images, labels = data['train']
    test_images, test_labels = data['test']
    rng = np.random.default_rng(seed)
    n_batches = math.ceil(len(images) / batch_size)
    good_weights, any_finite = model.params(), False
    result = Training('completed')

    def stopped_by_signal(where):
        result.stopped, result.signal = 'interrupted', stop.name
        result.message = f"interrupted by {stop.name} {where}"
        return result

    with (stop_on_signals() if stop is None else contextlib.nullcontext(stop)) as stop:
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
                    if any_finite:
                        result.message = (f"{where} (learning rate {lr:g} too high?); the model holds "
                                          f"the last weights that gave a finite loss")
                    else:
                        result.message = (f"{where} with the starting weights, before any update: "
                                          f"no weights gave a finite loss; the model keeps the ones "
                                          f"it started from")
                    return result
                good_weights, any_finite = weights, True
                result.batch_losses.append(loss)
                loss_sum += loss * len(rows)
                done += len(rows)
                if on_batch:
                    on_batch(epoch, batch, n_batches, loss)
                if bar:
                    bar.update(done, loss_sum / done, force=batch == n_batches)
                if stop.is_set():
                    if bar:
                        bar.close()
                    return stopped_by_signal(f"at epoch {epoch}, batch {batch} of {n_batches}")
            train_seconds = time.perf_counter() - started
            if bar:
                bar.close()
            train_scores = evaluate(model, images[:TRAIN_ACCURACY_IMAGES], labels[:TRAIN_ACCURACY_IMAGES])
            test_scores = evaluate(model, test_images, test_labels)
            finished = Epoch(epoch, loss_sum / done, test_scores.loss, train_scores.accuracy,
                             test_scores.accuracy, train_seconds, time.perf_counter() - started)
            result.history.append(finished)
            if on_epoch:
                on_epoch(finished)
            if stop.is_set():    # a signal during the evaluation passes
                return stopped_by_signal(f"after epoch {epoch}")
    return result


def collapsed(result):
    """True when the run trained and its final test accuracy is at chance level
    (at most ``COLLAPSED_ACCURACY``), whatever its loss."""
    return (result.stopped != 'diverged' and bool(result.history)
            and result.history[-1].test_accuracy <= COLLAPSED_ACCURACY)


# ---- reports ----------------------------------------------------------------

def epoch_line(e, epochs):
    width = len(str(epochs))
    return (f"epoch {e.epoch:{width}}/{epochs}  train loss {e.loss:.4f}  test loss {e.test_loss:.4f}  "
            f"train acc {e.train_accuracy:.4f}  test acc {e.test_accuracy:.4f}  {e.seconds:.1f} s")


def batch_line(epoch, epochs, batch, n_batches, loss):
    return f"epoch {epoch}/{epochs}  batch {batch:{len(str(n_batches))}}/{n_batches}  loss {loss:.4f}"


def metrics(args, dataset, data, model, sizes, result):
    n_train = len(data['train'][0])
    return {
        'dataset': dataset,
        'train_images': n_train,
        'test_images': len(data['test'][0]),
        'train_accuracy_images': min(n_train, TRAIN_ACCURACY_IMAGES),
        'layer_sizes': sizes,
        'params': model.n_params,
        'epochs': args.epochs, 'batch_size': args.batch_size, 'optimizer': args.optimizer,
        'lr': args.lr, 'seed': args.seed, 'threads': model.threads,
        'compiler': {'name': model.build.toolchain.family, 'version': model.build.toolchain.version,
                     'path': model.build.toolchain.path, 'flags': list(model.build.flags),
                     'cached': model.build.cached},
        'timings': dict(model.timings),
        'history': [asdict(e) for e in result.history],
        'batches_per_epoch': math.ceil(n_train / args.batch_size),
        'batch_losses': result.batch_losses,
        'stopped': result.stopped,
        'signal': result.signal,
        'divergence': result.divergence,
        'collapsed': collapsed(result),
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


# Up to this many finished epochs, the loss panel shows every batch's loss:
# one or two points per curve would show nothing.
PER_BATCH_PLOT_EPOCHS = 2


def draw_curves(history, batch_losses, batches_per_epoch, title):
    """The figure ``--plot`` saves: losses on the left, accuracies on the
    right, against whole epochs (every point marked); for runs of up to
    ``PER_BATCH_PLOT_EPOCHS`` epochs the left panel shows every batch's loss
    instead, with the test loss at the end of each epoch."""
    plt = require_matplotlib()
    from matplotlib.ticker import MaxNLocator
    epochs = [e.epoch for e in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    if len(history) <= PER_BATCH_PLOT_EPOCHS:
        left.plot(range(1, len(batch_losses) + 1), batch_losses, marker='.', markersize=3,
                  linewidth=0.8, label='train (each batch)')
        left.plot([e * batches_per_epoch for e in epochs], [e.test_loss for e in history], 'o',
                  label='test (end of epoch)')
        left.set(xlabel='batch', ylabel='cross-entropy loss', title='loss per batch')
    else:
        left.plot(epochs, [e.loss for e in history], marker='o', label='train (mean over the epoch)')
        left.plot(epochs, [e.test_loss for e in history], marker='o', label='test')
        left.set(xlabel='epoch', ylabel='cross-entropy loss', title='loss')
        left.set_xlim(0.5, len(history) + 0.5)
    right.plot(epochs, [e.train_accuracy for e in history], marker='o', label='train')
    right.plot(epochs, [e.test_accuracy for e in history], marker='o', label='test')
    right.set(xlabel='epoch', ylabel='accuracy', title='accuracy')
    right.set_xlim(0.5, len(history) + 0.5)
    for axes in (left, right):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        axes.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_curves(path, history, title, batch_losses=(), batches_per_epoch=1):
    plt = require_matplotlib()
    fig = draw_curves(history, list(batch_losses), batches_per_epoch, title)
    with atomic_write(path) as f:
        fig.savefig(f, format='png')
    plt.close(fig)


# ---- main -------------------------------------------------------------------

def main(argv=None):
    return run_cli(parse_args, run, argv)


def run(args):
    sizes = layer_sizes(args.hidden)

    def say(text):
        if not args.quiet:
            print(text, flush=True)

    try:
        check_outputs(args)
        if args.plot:
            require_matplotlib()    # now, not after a long run
        threads = resolve_threads(args.threads)     # a bad $MICROGRAD_THREADS, now
        saved = read_weights(args.load, sizes) if args.load else None
        dataset, data = load_dataset(args)
    except WeightsError as e:
        other = e.saved_sizes
        hint = (f"; pass --hidden {hidden_option(other[1:-1])} to use it"
                if other and other[0] == N_PIXELS and other[-1] == N_CLASSES else '')
        print(f"error: {e}{hint}", file=sys.stderr)
        return EXIT_ERROR
    # output paths, $MICROGRAD_THREADS, missing files, download, bad data
    except (ImportError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    images, labels = data['train']
    say(f"data: {dataset}: {len(images):,} training and {len(data['test'][0]):,} test images")
    try:
        model = build_model(args.hidden, seed=args.seed, cc=args.cc, optimizer=args.optimizer,
                            lr=args.lr, threads=threads)
    except compiler.BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    say(f"model: {architecture(sizes)} MLP, {model.n_params:,} parameters; "
        f"{OPTIMIZERS[args.optimizer][0]}, learning rate {args.lr:g}")
    say(compile_line(model))
    if args.verbose:
        print(model.summary(), flush=True)
    if saved is not None:
        try:
            say(load_saved(model, args.load, saved, args.optimizer))
        except compiler.weights.WeightsError as e:     # another graph's, or changed since read
            print(f"error: {one_line(e)}", file=sys.stderr)
            return EXIT_ERROR

    # From here on the first SIGINT, SIGTERM or SIGHUP stops training after
    # the batch, and the outputs are still written.
    with stop_on_signals() as stop:
        if args.epochs == 0:
            train_scores = evaluate(model, images[:TRAIN_ACCURACY_IMAGES], labels[:TRAIN_ACCURACY_IMAGES])
            test_scores = evaluate(model, *data['test'])
            print(f"test loss {test_scores.loss:.4f}  train acc {train_scores.accuracy:.4f}  "
                  f"test acc {test_scores.accuracy:.4f}", flush=True)   # the final line, even with --quiet
        elif len(images) > TRAIN_ACCURACY_IMAGES:
            say(f"(train acc is measured on the first {TRAIN_ACCURACY_IMAGES:,} training images)")
        started = time.perf_counter()
        result = train(model, data, args.epochs, args.batch_size, args.lr, seed=args.seed,
                       progress=progress_for(args), on_batch=batch_printer(args), stop=stop,
                       on_epoch=lambda e: say(epoch_line(e, args.epochs)))
        failed = report_outcome(args, result, time.perf_counter() - started)
        failed |= not write_outputs(args, dataset, data, model, sizes, result, say)
    if stop.is_set():
        return exit_status(stop.signum)
    return EXIT_ERROR if failed else 0


def progress_for(args):
    """How ``train`` shows an epoch's progress on stderr: a bar on a terminal, else plain lines."""
    if args.quiet or args.verbose:      # nothing, or a line per batch instead
        return None
    return functools.partial(ProgressBar if sys.stderr.isatty() else ProgressLines, sys.stderr)


def batch_printer(args):
    if not args.verbose:
        return None
    return lambda epoch, batch, n_batches, loss: print(batch_line(epoch, args.epochs, batch, n_batches, loss))


def report_outcome(args, result, seconds):
    """Print how training ended (the final line, and what went wrong on stderr);
    True when the run failed: it diverged, or collapsed to chance level."""
    if result.message:
        print(result.message, file=sys.stderr)
    if result.history:
        last, n = result.history[-1], len(result.history)
        print(f"trained {n} epoch{'s' if n != 1 else ''} in {seconds:.1f} s: "
              f"test loss {last.test_loss:.4f}  test acc {last.test_accuracy:.4f}", flush=True)
    if collapsed(result):
        last, steps, guessing = result.history[-1], len(result.batch_losses), math.log(N_CLASSES)
        if last.test_loss > 2 * guessing:
            why = (f"its test loss {last.test_loss:.4f} is far worse than guessing's {guessing:.4f}: "
                   f"learning rate {args.lr:g} too high?")
        else:
            name = 'SGD' if args.optimizer == 'sgd' else OPTIMIZERS[args.optimizer][0]
            why = (f"after {steps} {name} step{'s' * (steps != 1)} at learning rate {args.lr:g}: "
                   f"train longer, or change the rate")
        print(f"training collapsed: the final test accuracy {last.test_accuracy:.4f} is no better than "
              f"guessing (chance is {1 / N_CLASSES:.2f}; a run at or below {COLLAPSED_ACCURACY:.2f} "
              f"counts as failed); {why}", file=sys.stderr)
        return True
    return result.stopped == 'diverged'


def write_outputs(args, dataset, data, model, sizes, result, say):
    """``--save`` (keeping the ``--load`` file as ``.bak`` if it is the same),
    ``--metrics``, ``--plot``, ``--export``; False if one could not be written."""
    if args.save:
        backup = keep_backup(args.save) if args.load and same_file(args.load, args.save) else None
        save_weights(model, args.save, sizes, args.optimizer)
        say(f"saved weights to {args.save}" + (f" (the previous file is kept as {backup})" if backup else ''))
    if args.metrics:
        report = metrics(args, dataset, data, model, sizes, result)
        with atomic_write(args.metrics, 'w') as f:
            f.write(json.dumps(report, indent=1))
    if args.plot:
        if result.history:
            plot_curves(args.plot, result.history, f"{architecture(sizes)} MLP on {dataset}",
                        result.batch_losses, math.ceil(len(data['train'][0]) / args.batch_size))
            say(f"plotted to {args.plot}")
        else:
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
