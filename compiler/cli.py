"""What the training scripts (``mnist_train.py``, ``microgpt_train.py``)
share, so that each reads as an example: argument types, output paths
checked before any work (and the ``.bak`` of a replaced input), progress on
stderr, a line describing a compile, stopping cleanly on signals, curves
drawn with matplotlib, and comparing runs bit for bit.

The library never imports this module (tests/test_layout.py): it is the
command line's, like ``python -m compiler``."""
import argparse
import contextlib
import functools
import math
import os
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time

from compiler.files import atomic_write

EXIT_ERROR = 1
STOP_SIGNALS = tuple(getattr(signal, name) for name in ('SIGINT', 'SIGTERM', 'SIGHUP')
                     if hasattr(signal, name))


def exit_status(signum):
    """The conventional status of a program stopped by signal ``signum``: 128 + its number."""
    return 128 + signum


def one_line(error):
    """An exception's message on one line, never empty."""
    return ' '.join(str(error).split()) or type(error).__name__


def fail(error):
    """Print ``error: <message>`` on stderr; returns ``EXIT_ERROR``."""
    print(f"error: {str(error) or type(error).__name__}", file=sys.stderr)
    return EXIT_ERROR


def sayer(quiet):
    """``say(text)``: print and flush, unless ``quiet``."""
    return (lambda text: None) if quiet else (lambda text: print(text, flush=True))


# ---- arguments ----------------------------------------------------------------

