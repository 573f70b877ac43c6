"""No compiler outlives the process that started it (issue 13, item 5).

A real Python process compiles through a real compiler behind a shell
script that, like gcc, runs a child of its own (``sleep``, standing for
cc1) and has begun writing its output; the test then sends that process a
real SIGTERM, or SIGKILL. The compiler and its child must be gone within a
second, and no temporary file may stay in the cache (a later build sweeps
what a killed one left).
"""
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from compiler.build import cache

from tests.differential import FAST_CC, needs_cc
from tests.test_build import REPO, compile_tiny, fresh_cache  # noqa: F401

COMPILING = textwrap.dedent('''\
    import sys
    import compiler
    from micrograd import Value
    x, w = Value(0.0), Value(2.0)
    compiler.compile((x * w + 1.0).tanh(), [x], [w], cc=sys.argv[1])
''')


def alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rpartition(') ')[2][0] != 'Z'       # a zombie is dead
    except FileNotFoundError:
        return False


def slow_compiler(folder):
    """A real compiler's identity; a build that starts a child, writes part
    of its output, and waits a minute. Its pid and its child's go to files."""
    real = shutil.which(FAST_CC)
    path = os.path.join(folder, 'slowcc')
    with open(path, 'w') as f:
        f.write(textwrap.dedent(f'''\
            #!/bin/sh
            case "$1" in -E|--version|-v) exec {real} "$@";; esac
            out=; prev=; for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
            printf '\\177ELF' > "$out"
            sleep 60 &
            echo $! > {folder}/child.pid
            echo $$ > {folder}/driver.pid
            wait
            '''))
    os.chmod(path, 0o755)
    return path


