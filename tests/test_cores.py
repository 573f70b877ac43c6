"""Every core, the same bits: train_batch and predict split their rows and
weight tiles over C threads, and no thread count may change a result.

Most modules here are built with ``-DMICROGRAD_MIN_WORK_PER_THREAD=0``, so
that even a one-row batch is split over every thread asked for (by default
a small batch runs on fewer threads than asked, to stay fast)."""
import json
import os
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import compiler
from compiler import cpu
from compiler.constants import MAX_THREADS
from tests.differential import (COMPILERS, FAST_CC, assert_train_batch_matches_interpreter, compile_graph, needs_cc,
                                split_flags)
from tests.graphs import mlp_builder

THREAD_COUNTS = (1, 2, 3, 8)

# (inputs, hidden, classes, rows): layer sizes and batches of 1, 7, 63, 64,
# 65 and 257 (more than a block of 256 rows): smaller than a register tile,
# not a multiple of one, and a tile and one more
SHAPES = [
    (7, 65, 7, 257),
    (64, 1, 63, 1),
    (257, 64, 7, 65),
    (63, 257, 2, 7),
    (65, 7, 64, 64),
    (1, 63, 65, 63),
]


def mlp_params(sizes, seed=1):
    return list(np.random.default_rng(seed).uniform(-0.5, 0.5, sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))))


