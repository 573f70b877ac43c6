"""What ``bench_mnist.py`` measures: one model trained by one system.

A system is our compiled module (one entry of ``BUILDS``), PyTorch batched
(``torch``), PyTorch one image at a time (``torch-per-sample``) or the
interpreter (``micrograd``). The first three are driven through one small
interface, ``Runner``, so that every one of them is timed by the same code:
``measure(runner, threads, repeats)``.

A model is named by its layer sizes, ``784-256-128-10``: the project's MNIST
graph (``mnist_data.mnist_graph``), ReLU hidden layers, softmax
cross-entropy, float64, batch SGD.
"""
import gc
import hashlib
import inspect
import math
import statistics
import time

import numpy as np

import compiler
import mnist_data
from benchmarks.bench_machine import load_probe, other_load
from micrograd import Value, cross_entropy
from mnist_data import N_CLASSES, N_PIXELS, input_rows, mnist_graph

EPOCH = 60_000          # images in a full MNIST training epoch
MIN_PREDICT_PASS_S = 0.1   # a timed predict pass repeats predict() over the images at least this long

# Build name -> keyword arguments of ``compiler.compile`` (beyond the graph).
# Only the keywords an entry names are passed. ``cc`` says which compiler must
# be installed; the benchmark adds ``timeout`` unless an entry sets its own.
# A keyword that ``compiler.compile`` does not accept makes the row
# "unsupported" (the run goes on), except a switch set to ``False``: turning
# off a feature the compiler does not have asks for nothing, so it is dropped.
# ``-straight`` builds are the straight-line program (``vectorize=False``):
# minutes to compile with clang or gcc, so only for 784-50-10.
BUILDS = {
    'clang': {'cc': 'clang'},                                   # -O2, the default level
    'gcc': {'cc': 'gcc'},                                       # -O3, the default level
    'tcc': {'cc': 'tcc'},
    'clang-O0': {'cc': 'clang', 'opt': '-O0'},
    'clang-native': {'cc': 'clang', 'native': True},
    'tcc-straight': {'cc': 'tcc', 'vectorize': False},
    'clang-O0-straight': {'cc': 'clang', 'opt': '-O0', 'vectorize': False},
    'clang-O1-straight': {'cc': 'clang', 'opt': '-O1', 'vectorize': False},
    'clang-O2-straight': {'cc': 'clang', 'opt': '-O2', 'vectorize': False},
    'gcc-O2-straight': {'cc': 'gcc', 'opt': '-O2', 'vectorize': False},
}
TORCH_SYSTEMS = ('torch', 'torch-per-sample')
INTERPRETER = 'micrograd'

# Every result row has these keys (None where they do not apply). ``train_1t``,
# ``train_all``, ``predict_1t`` and ``predict_all`` are ``timing`` dicts.
ROW_FIELDS = (
    'model', 'system', 'kind', 'status', 'note', 'images', 'repeats', 'rounds', 'other_load',
    'train_1t', 'train_all', 'predict_1t', 'predict_all',
    'speedup_1t', 'speedup_all', 'predict_speedup_1t', 'predict_speedup_all', 'thread_speedup',
    'loss0', 'loss0_minus_interpreter', 'first_batch_loss_1t', 'first_batch_loss_all',
    'bits_identical', 'trained_loss', 'init_params_sha256',
)
# Extra keys of a compiled row.
BUILD_FIELDS = ('kwargs', 'toolchain', 'version', 'flags', 'passes', 'compile_s', 'timings',
                'ops', 'c_lines', 'c_bytes', 'compiler_peak_mb', 'macs_executed', 'macs_dense')
KINDS = {INTERPRETER: 'interpreter', **dict.fromkeys(TORCH_SYSTEMS, 'torch'),
         **dict.fromkeys(BUILDS, 'compiled')}


def row(model, system, status='ok', **values):
    kind = KINDS[system]
    out = dict.fromkeys(ROW_FIELDS + (BUILD_FIELDS if kind == 'compiled' else ()))
    out.update(model=model, system=system, kind=kind, status=status, **values)
    return out


# -- models and data ----------------------------------------------------------------------


def model_sizes(name):
    """``'784-128-10'`` -> ``[784, 128, 10]``; the ends must be MNIST's."""
    try:
        sizes = [int(s) for s in name.split('-')]
    except ValueError:
        sizes = []
    if len(sizes) < 2 or sizes[0] != N_PIXELS or sizes[-1] != N_CLASSES or min(sizes) < 1:
        raise ValueError(f"model {name!r}: layer sizes like 784-128-10 (784 in, 10 out)")
    return sizes


def hidden_sizes(name):
    return model_sizes(name)[1:-1]


