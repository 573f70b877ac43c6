"""The compiler's front end per scalar op: trace, passes and codegen (no C
compiler), on each graph built fresh.

    PYTHONPATH=. python benchmarks/bench_frontend.py [--graphs mlp3,gpt,random] [--repeats 1] [--compile]

Graphs: ``mlp1`` 784-50-10, ``mlp3`` 784-256-128-10 (mnist_data/model.py),
``gpt`` microgpt defaults, ``gpt64`` microgpt --n-embd 64 --n-layer 4
--n-head 4 (microgpt_train.py's model code), ``random`` a 1M-op irregular
graph of every op. Prints seconds per stage and microseconds per scalar op
of the user's graph. The tracer's C walk (compiler/walk.py) is built before
the first graph, as a first ``compile()`` on this machine builds it once.
``--compile`` also runs ``compiler.compile()`` on each graph, built fresh,
with a cold cache and the default choice, and prints its seconds and its
peak memory above the graph's (this process; the C compiler's own peak
beside it).
"""
import argparse
import gc
import os
import platform
import random
import resource
import sys
import threading
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import micrograd                                     # noqa: E402
from micrograd import Value                          # noqa: E402
import compiler                                      # noqa: E402
from compiler import walk                            # noqa: E402
from compiler.codegen import emit_module             # noqa: E402
from compiler.pages import heap_memory, small_pages  # noqa: E402
from compiler.trace import trace_graph               # noqa: E402
from compiler.passes import run_passes           # noqa: E402
from bench_machine import cold_cache             # noqa: E402


def mlp(hidden):
    def build():
        from mnist_data.model import mnist_graph
        g = mnist_graph(hidden=hidden)
        return g.loss, g.inputs, g.params, g.logits
    return build


def gpt(n_embd=16, n_layer=1, n_head=4):
    def build():
        import microgpt_train as mg
        names = ['emma', 'olivia', 'ava', 'isabella', 'sophia']
        _, _, config, weights, _ = mg.prepare(names, 42, n_embd=n_embd, n_layer=n_layer, n_head=n_head)
        sd, params = mg.value_weights(weights)
        graph = mg.sequence_graph(sd, config, config.block_size)
        return graph.losses, graph.inputs, params, [z for row in graph.logits for z in row]
    return build


def irregular(n_ops=int(os.environ.get('BENCH_RANDOM_OPS', 2_400_000)), seed=0):
    """Each op reads random earlier values (mostly recent ones): no structure to lift."""
    def build():
        rng = random.Random(seed)
        inputs = [Value(0.0) for _ in range(64)]
        params = [Value(rng.uniform(-1, 1)) for _ in range(256)]
        pool = inputs + params
        unary = [lambda a: a.tanh(), lambda a: a.relu(), lambda a: -a, lambda a: a.sigmoid(),
                 lambda a: a ** 2, lambda a: (a * 0.01).exp()]
        binary = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b,
                  lambda a, b: micrograd.max(a, b), lambda a, b: a / (b * b + 1.0)]
        for _ in range(n_ops // 2):
            a = pool[-1 - min(len(pool) - 1, int(rng.expovariate(1 / 50)))]
            if rng.random() < 0.4:
                v = rng.choice(unary)(a)
            else:
                b = pool[rng.randrange(len(pool))] if rng.random() < 0.2 else pool[-1 - rng.randrange(min(20, len(pool)))]
                v = rng.choice(binary)(a, b)
            pool.append(v)
        loss = sum(pool[-200:], Value(0.0, label='zero'))
        return loss, inputs, params, pool[-10:]
    return build


GRAPHS = {'mlp1': mlp((50,)), 'mlp3': mlp((256, 128)), 'gpt': gpt(), 'gpt64': gpt(64, 4, 4),
          'random': irregular()}


def count_ops(loss, outputs):
    from micrograd.engine import topological_order
    roots = list(loss) if isinstance(loss, list) else [loss]
    return sum(1 for v in topological_order(roots + list(outputs)) if v._prev)


def measure(build):
    loss, inputs, params, outputs = build()
    n = count_ops(loss, outputs)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        with small_pages(), heap_memory():      # as compile() runs them
            t0 = time.perf_counter()
            program, _, _ = trace_graph(loss, inputs, params, outputs)
            t1 = time.perf_counter()
            program = run_passes(program)
            t2 = time.perf_counter()
            emit_module(program)
            t3 = time.perf_counter()
    finally:
        if was:
            gc.enable()
    return n, t1 - t0, t2 - t1, t3 - t2


def _rss_mb():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2 ** 20


class PeakMemory:
    """This process's peak resident memory while the block runs, sampled every 5 ms."""

    def __enter__(self):
        self.peak, self.done = _rss_mb(), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while not self.done.wait(0.005):
            self.peak = max(self.peak, _rss_mb())

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, _rss_mb())


def measure_compile(build):
    """``compile()`` of a fresh graph, cold cache, default choice: (seconds,
    timings, the build's description, MB of peak memory above the graph's,
    MB of the largest C compiler process)."""
    loss, inputs, params, outputs = build()
    gc.collect()
    before = _rss_mb()
    with cold_cache('bench-frontend-'), PeakMemory() as peak, warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)
        t0 = time.perf_counter()
        m = compiler.compile(loss, inputs, params, outputs)
        seconds = time.perf_counter() - t0
    what = f'{m.build.toolchain.family} {m.build.flags_text().split()[0]}, {m.build.scalar_code()}'
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return seconds, m.timings, what, peak.peak - before, child


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--graphs', default='mlp1,mlp3,gpt,random')
    ap.add_argument('--repeats', type=int, default=1)
    ap.add_argument('--compile', action='store_true', help='also time compile() (cold cache) and its memory')
    args = ap.parse_args(argv)
    cpu = next((line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo')
                if line.startswith('model name')), platform.processor())
    print(f'CPU: {cpu}, Python {platform.python_version()}')
    print(f'trace walk: {"C (compiler/walk.py)" if walk.native_walker() else "Python: " + str(walk.problem())}')
    print(f'{"graph":8} {"ops":>9} {"trace s":>8} {"passes s":>9} {"codegen s":>10} {"us/op":>7}')
    for name in args.graphs.split(','):
        for _ in range(args.repeats):
            n, tr, pa, co = measure(GRAPHS[name])
            print(f'{name:8} {n:9,} {tr:8.3f} {pa:9.3f} {co:10.3f} {1e6 * (tr + pa + co) / n:7.2f}', flush=True)
    if args.compile:
        print(f'\n{"graph":8} {"compile() s":>11} {"C s":>6} {"MB above graph":>14} {"cc MB":>6}  build')
        for name in args.graphs.split(','):
            seconds, timings, what, mb, child = measure_compile(GRAPHS[name])
            print(f'{name:8} {seconds:11.2f} {timings["compile"]:6.2f} {mb:14.0f} {child:6.0f}  {what}', flush=True)


if __name__ == '__main__':
    main()