def number(kind, minimum, inclusive=True, maximum=None):
    """An argparse type: ``kind(text)``, finite, at least (or, with
    ``inclusive=False``, above) ``minimum`` and at most ``maximum``."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'a whole' if kind is int else 'a'} number: {text!r}") from None
        if not (value >= minimum if inclusive else value > minimum) or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {minimum}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {text}")
        return value
    return parse


class OutputPathError(ValueError):
    """An output path that could not be written: found before any work."""


def same_file(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def check_can_create_files(named, folder):
    """Raise ``OutputPathError`` unless a file can be created in ``folder``."""
    # Asking os.access would be wrong for root, read-only mounts and ACLs:
    # create (and remove) a file the way atomic_write will.
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix='.probe.', suffix='.tmp')
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise OutputPathError(f"{named}: cannot write in {folder} ({e.strerror})") from None


def check_output_path(option, path, example='out'):
    """Raise ``OutputPathError`` (one line) unless a file can be written at
    ``path``, given as ``--option``; ``example`` names a file for the hint
    when ``path`` is a folder."""
    target = os.path.realpath(path)
    named = f"--{option} {path}"
    if os.path.isdir(target) or path.endswith(os.sep):
        raise OutputPathError(f"{named} is a folder; give a file name in it, e.g. "
                              f"{os.path.join(path, example)}")
    if os.path.lexists(target) and not os.path.isfile(target):
        raise OutputPathError(f"{named} exists and is not a regular file")
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        problem = 'is not a folder' if os.path.exists(folder) else 'does not exist'
        raise OutputPathError(f"{named}: {folder} {problem}")
    check_can_create_files(named, folder)


def backup_path(path):
    """Where an output that replaces an input file keeps the input: ``PATH.bak``."""
    return os.path.realpath(path) + '.bak'


def keep_backup(path):
    """Copy the file at ``path`` (through a symlink) to ``backup_path(path)``; returns that path."""
    backup = backup_path(path)
    with open(os.path.realpath(path), 'rb') as source, atomic_write(backup) as f:
        shutil.copyfileobj(source, f)
    return backup


def check_folder(option, path, names):
    """Raise ``OutputPathError`` (one line) unless a folder of files ``names``
    can be written at ``path``: a folder that is empty, holds only those
    files (an earlier output: they are replaced), or can be created (with its
    missing parents)."""
    target = os.path.realpath(path)
    named = f"--{option} {path}"
    if os.path.isdir(target):
        others = sorted(set(os.listdir(target)) - set(names))
        if others:
            shown = ', '.join(others[:3]) + (f' and {len(others) - 3} more' if len(others) > 3 else '')
            raise OutputPathError(f"{named} holds other files than an {option}'s ({shown}): give a new "
                                  f"or empty folder, or an earlier {option}")
        check_can_create_files(named, target)
        return
    if os.path.lexists(target):
        raise OutputPathError(f"{named} exists and is not a folder")
    parent = os.path.dirname(target)
    while not os.path.lexists(parent):      # the missing folders are created
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputPathError(f"{named}: {parent} is not a folder")
    check_can_create_files(named, parent)


def check_outputs(files, examples, load=None, replaces_load='save', folder=None):
    """Every problem the output options would hit after a long run, found
    before it starts: ``files`` maps options to paths (None: not given),
    ``examples`` to a file name for the hint when a path is a folder;
    ``load`` is the input file, which only ``replaces_load`` may name (it is
    kept as ``.bak``); ``folder`` is ``(option, path, names)`` for an output
    folder (``--export``). Refused: unwritable or missing folders, folders
    given as files and files as folders, two options naming one path, an
    output over the input, a file inside the folder that the folder's
    output writes."""
    seen = {os.path.realpath(load): 'load'} if load else {}
    for option, path in files.items():
        if not path:
            continue
        check_output_path(option, path, examples[option])
        target = os.path.realpath(path)
        other = seen.get(target)
        if other == 'load' and option == replaces_load:
            if os.path.isdir(backup_path(path)):
                raise OutputPathError(f"--{option} {path} replaces the --load file and keeps it as "
                                      f"{backup_path(path)}, which is a folder")
        elif other:
            raise OutputPathError(f"--{other} and --{option} both name {target}: "
                                  f"give each option its own file")
        seen[target] = option
    if folder and folder[1]:
        name, path, names = folder
        check_folder(name, path, names)
        where = os.path.realpath(path)
        for target, option in seen.items():
            if target == where:
                raise OutputPathError(f"--{option} and --{name} both name {where}: "
                                      f"give each option its own path")
            if os.path.dirname(target) == where and os.path.basename(target) in names:
                raise OutputPathError(f"--{option} {files.get(option) or load} is a file --{name} "
                                      f"writes: give each option its own path")


# ---- progress -----------------------------------------------------------------

def duration(seconds):
    """``75`` -> ``'1:15'``, ``3725`` -> ``'1:02:05'``."""
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02}:{seconds:02}" if hours else f"{minutes}:{seconds:02}"


def progress_text(done, total, elapsed, loss, unit='img'):
    """``done/total``, ``unit``s per second, elapsed time, the ETA (at the rate so far), running loss."""
    rate = done / max(elapsed, 1e-9)
    return (f"{done:,}/{total:,}  {rate:,.0f} {unit}/s  {duration(elapsed)} elapsed  "
            f"ETA {duration((total - done) / rate) if rate else '?'}  loss {loss:.4f}")


class ProgressBar:
    """One line on a terminal, redrawn with ``\\r``: share done, rate, elapsed, ETA, running loss."""
    WIDTH = 24
    EVERY = 0.1     # seconds between redraws: more would cost time for nothing

    def __init__(self, stream, label, total, unit='img', clock=time.perf_counter):
        self.stream, self.label, self.total, self.unit, self.clock = stream, label, total, unit, clock
        self.start = self.drawn_at = clock()
        self.line_length = 0

    def update(self, done, loss, force=False):
        now = self.clock()
        if not force and now - self.drawn_at < self.EVERY:
            return
        self.drawn_at = now
        filled = self.WIDTH * done // self.total
        line = (f"{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                f"{progress_text(done, self.total, now - self.start, loss, self.unit)}")
        self.stream.write('\r' + line.ljust(self.line_length))
        self.stream.flush()
        self.line_length = len(line)

    def close(self):
        """Erase the bar so that the next line takes its place."""
        self.stream.write('\r' + ' ' * self.line_length + '\r')
        self.stream.flush()


class ProgressLines:
    """Off a terminal (a log file, a pipe): one plain line each time another
    ``percent`` of the work is done, where a redrawn bar would be noise.
    None at 100% (a summary line follows), and none for work that will take
    less than ``MIN_SECONDS`` at the rate so far: its summary comes soon
    enough, and ten fast epochs would log thirty lines."""
    MIN_SECONDS = 2.0

    def __init__(self, stream, label, total, unit='img', percent=25, clock=time.perf_counter):
        self.stream, self.label, self.total, self.unit, self.clock = stream, label, total, unit, clock
        self.percent = percent
        self.start = clock()
        self.next = percent

    def update(self, done, loss, force=False):
        percent = 100 * done // self.total
        if percent < self.next or percent >= 100:
            return
        self.next = (percent // self.percent + 1) * self.percent
        elapsed = self.clock() - self.start
        if elapsed * self.total / done < self.MIN_SECONDS:
            return
        self.stream.write(f"{self.label} {percent:3}%  "
                          f"{progress_text(done, self.total, elapsed, loss, self.unit)}\n")
        self.stream.flush()

    def close(self):
        pass


def progress_for(args, unit='img', percent=25, label=None):
    """How a run shows progress on stderr: a ``ProgressBar`` on a terminal,
    else ``ProgressLines`` every ``percent``; None with ``--quiet`` (nothing)
    or ``--verbose`` (a line per step instead). Called as ``(label, total)``,
    or ``(total)`` when ``label`` is given here."""
    if args.quiet or args.verbose:
        return None
    kind = ProgressBar if sys.stderr.isatty() else ProgressLines
    more = {'unit': unit} if kind is ProgressBar else {'unit': unit, 'percent': percent}
    return functools.partial(kind, sys.stderr, *([label] if label else []), **more)


def build_info(model):
    """The compiler that built ``model``, for a metrics file."""
    build = model.build
    return {'name': build.toolchain.family, 'version': build.toolchain.version,
            'path': build.toolchain.path, 'flags': list(build.flags), 'cached': build.cached}


def compile_line(model):
    """How long ``compile()`` took, per stage in the compiler's own order,
    the toolchain and flags, and the threads that will train."""
    build = model.build
    stages = ', '.join(f'{stage} {seconds:.2f} s' for stage, seconds in model.timings.items())
    cached = ', cached build' if build.cached else ''
    threads = model.threads
    return (f"compiled in {sum(model.timings.values()):.2f} s ({stages}{cached}) "
            f"with {build.toolchain.version} [{build.flags_text()}]; "
            f"{threads} thread{'s' * (threads != 1)}")


def run_cli(parse_args, run, argv=None):
    """``run(parse_args(argv))``; an abort (Ctrl-C before or after training,
    or a second stop signal during it) returns 128 + its signal's number."""
    args = parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt as e:
        print("\naborted", file=sys.stderr)
        return exit_status(getattr(e, 'signum', signal.SIGINT))


