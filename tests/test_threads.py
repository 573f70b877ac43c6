"""Compiled modules are independent of each other; ``train_batch`` and
``predict`` release the GIL, and a second thread calling into the same module
is refused, never raced."""
import threading

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


def _refusals(probes, thread):
    """Call ``probes`` in turn while ``thread`` runs: the indices of those that
    were refused as "in use by another thread" (any other error is raised)."""
    refused = set()
    while thread.is_alive():
        for i, probe in enumerate(probes):
            try:
                probe()
            except RuntimeError as e:
                if 'needs the values of forward' in str(e):
                    continue       # backward() between the calls: not a refusal
                assert 'in use by another thread' in str(e)
                refused.add(i)
    return refused


def byte_views(*shapes):
    """Float64 memoryviews over bytearrays: the arrays tell if a view of them is still exported."""
    arrays = [bytearray(8 * int(np.prod(shape))) for shape in shapes]
    return arrays, [memoryview(a).cast('d', shape) for a, shape in zip(arrays, shapes)]


@pytest.mark.parametrize('call', ['train_batch', 'predict'])
def test_a_second_thread_in_the_same_module_is_refused_not_raced(small, call):
    """Every entry point is refused while another thread's call runs, and
    releases the buffers it was given. Observing the refusal also shows the
    GIL is released: the probing thread could not run at all otherwise."""
    X = big_batch(100000)
    out = np.empty((len(X), N_OUT))
    arrays, (params_v, input_v, X_v, out_v) = byte_views((N_P,), (N_IN,), (2, N_IN), (2, N_OUT))
    mod = small.module
    probes = [lambda: mod.read_params(params_v), lambda: mod.write_params(params_v),
              lambda: mod.set_input(input_v), lambda: mod.set_input([0.0] * N_IN),
              mod.forward, mod.backward, mod.zero_grad, lambda: mod.update(0.0),
              lambda: mod.train_batch(X_v, 0.0), lambda: mod.predict(X_v, out_v),
              lambda: mod.read_outputs(np.empty(N_OUT)), lambda: mod.read_data(np.empty(mod.n_data))]
    twin = load_module(small.build.path)      # the same .so, its own state: never refused
    twin_probes = [twin.forward, lambda: twin.predict(X_v, out_v)]
    reset(small)
    refused, attempts = set(), 0
    while len(refused) < len(probes) and attempts < 40:
        attempts += 1
        args = (X, 0.0) if call == 'train_batch' else (X, out)
        t, result = run_in_thread(getattr(mod, call), *args)
        if attempts % 4:
            refused |= _refusals(probes, t)
        else:
            assert not _refusals(twin_probes, t), "a module with a state of its own was refused"
        t.join()
        assert 'error' not in result, result
    missing = [i for i in range(len(probes)) if i not in refused]
    assert not missing, f"probes {missing} never overlapped the running call in {attempts} attempts"
    for view in (params_v, input_v, X_v, out_v):
        view.release()          # BufferError if a refused call kept an export
    assert all(export_free(a) for a in arrays)


def test_refused_calls_leave_the_running_call_exact(small):
    """While a train_batch runs, a second thread's calls are refused and
    change nothing: the result equals the same train_batch run alone."""
    X = big_batch(100000, 3)
    alone = compile_small(FAST_CC)
    reset(alone)
    expected = alone.train_batch(X, 0.05), alone.params()
    # each would corrupt the batch if it raced it, and is harmless after it
    probes = [lambda: small.module.set_input([9.0, 9.0, 9.0]), small.module.zero_grad]
    for attempt in range(20):
        reset(small)
        t, result = run_in_thread(small.module.train_batch, X, 0.05)
        refused = _refusals(probes, t)
        t.join()
        assert result['value'] == expected[0]
        np.testing.assert_array_equal(small.params(), expected[1])
        if refused:
            break
    assert refused, "the batch always finished before a second call got in"


@pytest.mark.parametrize('entry', ['update', 'set_input', 'train_batch'])
def test_a_conversion_that_lets_another_thread_start_is_still_refused(small, entry):
    """A ``__float__`` runs Python code, so another thread can start a
    train_batch in the middle of converting this call's arguments; the state
    is claimed only after the conversion, so this call is refused too."""
    X = big_batch(200000, 4)
    buf = np.empty(N_P)

    def wait_until_busy(thread):
        """Whether ``thread``'s call was seen running (refusing a probe)."""
        while thread.is_alive():
            try:
                small.module.read_params(buf)
            except RuntimeError:
                return True
        return False

    class LetsOthersIn:
        """Starts a train_batch in another thread, and returns once it runs."""
        thread = None

        def __float__(self):
            if LetsOthersIn.thread is None:
                LetsOthersIn.thread, _ = run_in_thread(small.module.train_batch, X, 0.05)
                self.seen = wait_until_busy(LetsOthersIn.thread)
            return 0.01

    refused_while_busy = 0
    for attempt in range(10):
        reset(small)
        LetsOthersIn.thread = None
        lr = LetsOthersIn()
        args = {'update': (lr,), 'set_input': ([0.0, lr, 0.0],), 'train_batch': (X[:3], lr)}[entry]
        try:
            getattr(small.module, entry)(*args)
            refused = False
        except RuntimeError as e:
            assert 'in use by another thread' in str(e)
            refused = True
        LetsOthersIn.thread.join()
        if lr.seen:        # the other call was running just before this one claimed the state
            refused_while_busy += refused
        if refused_while_busy >= 2:
            break
    assert refused_while_busy >= 1, "the other thread's call was never running when the conversion ended"