def batch(n_in, classes, rows, seed=2):
    """Sparse inputs (about 60% exact zeros, some -0.0) and one-hot labels."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (rows, n_in)) * (rng.random((rows, n_in)) < 0.4)
    x[rng.random((rows, n_in)) < 0.05] = -0.0
    labels = np.eye(classes)[rng.integers(0, classes, rows)]
    return np.ascontiguousarray(np.hstack([x, labels]))


def overflowing(params):
    """``params`` with weights that overflow: infinite sums, then nan."""
    params = list(params)
    for i in range(0, len(params), 7):
        params[i] = 1e308 if i % 2 else -1e308
    return params


def run(m, params, T, X):
    """Fresh params, ``T`` threads: a step and predict, then a step and
    predict from weights that make values and gradients non-finite; every
    result as bytes."""
    m.threads = T
    assert m.threads == T
    out = []
    for start in (params, overflowing(params)):
        m.set_params(start)
        out += [np.float64(m.train_batch(X, 0.25)).tobytes(), m.params().tobytes(), m.predict(X).tobytes()]
    return out


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: '-'.join(map(str, s)))
def test_every_thread_count_gives_the_same_bits(cc, shape):
    n_in, hidden, classes, rows = shape
    sizes = [n_in, hidden, classes]
    params = mlp_params(sizes)
    m = compile_graph(mlp_builder(sizes), n_in + classes, params, cc, flags=split_flags(cc))
    # (a layer of one input is no sum to lift: it stays scalar code)
    assert [type(op).__name__ for op in m.program.ops].count('MatVec') == (n_in > 1) + (hidden > 1)
    X = batch(n_in, classes, rows)
    results = {T: run(m, params, T, X) for T in THREAD_COUNTS}
    assert not np.isfinite(np.frombuffer(results[1][3])[0]), "the second step was to overflow"
    for T in THREAD_COUNTS[1:]:
        for what, a, b in zip(('loss', 'params', 'predict') * 2, results[1], results[T]):
            assert a == b, f"{what} at {T} threads differs from 1 thread"


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_eight_threads_match_the_interpreter(cc):
    # two blocks and a bit of rows, split over 8 threads; inputs with zeros
    sizes = [20, 9, 4]
    X = batch(20, 4, 300)
    assert_train_batch_matches_interpreter(mlp_builder(sizes), X, mlp_params(sizes), 0.5, cc, steps=2,
                                           flags=split_flags(cc), threads=8)


@needs_cc
def test_the_split_depends_on_the_work_not_the_results():
    # the default build runs a small batch on fewer threads: same bits
    sizes = [30, 16, 5]
    params = mlp_params(sizes)
    X = batch(30, 5, 40)
    default = compile_graph(mlp_builder(sizes), 35, params, FAST_CC)
    split = compile_graph(mlp_builder(sizes), 35, params, FAST_CC, flags=split_flags(FAST_CC))
    assert run(default, params, 8, X) == run(split, params, 8, X)


# -- the thread count: compile(threads=), $MICROGRAD_THREADS, m.threads ------

def test_threads_default_to_the_cores_this_process_may_use(small, monkeypatch):
    monkeypatch.delenv('MICROGRAD_THREADS', raising=False)
    from tests.graphs import compile_small
    assert compile_small(FAST_CC).threads == len(os.sched_getaffinity(0))


@needs_cc
def test_the_environment_sets_the_default_and_an_argument_wins(monkeypatch):
    from tests.graphs import compile_small
    monkeypatch.setenv('MICROGRAD_THREADS', '3')
    assert compile_small(FAST_CC).threads == 3
    assert compile_small(FAST_CC, threads=5).threads == 5
    monkeypatch.setenv('MICROGRAD_THREADS', 'lots')
    with pytest.raises(ValueError, match="MICROGRAD_THREADS must be a whole number of threads, not 'lots'"):
        compile_small(FAST_CC)
    monkeypatch.setenv('MICROGRAD_THREADS', '0')      # the message names the variable (issue 21.9)
    with pytest.raises(ValueError, match="MICROGRAD_THREADS must be at least 1, not '0'"):
        compile_small(FAST_CC)
    monkeypatch.setenv('MICROGRAD_THREADS', str(MAX_THREADS + 1))
    with pytest.raises(ValueError, match=f"MICROGRAD_THREADS must be from 1 to {MAX_THREADS}, not '{MAX_THREADS + 1}'"):
        compile_small(FAST_CC)


@needs_cc
@pytest.mark.parametrize('n', [1, 2, 7, 64, 65, 200, MAX_THREADS])
def test_any_positive_count_is_kept_as_given(small, n):
    old = small.threads
    try:
        small.threads = n
        assert small.threads == n
    finally:
        small.threads = old


@needs_cc
@pytest.mark.parametrize('bad, error', [(0, ValueError), (-2, ValueError), (MAX_THREADS + 1, ValueError),
                                        (2 ** 70, ValueError), (2.0, TypeError), ('2', TypeError),
                                        (True, TypeError)])
def test_a_bad_count_is_refused_and_changes_nothing(small, bad, error):
    old = small.threads
    with pytest.raises(error):
        small.threads = bad
    with pytest.raises(error):
        small.module.set_threads(bad)
    assert small.threads == old


@needs_cc
def test_threads_none_means_the_default(small, monkeypatch):
    monkeypatch.setenv('MICROGRAD_THREADS', '3')
    old = small.threads
    try:
        small.threads = 1
        small.threads = None
        assert small.threads == 3
    finally:
        small.threads = old


# -- more cores than any fixed cap: real processes with a simulated CPU count --------

MANY_CORES = textwrap.dedent('''
    import json, os, sys
    sys.path[:0] = [{root!r}]
    os.sched_getaffinity = lambda pid: set(range({cores}))     # this machine, as if it had {cores} CPUs
    import numpy as np
    import compiler
    from tests.differential import compile_graph
    from tests.graphs import compile_small, mlp_builder
    from tests.test_cores import batch, mlp_params, split_flags
    report = {{'default': compile_small({cc!r}).threads}}
    m = compile_small({cc!r}, threads={explicit})
    report['explicit'] = m.threads
    sizes = [40, 24, 6]
    params = mlp_params(sizes)
    X = batch(40, 6, 300)
    one = compile_graph(mlp_builder(sizes), 46, params, {cc!r}, flags=split_flags({cc!r}), threads=1)
    many = compile_graph(mlp_builder(sizes), 46, params, {cc!r}, flags=split_flags({cc!r}))
    report['many'] = many.threads
    a = [one.train_batch(X, 0.1), one.params().tobytes(), one.predict(X).tobytes()]
    b = [many.train_batch(X, 0.1), many.params().tobytes(), many.predict(X).tobytes()]
    report['same'] = a == b
    try:
        compile_small({cc!r}, threads={too_many})
        report['too_many'] = 'accepted'
    except ValueError as e:
        report['too_many'] = str(e)
    print(json.dumps(report))
''')


@needs_cc
@pytest.mark.parametrize('cores', [128, MAX_THREADS + 500])
def test_more_cpus_than_the_old_cap_work_by_default(cores):
    """With 128 CPUs visible (and more than MAX_THREADS), the default uses
    them all (capped silently at MAX_THREADS), an explicit 100 is kept, a
    batch on that many threads gives the bits of one thread, and only an
    explicit count above MAX_THREADS is an error."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OPENBLAS_NUM_THREADS='1', OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    env.pop('MICROGRAD_THREADS', None)
    script = MANY_CORES.format(root=root, cc=FAST_CC, cores=cores, explicit=100, too_many=MAX_THREADS + 1)
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    expected = min(cores, MAX_THREADS)
    assert report['default'] == expected and report['many'] == expected and report['explicit'] == 100
    assert report['same']
    assert f'threads must be from 1 to {MAX_THREADS}, got {MAX_THREADS + 1}' in report['too_many']