def load_rows(data_dir, n_images, batch):
    """Input rows ``[pixels / 255, one-hot label]`` (float64 ``[N, 794]``) and
    where they came from. ``N`` is ``n_images`` (default: all training images),
    rounded down to whole batches."""
    if data_dir:
        images, labels = mnist_data.load(data_dir)['train']
        source = str(data_dir)
    else:
        images, labels = mnist_data.load_embedded()['train']
        source = 'embedded'
    n = len(images) if n_images is None else min(n_images, len(images))
    n -= n % batch
    if n == 0:
        raise SystemExit(f'need at least one batch of {batch} images, have {len(images)}')
    return input_rows(images[:n], labels[:n]), source


def params_sha256(values):
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float64).tobytes()).hexdigest()


# -- timing -------------------------------------------------------------------------------


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timing(threads, pass_seconds, pass_images):
    """One measurement: the seconds and images of each pass, and the median
    pass's throughput."""
    per_s = statistics.median(n / s for n, s in zip(pass_images, pass_seconds))
    return {'threads': threads, 'pass_seconds': pass_seconds, 'pass_images': pass_images,
            'images_per_s': per_s, 's_per_epoch': EPOCH / per_s}


TIMINGS = ('train_1t', 'train_all', 'predict_1t', 'predict_all')