# ---- stopping -----------------------------------------------------------------

class Aborted(KeyboardInterrupt):
    """A second stop signal: quit now, without saving (``signum`` gives the exit status)."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """Set by the first SIGINT, SIGTERM or SIGHUP received."""

    def __init__(self):
        self.signum = None

    def is_set(self):
        return self.signum is not None

    @property
    def name(self):
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def stop_on_signals():
    """The first SIGINT (Ctrl-C), SIGTERM or SIGHUP sets the yielded
    ``StopRequest`` (training stops after the current batch or step); a
    second one raises ``Aborted``.

    The handler only sets a flag: a compiled step runs in C without the GIL,
    so Python sees the signal when it returns, never halfway through it. A
    signal this process was started ignoring (``nohup`` ignores SIGHUP)
    stays ignored.
    """
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop          # signal handlers can only be set from the main thread
        return

    def handler(signum, frame):
        if stop.is_set():
            raise Aborted(signum)
        stop.signum = signum

    previous = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield stop
    finally:
        for signum, old in previous.items():
            signal.signal(signum, signal.SIG_DFL if old is None else old)


# ---- curves -------------------------------------------------------------------

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
    """Losses on the left, accuracies on the right, against whole epochs
    (every point marked); ``history`` holds epochs with ``epoch``, ``loss``,
    ``test_loss``, ``train_accuracy``, ``test_accuracy``. For runs of up to
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
    """``draw_curves`` saved as a PNG at ``path`` (replaced atomically)."""
    plt = require_matplotlib()
    fig = draw_curves(history, list(batch_losses), batches_per_epoch, title)
    with atomic_write(path) as f:
        fig.savefig(f, format='png')
    plt.close(fig)


# ---- bit for bit --------------------------------------------------------------

def same_bits(a, b):
    return struct.pack('<d', a) == struct.pack('<d', b)


def ordered_bits(x):
    """The float64's bits as an integer that orders like the floats (for ulp distances)."""
    (bits,) = struct.unpack('<q', struct.pack('<d', x))
    return bits if bits >= 0 else -(bits & 0x7FFF_FFFF_FFFF_FFFF)


def describe_difference(what, ours, theirs):
    """``what``: compiled ``ours`` vs interpreter ``theirs``, in full precision and in ulps."""
    apart = abs(ordered_bits(ours) - ordered_bits(theirs))
    return f"{what}: compiled {ours!r}, interpreter {theirs!r} ({apart} ulp apart)"


def first_difference(ours, theirs, labels):
    """What differs first between two lists of floats (``labels(i)`` names
    position ``i``), or None when every one is the same bits."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if not same_bits(a, b):
            return describe_difference(labels(i), a, b)
    return None