# -- several Python threads, each running several C threads -------------------

@needs_cc
def test_two_models_train_in_two_python_threads_each_on_several_cores():
    shapes = ([40, 24, 6], [33, 17, 5])
    models, data, expected = [], [], []
    for k, sizes in enumerate(shapes):
        params = mlp_params(sizes, seed=k)
        m = compile_graph(mlp_builder(sizes), sizes[0] + sizes[-1], params, FAST_CC,
                          flags=split_flags(FAST_CC), threads=3)
        X = batch(sizes[0], sizes[-1], 97, seed=k)
        losses = [m.train_batch(X, 0.1) for _ in range(30)]
        expected.append((losses, m.params().tobytes()))
        m.set_params(params)
        models.append(m)
        data.append(X)
    got = [None, None]

    def train(k):
        got[k] = ([models[k].train_batch(data[k], 0.1) for _ in range(30)], models[k].params().tobytes())
    workers = [threading.Thread(target=train, args=(k,)) for k in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "deadlock: a training thread did not finish"
    assert got == expected


# -- a thread that cannot be created: one thread does the work -------------------

CANNOT_START_THREADS = textwrap.dedent("""
    import json, os, resource, sys
    import numpy as np
    sys.path[:0] = [{root!r}]
    from tests.differential import compile_graph
    from tests.graphs import mlp_builder
    from tests.test_cores import batch, mlp_params, split_flags
    sizes = [40, 24, 6]
    params = mlp_params(sizes)
    X = batch(40, 6, 97)
    one = compile_graph(mlp_builder(sizes), 46, params, {cc!r}, flags=split_flags({cc!r}), threads=1)
    eight = compile_graph(mlp_builder(sizes), 46, params, {cc!r}, flags=split_flags({cc!r}), threads=8)
    expected = [one.train_batch(X, 0.1), one.params().tobytes(), one.predict(X).tobytes()]
    before = len(os.listdir('/proc/self/task'))
    if {limit}:
        # no room left for another thread's stack
        with open('/proc/self/statm') as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (4 << 20), resource.RLIM_INFINITY))
    got = [eight.train_batch(X, 0.1), eight.params().tobytes(), eight.predict(X).tobytes()]
    print(json.dumps({{'same': got == expected, 'threads': eight.threads,
                      'new_threads': len(os.listdir('/proc/self/task')) - before}}))
""")


@needs_cc
@pytest.mark.parametrize('limit', [True, False], ids=['no-room-for-threads', 'control'])
def test_when_no_thread_can_be_created_one_thread_does_the_work(limit):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OPENBLAS_NUM_THREADS='1', OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    script = CANNOT_START_THREADS.format(root=root, cc=FAST_CC, limit=limit)
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report['same'] and report['threads'] == 8
    # the limit did stop the helpers (else this test would test nothing)
    assert (report['new_threads'] == 0) if limit else (report['new_threads'] == 7)


# -- every set of loop kernels, the same bits -------------------------------------

KERNELS_RUN = textwrap.dedent("""
    import hashlib, json, sys
    sys.path[:0] = [{root!r}]
    from tests.differential import compile_graph
    from tests.graphs import mlp_builder
    from tests.test_cores import batch, mlp_params, run
    sizes = [70, 33, 9]
    params = mlp_params(sizes)
    import compiler
    m = compile_graph(mlp_builder(sizes), 79, params, {cc!r}, threads=2)
    out = run(m, params, 2, batch(70, 9, 45))
    # and the optimizer's vector loops (AdamW: every line of the step)
    adam = compile_graph(mlp_builder(sizes), 79, params, {cc!r}, threads=2,
                         optimizer=compiler.AdamW(0.01, weight_decay=0.1))
    out += run(adam, params, 2, batch(70, 9, 45)) + [adam.optimizer_state().tobytes()]
    print(json.dumps({{'isa': m.module.kernels, 'sha': hashlib.sha256(b''.join(out)).hexdigest()}}))
""")


@needs_cc
@pytest.mark.parametrize('cc', [cc for cc in COMPILERS if cc != 'tcc'])
def test_every_instruction_set_gives_the_same_bits(cc):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    reports = {}
    for want in ('base', 'avx2', 'avx512'):
        env = dict(os.environ, MICROGRAD_KERNELS=want)
        done = subprocess.run([sys.executable, '-c', KERNELS_RUN.format(root=root, cc=cc)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        reports[want] = json.loads(done.stdout.splitlines()[-1])
    assert reports['base']['isa'] == 'base'
    if cpu.cpu_flags() is not None:
        # each set this CPU has runs when asked for: the build carries it (compiler.cpu)
        for want, report in reports.items():
            assert report['isa'] == cpu.kernel_sets(want)[0], reports
    assert len({r['sha'] for r in reports.values()}) == 1, reports


@needs_cc
@pytest.mark.parametrize('cc', [FAST_CC, 'clang'] if 'clang' in COMPILERS and FAST_CC != 'clang' else [FAST_CC])
def test_the_first_non_finite_number_is_named_at_every_thread_count(cc):
    # X is checked a block of 64 rows at a time, each thread its own rows, as
    # they are run: the error names the first bad number of X however many
    # threads looked and wherever it is (a later block, a label column, the
    # last number), and nothing changes (the rows before it ran into
    # gradients of their own); momentum, so that the optimizer's state is checked too
    sizes = [257, 64, 7]
    params = mlp_params(sizes)
    m = compile_graph(mlp_builder(sizes), 264, params, cc, flags=split_flags(cc),
                      optimizer=compiler.SGD(0.1, momentum=0.9))
    assert m.n_params >= 16384     # the optimizer's step is split too
    X = batch(257, 7, 300)
    m.train_batch(X, 0.1)
    before = m.params().tobytes(), m.optimizer_state().tobytes(), m.grads().tobytes()
    cases = [([(280, 5), (250, 3)], (250, 3)),                # the first in X is in the last thread's part
             ([(150, 3), (180, 7), (250, 260)], (150, 3)),    # block 2, on threads 0 and 1 of 2
             ([(180, 7), (130, 258), (250, 1)], (130, 258)),  # a label column
             ([(299, 263)], (299, 263))]                      # the last number, in the last, short block
    for T in THREAD_COUNTS:
        m.threads = T
        for where, first in cases:
            bad = X.copy()
            for (r, c), v in zip(where, (np.inf, np.nan, -np.inf)):
                bad[r, c] = v
            with pytest.raises(ValueError, match=re.escape(f'X[{first[0]}, {first[1]}] is not finite')):
                m.train_batch(bad, 0.1)
            assert (m.params().tobytes(), m.optimizer_state().tobytes(), m.grads().tobytes()) == before, (T, where)
    # and the steps themselves, split over the threads, give the same bits
    results = set()
    for T in THREAD_COUNTS:
        m.set_params(params)
        m.set_optimizer_state(np.zeros_like(m.optimizer_state()))
        m.threads = T
        losses = [np.float64(m.train_batch(X, 0.1)).tobytes() for _ in range(3)]
        results.add((tuple(losses), m.params().tobytes(), m.optimizer_state().tobytes()))
    assert len(results) == 1
