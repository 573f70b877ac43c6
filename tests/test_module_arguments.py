"""Every entry point of the generated ``nn`` module refuses bad arguments
with a clear exception naming the function and the argument, leaves the
module's state as it was, and releases every buffer it took; a fuzzer in a
subprocess calls them in random order with random arguments."""
import gc
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from compiler.constants import KERNELS, MAX_THREADS
from compiler.load import load_module

from tests.differential import COMPILERS, FAST_CC
from tests.fuzz_module import watched
from tests.graphs import N_IN, N_OUT, N_P, P0, export_free, reset, snapshot

pytestmark = pytest.mark.skipif(not COMPILERS, reason="no C compiler installed")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_refused(m, fn, args, exc, words):
    """``fn(*args)`` raises ``exc`` with every one of ``words`` in its message,
    leaves the module's values and gradients unchanged and every argument's
    reference count as it was (an unreleased buffer holds a reference)."""
    before = snapshot(m)
    objs = watched(args)
    counts = [sys.getrefcount(o) for o in objs]
    with pytest.raises(exc) as e:
        fn(*args)
    message = str(e.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    del e
    assert [sys.getrefcount(o) for o in objs] == counts, "an argument's reference count changed"
    after = snapshot(m)
    assert np.array_equal(before[0], after[0], equal_nan=True) and np.array_equal(before[1], after[1])


def readonly(a):
    a.flags.writeable = False
    return a


class Boom:
    def __float__(self):
        raise ZeroDivisionError("from __float__")


good_X = np.zeros((4, N_IN))
good_out = np.zeros((4, N_OUT))


def bad_buffers(func, arg, n, writable):
    """The usual bad 1-D buffers for argument ``arg`` of ``func`` expecting
    ``n`` float64: (name, the arguments, exception, words of its message)."""
    cases = [
        ('list', ([0.0] * n,), TypeError, [f'{func}()', arg, 'buffer']),
        ('str', ('abc',), TypeError, [f'{func}()', arg]),
        ('None', (None,), TypeError, [f'{func}()', arg]),
        ('bytes', (b'\0' * (8 * n),), TypeError, [f'{func}()', arg, "format 'B'"]),
        ('float32', (np.zeros(n, np.float32),), TypeError, [arg, "format 'f'", 'itemsize 4']),
        ('int64', (np.zeros(n, np.int64),), TypeError, [arg, "format 'l'"]),
        ('object', (np.array([0.5] * n, dtype=object),), TypeError, [arg, "format 'O'"]),
        ('bigendian', (np.zeros(n, '>f8'),), TypeError, [arg, "'>d'"]),
        ('short', (np.zeros(n - 1),), ValueError, [f'{func}()', arg, f'expected {n}']),
        ('long', (np.zeros(n + 1),), ValueError, [arg, f'expected {n}']),
        ('2d', (np.zeros((1, n)),), ValueError, [arg, '1-dimensional']),
        ('strided', (np.zeros(2 * n)[::2],), ValueError, [arg, 'C-contiguous']),
        ('reversed', (np.zeros(n)[::-1],), ValueError, [arg, 'C-contiguous']),
        ('nargs0', (), TypeError, [f'{func}() takes 1 argument (0 given)']),
        ('nargs2', (np.zeros(n), np.zeros(n)), TypeError, [f'{func}() takes 1 argument (2 given)']),
    ]
    if writable:
        cases.append(('readonly', (readonly(np.zeros(n)),), ValueError, [arg, 'read-only']))
        cases.append(('bytes-view', (memoryview(bytes(8 * n)).cast('d'),), ValueError, [arg, 'read-only']))
    return cases


def _cases():
    """(entry point, a function of the model giving the arguments, exception, words of its message)."""
    cases = []

    def add(func, name, args, exc, words):
        make = args if callable(args) else (lambda m: args)
        cases.append(pytest.param(func, make, exc, words, id=f'{func}-{name}'))

    for func, arg, n, writable in [('set_input', 'values', N_IN, False), ('read_params', 'out', N_P, True),
                                   ('read_grads', 'out', N_P, True), ('write_params', 'values', N_P, False),
                                   ('read_outputs', 'out', N_OUT, True), ('read_data', 'out', 99, True)]:
        for name, args, exc, words in bad_buffers(func, arg, n, writable):
            if func == 'set_input' and name == 'list':
                continue             # set_input takes lists
            if func == 'read_data' and name in ('short', 'long'):
                continue             # its length is the program's slot count: below
            add(func, name, args, exc, words)
    add('read_data', 'short', lambda m: (np.zeros(m.module.n_data - 1),), ValueError,
        ['read_data()', 'out', 'expected'])
    add('set_input', 'short-list', ([0.0] * (N_IN - 1),), ValueError, ['set_input()', 'values', 'expected 3'])
    add('set_input', 'long-tuple', ((0.0,) * (N_IN + 1),), ValueError, ['values has 4 values'])
    add('set_input', 'str-item', ([0.0, 'a', 0.0],), TypeError, ['set_input()', 'values[1]', 'str'])
    add('set_input', 'none-item', ((0.0, 0.0, None),), TypeError, ['values[2]', 'NoneType'])
    add('set_input', 'complex-item', ([1j, 0.0, 0.0],), TypeError, ['values[0]', 'complex'])
    add('set_input', 'list-item', ([[0.0], 0.0, 0.0],), TypeError, ['values[0]'])
    add('set_input', 'huge-item', ([0.0, 10 ** 400, 0.0],), ValueError, ['values', 'too large'])
    add('set_input', 'float-raises', ([0.0, 0.0, Boom()],), ZeroDivisionError, ['from __float__'])
    add('set_input', 'dict', ({},), TypeError, ['set_input()', 'values', 'list of numbers'])
    add('set_input', 'number', (3.0,), TypeError, ['set_input()', 'values'])
    add('write_params', 'nan', (np.array([0.0] * 5 + [math.nan] + [0.0] * 7),), ValueError,
        ['write_params()', 'values[5]', 'not finite'])
    add('write_params', 'inf', (np.full(N_P, -math.inf),), ValueError, ['values[0]', 'not finite'])
    for name, lr, exc, words in [('str', 'a', TypeError, ['lr', 'real number', 'str']),
                                 ('None', None, TypeError, ['lr']), ('list', [0.1], TypeError, ['lr']),
                                 ('complex', 0.1j, TypeError, ['lr']), ('nan', math.nan, ValueError, ['lr', 'finite']),
                                 ('inf', math.inf, ValueError, ['lr', 'finite']), ('-inf', -math.inf, ValueError, ['lr']),
                                 ('negative', -0.1, ValueError, ['lr', '>= 0']),
                                 ('huge', 10 ** 400, ValueError, ['lr', 'too large'])]:
        add('update', f'lr-{name}', (lr,), exc, ['update()'] + words)
        add('train_batch', f'lr-{name}', (good_X, lr), exc, ['train_batch()'] + words)
    add('update', 'lr-raises', (Boom(),), ZeroDivisionError, ['from __float__'])
    add('update', 'nargs0', (), TypeError, ['update() takes 1 argument (0 given)'])
    add('update', 'nargs2', (0.1, 0.1), TypeError, ['update() takes 1 argument (2 given)'])
    for func in ('backward', 'zero_grad'):
        add(func, 'nargs1', (0.0,), TypeError, [f'{func}() takes 0 arguments (1 given)'])
    add('forward', 'nargs2', (1, 1), TypeError, ['forward() takes 0 to 1 arguments (2 given)'])
    add('forward', 'n-float', (0.0,), TypeError, ['forward()', 'n must be an int'])
    add('forward', 'n-one-loss', (1,), TypeError, ['forward()', 'a sequence', 'one loss'])
    add('forward', 'n-huge-one-loss', (2 ** 70,), TypeError, ['forward()', 'a sequence', 'one loss'])
    add('forward', 'n-bool', (True,), TypeError, ['forward()', 'n must be an int, not bool'])
    # True is neither a count nor a rate, wherever it is given
    add('update', 'lr-bool', (True,), TypeError, ['update()', 'lr', 'bool'])
    add('step', 'lr-bool', (False,), TypeError, ['step()', 'lr', 'bool'])
    add('train_batch', 'lr-bool', (good_X, True), TypeError, ['train_batch()', 'lr', 'bool'])
    add('set_threads', 'n-bool', (True,), TypeError, ['set_threads()', 'n must be an int, not bool'])
    add('set_threads', 'n-float', (2.0,), TypeError, ['set_threads()', 'n must be an int'])
    add('set_threads', 'n-huge', (2 ** 70,), ValueError, ['set_threads()', f'from 1 to {MAX_THREADS}', str(2 ** 70)])
    add('set_threads', 'n-zero', (0,), ValueError, ['set_threads()', f'from 1 to {MAX_THREADS}, got 0'])
    for name, X, exc, words in [
            ('1d', np.zeros(N_IN), ValueError, ['X', '2-dimensional']),
            ('3d', np.zeros((2, N_IN, 1)), ValueError, ['X', '2-dimensional']),
            ('cols', np.zeros((4, N_IN + 1)), ValueError, ['X has 4 columns, expected 3']),
            ('float32', np.zeros((4, N_IN), np.float32), TypeError, ['X', "format 'f'"]),
            ('int64', np.zeros((4, N_IN), np.int64), TypeError, ['X', "format 'l'"]),
            ('object', np.full((4, N_IN), 0.5, dtype=object), TypeError, ['X', "format 'O'"]),
            ('strided', np.zeros((4, 2 * N_IN))[:, ::2], ValueError, ['X', 'C-contiguous']),
            ('fortran', np.asfortranarray(np.zeros((4, N_IN))), ValueError, ['X', 'C-contiguous']),
            ('lists', [[0.0] * N_IN] * 4, TypeError, ['X', '2-D float64 buffer'])]:
        add('train_batch', f'X-{name}', (X, 0.1), exc, ['train_batch()'] + words)
        add('predict', f'X-{name}', (X, good_out), exc, ['predict()'] + words)
    add('train_batch', 'X-empty', (np.zeros((0, N_IN)), 0.1), ValueError, ['train_batch()', 'no rows'])
    for name, out, exc, words in [
            ('rows', np.zeros((3, N_OUT)), ValueError, ['out has 3 rows, expected 4']),
            ('cols', np.zeros((4, N_OUT + 1)), ValueError, ['out has 3 columns, expected 2']),
            ('1d', np.zeros(4 * N_OUT), ValueError, ['out', '2-dimensional']),
            ('readonly', readonly(np.zeros((4, N_OUT))), ValueError, ['out', 'read-only']),
            ('strided', np.zeros((4, 2 * N_OUT))[:, ::2], ValueError, ['out', 'C-contiguous']),
            ('float32', np.zeros((4, N_OUT), np.float32), TypeError, ['out', "format 'f'"]),
            ('none', None, TypeError, ['out'])]:
        add('predict', f'out-{name}', (good_X, out), exc, ['predict()'] + words)
    add('predict', 'nargs1', (good_X,), TypeError, ['predict() takes 2 arguments (1 given)'])
    add('predict', 'nargs3', (good_X, good_out, 0.1), TypeError, ['predict() takes 2 arguments (3 given)'])
    # without a compiled optimizer, train_batch's lr is required
    add('train_batch', 'no-lr', (good_X,), TypeError, ['train_batch()', 'lr is required', 'optimizer'])
    add('train_batch', 'nargs3', (good_X, 0.1, 0.1), TypeError, ['train_batch() takes 1 to 2 arguments (3 given)'])
    add('train_batch', 'nan-row', (np.array([[0.0, float('nan'), 0.0]]), 0.1), ValueError,
        ['train_batch()', 'X[0, 1] is not finite', 'nothing was changed'])
    return cases


@pytest.mark.parametrize('func, make, exc, words', _cases())
def test_bad_arguments_are_refused_clearly_and_change_nothing(small, func, make, exc, words):
    reset(small)
    assert_refused(small, getattr(small.module, func), make(small), exc, words)


def test_good_arguments_of_every_kind_are_accepted(small):
    reset(small)
    from array import array
    for values in ([0.5, 1, np.float32(0.25)], (0.5, 1.0, 0.25), np.array([0.5, 1.0, 0.25]),
                   array('d', [0.5, 1.0, 0.25]), memoryview(array('d', [0.5, 1.0, 0.25])),
                   np.array([0.5, 1.0, 0.25], '<f8'), readonly(np.array([0.5, 1.0, 0.25])),
                   np.zeros((2, 3))[1], np.zeros((3, 1))[:, 0]):
        small.set_input(values)
    small.module.write_params(readonly(P0.copy()))
    small.update(np.float64(0.0))
    small.update(1)
    assert small.train_batch(np.zeros((3, 3)), -0.0) == small.train_batch(np.zeros((3, 3)), 0)
    small.module.predict(np.zeros((0, 3)), np.zeros((0, 2)))
    small.set_params(np.zeros(13, np.float32))
    small.set_params([0] * 13)
    assert not small.params().any()


@pytest.mark.parametrize('values, exc, words', [
    ('abc', TypeError, ['set_params()', 'real numbers', '<U3']),
    ([0.5, 'a'] + [0.0] * 11, TypeError, ['set_params()', 'real numbers']),
    ([None] * 13, TypeError, ['set_params()', 'object']),
    (np.zeros(13, dtype=bool), TypeError, ['set_params()', 'bool']),
    (np.zeros(13, dtype=complex), TypeError, ['set_params()', 'complex']),
    ([[0.0, 1.0], [2.0]], TypeError, ['set_params()', 'sequence of 13 numbers']),
    (np.zeros(14), ValueError, ['set_params()', 'shape (13,)', '(14,)']),
    (np.zeros((1, 13)), ValueError, ['set_params()', '(1, 13)']),
    ([math.nan] * 13, ValueError, ['set_params()', 'values[0]', 'not finite']),
])
def test_set_params_refuses_what_is_not_13_finite_reals(small, values, exc, words):
    reset(small)
    assert_refused(small, small.set_params, (values,), exc, words)


@pytest.mark.parametrize('X, exc, words', [
    ([['a'] * 3], TypeError, ['predict()', '2-D array of real numbers', 'list']),
    (np.zeros(3), TypeError, ['predict()', 'shape (3,)']),
    (None, TypeError, ['predict()', 'NoneType']),
    (np.zeros((2, 4)), ValueError, ['predict()', 'X has 4 columns, expected 3']),
    (np.zeros((2, 3), bool), TypeError, ['predict()', 'dtype bool']),
])   # a list of lists of numbers, float32 and slices are copied to float64 rows (test_api.py)
def test_the_predict_wrapper_refuses_what_is_not_a_2d_array(small, X, exc, words):
    reset(small)
    assert_refused(small, small.predict, (X,), exc, words)


def test_backward_needs_a_forward_after_every_change(small):
    def refused():
        with pytest.raises(RuntimeError, match=r'backward\(\) needs the values of forward\(\)'):
            small.backward()

    fresh = load_module(small.build.path)     # a new module: nothing has run
    with pytest.raises(RuntimeError, match='needs the values of forward'):
        fresh.backward()
    reset(small)
    small.backward()                           # after forward: fine
    for change in (lambda: small.set_input([0.0, 0.0, 0.0]), lambda: small.update(0.1),
                   lambda: small.set_params(P0), lambda: small.train_batch(good_X, 0.1)):
        small.forward()
        change()
        refused()
    small.forward()
    small.predict(good_X)                      # predict runs rows of its own: the forward
    small.backward()                           # of set_input's row still stands
    small.set_input([0.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        small.set_input([0.0])                 # a refused call changes nothing ...
    refused()                                  # ... not even this flag
    small.forward()
    with pytest.raises(TypeError):
        small.set_input('abc')
    small.backward()


@pytest.mark.parametrize('func, shape, fmt, writable, other', [
    ('set_input', (N_IN + 1,), 'd', True, None),
    ('set_input', (1, N_IN), 'd', True, None),
    ('set_input', (N_IN,), 'f', True, None),
    ('set_input', (2 * N_IN,), 'd', True, 'strided'),
    ('read_params', (N_P,), 'd', False, None),        # read-only
    ('read_params', (N_P - 1,), 'd', True, None),
    ('write_params', (N_P,), 'd', True, 'nan'),
    ('read_outputs', (N_OUT,), 'd', False, None),
    ('train_batch', (4, N_IN + 1), 'd', True, None),
    ('train_batch', (4, N_IN), 'f', True, None),
    ('predict', (4, N_IN), 'd', True, 'bad out'),
    ('predict', (4, N_IN), 'd', True, 'good'),
    ('set_input', (N_IN,), 'd', True, 'good'),
])
def test_every_buffer_is_released_after_a_refusal(small, func, shape, fmt, writable, other):
    """A bytearray cannot be resized while a buffer of it is exported, and a
    memoryview cannot be released while it is: both tell a leaked export."""
    reset(small)
    size = 8 if fmt == 'd' else 4
    ba = bytearray(size * int(np.prod(shape)))
    mv = memoryview(ba).cast('B').cast(fmt, shape)
    if other == 'nan':
        mv[3] = math.nan
    arg = mv if writable else mv.toreadonly()
    if other == 'strided':
        arg = mv[::2] if fmt == 'd' and len(shape) == 1 else mv
    out_rows = (shape[0] if len(shape) == 2 else 1) - (other == 'bad out')
    out_ba = bytearray(8 * out_rows * N_OUT)
    out_mv = memoryview(out_ba).cast('d', (out_rows, N_OUT))
    args = {'train_batch': (arg, 0.1), 'predict': (arg, out_mv)}.get(func, (arg,))
    if other == 'good':
        getattr(small.module, func)(*args)
    else:
        with pytest.raises((TypeError, ValueError)):
            getattr(small.module, func)(*args)
    for view in (arg, mv, out_mv):
        view.release()          # BufferError if the module kept an export
    assert export_free(ba) and export_free(out_ba)


@pytest.mark.parametrize('cc', COMPILERS)
def test_fuzz_random_calls_in_a_subprocess(cc, private_build_cache):
    """Random call sequences with random good and bad arguments (see
    tests/fuzz_module.py): no crash, no unclear error, no state change on
    error, no reference or memory growth."""
    calls = 40000 if cc == FAST_CC else 15000
    r = subprocess.run([sys.executable, '-m', 'tests.fuzz_module', '--calls', str(calls),
                        '--seed', str(len(cc)), '--cc', cc], cwd=REPO,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'MICROGRAD_CACHE_DIR': private_build_cache})
    if r.returncode < 0:
        pytest.fail(f"the fuzzer was killed by {signal.Signals(-r.returncode).name}\n{r.stderr[-3000:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"fuzz [{cc}]: {report}")
    assert report['calls'] == calls
    assert report['succeeded'] > calls // 4 and sum(report['errors'].values()) > calls // 4
    assert report['traced_growth'] < 4096, report       # bytes traced by tracemalloc
    assert report['gc_objects_growth'] <= 10, report


def test_refused_calls_do_not_leak_memory(small):
    """What ``tracemalloc`` traces (``PyMem_Malloc`` scratch copies included)
    does not grow over thousands of refused calls."""
    import tracemalloc
    mod = small.module
    nan_params = np.full(N_P, math.nan)
    calls = [lambda: mod.set_input([0.0, None, 0.0]), lambda: mod.set_input((0.0, 0.0, 'x')),
             lambda: mod.set_input([0.0]), lambda: mod.set_input([0.0, 10 ** 400, 0.0]),
             lambda: mod.set_input(np.zeros(N_IN, np.float32)), lambda: mod.write_params(nan_params),
             lambda: mod.update(math.nan), lambda: mod.train_batch(np.zeros((4, N_IN + 1)), 0.1),
             lambda: mod.predict(good_X, np.zeros((3, N_OUT))), lambda: mod.read_params(readonly(np.zeros(N_P))),
             lambda: mod.forward(1)]

    def run(n):
        for _ in range(n):
            for call in calls:
                try:
                    call()
                except (TypeError, ValueError):
                    pass
    reset(small)
    tracemalloc.start()
    try:
        run(200)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        run(3000)
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a leak is at least one allocation (16 bytes or more) per refused call;
    # a few kilobytes come and go with the interpreter's own caches
    n = 3000 * len(calls)
    assert growth < n, f"{growth} bytes more after {n} refused calls"


def test_the_fuzzer_catches_a_leaked_reference(small):
    """The fuzzer's reference count check works: an argument that gains a
    reference during a call (as with a missing DECREF or PyBuffer_Release)
    is reported."""
    from tests import fuzz_module
    fresh = load_module(small.build.path)     # the fuzzer starts from a module that has not run

    class Leaky:
        kept = []

        def __getattr__(self, name):
            real = getattr(fresh, name)
            if name != 'set_input':
                return real

            def set_input(*args):
                Leaky.kept.extend(args)
                return real(*args)
            return set_input
    with pytest.raises(AssertionError, match='set_input.*changed reference counts'):
        fuzz_module.fuzz(Leaky(), 2000, seed=1)


@pytest.mark.parametrize('value', ['foo', 'AVX2', 'sse'])
def test_an_unknown_micrograd_kernels_is_refused_naming_the_variable(small, value):
    """$MICROGRAD_KERNELS=foo is no instruction set: loading the module says
    so, naming the variable and the values it may take (a typo must not pass
    silently as 'the widest this CPU has')."""
    script = f'from compiler.load import load_module\nload_module({str(small.build.path)!r})\n'
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, MICROGRAD_KERNELS=value)
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"ValueError: MICROGRAD_KERNELS must be one of {', '.join(KERNELS)} (or unset), not '{value}'"
    for good in ('', *KERNELS):
        env['MICROGRAD_KERNELS'] = good
        done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, (good, done.stderr)
