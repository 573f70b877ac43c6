"""Processes: the cores this process may use, running a program (the C
compiler, a load check) in a process group that ends with this process, and
killing that group. The compiler runs in a process group of its own that is
killed on a timeout, on Ctrl-C, on SIGTERM or SIGHUP (``terminate_cleanly``),
and when this process dies, even by SIGKILL (Linux: a death signal, see
``run_in_own_group``).
"""
import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading


def usable_cores():
    """The cores this process may use (its affinity mask where there is one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


PR_SET_PDEATHSIG = 1
# Started under this shell, a command dies with this process even when its
# own children (a compiler driver's cc1, as, ld) would survive a signal to
# the command alone: the shell gets SIGTERM when this process ends
# (PR_SET_PDEATHSIG) and kills its whole process group. The command runs in
# the background because a shell runs its traps only between commands.
SUPERVISOR = 'trap "kill -KILL 0" TERM HUP; "$@" & wait $!'


@functools.lru_cache(maxsize=None)
def _prctl():
    """libc's ``prctl`` (Linux), or ``None`` where there is none."""
    if not sys.platform.startswith('linux'):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _death_signal(sig):
    """A ``preexec_fn`` that makes the child receive ``sig`` when this
    process's calling thread ends, and exit at once if it already has."""
    prctl, parent = _prctl(), os.getpid()

    def preexec():
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:       # the parent died before prctl took effect
            os._exit(1)
    return preexec


def run_in_own_group(cmd, timeout=None, cwd=None, with_children=True):
    """Run ``cmd`` to completion and return its ``CompletedProcess`` (output as
    text), in a session and process group of its own that ends with this process.

    - ``timeout`` (seconds, or ``None``): the whole group is killed and
      ``subprocess.TimeoutExpired`` raised;
    - any exception while waiting (``KeyboardInterrupt``, or ``Terminated``
      inside ``terminate_cleanly``): the group is killed, then it propagates;
    - this process killed, even by SIGKILL (Linux): ``cmd`` gets a death
      signal (``PR_SET_PDEATHSIG``); ``with_children`` starts it under
      ``SUPERVISOR`` so that its children die too (its exit status is then
      the shell's: 128 + N for a command killed by signal N).

    The death signal follows the *thread* that started the command (see
    prctl(2)): that thread waits here until the command ends, so it cannot
    end first. ``OSError`` if ``cmd`` cannot be started.
    """
    preexec = None
    if _prctl() is not None:
        if with_children and os.path.exists('/bin/sh'):
            cmd = ['/bin/sh', '-c', SUPERVISOR, 'micrograd-supervisor', *cmd]
            preexec = _death_signal(signal.SIGTERM)
        else:
            preexec = _death_signal(signal.SIGKILL)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors='replace', cwd=cwd,
                            start_new_session=True, preexec_fn=preexec)
    me = threading.get_ident()
    with _waiting_lock:
        _waiting[me] = proc
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        kill_process_group(proc)
        e.output, e.stderr = proc.communicate()
        raise
    except BaseException:
        kill_process_group(proc)
        proc.wait()
        raise
    finally:
        with _waiting_lock:
            _waiting.pop(me, None)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


# thread ident -> the command that thread waits for in run_in_own_group. A
# signal (Ctrl-C) reaches only the main thread: commands that other threads
# run for it (the translation units of one build, in parallel) are killed
# through this, so that it need not wait for them to finish.
_waiting = {}
_waiting_lock = threading.Lock()


def kill_commands_of(threads):
    """Kill the process groups of the commands the threads ``threads``
    (idents) are waiting for in ``run_in_own_group``; they then return at once."""
    with _waiting_lock:
        procs = [_waiting[t] for t in threads if t in _waiting]
    for proc in procs:
        kill_process_group(proc)


def kill_process_group(proc):
    """SIGKILL the process group led by ``proc`` (started with
    ``start_new_session=True``): a compiler driver's children (cc1, as, ld)
    go with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived inside ``terminate_cleanly``."""


@contextlib.contextmanager
def terminate_cleanly(signals=(signal.SIGTERM, signal.SIGHUP)):
    """Let cleanup run when this process is told to end while the block runs.

    By default SIGTERM and SIGHUP end a Python process at once, without
    running ``finally`` blocks, so a compiler it started would be left
    running. Inside this block (in the main thread, and only for signals
    still at their default action) they raise ``Terminated`` instead; once it
    has propagated out of the block, cleaning up on its way, the default
    action is restored and the signal raised again, ending the process as it
    would have ended. Nothing is installed elsewhere or outside the block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [s for s in signals if signal.getsignal(s) == signal.SIG_DFL]
    received = []

    def handler(signum, frame):
        received.append(signum)
        raise Terminated(signal.Signals(signum).name)

    for s in ours:
        signal.signal(s, handler)
    try:
        yield
    except Terminated:
        if not received:
            raise
    finally:
        for s in ours:
            signal.signal(s, signal.SIG_DFL)
        if received:
            signal.raise_signal(received[0])
    if received:                       # the signal is blocked in this thread: still stop
        raise Terminated(signal.Signals(received[0]).name)
