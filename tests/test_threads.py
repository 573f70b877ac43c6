"""Compiled modules are independent of each other; ``train_batch`` and
``predict`` release the GIL, and a second thread calling into the same module
waits for it (with the GIL released), never races it."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import compiler
from compiler.load import load_module
from micrograd import Value
from micrograd.nn import MLP

from tests.differential import COMPILERS, FAST_CC
from tests.graphs import N_IN, N_OUT, N_P, P0, compile_small, export_free, reset

pytestmark = pytest.mark.skipif(not COMPILERS, reason="no C compiler installed")


def test_two_loads_of_one_cached_shared_object_are_independent(small):
    again = compile_small(FAST_CC)            # the same graph: the cached .so
    assert again.build.cached and again.build.path == small.build.path
    third = load_module(small.build.path)
    assert again.module is not small.module and third is not small.module
    reset(small)
    again.set_params(P0 * 2)
    third.write_params(np.array(P0 * -1))
    for m in (again.module, third):
        m.set_input([0.25, -0.5, 1.0])
    losses = [small.forward(), again.forward(), third.forward()]
    assert len(set(losses)) == 3
    np.testing.assert_array_equal(small.params(), P0)
    np.testing.assert_array_equal(again.params(), P0 * 2)
    with pytest.raises(RuntimeError, match='needs the values of forward'):
        load_module(small.build.path).backward()   # and the flag is per module
    small.backward()


def big_batch(rows, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, N_IN))


def run_in_thread(fn, *args):
    result = {}

    def target():
        try:
            result['value'] = fn(*args)
        except BaseException as e:      # noqa: BLE001 -- reported by the caller
            result['error'] = e
    t = threading.Thread(target=target)
    t.start()
    return t, result


def test_two_models_in_two_threads_match_running_them_one_after_the_other(small):
    other = compiler.compile(*_mlp_regression(), cc=FAST_CC)
    X1, X2 = big_batch(20000, 1), np.random.default_rng(2).standard_normal((20000, 4))
    p_other = other.params()

    def steps(m, X, n=4):
        return [m.train_batch(X, 0.05) for _ in range(n)] + [m.predict(X[:50])]

    reset(small)
    seq = steps(small, X1), steps(other, X2)
    seq_params = small.params(), other.params()
    reset(small)
    other.set_params(p_other)
    t1, r1 = run_in_thread(steps, small, X1)
    t2, r2 = run_in_thread(steps, other, X2)
    t1.join()
    t2.join()
    assert 'error' not in r1 and 'error' not in r2, (r1.get('error'), r2.get('error'))
    for got, want in zip((r1['value'], r2['value']), seq):
        assert got[:4] == want[:4]
        np.testing.assert_array_equal(got[4], want[4])
    np.testing.assert_array_equal(small.params(), seq_params[0])
    np.testing.assert_array_equal(other.params(), seq_params[1])


def _mlp_regression():
    model = MLP(4, [16, 16, 1], seed=5)
    xs = [Value(0.0) for _ in range(4)]
    out = model(xs)
    return (out - xs[0] * 0.5) ** 2, xs, model.parameters(), [out]


def byte_views(*shapes):
    """Float64 memoryviews over bytearrays: the arrays tell if a view of them is still exported."""
    arrays = [bytearray(8 * int(np.prod(shape))) for shape in shapes]
    return arrays, [memoryview(a).cast('d', shape) for a, shape in zip(arrays, shapes)]


def _probe_while(probes, thread):
    """Call ``probes`` in turn while ``thread`` runs (each must succeed: it
    waits for the model); returns how many calls were made."""
    calls = 0
    while thread.is_alive():
        for probe in probes:
            try:
                probe()
            except RuntimeError as e:
                if 'needs the values of forward' not in str(e):   # backward() between the calls
                    raise
            calls += 1
    return calls


@pytest.mark.parametrize('call', ['train_batch', 'predict'])
def test_a_second_thread_in_the_same_module_waits_for_it(small, call):
    """Every entry point called while another thread's call runs waits for it
    (nothing raises), sees the model before or after that call (never in
    between), and releases the buffers it was given."""
    X = big_batch(100000)
    out = np.empty((len(X), N_OUT))
    arrays, (params_v, input_v, X_v, out_v) = byte_views((N_P,), (N_IN,), (2, N_IN), (2, N_OUT))
    mod = small.module
    seen = []
    probes = [lambda: seen.append(small.params()), lambda: mod.set_input(input_v),
              lambda: mod.set_input([0.0] * N_IN), mod.forward, mod.backward, mod.zero_grad,
              lambda: mod.update(0.0), lambda: mod.predict(X_v, out_v),
              lambda: mod.read_outputs(np.empty(N_OUT)), lambda: mod.read_data(np.empty(mod.n_data)),
              lambda: mod.set_threads(mod.get_threads()), lambda: mod.read_params(params_v)]
    for attempt in range(3):
        reset(small)
        before = small.params()
        args = (X, 0.5) if call == 'train_batch' else (X, out)
        t, result = run_in_thread(getattr(mod, call), *args)
        calls = _probe_while(probes, t)
        t.join()
        assert 'error' not in result, result
        after = small.params()
        for p in seen:
            assert np.array_equal(p, before) or np.array_equal(p, after), "a read saw a batch half done"
        seen.clear()
        assert calls > 0
    for view in (params_v, input_v, X_v, out_v):
        view.release()          # BufferError if a call kept an export
    assert all(export_free(a) for a in arrays)


def test_the_gil_is_released_while_a_call_waits_for_the_model(small):
    """A call waiting for the model lets other Python threads run: a ticking
    thread advances while this thread's read_params waits out a train_batch."""
    X = big_batch(300000, 3)
    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.0005)
    ticker = threading.Thread(target=tick)
    ticker.start()
    waited = []
    try:
        for attempt in range(10):
            reset(small)
            t, result = run_in_thread(small.module.train_batch, X, 0.05)
            time.sleep(0.01)            # the batch is inside C by now (it takes far longer)
            if not t.is_alive():
                continue
            t0, n0 = time.perf_counter(), ticks[0]
            small.params()
            t1, n1 = time.perf_counter(), ticks[0]
            t.join()
            assert 'error' not in result, result
            if t1 - t0 > 0.05:          # it did wait
                waited.append(n1 - n0)
            if len(waited) >= 2:
                break
    finally:
        stop.set()
        ticker.join()
    assert waited, "read_params never had to wait for the batch"
    assert all(n >= 3 for n in waited), f"the ticking thread stood still while a call waited: {waited}"