def merge_rounds(rounds):
    """One row from the rows of one system in several rounds of the run: the
    passes of all rounds pooled, the compile of the median round, the bits
    the same only if they were in every round (and the same in all of them).
    A round that did not succeed stands for the row."""
    failed = next((r for r in rounds if r['status'] != 'ok'), None)
    if failed or len(rounds) == 1:
        return failed or rounds[0]
    by_compile = sorted(rounds, key=lambda r: r.get('compile_s') or 0)
    out = dict(by_compile[len(rounds) // 2], rounds=len(rounds))
    for key in TIMINGS:
        if out[key]:
            out[key] = timing(out[key]['threads'], [s for r in rounds for s in r[key]['pass_seconds']],
                              [n for r in rounds for n in r[key]['pass_images']])
    first_losses = {(r['first_batch_loss_1t'], r['first_batch_loss_all']) for r in rounds}
    out['bits_identical'] = all(r['bits_identical'] for r in rounds) and len(first_losses) == 1
    loads = [r['other_load'] for r in rounds if r['other_load'] is not None]
    out['other_load'] = statistics.mean(loads) if loads else None
    return out


def interleaved(runner, threads, repeats, one_pass, warm_up):
    """Seconds of ``repeats`` passes per thread setting (``{'1t': 1, 'all': n}``),
    the settings taking turns so that a busy spell on a shared machine hits
    all of them alike. After each switch ``warm_up`` runs untimed (PyTorch's
    first call at a new thread count is slow)."""
    seconds = {label: [] for label in threads}
    for _ in range(repeats):
        for label, n in threads.items():
            runner.threads = n
            warm_up()
            seconds[label].append(timed(one_pass))
    return seconds


# -- one interface for every trained system -----------------------------------------------


class Runner:
    """A model being trained: its parameters (flat, micrograd's order), a
    thread count, ``train_batch`` on a prepared batch, ``predict`` on all
    the images. Subclasses prepare the data their own way, untimed."""

    batches = ()
    images = 0

    def train_pass(self):
        for b in self.batches:
            self.last_loss = self.train_batch(b)

    def first_step(self, init, threads):
        """From ``init``, one batch at ``threads``: the loss, the parameters
        after the step and the predictions then, as bytes to compare."""
        self.set_params(init)
        self.threads = threads
        loss = self.train_batch(self.batches[0])
        after = np.asarray(self.params(), dtype=np.float64).tobytes()
        predicted = np.asarray(self.predict(), dtype=np.float64).tobytes()
        return loss, (np.float64(loss).tobytes(), after, predicted)

    def predict_calls(self):
        """How many ``predict`` calls make one timed pass of at least
        ``MIN_PREDICT_PASS_S`` (from one warm call)."""
        return max(1, math.ceil(MIN_PREDICT_PASS_S / max(timed(self.predict), 1e-9)))


def measure(runner, threads, repeats):
    """Train and predict timings at every thread setting, and the checks:
    the loss of image 0 at the initial weights, and whether one step from
    them gives the same bits at every setting."""
    init = np.array(runner.params())
    values = {'loss0': runner.loss0(), 'init_params_sha256': params_sha256(init),
              'images': runner.images, 'repeats': repeats, 'rounds': 1}
    firsts = {label: runner.first_step(init, n) for label, n in threads.items()}
    for label, (loss, _) in firsts.items():
        values[f'first_batch_loss_{label}'] = loss
    values['bits_identical'] = len({bits for _, bits in firsts.values()}) == 1

    runner.set_params(init)
    start = load_probe()
    train = interleaved(runner, threads, repeats, runner.train_pass,
                        lambda: runner.train_batch(runner.batches[0]))
    values['trained_loss'] = runner.last_loss
    calls = runner.predict_calls()
    predict = interleaved(runner, threads, repeats, lambda: [runner.predict() for _ in range(calls)],
                          runner.predict)
    values['other_load'] = other_load(start)
    for label, n in threads.items():
        values[f'train_{label}'] = timing(n, train[label], [runner.images] * repeats)
        values[f'predict_{label}'] = timing(n, predict[label], [runner.images * calls] * repeats)
    return values


class CompiledRunner(Runner):
    """Our compiled module: ``m.train_batch(X, lr)`` on batches of rows."""

    def __init__(self, m, X, batch, lr):
        self.m, self.X, self.lr = m, X, lr
        self.batches = [X[i:i + batch] for i in range(0, len(X), batch)]
        self.images = len(X)

    @property
    def threads(self):
        return self.m.threads

    @threads.setter
    def threads(self, n):
        self.m.threads = n

    def params(self):
        return self.m.params()

    def set_params(self, values):
        self.m.set_params(values)

    def loss0(self):
        self.m.set_input(self.X[0])
        return self.m.forward()

    def train_batch(self, b):
        return self.m.train_batch(b, self.lr)

    def predict(self):
        return self.m.predict(self.X)


class TorchRunner(Runner):
    """PyTorch float64 as a PyTorch user writes it: ``nn.Sequential`` of
    ``Linear``/``ReLU``, ``F.cross_entropy`` on the batch, ``optim.SGD``."""

    def __init__(self, torch, sizes, init, X, batch, lr):
        self.torch = torch
        layers = []
        for n_in, n_out in zip(sizes, sizes[1:]):
            layers += [torch.nn.Linear(n_in, n_out, dtype=torch.float64), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers[:-1])
        self.linears = [m for m in self.net if isinstance(m, torch.nn.Linear)]
        self.set_params(init)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=lr)
        self.pixels = torch.from_numpy(np.ascontiguousarray(X[:, :N_PIXELS]))
        self.targets = torch.from_numpy(X[:, N_PIXELS:].argmax(axis=1))
        self.batches = [(self.pixels[i:i + batch], self.targets[i:i + batch])
                        for i in range(0, len(X), batch)]
        self.images = len(X)

    @property
    def threads(self):
        return self.torch.get_num_threads()

    @threads.setter
    def threads(self, n):
        self.torch.set_num_threads(n)

    def params(self):
        """Flat, in micrograd's order: layer by layer, neuron by neuron, each
        neuron's weights then its bias."""
        return np.concatenate([self.torch.cat([m.weight, m.bias[:, None]], dim=1).detach().numpy().ravel()
                               for m in self.linears])

    def set_params(self, values):
        at = 0
        with self.torch.no_grad():
            for m in self.linears:
                n_out, n_in = m.weight.shape
                block = self.torch.from_numpy(np.asarray(values[at:at + n_out * (n_in + 1)])
                                              .reshape(n_out, n_in + 1))
                m.weight.copy_(block[:, :n_in])
                m.bias.copy_(block[:, n_in])
                at += n_out * (n_in + 1)

    def loss0(self):
        with self.torch.no_grad():
            return self.loss(self.pixels[:1], self.targets[:1]).item()

    def loss(self, x, y):
        return self.torch.nn.functional.cross_entropy(self.net(x), y)

    def train_batch(self, b):
        x, y = b
        self.optimizer.zero_grad()
        loss = self.loss(x, y)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def predict(self):
        with self.torch.no_grad():
            return self.net(self.pixels)


class TorchPerSampleRunner(TorchRunner):
    """PyTorch one image at a time (the compiled graph's arithmetic): each
    image's loss / batch is back-propagated, the gradients add up, one step."""

    def train_batch(self, b):
        x, y = b
        self.optimizer.zero_grad()
        total = 0.0
        for i in range(len(x)):
            loss = self.loss(x[i:i + 1], y[i:i + 1]) / len(x)
            loss.backward()
            total += loss.item()
        self.optimizer.step()
        return total


# -- the systems, each run inside a worker process ----------------------------------------


def run_torch(job, X):
    import torch
    sizes = model_sizes(job['model'])
    init = [p.data for p in mnist_graph(sizes[1:-1], job['seed']).params]   # what compile() starts from
    gc.collect()
    cls = TorchPerSampleRunner if job['system'] == 'torch-per-sample' else TorchRunner
    runner = cls(torch, sizes, np.array(init), X, job['batch'], job['lr'])
    return row(job['model'], job['system'], **measure(runner, job['threads'], job['repeats']))


def _accepts(name):
    parameters = inspect.signature(compiler.compile).parameters
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                     for p in parameters.values())