def start_compiling(tmp_path, cache):
    cc = slow_compiler(str(tmp_path))
    env = {**os.environ, 'MICROGRAD_CACHE_DIR': cache,
           'PYTHONPATH': os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')]))}
    env.pop('MICROGRAD_CACHE', None)
    proc = subprocess.Popen([sys.executable, '-c', COMPILING, cc], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / 'driver.pid').exists() or not (tmp_path / 'driver.pid').read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the build did not start: {proc.communicate()}")
        time.sleep(0.01)
    pids = [int((tmp_path / name).read_text()) for name in ('driver.pid', 'child.pid')]
    assert all(alive(pid) for pid in pids)
    return proc, pids


def assert_gone_within_a_second(pids):
    deadline = time.monotonic() + 1.0
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:                    # do not leave them running for a minute
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running a second after their parent ended: {left} (driver, child)"


def temporaries(folder):
    return [name for name in os.listdir(folder) if name.startswith('.')]


@needs_cc
def test_sigterm_during_a_build_kills_the_compiler_and_removes_its_output(tmp_path, fresh_cache):
    proc, pids = start_compiling(tmp_path, fresh_cache)
    assert temporaries(fresh_cache), "the compiler has not begun its output"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM          # it still ends as SIGTERM ends it
    assert_gone_within_a_second(pids)
    assert temporaries(fresh_cache) == []


@needs_cc
def test_a_killed_parent_takes_the_compiler_along_and_a_later_build_sweeps_its_output(tmp_path,
                                                                                    fresh_cache):
    proc, pids = start_compiling(tmp_path, fresh_cache)
    proc.kill()                                         # SIGKILL: no handler runs in Python
    proc.communicate(timeout=30)
    assert_gone_within_a_second(pids)
    assert temporaries(fresh_cache), "the killed build left no partial output to sweep"
    compile_tiny(cc=FAST_CC)                            # a later build, of another entry
    assert temporaries(fresh_cache) == []


@needs_cc
def test_signal_handlers_are_left_as_they_were(monkeypatch):
    monkeypatch.setenv('MICROGRAD_CACHE', '0')         # every compile runs the compiler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert compile_tiny(cc=FAST_CC).build.cmd is not None
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    mine = lambda signum, frame: None                   # noqa: E731
    old = signal.signal(signal.SIGTERM, mine)
    try:
        assert compile_tiny(cc=FAST_CC).build.cmd is not None
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def test_temporaries_are_swept_only_when_no_one_holds_their_lock(tmp_path):
    key_dead, key_busy = 'a' * 32, 'b' * 32
    names = [f'.tmp-{key_dead}-99999.so', f'.{key_dead}.c.x1y2.tmp',
             f'.tmp-{key_busy}-12345.so', f'.{key_busy}.sha256.abcd.tmp']
    for name in names + ['mnist', 'notes.txt', '.hidden-of-someone-else']:
        (tmp_path / name).write_text('x')
    (tmp_path / f'{key_busy}.lock').touch()
    with open(tmp_path / f'{key_busy}.lock') as held:
        fcntl.flock(held, fcntl.LOCK_EX)                # a build of key_busy is running
        removed = cache.sweep_temporaries(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == sorted(names[:2])
    left = set(os.listdir(tmp_path))
    assert set(names[2:]) <= left and {'mnist', 'notes.txt', '.hidden-of-someone-else'} <= left


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_command_started_in_its_own_group_dies_with_its_parent(tmp_path):
    """``compiler.build.process.run_in_own_group`` by itself, in a child Python killed by SIGKILL."""
    script = textwrap.dedent(f'''\
        from compiler.build.process import run_in_own_group
        run_in_own_group(['/bin/sh', '-c', 'sleep 60 & echo $! > {tmp_path}/child.pid; '
                          'echo $$ > {tmp_path}/driver.pid; wait'])
    ''')
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')]))}
    proc = subprocess.Popen([sys.executable, '-c', script], env=env)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / 'driver.pid').exists() or not (tmp_path / 'driver.pid').read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
        pids = [int((tmp_path / n).read_text()) for n in ('driver.pid', 'child.pid')]
    finally:
        proc.kill()
        proc.wait()
    assert_gone_within_a_second(pids)


PARALLEL = textwrap.dedent('''\
    import sys
    import compiler
    from micrograd import Value, nn
    model = nn.MLP(4, [3, 2], seed=0)
    xs = [Value(0.0) for _ in range(4)]
    out = model(xs)
    compiler.compile(out[0] * out[1], xs, model.parameters(), cc=sys.argv[1])
''')


@needs_cc
def test_ctrl_c_stops_every_part_of_a_parallel_build_at_once(tmp_path, fresh_cache):
    """A build in several translation units compiles them on threads; Ctrl-C
    reaches only the main thread, which must stop the other threads'
    compilers instead of waiting for them (issue 21.12: a microgpt build
    took 5-7 s to stop)."""
    real = shutil.which(FAST_CC)
    cc = tmp_path / 'slowcc'
    cc.write_text(textwrap.dedent(f'''\
        #!/bin/sh
        case "$1" in -E|--version|-v) exec {real} "$@";; esac
        sleep 60 &
        echo $! >> {tmp_path}/children
        echo $$ >> {tmp_path}/drivers
        wait
        '''))
    cc.chmod(0o755)
    env = {**os.environ, 'MICROGRAD_CACHE_DIR': fresh_cache,
           'PYTHONPATH': os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')]))}
    env.pop('MICROGRAD_CACHE', None)
    proc = subprocess.Popen([sys.executable, '-c', PARALLEL, str(cc)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    drivers = tmp_path / 'drivers'
    while not drivers.exists() or len(drivers.read_text().split()) < 2:     # two parts at once
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the parallel build did not start: {proc.communicate()}")
        time.sleep(0.01)
    pids = [int(p) for name in ('drivers', 'children') for p in (tmp_path / name).read_text().split()]
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        raise AssertionError("Ctrl-C waited for the other parts' compilers") from None
    finally:
        proc.kill()
    assert time.monotonic() - start < 3, "Ctrl-C waited for the other parts' compilers"
    assert 'KeyboardInterrupt' in err
    time.sleep(0.2)
    assert not [pid for pid in pids if alive(pid)], "a compiler outlived the interrupted build"
