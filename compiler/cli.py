"""What the training scripts (``mnist_train.py``, ``microgpt_train.py``)
share: argument types, output paths checked before any work, progress on
stderr, a line describing a compile, and stopping cleanly on signals."""
import argparse
import contextlib
import math
import os
import signal
import sys
import tempfile
import threading
import time

EXIT_ERROR = 1
STOP_SIGNALS = tuple(getattr(signal, name) for name in ('SIGINT', 'SIGTERM', 'SIGHUP')
                     if hasattr(signal, name))


def exit_status(signum):
    """The conventional status of a program stopped by signal ``signum``: 128 + its number."""
    return 128 + signum


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