def unsupported_kwargs(entry):
    """The keywords of a build entry that ``compiler.compile`` cannot honour."""
    return [k for k, v in entry.items() if not _accepts(k) and v is not False]


def compile_kwargs(entry, timeout):
    """The keyword arguments for one build: the entry's own, plus the timeout.

    A switch set to ``False`` that the compiler does not know is left out.
    """
    kwargs = {k: v for k, v in entry.items() if _accepts(k) or v is not False}
    kwargs.setdefault('timeout', timeout)
    return kwargs


def compiler_installed(entry):
    try:
        compiler.find_compiler(entry.get('cc'))
    except compiler.CompilerNotFound:
        return False
    return True


def run_compiled(job, X):
    """Compile the model with one build (a real compile: the worker runs with
    ``MICROGRAD_CACHE=0``), then measure it."""
    entry = BUILDS[job['system']]
    kwargs = compile_kwargs(entry, job['compile_timeout'])
    base = row(job['model'], job['system'], kwargs=entry)
    g = mnist_graph(hidden_sizes(job['model']), job['seed'])
    try:
        t0 = time.perf_counter()
        m = compiler.compile(g.loss, inputs=g.inputs, params=g.params, outputs=g.logits, **kwargs)
        compile_s = time.perf_counter() - t0
    except compiler.CompileTimeout:
        return dict(base, status='timeout', compile_s=kwargs['timeout'], compiler_peak_mb=children_peak_mb(),
                    note=f"compile did not finish within {kwargs['timeout']:g} s")
    except compiler.BuildError as e:
        return dict(base, status='error', note=str(e).splitlines()[0])
    del g
    gc.collect()
    details = dict(toolchain=m.build.toolchain.family, version=m.build.toolchain.version,
                   flags=list(m.build.flags), passes=list(m.program.passes), compile_s=compile_s,
                   timings=dict(m.timings), ops=len(m.program.ops), c_lines=m.source.count('\n'),
                   c_bytes=len(m.source.encode()), compiler_peak_mb=children_peak_mb())
    if m.build.cached:
        details['note'] = 'cache hit: the compile time is not real'
    runner = CompiledRunner(m, X, job['batch'], job['lr'])
    measured = measure(runner, job['threads'], job['repeats'])
    return dict(base, **details, **measured, macs_executed=executed_macs(m, runner),
                macs_dense=dense_macs(job['model']))


KERNEL_KINDS = ('forward', 'input_grad', 'weight_grad')


def dense_macs(model):
    """Multiply-adds per image of one training step without skipping any
    zero: every layer's forward and weight gradient, and the input gradient
    of every layer but the first (the pixels need none)."""
    sizes = model_sizes(model)
    layers = list(zip(sizes, sizes[1:]))
    forward = sum(c * r for c, r in layers)
    return {'forward': forward, 'input_grad': forward - layers[0][0] * layers[0][1], 'weight_grad': forward}


def executed_macs(m, runner):
    """Multiply-adds per image the kernels ran in one training pass over the
    batches (after skipping zeros), by kind (the module's ``kernel_macs()``)."""
    m.module.kernel_macs()              # from 0
    runner.train_pass()
    return {kind: n / runner.images for kind, n in zip(KERNEL_KINDS, m.module.kernel_macs())}


def children_peak_mb():
    """Peak resident memory of the largest child so far (the C compiler), or None.

    A child's peak counts from its fork, when it shares this process's memory,
    so a peak not above our own says only "less than this process".
    """
    import resource
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(child / 1024, 1) if child > own else None


def run_system(job):
    """The row of ``job['system']`` on ``job['model']`` (in a worker process)."""
    X, _ = load_rows(job['data'], job['images'], job['batch'])
    return (run_torch if job['system'] in TORCH_SYSTEMS else run_compiled)(job, X)


# -- the interpreter (the reference; in the main process) ----------------------------------


def run_interpreter(model, X, n_images, seed):
    """micrograd as a user runs it: per image a new graph (the forward), then
    ``backward``; the loss of image 0 is the reference every row must match.
    Includes collecting the previous image's graph (its closures form cycles)."""
    net = mnist_graph(hidden_sizes(model), seed).model
    losses = []
    t0 = time.perf_counter()
    for r in X[:n_images]:
        values = r.tolist()
        loss = cross_entropy(net([Value(v) for v in values[:N_PIXELS]]),
                             [Value(v) for v in values[N_PIXELS:]])
        loss.backward()
        losses.append(loss.data)
        gc.collect()
    seconds = time.perf_counter() - t0
    return row(model, INTERPRETER, images=n_images, repeats=1, loss0=losses[0],
               train_1t=timing(1, [seconds], [n_images]), note='graph rebuilt per image')