def test_calls_that_wait_leave_the_running_call_exact(small):
    """While a train_batch runs, a second thread's calls wait for it and
    change nothing it uses: the result equals the same train_batch run alone."""
    X = big_batch(100000, 3)
    alone = compile_small(FAST_CC)
    reset(alone)
    expected = alone.train_batch(X, 0.05), alone.params()
    probes = [lambda: small.module.read_params(np.empty(N_P)), lambda: small.module.read_grads(np.empty(N_P))]
    for attempt in range(3):
        reset(small)
        t, result = run_in_thread(small.module.train_batch, X, 0.05)
        _probe_while(probes, t)
        t.join()
        assert result['value'] == expected[0]
        np.testing.assert_array_equal(small.params(), expected[1])


@pytest.mark.parametrize('entry', ['update', 'set_input', 'train_batch'])
def test_a_conversion_that_lets_another_thread_start_waits_without_deadlock(small, entry):
    """A ``__float__`` runs Python code, so another thread can start a
    train_batch in the middle of converting this call's arguments; the model
    is taken only after the conversion, so this call waits for that batch
    (and does not deadlock on itself)."""
    X = big_batch(200000, 4)

    class LetsOthersIn:
        """Starts a train_batch in another thread, and returns once it runs."""
        thread = None

        def __float__(self):
            if LetsOthersIn.thread is None:
                LetsOthersIn.thread, LetsOthersIn.result = run_in_thread(small.module.train_batch, X, 0.05)
                time.sleep(0.01)
            return 0.01

    reset(small)
    lr = LetsOthersIn()
    args = {'update': (lr,), 'set_input': ([0.0, lr, 0.0],), 'train_batch': (X[:3], lr)}[entry]
    done, result = run_in_thread(getattr(small.module, entry), *args)
    done.join(timeout=60)
    assert not done.is_alive(), "deadlock"
    assert 'error' not in result, result
    LetsOthersIn.thread.join()
    assert 'error' not in LetsOthersIn.result, LetsOthersIn.result


FORKED_WHILE_BUSY = textwrap.dedent("""
    import os, sys, threading, time
    sys.path[:0] = [{root!r}]
    import numpy as np
    from tests.graphs import compile_small
    m = compile_small({cc!r})
    X = np.random.default_rng(0).standard_normal((400000, 3))
    t = threading.Thread(target=m.train_batch, args=(X, 0.05))
    t.start()
    time.sleep(0.05)
    busy = t.is_alive()
    pid = os.fork()
    if pid == 0:                     # the child: no thread is inside train_batch here
        m.params()
        m.train_batch(X[:10], 0.05)
        m.threads = 2
        m.train_batch(X[:10], 0.05)
        os._exit(0)
    still_busy = t.is_alive()
    t.join()
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = -1
    print(busy and still_busy, status)
""")


def test_a_process_forked_while_another_thread_trains_finds_the_model_free():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for attempt in range(5):
        done = subprocess.run([sys.executable, '-c', FORKED_WHILE_BUSY.format(root=root, cc=FAST_CC)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        overlapped, status = done.stdout.split()
        assert status == '0', "the forked child could not use the model (it hung or failed)"
        if overlapped == 'True':
            return
    pytest.fail("the fork never happened while train_batch ran")
